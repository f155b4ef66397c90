package persistence_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/go-cmp/cmp"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/sqlite"
)

// turnWrites returns the writes of n turns of session s1 (key k1), four writes a turn, as its
// session sends them: the inbound message; the title; the result (status, reply, outbox entry,
// usage); the delivery mark.
func turnWrites(n int) [][]persistence.Op {
	var out [][]persistence.Op
	for i := 1; i <= n; i++ {
		seq, turn := int64(2*i-1), fmt.Sprintf("t%d", i)
		out = append(out,
			[]persistence.Op{userMessage("s1", seq, fmt.Sprintf("m%d", i)), &persistence.TouchSession{SessionID: "s1", At: t0}},
			[]persistence.Op{&persistence.SetTitle{SessionID: "s1", Title: fmt.Sprintf("turn %d", i)}},
			[]persistence.Op{
				&persistence.SetMessageStatus{SessionID: "s1", Seqs: []int64{seq}, Status: persistence.StatusDone, TurnID: turn},
				&persistence.AppendMessage{Message: persistence.Message{SessionID: "s1", Seq: seq + 1, Role: persistence.RoleAssistant,
					Content: "reply", TurnID: turn, Active: true, CreatedAt: t0}},
				&persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: "k1", Seq: int64(i), SessionID: "s1", Kind: "reply",
					Text: "reply", TurnID: turn, Platform: "http", ChatID: "c", State: persistence.DeliveryPending, CreatedAt: t0}},
				&persistence.AddUsage{SessionID: "s1", TurnID: turn, InputTokens: 10, OutputTokens: 20},
			},
			[]persistence.Op{&persistence.MarkDelivery{SessionKey: "k1", Seq: int64(i), State: persistence.DeliveryDelivered, At: t0}},
		)
	}
	return out
}

// spoolTurns writes session s1, then, with the database down, the writes of n turns: each
// acknowledged alone, so each is a batch of its own in the spool.
func (w *spoolWorld) spoolTurns(t *testing.T, n int) {
	t.Helper()
	w.write(t, 1, session("s1", "k1", t0))
	w.out.Down.Store(true)
	for i, ops := range turnWrites(n) {
		w.write(t, uint64(2+i), ops...)
	}
	if got, want := w.files(""), 4*n; got != want {
		t.Fatalf("%d batches in the spool, want %d", got, want)
	}
}

// mustHoldTurns checks that st holds n turns of turnWrites, each once and in order.
func mustHoldTurns(t *testing.T, st *sqlite.Store, n int) {
	t.Helper()
	ctx := context.Background()
	tr, err := st.Transcript(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for _, m := range tr {
		got = append(got, fmt.Sprintf("%d %s %s", m.Seq, m.Role, m.Status))
	}
	for i := 1; i <= n; i++ {
		want = append(want, fmt.Sprintf("%d user done", 2*i-1), fmt.Sprintf("%d assistant ", 2*i))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("transcript of s1 (-want +got):\n%s", diff)
	}
	s, err := st.Session(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if wantTitle := fmt.Sprintf("turn %d", n); s.Title != wantTitle || s.InputTokens != int64(10*n) || s.OutputTokens != int64(20*n) {
		t.Errorf("session s1: title %q, tokens %d/%d; want %q, %d/%d", s.Title, s.InputTokens, s.OutputTokens, wantTitle, 10*n, 20*n)
	}
	out, err := st.OutboxAfter(ctx, "k1", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != n {
		t.Errorf("outbox of k1: %d entries, want %d", len(out), n)
	}
	for _, e := range out {
		if e.State != persistence.DeliveryDelivered || e.Attempts != 1 {
			t.Errorf("outbox entry %d: %s after %d attempts, want delivered after 1", e.Seq, e.State, e.Attempts)
		}
	}
}

// TestReplayCommitsSeveralBatchesATransaction: a replay commits the spooled batches a
// transaction of up to MaxBatch (64 here) groups at a time, in order, as
// agentgate_persist_batch_size shows. Before, it committed one transaction a batch: after a
// long outage, thousands of small transactions, each with its fsync, whose WAL the checkpointer
// had to keep up with (BenchmarkSpoolReplay: 2,000 batches, 2,000 transactions in 2.1–6.3 s,
// the -wal file at 4.0 MB; now 4 transactions in 0.26–0.58 s, 1.3 MB).
func TestReplayCommitsSeveralBatchesATransaction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var sizes []int
		w := spoolWorldOn(t, t.TempDir(), slog.New(slog.DiscardHandler), false, func(o *persistence.ActorOptions) {
			o.Observe = func(groups int, _ time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				sizes = append(sizes, groups)
			}
		})
		defer w.close(t)
		w.spoolTurns(t, 25)
		mu.Lock()
		sizes = nil
		mu.Unlock()

		w.out.Down.Store(false)
		time.Sleep(time.Second) // the replay's tick
		synctest.Wait()
		mu.Lock()
		got := sizes
		mu.Unlock()
		// The first is the oldest batch alone: the database was unavailable at the last try
		// (TestReplayDuringAnOutageReadsOneBatchATick).
		if want := []int{1, 64, 35}; !cmp.Equal(got, want) {
			t.Errorf("groups of the replay's transactions = %v, want %v", got, want)
		}
		if n, failed := w.files(""), w.files("failed"); n != 0 || failed != 0 {
			t.Errorf("after the replay, %d batches wait and %d were set aside, want none", n, failed)
		}
		mustHoldTurns(t, w.store, 25)
	})
}

// peekCounter is a spool that counts the batches read from it (Peek).
type peekCounter struct {
	persistence.Spooler
	peeks atomic.Int64
}

func (s *peekCounter) Peek(after string) (string, [][]persistence.Op, error) {
	s.peeks.Add(1)
	return s.Spooler.Peek(after)
}

// TestReplayDuringAnOutageReadsOneBatchATick: while the database is unavailable, each replay
// tick tries the oldest batch alone, reading one batch of the spool; once it commits, the
// replay builds runs again. Before, each tick (one a second) read and decoded a whole run, up
// to persist.max_batch batches, for a transaction that could only fail.
func TestReplayDuringAnOutageReadsOneBatchATick(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var sizes []int
		var sp *peekCounter
		w := spoolWorldOn(t, t.TempDir(), slog.New(slog.DiscardHandler), false, func(o *persistence.ActorOptions) {
			sp = &peekCounter{Spooler: o.Spool}
			o.Spool = sp
			o.Observe = func(groups int, _ time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				sizes = append(sizes, groups)
			}
		})
		defer w.close(t)
		w.spoolTurns(t, 10)
		mu.Lock()
		sizes = nil
		mu.Unlock()

		const ticks = 5
		sp.peeks.Store(0)
		time.Sleep(ticks * time.Second)
		synctest.Wait()
		if got := sp.peeks.Load(); got == 0 || got > ticks {
			t.Errorf("%d spool batches read in %d replay ticks of an outage, want one a tick", got, ticks)
		}

		w.out.Down.Store(false)
		time.Sleep(time.Second)
		synctest.Wait()
		mu.Lock()
		got := sizes
		mu.Unlock()
		if want := []int{1, 39}; !cmp.Equal(got, want) {
			t.Errorf("groups of the replay's transactions = %v, want %v", got, want)
		}
		mustHoldTurns(t, w.store, 10)
	})
}

// dyingSpool is a spool whose process dies as it removes replayed batches: it removes the first
// removes of them, then nothing more.
type dyingSpool struct {
	persistence.Spooler
	removes int
}

func (s *dyingSpool) Remove(names ...string) error {
	if err := s.Spooler.Remove(names[:min(s.removes, len(names))]...); err != nil {
		return err
	}
	return errors.New("the process died (test)")
}

// TestReplayThatDiesBeforeTheSpoolLetsGoIsAppliedAgain: a replay whose process dies after its
// transaction committed, before or while the spool removes its batches, leaves the newest of
// them in the spool; the next start applies them again, in order, and the store ends as after
// one replay: each turn once, the last title, the tokens counted once, each delivery once.
func TestReplayThatDiesBeforeTheSpoolLetsGoIsAppliedAgain(t *testing.T) {
	const turns = 10 // 40 batches: one transaction
	for _, tc := range []struct {
		name    string
		removed int
	}{
		{"before any removal", 0},
		{"half way through the removals", 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir := t.TempDir()
				quiet := slog.New(slog.DiscardHandler)
				last := spoolWorldOn(t, dir, quiet, false)
				last.spoolTurns(t, turns)
				last.close(t)

				died := spoolWorldOn(t, dir, quiet, false, func(o *persistence.ActorOptions) {
					o.Spool = &dyingSpool{Spooler: o.Spool, removes: tc.removed}
				})
				if tr, err := died.store.Transcript(context.Background(), "s1"); err != nil || len(tr) != 2*turns {
					t.Fatalf("transcript after the replay died: %d rows, %v; want the %d it committed", len(tr), err, 2*turns)
				}
				died.close(t)
				if n, want := died.files(""), 4*turns-tc.removed; n != want {
					t.Fatalf("%d batches in the spool after the replay died, want %d", n, want)
				}

				var logs testutil.Buffer
				w := spoolWorldOn(t, dir, slog.New(slog.NewTextHandler(&logs, nil)), false)
				defer w.close(t)
				if n, failed := w.files(""), w.files("failed"); n != 0 || failed != 0 {
					t.Errorf("after the next start's replay, %d batches wait and %d were set aside, want none", n, failed)
				}
				if got := logs.String(); strings.Contains(got, "level=ERROR") {
					t.Errorf("log of the replay again:\n%s\nwant no error", got)
				}
				mustHoldTurns(t, w.store, turns)
			})
		})
	}
}

// abortingStore fails as a whole a transaction that holds a poison write (a title of
// "poison"), as a database that rolls a transaction back for one statement's sake does: every
// group gets the error, except a user message whose id is "dup", which keeps ErrDuplicate, as a
// group the savepoint pass refused as a duplicate keeps its own error (sqlstore.FillUndecided).
type abortingStore struct{ persistence.Store }

var errAborted = errors.New("transaction rolled back (test)")

func (s *abortingStore) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	if !slices.ContainsFunc(groups, func(g []persistence.Op) bool {
		return slices.ContainsFunc(g, func(op persistence.Op) bool {
			st, ok := op.(*persistence.SetTitle)
			return ok && st.Title == "poison"
		})
	}) {
		return s.Store.Commit(ctx, groups)
	}
	errs := make([]error, len(groups))
	for i, g := range groups {
		errs[i] = errAborted
		if m, ok := g[0].(*persistence.AppendMessage); ok && m.Message.MessageID == "dup" {
			errs[i] = fmt.Errorf("append message: %w (test)", persistence.ErrDuplicate)
		}
	}
	return errs
}

// abortedReplay is what a start's replay over an abortingStore left.
type abortedReplay struct {
	st     *sqlite.Store
	failed []string // the batches set aside
	left   int      // the batches still in the spool
	sizes  []int    // the groups of each transaction, as agentgate_persist_batch_size shows
	logs   string
}

// replayOverAbortingStore spools batches (one group each), with prior committed to the store
// first, then starts a persistence actor over an abortingStore, which replays them, and returns
// what the replay left. It runs inside the caller's synctest bubble.
func replayOverAbortingStore(t *testing.T, prior [][]persistence.Op, batches [][]persistence.Op) *abortedReplay {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	for i, err := range st.Commit(context.Background(), prior) {
		if err != nil {
			t.Fatalf("prior write %d: %v", i, err)
		}
	}
	sp, err := spool.Open(filepath.Join(dir, "spool"))
	if err != nil {
		t.Fatal(err)
	}
	for _, ops := range batches {
		if _, err := sp.Append([][]persistence.Op{ops}); err != nil {
			t.Fatal(err)
		}
	}

	r := &abortedReplay{st: st}
	var logs testutil.Buffer
	var mu sync.Mutex
	quiet := slog.New(slog.DiscardHandler)
	system := quietSystem(t, quiet)
	defer system.Shutdown()
	pid := system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(t.Context(), &abortingStore{Store: st},
		persistence.ActorOptions{MaxBatch: 64, Spool: sp, ReplayEvery: time.Hour, Log: slog.New(slog.NewTextHandler(&logs, nil)),
			Observe: func(groups int, _ time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				r.sizes = append(r.sizes, groups)
			}})))
	// The actor replays when it starts, before it takes the Flush.
	if _, err := system.Root.RequestFuture(pid, &persistence.Flush{}, time.Minute).Result(); err != nil {
		t.Fatal(err)
	}
	if err := system.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "spool", "failed"))
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".json") {
			r.failed = append(r.failed, e.Name())
		}
	}
	r.left, r.logs = sp.Len(), logs.String()
	return r
}

// mustTranscriptRows checks that session s1 of st holds n transcript rows.
func mustTranscriptRows(t *testing.T, st *sqlite.Store, n int) {
	t.Helper()
	if tr, err := st.Transcript(context.Background(), "s1"); err != nil || len(tr) != n {
		t.Errorf("transcript of s1 after the replay: %d rows, %v; want %d", len(tr), err, n)
	}
}

// userBatches returns a batch of a user message of s1 for each of seqs, with id m<seq>.
func userBatches(seqs ...int64) [][]persistence.Op {
	var out [][]persistence.Op
	for _, seq := range seqs {
		out = append(out, []persistence.Op{userMessage("s1", seq, fmt.Sprintf("m%d", seq))})
	}
	return out
}

// TestReplayTransactionThatFailsAsAWholeSetsAsideOnlyItsCause: when a replay's transaction
// fails as a whole, the batches are tried one at a time, so that only the batch that failed it
// is set aside and the others reach the database. Without that, the good batches committed with
// it would be set aside too, their writes kept out of the database.
func TestReplayTransactionThatFailsAsAWholeSetsAsideOnlyItsCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		batches := append([][]persistence.Op{{session("s1", "k1", t0)}}, userBatches(1, 2, 3)...)
		batches = append(batches, []persistence.Op{&persistence.SetTitle{SessionID: "s1", Title: "poison"}})
		batches = append(batches, userBatches(4, 5)...)
		r := replayOverAbortingStore(t, nil, batches)

		mustTranscriptRows(t, r.st, 5)
		if want := []string{"00000000000000000005.json"}; !cmp.Equal(r.failed, want) || r.left != 0 {
			t.Errorf("set aside %v, %d left in the spool; want %v alone, none left; log:\n%s", r.failed, r.left, want, r.logs)
		}
	})
}

// TestReplayTransactionThatFailsAsAWholeBesideADuplicateSetsAsideOnlyItsCause: a run's
// transaction that fails as a whole after the savepoint pass refused one of its groups as a
// duplicate (which keeps that error, not the transaction's) failed as a whole all the same: its
// batches are tried one at a time and only its cause is set aside. Before, the duplicate made
// it look like a transaction that had committed and refused every other group, and every batch
// of the run (up to persist.max_batch of them, the one that creates the session among them) was
// set aside.
func TestReplayTransactionThatFailsAsAWholeBesideADuplicateSetsAsideOnlyItsCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		batches := [][]persistence.Op{{session("s1", "k1", t0)}, {userMessage("s1", 1, "dup")}}
		batches = append(batches, userBatches(2, 3)...)
		batches = append(batches, []persistence.Op{&persistence.SetTitle{SessionID: "s1", Title: "poison"}})
		r := replayOverAbortingStore(t, nil, batches)

		mustTranscriptRows(t, r.st, 3)
		if want := []string{"00000000000000000005.json"}; !cmp.Equal(r.failed, want) || r.left != 0 {
			t.Errorf("set aside %v, %d left in the spool; want %v alone, none left; log:\n%s", r.failed, r.left, want, r.logs)
		}
	})
}

// TestReplayOfDuplicatesAloneLeavesTheSpool: a run whose every group the database refuses as a
// duplicate (their messages are stored already) committed: its batches leave the spool in that
// one transaction, none set aside and none tried again alone.
func TestReplayOfDuplicatesAloneLeavesTheSpool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		prior := append([][]persistence.Op{{session("s1", "k1", t0)}}, userBatches(1, 2, 3)...)
		var again [][]persistence.Op // the same messages, at later seqs
		for _, b := range userBatches(1, 2, 3) {
			m := *b[0].(*persistence.AppendMessage)
			m.Message.Seq += 10
			again = append(again, []persistence.Op{&m})
		}
		r := replayOverAbortingStore(t, prior, again)

		mustTranscriptRows(t, r.st, 3)
		if want := []int{3}; !cmp.Equal(r.sizes, want) || len(r.failed) != 0 || r.left != 0 {
			t.Errorf("transactions of %v groups, set aside %v, %d left in the spool; want %v, none set aside, none left; log:\n%s",
				r.sizes, r.failed, r.left, want, r.logs)
		}
	})
}

// TestReplayGoesBatchByBatchToTheCauseOfAWholeFailure: after a run's transaction failed as a
// whole, the replay commits its batches one at a time up to the one that fails alone, and then
// builds runs again. Before, it made a run again from each batch behind the first: a cause k
// batches in cost k transactions of up to persist.max_batch groups, each failing.
func TestReplayGoesBatchByBatchToTheCauseOfAWholeFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		batches := append([][]persistence.Op{{session("s1", "k1", t0)}}, userBatches(1, 2, 3, 4, 5)...)
		batches = append(batches, []persistence.Op{&persistence.SetTitle{SessionID: "s1", Title: "poison"}})
		batches = append(batches, userBatches(6, 7, 8)...)
		r := replayOverAbortingStore(t, nil, batches)

		mustTranscriptRows(t, r.st, 8)
		if want := []int{10, 1, 1, 1, 1, 1, 1, 1, 3}; !cmp.Equal(r.sizes, want) || len(r.failed) != 1 || r.left != 0 {
			t.Errorf("transactions of %v groups, set aside %v, %d left in the spool; want %v, the poison set aside, none left",
				r.sizes, r.failed, r.left, want)
		}
	})
}
