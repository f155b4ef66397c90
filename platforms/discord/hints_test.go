package discord_test

import (
	"strings"
	"testing"

	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestHintIsNotRepeatedAfterARestart: a message with nothing to read (a DM sticker, a bare
// mention) gets a hint and is not stored, so the next start's backfill, reading the chat after
// the newest message the store took, finds it again. It sees the bot's hint that replies to it
// in the history it reads, and does not hint again. Before, every restart within
// backfill_window posted the same hint once more.
func TestHintIsNotRepeatedAfterARestart(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	w.answeredInBoth(t) // the store took a message from each chat: a restart reads them back
	sticker := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice})
	bare := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, MentionBot: true})
	hinted := map[string]string{sticker.ID: dmID, bare.ID: channelID}
	for id, ch := range hinted {
		w.replyTo(t, ch, id)
	}

	w.stop(t)
	w.start(t)
	w.srv.WaitReady(t)
	after := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "after"})
	w.replyTo(t, dmID, after.ID)
	after = w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "after", MentionBot: true})
	w.replyTo(t, channelID, after.ID)
	// Live messages wait for the backfill, but an "after" may be read by the backfill itself
	// (posted before the client's READY was handled) and answered before it ends: its line ends it.
	w.srv.WaitFor(t, "the restart's backfill to end", func() bool { return strings.Contains(w.log.String(), "read what was missed") })
	for id, ch := range hinted {
		var told []string
		for _, m := range w.srv.Sent(ch) {
			if m.MessageReference != nil && m.MessageReference.MessageID == id {
				told = append(told, m.Content)
			}
		}
		if len(told) != 1 {
			t.Errorf("message %s in %s got %d replies, want 1 (a hint, once): %q", id, ch, len(told), told)
		}
	}
}
