package supervisor

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
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
