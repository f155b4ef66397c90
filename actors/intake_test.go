package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
)

// TestMessageCaughtByTheStopIsDraining: a message taken in just before the daemon began to
// drain, whose session then stops before its write is acknowledged, fails with
// platforms.ErrDraining (and ErrUnavailable): the daemon is stopping. Before, it failed with
// ErrUnavailable alone, so Discord told its sender the message could not be stored and to send
// it again, and the next start's backfill read it back and answered it all the same.
func TestMessageCaughtByTheStopIsDraining(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		held := &heldCommits{hold: make(chan struct{}), release: make(chan struct{}), held: make(chan struct{}, 1)}
		close(held.hold)
		w := newManagerWorldWrites(t, echo.New(), nil, func(s persistence.Store) persistence.Store {
			held.Store = s
			return held
		})
		in := NewIntake(NewLocalRouter(w.system.Root, w.manager), w.store, identity.DefaultKeyOptions, metrics.New("fake"), w.d.Log)
		errc := make(chan error, 1)
		go func() {
			_, err := in.Deliver(w.ctx, &platforms.Inbound{Source: w.src, MessageID: "m1", Text: "hi", ReceivedAt: time.Now()})
			errc <- err
		}()
		<-held.held // its write waits in the commit
		in.Drain()
		stopped := w.system.Root.PoisonFuture(w.manager)
		err := <-errc
		if !errors.Is(err, platforms.ErrDraining) || !errors.Is(err, platforms.ErrUnavailable) {
			t.Errorf("Deliver = %v, want ErrDraining and ErrUnavailable", err)
		}
		close(held.release)
		if err := stopped.Wait(); err != nil {
			t.Errorf("the manager did not stop: %v", err)
		}
	})
}

// TestDeliverUnansweredInTimeIsUnavailable: a message whose session does not answer within the
// router's DefaultRequestTimeout (its write hangs in a commit) fails with
// platforms.ErrUnavailable, which a platform answers "send it again" (HTTP 503; sent again with
// the same id, it is stored once). Before, it failed with a bare ErrTimeout, which the HTTP API
// answered 500 "internal error" and logged as `ERR deliver failed`: on a real full disk, for the
// messages the manager held for a session waiting out a pause after refused writes (now
// answered at once: TestDeliverToAPausedSessionIsAnsweredAtOnce).
func TestDeliverUnansweredInTimeIsUnavailable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		held := &heldCommits{hold: make(chan struct{}), release: make(chan struct{}), held: make(chan struct{}, 1)}
		close(held.hold)
		w := newManagerWorldWrites(t, echo.New(), nil, func(s persistence.Store) persistence.Store {
			held.Store = s
			return held
		})
		in := NewIntake(NewLocalRouter(w.system.Root, w.manager), w.store, identity.DefaultKeyOptions, metrics.New("fake"), w.d.Log)
		_, err := in.Deliver(context.Background(), &platforms.Inbound{Source: w.src, MessageID: "m1", Text: "one", ReceivedAt: time.Now()})
		if !errors.Is(err, platforms.ErrUnavailable) {
			t.Errorf("Deliver whose session does not answer in time = %v, want platforms.ErrUnavailable", err)
		}
		<-held.held
		close(held.release)
	})
}

// TestPausedSessionStartsEarlyOnceTheStoreTakesWrites: a session waits out a pause after the
// store refused its writes (a full disk; here its idle reset's, which each start does again),
// up to a minute; once room is made and the store has taken a write since the pause began
// (another chat's message here), the session starts within a second and does its work; a
// message that comes for it then is taken at once. Before, it waited out the rest of its pause,
// and messages for it were answered unavailable meanwhile: after a disk was freed, its chat
// waited up to a minute more.
func TestPausedSessionStartsEarlyOnceTheStoreTakesWrites(t *testing.T) {
	for _, another := range []bool{false, true} {
		t.Run(fmt.Sprintf("another message=%v", another), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				out := &storetest.Outage{}
				agent, _ := countingEcho()
				var refusals persistence.Refusals
				w := newManagerWorldWith(t, filepath.Join(t.TempDir(), "agentgate.db"), agent,
					func(d *Deps) { d.Refusals = &refusals; idleReset(d) },
					out.Wrap,
					func(o *persistence.ActorOptions) { o.Refusals = &refusals })
				sid := w.pauseByRefusedResets(t, func(bool) { out.Down.Store(true) })
				time.Sleep(64 * time.Second) // just after a restart: the next is a minute away
				synctest.Wait()
				if r := w.deliver(t, "m2", "two"); r.ErrorCode != "unavailable" {
					t.Fatalf("m2 while the disk is full: %+v, want unavailable", r)
				}

				out.Down.Store(false) // room is made
				other := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c2", UserID: "u2"}
				otherKey := identity.Key(other, w.d.Config.Keys)
				res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: otherKey, Msg: &Deliver{SessionKey: otherKey,
					Source: sourceToProto(other), MessageId: "o1", Text: "hello", ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour).Result()
				if err != nil || res.(*DeliverResult).ErrorCode != "" {
					t.Fatalf("another chat's message once room is made: %v %+v", err, res)
				}
				if another {
					if r := w.deliver(t, "m2", "two"); r.ErrorCode != "" {
						t.Errorf("m2 sent again once the store took a write: %+v, want it taken at once", r)
					}
				}
				time.Sleep(2 * time.Second) // well inside the minute the pause had left
				synctest.Wait()
				if sess, err := w.store.Session(w.ctx, sid); err != nil || sess.EndedAt.IsZero() {
					t.Errorf("session %s after room was made: %+v %v, want its reset stored", sid, sess, err)
				}
				if another {
					var sent []string
					for len(w.sent) > 0 {
						sent = append(sent, (<-w.sent).Out.Text)
					}
					if !slices.Contains(sent, "echo: two") {
						t.Errorf("sent %q, want m2 answered", sent)
					}
				}
			})
		})
	}
}

// idleReset gives the sessions of d an idle reset policy of 30 s.
func idleReset(d *Deps) {
	idle := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Second}
	d.Config.ResetFor = func(string, string) ResetPolicy { return idle }
	d.Config.ResetPolicies = []ResetPolicy{idle}
}

// pauseByRefusedResets has w's session (idleReset) start again and again from the store after
// pauses: m1 is answered, the session goes idle past its policy, full fills the disk (full(true))
// and the reset falls due. Its write is refused, and so it is at each start, where the session
// does the reset again; the pause before the next start grows from 1 s to a minute. It returns
// the id of m1's session, which the reset ends. (A turn's result the store refuses pauses
// nothing: the session holds it and writes it again, TestRefusedTurnResultIsKeptNotRunAgain.)
func (w *managerWorld) pauseByRefusedResets(t *testing.T, full func(bool)) string {
	t.Helper()
	r := w.deliver(t, "m1", "one")
	if r.Disposition != platforms.Started {
		t.Fatalf("m1: %+v, want started", r)
	}
	w.awaitTurnEnds(1)
	time.Sleep(time.Minute) // idle past its policy
	full(true)
	w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
	return r.SessionId
}

// TestPausesAfterAnEarlyStartAreWaitedOut: on a disk with room for small writes but not for a
// session's write (its reset's here, which each start does again), other chats' writes keep
// getting through; the session, started early once, is refused again, and its pauses after
// that are waited out: it starts about once per pause of its backoff, not once a second.
// Before, every pause ended at the next write another chat got through, and the session started
// again each time: when the refused write was a turn's result, it ran its agent again each time
// (a turn's result is held now, TestRefusedTurnResultIsKeptNotRunAgain).
func TestPausesAfterAnEarlyStartAreWaitedOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var full atomic.Bool
		var starts atomic.Int32 // refused writes of c1's reset: one each time its session starts
		agent, _ := countingEcho()
		var refusals persistence.Refusals
		w := newManagerWorldWith(t, filepath.Join(t.TempDir(), "agentgate.db"), agent,
			func(d *Deps) { d.Refusals = &refusals; idleReset(d) },
			func(s persistence.Store) persistence.Store {
				// A disk with room for small writes, not for c1's reset.
				return &refusedWrites{Store: s, refuse: func(op persistence.Op) bool {
					if _, ok := op.(*persistence.EndSession); ok && full.Load() {
						starts.Add(1)
						return true
					}
					return false
				}}
			},
			func(o *persistence.ActorOptions) { o.Refusals = &refusals })
		w.pauseByRefusedResets(t, full.Store)
		other := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c2", UserID: "u2"}
		otherKey := identity.Key(other, w.d.Config.Keys)
		const minutes = 5
		// Another chat's write gets through every second (until the refused session has started
		// more often than its backoff allows: the test fails then, without running on).
		for i := 0; i < minutes*60 && starts.Load() <= 20; i++ {
			res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: otherKey, Msg: &Deliver{SessionKey: otherKey,
				Source: sourceToProto(other), MessageId: fmt.Sprint("o", i), Text: "hello", ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour).Result()
			if err != nil || res.(*DeliverResult).ErrorCode != "" {
				t.Fatalf("another chat's message: %v %+v", err, res)
			}
			time.Sleep(time.Second)
		}
		// Pauses of 1, 2, 4 … 32 s, then a minute: about 8 in 5 minutes, and at most one early
		// start after each.
		if n := starts.Load(); n > 20 {
			t.Errorf("the refused session started %d times in %d minutes, want its pauses waited out (about 16 at most)", n, minutes)
		} else if n < 5 {
			t.Fatalf("the refused session started %d times in %d minutes: the test does not test", n, minutes)
		}
	})
}

// TestDeliverToAPausedSessionIsAnsweredAtOnce: a message for a session that waits out a pause
// after the store refused its writes (a full disk) is answered unavailable at once. Before, the
// manager held it until the pause ended, up to a minute: on a full disk each HTTP request of
// such a chat hung for 30 s, and its client's connection with it, only to be told to send the
// message again.
func TestDeliverToAPausedSessionIsAnsweredAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		agent, ran := countingEcho()
		w := newManagerWorldWrites(t, agent, idleReset, func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		w.pauseByRefusedResets(t, out.Down.Store)
		time.Sleep(64 * time.Second) // just after a restart: the next is a minute away
		synctest.Wait()
		in := NewIntake(NewLocalRouter(w.system.Root, w.manager), w.store, identity.DefaultKeyOptions, metrics.New("fake"), w.d.Log)
		start := time.Now()
		_, err := in.Deliver(context.Background(), &platforms.Inbound{Source: w.src, MessageID: "m2", Text: "two", ReceivedAt: time.Now()})
		if !errors.Is(err, platforms.ErrUnavailable) {
			t.Errorf("Deliver to a paused session = %v, want platforms.ErrUnavailable", err)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("Deliver to a paused session answered after %v, want at once", took)
		}
		// m1, taken before the pause, delivered again meanwhile (a platform's retry) is a
		// duplicate, not a message to send again. Before, it was answered unavailable too.
		ack, err := in.Deliver(context.Background(), &platforms.Inbound{Source: w.src, MessageID: "m1", Text: "one", ReceivedAt: time.Now()})
		if err != nil || ack.Disposition != platforms.Duplicate {
			t.Errorf("m1 delivered again to its paused session = %+v, %v; want a duplicate", ack, err)
		}
		// Once the store takes writes again, the session starts after its pause; m2, sent
		// again, is taken and runs once, and m1 does not run again.
		out.Down.Store(false)
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if r := w.deliver(t, "m2", "two"); r.ErrorCode != "" {
			t.Errorf("m2 sent again after the outage: %+v, want it taken", r)
		}
		w.answerTo("m2")
		if n1, n2 := ran("m1"), ran("m2"); n1 != 1 || n2 != 1 {
			t.Errorf("the agent ran m1 %d and m2 %d times, want once each", n1, n2)
		}
	})
}

// panicsOnWithdraw is a router whose withdrawals panic (a bug met on the way to the session);
// it routes everything else.
type panicsOnWithdraw struct{ SessionRouter }

func (p panicsOnWithdraw) Request(ctx context.Context, key string, msg any) (any, error) {
	if _, ok := msg.(*Withdraw); ok {
		panic("injected: the withdrawal failed")
	}
	return p.SessionRouter.Request(ctx, key, msg)
}

// TestWithdrawStoredThatPanicsLogsItsStack: a withdrawal through the store (a purge's message
// the platform does not remember, WithdrawStored) that panics fails with the panic's value, and
// the intake logs the panic with its stack and the message, as the platform's recover logged it
// when each such withdrawal ran on a goroutine of the platform's own. Before, since the purge's
// withdrawals through the store went in one call, the stack was lost: the platform saw the
// error alone.
func TestWithdrawStoredThatPanicsLogsItsStack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testutil.Buffer
		a := newRequeueAgent()
		w := newManagerWorld(t, a, nil)
		if r := w.deliver(t, "m0", "hold"); r.Disposition != platforms.Started {
			t.Fatalf("m0: %+v, want started", r)
		}
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Queued {
			t.Fatalf("m1: %+v, want queued", r)
		}
		in := NewIntake(panicsOnWithdraw{NewLocalRouter(w.system.Root, w.manager)}, w.store, identity.DefaultKeyOptions, metrics.New("fake"),
			slog.New(slog.NewTextHandler(&logs, nil)))
		out := in.WithdrawStored(w.ctx, w.src.Platform, w.src.ChatID, "", []string{"m1"})
		if len(out) != 1 || out[0].Taken || out[0].Err == nil || !strings.Contains(out[0].Err.Error(), "withdraw panicked: injected") {
			t.Errorf("WithdrawStored(m1) = %+v, want failed with the panic", out)
		}
		var line string
		for l := range strings.Lines(logs.String()) {
			if strings.Contains(l, msgWithdrawPanicked) {
				line = l
			}
		}
		if !strings.Contains(line, "level=ERROR") || !strings.Contains(line, "message_id=m1") || !strings.Contains(line, "session="+w.key) ||
			!strings.Contains(line, "injected: the withdrawal failed") || !strings.Contains(line, "panicsOnWithdraw") {
			t.Errorf("the panic's line = %q, want at ERROR with the message, its session, the panic and its stack\n%s", line, logs.String())
		}
		close(a.hold)
	})
}
