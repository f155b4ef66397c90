package discord_test

import (
	"strings"
	"testing"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestUnknownChannelRefusalOnlyForWhomTheBotAnswers: a message in a channel the platform must
// look up over REST (an archived thread) while that lookup fails is answered "I could not look
// up this channel" only when the bot would have answered it: not another bot (which may answer
// back, and a loop of two bots starts), not a user outside the allowlist, and not a message
// without a mention. Handlers run in gateway order, so once a later DM is answered the thread's
// messages have been handled.
func TestUnknownChannelRefusalOnlyForWhomTheBotAnswers(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	const threadID = "210000000000000001"
	w.srv.AddChannel(discordtest.Channel{ID: threadID, GuildID: guildID, Type: discordgo.ChannelTypeGuildPublicThread, ParentID: channelID, OwnerID: alice.ID, Name: "topic"})
	w.srv.ArchiveThread(threadID) // out of the state: its messages are looked up over REST
	otherBot := discordtest.User{ID: "400000000000000009", Username: "otherbot", Bot: true}

	w.srv.FailNext("GET", "/channels/"+threadID, 500, 3)
	w.srv.Post(discordtest.UserMessage{ChannelID: threadID, Author: otherBot, Content: "beep", MentionBot: true})
	w.srv.Post(discordtest.UserMessage{ChannelID: threadID, Author: bob, Content: "chatter without a mention"})
	mentioned := w.srv.Post(discordtest.UserMessage{ChannelID: threadID, Author: alice, Content: "are you there?", MentionBot: true})
	dm := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "and here?"})
	w.replyTo(t, dmID, dm.ID)

	sent := w.srv.Sent(threadID)
	if len(sent) != 1 || sent[0].MessageReference == nil || sent[0].MessageReference.MessageID != mentioned.ID ||
		!strings.Contains(sent[0].Content, "could not look up this channel") {
		t.Errorf("bot posted %q in the thread, want only the refusal for %s's mention", contents(sent), alice.Username)
	}
}
