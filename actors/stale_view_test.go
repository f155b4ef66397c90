package actors

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/asynkron/protoactor-go/actor"
)

// TestActivationAsksAMemberThatAskedItBefore: three members. a runs the key's slow turn, with
// the chat's next message queued behind it, when the key moves: c joined, and its view places
// the key on c. c's activation asks a (which holds the key, and hands it on once its turn is
// done) and b (which holds nothing of it yet). Then b activates the key too: b has not renewed
// since c joined, so its view knows only a and places the key on b, and the store names a as
// the key's holder (c has not claimed it yet). b asks a, and waits for it as c does. When a
// lets go, the two must not both claim the key: b remembers that c, a member its view does not
// list, asked it for the key, and asks c too; the two activations rank, and one of them runs the
// next message, once.
//
// Before, b asked only a: a's "let go" reached b and c at once, both claimed the key, and the
// next message ran on both, the first run's result fenced (TestClusterHunt, seed 2, under load:
// m37 ran on m4 and on m5, which had joined during a rolling restart).
func TestActivationAsksAMemberThatAskedItBefore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		agent, ran := slowUntil(release)
		var ownerA, ownerB, ownerC atomic.Pointer[actor.PID]
		w := clusterWorld(t, agent)
		member := func(node string) (*Deps, *actor.PID) {
			d := &Deps{Ctx: w.ctx, Store: w.store, Agent: agent, Platforms: w.d.Platforms, Log: w.d.Log,
				Metrics: metrics.New("fake"), Node: node, Config: w.d.Config, Persist: w.d.Persist, Fencing: true, Clustered: true}
			pid := w.system.Root.Spawn(NewSessionManager(d))
			t.Cleanup(func() { _ = w.system.Root.StopFuture(pid).Wait() })
			return d, pid
		}
		db, b := member("b")
		dc, c := member("c")
		nodes := map[string]*actor.PID{"a": w.manager, "b": b, "c": c}
		w.d.Placement = storedPlacement{peersPlacement{self: w.manager, peers: []*actor.PID{b}, owner: &ownerA}, w.store, nodes}
		db.Placement = storedPlacement{peersPlacement{self: b, peers: []*actor.PID{w.manager}, owner: &ownerB}, w.store, nodes}
		dc.Placement = storedPlacement{peersPlacement{self: c, peers: []*actor.PID{w.manager, b}, owner: &ownerC}, w.store, nodes}
		ownerA.Store(w.manager)
		ownerB.Store(b)
		ownerC.Store(c)

		slow := w.request("m1", "slow")
		synctest.Wait()
		if res := w.deliver(t, "m2", "next"); res.Disposition != "queued" {
			t.Fatalf("the next message: %+v, want it queued behind the slow turn", res)
		}
		ownerA.Store(c) // a hears of c: the key is c's now
		w.system.Root.Send(c, &Routed{Key: w.key, Msg: &Recover{}})
		synctest.Wait()
		w.system.Root.Send(b, &Routed{Key: w.key, Msg: &Recover{}})
		synctest.Wait()
		if own, err := w.store.Ownership(w.ctx, w.key); err != nil || own.Owner != "a" {
			t.Errorf("while a ran the turn the key's claim is %+v (%v), want a's", own, err)
		}

		close(release)
		if res, err := slow.Result(); err != nil || res.(*DeliverResult).Disposition != "started" {
			t.Errorf("the slow message: %+v %v, want started", res, err)
		}
		// a's reply to the slow message, then the next message's, perhaps after a's reply sent
		// again by the member that loads the key (the world's platform confirms nothing).
		ranOnceEach(t, w, ran)
	})
}

// ranOnceEach waits for the next message to run (at most a minute), then long enough for a
// second run of either, and checks that the agent ran the slow message and the next once each.
func ranOnceEach(t *testing.T, w *managerWorld, ran func(string) int) {
	t.Helper()
	deadline := time.After(time.Minute)
	for ran("next") == 0 {
		select {
		case <-w.sent:
		case <-deadline:
			t.Fatal("the next message never ran")
		}
	}
	time.Sleep(2 * releaseTries * releaseAnswerTimeout) // long enough for a second run
	synctest.Wait()
	if ran("slow") != 1 || ran("next") != 1 {
		t.Errorf("the agent ran the slow message %d times and the next %d, want once each", ran("slow"), ran("next"))
	}
}
