package openai_test

import (
	"bytes"
	"strings"
	"sync"
	"testing"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
	"github.com/agentgate/agentgate/internal/identity"
)

// syncBuffer is a bytes.Buffer for the log lines of an agent's calls.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(substr string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for l := range strings.Lines(s.b.String()) {
		if strings.Contains(l, substr) {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}

// TestTrimmedHistoryIsLogged: a request that leaves history out says so at debug once a turn,
// with how many messages and which setting; the first one the token budget cuts says so at
// info too, once for the agent, so that the operator learns the model no longer sees the
// start of long conversations without an info line every turn. Before, nothing said it.
func TestTrimmedHistoryIsLogged(t *testing.T) {
	hist := []agents.Message{msg("user", pad("u1")), msg("assistant", pad("a1")), msg("user", pad("u2")), msg("assistant", pad("a2"))}
	turn := func(id string) *agents.Request {
		return &agents.Request{Identity: identity.Turn{SessionKey: "agent:main:http:dm:u1", TurnID: id},
			History: hist, Messages: []agents.Message{msg("user", "now?")}}
	}
	const (
		debugLine = `level=DEBUG msg="request history trimmed"`
		infoLine  = `level=INFO msg="a request left out older history to fit agent.openai.token_budget; each turn's cut is logged at debug from now on"`
	)
	t.Run("token_budget", func(t *testing.T) {
		var logs syncBuffer
		m := newFakeModel(t, openaitest.Reply("ok", 1, 1))
		// The system prompt (7), the message (5) and all 4 history messages (14 each) but one
		// token: the two oldest are left out.
		a := MustAgent(t, m, &logs, nil, func(c *openai.Config) { c.SystemPrompt, c.TokenBudget = "Be brief.", 7+5+4*14-1 })
		for _, id := range []string{"t1", "t2"} {
			if _, err := a.Run(t.Context(), turn(id)); err != nil {
				t.Fatalf("Run %s: %v", id, err)
			}
		}
		got := logs.lines(debugLine)
		if len(got) != 2 || !strings.Contains(got[0], "turn=t1 left_out=2 sent=2 by=token_budget") || !strings.Contains(got[1], "turn=t2 left_out=2 sent=2 by=token_budget") {
			t.Errorf("debug lines %q, want one a turn saying left_out=2 sent=2 by=token_budget", got)
		}
		if got := logs.lines(infoLine); len(got) != 1 || !strings.Contains(got[0], "session=agent:main:http:dm:u1 turn=t1 token_budget=67 left_out=2 sent=2") {
			t.Errorf("info lines %q, want one, of the first turn, naming the budget", got)
		}
	})
	t.Run("max_history", func(t *testing.T) {
		var logs syncBuffer
		m := newFakeModel(t, openaitest.Reply("ok", 1, 1))
		a := MustAgent(t, m, &logs, nil, func(c *openai.Config) { c.MaxHistory = 3 })
		if _, err := a.Run(t.Context(), turn("t1")); err != nil {
			t.Fatal(err)
		}
		// max_history 3 keeps a1 u2 a2, and a history never starts with an assistant message.
		if got := logs.lines(debugLine); len(got) != 1 || !strings.Contains(got[0], "left_out=2 sent=2 by=max_history") {
			t.Errorf("debug lines %q, want one saying left_out=2 sent=2 by=max_history", got)
		}
		if got := logs.lines("level=INFO"); len(got) != 0 {
			t.Errorf("info lines %q, want none: max_history is a count the operator chose", got)
		}
	})
	t.Run("nothing left out", func(t *testing.T) {
		var logs syncBuffer
		m := newFakeModel(t, openaitest.Reply("ok", 1, 1))
		a := MustAgent(t, m, &logs, nil, func(c *openai.Config) { c.TokenBudget = 5 + 4*14 })
		if _, err := a.Run(t.Context(), turn("t1")); err != nil {
			t.Fatal(err)
		}
		if got := logs.lines("history"); len(got) != 0 {
			t.Errorf("lines %q, want none about the history", got)
		}
	})
}
