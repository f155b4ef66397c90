package supervisor

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
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
