package supervisor

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/persistence"
)

// endRunRefused is a store that refuses the record of a clean stop, as a full disk does.
type endRunRefused struct{ persistence.Store }

func (s *endRunRefused) EndRun(context.Context, string) error {
	return errors.New("database or disk is full (13) (test)")
}

// TestCleanStopTheStoreRefusedIsNotCountedUnclean: a clean stop whose record the store refuses
// (a full disk) is kept in the data directory, and the next start records it before its own
// run: it counts no unclean stop, and the message the stop cut short gets no strike. Before,
// the next start counted one ("the last run did not stop cleanly"), a strike against the
// message each session was running at every restart of a daemon on a full disk.
func TestCleanStopTheStoreRefusedIsNotCountedUnclean(t *testing.T) {
	dir := t.TempDir()
	started := make(chan struct{})
	slow := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		close(started)
		<-ctx.Done() // cut short by the stop
		return nil, ctx.Err()
	})
	last := &logSignal{}
	r := MustStartDaemon(t, slow, daemonOpts{dir: dir, logs: last, drain: time.Millisecond,
		wrap: func(s persistence.Store) persistence.Store { return &endRunRefused{Store: s} }})
	r.inject(t, dm, "m1", "a turn the stop cuts short")
	<-started
	r.stop(t)
	if got := last.String(); !strings.Contains(got, "record the clean stop in the store; kept in the data directory for the next start") {
		t.Fatalf("log of a stop whose store refused the clean stop:\n%s\nwant it kept in the data directory",
			grepLines(got, "clean stop"))
	}

	next := &logSignal{}
	r = MustStartDaemon(t, echo.New(), daemonOpts{dir: dir, logs: next})
	defer r.stop(t)
	if got := next.String(); strings.Contains(got, "did not stop cleanly") || !strings.Contains(got, "recorded the clean stop of an earlier run") {
		t.Errorf("log of the next start:\n%s\nwant the earlier clean stop recorded, and no unclean stop counted",
			grepLines(got, "clean"))
	}
	m, err := r.d.Store().FindInbound(context.Background(), dm.Platform, dm.ChatID, "m1")
	if err != nil {
		t.Fatal(err)
	}
	if m.Attempts != 0 {
		t.Errorf("unclean stops counted against m1 = %d, want 0", m.Attempts)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), cleanStopPrefix) {
			t.Errorf("%s left in the data directory once the store took the clean stop", e.Name())
		}
	}
}
