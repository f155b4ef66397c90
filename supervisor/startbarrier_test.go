package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
)

// gatedStore holds each commit, while armed, until the test lets it through or its ctx ends: a
// replay as slow as the test wants.
type gatedStore struct {
	persistence.Store
	armed   atomic.Bool
	entered chan struct{} // a commit waits at the gate
	release chan struct{} // lets one through; closed: all
}

func newGatedStore() *gatedStore {
	g := &gatedStore{entered: make(chan struct{}, 16), release: make(chan struct{})}
	g.armed.Store(true)
	return g
}

func (g *gatedStore) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	if g.armed.Load() {
		g.entered <- struct{}{}
		select {
		case <-g.release:
		case <-ctx.Done(): // the daemon stops: the commit fails, as a real one would
		}
	}
	return g.Store.Commit(ctx, groups)
}

// open lets every commit through from now on.
func (g *gatedStore) open() {
	g.armed.Store(false)
	close(g.release)
}

// fireReplayChecks makes the start barrier's checks the test's to fire.
func fireReplayChecks(t *testing.T) chan time.Time {
	t.Helper()
	ticks := make(chan time.Time)
	f := func() (<-chan time.Time, func()) { return ticks, func() {} }
	old := replayChecks.Swap(&f)
	t.Cleanup(func() { replayChecks.Store(old) })
	return ticks
}

// tick fires one check of the barrier, failing the test if the barrier does not take it.
func tick(t *testing.T, ticks chan<- time.Time) {
	select {
	case ticks <- time.Now():
	case <-time.After(10 * time.Second):
		t.Error("the start barrier took no check within 10 s")
	}
}

// waitAtGate waits for a commit to wait at g's gate.
func waitAtGate(t *testing.T, g *gatedStore, what string) bool {
	select {
	case <-g.entered:
		return true
	case <-time.After(30 * time.Second):
		t.Errorf("%s: no commit came to the gate within 30 s", what)
		return false
	}
}

// mustLeaveResetInSpool runs a daemon on dir whose chat dm is reset while the database refuses
// writes, then takes m2 in the session the reset began, and stops with both in the spool. It
// returns the key and the session the reset ended.
func mustLeaveResetInSpool(t *testing.T, dir string) (key, ended string) {
	t.Helper()
	o := &storetest.Outage{}
	r := startWithOutage(t, dir, o, echo.New())
	a1 := r.inject(t, dm, "m1", "one")
	r.waitSent(t, 1)
	o.Down.Store(true)
	if got := r.resetOK(t, a1.SessionKey, "reset while writes wait in the spool"); got.SessionID == a1.SessionID {
		t.Fatalf("the reset answered session %s, the one it ended", got.SessionID)
	}
	r.inject(t, dm, "m2", "two, in the session the reset began")
	r.waitSent(t, 2)
	r.stop(t)
	if n, err := r.d.spooled(); err != nil || n < 2 {
		t.Fatalf("%d batches in the spool after the stop (%v), want the reset's and m2's", n, err)
	}
	return a1.SessionKey, a1.SessionID
}

// TestStartThatGoesOnBeforeTheReplayKeepsSessionsWaiting: a start whose replay of the spool the
// last run left takes no batch out of it for a minute (a commit that does not return) goes on
// without waiting for it, but no session loads from the database before the replay is in: a
// message to a chat whose reset waits in the spool is refused as unavailable (its sender sends
// it again), and runs, once the spool drained, in the session the reset began. Before, the
// Spooling flag was set only once the replay ended: the session loaded the database without
// the reset and took the message into the session the reset had ended (resurrected), or waited
// for the stalled persistence actor to store it.
func TestStartThatGoesOnBeforeTheReplayKeepsSessionsWaiting(t *testing.T) {
	dir := t.TempDir()
	key, ended := mustLeaveResetInSpool(t, dir)

	ticks := fireReplayChecks(t)
	g := newGatedStore()
	var logs logSignal
	go func() {
		if waitAtGate(t, g, "the start's replay") {
			tick(t, ticks) // a minute with no batch out of the spool
		}
	}()
	r := MustStartDaemon(t, echo.New(), daemonOpts{dir: dir, logs: &logs, wrap: func(s persistence.Store) persistence.Store {
		g.Store = s
		return g
	}})
	opened := false
	defer func() {
		if !opened {
			g.open()
		}
		r.stop(t)
	}()
	const goesOn = `level=WARN msg="the replay of the spool left by the last run took no batch out of it for a minute; the start goes on without waiting for it"`
	if got := logs.String(); !strings.Contains(got, goesOn) {
		t.Errorf("the start's log:\n%s\nwant %q", got, goesOn)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	_, err := r.fake.Inject(ctx, &platforms.Inbound{Source: dm, MessageID: "m3", Text: "three"})
	cancel()
	if !errors.Is(err, platforms.ErrUnavailable) {
		t.Errorf("a message to a chat whose reset waits in the spool, during the start's replay: %v, want ErrUnavailable", err)
	}

	g.open()
	opened = true
	r.injectWhenLoaded(t, dm, "m3", "three")
	answeredAfterTheSpooledReset(t, r, dir, key, ended)
}

// TestStartWaitsForAReplayThatTakesBatches: a start waits for the replay of the spool the last
// run left for as long as the replay takes batches out of it, saying each minute how many are
// left, and nothing serves before it has ended. Before, the start went on after a minute, and
// the sessions that loaded (and the platforms' reads of the store) raced the replay.
func TestStartWaitsForAReplayThatTakesBatches(t *testing.T) {
	dir := t.TempDir()
	key, _ := mustLeaveResetInSpool(t, dir)

	ticks := fireReplayChecks(t)
	g := newGatedStore()
	const waits = `level=INFO msg="the start waits for the replay of the spool left by the last run"`
	logs := &logSignal{want: waits, ready: make(chan struct{})}
	ready := logs.ready
	go func() {
		defer g.open()
		if !waitAtGate(t, g, "the replay's first batch") {
			return
		}
		g.release <- struct{}{}
		if !waitAtGate(t, g, "the replay's second batch") { // the first is out of the spool
			return
		}
		tick(t, ticks)
		select {
		case <-ready:
		case <-time.After(10 * time.Second):
			t.Errorf("no %q within 10 s of a check:\n%s", waits, logs.String())
			return
		}
		if got := logs.String(); strings.Contains(got, "agentgate started") {
			t.Errorf("the start went on during the replay:\n%s", got)
		}
	}()
	r := MustStartDaemon(t, echo.New(), daemonOpts{dir: dir, logs: logs, tweak: func(c *config.Config) {
		c.Persist.MaxBatch = 1 // a transaction a batch: the replay takes them out one by one
	}, wrap: func(s persistence.Store) persistence.Store {
		g.Store = s
		return g
	}})
	defer r.stop(t)
	got := logs.String()
	if i, j := strings.Index(got, waits), strings.Index(got, "agentgate started"); i < 0 || j < i || strings.Contains(got, "level=WARN msg=\"the replay") {
		t.Errorf("the start's log:\n%s\nwant %q before the start's line, and no warning that the start went on", got, waits)
	}
	if r.d.deps.Spooling.Load() {
		t.Error("writes wait in the spool once the start has waited for its replay")
	}
	r.inject(t, dm, "m3", "three")
	r.waitReplyTo(t, "m3")
	checkAnsweredInOrder(t, r, dir, key, "m2", "m3")
}

// TestStopDuringTheStartsReplay: a stop asked for while the start waits for the replay of the
// spool the last run left (serve's first stop signal, Options.Stop) ends the start at once: the
// replay stops after the batch it commits, Start stops what it started and returns ErrStopped,
// the batches the replay did not take stay in the spool, the stop says so, and the next start
// replays them, losing nothing. Before, the start waited for as long as the replay took batches
// out of the spool, hearing no stop: SIGTERM waited for the end of a long replay.
func TestStopDuringTheStartsReplay(t *testing.T) {
	dir := t.TempDir()
	key, ended := mustLeaveResetInSpool(t, dir)
	spooled := func() int {
		n, err := spool.Waiting(filepath.Join(dir, "spool"))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	left := spooled()

	g := newGatedStore()
	defer g.open() // a start that did not stop must not hang the test
	cfg := config.Default()
	cfg.DataDir, cfg.HTTP.Addr = dir, "127.0.0.1:0"
	cfg.Persist.MaxBatch = 1 // a transaction a batch
	var logs logSignal
	stop := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		d, err := Start(t.Context(), cfg, slog.New(slog.NewTextHandler(&logs, nil)), Options{Agent: echo.New(), Stop: stop,
			WrapStore: func(s persistence.Store) persistence.Store {
				g.Store = s
				return g
			}})
		if err == nil {
			err = errors.New("Start returned a daemon")
			_ = d.Stop(context.Background())
		}
		started <- err
	}()
	if !waitAtGate(t, g, "the start's replay") {
		return
	}
	close(stop) // the replay's first batch is at the gate
	select {
	case err := <-started:
		if !errors.Is(err, ErrStopped) {
			t.Fatalf("Start = %v, want ErrStopped", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("Start did not return within 30 s of the stop, its replay at the database's gate:\n%s", logs.String())
	}
	if n := spooled(); n != left {
		t.Errorf("%d batches in the spool after a stop during its replay, want the %d the start found", n, left)
	}
	const stopped = `level=WARN msg="stopped with writes waiting in the spool; the next start replays them before any session loads"`
	if got := logs.String(); !strings.Contains(got, stopped) || strings.Contains(got, "agentgate started") {
		t.Errorf("the start's log:\n%s\nwant %q, and no start line", got, stopped)
	}

	r := MustStartDaemon(t, echo.New(), daemonOpts{dir: dir})
	defer r.stop(t)
	if n := spooled(); n != 0 {
		t.Errorf("%d batches in the spool once the next start replayed it", n)
	}
	r.inject(t, dm, "m3", "three")
	answeredAfterTheSpooledReset(t, r, dir, key, ended)
}

// answeredAfterTheSpooledReset: m3 is answered, in the session the spooled reset began, not in
// the one it ended, and m2 and m3 are answered in order.
func answeredAfterTheSpooledReset(t *testing.T, r *runtime, dir, key, ended string) {
	t.Helper()
	r.waitReplyTo(t, "m3")
	route, err := r.d.store.Route(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if route.SessionID == ended {
		t.Errorf("the key routes to session %s, which the spooled reset ended", ended)
	}
	checkAnsweredInOrder(t, r, dir, key, "m2", "m3")
}
