package config

import (
	"errors"
	"fmt"
	"time"
)

// StopMargin is how long serve's stop lasts at most past shutdown.drain_timeout: the turns
// still running at the drain's deadline are cancelled, and an exec agent's commands that have
// not ended by the stop's deadline are killed then, with their process groups (SIGKILL).
const StopMargin = 30 * time.Second

// ExecAdvice returns what serve warns of in the exec backend's settings, which it starts with
// all the same: a kill_grace that a stop cannot give. A command cancelled at the drain's
// deadline gets SIGTERM, then SIGKILL at the stop's deadline, StopMargin later, however long
// kill_grace is (found by a walkthrough: kill_grace: 20m was taken without a word). A
// *FieldError of agent.exec.kill_grace.
func (c *Config) ExecAdvice() []error {
	g := c.Agent.Exec.KillGrace
	if c.Agent.Backend != "exec" || g < StopMargin {
		return nil
	}
	return []error{&FieldError{Field: "agent.exec.kill_grace", Value: g, Err: errors.New("not shorter than the " +
		ShortDuration(StopMargin) + " a stop gives the commands it cancels: at a stop, a command still running at " +
		"shutdown.drain_timeout gets SIGTERM, then SIGKILL with what it started at most " + ShortDuration(StopMargin) +
		" later, not after kill_grace (outside a stop kill_grace holds, and an interrupted command that ignores SIGTERM " +
		"holds its chat's next turn for up to twice kill_grace)")}}
}

// HistoryAdvice returns what serve warns of in the agent's history, which it starts with all
// the same: an agent.exec.history or agent.openai.max_history above sessions.history_limit. A
// session keeps history_limit messages for its agent, so the agent gets the smaller of the two;
// before, history: 50 with history_limit: 4 gave the command 4 without a word (found by a
// walkthrough). A *FieldError of the backend's key.
func (c *Config) HistoryAdvice() []error {
	var field, who string
	var h int
	switch c.Agent.Backend {
	case "exec":
		field, who, h = "agent.exec.history", "the command gets", c.Agent.Exec.History
	case "openai":
		field, who, h = "agent.openai.max_history", "each request carries", c.Agent.OpenAI.MaxHistory
	default:
		return nil
	}
	limit := c.Sessions.HistoryLimit
	if h <= limit || limit < 0 {
		return nil // (a negative limit is a problem said apart)
	}
	gets := fmt.Sprintf("at most %d", limit)
	if limit == 0 {
		gets = "none"
	}
	return []error{&FieldError{Field: field, Value: h, Err: fmt.Errorf(
		"more than sessions.history_limit, %d, the messages a session keeps for its agent: %s %s "+
			"(the smaller of the two wins)", limit, who, gets), others: []string{"sessions.history_limit"}}}
}
