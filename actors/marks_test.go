package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/platformtest"
	"github.com/asynkron/protoactor-go/actor"
)

// heldWrite is a write the test's persistence actor received and has not answered.
type heldWrite struct {
	w    *persistence.Write
	from *actor.PID
}

// One mark write takes the marks of every reply the largest allowed transaction can carry.
func TestMarksCoverTheLargestBatch(t *testing.T) {
	if maxMarks < config.MaxBatchLimit {
		t.Errorf("maxMarks = %d, below config.MaxBatchLimit %d: a commit could carry more replies than one mark write takes", maxMarks, config.MaxBatchLimit)
	}
}

// TestMarksKeepPaceWithSends: the delivery marks of every send that finished while a mark write
// was in flight go in the next mark write, however many they are up to the persistence actor's
// largest transaction. (With at most 256 marks a write, a platform that sent more replies per
// commit than that fell further behind with every commit, and its backlog grew for as long as
// the load lasted.)
func TestMarksKeepPaceWithSends(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		system, p, fake, writes := heldMarksWorld(t)

		const replies = 1500
		for i := range replies {
			system.Root.Send(p, &SendOutbound{Out: &platforms.Outbound{SessionKey: fmt.Sprintf("fake:dm:%d", i), Seq: 1, Text: "hi"}})
		}
		first := <-writes // in flight, unanswered, while the other sends finish
		synctest.Wait()
		if n := len(fake.Sent()); n != replies {
			t.Fatalf("%d replies sent, want %d", n, replies)
		}
		system.Root.Send(first.from, &persistence.WriteResult{ID: first.w.ID})
		second := <-writes
		if got, want := len(first.w.Ops)+len(second.w.Ops), replies; got != want {
			t.Errorf("the first two mark writes hold %d + %d marks, want all %d", len(first.w.Ops), len(second.w.Ops), want)
		}
		system.Root.Send(second.from, &persistence.WriteResult{ID: second.w.ID})
		synctest.Wait()
		select {
		case w := <-writes:
			t.Errorf("a third mark write of %d marks, want none", len(w.w.Ops))
		default:
		}
	})
}

// TestMarksRefusedAsUnavailableAreWrittenLater: a mark write the store refuses because it cannot
// be written (the database and the spool failing) is written again once the store may take it,
// so the reply it marks is not sent again at the next start. Before, it was dropped (found by
// TestOutageHunt as an outbox entry delivered but still marked pending).
func TestMarksRefusedAsUnavailableAreWrittenLater(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		system, p, _, writes := heldMarksWorld(t)

		system.Root.Send(p, &SendOutbound{Out: &platforms.Outbound{SessionKey: "fake:dm:1", Seq: 1, Text: "hi"}})
		first := <-writes
		system.Root.Send(first.from, &persistence.WriteResult{ID: first.w.ID,
			Err: fmt.Errorf("%w: spool failed too (test)", persistence.ErrUnavailable)})
		select {
		case again := <-writes:
			if len(again.w.Ops) != len(first.w.Ops) {
				t.Errorf("the marks written again: %d ops, want the %d refused", len(again.w.Ops), len(first.w.Ops))
			}
		case <-time.After(time.Minute):
			t.Error("the delivery mark refused as unavailable was not written again within a minute")
		}
	})
}

// heldMarksWorld starts a platform actor on fake whose persistence actor only hands each write
// it gets to writes, to be answered by the test. Call it inside synctest.Test: the world stops
// when the test ends.
func heldMarksWorld(t *testing.T) (system *actor.ActorSystem, p *actor.PID, fake *platformtest.Fake, writes chan heldWrite) {
	t.Helper()
	return heldMarksWorldLog(t, nil)
}

// heldMarksWorldLog is heldMarksWorld whose platform actor logs to log (nil: nowhere).
func heldMarksWorldLog(t *testing.T, log *slog.Logger) (system *actor.ActorSystem, p *actor.PID, fake *platformtest.Fake, writes chan heldWrite) {
	t.Helper()
	system, quiet := quietSystem(t)
	if log != nil {
		quiet = log
	}
	t.Cleanup(system.Shutdown)
	writes = make(chan heldWrite, 16)
	persist := system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if w, ok := c.Message().(*persistence.Write); ok {
			writes <- heldWrite{w: w, from: c.Sender()}
		}
	}))
	fake = platformtest.NewFake("fake")
	d := &Deps{Ctx: t.Context(), Persist: persist, Log: quiet, Metrics: metrics.New("fake")}
	p = system.Root.Spawn(NewPlatform(d, fake, &PlatformHealth{}))
	t.Cleanup(func() { system.Root.Stop(p) })
	return system, p, fake, writes
}

// TestFailedMarkNamesItsReply: a delivery mark the store refuses for good (not as unavailable)
// is not written again, so its reply is sent again when its session next loads; the line says
// so and names the reply (session, seq), which it did not before.
func TestFailedMarkNamesItsReply(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testutil.Buffer
		system, p, _, writes := heldMarksWorldLog(t, slog.New(slog.NewTextHandler(&logs, nil)))

		system.Root.Send(p, &SendOutbound{Out: &platforms.Outbound{SessionKey: "fake:dm:1", Seq: 7, Text: "hi"}})
		first := <-writes
		system.Root.Send(first.from, &persistence.WriteResult{ID: first.w.ID, Err: errors.New("constraint failed (test)")})
		synctest.Wait()
		got := logs.String()
		for _, want := range []string{"record a delivery mark; not tried again", "session=fake:dm:1", "seq=7", "err=\"constraint failed (test)\""} {
			if !strings.Contains(got, want) {
				t.Errorf("log lacks %q:\n%s", want, got)
			}
		}
	})
}

// TestUnacknowledgedMarksAreLoggedOnceAMinute: a mark write that gets no answer (a database that
// hangs) is sent again every resendAfter, and says so at once, then at most once a minute with
// the resends held back in between (repeats); once a write is answered, the resends held back
// since the last line are reported, and the next write that goes unanswered says so at once
// again, alone. Before, it warned at every resend, each 5 s, for as long as the database hung;
// and then the resends held back were counted in the next outage's first line, or never.
func TestUnacknowledgedMarksAreLoggedOnceAMinute(t *testing.T) {
	const unacked = `level=WARN msg="delivery marks not acknowledged; sending them again"`
	synctest.Test(t, func(t *testing.T) {
		var logs testutil.Buffer
		system, p, _, writes := heldMarksWorldLog(t, slog.New(slog.NewTextHandler(&logs, nil)))

		system.Root.Send(p, &SendOutbound{Out: &platforms.Outbound{SessionKey: "fake:dm:1", Seq: 1, Text: "hi"}})
		last := <-writes
		for range 2 * int(time.Minute/resendAfter) { // two minutes of resends, none answered
			last = <-writes
		}
		synctest.Wait()
		if got := logs.String(); strings.Count(got, unacked) != 2 || !strings.Contains(got, "repeats=11") {
			t.Errorf("log of two minutes of unanswered mark writes:\n%s\nwant %q twice (once a minute), the second with repeats=11", got, unacked)
		}

		system.Root.Send(last.from, &persistence.WriteResult{ID: last.w.ID})
		system.Root.Send(p, &SendOutbound{Out: &platforms.Outbound{SessionKey: "fake:dm:1", Seq: 2, Text: "hi again"}})
		<-writes
		<-writes // its resend
		synctest.Wait()
		var lines []string
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, unacked) {
				lines = append(lines, l)
			}
		}
		// 11 or 12 held back since the second line: the resend at 1:05 is that line's own event
		// or held back, as it comes before or after the limiter's timer.
		if len(lines) != 4 || !strings.Contains(lines[2], "repeats=11 ") && !strings.Contains(lines[2], "repeats=12 ") ||
			strings.Contains(lines[3], "repeats=") {
			t.Errorf("log once a write was answered and the next went unanswered:\n%s\nwant %q a third time as the write is answered, with the resends held back (repeats), then a fourth at once, alone", logs.String(), unacked)
		}
	})
}
