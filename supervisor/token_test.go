package supervisor

import (
	"net/http"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil"
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
