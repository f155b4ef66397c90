package discord

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestLongRateLimitEndsTheSend: Discord may answer a post with a 429 that asks to wait for
// hours (a slowmode the bot may not bypass, a long ban). Send waits out a rate limit only as
// long as its ctx allows, and then fails with an error the platform actor retries; it does not
// sleep through the wait with the chat's replies held behind it, whatever its ctx says. A send
// that comes back while the limit lasts fails at once, and one after it posts.
func TestLongRateLimitEndsTheSend(t *testing.T) {
	const dm, dm2 = "300000000000000001", "300000000000000002"
	srv := discordtest.New(t)
	srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
	srv.AddChannel(discordtest.Channel{ID: dm2, Type: discordgo.ChannelTypeDM})
	p, err := New(Config{Token: srv.Token(), Settings: config.Discord{APIURL: srv.APIURL()}})
	if err != nil {
		t.Fatal(err)
	}
	out := &platforms.Outbound{SessionKey: "agent:main:discord:dm:" + dm, Seq: 1, Text: "the reply", TurnEnd: true,
		Target: identity.Source{Platform: Name, ChatType: identity.ChatDM, ChatID: dm}}
	send := func(timeout time.Duration) error {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- p.Send(ctx, out) }()
		select {
		case err := <-done:
			return err
		case <-time.After(timeout + 10*time.Second):
			t.Fatalf("Send with a %v deadline has not returned after %v", timeout, timeout+10*time.Second)
			return nil
		}
	}

	srv.RateLimitNext("POST", "/channels/"+dm+"/messages", time.Hour, 1)
	err = send(time.Second)
	if err == nil || errors.Is(err, platforms.ErrUndeliverable) {
		t.Fatalf("Send rate limited for an hour = %v, want a retryable error", err)
	}
	if err := send(time.Second); err == nil {
		t.Errorf("Send again while the rate limit lasts = nil, want an error")
	}
	if n := len(srv.Sent(dm)); n != 0 {
		t.Errorf("posted %d messages while rate limited, want 0", n)
	}

	// A short rate limit (in another channel: limits are per channel) is waited out within
	// the send.
	out.Target.ChatID, out.SessionKey = dm2, "agent:main:discord:dm:"+dm2
	srv.RateLimitNext("POST", "/channels/"+dm2+"/messages", 50*time.Millisecond, 1)
	if err := send(10 * time.Second); err != nil {
		t.Errorf("Send rate limited for 50ms = %v, want nil", err)
	}
	if n := len(srv.Sent(dm2)); n != 1 {
		t.Errorf("posted %d messages, want 1", n)
	}
}

// TestLongRateLimitEndsTheDraftEdit: a streamed reply ends by editing its draft into the final
// reply, inside Send. A 429 on that edit asking to wait an hour ends the send within its
// deadline, with an error the platform actor retries; discordgo slept the hour, and the chat's
// final reply and every reply queued behind it waited. A send that comes back while the limit
// lasts fails without asking Discord; a short limit is waited out within the send.
func TestLongRateLimitEndsTheDraftEdit(t *testing.T) {
	const dm, dm2 = "300000000000000001", "300000000000000002"
	srv := discordtest.New(t)
	srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
	srv.AddChannel(discordtest.Channel{ID: dm2, Type: discordgo.ChannelTypeDM})
	p := mustNew(t, srv)
	reply := func(chat string) (*platforms.Outbound, string) {
		t.Helper()
		target := identity.Source{Platform: Name, ChatType: identity.ChatDM, ChatID: chat}
		draft, err := p.SendDraft(t.Context(), target, nil, "", "thinking")
		if err != nil {
			t.Fatalf("SendDraft = %v", err)
		}
		return &platforms.Outbound{SessionKey: "agent:main:discord:dm:" + chat, Seq: 1, Text: "the answer", TurnEnd: true,
			Target: target, DraftID: draft}, "/channels/" + chat + "/messages/" + draft
	}

	out, edit := reply(dm)
	srv.RateLimitNext("PATCH", edit, time.Hour, 1)
	send := func(ctx context.Context) error { return p.Send(ctx, out) }
	if err := mustReturnWithin(t, time.Second, send); err == nil || errors.Is(err, platforms.ErrUndeliverable) {
		t.Fatalf("Send whose draft edit is rate limited for an hour = %v, want a retryable error", err)
	}
	if err := mustReturnWithin(t, time.Second, send); err == nil {
		t.Errorf("Send again while the rate limit lasts = nil, want an error")
	}
	if n := srv.Requests("PATCH", edit); n != 1 {
		t.Errorf("%d edits reached Discord, want 1 (the one rate limited)", n)
	}
	if got := srv.Sent(dm); len(got) != 1 || got[0].Content != "thinking" {
		t.Errorf("channel holds %q, want only the draft, unchanged", contentsOf(got))
	}

	out, edit = reply(dm2)
	srv.RateLimitNext("PATCH", edit, 100*time.Millisecond, 1)
	if err := mustReturnWithin(t, 10*time.Second, send); err != nil {
		t.Errorf("Send whose draft edit is rate limited for 100ms = %v, want nil", err)
	}
	if got := srv.Sent(dm2); len(got) != 1 || got[0].Content != "the answer" {
		t.Errorf("channel holds %q, want the draft edited into the answer", contentsOf(got))
	}
}

// TestEveryCallWaitsOnlyWithinItsDeadline: every REST call of the platform, not only a post,
// waits out a 429 only as long as its ctx allows. Under a limit of an hour each call ends
// within its deadline (the typing indicator's is restTimeout), and a call while the limit
// lasts fails without asking Discord; a limit of 100ms is waited out and the call succeeds.
// discordgo's own handling slept the hour: a draft's edit or deletion held its chat, the
// channel lookup the gateway's reader, the backfill every channel after the one limited.
func TestEveryCallWaitsOnlyWithinItsDeadline(t *testing.T) {
	const guild, text, dm = "100000000000000001", "200000000000000001", "300000000000000001"
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	dmTarget := identity.Source{Platform: Name, ChatType: identity.ChatDM, ChatID: dm}
	type world struct {
		srv   *discordtest.Server
		draft string // the bot's draft in the DM
		msg   string // alice's message in the text channel
	}
	for _, tc := range []struct {
		name   string
		method string
		path   func(w *world) string
		call   func(ctx context.Context, p *Platform, w *world) error
		done   func(w *world) bool // whether the call took effect
	}{{
		name: "edit draft", method: "PATCH",
		path: func(w *world) string { return "/channels/" + dm + "/messages/" + w.draft },
		call: func(ctx context.Context, p *Platform, w *world) error {
			return p.EditDraft(ctx, dmTarget, w.draft, "more")
		},
		done: func(w *world) bool { return w.srv.Sent(dm)[0].Content == "more" },
	}, {
		name: "delete draft", method: "DELETE",
		path: func(w *world) string { return "/channels/" + dm + "/messages/" + w.draft },
		call: func(ctx context.Context, p *Platform, w *world) error { return p.DeleteDraft(ctx, dmTarget, w.draft) },
		done: func(w *world) bool { return len(w.srv.DeletedByBot()) == 1 },
	}, {
		name: "typing", method: "POST",
		path: func(*world) string { return "/channels/" + dm + "/typing" },
		call: func(_ context.Context, p *Platform, _ *world) error {
			p.sendTyping(dm) // on its own deadline; it logs what fails
			return nil
		},
		done: func(w *world) bool { return w.srv.Typing(dm) == 1 },
	}, {
		name: "channel lookup", method: "GET",
		path: func(*world) string { return "/channels/" + text },
		call: func(ctx context.Context, p *Platform, _ *world) error {
			info, err := p.fetchChannel(ctx, text)
			if err == nil && !info.threads {
				err = fmt.Errorf("fetchChannel = %+v, want a text channel", info)
			}
			return err
		},
	}, {
		name: "thread start", method: "POST",
		path: func(w *world) string { return "/channels/" + text + "/messages/" + w.msg + "/threads" },
		call: func(ctx context.Context, p *Platform, w *world) error {
			return p.startThread(ctx, text, w.msg, "hello")
		},
		done: func(w *world) bool { return len(w.srv.Threads()) == 1 },
	}, {
		name: "backfill page", method: "GET",
		path: func(*world) string { return "/channels/" + text + "/messages" },
		call: func(ctx context.Context, p *Platform, w *world) error {
			ms, err := p.history(ctx, text, "")
			if err == nil && (len(ms) != 1 || ms[0].ID != w.msg) {
				err = fmt.Errorf("history = %d messages, want alice's", len(ms))
			}
			return err
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			w := &world{srv: discordtest.New(t)}
			w.srv.AddGuild(guild, "guild")
			w.srv.AddChannel(discordtest.Channel{ID: text, GuildID: guild, Type: discordgo.ChannelTypeGuildText, Name: "general"})
			w.srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
			w.msg = w.srv.Post(discordtest.UserMessage{ChannelID: text, Author: alice, Content: "hello"}).ID
			p := mustNew(t, w.srv)
			var err error
			if w.draft, err = p.SendDraft(t.Context(), dmTarget, nil, "", "thinking"); err != nil {
				t.Fatalf("SendDraft = %v", err)
			}
			path := tc.path(w)
			call := func(ctx context.Context) error { return tc.call(ctx, p, w) }
			deadline := 2 * time.Second
			if tc.name == "typing" {
				deadline = restTimeout
			}

			w.srv.RateLimitNext(tc.method, path, time.Hour, 1)
			if err := mustReturnWithin(t, deadline, call); err == nil && tc.name != "typing" {
				t.Errorf("call rate limited for an hour = nil, want an error")
			}
			if err := mustReturnWithin(t, deadline, call); err == nil && tc.name != "typing" {
				t.Errorf("call again while the rate limit lasts = nil, want an error")
			}
			if n := w.srv.Requests(tc.method, path); n != 1 {
				t.Errorf("%d requests reached Discord, want 1 (the one rate limited)", n)
			}
			if tc.done != nil && tc.done(w) {
				t.Errorf("the call took effect under a rate limit of an hour")
			}

			// A new platform (nothing remembered) under a short limit.
			p = mustNew(t, w.srv)
			w.srv.RateLimitNext(tc.method, path, 100*time.Millisecond, 1)
			if err := mustReturnWithin(t, 10*time.Second, call); err != nil {
				t.Errorf("call rate limited for 100ms = %v, want nil", err)
			}
			if n := w.srv.Requests(tc.method, path); n != 3 {
				t.Errorf("%d requests reached Discord, want 3 (a 429 each, and the retry)", n)
			}
			if tc.done != nil && !tc.done(w) {
				t.Errorf("the call did not take effect after a rate limit of 100ms")
			}
		})
	}
}

// TestGlobalRateLimitHoldsEveryRoute: a 429 whose body says "global": true limits every route
// of the bot, not just the one that got it. Under a global limit of an hour, got by the typing
// indicator, a post, a draft's edit and a channel lookup each fail within their deadline
// without asking Discord (they went out, and only made the ban longer). A shorter one is waited
// out by a call on another route that has the time.
func TestGlobalRateLimitHoldsEveryRoute(t *testing.T) {
	const dm, text, guild = "300000000000000001", "200000000000000001", "100000000000000001"
	srv := discordtest.New(t)
	srv.AddGuild(guild, "guild")
	srv.AddChannel(discordtest.Channel{ID: text, GuildID: guild, Type: discordgo.ChannelTypeGuildText, Name: "general"})
	srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
	target := identity.Source{Platform: Name, ChatType: identity.ChatDM, ChatID: dm}
	p := mustNew(t, srv)
	draft, err := p.SendDraft(t.Context(), target, nil, "", "thinking")
	if err != nil {
		t.Fatalf("SendDraft = %v", err)
	}
	edit, post := "/channels/"+dm+"/messages/"+draft, "/channels/"+dm+"/messages"

	srv.GlobalRateLimitNext("POST", "/channels/"+dm+"/typing", time.Hour, 1)
	p.sendTyping(dm)
	out := &platforms.Outbound{SessionKey: "agent:main:discord:dm:" + dm, Seq: 1, Text: "the answer", Target: target}
	for _, c := range []struct {
		name         string
		method, path string
		call         func(context.Context) error
	}{
		{"Send", "POST", post, func(ctx context.Context) error { return p.Send(ctx, out) }},
		{"EditDraft", "PATCH", edit, func(ctx context.Context) error { return p.EditDraft(ctx, target, draft, "more") }},
		{"fetchChannel", "GET", "/channels/" + text, func(ctx context.Context) error { _, err := p.fetchChannel(ctx, text); return err }},
	} {
		before := srv.Requests(c.method, c.path)
		if err := mustReturnWithin(t, 2*time.Second, c.call); err == nil {
			t.Errorf("%s under a global rate limit of an hour = nil, want an error", c.name)
		}
		if n := srv.Requests(c.method, c.path) - before; n != 0 {
			t.Errorf("%s under a global rate limit made %d requests, want 0", c.name, n)
		}
	}
	if got := srv.Sent(dm); len(got) != 1 || got[0].Content != "thinking" {
		t.Errorf("channel holds %q, want only the draft, unchanged", contentsOf(got))
	}

	// A new platform (nothing remembered). The channel lookup gets a global limit longer than its
	// deadline and fails at once; the draft's edit has the time, and goes once the limit is over.
	p = mustNew(t, srv)
	const limit = 1500 * time.Millisecond
	srv.GlobalRateLimitNext("GET", "/channels/"+text, limit, 1)
	start := time.Now()
	if err := mustReturnWithin(t, limit/2, func(ctx context.Context) error { _, err := p.fetchChannel(ctx, text); return err }); err == nil {
		t.Fatalf("fetchChannel under a global limit past its deadline = nil, want an error")
	}
	if err := mustReturnWithin(t, 10*time.Second, func(ctx context.Context) error { return p.EditDraft(ctx, target, draft, "more") }); err != nil {
		t.Errorf("EditDraft after a global limit of %v = %v, want nil", limit, err)
	}
	if took := time.Since(start); took < limit {
		t.Errorf("EditDraft went %v after the global limit of %v began, want after it ended", took, limit)
	}
	if got := srv.Sent(dm); len(got) != 1 || got[0].Content != "more" {
		t.Errorf("channel holds %q, want the draft edited", contentsOf(got))
	}
	if n := srv.Requests("PATCH", edit); n != 1 {
		t.Errorf("%d edits reached Discord, want 1 (after the limit)", n)
	}
}

// TestRateLimitedGatewayLookupHoldsNoRun: Open looks the gateway's URL up over REST, discordgo's
// own call, and discordgo slept through a 429 on it inside Open, deaf to Run's ctx: a limit of
// an hour held the connection and the daemon's stop. Now Run ends with an error at once; the
// next Run waits the limit out without asking Discord again, fails at once when its deadline
// comes first, and a stop ends its wait.
func TestRateLimitedGatewayLookupHoldsNoRun(t *testing.T) {
	srv := discordtest.New(t)
	p := mustNew(t, srv)
	run := func(ctx context.Context) error {
		return p.Run(ctx, func(context.Context, *platforms.Inbound) (*platforms.Ack, error) { return &platforms.Ack{}, nil })
	}
	srv.RateLimitNext("GET", "/gateway", time.Hour, 1)
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("Run whose gateway lookup is rate limited for an hour = nil, want an error")
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Run whose gateway lookup is rate limited for an hour has not returned after 10s")
	}
	if err := mustReturnWithin(t, 2*time.Second, run); err == nil {
		t.Errorf("Run with a deadline before the limit ends = nil, want an error")
	}
	go func() { done <- run(ctx) }()
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run stopped while waiting out the limit = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Run stopped while waiting out the limit has not returned after 10s")
	}
	if n := srv.Requests("GET", "/gateway"); n != 1 {
		t.Errorf("%d gateway lookups reached Discord, want 1 (the one rate limited)", n)
	}
}

// TestRateLimitsAreLoggedOnceAMinute: a bot that meets 429 after 429 logs one line a minute,
// counting them, not one per 429.
func TestRateLimitsAreLoggedOnceAMinute(t *testing.T) {
	const dm = "300000000000000001"
	srv := discordtest.New(t)
	srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
	var buf testutil.Buffer
	p, err := New(Config{Token: srv.Token(), Settings: config.Discord{APIURL: srv.APIURL()},
		Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	target := identity.Source{Platform: Name, ChatType: identity.ChatDM, ChatID: dm}
	for i := range 3 {
		srv.RateLimitNext("POST", "/channels/"+dm+"/messages", 10*time.Millisecond, 1)
		if _, err := p.SendDraft(t.Context(), target, nil, "", fmt.Sprint("draft ", i)); err != nil {
			t.Fatalf("SendDraft %d = %v", i, err)
		}
	}
	if n := srv.Requests("POST", "/channels/"+dm+"/messages"); n != 6 {
		t.Fatalf("%d posts reached Discord, want 6 (a 429 and the retry, three times)", n)
	}
	if n := strings.Count(buf.String(), `msg="discord rate limit"`); n != 1 {
		t.Errorf("three 429s within a minute logged %d lines, want 1:\n%s", n, buf.String())
	}
	if !strings.Contains(buf.String(), "limits=1") {
		t.Errorf("the line does not count its 429 (limits=1):\n%s", buf.String())
	}
}

// TestEdgeBlockIsWaitedOut: Discord's edge (Cloudflare) answers a host it blocks with a 429
// whose body is an HTML page, with or without a Retry-After header. discordgo failed such a
// call with a JSON syntax error, and every caller tried again at once, each try one more
// invalid request that kept the block on. Now it is a global rate limit: of the Retry-After
// header's length, or, without one, of a backoff (10 s at first); calls on every route wait it
// out within their deadline, and fail at once without asking Discord past it.
func TestEdgeBlockIsWaitedOut(t *testing.T) {
	const dm, text, guild = "300000000000000001", "200000000000000001", "100000000000000001"
	for _, tc := range []struct {
		name       string
		retryAfter time.Duration // of the 429's Retry-After header; 0 sends none
		blockWait  time.Duration // the backoff without one; 0 keeps blockWaitFirst
		waits      bool          // whether a call with 10 s to go waits it out and succeeds
	}{
		{name: "an hour's Retry-After", retryAfter: time.Hour},
		{name: "no Retry-After", retryAfter: 0},
		{name: "a second's Retry-After", retryAfter: time.Second, waits: true},
		{name: "no Retry-After, a short backoff", blockWait: 200 * time.Millisecond, waits: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.blockWait > 0 {
				SetBlockWait(t, tc.blockWait)
			}
			srv := discordtest.New(t)
			srv.AddGuild(guild, "guild")
			srv.AddChannel(discordtest.Channel{ID: text, GuildID: guild, Type: discordgo.ChannelTypeGuildText, Name: "general"})
			srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
			var buf testutil.Buffer
			p, err := New(Config{Token: srv.Token(), Settings: config.Discord{APIURL: srv.APIURL()},
				Logger: slog.New(slog.NewTextHandler(&buf, nil))})
			if err != nil {
				t.Fatal(err)
			}
			post := "/channels/" + dm + "/messages"
			out := &platforms.Outbound{SessionKey: "agent:main:discord:dm:" + dm, Seq: 1, Text: "the answer", TurnEnd: true,
				Target: identity.Source{Platform: Name, ChatType: identity.ChatDM, ChatID: dm}}
			send := func(ctx context.Context) error { return p.Send(ctx, out) }
			srv.BlockNext("POST", post, tc.retryAfter, 1)

			if tc.waits {
				start := time.Now()
				if err := mustReturnWithin(t, 10*time.Second, send); err != nil {
					t.Fatalf("Send blocked briefly = %v, want nil", err)
				}
				wait := cmp.Or(tc.retryAfter, tc.blockWait)
				if took := time.Since(start); took < wait {
					t.Errorf("Send posted %v after the block began, want after its %v", took, wait)
				}
				if n := srv.Requests("POST", post); n != 2 {
					t.Errorf("%d posts reached Discord, want 2 (the blocked one, and one after the wait)", n)
				}
				if got := srv.Sent(dm); len(got) != 1 || got[0].Content != "the answer" {
					t.Errorf("channel holds %q, want the answer once", contentsOf(got))
				}
				return
			}
			if err := mustReturnWithin(t, 2*time.Second, send); err == nil || errors.Is(err, platforms.ErrUndeliverable) {
				t.Fatalf("Send blocked past its deadline = %v, want a retryable error", err)
			}
			if err := mustReturnWithin(t, 2*time.Second, send); err == nil {
				t.Errorf("Send again while blocked = nil, want an error")
			}
			lookup := func(ctx context.Context) error { _, err := p.fetchChannel(ctx, text); return err }
			if err := mustReturnWithin(t, 2*time.Second, lookup); err == nil {
				t.Errorf("a channel lookup while blocked = nil, want an error (the block holds every route)")
			}
			if n := srv.Requests("", ""); n != 1 {
				t.Errorf("%d requests reached Discord, want 1 (the blocked post): retries made the block last", n)
			}
			if !strings.Contains(buf.String(), "blocked=true") || !strings.Contains(buf.String(), "global=true") {
				t.Errorf("the rate limit line does not say the host is blocked:\n%s", buf.String())
			}
		})
	}
}

// TestWhichA429IsDiscords: a 429 whose body says how long to wait is Discord's own and is left
// as it is; any other (an edge's page, a JSON error without retry_after) is a block, whose wait
// the Retry-After header gives, in seconds or as a date.
func TestWhichA429IsDiscords(t *testing.T) {
	for body, want := range map[string]bool{
		`{"message": "You are being rate limited.", "retry_after": 0.5, "global": false}`:    true,
		`{"message": "You are being rate limited.", "retry_after": 0}`:                       true,
		`{"message": "You are being blocked from accessing our API temporarily", "code": 0}`: false,
		`<!DOCTYPE html><html><title>Error 1015</title></html>`:                              false,
		``: false,
	} {
		if got := discordsOwn429([]byte(body)); got != want {
			t.Errorf("discordsOwn429(%q) = %v, want %v", body, got, want)
		}
	}
	now := time.Date(2025, time.January, 1, 0, 0, 0, 0, time.UTC)
	for header, want := range map[string]time.Duration{
		"":                              0,
		"0":                             0,
		"-5":                            0,
		"soon":                          0,
		"120":                           2 * time.Minute,
		"1.5":                           1500 * time.Millisecond,
		"99999999999":                   maxRetryAfter,
		"Wed, 01 Jan 2025 00:01:00 GMT": time.Minute,
		"Tue, 31 Dec 2024 23:00:00 GMT": 0,
	} {
		h := http.Header{}
		if header != "" {
			h.Set("Retry-After", header)
		}
		if got, ok := retryAfter(h, now); got != want || ok != (want > 0) {
			t.Errorf("retryAfter(%q) = %v, %v; want %v, %v", header, got, ok, want, want > 0)
		}
	}
}

// TestBlockBackoff: without a Retry-After, a block's wait doubles from blockWaitFirst up to
// blockWaitMax while its 429s keep coming; the 429s of requests that were out together share
// one wait; Discord's answering again starts the backoff over.
func TestBlockBackoff(t *testing.T) {
	first := time.Duration(blockWaitFirst.Load())
	var b blockedAs429
	now := time.Date(2025, time.January, 1, 0, 0, 0, 0, time.UTC)
	want := first
	for i := range 10 {
		if got := b.backoff(now); got != want {
			t.Fatalf("wait %d = %v, want %v", i, got, want)
		}
		if got := b.backoff(now.Add(time.Second)); got != want-time.Second {
			t.Errorf("wait %d of a request that was out with it = %v, want the rest of the same wait, %v", i, got, want-time.Second)
		}
		now = now.Add(want)
		want = min(2*want, blockWaitMax)
	}
	if want != blockWaitMax {
		t.Errorf("after 10 waits the next is %v, want blockWaitMax %v", want, blockWaitMax)
	}
	b.next = roundTripFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
	})
	req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1/", nil)
	if _, err := b.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if got := b.backoff(now); got != first {
		t.Errorf("wait after Discord answered again = %v, want %v", got, first)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func mustNew(t *testing.T, srv *discordtest.Server) *Platform {
	t.Helper()
	p, err := New(Config{Token: srv.Token(), Settings: config.Discord{APIURL: srv.APIURL()}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// mustReturnWithin runs call with a ctx that ends after d and returns its error. It fails t
// when call has not returned 10 s after that: it is sleeping through a rate limit, deaf to ctx.
func mustReturnWithin(t *testing.T, d time.Duration, call func(context.Context) error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- call(ctx) }()
	select {
	case err := <-done:
		return err
	case <-time.After(d + 10*time.Second):
		t.Fatalf("a call with a %v deadline has not returned after %v", d, d+10*time.Second)
		return nil
	}
}

func contentsOf(ms []*discordgo.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Content
	}
	return out
}
