package actors

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/asynkron/protoactor-go/actor"
)

// TestHandOverSkipsAWaiterThatDied: member b asks a, which runs the key's turn, to let go of the
// key (Release) and forwards it the chat's next message, which a queues behind the turn. Then b
// dies, and the key is c's in a's view. Once a's turn is done (a minute later), what its session left queued
// goes to the key's owner, c, which runs it: not to b, the waiter that died, where it was lost
// until a recovery sweep.
func TestHandOverSkipsAWaiterThatDied(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		agent, ran := slowUntil(release)
		var owner atomic.Pointer[actor.PID]
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
		w.d.Placement = peersPlacement{self: w.manager, peers: []*actor.PID{b, c}, owner: &owner}
		db.Placement = peersPlacement{self: b, peers: []*actor.PID{w.manager, c}, owner: &owner}
		dc.Placement = peersPlacement{self: c, peers: []*actor.PID{w.manager}, owner: &owner}
		owner.Store(w.manager)

		slow := w.request("m1", "slow")
		synctest.Wait()
		owner.Store(b) // the key moves to b, which asks a to let go of it
		res, err := w.system.Root.RequestFuture(b, &Routed{Key: w.key, Msg: w.message("m2", "next")}, time.Hour).Result()
		if err != nil || res.(*DeliverResult).Disposition != "queued" {
			t.Fatalf("the next message, sent to b: %+v %v, want it queued behind the running turn", res, err)
		}
		synctest.Wait()
		if err := w.system.Root.StopFuture(b).Wait(); err != nil { // b dies
			t.Fatal(err)
		}
		owner.Store(c)          // and the key is c's
		time.Sleep(time.Minute) // while a's turn runs on
		close(release)
		if _, err := slow.Result(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		time.Sleep(time.Minute) // less than any recovery sweep
		synctest.Wait()
		if n := ran("next"); n != 1 {
			t.Errorf("the queued message ran %d times, want once (on c, the key's owner)", n)
		}
	})
}
