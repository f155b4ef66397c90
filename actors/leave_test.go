package actors

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/asynkron/protoactor-go/actor"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLeavingManagerHandsKeysOnOnceTheirTurnsEnd: a manager whose member leaves the cluster
// (Leave) starts no turn. A message for the key whose turn runs is stored behind it (queued);
// one for a key without a session here goes to the key's successor at once (Forward). When the
// running turn ends, its reply is sent, the session stops without starting the queued message,
// and the successor is told to recover the key, where that message is pending; only then is the
// drain answered.
func TestLeavingManagerHandsKeysOnOnceTheirTurnsEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		ran := make(chan string, 8)
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			ran <- req.Messages[0].Text
			if req.Messages[0].Text == "slow" {
				<-release
			}
			return &agents.Response{Text: "ok"}, nil
		})
		w := newManagerWorld(t, agent, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true })
		forwarded := make(chan *Forward, 8)
		successor := w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			if f, ok := c.Message().(*Forward); ok {
				forwarded <- f
				if d := f.GetDeliver(); d != nil {
					c.Respond(&DeliverResult{SessionKey: f.Key, MessageId: d.MessageId, Disposition: "started"})
				}
			}
		}))

		slow := w.request("m1", "slow")
		if got := <-ran; got != "slow" {
			t.Fatalf("the agent ran %q, want the slow message", got)
		}
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return successor }})
		drained := make(chan struct{}, 1)
		drainer := w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			if _, ok := c.Message().(*Drained); ok {
				drained <- struct{}{}
			}
		}))
		w.system.Root.RequestWithCustomSender(w.manager, &Drain{}, drainer)

		if res := w.deliver(t, "m2", "next"); res.Disposition != "queued" || res.ErrorCode != "" {
			t.Errorf("a message behind the running turn: %+v, want it queued", res)
		}
		other := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c2", UserID: "u1"}
		otherKey := identity.Key(other, w.d.Config.Keys)
		res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: otherKey, Msg: &Deliver{SessionKey: otherKey,
			Source: sourceToProto(other), MessageId: "o1", Text: "hi"}}, time.Hour).Result()
		if err != nil || res.(*DeliverResult).Disposition != "started" {
			t.Errorf("a message for a key without a session: %+v %v, want the successor's answer", res, err)
		}
		if f := <-forwarded; f.Key != otherKey || f.GetDeliver().GetMessageId() != "o1" || f.Hops != 1 {
			t.Errorf("forwarded %v, want o1 of %s, one hop", f, otherKey)
		}
		synctest.Wait()
		select {
		case <-drained:
			t.Error("the drain was answered while a turn still ran")
		default:
		}

		close(release)
		if r := (<-w.sent).Out; len(r.InReplyTo) != 1 || r.InReplyTo[0] != "m1" {
			t.Errorf("sent %+v, want the slow message's reply", r)
		}
		if _, err := slow.Result(); err != nil {
			t.Fatal(err)
		}
		if f := <-forwarded; f.Key != w.key || f.GetRecover() == nil {
			t.Errorf("forwarded %v, want a Recover of %s", f, w.key)
		}
		<-drained
		synctest.Wait()
		ranNone(t, ran)
		if keys := w.active(t); len(keys) != 0 {
			t.Errorf("sessions %v still in memory, want none", keys)
		}
		w.wantPendingAlone(t, "m2")
	})
}

// TestLeavingManagersDrainWaitsForTheHandOver: the drain of a leaving member ends once its
// sessions have handed their keys on, not as soon as no turn runs. A session whose turn ends
// with a message queued behind it tells its manager it is idle and that it hands over; when it
// said it was idle first, the drain was answered before the manager knew of the hand-over, the
// daemon went on to stop the manager, and the successor was never told to recover the key (the
// queued message waited for the member to withdraw and the others' next recovery).
func TestLeavingManagersDrainWaitsForTheHandOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		agent, _ := slowUntil(release)
		w := newManagerWorld(t, agent, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true })
		// One actor is both the successor and the drain's requester: its mailbox shows the order
		// in which the manager sent them.
		seen := make(chan string, 8)
		observer := w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			switch m := c.Message().(type) {
			case *Forward:
				if m.GetRecover() != nil {
					seen <- "recover"
				} else {
					seen <- "forward"
				}
			case *Drained:
				seen <- "drained"
			}
		}))
		slow := w.request("m1", "slow")
		synctest.Wait()
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return observer }})
		w.system.Root.RequestWithCustomSender(w.manager, &Drain{}, observer)
		if res := w.deliver(t, "m2", "next"); res.Disposition != "queued" {
			t.Fatalf("m2: %+v, want queued", res)
		}
		close(release)
		if _, err := slow.Result(); err != nil {
			t.Fatal(err)
		}
		<-w.sent
		if first := <-seen; first != "recover" {
			t.Errorf("the manager's first word after the turn: %s, want the successor's recover before the drain's end", first)
		}
		synctest.Wait()
	})
}

// TestLeavingSessionRestartedAfterACrashStartsNoTurn: the agent of a leaving member's running
// turn panics, and the session restarts from the store. The new incarnation is still the
// leaving member's: it starts no turn, and hands the key on to its successor with the message
// that crashed and the one queued behind it. Before, a restart forgot that the member leaves:
// the new incarnation ran both messages here, feeding the drain, and a drain deadline then
// cancelled them to run again at the successor.
func TestLeavingSessionRestartedAfterACrashStartsNoTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		ran := make(chan string, 8)
		agent := panicsOnBoom(ran, release)
		w := newManagerWorld(t, agent, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true })
		successor, forwarded := w.forwardSink()
		if res := w.deliver(t, "m1", "boom"); res.Disposition != "started" {
			t.Fatalf("m1: %+v", res)
		}
		if got := <-ran; got != "boom" {
			t.Fatalf("the agent ran %q", got)
		}
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return successor }})
		if res := w.deliver(t, "m2", "next"); res.Disposition != "queued" {
			t.Fatalf("m2: %+v, want queued", res)
		}
		close(release)
		select {
		case f := <-forwarded:
			if f.Key != w.key || f.GetRecover() == nil {
				t.Errorf("forwarded %v, want a Recover of %s", f, w.key)
			}
		case text := <-ran:
			t.Fatalf("the leaving member ran %q again after its session restarted", text)
		}
		synctest.Wait()
		ranNone(t, ran)
		snap, err := w.store.LoadSession(w.ctx, w.key, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.Pending) != 2 {
			t.Errorf("pending %+v, want m1 and m2 for the successor", snap.Pending)
		}
	})
}

// TestLeavingSessionRestartedInAnOutageDoesNotClaimTheKey: the agent of a leaving member's
// running turn panics while the database is down (the outage that took the member's membership),
// and the new incarnation, which knows from its lifeline that the member leaves, finds its claim
// refused as unavailable. It stops without loading, as a session told of the leave while it
// waits does (TestLeavingMemberDoesNotClaimAKeyItWaitedToLoad), and the successor is told to
// run the key's work. Before, it waited, and claimed the key once the database answered,
// fencing the turn the key's next holder ran meanwhile.
func TestLeavingSessionRestartedInAnOutageDoesNotClaimTheKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		ran := make(chan string, 8)
		agent := panicsOnBoom(ran, release)
		var store *downStore
		w := newManagerWorld(t, agent, func(d *Deps) {
			d.Node, d.Fencing, d.Clustered = "a", true, true
			store = &downStore{Store: d.Store}
			d.Store = store
		})
		successor, forwarded := w.forwardSink()
		if res := w.deliver(t, "m1", "boom"); res.Disposition != "started" {
			t.Fatalf("m1: %+v", res)
		}
		<-ran
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return successor }})
		synctest.Wait()
		store.down.Store(true)
		claims := store.claims.Load()
		close(release)
		synctest.Wait()
		if store.claims.Load() == claims {
			t.Fatal("the restarted session did not try to claim the key")
		}
		store.down.Store(false)
		claims = store.claims.Load()
		time.Sleep(3 * storeWaitTick)
		synctest.Wait()
		if n := store.claims.Load() - claims; n != 0 {
			t.Errorf("the leaving member's restarted session claimed the key %d times once the database answered, want 0", n)
		}
		if recovers := recoversOf(forwarded, w.key); recovers != 1 {
			t.Errorf("%d Recovers of the key handed to the successor, want 1 (it runs what the store holds)", recovers)
		}
		ranNone(t, ran)
	})
}

// TestRecoverWhileTheSessionStopsRunsTheWork: a Recover reaches the manager while the key's
// session stops (it asked to passivate; a leaving member's hand-over sends one to the key's
// successor, whose own session may be passivating). The work the store lists for the key is
// run by the session started once the old one is gone. Before, the Recover was dropped, and the
// work waited for the key's next message or recovery sweep.
func TestRecoverWhileTheSessionStopsRunsTheWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "echo: " + req.Messages[len(req.Messages)-1].Text}, nil
		})
		w := newManagerWorld(t, echo, nil)
		r := w.deliver(t, "m1", "one")
		if r.ErrorCode != "" {
			t.Fatalf("m1: %+v", r)
		}
		<-w.sent
		synctest.Wait()
		// The session asks to stop; it is suspended, so the manager's stop waits in its mailbox.
		resume := w.suspendAndPassivate(t)
		synctest.Wait()
		// Meanwhile another activation stored a message of the key (as the leaving member's
		// session did), and the key's recovery is asked for.
		err := w.store.Commit(w.ctx, [][]persistence.Op{{&persistence.AppendMessage{Message: persistence.Message{
			SessionID: r.SessionId, Seq: 3, Role: persistence.RoleUser, Content: "two", Platform: w.src.Platform,
			ChatID: w.src.ChatID, MessageID: "m2", UserID: w.src.UserID, Status: persistence.StatusPending,
			Active: true, CreatedAt: time.Now()}}}})[0]
		if err != nil {
			t.Fatal(err)
		}
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &Recover{}})
		synctest.Wait()
		resume()
		for {
			// The fake platform marks nothing delivered: the next activation sends m1's reply
			// again first.
			select {
			case got := <-w.sent:
				if got.Out.Text == "echo: two" {
					return
				}
			case <-time.After(time.Hour):
				t.Fatal("m2, pending in the store, did not run: the Recover that came while the session stopped was dropped")
			}
		}
	})
}

// heldCommits is a store whose Commit waits while hold is set, until release is closed.
type heldCommits struct {
	persistence.Store
	hold    chan struct{} // closed: commits wait for release
	release chan struct{}
	held    chan struct{} // a commit waits
}

func (h *heldCommits) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	select {
	case <-h.hold:
		h.held <- struct{}{}
		<-h.release
	default:
	}
	return h.Store.Commit(ctx, groups)
}

// TestLeavingSessionAcknowledgesQueued: a message whose write completes after the member began
// to leave is acknowledged queued, not started: the session starts no turn and hands the key
// on, and the message runs at the successor.
func TestLeavingSessionAcknowledgesQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ran := make(chan string, 8)
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			ran <- req.Messages[0].Text
			return &agents.Response{Text: "ok"}, nil
		})
		hc := &heldCommits{hold: make(chan struct{}), release: make(chan struct{}), held: make(chan struct{}, 1)}
		w := newManagerWorldWrites(t, agent, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true },
			func(s persistence.Store) persistence.Store { hc.Store = s; return hc })
		if res := w.deliver(t, "m1", "one"); res.Disposition != "started" {
			t.Fatalf("m1: %+v, want it started", res)
		}
		<-ran
		synctest.Wait()

		successor := w.system.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
		close(hc.hold)
		m2 := w.request("m2", "two")
		<-hc.held // m2's write waits in the store
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return successor }})
		synctest.Wait()
		close(hc.release)
		res, err := m2.Result()
		if err != nil {
			t.Fatal(err)
		}
		if d := res.(*DeliverResult).Disposition; d != "queued" {
			t.Errorf("m2, stored after the member began to leave: %q, want queued (it runs at the successor)", d)
		}
		synctest.Wait()
		ranNone(t, ran)
	})
}

// TestLeavingSessionHandsOnAnUnsureMessage: a message whose commit applied though its answer
// was lost, at a moment the store could not be read either, is pending in the store but in no
// queue. A session that hands its key on as its
// member leaves has the successor recover the key for it too; before, only a queue made it
// ask, and the message waited for a recovery sweep.
func TestLeavingSessionHandsOnAnUnsureMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "ok"}, nil
		})
		out := &storetest.Outage{}
		blind := &blindReads{}
		w := newManagerWorldWrites(t, agent, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true; blind.wrap(d) },
			out.Wrap)
		if res := w.deliver(t, "m0", "zero"); res.Disposition != "started" {
			t.Fatalf("m0: %+v", res)
		}
		<-w.sent
		out.Lost.Store(1)
		blind.on.Store(true) // the session cannot read whether the write applied
		if res := w.deliver(t, "m1", "one"); res.ErrorCode != "unavailable" {
			t.Fatalf("m1 whose commit answer is lost: %+v, want unavailable", res)
		}
		blind.on.Store(false)
		synctest.Wait()

		successor, forwarded := w.forwardSink()
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return successor }})
		select {
		case f := <-forwarded:
			if f.Key != w.key || f.GetRecover() == nil {
				t.Errorf("forwarded %v, want a Recover of %s", f, w.key)
			}
		case <-time.After(time.Minute):
			t.Error("the successor was not told to recover the key, where m1 is pending")
		}
	})
}

// TestLeavingMemberDoesNotStartAKeyBouncedBackToIt: a leaving member's session hands its key
// on with a message pending (m2), and the Recover comes back to it forwarded as often as a
// message may be (members leaving at once, in a database outage each losing its membership,
// each see the other as the successor). The member does not start the key for it: the message
// stays pending in the store for a member that stays (its recovery sweep, or its change of
// membership once this one has gone), and a message forwarded back so is answered stopped
// (the cluster router sends it again), not taken. Only a member with no other member to hand
// on to runs the key, as a single daemon does.
//
// Before, the member ran the Recover where it was: a new session, never told that its member
// leaves, claimed the key and ran m2, while the member that restarted in its place, which found
// no live holder of the key in the store, claimed it too and ran m2 again (a black-box cluster
// soak: one message's agent ran on two members at once).
func TestLeavingMemberDoesNotStartAKeyBouncedBackToIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		ran := make(chan string, 8)
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			text := req.Messages[len(req.Messages)-1].Text
			ran <- text
			if text == "slow" {
				<-release
			}
			return &agents.Response{Text: "ok"}, nil
		})
		w := newManagerWorld(t, agent, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true })
		other, forwarded := w.forwardSink()
		var successor atomic.Pointer[actor.PID]
		successor.Store(other)

		slow := w.request("m1", "slow")
		if got := <-ran; got != "slow" {
			t.Fatalf("the agent ran %q, want the slow message", got)
		}
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return successor.Load() }})
		if res := w.deliver(t, "m2", "next"); res.Disposition != "queued" || res.ErrorCode != "" {
			t.Fatalf("a message behind the running turn: %+v, want it queued", res)
		}
		close(release)
		if _, err := slow.Result(); err != nil {
			t.Fatal(err)
		}
		f := <-forwarded
		if f.Key != w.key || f.GetRecover() == nil {
			t.Fatalf("forwarded %v, want a Recover of %s", f, w.key)
		}
		synctest.Wait()

		// The other member, leaving too, sends it back: it has been forwarded often enough.
		w.system.Root.Send(w.manager, &Forward{Key: w.key, Hops: maxForwardHops, Msg: &Forward_Recover{Recover: &Recover{}}})
		res, err := w.system.Root.RequestFuture(w.manager, &Forward{Key: w.key, Hops: maxForwardHops,
			Msg: &Forward_Deliver{Deliver: w.message("m3", "more")}}, time.Hour).Result()
		synctest.Wait()
		if err != nil || res.(*DeliverResult).ErrorCode != ErrCodeStopped {
			t.Errorf("a message forwarded back to the leaving member: %+v %v, want it answered stopped", res, err)
		}
		ranNone(t, ran)
		if keys := w.active(t); len(keys) != 0 {
			t.Errorf("sessions %v started on the leaving member, want none", keys)
		}
		w.wantPendingAlone(t, "m2")

		// No other member stays: it runs the key's work itself.
		successor.Store(nil)
		w.system.Root.Send(w.manager, &Forward{Key: w.key, Hops: maxForwardHops, Msg: &Forward_Recover{Recover: &Recover{}}})
		if got := <-ran; got != "next" {
			t.Errorf("the last member ran %q, want m2", got)
		}
	})
}

// TestLeavingMemberDoesNotStartAKeyForAMessageBouncedWhileItStops: a message forwarded back to
// a leaving member as often as a message may be, which reaches it while the key's session stops
// there, is answered stopped once the session is gone, as one for a key without a session is
// (TestLeavingMemberDoesNotStartAKeyBouncedBackToIt): it cannot go on to the successor, and the
// member does not start the key for it. Before, a new session, never told that its member
// leaves, took it and ran it on the leaving member.
func TestLeavingMemberDoesNotStartAKeyForAMessageBouncedWhileItStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ran := make(chan string, 8)
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			ran <- req.Messages[len(req.Messages)-1].Text
			return &agents.Response{Text: "ok"}, nil
		})
		w := newManagerWorld(t, agent, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true })
		successor := w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {}))
		if r := w.deliver(t, "m1", "one"); r.ErrorCode != "" {
			t.Fatalf("m1: %+v", r)
		}
		<-ran
		w.awaitTurnEnds(1)
		synctest.Wait()

		resume := w.suspendAndPassivate(t)
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return successor }})
		bounced := w.system.Root.RequestFuture(w.manager, &Forward{Key: w.key, Hops: maxForwardHops,
			Msg: &Forward_Deliver{Deliver: w.message("m2", "two")}}, time.Hour)
		synctest.Wait()
		resume()
		res, err := bounced.Result()
		if err != nil || res.(*DeliverResult).ErrorCode != ErrCodeStopped {
			t.Errorf("a message forwarded back to the leaving member while the session stopped: %+v %v, want it answered stopped", res, err)
		}
		synctest.Wait()
		ranNone(t, ran)
		if keys := w.active(t); len(keys) != 0 {
			t.Errorf("sessions %v started on the leaving member, want none", keys)
		}
	})
}

// TestLeavingMemberDoesNotStartAKeyWhoseRecoverBouncedWhileItActivated: an activation of a key
// began before the member left (a Recover handed to it), and the key's Recover comes back to it
// forwarded as often as it may be while it waits for the other members to let go, and so does a
// message. Once they have, the member, which leaves and knows a successor, gives the activation up instead of
// starting the key (TestLeavingMemberDoesNotStartAKeyBouncedBackToIt): the key's work waits in
// the store for a member that stays, and the message is answered stopped. Before, the activation
// went on, and its session, never told that its member leaves, claimed the key and ran its work
// on the leaving member.
func TestLeavingMemberDoesNotStartAKeyWhoseRecoverBouncedWhileItActivated(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := peeredClusterWorld(t, echo.New())
		successor := w.system.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
		w.system.Root.Send(w.manager, &Forward{Key: w.key, Hops: 1, Msg: &Forward_Recover{Recover: &Recover{}}})
		synctest.Wait()
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return successor }})
		w.system.Root.Send(w.manager, &Forward{Key: w.key, Hops: maxForwardHops, Msg: &Forward_Recover{Recover: &Recover{}}})
		bounced := w.system.Root.RequestFuture(w.manager, &Forward{Key: w.key, Hops: maxForwardHops,
			Msg: &Forward_Deliver{Deliver: w.message("m1", "hi")}}, time.Hour)
		time.Sleep(2 * releaseAnswerTimeout)
		synctest.Wait()
		if res, err := bounced.Result(); err != nil || res.(*DeliverResult).ErrorCode != ErrCodeStopped {
			t.Errorf("a message forwarded back to the leaving member while it activated the key: %+v %v, want it answered stopped", res, err)
		}
		if keys := w.active(t); len(keys) != 0 {
			t.Errorf("sessions %v started on the leaving member, want none", keys)
		}
		if _, err := w.store.Ownership(w.ctx, w.key); err == nil {
			t.Error("the leaving member claimed the key")
		}
	})
}

// active is the keys of the sessions in w's manager's memory.
func (w *managerWorld) active(t *testing.T) []string {
	t.Helper()
	res, err := w.system.Root.RequestFuture(w.manager, &ListActive{}, time.Hour).Result()
	if err != nil {
		t.Fatalf("list active: %v", err)
	}
	return res.(*ActiveList).Keys
}

// recoversOf takes the Forwards waiting in forwarded and counts the Recovers of key among them.
func recoversOf(forwarded chan *Forward, key string) int {
	n := 0
	for len(forwarded) > 0 {
		if f := <-forwarded; f.Key == key && f.GetRecover() != nil {
			n++
		}
	}
	return n
}

// ranNone checks that the agent has run no turn since ran was last read.
func ranNone(t *testing.T, ran chan string) {
	t.Helper()
	select {
	case text := <-ran:
		t.Errorf("the leaving member ran %q", text)
	default:
	}
}

// wantPendingAlone checks that the store holds id, and only id, pending for w's key: the work
// left for the key's next holder.
func (w *managerWorld) wantPendingAlone(t *testing.T, id string) {
	t.Helper()
	snap, err := w.store.LoadSession(w.ctx, w.key, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Pending) != 1 || snap.Pending[0].MessageID != id {
		t.Errorf("pending %+v, want %s alone, for the key's next holder", snap.Pending, id)
	}
}

// forwardSink spawns a stand-in for another member's manager, which takes the Forwards handed
// on to it into the channel returned (8 at most).
func (w *managerWorld) forwardSink() (*actor.PID, chan *Forward) {
	forwarded := make(chan *Forward, 8)
	pid := w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if f, ok := c.Message().(*Forward); ok {
			forwarded <- f
		}
	}))
	return pid, forwarded
}

// panicsOnBoom is an agent that says into ran each message it runs, and answers "ok", but
// panics on "boom" once release is closed.
func panicsOnBoom(ran chan<- string, release <-chan struct{}) agents.Agent {
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		ran <- req.Messages[0].Text
		if req.Messages[0].Text == "boom" {
			<-release
			panic("agent bug")
		}
		return &agents.Response{Text: "ok"}, nil
	})
}

// TestLeavingManagersDrainWaitsForIdleSessionsToHandOn: the drain of a leaving member is asked
// right behind the Leave (Daemon.Stop), and sessions with no turn running hand their keys on
// once they have read that their member leaves. The drain ends once they have. Before, it was
// answered as soon as the manager had told them, before any had read it: the daemon went on to
// stop them, and those that had not read it yet stopped without handing their keys on (a
// leaving member counted 1 of its 3 sessions handed on, in CI's TestClusterCountsSessionsHandedOn).
func TestLeavingManagersDrainWaitsForIdleSessionsToHandOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newManagerWorld(t, echo.New(), func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true })
		const sessions = 3
		for i := range sessions {
			src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: fmt.Sprint("c", i), UserID: "u1"}
			key := identity.Key(src, w.d.Config.Keys)
			res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: key, Msg: &Deliver{SessionKey: key,
				Source: sourceToProto(src), MessageId: fmt.Sprint("m", i), Text: "hi"}}, time.Hour).Result()
			if err != nil || res.(*DeliverResult).Disposition != "started" {
				t.Fatalf("m%d: %+v %v", i, res, err)
			}
		}
		w.awaitTurnEnds(sessions)
		synctest.Wait()

		// The sessions read nothing until the drain has been asked: the manager handles the Leave
		// and the Drain before any of them has read that its member leaves.
		var resume []func()
		for i := range sessions {
			key := identity.Key(identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: fmt.Sprint("c", i), UserID: "u1"}, w.d.Config.Keys)
			session := actor.NewPID(w.system.Address(), w.manager.Id+"/"+key)
			proc, ok := w.system.ProcessRegistry.Get(session)
			if !ok {
				t.Fatalf("no session %s", session)
			}
			proc.SendSystemMessage(session, &actor.SuspendMailbox{})
			resume = append(resume, func() { proc.SendSystemMessage(session, &actor.ResumeMailbox{}) })
		}
		successor, _ := w.forwardSink()
		handedOn := make(chan float64, 1)
		drainer := w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			if _, ok := c.Message().(*Drained); ok {
				handedOn <- promtest.ToFloat64(w.d.Metrics.SessionsHandedOn)
			}
		}))
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return successor }})
		w.system.Root.RequestWithCustomSender(w.manager, &Drain{}, drainer)
		synctest.Wait()
		for _, r := range resume {
			r()
		}
		if n := <-handedOn; n != sessions {
			t.Errorf("at the drain's end %v sessions had handed their keys on, want all %d", n, sessions)
		}
		synctest.Wait()
		if keys := w.active(t); len(keys) != 0 {
			t.Errorf("sessions %v still in memory, want none", keys)
		}
	})
}

// TestLeavingManagersDrainEndsWithTheKeysNoMemberTakes: a leaving member with no member to take a
// key over (Leave.Successor answers nil: the members it handed to leave too, as in a whole
// cluster stopped at once) runs the key itself, as a single daemon does, and its drain ends once
// no turn of it runs. Such a session is never told that its member leaves and hands nothing on:
// the drain waited for it to leave memory, and every such stop waited out its whole drain
// deadline, then said it cancelled turns when none ran.
func TestLeavingManagersDrainEndsWithTheKeysNoMemberTakes(t *testing.T) {
	t.Run("a message after the leave", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			w := newManagerWorld(t, echo.New(), func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true })
			w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return nil }})
			if res := w.deliver(t, "m1", "hi"); res.Disposition != "started" {
				t.Fatalf("m1: %+v, want it run here", res)
			}
			drained := w.drain()
			w.awaitTurnEnds(1)
			synctest.Wait()
			if !answered(drained) {
				t.Error("the drain was not answered once the turn of the key no member takes had ended")
			}
		})
	})
	t.Run("work left queued once the successor is gone", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			release := make(chan struct{})
			agent, _ := slowUntil(release)
			w := newManagerWorld(t, agent, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true })
			sink, _ := w.forwardSink()
			var successor atomic.Pointer[actor.PID]
			successor.Store(sink)
			slow := w.request("m1", "slow")
			synctest.Wait()
			w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return successor.Load() }})
			drained := w.drain()
			if res := w.deliver(t, "m2", "next"); res.Disposition != "queued" {
				t.Fatalf("m2: %+v, want queued", res)
			}
			successor.Store(nil) // the member that was to take the key over leaves too
			close(release)
			if _, err := slow.Result(); err != nil {
				t.Fatal(err)
			}
			w.awaitTurnEnds(2) // m1's, then m2's, run here: no member takes the key
			synctest.Wait()
			if !answered(drained) {
				t.Error("the drain was not answered once the queued message had run here")
			}
		})
	})
}

// TestLeavingManagerListsTheKeysItsDrainWaitsFor: while a leaving member's session that left a
// message queued waits for its platform to confirm its sends before its key is handed on,
// ListActive names the key among those handing on, and none busy (the drain deadline's line
// lists them: before, a drain that ran out waiting for hand-overs said it cancelled the turns of
// "sessions 0"); once the key is handed on, none.
func TestLeavingManagerListsTheKeysItsDrainWaitsFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		agent, _ := slowUntil(release)
		w := newManagerWorld(t, agent, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true })
		sent := make(chan struct{}, 8)
		w.d.Platforms["fake"] = w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) { // before any session
			if _, ok := c.Message().(*SendOutbound); ok {
				sent <- struct{}{}
			} // a Quiesce is never answered: the sends stay unconfirmed
		}))
		slow := w.request("m1", "slow")
		synctest.Wait()
		successor, forwarded := w.forwardSink()
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return successor }})
		drained := w.drain()
		if res := w.deliver(t, "m2", "next"); res.Disposition != "queued" {
			t.Fatalf("m2: %+v, want queued", res)
		}
		close(release)
		if _, err := slow.Result(); err != nil {
			t.Fatal(err)
		}
		<-sent
		synctest.Wait()
		if l := w.list(t); len(l.Busy) != 0 || !slices.Equal(l.HandingOn, []string{w.key}) || len(drained) != 0 {
			t.Errorf("while the platform confirms nothing: busy %v, handing on %v, drained %v; want none busy, %s handing on, the drain waiting",
				l.Busy, l.HandingOn, len(drained) != 0, w.key)
		}
		time.Sleep(handOnQuiesceTimeout) // (synctest's clock) the hand-on gives up waiting for the platform
		<-drained
		synctest.Wait() // the stand-in successor has taken what was sent to it
		if n := recoversOf(forwarded, w.key); n != 1 {
			t.Errorf("the successor was told %d times to recover the key, want once", n)
		}
		if l := w.list(t); len(l.HandingOn) != 0 || len(l.Keys) != 0 {
			t.Errorf("once handed on: sessions %v, handing on %v; want none", l.Keys, l.HandingOn)
		}
	})
}

// list is the manager's ActiveList.
func (w *managerWorld) list(t *testing.T) *ActiveList {
	t.Helper()
	res, err := w.system.Root.RequestFuture(w.manager, &ListActive{}, time.Hour).Result()
	if err != nil {
		t.Fatalf("list active: %v", err)
	}
	return res.(*ActiveList)
}

// TestLeavingManagerListsTheFiledResetsItsDrainWaitsFor: a leaving member's drain waits too for
// the filed resets it hands on with their keys until the key's next owner takes them
// (answerDrains), and ListActive names those keys among the ones handing on. Before, it named
// only keys with a session here: a drain that ran out waiting for such a hand-on alone (a
// successor that does not answer) said it cancelled the turns of "sessions 0".
func TestLeavingManagerListsTheFiledResetsItsDrainWaitsFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, _, _, _ := refusedResetWorld(t, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true })
		successor, forwarded := w.forwardSink() // it never answers the reset handed on
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return successor }})
		drained := w.drain()
		time.Sleep(maxRefusedPause) // (synctest's clock) the pause ends: the key and its reset go on
		synctest.Wait()
		handedOn := false
		for len(forwarded) > 0 {
			if f := <-forwarded; f.Key == w.key && f.GetResetDue() != nil {
				handedOn = true
			}
		}
		if !handedOn {
			t.Fatal("the filed reset was not handed on with the key")
		}
		if l := w.list(t); len(l.Busy) != 0 || !slices.Equal(l.HandingOn, []string{w.key}) || answered(drained) {
			t.Errorf("while the successor has not taken the reset: busy %v, handing on %v, drained %v; want none busy, %s handing on, the drain waiting",
				l.Busy, l.HandingOn, answered(drained), w.key)
		}
	})
}

// TestManagerRestartedWhileItsMemberLeavesGoesOnLeaving: a leaving member's manager panics while
// a turn runs, after the daemon has asked its drain, and its supervisor restarts it (the session
// stops with it; its message stays pending for the member that takes the key over). The
// restarted manager answers that drain, as nothing runs any more, and it still leaves: a message
// for the key goes to the key's successor, and no session starts here. Before, the leave and the
// drain lived only in the incarnation that panicked: the drain was never answered (the daemon's
// stop waited out its whole drain deadline), and the new incarnation activated the key here and
// ran its messages, which the leave exists to prevent.
func TestManagerRestartedWhileItsMemberLeavesGoesOnLeaving(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		agent, ran := slowUntil(release)
		w := newManagerWorld(t, agent, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true })
		slow := w.request("m1", "slow")
		synctest.Wait()
		forwarded, drained, restart := w.leaveToASink(t)
		if answered(drained) {
			t.Fatal("the drain was answered while a turn ran")
		}

		restart()
		if _, err := slow.Result(); err != nil {
			t.Fatal(err)
		}
		if !answered(drained) {
			t.Error("the drain asked of the manager before its restart was not answered once nothing ran")
		}
		for len(forwarded) > 0 {
			<-forwarded // what the stopped session handed on, if anything
		}

		w.request("m2", "next")
		synctest.Wait()
		handed := false
		for len(forwarded) > 0 {
			if f := <-forwarded; f.Key == w.key && f.GetDeliver().GetMessageId() == "m2" {
				handed = true
			}
		}
		if !handed {
			t.Error("a message for the key after the restart was not handed on to the key's successor")
		}
		if keys := w.active(t); len(keys) != 0 {
			t.Errorf("the restarted manager of a leaving member holds the sessions %q, want none", keys)
		}
		if n := ran("slow") + ran("next"); n != 1 {
			t.Errorf("the agent ran %d turns, want only the first run of m1 (none here after the restart)", n)
		}
		w.wantPendingAlone(t, "m1")
	})
}

// leaveToASink has w's manager leave to a sink successor (its Forwards come on forwarded) and
// asks the daemon's drain. restart then restarts the manager: another key's recovery meets a
// failing successor lookup, and the manager panics.
func (w *managerWorld) leaveToASink(t *testing.T) (forwarded chan *Forward, drained <-chan struct{}, restart func()) {
	t.Helper()
	sink, forwarded := w.forwardSink()
	var boom atomic.Bool
	successor := func(key string) *actor.PID {
		if key == "other-key" && boom.CompareAndSwap(true, false) {
			panic("the successor's lookup fails")
		}
		return sink
	}
	w.system.Root.Send(w.manager, &Leave{Successor: successor})
	drained = w.drain()
	synctest.Wait()
	return forwarded, drained, func() {
		t.Helper()
		w.restartManager(t, &boom)
	}
}
