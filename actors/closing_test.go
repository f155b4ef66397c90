package actors

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
)

// gatedLoads is a store whose LoadSession of key waits until gate is closed, after it says so
// on loading: a session that stays in its start for as long as a test needs.
type gatedLoads struct {
	persistence.Store
	key     string
	loading chan struct{}
	gate    chan struct{}
}

func (s *gatedLoads) LoadSession(ctx context.Context, key string, historyLimit, pendingLimit int) (*persistence.Snapshot, error) {
	if key == s.key {
		s.loading <- struct{}{}
		<-s.gate
	}
	return s.Store.LoadSession(ctx, key, historyLimit, pendingLimit)
}

// TestStoppingManagerStartsNothingForALateMessage: a manager stops (as the daemon stops it, with
// a poison pill) while a session of another chat is still starting, so the stop waits for it.
// A message routed to the manager meanwhile starts no session: a message for a key without a
// session, in a single daemon or a cluster member, is answered "stopped" and not stored (a
// platform asks its sender to send it again; the cluster router sends it again to the key's
// next owner); a message for the key of the session that stops with the manager is answered so
// too, and a Peek at it says it is inactive; a reset is answered with a dead letter, as a stopped
// manager's would be; a leaving member hands the message to the key's successor; a Recover
// starts nothing (the work stays in the store for the key's next activation). The manager's stop
// ends once the starting session has stopped.
//
// Before, the message started an activation under the stopping manager: its session stored and
// ran the message and answered it, and the manager's stop then waited for that session, which
// nothing stopped, for ever. A message for the stopping session's key (and a Peek's GetState)
// was forwarded to it and dropped unanswered.
func TestStoppingManagerStartsNothingForALateMessage(t *testing.T) {
	for _, tc := range []struct {
		name      string
		clustered bool
		leaving   bool
		sameKey   bool   // the message is for the key of the session that stops with the manager
		kind      string // of the message: "deliver" (by default), "reset", "recover" or "peek"
	}{
		{name: "single daemon"},
		{name: "cluster member", clustered: true},
		{name: "the stopping session's key", sameKey: true},
		{name: "a reset", kind: "reset"},
		{name: "a peek at the stopping session", sameKey: true, kind: "peek"},
		{name: "a recover", kind: "recover"},
		{name: "a recover, cluster member", clustered: true, kind: "recover"},
		{name: "leaving member", clustered: true, leaving: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c2", UserID: "u1"}
				var loads *gatedLoads
				w := newManagerWorld(t, echo.New(), func(d *Deps) {
					if tc.clustered {
						d.Node, d.Fencing, d.Clustered = "a", true, true
					}
					loads = &gatedLoads{Store: d.Store, key: identity.Key(src, d.Config.Keys),
						loading: make(chan struct{}, 1), gate: make(chan struct{})}
					d.Store = loads
				})
				var owner atomic.Pointer[actor.PID]
				if tc.clustered {
					w.d.Placement = peersPlacement{self: w.manager, owner: &owner}
					owner.Store(w.manager)
				}
				// The other chat's session starts (a recovery) and waits for its load.
				w.system.Root.Send(w.manager, &Routed{Key: loads.key, Msg: &Recover{}})
				<-loads.loading
				forwarded := make(chan *Forward, 4)
				if tc.leaving {
					successor := w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
						if f, ok := c.Message().(*Forward); ok {
							forwarded <- f
						}
					}))
					w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return successor }})
				}
				stopped := w.system.Root.PoisonFuture(w.manager)
				synctest.Wait() // the manager stops, waiting for the starting session

				key, msg := w.key, any(w.message("m1", "hi"))
				if tc.sameKey {
					key, msg = loads.key, &Deliver{SessionKey: loads.key, Source: sourceToProto(src), MessageId: "m1",
						Text: "hi", ReceivedAtUnixNano: time.Now().UnixNano()}
				}
				switch tc.kind {
				case "reset":
					msg = &ResetSession{Reason: persistence.EndResetCommand}
				case "recover":
					msg = &Recover{}
				}
				if tc.kind != "peek" {
					msg = &Routed{Key: key, Msg: msg}
				} else {
					msg = &Peek{Key: key}
				}
				f := w.system.Root.RequestFuture(w.manager, msg, time.Hour)
				synctest.Wait()
				close(loads.gate)
				if err := stopped.Wait(); err != nil {
					t.Errorf("the manager did not stop: %v", err)
				}
				switch {
				case tc.kind == "recover":
				case tc.kind == "peek":
					if res, err := f.Result(); err != nil || res.(*SessionState).Active {
						t.Errorf("the peek during the stop: %+v %v, want the session inactive", res, err)
					}
				case tc.kind == "reset":
					if res, err := f.Result(); !errors.Is(err, actor.ErrDeadLetter) {
						t.Errorf("the reset routed during the stop: %+v %v, want a dead letter", res, err)
					}
				case tc.leaving:
					select {
					case fw := <-forwarded:
						if fw.GetDeliver().GetMessageId() != "m1" {
							t.Errorf("the successor was forwarded %+v, want m1", fw)
						}
					default:
						t.Error("the message was not handed to the key's successor")
					}
				default:
					if res, err := f.Result(); err != nil || res.(*DeliverResult).ErrorCode != ErrCodeStopped {
						t.Errorf("the message routed during the stop: %+v %v, want %q", res, err, ErrCodeStopped)
					}
				}
				chat := w.src.ChatID
				if tc.sameKey {
					chat = src.ChatID
				}
				if m, err := w.store.FindInbound(w.ctx, "fake", chat, "m1"); !errors.Is(err, persistence.ErrNotFound) {
					t.Errorf("the message routed during the stop was stored here: %+v %v", m, err)
				}
			})
		})
	}
}

// TestStoppingManagerStartsNoSuccessor: a session passivates (its mailbox is suspended, so it has
// not stopped yet) and a message for its key is held for its successor when the manager stops,
// while a session of another chat is still starting. The held message is answered "stopped",
// and when the passivating session is gone no successor starts for it: the message is not
// stored here, and the manager's stop ends once the other session has stopped.
//
// Before, the successor started under the stopping manager: it stored and ran the message just
// answered "stopped", and the stop waited for it for ever.
func TestStoppingManagerStartsNoSuccessor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c2", UserID: "u1"}
		var loads *gatedLoads
		w := newManagerWorld(t, echo.New(), func(d *Deps) {
			loads = &gatedLoads{Store: d.Store, key: identity.Key(src, d.Config.Keys),
				loading: make(chan struct{}, 1), gate: make(chan struct{})}
			d.Store = loads
		})
		if r := w.deliver(t, "m0", "one"); r.ErrorCode != "" {
			t.Fatalf("m0: %+v", r)
		}
		w.awaitTurnEnds(1)
		synctest.Wait()
		w.system.Root.Send(w.manager, &Routed{Key: loads.key, Msg: &Recover{}})
		<-loads.loading

		w.suspendAndPassivate(t)
		f := w.request("m1", "two") // held for the successor
		synctest.Wait()
		stopped := w.system.Root.PoisonFuture(w.manager)
		synctest.Wait() // the passivating session stops with the manager; the other still starts
		close(loads.gate)
		if err := stopped.Wait(); err != nil {
			t.Errorf("the manager did not stop: %v", err)
		}
		if res, err := f.Result(); err != nil || res.(*DeliverResult).ErrorCode != ErrCodeStopped {
			t.Errorf("the held message: %+v %v, want %q", res, err, ErrCodeStopped)
		}
		synctest.Wait()
		if m, err := w.store.FindInbound(w.ctx, "fake", w.src.ChatID, "m1"); !errors.Is(err, persistence.ErrNotFound) {
			t.Errorf("the message answered %q was stored all the same: %+v %v", ErrCodeStopped, m, err)
		}
	})
}
