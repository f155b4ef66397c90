package discord

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestFullChannelsKeepAnUnreadPlace: the platform remembers its most channels (backfillChannels,
// lowered to 2), and a backfill could not read a quiet channel (Discord failed every try): its
// place is kept unread. The next new gateway session's READY merges the store's recent chats,
// two channels another cluster member took, and one of them forgets the quietest remembered
// channel without an unread place, not the one with it: that READY's backfill reads the
// message said there while the gateway was down, and answers it. Before, the quietest channel
// was forgotten whatever it held, its unread place cleared with it (in the store too), and the
// message was never read back, without a word: a bot in more than 1,000 active channels merged
// as many at every READY.
func TestFullChannelsKeepAnUnreadPlace(t *testing.T) {
	old := backfillChannels
	backfillChannels = 2
	t.Cleanup(func() { backfillChannels = old })
	const quiet, a, b = "200000000000000001", "200000000000000002", "200000000000000003"
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	var marks [2][]persistence.ChatMark // what Recent returns at the first READY, and after
	var readies atomic.Int32
	var fake *discordtest.Server
	h := newHeldDelivery()
	srv, _, log, _ := intakeWorldWith(t, h, func(srv *discordtest.Server) {
		fake = srv
		srv.AddGuild(recentGuild, "guild")
		for _, ch := range []string{quiet, a, b} {
			srv.AddChannel(discordtest.Channel{ID: ch, GuildID: recentGuild, Type: discordgo.ChannelTypeGuildText, Name: "general-" + ch})
		}
		// Said before the platform connects: no gateway session hears it.
		srv.Post(discordtest.UserMessage{ChannelID: quiet, Author: alice, Content: "missed"})
		marks[0] = []persistence.ChatMark{{ChatID: quiet, ScopeID: recentGuild, MessageID: "1", At: srv.Now()}}
		for _, ch := range []string{b, a} { // newest first, as the store returns them
			m := srv.Post(discordtest.UserMessage{ChannelID: ch, Author: alice, Content: "answered already"})
			marks[1] = append(marks[1], persistence.ChatMark{ChatID: ch, ScopeID: recentGuild, MessageID: m.ID, At: srv.Now()})
		}
		srv.FailNext("GET", "/channels/"+quiet+"/messages", 500, backfillTries) // the first READY's backfill
	}, func(c *Config) {
		c.Settings.BackfillWindow = time.Hour
		c.Now = fake.Now // the clock the fake's messages are stamped with
		c.Recent = func(context.Context, time.Time) ([]persistence.ChatMark, error) {
			return marks[min(readies.Add(1)-1, 1)], nil
		}
	}, discordtest.WithHeartbeatInterval(discordtest.DefaultHeartbeatInterval))
	const backfilled = "discord gateway session was new: read what was missed"
	pollFor(t, "the first READY's backfill", func() bool { return strings.Contains(log.String(), backfilled) })
	if !strings.Contains(log.String(), "read again later") {
		t.Fatalf("the first backfill read the quiet channel, want its read failed:\n%s", log.String())
	}

	srv.InvalidateSession() // a new gateway session: its READY merges the store's chats, and backfills
	pollFor(t, "the second READY's backfill", func() bool { return strings.Count(log.String(), backfilled) == 2 })
	if texts, _, _ := h.got(); !slices.Contains(texts, "missed") {
		t.Errorf("delivered %q, want the message said in the quiet channel while the gateway was down:\n%s", texts, log.String())
	}
}

// TestUnreadPlaceOfAChannelForgottenMidBackfillIsReadAgain: the platform remembers its most
// channels (backfillChannels, lowered to 2), a and b, and a READY's backfill reads a first (the
// quieter): a mention said there while the gateway was down opens an auto-thread, a channel new
// past the bound, which forgets the quietest one without an unread place: b, not read yet. b's
// read then fails (Discord failed every try) and keeps its place unread; the read of the gaps
// reads it again, and answers the message said there while the gateway was down. Before, b's
// place was kept for a channel no longer remembered, which the reads of the gaps never read
// (they read the remembered channels): the message waited for the next new gateway session,
// days away maybe, while the gap read was armed again and again to read nothing.
func TestUnreadPlaceOfAChannelForgottenMidBackfillIsReadAgain(t *testing.T) {
	old := backfillChannels
	backfillChannels = 2
	t.Cleanup(func() { backfillChannels = old })
	SetGapRetry(t, 100*time.Millisecond)
	const a, b = "200000000000000002", "200000000000000003"
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	var marks []persistence.ChatMark
	var fake *discordtest.Server
	h := newHeldDelivery()
	_, p, log, _ := intakeWorldWith(t, h, func(srv *discordtest.Server) {
		fake = srv
		srv.AddGuild(recentGuild, "guild")
		for _, ch := range []string{a, b} {
			srv.AddChannel(discordtest.Channel{ID: ch, GuildID: recentGuild, Type: discordgo.ChannelTypeGuildText, Name: "general-" + ch})
		}
		for _, ch := range []string{a, b} { // a is the quieter one
			m := srv.Post(discordtest.UserMessage{ChannelID: ch, Author: alice, Content: "answered already", MentionBot: true})
			marks = append([]persistence.ChatMark{{ChatID: ch, ScopeID: recentGuild, MessageID: m.ID, At: srv.Now()}}, marks...)
		}
		// Said before the platform connects: no gateway session hears them.
		srv.Post(discordtest.UserMessage{ChannelID: b, Author: alice, Content: "missed", MentionBot: true})
		srv.Post(discordtest.UserMessage{ChannelID: a, Author: alice, Content: "a question", MentionBot: true})
		srv.FailNext("GET", "/channels/"+b+"/messages", 500, backfillTries) // the READY's backfill
	}, func(c *Config) {
		c.Settings.BackfillWindow = time.Hour
		c.Settings.AutoThread = true
		c.Settings.RequireMention = true
		c.Now = fake.Now // the clock the fake's messages are stamped with
		c.Recent = func(context.Context, time.Time) ([]persistence.ChatMark, error) { return marks, nil }
	}, discordtest.WithHeartbeatInterval(discordtest.DefaultHeartbeatInterval))
	pollFor(t, "the READY's backfill", func() bool {
		return strings.Contains(log.String(), "discord gateway session was new: read what was missed")
	})
	if !strings.Contains(log.String(), "read again later") {
		t.Fatalf("the backfill read b, want its read failed:\n%s", log.String())
	}
	p.mu.Lock()
	_, unread := p.unread[b]
	_, seen := p.seen[b]
	p.mu.Unlock()
	if !unread || !seen {
		t.Errorf("b's place unread: %v, b remembered: %v; want both", unread, seen)
	}
	pollFor(t, "the message said in b while the gateway was down, read again", func() bool {
		texts, _, _ := h.got()
		return slices.Contains(texts, "missed")
	})
	if texts, _, _ := h.got(); !slices.Contains(texts, "a question") {
		t.Errorf("delivered %q, want a's question too", texts)
	}
}
