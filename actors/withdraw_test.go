package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// withdraw routes a Withdraw of message id of the world's chat through the manager, as the
// platform's intake does, and returns the session's answer.
func (w *managerWorld) withdraw(t *testing.T, id string) *WithdrawResult {
	t.Helper()
	res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &Withdraw{Source: sourceToProto(w.src), MessageId: id}}, time.Hour).Result()
	if err != nil {
		t.Fatalf("withdraw %s: %v", id, err)
	}
	return res.(*WithdrawResult)
}

// holdsM1 answers "m1" once gate is closed, "m2" once the second gate is (when one is given),
// and others at once, counting its runs by message id.
func holdsM1(gate <-chan struct{}, more ...<-chan struct{}) (agents.Agent, func(id string) int) {
	var mu sync.Mutex
	runs := map[string]int{}
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		id := req.Identity.MessageID
		mu.Lock()
		runs[id]++
		mu.Unlock()
		var wait <-chan struct{}
		switch {
		case id == "m1":
			wait = gate
		case id == "m2" && len(more) > 0:
			wait = more[0]
		}
		if wait != nil {
			select {
			case <-wait:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return &agents.Response{Text: "answer " + id}, nil
	})
	return agent, func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return runs[id]
	}
}

// refuseArchive refuses, as unavailable, the commits that archive rows, while refusing is set.
type refuseArchive struct {
	persistence.Store
	mu       sync.Mutex
	refusing bool
}

func (r *refuseArchive) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	r.mu.Lock()
	refusing := r.refusing
	r.mu.Unlock()
	archives := slices.ContainsFunc(groups, func(g []persistence.Op) bool {
		return slices.ContainsFunc(g, func(op persistence.Op) bool { _, ok := op.(*persistence.ArchiveMessages); return ok })
	})
	if !refusing || !archives {
		return r.Store.Commit(ctx, groups)
	}
	errs := make([]error, len(groups))
	for i := range errs {
		errs[i] = fmt.Errorf("%w: disk full (test)", persistence.ErrUnavailable)
	}
	return errs
}

// TestRefusedWithdrawalRunsNoTurnAgain: a withdrawal whose archive the store refuses leaves the
// message to run, in the queue, and cancels nothing. Before, the session started again from
// the store, which cancelled the turn running meanwhile and ran its message again (found by a
// review).
func TestRefusedWithdrawalRunsNoTurnAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		agent, ran := holdsM1(gate)
		store := &refuseArchive{refusing: true}
		w := newManagerWorldWrites(t, agent, nil, func(s persistence.Store) persistence.Store { store.Store = s; return store })
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		if r := w.deliver(t, "m2", "two"); r.Disposition != platforms.Queued {
			t.Fatalf("m2: %+v, want queued", r)
		}
		if r := w.withdraw(t, "m2"); r.Withdrawn || r.Error == "" {
			t.Fatalf("withdrawal whose archive is refused = %+v, want not withdrawn, with the error", r)
		}
		close(gate)
		time.Sleep(time.Minute)
		synctest.Wait()
		for _, id := range []string{"m1", "m2"} {
			if n := ran(id); n != 1 {
				t.Errorf("the agent ran %s %d times, want once", id, n)
			}
			if st, _ := w.statusOf(t, id); st != persistence.StatusDone {
				t.Errorf("%s is %s in the store, want done", id, st)
			}
		}
	})
}

// TestWithdrawalWhileAResultIsHeldIsRefused: while the session holds a turn's result the store
// refused, a withdrawal is answered at once, not withdrawn, and the message runs once the
// result is stored. Before, its archive waited behind the result for the whole outage, and the
// Discord gateway's reader, which asks, with it (found by a review).
func TestWithdrawalWhileAResultIsHeldIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate, gate2 := make(chan struct{}), make(chan struct{})
		agent, ran := holdsM1(gate, gate2)
		disk := &fullDisk{left: 20, result: resultOf("m1")}
		w := newManagerWorldWrites(t, agent, nil, func(s persistence.Store) persistence.Store { disk.Store = s; return disk })
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		for _, id := range []string{"m2", "m3"} { // m2 runs on while m1's result is held; m3 waits
			if r := w.deliver(t, id, id); r.Disposition != platforms.Queued {
				t.Fatalf("%s: %+v, want queued", id, r)
			}
		}
		close(gate)
		synctest.Wait()
		if disk.refusedResults() == 0 {
			t.Fatal("the store took the turn's result: the test does not test")
		}
		f := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &Withdraw{Source: sourceToProto(w.src), MessageId: "m3"}}, time.Hour)
		res, err := f.Result() // (under the old code, it came once the store took the result)
		if err != nil {
			t.Fatal(err)
		}
		if r := res.(*WithdrawResult); r.Withdrawn || r.Error == "" {
			t.Errorf("withdrawal while a result is held = %+v, want refused at once", r)
		}
		close(gate2)
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		for _, id := range []string{"m1", "m2", "m3"} {
			if n := ran(id); n != 1 {
				t.Errorf("the agent ran %s %d times, want once", id, n)
			}
			if st, _ := w.statusOf(t, id); st != persistence.StatusDone {
				t.Errorf("%s is %s in the store, want done", id, st)
			}
		}
	})
}

// TestWithdrawalOfAnInterruptIsRefused: in interrupt mode m2 cuts m1's turn short and waits
// while m1's call ends; m2's sender deletes it. It is not withdrawn: m1, cut short, is answered
// with it, and taken back, it would leave m1 unanswered until the user writes again (found by
// a review).
func TestWithdrawalOfAnInterruptIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := &slowToEnd{ending: 3 * time.Second}
		w := newManagerWorld(t, agent, func(d *Deps) { d.Config.QueueMode = ModeInterrupt })
		w.deliver(t, "m1", "first")
		synctest.Wait()
		if r := w.deliver(t, "m2", "second"); r.Disposition != platforms.Interrupted {
			t.Fatalf("m2: %+v, want interrupted", r)
		}
		if r := w.withdraw(t, "m2"); r.Withdrawn {
			t.Errorf("withdrawal of the message that cut m1 short = %+v, want it left to run", r)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		var answer *platforms.Outbound
		for len(w.sent) > 0 {
			if o := (<-w.sent).Out; o.TurnEnd {
				answer = o
			}
		}
		if answer == nil || !slices.Equal(answer.InReplyTo, []string{"m1", "m2"}) {
			t.Errorf("the answer: %+v, want it to answer m1 and m2", answer)
		}
	})
}

// rowOf reads the stored row of the world's message id.
func (w *managerWorld) rowOf(t *testing.T, id string) *persistence.Message {
	t.Helper()
	m, err := w.store.FindInbound(w.ctx, w.src.Platform, w.src.ChatID, id)
	if err != nil {
		t.Fatalf("FindInbound(%s): %v", id, err)
	}
	return m
}

// TestDeletedSpilledMessageIsWithdrawn: a message of a queue past its cap, which waits in the
// store only (spill.go), is withdrawn when its sender deletes it, as one in memory is: it never
// runs, its row is archived, and a restart does not run it again; nor is one of a restart's
// backlog past the cap, spilled from the start. The others run, in order. Before, the session
// looked for it in memory only: it was not withdrawn, and ran and was answered.
func TestDeletedSpilledMessageIsWithdrawn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		a := newRequeueAgent()
		w := newManagerWorldAt(t, path, a, func(d *Deps) { d.Config.QueueCap = 2 })
		if r := w.deliver(t, "m0", "hold"); r.Disposition != platforms.Started {
			t.Fatalf("m0: %+v, want started", r)
		}
		w.flood(t, 1, 8, 16)
		if r := w.withdraw(t, "m6"); !r.Withdrawn || r.Error != "" {
			t.Fatalf("withdrawal of m6, spilled = %+v, want withdrawn", r)
		}
		if r := w.withdraw(t, "m6"); r.Withdrawn || r.Error != "" {
			t.Errorf("second withdrawal of m6 = %+v, want nothing to withdraw", r)
		}
		if m := w.rowOf(t, "m6"); m.Active || !m.Archived {
			t.Errorf("m6's row = %+v, want archived", m)
		}
		w.stop() // m0's turn is cut short: it and the rest wait in the store
		synctest.Wait()

		b := newRequeueAgent()
		b.holdAll.Store(true)
		w2 := newManagerWorldAt(t, path, b, func(d *Deps) { d.Config.QueueCap = 2 })
		if r := w2.deliver(t, "m9", "m9"); r.Disposition != platforms.Queued {
			t.Fatalf("m9: %+v, want queued behind the backlog", r)
		}
		synctest.Wait() // loaded: m0 runs again, m7 waits in the store past the cap
		if r := w2.withdraw(t, "m7"); !r.Withdrawn || r.Error != "" {
			t.Fatalf("withdrawal of m7, spilled at the start = %+v, want withdrawn", r)
		}
		close(b.hold)
		w2.awaitTurnEnds(8)
		synctest.Wait()
		if got, want := b.order(), []string{"m0", "m1", "m2", "m3", "m4", "m5", "m8", "m9"}; !slices.Equal(got, want) {
			t.Errorf("after the restart turns ran %v, want %v: not the withdrawn m6 and m7", got, want)
		}
		for _, id := range []string{"m6", "m7"} {
			if m := w2.rowOf(t, id); m.Active || !m.Archived || m.Status != persistence.StatusPending {
				t.Errorf("%s's row = %+v, want archived unrun", id, m)
			}
		}
	})
}

// TestRefusedWithdrawalOfASpilledMessageRunsIt: a spilled message whose withdrawal's archive
// the store refuses runs after all, in its place, once; while the archive was in flight, the
// read of the spill back passed over it.
func TestRefusedWithdrawalOfASpilledMessageRunsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		store := &refuseArchive{refusing: true}
		w := newManagerWorldWrites(t, a, func(d *Deps) { d.Config.QueueCap = 2 },
			func(s persistence.Store) persistence.Store { store.Store = s; return store })
		w.deliver(t, "m0", "hold")
		ids := w.flood(t, 1, 8, 16)
		if r := w.withdraw(t, "m6"); r.Withdrawn || r.Error == "" {
			t.Fatalf("withdrawal whose archive is refused = %+v, want not withdrawn, with the error", r)
		}
		store.mu.Lock()
		store.refusing = false
		store.mu.Unlock()
		if r := w.withdraw(t, "m7"); !r.Withdrawn || r.Error != "" {
			t.Fatalf("withdrawal of m7 = %+v, want withdrawn", r)
		}
		close(a.hold)
		w.awaitTurnEnds(8)
		synctest.Wait()
		want := append([]string{"m0"}, slices.DeleteFunc(ids, func(id string) bool { return id == "m7" })...)
		if got := a.order(); !slices.Equal(got, want) {
			t.Errorf("turns ran %v, want %v", got, want)
		}
	})
}

// holdArchive holds the commits that archive rows until release is closed.
type holdArchive struct {
	persistence.Store
	release chan struct{}
}

func (h *holdArchive) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	if slices.ContainsFunc(groups, func(g []persistence.Op) bool {
		return slices.ContainsFunc(g, func(op persistence.Op) bool { _, ok := op.(*persistence.ArchiveMessages); return ok })
	}) {
		<-h.release
	}
	return h.Store.Commit(ctx, groups)
}

// TestSpilledMessageWithdrawnIsNotReadBackBeforeItsArchive: the spilled messages read back while
// the archive of one withdrawn among them is in flight (its row pending still) do not include
// it: it never runs.
func TestSpilledMessageWithdrawnIsNotReadBackBeforeItsArchive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		store := &holdArchive{release: make(chan struct{})}
		w := newManagerWorldWrites(t, a, func(d *Deps) { d.Config.QueueCap = 2 },
			func(s persistence.Store) persistence.Store { store.Store = s; return store })
		w.deliver(t, "m0", "hold")
		ids := w.flood(t, 1, 6, 16)
		withdrawn := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &Withdraw{Source: sourceToProto(w.src), MessageId: "m3"}}, time.Hour)
		close(a.hold)
		synctest.Wait()
		if got := a.order(); len(got) != 6 {
			t.Fatalf("turns ran %v before the archive landed, want 6: the spill read back past m3", got)
		}
		close(store.release)
		res, err := withdrawn.Result()
		if r, _ := res.(*WithdrawResult); err != nil || r == nil || !r.Withdrawn {
			t.Fatalf("withdrawal of m3 = %v (err %v), want withdrawn", res, err)
		}
		w.awaitTurnEnds(6)
		synctest.Wait()
		want := append([]string{"m0"}, slices.DeleteFunc(ids, func(id string) bool { return id == "m3" })...)
		if got := a.order(); !slices.Equal(got, want) {
			t.Errorf("turns ran %v, want %v", got, want)
		}
	})
}

// TestWithdrawnSpilledMessageWhoseAnswerWasLostStaysWithdrawn: a spilled message whose write's
// answer was lost (the session holds it as unsure: it may be stored) and that its sender
// deletes is withdrawn from the store; the key's recovery, which adopts the unsure messages
// the store holds, does not take it back and run it once the spill was read back past it.
// Before, the recovery found its row (archived, pending still) "as written" and ran it.
func TestWithdrawnSpilledMessageWhoseAnswerWasLostStaysWithdrawn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		out := &storetest.Outage{}
		blind := &blindReads{}
		w := newManagerWorldWrites(t, a, func(d *Deps) { d.Config.QueueCap = 2; d.Fencing = true; blind.wrap(d) },
			func(s persistence.Store) persistence.Store { out.Store = s; return out })
		w.deliver(t, "m0", "hold")
		ids := w.flood(t, 1, 4, 16)
		out.Lost.Store(1)
		blind.on.Store(true) // the session cannot read whether the write applied
		if r := w.deliver(t, "lost", "lost"); r.ErrorCode != "unavailable" {
			t.Fatalf("lost, whose commit answer is lost: %+v, want unavailable", r)
		}
		blind.on.Store(false)
		if r := w.deliver(t, "after", "after"); r.Disposition != platforms.Queued {
			t.Fatalf("after: %+v, want queued", r)
		}
		if r := w.withdraw(t, "lost"); !r.Withdrawn || r.Error != "" {
			t.Fatalf("withdrawal of lost, spilled = %+v, want withdrawn", r)
		}
		close(a.hold)
		w.awaitTurnEnds(6)
		synctest.Wait() // the spill read back past it
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &Recover{}})
		synctest.Wait()
		if want := append(append([]string{"m0"}, ids...), "after"); !slices.Equal(a.order(), want) {
			t.Errorf("turns ran %v, want %v: not the withdrawn one", a.order(), want)
		}
		if m := w.rowOf(t, "lost"); m.Active || !m.Archived || m.Status != persistence.StatusPending {
			t.Errorf("lost's row = %+v, want archived unrun", m)
		}
	})
}

// holdRefuseArchive holds the commits that archive rows until release is closed, then refuses
// them (the store failing meanwhile); other commits go through.
type holdRefuseArchive struct {
	persistence.Store
	release chan struct{}
}

func (h *holdRefuseArchive) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	errs := make([]error, len(groups))
	var rest [][]persistence.Op
	var at []int
	for i, g := range groups {
		if len(g) <= 2 && slices.ContainsFunc(g, func(op persistence.Op) bool { _, ok := op.(*persistence.ArchiveMessages); return ok }) &&
			!slices.ContainsFunc(g, func(op persistence.Op) bool { _, ok := op.(*persistence.SetMessageStatus); return ok }) {
			<-h.release
			errs[i] = fmt.Errorf("%w: disk full (test)", persistence.ErrUnavailable)
			continue
		}
		rest, at = append(rest, g), append(at, i)
	}
	if len(rest) > 0 {
		for j, err := range h.Store.Commit(ctx, rest) {
			errs[at[j]] = err
		}
	}
	return errs
}

// TestRefusedWithdrawalAfterANewSessionRunsNothing: a message withdrawn while a /new ends its
// session, the withdrawal's archive in flight, and whose archive the store then refuses, is
// dropped as the /new dropped the queue: it does not run in the new session, and its row is
// set aside (failed, archived), not left pending; so in the queue in memory and among the
// spilled messages. Before, the one in memory went back into the queue, now the new session's,
// and ran there (the deleted message answered after the /new), and a spilled one's row stayed
// pending in the ended session, to run if it was resumed.
func TestRefusedWithdrawalAfterANewSessionRunsNothing(t *testing.T) {
	refusedWithdrawalAfter(t, "/new")
}

// TestRefusedWithdrawalAfterAStopRunsNothing: as TestRefusedWithdrawalAfterANewSessionRunsNothing,
// with a /stop, which drops the queue (and cancels the turn) but leaves the session current: the
// withdrawn message, in memory or spilled, is set aside as the /stop set the queue aside. Before,
// the refused archive put it back in the queue, behind the /stop, and it ran and was answered.
func TestRefusedWithdrawalAfterAStopRunsNothing(t *testing.T) {
	refusedWithdrawalAfter(t, "/stop")
}

// refusedWithdrawalAfter withdraws a message queued in memory (m2), or a spilled one (m4), each
// in a subtest, holds its archive while cmd, a command that drops the queue, runs, then refuses
// the archive, and checks that the message neither runs nor stays pending.
func refusedWithdrawalAfter(t *testing.T, cmd string) {
	for _, id := range []string{"m2", "m4"} { // in memory; spilled
		t.Run(id, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := newRequeueAgent()
				store := &holdRefuseArchive{release: make(chan struct{})}
				w := newManagerWorldWrites(t, a, func(d *Deps) { d.Config.QueueCap = 2 },
					func(s persistence.Store) persistence.Store { store.Store = s; return store })
				w.deliver(t, "m0", "hold")
				w.flood(t, 1, 4, 16)
				withdrawn := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &Withdraw{Source: sourceToProto(w.src), MessageId: id}}, time.Hour)
				synctest.Wait()
				n := w.request("n1", cmd)
				synctest.Wait()
				close(store.release)
				if _, err := n.Result(); err != nil {
					t.Fatalf("%s: %v", cmd, err)
				}
				if _, err := withdrawn.Result(); err != nil {
					t.Fatalf("withdrawal of %s: %v", id, err)
				}
				close(a.hold)
				if r := w.deliver(t, "m5", "m5"); r.ErrorCode != "" {
					t.Fatalf("m5: %+v", r)
				}
				w.awaitTurnEnds(2)
				synctest.Wait()
				if got := a.order(); slices.Contains(got, id) {
					t.Errorf("turns ran %v: the withdrawn %s too", got, id)
				}
				if m := w.rowOf(t, id); m.Status == persistence.StatusPending && m.Active {
					t.Errorf("%s's row = %+v, left pending after the %s", id, m, cmd)
				}
			})
		})
	}
}

// spoolWorld is a world whose persistence actor spools the writes out refuses (out.Down) in
// dir/spool, and replays them every second, with a queue cap of 2. A spool left by an earlier
// world is replayed before any session loads, as the daemon's start waits for it
// (supervisor's awaitReplay): the world starts spooling, or its manager's first sweep could
// load a session before the persistence actor, started at the same time, sets the flag.
// It returns the world and how many batches the spool held when it opened.
func spoolWorld(t *testing.T, dir string, out *storetest.Outage, a agents.Agent) (*managerWorld, int) {
	t.Helper()
	return spoolWorldThrough(t, dir, out, a, nil)
}

// spoolWorldThrough is spoolWorld whose spool is wrap's (one that fails on cue), when wrap is
// not nil; setup may change the Deps further.
func spoolWorldThrough(t *testing.T, dir string, out *storetest.Outage, a agents.Agent, wrap func(persistence.Spooler) persistence.Spooler,
	setup ...func(*Deps)) (*managerWorld, int) {
	t.Helper()
	opened, err := spool.Open(filepath.Join(dir, "spool"))
	if err != nil {
		t.Fatal(err)
	}
	left := opened.Len() // (read before the persistence actor, which owns the spool, starts)
	var sp persistence.Spooler = opened
	if wrap != nil {
		sp = wrap(sp)
	}
	var deps *Deps
	return newManagerWorldWith(t, filepath.Join(dir, "agentgate.db"), a,
		func(d *Deps) {
			deps, d.Config.QueueCap = d, 2
			d.Spooling.Store(left > 0)
			for _, f := range setup {
				f(d)
			}
		},
		out.Wrap,
		func(o *persistence.ActorOptions) {
			o.Spool, o.Spooling, o.ReplayEvery = sp, &deps.Spooling, time.Second
		}), left
}

// fullSpool is a spool whose appends fail (its disk full) while full is set.
type fullSpool struct {
	persistence.Spooler
	full atomic.Bool
}

func (f *fullSpool) Append(groups [][]persistence.Op) (string, error) {
	if f.full.Load() {
		return "", errors.New("write spool batch: no space left on device (test)")
	}
	return f.Spooler.Append(groups)
}

// TestRefusedWithdrawalOfASpilledMessageInTheSpoolRunsIt: while writes wait in the spool, a
// spilled message whose withdrawal's archive is refused (the spool's disk full too) is put back
// among the spilled messages: it runs in its place once the spool is replayed, once; and the
// withdrawal of another, once the spool takes writes again, withdraws it.
func TestRefusedWithdrawalOfASpilledMessageInTheSpoolRunsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		full := &fullSpool{}
		a := newRequeueAgent()
		w, _ := spoolWorldThrough(t, t.TempDir(), out, a, func(s persistence.Spooler) persistence.Spooler { full.Spooler = s; return full })
		w.deliver(t, "m0", "hold")
		ids := w.flood(t, 1, 2, 10)
		out.Down.Store(true)
		ids = append(ids, w.flood(t, 3, 10, 10)...)
		full.full.Store(true)
		if r := w.withdraw(t, "m6"); r.Withdrawn || r.Error == "" {
			t.Fatalf("withdrawal of m6 whose archive is refused = %+v, want not withdrawn, with the error", r)
		}
		full.full.Store(false)
		if r := w.withdraw(t, "m7"); !r.Withdrawn || r.Error != "" {
			t.Fatalf("withdrawal of m7 = %+v, want withdrawn", r)
		}
		close(a.hold)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		out.Down.Store(false)
		want := append([]string{"m0"}, slices.DeleteFunc(ids, func(id string) bool { return id == "m7" })...)
		w.awaitTurnEndsWithin(t, len(want), time.Minute)
		synctest.Wait()
		if got := a.order(); !slices.Equal(got, want) {
			t.Errorf("turns ran %v, want %v: m6 in its place, not m7", got, want)
		}
	})
}

// TestDeletedSpilledMessageInTheSpoolIsWithdrawn: while the database fails and writes wait in
// the spool, a message past the queue's cap (spilled) that its sender deletes is withdrawn,
// although the database does not hold it yet: its archive follows its write in the spool, and
// once the spool is replayed it does not run, nor after a restart that replays the spool. Before,
// the withdrawal looked for it in the database only, found nothing, and it ran and was answered.
func TestDeletedSpilledMessageInTheSpoolIsWithdrawn(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprint("restart=", restart), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir := t.TempDir()
				out := &storetest.Outage{}
				a := newRequeueAgent()
				w, _ := spoolWorld(t, dir, out, a)
				w.deliver(t, "m0", "hold")
				ids := w.flood(t, 1, 2, 10)
				out.Down.Store(true)
				ids = append(ids, w.flood(t, 3, 10, 10)...)
				if r := w.withdraw(t, "m6"); !r.Withdrawn || r.Error != "" {
					t.Fatalf("withdrawal of m6, spilled and in the spool = %+v, want withdrawn", r)
				}
				if r := w.withdraw(t, "m6"); r.Withdrawn || r.Error != "" {
					t.Errorf("second withdrawal of m6 = %+v, want nothing to withdraw", r)
				}
				ids = slices.DeleteFunc(ids, func(id string) bool { return id == "m6" })
				if r := w.deliver(t, "m11", "m11"); r.Disposition != platforms.Queued || int(r.QueueDepth) != len(ids)+1 {
					t.Errorf("m11: %s, queue depth %d; want queued, depth %d: not counting m6", r.Disposition, r.QueueDepth, len(ids)+1)
				}
				ids = append(ids, "m11")
				want := append([]string{"m0"}, ids...)
				if restart {
					w.stop() // m0's turn is cut short: it runs again
					synctest.Wait()
					out.Down.Store(false)
					a = newRequeueAgent()
					close(a.hold)
					var left int
					if w, left = spoolWorld(t, dir, out, a); left == 0 {
						t.Fatal("the spool was empty at the restart: the test does not test")
					}
					w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &Recover{}})
				} else {
					close(a.hold)
					time.Sleep(10 * time.Second)
					synctest.Wait()
					out.Down.Store(false)
				}
				w.awaitTurnEndsWithin(t, len(want), time.Minute)
				synctest.Wait()
				if got := a.order(); !slices.Equal(got, want) {
					t.Errorf("turns ran %v, want %v: not the withdrawn m6", got, want)
				}
				if m := w.rowOf(t, "m6"); m.Active || !m.Archived || m.Status != persistence.StatusPending {
					t.Errorf("m6's row = %+v, want archived unrun", m)
				}
			})
		})
	}
}

// TestDeletedRunningMessageWhileTheSpoolHoldsMoreThanItRemembersIsNoError: while writes wait in
// the spool and the session has forgotten the oldest of its spilled messages there (more than
// maxSpooledIDs), the deletion of a message the store shows outside the spilled ones (its turn
// running) is no error: nothing to withdraw, as without a spool. One the store does not show
// (forgotten, in the spool) is the error that says it may be one of the oldest. Before, the
// running one got that error too, and the platform warned that a message past the queue's cap
// was not withdrawn.
func TestDeletedRunningMessageWhileTheSpoolHoldsMoreThanItRemembersIsNoError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		a := newRequeueAgent()
		w, _ := spoolWorld(t, t.TempDir(), out, a)
		w.deliver(t, "m0", "hold")
		w.flood(t, 1, 2, 10)
		out.Down.Store(true)
		// Sent at once, written in a few spool batches (the first two spilled are forgotten).
		var sent []*actor.Future
		for i := 3; i <= maxSpooledIDs+4; i++ {
			sent = append(sent, w.request(fmt.Sprint("m", i), "x"))
		}
		for i, f := range sent {
			if r, err := f.Result(); err != nil || r.(*DeliverResult).Disposition != platforms.Queued {
				t.Fatalf("m%d: %v %v, want queued", i+3, r, err)
			}
		}
		if r := w.withdraw(t, "m0"); r.Withdrawn || r.Error != "" {
			t.Errorf("withdrawal of m0, running = %+v, want nothing to withdraw, no error", r)
		}
		if r := w.withdraw(t, "m3"); r.Withdrawn || !strings.Contains(r.Error, "oldest") {
			t.Errorf("withdrawal of m3, spilled, in the spool and forgotten = %+v, want the error that says so", r)
		}
		if r := w.withdraw(t, "m5"); !r.Withdrawn || r.Error != "" {
			t.Errorf("withdrawal of m5, spilled, in the spool = %+v, want withdrawn", r)
		}
	})
}

// leakySpool is a spool whose appends, while leak is set, store the batch but report that they
// failed: the spool's own case of a batch whose directory entry may not be durable and that it
// could not take back (spool.Append: "it is there and will be replayed").
type leakySpool struct {
	persistence.Spooler
	leak atomic.Bool
}

func (l *leakySpool) Append(groups [][]persistence.Op) (string, error) {
	name, err := l.Spooler.Append(groups)
	if err == nil && l.leak.Load() {
		return "", fmt.Errorf("spool append %s: sync spool directory: input/output error (test)", name)
	}
	return name, err
}

// TestWithdrawnMessageSpooledTwiceDoesNotRun: a message whose first write went to the spool
// though the spool reported it failed (its sender told it was not stored), sent again and
// spooled again under a later seq while the database fails, and then deleted by its sender, does
// not run: at the replay the first copy is stored and the second refused as its duplicate, and
// the withdrawal archives the first copy too. Spilled past the queue's cap (in the spool, read
// back once it drains) and in memory (run from the store after a restart). Before, the
// withdrawal archived the second copy's seq only, which the database never held, reported the
// message withdrawn, and the first copy ran and was answered.
func TestWithdrawnMessageSpooledTwiceDoesNotRun(t *testing.T) {
	for _, spilled := range []bool{true, false} {
		t.Run(fmt.Sprint("spilled=", spilled), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir := t.TempDir()
				out := &storetest.Outage{}
				leaky := &leakySpool{}
				a := newRequeueAgent()
				w, _ := spoolWorldThrough(t, dir, out, a, func(s persistence.Spooler) persistence.Spooler { leaky.Spooler = s; return leaky })
				w.deliver(t, "m0", "hold")
				var ids []string
				if spilled {
					ids = w.flood(t, 1, 2, 10)
				}
				out.Down.Store(true)
				if spilled {
					ids = append(ids, w.flood(t, 3, 4, 10)...)
				}
				leaky.leak.Store(true)
				if r := w.deliver(t, "x", "x"); r.ErrorCode != "unavailable" {
					t.Fatalf("x, whose spool append is reported failed: %+v, want unavailable", r)
				}
				leaky.leak.Store(false)
				if r := w.deliver(t, "x", "x"); r.Disposition != platforms.Queued || r.ErrorCode != "" {
					t.Fatalf("x sent again: %+v, want queued", r)
				}
				if r := w.withdraw(t, "x"); !r.Withdrawn || r.Error != "" {
					t.Fatalf("withdrawal of x = %+v, want withdrawn", r)
				}
				want := append([]string{"m0"}, ids...)
				if spilled {
					close(a.hold)
					time.Sleep(10 * time.Second)
					synctest.Wait()
					out.Down.Store(false)
				} else {
					w.stop() // m0's turn is cut short: it runs again
					synctest.Wait()
					out.Down.Store(false)
					a = newRequeueAgent()
					close(a.hold)
					var left int
					if w, left = spoolWorldThrough(t, dir, out, a, func(s persistence.Spooler) persistence.Spooler { leaky.Spooler = s; return leaky }); left == 0 {
						t.Fatal("the spool was empty at the restart: the test does not test")
					}
					w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &Recover{}})
				}
				w.awaitTurnEndsWithin(t, len(want), time.Minute)
				time.Sleep(10 * time.Second)
				synctest.Wait()
				if got := a.order(); !slices.Equal(got, want) {
					t.Errorf("turns ran %v, want %v: not the withdrawn x", got, want)
				}
				if m := w.rowOf(t, "x"); m.Active || !m.Archived || m.Status != persistence.StatusPending {
					t.Errorf("x's row = %+v, want archived unrun", m)
				}
			})
		})
	}
}

// refuseArchiveOnCue holds a commit that archives rows while cue is set, until release is
// closed, and then refuses it as unavailable (the database failing); other commits go through.
type refuseArchiveOnCue struct {
	persistence.Store
	cue     atomic.Bool
	release chan struct{}
}

func (r *refuseArchiveOnCue) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	if r.cue.Load() && slices.ContainsFunc(groups, func(g []persistence.Op) bool {
		return slices.ContainsFunc(g, func(op persistence.Op) bool { _, ok := op.(*persistence.ArchiveMessages); return ok })
	}) {
		<-r.release
		errs := make([]error, len(groups))
		for i := range errs {
			errs[i] = fmt.Errorf("%w: connection refused (test)", persistence.ErrUnavailable)
		}
		return errs
	}
	return r.Store.Commit(ctx, groups)
}

// TestRefusedSpooledWithdrawalTheDatabaseCannotReadBackSaysWhatItKnows: a spilled message whose
// write waited in the spool is withdrawn, the database and the spool both refuse its archive,
// the spill is read back past it meanwhile, and the database then cannot be read for it: the
// session's line says what happened (the archive refused by both, the read failed), that the
// message does not run now, and that it runs at the session's next load only if the
// spool's replay stored it, with the message, its seq and both errors. Before, it said the store
// refused the withdrawal and that the message stayed pending in the store and ran at a restart,
// though the session could not read the store, and the replay may have set the write aside.
func TestRefusedSpooledWithdrawalTheDatabaseCannotReadBackSaysWhatItKnows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testutil.Buffer
		out := &storetest.Outage{}
		cue := &refuseArchiveOnCue{release: make(chan struct{})}
		full := &fullSpool{}
		blind := &blindReads{}
		opened, err := spool.Open(filepath.Join(t.TempDir(), "spool"))
		if err != nil {
			t.Fatal(err)
		}
		full.Spooler = opened
		a := newRequeueAgent()
		var deps *Deps
		w := newManagerWorldWith(t, filepath.Join(t.TempDir(), "agentgate.db"), a,
			func(d *Deps) {
				deps, d.Config.QueueCap = d, 2
				d.Log = slog.New(slog.NewTextHandler(&logs, nil))
				blind.wrap(d)
			},
			func(s persistence.Store) persistence.Store { cue.Store = s; out.Store = cue; return out },
			func(o *persistence.ActorOptions) {
				o.Spool, o.Spooling, o.ReplayEvery = full, &deps.Spooling, time.Second
			})
		w.deliver(t, "m0", "hold")
		w.flood(t, 1, 2, 10)
		out.Down.Store(true)
		w.flood(t, 3, 6, 10) // spilled, their writes in the spool
		out.Down.Store(false)
		time.Sleep(2 * time.Second) // the spool replayed
		synctest.Wait()
		if deps.Spooling.Load() {
			t.Fatal("the spool did not drain")
		}
		cue.cue.Store(true)
		m4 := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &Withdraw{Source: sourceToProto(w.src), MessageId: "m4"}}, time.Hour)
		synctest.Wait() // m4's archive held
		cue.cue.Store(false)
		// m1 leaves the queue in memory: the spill is read back, past m4, whose archive is in
		// flight.
		m1 := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &Withdraw{Source: sourceToProto(w.src), MessageId: "m1"}}, time.Hour)
		synctest.Wait() // its archive waits behind m4's
		blind.on.Store(true)
		full.full.Store(true)
		close(cue.release)
		if r, err := m1.Result(); err != nil || !r.(*WithdrawResult).Withdrawn {
			t.Fatalf("withdrawal of m1 = %+v %v, want withdrawn", r, err)
		}
		res, err := m4.Result()
		if err != nil {
			t.Fatal(err)
		}
		if r := res.(*WithdrawResult); r.Withdrawn || r.Error == "" {
			t.Fatalf("withdrawal of m4 whose archive both refused = %+v, want not withdrawn, with the error", r)
		}
		blind.on.Store(false)
		full.full.Store(false)
		const want = "a message its sender deleted could not be withdrawn (the database and the spool both refused its archive) nor read back to run in its place (the database did not answer); it does not run now, and runs at the session's next load from the store if the spool's replay stored it"
		logged := logs.String()
		line := ""
		for l := range strings.Lines(logged) {
			if strings.Contains(l, "m4") && strings.Contains(l, "level=WARN") {
				line = l
			}
		}
		if !strings.Contains(line, want) || !strings.Contains(line, "message_id=m4") || !strings.Contains(line, "seq=") ||
			!strings.Contains(line, "connection refused (test)") || !strings.Contains(line, "no space left on device (test)") {
			t.Errorf("the line of m4 = %q, want %q with the message, its seq, the read's error and the archive's\n%s", line, want, logged)
		}
		close(a.hold)
		w.awaitTurnEnds(5) // m0, m2, m3, m5, m6
		synctest.Wait()
		if got, want := a.order(), []string{"m0", "m2", "m3", "m5", "m6"}; !slices.Equal(got, want) {
			t.Errorf("turns ran %v, want %v: not m4 now", got, want)
		}
	})
}
