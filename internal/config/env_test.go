package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestUnknownEnvSecretVariables: a variable that a *_env key names holds that secret, whatever
// its name: it is no misspelt key, whether the file or an AGENTGATE_*_ENV variable names it
// (found by a walkthrough: check-config called the bearer token named by http.token_env
// ignored). A misspelt key beside it is still reported.
func TestUnknownEnvSecretVariables(t *testing.T) {
	secrets := []string{
		"AGENTGATE_HTTP_TOKEN=s3cret", "AGENTGATE_PLATFORMS_DISCORD_BOT=MTA5.x", "AGENTGATE_AGENT_KEY=sk-x",
		"AGENTGATE_HTTP_TOKN=typo",
	}
	tests := []struct {
		name, file string
		environ    []string
		want       []string
	}{
		{name: "named by the file",
			file: "http:\n  token_env: AGENTGATE_HTTP_TOKEN\nplatforms:\n  discord:\n    token_env: AGENTGATE_PLATFORMS_DISCORD_BOT\n" +
				"agent:\n  openai:\n    api_key_env: AGENTGATE_AGENT_KEY\n",
			want: []string{"AGENTGATE_HTTP_TOKN"}},
		{name: "named by variables",
			environ: []string{"AGENTGATE_HTTP_TOKEN_ENV=AGENTGATE_HTTP_TOKEN", "AGENTGATE_PLATFORMS_DISCORD_TOKEN_ENV=AGENTGATE_PLATFORMS_DISCORD_BOT",
				"AGENTGATE_AGENT_OPENAI_API_KEY_ENV=AGENTGATE_AGENT_KEY"},
			want: []string{"AGENTGATE_HTTP_TOKN"}},
		{name: "named by none",
			want: []string{"AGENTGATE_AGENT_KEY", "AGENTGATE_HTTP_TOKEN", "AGENTGATE_HTTP_TOKN", "AGENTGATE_PLATFORMS_DISCORD_BOT"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			environ := append(tc.environ, secrets...)
			path := ""
			if tc.file != "" {
				path = MustWriteConfig(t, tc.file)
			}
			cfg, err := Load(path, environ, nil)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, cfg.UnknownEnv(environ)); diff != "" {
				t.Errorf("Config.UnknownEnv() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestEnvProblemNamesItsVariable: a value an AGENTGATE_* variable set that validation refuses
// names the variable, where the operator set it; one a flag set over it does not. Before,
// AGENTGATE_SESSIONS_QUEUE_CAP=0 read "sessions.queue.cap: 0: must be at least 1" (a
// walkthrough).
func TestEnvProblemNamesItsVariable(t *testing.T) {
	_, err := Load("", []string{"AGENTGATE_SESSIONS_QUEUE_CAP=0"}, nil)
	if want := "sessions.queue.cap: 0: must be at least 1 (set by AGENTGATE_SESSIONS_QUEUE_CAP)"; err == nil || err.Error() != want {
		t.Errorf("Load(AGENTGATE_SESSIONS_QUEUE_CAP=0) error = %v, want %q", err, want)
	}
	path := MustWriteConfig(t, "sessions:\n  queue:\n    cap: 0\n")
	if _, err := Load(path, nil, nil); err == nil || strings.Contains(err.Error(), "set by") {
		t.Errorf("Load(file with cap 0) error = %v, want the file's problem, naming no variable", err)
	}
	_, err = Load("", []string{"AGENTGATE_SESSIONS_QUEUE_CAP=5"}, func(c *Config) { c.Sessions.Queue.Cap = 0 })
	if err == nil || strings.Contains(err.Error(), "set by") {
		t.Errorf("Load(a flag's cap 0 over the variable's 5) error = %v, want a problem naming no variable", err)
	}
}
