package persistence_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
)

// spoolWorldOn starts a persistence actor with a spool over the real SQLite store in dir, as a
// daemon's start does (a new process: its Spooling flag starts false), logging to log, its
// options changed by tune.
func spoolWorldOn(t *testing.T, dir string, log *slog.Logger, down bool, tune ...func(*persistence.ActorOptions)) *spoolWorld {
	t.Helper()
	w := startSpoolWorld(t, t.Context(), dir, log, new(atomic.Bool), down, tune...)
	// The daemon's start barrier: no session loads before the actor has taken it.
	if _, err := w.system.Root.RequestFuture(w.pid, &persistence.Flush{}, time.Minute).Result(); err != nil {
		t.Fatal(err)
	}
	return w
}

// TestStartWithWritesLeftInTheSpoolSaysSo: a daemon stopped while writes waited in its spool
// replays them at the next start. That start logs, at INFO, how many batches the last run left
// and that they are replayed before any session loads, and then that the spool drained, once
// the database took them: at once, or later when it still refuses writes at the start. Before,
// the replay said nothing: the drained line needs the Spooling flag, which starts false in a
// new process.
func TestStartWithWritesLeftInTheSpoolSaysSo(t *testing.T) {
	const (
		left    = "level=INFO msg=\"writes left in the spool by the last run; replaying them before any session loads\" batches=2"
		drained = "level=INFO msg=\"spool drained; writing to the database again\""
	)
	for _, tc := range []struct {
		name string
		down bool // the database still refuses writes when the daemon starts again
	}{
		{"database takes writes", false},
		{"database refuses writes at first", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir := t.TempDir()
				last := spoolWorldOn(t, dir, slog.New(slog.DiscardHandler), false)
				last.write(t, 1, session("s1", "k1", t0))
				last.out.Down.Store(true)
				last.write(t, 2, userMessage("s1", 1, "m1")) // spooled, acknowledged
				last.write(t, 3, userMessage("s1", 2, "m2")) // a second batch
				last.close(t)
				if n := last.files(""); n != 2 {
					t.Fatalf("%d batches in the spool after the stop, want 2", n)
				}

				var logs testutil.Buffer
				w := spoolWorldOn(t, dir, slog.New(slog.NewTextHandler(&logs, nil)), tc.down)
				defer w.close(t)
				if tc.down {
					if got := logs.String(); !strings.Contains(got, left) || strings.Contains(got, drained) {
						t.Errorf("log of a start whose database refuses the spool:\n%s\nwant %q and not yet %q", got, left, drained)
					}
					w.out.Down.Store(false)
					time.Sleep(2 * time.Second) // the replay ticks
					synctest.Wait()
				}
				got := logs.String()
				i, j := strings.Index(got, left), strings.Index(got, drained)
				if i < 0 || j < i {
					t.Errorf("log of the start:\n%s\nwant %q, then %q", got, left, drained)
				}
				if tr, err := w.store.Transcript(context.Background(), "s1"); err != nil || len(tr) != 2 {
					t.Errorf("transcript of s1 after the replay: %d rows, %v; want the 2 spooled messages", len(tr), err)
				}
			})
		})
	}
}
