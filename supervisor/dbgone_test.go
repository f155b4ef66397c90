package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
)

// TestDatabaseFileDeletedUnderTheDaemon: the database file deleted while the daemon runs (rm
// of agentgate.db, or of the whole data directory) takes no acknowledged message with it. With
// the spool there, a message sent after it is acknowledged from the spool (HTTP 202), not from
// the deleted file; with the spool gone too, it is refused (the platform's ErrUnavailable, HTTP
// 503). Either
// way /readyz fails, saying the file was deleted and what to do, and agentgate_store_corrupt is
// 1; and a start on the database put back (the old file, kept by a hard link here as an
// operator's copy out of /proc/PID/fd would keep it) holds every message acknowledged, those of
// the spool replayed. Before, the daemon acknowledged every message into the deleted file, said
// it was ready, and all of it was lost at the next start (found by black-box soaks).
func TestDatabaseFileDeletedUnderTheDaemon(t *testing.T) {
	for _, tt := range []struct {
		name  string
		whole bool // the whole data directory, its spool with it
	}{
		{"the database file", false},
		{"the data directory", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			r := startOn(t, dir, 0, echo.New())
			stopped := false
			defer func() {
				if !stopped {
					r.stop(t)
				}
			}()
			src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c", UserID: "u"}
			r.inject(t, src, "before", "hello")
			r.waitSent(t, 1)
			post := func(id string) int { // to the HTTP API, in a chat of its own
				t.Helper()
				resp, err := http.Post("http://"+r.d.Addr().String()+"/v1/messages", "application/json",
					strings.NewReader(`{"chat_id":"h","user_id":"u","text":"hi","message_id":"`+id+`"}`))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			if code := post("h-before"); code != http.StatusAccepted {
				t.Fatalf("POST /v1/messages before the file was deleted = %d, want 202", code)
			}

			db := r.d.cfg.DSN()
			kept := filepath.Join(t.TempDir(), "agentgate.db")
			if err := os.Link(db, kept); err != nil {
				t.Fatal(err)
			}
			remove := os.Remove
			if tt.whole {
				remove = func(string) error { return os.RemoveAll(dir) }
			}
			if err := remove(db); err != nil {
				t.Fatal(err)
			}
			ack, err := r.fake.Inject(t.Context(), &platforms.Inbound{Source: src, MessageID: "after", Text: "still there?"})
			acked := err == nil
			switch {
			case tt.whole && !errors.Is(err, platforms.ErrUnavailable):
				t.Errorf("Inject with the data directory deleted = %+v, %v; want platforms.ErrUnavailable", ack, err)
			case !tt.whole && err != nil:
				t.Errorf("Inject with the database file deleted = %v; want it acknowledged from the spool", err)
			}
			posted := post("h-after")
			if want := map[bool]int{false: http.StatusAccepted, true: http.StatusServiceUnavailable}[tt.whole]; posted != want {
				t.Errorf("POST /v1/messages after the file was deleted = %d, want %d", posted, want)
			}

			code, ready := r.readyz(t)
			const what, fix = " was deleted: ", "stop the daemon, put the database back at that path, and start"
			if store := ready["store"]; code != http.StatusServiceUnavailable || !strings.HasPrefix(store, "ping: the database file "+db+what) ||
				!strings.Contains(store, fix) {
				t.Errorf("/readyz after the file was deleted = %d, store %q\nwant 503 saying the file%s…%s", code, store, what, fix)
			}
			if _, metrics := getPath(t, r, "/metrics"); !strings.Contains(metrics, "\nagentgate_store_corrupt 1\n") {
				t.Errorf("/metrics after the file was deleted lacks agentgate_store_corrupt 1")
			}
			r.stop(t)
			stopped = true

			// The operator puts the database back, and starts.
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(kept, db); err != nil {
				t.Fatal(err)
			}
			r = startOn(t, dir, 0, echo.New())
			defer r.stop(t)
			stored := func(platform, chat, id string) bool {
				m, err := r.d.store.FindInbound(t.Context(), platform, chat, id)
				if err != nil && !errors.Is(err, persistence.ErrNotFound) {
					t.Fatal(err)
				}
				return m != nil
			}
			if !stored("fake", "c", "before") || !stored("http", "h", "h-before") {
				t.Error("a message acknowledged before the file was deleted is not in the database put back")
			}
			waitUntil(t, func() bool { return !r.d.deps.Spooling.Load() })
			if acked && !stored("fake", "c", "after") {
				t.Error(`message "after", acknowledged after the file was deleted, is not in the database once the spool is replayed`)
			}
			if posted == http.StatusAccepted && !stored("http", "h", "h-after") {
				t.Error(`message "h-after", acknowledged (202) after the file was deleted, is not in the database once the spool is replayed`)
			}
		})
	}
}

// goneAtRecord is the daemon's store, whose database file is deleted just before the daemon
// records its run: as by an rm of the data directory as the daemon starts.
type goneAtRecord struct {
	persistence.Store
	path string
}

func (s *goneAtRecord) BeginRun(ctx context.Context, run string, at time.Time) (*persistence.UncleanStop, error) {
	if err := os.Remove(s.path); err != nil {
		return nil, err
	}
	return s.Store.BeginRun(ctx, run, at)
}

// TestStartRefusedOnADatabaseFileGone: a start whose record of its run finds the database file
// deleted since the store opened it fails, saying so, and leaves nothing running: the next
// start on the data directory goes ahead. Before, the record went into the deleted file and
// the daemon started on it.
func TestStartRefusedOnADatabaseFileGone(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "agentgate.db")
	err := startRefused(t, dir, func(s persistence.Store) persistence.Store { return &goneAtRecord{Store: s, path: path} },
		"on a database file deleted before its run was recorded")
	if !errors.Is(err, persistence.ErrFileGone) || !strings.HasPrefix(err.Error(), "start: record the daemon's run: begin run ") ||
		!strings.Contains(err.Error(), "the database file "+path+" was deleted: ") {
		t.Errorf("Start = %v\nwant persistence.ErrFileGone, saying that the record of the run found the file deleted", err)
	}
	r := startOn(t, dir, 0, echo.New()) // the data directory and the port were let go
	r.stop(t)
}

// goneAtReplay is the daemon's store, whose database file is deleted just before the start's
// replay of the last run's spool commits.
type goneAtReplay struct {
	persistence.Store
	path string
	once sync.Once
}

func (s *goneAtReplay) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	s.once.Do(func() { _ = os.Remove(s.path) })
	return s.Store.Commit(ctx, groups)
}

// TestStartRefusedOnADatabaseFileGoneAtTheReplay: a start whose replay of the last run's spool
// finds the database file deleted fails, as one whose record of its run does, though the record
// waits for the spool's replay.
func TestStartRefusedOnADatabaseFileGoneAtTheReplay(t *testing.T) {
	dir := t.TempDir()
	o := &storetest.Outage{}
	r := startWithOutage(t, dir, o, echo.New())
	o.Down.Store(true)
	r.inject(t, dm, "m1", "spooled")
	r.waitSent(t, 1)
	r.stop(t)

	path := filepath.Join(dir, "agentgate.db")
	err := startRefused(t, dir, func(s persistence.Store) persistence.Store { return &goneAtReplay{Store: s, path: path} },
		"whose replay found the database file deleted")
	if !errors.Is(err, persistence.ErrFileGone) {
		t.Errorf("Start = %v, want persistence.ErrFileGone", err)
	}
}

// startRefused starts a daemon on dir whose store is wrap's, which must refuse to start (what
// says how, in the failure), and returns its error.
func startRefused(t *testing.T, dir string, wrap func(persistence.Store) persistence.Store, what string) error {
	t.Helper()
	cfg := config.Default()
	cfg.DataDir, cfg.HTTP.Addr = dir, "127.0.0.1:0"
	d, err := Start(t.Context(), cfg, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		Options{Agent: echo.New(), WrapStore: wrap})
	if err == nil {
		_ = d.Stop(context.Background())
		t.Fatalf("Start %s succeeded, want it refused", what)
	}
	return err
}
