package discord_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/platforms/discord"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestRefusedConnectionIsTriedAgainEvery30Minutes: a gateway close that Discord says not to
// reconnect after (a token refused, a shard, sharding, the API version, invalid or disallowed
// intents), or a 401 on the gateway's lookup, keeps the platform down with one ERR line that says
// what the operator must do, and /readyz failing with it, until a try 30 minutes later (the test
// fires the wait): refused again, it logs one more line; taken, the platform connects without a
// restart, as after a refusal Discord made in error or an intent the operator turned on
// meanwhile. Before, a refused token kept the platform down until a restart, and the other codes
// (and the 401) were retried within a minute for ever, each try a warning that read as a network
// problem. A live connection that Discord closes so (4004 once the token is reset in the
// Developer Portal) stays down at once, as a refused connect does; before, discordgo's warning
// of the close and a restart came first, and the ERR only when Discord refused its RESUME.
func TestRefusedConnectionIsTriedAgainEvery30Minutes(t *testing.T) {
	const token = "discord refused the bot token; the platform stays down until the daemon is restarted with the right one"
	tests := []struct {
		name      string
		refuse    func(srv *discordtest.Server) // twice
		line, fix string
		attrs     []string // of the line: what to change, and how Discord refused
		live      bool     // refuse once the platform is connected
	}{
		{"4004", closing(4004), token, "(gateway close 4004): set the right one in $" + tokenEnv + " and restart the daemon",
			[]string{"token_env=" + tokenEnv, "close_code=4004"}, false},
		{"4004 live", func(srv *discordtest.Server) { srv.RefuseNext(4004, 1); srv.CloseLive(4004) }, token,
			"(gateway close 4004): set the right one in $" + tokenEnv + " and restart the daemon", []string{"token_env=" + tokenEnv, "close_code=4004"}, true},
		{"401", func(srv *discordtest.Server) { srv.FailNext(http.MethodGet, "/gateway", http.StatusUnauthorized, 2) }, token,
			"(HTTP 401): set the right one in $" + tokenEnv + " and restart the daemon", []string{"token_env=" + tokenEnv, "status=401"}, false},
		{"4010", closing(4010), "discord refused the shard; set platforms.discord.shard_id and shard_count to one of the bot's shards and restart the daemon",
			"(gateway close 4010): set platforms.discord.shard_id and shard_count", []string{"shard_count=1", "close_code=4010"}, false},
		{"4011", closing(4011), "discord requires sharding: the bot is in too many guilds for one connection; set platforms.discord.shard_count and run a daemon for each shard_id",
			"(gateway close 4011): set platforms.discord.shard_count and run a daemon for each shard_id", []string{"shard_id=0", "close_code=4011"}, false},
		{"4012", closing(4012), "discord refused the gateway api version of this agentgate; upgrade it",
			"(gateway close 4012): upgrade agentgate", []string{"close_code=4012"}, false},
		{"4013", closing(4013), "discord refused the gateway intents as invalid; upgrade agentgate",
			"(gateway close 4013): upgrade agentgate", []string{"intents=", "close_code=4013"}, false},
		{"4014", closing(4014), "discord refused the message content intent; turn it on for the bot in the developer portal",
			"(gateway close 4014): turn it on in the Discord Developer Portal (the application, Bot, Privileged Gateway Intents)", []string{"intents=", "close_code=4014"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			waits := make(chan time.Duration, 8)
			fire := make(chan time.Time)
			discord.SetRetryAfter(t, func(d time.Duration) <-chan time.Time {
				waits <- d
				return fire
			})
			w := newWorld(t, echoAgent, nil)
			if tt.live {
				w.start(t)
				w.srv.WaitReady(t)
				tt.refuse(w.srv)
			} else {
				tt.refuse(w.srv)
				w.start(t)
			}
			waited := func() {
				t.Helper()
				select {
				case d := <-waits:
					if d != 30*time.Minute {
						t.Errorf("waits %v before it tries again, want 30m", d)
					}
				case <-time.After(discordtest.WaitTimeout):
					t.Fatalf("the platform never waited to try again\n%s", w.log.String())
				}
			}
			down := func(refusals int) {
				t.Helper()
				log := w.log.String()
				if n := strings.Count(log, tt.line); n != refusals {
					t.Errorf("%q logged %d times, want %d (once per refusal)\n%s", tt.line, n, refusals, log)
				}
				for l := range strings.Lines(log) {
					if !strings.Contains(l, tt.line) {
						continue
					}
					for _, want := range append(tt.attrs, "level=ERROR", "retry_in=30m0s") {
						if !strings.Contains(l, want) {
							t.Errorf("refusal logged as %q, want %s in it", l, want)
						}
					}
				}
				if got := readyz(t, w); !strings.Contains(got, tt.fix) {
					t.Errorf("/readyz = %s, want %q", got, tt.fix)
				}
			}
			waited()
			down(1)
			fire <- time.Time{}
			waited()
			down(2)
			fire <- time.Time{}
			w.srv.WaitReady(t)
			eventually(t, "/readyz reports Discord connected", func() bool {
				return strings.Contains(readyz(t, w), `"platform.discord":"ok"`)
			})
			w.stop(t)
			log := w.log.String()
			if strings.Count(log, tt.line) != 2 || strings.Contains(log, "platform stopped; restarting") {
				t.Errorf("after the refusals, the log has more of them, or a restart:\n%s", log)
			}
			for l := range strings.Lines(log) {
				if strings.Contains(l, "level=WARN") && strings.Contains(l, "websocket: close") {
					t.Errorf("a refusal is also a warning: %s", l)
				}
			}
		})
	}
}

// closing makes the fake close the next two connections with gateway close code.
func closing(code int) func(*discordtest.Server) {
	return func(srv *discordtest.Server) { srv.RefuseNext(code, 2) }
}
