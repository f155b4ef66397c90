package main

import "testing"

// TestCheckConfigWarnsOfExecHistoryPastTheLimit: check-config warns, at agent.exec.history's
// line, of a history the session does not keep (above sessions.history_limit, which wins), and
// says config ok: serve takes it. Before, history: 50 with history_limit: 4 gave the command 4
// messages without a word (found by a walkthrough).
func TestCheckConfigWarnsOfExecHistoryPastTheLimit(t *testing.T) {
	for _, tt := range []struct{ name, history, limit, want string }{
		{"above", "50", "4", "warning: %s:7: agent.exec.history: 50: more than sessions.history_limit, 4, " +
			"the messages a session keeps for its agent: the command gets at most 4 (the smaller of the two wins)\n"},
		{"a limit of none", "20", "0", "warning: %s:7: agent.exec.history: 20: more than sessions.history_limit, 0, " +
			"the messages a session keeps for its agent: the command gets none (the smaller of the two wins)\n"},
		{"within", "4", "4", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			checkConfigWarns(t, "sessions:\n  history_limit: "+tt.limit+
				"\nagent:\n  backend: exec\n  exec:\n    history: "+tt.history+"\n    command: [sh]\n", tt.want)
		})
	}
}
