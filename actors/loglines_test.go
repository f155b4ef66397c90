package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// TestRefusedInboundWriteNamesTheMessage: the line of a message the store refused names the
// session and the message, so an operator can find it, and is a WRN when the store is
// unavailable, an outage the persistence actor reports once for every session. Before, it was
// an ERR per message with neither the message id nor the sender's fate.
func TestRefusedInboundWriteNamesTheMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		var logs testutil.Buffer
		agent := agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "answer"}, nil
		})
		w := newManagerWorldWrites(t, agent, func(d *Deps) {
			d.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		}, func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		w.deliver(t, "m1", "one")
		w.awaitTurnEnds(1)
		out.Down.Store(true) // no spool in this world: the write is refused as unavailable
		if r := w.deliver(t, "m2", "two"); r.ErrorCode != "unavailable" {
			t.Fatalf("m2 with the store down: %+v, want unavailable", r)
		}
		synctest.Wait()
		var line string
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, "store inbound message") {
				line = l
			}
		}
		if line == "" {
			t.Fatalf("no line for the refused message:\n%s", logs.String())
		}
		for _, want := range []string{"level=WARN", "session=" + w.key, "message_id=m2", "its sender is told to send it again", "err="} {
			if !strings.Contains(line, want) {
				t.Errorf("line %q lacks %q", line, want)
			}
		}
		out.Down.Store(false)
	})
}

// TestFailedRecoveryListingIsLoggedOnceAMinute: a store that cannot list the sessions with
// unfinished work for minutes is retried every recoverRetry, but said at the first failure
// and then once a minute, as a WRN: the retry handles it. Before, it was an ERR every 5s.
func TestFailedRecoveryListingIsLoggedOnceAMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testutil.Buffer
		echo := agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "echo"}, nil
		})
		fails := int(150 * time.Second / recoverRetry) // two and a half minutes
		newManagerWorld(t, echo, func(d *Deps) {
			d.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			d.Store = &blindRecovery{Store: d.Store, failures: fails}
		})
		time.Sleep(3 * time.Minute)
		synctest.Wait()
		lines := strings.Count(logs.String(), "list the sessions with unfinished work")
		if lines != 3 {
			t.Errorf("%d failed listings logged %d lines, want 3 (the first, then one a minute):\n%s", fails, lines, logs.String())
		}
		if strings.Contains(logs.String(), "level=ERROR") {
			t.Errorf("a retried listing logged at ERROR:\n%s", logs.String())
		}
	})
}

// TestConflictingFirstMessageIsNoWarning: in a group chat with a session per user, ub's first
// message reuses the id of ua's. The store refuses it (HTTP 409) and ub's session, whose new
// incarnation was never written, starts again from the store; that is the dedupe at work, which
// any client can repeat at will, not a write the database failed: an INF line, not the WRN the
// runbook sends an operator to the database with. ub's next message runs as usual. Before,
// each such 409 logged "WRN the session starts again from the store" with why "a message that
// reset the session", on a session that had never been reset.
func TestConflictingFirstMessageIsNoWarning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testutil.Buffer
		agent := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "ok " + req.Identity.MessageID}, nil
		})
		w := newManagerWorld(t, agent, func(d *Deps) {
			d.Config.Keys = identity.DefaultKeyOptions
			d.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		})
		ua := identity.Source{Platform: "fake", ChatType: identity.ChatGroup, ChatID: "g", UserID: "ua"}
		ub := ua
		ub.UserID = "ub"
		send := func(src identity.Source, id string) *DeliverResult {
			t.Helper()
			key := identity.Key(src, w.d.Config.Keys)
			res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: key, Msg: &Deliver{SessionKey: key,
				Source: sourceToProto(src), MessageId: id, Text: "hi", ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour).Result()
			if err != nil {
				t.Fatalf("deliver %s from %s: %v", id, src.UserID, err)
			}
			return res.(*DeliverResult)
		}
		if r := send(ua, "m1"); r.ErrorCode != "" {
			t.Fatalf("ua's m1: %+v", r)
		}
		synctest.Wait()
		for range 3 {
			if r := send(ub, "m1"); r.ErrorCode != ErrCodeConflict {
				t.Fatalf("ub's m1 = %+v, want error code %q", r, ErrCodeConflict)
			}
			synctest.Wait()
		}
		if r := send(ub, "m2"); r.ErrorCode != "" || r.Disposition != "started" {
			t.Fatalf("ub's m2 after the conflicts = %+v, want started", r)
		}
		synctest.Wait()
		var restarts int
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
				t.Errorf("a message id conflict logged %q, want no WRN or ERR", l)
			}
			if strings.Contains(l, "the session starts again from the store") {
				restarts++
				if strings.Contains(l, "reset") {
					t.Errorf("line %q says the session was reset; it was only begun", l)
				}
			}
		}
		if restarts == 0 {
			t.Errorf("no line says the session starts again from the store:\n%s", logs.String())
		}
	})
}

// TestRefusedByAFullQueueIsLogged: a message a full queue refuses (overflow: reject) is logged
// with its session and id, at most once a minute, the refusals held back reported with their
// count as the minute passes (not by the next refusal, however late); and the queue depth
// histogram sees only the messages that wait, not a depth past the cap that never was. Before,
// nothing was logged at any level, and each refusal was observed as a depth.
func TestRefusedByAFullQueueIsLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testutil.Buffer
		release := make(chan struct{})
		agent := agents.Func(func(ctx context.Context, _ *agents.Request) (*agents.Response, error) {
			<-release
			return &agents.Response{Text: "answer"}, nil
		})
		w := newManagerWorld(t, agent, func(d *Deps) {
			d.Config.QueueCap, d.Config.Overflow = 1, OverflowReject
			d.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		})
		t.Cleanup(func() { close(release) }) // before the world's cleanup stops it
		w.deliver(t, "m1", "runs")
		w.deliver(t, "m2", "waits")
		for _, id := range []string{"m3", "m4", "m5"} {
			if r := w.deliver(t, id, "refused"); r.ErrorCode != "rejected" {
				t.Fatalf("%s: %+v, want rejected", id, r)
			}
		}
		time.Sleep(2*time.Minute + time.Second) // m4 and m5 reported at 1:00, then a quiet minute
		if r := w.deliver(t, "m6", "refused"); r.ErrorCode != "rejected" {
			t.Fatalf("m6: %+v, want rejected", r)
		}
		var lines []string
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, "session queue full") {
				lines = append(lines, l)
			}
		}
		if len(lines) != 3 {
			t.Fatalf("%d lines of a full queue, want 3 (m3, m4 and m5 reported a minute later, then m6):\n%s", len(lines), logs.String())
		}
		for i, want := range [][]string{
			{"level=WARN", "session=" + w.key, "message_id=m3", "cap=1"},
			{"time=2000-01-01T00:01:00.000Z", "level=WARN", "message_id=m5", "repeats=2 "}, // m4 and m5
			{"level=WARN", "message_id=m6"},
		} {
			for _, s := range want {
				if !strings.Contains(lines[i], s) {
					t.Errorf("line %q lacks %q", lines[i], s)
				}
			}
		}
		if strings.Contains(lines[0], "repeats=") || strings.Contains(lines[2], "repeats=") {
			t.Errorf("m3's line %q or m6's %q counts repeats, want none: m4 and m5 were reported", lines[0], lines[2])
		}
		var depth dto.Metric
		if err := w.d.Metrics.QueueDepth.Write(&depth); err != nil {
			t.Fatal(err)
		}
		if n, sum := depth.GetHistogram().GetSampleCount(), depth.GetHistogram().GetSampleSum(); n != 2 || sum != 1 {
			t.Errorf("queue depth observed %d times, summing %v; want m1 at 0 and m2 at 1", n, sum)
		}
	})
}

// TestFailedTurnNamesItsMessages: the line of a failed turn names the messages it answered, so
// an operator holding a user's message id finds what became of it.
func TestFailedTurnNamesItsMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testutil.Buffer
		agent := agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
			return nil, errors.New("boom")
		})
		w := newManagerWorld(t, agent, func(d *Deps) {
			d.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		})
		w.deliver(t, "m1", "one")
		w.awaitTurnEnds(1)
		synctest.Wait()
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, "turn failed") {
				if !strings.Contains(l, "message_id=m1") {
					t.Errorf("line %q does not name message m1", l)
				}
				return
			}
		}
		t.Errorf("no line of the failed turn:\n%s", logs.String())
	})
}

// TestFailedTurnsAreLoggedOnceAMinute: an agent that fails every turn logs the first failure at
// once, in full, and then a line a minute for all sessions, which reports the failures held back
// in the minute before (repeats) as the minute passes, with no next failure needed; each held
// back is logged in full at Debug. A failure after a quiet minute is logged at once, alone. The
// lines add up to every failed turn. Before, each failed turn logged its own WRN line, without
// bound; and then (a single-key Limiter) the failures held back waited for the next line let
// through, which counted them as its repeats however much later it came.
func TestFailedTurnsAreLoggedOnceAMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testutil.Buffer
		agent := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return nil, errors.New("model endpoint down (" + req.Identity.MessageID + ")")
		})
		w := newManagerWorld(t, agent, func(d *Deps) {
			d.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		})
		other := w.src
		other.ChatID = "c2"
		failed := 0
		fail := func(src identity.Source, id string) {
			t.Helper()
			key := identity.Key(src, w.d.Config.Keys)
			res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: key, Msg: &Deliver{SessionKey: key,
				Source: sourceToProto(src), MessageId: id, Text: "hi", ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour).Result()
			if r, ok := res.(*DeliverResult); err != nil || !ok || r.ErrorCode != "" {
				t.Fatalf("deliver %s: %v, %v", id, res, err)
			}
			w.awaitTurnEnds(1)
			failed++
		}
		for i := range 10 { // two chats, at the same time
			fail(w.src, fmt.Sprintf("a%d", i))
			fail(other, fmt.Sprintf("b%d", i))
		}
		// At 1:00 the 19 held back are reported; the next window runs from then.
		time.Sleep(time.Minute + time.Second)
		for i := range 5 {
			fail(other, fmt.Sprintf("c%d", i))
		}
		// At 2:00 the five held back are reported; d0 comes after a quiet minute.
		time.Sleep(2 * time.Minute)
		fail(w.src, "d0")
		synctest.Wait()

		var warns []string
		debugs := 0
		for l := range strings.SplitSeq(logs.String(), "\n") {
			switch {
			case !strings.Contains(l, `msg="turn failed"`):
			case strings.Contains(l, "level=WARN"):
				warns = append(warns, l)
			case strings.Contains(l, "level=DEBUG"):
				debugs++
				if !strings.Contains(l, "err=") || !strings.Contains(l, "message_id=") {
					t.Errorf("a failed turn held back is logged at Debug without its detail: %q", l)
				}
			}
		}
		if len(warns) != 4 {
			t.Fatalf("%d failed turns logged %d WRN lines, want 4 (the first, then a report a minute, then the one after a quiet minute):\n%s", failed, len(warns), strings.Join(warns, "\n"))
		}
		for i, want := range [][]string{
			{"session=" + w.key, "message_id=a0", "turn=", `err="model endpoint down (a0)"`},
			{"time=2000-01-01T00:01:00.000Z", "session=" + identity.Key(other, w.d.Config.Keys), "message_id=b9", `err="model endpoint down (b9)"`, "repeats=19 ", "repeats_from=", "repeats_to="},
			{"time=2000-01-01T00:02:00.000Z", "message_id=c4", "repeats=5 "},
			{"message_id=d0"},
		} {
			for _, s := range want {
				if !strings.Contains(warns[i], s) {
					t.Errorf("line %d %q lacks %q", i+1, warns[i], s)
				}
			}
		}
		if strings.Contains(warns[0], "repeats=") || strings.Contains(warns[3], "repeats=") {
			t.Errorf("the first line %q or the one after a quiet minute %q counts repeats, want none", warns[0], warns[3])
		}
		if logged := 2 + 19 + 5; logged != failed {
			t.Errorf("the lines stand for %d failed turns, want %d", logged, failed)
		}
		if debugs+2 != failed { // the first and d0 at Warn, the others at Debug and in a report
			t.Errorf("%d WRN and %d DEBUG lines for %d failed turns, want one line each", len(warns), debugs, failed)
		}
		if n := promtestutil.ToFloat64(w.d.Metrics.TurnsTotal.WithLabelValues("error")); int(n) != failed {
			t.Errorf("agentgate_turns_total{outcome=\"error\"} = %v, want %d", n, failed)
		}
	})
}

// TestEveryTurnIsTimed: a turn cut short (a /stop, an interrupt) or lost with its crashed
// session is observed in agentgate_turn_duration_seconds as one with a result is, so that the
// histogram's count is agentgate_turns_total's sum. Before, only turns with a result were timed.
func TestEveryTurnIsTimed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			switch req.Messages[0].Text {
			case "crash":
				panic("injected")
			case "wait":
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return &agents.Response{Text: "answer"}, nil
		})
		w := newManagerWorld(t, agent, nil)
		w.deliver(t, "m1", "answered")
		w.awaitTurnEnds(1)
		w.deliver(t, "m2", "wait")
		synctest.Wait()
		w.deliver(t, "m3", "/stop")
		w.deliver(t, "m4", "crash")
		synctest.Wait()
		var turns, timed float64
		for _, outcome := range []string{"ok", "error", "cancelled", "crashed"} {
			turns += promtestutil.ToFloat64(w.d.Metrics.TurnsTotal.WithLabelValues(outcome))
		}
		var d dto.Metric
		if err := w.d.Metrics.TurnDuration.Write(&d); err != nil {
			t.Fatal(err)
		}
		timed = float64(d.GetHistogram().GetSampleCount())
		if turns < 3 || timed != turns {
			t.Errorf("%v turns timed of %v counted (an answer, a /stop, crashes), want every one", timed, turns)
		}
	})
}

// TestFailedDuplicateChecksAreLoggedOnceAMinute: a command whose duplicate check cannot read the
// store (an outage) runs, and its write, refused too, tells its client to send it again; each
// resend's check fails again. The check's line is logged at once, then once a minute for all
// sessions, counting the others (repeats), as the refused messages' lines are. Before, each
// resend logged one: 22 lines for one /new a client resent through a PostgreSQL outage of a
// few seconds (a soak of the binary).
func TestFailedDuplicateChecksAreLoggedOnceAMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs, key, end := resendNewThroughAnOutage(t, slog.LevelWarn)
		defer end()
		var lines []string
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, "check a command for a duplicate") {
				lines = append(lines, l)
			}
		}
		if len(lines) != 2 {
			t.Fatalf("%d lines of failed duplicate checks, want 2 (the first, then a minute later, counting the 3 between):\n%s", len(lines), logs.String())
		}
		for i, want := range [][]string{
			{"level=WARN", "session=" + key, "message_id=new1", "err="},
			{"message_id=new1", "repeats=3"},
		} {
			for _, s := range want {
				if !strings.Contains(lines[i], s) {
					t.Errorf("line %q lacks %q", lines[i], s)
				}
			}
		}
	})
}

// readsDown is a store whose FindInbound fails as unavailable while down is set, as a database
// in an outage answers the duplicate checks.
type readsDown struct {
	persistence.Store
	down *atomic.Bool
}

func (s *readsDown) FindInbound(ctx context.Context, platform, chatID, messageID string) (*persistence.Message, error) {
	if s.down.Load() {
		return nil, fmt.Errorf("find inbound %s: %w: connection refused (test)", messageID, persistence.ErrUnavailable)
	}
	return s.Store.FindInbound(ctx, platform, chatID, messageID)
}

// TestRefusedCommandResendsAreLoggedOnceAMinute: a command whose write is refused in an outage
// (the database and the spool both failing) tells its client to send it again, and the session
// starts again from the store; the client resends it, refused again, until the outage ends. Its
// line, "store command; …", is logged at once, then as the minute passes for that command,
// counting its resends held back (repeats, and between which times; each at DEBUG). The
// session's own "the session starts again from the store" is at DEBUG: the manager's line says
// it, with why (TestRefusedSessionPausesAreLoggedOnceAMinute). Before, each resend logged both at
// WARN: one /new a client resent through an outage of half a minute logged them 4 times each.
// Another command is logged at once (TestWritesBehindARefusedBeginningAreOutageRefusals).
func TestRefusedCommandResendsAreLoggedOnceAMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs, _, end := resendNewThroughAnOutage(t, slog.LevelDebug)
		defer end()
		synctest.Wait()
		for _, tc := range []struct {
			msg  string
			want [][]string // each line's
		}{
			{`msg="store command; its sender is told to send it again"`, [][]string{
				{"level=WARN", "message_id=new1", "command=new", "err="},
				{"level=WARN", "message_id=new1", "repeats=3", "repeats_from=00:00:10.000", "repeats_to=00:00:30.000"},
			}},
			{`msg="the session starts again from the store"`, [][]string{
				{"level=DEBUG", `why="the write of /new was refused"`},
				{"level=DEBUG", `why="the write of /new was refused"`},
				{"level=DEBUG", `why="the write of /new was refused"`},
				{"level=DEBUG", `why="the write of /new was refused"`},
				{"level=DEBUG", `why="the write of /new was refused"`},
			}},
		} {
			var lines []string
			for _, l := range linesWith(logs, tc.msg) {
				if !strings.Contains(l, "level=DEBUG") || strings.Contains(tc.want[0][0], "DEBUG") {
					lines = append(lines, l)
				}
			}
			if len(lines) != len(tc.want) {
				t.Errorf("%d lines with %s, want %d:\n%s", len(lines), tc.msg, len(tc.want), strings.Join(lines, "\n"))
				continue
			}
			for i, want := range tc.want {
				for _, s := range want {
					if !strings.Contains(lines[i], s) {
						t.Errorf("line %q lacks %q", lines[i], s)
					}
				}
			}
		}
	})
}

// TestRefusedSessionPausesAreLoggedOnceAMinute: the manager's side of a refused write, "the
// store refused a session's write; it starts again from the store", is logged at once, then as
// the minute passes for that session, counting the pauses held back (repeats, and between which
// times; each at DEBUG), with which write was refused and why (why, err). Before, each resend of
// a command refused in an outage logged one at WARN: a client resending through a long outage
// at night logged one a resend.
func TestRefusedSessionPausesAreLoggedOnceAMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs, key, end := resendNewThroughAnOutage(t, slog.LevelInfo)
		defer end()
		synctest.Wait() // the last resend's session stops, and the manager pauses it
		const msg = `msg="the store refused a session's write; it starts again from the store"`
		lines := linesWith(logs, msg)
		if len(lines) != 2 {
			t.Fatalf("%d lines with %s over 5 resends, want 2 (the first, then a minute later):\n%s", len(lines), msg, strings.Join(lines, "\n"))
		}
		for i, want := range [][]string{
			{"level=WARN", "session=" + key, "in=1s", `why="the write of /new was refused"`, `err="persistence: database unavailable`},
			{"level=WARN", "session=" + key, "in=8s", "repeats=3", "repeats_from=00:00:10.000", "repeats_to=00:00:30.000"},
		} {
			for _, s := range want {
				if !strings.Contains(lines[i], s) {
					t.Errorf("line %q lacks %q", lines[i], s)
				}
			}
		}
		if strings.Contains(lines[0], "repeats=") {
			t.Errorf("the first line %q has repeats, want none", lines[0])
		}
	})
}

// resendNewThroughAnOutage runs, in t's synctest bubble, a session that answered one message,
// then a store outage through which a client resends one /new as clients do, once the session
// has started again after each refusal (its pause: 1, 2, 4, then 8 s), so that each resend's
// duplicate check reads the store: four times 10 s apart, then once more over a minute after
// the first. It returns the log at level, the session's key, and end, which ends the outage. No
// spool in this world, as a cluster member's: each write is refused.
func resendNewThroughAnOutage(t *testing.T, level slog.Level) (logs *testutil.Buffer, key string, end func()) {
	t.Helper()
	out := &storetest.Outage{}
	logs = &testutil.Buffer{}
	w := newManagerWorldWrites(t, echo.New(), func(d *Deps) {
		d.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: level}))
		d.Store = &readsDown{Store: d.Store, down: &out.Down}
	}, out.Wrap)
	w.deliver(t, "m0", "zero")
	w.awaitTurnEnds(1)
	out.Down.Store(true)
	for range 4 {
		if r := w.deliver(t, "new1", "/new"); r.ErrorCode != "unavailable" {
			t.Fatalf("/new in the outage: %+v, want unavailable", r)
		}
		time.Sleep(10 * time.Second)
	}
	time.Sleep(25 * time.Second) // over a minute after the first
	if r := w.deliver(t, "new1", "/new"); r.ErrorCode != "unavailable" {
		t.Fatalf("/new a minute later: %+v, want unavailable", r)
	}
	return logs, w.key, func() { out.Down.Store(false) }
}

// TestRefusedPausesOfManySessionsAreFolded: in an outage of many chats, the manager's line of a
// refused write is logged at once for each session, and then, beyond logging.FoldAbove lines a
// minute, the pauses of all the sessions held back are one line a minute, which counts them
// (keys, repeats) and names a few. Before, each session had its line each minute: an outage of
// 5,000 chats logged 5,000 lines a minute.
func TestRefusedPausesOfManySessionsAreFolded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		logs := &testutil.Buffer{}
		w := newManagerWorldWrites(t, echo.New(), func(d *Deps) {
			d.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
			d.Store = &readsDown{Store: d.Store, down: &out.Down}
		}, out.Wrap)
		defer out.Down.Store(false)
		const chats = 12
		for i := range chats {
			w.deliverTo(t, fmt.Sprint("c", i), "m0", "zero")
		}
		w.awaitTurnEnds(chats)
		out.Down.Store(true)
		for range 18 { // 3 minutes: each client resends its /new every 10 s
			for i := range chats {
				w.deliverTo(t, fmt.Sprint("c", i), "new1", "/new")
			}
			time.Sleep(10 * time.Second)
		}
		synctest.Wait()
		const msg = `msg="the store refused a session's write; it starts again from the store"`
		lines := linesWith(logs, msg)
		folded := 0
		for _, l := range lines {
			if strings.Contains(l, "keys=") && strings.Contains(l, "examples=") {
				folded++
			}
		}
		// Each session's first line, FoldAbove lines of their own, then one a minute.
		if most := chats + logging.FoldAbove + 3; len(lines) > most || folded == 0 {
			t.Errorf("%d lines with %s in 3 minutes of %d sessions paused again and again, %d folded; want at most %d, with the folded ones:\n%s",
				len(lines), msg, chats, folded, most, strings.Join(lines, "\n"))
		}
	})
}

// TestHeldRefusalLinesAreReportedAtTheStop: the refusals an outage held back within the minute
// of their lines (the manager's pause of the session, the command's own line) are reported when
// the session manager stops, with their count (repeats), as its window would have reported
// them. Before, only the limiter's timer reported them, up to a minute after a stop that a
// daemon's exit follows at once: a daemon stopped in an outage (as an operator does, to restart
// it) left the refusals of its last minute at DEBUG alone.
func TestHeldRefusalLinesAreReportedAtTheStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		logs := &testutil.Buffer{}
		w := newManagerWorldWrites(t, echo.New(), func(d *Deps) {
			d.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
			d.Store = &readsDown{Store: d.Store, down: &out.Down}
		}, out.Wrap)
		defer out.Down.Store(false)
		w.deliver(t, "m0", "zero")
		w.awaitTurnEnds(1)
		out.Down.Store(true)
		for range 2 {
			if r := w.deliver(t, "new1", "/new"); r.ErrorCode != "unavailable" {
				t.Fatalf("/new in the outage: %+v, want unavailable", r)
			}
			time.Sleep(10 * time.Second)
		}
		synctest.Wait()
		w.stop() // 20 s after the first refusal: within its line's minute
		synctest.Wait()
		for _, msg := range []string{
			`msg="the store refused a session's write; it starts again from the store"`,
			`msg="store command; its sender is told to send it again"`,
		} {
			lines := linesWith(logs, msg)
			if len(lines) != 2 || strings.Contains(lines[0], "repeats=") || !strings.Contains(lines[1], "repeats=1 ") {
				t.Errorf("%d lines with %s after 2 refusals and a stop, want 2: the first, then the second's, reported at the stop (repeats=1):\n%s",
					len(lines), msg, strings.Join(lines, "\n"))
			}
		}
	})
}
