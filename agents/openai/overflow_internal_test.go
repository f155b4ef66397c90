package openai

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/agentgate/agentgate/agents"
)

// FuzzContextOverflow reads any refusal's message as contextOverflowOf does, and makes of it
// what refusal and overflowed make of a 400 with it: never a panic (numbers past an int, no
// max_tokens setting, a message cut at maxErrorMessage), a Refusal with a notice, and counts
// that are never negative.
//
// Run it with make fuzz FUZZ=FuzzContextOverflow PKG=./agents/openai.
func FuzzContextOverflow(f *testing.F) {
	for _, s := range []string{
		"'max_tokens' or 'max_completion_tokens' is too large: 9000. This model's maximum context length is 8192 tokens and your request has 12 input tokens (9000 > 8192 - 12).",
		"This model's maximum context length is 8192 tokens. However, you requested 9000 output tokens and your prompt contains at least 12 input tokens, for a total of at least 9012 tokens.",
		"You passed 12 input tokens and requested 9000 output tokens. However, the model's context length is only 8192 tokens",
		"This model's maximum context length is 8192 tokens. However, you requested 9000 tokens (7000 in the messages, 2000 in the completion).",
		"'max_tokens' is too large: 99999999999999999999999. This model's maximum context length is 8,192 tokens and your request has 12 input tokens",
		"This model's maximum context length is 0 tokens. However, you requested 0 tokens (0 in the messages, 0 in the completion).",
		`{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error","n_prompt_tokens":12,"n_ctx":1024}}`,
		`{"error":{"type":"exceed_context_size_error","n_prompt_tokens":-5,"n_ctx":99999999999999999999}}`,
		`{"error":{"message":"litellm.BadRequestError: OpenAIException - Error code: 400 - {'error': {'code': 400, 'type': 'exceed_context_size_error', 'n_prompt_tokens': 7000, 'n_ctx': 8192}}","type":null}}`,
		"{'type': 'exceed_context_size_error', 'n_prompt_tokens': 99999999999, 'n_ctx': 1}",
		"",
	} {
		f.Add(s, 2000)
		f.Add(s, 0)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f.Fuzz(func(t *testing.T, message string, maxTokens int) {
		o, ok := contextOverflowOf(message)
		if ok && (o.context < 0 || o.input < 0 || o.output < 0) {
			t.Errorf("contextOverflowOf(%q) = %+v, want no negative count", message, o)
		}
		// The message as a whole error body too (llama.cpp's fields).
		c := contextRefusalOf(message, []byte(message), []byte(message), max(maxTokens, 0))
		if c.counted && (c.overflow.context < 0 || c.overflow.input < 0 || c.overflow.output < 0) {
			t.Errorf("contextRefusalOf(%q) = %+v, want no negative count", message, c)
		}
		if (ok && !usableContext(o.context)) || (c.counted && !usableContext(c.overflow.context)) {
			t.Errorf("contextRefusalOf(%q) = %+v, contextOverflowOf %+v, want a context counted only when a model may have it", message, c, o)
		}
		a := &Agent{maxTokens: maxTokens}
		for _, code := range []int{http.StatusBadRequest, http.StatusUnprocessableEntity} {
			for _, se := range []*StatusError{{Code: code, Message: message}, {Code: code, Message: message, context: &c}} {
				err := a.refusal(a.overflowed(se, log), false, false)
				if ref, isRef := errors.AsType[*agents.Refusal](err); !isRef || ref.Notice == "" {
					t.Errorf("refusal of a %d with %q = %v, want a Refusal with a notice", code, message, err)
				}
			}
		}
	})
}
