package config

import (
	"strings"
	"testing"
)

// TestExecAdvice: a kill_grace that a stop cannot give (StopMargin or longer) is warned of, with
// what a stop does instead, as check-config prints it; a shorter one, or one of another
// backend, is not (found by a walkthrough: kill_grace: 20m was taken without a word).
func TestExecAdvice(t *testing.T) {
	tests := []struct {
		name, file string
		want       string
	}{
		{name: "twenty minutes", file: "agent:\n  backend: exec\n  exec:\n    command: [sh]\n    kill_grace: 20m\n",
			want: "agent.exec.kill_grace: 20m: not shorter than the 30s a stop gives the commands it cancels: at a stop, a command still " +
				"running at shutdown.drain_timeout gets SIGTERM, then SIGKILL with what it started at most 30s later, not after kill_grace"},
		{name: "the margin itself", file: "agent:\n  backend: exec\n  exec:\n    command: [sh]\n    kill_grace: 30s\n",
			want: "agent.exec.kill_grace: 30s: not shorter than the 30s"},
		{name: "within the margin", file: "agent:\n  backend: exec\n  exec:\n    command: [sh]\n    kill_grace: 29s\n"},
		{name: "the default", file: "agent:\n  backend: exec\n  exec:\n    command: [sh]\n"},
		{name: "another backend", file: "agent:\n  exec:\n    kill_grace: 20m\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := adviceOf(t, tc.file, (*Config).ExecAdvice)
			switch {
			case tc.want == "" && len(got) > 0:
				t.Errorf("ExecAdvice() = %q, want none", got)
			case tc.want != "" && (len(got) != 1 || !strings.HasPrefix(got[0], tc.want)):
				t.Errorf("ExecAdvice() = %q, want one starting %q", got, tc.want)
			}
		})
	}
}

// TestHistoryAdvice: an agent.exec.history or agent.openai.max_history above
// sessions.history_limit is warned of, with what the agent gets (the smaller of the two); one
// within it, or of another backend, is not (found by a walkthrough: history: 50 with history_limit: 4 gave the command 4, and
// history_limit: 0 none, without a word).
func TestHistoryAdvice(t *testing.T) {
	const exec = "agent:\n  backend: exec\n  exec:\n    command: [sh]\n"
	tests := []struct {
		name, file string
		want       string
	}{
		{name: "above the limit", file: exec + "    history: 50\nsessions:\n  history_limit: 4\n",
			want: "agent.exec.history: 50: more than sessions.history_limit, 4, the messages a session keeps for its agent: " +
				"the command gets at most 4 (the smaller of the two wins)"},
		{name: "a limit of none", file: exec + "    history: 1\nsessions:\n  history_limit: 0\n",
			want: "agent.exec.history: 1: more than sessions.history_limit, 0, the messages a session keeps for its agent: " +
				"the command gets none (the smaller of the two wins)"},
		{name: "equal", file: exec + "    history: 4\nsessions:\n  history_limit: 4\n"},
		{name: "below", file: exec + "    history: 0\nsessions:\n  history_limit: 0\n"},
		{name: "the defaults", file: exec},
		{name: "another backend", file: "agent:\n  exec:\n    history: 50\nsessions:\n  history_limit: 4\n"},
		{name: "openai above the limit", file: "agent:\n  backend: openai\n  openai:\n    base_url: https://api.example.com/v1\n    model: m\n" +
			"    max_history: 30\nsessions:\n  history_limit: 10\n",
			want: "agent.openai.max_history: 30: more than sessions.history_limit, 10, the messages a session keeps for its agent: " +
				"each request carries at most 10 (the smaller of the two wins)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := adviceOf(t, tc.file, (*Config).HistoryAdvice)
			switch {
			case tc.want == "" && len(got) > 0:
				t.Errorf("HistoryAdvice() = %q, want none", got)
			case tc.want != "" && (len(got) != 1 || got[0] != tc.want):
				t.Errorf("HistoryAdvice() = %q, want %q", got, tc.want)
			}
		})
	}
}

// adviceOf is what advice (a Config method that returns the warnings serve starts with all the
// same) says of the configuration file of text.
func adviceOf(t *testing.T, text string, advice func(*Config) []error) []string {
	t.Helper()
	cfg, err := Load(MustWriteConfig(t, text), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, err := range advice(cfg) {
		got = append(got, err.Error())
	}
	return got
}
