package actors

import (
	"context"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
)

// listingPanics is a store whose Recoverable panics once when armed: it stands for any bug of
// the session manager's own (its listing runs on the manager).
type listingPanics struct {
	persistence.Store
	boom *atomic.Bool
}

func (l listingPanics) Recoverable(ctx context.Context) ([]string, error) {
	if l.boom.CompareAndSwap(true, false) {
		panic("the manager's listing fails")
	}
	return l.Store.Recoverable(ctx)
}

// restartedDuringM1 is a managerWorld set up by setup whose manager panics, and is restarted
// by its supervisor, while m1's turn runs.
func restartedDuringM1(t *testing.T, agent agents.Agent, setup func(*Deps)) *managerWorld {
	t.Helper()
	var restart func(*testing.T, *managerWorld)
	w := newManagerWorld(t, agent, func(d *Deps) {
		setup(d)
		restart = panicsOnCue(d)
	})
	if res := w.deliver(t, "m1", "first"); res.Disposition != "started" {
		t.Fatalf("m1: %+v", res)
	}
	synctest.Wait()
	restart(t, w)
	return w
}

// panicsOnCue wraps d's store in listingPanics and returns restart, which makes w's manager
// panic in its next listing and waits until its supervisor has restarted it.
func panicsOnCue(d *Deps) (restart func(t *testing.T, w *managerWorld)) {
	boom := new(atomic.Bool)
	d.Store = listingPanics{Store: d.Store, boom: boom}
	return func(t *testing.T, w *managerWorld) {
		t.Helper()
		boom.Store(true)
		w.system.Root.Send(w.manager, &recoverAll{})
		synctest.Wait()
		if boom.Load() {
			t.Fatal("the manager did not restart")
		}
	}
}

// TestRestartedManagerWaitsForTheCancelledCallsBeforeItRecovers: a manager panics while m1's
// turn runs, and its supervisor restarts it: the restart stops m1's session and cancels its
// turn, whose agent takes 3 s to return (an exec command that cleans up on SIGTERM). The new
// incarnation holds the key until that call has returned; m2, which reaches it meanwhile (a
// client's retry of a message answered "stopped" at the restart comes at once), is held, and
// only then goes on: a single daemon recovers the key (m1, pending in the store, runs again, also
// without m2) and m2 runs after it; a cluster member's m2 activates the key, whose session loads
// m1 too (without m2, its recovery does: TestRestartedMemberRecoversTheStoppedKeysItOwns). Before,
// a single daemon's new incarnation recovered the key as it started, and a cluster member's
// activated it for m2 at once: m1 ran a second time beside the call still ending, the agent's
// tools acting twice at once for one message.
func TestRestartedManagerWaitsForTheCancelledCallsBeforeItRecovers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(*Deps)
		m2    bool // m2 reaches the new incarnation while m1's cancelled call ends
		// late: the old incarnation's successor for the key (sent to itself as a stopping
		// session of the key stopped) reaches the new one during the hold
		late bool
	}{
		{"single daemon", func(*Deps) {}, true, false},
		{"single daemon, nothing meanwhile", func(*Deps) {}, false, false},
		{"single daemon, a late successor meanwhile", func(*Deps) {}, true, true},
		{"cluster member", func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true }, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				agent := &slowToEnd{ending: 3 * time.Second}
				w := restartedDuringM1(t, agent, tc.setup)
				var m2 *actor.Future
				if tc.m2 {
					m2 = w.request("m2", "second")
				}
				if tc.late {
					w.system.Root.Send(w.manager, &successor{key: w.key})
				}
				synctest.Wait()
				if got, want := agent.events(), []string{"m1 starts"}; !slices.Equal(got, want) {
					t.Errorf("while m1's cancelled call ends, agent calls %q, want %q (nothing runs again before it has returned)", got, want)
				}

				time.Sleep(3 * time.Second) // (synctest's clock) the cancelled call returns
				synctest.Wait()
				want := []string{"m1 starts", "m1 returns", "m1 starts", "m1 returns"}
				if tc.m2 {
					res, err := m2.Result()
					if err != nil {
						t.Fatalf("m2: %v", err)
					}
					if d := res.(*DeliverResult); d.ErrorCode != "" {
						t.Errorf("m2 answered %+v, want it taken", d)
					}
					want = append(want, "m2 starts", "m2 returns")
				}
				if got := agent.events(); !slices.Equal(got, want) {
					t.Errorf("agent calls %q, want %q (m1 runs again once its cancelled call has returned, m2 after it)", got, want)
				}
			})
		})
	}
}

// unrelatedLong is slowToEnd whose u1, a message of another chat, runs 8 s and is cancelled by
// nothing here: a long turn of a healthy session.
type unrelatedLong struct{ slowToEnd }

func (a *unrelatedLong) Run(ctx context.Context, req *agents.Request) (*agents.Response, error) {
	if id := req.Identity.MessageID; id == "u1" {
		a.note(id + " starts")
		defer a.note(id + " returns")
		select {
		case <-time.After(8 * time.Second):
			return &agents.Response{Text: "ok u1"}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return a.slowToEnd.Run(ctx, req)
}

// TestRestartedManagerWaitsOnlyForTheCallsItsRestartCancelled: a manager panics while m1's turn
// runs, and the restart cancels it (its agent takes 3 s to return). Just after the restart, u1
// of another chat starts a turn of 8 s on a session the restart did not stop. The hold of m1's
// key ends when m1's cancelled call has returned: m1 runs again, and m2, held meanwhile, after
// it, while u1 still runs. Before, the hold waited for every agent call of the daemon
// (AgentCalls.Wait), so u1's turn held m1's key (and a single daemon's whole recovery) until it
// returned, up to CancelWait.
func TestRestartedManagerWaitsOnlyForTheCallsItsRestartCancelled(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(*Deps)
	}{
		{"single daemon", func(*Deps) {}},
		{"cluster member", func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				agent := &unrelatedLong{slowToEnd{ending: 3 * time.Second}}
				w := restartedDuringM1(t, agent, tc.setup)

				other := w.src
				other.ChatID = "c2"
				otherKey := identity.Key(other, w.d.Config.Keys)
				u1, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: otherKey, Msg: &Deliver{SessionKey: otherKey,
					Source: sourceToProto(other), MessageId: "u1", Text: "long", ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour).Result()
				if err != nil || u1.(*DeliverResult).Disposition != "started" {
					t.Fatalf("u1: %+v %v, want started", u1, err)
				}
				m2 := w.request("m2", "second")
				synctest.Wait()

				time.Sleep(3 * time.Second) // (synctest's clock) m1's cancelled call returns
				synctest.Wait()
				want := []string{"m1 starts", "u1 starts", "m1 returns", "m1 starts", "m1 returns", "m2 starts", "m2 returns"}
				if got := agent.events(); !slices.Equal(got, want) {
					t.Errorf("once m1's cancelled call returned, agent calls %q, want %q (m1's key goes on while u1, begun since the restart, still runs)", got, want)
				}
				// (Only now: waiting for m2's answer before would let the bubble's clock run on.)
				if res, err := m2.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
					t.Fatalf("m2: %+v %v, want it taken", res, err)
				}
				time.Sleep(5 * time.Second) // u1 returns
				synctest.Wait()
				if got, want := agent.events(), append(want, "u1 returns"); !slices.Equal(got, want) {
					t.Errorf("agent calls %q, want %q", got, want)
				}
			})
		})
	}
}

// TestDrainDuringTheRestartHoldLeavesItsWorkForTheNextStart: a single daemon stops while its
// restarted manager holds the key whose turn (m1) its restart cancelled, with m2 held for it.
// The drain does not wait for the hold (nothing runs), and the stop answers m2 stopped (it was
// never stored: the client sends it again, HTTP 503, or Discord's backfill reads it back) while
// m1 stays pending in the store: the next start runs m1, and m2, sent again, after it. Nothing is
// lost, and nothing runs beside the cancelled call.
func TestDrainDuringTheRestartHoldLeavesItsWorkForTheNextStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		agent := &slowToEnd{ending: 3 * time.Second}
		var restart func(*testing.T, *managerWorld)
		w := newManagerWorldAt(t, path, agent, func(d *Deps) { restart = panicsOnCue(d) })
		if res := w.deliver(t, "m1", "first"); res.Disposition != "started" {
			t.Fatalf("m1: %+v", res)
		}
		synctest.Wait()
		restart(t, w)
		m2 := w.request("m2", "second")
		synctest.Wait()

		drained := w.drain()
		synctest.Wait()
		if !answered(drained) {
			t.Fatal("the drain waits for the held key")
		}
		if err := w.system.Root.StopFuture(w.manager).Wait(); err != nil {
			t.Fatal(err)
		}
		if res, err := m2.Result(); err != nil || res.(*DeliverResult).ErrorCode != ErrCodeStopped {
			t.Errorf("m2 answered %+v %v, want %s (send it again)", res, err, ErrCodeStopped)
		}
		w.wantPendingAlone(t, "m1")
		time.Sleep(3 * time.Second) // the cancelled call returns, as the daemon's stop waits for it
		synctest.Wait()
		if got, want := agent.events(), []string{"m1 starts", "m1 returns"}; !slices.Equal(got, want) {
			t.Errorf("agent calls %q, want %q (nothing ran again during the stop)", got, want)
		}
		w.stop()

		w = newManagerWorldAt(t, path, agent, nil) // the next start
		synctest.Wait()
		if res := w.deliver(t, "m2", "second"); res.ErrorCode != "" {
			t.Fatalf("m2 sent again: %+v", res)
		}
		w.awaitTurnEnds(2)
		want := []string{"m1 starts", "m1 returns", "m1 starts", "m1 returns", "m2 starts", "m2 returns"}
		if got := agent.events(); !slices.Equal(got, want) {
			t.Errorf("agent calls %q, want %q (the next start runs m1, and m2 after it)", got, want)
		}
	})
}
