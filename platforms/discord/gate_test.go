package discord

import (
	"testing"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
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
		Content:     "<@900> hello <@!900> there <@123>",
		Attachments: []*discordgo.MessageAttachment{{Filename: "a.png", URL: "https://cdn.example/a.png"}},
	}
	want := "hello  there <@123>\n[attachment: a.png https://cdn.example/a.png]"
	if got := text(m, "900"); got != want {
		t.Errorf("text = %q, want %q", got, want)
	}
	if !mentions(&discordgo.Message{Content: "hi <@!900>"}, "900") || mentions(&discordgo.Message{Content: "hi <@901>"}, "900") {
		t.Error("mentions misreads a mention")
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
