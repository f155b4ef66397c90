package supervisor

import (
	"net/http"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// getStatus answers the status of GET url with the bearer token (none when "").
func getStatus(t *testing.T, url, token string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestTokenVariableWithWhiteSpace: a token variable read with white space around it (an
// EnvironmentFile, $(cat file) with a line end) serves the token without it, as a client's
// header is read. Before, every request was refused.
func TestTokenVariableWithWhiteSpace(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef"
	t.Setenv("AGTEST_HTTP_TOKEN", " "+token+"\r\n")
	r := MustStart(t, echo.New(), func(c *config.Config) { c.HTTP.TokenEnv = "AGTEST_HTTP_TOKEN" })
	url := "http://" + r.d.Addr().String() + "/v1/sessions"
	if got := getStatus(t, url, token); got != http.StatusOK {
		t.Errorf("GET /v1/sessions with the token = %d, want 200", got)
	}
	if got := getStatus(t, url, ""); got != http.StatusUnauthorized {
		t.Errorf("GET /v1/sessions without the token = %d, want 401", got)
	}
}

// TestStartLogsOfTheToken: a daemon that serves its HTTP API without a token says so at start,
// naming http.token_env (loopback is not private on a host others log in to), and one whose
// token is short enough to guess warns of it, without the token; a long token gets neither.
func TestStartLogsOfTheToken(t *testing.T) {
	const tokenless = "http API serves without a bearer token"
	const short = "the HTTP API's bearer token is short enough to guess; serving all the same"
	cases := []struct {
		name, token string
		want        []string // lines the log holds
		absent      []string // and those it does not
	}{
		{"none", "", []string{"level=INFO msg=\"" + tokenless, "set http.token_env"}, []string{short}},
		{"short", "sh0rt", []string{"level=WARN msg=\"" + short, `http.token_env: \"AGTEST_HTTP_TOKEN\": holds a token shorter than 16 characters`, "openssl rand -hex 32"}, []string{tokenless, "sh0rt"}},
		{"long", "0123456789abcdef", nil, []string{tokenless, short}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var logs testutil.Buffer
			r := MustStartDaemon(t, echo.New(), daemonOpts{logs: &logs, tweak: func(c *config.Config) {
				if tc.token != "" {
					t.Setenv("AGTEST_HTTP_TOKEN", tc.token)
					c.HTTP.TokenEnv = "AGTEST_HTTP_TOKEN"
				}
			}})
			r.stop(t)
			for _, w := range tc.want {
				if !strings.Contains(logs.String(), w) {
					t.Errorf("the start's log lacks %q:\n%s", w, logs.String())
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(logs.String(), a) {
					t.Errorf("the start's log holds %q:\n%s", a, logs.String())
				}
			}
		})
	}
}

// TestStartWarnsOfADiscordTokenOfAnotherShape: a daemon whose Discord bot token has a shape no
// bot token has (a client secret pasted in its place: no dots) warns of it at start, naming
// the variable and never the token, and starts all the same (Discord may change the format;
// the fake takes the value); a token of the shape is no warning. Before, serve said nothing,
// and only the connection's refusal told.
func TestStartWarnsOfADiscordTokenOfAnotherShape(t *testing.T) {
	const warning = "the Discord bot token does not look like one; serving all the same"
	for _, tc := range []struct {
		name, token string
		want        bool
	}{
		{"a client secret", "AbCdEfGhIjKlMnOpQrStUvWxYz012345", true},
		{"a bot token", discordtest.DefaultToken, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := discordtest.New(t, discordtest.WithToken(tc.token))
			t.Setenv("AGTEST_BOT_TOKEN", tc.token)
			var logs testutil.Buffer
			r := MustStartDaemon(t, echo.New(), daemonOpts{logs: &logs, tweak: func(c *config.Config) {
				c.Platforms.Discord.Enabled, c.Platforms.Discord.APIURL = true, srv.APIURL()
				c.Platforms.Discord.TokenEnv = "AGTEST_BOT_TOKEN"
			}})
			srv.WaitReady(t) // serving all the same
			r.stop(t)
			got := logs.String()
			if has := strings.Contains(got, "level=WARN msg=\""+warning+"\""); has != tc.want {
				t.Errorf("the start's log holds %q: %v, want %v:\n%s", warning, has, tc.want, got)
			}
			if tc.want && (!strings.Contains(got, `platforms.discord.token_env: \"AGTEST_BOT_TOKEN\"`) || !strings.Contains(got, "has no dots")) {
				t.Errorf("the start's log does not name the variable and say what is wrong:\n%s", got)
			}
			if strings.Contains(got, tc.token) {
				t.Errorf("the start's log holds the token:\n%s", got)
			}
		})
	}
}
