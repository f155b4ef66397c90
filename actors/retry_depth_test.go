package actors

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
)

// TestRetryIsAnsweredWithTheQueueDepthBehindItsTurn: a /retry whose retried turn starts at once
// is answered with queue_depth 0, as a message that starts a turn is, and so is its repeat sent
// while its write is in flight. Before, both were answered before the retried turn started and
// counted the retried message itself (1).
func TestRetryIsAnsweredWithTheQueueDepthBehindItsTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hc := &heldCommits{hold: make(chan struct{}), release: make(chan struct{}), held: make(chan struct{}, 64)}
		var calls atomic.Int32
		w := newManagerWorldWrites(t, agents.Func(func(ctx context.Context, _ *agents.Request) (*agents.Response, error) {
			if calls.Add(1) == 1 {
				return &agents.Response{Text: "first answer"}, nil
			}
			<-ctx.Done() // the retried turn runs until the test ends: nothing else changes the queue
			return nil, ctx.Err()
		}), nil, func(s persistence.Store) persistence.Store { hc.Store = s; return hc })
		src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c", UserID: "u"}
		send := func(id, text string) *actor.Future {
			key := identity.Key(src, w.d.Config.Keys)
			return w.system.Root.RequestFuture(w.manager, &Routed{Key: key, Msg: &Deliver{SessionKey: key,
				Source: sourceToProto(src), MessageId: id, Text: text, ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour)
		}
		if _, err := send("m1", "hi").Result(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // m1's turn ends
		close(hc.hold)  // the /retry's write waits in the persistence actor
		first := send("r1", "/retry")
		synctest.Wait()
		repeat := send("r1", "/retry")
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
		if fr.Disposition != "command" || fr.QueueDepth != 0 || rr.Disposition != "duplicate" || rr.QueueDepth != 0 {
			t.Errorf("/retry %q queue_depth %d, its repeat %q queue_depth %d; want command and duplicate, both 0",
				fr.Disposition, fr.QueueDepth, rr.Disposition, rr.QueueDepth)
		}
		synctest.Wait() // the retried turn has called the agent
		if n := calls.Load(); n != 2 {
			t.Errorf("the agent ran %d turns, want 2 (m1 and its retry)", n)
		}
	})
}
