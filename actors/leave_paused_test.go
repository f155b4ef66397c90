package actors

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/asynkron/protoactor-go/actor"
)

// TestLeavingManagersDrainDoesNotWaitOutAPauseOfAKeyNoMemberTakes: on a leaving member with no
// member to take a key over (Leave.Successor answers nil: the members it would hand to leave
// too), the store refuses a command's write while the key's turn runs (a full disk), and the
// session starts again from the store after a pause. The session will hand nothing on: the
// drain ends once no turn runs, and the stop that follows stops the key's pause, as a single
// daemon's does. The message whose turn the refusal cut short stays pending in the store, and
// the next start runs it. Before, the drain waited for the key's pause (1 s doubling to a
// minute) and for the turn run again after it: each such stop was held that long.
func TestLeavingManagersDrainDoesNotWaitOutAPauseOfAKeyNoMemberTakes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		agent, ran := slowUntil(release)
		out := &storetest.Outage{}
		w := newManagerWorldWrites(t, agent, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true },
			func(s persistence.Store) persistence.Store { out.Store = s; return out })
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return nil }})
		if res := w.deliver(t, "m1", "slow"); res.Disposition != "started" {
			t.Fatalf("m1: %+v, want it run here", res)
		}
		drained := w.drain()
		synctest.Wait()
		if answered(drained) {
			t.Fatal("the drain was answered while m1's turn ran")
		}

		out.Down.Store(true) // the disk fills: the store refuses every write until the test ends
		if res := w.deliver(t, "k1", "/title refused"); res.ErrorCode == "" {
			t.Fatalf("/title: %+v, want it refused", res)
		}
		synctest.Wait() // m1's turn is cancelled, and the key waits out its pause
		if l := w.list(t); len(l.Keys) != 0 || len(l.Busy) != 0 || len(l.HandingOn) != 0 {
			t.Errorf("while the key waits out its pause: sessions %v, busy %v, handing on %v; want none", l.Keys, l.Busy, l.HandingOn)
		}
		if !answered(drained) {
			t.Error("the drain waited for the pause of a key no member takes over")
		}
		if err := w.system.Root.PoisonFuture(w.manager).Wait(); err != nil {
			t.Fatal(err)
		}
		if n := ran("slow"); n != 1 {
			t.Errorf("m1 ran %d times on the leaving member, want once (cut short by the refusal)", n)
		}
		w.wantPendingAlone(t, "m1")

		// The next start, once the disk has room: it runs m1.
		out.Down.Store(false)
		close(release)
		d := &Deps{Ctx: w.ctx, Store: w.store, Agent: agent, Platforms: w.d.Platforms, Log: w.d.Log,
			Metrics: metrics.New("fake"), Node: "a", Config: w.d.Config, Persist: w.d.Persist}
		next := w.system.Root.Spawn(NewSessionManager(d))
		t.Cleanup(func() { _ = w.system.Root.StopFuture(next).Wait() })
		for {
			select {
			case s := <-w.sent:
				if slices.Contains(s.Out.InReplyTo, "m1") {
					return
				}
			case <-time.After(time.Minute):
				t.Fatal("m1, left pending by the leaving member's stop, did not run at the next start")
			}
		}
	})
}
