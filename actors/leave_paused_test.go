package actors

import (
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/asynkron/protoactor-go/actor"
)

// TestLeavingManagersDrainDoesNotWaitOutAPauseOfAKeyNoMemberTakes: on a leaving member with no
// member to take a key over (Leave.Successor answers nil: the members it would hand to leave
// too), the store refuses a command's write while the key's turn runs (a full disk), and the
// session starts again from the store after a pause. The session will hand nothing on: the
// drain ends once no turn runs, and the stop that follows stops the key's pause, as a single
// daemon's does. The message whose turn the refusal cut short stays pending in the store, and
// the next start runs it. Before, the drain waited for the key's pause (1 s doubling to a
// minute) and for the turn run again after it: each such stop was held that long.
func TestLeavingManagersDrainDoesNotWaitOutAPauseOfAKeyNoMemberTakes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		agent, ran := slowUntil(release)
		out := &storetest.Outage{}
		w := newManagerWorldWrites(t, agent, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true },
			out.Wrap)
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return nil }})
		if res := w.deliver(t, "m1", "slow"); res.Disposition != "started" {
			t.Fatalf("m1: %+v, want it run here", res)
		}
		drained := w.drain()
		synctest.Wait()
		if answered(drained) {
			t.Fatal("the drain was answered while m1's turn ran")
		}

		out.Down.Store(true) // the disk fills: the store refuses every write until the test ends
		if res := w.deliver(t, "k1", "/title refused"); res.ErrorCode == "" {
			t.Fatalf("/title: %+v, want it refused", res)
		}
		synctest.Wait() // m1's turn is cancelled, and the key waits out its pause
		if l := w.list(t); len(l.Keys) != 0 || len(l.Busy) != 0 || len(l.HandingOn) != 0 {
			t.Errorf("while the key waits out its pause: sessions %v, busy %v, handing on %v; want none", l.Keys, l.Busy, l.HandingOn)
		}
		if !answered(drained) {
			t.Error("the drain waited for the pause of a key no member takes over")
		}
		if err := w.system.Root.PoisonFuture(w.manager).Wait(); err != nil {
			t.Fatal(err)
		}
		if n := ran("slow"); n != 1 {
			t.Errorf("m1 ran %d times on the leaving member, want once (cut short by the refusal)", n)
		}
		w.wantPendingAlone(t, "m1")

		// The next start, once the disk has room: it runs m1.
		out.Down.Store(false)
		close(release)
		d := &Deps{Ctx: w.ctx, Store: w.store, Agent: agent, Platforms: w.d.Platforms, Log: w.d.Log,
			Metrics: metrics.New("fake"), Node: "a", Config: w.d.Config, Persist: w.d.Persist}
		next := w.system.Root.Spawn(NewSessionManager(d))
		t.Cleanup(func() { _ = w.system.Root.StopFuture(next).Wait() })
		for {
			select {
			case s := <-w.sent:
				if slices.Contains(s.Out.InReplyTo, "m1") {
					return
				}
			case <-time.After(time.Minute):
				t.Fatal("m1, left pending by the leaving member's stop, did not run at the next start")
			}
		}
	})
}

// TestLeaveHandsOnAKeyPausedBeforeIt: the store refuses a command's write while the key's turn
// runs (a full disk), and the session stops to start again from the store after a pause; then
// the member begins to leave, and another member takes the key over. The pause ends at once: the
// key goes on to its successor (a Recover: m1, cut short by the refusal, is pending), and the
// drain, with nothing else to wait for, is answered. Before, the key waited out the rest of its
// pause (1 s doubling to a minute) before it went on, and the drain and the stop with it.
func TestLeaveHandsOnAKeyPausedBeforeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		agent, ran := slowUntil(release)
		out := &storetest.Outage{}
		w := newManagerWorldWrites(t, agent, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true },
			out.Wrap)
		sink, forwarded := w.forwardSink()
		if res := w.deliver(t, "m1", "slow"); res.Disposition != "started" {
			t.Fatalf("m1: %+v, want it run here", res)
		}
		synctest.Wait()
		out.Down.Store(true) // the disk fills
		if res := w.deliver(t, "k1", "/title refused"); res.ErrorCode == "" {
			t.Fatalf("/title: %+v, want it refused", res)
		}
		synctest.Wait() // m1's turn is cancelled, and the key waits out its pause
		out.Down.Store(false)

		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return sink }})
		drained := w.drain()
		synctest.Wait()
		if n := recoversOf(forwarded, w.key); n != 1 {
			t.Errorf("the key paused before the leave was handed on %d times at the leave, want once (m1 is pending)", n)
		}
		if l := w.list(t); len(l.Keys) != 0 || len(l.HandingOn) != 0 || !answered(drained) {
			t.Errorf("at the leave: sessions %v, handing on %v, drained %v; want none, none, the drain answered",
				l.Keys, l.HandingOn, answered(drained))
		}
		if n := ran("slow"); n != 1 {
			t.Errorf("m1 ran %d times on the leaving member, want once (cut short by the refusal)", n)
		}
		w.wantPendingAlone(t, "m1")
	})
}

// TestLeavingMemberHandsOnAPausedKeyThatGainsASuccessor: on a leaving member with no member to
// take its keys over, the store refuses a command's write on two keys, half a second apart: each
// waits out a pause of 1 s. Then a member joins, which takes the keys over. At the next pause
// check (each second while keys wait out a pause) the second key goes on to it, before its pause
// is over. Before, it went on only at its pause's end: had the stop come first, its work waited
// for the member's withdrawal and the recovery of the key's owner then.
func TestLeavingMemberHandsOnAPausedKeyThatGainsASuccessor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		agent, _ := slowUntil(release)
		out := &storetest.Outage{}
		w := newManagerWorldWrites(t, agent, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true },
			out.Wrap)
		sink, forwarded := w.forwardSink()
		var joined atomic.Bool
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID {
			if joined.Load() {
				return sink
			}
			return nil
		}})
		src2 := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c2", UserID: "u2"}
		key2 := identity.Key(src2, w.d.Config.Keys)
		deliver2 := func(id, text string) *DeliverResult {
			d := &Deliver{SessionKey: key2, Source: sourceToProto(src2), MessageId: id, Text: text, ReceivedAtUnixNano: time.Now().UnixNano()}
			res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: key2, Msg: d}, time.Hour).Result()
			if err != nil {
				t.Fatalf("deliver %s: %v", id, err)
			}
			return res.(*DeliverResult)
		}
		if res := w.deliver(t, "m1", "slow"); res.Disposition != "started" {
			t.Fatalf("m1: %+v, want it run here", res)
		}
		if res := deliver2("n1", "slow"); res.Disposition != "started" {
			t.Fatalf("n1: %+v, want it run here", res)
		}
		synctest.Wait()
		out.Down.Store(true) // the disk fills
		if res := w.deliver(t, "k1", "/title refused"); res.ErrorCode == "" {
			t.Fatalf("/title: %+v, want it refused", res)
		}
		synctest.Wait()
		time.Sleep(500 * time.Millisecond)
		if res := deliver2("k2", "/title refused"); res.ErrorCode == "" {
			t.Fatalf("/title: %+v, want it refused", res)
		}
		synctest.Wait() // both keys wait out their pauses, the second until 1.5 s
		if n := recoversOf(forwarded, key2); n != 0 {
			t.Fatalf("handed %s on %d times with no member to take it", key2, n)
		}

		joined.Store(true) // a member joins
		time.Sleep(500 * time.Millisecond)
		synctest.Wait() // 1 s: the first key's pause ends, and a pause check runs
		if n := recoversOf(forwarded, key2); n != 1 {
			t.Errorf("the paused key was handed on %d times at the pause check after a member joined, want once", n)
		}
	})
}
