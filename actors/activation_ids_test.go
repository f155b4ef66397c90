package actors

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/asynkron/protoactor-go/actor"
)

// panicsOnce is a Placement whose Peers panics once boom is set: the activation that asks for
// them fails, and the manager's supervisor restarts the manager.
type panicsOnce struct {
	Placement
	boom *atomic.Bool
}

func (p panicsOnce) Peers() []*actor.PID {
	if p.boom.CompareAndSwap(true, false) {
		panic("the placement fails")
	}
	return p.Placement.Peers()
}

// TestLateAnswerToAnEarlierIncarnationIsNotTaken: member b holds the key and says so to a's
// activation, whose manager then restarts (a panic; a member restarted on its address is the same
// case: its manager's PID is the same). The new incarnation activates the key again and b says
// it holds it again. An answer b sends late to the first activation (it let go of the key for it
// once its turn ended, and took it again since) must not end the second one's wait: the key's
// requests keep going to b, and nothing runs here.
//
// Before, a manager numbered its activations from 1 in every incarnation: the second activation
// had the first one's number, took b's late answer for its own, and started the session here
// while b still held the key (the next message ran here, beside b's turn).
func TestLateAnswerToAnEarlierIncarnationIsNotTaken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ran atomic.Int32
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			ran.Add(1)
			return echo.New().Run(ctx, req)
		})
		w := clusterWorld(t, agent)
		releases := make(chan *Release, 8)
		forwards := make(chan *Forward, 8)
		b := w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			switch m := c.Message().(type) {
			case *Release:
				releases <- m
				c.Respond(&Released{Key: m.Key, Address: c.Self().Address, Id: c.Self().Id, Holding: true, Activation: m.Activation})
			case *Forward:
				forwards <- m
			}
		}))
		var owner atomic.Pointer[actor.PID]
		var boom atomic.Bool
		w.d.Placement = panicsOnce{peersPlacement{self: w.manager, peers: []*actor.PID{b}, owner: &owner}, &boom}
		owner.Store(w.manager)

		w.request("m1", "first")
		synctest.Wait()
		first := <-releases
		<-forwards // m1 went to b, which holds the key

		// The manager restarts: another chat's activation meets a failing placement.
		boom.Store(true)
		other := w.src
		other.ChatID = "other"
		w.system.Root.Send(w.manager, &Routed{Key: "other-key", Msg: &Deliver{SessionKey: "other-key", Source: sourceToProto(other),
			MessageId: "o1", Text: "boom", ReceivedAtUnixNano: time.Now().UnixNano()}})
		synctest.Wait()

		w.request("m2", "second")
		synctest.Wait()
		second := <-releases
		<-forwards // m2 went to b too
		// b's late answer to the first activation: it let go of the key for it.
		w.system.Root.Send(w.manager, &Released{Key: w.key, Address: b.Address, Id: b.Id, Activation: first.Activation})
		synctest.Wait()

		w.request("m3", "third")
		synctest.Wait()
		select {
		case f := <-forwards:
			if d := f.GetDeliver(); d == nil || d.MessageId != "m3" {
				t.Errorf("b was forwarded %v, want m3", f)
			}
		default:
			t.Errorf("m3 did not go to b, which still holds the key for activation %d (the late answer was for %d)",
				second.Activation, first.Activation)
		}
		if n := ran.Load(); n != 0 {
			t.Errorf("%d turns ran here while b held the key, want none", n)
		}
	})
}
