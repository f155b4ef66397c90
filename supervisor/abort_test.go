package supervisor

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/persistence"
)

// endRunHeld is a store whose EndRun waits for release before it writes.
type endRunHeld struct {
	persistence.Store
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (s *endRunHeld) EndRun(ctx context.Context, run string) error {
	s.once.Do(func() { close(s.entered) })
	select {
	case <-s.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Store.EndRun(ctx, run)
}

// TestAbortWaitsForTheStopsCleanStopWrite: a second signal that comes while the stop writes
// the clean stop waits for that write (up to abortEndRun) before the process exits. Before, the
// stop had taken the write, Abort returned at once, and the exit cut the write short: the
// next start counted an unclean stop (a review's finding).
func TestAbortWaitsForTheStopsCleanStopWrite(t *testing.T) {
	held := &endRunHeld{entered: make(chan struct{}), release: make(chan struct{})}
	r := MustStartDaemon(t, echo.New(), daemonOpts{wrap: func(s persistence.Store) persistence.Store { held.Store = s; return held }})
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopped <- r.d.Stop(ctx)
	}()
	<-held.entered // the stop writes the clean stop now
	start := time.Now()
	r.d.Abort()
	if took := time.Since(start); took < abortEndRun {
		t.Errorf("Abort returned after %v while the stop's write of the clean stop was under way, want it to wait up to %v", took, abortEndRun)
	}
	close(held.release)
	if err := <-stopped; err != nil {
		t.Errorf("Stop: %v", err)
	}
}

// TestAbortKillsWithoutBlamingAServiceManager: a second signal while an exec agent runs a slow
// turn kills its command, and says so; the session's report of the command's SIGKILL does not
// warn that a service manager signalled it ("under systemd, set KillMode=mixed"): agentgate
// killed it. Before, a new user who pressed Ctrl-C twice in a terminal was sent looking for a
// systemd problem that did not exist.
func TestAbortKillsWithoutBlamingAServiceManager(t *testing.T) {
	running := filepath.Join(t.TempDir(), "running")
	logs := &logSignal{}
	r := MustStartDaemon(t, MustExecAgent(t, fmt.Sprintf("touch %q; sleep 60", running)), daemonOpts{logs: logs, drain: time.Minute})
	r.inject(t, dm, "m1", "a slow turn")
	waitUntil(t, func() bool { _, err := os.Stat(running); return err == nil })
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		stopped <- r.d.Stop(ctx)
	}()
	waitUntil(t, r.d.deps.Stopping.Load) // the first signal's stop drains
	r.d.Abort()                          // the second signal's
	if err := <-stopped; err != nil {    // the drain ends once the cut turn's session is idle
		t.Errorf("Stop: %v", err)
	}
	if !strings.Contains(logs.String(), "killed the agent commands still running") {
		t.Errorf("the log after Abort does not say it killed the agent's command:\n%s", logs.String())
	}
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "KillMode=mixed") && !strings.Contains(l, "level=DEBUG") {
			t.Errorf("the log after Abort blames a service manager for the command it killed itself:\n%s", l)
		}
	}
}

// TestAbortGivenOnceTheRunIsRecorded: Start gives Options.Abortable its Abort once the run is
// in the store (and before the sessions start): an Abort called right then, as serve's second
// stop signal during the start calls it, records the clean stop, so the exit that follows is
// not counted as an unclean stop at the next start. Before, nothing gave serve's start-time
// signal reader Abort, and it exited without the clean stop.
func TestAbortGivenOnceTheRunIsRecorded(t *testing.T) {
	cfg := config.Default()
	cfg.DataDir, cfg.HTTP.Addr = t.TempDir(), "127.0.0.1:0"
	var logs logSignal
	given := 0
	d, err := Start(t.Context(), cfg, slog.New(slog.NewTextHandler(&logs, nil)), Options{Agent: echo.New(),
		Abortable: func(abort func()) {
			given++
			abort() // a second signal in the instant Start gives it
		}})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer func() { _ = d.Stop(context.Background()) }()
	if given != 1 {
		t.Errorf("Start gave Abort %d times, want once", given)
	}
	db, err := sql.Open("sqlite", "file:"+cfg.DSN()+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var run string
	var started sql.NullInt64
	if err := db.QueryRow(`SELECT run, started_at FROM daemon_run WHERE one = 1`).Scan(&run, &started); err != nil {
		t.Fatal(err)
	}
	switch {
	case !started.Valid:
		t.Errorf("no run recorded: Abort was given before the run was in the store, which it then kept out\n%s", logs.String())
	case run != "":
		t.Errorf("after an Abort during the start the database names run %s as running: the next start counts an unclean stop\n%s", run, logs.String())
	}
}
