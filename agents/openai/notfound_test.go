package openai_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
)

// TestNotFoundSaysWhereItPosted: a 404 of a base_url without the API's /v1 (the endpoint has no
// such route) is an error, logged as the turn's failure, that names the URL posted to (without
// its query) and says to check base_url and model; the user's notice is true of an unknown
// model as well. Before, both were told the endpoint "does not know the model it is set up
// with", and an operator who missed /v1 looked for a model that was there.
func TestNotFoundSaysWhereItPosted(t *testing.T) {
	m := newFakeModel(t, openaitest.Reply("never", 1, 1))
	root := strings.TrimSuffix(m.URL(), "/v1")
	a := MustAgent(t, m, nil, nil, func(c *openai.Config) { c.BaseURL = root + "?key=sekret-proxy-key" })
	_, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}})
	if err == nil {
		t.Fatal("Run succeeded, want the endpoint's 404")
	}
	got := err.Error()
	for _, want := range []string{"404", "posted to " + root + "/chat/completions:", "agent.openai.base_url", "/v1", "agent.openai.model"} {
		if !strings.Contains(got, want) {
			t.Errorf("Run error = %q, want it to hold %q", got, want)
		}
	}
	if strings.Contains(got, "sekret") {
		t.Errorf("Run error = %q, want base_url's query left out", got)
	}
	ref, ok := errors.AsType[*agents.Refusal](err)
	if !ok || !strings.Contains(ref.Notice, "no such model or address") || strings.Contains(ref.Notice, "does not know the model") {
		t.Errorf("Run error %v: refusal %v, want a notice that names both causes", err, ok)
	}
}
