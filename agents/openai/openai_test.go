package openai_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/google/go-cmp/cmp"
)

func msg(role, text string) agents.Message { return agents.Message{Role: role, Text: text} }

// pad makes a text of exactly 40 characters: EstimateTokens gives it 14.
func pad(s string) string { return fmt.Sprintf("%-40s", s) }

// TestRequestBodies checks the exact body of the request a turn sends: system prompt, notes,
// history (with the sender prefixes the session put in), new messages, runs of one role joined,
// and the trimming by max_history and by the token budget.
func TestRequestBodies(t *testing.T) {
	temp := 0.2
	hist := []agents.Message{msg("user", pad("u1")), msg("assistant", pad("a1")), msg("user", pad("u2")), msg("assistant", pad("a2"))}
	histJSON := func(names ...string) string {
		var parts []string
		for _, n := range names {
			role := "user"
			if n[0] == 'a' {
				role = "assistant"
			}
			parts = append(parts, fmt.Sprintf(`{"role":%q,"content":%q}`, role, pad(n)))
		}
		return strings.Join(parts, ",")
	}
	sys := `{"role":"system","content":"Be brief."}` // 9 characters: 7 estimated tokens
	now := `{"role":"user","content":"now?"}`        // 5 estimated tokens
	tests := []struct {
		name  string
		tweak func(*openai.Config)
		req   agents.Request
		want  string
	}{
		{
			name: "shared session with prompt, note and options",
			tweak: func(c *openai.Config) {
				c.SystemPrompt, c.Temperature, c.MaxTokens = "You are helpful.", &temp, 64
			},
			req: agents.Request{
				Notes:    []string{"This conversation continues session 20261110_120000_ab12cd34, which was reset (idle)."},
				History:  []agents.Message{msg("user", "[Ann] hi"), msg("assistant", "hello Ann"), msg("notice", "⚠️ reset")},
				Messages: []agents.Message{msg("user", "[Bob] and me?"), msg("user", "[Bob] hello?")},
			},
			want: `{"model":"gpt-test","messages":[
				{"role":"system","content":"You are helpful.\n\nThis conversation continues session 20261110_120000_ab12cd34, which was reset (idle)."},
				{"role":"user","content":"[Ann] hi"},{"role":"assistant","content":"hello Ann"},
				{"role":"user","content":"[Bob] and me?\n\n[Bob] hello?"}],
				"temperature":0.2,"max_tokens":64}`,
		},
		{
			// Roles alternate, as many chat templates demand (Mistral's, as vLLM applies it,
			// refuses the request otherwise): sent as two user messages, a message whose turn
			// failed made every later turn of the session fail there.
			name: "a message whose turn failed joins the next one",
			req: agents.Request{
				History:  []agents.Message{msg("user", "u1"), msg("assistant", "a1"), msg("user", "failed"), msg("notice", "⚠️ could not answer")},
				Messages: []agents.Message{msg("user", "again")},
			},
			want: `{"model":"gpt-test","messages":[{"role":"user","content":"u1"},{"role":"assistant","content":"a1"},
				{"role":"user","content":"failed\n\nagain"}]}`,
		},
		{
			name: "no prompt, no options",
			req:  agents.Request{Messages: []agents.Message{msg("user", "hi")}},
			want: `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}`,
		},
		{
			name:  "max_history keeps the newest",
			tweak: func(c *openai.Config) { c.SystemPrompt, c.MaxHistory = "Be brief.", 2 },
			req:   agents.Request{History: hist, Messages: []agents.Message{msg("user", "now?")}},
			want:  `{"model":"gpt-test","messages":[` + sys + `,` + histJSON("u2", "a2") + `,` + now + `]}`,
		},
		{
			name:  "max_history never starts with an assistant message",
			tweak: func(c *openai.Config) { c.SystemPrompt, c.MaxHistory = "Be brief.", 3 },
			req:   agents.Request{History: hist, Messages: []agents.Message{msg("user", "now?")}},
			want:  `{"model":"gpt-test","messages":[` + sys + `,` + histJSON("u2", "a2") + `,` + now + `]}`,
		},
		{
			name:  "max_history 0 sends no history",
			tweak: func(c *openai.Config) { c.SystemPrompt, c.MaxHistory = "Be brief.", 0 },
			req:   agents.Request{History: hist, Messages: []agents.Message{msg("user", "now?")}},
			want:  `{"model":"gpt-test","messages":[` + sys + `,` + now + `]}`,
		},
		{
			name:  "budget fits everything",
			tweak: func(c *openai.Config) { c.SystemPrompt, c.TokenBudget = "Be brief.", 7+5+4*14 },
			req:   agents.Request{History: hist, Messages: []agents.Message{msg("user", "now?")}},
			want:  `{"model":"gpt-test","messages":[` + sys + `,` + histJSON("u1", "a1", "u2", "a2") + `,` + now + `]}`,
		},
		{
			name:  "budget drops the oldest",
			tweak: func(c *openai.Config) { c.SystemPrompt, c.TokenBudget = "Be brief.", 7+5+4*14-1 },
			req:   agents.Request{History: hist, Messages: []agents.Message{msg("user", "now?")}},
			want:  `{"model":"gpt-test","messages":[` + sys + `,` + histJSON("u2", "a2") + `,` + now + `]}`,
		},
		{
			// 40 Chinese characters are some 40 tokens, not 10: counted as 10 (4 characters a
			// token), the history fitted, and the request was over the budget.
			name:  "budget counts a character of another script as a token",
			tweak: func(c *openai.Config) { c.SystemPrompt, c.TokenBudget = "Be brief.", 7+5+2*14 },
			req:   agents.Request{History: []agents.Message{msg("user", strings.Repeat("汉", 40)), msg("assistant", pad("a1"))}, Messages: []agents.Message{msg("user", "now?")}},
			want:  `{"model":"gpt-test","messages":[` + sys + `,` + now + `]}`,
		},
		{
			name:  "budget smaller than the turn keeps the turn",
			tweak: func(c *openai.Config) { c.SystemPrompt, c.TokenBudget = "Be brief.", 3 },
			req:   agents.Request{History: hist, Messages: []agents.Message{msg("user", "now?")}},
			want:  `{"model":"gpt-test","messages":[` + sys + `,` + now + `]}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newFakeModel(t, openaitest.Reply("ok", 1, 1))
			a := MustAgent(t, m, nil, nil, tt.tweak)
			if _, err := a.Run(t.Context(), &tt.req); err != nil {
				t.Fatalf("Run: %v", err)
			}
			calls := m.Requests()
			if len(calls) != 1 {
				t.Fatalf("%d requests, want 1", len(calls))
			}
			if got, want := calls[0].Body, compact(t, tt.want); got != want {
				t.Errorf("request body\n got %s\nwant %s", got, want)
			}
			h := calls[0].Header
			if h.Get("Authorization") != "Bearer "+testKey || h.Get("Content-Type") != "application/json" {
				t.Errorf("headers Authorization=%q Content-Type=%q", h.Get("Authorization"), h.Get("Content-Type"))
			}
		})
	}
}

// TestBaseURLWithAQuery: a base URL's query (Azure's api-version, a proxy's key) stays in the
// query; the path goes after the base URL's path, not into its query.
func TestBaseURLWithAQuery(t *testing.T) {
	m := newFakeModel(t, openaitest.Reply("ok", 1, 1))
	a := MustAgent(t, m, nil, nil, func(c *openai.Config) { c.BaseURL = m.URL() + "/?api-version=2024-10-21&x=a%2Fb" })
	if _, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got, want := m.Requests()[0].URL, "/v1/chat/completions?api-version=2024-10-21&x=a%2Fb"; got != want {
		t.Errorf("request URL %q, want %q", got, want)
	}
}

func TestNoKeyVariableSendsNoAuthorization(t *testing.T) {
	m := newFakeModel(t, openaitest.Reply("ok", 1, 1))
	a := MustAgent(t, m, nil, nil, func(c *openai.Config) { c.APIKeyEnv = "" })
	if _, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}}); err != nil {
		t.Fatal(err)
	}
	if h := m.Requests()[0].Header.Get("Authorization"); h != "" {
		t.Errorf("Authorization = %q, want none", h)
	}
}

func TestReplyAndUsage(t *testing.T) {
	m := newFakeModel(t, openaitest.Reply("  Hello there.\n", 321, 12))
	a := MustAgent(t, m, nil, nil, nil)
	resp, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Text != "Hello there." || resp.Usage != (agents.Usage{InputTokens: 321, OutputTokens: 12}) {
		t.Errorf("Run = %q %+v, want \"Hello there.\" {321 12}", resp.Text, resp.Usage)
	}
}

func TestEmptyReplyIsAnError(t *testing.T) {
	m := newFakeModel(t, openaitest.Reply("", 40, 0))
	a := MustAgent(t, m, nil, nil, nil)
	resp, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}})
	if !errors.Is(err, openai.ErrEmptyReply) {
		t.Fatalf("Run error = %v, want ErrEmptyReply", err)
	}
	if resp == nil || resp.Usage.InputTokens != 40 {
		t.Errorf("Run response = %+v, want the spent usage", resp)
	}
}

// TestRefusalsSayWhy: an answer the same request would get again (the credentials, the model's
// name, a conversation too long, a refused request, the content filter with no text) is an
// agents.Refusal whose notice tells the user why; one that may pass (a 500) is not, and the
// user is asked to try again. Only the content policy and filter decline the message itself
// (Refusal.Declined).
func TestRefusalsSayWhy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer http.HandlerFunc
		want   string // in the notice; "" means no Refusal
		// declined is Refusal.Declined: the message itself is declined (a later turn must not
		// send it again), not the request agentgate made of it.
		declined bool
	}{
		{"bad key", openaitest.Status(401, `{"error":{"message":"Incorrect API key provided"}}`), "refused its credentials", false},
		{"forbidden", openaitest.Status(403, `{"error":{"message":"no access"}}`), "refused its credentials", false},
		{"unknown model", openaitest.Status(404, `{"error":{"message":"The model 'gpt-9' does not exist"}}`), "no such model or address", false},
		{"context length (OpenAI)", openaitest.Status(400, `{"error":{"message":"This model's maximum context length is 8192 tokens.","code":"context_length_exceeded"}}`), "send /new", false},
		{"context length (vLLM)", openaitest.Status(400, `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens"}`), "send /new", false},
		{"too large", openaitest.Status(413, `request entity too large`), "send /new", false},
		{"content policy", openaitest.Status(400, `{"error":{"message":"Your request was rejected as a result of our safety system.","code":"content_policy_violation"}}`), "content policy", true},
		// OpenAI's reasoning models; before, it named nothing and read as a request refused.
		{"invalid prompt", openaitest.Status(400, `{"error":{"message":"Invalid prompt: your prompt was flagged as potentially violating our usage policy. Please try again with a different prompt: https://platform.openai.com/docs/guides/reasoning#advice-on-prompting","type":"invalid_request_error","param":null,"code":"invalid_prompt"}}`), "content policy", true},
		{"invalid prompt behind LiteLLM", openaitest.Status(400, `{"error":{"message":"litellm.BadRequestError: OpenAIException - Error code: 400 - {'error': {'message': 'Invalid prompt: your prompt was flagged as potentially violating our usage policy. Please try again with a different prompt: https://platform.openai.com/docs/guides/reasoning#advice-on-prompting', 'type': 'invalid_request_error', 'param': None, 'code': 'invalid_prompt'}}","type":null,"param":null,"code":"400"}}`), "content policy", true},
		{"bad request", openaitest.Status(400, `{"error":{"message":"Invalid value for 'temperature'"}}`), "refused the request", false},
		{"unprocessable", openaitest.Status(422, `{"detail":[{"loc":["body","messages",1,"content"],"msg":"Input should be a valid string","type":"string_type"}]}`), "refused the request", false},
		{"content filter, no text", openaitest.Raw("application/json", `{"choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"content_filter"}]}`), "content filter", true},
		// A refusal declines the message as the content filter does; before, it was a reply
		// kept in later turns. Its words are the notice's end, without their period.
		{"refusal field", openaitest.Raw("application/json", `{"choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":"I can't help with that."},"finish_reason":"stop"}]}`),
			"the model refused to answer it, saying: I can't help with that", true},
		// agentgate offers no tools: asked again for the same message, the model asks again.
		// Before, the user was told to try again.
		{"tool calls, no text", openaitest.Raw("application/json", `{"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}}]},"finish_reason":"tool_calls"}]}`),
			"asked to call a tool", true},
		{"tool calls, streamed", openaitest.Raw("text/event-stream", `data: {"choices":[{"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}`+"\n\n"+
			`data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}`+"\n\n"+
			`data: {"choices":[{"delta":{},"finish_reason":"tool_calls"}]}`+"\n\ndata: [DONE]\n\n"), "asked to call a tool", true},
		// A server that says stop but sends the call all the same.
		{"tool calls with finish stop", openaitest.Raw("application/json", `{"choices":[{"message":{"content":"","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"stop"}]}`),
			"asked to call a tool", true},
		{"function call (legacy)", openaitest.Raw("application/json", `{"choices":[{"message":{"content":null,"function_call":{"name":"f","arguments":"{}"}},"finish_reason":"function_call"}]}`),
			"asked to call a tool", true},
		{"server error", openaitest.Status(500, `{"error":{"message":"boom"}}`), "", false},
		// A wait longer than max_backoff is not waited out: the user is told how long, not to
		// try again at once.
		{"rate limit of an hour", openaitest.Status(429, `{"error":{"message":"quota"}}`, "Retry-After: 3600"), "asked for a wait of 1h0m0s before its next request: send it again after that", false},
		{"rate limit within max_backoff", openaitest.Status(429, `{"error":{"message":"slow"}}`, "Retry-After: 2"), "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(t, tc.answer)
			a := MustAgent(t, m, nil, nil, func(c *openai.Config) { c.MaxRetries = 0 })
			_, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}})
			if err == nil {
				t.Fatal("Run succeeded, want an error")
			}
			ref, ok := errors.AsType[*agents.Refusal](err)
			switch {
			case tc.want == "" && ok:
				t.Errorf("Run error %v is a Refusal (%q), want one the user may try again", err, ref.Notice)
			case tc.want != "" && (!ok || !strings.Contains(ref.Notice, tc.want)):
				t.Errorf("Run error = %v (refusal %v), want a Refusal saying %q", err, ok, tc.want)
			case ok && ref.Declined != tc.declined:
				t.Errorf("Run error %v: Refusal.Declined = %v, want %v", err, ref.Declined, tc.declined)
			}
		})
	}
}

// TestRefusalOfASettingIsNotSentWithoutTheRiders: a 400 or 422 that names only parameters of
// the agent's configuration as what it refuses (a max_tokens too large for the model, a
// temperature it does not take, an unknown model) fails the turn as "refused the request" for a
// setting, and is not sent again without the earlier messages that got no answer: no message is
// at fault, and none is left out. A refusal that names the messages, or names nothing, is sent
// again without them (TestRefusedRequestIsSentAgainWithoutTheRiders), and says so in the log.
func TestRefusalOfASettingIsNotSentWithoutTheRiders(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		probed     bool
	}{
		{"max_tokens too large (OpenAI)", `{"error":{"message":"max_tokens is too large: 100000. This model supports at most 16384 completion tokens, whereas you provided 100000.","type":"invalid_request_error","param":"max_tokens","code":null}}`, false},
		{"temperature (OpenAI)", `{"error":{"message":"Unsupported value: 'temperature' does not support 0.7 with this model. Only the default (1) value is supported.","type":"invalid_request_error","param":"temperature","code":"unsupported_value"}}`, false},
		{"temperature (vLLM)", `{"object":"error","message":"temperature must be in [0, 2], got 3.0. (parameter=temperature, value=3.0)","type":"BadRequestError","code":400}`, false},
		{"model", `{"error":{"message":"invalid model ID","type":"invalid_request_error","param":"model"}}`, false},
		// LiteLLM's proxy passes a provider's error on as Python's repr, in its message.
		{"max_tokens too large (OpenAI behind LiteLLM)", `{"error":{"message":"litellm.BadRequestError: OpenAIException - Error code: 400 - {'error': {'message': 'max_tokens is too large: 100000. This model supports at most 16384 completion tokens, whereas you provided 100000.', 'type': 'invalid_request_error', 'param': 'max_tokens', 'code': None}}","type":null,"param":null,"code":"400"}}`, false},
		{"stop (vLLM behind LiteLLM)", `{"error":{"message":"litellm.BadRequestError: OpenAIException - Error code: 400 - {'error': {'message': \"[{'type': 'string_type', 'loc': ('body', 'stop', 'str'), 'msg': 'Input should be a valid string', 'input': []}]\", 'type': 'BadRequestError', 'param': None, 'code': 400}}","type":null,"param":null,"code":"400"}}`, false},
		{"a message (OpenAI behind LiteLLM)", `{"error":{"message":"litellm.BadRequestError: OpenAIException - Error code: 400 - {'error': {'message': \"Invalid 'messages[1].content': string too long.\", 'type': 'invalid_request_error', 'param': 'messages', 'code': None}}","type":null,"param":null,"code":"400"}}`, true},
		// serde's, as an axum-based server answers a setting it does not know.
		{"temperature (an axum server)", "Failed to deserialize the JSON body into the target type: unknown field `temperature`, expected one of `model`, `messages`, `max_tokens` at line 1 column 60", false},
		{"a message (OpenAI)", `{"error":{"message":"Invalid 'messages[1].content': string too long.","type":"invalid_request_error","param":"messages[1].content"}}`, true},
		{"a message (pydantic)", `{"detail":[{"loc":["body","messages",1,"content"],"msg":"Input should be a valid string","type":"string_type"}]}`, true},
		{"a message and a setting", `{"detail":[{"loc":["body","messages",1,"content"],"msg":"Input should be a valid string","type":"string_type"},{"loc":["body","max_tokens"],"msg":"Input should be less than 4096","type":"less_than"}]}`, true},
		{"nothing named", `{"error":{"message":"Bad Request"}}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code := http.StatusBadRequest
			if strings.HasPrefix(tc.body, `{"detail"`) || strings.HasPrefix(tc.body, "Failed to deserialize") {
				code = http.StatusUnprocessableEntity
			}
			m := newFakeModel(t, openaitest.Status(code, tc.body))
			a := MustAgent(t, m, nil, nil, func(c *openai.Config) { c.MaxRetries, c.MaxTokens = 0, 100000 })
			_, err := a.Run(t.Context(), &agents.Request{History: []agents.Message{msg("user", "unanswered")}, Messages: []agents.Message{msg("user", "hi")}})
			ref, ok := errors.AsType[*agents.Refusal](err)
			if !ok || !strings.Contains(ref.Notice, "refuse") {
				t.Fatalf("Run error = %v, want a Refusal saying it refused the request", err)
			}
			if want := map[bool]int{false: 1, true: 2}[tc.probed]; m.Count() != want {
				t.Errorf("the model got %d requests, want %d", m.Count(), want)
			}
			if setting := strings.Contains(ref.Notice, "for a setting of the agent"); setting == tc.probed {
				t.Errorf("Run error %v: notice %q, want it to name a setting: %v", err, ref.Notice, !tc.probed)
			}
		})
	}
}

// TestStreamedRefusalIsNoReply: a refusal streamed in the refusal field, as OpenAI streams it,
// is not shown growing as a reply: the turn fails with a Refusal that quotes it, and declines
// the message. Before, the user watched it stream in as the answer, and it stayed in later
// turns as one.
func TestStreamedRefusalIsNoReply(t *testing.T) {
	m := newFakeModel(t, openaitest.Raw("text/event-stream",
		`data: {"choices":[{"delta":{"role":"assistant","content":null,"refusal":""}}]}`+"\n\n"+
			`data: {"choices":[{"delta":{"refusal":"I'm sorry, "}}]}`+"\n\n"+
			`data: {"choices":[{"delta":{"refusal":"I can't help with that."}}]}`+"\n\n"+
			`data: {"choices":[{"delta":{},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n"))
	a := MustAgent(t, m, nil, nil, nil)
	var partials []string
	_, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")},
		Partial: func(s string) { partials = append(partials, s) }})
	ref, ok := errors.AsType[*agents.Refusal](err)
	if want := "the model refused to answer it, saying: I'm sorry, I can't help with that"; !ok || ref.Notice != want || !ref.Declined {
		t.Errorf("Run error = %v (refusal %v), want a declining Refusal whose notice is %q", err, ok, want)
	}
	if len(partials) != 0 {
		t.Errorf("partials %q, want none: a refusal is no reply", partials)
	}
}

// TestStreamErrorField: llama.cpp's server, until its late-2025 rework, sent an error in a
// stream as a field of its own, "error: {…}", then "data: [DONE]" (server.cpp's
// server_sent_event(sink, "error", error_data); the body as ggml-org/llama.cpp#14566 and
// coddy-project/coddy-agent#106 quote it): it is read as the error it is, as the same error in
// a "data:" event or a 200's body would be. A prompt too long for the context is a conversation
// too long (/new); exceed_context_size_error's numbers, where the prompt fits, blame the
// max_tokens setting (an ERR); an error after text was streamed fails the turn with the
// server's message, not sent again. Before, the line was skipped: the turn ended as a reply
// without text (or, with no [DONE] after it, as a response that broke off, sent again), the
// server's reason unsaid, and a reply broken off by an error was taken for whole.
func TestStreamErrorField(t *testing.T) {
	const tooLong = "the request exceeds the available context size. try increasing the context size or enable context shift"
	for _, tc := range []struct {
		name, body string
		want       string // in the notice, or in the error when it is no Refusal
		refusal    bool
		newHelps   bool // the notice names /new
		operator   bool // an ERR for the operator
		partials   int
	}{
		{"a prompt too long (b5630)",
			`error: {"code":400,"message":"` + tooLong + `","type":"invalid_request_error"}` + "\n\ndata: [DONE]\n\n",
			"conversation is too long", true, true, false, 0},
		{"a prompt too long, the stream ending after it",
			`error: {"code":400,"message":"request (4476 tokens) exceeds the available context size (4096 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":4476,"n_ctx":4096}` + "\n\n",
			"conversation is too long", true, true, false, 0},
		{"exceed_context_size_error, the prompt fits",
			`error: {"code":400,"message":"` + tooLong + `","type":"exceed_context_size_error","n_prompt_tokens":7000,"n_ctx":8192}` + "\n\ndata: [DONE]\n\n",
			"max_tokens setting", true, true, true, 0},
		{"an error after text",
			`data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}` + "\n\n" + `error: {"code":500,"message":"Context size has been exceeded.","type":"server_error"}` + "\n\ndata: [DONE]\n\n",
			"Context size has been exceeded.", false, false, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(t, openaitest.Raw("text/event-stream", tc.body))
			var logs bytes.Buffer
			a := MustAgent(t, m, &logs, nil, func(c *openai.Config) { c.MaxTokens = 2000 })
			partials := 0
			resp, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}, Partial: func(string) { partials++ }})
			ref, isRef := errors.AsType[*agents.Refusal](err)
			switch {
			case err == nil:
				t.Fatalf("Run = %+v, want an error", resp)
			case isRef != tc.refusal:
				t.Fatalf("Run error = %v (refusal %v), want a Refusal: %v", err, isRef, tc.refusal)
			case isRef && (!strings.Contains(ref.Notice, tc.want) || strings.Contains(ref.Notice, "/new") != tc.newHelps):
				t.Fatalf("Run error = %v, want a Refusal saying %q, /new named: %v", err, tc.want, tc.newHelps)
			case !isRef && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("Run error = %v, want the server's message %q", err, tc.want)
			}
			if m.Count() != 1 {
				t.Errorf("the model got %d requests, want 1", m.Count())
			}
			if partials != tc.partials {
				t.Errorf("partials = %d, want %d", partials, tc.partials)
			}
			if got := strings.Contains(logs.String(), "level=ERROR"); got != tc.operator {
				t.Errorf("an ERR logged: %v, want %v:\n%s", got, tc.operator, logs.String())
			}
		})
	}
}

// TestErrorAfterTextIsNoRefusal: an error a stream sends after text was shown, with a 400 as
// its code, is a reply broken off, not a refusal of what the request held: vLLM's streamed
// error (serving_engine.py's create_streaming_error_response, whose status defaults to 400
// BadRequestError, for any exception in the middle of a reply), or llama.cpp's older "error:"
// line. The request is not sent again without the earlier messages that got no answer, which
// showed the user the reply start over, nor are they left out; the turn fails with the
// server's message, and its sender is asked to try again (no Refusal), as after a 500. Before,
// the 400 read as a refusal of the riders: the request went again without them.
func TestErrorAfterTextIsNoRefusal(t *testing.T) {
	const text = `data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}` + "\n\n"
	for _, tc := range []struct{ name, body string }{
		{"vLLM", text + `data: {"error":{"object":"error","message":"list index out of range","type":"BadRequestError","param":null,"code":400}}` + "\n\ndata: [DONE]\n\n"},
		{"llama.cpp's error line", text + `error: {"code":400,"message":"list index out of range","type":"invalid_request_error"}` + "\n\ndata: [DONE]\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(t, openaitest.Raw("text/event-stream", tc.body))
			var logs bytes.Buffer
			a := MustAgent(t, m, &logs, nil, nil)
			req := ridersRequest("s1", "what is the time?", "and the date?")
			var shown []string
			req.Partial = func(s string) { shown = append(shown, s) }
			resp, err := a.Run(t.Context(), req)
			if _, isRef := errors.AsType[*agents.Refusal](err); err == nil || isRef || !strings.Contains(err.Error(), "list index out of range") {
				t.Fatalf("Run error = %v, want the server's message, no Refusal", err)
			}
			if resp != nil && resp.RidersLeftOut {
				t.Errorf("Run left the riders out")
			}
			if m.Count() != 1 || len(shown) != 1 {
				t.Errorf("the model got %d requests, the user was shown %q; want 1 request, the text shown once", m.Count(), shown)
			}
			if strings.Contains(logs.String(), "level=ERROR") {
				t.Errorf("logs hold an ERR:\n%s", logs.String())
			}
		})
	}
}

// TestMaxCompletionTokens: an endpoint that refuses max_tokens and asks for
// max_completion_tokens (OpenAI's reasoning models) gets the request again at once with the
// bound under that name, and every later request too; the turn is answered. Before, every turn
// failed, and no setting could send the bound by that name.
func TestMaxCompletionTokens(t *testing.T) {
	refuse := openaitest.Status(400, `{"error":{"message":"Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.","type":"invalid_request_error","param":"max_tokens","code":"unsupported_parameter"}}`)
	m := newFakeModel(t, refuse, openaitest.Reply("first", 1, 1), openaitest.Reply("second", 1, 1))
	a := MustAgent(t, m, nil, nil, func(c *openai.Config) { c.MaxTokens = 300 })
	for _, want := range []string{"first", "second"} {
		resp, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}})
		if err != nil || resp.Text != want {
			t.Fatalf("Run = %+v, %v; want %q", resp, err, want)
		}
	}
	for n, want := range []string{`"max_tokens":300`, `"max_completion_tokens":300`, `"max_completion_tokens":300`} {
		body := m.Body(t, n+1)
		if !strings.Contains(body, want) || strings.Count(body, "max_") != 1 {
			t.Errorf("request %d = %s, want the bound once, as %s", n+1, body, want)
		}
	}
	// Another 400 is not sent again.
	m2 := newFakeModel(t, openaitest.Status(400, `{"error":{"message":"Invalid value for 'temperature'"}}`))
	a2 := MustAgent(t, m2, nil, nil, func(c *openai.Config) { c.MaxTokens = 300 })
	if _, err := a2.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}}); err == nil || len(m2.Requests()) != 1 {
		t.Errorf("Run = %v after %d requests, want the 400 after one", err, len(m2.Requests()))
	}
}

// TestStreaming: with Partial set the request streams, Partial gets the whole text as it grows
// (one call per delta), and the reply and usage come from the stream.
func TestStreaming(t *testing.T) {
	gate := make(chan struct{})
	m := newFakeModel(t, openaitest.Stream(gate, 55, 3, "Hel", "lo, ", "world"))
	a := MustAgent(t, m, nil, nil, nil)
	partials := make(chan string, 16)
	type result struct {
		resp *agents.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := a.Run(t.Context(), &agents.Request{
			Messages: []agents.Message{msg("user", "hi")},
			Partial:  func(s string) { partials <- s },
		})
		done <- result{resp, err}
	}()
	for i, want := range []string{"Hel", "Hello, ", "Hello, world"} {
		if i > 0 {
			gate <- struct{}{}
		}
		select {
		case got := <-partials:
			if got != want {
				t.Errorf("partial %d = %q, want %q", i, got, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no partial %d", i)
		}
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.resp.Text != "Hello, world" || r.resp.Usage != (agents.Usage{InputTokens: 55, OutputTokens: 3}) {
		t.Errorf("Run = %q %+v, want \"Hello, world\" {55 3}", r.resp.Text, r.resp.Usage)
	}
	want := compact(t, `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`)
	if got := m.Requests()[0]; got.Body != want || got.Header.Get("Accept") != "text/event-stream" {
		t.Errorf("request %s (Accept %q), want %s", got.Body, got.Header.Get("Accept"), want)
	}
	if len(partials) != 0 {
		t.Errorf("%d more partials, want none", len(partials))
	}
}

func TestStreamRequestAnsweredWithJSON(t *testing.T) {
	m := newFakeModel(t, openaitest.Reply("whole", 2, 1))
	a := MustAgent(t, m, nil, nil, nil)
	var got []string
	resp, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}, Partial: func(s string) { got = append(got, s) }})
	if err != nil || resp.Text != "whole" || fmt.Sprint(got) != "[whole]" {
		t.Errorf("Run = %+v, %v with partials %q; want \"whole\" once", resp, err, got)
	}
}

// TestRetries: 429 and 5xx are retried with capped exponential backoff, honouring Retry-After in
// seconds, as an HTTP date and as retry-after-ms; the waits are what the injected sleep saw.
func TestRetries(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		steps     []http.HandlerFunc
		tweak     func(*openai.Config)
		waits     []time.Duration
		calls     int
		wantErr   string // "" means success
		wantReply string
	}{
		{
			name: "Retry-After seconds, HTTP date, backoff",
			steps: []http.HandlerFunc{
				openaitest.Status(429, `{"error":{"message":"Rate limit reached"}}`, "Retry-After: 7"),
				// Sent 7 s later, after the first wait.
				openaitest.Status(503, `overloaded`, "Retry-After: "+now.Add(10*time.Second).Format(http.TimeFormat)),
				openaitest.Status(500, `{"error":{"message":"boom"}}`),
				openaitest.Reply("finally", 9, 2),
			},
			waits: []time.Duration{7 * time.Second, 3 * time.Second, 4 * time.Second}, calls: 4, wantReply: "finally",
		},
		{
			name:  "retry-after-ms",
			steps: []http.HandlerFunc{openaitest.Status(429, `{}`, "Retry-After-Ms: 1500", "Retry-After: 2"), openaitest.Reply("ok", 1, 1)},
			waits: []time.Duration{1500 * time.Millisecond}, calls: 2, wantReply: "ok",
		},
		{
			name:  "fractional Retry-After",
			steps: []http.HandlerFunc{openaitest.Status(429, `{"error":{"message":"slow down"}}`, "Retry-After: 0.5"), openaitest.Reply("ok", 1, 1)},
			waits: []time.Duration{500 * time.Millisecond}, calls: 2, wantReply: "ok",
		},
		{
			// A 200 without a body (a proxy that lost the endpoint's answer) is no answer: a
			// chat completion changes nothing on the endpoint, so it is asked again. Before,
			// the turn failed at once ("unexpected end of JSON input").
			name:  "an empty 200 is retried",
			steps: []http.HandlerFunc{openaitest.Raw("application/json", ""), openaitest.Raw("application/json", " \r\n"), openaitest.Reply("ok", 1, 1)},
			waits: []time.Duration{time.Second, 2 * time.Second}, calls: 3, wantReply: "ok",
		},
		{
			name:  "a 200 whose JSON ends before it is whole is retried",
			steps: []http.HandlerFunc{openaitest.Raw("application/json", `{"choices":[{"index":0,"message":{"role":"assistant","content":"hal`), openaitest.Reply("whole", 1, 1)},
			waits: []time.Duration{time.Second}, calls: 2, wantReply: "whole",
		},
		{
			name:  "an empty 200 that lasts fails the turn as broken off",
			steps: []http.HandlerFunc{openaitest.Raw("application/json", "")},
			waits: []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}, calls: 4, wantErr: "response broke off: the answer's body is empty",
		},
		{
			name:  "backoff is capped",
			steps: []http.HandlerFunc{openaitest.Status(502, ``), openaitest.Status(502, ``), openaitest.Status(502, ``), openaitest.Status(502, ``), openaitest.Reply("ok", 1, 1)},
			tweak: func(c *openai.Config) { c.MaxRetries, c.MaxBackoff = 5, 3*time.Second },
			waits: []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}, calls: 5, wantReply: "ok",
		},
		{
			name:  "retries run out",
			steps: []http.HandlerFunc{openaitest.Status(500, `{"error":{"message":"still broken"}}`)},
			waits: []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}, calls: 4,
			wantErr: "model endpoint answered 500 Internal Server Error: still broken",
		},
		{
			name:  "Retry-After longer than max_backoff is not retried",
			steps: []http.HandlerFunc{openaitest.Status(429, `{"error":{"message":"quota"}}`, "Retry-After: 120")},
			calls: 1, wantErr: "model endpoint answered 429 Too Many Requests: quota (asked to retry after 2m0s)",
		},
		{
			name:  "a client error is not retried",
			steps: []http.HandlerFunc{openaitest.Status(400, `{"error":{"message":"context length exceeded"}}`)},
			calls: 1, wantErr: "model endpoint answered 400 Bad Request: context length exceeded",
		},
		{
			name: "a stream that breaks before any text is retried",
			steps: []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			}, openaitest.Stream(nil, 1, 1, "fine")},
			tweak: func(c *openai.Config) {}, waits: []time.Duration{time.Second}, calls: 2, wantReply: "fine",
		},
		{
			name: "a stream that breaks after text is not retried",
			steps: []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"half an ans\"}}]}\n\n")
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			}},
			calls: 1, wantErr: "response broke off",
		},
		{
			// A proxy that cuts a stream off at its own timeout may end it cleanly, between two
			// events: without [DONE] or a finish reason the reply is not whole.
			name:  "a stream that ends cleanly after text, unfinished, is not retried",
			steps: []http.HandlerFunc{openaitest.Raw("text/event-stream", "data: {\"choices\":[{\"delta\":{\"content\":\"half an ans\"}}]}\n\n")},
			calls: 1, wantErr: "response broke off",
		},
		{
			name: "an unasked-for event-stream answer that ends unfinished is retried",
			steps: []http.HandlerFunc{
				openaitest.Raw("text/event-stream", "data: {\"choices\":[{\"delta\":{\"content\":\"half an ans\"}}]}\n\n"),
				openaitest.Reply("whole", 1, 1),
			},
			waits: []time.Duration{time.Second}, calls: 2, wantReply: "whole",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newFakeModel(t, tt.steps...)
			sl := &sleeps{at: now}
			a := MustAgent(t, m, nil, sl, func(c *openai.Config) {
				c.Now = sl.now
				if tt.tweak != nil {
					tt.tweak(c)
				}
			})
			req := &agents.Request{Messages: []agents.Message{msg("user", "hi")}}
			if strings.Contains(tt.name, "stream") && !strings.Contains(tt.name, "unasked-for") {
				req.Partial = func(string) {}
			}
			resp, err := a.Run(t.Context(), req)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Run: %v", err)
			case tt.wantErr == "" && resp.Text != tt.wantReply:
				t.Errorf("reply %q, want %q", resp.Text, tt.wantReply)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("Run error = %v, want one containing %q", err, tt.wantErr)
			}
			if d := cmp.Diff(tt.waits, sl.waits()); d != "" {
				t.Errorf("waits mismatch (-want +got):\n%s", d)
			}
			if n := len(m.Requests()); n != tt.calls {
				t.Errorf("%d requests, want %d", n, tt.calls)
			}
		})
	}
}

// TestRedirectIsNotFollowed: a redirect is an error that says where it points. A client that
// follows it turns the POST into a GET (301, 302) and sends the API key along to the same host
// over any scheme, and to its subdomains.
func TestRedirectIsNotFollowed(t *testing.T) {
	for _, code := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			var m *openaitest.Model
			m = newFakeModel(t, func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, m.URL()+"/chat/completions?api-key="+testKey, code)
			}, openaitest.Reply("followed", 1, 1))
			a := MustAgent(t, m, nil, nil, nil)
			resp, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}})
			var se *openai.StatusError
			if !errors.As(err, &se) || se.Code != code {
				t.Fatalf("Run = %+v, %v; want a StatusError %d", resp, err, code)
			}
			if want := "redirected to " + m.URL() + "/chat/completions, which is not followed"; !strings.Contains(se.Message, want) {
				t.Errorf("error message %q, want it to contain %q", se.Message, want)
			}
			if strings.Contains(err.Error(), testKey) {
				t.Errorf("error %q carries the key", err)
			}
			if n := m.Count(); n != 1 {
				t.Errorf("the model got %d requests, want 1 (no retry, no redirect followed)", n)
			}
		})
	}
}

// TestEventStreamAnswers: an answer is read as what its body is. Servers and proxies that always
// stream answer a plain request with an event stream, or label a stream application/json (or a
// JSON document text/event-stream).
func TestEventStreamAnswers(t *testing.T) {
	const stream = ": keep-alive\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"He\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"llo\"},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n"
	tests := []struct {
		name      string
		answer    http.HandlerFunc
		streaming bool
		partials  []string
	}{
		{"a plain request answered with a stream", openaitest.Raw("text/event-stream", stream), false, nil},
		{"a plain request answered with a stream labelled JSON", openaitest.Raw("application/json", stream), false, nil},
		{"a stream labelled JSON", openaitest.Raw("application/json; charset=utf-8", "\n"+stream), true, []string{"He", "Hello"}},
		{"a stream without a label", openaitest.Raw("", "data: "+stream[len(": keep-alive\n\ndata: "):]), true, []string{"He", "Hello"}},
		{"a stream whose lines end with a lone CR", openaitest.Raw("text/event-stream", strings.ReplaceAll(stream, "\n", "\r")), true, []string{"He", "Hello"}},
		{"a stream that starts with a byte order mark", openaitest.Raw("text/event-stream", "\uFEFF"+stream[len(": keep-alive\n\n"):]), true, []string{"He", "Hello"}},
		{"one reply that starts with a byte order mark", openaitest.Raw("application/json", "\uFEFF"+`{"choices":[{"message":{"content":"Hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":2}}`), false, nil},
		{"one reply labelled a stream", openaitest.Raw("text/event-stream", `{"choices":[{"message":{"content":"Hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":2}}`), true, []string{"Hello"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newFakeModel(t, tt.answer)
			a := MustAgent(t, m, nil, nil, nil)
			resp, partials := mustRun(t, a, &agents.Request{Messages: []agents.Message{msg("user", "hi")}}, tt.streaming)
			if resp.Text != "Hello" || resp.Usage != (agents.Usage{InputTokens: 4, OutputTokens: 2}) {
				t.Errorf("Run = %q %+v, want \"Hello\" {4 2}", resp.Text, resp.Usage)
			}
			if d := cmp.Diff(tt.partials, partials); d != "" {
				t.Errorf("partials mismatch (-want +got):\n%s", d)
			}
		})
	}
}

// mustRun runs req on a, with streaming the texts Partial was given, and fails the test on an
// error.
func mustRun(t *testing.T, a *openai.Agent, req *agents.Request, streaming bool) (*agents.Response, []string) {
	t.Helper()
	var partials []string
	if streaming {
		req.Partial = func(s string) { partials = append(partials, s) } // called by Run's call, one at a time
	}
	resp, err := a.Run(t.Context(), req)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return resp, partials
}

// TestCutOffReplySaysSo: a reply the model stopped at its length limit or its content filter
// says so at its end (the user would take it for the whole answer), and the log says why; the
// next turn's history carries the reply without the note.
func TestCutOffReplySaysSo(t *testing.T) {
	tests := []struct {
		name, finish string
		streaming    bool
		want         string
	}{
		{"length", "length", false, "The answer is cut sho\n\n[…cut off: the model reached its length limit]"},
		{"content filter, streamed", "content_filter", true, "The answer is cut sho\n\n[…cut off by the model's content filter]"},
		// "Let me look that up" and nothing more: no answer follows the call.
		{"tool calls", "tool_calls", false, "The answer is cut sho\n\n[…cut off: the model asked to call a tool, which agentgate does not offer]"},
		{"stop", "stop", true, "The answer is cut sho"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			answer := openaitest.Raw("application/json", `{"choices":[{"message":{"content":"The answer is cut sho"},"finish_reason":"`+tt.finish+`"}]}`)
			if tt.streaming {
				answer = openaitest.Raw("text/event-stream", `data: {"choices":[{"delta":{"content":"The answer is cut sho"}}]}`+"\n\n"+
					`data: {"choices":[{"delta":{},"finish_reason":"`+tt.finish+`"}]}`+"\n\ndata: [DONE]\n\n")
			}
			m := newFakeModel(t, answer)
			var logs strings.Builder
			a := MustAgent(t, m, &logs, nil, nil)
			resp, partials := mustRun(t, a, &agents.Request{Messages: []agents.Message{msg("user", "hi")}, Identity: identity.Turn{TurnID: "t_cut"}}, tt.streaming)
			if resp.Text != tt.want {
				t.Errorf("Run = %q, want %q", resp.Text, tt.want)
			}
			if tt.streaming && partials[len(partials)-1] != tt.want {
				t.Errorf("the last partial %q, want the reply %q", partials[len(partials)-1], tt.want)
			}
			line := "model reply cut off"
			if got := strings.Contains(logs.String(), line) && strings.Contains(logs.String(), "turn=t_cut"); got != (tt.finish != "stop") {
				t.Errorf("log has %q for the turn: %v, want %v; log:\n%s", line, got, !got, logs.String())
			}
			// The note is the user's: the next turn gives the model its own reply without it.
			next := &agents.Request{History: []agents.Message{msg("user", "hi"), msg("assistant", resp.Text)},
				Messages: []agents.Message{msg("user", "go on")}}
			if _, err := a.Run(t.Context(), next); err != nil {
				t.Fatal(err)
			}
			if body, want := m.Body(t, 2), `{"role":"assistant","content":"The answer is cut sho"}`; !strings.Contains(body, want) {
				t.Errorf("the next request %s, want the reply in its history as %s", body, want)
			}
		})
	}
}

// TestReplyLongerThanMaxReply: a reply longer than MaxReply is cut there and says so; a stream
// that never ends (a model repeating itself, with no max_tokens) is read no further than that,
// and its request ends, rather than running to the turn's timeout.
func TestReplyLongerThanMaxReply(t *testing.T) {
	long := strings.Repeat("é", openai.MaxReply/2+1)
	endless := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := strings.Repeat(`data: {"choices":[{"delta":{"content":"`+strings.Repeat("ab", 500)+`"}}]}`+"\n\n", 16)
		for r.Context().Err() == nil {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
		}
	}
	tests := []struct {
		name      string
		answer    http.HandlerFunc
		streaming bool
	}{
		{"one reply", openaitest.Reply(long, 1, 1), false},
		{"a stream that never ends", endless, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newFakeModel(t, tt.answer)
			a := MustAgent(t, m, nil, nil, func(c *openai.Config) { c.Timeout = 30 * time.Second })
			req := &agents.Request{Messages: []agents.Message{msg("user", "hi")}}
			if tt.streaming {
				req.Partial = func(string) {}
			}
			resp, err := a.Run(t.Context(), req)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			const note = "\n\n[…cut off: the reply is longer than agentgate takes]"
			if !strings.HasSuffix(resp.Text, note) || len(resp.Text) > openai.MaxReply || len(resp.Text) < openai.MaxReply-len(note)-4 {
				t.Errorf("Run = %d bytes ending %q, want at most %d ending %q", len(resp.Text), resp.Text[max(len(resp.Text)-80, 0):], openai.MaxReply, note)
			}
		})
	}
}

// TestUnreachableIsRetriedAndSafe: a refused connection is retried; the error names neither the
// URL nor the credentials it may carry.
func TestUnreachableIsRetriedAndSafe(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	t.Setenv("OPENAI_TEST_KEY", testKey)
	sl := &sleeps{}
	a, err := openai.New(openai.Config{BaseURL: "http://proxyuser:hunter2hunter2@" + addr + "/v1?api-key=" + testKey,
		Model: "m", APIKeyEnv: "OPENAI_TEST_KEY", MaxRetries: 2, Sleep: sl.sleep, Jitter: noJitter})
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}})
	if err == nil || !strings.Contains(err.Error(), "model endpoint unreachable") {
		t.Fatalf("Run error = %v, want unreachable", err)
	}
	for _, secret := range []string{"hunter2hunter2", testKey, addr + "/v1"} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("error %q contains %q", err, secret)
		}
	}
	if d := cmp.Diff([]time.Duration{time.Second, 2 * time.Second}, sl.waits()); d != "" {
		t.Errorf("waits mismatch (-want +got):\n%s", d)
	}
}

// TestCancelAbortsTheRequest: cancelling the turn's context (an interrupt) cancels the HTTP
// request in flight; the server sees its request context end.
func TestCancelAbortsTheRequest(t *testing.T) {
	cancelled := make(chan struct{})
	m := newFakeModel(t, func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		close(cancelled)
	})
	for _, streaming := range []bool{false, true} {
		t.Run(fmt.Sprint("streaming=", streaming), func(t *testing.T) {
			if streaming {
				cancelled = make(chan struct{})
			}
			a := MustAgent(t, m, nil, nil, nil)
			ctx, cancel := context.WithCancel(t.Context())
			req := &agents.Request{Messages: []agents.Message{msg("user", "hi")}}
			if streaming {
				req.Partial = func(string) {}
			}
			done := make(chan error, 1)
			go func() {
				_, err := a.Run(ctx, req)
				done <- err
			}()
			m.Wait(t)
			cancel()
			select {
			case <-cancelled:
			case <-time.After(30 * time.Second):
				t.Fatal("the server never saw the request cancelled")
			}
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Run error = %v, want context.Canceled", err)
			}
		})
	}
}

func TestTimeoutBoundsTheTurn(t *testing.T) {
	m := newFakeModel(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	a := MustAgent(t, m, nil, nil, func(c *openai.Config) { c.Timeout = 50 * time.Millisecond })
	_, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}})
	if !errors.Is(err, openai.ErrTimeout) || err.Error() != "openai agent: timed out: no reply within 50ms (agent.openai.timeout)" {
		t.Errorf("Run error = %v, want ErrTimeout that names the timeout", err)
	}
	// The user is told it timed out, not to try again (which would most likely time out too).
	if ref, ok := errors.AsType[*agents.Refusal](err); !ok || ref.Notice != "it took longer than its time limit (50ms) and was stopped" {
		t.Errorf("Run error = %#v, want an agents.Refusal that says it took longer than its time limit", err)
	}
}

// TestSteering: a message steered in while the model works joins the next call, after the
// answer so far; the turn's reply holds both answers and its usage both calls'.
func TestSteering(t *testing.T) {
	m, release := newHeldModel(t, openaitest.Reply("First answer.", 10, 2), openaitest.Reply("Second answer.", 20, 3))
	a := MustAgent(t, m, nil, nil, nil)
	if !a.CanSteer() {
		t.Fatal("CanSteer() = false")
	}
	steer := make(chan agents.Message) // unbuffered: a send returns once the agent took it
	done := make(chan *agents.Response, 1)
	go func() {
		resp, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "[Ann] question")}, Steer: steer})
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	m.Wait(t)
	steer <- msg("user", "[Ann] and also this")
	close(release)
	resp := <-done
	close(steer)
	calls := m.Requests()
	if len(calls) != 2 {
		t.Fatalf("%d requests, want 2", len(calls))
	}
	want := compact(t, `{"model":"gpt-test","messages":[{"role":"user","content":"[Ann] question"},
		{"role":"assistant","content":"First answer."},{"role":"user","content":"[Ann] and also this"}]}`)
	if calls[1].Body != want {
		t.Errorf("second request\n got %s\nwant %s", calls[1].Body, want)
	}
	if resp.Text != "First answer.\n\nSecond answer." || resp.Usage != (agents.Usage{InputTokens: 30, OutputTokens: 5}) {
		t.Errorf("Run = %q %+v", resp.Text, resp.Usage)
	}
}

// TestSteeredIntoAFailedCallIsUnseen: a message steered into a turn whose model call then
// fails never reached the model, and the agent says so (Response.Unseen), so that it runs as
// the next turn. Counted as seen, it failed with the turn (its sender told to try again), or,
// when the endpoint declined the turn's own message, was left out of the conversation with it,
// unsent.
func TestSteeredIntoAFailedCallIsUnseen(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(w http.ResponseWriter, r *http.Request)
	}{
		{"server error", openaitest.Status(http.StatusInternalServerError, `{"error":{"message":"boom"}}`)},
		{"declined", openaitest.Status(http.StatusBadRequest, `{"error":{"message":"flagged by our content policy"}}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, release := newHeldModel(t, tc.answer)
			a := MustAgent(t, m, nil, nil, func(c *openai.Config) { c.MaxRetries = 0 })
			resp, err := steered(t, a, m, release, nil)
			if err == nil {
				t.Fatalf("Run() = %+v, nil; want an error", resp)
			}
			if resp == nil || resp.Unseen != 1 {
				t.Errorf("Run() = %+v, %v; want Unseen 1: the steered message never reached the model", resp, err)
			}
			if n := m.Count(); n != 1 {
				t.Errorf("%d requests, want 1", n)
			}
		})
	}
}

// TestSteeredCallThatFailsKeepsTheAnswer: when the call a turn makes for messages steered into
// it fails, the turn answers with what the calls before it answered, and the steered messages
// run as the next turn. Before, the turn failed: the answer the user had seen stream was thrown
// away, and the message it answered marked failed, its sender told to try again.
func TestSteeredCallThatFailsKeepsTheAnswer(t *testing.T) {
	m, release := newHeldModel(t, openaitest.Reply("First answer.", 10, 2), openaitest.Status(http.StatusInternalServerError, `{"error":{"message":"boom"}}`))
	a := MustAgent(t, m, nil, nil, func(c *openai.Config) { c.MaxRetries = 0 })
	resp, err := steered(t, a, m, release, nil)
	if n := m.Count(); n != 2 {
		t.Fatalf("%d requests, want 2", n)
	}
	if err != nil || resp == nil || resp.Text != "First answer." || resp.Unseen != 1 ||
		resp.Usage != (agents.Usage{InputTokens: 10, OutputTokens: 2}) {
		t.Errorf("Run() = %+v, %v; want First answer. with the steered message unseen and the first call's usage", resp, err)
	}
}

// TestSteeringIsBounded: a turn makes at most MaxSteerRounds more calls; in the last one the
// agent takes no more messages, so every message it took is answered.
func TestSteeringIsBounded(t *testing.T) {
	steer := make(chan agents.Message)
	var answers []http.HandlerFunc
	for i := range openai.MaxSteerRounds + 1 {
		answers = append(answers, openaitest.Reply(fmt.Sprint("answer ", i), 1, 1))
	}
	release := make(chan struct{})
	var held []http.HandlerFunc
	for i := range openai.MaxSteerRounds + 1 {
		held = append(held, func(w http.ResponseWriter, r *http.Request) {
			<-release
			answers[i](w, r)
		})
	}
	m := newFakeModel(t, held...)
	a := MustAgent(t, m, nil, nil, nil)
	done := make(chan *agents.Response, 1)
	go func() {
		resp, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "go")}, Steer: steer})
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	for i := range openai.MaxSteerRounds {
		m.Wait(t)
		steer <- msg("user", fmt.Sprint("more ", i))
		release <- struct{}{}
	}
	m.Wait(t) // the last call: nothing is taken any more
	select {
	case steer <- msg("user", "too late"):
		t.Error("the agent took a message during its last call")
	default:
	}
	release <- struct{}{}
	resp := <-done
	if n := len(m.Requests()); n != openai.MaxSteerRounds+1 {
		t.Errorf("%d requests, want %d", n, openai.MaxSteerRounds+1)
	}
	if want := "answer 0\n\nanswer 1\n\nanswer 2\n\nanswer 3"; resp.Text != want {
		t.Errorf("reply %q, want %q", resp.Text, want)
	}
}

// TestSecretsStayOut: whatever the endpoint echoes, the key reaches neither an error nor a log
// line (debug included), nor the printed agent.
func TestSecretsStayOut(t *testing.T) {
	echo := fmt.Sprintf(`{"error":{"message":"Incorrect API key provided: %s. Header was Authorization: Bearer %s","type":"invalid_request_error"}}`, testKey, testKey)
	tests := []struct {
		name    string
		steps   []http.HandlerFunc
		stream  bool
		wantErr string
	}{
		{"401 echoing the key", []http.HandlerFunc{openaitest.Status(401, echo)}, false, "401 Unauthorized: Incorrect API key provided: [redacted]"},
		{"429 echoing the key, retried", []http.HandlerFunc{openaitest.Status(429, echo, "Retry-After: 1")}, false, "429 Too Many Requests"},
		{"error inside a stream", []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: %s\n\n", echo)
		}}, true, "model endpoint answered with an error"},
		{"plain text body", []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "bad key "+testKey+" and "+r.Header.Get("Authorization"), http.StatusForbidden)
		}}, false, `403 Forbidden: "bad key [redacted] and Bearer [redacted]"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newFakeModel(t, tt.steps...)
			logs := &testutil.Buffer{}
			a := MustAgent(t, m, logs, nil, nil)
			req := &agents.Request{Messages: []agents.Message{msg("user", "hi")}, Identity: identity.Turn{TurnID: "t_1"}}
			if tt.stream {
				req.Partial = func(string) {}
			}
			_, err := a.Run(t.Context(), req)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Run error = %v, want one containing %q", err, tt.wantErr)
			}
			for what, s := range map[string]string{"error": err.Error(), "logs": logs.String(), "agent": fmt.Sprintf("%+v %#v", a, a)} {
				if strings.Contains(s, testKey) || strings.Contains(s, testKey[10:30]) {
					t.Errorf("%s contains the key: %s", what, s)
				}
			}
		})
	}
}

// TestEndpointSecretsRedacted: credentials other than the key that an endpoint (or a proxy in
// front of it) echoes in its error are redacted by the same rules as an exec command's output.
// Before, Basic credentials, a URL's password, a named value and a GitHub token reached the
// error and the log as sent.
func TestEndpointSecretsRedacted(t *testing.T) {
	secrets := []string{"dXNlcjpzM2NyZXQ=", "s3cret", "k1value", "ghp_0123456789abcdefghij0123"}
	body := fmt.Sprintf(`{"error":{"message":"proxy: Authorization: Basic %s refused; dsn postgres://agent:%s@db/x; api_key=%s; %s"}}`,
		secrets[0], secrets[1], secrets[2], secrets[3])
	m := newFakeModel(t, openaitest.Status(400, body))
	logs := &testutil.Buffer{}
	a := MustAgent(t, m, logs, nil, nil)
	_, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}, Identity: identity.Turn{TurnID: "t_1"}})
	want := "400 Bad Request: proxy: Authorization: Basic [redacted] refused; dsn postgres://agent:[redacted]@db/x; api_key=[redacted]; [redacted]"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Run error = %v, want one containing %q", err, want)
	}
	for _, secret := range secrets {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("the log contains %q: %s", secret, logs.String())
		}
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Setenv("OPENAI_TEST_EMPTY", " ")
	temp := 2.5
	tests := []struct {
		name string
		c    openai.Config
		want []string
	}{
		{"nothing", openai.Config{}, []string{"base URL is empty", "model is empty"}},
		{"key variable unset", openai.Config{BaseURL: "https://api.example/v1", Model: "m", APIKeyEnv: "OPENAI_TEST_SURELY_UNSET"},
			[]string{"environment variable OPENAI_TEST_SURELY_UNSET (agent.openai.api_key_env) is not set or empty: set it to the endpoint's API key, or set agent.openai.api_key_env: \"\" for a server that takes none"}},
		{"key variable empty", openai.Config{BaseURL: "https://api.example/v1", Model: "m", APIKeyEnv: "OPENAI_TEST_EMPTY"},
			[]string{"OPENAI_TEST_EMPTY (agent.openai.api_key_env) is not set or empty: set it to the endpoint's API key, or set agent.openai.api_key_env: \"\" for a server that takes none"}},
		{"relative URL with a secret", openai.Config{BaseURL: "api.example/v1?key=sekrit123", Model: "m"},
			[]string{"base URL must be an absolute http or https URL"}},
		{"ranges", openai.Config{BaseURL: "http://localhost/v1", Model: "m", Temperature: &temp, MaxTokens: -1, TokenBudget: -1},
			[]string{"temperature 2.5 is not from 0 to 2", "negative max tokens", "negative token budget"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := openai.New(tt.c)
			if err == nil {
				t.Fatal("New: no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("New error = %q, want it to contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "sekrit123") {
				t.Errorf("New error %q shows the URL", err)
			}
		})
	}
}

// TestAPanicInTheCallReachesRunsCaller: a panic while the model's answer is handled (here in
// Partial, the runtime's draft) is raised again by Run on its caller's goroutine, where the
// runtime recovers an agent's panic (the turn's session crashes and restarts; a message that
// does so 3 times is quarantined). Before, it ended the process from the call's goroutine.
func TestAPanicInTheCallReachesRunsCaller(t *testing.T) {
	m := newFakeModel(t, openaitest.Stream(nil, 5, 2, "Hel", "lo"))
	a := MustAgent(t, m, nil, nil, nil)
	var got any
	func() {
		defer func() { got = recover() }()
		_, err := a.Run(t.Context(), &agents.Request{
			Messages: []agents.Message{msg("user", "hi")},
			Partial:  func(string) { panic("injected: the draft failed") },
		})
		t.Errorf("Run returned (err %v), want its panic", err)
	}()
	s, _ := got.(string)
	if !strings.Contains(s, "injected: the draft failed") || !strings.Contains(s, "the model call's goroutine") {
		t.Errorf("Run panicked with %v, want the call's panic and its stack", got)
	}
}

// TestRetryLineNamesTheTurn: the line of a retried model call names the session and the turn
// it is for, so an operator can tell which chat waits on the endpoint; it is logged at most
// once a minute, and the retries held back are reported as the daemon stops (FlushLines).
func TestRetryLineNamesTheTurn(t *testing.T) {
	upstream := openaitest.Status(http.StatusBadGateway, `{"error":{"message":"upstream"}}`)
	m := newFakeModel(t, upstream, openaitest.Reply("hello", 1, 1), upstream, openaitest.Reply("hello again", 1, 1))
	logs := &testutil.Buffer{}
	a := MustAgent(t, m, logs, nil, nil)
	req := &agents.Request{Messages: []agents.Message{msg("user", "hi")},
		Identity: identity.Turn{SessionKey: "agent:main:http:dm:u1", TurnID: "t_1"}}
	if _, err := a.Run(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	var line string
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, "model call failed; retrying") {
			line = l
		}
	}
	for _, want := range []string{"level=WARN", "session=agent:main:http:dm:u1", "turn=t_1", "attempt=1"} {
		if !strings.Contains(line, want) {
			t.Errorf("retry line %q lacks %q", line, want)
		}
	}
	// The next turn's retry within the minute is held back (an endpoint's outage retries
	// every turn), and counted in the next line.
	req.Identity.TurnID = "t_2"
	if _, err := a.Run(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "model call failed; retrying"); n != 1 {
		t.Errorf("%d retry lines for two turns' retries within a minute, want 1:\n%s", n, logs.String())
	}
	// The retry held back is reported as the daemon stops (FlushLines): else the limiter's
	// timer reported it a minute later, when the daemon had exited.
	a.FlushLines()
	var lines []string
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, "model call failed; retrying") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2 || !strings.Contains(lines[1], "turn=t_2") || !strings.Contains(lines[1], "repeats=1 ") {
		t.Errorf("retry lines after FlushLines = %q, want the second turn's retry reported (turn=t_2, repeats=1)", lines)
	}
}

// results records what an agent's Config.Requests is told.
type results struct {
	mu  sync.Mutex
	got []string
}

func (r *results) add(s string) {
	r.mu.Lock()
	r.got = append(r.got, s)
	r.mu.Unlock()
}

func (r *results) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

// TestRequestResults: every request to the endpoint, each retry its own, is counted by what
// came of it (agentgate_model_requests_total), and each result is one of RequestResults. A 200
// without text (no choices, only tool calls), whose turn fails, is a bad reply: before, it
// counted ok.
func TestRequestResults(t *testing.T) {
	brokeOff := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "500")
		io.WriteString(w, `{"choices":[`)
	}
	hang := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	for _, tc := range []struct {
		name    string
		steps   []http.HandlerFunc
		timeout time.Duration
		cancel  bool // cancel the turn once the request is in
		want    []string
	}{
		{name: "retried", steps: []http.HandlerFunc{openaitest.Status(429, `{}`), openaitest.Status(502, `<html>`), openaitest.Reply("hi", 1, 1)},
			want: []string{"rate_limited", "server_error", "ok"}},
		{name: "refused", steps: []http.HandlerFunc{openaitest.Status(401, `{"error":{"message":"bad key"}}`)}, want: []string{"refused"}},
		{name: "redirect", steps: []http.HandlerFunc{func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://127.0.0.1:1/elsewhere", http.StatusFound)
		}}, want: []string{"refused"}},
		{name: "bad reply", steps: []http.HandlerFunc{openaitest.Raw("application/json", `not json`)}, want: []string{"bad_reply"}},
		{name: "no choices", steps: []http.HandlerFunc{openaitest.Raw("application/json", `{"choices":[]}`)}, want: []string{"bad_reply"}},
		{name: "tool calls", steps: []http.HandlerFunc{openaitest.Raw("application/json",
			`{"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`)},
			want: []string{"bad_reply"}},
		{name: "broke off", steps: []http.HandlerFunc{brokeOff, openaitest.Reply("hi", 1, 1)}, want: []string{"broke_off", "ok"}},
		{name: "timeout", steps: []http.HandlerFunc{hang}, timeout: 50 * time.Millisecond, want: []string{"timeout"}},
		{name: "cancelled", steps: []http.HandlerFunc{hang}, cancel: true, want: []string{"cancelled"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(t, tc.steps...)
			var got results
			a := MustAgent(t, m, nil, nil, func(c *openai.Config) {
				c.Requests, c.Timeout = got.add, tc.timeout
			})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tc.cancel {
				go func() { m.Wait(t); cancel() }()
			}
			_, _ = a.Run(ctx, &agents.Request{Messages: []agents.Message{msg("user", "hi")}})
			if d := cmp.Diff(tc.want, got.all()); d != "" {
				t.Errorf("results mismatch (-want +got):\n%s", d)
			}
			for _, r := range got.all() {
				if !slices.Contains(openai.RequestResults, r) {
					t.Errorf("result %q is not in RequestResults", r)
				}
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		var got results
		a, err := openai.New(openai.Config{BaseURL: "http://" + addr + "/v1", Model: "m", MaxRetries: 1,
			Sleep: (&sleeps{}).sleep, Requests: got.add})
		if err != nil {
			t.Fatal(err)
		}
		_, _ = a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}})
		if d := cmp.Diff([]string{"unreachable", "unreachable"}, got.all()); d != "" {
			t.Errorf("results mismatch (-want +got):\n%s", d)
		}
	})
}

// TestRateLimitPausesEveryRequest: while one turn waits out a 429's Retry-After, another turn's
// request waits too, instead of meeting the same limit; both are answered once it has passed.
func TestRateLimitPausesEveryRequest(t *testing.T) {
	m := newFakeModel(t, openaitest.Status(429, `{"error":{"message":"slow down"}}`, "Retry-After: 5"), openaitest.Reply("ok", 1, 1))
	slept, release := make(chan time.Duration), make(chan struct{})
	clock := &sleeps{at: time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)}
	logs := &testutil.Buffer{}
	a := MustAgent(t, m, logs, nil, func(c *openai.Config) {
		c.Now = clock.now
		c.Sleep = func(ctx context.Context, d time.Duration) error {
			slept <- d
			<-release
			return clock.sleep(ctx, d)
		}
	})
	run := func() <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}})
			done <- err
		}()
		return done
	}
	first := run()
	if d := <-slept; d != 5*time.Second {
		t.Fatalf("the rate-limited turn waits %v, want the 5s it was asked to", d)
	}
	second := run()
	select {
	case d := <-slept:
		if d != 5*time.Second {
			t.Errorf("the other turn waits %v, want the 5s left of the limit", d)
		}
	case err := <-second:
		t.Fatalf("the other turn sent its request during the rate limit (%v)", err)
	}
	if n := m.Count(); n != 1 {
		t.Errorf("the model got %d requests during the limit, want 1", n)
	}
	// The other turn's wait is said, once a minute: its chat's reply is late for another's limit.
	if want := `level=WARN msg="model call waits out a rate limit the endpoint gave another request; every turn's calls wait" session="" turn="" wait=5s`; strings.Count(logs.String(), want) != 1 {
		t.Errorf("the log has not once %q:\n%s", want, logs)
	}
	close(release)
	for _, done := range []<-chan error{first, second} {
		if err := <-done; err != nil {
			t.Errorf("Run after the limit: %v", err)
		}
	}
	if n := m.Count(); n != 3 {
		t.Errorf("the model got %d requests, want 3", n)
	}
}

// TestRateLimitAGivenUpTurnMetPausesTheOthers: a turn that gives up on a rate limit (its last
// attempt, or a Retry-After longer than agent.openai.max_backoff) still holds the other turns
// for the limit (up to max_backoff: no request waits longer for the endpoint). Before, only a turn that retried did, so every other turn sent its request
// into the limit the endpoint had just announced.
func TestRateLimitAGivenUpTurnMetPausesTheOthers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers []string
		retries int
		want    time.Duration
	}{
		{"last attempt, Retry-After", []string{"Retry-After: 5"}, 0, 5 * time.Second},
		{"last attempt, no Retry-After", nil, 0, time.Second},                              // the first backoff
		{"Retry-After over max_backoff", []string{"Retry-After: 60"}, 3, 30 * time.Second}, // max_backoff
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(t, openaitest.Status(429, `{"error":{"message":"slow down"}}`, tc.headers...), openaitest.Reply("ok", 1, 1))
			sl := &sleeps{at: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)}
			a := MustAgent(t, m, nil, sl, func(c *openai.Config) {
				c.Now, c.MaxRetries = sl.now, tc.retries
			})
			if _, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}}); err == nil {
				t.Fatal("the rate-limited turn succeeded; want it to give up")
			}
			if got := sl.waits(); len(got) != 0 {
				t.Fatalf("the rate-limited turn waited %v before giving up", got)
			}
			if _, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}}); err != nil {
				t.Fatalf("the next turn: %v", err)
			}
			if got := sl.waits(); !slices.Equal(got, []time.Duration{tc.want}) {
				t.Errorf("the next turn waited %v before its request, want %v", got, tc.want)
			}
			if n := m.Count(); n != 2 {
				t.Errorf("the model got %d requests, want 2", n)
			}
		})
	}
}

// TestBackoffIsSpread: turns whose requests failed together do not retry together: the
// default jitter waits from half the backoff to all of it.
func TestBackoffIsSpread(t *testing.T) {
	m := openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) { // each turn: 502, then an answer
		if n%2 == 1 {
			openaitest.Status(502, ``)(w, r)
			return
		}
		openaitest.WriteReply(w, "ok", 1, 1)
	})
	seen := map[time.Duration]bool{}
	for range 20 {
		sl := &sleeps{}
		a := MustAgent(t, m, nil, sl, func(c *openai.Config) { c.Jitter = nil })
		if _, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}}); err != nil {
			t.Fatal(err)
		}
		for _, d := range sl.waits() {
			if d < 500*time.Millisecond || d > time.Second {
				t.Errorf("backoff %v, want from 500ms to 1s", d)
			}
			seen[d] = true
		}
	}
	if len(seen) < 2 {
		t.Errorf("20 turns all waited %v: the backoff is not spread", seen)
	}
}

// TestRateLimitedTurnsRetrySpread: turns whose requests met a 429 that named no wait together
// keep their own spread backoffs. Before, the pause the longest one set held every other such
// turn until it ended, so that all retried together again, as before the jitter.
func TestRateLimitedTurnsRetrySpread(t *testing.T) {
	both := make(chan struct{})
	m := openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
		switch n {
		case 1:
			<-both
		case 2:
			close(both)
		default:
			openaitest.WriteReply(w, "ok", 1, 1)
			return
		}
		openaitest.Status(429, `{"error":{"message":"slow down"}}`)(w, r) // no Retry-After
	})
	at := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	var (
		mu      sync.Mutex
		jitters int
		waits   []time.Duration
	)
	slept := make(chan struct{})
	var once sync.Once
	a := MustAgent(t, m, nil, nil, func(c *openai.Config) {
		c.Now = func() time.Time { return at } // the waits are read against one moment
		c.Jitter = func(d time.Duration) time.Duration {
			mu.Lock()
			jitters++
			first := jitters == 1
			mu.Unlock()
			if !first {
				return d // the other turn: all of it
			}
			<-slept // this turn: half, decided once the other one waits (its pause is set)
			return d / 2
		}
		c.Sleep = func(ctx context.Context, d time.Duration) error {
			mu.Lock()
			waits = append(waits, d)
			mu.Unlock()
			once.Do(func() { close(slept) })
			return ctx.Err()
		}
	})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if _, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}}); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	wg.Wait()
	slices.Sort(waits)
	if want := []time.Duration{500 * time.Millisecond, time.Second}; !slices.Equal(waits, want) {
		t.Errorf("the rate-limited turns waited %v, want their own spread backoffs %v", waits, want)
	}
}

// TestRateLimitAnnouncedDuringABackoffIsWaitedOut: a turn sleeping its own backoff after a 5xx
// waits out a Retry-After another turn's request is given meanwhile, instead of sending its
// retry into it when its own, shorter backoff ends. Before, the pause was looked at only
// before the sleep: a soak against a fake model saw retries arrive 0.5 s into a 1 s window
// and 1 s into a 3 s one.
func TestRateLimitAnnouncedDuringABackoffIsWaitedOut(t *testing.T) {
	m := newFakeModel(t,
		openaitest.Status(500, `{"error":{"message":"internal"}}`),                    // the first turn
		openaitest.Status(429, `{"error":{"message":"slow down"}}`, "Retry-After: 5"), // the second turn
		openaitest.Reply("ok", 1, 1))
	clock := &sleeps{at: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)}
	slept := make(chan time.Duration)
	releaseFirst, releaseSecond := make(chan struct{}), make(chan struct{})
	counted := make(chan struct{}) // the requests during the limit are counted: the first turn may retry
	var calls atomic.Int32
	a := MustAgent(t, m, nil, nil, func(c *openai.Config) {
		c.Now = clock.now
		c.Sleep = func(ctx context.Context, d time.Duration) error {
			switch calls.Add(1) {
			case 1: // the first turn's backoff after its 500
				slept <- d
				<-releaseFirst
			case 2: // the second turn's Retry-After
				slept <- d
				<-releaseSecond
			default:
				slept <- d
				<-counted
			}
			return clock.sleep(ctx, d)
		}
	})
	run := func() <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}})
			done <- err
		}()
		return done
	}
	first := run()
	if d := <-slept; d != time.Second {
		t.Fatalf("the first turn's backoff is %v, want 1s", d)
	}
	second := run()
	if d := <-slept; d != 5*time.Second {
		t.Fatalf("the second turn waits %v, want the 5s it was asked to", d)
	}
	close(releaseFirst) // 1s has passed: 4s of the limit are left
	select {
	case d := <-slept:
		if d != 4*time.Second {
			t.Errorf("after its backoff the first turn waits %v more, want the 4s left of the limit", d)
		}
	case err := <-first:
		t.Fatalf("the first turn sent its retry into the rate limit announced during its backoff (Run: %v); the model got %d requests", err, m.Count())
	}
	if n := m.Count(); n != 2 {
		t.Errorf("the model got %d requests during the limit, want 2", n)
	}
	close(counted)
	if err := <-first; err != nil {
		t.Errorf("the first turn after the limit: %v", err)
	}
	close(releaseSecond)
	if err := <-second; err != nil {
		t.Errorf("the second turn after the limit: %v", err)
	}
	if n := m.Count(); n != 4 {
		t.Errorf("the model got %d requests, want 4", n)
	}
}

// TestLargeAnswers: an answer is read up to MaxBody, a generous bound: a body past 8 MiB
// (the model's reasoning beside its reply), or a stream that sends a long reply as one event
// (escaped as \u sequences, 6 bytes a character), is answered, cut at MaxReply as any long
// reply is. Past MaxBody the turn fails, once, not retried, with ErrTooLarge and a notice that
// says so. Before, a body past 8 MiB failed with "response larger than 8388608 bytes" and the
// user was asked to try again, which could only fail the same way; an event past 4 MiB broke
// off, and was retried.
func TestLargeAnswers(t *testing.T) {
	body := func(reasoning int) string {
		return `{"choices":[{"index":0,"message":{"role":"assistant","content":"the answer","reasoning_content":"` +
			strings.Repeat("x", reasoning) + `"},"finish_reason":"stop"}]}`
	}
	event := func(content string) string {
		return "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + content + "\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
	}
	const cut = "\n\n[…cut off: the reply is longer than agentgate takes]"
	tests := []struct {
		name      string
		answer    http.HandlerFunc
		streaming bool
		want      string // the reply's start; "" means ErrTooLarge
		wantCut   bool
	}{
		{name: "a body past 8 MiB", answer: openaitest.Raw("application/json", body(20<<20)), want: "the answer"},
		{name: "a long reply as one event", answer: openaitest.Raw("text/event-stream", event(strings.Repeat(`\u4e2d`, 800_000))),
			streaming: true, want: "中中中", wantCut: true},
		{name: "a body past MaxBody", answer: openaitest.Raw("application/json", body(openai.MaxBody))},
		{name: "an event past MaxBody", answer: openaitest.Raw("text/event-stream", event(strings.Repeat("x", openai.MaxBody))), streaming: true},
		{name: "a line past MaxBody", answer: openaitest.Raw("text/event-stream", ": "+strings.Repeat("x", openai.MaxBody)+"\n\n"+event("hi")), streaming: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(t, tc.answer)
			a := MustAgent(t, m, nil, nil, nil)
			req := &agents.Request{Messages: []agents.Message{msg("user", "hi")}}
			if tc.streaming {
				req.Partial = func(string) {}
			}
			resp, err := a.Run(t.Context(), req)
			if tc.want != "" {
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
				if !strings.HasPrefix(resp.Text, tc.want) || strings.HasSuffix(resp.Text, cut) != tc.wantCut {
					t.Errorf("Run = %d bytes %q…%q, want it to start %q (cut: %t)", len(resp.Text),
						resp.Text[:min(len(resp.Text), 20)], resp.Text[max(len(resp.Text)-60, 0):], tc.want, tc.wantCut)
				}
				return
			}
			if !errors.Is(err, openai.ErrTooLarge) {
				t.Fatalf("Run = %v, want ErrTooLarge", err)
			}
			if want := fmt.Sprintf("%d MiB", openai.MaxBody>>20); !strings.Contains(err.Error(), want) {
				t.Errorf("Run error = %q, want it to name the bound, %s", err, want)
			}
			if ref, ok := errors.AsType[*agents.Refusal](err); !ok || !strings.Contains(ref.Notice, "larger than agentgate reads") {
				t.Errorf("Run error = %v, want a Refusal whose notice says the answer was too large", err)
			}
			if n := m.Count(); n != 1 {
				t.Errorf("the model got %d requests, want 1 (no retry)", n)
			}
		})
	}
}

// TestAnswerThatIsNoCompletion: a 200 whose body is no chat completion fails the turn with an
// error that says what it was and how it starts (its Content-Type, its first characters), not
// only the JSON parser's complaint; a web page (the login page of a proxy in front of the
// endpoint, a web app at a base_url without the API's path), which every turn would get, is a
// Refusal: the user is told why instead of being asked to try again. Before, the log said
// "invalid character '<' looking for beginning of value", and nothing more.
func TestAnswerThatIsNoCompletion(t *testing.T) {
	tests := []struct {
		name      string
		answer    http.HandlerFunc
		streaming bool
		want      []string // in the error
		notice    string   // in the Refusal's notice; "" means no Refusal
	}{
		{name: "a web app's page", answer: openaitest.Raw("text/html; charset=utf-8", "\n<!doctype html><html><head><title>Open WebUI</title></head></html>"),
			want: []string{`a web page (Content-Type "text/html; charset=utf-8") that reads "Open WebUI"`, "agent.openai.base_url"}, notice: "web page"},
		{name: "a page without text", answer: openaitest.Raw("text/html", "<html><head><meta http-equiv=refresh content=\"0; url=/login\"></head></html>"),
			want: []string{`a web page (Content-Type "text/html") with no text, starting "<html><head><meta http-equiv=refresh content=\"0; url=/login\"></head></html>"`}, notice: "web page"},
		{name: "a proxy's login page, streaming", answer: openaitest.Raw("text/html", "<html><body>Sign in to Access "+testKey+"</body></html>"),
			streaming: true, want: []string{"Sign in to Access [redacted]"}, notice: "web page"},
		{name: "a JSON array", answer: openaitest.Raw("application/json", "[]"), want: []string{`"application/json"`, `starting "[]"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(t, tc.answer)
			a := MustAgent(t, m, nil, nil, nil)
			req := &agents.Request{Messages: []agents.Message{msg("user", "hi")}}
			if tc.streaming {
				req.Partial = func(string) {}
			}
			_, err := a.Run(t.Context(), req)
			if err == nil {
				t.Fatal("Run succeeded, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Run error = %q, want it to hold %q", err, w)
				}
			}
			if strings.Contains(err.Error(), testKey) {
				t.Errorf("Run error = %q, holds the key", err)
			}
			ref, ok := errors.AsType[*agents.Refusal](err)
			switch {
			case tc.notice == "" && ok:
				t.Errorf("Run error %v is a Refusal (%q), want one the user may try again", err, ref.Notice)
			case tc.notice != "" && (!ok || !strings.Contains(ref.Notice, tc.notice)):
				t.Errorf("Run error = %v (refusal %t), want a Refusal saying %q", err, ok, tc.notice)
			}
			if n := m.Count(); n != 1 {
				t.Errorf("the model got %d requests, want 1 (no retry)", n)
			}
		})
	}
}

// TestNoRoomToAnswer: a model that reached its length limit before it said anything (a
// reasoning model that spent max_tokens thinking, or a context that is full) fails the turn
// with a Refusal that says why, and an error that tells the operator what to change: the same
// message would fail the same way. Before, the user was asked to try again, and the log said
// only "the model returned no text (finish reason "length")".
func TestNoRoomToAnswer(t *testing.T) {
	answer := openaitest.Raw("application/json", `{"choices":[{"index":0,"message":{"role":"assistant","content":"","reasoning_content":"Let me think…"},"finish_reason":"length"}],"usage":{"prompt_tokens":30,"completion_tokens":256}}`)
	tests := []struct {
		name       string
		maxTokens  int
		wantErr    string
		wantNotice string
	}{
		{name: "max_tokens", maxTokens: 256, wantErr: "raise agent.openai.max_tokens", wantNotice: "used up its token limit"},
		{name: "the context", wantErr: "end of its context", wantNotice: "send /new"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(t, answer)
			a := MustAgent(t, m, nil, nil, func(c *openai.Config) { c.MaxTokens = tc.maxTokens })
			resp, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}})
			if !errors.Is(err, openai.ErrEmptyReply) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Run error = %v, want ErrEmptyReply saying %q", err, tc.wantErr)
			}
			if ref, ok := errors.AsType[*agents.Refusal](err); !ok || !strings.Contains(ref.Notice, tc.wantNotice) {
				t.Errorf("Run error = %v (refusal %t), want a Refusal saying %q", err, ok, tc.wantNotice)
			}
			if resp == nil || resp.Usage.OutputTokens != 256 {
				t.Errorf("Run response = %+v, want the spent usage", resp)
			}
		})
	}
}

// TestErrorInAnAnswer: an error the endpoint sends in a 200's body (an error event in a stream,
// as OpenAI, vLLM and LiteLLM send one when the model fails after the headers went out) is
// retried as the status it names (its code, or its type: server_error, overloaded_error,
// rate_limit…) would be, unless text was already shown (the user would see it start over); one
// that names a refusal (400) is a Refusal. Before, no such error was retried: a server error
// in the first event failed the turn at once.
func TestErrorInAnAnswer(t *testing.T) {
	const sse = "text/event-stream"
	event := func(data string) string { return "event: error\ndata: " + data + "\n\n" }
	ok := openaitest.Stream(nil, 1, 1, "fine")
	tests := []struct {
		name      string
		answer    http.HandlerFunc
		streaming bool
		requests  int    // requests made
		want      string // the reply; "" means an error
		notice    string // in the Refusal's notice, when the turn fails with one
		result    string // of the first request
	}{
		{name: "server_error in a stream", answer: openaitest.Raw(sse, event(`{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}`)),
			streaming: true, requests: 2, want: "fine", result: openai.ResultServerError},
		{name: "a 503 code in a stream", answer: openaitest.Raw(sse, event(`{"error":{"object":"error","message":"engine dead","type":"InternalServerError","code":503}}`)),
			streaming: true, requests: 2, want: "fine", result: openai.ResultServerError},
		{name: "a 429 code as a string", answer: openaitest.Raw(sse, event(`{"error":{"message":"rate limited","code":"429"}}`)),
			streaming: true, requests: 2, want: "fine", result: openai.ResultRateLimited},
		{name: "OpenAI's rate limit, named in code", answer: openaitest.Raw(sse, event(`{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`)),
			streaming: true, requests: 2, want: "fine", result: openai.ResultRateLimited},
		{name: "overloaded, not streamed", answer: openaitest.Raw("application/json", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`),
			requests: 2, want: "fine", result: openai.ResultServerError},
		{name: "after text was shown", answer: openaitest.Raw(sse, "data: {\"choices\":[{\"delta\":{\"content\":\"par\"}}]}\n\n"+event(`{"error":{"message":"server error","type":"server_error"}}`)),
			streaming: true, requests: 1, result: openai.ResultServerError},
		{name: "after text nobody saw", answer: openaitest.Raw(sse, "data: {\"choices\":[{\"delta\":{\"content\":\"par\"}}]}\n\n"+event(`{"error":{"message":"server error","type":"server_error"}}`)),
			requests: 2, want: "fine", result: openai.ResultServerError},
		{name: "a refusal", answer: openaitest.Raw(sse, event(`{"error":{"message":"bad request","type":"invalid_request_error","code":400}}`)),
			streaming: true, requests: 1, notice: "refused the request", result: openai.ResultRefused},
		{name: "an error that names nothing", answer: openaitest.Raw(sse, event(`{"error":{"message":"something"}}`)),
			streaming: true, requests: 1, result: openai.ResultRefused},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(t, tc.answer, ok)
			var results []string
			var mu sync.Mutex
			a := MustAgent(t, m, nil, nil, func(c *openai.Config) {
				c.Requests = func(r string) { mu.Lock(); results = append(results, r); mu.Unlock() }
			})
			req := &agents.Request{Messages: []agents.Message{msg("user", "hi")}}
			if tc.streaming {
				req.Partial = func(string) {}
			}
			resp, err := a.Run(t.Context(), req)
			switch {
			case tc.want != "" && (err != nil || resp.Text != tc.want):
				t.Errorf("Run = %+v, %v; want %q", resp, err, tc.want)
			case tc.want == "" && err == nil:
				t.Errorf("Run = %q, want an error", resp.Text)
			}
			if tc.notice != "" {
				if ref, ok := errors.AsType[*agents.Refusal](err); !ok || !strings.Contains(ref.Notice, tc.notice) {
					t.Errorf("Run error = %v, want a Refusal saying %q", err, tc.notice)
				}
			}
			if n := m.Count(); n != tc.requests {
				t.Errorf("the model got %d requests, want %d", n, tc.requests)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(results) == 0 || results[0] != tc.result {
				t.Errorf("request results = %q, want the first %q", results, tc.result)
			}
		})
	}
}
