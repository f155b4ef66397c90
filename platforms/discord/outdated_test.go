package discord

import (
	"fmt"
	"strings"
	"testing"

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
