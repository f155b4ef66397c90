package supervisor

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// panickyScan is a store whose scan for idle sessions panics, as a driver bug might: the
// timers actor fails at every start, faster than its supervisor restarts it.
type panickyScan struct{ persistence.Store }

func (panickyScan) IdleSessions(context.Context, time.Time, int) ([]persistence.Session, error) {
	panic("injected: the idle scan fails")
}

// TestTopLevelActorPastItsRestartsStopsTheDaemon: a top-level actor that fails more often than
// its supervisor restarts it is stopped for good, so the daemon fails (Fatal, which makes
// `agentgate serve` stop and exit non-zero for its process supervisor to start it afresh) and
// /readyz says why, instead of running on without it. A session stopped by its supervisor
// for the same reason is not the daemon's failure: its manager starts it again.
func TestTopLevelActorPastItsRestartsStopsTheDaemon(t *testing.T) {
	t.Run("session", func(t *testing.T) {
		agent := agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
			panic("agent bug")
		})
		r := MustStart(t, agent, nil)
		crashy := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "crashy", UserID: "u"}
		r.inject(t, crashy, "m1", "boom")
		r.waitReplyTo(t, "m1") // quarantined after 3 crashes
		r.inject(t, crashy, "m2", "boom")
		// Its 4th crash in a minute: past its 3 restarts, the session is stopped.
		restarts := r.d.metrics.ActorRestarts.WithLabelValues("session")
		waitUntil(t, func() bool { return testutil.ToFloat64(restarts) >= 4 })
		select {
		case err := <-r.d.Fatal():
			t.Fatalf("a session stopped by its supervisor failed the daemon: %v", err)
		default:
		}
		if code, body := getPath(t, r, "/readyz"); code != http.StatusOK {
			t.Errorf("/readyz = %d %s after a session's crashes, want 200", code, body)
		}
	})
	t.Run("top-level", func(t *testing.T) {
		r := MustStartDaemon(t, nil, daemonOpts{
			wrap:  func(s persistence.Store) persistence.Store { return panickyScan{s} },
			tweak: func(c *config.Config) { c.Sessions.Reset.Mode, c.Sessions.Reset.IdleMinutes = "idle", 60 },
		})
		defer r.stop(t)
		select {
		case err := <-r.d.Fatal():
			if !strings.Contains(err.Error(), "timers actor failed more often than its supervisor restarts it") ||
				!strings.Contains(err.Error(), "the idle scan fails") {
				t.Errorf("Fatal = %v, want the timers actor named with its last failure", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("the timers actor failed past its restarts and the daemon went on")
		}
		code, body := getPath(t, r, "/readyz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, `"actors":"the timers actor failed`) {
			t.Errorf("/readyz = %d %s, want 503 naming the stopped actor", code, body)
		}
	})
}

// getPath GETs path from the daemon's HTTP listener.
func getPath(t *testing.T, r *runtime, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + r.d.Addr().String() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// readyz returns the status of the daemon's /readyz and its components.
func (r *runtime) readyz(t *testing.T) (int, map[string]string) {
	t.Helper()
	resp, err := http.Get("http://" + r.d.Addr().String() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct{ Components map[string]string }
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("/readyz body: %v", err)
	}
	return resp.StatusCode, body.Components
}

// TestTopLevelActorStoppedDuringTheDrain: a top-level actor stopped past its restarts during
// the drain a stop signal began fails the daemon (Fatal, which `agentgate serve` reads once
// the drain ends, to exit 1): the daemon stopped without it, its turns' writes or a
// platform's replies. Before, a stop that had begun hid it and serve exited 0 (a review). One
// stopped once the drain is over, as Stop stops the tree, is no failure.
func TestTopLevelActorStoppedDuringTheDrain(t *testing.T) {
	tests := []struct {
		name     string
		tree     bool // Stop stops the tree's actors
		wantFail bool
	}{
		{"during the drain", false, true},
		{"as the tree stops", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &Daemon{log: slog.New(slog.DiscardHandler), fatal: make(chan error, 1)}
			top := map[string]bool{"timers": true}
			d.topLevel.Store(&top)
			d.stopping.Store(true) // Stop has begun: a signal's drain
			d.treeStopping.Store(tt.tree)
			d.actorStopped(actor.NewPID("nonhost", "timers"), "injected: the idle scan fails")
			select {
			case err := <-d.Fatal():
				if !tt.wantFail {
					t.Errorf("Fatal = %v, want none: the tree's own stop is no failure", err)
				} else if !strings.Contains(err.Error(), "timers actor failed more often than its supervisor restarts it") {
					t.Errorf("Fatal = %v, want the timers actor named", err)
				}
			default:
				if tt.wantFail {
					t.Error("the timers actor stopped past its restarts during the drain, and the daemon did not fail: serve would exit 0")
				}
			}
		})
	}
}
