package discord

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// rateLimitLines returns the "discord rate limit" lines of log.
func rateLimitLines(log string) []string {
	var out []string
	for l := range strings.Lines(log) {
		if strings.Contains(l, `msg="discord rate limit"`) {
			out = append(out, l)
		}
	}
	return out
}

// TestLogsNameTheURLRequested: with api_url set (a REST proxy), the rate limit line and the
// error of a request that found nothing listening name the URL requested, not Discord's own,
// which sent the operator to look at discord.com for a proxy that was down.
func TestLogsNameTheURLRequested(t *testing.T) {
	const dm = "300000000000000001"
	t.Run("rate limit", func(t *testing.T) {
		srv := discordtest.New(t)
		srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
		var buf testutil.Buffer
		p, err := New(Config{Token: srv.Token(), Settings: config.Discord{APIURL: srv.APIURL()},
			Logger: slog.New(slog.NewTextHandler(&buf, nil))})
		if err != nil {
			t.Fatal(err)
		}
		srv.RateLimitNext("POST", "/channels/"+dm+"/messages", 10*time.Millisecond, 1)
		target := identity.Source{Platform: Name, ChatType: identity.ChatDM, ChatID: dm}
		if _, err := p.SendDraft(t.Context(), target, nil, "", "draft"); err != nil {
			t.Fatalf("SendDraft = %v", err)
		}
		lines := rateLimitLines(buf.String())
		if want := "url=" + srv.APIURL() + "channels/" + dm + "/messages"; len(lines) != 1 || !strings.Contains(lines[0], want) {
			t.Errorf("rate limit lines = %q, want one with %s", lines, want)
		}
	})
	t.Run("nothing listening", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		api := fmt.Sprintf("http://%s/api/v9/", ln.Addr())
		ln.Close()
		p, err := New(Config{Token: "token", Settings: config.Discord{APIURL: api}})
		if err != nil {
			t.Fatal(err)
		}
		err = p.Run(t.Context(), nil)
		if err == nil || !strings.Contains(err.Error(), `"`+api+`gateway"`) || strings.Contains(err.Error(), "discord.com") {
			t.Errorf("Run = %v, want the failed request to %sgateway", err, api)
		}
	})
}

// TestEdgeBlockAfterARouteLimitIsLogged: an edge's block (a 429 that is not Discord's own) that
// comes within a minute of a route's 429 is logged all the same, with blocked=true, which the
// runbook points to: the lines of both shared one a minute, and the route's held the block's
// back.
func TestEdgeBlockAfterARouteLimitIsLogged(t *testing.T) {
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
	post := "/channels/" + dm + "/messages"
	srv.RateLimitNext("POST", post, 10*time.Millisecond, 1)
	if _, err := p.SendDraft(t.Context(), target, nil, "", "first"); err != nil {
		t.Fatalf("SendDraft = %v", err)
	}
	srv.BlockNext("POST", post, 50*time.Millisecond, 1)
	if _, err := p.SendDraft(t.Context(), target, nil, "", "second"); err != nil {
		t.Fatalf("SendDraft = %v", err)
	}
	lines := rateLimitLines(buf.String())
	if len(lines) != 2 || strings.Contains(lines[0], "blocked=") || !strings.Contains(lines[1], "blocked=true") || !strings.Contains(lines[1], "global=true") {
		t.Errorf("rate limit lines = %q, want the route's, then the block's with blocked=true", lines)
	}
}
