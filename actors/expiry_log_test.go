package actors

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil"
)

// TestAutomaticResetsAreOneInfoLineAScan: the timers' scan resets many sessions at once (a
// daily reset, an idle one after a long stop). Each session's reset is a Debug line that names
// its key, and Info gets the scan's one line with the counts by reason. Before, each was an
// Info line: a daily reset of thousands of chats flooded the log in one minute.
func TestAutomaticResetsAreOneInfoLineAScan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testutil.Buffer
		agent := agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "ok"}, nil
		})
		// DMs reset after an hour idle, groups at 04:00.
		idle := ResetPolicy{Mode: ResetIdle, Idle: time.Hour, Location: time.UTC}
		daily := ResetPolicy{Mode: ResetDaily, AtHour: 4, Location: time.UTC}
		w := newManagerWorld(t, agent, func(d *Deps) {
			d.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			d.Config.Keys = identity.DefaultKeyOptions
			d.Config.ResetFor = func(_, chatType string) ResetPolicy {
				if chatType == identity.ChatGroup {
					return daily
				}
				return idle
			}
			d.Config.ResetPolicies = []ResetPolicy{idle, daily}
		})
		var keys []string
		send := func(chatType, chat, id string) {
			t.Helper()
			src := identity.Source{Platform: "fake", ChatType: chatType, ChatID: chat, UserID: "u"}
			key := identity.Key(src, w.d.Config.Keys)
			res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: key, Msg: &Deliver{SessionKey: key,
				Source: sourceToProto(src), MessageId: id, Text: "hi", ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour).Result()
			if err != nil || res.(*DeliverResult).ErrorCode != "" {
				t.Fatalf("deliver %s to %s: %v, %v", id, key, res, err)
			}
			keys = append(keys, key)
		}
		for i := range 3 {
			send(identity.ChatDM, fmt.Sprint("d", i), fmt.Sprint("m", i))
		}
		for i := range 2 {
			send(identity.ChatGroup, fmt.Sprint("g", i), fmt.Sprint("n", i))
		}
		synctest.Wait()
		time.Sleep(5 * time.Hour) // past 04:00 (synctest's clock starts at midnight UTC)
		timers := w.system.Root.Spawn(NewTimers(w.d, NewLocalRouter(w.system.Root, w.manager), time.Minute))
		defer func() {
			if err := w.system.Root.StopFuture(timers).Wait(); err != nil {
				t.Error(err)
			}
		}()
		synctest.Wait() // its first scan: every session is due

		lines := func(level, msg string) []string {
			var found []string
			for l := range strings.SplitSeq(logs.String(), "\n") {
				if strings.Contains(l, "level="+level) && strings.Contains(l, `msg="`+msg+`"`) {
					found = append(found, l)
				}
			}
			return found
		}
		const summary = "sessions due for reset"
		if got := lines("INFO", "session reset"); len(got) > 0 {
			t.Errorf("%d sessions reset, %d of them logged at INFO, want none (one line a scan):\n%s", len(keys), len(got), strings.Join(got, "\n"))
		}
		debug := strings.Join(lines("DEBUG", "session reset"), "\n")
		for _, key := range keys {
			if !strings.Contains(debug, "session="+key+" ") {
				t.Errorf("no DEBUG line of the reset of %s:\n%s", key, debug)
			}
		}
		got := lines("INFO", summary)
		if want := "idle=3 daily=2"; len(got) != 1 || !strings.HasSuffix(got[0], want) {
			t.Fatalf("scan lines after 3 idle and 2 daily resets: %q, want one ending in %q", got, want)
		}

		// The next resets make the next summary: a DM that becomes idle again.
		send(identity.ChatDM, "d0", "m10")
		time.Sleep(61 * time.Minute) // an hour idle, then the next scan
		synctest.Wait()
		if got := lines("INFO", summary); len(got) != 2 || !strings.HasSuffix(got[1], "idle=1 daily=0") {
			t.Errorf("scan lines after one more idle reset: %q, want a second one ending in idle=1 daily=0", got)
		}
	})
}

// TestBusyDueSessionIsLoggedOnceNotEveryScan: a session due for its reset while a turn runs
// waits for the turn; the scans meanwhile tell it again, but the scan's line counts it only
// the first time. Before, each scan (every check_every) logged "sessions due for reset idle=1"
// again for as long as the turn ran (found by a walkthrough: 13 lines in 13 s).
func TestBusyDueSessionIsLoggedOnceNotEveryScan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testutil.Buffer
		release := make(chan struct{})
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return &agents.Response{Text: "ok"}, nil
		})
		idle := ResetPolicy{Mode: ResetIdle, Idle: time.Hour, Location: time.UTC}
		w := newManagerWorld(t, agent, func(d *Deps) {
			d.Log = slog.New(slog.NewTextHandler(&logs, nil))
			d.Config.Keys = identity.DefaultKeyOptions
			d.Config.ResetFor = func(string, string) ResetPolicy { return idle }
			d.Config.ResetPolicies = []ResetPolicy{idle}
		})
		src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "busy", UserID: "u"}
		key := identity.Key(src, w.d.Config.Keys)
		res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: key, Msg: &Deliver{SessionKey: key,
			Source: sourceToProto(src), MessageId: "m1", Text: "hi", ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour).Result()
		if err != nil || res.(*DeliverResult).ErrorCode != "" {
			t.Fatalf("deliver: %v, %v", res, err)
		}
		timers := w.system.Root.Spawn(NewTimers(w.d, NewLocalRouter(w.system.Root, w.manager), time.Minute))
		defer func() {
			if err := w.system.Root.StopFuture(timers).Wait(); err != nil {
				t.Error(err)
			}
		}()
		time.Sleep(65 * time.Minute) // due at 60 min, its turn still running: 5 scans find it due
		synctest.Wait()
		if n := strings.Count(logs.String(), `msg="sessions due for reset"`); n != 1 {
			t.Errorf("5 scans of a busy due session logged %d lines, want 1:\n%s", n, logs.String())
		}
		close(release)
		synctest.Wait()
	})
}
