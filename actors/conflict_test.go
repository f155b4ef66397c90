package actors

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
)

// TestRepeatOfAnIDTakenElsewhereIsAConflict: in a group chat with a session per user, ub sends
// a message with the id of ua's message, twice, the second while the first's write is in
// flight (a client's retry). Both are the conflict they are (HTTP 409), and nothing is stored
// for ub. Before, the repeat was answered "duplicate" (202): a message nobody stored was
// acknowledged (found by TestHuntHTTP in ./supervisor).
func TestRepeatOfAnIDTakenElsewhereIsAConflict(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "ok " + req.Identity.MessageID}, nil
		})
		hc := &heldCommits{hold: make(chan struct{}), release: make(chan struct{}), held: make(chan struct{}, 64)}
		w := newManagerWorldWrites(t, agent, func(d *Deps) { d.Config.Keys = identity.DefaultKeyOptions },
			func(s persistence.Store) persistence.Store { hc.Store = s; return hc })
		ua := identity.Source{Platform: "fake", ChatType: identity.ChatGroup, ChatID: "g", UserID: "ua"}
		ub := ua
		ub.UserID = "ub"
		send := func(src identity.Source, id string) *actor.Future {
			key := identity.Key(src, w.d.Config.Keys)
			return w.system.Root.RequestFuture(w.manager, &Routed{Key: key, Msg: &Deliver{SessionKey: key,
				Source: sourceToProto(src), MessageId: id, Text: "hi", ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour)
		}
		if res, err := send(ua, "m1").Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
			t.Fatalf("ua's m1: %v %v", res, err)
		}
		synctest.Wait()
		close(hc.hold) // ub's write waits in the persistence actor
		first, repeat := send(ub, "m1"), send(ub, "m1")
		synctest.Wait()
		close(hc.release)
		for name, f := range map[string]*actor.Future{"first": first, "repeat": repeat} {
			res, err := f.Result()
			if r, ok := res.(*DeliverResult); err != nil || !ok || r.ErrorCode != ErrCodeConflict {
				t.Errorf("ub's m1 (%s) = %+v %v, want error code %q", name, res, err, ErrCodeConflict)
			}
		}
		if in, err := w.store.FindInbound(w.ctx, "fake", "g", "m1"); err != nil || in.UserID != "ua" {
			t.Errorf("m1 in the store: %+v %v, want ua's", in, err)
		}
	})
}

// TestRepeatWhileItsWriteIsInFlightGetsTheSameQueueDepth: a message sent again while its first
// write is in flight (a client's retry) is answered "duplicate" with the queue_depth the first
// is answered with: the messages that wait behind the turn it starts. Before, the repeat was
// answered before the first's turn started, and counted the first itself (1 beside its 0).
func TestRepeatWhileItsWriteIsInFlightGetsTheSameQueueDepth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hc := &heldCommits{hold: make(chan struct{}), release: make(chan struct{}), held: make(chan struct{}, 64)}
		w := newManagerWorldWrites(t, agents.Func(func(ctx context.Context, _ *agents.Request) (*agents.Response, error) {
			<-ctx.Done() // the turn runs until the test ends: nothing else changes the queue
			return nil, ctx.Err()
		}), nil, func(s persistence.Store) persistence.Store { hc.Store = s; return hc })
		src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c", UserID: "u"}
		send := func(id string) *actor.Future {
			key := identity.Key(src, w.d.Config.Keys)
			return w.system.Root.RequestFuture(w.manager, &Routed{Key: key, Msg: &Deliver{SessionKey: key,
				Source: sourceToProto(src), MessageId: id, Text: "hi", ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour)
		}
		close(hc.hold) // m1's write waits in the persistence actor
		first := send("m1")
		synctest.Wait()
		repeat := send("m1")
		synctest.Wait()
		close(hc.release)
		f, err := first.Result()
		if err != nil {
			t.Fatal(err)
		}
		r, err := repeat.Result()
		if err != nil {
			t.Fatal(err)
		}
		fr, rr := f.(*DeliverResult), r.(*DeliverResult)
		if fr.Disposition != "started" || rr.Disposition != "duplicate" || rr.QueueDepth != fr.QueueDepth {
			t.Errorf("first %q queue_depth %d, repeat %q queue_depth %d; want started, and duplicate with the same queue_depth",
				fr.Disposition, fr.QueueDepth, rr.Disposition, rr.QueueDepth)
		}
	})
}
