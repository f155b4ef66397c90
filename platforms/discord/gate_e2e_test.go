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

// TestBotRoleMentionIsAMention: a mention of the role Discord makes for the bot in a guild
// (managed, tags.bot_id the bot's id; offered next to the bot when a user types @) is a mention
// of the bot: the message is answered without the role's mention in its text, and a bare one
// gets the hint. Before, it counted as none, and where the bot answers only when mentioned the
// message was ignored. A mention of any other role is still none, and so is the bot's role of
// another guild, made while the bot is connected (GUILD_ROLE_CREATE).
func TestBotRoleMentionIsAMention(t *testing.T) {
	const botRole, otherRole = "500000000000000001", "500000000000000002"
	const guild2, channel2, botRole2 = "100000000000000002", "200000000000000002", "500000000000000003"
	w := newWorld(t, echoAgent, nil)
	w.srv.AddRole(guildID, discordtest.Role{ID: botRole, Name: "agentgate", BotID: w.srv.BotID()})
	w.srv.AddRole(guildID, discordtest.Role{ID: otherRole, Name: "helpers"})
	w.srv.AddGuild(guild2, "guild 2")
	w.srv.AddChannel(discordtest.Channel{ID: channel2, GuildID: guild2, Type: discordgo.ChannelTypeGuildText, Name: "general"})
	w.start(t)
	w.srv.WaitReady(t)
	w.srv.AddRole(guild2, discordtest.Role{ID: botRole2, Name: "agentgate", BotID: w.srv.BotID()})

	other := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "anyone?", MentionRoles: []string{otherRole}})
	// Typed out by hand: Discord lists no role of another guild in mention_roles.
	elsewhere := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "<@&" + botRole2 + "> in the wrong guild"})
	asked := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "what time is it?", MentionRoles: []string{botRole}})
	if reply := w.replyTo(t, channelID, asked.ID); reply.Content != "echo: what time is it?" {
		t.Errorf("a mention of the bot's role was answered %q, want the echo without the mention", reply.Content)
	}
	bare := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, MentionRoles: []string{botRole}})
	if hint := w.replyTo(t, channelID, bare.ID); !strings.Contains(hint.Content, "without a message") {
		t.Errorf("a bare mention of the bot's role was answered %q, want the hint", hint.Content)
	}
	asked2 := w.srv.Post(discordtest.UserMessage{ChannelID: channel2, Author: alice, Content: "and here?", MentionRoles: []string{botRole2}})
	if reply := w.replyTo(t, channel2, asked2.ID); reply.Content != "echo: and here?" {
		t.Errorf("a mention of the bot's role made while connected was answered %q, want the echo", reply.Content)
	}
	// Handlers run in gateway order: the messages before the answered ones were handled.
	for _, id := range []string{other.ID, elsewhere.ID} {
		if _, ok := w.stored(t, channelID, id); ok {
			t.Errorf("message %s, which mentions another role, was taken", id)
		}
	}
	if n := len(w.srv.Sent(channelID)); n != 2 {
		t.Errorf("bot posted %d messages in the channel, want 2 (the answer, the hint): %q", n, contents(w.srv.Sent(channelID)))
	}
}
