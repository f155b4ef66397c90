package actors

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/platformtest"
	"github.com/asynkron/protoactor-go/actor"
)

// sendWorld is a platform actor over a fake platform whose mark writes the test answers at once
// and collects.
type sendWorld struct {
	system *actor.ActorSystem
	fake   *platformtest.Fake
	pid    *actor.PID
	marks  chan *persistence.MarkDelivery
}

func newSendWorld(t *testing.T) *sendWorld {
	system, quiet := quietSystem(t)
	w := &sendWorld{
		system: system,
		fake:   platformtest.NewFake("fake"),
		marks:  make(chan *persistence.MarkDelivery, 64),
	}
	persist := w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if wr, ok := c.Message().(*persistence.Write); ok {
			for _, op := range wr.Ops {
				w.marks <- op.(*persistence.MarkDelivery)
			}
			c.Respond(&persistence.WriteResult{ID: wr.ID})
		}
	}))
	d := &Deps{Ctx: t.Context(), Persist: persist, Log: quiet, Metrics: metrics.New("fake")}
	w.pid = w.system.Root.Spawn(NewPlatform(d, w.fake, &PlatformHealth{}))
	return w
}

func (w *sendWorld) send(seq int64) {
	w.system.Root.Send(w.pid, &SendOutbound{Out: &platforms.Outbound{SessionKey: "fake:dm:c1", Seq: seq, Text: fmt.Sprint("reply ", seq), TurnEnd: true}})
}

// takeMarks returns the marks written so far, by seq.
func (w *sendWorld) takeMarks() map[int64]string {
	got := map[int64]string{}
	for {
		select {
		case m := <-w.marks:
			got[m.Seq] = m.State
		default:
			return got
		}
	}
}

// TestSendRetriesUntilDelivered: a send that fails for a reason that may pass is retried, past
// any number of attempts, until it succeeds, and the key's later replies wait behind it, so
// they are delivered in order. (It used to be given up after five attempts, ~8 s, and the next
// reply overtook it.)
func TestSendRetriesUntilDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newSendWorld(t)
		defer w.system.Shutdown()
		w.fake.SetSendError(errors.New("503 service unavailable"))
		w.send(1)
		w.send(2)
		time.Sleep(10 * time.Minute) // an outage of ten minutes: ~25 attempts
		synctest.Wait()
		if n := len(w.fake.Sent()); n != 0 {
			t.Fatalf("%d replies sent during the outage", n)
		}
		if m := w.takeMarks(); len(m) != 0 {
			t.Fatalf("marks written during the outage: %v, want none (the replies are still pending)", m)
		}
		w.fake.SetSendError(nil)
		time.Sleep(sendBackoffMax)
		synctest.Wait()
		var order []int64
		for _, o := range w.fake.Sent() {
			order = append(order, o.Seq)
		}
		if fmt.Sprint(order) != "[1 2]" {
			t.Errorf("replies sent in the order %v, want [1 2]", order)
		}
		if m := w.takeMarks(); m[1] != persistence.DeliveryDelivered || m[2] != persistence.DeliveryDelivered {
			t.Errorf("marks %v, want both delivered", m)
		}
		w.system.Root.Stop(w.pid)
	})
}

// TestUndeliverableSendFailsAtOnce: a send the platform refuses for good is recorded as failed
// at its first attempt, and the key's next reply goes out.
func TestUndeliverableSendFailsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newSendWorld(t)
		defer w.system.Shutdown()
		w.fake.SetSendError(fmt.Errorf("403 missing access: %w", platforms.ErrUndeliverable))
		w.send(1)
		synctest.Wait()
		w.fake.SetSendError(nil)
		w.send(2)
		synctest.Wait()
		if m := w.takeMarks(); m[1] != persistence.DeliveryFailed || m[2] != persistence.DeliveryDelivered {
			t.Errorf("marks %v, want 1 failed and 2 delivered", m)
		}
		if sent := w.fake.Sent(); len(sent) != 1 || sent[0].Seq != 2 {
			t.Errorf("sent %d replies, want only the second", len(sent))
		}
		w.system.Root.Stop(w.pid)
	})
}

// TestQuiesceOfOneKeyWaitsOnlyForItsSends: a Quiesce for one session's key is answered once that
// session's sends are done and their marks written, whatever other sessions' sends and marks
// are doing; a Quiesce of the whole platform waits for all of them. (A member handing one key on
// under load waited for a moment with no send and no mark in flight at all, which may not come
// before the 10 s bound.)
func TestQuiesceOfOneKeyWaitsOnlyForItsSends(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		system, quiet := quietSystem(t)
		defer system.Shutdown()
		fake := platformtest.NewFake("fake")
		release := make(chan struct{})
		persist := system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			if wr, ok := c.Message().(*persistence.Write); ok {
				<-release // the mark write takes as long as the test wants
				c.Respond(&persistence.WriteResult{ID: wr.ID})
			}
		}))
		d := &Deps{Ctx: t.Context(), Persist: persist, Log: quiet, Metrics: metrics.New("fake")}
		pid := system.Root.Spawn(NewPlatform(d, fake, &PlatformHealth{}))
		system.Root.Send(pid, &SendOutbound{Out: &platforms.Outbound{SessionKey: "fake:dm:busy", Seq: 1, Text: "r", TurnEnd: true}})
		synctest.Wait() // sent; its mark write waits

		answers := make(chan string, 3)
		ask := func(name string, q *Quiesce) {
			waiter := system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
				if _, ok := c.Message().(*Quiesced); ok {
					answers <- name
				}
			}))
			system.Root.RequestWithCustomSender(pid, q, waiter)
		}
		ask("idle", &Quiesce{Key: "fake:dm:idle"})
		ask("busy", &Quiesce{Key: "fake:dm:busy"})
		ask("all", &Quiesce{})
		synctest.Wait()
		if got := drain(answers); fmt.Sprint(got) != "[idle]" {
			t.Errorf("answered %v while the busy session's mark was unwritten, want only the idle session's", got)
		}
		close(release)
		synctest.Wait()
		if got := drain(answers); len(got) != 2 {
			t.Errorf("answered %v once the mark was written, want the busy session's and the platform's", got)
		}
	})
}

// drain returns what ch holds now.
func drain(ch chan string) []string {
	var out []string
	for {
		select {
		case v := <-ch:
			out = append(out, v)
		default:
			return out
		}
	}
}

// TestRestartedSessionDoesNotSendARepliedAgain: a reply waits in the platform actor for a send
// that fails (a platform outage) when its session crashes. The restarted session finds the
// reply unconfirmed in the store and hands it to the platform actor again, which already holds
// it: the user must get it once. (Before, the platform actor queued it a second time, and sent
// it twice once the outage ended.)
func TestRestartedSessionDoesNotSendARepliedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var crashed atomic.Bool
		agent := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			if req.Identity.MessageID == "m2" && crashed.CompareAndSwap(false, true) {
				panic("agent bug")
			}
			return &agents.Response{Text: "ok " + req.Identity.MessageID}, nil
		})
		w := newManagerWorld(t, agent, nil)
		fake := platformtest.NewFake("fake")
		w.d.Platforms["fake"] = w.system.Root.Spawn(NewPlatform(w.d, fake, &PlatformHealth{})) // before any session
		fake.SetSendError(errors.New("503 service unavailable"))
		w.deliver(t, "m1", "one") // its reply waits for the platform
		synctest.Wait()
		w.deliver(t, "m2", "two") // crashes the session, which reloads and runs m2 again
		time.Sleep(time.Minute)
		synctest.Wait()
		fake.SetSendError(nil)
		time.Sleep(time.Minute)
		synctest.Wait()

		got := map[string]int{}
		for _, o := range fake.Sent() {
			got[fmt.Sprint(o.Seq, " ", o.InReplyTo)]++
		}
		if want := map[string]int{"1 [m1]": 1, "2 [m2]": 1}; !maps.Equal(got, want) {
			t.Errorf("sent (seq, in_reply_to: times) %v, want %v", got, want)
		}
	})
}

// TestReplySentAgainReachesThePlatformMarked: a reply a loading session found unconfirmed in the
// store and hands over again (SendOutbound.Again) reaches the platform marked Again, so that
// Discord looks for the post an earlier send may have made before posting it, whatever the
// reply's age (TestReplyCutByAStopIsNotPostedTwiceAfterALongStop in platforms/discord); a new
// reply is not marked, and the session's message is left as it was sent.
func TestReplySentAgainReachesThePlatformMarked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newSendWorld(t)
		defer w.system.Shutdown()
		again := &platforms.Outbound{SessionKey: "fake:dm:c1", Seq: 1, Text: "reply 1", InReplyTo: []string{"m1"}, TurnEnd: true}
		w.system.Root.Send(w.pid, &SendOutbound{Out: again, Again: true})
		w.send(2)
		synctest.Wait()
		got := map[int64]bool{}
		for _, o := range w.fake.Sent() {
			got[o.Seq] = o.Again
		}
		if want := map[int64]bool{1: true, 2: false}; !maps.Equal(got, want) {
			t.Errorf("sent (seq: again) %v, want %v", got, want)
		}
		if again.Again {
			t.Error("the session's outbound was changed: Again is set on it")
		}
		w.system.Root.Stop(w.pid)
	})
}

// inboundPlatform is a fake whose first Run fails at once (a lost connection) and whose later
// Runs wait for their ctx; its inbound wait (platforms.InboundWaiter) says it was called on
// waited, and returns once release is closed.
type inboundPlatform struct {
	*platformtest.Fake
	runs    atomic.Int32
	waited  chan struct{}
	release chan struct{}
}

func (p *inboundPlatform) Run(ctx context.Context, _ platforms.Deliver) error {
	if p.runs.Add(1) == 1 {
		return errors.New("gateway connection lost")
	}
	<-ctx.Done()
	return nil
}

func (p *inboundPlatform) WaitInbound(ctx context.Context) {
	close(p.waited)
	select {
	case <-p.release:
	case <-ctx.Done():
	}
}

// TestStopInTheRunBackoffWaitsForTheInbound: a platform actor stopped while it waits to run its
// platform again (the backoff after Run failed) waits for the inbound messages the failed Run
// left to be handed on (platforms.InboundWaiter) before it stops, as a Run stopped while it
// runs waits for them. Before, it stopped at once, and the platform (Discord's intake) went on
// delivering after the runtime was gone, or not at all once the process exited.
func TestStopInTheRunBackoffWaitsForTheInbound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		system, quiet := quietSystem(t)
		defer system.Shutdown()
		p := &inboundPlatform{Fake: platformtest.NewFake("fake"), waited: make(chan struct{}), release: make(chan struct{})}
		d := &Deps{Ctx: t.Context(), Log: quiet, Metrics: metrics.New("fake")}
		pid := system.Root.Spawn(NewPlatform(d, p, &PlatformHealth{}))
		system.Root.Send(pid, &StartIntake{Deliver: func(context.Context, *platforms.Inbound) (*platforms.Ack, error) { return nil, nil }})
		synctest.Wait() // Run failed: the actor waits runBackoffBase to run it again
		if n := p.runs.Load(); n != 1 {
			t.Fatalf("Run called %d times before the stop, want once (the stop is to come in its backoff)", n)
		}
		stopped := make(chan struct{})
		go func() {
			_ = system.Root.PoisonFuture(pid).Wait()
			close(stopped)
		}()
		synctest.Wait()
		select {
		case <-p.waited:
		default:
			t.Fatal("the platform actor stopped in its Run backoff without waiting for the platform's inbound")
		}
		select {
		case <-stopped:
			t.Fatal("the platform actor stopped before the platform's inbound was handed on")
		default:
		}
		close(p.release)
		<-stopped
	})
}
