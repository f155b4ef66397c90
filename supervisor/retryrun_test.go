package supervisor

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// busyRetry is a store that refuses the record of the daemon's run at start, and whose later
// records wait as a database does whose write lock another process holds: until their ctx ends.
type busyRetry struct {
	persistence.Store
	calls   atomic.Int32
	entered chan struct{} // closed when the first retry's record begins to wait
}

func (s *busyRetry) BeginRun(ctx context.Context, run string, at time.Time) (*persistence.UncleanStop, error) {
	switch s.calls.Add(1) {
	case 1:
		return nil, errors.New("database or disk is full (13) (test)")
	case 2:
		close(s.entered)
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestAbortIsNotHeldUpByTheRunRecordsRetry: a second signal that comes while the retry of a
// refused run record waits for the database still records the clean stop. Before, the retry's
// write waited under the daemon's context alone (SQLite's busy timeout: 5 s) holding the lock
// Abort waits for at most abortEndRun, so Abort gave up: "the next start counts an unclean stop"
// (a review's finding).
func TestAbortIsNotHeldUpByTheRunRecordsRetry(t *testing.T) {
	st := &busyRetry{entered: make(chan struct{})}
	logs := &logSignal{}
	r := MustStartDaemon(t, echo.New(), daemonOpts{logs: logs, wrap: func(s persistence.Store) persistence.Store { st.Store = s; return st }})
	defer r.stop(t)
	<-st.entered // the retry's record waits for the database now
	r.d.Abort()
	if strings.Contains(logs.String(), "the clean stop was not recorded in time") {
		t.Errorf("Abort while the run record's retry waited for the database logged:\n%s\nwant the clean stop recorded: the retry's write gives way within %v",
			grepLines(logs.String(), "clean stop"), runRetryWithin)
	}
}

// pingHeld is a store whose first Ping, which only the retry of a refused run record makes
// here, lasts until the test has begun the stop and then a while longer, as a database that
// answers late does; it notes a Close that comes while that Ping is in flight.
type pingHeld struct {
	persistence.Store
	once      sync.Once
	entered   chan struct{} // closed when the Ping begins
	stopBegun chan struct{} // closed by the test just before it calls Stop
	closing   chan struct{} // closed by Close
	pinging   atomic.Bool
	overlap   atomic.Bool
}

func (s *pingHeld) BeginRun(context.Context, string, time.Time) (*persistence.UncleanStop, error) {
	return nil, errors.New("database or disk is full (13) (test)")
}

func (s *pingHeld) Ping(ctx context.Context) error {
	first := false
	s.once.Do(func() { first = true })
	if !first {
		return s.Store.Ping(ctx)
	}
	s.pinging.Store(true)
	defer s.pinging.Store(false)
	close(s.entered)
	<-s.stopBegun
	select {
	case <-s.closing:
	case <-time.After(2 * time.Second): // the answer comes late
	}
	return errors.New("no answer (test)")
}

func (s *pingHeld) Close() error {
	if s.pinging.Load() {
		s.overlap.Store(true)
	}
	close(s.closing)
	return s.Store.Close()
}

// TestStopWaitsForTheRunRecordsRetry: Stop closes the store only once the retry of a refused
// run record has ended. Before, nothing waited for it, and its Ping (or its record) could meet
// a store being closed (a review's finding).
func TestStopWaitsForTheRunRecordsRetry(t *testing.T) {
	st := &pingHeld{entered: make(chan struct{}), stopBegun: make(chan struct{}), closing: make(chan struct{})}
	r := MustStartDaemon(t, echo.New(), daemonOpts{wrap: func(s persistence.Store) persistence.Store { st.Store = s; return st }})
	<-st.entered // the retry pings the store now
	close(st.stopBegun)
	r.stop(t)
	if st.overlap.Load() {
		t.Error("Stop closed the store while the run record's retry pinged it; want it to wait for the retry to end")
	}
}

// grepLines returns the lines of s that hold substr.
func grepLines(s, substr string) string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "")
}

// runRecords notes whether a store recorded the daemon's run (BeginRun), and whether it did so
// while writes waited in the spool of dir.
type runRecords struct {
	dir             string
	early, recorded atomic.Bool
}

// beginRun records the run through begin, noting it.
func (w *runRecords) beginRun(ctx context.Context, begin func(context.Context, string, time.Time) (*persistence.UncleanStop, error), run string, at time.Time) (*persistence.UncleanStop, error) {
	if n, err := spool.Waiting(filepath.Join(w.dir, "spool")); err != nil || n > 0 {
		w.early.Store(true)
	}
	u, err := begin(ctx, run, at)
	if err == nil {
		w.recorded.Store(true)
	}
	return u, err
}

// lastRunsWritesInTheSpool runs a daemon on dir that answers one message and then, the
// database down, a second one, whose writes go to the spool, and stops it: the next start on
// dir finds them there.
func lastRunsWritesInTheSpool(t *testing.T, dir string) {
	t.Helper()
	o := &storetest.Outage{}
	r := startWithOutage(t, dir, o, echo.New())
	r.inject(t, dm, "m1", "one")
	r.waitSent(t, 1)
	o.Down.Store(true)
	r.inject(t, dm, "m2", "two, spooled")
	r.waitSent(t, 2)
	r.stop(t)
}

// runAfterSpool is an outage whose first record of the daemon's run is refused, as a database
// that is down when the daemon starts refuses it, and that notes whether a later record was
// made while writes waited in the spool.
type runAfterSpool struct {
	*storetest.Outage
	runRecords
	refused atomic.Bool
	pings   atomic.Int32
}

func (s *runAfterSpool) BeginRun(ctx context.Context, run string, at time.Time) (*persistence.UncleanStop, error) {
	if s.refused.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("%w: connection refused (test)", persistence.ErrUnavailable)
	}
	return s.beginRun(ctx, s.Outage.BeginRun, run, at)
}

func (s *runAfterSpool) Ping(ctx context.Context) error {
	s.pings.Add(1)
	return s.Outage.Ping(ctx)
}

// TestRunRecordsRetryWaitsForTheSpool: a daemon started while the database is down, with the
// last run's writes in the spool, records its run only once the spool is replayed. The record
// counts the last run's unclean stop against each session's head pending message in the
// database; before the replay that is a message the spool may have answered, and the one that
// was running gets no strike. Before, the retry took the database's first answer: a database
// back from an outage took the record before the replay (found by a crash soak on PostgreSQL,
// "recorded the daemon's run in the store" logged before "spool drained").
func TestRunRecordsRetryWaitsForTheSpool(t *testing.T) {
	dir := t.TempDir()
	lastRunsWritesInTheSpool(t, dir)

	st := &runAfterSpool{Outage: &storetest.Outage{}, runRecords: runRecords{dir: dir}}
	st.Down.Store(true)
	r := MustStartDaemon(t, echo.New(), daemonOpts{dir: dir, wrap: func(s persistence.Store) persistence.Store {
		st.Outage.Store = s
		return st
	}})
	defer r.stop(t)
	// Two ticks of the retry have passed the store's ping (nothing else pings it here), so the
	// first one's record, had it been made, is done; or a record was made.
	waitUntil(t, func() bool { return st.pings.Load() >= 2 || st.recorded.Load() })
	st.Down.Store(false)
	waitUntil(t, func() bool { return st.recorded.Load() })
	if st.early.Load() {
		t.Error("the run was recorded while the last run's writes waited in the spool; want it recorded once they are replayed")
	}
}

// replayRefusedOnce is a database whose first commit is refused as unavailable (the start's
// replay of the spool), and which takes everything after it, the record of the run included:
// a database back between the replay's try and the record. It notes whether the run was
// recorded while writes waited in the spool.
type replayRefusedOnce struct {
	persistence.Store
	runRecords
	refused atomic.Bool
}

func (s *replayRefusedOnce) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	if s.refused.CompareAndSwap(false, true) {
		errs := make([]error, len(groups))
		for i := range errs {
			errs[i] = fmt.Errorf("%w: connection refused (test)", persistence.ErrUnavailable)
		}
		return errs
	}
	return s.Store.Commit(ctx, groups)
}

func (s *replayRefusedOnce) BeginRun(ctx context.Context, run string, at time.Time) (*persistence.UncleanStop, error) {
	return s.beginRun(ctx, s.Store.BeginRun, run, at)
}

// TestRunIsNotRecordedAtStartWhileTheSpoolWaits: the record of the run made at start, after
// the start's replay of the last run's spool, waits for that replay when it did not drain the
// spool (the database unavailable at that moment, a batch it could not remove), as the retry
// of a refused record does. Before, only the retry waited: a database that took the record
// right after refusing the replay (back from an outage, or the replay's commit met a lock)
// counted the last run's unclean stop against heads that the spool had answered.
func TestRunIsNotRecordedAtStartWhileTheSpoolWaits(t *testing.T) {
	dir := t.TempDir()
	lastRunsWritesInTheSpool(t, dir)

	st := &replayRefusedOnce{runRecords: runRecords{dir: dir}}
	r := MustStartDaemon(t, echo.New(), daemonOpts{dir: dir, wrap: func(s persistence.Store) persistence.Store {
		st.Store = s
		return st
	}})
	defer r.stop(t)
	waitUntil(t, func() bool { return st.recorded.Load() })
	if !st.refused.Load() {
		t.Fatal("the start's replay made no commit; the test did not set up a spool")
	}
	if st.early.Load() {
		t.Error("the run was recorded at start while the last run's writes waited in the spool; want it recorded once they are replayed")
	}
}
