package actors

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
)

// TestResetBehindAHeldResultWaitsBehindIt: an idle reset falls due while m1's turn runs, and is
// written as the turn ends, behind its result; the store refuses the result (a full disk) three
// times, and the reset with it. The session holds both and writes them again, in order, once
// the store takes writes: m1 ran once, its reply went out once, and the session ended after it
// (its reply is in it). A message that comes while the reset waits is refused at once, not run
// in the session that ended before it came; sent again, it begins the next session. Before, the
// reset's refusal had the session start again from the store, which gave up m1's result, and
// m1 ran a second time.
func TestResetBehindAHeldResultWaitsBehindIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		echo, ran := countingEcho()
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			if req.Identity.MessageID == "m1" {
				<-gate
			}
			return echo.Run(ctx, req)
		})
		idle := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Second, Notify: true}
		disk := &fullDisk{left: 3, result: resultOf("m1")}
		w := newManagerWorldWrites(t, agent, func(d *Deps) {
			d.Config.ResetFor = func(string, string) ResetPolicy { return idle }
			d.Config.ResetPolicies = []ResetPolicy{idle}
		}, func(s persistence.Store) persistence.Store { disk.Store = s; return disk })
		m1 := w.deliver(t, "m1", "one")
		if m1.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", m1)
		}
		time.Sleep(time.Minute) // the turn runs past the idle time
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
		synctest.Wait() // due, but the session works: the reset waits for the turn
		close(gate)
		synctest.Wait() // m1's result and the reset behind it are refused
		if disk.refusedResults() != 1 {
			t.Fatalf("the store refused m1's result %d times by now, want 1: the test does not test", disk.refusedResults())
		}
		if r := w.deliver(t, "m2", "two"); r.ErrorCode != ErrCodeUnavailable {
			t.Errorf("m2 while the reset waits behind m1's result: %+v, want it refused as unavailable", r)
		}
		time.Sleep(time.Minute)
		synctest.Wait()

		if got := disk.refusedResults(); got != 3 {
			t.Fatalf("the store refused m1's result %d times, want 3", got)
		}
		if n := ran("m1"); n != 1 {
			t.Errorf("the agent ran m1 %d times, want once", n)
		}
		var sent []string
		for len(w.sent) > 0 {
			sent = append(sent, (<-w.sent).Out.Text)
		}
		if !slices.Equal(sent, []string{"echo: one"}) {
			t.Errorf("sent %q, want m1's reply once", sent)
		}
		sess, err := w.store.Session(w.ctx, m1.SessionId)
		if err != nil {
			t.Fatal(err)
		}
		if sess.EndedAt.IsZero() || sess.EndReason != persistence.EndIdle {
			t.Errorf("m1's session ended at %v (%q), want ended by its idle reset", sess.EndedAt, sess.EndReason)
		}
		history, _, err := w.store.History(w.ctx, m1.SessionId, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(history) != 2 || history[1].Role != persistence.RoleAssistant || history[1].Content != "echo: one" {
			t.Errorf("m1's session holds %+v, want m1 and its reply", history)
		}
		if st, _ := w.statusOf(t, "m1"); st != persistence.StatusDone {
			t.Errorf("m1 is %s in the store, want done", st)
		}
		// Its reset stored, the session that ended passivates, as one whose reset was taken
		// at once does (found by a review: it stayed in memory for passivate_after).
		if p := promtest.ToFloat64(w.d.Metrics.SessionPassivations); p != 1 {
			t.Errorf("%v passivations once the held reset was stored, want 1", p)
		}

		r := w.deliver(t, "m2", "two")
		if r.ErrorCode != "" || r.SessionId == m1.SessionId {
			t.Fatalf("m2 sent again: %+v, want it taken in a new session (not %s)", r, m1.SessionId)
		}
		synctest.Wait() // its turn runs
		next, err := w.store.Session(w.ctx, r.SessionId)
		if err != nil || next.PrevSessionID != m1.SessionId {
			t.Errorf("m2's session %+v (%v), want it to follow %s", next, err, m1.SessionId)
		}
		if n := ran("m2"); n != 1 {
			t.Errorf("the agent ran m2 %d times, want once", n)
		}
	})
}

// TestSetAsideBehindAHeldResultWaitsBehindIt: the key's start sets aside, a page at a time, the
// messages left pending in the session it has left, while "next", the message that started it,
// runs; the page after the one in flight as "next" ends goes out behind its result. The store
// refuses that result (a full disk) three times, and the set-asides behind it. The session holds
// them behind the result and writes them again after it, in order, once the store takes writes:
// "next" ran once, its reply went out once, before the notices of the set-asides held behind it,
// and every message left behind is set aside once. Before, a set-aside's refusal had the
// session start again from the store, which gave up the result, and "next" ran a second time.
func TestSetAsideBehindAHeldResultWaitsBehindIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		ids := storeLeftBehind(t, path, 2*asidePage+10, 16)
		secondPage := func(op persistence.Op) bool {
			m, ok := op.(*persistence.SetMessageStatus)
			return ok && m.SessionID == "s-old" && m.Seqs[0] > asidePage && m.Seqs[0] <= 2*asidePage
		}
		secondSent := make(chan struct{})
		disk := &fullDisk{left: 3, result: resultOf("next")}
		agent, ran := countingEcho()
		w := newManagerWorldWith(t, path, agent, nil, func(s persistence.Store) persistence.Store {
			disk.Store = &waitsFor{Store: s, pick: secondPage, until: secondSent}
			return disk
		}, func(o *persistence.ActorOptions) {
			o.MaxBatch = 1 // the result commits alone: the set-asides ahead of it are taken
		})
		sentSoFar := w.collectSent()
		if r := w.deliver(t, "next", "hello"); r.Disposition != platforms.Started {
			t.Fatalf("next: %+v, want started", r)
		}
		synctest.Wait() // the second page waits in its commit, and next's result behind it
		close(secondSent)
		time.Sleep(time.Minute)
		synctest.Wait()
		sent := sentSoFar()

		if disk.refusedResults() == 0 {
			t.Fatal("the store took next's result at once: the test does not test")
		}
		if n := ran("next"); n != 1 {
			t.Errorf("the agent ran next %d times, want once", n)
		}
		var replies []string
		notices, noticesAfter := 0, 0
		for _, out := range sent {
			switch {
			case out.Text == leftBehindNotice:
				notices++
				if len(replies) > 0 {
					noticesAfter++
				}
			default:
				replies = append(replies, out.Text)
			}
		}
		if !slices.Equal(replies, []string{"echo: hello"}) {
			t.Errorf("replies sent %q, want next's once", replies)
		}
		if held := len(ids) - 2*asidePage; notices != len(ids) || noticesAfter != held {
			t.Errorf("sent %d notices, %d of them after next's reply; want %d, the last page's %d, held behind it, after it",
				notices, noticesAfter, len(ids), held)
		}
		if st, _ := w.statusOf(t, "next"); st != persistence.StatusDone {
			t.Errorf("next is %s in the store, want done", st)
		}
		w.checkSetAside(t, ids, leftBehindNotice)
	})
}

// waitsFor is a store whose commits that hold a write pick picks wait until until is closed.
type waitsFor struct {
	persistence.Store
	pick  func(persistence.Op) bool
	until <-chan struct{}
}

func (s *waitsFor) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	if slices.ContainsFunc(groups, func(g []persistence.Op) bool { return slices.ContainsFunc(g, s.pick) }) {
		<-s.until
	}
	return s.Store.Commit(ctx, groups)
}

// TestResetHeldBehindAResultGivenUpIsDoneAfterTheRerun: an idle reset falls due while m1's turn
// runs and is written behind its result; m2 comes before the store answers and begins the next
// session in memory. The store refuses the result, and the reset and m2's write behind it: m2's
// refusal has the session start again from the store, which gives up the held result and the
// reset. The key's next activation runs m1 again (at least once, as documented for a result
// given up at a hand-over), answers it once, and then does the reset. Without the reset filed
// as it was given up, that activation found the session due by the activity the store held
// (m1's arrival) and set m1 aside with a notice that it was not run, though it had run.
func TestResetHeldBehindAResultGivenUpIsDoneAfterTheRerun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		echo, ran := countingEcho()
		var once sync.Once
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			if req.Identity.MessageID == "m1" {
				once.Do(func() { <-gate })
			}
			return echo.Run(ctx, req)
		})
		idle := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Second, Notify: true}
		disk := &refusesFirst{pick: resultOf("m1"), gate: make(chan struct{})}
		var logs testutil.Buffer
		w := newManagerWorldWrites(t, agent, loggedTo(&logs, func(d *Deps) {
			d.Config.ResetFor = func(string, string) ResetPolicy { return idle }
			d.Config.ResetPolicies = []ResetPolicy{idle}
		}), func(s persistence.Store) persistence.Store { disk.Store = s; return disk })
		m1 := w.deliver(t, "m1", "one")
		time.Sleep(time.Minute)
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
		synctest.Wait()
		close(gate)
		synctest.Wait() // m1's result waits in its commit, and the reset behind it
		m2 := w.request("m2", "two")
		synctest.Wait() // m2's write waits behind them
		close(disk.gate)
		time.Sleep(time.Minute)
		synctest.Wait()

		if disk.refusals() == 0 {
			t.Fatal("the store took m1's result at once: the test does not test")
		}
		if res, err := m2.Result(); err != nil || res.(*DeliverResult).ErrorCode == "" {
			t.Errorf("m2, its write refused behind m1's result: %v %v, want it refused", res, err)
		}
		// The reset and m2, given up as the session started again from the store, say so; no
		// other activation claimed the key (before, their err said "session key claimed by a
		// newer activation").
		if got := linesWith(&logs, `msg="store session reset"`); len(got) != 1 || !strings.Contains(got[0], "given up as the session started again from the store") {
			t.Errorf("lines of the reset given up: %q, want one saying it was given up as the session started again from the store", got)
		}
		if got := linesWith(&logs, "claimed by a newer activation"); len(got) > 0 {
			t.Errorf("a line says another activation claimed the key: %q", got)
		}
		if n := ran("m1"); n != 2 {
			t.Errorf("the agent ran m1 %d times, want twice: its held result was given up, and it ran again", n)
		}
		var sent []string
		for len(w.sent) > 0 {
			sent = append(sent, (<-w.sent).Out.Text)
		}
		if !slices.Equal(sent, []string{"echo: one"}) {
			t.Errorf("sent %q, want m1's reply once", sent)
		}
		if st, _ := w.statusOf(t, "m1"); st != persistence.StatusDone {
			t.Errorf("m1 is %s in the store, want done", st)
		}
		sess, err := w.store.Session(w.ctx, m1.SessionId)
		if err != nil {
			t.Fatal(err)
		}
		if sess.EndedAt.IsZero() || sess.EndReason != persistence.EndIdle {
			t.Errorf("m1's session ended at %v (%q), want ended by its idle reset", sess.EndedAt, sess.EndReason)
		}
	})
}

// TestWritesBehindAHeldResultGoOutOnceItIsTaken: once the store has taken the turn result it
// refused, the writes made behind it go out as any write does: the session holds nothing, and a
// command is answered while a set-aside page is still in its commit. Before (found by a
// review), a set-aside's backlog made behind the held result went out one page at a time, held,
// and until its last page the session answered commands that the store refused writes.
func TestWritesBehindAHeldResultGoOutOnceItIsTaken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		ids := storeLeftBehind(t, path, 5*asidePage+10, 16)
		page := func(n int64) func(persistence.Op) bool {
			return func(op persistence.Op) bool {
				m, ok := op.(*persistence.SetMessageStatus)
				return ok && m.SessionID == "s-old" && m.Seqs[0] > (n-1)*asidePage && m.Seqs[0] <= n*asidePage
			}
		}
		secondSent, fourthSent := make(chan struct{}), make(chan struct{})
		disk := &fullDisk{left: 1, result: resultOf("next")}
		agent, ran := countingEcho()
		w := newManagerWorldWith(t, path, agent, nil, func(s persistence.Store) persistence.Store {
			disk.Store = &waitsFor{Store: &waitsFor{Store: s, pick: page(4), until: fourthSent}, pick: page(2), until: secondSent}
			return disk
		}, func(o *persistence.ActorOptions) {
			o.MaxBatch = 1
		})
		defer w.collectSent()()
		if r := w.deliver(t, "next", "hello"); r.Disposition != platforms.Started {
			t.Fatalf("next: %+v, want started", r)
		}
		synctest.Wait() // the second page waits in its commit, and next's result behind it
		close(secondSent)
		time.Sleep(time.Minute) // next's result is refused, held, and taken; the fourth page waits in its commit
		synctest.Wait()
		if disk.refusedResults() == 0 {
			t.Fatal("the store took next's result at once: the test does not test")
		}
		if st, _ := w.statusOf(t, "next"); st != persistence.StatusDone {
			t.Fatalf("next is %s in the store, want done", st)
		}
		status := w.request("c1", "/status") // its answer's write commits after the fourth page
		synctest.Wait()
		close(fourthSent)
		synctest.Wait()
		if res, err := status.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
			t.Errorf("/status after the held result was taken: %v %v, want it answered", res, err)
		}
		if n := ran("next"); n != 1 {
			t.Errorf("the agent ran next %d times, want once", n)
		}
		w.checkSetAside(t, ids, leftBehindNotice)
	})
}

// collectSent takes what the world's platform is sent, more than w.sent holds, until the
// function it returns is called, which returns it.
func (w *managerWorld) collectSent() func() []*platforms.Outbound {
	var sent []*platforms.Outbound
	stop, drained := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(drained)
		for {
			select {
			case m := <-w.sent:
				sent = append(sent, m.Out)
			case <-stop:
				return
			}
		}
	}()
	return func() []*platforms.Outbound {
		close(stop)
		<-drained
		return sent
	}
}
