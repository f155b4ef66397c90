package supervisor

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
)

// TestExecHistoryBytesReachesTheCommand: agent.exec.history_bytes bounds the history on the
// exec agent's stdin, as the daemon builds the agent: the conversation's oldest message, which
// does not fit beside the newer ones, is left out.
func TestExecHistoryBytesReachesTheCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	script := filepath.Join(dir, "agent")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ncat > \""+dir+"/stdin.json\"\necho ok\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	const limit = 2500 // three messages of 1000 bytes do not fit, two and the replies do
	r := MustStartDaemon(t, nil, daemonOpts{tweak: func(c *config.Config) {
		c.Agent.Backend = "exec"
		c.Agent.Exec.Command = []string{script}
		c.Agent.Exec.HistoryBytes = limit
	}})
	defer r.stop(t)
	src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c", UserID: "u"}
	for i := range 4 {
		r.inject(t, src, fmt.Sprintf("m%d", i+1), fmt.Sprintf("u%d %s", i+1, strings.Repeat("x", 1000)))
		r.waitSent(t, i+1)
	}
	b, err := os.ReadFile(filepath.Join(dir, "stdin.json"))
	if err != nil {
		t.Fatal(err)
	}
	var in struct {
		History []agents.Message `json:"history"`
	}
	if err := json.Unmarshal(b, &in); err != nil {
		t.Fatalf("the last turn's stdin %q: %v", b, err)
	}
	hist, _ := json.Marshal(in.History)
	var texts []string
	for _, m := range in.History {
		texts = append(texts, m.Text[:min(len(m.Text), 2)])
	}
	if len(hist) > limit || strings.Contains(string(hist), `"u1 `) || !strings.Contains(string(hist), `"u3 `) {
		t.Errorf("the fourth turn's history (%d bytes) begins its entries %q, want at most %d bytes, down to u3 and without u1", len(hist), texts, limit)
	}
}
