package config

import (
	"strings"
	"testing"
)

// TestDiscordTokenAdvice: a Discord bot token of a shape no bot token has (three dot-separated
// base64url parts: the bot's ID, a timestamp, a signature) is warned of, naming the variable
// and never the token: something else pasted in its place (a client secret or ID, the
// "Bearer " header form, two values run together). Before, check-config and serve took any
// value, and only the connection told. A token of the right shape, with white space or the
// "Bot " prefix the platform cuts, is none; an unset variable, or Discord disabled, neither
// (Preflight refuses the one).
func TestDiscordTokenAdvice(t *testing.T) {
	const good = "MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBc12.x_y-Z0123456789abcdefghijKLMNOP"
	for _, tt := range []struct {
		name, value string
		enabled     bool
		want        string // in the advice; "" for none
	}{
		{"the shape of a bot token", good, true, ""},
		{"with white space around it", " " + good + "\n", true, ""},
		{"with the Bot prefix", "Bot " + good, true, ""},
		{"unset", "", true, ""},
		{"the Bot prefix alone", "Bot", true, ""},
		{"discord disabled", "secret", false, ""},
		{"a Bearer header", "Bearer " + good, true, `starts with "Bearer "`},
		{"white space inside", good + " " + good, true, "holds white space"},
		{"an application ID", "123456789012345678", true, "all digits"},
		{"a client secret", "AbCdEfGhIjKlMnOpQrStUvWxYz012345", true, "has no dots"},
		{"two parts", "MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBc12", true, "not three parts"},
		{"an empty part", "MTIzNDU2Nzg5MDEyMzQ1Njc4..x_y-Z0123456789", true, "not three parts"},
		{"base64 that is not base64url", "MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBc12.x/y+Z0123456789=", true, "not three parts"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Platforms.Discord.Enabled = tt.enabled
			c.Platforms.Discord.TokenEnv = "MY_BOT_TOKEN"
			getenv := func(name string) string {
				if name == "MY_BOT_TOKEN" {
					return tt.value
				}
				return ""
			}
			got := c.DiscordTokenAdvice(getenv)
			if tt.want == "" {
				if len(got) != 0 {
					t.Errorf("DiscordTokenAdvice(%q) = %v, want none", tt.value, got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("DiscordTokenAdvice(%q) = %v, want one saying %q", tt.value, got, tt.want)
			}
			msg := got[0].Error()
			if !strings.HasPrefix(msg, `platforms.discord.token_env: "MY_BOT_TOKEN": `) || !strings.Contains(msg, tt.want) {
				t.Errorf("DiscordTokenAdvice(%q) = %q, want it to name platforms.discord.token_env and MY_BOT_TOKEN and say %q", tt.value, msg, tt.want)
			}
			for _, part := range strings.FieldsFunc(tt.value, func(r rune) bool { return r == ' ' || r == '.' }) {
				if len(part) >= 8 && strings.Contains(msg, part) {
					t.Errorf("DiscordTokenAdvice(%q) = %q, which quotes the token (%q)", tt.value, msg, part)
				}
			}
		})
	}
}
