package persistence_test

import (
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
)

// TestReplayThatWaitsForTheDatabaseSaysSo: a start whose spool the database still refuses logs
// at WARN that the replay waits, with the batches waiting and the database's error, once a
// minute while it lasts, the refusals held back since the last line reported as it ends (the
// spool drained), and again at once, alone, in the next outage. Before, such a replay logged
// nothing: the start's only line about the spool said it was being replayed (found by an
// operations walkthrough).
func TestReplayThatWaitsForTheDatabaseSaysSo(t *testing.T) {
	const waits = `level=WARN msg="database unavailable; the spooled writes wait and the replay tries again" batches=2 ` +
		`err="persistence: database unavailable: disk full (test)"`
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		last := spoolWorldOn(t, dir, slog.New(slog.DiscardHandler), false)
		last.write(t, 1, session("s1", "k1", t0))
		last.out.Down.Store(true)
		last.write(t, 2, userMessage("s1", 1, "m1")) // spooled, acknowledged
		last.write(t, 3, userMessage("s1", 2, "m2"))
		last.close(t)

		var logs testutil.Buffer
		w := spoolWorldOn(t, dir, slog.New(slog.NewTextHandler(&logs, nil)), true)
		defer w.close(t)
		time.Sleep(90 * time.Second) // the replay tries each second
		synctest.Wait()
		if got := logs.String(); strings.Count(got, waits) != 2 || !strings.Contains(got, "repeats=59") {
			t.Errorf("log of 90 s of a replay the database refuses:\n%s\nwant %q twice (one a minute), the second with repeats=59", got, waits)
		}

		w.out.Down.Store(false)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		w.out.Down.Store(true)
		w.write(t, 4, userMessage("s1", 3, "m3")) // a new outage
		w.write(t, 5, userMessage("s1", 4, "m4"))
		time.Sleep(2 * time.Second)
		synctest.Wait()
		got := logs.String()
		var lines []string
		for l := range strings.SplitSeq(got, "\n") {
			if strings.Contains(l, waits) {
				lines = append(lines, l)
			}
		}
		// 30 or 31 held back: the tick at 1:00 is the second line's own event (let through, the
		// window passed) or held back, as it comes before or after the limiter's timer.
		if len(lines) != 4 ||
			!strings.Contains(lines[2], "repeats=31 ") && !strings.Contains(lines[2], "repeats=30 ") ||
			strings.Contains(lines[3], "repeats") || strings.Index(got, lines[2]) > strings.Index(got, "spool drained") {
			t.Errorf("log after the spool drained and a new outage began:\n%s\nwant %q a third time as the spool drained, with the refusals since the last line (repeats=30 or 31), then a fourth at once, alone", got, waits)
		}
	})
}
