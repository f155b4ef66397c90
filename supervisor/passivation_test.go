package supervisor

import (
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/actors"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/platformtest"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMemoryIsBoundedByActiveSessions: with 100,000 known sessions in the store and 100 of them
// active, only the 100 have actors; idle ones passivate and come back on their next message.
func TestMemoryIsBoundedByActiveSessions(t *testing.T) {
	if testing.Short() {
		t.Skip("creates 100,000 sessions")
	}
	const known, active = 100_000, 100
	dir := t.TempDir()
	cfg := config.Default()
	cfg.DataDir = dir
	src := func(i int) identity.Source {
		return identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: fmt.Sprint("chat-", i), UserID: "u"}
	}
	// The store creates the schema; the known sessions are then written in one statement (the
	// keys are exactly what Key builds for src(i): agent:main:fake:dm:chat-<i>). Under -race the
	// pure-Go SQLite makes this the slow part of the test (~35 s); without it, well under 1 s.
	store, err := sqlite.Open(t.Context(), cfg.DSN(), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	if k := identity.Key(src(7), identity.DefaultKeyOptions); k != "agent:main:fake:dm:chat-7" {
		t.Fatalf("key layout changed: %s", k)
	}
	db, err := sql.Open("sqlite", "file:"+cfg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(-time.Hour).UnixNano()
	for _, q := range []string{
		`WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i+1 FROM n WHERE i+1 < ?)
		 INSERT INTO sessions (id, key, platform, chat_type, chat_id, user_id, started_at, last_activity_at)
		 SELECT 's-'||i, 'agent:main:fake:dm:chat-'||i, 'fake', 'dm', 'chat-'||i, 'u', ?2, ?2 FROM n`,
		`INSERT INTO routing (key, session_id, generation, updated_at) SELECT key, id, 1, started_at FROM sessions`,
	} {
		if _, err := db.ExecContext(t.Context(), q, known, at); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	cfg.HTTP.Addr = "127.0.0.1:0"
	cfg.Sessions.PassivateAfter = 300 * time.Millisecond
	fake := platformtest.NewFake("fake")
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	d, err := Start(t.Context(), cfg, log, Options{Agent: echo.New(), Platforms: []platforms.Platform{fake}})
	if err != nil {
		t.Fatal(err)
	}
	r := &runtime{d: d, fake: fake}
	defer r.stop(t)
	var wg sync.WaitGroup
	for i := range active {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ack := r.inject(t, src(i*(known/active)), fmt.Sprint("m", i), "hi"); ack != nil && ack.SessionID != fmt.Sprint("s-", i*(known/active)) {
				t.Errorf("message to a known key started session %s, want its stored one", ack.SessionID)
			}
		}()
	}
	wg.Wait()
	r.waitSent(t, active)
	if n := len(r.activeKeys(t)); n > active {
		t.Errorf("%d session actors in memory with %d known and %d active, want at most %d", n, known, active, active)
	}
	waitUntil(t, func() bool { return len(r.activeKeys(t)) == 0 })
	if got := testutil.ToFloat64(d.metrics.SessionPassivations); got != active {
		t.Errorf("passivations = %v, want %d", got, active)
	}
	// A passivated session leaves the manager's list at once and the gauge when it has stopped;
	// the sessions passivate together (one idle sweep), so the last ones may still be stopping.
	waitUntil(t, func() bool { return testutil.ToFloat64(d.metrics.SessionsActive) == 0 })
	ack := r.inject(t, src(0), "again", "back")
	r.waitSent(t, active+1)
	if ack.SessionID != "s-0" || testutil.ToFloat64(d.metrics.SessionActivations) != active+1 {
		t.Errorf("re-activation: session %s, activations %v; want s-0 and %d", ack.SessionID, testutil.ToFloat64(d.metrics.SessionActivations), active+1)
	}
}

func (r *runtime) activeKeys(t *testing.T) []string {
	t.Helper()
	res, err := r.d.system.Root.RequestFuture(r.d.manager, &actors.ListActive{}, 10*time.Second).Result()
	if err != nil {
		t.Fatal(err)
	}
	return res.(*actors.ActiveList).Keys
}

// TestReadingSessionsDoesNotKeepThemInMemory: a dashboard that polls GET /v1/sessions and GET
// /v1/sessions/{key} (their live state) more often than passivate_after does not keep the
// sessions it reads in memory: they passivate as if nobody looked. Before, the live state's
// GetState counted as activity, so a poll kept every session in memory as long as it went on
// (a soak's session list, polled every few seconds, kept hundreds of idle sessions 40 s and
// more past passivate_after), and memory grew with the sessions ever seen, not the active ones.
func TestReadingSessionsDoesNotKeepThemInMemory(t *testing.T) {
	r := MustStartDaemon(t, echo.New(), daemonOpts{tweak: func(c *config.Config) { c.Sessions.PassivateAfter = 200 * time.Millisecond }})
	defer r.stop(t)
	ack := r.inject(t, dm, "m1", "hello")
	r.waitSent(t, 1)
	base := "http://" + r.d.Addr().String()
	poll := func(path string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s = %d", path, resp.StatusCode)
		}
	}
	// Each poll reads the live state of the session while it is in memory; it must passivate
	// all the same, within the poll's deadline.
	waitUntil(t, func() bool {
		poll("/v1/sessions")
		poll("/v1/sessions?state=active")
		poll("/v1/sessions/" + url.PathEscape(ack.SessionKey))
		return len(r.activeKeys(t)) == 0
	})
}
