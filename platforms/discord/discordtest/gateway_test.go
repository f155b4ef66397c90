package discordtest_test

import (
	"errors"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"
	"github.com/gorilla/websocket"

	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

func TestOpenIdentifies(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	c := mustOpen(t, srv, allIntents, func(dg *discordgo.Session) {
		dg.ShardID, dg.ShardCount = 1, 2
	})

	if got := srv.Identifies(); got != 1 {
		t.Errorf("Identifies() = %d, want 1", got)
	}
	if got := srv.Intents(); got != allIntents {
		t.Errorf("Intents() = %d, want %d", got, allIntents)
	}
	if got, want := srv.Shard(), [2]int{1, 2}; got != want {
		t.Errorf("Shard() = %v, want %v", got, want)
	}
	if !srv.Ready() {
		t.Error("Ready() = false after Open, want true")
	}
	if got := c.State.User.ID; got != srv.BotID() {
		t.Errorf("State.User.ID = %q, want BotID %q", got, srv.BotID())
	}
	if !c.State.User.Bot {
		t.Error("State.User.Bot = false, want true")
	}

	g := mustRecv(t, c.guilds, "GUILD_CREATE")
	if g.ID != guildID || g.Name != "agentgate-test" {
		t.Errorf("GUILD_CREATE = %s %q, want %s %q", g.ID, g.Name, guildID, "agentgate-test")
	}
	ch, err := c.State.Channel(channelID)
	if err != nil {
		t.Fatalf("State.Channel(%s) = %v after GUILD_CREATE", channelID, err)
	}
	if ch.GuildID != guildID || ch.Name != "general" || ch.Type != discordgo.ChannelTypeGuildText {
		t.Errorf("State.Channel = {%s %q %d}, want {%s general 0}", ch.GuildID, ch.Name, ch.Type, guildID)
	}
	if _, err := c.State.Channel(dmID); err == nil {
		t.Error("State.Channel(DM) found; Discord does not announce DM channels to bots")
	}
}

func TestWrongTokenIsRefused(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	dg := newSession(t, srv, "Bot not-"+srv.Token())
	err := dg.Open()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != 4004 {
		t.Fatalf("Open() with a wrong token = %v, want close 4004", err)
	}
	if got := srv.Identifies(); got != 0 {
		t.Errorf("Identifies() = %d, want 0", got)
	}
}

func TestReceiveMessages(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	full := mustOpen(t, srv, allIntents)

	tests := []struct {
		name        string
		in          discordtest.UserMessage
		wantContent string
		wantGuild   string
		wantNick    string
		wantMention bool
	}{
		{
			name:        "guild",
			in:          discordtest.UserMessage{ChannelID: channelID, Author: alice, Nick: "Ally", Content: "hi"},
			wantContent: "hi", wantGuild: guildID, wantNick: "Ally",
		},
		{
			name:        "mention",
			in:          discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "hi", MentionBot: true},
			wantContent: "<@" + srv.BotID() + "> hi", wantGuild: guildID, wantMention: true,
		},
		{
			name:        "dm",
			in:          discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "psst"},
			wantContent: "psst",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			posted := srv.Post(tt.in)
			got := mustRecv(t, full.messages, "MESSAGE_CREATE")
			if got.ID != posted.ID || got.ChannelID != tt.in.ChannelID {
				t.Errorf("got message %s in %s, want %s in %s", got.ID, got.ChannelID, posted.ID, tt.in.ChannelID)
			}
			if got.Content != tt.wantContent {
				t.Errorf("Content = %q, want %q", got.Content, tt.wantContent)
			}
			if got.GuildID != tt.wantGuild {
				t.Errorf("GuildID = %q, want %q", got.GuildID, tt.wantGuild)
			}
			if (got.Member != nil) != (tt.wantGuild != "") {
				t.Errorf("Member = %+v, want one exactly in guilds", got.Member)
			}
			if got.Member != nil && got.Member.Nick != tt.wantNick {
				t.Errorf("Member.Nick = %q, want %q", got.Member.Nick, tt.wantNick)
			}
			if got.Author == nil || got.Author.ID != alice.ID || got.Author.GlobalName != "Alice" {
				t.Errorf("Author = %+v, want alice", got.Author)
			}
			mentioned := len(got.Mentions) == 1 && got.Mentions[0].ID == srv.BotID()
			if mentioned != tt.wantMention {
				t.Errorf("Mentions = %v, want the bot: %v", got.Mentions, tt.wantMention)
			}
			if got.Timestamp.IsZero() || !got.Timestamp.Equal(posted.Timestamp) {
				t.Errorf("Timestamp = %v, want %v", got.Timestamp, posted.Timestamp)
			}
		})
	}
}

// Without the privileged MESSAGE_CONTENT intent Discord blanks the content of guild
// messages that do not mention the bot.
func TestMessageContentIntent(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	c := mustOpen(t, srv, allIntents&^discordgo.IntentsMessageContent)

	tests := []struct {
		name string
		in   discordtest.UserMessage
		want string
	}{
		{"guild", discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "secret"}, ""},
		{"mention", discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "hey", MentionBot: true}, "<@" + srv.BotID() + "> hey"},
		{"dm", discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "psst"}, "psst"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			posted := srv.Post(tt.in)
			got := mustRecv(t, c.messages, "MESSAGE_CREATE")
			if got.Content != tt.want {
				t.Errorf("Content = %q, want %q", got.Content, tt.want)
			}
			if posted.Content != tt.in.Content && !tt.in.MentionBot {
				t.Errorf("Post() returned Content %q, want the unredacted %q", posted.Content, tt.in.Content)
			}
		})
	}
}

func TestSendReplyEditTyping(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	c := mustOpen(t, srv, allIntents)

	question := srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "question"})
	mustRecv(t, c.messages, "alice's MESSAGE_CREATE")

	if err := c.ChannelTyping(channelID); err != nil {
		t.Fatalf("ChannelTyping() = %v", err)
	}
	if got := srv.Typing(channelID); got != 1 {
		t.Errorf("Typing() = %d, want 1", got)
	}
	hello, err := c.ChannelMessageSend(channelID, "hello")
	if err != nil {
		t.Fatalf("ChannelMessageSend() = %v", err)
	}
	if hello.GuildID != "" {
		t.Errorf("REST message has GuildID %q; Discord only sets it on gateway events", hello.GuildID)
	}
	reply, err := c.ChannelMessageSendReply(channelID, "answer", question.Reference())
	if err != nil {
		t.Fatalf("ChannelMessageSendReply() = %v", err)
	}
	if _, err := c.ChannelMessageEdit(channelID, hello.ID, "hello, edited"); err != nil {
		t.Fatalf("ChannelMessageEdit() = %v", err)
	}

	sent := srv.WaitSent(t, channelID, 2)
	if len(sent) != 2 || sent[0].ID != hello.ID || sent[1].ID != reply.ID {
		t.Fatalf("Sent() = %v, want [hello answer]", sent)
	}
	if sent[0].Content != "hello, edited" || sent[0].EditedTimestamp == nil {
		t.Errorf("Sent()[0] = %q edited %v, want the edit applied", sent[0].Content, sent[0].EditedTimestamp)
	}
	if sent[0].Author.ID != srv.BotID() || sent[0].GuildID != guildID {
		t.Errorf("Sent()[0] author %s guild %s, want bot %s in %s", sent[0].Author.ID, sent[0].GuildID, srv.BotID(), guildID)
	}
	r := sent[1]
	if r.Type != discordgo.MessageTypeReply || r.MessageReference == nil || r.MessageReference.MessageID != question.ID {
		t.Errorf("Sent()[1] type %d reference %+v, want a reply to %s", r.Type, r.MessageReference, question.ID)
	}
	if r.ReferencedMessage == nil || r.ReferencedMessage.Content != "question" {
		t.Errorf("Sent()[1].ReferencedMessage = %+v, want alice's question", r.ReferencedMessage)
	}
	if len(r.Mentions) != 1 || r.Mentions[0].ID != alice.ID {
		t.Errorf("reply Mentions = %v, want alice (replies ping by default)", r.Mentions)
	}

	// Discord echoes the bot's own messages and edits on the gateway.
	for _, want := range []string{hello.ID, reply.ID} {
		got := mustRecv(t, c.messages, "the bot's own MESSAGE_CREATE")
		if got.ID != want || got.Author.ID != c.State.User.ID {
			t.Errorf("MESSAGE_CREATE %s by %s, want %s by the bot", got.ID, got.Author.ID, want)
		}
	}
	if u := mustRecv(t, c.updates, "MESSAGE_UPDATE"); u.ID != hello.ID || u.Content != "hello, edited" {
		t.Errorf("MESSAGE_UPDATE %s %q, want %s %q", u.ID, u.Content, hello.ID, "hello, edited")
	}

	// An empty allowed_mentions pings nobody, whatever the content says.
	quiet, err := c.ChannelMessageSendComplex(channelID, &discordgo.MessageSend{
		Content:         "@everyone <@" + alice.ID + "> <@&77>",
		AllowedMentions: &discordgo.MessageAllowedMentions{},
	})
	if err != nil {
		t.Fatalf("ChannelMessageSendComplex() = %v", err)
	}
	if len(quiet.Mentions) != 0 || quiet.MentionEveryone || len(quiet.MentionRoles) != 0 {
		t.Errorf("with empty allowed_mentions: Mentions %v, MentionEveryone %v, MentionRoles %v, want none", quiet.Mentions, quiet.MentionEveryone, quiet.MentionRoles)
	}
	loud, err := c.ChannelMessageSend(channelID, "@everyone <@"+alice.ID+"> <@&77>")
	if err != nil {
		t.Fatalf("ChannelMessageSend() = %v", err)
	}
	if len(loud.Mentions) != 1 || !loud.MentionEveryone || len(loud.MentionRoles) != 1 {
		t.Errorf("without allowed_mentions: Mentions %v, MentionEveryone %v, MentionRoles %v, want alice, everyone and role 77", loud.Mentions, loud.MentionEveryone, loud.MentionRoles)
	}
}

func TestStartThread(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	c := mustOpen(t, srv, allIntents)
	mustRecv(t, c.guilds, "GUILD_CREATE")

	start := srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "long topic"})
	th, err := c.MessageThreadStart(channelID, start.ID, "long topic", 60)
	if err != nil {
		t.Fatalf("MessageThreadStart() = %v", err)
	}
	want := discordtest.Channel{
		ID: start.ID, GuildID: guildID, Type: discordgo.ChannelTypeGuildPublicThread,
		ParentID: channelID, OwnerID: srv.BotID(), Name: "long topic",
	}
	got := discordtest.Channel{ID: th.ID, GuildID: th.GuildID, Type: th.Type, ParentID: th.ParentID, OwnerID: th.OwnerID, Name: th.Name}
	if got != want {
		t.Errorf("MessageThreadStart() = %+v, want %+v", got, want)
	}
	if threads := srv.Threads(); len(threads) != 1 || threads[0] != want {
		t.Errorf("Threads() = %+v, want [%+v]", threads, want)
	}
	if ev := mustRecv(t, c.threads, "THREAD_CREATE"); ev.ID != start.ID || !ev.NewlyCreated {
		t.Errorf("THREAD_CREATE %s newly_created %v, want %s true", ev.ID, ev.NewlyCreated, start.ID)
	}
	if _, err := c.State.Channel(th.ID); err != nil {
		t.Errorf("State.Channel(thread) = %v after THREAD_CREATE", err)
	}

	_, err = c.MessageThreadStart(channelID, start.ID, "again", 60)
	var rerr *discordgo.RESTError
	if !errors.As(err, &rerr) || rerr.Response.StatusCode != 400 || rerr.Message == nil || rerr.Message.Code != 160004 {
		t.Errorf("second MessageThreadStart() = %v, want 400 code 160004", err)
	}

	if _, err := c.ChannelMessageSend(th.ID, "in the thread"); err != nil {
		t.Fatalf("ChannelMessageSend(thread) = %v", err)
	}
	if sent := srv.Sent(th.ID); len(sent) != 1 || sent[0].GuildID != guildID {
		t.Errorf("Sent(thread) = %v, want one message in guild %s", sent, guildID)
	}
	srv.Post(discordtest.UserMessage{ChannelID: th.ID, Author: alice, Content: "follow-up"})
	for {
		m := mustRecv(t, c.messages, "alice's message in the thread")
		if m.Author.ID == alice.ID && m.ChannelID == th.ID {
			break
		}
	}
}

// A dropped connection is resumed, and every message posted meanwhile arrives exactly
// once, in order.
func TestDisconnectResumes(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	c := mustOpen(t, srv, allIntents)

	srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "before"})
	if m := mustRecv(t, c.messages, "message before the disconnect"); m.Content != "before" {
		t.Fatalf("got %q, want %q", m.Content, "before")
	}

	// discordgo sleeps a second in Session.Close before it redials, so these are posted
	// while the client is away; WaitReady then waits for the RESUME.
	srv.Disconnect()
	down := []string{"down 1", "down 2", "down 3"}
	for _, s := range down {
		srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: s})
	}
	srv.WaitReady(t)
	srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "after"})

	// Delivery is in sequence order, so a duplicate would show up before "after".
	for _, want := range append(down, "after") {
		if m := mustRecv(t, c.messages, want); m.Content != want {
			t.Fatalf("got %q, want %q", m.Content, want)
		}
	}
	mustBeEmpty(t, c.messages, "message after the last one")
	if got := srv.Resumes(); got != 1 {
		t.Errorf("Resumes() = %d, want 1", got)
	}
	if got := srv.Identifies(); got != 1 {
		t.Errorf("Identifies() = %d, want 1", got)
	}
}

// A session Discord forgot cannot be resumed: discordgo identifies again, and what was
// posted in between is lost.
func TestInvalidSessionReidentifies(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	c := mustOpen(t, srv, allIntents)

	// As in TestDisconnectResumes, discordgo is still in its one-second Close when "lost"
	// is posted.
	srv.InvalidateSession()
	srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "lost"})
	srv.WaitFor(t, "a second IDENTIFY", func() bool { return srv.Identifies() == 2 && srv.Ready() })
	srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "after"})

	if m := mustRecv(t, c.messages, "message after re-identifying"); m.Content != "after" {
		t.Errorf("got %q, want %q (messages posted without a session are not delivered)", m.Content, "after")
	}
	if got := srv.Resumes(); got != 0 {
		t.Errorf("Resumes() = %d, want 0", got)
	}
}

func TestHeartbeats(t *testing.T) {
	t.Parallel()
	srv := newWorld(t, discordtest.WithHeartbeatInterval(200*time.Millisecond))
	mustOpen(t, srv, allIntents)
	srv.WaitFor(t, "three heartbeats", func() bool { return srv.Heartbeats() >= 3 })
}

// A connection whose heartbeats go unacknowledged (MissHeartbeatACKs) is closed by discordgo,
// five intervals after the last ACK, and the client connects again. discordgo closes it with
// Session.Close, whose close frame says 1000, which ends the gateway session on Discord (the
// connection is stale, not dead, so the frame arrives): its RESUME gets INVALID_SESSION, and it
// identifies again. Discord asks for another code there (docs: Heartbeat Interval, "terminate
// the connection with any close code besides 1000 or 1001"); discordgo v0.28.1 offers no way to
// choose it on that path.
func TestMissedHeartbeatACKsReconnect(t *testing.T) {
	t.Parallel()
	srv := newWorld(t, discordtest.WithHeartbeatInterval(200*time.Millisecond))
	mustOpen(t, srv, allIntents)
	srv.MissHeartbeatACKs(8)
	srv.WaitFor(t, "a new IDENTIFY after the missed ACKs", func() bool { return srv.Identifies() == 2 && srv.Ready() })
	if got := srv.Resumes(); got != 0 {
		t.Errorf("Resumes() = %d, want 0: the session ended with discordgo's close 1000", got)
	}
}
