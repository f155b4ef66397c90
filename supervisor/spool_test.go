package supervisor

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/prometheus/client_golang/prometheus/testutil"
	_ "modernc.org/sqlite"
)

// TestDatabaseLockedSpoolsAndDrains holds an exclusive lock on the database from another
// connection in the middle of a load: intake goes on into the spool (every message is still
// acknowledged), and once the lock is gone the spool drains in order. Every acknowledged message
// is in the database exactly once, answered exactly once, in arrival order per session.
func TestDatabaseLockedSpoolsAndDrains(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out SQLite's busy timeout")
	}
	dir := t.TempDir()
	r := startOn(t, dir, 10*time.Second, echo.New())
	defer r.stop(t)
	spoolsAndDrains(t, r, r.lockDatabase)
}

// spoolsAndDrains sends messages to 5 sessions, makes the database unavailable with fail,
// sends more, makes it available again with the function fail returned, and checks that every
// acknowledged message is in the database exactly once, answered exactly once, in arrival
// order per session.
func spoolsAndDrains(t *testing.T, r *runtime, fail func(*testing.T) (restore func())) {
	const sessions, before, during = 5, 4, 8
	send := func(phase string, n int) map[string][]string {
		var mu sync.Mutex
		ids := map[string][]string{}
		var wg sync.WaitGroup
		for s := range sessions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: fmt.Sprint("chat-", s), UserID: "u"}
				for i := range n {
					id := fmt.Sprintf("%s-%d-%d", phase, s, i)
					ack := r.inject(t, src, id, id)
					if ack == nil {
						return
					}
					mu.Lock()
					ids[ack.SessionKey] = append(ids[ack.SessionKey], id)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return ids
	}
	first := send("before", before)
	r.waitSent(t, sessions*before)

	unlock := fail(t)
	second := send("during", during) // acknowledged although the database is locked
	if t.Failed() {
		t.FailNow()
	}
	if n := testutil.ToFloat64(r.d.metrics.SpoolFiles); n == 0 {
		t.Errorf("agentgate_spool_files = 0 while the database is locked, want > 0")
	}
	unlock()

	outs := r.waitSent(t, sessions*(before+during))
	answered := map[string]int{}
	replies := map[string][]string{}
	for _, o := range outs {
		answered[o.InReplyTo[0]]++
		replies[o.SessionKey] = append(replies[o.SessionKey], o.InReplyTo[0])
	}
	for key, ids := range first {
		want := append(append([]string{}, ids...), second[key]...)
		if fmt.Sprint(replies[key]) != fmt.Sprint(want) {
			t.Errorf("session %s answered %v, want in order %v", key, replies[key], want)
		}
	}
	for id, n := range answered {
		if n != 1 {
			t.Errorf("message %s answered %d times, want once", id, n)
		}
	}
	waitUntil(t, func() bool { return testutil.ToFloat64(r.d.metrics.SpoolFiles) == 0 })
	for key := range first {
		snap, err := r.d.store.LoadSession(t.Context(), key, 1000)
		if err != nil {
			t.Fatal(err)
		}
		users := map[string]int{}
		var assistants int
		for _, m := range snap.History {
			switch m.Role {
			case persistence.RoleUser:
				users[m.MessageID]++
				if m.Status != persistence.StatusDone {
					t.Errorf("message %s has status %s, want done", m.MessageID, m.Status)
				}
			case persistence.RoleAssistant:
				assistants++
			}
		}
		if len(users) != before+during || assistants != before+during {
			t.Errorf("session %s has %d user messages and %d replies in the database, want %d each", key, len(users), assistants, before+during)
		}
		for id, n := range users {
			if n != 1 {
				t.Errorf("message %s stored %d times", id, n)
			}
		}
	}
}

// waitUntil polls cond under a deadline.
func waitUntil(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30s")
		}
		time.Sleep(10 * time.Millisecond) // a poll interval under a deadline
	}
}

// TestDatabaseAndSpoolFailingRefusesExplicitly: when neither the database nor the spool can take
// a message, the sender gets platforms.ErrUnavailable (HTTP 503), never a silent drop.
func TestDatabaseAndSpoolFailingRefusesExplicitly(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out SQLite's busy timeout")
	}
	dir := t.TempDir()
	r := startOn(t, dir, 10*time.Second, echo.New())
	defer r.stop(t)
	src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c", UserID: "u"}
	r.inject(t, src, "ok-1", "fine")
	r.waitSent(t, 1)

	spoolDir := filepath.Join(dir, "spool")
	if err := os.RemoveAll(spoolDir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(spoolDir, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	unlock := r.lockDatabase(t)
	defer unlock()

	_, err := r.fake.Inject(t.Context(), &platforms.Inbound{Source: src, MessageID: "lost?", Text: "x"})
	if !errors.Is(err, platforms.ErrUnavailable) {
		t.Fatalf("Inject with database and spool failing = %v, want platforms.ErrUnavailable", err)
	}
}

// lockDatabase takes the database's write lock from outside the daemon (BEGIN EXCLUSIVE on a
// connection of its own), so the daemon's writes fail as unavailable; unlock releases it and is
// safe to call twice.
func (r *runtime) lockDatabase(t *testing.T) (unlock func()) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+r.d.cfg.DSN()+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(t.Context())
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(t.Context(), "BEGIN EXCLUSIVE"); err != nil {
		conn.Close()
		db.Close()
		t.Fatalf("take the database lock: %v", err)
	}
	var once sync.Once
	unlock = func() {
		once.Do(func() {
			if _, err := conn.ExecContext(context.Background(), "ROLLBACK"); err != nil {
				t.Errorf("release the database lock: %v", err)
			}
			conn.Close()
			db.Close()
		})
	}
	t.Cleanup(unlock)
	return unlock
}
