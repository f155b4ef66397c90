package discord

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestMessageAnOlderMemberCannotTakeIsAskedForAgainLater: a message the cluster member holding
// its session did not know (platforms.OutdatedMemberError: that member runs an older
// agentgate, during a rolling upgrade; nothing was stored) is not taken, and its sender is told
// that the bot is being upgraded and to send it again in a few minutes, replying to it; the
// WRN line names the member and says to upgrade it. The notice is one that asks to send it
// again: the next start's backfill does not take the message (repliedTo). Before, its sender
// was told that the message could not be stored and to send it again at once, which met the
// same older member until the upgrade was over.
func TestMessageAnOlderMemberCannotTakeIsAskedForAgainLater(t *testing.T) {
	const dm = "300000000000000001"
	h := newHeldDelivery()
	outdated := &platforms.OutdatedMemberError{Address: "10.0.0.7:6340", Node: "b/run1", Version: "v1.8.0 go1.26.8", Request: "Forward field 11"}
	h.refuse(fmt.Errorf("deliver to agent:main:discord:dm:%s: request *actors.Deliver to agent:main:discord:dm:%s: %w", dm, dm, outdated))
	srv, _, log, _ := intakeWorld(t, h)
	m := srv.Post(discordtest.UserMessage{ChannelID: dm, Author: discordtest.User{ID: "400000000000000001", Username: "alice"}, Content: "hello"})

	sent := srv.WaitSent(t, dm, 1)
	if n := sent[0]; n.Content != upgradingNotice || n.MessageReference == nil || n.MessageReference.MessageID != m.ID {
		t.Errorf("the bot posted %q (reference %+v), want %q replying to %s", n.Content, n.MessageReference, upgradingNotice, m.ID)
	}
	if _, asked := repliedTo(sent, sent[0].Author.ID); !asked[m.ID] {
		t.Errorf("the notice %q does not ask to send the message again for the next start's backfill (notTakenNotices)", sent[0].Content)
	}
	var line string
	for l := range strings.Lines(log.String()) {
		if strings.Contains(l, "discord message not taken") {
			line = l
		}
	}
	for _, want := range []string{"level=WARN", "message_id=" + m.ID, "10.0.0.7:6340", "runs an older agentgate", "upgrade it"} {
		if !strings.Contains(line, want) {
			t.Errorf("line %q, want %q in it; log:\n%s", line, want, log.String())
		}
	}
}

// notTakenLines returns the "discord message not taken" lines of log.
func notTakenLines(log string) []string {
	var lines []string
	for l := range strings.Lines(log) {
		if strings.Contains(l, `msg="discord message not taken"`) {
			lines = append(lines, l)
		}
	}
	return lines
}

// TestRefusalsOfAnOlderMemberAreLoggedOnceAMinute: through a rolling upgrade, an older member
// refuses every message of its chats (platforms.OutdatedMemberError). Its first refusal is
// logged at once, then those within a minute are held back (at Debug) and counted in one line
// when the minute has passed (repeats=4, with the last one's message_id); another older
// member, and a refusal of another kind (the database unavailable), get a line of their own at
// once, and so does an error of no kind the runtime names (an answer it did not expect) after
// the database's; before, it was held back behind it. Before, each refused message logged its
// own WRN line.
func TestRefusalsOfAnOlderMemberAreLoggedOnceAMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log testutil.Buffer
		p := &Platform{log: slog.New(slog.NewTextHandler(&log, nil))}
		older := func(addr string) error {
			return fmt.Errorf("deliver to agent:main:discord:dm:1: %w",
				&platforms.OutdatedMemberError{Address: addr, Node: "b/run1", Version: "v1.8.0 go1.26.8", Request: "Forward field 11"})
		}
		msg := func(id string) *discordgo.Message {
			return &discordgo.Message{ChannelID: "300000000000000001", ID: id}
		}
		for i := range 5 {
			p.logNotTaken(msg(fmt.Sprint(500+i)), older("10.0.0.7:6340"))
			time.Sleep(time.Second)
		}
		p.logNotTaken(msg("600"), older("10.0.0.8:6340"))
		p.logNotTaken(msg("700"), fmt.Errorf("deliver: %w", platforms.ErrUnavailable))
		p.logNotTaken(msg("800"), fmt.Errorf("deliver to agent:main:discord:dm:1: unexpected answer %T", &discordgo.Message{}))
		lines := notTakenLines(log.String())
		if len(lines) != 4 {
			t.Fatalf("lines within the minute = %q, want 4: the first of 10.0.0.7's, 10.0.0.8's, the database's and an unexpected error's", lines)
		}
		for i, want := range []string{"message_id=500 ", "message_id=600 ", "message_id=700 ", "message_id=800 "} {
			if !strings.Contains(lines[i], want) || strings.Contains(lines[i], "repeats") {
				t.Errorf("line %d = %q, want %q in it, and no repeats", i, lines[i], want)
			}
		}
		if !strings.Contains(lines[0], "10.0.0.7:6340") || !strings.Contains(lines[1], "10.0.0.8:6340") {
			t.Errorf("lines %q do not name the older members", lines[:2])
		}
		time.Sleep(logging.LimitEvery)
		synctest.Wait()
		lines = notTakenLines(log.String())
		if len(lines) != 5 {
			t.Fatalf("lines once the minute has passed = %q, want 5", lines)
		}
		for _, want := range []string{"level=WARN", "message_id=504 ", "10.0.0.7:6340", "repeats=4 "} {
			if !strings.Contains(lines[4], want) {
				t.Errorf("the minute's report = %q, want %q in it", lines[4], want)
			}
		}
		p.notTakenLines.Flush()
	})
}

// TestRefusedMessagesAreCountedInOneLineAtTheStop: four messages an older member refuses each
// get their notice, but one WRN line while the platform runs; the three held back are counted
// in one line as it stops (repeats=3), not left for a report the exiting process never logs.
// Before, each logged its own line.
func TestRefusedMessagesAreCountedInOneLineAtTheStop(t *testing.T) {
	const dm = "300000000000000001"
	h := newHeldDelivery()
	outdated := &platforms.OutdatedMemberError{Address: "10.0.0.7:6340", Node: "b/run1", Version: "v1.8.0 go1.26.8", Request: "Forward field 11"}
	h.refuse(fmt.Errorf("deliver to agent:main:discord:dm:%s: %w", dm, outdated))
	srv, _, log, stop := intakeWorld(t, h)
	var last *discordgo.Message
	for i := range 4 {
		last = srv.Post(discordtest.UserMessage{ChannelID: dm, Author: discordtest.User{ID: "400000000000000001", Username: "alice"}, Content: fmt.Sprint("hello ", i)})
	}
	for _, n := range srv.WaitSent(t, dm, 4) {
		if n.Content != upgradingNotice {
			t.Errorf("the bot posted %q, want %q", n.Content, upgradingNotice)
		}
	}
	if lines := notTakenLines(log.String()); len(lines) != 1 {
		t.Errorf("lines of four refusals = %q, want 1", lines)
	}
	stop()
	lines := notTakenLines(log.String())
	if len(lines) != 2 {
		t.Fatalf("lines after the stop = %q, want 2", lines)
	}
	for _, want := range []string{"level=WARN", "message_id=" + last.ID, "repeats=3 "} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("the stop's report = %q, want %q in it", lines[1], want)
		}
	}
}
