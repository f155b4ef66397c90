package discord

import (
	"slices"
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

// stopLookupCases are the ways a stop cuts a message's REST lookup short: the stop comes while
// the lookup waits for a slow Discord (and ends it), or the message is queued behind a held
// delivery when the stop comes, and its lookup, made within the stop's notice bound
// (noticeCtx), waits until the bound's 3 s run out.
var stopLookupCases = []struct {
	name   string
	queued bool
}{
	{"during the lookup", false},
	{"queued, out of time", true},
}

// TestStopCuttingARoleLookupLeavesTheMessageForTheNextStart: in a channel where the bot
// answers only when mentioned, bob mentions the bot's role in a guild whose roles are not
// known yet (its GUILD_CREATE has not come: a backfill runs beside the gateway's first events),
// in a chat the store took nothing from, and the stop cuts the lookup of the guild's roles
// short. Whether the message is for the bot is not known: it is left for the next start, which
// reads it back and answers it. Before, the failed lookup counted as no role: the message was
// dropped as one not for the bot, with a WRN, and the next start did not read it back.
func TestStopCuttingARoleLookupLeavesTheMessageForTheNextStart(t *testing.T) {
	const channel, botRole = "200000000000000002", "500000000000000001"
	for _, tc := range stopLookupCases {
		t.Run(tc.name, func(t *testing.T) {
			m := stopDuringALookup(t, tc.queued, "/guilds/"+recentGuild+"/roles",
				func(srv *discordtest.Server) {
					srv.AddGuild(recentGuild, "guild")
					srv.AddChannel(discordtest.Channel{ID: channel, GuildID: recentGuild, Type: discordgo.ChannelTypeGuildText, Name: "general"})
					srv.AddRole(recentGuild, discordtest.Role{ID: botRole, Name: "agentgate", BotID: srv.BotID()})
				},
				func(p *Platform) { forgetRoles(t, p, recentGuild) },
				discordtest.UserMessage{ChannelID: channel, Content: "a question", MentionRoles: []string{botRole}},
				"the bot's role not looked up; the next start reads it back")
			if m.Content != "<@&"+botRole+"> a question" {
				t.Fatalf("posted %q, want the role's mention", m.Content)
			}
		})
	}
}

// TestStopCuttingAChannelLookupLeavesAnUnmentionedMessageForTheNextStart: in a channel where
// the bot answers only when mentioned, bob writes without a mention in a thread the bot opened
// (its conversation, which needs none), archived, so out of discordgo's state, and the stop
// cuts the thread's lookup short. Whether the message is for the bot is not known: it is left
// for the next start, which reads it back and answers it, and nothing is posted (a notice would
// answer what may be chatter). Before, it was dropped as unmentioned chatter, with a WRN
// "its channel was not looked up in time", and the next start did not read it back.
func TestStopCuttingAChannelLookupLeavesAnUnmentionedMessageForTheNextStart(t *testing.T) {
	const channel, thread = "200000000000000002", "200000000000000003"
	for _, tc := range stopLookupCases {
		t.Run(tc.name, func(t *testing.T) {
			var srv *discordtest.Server
			stopDuringALookup(t, tc.queued, "/channels/"+thread,
				func(s *discordtest.Server) {
					srv = s
					addArchivedThread(s, channel, thread, s.BotID())
				},
				nil,
				discordtest.UserMessage{ChannelID: thread, Content: "and another thing"},
				"its channel not looked up; the next start reads it back")
			if sent := srv.Sent(thread); len(sent) != 0 {
				t.Errorf("the bot posted %q in its thread, want nothing", contentsOf(sent))
			}
		})
	}
}

// stopDuringALookup runs a platform in a world setup arranges, where the bot answers only when
// mentioned and backfill is on, with a store that keeps its unread places; ready runs once it
// is connected. bob posts um, whose handling makes a REST lookup (a GET of a path that ends in
// lookup) that Discord holds, and the daemon stops: during the lookup, or with um queued behind
// a held delivery (queued). um is not delivered, the log says it is left for the next start
// (left), and the next start reads it back and delivers it. It returns the message posted.
func stopDuringALookup(t *testing.T, queued bool, lookup string, setup func(*discordtest.Server), ready func(*Platform),
	um discordtest.UserMessage, left string) *discordgo.Message {
	t.Helper()
	answer := make(chan struct{})
	defer close(answer) // after the stop: the fake's held handler ends
	store := newUnreadStore()
	mentionOnly := func(c *Config) { c.Settings.RequireMention = true }
	h := newHeldDelivery()
	srv, p, log, stop := intakeWorldWith(t, h, setup, func(c *Config) {
		c.Settings.BackfillWindow = time.Hour
		mentionOnly(c)
	}, discordtest.WithHeartbeatInterval(discordtest.DefaultHeartbeatInterval))
	p.SetRecord(store.record)
	if ready != nil {
		ready(p)
	}
	srv.HoldNext("GET", lookup, answer, 1)
	um.Author = discordtest.User{ID: "400000000000000002", Username: "bob"}
	var m *discordgo.Message
	if queued {
		alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
		srv.Post(discordtest.UserMessage{ChannelID: "300000000000000001", Author: alice, Content: "first"})
		<-h.started
		m = srv.Post(um)
		waitQueued(t, p, "the message queued behind the held delivery", 1)
		onStopWait(t, func() {
			h.drain()
			close(h.release)
		})
	} else {
		m = srv.Post(um)
		pollFor(t, "the lookup", func() bool { return srv.Requests("GET", lookup) == 1 })
		h.drain()
	}
	stop() // returns once the intake has handled the message (settle)
	if n := srv.Requests("GET", lookup); n != 1 {
		t.Errorf("%s was looked up %d times, want once", lookup, n)
	}
	if texts, _, _ := h.got(); slices.Contains(texts, um.Content) {
		t.Errorf("the runtime was handed %q, want it turned away by the stop", texts)
	}
	if s := log.String(); !strings.Contains(s, left) || !strings.Contains(s, "message_id="+m.ID) {
		t.Fatalf("the message was not left for the next start:\n%s", s)
	}

	again := startAgain(t, srv, store, mentionOnly)
	pollFor(t, "the message read back", func() bool {
		texts, _, _ := again.got()
		return slices.Contains(texts, um.Content)
	})
	return m
}

// forgetRoles waits until p knows the bot's role in guild (its GUILD_CREATE), then forgets it,
// as before the guild's GUILD_CREATE came: a message that mentions a role there looks the
// guild's roles up over REST.
func forgetRoles(t *testing.T, p *Platform, guild string) {
	t.Helper()
	pollFor(t, "the guild's roles", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		_, ok := p.roles[guild]
		return ok
	})
	p.mu.Lock()
	delete(p.roles, guild)
	p.mu.Unlock()
}

// TestStopsBoundMeetingARateLimitLeavesARoleMentionForTheNextStart: in a channel where the bot
// answers only when mentioned, bob mentions the bot's role in a guild whose roles are not known
// yet, queued behind a held delivery when the daemon stops, and the guild's roles route is rate
// limited past the stop's notice bound (3 s), within which the lookup is made: the lookup fails
// at once, before the bound ends, without asking Discord. The stop's bound cut it short, as one
// that ran out: the message is left for the next start, which reads it back and answers it.
// Before, only a lookup whose ctx had ended was the stop's: this one counted as no role, was
// remembered as a miss, and the message was dropped as one not for the bot (a WRN "cannot look
// up the guild's roles"), not read back.
func TestStopsBoundMeetingARateLimitLeavesARoleMentionForTheNextStart(t *testing.T) {
	const channel, botRole = "200000000000000002", "500000000000000001"
	store := newUnreadStore()
	mentionOnly := func(c *Config) { c.Settings.RequireMention = true }
	h := newHeldDelivery()
	srv, p, log, stop := intakeWorldWith(t, h, func(srv *discordtest.Server) {
		srv.AddGuild(recentGuild, "guild")
		srv.AddChannel(discordtest.Channel{ID: channel, GuildID: recentGuild, Type: discordgo.ChannelTypeGuildText, Name: "general"})
		srv.AddRole(recentGuild, discordtest.Role{ID: botRole, Name: "agentgate", BotID: srv.BotID()})
	}, func(c *Config) {
		c.Settings.BackfillWindow = time.Hour
		mentionOnly(c)
	}, discordtest.WithHeartbeatInterval(discordtest.DefaultHeartbeatInterval))
	p.SetRecord(store.record)
	forgetRoles(t, p, recentGuild)
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	bob := discordtest.User{ID: "400000000000000002", Username: "bob"}
	srv.Post(discordtest.UserMessage{ChannelID: "300000000000000001", Author: alice, Content: "first"})
	<-h.started
	m := srv.Post(discordtest.UserMessage{ChannelID: channel, Author: bob, Content: "a question", MentionRoles: []string{botRole}})
	waitQueued(t, p, "the mention queued behind the held delivery", 1)
	// Past the stop's bound, within restTimeout: outside a stop, the lookup waits it out. Set
	// as the stop begins, as the bound runs from there: set at the test's start, the seconds a
	// loaded host took to get here (the READY, its backfill) ran the limit down within the
	// bound, and the lookup waited it out and asked Discord.
	limitRoles(p, 2*stopNoticeTimeout)
	onStopWait(t, func() {
		h.drain()
		close(h.release)
	})
	stop() // returns once the intake has handled the message (settle)
	lookup := "/guilds/" + recentGuild + "/roles"
	if n := srv.Requests("GET", lookup); n != 0 {
		t.Errorf("%s was asked %d times, want none (rate limited past the stop's bound)", lookup, n)
	}
	if s := log.String(); !strings.Contains(s, "the bot's role not looked up; the next start reads it back") ||
		!strings.Contains(s, "message_id="+m.ID) || strings.Contains(s, "cannot look up the guild's roles") {
		t.Fatalf("the message was not left for the next start:\n%s", s)
	}
	p.mu.Lock()
	_, missed := p.roleMisses[recentGuild]
	p.mu.Unlock()
	if missed {
		t.Errorf("the lookup the stop's bound cut short is remembered as a miss")
	}
	again := startAgain(t, srv, store, mentionOnly)
	pollFor(t, "the message read back", func() bool {
		texts, _, _ := again.got()
		return slices.Contains(texts, "a question")
	})
}

// TestStopCuttingARoleLookupShortWithBackfillOffSaysSo: as
// TestStopsBoundMeetingARateLimitLeavesARoleMentionForTheNextStart, with backfill off: nothing
// reads the message back, and a notice would answer what may be chatter, so the message is not
// answered. The log says it was the stop, and what it means: before, the line was Discord's
// failure's, "cannot look up the guild's roles", which sent the operator to look at Discord.
func TestStopCuttingARoleLookupShortWithBackfillOffSaysSo(t *testing.T) {
	const channel, botRole = "200000000000000002", "500000000000000001"
	h := newHeldDelivery()
	srv, p, log, stop := intakeWorldWith(t, h, func(srv *discordtest.Server) {
		srv.AddGuild(recentGuild, "guild")
		srv.AddChannel(discordtest.Channel{ID: channel, GuildID: recentGuild, Type: discordgo.ChannelTypeGuildText, Name: "general"})
		srv.AddRole(recentGuild, discordtest.Role{ID: botRole, Name: "agentgate", BotID: srv.BotID()})
	}, func(c *Config) { c.Settings.RequireMention = true },
		discordtest.WithHeartbeatInterval(discordtest.DefaultHeartbeatInterval))
	p.SetRecord(newUnreadStore().record)
	forgetRoles(t, p, recentGuild)
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	bob := discordtest.User{ID: "400000000000000002", Username: "bob"}
	srv.Post(discordtest.UserMessage{ChannelID: "300000000000000001", Author: alice, Content: "first"})
	<-h.started
	m := srv.Post(discordtest.UserMessage{ChannelID: channel, Author: bob, Content: "a question", MentionRoles: []string{botRole}})
	waitQueued(t, p, "the mention queued behind the held delivery", 1)
	limitRoles(p, 2*stopNoticeTimeout) // as the stop begins (see above)
	onStopWait(t, func() {
		h.drain()
		close(h.release)
	})
	stop()
	s := log.String()
	if !strings.Contains(s, "discord message met the stop before the bot's role was looked up, and nothing reads it back (backfill is off)") ||
		!strings.Contains(s, "message_id="+m.ID) || strings.Contains(s, "cannot look up the guild's roles") {
		t.Errorf("the log does not say the stop cut the role's lookup short:\n%s", s)
	}
	if sent := srv.Sent(channel); len(sent) != 0 {
		t.Errorf("the bot posted %q, want nothing (it may be chatter)", contentsOf(sent))
	}
}

// limitRoles has Discord rate limit the roles route of recentGuild for d from now.
func limitRoles(p *Platform, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.limited[discordgo.EndpointGuildRoles(recentGuild)] = time.Now().Add(d)
}
