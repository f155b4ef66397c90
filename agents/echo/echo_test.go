package echo_test

import (
	"context"
	"errors"
	"testing"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/identity"
)

func TestRun(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		messages []string
		want     string
	}{
		{name: "one message", messages: []string{"hello\nworld  "}, want: "hello\nworld  "},
		{name: "collected messages", messages: []string{"first", "second", "third"}, want: "first\nsecond\nthird"},
		{name: "no messages", messages: nil, want: ""},
		{name: "empty text", messages: []string{""}, want: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := &agents.Request{
				Identity: identity.Turn{SessionKey: "agent:main:http:dm:c1", TurnID: "t1"},
				// History must never be echoed: only this turn's messages are the input.
				History: []agents.Message{{Role: "user", Text: "old"}},
			}
			for _, s := range tc.messages {
				req.Messages = append(req.Messages, agents.Message{Role: "user", Text: s})
			}
			resp, err := echo.New().Run(t.Context(), req)
			if err != nil {
				t.Fatalf("Run(%q) error = %v, want nil", tc.messages, err)
			}
			if resp.Text != tc.want {
				t.Errorf("Run(%q) = %q, want %q", tc.messages, resp.Text, tc.want)
			}
		})
	}
}

func TestRunCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	req := &agents.Request{Messages: []agents.Message{{Role: "user", Text: "hi"}}}
	resp, err := echo.New().Run(ctx, req)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run(cancelled ctx) = %v, %v; want error wrapping context.Canceled", resp, err)
	}
}

func TestRunNilRequest(t *testing.T) {
	t.Parallel()
	if resp, err := echo.New().Run(t.Context(), nil); err == nil {
		t.Errorf("Run(nil) = %v, nil; want an error", resp)
	}
}
