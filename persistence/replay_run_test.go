package persistence_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
		if want := []int{64, 36}; !cmp.Equal(got, want) {
			t.Errorf("groups of the replay's transactions = %v, want %v", got, want)
		}
		if n, failed := w.files(""), w.files("failed"); n != 0 || failed != 0 {
			t.Errorf("after the replay, %d batches wait and %d were set aside, want none", n, failed)
		}
		mustHoldTurns(t, w.store, 25)
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
// group gets the error.
type abortingStore struct{ persistence.Store }

var errAborted = errors.New("transaction rolled back (test)")

func (s *abortingStore) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	for _, g := range groups {
		for _, op := range g {
			if st, ok := op.(*persistence.SetTitle); ok && st.Title == "poison" {
				errs := make([]error, len(groups))
				for i := range errs {
					errs[i] = errAborted
				}
				return errs
			}
		}
	}
	return s.Store.Commit(ctx, groups)
}

// TestReplayTransactionThatFailsAsAWholeSetsAsideOnlyItsCause: when a replay's transaction
// fails as a whole, the batches are tried one at a time, so that only the batch that failed it
// is set aside and the others reach the database. Without that, the good batches committed with
// it would be set aside too, their writes kept out of the database.
func TestReplayTransactionThatFailsAsAWholeSetsAsideOnlyItsCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		sp, err := spool.Open(filepath.Join(dir, "spool"))
		if err != nil {
			t.Fatal(err)
		}
		batches := [][]persistence.Op{{session("s1", "k1", t0)}}
		for seq := int64(1); seq <= 3; seq++ {
			batches = append(batches, []persistence.Op{userMessage("s1", seq, fmt.Sprintf("m%d", seq))})
		}
		batches = append(batches, []persistence.Op{&persistence.SetTitle{SessionID: "s1", Title: "poison"}})
		for seq := int64(4); seq <= 5; seq++ {
			batches = append(batches, []persistence.Op{userMessage("s1", seq, fmt.Sprintf("m%d", seq))})
		}
		for _, ops := range batches {
			if _, err := sp.Append([][]persistence.Op{ops}); err != nil {
				t.Fatal(err)
			}
		}

		var logs testutil.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		quiet := slog.New(slog.DiscardHandler)
		system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
		defer system.Shutdown()
		pid := system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(t.Context(), &abortingStore{Store: st},
			persistence.ActorOptions{MaxBatch: 64, Spool: sp, ReplayEvery: time.Hour, Log: log})))
		defer func() { _ = system.Root.StopFuture(pid).Wait() }()
		// The actor replays when it starts, before it takes the Flush.
		if _, err := system.Root.RequestFuture(pid, &persistence.Flush{}, time.Minute).Result(); err != nil {
			t.Fatal(err)
		}

		if tr, err := st.Transcript(context.Background(), "s1"); err != nil || len(tr) != 5 {
			t.Errorf("transcript of s1 after the replay: %d rows, %v; want the 5 spooled messages", len(tr), err)
		}
		entries, _ := os.ReadDir(filepath.Join(dir, "spool", "failed"))
		var failed []string
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".json") {
				failed = append(failed, e.Name())
			}
		}
		if want := []string{"00000000000000000005.json"}; !cmp.Equal(failed, want) || sp.Len() != 0 {
			t.Errorf("set aside %v, %d left in the spool; want %v alone, none left; log:\n%s", failed, sp.Len(), want, logs.String())
		}
	})
}
