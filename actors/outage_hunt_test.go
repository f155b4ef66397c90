package actors

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// The outage hunt is the model test (model_test.go) with a database that fails and comes back
// at random moments, a spool that takes the writes meanwhile and replays them, a spool that
// fails too, and daemon restarts and kills while writes wait in the spool or are being
// replayed, all on the same data directory. It checks the model's guarantees (G1 identity, G2
// order, G4 no silent drop and no duplicate answer, G6 boundaries, the rows agreeing with what
// was delivered) and, on top: nothing is left in the spool or set aside from it, and a message
// refused as unavailable (the database and the spool both failing) is never stored.
//
// How the database fails:
//   - locked: another connection holds BEGIN EXCLUSIVE, so the daemon's commits wait out
//     SQLite's busy timeout (5 s of real time) and fail busy. It costs real time, so a seed
//     has at most one such episode, around one burst of messages.
//   - down: the store's commits fail as unavailable, as on a full disk (storetest.Outage),
//     for as long as the model likes (its reads go on, as they do on a full disk).
//   - lost: a commit applies and its answer is lost (storetest.Outage.Lost), so its writes
//     are spooled and replayed although the database holds them.
//
// The spool fails by its directory being replaced with a file (only while it is empty: its
// batches must not be taken away behind the persistence actor's back).
//
// AGENTGATE_OUTAGE_SEEDS=N runs N random seeds instead of the fixed ones;
// AGENTGATE_OUTAGE_SEED=S replays seed S; AGENTGATE_OUTAGE_STEPS sets the steps per seed;
// AGENTGATE_OUTAGE_LOG=1 logs what the model did also when a seed passes;
// AGENTGATE_OUTAGE_DEBUG=1 also logs the spool batches that were set aside.

// outageSeeds are the seeds the suite always runs.
var outageSeeds = []uint64{1, 2, 3}

const outageSteps = 40

func TestOutageHunt(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out SQLite's busy timeout")
	}
	seeds, steps := testutil.HuntSeeds(t, "AGENTGATE_OUTAGE", outageSeeds, outageSteps)
	script := modelScript(t)
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir := t.TempDir()
				out := &modelOutage{t: t, o: &storetest.Outage{}, dir: filepath.Join(dir, "spool"), locks: 1}
				m := newModelOut(t, seed, script, out)
				out.path = m.path
				m.runOutage(steps)
				m.check()
				m.checkOutage()
				if os.Getenv("AGENTGATE_OUTAGE_LOG") != "" {
					t.Logf("what the model did:\n%s", strings.Join(m.log, "\n"))
				}
			})
		})
	}
}

// modelOutage makes the model's database and spool fail on cue.
type modelOutage struct {
	t        *testing.T
	o        *storetest.Outage // wraps each run's store
	dir      string            // the spool directory
	path     string            // the database
	spoolOff bool              // the spool directory is a file now
	lost     bool              // a commit's answer was lost at least once
	locks    int               // lock episodes left
	lockDB   *sql.DB
	lockConn *sql.Conn
}

// attach gives a starting daemon the failing store and a spool.
func (o *modelOutage) attach(d *Deps, store *sqlite.Store, opts *persistence.ActorOptions) {
	o.spoolBack() // a daemon does not start without its spool directory
	o.o.Store = store
	d.Store = o.o
	sp, err := spool.Open(o.dir)
	if err != nil {
		o.t.Fatalf("open the spool: %v", err)
	}
	opts.Spool, opts.Spooling = sp, &d.Spooling
	opts.ReplayEvery = time.Second
}

// spoolFail replaces the spool directory with a file, when no batch waits in it.
func (o *modelOutage) spoolFail() bool {
	if o.spoolOff {
		return false
	}
	entries, err := os.ReadDir(o.dir)
	if err != nil {
		o.t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".json") {
			return false
		}
	}
	if err := os.Rename(o.dir, o.dir+".off"); err != nil {
		o.t.Fatal(err)
	}
	if err := os.WriteFile(o.dir, []byte("not a directory"), 0o600); err != nil {
		o.t.Fatal(err)
	}
	o.spoolOff = true
	return true
}

// spoolBack gives the spool its directory again.
func (o *modelOutage) spoolBack() {
	if !o.spoolOff {
		return
	}
	if err := os.Remove(o.dir); err != nil {
		o.t.Fatal(err)
	}
	if err := os.Rename(o.dir+".off", o.dir); err != nil {
		o.t.Fatal(err)
	}
	o.spoolOff = false
}

// lock takes the database's write lock on a connection of its own.
func (o *modelOutage) lock() {
	db, err := sql.Open("sqlite", "file:"+o.path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		o.t.Fatal(err)
	}
	conn, err := db.Conn(context.Background())
	if err == nil {
		_, err = conn.ExecContext(context.Background(), "BEGIN EXCLUSIVE")
	}
	if err != nil {
		db.Close()
		o.t.Fatalf("take the database lock: %v", err)
	}
	o.lockDB, o.lockConn = db, conn
}

// unlock releases the lock, if it is held.
func (o *modelOutage) unlock() {
	if o.lockConn == nil {
		return
	}
	if _, err := o.lockConn.ExecContext(context.Background(), "ROLLBACK"); err != nil {
		o.t.Errorf("release the database lock: %v", err)
	}
	o.lockConn.Close()
	o.lockDB.Close()
	o.lockConn, o.lockDB = nil, nil
}

// inSpool reports whether a batch waiting in the spool holds the message id.
func (o *modelOutage) inSpool(id string) bool {
	dir := o.dir
	if o.spoolOff {
		dir += ".off"
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if b, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil && strings.Contains(string(b), `"MessageID":"`+id+`"`) {
			return true
		}
	}
	return false
}

// heal makes the database and the spool work again.
func (o *modelOutage) heal() {
	o.unlock()
	o.o.Down.Store(false)
	o.o.Lost.Store(0)
	o.spoolBack()
}

// runOutage is run with the database and the spool failing and coming back.
func (m *model) runOutage(steps int) {
	o := m.out
	for range steps {
		switch p := m.rng.IntN(100); {
		case p < 32:
			m.burst()
		case p < 46:
			m.command()
		case p < 50:
			m.redeliver()
		case p < 58:
			m.logf("database down")
			o.o.Down.Store(true)
		case p < 66:
			m.logf("database back")
			o.o.Down.Store(false)
			if m.rng.IntN(2) == 0 {
				m.logf("spool back")
				o.spoolBack()
			}
		case p < 69:
			n := 1 + m.rng.IntN(2)
			m.logf("the answers of the next %d commits are lost", n)
			o.o.Lost.Store(int32(n))
			o.lost = true
		case p < 73:
			if o.spoolFail() {
				m.logf("spool fails")
			}
		case p < 76:
			if o.locks > 0 {
				o.locks--
				m.logf("database locked")
				o.lock()
				m.burst()
				if m.rng.IntN(3) == 0 {
					m.logf("restart (killed) while locked")
					m.kill()
					m.start()
				}
				m.logf("database unlocked")
				o.unlock()
			}
		case p < 88:
			m.advance(4000 * time.Millisecond)
		default:
			m.restart(3)
		}
	}
	m.logf("database and spool healed")
	o.heal()
	// Quiesce: the spool drains, every turn ends, every reply is sent and marked.
	for range 20 {
		time.Sleep(30 * time.Second)
		synctest.Wait()
	}
}

// checkOutage: nothing waits in the spool or was set aside from it, and a message refused as
// unavailable was not stored (unless a commit's answer was lost: then the refusal cannot
// know).
func (m *model) checkOutage() {
	t, o := m.t, m.out
	entries, err := os.ReadDir(o.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("spool holds %s after everything ended", e.Name())
	}
	if failed, err := os.ReadDir(filepath.Join(o.dir, "failed")); err == nil || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("spool batches set aside: %d (%v)", len(failed), err)
		for _, f := range failed {
			if os.Getenv("AGENTGATE_OUTAGE_DEBUG") != "" && !strings.HasSuffix(f.Name(), ".reason.txt") {
				b, _ := os.ReadFile(filepath.Join(o.dir, "failed", f.Name()))
				t.Logf("%s: %s", f.Name(), b)
			}
			if strings.HasSuffix(f.Name(), ".reason.txt") {
				b, _ := os.ReadFile(filepath.Join(o.dir, "failed", f.Name()))
				t.Errorf("%s: %s", f.Name(), b)
			}
		}
	}
	if o.lost {
		return
	}
	for _, a := range m.acks {
		if m.byID[a.id] != a || a.res == nil || a.res.ErrorCode != "unavailable" {
			continue
		}
		if row, err := m.daemon.store.FindInbound(t.Context(), a.src.Platform, a.src.ChatID, a.id); err == nil {
			t.Errorf("%s was refused (%s), but the store holds it in session %s (status %s)", a.id, a.describe(), row.SessionID, row.Status)
		}
	}
}

// TestRecoveryAfterTheSpoolDrains: a message acknowledged while the database was down (its
// write in the spool) and not answered when the daemon stopped is answered once the spool is
// replayed after the next start, without waiting for the chat's next message. Before, the
// start's recovery listed the sessions with pending messages while the database did not show
// the spooled ones yet, and nothing listed them again: the message stayed pending until the
// chat wrote again (found by TestOutageHunt).
func TestRecoveryAfterTheSpoolDrains(t *testing.T) {
	script := modelScript(t)
	synctest.Test(t, func(t *testing.T) {
		out := &modelOutage{t: t, o: &storetest.Outage{}, dir: filepath.Join(t.TempDir(), "spool")}
		m := newModelOut(t, 1, script, out)
		out.o.Down.Store(true)
		a, f := m.send(m.srcs[0], "m1", "m1 d=5", "")
		m.await([]*modelAck{a}, []*actor.Future{f})
		if !a.accepted() {
			t.Fatalf("m1 while the database is down: %s, want accepted (spooled)", a.describe())
		}
		m.stop(false) // its turn is cut short: m1 is pending, in the spool only
		m.start()
		out.o.Down.Store(false)
		time.Sleep(time.Minute)
		synctest.Wait()
		answered := 0
		for _, o := range m.fake.Sent() {
			if slices.Contains(o.InReplyTo, "m1") {
				answered++
			}
		}
		if answered != 1 {
			t.Errorf("m1 answered %d times a minute after the spool could drain, want once", answered)
		}
	})
}

// TestWaitingSessionAnswersADuplicate: a session that waits for the spool to drain before it
// loads answers a message it has already stored (a platform's or a client's re-delivery) as a
// duplicate, not as "unavailable, send it again", which would say that a message taken (and
// answered) was not (found by TestOutageHunt).
func TestWaitingSessionAnswersADuplicate(t *testing.T) {
	script := modelScript(t)
	synctest.Test(t, func(t *testing.T) {
		out := &modelOutage{t: t, o: &storetest.Outage{}, dir: filepath.Join(t.TempDir(), "spool")}
		m := newModelOut(t, 1, script, out)
		src := m.srcs[0]
		a, f := m.send(src, "m1", "m1 d=0", "")
		m.await([]*modelAck{a}, []*actor.Future{f})
		time.Sleep(10 * time.Second)
		synctest.Wait()
		out.o.Down.Store(true)
		b, f := m.send(src, "m2", "m2 d=0", "") // spooled
		m.await([]*modelAck{b}, []*actor.Future{f})
		m.stop(false)
		m.start() // the spool holds m2's writes: the session waits before it loads
		again, f := m.send(src, "m1", "m1 d=0", "")
		m.await([]*modelAck{again}, []*actor.Future{f})
		if !a.accepted() || again.res == nil || again.res.Disposition != platforms.Duplicate || again.res.ErrorCode != "" {
			t.Errorf("m1 (%s) delivered again to a session waiting for the spool: %s, want duplicate", a.describe(), again.describe())
		}
		out.o.Down.Store(false)
	})
}

// TestResumeWhileSpooling: /resume while writes wait in the spool does not reopen a session
// from what the database shows, which lacks the spooled rows of that session: the resumed
// session's next rows would take seqs the spooled ones hold, and the replay would set the
// whole batch aside (the /resume, its notice and the route lost). Before, it did (found by
// TestOutageHunt); now it asks to try again once the database is back.
func TestResumeWhileSpooling(t *testing.T) {
	script := modelScript(t)
	synctest.Test(t, func(t *testing.T) {
		out := &modelOutage{t: t, o: &storetest.Outage{}, dir: filepath.Join(t.TempDir(), "spool")}
		m := newModelOut(t, 1, script, out)
		src := m.srcs[0]
		step := func(id, text, cmd string) *modelAck {
			a, f := m.send(src, id, text, cmd)
			m.await([]*modelAck{a}, []*actor.Future{f})
			time.Sleep(time.Second)
			synctest.Wait()
			return a
		}
		first := step("m1", "m1 d=0", "")
		out.o.Down.Store(true)
		step("m2", "m2 d=0", "") // its row and its reply's wait in the spool
		step("k3", "/new", "new")
		step("k4", "/resume "+first.res.SessionId, "resume")
		out.o.Down.Store(false)
		time.Sleep(time.Minute)
		synctest.Wait()
		m.checkOutage()
		if row, err := m.daemon.store.FindInbound(t.Context(), src.Platform, src.ChatID, "k4"); err != nil {
			t.Errorf("the /resume sent while spooling is not stored: %v", err)
		} else if row.Status != persistence.StatusDone {
			t.Errorf("the /resume is stored %s, want done", row.Status)
		}
	})
}
