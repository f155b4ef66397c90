package discord

import (
	"strings"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestStopTellsALookupRefusedForWhatItIs: the daemon stops while a delivery is held, with a
// mention queued behind it in a thread discordgo's state does not hold, in a chat the store
// took nothing from (the next start does not read it back), and Discord refuses the thread's
// lookup (403: the bot lost access to it). That is the channel's failure, not the stop's: it
// is logged at ERR as outside a stop, and its sender is told the channel could not be looked
// up. Before, every failed lookup during a stop was taken for the stop's bound running out:
// logged at WRN as "its channel was not looked up in time", and its sender was told the bot
// was restarting and to send it again in a minute, when the next start refuses it the same.
func TestStopTellsALookupRefusedForWhatItIs(t *testing.T) {
	const channel, thread = "200000000000000002", "200000000000000003"
	h := newHeldDelivery()
	srv, p, log, stop := intakeWorldWith(t, h, func(srv *discordtest.Server) {
		addArchivedThread(srv, channel, thread, "400000000000000002")
		srv.FailNext("GET", "/channels/"+thread, 403, 1)
	}, func(c *Config) {
		c.Settings.BackfillWindow = time.Hour
		c.Settings.RequireMention = true
	}, discordtest.WithHeartbeatInterval(discordtest.DefaultHeartbeatInterval))
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	bob := discordtest.User{ID: "400000000000000002", Username: "bob"}
	srv.Post(discordtest.UserMessage{ChannelID: "300000000000000001", Author: alice, Content: "first"})
	<-h.started
	inThread := srv.Post(discordtest.UserMessage{ChannelID: thread, Author: bob, Content: "a question", MentionBot: true})
	waitQueued(t, p, "the mention queued behind the held delivery", 1)
	onStopWait(t, func() {
		h.drain()
		close(h.release)
	})
	stop() // returns once the intake has handed the queue on (settle)
	if n := srv.Requests("GET", "/channels/"+thread); n != 1 {
		t.Fatalf("the thread was looked up %d times, want once (refused)", n)
	}
	sent := srv.Sent(thread)
	if len(sent) != 1 || sent[0].Content != unknownChannelNotice || sent[0].MessageReference == nil || sent[0].MessageReference.MessageID != inThread.ID {
		var got []string
		for _, s := range sent {
			got = append(got, s.Content)
		}
		t.Errorf("the bot posted %q in the thread, want the notice that its channel could not be looked up, replying to %s", got, inThread.ID)
	}
	if s := log.String(); !strings.Contains(s, "level=ERROR msg=\"discord message from an unknown channel; not taken\"") || strings.Contains(s, "not looked up in time") {
		t.Errorf("Discord's refusal of the lookup is not logged as the channel's failure:\n%s", s)
	}
}

// TestStopDuringALookupTellsItsSenderToSendAgain: a mention in a thread discordgo's state does
// not hold, in a chat the store took nothing from, is being handled, its thread's lookup waiting
// for a slow Discord, when the daemon stops. The stop ends the lookup, and its sender gets the
// stop's notice to send it again, as one queued behind it does
// (TestStopTellsSendersInAThreadAndAnAutoThreadToSendAgain). Before, only a message that met
// the stop before its lookups was handled so: the lookup the stop cut short logged ERR "discord
// message from an unknown channel", and its sender was told the channel could not be looked
// up.
func TestStopDuringALookupTellsItsSenderToSendAgain(t *testing.T) {
	const channel, thread = "200000000000000002", "200000000000000003"
	answer := make(chan struct{})
	defer close(answer) // after the stop: the fake's held handler ends
	h := newHeldDelivery()
	srv, _, log, stop := intakeWorldWith(t, h, func(srv *discordtest.Server) {
		addArchivedThread(srv, channel, thread, "400000000000000002")
		srv.HoldNext("GET", "/channels/"+thread, answer, 1)
	}, func(c *Config) {
		c.Settings.BackfillWindow = time.Hour
		c.Settings.RequireMention = true
	}, discordtest.WithHeartbeatInterval(discordtest.DefaultHeartbeatInterval))
	bob := discordtest.User{ID: "400000000000000002", Username: "bob"}
	m := srv.Post(discordtest.UserMessage{ChannelID: thread, Author: bob, Content: "a question", MentionBot: true})
	pollFor(t, "the thread's lookup", func() bool { return srv.Requests("GET", "/channels/"+thread) == 1 })
	h.drain()
	stop() // returns once the intake has handled the message (settle)
	wantStopNotice(t, srv, thread, m)
	if s := log.String(); strings.Contains(s, "unknown channel") {
		t.Errorf("the lookup the stop cut short is logged as the channel's failure:\n%s", s)
	}
}

// TestStopDuringAThreadsOpeningSaysNothingFalse: a mention in a channel whose mentions open an
// auto-thread, in a chat the store took nothing from, is being handled, its thread's opening
// waiting for a slow Discord, when the daemon stops. The stop ends the opening, the stopping
// runtime turns the message away, and its sender gets the stop's notice to send it again, in
// the channel, replying to it; nothing warns of a thread to be opened on the reply, or of a
// sender not told. Before, the opening the stop cut short warned "open discord thread; will
// retry on reply", and its notice that the thread would open later, posted on the stop's
// cancelled context, warned that its author was not told, though the stop's notice followed.
func TestStopDuringAThreadsOpeningSaysNothingFalse(t *testing.T) {
	const channel = "200000000000000002"
	answer := make(chan struct{})
	defer close(answer) // after the stop: the fake's held handler ends
	h := newHeldDelivery()
	srv, _, log, stop := intakeWorldWith(t, h, func(srv *discordtest.Server) {
		srv.AddGuild(recentGuild, "guild")
		srv.AddChannel(discordtest.Channel{ID: channel, GuildID: recentGuild, Type: discordgo.ChannelTypeGuildText, Name: "general"})
		srv.HoldNext("POST", "/threads", answer, 1)
	}, func(c *Config) {
		c.Settings.BackfillWindow = time.Hour
		c.Settings.AutoThread = true
		c.Settings.RequireMention = true
	}, discordtest.WithHeartbeatInterval(discordtest.DefaultHeartbeatInterval))
	bob := discordtest.User{ID: "400000000000000002", Username: "bob"}
	m := srv.Post(discordtest.UserMessage{ChannelID: channel, Author: bob, Content: "a question", MentionBot: true})
	pollFor(t, "the thread's opening", func() bool { return srv.Requests("POST", "/threads") == 1 })
	h.drain()
	stop() // returns once the intake has handled the message (settle)
	wantStopNotice(t, srv, channel, m)
	if s := log.String(); strings.Contains(s, "open discord thread") || strings.Contains(s, "its author is not told") {
		t.Errorf("the opening the stop cut short warned:\n%s", s)
	}
}

// addArchivedThread adds a guild (recentGuild) with a text channel and an archived public
// thread in it, started by owner: GUILD_CREATE does not list the thread, and its messages are
// looked up over REST.
func addArchivedThread(srv *discordtest.Server, channel, thread, owner string) {
	srv.AddGuild(recentGuild, "guild")
	srv.AddChannel(discordtest.Channel{ID: channel, GuildID: recentGuild, Type: discordgo.ChannelTypeGuildText, Name: "general"})
	srv.AddChannel(discordtest.Channel{ID: thread, GuildID: recentGuild, Type: discordgo.ChannelTypeGuildPublicThread, ParentID: channel, OwnerID: owner, Name: "a thread"})
	srv.ArchiveThread(thread)
}

// wantStopNotice: the bot posted one message in where, the stop's notice to send it again,
// replying to m.
func wantStopNotice(t *testing.T, srv *discordtest.Server, where string, m *discordgo.Message) {
	t.Helper()
	sent := srv.Sent(where)
	if len(sent) != 1 || sent[0].Content != drainingNotice || sent[0].MessageReference == nil || sent[0].MessageReference.MessageID != m.ID {
		var got []string
		for _, s := range sent {
			got = append(got, s.Content)
		}
		t.Errorf("the bot posted %q in %s, want the stop's notice to send it again replying to %s", got, where, m.ID)
	}
}
