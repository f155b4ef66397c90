package supervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	agtest "github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
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

// TestEventStreamResumedWhileSpoolingRepeatsNothing: a client resumes a session's event stream
// after a reply that was sent while the database was locked (the reply waits in the spool). The
// next event it gets is the next reply, not that one again. Before, the resume point was
// clamped to the database's last event, and the replies sent from the spool came again once it
// drained (found by review).
func TestEventStreamResumedWhileSpoolingRepeatsNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out SQLite's busy timeout")
	}
	r := startOn(t, t.TempDir(), 10*time.Second, echo.New())
	defer r.stop(t)
	base := "http://" + r.d.Addr().String()
	post := func(id string) httpplatform.MessageResponse {
		t.Helper()
		resp, err := http.Post(base+"/v1/messages?wait=30s", "application/json",
			strings.NewReader(`{"chat_id":"spool","user_id":"u","text":"hi","message_id":"`+id+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m httpplatform.MessageResponse
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != http.StatusOK || len(m.Replies) != 1 {
			t.Fatalf("POST %s: %d %+v %v, want its reply", id, resp.StatusCode, m, err)
		}
		return m
	}
	post("m1")
	unlock := r.lockDatabase(t)
	m2 := post("m2") // answered from the spool
	spooled := m2.Replies[0]

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/sessions/"+url.PathEscape(m2.SessionKey)+"/events", nil)
	req.Header.Set("Last-Event-ID", fmt.Sprint(spooled.Seq))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	unlock()
	waitUntil(t, func() bool { return !r.d.deps.Spooling.Load() })
	post("m3")
	for br := bufio.NewReader(resp.Body); ; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended before an event: %v", err)
		}
		if id, ok := strings.CutPrefix(strings.TrimSpace(line), "id: "); ok {
			if want := fmt.Sprint(spooled.Seq + 1); id != want {
				t.Errorf("first event after resuming from %d: id %s, want %s", spooled.Seq, id, want)
			}
			return
		}
	}
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
	// Drained is empty on disk too: a daemon that spools now and then for months must not
	// keep a file of every batch it replayed.
	if left, err := os.ReadDir(r.d.spool.Dir()); err != nil || len(left) > 0 {
		t.Errorf("spool directory after the replay holds %d entries (%v), want none: %v", len(left), err, left)
	}
	for key := range first {
		snap, err := r.d.store.LoadSession(t.Context(), key, 1000, 0)
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

// lockDatabase takes the database's write lock from outside the daemon, so the daemon's writes
// fail as unavailable; unlock releases it and is safe to call twice.
func (r *runtime) lockDatabase(t *testing.T) (unlock func()) {
	t.Helper()
	return agtest.LockSQLite(t, r.d.cfg.DSN())
}

// fillDisk makes r's disk full: the database (o) refuses writes, and the spool cannot be
// written. roomAgain gives the spool room again; the database refuses writes until o.Down is
// cleared.
func fillDisk(t *testing.T, r *runtime, o *storetest.Outage) (roomAgain func()) {
	t.Helper()
	spoolDir := r.d.spool.Dir()
	if err := os.Rename(spoolDir, spoolDir+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(spoolDir, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	o.Down.Store(true)
	return func() {
		t.Helper()
		if err := os.Remove(spoolDir); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(spoolDir+".away", spoolDir); err != nil {
			t.Fatal(err)
		}
	}
}

// startWithOutage starts a daemon on dir whose store is o's.
func startWithOutage(t *testing.T, dir string, o *storetest.Outage, agent agents.Agent) *runtime {
	return MustStartDaemon(t, agent, daemonOpts{dir: dir, wrap: func(s persistence.Store) persistence.Store {
		o.Store = s
		return o
	}})
}

// injectWhenLoaded sends a message until the session accepts it: while writes wait in the spool
// a session that starts refuses messages with ErrUnavailable, which a sender retries.
func (r *runtime) injectWhenLoaded(t *testing.T, src identity.Source, id, text string) {
	t.Helper()
	waitUntil(t, func() bool {
		_, err := r.fake.Inject(t.Context(), &platforms.Inbound{Source: src, MessageID: id, Text: text})
		if err != nil && !errors.Is(err, platforms.ErrUnavailable) {
			t.Fatalf("Inject(%s): %v", id, err)
		}
		return err == nil
	})
}

// checkAnsweredInOrder checks that the session of the key holds exactly ids as its user
// messages, in this order, each done, each followed by one reply, and that no spool batch was
// set aside.
func checkAnsweredInOrder(t *testing.T, r *runtime, dir, key string, ids ...string) {
	t.Helper()
	snap, err := r.d.store.LoadSession(t.Context(), key, 1000, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	replies := 0
	for _, m := range snap.History {
		switch m.Role {
		case persistence.RoleUser:
			got = append(got, m.MessageID+":"+m.Status)
		case persistence.RoleAssistant:
			replies++
		}
	}
	var want []string
	for _, id := range ids {
		want = append(want, id+":"+persistence.StatusDone)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || replies != len(ids) {
		t.Errorf("the session holds %v and %d replies, want %v and %d", got, replies, want, len(ids))
	}
	if failed, _ := os.ReadDir(filepath.Join(dir, "spool", "failed")); len(failed) > 0 {
		t.Errorf("spool batches set aside: %d files in spool/failed", len(failed))
	}
}

// TestRestartWhileSpoolingLoadsAfterReplay: a daemon restarted while the database still cannot
// be written, with acknowledged writes in the spool, does not start the chat's session from a
// database that lacks them: the session refuses messages as unavailable (the sender retries)
// until the spool is replayed, then loads and goes on. Every acknowledged message is stored
// once and answered, in order, and no spool batch is set aside.
func TestRestartWhileSpoolingLoadsAfterReplay(t *testing.T) {
	dir := t.TempDir()
	o := &storetest.Outage{}
	var logs logSignal
	r := MustStartDaemon(t, echo.New(), daemonOpts{dir: dir, logs: &logs, wrap: func(s persistence.Store) persistence.Store {
		o.Store = s
		return o
	}})
	a1 := r.inject(t, dm, "m1", "one")
	r.waitSent(t, 1)
	o.Down.Store(true)
	r.inject(t, dm, "m2", "two, spooled")
	r.waitSent(t, 2)
	r.stop(t)
	// The stop says what the database does not have yet.
	if got, want := logs.String(), "stopped with writes waiting in the spool; the next start replays them before any session loads"; !strings.Contains(got, want) {
		t.Errorf("the stop's log:\n%s\nwant %q", got, want)
	}

	o = &storetest.Outage{}
	o.Down.Store(true)
	r = startWithOutage(t, dir, o, echo.New())
	defer r.stop(t)
	if _, err := r.fake.Inject(t.Context(), &platforms.Inbound{Source: dm, MessageID: "m3", Text: "three"}); !errors.Is(err, platforms.ErrUnavailable) {
		t.Errorf("a message to a session whose writes wait in the spool: %v, want ErrUnavailable", err)
	}
	// An operator's reset meanwhile is refused as unavailable too (503), not an internal error.
	resp, err := http.Post("http://"+r.d.Addr().String()+"/v1/sessions/"+url.PathEscape(a1.SessionKey)+"/reset", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"code":"unavailable"`) {
		t.Errorf("reset of a session whose writes wait in the spool: %d %s, want 503 unavailable", resp.StatusCode, body)
	}
	o.Down.Store(false)
	r.injectWhenLoaded(t, dm, "m3", "three")
	r.waitReplyTo(t, "m3")
	checkAnsweredInOrder(t, r, dir, a1.SessionKey, "m1", "m2", "m3")
}

// TestCrashWhileSpoolingLoadsAfterReplay: a session that crashes while its writes wait in the
// spool starts again only once they are replayed, so it never reuses their seqs nor forgets the
// message it was running.
func TestCrashWhileSpoolingLoadsAfterReplay(t *testing.T) {
	dir := t.TempDir()
	var crashed atomic.Bool
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		if text := req.Messages[0].Text; text == "crash" && crashed.CompareAndSwap(false, true) {
			panic("agent bug (test)")
		}
		return &agents.Response{Text: "ok " + req.Messages[0].Text}, nil
	})
	o := &storetest.Outage{}
	r := startWithOutage(t, dir, o, agent)
	defer r.stop(t)
	a1 := r.inject(t, dm, "m1", "one")
	r.waitSent(t, 1)
	o.Down.Store(true)
	r.inject(t, dm, "m2", "crash")
	restarts := r.d.metrics.ActorRestarts.WithLabelValues("session")
	waitUntil(t, func() bool { return testutil.ToFloat64(restarts) >= 1 })
	if _, err := r.fake.Inject(t.Context(), &platforms.Inbound{Source: dm, MessageID: "m3", Text: "three"}); !errors.Is(err, platforms.ErrUnavailable) {
		t.Errorf("a message to a restarted session whose writes wait in the spool: %v, want ErrUnavailable", err)
	}
	o.Down.Store(false)
	r.injectWhenLoaded(t, dm, "m3", "three")
	r.waitReplyTo(t, "m3")
	r.waitReplyTo(t, "m2")
	checkAnsweredInOrder(t, r, dir, a1.SessionKey, "m1", "m2", "m3")
}

// TestReadyzFailsWhileWritesAreRefused: /readyz's store fails while the persistence actor
// refuses writes (the database and the spool both failing: a full disk) and while writes wait
// in the spool, and passes again once the database takes them. Before, the store's ping (it
// takes the write lock and rolls back, which a full or read-only disk allows) said "ok"
// throughout: a daemon whose data_dir was full answered every message 503 while /readyz said
// ready.
func TestReadyzFailsWhileWritesAreRefused(t *testing.T) {
	dir := t.TempDir()
	o := &storetest.Outage{}
	r := startWithOutage(t, dir, o, echo.New())
	defer r.stop(t)
	src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c", UserID: "u"}
	r.inject(t, src, "ok-1", "fine")
	r.waitSent(t, 1)
	if code, body := getPath(t, r, "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz = %d %s before the outage, want 200", code, body)
	}

	roomAgain := fillDisk(t, r, o)
	if _, err := r.fake.Inject(t.Context(), &platforms.Inbound{Source: src, MessageID: "refused", Text: "x"}); !errors.Is(err, platforms.ErrUnavailable) {
		t.Fatalf("Inject with the database and the spool failing = %v, want platforms.ErrUnavailable", err)
	}
	if code, body := getPath(t, r, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "writes refused") {
		t.Errorf("/readyz = %d %s while writes are refused, want 503 naming the store's refused writes", code, body)
	}
	// agentgate_spool_files, the metric to alert on for an outage, stays 0: the spool took
	// nothing. The refusals are counted.
	if n := testutil.ToFloat64(r.d.metrics.WritesRefused); n < 1 {
		t.Errorf("agentgate_persist_writes_refused_total = %v after a refused write, want >= 1", n)
	}

	// The spool has room again, the database not yet: writes wait in the spool.
	roomAgain()
	r.inject(t, src, "spooled", "y")
	if code, body := getPath(t, r, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "spool") {
		t.Errorf("/readyz = %d %s while writes wait in the spool, want 503 naming the spool", code, body)
	}

	o.Down.Store(false)
	waitUntil(t, func() bool { code, _ := getPath(t, r, "/readyz"); return code == http.StatusOK })
}

// TestRefusedResetIs503AndChangesNothing: an operator's reset while the database and the spool
// both refuse writes (a full disk) is answered 503 unavailable, saying it could not be stored,
// and the session goes on as it was: once the disk has room, the chat's next message is taken
// in the same session and answered. Before, the answer was a 500 internal error, and the
// session went on in memory as a new session the store did not hold: every later message of
// the chat was refused (its row's session did not exist) until the daemon restarted.
func TestRefusedResetIs503AndChangesNothing(t *testing.T) {
	dir := t.TempDir()
	o := &storetest.Outage{}
	r := startWithOutage(t, dir, o, echo.New())
	defer r.stop(t)
	src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c", UserID: "u"}
	a1 := r.inject(t, src, "m1", "one")
	r.waitSent(t, 1)

	roomAgain := fillDisk(t, r, o)
	resp, err := http.Post("http://"+r.d.Addr().String()+"/v1/sessions/"+url.PathEscape(a1.SessionKey)+"/reset", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"code":"unavailable"`) ||
		!strings.Contains(string(body), "the reset could not be stored") {
		t.Errorf("reset while writes are refused: %d %s, want 503 unavailable saying the reset could not be stored", resp.StatusCode, body)
	}

	roomAgain()
	o.Down.Store(false)
	r.injectWhenLoaded(t, src, "m2", "two")
	r.waitReplyTo(t, "m2")
	route, err := r.d.store.Route(t.Context(), a1.SessionKey)
	if err != nil || route.SessionID != a1.SessionID {
		t.Errorf("the key routes to %+v (%v), want the session the reset left as it was, %s", route, err, a1.SessionID)
	}
	checkAnsweredInOrder(t, r, dir, a1.SessionKey, "m1", "m2")
}

// TestResetWhileSpoolingAnswersTheNewSession: an operator's reset while writes wait in the spool
// (the database refuses them; the spool takes them) is done, and its answer is the new session
// the reset began, with prev_session_id naming the one it ended, as docs/HTTP-API.md says; and
// GET of the key says the same once the spool has drained. Before, the answer was read back from
// the database, which did not show the reset yet: it was the session the reset had ended, as if
// still open, and agentgate sessions reset reported that one as the key's session.
func TestResetWhileSpoolingAnswersTheNewSession(t *testing.T) {
	o := &storetest.Outage{}
	r := startWithOutage(t, t.TempDir(), o, echo.New())
	defer r.stop(t)
	src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c", UserID: "u"}
	a1 := r.inject(t, src, "m1", "one")
	r.waitSent(t, 1)

	o.Down.Store(true)
	got := r.resetOK(t, a1.SessionKey, "reset while writes wait in the spool")
	if !r.d.deps.Spooling.Load() {
		t.Fatal("the reset's write did not go to the spool: the test shows nothing")
	}
	if got.SessionID == a1.SessionID || got.PrevSessionID != a1.SessionID || got.EndedAt != nil ||
		got.Messages != 0 || got.StartedAt.IsZero() || got.ChatID != "c" || got.Live == nil {
		t.Errorf("reset while writes wait in the spool answered session %s (prev %q, ended %v, %d messages, started %v, chat %q, live %v), want a new open session after %s, with nothing in it yet",
			got.SessionID, got.PrevSessionID, got.EndedAt, got.Messages, got.StartedAt, got.ChatID, got.Live, a1.SessionID)
	}

	after := r.sessionOnceDrained(t, o, a1.SessionKey)
	if after.SessionID != got.SessionID || after.PrevSessionID != a1.SessionID {
		t.Errorf("once the spool drained the key's session is %s (prev %s), want %s (prev %s), as the reset answered",
			after.SessionID, after.PrevSessionID, got.SessionID, a1.SessionID)
	}
}

// TestResetOfASessionEndedWhileSpoolingAnswersItEnded: an operator's reset of a session whose
// idle reset waits in the spool (the database refuses writes) finds nothing to end, and answers
// the session ended, as docs/HTTP-API.md says of an ended one: ended_at and end_reason set, as
// GET shows once the spool has drained. Before, the answer was read back from the database,
// which did not show the end yet: the session was answered as the key's open one, and agentgate
// sessions reset reported a reset made.
func TestResetOfASessionEndedWhileSpoolingAnswersItEnded(t *testing.T) {
	clk := agtest.NewClock(t0)
	o := &storetest.Outage{}
	r := MustStartDaemon(t, echo.New(), daemonOpts{now: clk.Now, wrap: func(s persistence.Store) persistence.Store {
		o.Store = s
		return o
	}, tweak: func(c *config.Config) { c.Sessions.Reset.Timezone = "UTC"; idleHour(c) }})
	defer r.stop(t)
	a1 := r.inject(t, dm, "m1", "one")
	r.waitSent(t, 1)

	o.Down.Store(true)
	clk.Advance(time.Hour)
	r.checkResets()
	waitUntil(t, func() bool { return r.sessionState(t, a1.SessionKey).SessionId == "" })
	// The end's write, refused by the database, goes to the spool (else the test shows nothing):
	// it may still be on its way when the session answers that it ended.
	waitUntil(t, func() bool { return r.d.deps.Spooling.Load() })
	got := r.resetOK(t, a1.SessionKey, "reset while the session's end waits in the spool")
	due := t0.Add(time.Hour)
	if got.SessionID != a1.SessionID || got.EndedAt == nil || !got.EndedAt.Equal(due) || got.EndReason != persistence.EndIdle || got.Kept {
		t.Errorf("reset while the session's end waits in the spool answered session %s ended %v (%q), kept %v; want %s ended %v (%s)",
			got.SessionID, got.EndedAt, got.EndReason, got.Kept, a1.SessionID, due, persistence.EndIdle)
	}

	after := r.sessionOnceDrained(t, o, a1.SessionKey)
	if after.SessionID != a1.SessionID || after.EndedAt == nil || !after.EndedAt.Equal(due) || after.EndReason != persistence.EndIdle {
		t.Errorf("once the spool drained the key's session is %s ended %v (%q), want %s ended %v (%s), as the reset answered",
			after.SessionID, after.EndedAt, after.EndReason, a1.SessionID, due, persistence.EndIdle)
	}
}

// resetOK has an operator reset key over HTTP (POST /v1/sessions/{key}/reset) and returns the
// session answered; what is the request, for the failure's message. It must be answered 200.
func (r *runtime) resetOK(t *testing.T, key, what string) httpplatform.SessionInfo {
	t.Helper()
	resp, err := http.Post("http://"+r.d.Addr().String()+"/v1/sessions/"+url.PathEscape(key)+"/reset", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var got httpplatform.SessionInfo
	err = json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d (%v), want 200", what, resp.StatusCode, err)
	}
	return got
}

// sessionOnceDrained ends the outage o, waits for the spool to drain, and returns the key's
// session as GET /v1/sessions/{key} reads it from the database then.
func (r *runtime) sessionOnceDrained(t *testing.T, o *storetest.Outage, key string) httpplatform.SessionInfo {
	t.Helper()
	o.Down.Store(false)
	waitUntil(t, func() bool { return !r.d.deps.Spooling.Load() })
	path := "/v1/sessions/" + url.PathEscape(key)
	code, body := getPath(t, r, path)
	var after httpplatform.SessionInfo
	if err := json.Unmarshal([]byte(body), &after); err != nil || code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, code, body)
	}
	return after
}
