package actors

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// TestStoppedGrainsLastMessageRuns: the manager stops a key's grain when its session
// passivates, but the grain still hands on a message that was in its mailbox before the stop,
// and only then stops (grainStopped). That message starts a new session, which must run it:
// the grain's stop is the manager's own, not the cluster moving the key away. Before, the
// manager took the grain for the key's live one, so its stop told the new session the key
// had moved; the session handed over and stopped, and the message waited for the next
// recovery sweep (up to member_ttl).
func TestStoppedGrainsLastMessageRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "echo: " + req.Messages[len(req.Messages)-1].Text}, nil
		})
		w := newManagerWorld(t, echo, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true })
		stopped := make(chan struct{})
		grain := w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			if _, ok := c.Message().(*actor.Stopped); ok {
				close(stopped)
			}
		}))
		viaGrain := func(id, text string) *actor.Future {
			return w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Grain: grain, Msg: w.message(id, text)}, time.Hour)
		}
		// reply waits for the reply text want; a reply not yet marked delivered is sent again
		// by each activation (at least once), so earlier ones may come first.
		reply := func(want string) {
			t.Helper()
			for {
				select {
				case got := <-w.sent:
					if got.Out.Text == want {
						return
					}
				case <-time.After(time.Minute):
					t.Fatalf("no reply %q within a minute", want)
				}
			}
		}

		if res, err := viaGrain("m1", "one").Result(); err != nil || res.(*DeliverResult).Disposition != platforms.Started {
			t.Fatalf("m1: %+v, %v", res, err)
		}
		reply("echo: one")
		time.Sleep(2 * time.Hour) // the session passivates, and the manager stops its grain
		synctest.Wait()
		select {
		case <-stopped:
		default:
			t.Fatalf("the grain is not stopped after its session passivated")
		}

		// What the manager then receives from the grain: the message it still handed on, and
		// its stop.
		f := viaGrain("m2", "two")
		w.system.Root.Send(w.manager, &grainStopped{key: w.key, grain: grain})
		res, err := f.Result()
		if err != nil || res.(*DeliverResult).ErrorCode != "" {
			t.Fatalf("m2: %+v, %v", res, err)
		}
		reply("echo: two")
		synctest.Wait() // the turn's writes settle before the world stops
	})
}
