package discordtest_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// restCode returns the status and Discord error code of a *discordgo.RESTError.
func restCode(err error) (status, code int, ok bool) {
	var rerr *discordgo.RESTError
	if !errors.As(err, &rerr) {
		return 0, 0, false
	}
	if rerr.Message != nil {
		code = rerr.Message.Code
	}
	return rerr.Response.StatusCode, code, true
}

// TestContentStripped: as Discord does, the fake keeps a message's content without the control
// characters but tab, line feed, carriage return and ESC (which ansi code blocks use), and
// without bidirectional overrides; Posted shows the content as the request carried it.
func TestContentStripped(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	dg := newSession(t, srv, "Bot "+srv.Token())
	const sent = "a\x07b\u0085c\u202ed\t\x1b[31me\x1b[0m\r\n"
	m, err := dg.ChannelMessageSend(channelID, sent)
	if err != nil {
		t.Fatal(err)
	}
	if want := "abcd\t\x1b[31me\x1b[0m\r\n"; m.Content != want {
		t.Errorf("content %q, want %q", m.Content, want)
	}
	if got := srv.Posted(channelID); len(got) != 1 || got[0] != sent {
		t.Errorf("Posted = %q, want [%q]", got, sent)
	}
}

// REST calls need no gateway connection.
func TestRESTErrors(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	dg := newSession(t, srv, "Bot "+srv.Token())
	fromAlice := srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "mine"})
	no := false

	tests := []struct {
		name       string
		call       func() error
		wantStatus int
		wantCode   int
	}{
		{"unknown channel", func() error {
			_, err := dg.ChannelMessageSend("1", "x")
			return err
		}, 404, 10003},
		{"get unknown channel", func() error {
			_, err := dg.Channel("1")
			return err
		}, 404, 10003},
		{"too long", func() error {
			_, err := dg.ChannelMessageSend(channelID, strings.Repeat("é", 2001))
			return err
		}, 400, 50035},
		{"empty", func() error {
			_, err := dg.ChannelMessageSend(channelID, "")
			return err
		}, 400, 50006},
		{"only what Discord strips", func() error {
			_, err := dg.ChannelMessageSend(channelID, "\x07\x08 \u202e\n")
			return err
		}, 400, 50006},
		{"edit too long", func() error {
			m, err := dg.ChannelMessageSend(channelID, "short")
			if err != nil {
				return err
			}
			_, err = dg.ChannelMessageEdit(channelID, m.ID, strings.Repeat("x", 2001))
			return err
		}, 400, 50035},
		{"edit someone else's", func() error {
			_, err := dg.ChannelMessageEdit(channelID, fromAlice.ID, "hijack")
			return err
		}, 403, 50005},
		{"edit unknown message", func() error {
			_, err := dg.ChannelMessageEdit(channelID, "1", "x")
			return err
		}, 404, 10008},
		{"reply to unknown message", func() error {
			_, err := dg.ChannelMessageSendReply(channelID, "x", &discordgo.MessageReference{MessageID: "1"})
			return err
		}, 400, 50035},
		{"thread in a DM", func() error {
			m, err := dg.ChannelMessageSend(dmID, "x")
			if err != nil {
				return err
			}
			_, err = dg.MessageThreadStart(dmID, m.ID, "t", 60)
			return err
		}, 400, 50024},
		{"unknown route", func() error {
			_, err := dg.Request("GET", discordgo.EndpointAPI+"no/such/route", nil)
			return err
		}, 404, 0},
		{"wrong token", func() error {
			bad := newSession(t, srv, "Bot wrong")
			_, err := bad.ChannelMessageSend(channelID, "x")
			return err
		}, 401, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			status, code, ok := restCode(err)
			if !ok || status != tt.wantStatus || code != tt.wantCode {
				t.Errorf("error = %v, want a RESTError %d with code %d", err, tt.wantStatus, tt.wantCode)
			}
		})
	}

	// Limits count characters, not bytes; a reference that need not exist is dropped.
	if _, err := dg.ChannelMessageSend(channelID, strings.Repeat("é", 2000)); err != nil {
		t.Errorf("ChannelMessageSend(2000 runes) = %v, want success", err)
	}
	m, err := dg.ChannelMessageSendReply(channelID, "x", &discordgo.MessageReference{MessageID: "1", FailIfNotExists: &no})
	if err != nil || m.MessageReference != nil {
		t.Errorf("reply to unknown message with fail_if_not_exists=false = %+v, %v; want a plain message", m, err)
	}
}

func TestRESTReads(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	dg := newSession(t, srv, "Bot "+srv.Token())

	me, err := dg.User("@me")
	if err != nil || me.ID != srv.BotID() || !me.Bot {
		t.Errorf("User(@me) = %+v, %v; want the bot %s", me, err, srv.BotID())
	}
	ch, err := dg.Channel(channelID)
	if err != nil || ch.GuildID != guildID || ch.Name != "general" || ch.Type != discordgo.ChannelTypeGuildText {
		t.Errorf("Channel(%s) = %+v, %v; want the guild text channel", channelID, ch, err)
	}
	srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "hi"})
	dm, err := dg.Channel(dmID)
	if err != nil || dm.Type != discordgo.ChannelTypeDM || dm.GuildID != "" || len(dm.Recipients) != 1 || dm.Recipients[0].ID != alice.ID {
		t.Errorf("Channel(DM) = %+v, %v; want a DM with alice", dm, err)
	}
	gw, err := dg.GatewayBot()
	if err != nil || gw.URL != srv.GatewayURL()+"/" || gw.Shards != 1 {
		t.Errorf("GatewayBot() = %+v, %v; want %s/ and 1 shard", gw, err, srv.GatewayURL())
	}
}

func TestFailNext(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	dg := newSession(t, srv, "Bot "+srv.Token())
	rateLimited := make(chan *discordgo.RateLimit, 10)
	dg.AddHandler(func(_ *discordgo.Session, rl *discordgo.RateLimit) { rateLimited <- rl })

	// discordgo retries a 502 up to MaxRestRetries (3) times by itself.
	srv.FailNext("POST", "/messages", http.StatusBadGateway, 3)
	if _, err := dg.ChannelMessageSend(channelID, "after three 502s"); err != nil {
		t.Errorf("ChannelMessageSend after three 502s = %v, want success", err)
	}
	srv.FailNext("POST", "/messages", http.StatusBadGateway, 4)
	_, err := dg.ChannelMessageSend(channelID, "after four 502s")
	if err == nil || !strings.Contains(err.Error(), "Exceeded Max retries") {
		t.Errorf("ChannelMessageSend after four 502s = %v, want discordgo's retries exhausted", err)
	}

	// It waits out a 429 and retries.
	srv.FailNext("POST", "/messages", http.StatusTooManyRequests, 1)
	if _, err := dg.ChannelMessageSend(channelID, "after a 429"); err != nil {
		t.Errorf("ChannelMessageSend after a 429 = %v, want success", err)
	}
	if rl := mustRecv(t, rateLimited, "a RateLimit event"); rl.RetryAfter <= 0 || rl.Message != "You are being rate limited." {
		t.Errorf("RateLimit = %+v, want Discord's 429 body", rl.TooManyRequests)
	}

	// Other errors come back to the caller at once.
	srv.FailNext("", "/typing", http.StatusInternalServerError, 1)
	if status, _, _ := restCode(dg.ChannelTyping(channelID)); status != 500 {
		t.Errorf("ChannelTyping status = %d, want 500", status)
	}
	if err := dg.ChannelTyping(channelID); err != nil {
		t.Errorf("ChannelTyping after the fault = %v, want success", err)
	}
	if got := srv.Typing(channelID); got != 1 {
		t.Errorf("Typing() = %d, want 1 (a failed request has no effect)", got)
	}

	sent := srv.Sent(channelID)
	if len(sent) != 2 || sent[0].Content != "after three 502s" || sent[1].Content != "after a 429" {
		t.Errorf("Sent() = %v, want the two messages that got through, once each", sent)
	}
}

// A global 429 has Discord's form: "global": true in the body, X-RateLimit-Global and the global
// scope, and none of the route's headers (discordgo would read them as the route's). Requests
// counts what was answered, the 429 included.
func TestGlobalRateLimitNext(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	srv.GlobalRateLimitNext("POST", "/typing", 90*time.Second, 1)
	typing := func() *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, discordgo.EndpointChannelTyping(channelID), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bot "+srv.Token())
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatalf("POST typing: %v", err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	resp := typing()
	var body struct {
		RetryAfter float64 `json:"retry_after"`
		Global     bool    `json:"global"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("decode the 429's body: %v", err)
	}
	if resp.StatusCode != http.StatusTooManyRequests || body.RetryAfter != 90 || !body.Global {
		t.Errorf("POST typing = %d %+v, want 429 with retry_after 90 and global", resp.StatusCode, body)
	}
	h := resp.Header
	if h.Get("X-RateLimit-Global") != "true" || h.Get("X-RateLimit-Scope") != "global" || h.Get("Retry-After") != "90" {
		t.Errorf("429 headers = %v, want X-RateLimit-Global true, scope global, Retry-After 90", h)
	}
	for _, k := range []string{"X-RateLimit-Bucket", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Reset-After"} {
		if v := h.Get(k); v != "" {
			t.Errorf("global 429 has %s: %s, want none", k, v)
		}
	}
	if resp := typing(); resp.StatusCode != http.StatusNoContent || resp.Header.Get("X-RateLimit-Bucket") == "" {
		t.Errorf("POST typing after the 429 = %d with headers %v, want 204 with the route's headers", resp.StatusCode, resp.Header)
	}
	if got := srv.Requests("POST", "/channels/"+channelID+"/typing"); got != 2 {
		t.Errorf("Requests(POST typing) = %d, want 2", got)
	}
	if got := srv.Requests("", "/typing"); got != 2 {
		t.Errorf("Requests(any typing) = %d, want 2", got)
	}
	if got := srv.Typing(channelID); got != 1 {
		t.Errorf("Typing() = %d, want 1 (the 429 had no effect)", got)
	}
}

// A response lost after the message was posted makes discordgo's retry post it twice,
// unless the body carries a nonce with enforce_nonce (which discordgo's MessageSend lacks).
func TestEnforceNonce(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	dg := newSession(t, srv, "Bot "+srv.Token())
	endpoint := discordgo.EndpointChannelMessages(channelID)

	srv.FailNextAfter("POST", "/messages", http.StatusBadGateway, 1)
	body := map[string]any{"content": "once", "nonce": "n-1", "enforce_nonce": true}
	resp, err := dg.RequestWithBucketID("POST", endpoint, body, endpoint)
	if err != nil {
		t.Fatalf("POST with enforce_nonce after a lost response = %v", err)
	}
	if sent := srv.Sent(channelID); len(sent) != 1 || !strings.Contains(string(resp), sent[0].ID) {
		t.Errorf("Sent() = %v, response %s; want one message, returned by the retry", sent, resp)
	}

	srv.FailNextAfter("POST", "/messages", http.StatusBadGateway, 1)
	if _, err := dg.ChannelMessageSend(channelID, "twice"); err != nil {
		t.Fatalf("ChannelMessageSend after a lost response = %v", err)
	}
	if sent := srv.Sent(channelID); len(sent) != 3 {
		t.Errorf("Sent() = %v, want the message without a nonce posted twice", sent)
	}
}

// Discord enforces a nonce for a few minutes only (NonceWindow on the fake clock): a post that
// repeats it later creates another message. The history does not show nonces.
func TestNonceWindow(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	dg := newSession(t, srv, "Bot "+srv.Token())
	endpoint := discordgo.EndpointChannelMessages(channelID)
	post := func() {
		t.Helper()
		body := map[string]any{"content": "once", "nonce": "n-1", "enforce_nonce": true}
		if _, err := dg.RequestWithBucketID("POST", endpoint, body, endpoint); err != nil {
			t.Fatalf("POST with enforce_nonce = %v", err)
		}
	}
	post()
	srv.Advance(discordtest.NonceWindow - time.Second)
	post()
	if sent := srv.Sent(channelID); len(sent) != 1 {
		t.Errorf("Sent() within the window = %d messages, want one", len(sent))
	}
	srv.Advance(time.Second)
	post()
	if sent := srv.Sent(channelID); len(sent) != 2 {
		t.Errorf("Sent() after the window = %d messages, want 2 (the message posted again)", len(sent))
	}
	history, err := dg.RequestWithBucketID("GET", endpoint+"?limit=10", nil, endpoint)
	if err != nil {
		t.Fatalf("GET messages = %v", err)
	}
	if strings.Contains(string(history), "nonce") {
		t.Errorf("the history shows nonces: %s", history)
	}
}

func TestClientRefusesOtherHosts(t *testing.T) {
	t.Parallel()
	srv := discordtest.New(t)
	resp, err := srv.Client().Get("https://example.com/")
	if err == nil {
		resp.Body.Close()
		t.Fatal("Client().Get(example.com) succeeded, want a refusal")
	}
	if !strings.Contains(err.Error(), "refusing") {
		t.Errorf("Client().Get(example.com) = %v, want a refusal", err)
	}
}

func TestWithToken(t *testing.T) {
	t.Parallel()
	srv := discordtest.New(t, discordtest.WithToken("Bot custom"))
	if got := srv.Token(); got != "custom" {
		t.Errorf("Token() = %q, want %q", got, "custom")
	}
	if _, err := newSession(t, srv, "Bot custom").User("@me"); err != nil {
		t.Errorf("User(@me) with the custom token = %v", err)
	}
}

// TestChannelHistory: Get Channel Messages with after returns the first messages after it, and
// with before the newest ones older than it, newest first, in the REST form (no guild_id); a
// bad limit or channel is refused.
func TestChannelHistory(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	dg := newSession(t, srv, "Bot "+srv.Token())
	var ids []string
	for _, text := range []string{"one", "two", "three"} {
		ids = append(ids, srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: text}).ID)
	}
	for _, tc := range []struct {
		before, after string
		limit         int
		want          []string // contents, as returned
	}{
		{"", ids[0], 100, []string{"three", "two"}},
		{"", ids[0], 1, []string{"two"}},
		{"", ids[2], 100, nil},
		{"", "", 2, []string{"three", "two"}},     // neither: the newest
		{ids[2], "", 100, []string{"two", "one"}}, // before: the newest older than it
		{ids[2], "", 1, []string{"two"}},
		{ids[0], "", 100, nil},
	} {
		ms, err := dg.ChannelMessages(channelID, tc.limit, tc.before, tc.after, "")
		if err != nil {
			t.Fatalf("ChannelMessages(before %s, after %s, limit %d): %v", tc.before, tc.after, tc.limit, err)
		}
		var got []string
		for _, m := range ms {
			got = append(got, m.Content)
			if m.GuildID != "" {
				t.Errorf("history message %s has guild_id %q; REST messages carry none", m.ID, m.GuildID)
			}
		}
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("ChannelMessages(before %s, after %s, limit %d) = %q, want %q", tc.before, tc.after, tc.limit, got, tc.want)
		}
	}
	if _, err := dg.ChannelMessages("1", 10, "", ids[0], ""); err == nil {
		t.Error("history of an unknown channel: no error")
	} else if status, code, _ := restCode(err); status != 404 || code != 10003 {
		t.Errorf("history of an unknown channel: %d/%d, want 404/10003", status, code)
	}
}

// TestRolesAndRoleMentions: a guild's roles (@everyone, then those added) come with its
// GUILD_CREATE and from GET guilds/{g}/roles, the bot's managed and tagged with its id; a
// message that mentions a role carries it in its content and mention_roles.
func TestRolesAndRoleMentions(t *testing.T) {
	t.Parallel()
	const botRole = "700000000000000001"
	srv := newWorld(t)
	srv.AddRole(guildID, discordtest.Role{ID: botRole, Name: "agentgate", BotID: srv.BotID()})
	c := mustOpen(t, srv, allIntents)
	g := mustRecv(t, c.guilds, "GUILD_CREATE")
	if len(g.Roles) != 2 || g.Roles[0].ID != guildID || g.Roles[1].ID != botRole || !g.Roles[1].Managed {
		t.Errorf("GUILD_CREATE roles = %+v, want @everyone and the bot's managed role", g.Roles)
	}
	body, err := c.Request(http.MethodGet, discordgo.EndpointGuildRoles(guildID), nil)
	if err != nil {
		t.Fatalf("GET guild roles = %v", err)
	}
	var roles []struct {
		ID   string            `json:"id"`
		Tags map[string]string `json:"tags"`
	}
	if err := json.Unmarshal(body, &roles); err != nil || len(roles) != 2 || roles[1].Tags["bot_id"] != srv.BotID() {
		t.Errorf("GET guild roles = %s (%v), want the bot's role tagged with bot_id %s", body, err, srv.BotID())
	}
	m := srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "hi", MentionRoles: []string{botRole}})
	got := mustRecv(t, c.messages, "MESSAGE_CREATE")
	for _, x := range []*discordgo.Message{m, got.Message} {
		if x.Content != "<@&"+botRole+"> hi" || len(x.MentionRoles) != 1 || x.MentionRoles[0] != botRole {
			t.Errorf("message = %q mentioning roles %v, want the role's mention", x.Content, x.MentionRoles)
		}
	}
}

// TestBlockNext: the edge's block is a 429 with an HTML body, a Retry-After header when asked
// for, and none of Discord's rate-limit headers.
func TestBlockNext(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	for _, retryAfter := range []time.Duration{0, 1500 * time.Millisecond} {
		srv.BlockNext("GET", "/channels/"+channelID, retryAfter, 1)
		req, _ := http.NewRequest(http.MethodGet, srv.APIURL()+"channels/"+channelID, nil)
		req.Header.Set("Authorization", "Bot "+srv.Token())
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := map[time.Duration]string{0: "", 1500 * time.Millisecond: "2"}[retryAfter]
		if resp.StatusCode != http.StatusTooManyRequests || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
			resp.Header.Get("Retry-After") != want || resp.Header.Get("X-RateLimit-Bucket") != "" {
			t.Errorf("blocked answer = %d %v, want 429 text/html, Retry-After %q, no X-RateLimit-*", resp.StatusCode, resp.Header, want)
		}
	}
}
