package actors

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A message that reaches a session after it asked to passivate (the manager had routed it
// there before it knew) is handed back to the manager, which gives it to the key's next
// activation: it is stored, answered and run. A passivating session that took it in would
// stop with it (its sender told to send it again, or its turn cut short and left to the next
// message of the chat).
func TestPassivatingSessionHandsOverWhatReachesIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "agentgate.db"), sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		system, quiet := quietSystem()
		defer system.Shutdown()

		replies := make(chan string, 10)
		platform := system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			if m, ok := c.Message().(*SendOutbound); ok {
				replies <- m.Out.Text
			}
		}))
		echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "echo: " + req.Messages[len(req.Messages)-1].Text}, nil
		})
		d := &Deps{Ctx: ctx, Store: store, Agent: echo, Platforms: map[string]*actor.PID{"fake": platform},
			Log: quiet, Metrics: metrics.New("fake"), Node: "test",
			Config: SessionConfig{PassivateAfter: time.Hour, QueueMode: ModeFollowup, QueueCap: 10, HistoryLimit: 50}}
		d.Persist = system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(ctx, store, persistence.ActorOptions{MaxBatch: 64})))
		manager := system.Root.Spawn(NewSessionManager(d))
		defer func() { // before the store closes, and inside the bubble
			_ = system.Root.StopFuture(manager).Wait()
			_ = system.Root.StopFuture(d.Persist).Wait()
		}()
		// reply waits for the reply text want; a reply not yet marked delivered is sent again
		// by each activation (at least once), so earlier ones may come first.
		reply := func(want string) {
			t.Helper()
			for {
				select {
				case got := <-replies:
					if got == want {
						return
					}
				case <-time.After(time.Minute):
					t.Fatalf("no reply %q", want)
				}
			}
		}

		src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1", UserID: "u1"}
		key := identity.Key(src, d.Config.Keys)
		// deliver sends a message to pid: the manager (routed, as the router does) or a session.
		deliver := func(pid *actor.PID, id, text string) *DeliverResult {
			t.Helper()
			var msg any = &Deliver{SessionKey: key, Source: sourceToProto(src), MessageId: id, Text: text,
				ReceivedAtUnixNano: time.Now().UnixNano()}
			if pid == manager {
				msg = &Routed{Key: key, Msg: msg}
			}
			res, err := system.Root.RequestFuture(pid, msg, time.Minute).Result()
			if err != nil {
				t.Fatalf("deliver %s: %v", id, err)
			}
			return res.(*DeliverResult)
		}

		// The manager's idle sweep runs every 15 minutes from its start; the session starts a
		// minute later, so at 62 minutes it is idle past PassivateAfter and no sweep has seen it.
		time.Sleep(time.Minute)
		if r := deliver(manager, "m1", "one"); r.ErrorCode != "" {
			t.Fatalf("m1: %+v", r)
		}
		reply("echo: one")
		time.Sleep(61 * time.Minute)
		synctest.Wait()

		session := actor.NewPID(system.Address(), manager.Id+"/"+key)
		system.Root.Send(session, &idleCheck{}) // it asks to passivate…
		r := deliver(session, "m2", "two")      // …and is then given a message
		if r.ErrorCode != "" {
			t.Fatalf("m2 reached the passivating session: %+v, want it accepted by the next activation", r)
		}
		reply("echo: two")
		if a, p := testutil.ToFloat64(d.Metrics.SessionActivations), testutil.ToFloat64(d.Metrics.SessionPassivations); a != 2 || p != 1 {
			t.Errorf("%v activations and %v passivations, want 2 and 1", a, p)
		}
	})
}

// quietSystem returns an actor system that logs nothing, and the logger that discards.
func quietSystem() (*actor.ActorSystem, *slog.Logger) {
	quiet := slog.New(slog.DiscardHandler)
	return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet })), quiet
}
