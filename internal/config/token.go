package config

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MinTokenLength is the shortest bearer token TokenAdvice does not warn of.
const MinTokenLength = 16

// TokenAdvice returns what serve warns of in the HTTP API's bearer token, which getenv reads
// from http.token_env, and starts with all the same: a token shorter than MinTokenLength, which
// can be guessed (AG_TOKEN=x was taken without a word, found by a security walkthrough). A
// *FieldError of http.token_env that never holds the token. An unset variable is Preflight's.
func (c *Config) TokenAdvice(getenv func(string) string) []error {
	if c.HTTP.TokenEnv == "" {
		return nil
	}
	token := strings.TrimSpace(getenv(c.HTTP.TokenEnv))
	if n := utf8.RuneCountInString(token); n == 0 || n >= MinTokenLength {
		return nil
	}
	return []error{&FieldError{Field: "http.token_env", Value: c.HTTP.TokenEnv, Err: fmt.Errorf("holds a token shorter than %d "+
		"characters, which can be guessed: use a long random one, such as the output of openssl rand -hex 32", MinTokenLength)}}
}

// DiscordTokenAdvice returns what serve warns of in the Discord bot token, which getenv reads
// from platforms.discord.token_env, and starts with all the same: a value of a shape no bot
// token has, most likely something else pasted in its place (the application's client secret
// or ID, the "Bearer " header form, two values run together). A bot token is three
// dot-separated base64url parts (the bot's ID, a timestamp, a signature). Only the connection
// tells whether a token is right, and Discord may change the format, so this is no refusal;
// before, check-config said "config ok" of any value, and the first word of it was the
// connection's refusal. A *FieldError of platforms.discord.token_env that never holds the
// token. The value is read as the platform reads it (white space around it and a "Bot " in
// front cut); an unset variable, or one holding the prefix alone, is Preflight's.
func (c *Config) DiscordTokenAdvice(getenv func(string) string) []error {
	dc := c.Platforms.Discord
	if !dc.Enabled || dc.TokenEnv == "" {
		return nil
	}
	t := strings.TrimSpace(getenv(dc.TokenEnv))
	if len(t) > 4 && strings.EqualFold(t[:4], "bot ") {
		t = strings.TrimSpace(t[4:])
	}
	why := botTokenShape(t)
	if why == "" {
		return nil
	}
	return []error{&FieldError{Field: "platforms.discord.token_env", Value: dc.TokenEnv, Err: fmt.Errorf("holds a value that does not look like "+
		"a bot token: %s; copy the token from the Developer Portal's Bot page (Reset Token shows a new one); serve starts with it all "+
		"the same, in case Discord changed the format, and Discord refuses a wrong one at the connection", why)}}
}

// botTokenShape says what in t, a bot token as the platform sends it, no bot token has: "" when
// nothing does (or t is empty, or the prefix alone, which Preflight refuses).
func botTokenShape(t string) string {
	switch {
	case t == "" || strings.EqualFold(t, "bot"):
		return ""
	case len(t) > 7 && strings.EqualFold(t[:7], "bearer "):
		return `it starts with "Bearer ", an OAuth2 access token's header form, where agentgate sends the bot token with "Bot " itself: set the token alone`
	case strings.ContainsFunc(t, unicode.IsSpace):
		return "it holds white space, which no bot token does (two values pasted together?)"
	case strings.Trim(t, "0123456789") == "":
		return "it is all digits, the form of the application's (client) ID or a user's ID, not of a bot token"
	case !strings.Contains(t, "."):
		return "it has no dots, where a bot token is three parts separated by dots (the bot's ID, a timestamp, a signature): the client secret or the public key pasted in its place?"
	}
	parts := strings.Split(t, ".")
	base64url := func(p string) bool {
		return p != "" && strings.Trim(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") == ""
	}
	if len(parts) != 3 || !base64url(parts[0]) || !base64url(parts[1]) || !base64url(parts[2]) {
		return "it is not three parts of letters, digits, - and _ separated by dots, the form of a bot token"
	}
	return ""
}
