package actors

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
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
		echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "echo: " + req.Messages[len(req.Messages)-1].Text}, nil
		})
		w := newManagerWorld(t, echo, nil)
		system, manager, key, d := w.system, w.manager, w.key, w.d
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
					t.Fatalf("no reply %q", want)
				}
			}
		}

		// deliver sends a message to pid: the manager (routed, as the router does) or a session.
		deliver := func(pid *actor.PID, id, text string) *DeliverResult {
			t.Helper()
			var msg any = w.message(id, text)
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

		// The session asks to passivate, and is then given a message: both are in its mailbox
		// before it handles the first (it is suspended meanwhile), as when the manager forwards
		// a message before the request reaches it. Otherwise the manager's stop could overtake
		// the test's message.
		session := actor.NewPID(system.Address(), manager.Id+"/"+key)
		proc, ok := system.ProcessRegistry.Get(session)
		if !ok {
			t.Fatalf("no session %s", session)
		}
		proc.SendSystemMessage(session, &actor.SuspendMailbox{})
		system.Root.Send(session, &idleCheck{})
		fut := system.Root.RequestFuture(session, w.message("m2", "two"), time.Minute)
		proc.SendSystemMessage(session, &actor.ResumeMailbox{})
		res, err := fut.Result()
		if err != nil {
			t.Fatalf("deliver m2: %v", err)
		}
		if r := res.(*DeliverResult); r.ErrorCode != "" {
			t.Fatalf("m2 reached the passivating session: %+v, want it accepted by the next activation", r)
		}
		reply("echo: two")
		if a, p := testutil.ToFloat64(d.Metrics.SessionActivations), testutil.ToFloat64(d.Metrics.SessionPassivations); a != 2 || p != 1 {
			t.Errorf("%v activations and %v passivations, want 2 and 1", a, p)
		}
	})
}

// quietSystem returns an actor system that logs nothing, and the logger that discards.
//
// When the test ends it waits out protoactor's dead-letter log throttle: the first dead letter
// of an interval starts a goroutine that waits for the interval on a ticker, and a synctest
// bubble that ends while one waits panics ("blocked goroutines remain"). The interval is a
// millisecond, so outside a bubble the wait costs nothing either.
func quietSystem(t *testing.T) (*actor.ActorSystem, *slog.Logger) {
	quiet := slog.New(slog.DiscardHandler)
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }),
		actor.WithDeadLetterThrottleInterval(deadLetterThrottle))
	t.Cleanup(func() { time.Sleep(2 * deadLetterThrottle) }) // registered first, so it runs last
	return system, quiet
}

// deadLetterThrottle is the test systems' dead-letter log throttle interval (quietSystem).
const deadLetterThrottle = time.Millisecond

// TestLatePassivateLeavesTheSuccessorAlone: a request to passivate that reaches the manager
// after its session stopped (the session's Terminated, a system message, overtakes what it sent
// before) names a session that is gone: the key's session in memory now, its successor, is not
// stopped, and no passivation is counted (which would also reset the key's crash backoff).
func TestLatePassivateLeavesTheSuccessorAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "echo: " + req.Messages[len(req.Messages)-1].Text}, nil
		})
		w := newManagerWorld(t, echo, nil)
		if r := w.deliver(t, "m1", "one"); r.ErrorCode != "" {
			t.Fatalf("m1: %+v", r)
		}
		synctest.Wait()
		gone := actor.NewPID(w.system.Address(), w.manager.Id+"/an-earlier-incarnation")
		w.system.Root.Send(w.manager, &passivate{key: w.key, pid: gone})
		synctest.Wait()
		if r := w.deliver(t, "m2", "two"); r.ErrorCode != "" {
			t.Fatalf("m2: %+v", r)
		}
		synctest.Wait()
		if a, p := testutil.ToFloat64(w.d.Metrics.SessionActivations), testutil.ToFloat64(w.d.Metrics.SessionPassivations); a != 1 || p != 0 {
			t.Errorf("%v activations and %v passivations, want 1 and 0: a stale request stopped the live session", a, p)
		}
	})
}
