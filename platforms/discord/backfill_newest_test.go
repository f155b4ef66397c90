package discord_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// cutWarning is the start of the warning a backfill logs when its page cap stopped a read short.
const cutWarning = "discord backfill: more was said in some channels than is read back"

// restartAfterChatter answers a mention of alice's in the channel, has bob chatter there n
// times without a mention (the bot sees it live, and does not take it), and stops the daemon.
// It returns alice's message.
func restartAfterChatter(t *testing.T, w *world, n int) (asked string) {
	t.Helper()
	m := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "hi", MentionBot: true})
	w.replyTo(t, channelID, m.ID)
	for i := range n {
		w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: fmt.Sprint("chatter ", i)})
	}
	w.stop(t)
	return m.ID
}

// TestRestartBackfillInABusyChannelReadsTheNewest: after a restart, a channel's history is read
// back from the newest message the store took there; in a channel that needs a mention, the
// chatter after it that the bot saw live (and did not take) can fill more than the pages a
// backfill reads. The pages read are the newest, which hold what was said while the daemon
// was down: it is answered, in order, and the warning names the channel whose older messages
// were not read. Before, the pages were read oldest first, went on the chatter, and the
// mention said while down was never answered, without a word.
func TestRestartBackfillInABusyChannelReadsTheNewest(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	asked := restartAfterChatter(t, w, 520)
	down1 := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "said while down", MentionBot: true})
	down2 := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "and again", MentionBot: true})
	reads := w.srv.Requests("GET", "/channels/"+channelID+"/messages")
	w.start(t)
	w.srv.WaitReady(t)
	after := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "after", MentionBot: true})

	w.replyTo(t, channelID, down2.ID)
	w.replyTo(t, channelID, after.ID) // live messages wait for the backfill: it is done
	if got, want := w.answered(channelID), []string{asked, down1.ID, down2.ID, after.ID}; !slices.Equal(got, want) {
		t.Errorf("channel replies answer %v, want %v (each once, in order)", got, want)
	}
	if n := w.srv.Requests("GET", "/channels/"+channelID+"/messages") - reads; n != 5 {
		t.Errorf("the start read %d pages of the channel's history, want 5 (500 messages of users: backfillSaid)", n)
	}
	var warning string
	for line := range strings.Lines(w.log.String()) {
		if strings.Contains(line, cutWarning) {
			warning = line
		}
	}
	if !strings.Contains(warning, "level=WARN") || !strings.Contains(warning, "channel_ids=["+channelID+"]") || !strings.Contains(warning, "read_back=500") {
		t.Errorf("warning about the channel's unread older messages = %q, want a WARN naming channel %s and the 500 read back", warning, channelID)
	}
}

// TestRestartBackfillReadsSeveralPagesOldestFirst: a span of history longer than a page but
// within the cap is read back whole, newest page first, and answered oldest first, without a
// warning.
func TestRestartBackfillReadsSeveralPagesOldestFirst(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	asked := restartAfterChatter(t, w, 120)
	down1 := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "first while down", MentionBot: true})
	for i := range 130 {
		w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: fmt.Sprint("down chatter ", i)})
	}
	down2 := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "last while down", MentionBot: true})
	reads := w.srv.Requests("GET", "/channels/"+channelID+"/messages")
	w.start(t)
	w.srv.WaitReady(t)
	after := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "after", MentionBot: true})

	w.replyTo(t, channelID, after.ID) // live messages wait for the backfill: it is done
	if got, want := w.answered(channelID), []string{asked, down1.ID, down2.ID, after.ID}; !slices.Equal(got, want) {
		t.Errorf("channel replies answer %v, want %v (each once, in order)", got, want)
	}
	// 1 reply + 120 + 1 + 130 + 1 messages after the mark: three pages.
	if n := w.srv.Requests("GET", "/channels/"+channelID+"/messages") - reads; n != 3 {
		t.Errorf("the start read %d pages of the channel's history, want 3", n)
	}
	if strings.Contains(w.log.String(), cutWarning) {
		t.Errorf("a backfill that read all it had to warned that it did not:\n%s", w.log.String())
	}
}

// TestRestartAfterTheBotsRepliesIsNoWarning: after a restart the mark a channel is read back from
// is the newest message the store took there, a user's; the bot's replies after it (to a
// backlog read back at the start before, one each, hundreds) are read, but do not count towards
// what a backfill reads: the read reaches the mark, and nothing is said to be left unanswered.
// Before, they filled its pages, and every restart after a backlog warned of messages left
// unanswered when there were none.
func TestRestartAfterTheBotsRepliesIsNoWarning(t *testing.T) {
	w := startWorld(t, echoAgent, func(c *config.Config) { c.Platforms.Discord.FreeResponseChannels = []string{channelID} })
	first := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "hi"})
	w.replyTo(t, channelID, first.ID)
	w.stop(t)
	// The bot's replies, as the start after a backlog posts them (five pages' worth).
	bot := discordtest.User{ID: w.srv.BotID(), Username: "agentgate", Bot: true}
	for i := range 520 {
		w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bot, Content: fmt.Sprint("echo: backlog ", i)})
	}
	reads := w.srv.Requests("GET", "/channels/"+channelID+"/messages")
	w.start(t)
	w.srv.WaitReady(t)
	after := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "after"})
	w.replyTo(t, channelID, after.ID) // live messages wait for the backfill: it is done
	if strings.Contains(w.log.String(), cutWarning) {
		t.Errorf("a restart with nothing new said warned of messages left unread:\n%s", w.log.String())
	}
	if got, want := w.answered(channelID), []string{first.ID, after.ID}; !slices.Equal(got, want) {
		t.Errorf("channel replies answer %v, want %v (each once)", got, want)
	}
	// 1 reply + 520 of the bot's after the mark, and the mark: six pages.
	if n := w.srv.Requests("GET", "/channels/"+channelID+"/messages") - reads; n != 6 {
		t.Errorf("the start read %d pages of the channel's history, want 6", n)
	}
}
