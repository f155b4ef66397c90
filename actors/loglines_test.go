package actors

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
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
