package supervisor

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestPostgresUnavailableSpoolsAndDrains is TestDatabaseLockedSpoolsAndDrains on PostgreSQL:
// the daemon's database stops taking connections and its connections are cut in the middle of
// a load (what a server restart or a network cut looks like to it). Intake goes on into the
// spool, and once the database is back the spool drains: every acknowledged message is stored
// and answered exactly once, in order.
func TestPostgresUnavailableSpoolsAndDrains(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	r := startOn(t, t.TempDir(), 10*time.Second, echo.New(), func(c *config.Config) {
		c.Store.Driver, c.Store.DSN = "postgres", dsn
	})
	defer r.stop(t)
	spoolsAndDrains(t, r, func(t *testing.T) func() { return pgtest.Cut(t, dsn) })
}

// TestHostileAgentOutputIsStored: an agent (a model endpoint) may answer a NUL, which
// PostgreSQL cannot store in text, or report usage out of all reason, which would overflow the
// session's totals (SQLite turned them into a REAL that no read could scan; PostgreSQL refused
// the turn's whole write). On both stores the turns are stored and answered, and the store
// stays readable.
func TestHostileAgentOutputIsStored(t *testing.T) {
	agent := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
		return &agents.Response{Text: "a\x00b", Usage: agents.Usage{InputTokens: 1 << 62, OutputTokens: -5}}, nil
	})
	for _, driver := range []string{"sqlite", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			r := MustStartDaemon(t, agent, daemonOpts{tweak: func(c *config.Config) {
				if driver == "postgres" {
					c.Store.Driver, c.Store.DSN = "postgres", pgtest.NewDatabase(t)
				}
			}})
			defer r.stop(t)
			var ack *platforms.Ack
			for _, id := range []string{"m1", "m2", "m3"} {
				ack = r.inject(t, dm, id, "x\x00y")
				r.waitReplyTo(t, id)
			}
			if got := r.fake.Sent()[0].Text; got != "a\uFFFDb" {
				t.Errorf("reply %q, want the NUL replaced", got)
			}
			s := r.session(t, ack.SessionID)
			if s.InputTokens <= 0 || s.OutputTokens != 0 {
				t.Errorf("session tokens %d in, %d out; want a bounded positive total and no negative", s.InputTokens, s.OutputTokens)
			}
			if _, err := r.d.store.ListSessions(t.Context(), persistence.ListFilter{}); err != nil {
				t.Errorf("ListSessions after the hostile usage: %v", err)
			}
			msgs, err := r.d.store.Transcript(t.Context(), ack.SessionID)
			if err != nil || len(msgs) != 6 {
				t.Fatalf("transcript: %d rows, %v; want 6", len(msgs), err)
			}
			if msgs[0].Content != "x\uFFFDy" {
				t.Errorf("stored user text %q, want the NUL replaced", msgs[0].Content)
			}
		})
	}
}

// TestPostgresDaemonRecordsItsAddress: a member of a shared PostgreSQL store (a cluster member:
// no spool, nothing else in its data directory) whose data directory does not exist yet creates
// it and records its HTTP address in it, for the admin commands; it used to warn at every start
// that it could not.
func TestPostgresDaemonRecordsItsAddress(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	r := MustStartDaemon(t, echo.New(), daemonOpts{dir: dir, shared: true, tweak: func(c *config.Config) {
		c.Store.Driver, c.Store.DSN = "postgres", pgtest.NewDatabase(t)
	}})
	defer r.stop(t)
	got, err := os.ReadFile(filepath.Join(dir, AddrFile))
	if err != nil {
		t.Fatalf("the daemon's address in its data directory: %v", err)
	}
	if strings.TrimSpace(string(got)) != r.d.Addr().String() {
		t.Errorf("recorded address %q, want %s", got, r.d.Addr())
	}
}

// TestPostgresUnavailableAnswers503: while the database cannot be reached, the session queries
// answer 503 unavailable (DESIGN's code for "retry later"), not 500; once it is back they
// answer again.
func TestPostgresUnavailableAnswers503(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	r := startOn(t, t.TempDir(), 10*time.Second, echo.New(), func(c *config.Config) {
		c.Store.Driver, c.Store.DSN = "postgres", dsn
	})
	defer r.stop(t)
	src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c", UserID: "u"}
	ack := r.inject(t, src, "m1", "hello")
	r.waitSent(t, 1)
	base := "http://" + r.d.Addr().String()
	key := url.PathEscape(ack.SessionKey)

	restore := pgtest.Cut(t, dsn)
	for _, path := range []string{"/v1/sessions", "/v1/sessions/" + key + "/transcript"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"code":"unavailable"`) {
			t.Errorf("GET %s with the database cut: %d %s, want 503 unavailable", path, resp.StatusCode, body)
		}
	}
	restore()
	resp, err := http.Get(base + "/v1/sessions/" + key + "/transcript")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "hello") {
		t.Errorf("GET transcript with the database back: %d %s, want 200 with the message", resp.StatusCode, body)
	}
}
