package discord

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
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
