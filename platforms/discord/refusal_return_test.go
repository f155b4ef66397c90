package discord_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestRefusalEndsRunWhenAsked: with Config.ReturnRefusal (a cluster member's), a connection
// Discord refuses for good, at the connect or once live, ends Run at once with a RefusedError
// that says to try again in 30 minutes, after the one ERR line, and Ready says what to change;
// Run does not wait the 30 minutes itself. Before, Run kept waiting, and a cluster member held
// the gateway lease all that time while no other member could connect.
func TestRefusalEndsRunWhenAsked(t *testing.T) {
	tests := []struct {
		name   string
		refuse func(srv *discordtest.Server)
		live   bool // refuse once the platform is connected
		fix    string
	}{
		{"4004", func(srv *discordtest.Server) { srv.RefuseNext(4004, 1) }, false, "the bot token was refused (gateway close 4004)"},
		{"4004 live", func(srv *discordtest.Server) { srv.RefuseNext(4004, 1); srv.CloseLive(4004) }, true, "the bot token was refused (gateway close 4004)"},
		{"401", func(srv *discordtest.Server) { srv.FailNext(http.MethodGet, "/gateway", http.StatusUnauthorized, 1) }, false, "the bot token was refused (HTTP 401)"},
		{"4014", func(srv *discordtest.Server) { srv.RefuseNext(4014, 1) }, false, "the message content intent was refused (gateway close 4014)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			discord.SetRetryAfter(t, func(time.Duration) <-chan time.Time {
				t.Error("Run waits to try again itself")
				return nil
			})
			srv := discordtest.New(t)
			log := &testutil.Buffer{}
			settings := config.Default().Platforms.Discord
			settings.APIURL = srv.APIURL()
			p, err := discord.New(discord.Config{Token: srv.Token(), Settings: settings, Now: srv.Now, ReturnRefusal: true,
				Logger: slog.New(slog.NewTextHandler(log, nil))})
			if err != nil {
				t.Fatal(err)
			}
			deliver := func(_ context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
				return &platforms.Ack{MessageID: in.MessageID, Disposition: "started"}, nil
			}
			if !tt.live {
				tt.refuse(srv)
			}
			ran := make(chan error, 1)
			go func() { ran <- p.Run(t.Context(), deliver) }()
			if tt.live {
				srv.WaitReady(t)
				tt.refuse(srv)
			}
			select {
			case err = <-ran:
			case <-time.After(discordtest.WaitTimeout):
				t.Fatalf("Run still runs after the refusal\n%s", log.String())
			}
			var refused *discord.RefusedError
			if !errors.As(err, &refused) || refused.RetryIn != 30*time.Minute {
				t.Fatalf("Run = %v, want a RefusedError to try again in 30m", err)
			}
			if got := p.Ready(t.Context()); got == nil || !strings.Contains(got.Error(), tt.fix) {
				t.Errorf("Ready = %v, want %q in it", got, tt.fix)
			}
			if n := strings.Count(log.String(), "level=ERROR msg=\"discord refused"); n != 1 {
				t.Errorf("%d ERR lines of the refusal, want 1\n%s", n, log.String())
			}
		})
	}
}
