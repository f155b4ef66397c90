package discord

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

func TestGate(t *testing.T) {
	const bot = "900"
	yes, no := true, false
	base := config.Default().Platforms.Discord
	user := &discordgo.User{ID: "1", Username: "alice"}
	otherBot := &discordgo.User{ID: "2", Username: "robot", Bot: true}
	text := chanInfo{kind: kindText, guild: "g1"}
	userThread := chanInfo{kind: kindThread, parent: "c1", guild: "g1", owner: "1"}
	botThread := chanInfo{kind: kindThread, parent: "c1", guild: "g1", owner: bot}
	dm := chanInfo{kind: kindDM}
	msg := func(author *discordgo.User, guild, channel string) *discordgo.Message {
		return &discordgo.Message{Author: author, GuildID: guild, ChannelID: channel}
	}
	tests := []struct {
		name      string
		tweak     func(*config.Discord)
		m         *discordgo.Message
		ch        chanInfo
		mentioned bool
		want      bool
	}{
		{"dm needs no mention", nil, msg(user, "", "d1"), dm, false, true},
		{"channel without mention", nil, msg(user, "g1", "c1"), text, false, false},
		{"channel with mention", nil, msg(user, "g1", "c1"), text, true, true},
		{"mention not required", func(d *config.Discord) { d.RequireMention = false }, msg(user, "g1", "c1"), text, false, true},
		{"free-response channel", func(d *config.Discord) { d.FreeResponseChannels = []string{"c1"} }, msg(user, "g1", "c1"), text, false, true},
		{"guild override", func(d *config.Discord) { d.Guilds = map[string]config.DiscordScope{"g1": {RequireMention: &no}} }, msg(user, "g1", "c1"), text, false, true},
		{"channel beats guild", func(d *config.Discord) {
			d.Guilds = map[string]config.DiscordScope{"g1": {RequireMention: &no}}
			d.Channels = map[string]config.DiscordScope{"c1": {RequireMention: &yes}}
		}, msg(user, "g1", "c1"), text, false, false},
		{"a user's thread follows its parent", nil, msg(user, "g1", "t1"), userThread, false, false},
		{"a user's thread in a free parent", func(d *config.Discord) { d.FreeResponseChannels = []string{"c1"} }, msg(user, "g1", "t1"), userThread, false, true},
		{"the bot's own thread", nil, msg(user, "g1", "t2"), botThread, false, true},
		{"another bot", nil, msg(otherBot, "g1", "c1"), text, true, false},
		{"another bot, allowed", func(d *config.Discord) { d.AllowBots = true }, msg(otherBot, "g1", "c1"), text, true, true},
		{"user not allowed", func(d *config.Discord) { d.AllowedUsers = []string{"7"} }, msg(user, "", "d1"), dm, false, false},
		{"user allowed", func(d *config.Discord) { d.AllowedUsers = []string{"1"} }, msg(user, "", "d1"), dm, false, true},
		{"guild not allowed", func(d *config.Discord) { d.AllowedGuilds = []string{"g2"} }, msg(user, "g1", "c1"), text, true, false},
		{"channel not allowed", func(d *config.Discord) { d.AllowedChannels = []string{"c2"} }, msg(user, "g1", "c1"), text, true, false},
		{"thread of an allowed channel", func(d *config.Discord) { d.AllowedChannels = []string{"c1"} }, msg(user, "g1", "t2"), botThread, false, true},
		{"dm ignores guild and channel lists", func(d *config.Discord) { d.AllowedChannels = []string{"c2"}; d.AllowedGuilds = []string{"g2"} }, msg(user, "", "d1"), dm, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base
			if tt.tweak != nil {
				tt.tweak(&c)
			}
			if got := newGate(c).admit(tt.m, tt.ch, bot, tt.mentioned); got != tt.want {
				t.Errorf("admit = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestTextDropsTheBotMentionAndListsAttachments(t *testing.T) {
	m := &discordgo.Message{
		Content:     "<@900> hello <@!900> there <@123> <@&950> <@&951>",
		Attachments: []*discordgo.MessageAttachment{{Filename: "a.png", URL: "https://cdn.example/a.png"}},
	}
	want := "hello  there <@123>  <@&951>\n[attachment: a.png https://cdn.example/a.png]"
	if got := text(m, "900", "950"); got != want {
		t.Errorf("text = %q, want %q", got, want)
	}
	for _, tc := range []struct {
		m    *discordgo.Message
		role string
		want bool
	}{
		{&discordgo.Message{Content: "hi <@!900>"}, "", true},
		{&discordgo.Message{Content: "hi <@901>"}, "", false},
		{&discordgo.Message{Content: "hi <@&950>", MentionRoles: []string{"950"}}, "950", true},
		{&discordgo.Message{Content: "hi <@&950>"}, "950", true},
		{&discordgo.Message{Content: "hi", MentionRoles: []string{"950"}}, "950", true},
		{&discordgo.Message{Content: "hi <@&951>", MentionRoles: []string{"951"}}, "950", false},
		{&discordgo.Message{Content: "hi <@&950>", MentionRoles: []string{"950"}}, "", false},
	} {
		if got := mentions(tc.m, "900", tc.role); got != tc.want {
			t.Errorf("mentions(%q, role %q) = %v, want %v", tc.m.Content, tc.role, got, tc.want)
		}
	}
}

func TestThreadName(t *testing.T) {
	for in, want := range map[string]string{
		"  how do I\nparse json?": "how do I",
		"":                        "conversation",
		"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa…",
	} {
		if got := threadName(in); got != want {
			t.Errorf("threadName(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzThreadName: whatever a message says, the name of the thread it opens is what Discord
// accepts (1 to 100 characters) and what the doc promises: one line of at most 80 characters,
// with no white space at its ends or in runs.
func FuzzThreadName(f *testing.F) {
	for _, s := range []string{"", "  how do I\nparse json?", "\n\n\t", "a\r\nb", "\u2028x\u2029y", "\x00", "\xff\xfe",
		strings.Repeat("é", 79) + " x", strings.Repeat("😀", 81), strings.Repeat("a ", 60)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, content string) {
		name := threadName(content)
		n := utf8.RuneCountInString(name)
		switch {
		case n < 1 || n > 80:
			t.Fatalf("threadName(%q) = %q, %d characters, want 1 to 80", content, name, n)
		case strings.ContainsAny(name, "\r\n") || strings.Join(strings.Fields(name), " ") != name:
			t.Fatalf("threadName(%q) = %q, want one line without white space at its ends or in runs", content, name)
		}
	})
}

// TestBotRoleIsLookedUpBeforeItsGuildCreate: a message that mentions a role in a guild whose
// GUILD_CREATE has not come yet (a backfill runs beside the gateway's first events) looks the
// guild's roles up over REST, once: the bot's role is found, and a guild without one is
// remembered as such.
func TestBotRoleIsLookedUpBeforeItsGuildCreate(t *testing.T) {
	const guild, guild2, botRole = "100000000000000001", "100000000000000002", "500000000000000001"
	srv := discordtest.New(t)
	srv.AddGuild(guild, "guild")
	srv.AddGuild(guild2, "guild 2")
	srv.AddRole(guild, discordtest.Role{ID: "500000000000000009", Name: "helpers"})
	srv.AddRole(guild, discordtest.Role{ID: botRole, Name: "agentgate", BotID: srv.BotID()})
	p := mustNew(t, srv)
	bot := srv.BotID()
	p.botID.Store(&bot)
	for _, tc := range []struct {
		m    *discordgo.Message
		want string
	}{
		{&discordgo.Message{GuildID: guild, Content: "<@&" + botRole + "> hi", MentionRoles: []string{botRole}}, botRole},
		{&discordgo.Message{GuildID: guild, Content: "<@&500000000000000009> hi", MentionRoles: []string{"500000000000000009"}}, botRole},
		{&discordgo.Message{GuildID: guild2, Content: "<@&" + botRole + "> hi"}, ""},
		{&discordgo.Message{GuildID: guild2, Content: "<@&" + botRole + "> again"}, ""},
	} {
		if got, _ := p.botRole(t.Context(), tc.m); got != tc.want {
			t.Errorf("botRole(%q in guild %s) = %q, want %q", tc.m.Content, tc.m.GuildID, got, tc.want)
		}
	}
	if got, _ := p.botRole(t.Context(), &discordgo.Message{GuildID: "100000000000000003", Content: "no role"}); got != "" {
		t.Errorf("botRole of a message that mentions no role = %q, want none (and no lookup)", got)
	}
	// A lookup that fails (a guild Discord does not know here) is not made again at once: each
	// holds the gateway's reader.
	const unknown = "100000000000000004"
	for range 2 {
		if got, _ := p.botRole(t.Context(), &discordgo.Message{GuildID: unknown, Content: "<@&" + botRole + "> hi"}); got != "" {
			t.Errorf("botRole in a guild whose roles cannot be read = %q, want none", got)
		}
	}
	for _, g := range []string{guild, guild2, unknown} {
		if n := srv.Requests("GET", "/guilds/"+g+"/roles"); n != 1 {
			t.Errorf("guild %s's roles were looked up %d times, want once", g, n)
		}
	}
	if n := srv.Requests("", ""); n != 3 {
		t.Errorf("%d requests reached Discord, want 3 (a lookup per guild)", n)
	}
}

// TestBotRoleLookupACtxEndedIsNotAMiss: a lookup of a guild's roles that its ctx ended (the
// daemon's stop, or its notice bound) returns its error, as the role is not known, and is not
// remembered as a miss: the next message that mentions a role there looks them up again.
// Before, it counted as no role and was remembered so for roleRetry: every mention of the bot's
// role in that guild met meanwhile counted as none, without a lookup.
func TestBotRoleLookupACtxEndedIsNotAMiss(t *testing.T) {
	const guild, botRole = "100000000000000001", "500000000000000001"
	srv := discordtest.New(t)
	srv.AddGuild(guild, "guild")
	srv.AddRole(guild, discordtest.Role{ID: botRole, Name: "agentgate", BotID: srv.BotID()})
	p := mustNew(t, srv)
	bot := srv.BotID()
	p.botID.Store(&bot)
	m := &discordgo.Message{GuildID: guild, Content: "<@&" + botRole + "> hi", MentionRoles: []string{botRole}}
	ended, cancel := context.WithCancel(t.Context())
	cancel()
	if got, err := p.botRole(ended, m); err == nil || got != "" {
		t.Errorf("botRole on an ended ctx = %q, %v; want no role and the lookup's error", got, err)
	}
	if got, err := p.botRole(t.Context(), m); err != nil || got != botRole {
		t.Errorf("botRole after a lookup the ctx ended = %q, %v; want %s, looked up again", got, err, botRole)
	}
}
