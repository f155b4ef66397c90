package actors

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/asynkron/protoactor-go/actor"
)

// TestWaitingSessionStopsWhenItsKeyMoves: a session waiting for the spool whose key goes to
// another member (moved) stops without loading; it must not claim, once the spool drains, the
// key the new owner holds.
func TestWaitingSessionStopsWhenItsKeyMoves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "echo"}, nil
		})
		w := newManagerWorld(t, echo, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true })
		system, manager, key, d, store, ctx := w.system, w.manager, w.key, w.d, w.store, w.ctx
		src := w.src
		grain := system.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
		d.Spooling.Store(true)
		res, err := system.Root.RequestFuture(manager, &Routed{Key: key, Grain: grain, Msg: &Deliver{SessionKey: key,
			Source: sourceToProto(src), MessageId: "m1", Text: "hi", ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour).Result()
		t.Logf("deliver while spooling: %+v %v", res, err)
		// Another member now owns the key and claims it.
		claimed, err := store.Claim(ctx, key, "b", time.Now(), nil)
		if err != nil {
			t.Fatal(err)
		}
		epoch := claimed.Epoch
		system.Root.Send(manager, &grainStopped{key: key, grain: grain})
		synctest.Wait()
		time.Sleep(5 * time.Second)
		d.Spooling.Store(false) // the spool drains
		time.Sleep(5 * time.Second)
		synctest.Wait()
		act, _ := system.Root.RequestFuture(manager, &ListActive{}, time.Hour).Result()
		if slices.Contains(act.(*ActiveList).Keys, key) {
			t.Errorf("the session whose key moved away is still active here")
		}
		own, err := store.Ownership(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if own.Owner != "b" || own.Epoch != epoch {
			t.Errorf("ownership %+v after the move, want b's claim (epoch %d): this member took the key back", own, epoch)
		}
	})
}
