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
	_, err := Load("", []string{"AGENTGATE_AGENT_EXEC_HISTORY_BYTES=-1"}, nil)
	if want := "agent.exec.history_bytes: -1: must not be negative (set by AGENTGATE_AGENT_EXEC_HISTORY_BYTES)"; err == nil || err.Error() != want {
		t.Errorf("Load(AGENTGATE_AGENT_EXEC_HISTORY_BYTES=-1) error = %v, want %q", err, want)
	}
	_, err = Load("", []string{"AGENTGATE_SESSIONS_QUEUE_CAP=0"}, nil)
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

// TestCrossKeyProblemNamesTheVariables: a problem between keys names the AGENTGATE_* variables
// that set any of its keys, not only its own key's: where the operator set the value that makes
// it one. Before, AGENTGATE_AGENT_BACKEND=exec alone read "agent.exec.command: required when
// agent.backend is exec", to an operator who never wrote agent.backend anywhere; a value a flag
// set over a variable still names no variable.
func TestCrossKeyProblemNamesTheVariables(t *testing.T) {
	const conns = "must be at least http.max_held + 64 (564), so that held event streams and ?wait requests leave connections for health checks and new messages"
	tests := []struct {
		name, file string // file: "" for none
		environ    []string
		override   func(*Config)
		want       string // the one problem; {file} stands for the file's path
	}{
		{name: "a required key, the key that requires it from a variable",
			environ: []string{"AGENTGATE_AGENT_BACKEND=exec"},
			want:    "agent.exec.command: required when agent.backend is exec (agent.backend set by AGENTGATE_AGENT_BACKEND)"},
		{name: "at the line of the file's section",
			file:    "agent:\n  exec:\n    timeout: 1m\n",
			environ: []string{"AGENTGATE_AGENT_BACKEND=exec"},
			want:    "{file}:2: agent.exec.command: required when agent.backend is exec (agent.backend set by AGENTGATE_AGENT_BACKEND)"},
		{name: "both keys from variables",
			environ: []string{"AGENTGATE_HTTP_MAX_HELD=500", "AGENTGATE_HTTP_MAX_CONNECTIONS=100"},
			want:    "http.max_connections: 100: " + conns + " (set by AGENTGATE_HTTP_MAX_CONNECTIONS, http.max_held set by AGENTGATE_HTTP_MAX_HELD)"},
		{name: "the file's key, the other one's variable",
			file:    "http:\n  max_connections: 100\n",
			environ: []string{"AGENTGATE_HTTP_MAX_HELD=500"},
			want:    "{file}:2: http.max_connections: 100: " + conns + " (http.max_held set by AGENTGATE_HTTP_MAX_HELD)"},
		{name: "the driver a variable set",
			file:    "store:\n  dsn: postgres://db.invalid/agentgate\n",
			environ: []string{"AGENTGATE_STORE_DRIVER=sqlite"},
			want:    "{file}:2: store.dsn: is a PostgreSQL connection string, but store.driver is sqlite: set store.driver: postgres (store.driver set by AGENTGATE_STORE_DRIVER)"},
		{name: "a section's keys",
			file:    "store:\n  driver: postgres\n  dsn: postgres://db.invalid/agentgate\ncluster:\n  enabled: true\n",
			environ: []string{"AGENTGATE_CLUSTER_TLS_CERT_FILE=/etc/agentgate/member.pem"},
			want: `cluster.tls: "cert_file \"/etc/agentgate/member.pem\", key_file \"\", ca_file \"\"": set all three files (mutual TLS) or none` +
				" (cluster.tls.cert_file set by AGENTGATE_CLUSTER_TLS_CERT_FILE)"},
		{name: "a flag over the variable",
			environ:  []string{"AGENTGATE_AGENT_BACKEND=openai"},
			override: func(c *Config) { c.Agent.Backend = "exec" },
			want:     "agent.exec.command: required when agent.backend is exec"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := ""
			if tc.file != "" {
				path = MustWriteConfig(t, tc.file)
			}
			_, err := Load(path, tc.environ, tc.override)
			if want := strings.ReplaceAll(tc.want, "{file}", path); err == nil || err.Error() != want {
				t.Errorf("Load() error = %v, want %q", err, want)
			}
		})
	}
}

// TestCrossKeyAdviceNamesTheVariables: a warning between keys names the variables too
// (HistoryAdvice, which serve logs and check-config prints).
func TestCrossKeyAdviceNamesTheVariables(t *testing.T) {
	environ := []string{"AGENTGATE_AGENT_BACKEND=exec", "AGENTGATE_AGENT_EXEC_COMMAND=[cat]", "AGENTGATE_SESSIONS_HISTORY_LIMIT=4"}
	path := MustWriteConfig(t, "agent:\n  exec:\n    history: 50\n")
	cfg, problems, refused := Check(path, environ, nil, nil, func(c *Config) []error { return c.HistoryAdvice() })
	const want = "agent.exec.history: 50: more than sessions.history_limit, 4, the messages a session keeps for its agent: " +
		"the command gets at most 4 (the smaller of the two wins) (sessions.history_limit set by AGENTGATE_SESSIONS_HISTORY_LIMIT)"
	if cfg == nil || problems != nil || refused == nil || refused.Error() != path+":3: "+want {
		t.Errorf("Check() = %v, %v; want no problem and the advice %q", problems, refused, path+":3: "+want)
	}
}
