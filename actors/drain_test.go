package actors

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
)

// TestDrainWaitsForTheRerunOfACrashedTurn: a session whose agent panics during a drain restarts
// and runs the message again; the drain ends once that rerun has answered. Before, the crashed
// incarnation told its manager it was idle, so the drain ended at the crash: the daemon then
// stopped while the restarted session started the rerun, which it cancelled at once (its
// message ran again at the next start, after an agent call cut short).
func TestDrainWaitsForTheRerunOfACrashedTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		crash, rerun := make(chan struct{}), make(chan struct{})
		ran := make(chan int, 4)
		calls := 0
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			calls++
			ran <- calls
			if calls == 1 {
				<-crash
				panic("agent bug")
			}
			select {
			case <-rerun:
				return &agents.Response{Text: "answered after the crash"}, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
		w := newManagerWorld(t, agent, nil)
		if res := w.deliver(t, "m1", "work"); res.Disposition != "started" {
			t.Fatalf("m1: %+v", res)
		}
		<-ran
		drained := w.drain()
		close(crash)
		if n := <-ran; n != 2 {
			t.Fatalf("agent call %d, want the rerun (2)", n)
		}
		synctest.Wait()
		if answered(drained) {
			t.Fatal("the drain ended while the crashed turn's rerun ran")
		}
		close(rerun)
		if out := <-w.sent; out.Out.Text != "answered after the crash" {
			t.Errorf("sent %q, want the rerun's answer", out.Out.Text)
		}
		synctest.Wait()
		if !answered(drained) {
			t.Error("the drain did not end once the rerun answered")
		}
	})
}

// drain asks w's manager to drain, as a stopping daemon does; the channel gets its answer.
func (w *managerWorld) drain() <-chan struct{} {
	drained := make(chan struct{}, 1)
	drainer := w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*Drained); ok {
			drained <- struct{}{}
		}
	}))
	w.system.Root.RequestWithCustomSender(w.manager, &Drain{}, drainer)
	return drained
}

// answered reports whether the drain's answer has come (drain), without waiting for it.
func answered(drained <-chan struct{}) bool {
	select {
	case <-drained:
		return true
	default:
		return false
	}
}

// TestNoAgentCallStartsOnceTheCallsAreClosed: once a stopping daemon has waited for the agent
// calls in flight (AgentCalls.Close, then Wait), a turn whose request reaches it late runs no
// agent: the call would outlive the daemon and run beside the next start's rerun of the same
// message. The turn answers its session with ErrAgentCallsClosed, and nothing is counted.
func TestNoAgentCallStartsOnceTheCallsAreClosed(t *testing.T) {
	system, _ := quietSystem(t)
	defer system.Shutdown()
	var calls AgentCalls
	calls.Close()
	agent := agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
		t.Error("the agent ran after the calls were closed")
		return &agents.Response{Text: "late"}, nil
	})
	finished := make(chan *TurnFinished, 1)
	session := system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if f, ok := c.Message().(*TurnFinished); ok {
			finished <- f
		}
	}))
	turn := system.Root.Spawn(NewTurn(t.Context(), agent, &calls, nil, metrics.New("fake").Actor("turn"), nil))
	req := &agents.Request{Identity: identity.Turn{TurnID: "t_late"}}
	system.Root.Send(turn, &runTurn{req: req, session: session})
	if f := <-finished; !errors.Is(f.Err, ErrAgentCallsClosed) {
		t.Errorf("turn finished with %v, want ErrAgentCallsClosed", f.Err)
	}
	if n := calls.Running(); n != 0 {
		t.Errorf("%d calls counted, want 0", n)
	}
	if err := calls.Wait(t.Context()); err != nil {
		t.Errorf("Wait: %v", err)
	}
}

// TestDrainRunsADebouncedMessage: a message held for its debounce window when the drain begins
// is run and answered before the drain ends, as one queued behind a running turn is. Before,
// its session counted as idle, so the drain ended at once and the message waited for the next
// start.
func TestDrainRunsADebouncedMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "echo: " + req.Messages[0].Text}, nil
		})
		w := newManagerWorld(t, echo, func(d *Deps) { d.Config.Debounce = 2 * time.Second })
		if res := w.deliver(t, "m1", "held"); res.ErrorCode != "" {
			t.Fatalf("m1: %+v", res)
		}
		synctest.Wait()
		drained := w.drain()
		synctest.Wait()
		if answered(drained) {
			t.Fatal("the drain ended while a message waited out its debounce window")
		}
		if out := <-w.sent; out.Out.Text != "echo: held" {
			t.Errorf("sent %q, want the debounced message's answer", out.Out.Text)
		}
		synctest.Wait()
		if !answered(drained) {
			t.Error("the drain did not end once the debounced message was answered")
		}
	})
}

// TestTurnBegunAfterTheStopsWaitStaysPending: a session still alive when the stop has waited
// for the agent calls (its stop passed the deadline) begins a turn that runs no agent
// (ErrAgentCallsClosed). The turn was cut short by the stop, not failed: its message stays
// pending for the next start and its sender gets no "could not answer" notice, as for a turn
// cancelled at the drain deadline. Before, it was marked failed, with that notice.
func TestTurnBegunAfterTheStopsWaitStaysPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
			t.Error("the agent ran after the stop waited for the agent calls")
			return &agents.Response{Text: "late"}, nil
		})
		w := newManagerWorld(t, agent, nil)
		w.d.AgentCalls.Close()
		if r := w.deliver(t, "m1", "hello"); r.ErrorCode != "" {
			t.Fatalf("m1: %+v", r)
		}
		synctest.Wait()
		if st, _ := w.statusOf(t, "m1"); st != persistence.StatusPending {
			t.Errorf("m1: %s, want pending for the next start", st)
		}
		select {
		case out := <-w.sent:
			t.Errorf("sent %q, want nothing", out.Out.Text)
		default:
		}
	})
}
