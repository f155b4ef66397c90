package openai_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
	"github.com/agentgate/agentgate/internal/testutil"
)

// The line the agent logs once it leaves stream_options out.
const noStreamOptionsLine = "the model endpoint refused stream_options; streamed requests go without it from now on"

// refuseStreamOptions starts a model that answers 400 with message to a request that carries
// stream_options, as endpoints that do not know it do (Azure OpenAI before API version
// 2024-10-21, proxies in front of older servers), and streams "hello" (with its usage, as some
// send it unasked) to one that does not.
func refuseStreamOptions(t *testing.T, message string) *openaitest.Model {
	var m *openaitest.Model
	m = openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if strings.Contains(m.Requests()[n-1].Body, `"stream_options"`) {
			openaitest.Status(http.StatusBadRequest, `{"error":{"message":`+jsonQuote(message)+`,"type":"invalid_request_error","param":"stream_options","code":null}}`)(w, r)
			return
		}
		openaitest.WriteStream(w, r, nil, 12, 3, "hel", "lo")
	})
	return m
}

func jsonQuote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }

// TestStreamOptionsRefused: an endpoint that answers 400 to stream_options (older Azure OpenAI
// API versions, servers that refuse what they do not know) gets the streamed request again at
// once without it, and every later streamed request goes without it; the switch is logged once,
// and the token usage such an endpoint sends anyway is counted. Before, every streamed turn
// (each Discord reply) failed as "its model endpoint refused the request".
func TestStreamOptionsRefused(t *testing.T) {
	for _, message := range []string{
		"Unrecognized request argument supplied: stream_options",              // Azure OpenAI
		"Unknown parameter: 'stream_options'. (request id: 2024080621443691)", // a proxy's upstream
		"property 'stream_options' is unsupported, did you mean 'stream'?",    // Groq's wording of such a refusal
	} {
		t.Run(message, func(t *testing.T) {
			m := refuseStreamOptions(t, message)
			logs := &testutil.Buffer{}
			a := MustAgent(t, m, logs, nil, nil)
			for i := range 2 {
				var partials []string
				resp, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}, Partial: func(s string) { partials = append(partials, s) }})
				if err != nil || resp.Text != "hello" || resp.Usage != (agents.Usage{InputTokens: 12, OutputTokens: 3}) {
					t.Fatalf("turn %d: Run() = %+v, %v; want hello with usage {12 3}", i+1, resp, err)
				}
				if strings.Join(partials, "|") != "hel|hello" {
					t.Errorf("turn %d: partials %q, want hel, hello", i+1, partials)
				}
			}
			// A turn that does not stream is not concerned.
			if resp, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}}); err != nil || resp.Text != "hello" {
				t.Fatalf("unstreamed turn: Run() = %+v, %v; want hello", resp, err)
			}
			var with []bool
			for _, r := range m.Requests() {
				with = append(with, strings.Contains(r.Body, `"stream_options"`))
			}
			if want := []bool{true, false, false, false}; !slices.Equal(with, want) {
				t.Errorf("requests carried stream_options: %v, want %v", with, want)
			}
			if n := strings.Count(logs.String(), noStreamOptionsLine); n != 1 {
				t.Errorf("the switch was logged %d times, want once:\n%s", n, logs.String())
			}
		})
	}
	// Another 400 of a streamed request is not sent again.
	m := newFakeModel(t, openaitest.Status(http.StatusBadRequest, `{"error":{"message":"Invalid value for 'temperature'"}}`))
	a := MustAgent(t, m, nil, nil, nil)
	if _, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}, Partial: func(string) {}}); err == nil || m.Count() != 1 {
		t.Errorf("Run() = %v after %d requests, want the 400 after one", err, m.Count())
	}
}

// TestRefusedParameterOfConcurrentTurns: turns whose requests went out together, before any of
// them was refused for a parameter the agent can do without (stream_options) or name otherwise
// (max_tokens), are each sent again: the switch is the agent's, but each request was built
// before it. Before, only the first refused turn sent its request again; the others failed as
// "its model endpoint refused the request" (every chat streaming at once after a start).
func TestRefusedParameterOfConcurrentTurns(t *testing.T) {
	const turns = 3
	for _, tc := range []struct {
		name, refused, message, line string
		stream                       bool
	}{
		{"stream_options", `"stream_options"`, "Unrecognized request argument supplied: stream_options", noStreamOptionsLine, true},
		{"max_tokens", `"max_tokens"`, "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
			"the model endpoint refused max_tokens and asks for max_completion_tokens", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			refusedAll := make(chan struct{})
			refused := 0
			var m *openaitest.Model
			m = openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if strings.Contains(m.Requests()[n-1].Body, tc.refused) {
					// Every turn's first request is held until all of them were sent.
					mu.Lock()
					if refused++; refused == turns {
						close(refusedAll)
					}
					mu.Unlock()
					select {
					case <-refusedAll:
					case <-r.Context().Done():
						return
					}
					openaitest.Status(http.StatusBadRequest, `{"error":{"message":`+jsonQuote(tc.message)+`,"type":"invalid_request_error"}}`)(w, r)
					return
				}
				if tc.stream {
					openaitest.WriteStream(w, r, nil, 1, 1, "ok")
					return
				}
				openaitest.WriteReply(w, "ok", 1, 1)
			})
			logs := &testutil.Buffer{}
			a := MustAgent(t, m, logs, nil, func(c *openai.Config) { c.MaxTokens = 300 })
			errs := make(chan error, turns)
			for range turns {
				go func() {
					req := &agents.Request{Messages: []agents.Message{msg("user", "hi")}}
					if tc.stream {
						req.Partial = func(string) {}
					}
					resp, err := a.Run(t.Context(), req)
					if err == nil && resp.Text != "ok" {
						err = fmt.Errorf("reply %q, want ok", resp.Text)
					}
					errs <- err
				}()
			}
			for range turns {
				if err := <-errs; err != nil {
					t.Errorf("Run() = %v; want ok: the request was sent before the switch, and is sent again", err)
				}
			}
			if n := m.Count(); n != 2*turns {
				t.Errorf("%d requests, want %d: each turn's, refused, and once more", n, 2*turns)
			}
			if n := strings.Count(logs.String(), tc.line); n != 1 {
				t.Errorf("the switch was logged %d times, want once:\n%s", n, logs.String())
			}
		})
	}
}

// TestRefusalDuringAPauseIsHonouredByTheWaitingCalls: a call that waits out a rate limit (its
// own Retry-After, or another turn's) while another turn's request is refused for a parameter
// (max_tokens, stream_options) goes out in the form the refusal asked for, the first time. Before,
// the request was encoded before the wait and sent as it was: each waiting turn got the same
// 400 once more and sent its request again (found by a soak: a 429's Retry-After, then a
// reasoning model's refusal of max_tokens).
func TestRefusalDuringAPauseIsHonouredByTheWaitingCalls(t *testing.T) {
	for _, tc := range []struct {
		name, refused, message string
		stream                 bool
	}{
		{"stream_options", `"stream_options"`, "Unrecognized request argument supplied: stream_options", true},
		{"max_tokens", `"max_tokens"`, "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refuse := make(chan struct{}) // the refused turn's first request is answered once closed
			var m *openaitest.Model
			m = openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
				body := m.Requests()[n-1].Body
				switch {
				case !strings.Contains(body, tc.refused):
					if tc.stream {
						openaitest.WriteStream(w, r, nil, 1, 1, "ok")
						return
					}
					openaitest.WriteReply(w, "ok", 1, 1)
				case strings.Contains(body, `"content":"refused"`):
					select {
					case <-refuse:
					case <-r.Context().Done():
						return
					}
					fallthrough
				default:
					select {
					case <-refuse: // the form switched: an old one is refused again
						openaitest.Status(http.StatusBadRequest, `{"error":{"message":`+jsonQuote(tc.message)+`,"type":"invalid_request_error"}}`)(w, r)
					default:
						openaitest.Status(http.StatusTooManyRequests, `{"error":{"message":"slow down"}}`, "Retry-After: 5")(w, r)
					}
				}
			})
			clock := &sleeps{at: time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)}
			slept, release := make(chan time.Duration), make(chan struct{})
			a := MustAgent(t, m, nil, nil, func(c *openai.Config) {
				c.MaxTokens, c.Now = 300, clock.now
				c.Sleep = func(ctx context.Context, d time.Duration) error {
					select {
					case slept <- d:
					case <-release:
					}
					<-release
					return clock.sleep(ctx, d)
				}
			})
			run := func(text string) <-chan error {
				done := make(chan error, 1)
				go func() {
					req := &agents.Request{Messages: []agents.Message{msg("user", text)}}
					if tc.stream {
						req.Partial = func(string) {}
					}
					resp, err := a.Run(t.Context(), req)
					if err == nil && resp.Text != "ok" {
						err = fmt.Errorf("reply %q, want ok", resp.Text)
					}
					done <- err
				}()
				return done
			}
			refused := run("refused")
			m.WaitRequests(t, 1)
			limited := run("limited") // 429, Retry-After: 5
			if d := <-slept; d != 5*time.Second {
				t.Fatalf("the rate-limited turn waits %v, want 5s", d)
			}
			held := run("held") // waits out the other turn's limit
			if d := <-slept; d != 5*time.Second {
				t.Fatalf("the held turn waits %v, want 5s", d)
			}
			close(refuse)
			if d := <-slept; d != 5*time.Second { // the refused turn, sent again, waits too
				t.Fatalf("the refused turn waits %v, want 5s", d)
			}
			close(release)
			for name, done := range map[string]<-chan error{"refused": refused, "limited": limited, "held": held} {
				if err := <-done; err != nil {
					t.Errorf("the %s turn: Run() = %v; want ok", name, err)
				}
			}
			var with []int
			for i, r := range m.Requests() {
				if strings.Contains(r.Body, tc.refused) {
					with = append(with, i+1)
				}
			}
			if len(with) != 2 || m.Count() != 5 {
				t.Errorf("requests %v of %d carried %s, want 2 of 5: only the two sent before the refusal (the waiting turns' go out in the new form)",
					with, m.Count(), tc.refused)
			}
		})
	}
}

// TestRefusedParameterKeepsTheRetriesCounted: a request sent again in the form a refusal asks
// for (adapt) is the same call: it retries only what max_retries leaves of its retries, and
// its backoff goes on from where the call's was. Before, each resend began a count of its own:
// with max_retries 2, a call refused for a parameter after a retried 503 was tried 5 times,
// 3 of them retries, and its backoff began again at 1s.
func TestRefusedParameterKeepsTheRetriesCounted(t *testing.T) {
	for _, tc := range []struct {
		name, message string
		stream        bool
	}{
		{"stream_options", "Unrecognized request argument supplied: stream_options", true},
		{"max_tokens", "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(t, openaitest.Status(http.StatusServiceUnavailable, `{"error":{"message":"overloaded"}}`),
				openaitest.Status(http.StatusBadRequest, `{"error":{"message":`+jsonQuote(tc.message)+`}}`),
				openaitest.Status(http.StatusServiceUnavailable, `{"error":{"message":"overloaded"}}`))
			sl := &sleeps{}
			a := MustAgent(t, m, nil, sl, func(c *openai.Config) { c.MaxRetries = 2; c.MaxTokens = 300 })
			req := &agents.Request{Messages: []agents.Message{msg("user", "hi")}}
			if tc.stream {
				req.Partial = func(string) {}
			}
			if _, err := a.Run(t.Context(), req); err == nil {
				t.Fatal("Run() = nil error; want the 503")
			}
			if n := m.Count(); n != 4 {
				t.Errorf("%d requests, want 4: a 503, its retry refused for %s, sent again, its retry (2 retries)", n, tc.name)
			}
			if got, want := sl.waits(), []time.Duration{time.Second, 2 * time.Second}; !slices.Equal(got, want) {
				t.Errorf("waits %v, want %v", got, want)
			}
		})
	}
}

// TestStreamOptionsRefusalShapes: stream_options is left out for good only when the refusal
// names it in a shape real endpoints send: OpenAI's error.param and its "Unknown parameter"
// and "Unsupported parameter", Azure OpenAI's "Unrecognized request argument(s) supplied" and
// "Validation error at #/…", Groq's "property … is unsupported", LiteLLM's "does not support
// parameters", pydantic's validation errors (FastAPI's 422 detail list, Mistral's, vLLM's as
// Python's repr), whose loc names the field, serde's "unknown field `…`" (an axum-based
// server's plain-text 422; before, nothing named, every streamed turn was refused), and Go's
// encoding/json's `json: unknown field "…"` (a server that decodes with DisallowUnknownFields;
// the same before). A refusal that merely holds the request (a
// proxy, or vLLM's validation error, that echoes the body it refused for another reason) does
// not switch: the next refusal of a streamed request would then be met without stream_options,
// and every streamed turn's token usage went uncounted from then on. Before, any 400 or 422 whose
// message held "stream_options" anywhere switched, and a 422 whose detail list named it did not.
func TestStreamOptionsRefusalShapes(t *testing.T) {
	const echoed = `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`
	for _, tc := range []struct {
		name    string
		code    int
		body    string
		switch_ bool
	}{
		{"OpenAI, unknown parameter", 400, `{"error":{"message":"Unknown parameter: 'stream_options'.","type":"invalid_request_error","param":"stream_options","code":"unknown_parameter"}}`, true},
		{"OpenAI, error.param alone", 400, `{"error":{"message":"Invalid type for a nested parameter.","type":"invalid_request_error","param":"stream_options.include_usage","code":"invalid_type"}}`, true},
		{"Azure OpenAI", 400, `{"error":{"message":"Unrecognized request argument supplied: stream_options","type":"invalid_request_error","param":null,"code":null}}`, true},
		{"Azure OpenAI, several", 400, `{"error":{"message":"Unrecognized request arguments supplied: seed, stream_options","type":"invalid_request_error","param":null,"code":null}}`, true},
		{"Azure AI model inference", 400, `{"error":{"requestid":"eea1c96d-fba7-4116-9cb3-e614b9ff7652","code":400,"message":"Validation error at #/stream_options: Extra inputs are not permitted"}}`, true},
		{"Groq", 400, `{"error":{"message":"property 'stream_options' is unsupported, did you mean 'stream'?","type":"invalid_request_error"}}`, true},
		{"LiteLLM", 400, `{"error":{"message":"litellm.UnsupportedParamsError: openrouter does not support parameters: {'stream_options': {'include_usage': True}}, for model=gpt-test. To drop these, set litellm.drop_params=True","type":"invalid_request_error","param":null,"code":"400"}}`, true},
		{"a backend's detail string", 400, `{"detail":"Unsupported parameter: stream_options"}`, true},
		{"vLLM, extra_forbidden as Python's repr", 400, `{"object":"error","message":"[{'type': 'extra_forbidden', 'loc': ('body', 'stream_options'), 'msg': 'Extra inputs are not permitted', 'input': {'include_usage': True}}]","type":"BadRequestError","param":null,"code":400}`, true},
		{"vLLM, its own check", 400, `{"object":"error","message":"Stream options can only be defined when ` + "`stream=True`" + `. (parameter=stream_options)","type":"BadRequestError","param":"stream_options","code":400}`, true},
		{"vLLM, its own check with the value", 400, `{"object":"error","message":"Stream options can only be defined when ` + "`stream=True`" + `. (parameter=stream_options, value={'include_usage': True})","type":"BadRequestError","param":null,"code":400}`, true},
		{"FastAPI's 422", 422, `{"detail":[{"type":"extra_forbidden","loc":["body","stream_options"],"msg":"Extra inputs are not permitted","input":{"include_usage":true}}]}`, true},
		{"Mistral's 422", 422, `{"object":"error","message":{"detail":[{"type":"extra_forbidden","loc":["body","stream_options"],"msg":"Extra inputs are not permitted","input":{"include_usage":true}}]},"type":"invalid_request_error","param":null,"code":null}`, true},
		{"Mistral's 422 through a proxy", 422, `{"object":"error","message":"{\"detail\":[{\"type\":\"extra_forbidden\",\"loc\":[\"body\",\"stream_options\"],\"msg\":\"Extra inputs are not permitted\"}]}","type":"internal_error_proxy","param":null,"code":"1000"}`, true},
		{"an axum server's 422", 422, "Failed to deserialize the JSON body into the target type: unknown field `stream_options`, expected one of `model`, `messages`, `max_tokens`, `temperature`, `stream` at line 1 column 121", true},
		{"an axum server's 422 of a field inside it", 422, "Failed to deserialize the JSON body into the target type: stream_options: unknown field `include_usage`, expected `continuous_usage_stats` at line 1 column 118", true},
		{"serde's words in JSON", 400, `{"message":"Failed to deserialize the JSON body into the target type: unknown field ` + "`stream_options`" + `, expected one of ` + "`model`, `messages`" + `"}`, true},
		// Go's encoding/json with DisallowUnknownFields (decode.go: fmt.Errorf("json: unknown
		// field %q", key)), as http.Error's plain text or an error's message; of a field
		// inside stream_options, by its own name alone.
		{"a Go server's plain text", 400, "json: unknown field \"stream_options\"\n", true},
		{"a Go server's error in JSON", 400, `{"error":{"message":"json: unknown field \"stream_options\"","type":"invalid_request_error"}}`, true},
		{"a Go server's of a field inside it", 400, "json: unknown field \"include_usage\"\n", true},
		{"a Go server's behind a prefix", 400, `{"error":{"message":"invalid request body: json: unknown field \"stream_options\""}}`, true},
		// Its JSON body passed on as text in a proxy's message (as LiteLLM passes Anthropic's
		// on: "AnthropicException - {\"type\":\"error\",…}", BerriAI/litellm#16525), whose
		// quotes are escaped once the proxy's JSON is read; encoding/json/v2's wording
		// (RejectUnknownMembers, as go1.26 GOEXPERIMENT=jsonv2 prints it), of a field inside
		// stream_options too. Before, both named nothing.
		{"a Go server's JSON in a proxy's message", 400, `{"error":{"message":"upstream answered 400: {\"error\":{\"message\":\"json: unknown field \\\"stream_options\\\"\",\"type\":\"invalid_request_error\"}}","type":"upstream_error"}}`, true},
		{"Go's json/v2", 400, "json: cannot unmarshal JSON string into Go api.ChatRequest: unknown object member name \"stream_options\"\n", true},
		{"Go's json/v2 of a field inside it", 400, `{"error":{"message":"json: cannot unmarshal JSON string into Go api.StreamOptions: unknown object member name \"include_usage\" within \"/stream_options\""}}`, true},
		// Refusals that only hold the request.
		{"an axum server's 422 of another field", 422, "Failed to deserialize the JSON body into the target type: unknown field `seed`, expected one of `model`, `messages`, `stream`, `stream_options` at line 1 column 121", false},
		{"a Go server's of another field", 400, "json: unknown field \"seed\"\n", false},
		{"a Go server's JSON in a proxy's message, of another field", 400, `{"error":{"message":"upstream answered 400: {\"error\":{\"message\":\"json: unknown field \\\"seed\\\"\"}}","type":null}}`, false},
		{"vLLM's value error echoing the body", 400, `{"error":{"message":"1 validation error:\n  {'type': 'value_error', 'loc': ('body',), 'msg': 'Value error, n must be 1', 'input': {'model': 'gpt-test', 'n': 2, 'stream': True, 'stream_options': {'include_usage': True}}}","type":"BadRequestError","param":null,"code":400}}`, false},
		{"a proxy echoing the body in its message", 400, `{"error":{"message":"upstream rejected the request ` + strings.ReplaceAll(echoed, `"`, `\"`) + `","type":"proxy_error"}}`, false},
		{"a proxy echoing the body in plain text", 400, "bad request: " + echoed, false},
		{"a 422 of the whole body", 422, `{"detail":[{"type":"model_attributes_type","loc":["body"],"msg":"Input should be a valid dictionary","input":` + echoed + `}]}`, false},
		{"a 422 of another field", 422, `{"detail":[{"type":"extra_forbidden","loc":["body","seed"],"msg":"Extra inputs are not permitted","input":` + echoed + `}]}`, false},
		{"another unknown parameter, the body echoed", 400, `{"error":{"message":"Unknown parameter: 'seed'. Request: ` + strings.ReplaceAll(echoed, `"`, `\"`) + `","param":"seed"}}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m *openaitest.Model
			m = openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if strings.Contains(m.Requests()[n-1].Body, `"stream_options"`) {
					openaitest.Status(tc.code, tc.body)(w, r)
					return
				}
				openaitest.WriteStream(w, r, nil, 1, 1, "ok")
			})
			logs := &testutil.Buffer{}
			a := MustAgent(t, m, logs, nil, nil)
			resp, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}, Partial: func(string) {}})
			switched := strings.Contains(logs.String(), noStreamOptionsLine)
			if tc.switch_ {
				if err != nil || resp.Text != "ok" || m.Count() != 2 || !switched {
					t.Errorf("Run() = %+v, %v after %d requests (switch logged: %v); want ok from the request sent again without stream_options", resp, err, m.Count(), switched)
				}
				return
			}
			if err == nil || m.Count() != 1 || switched {
				t.Errorf("Run() = %+v, %v after %d requests (switch logged: %v); want the refusal after one request, stream_options kept", resp, err, m.Count(), switched)
			}
		})
	}
}

// TestMaxTokensRefusalShapes: the bound goes by max_completion_tokens for good only when the
// refusal names max_tokens as a parameter the endpoint does not take (refusedNames's
// unknown): OpenAI's and Azure OpenAI's answer for their reasoning models (its param and code,
// or its wording alone, as proxies pass it on), LiteLLM's, pydantic's extra_forbidden in a 422,
// serde's and Go's "unknown field" (Go's named nothing before).
// A refusal of max_tokens' value (OpenAI's "max_tokens is too large", vLLM's "'max_tokens' or
// 'max_completion_tokens' is too large" when the context is full, a 422 of its range) asks for
// a smaller bound, not another name, and one that merely holds the name (an echo of the chat's
// text) asks for nothing. Before, any 400 or 422 whose message held "max_completion_tokens"
// switched, vLLM's full context among them, and a refusal that did not hold it did not.
func TestMaxTokensRefusalShapes(t *testing.T) {
	const openAI = "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."
	for _, tc := range []struct {
		name    string
		code    int
		body    string
		switch_ bool
	}{
		{"OpenAI", 400, `{"error":{"message":"` + openAI + `","type":"invalid_request_error","param":"max_tokens","code":"unsupported_parameter"}}`, true},
		{"OpenAI's wording through a proxy", 400, `{"error":{"message":"` + openAI + `","code":"invalid_request_body"}}`, true},
		{"LiteLLM passing OpenAI's on", 400, `{"error":{"message":"litellm.BadRequestError: OpenAIException - ` + openAI + `","type":null,"param":null,"code":"400"}}`, true},
		{"LiteLLM's own", 400, `{"error":{"message":"litellm.UnsupportedParamsError: openai does not support parameters: ['max_tokens'], for model=gpt-test. To drop these, set litellm.drop_params=True","type":"invalid_request_error","param":null,"code":"400"}}`, true},
		{"a 422 of pydantic's extra_forbidden", 422, `{"detail":[{"type":"extra_forbidden","loc":["body","max_tokens"],"msg":"Extra inputs are not permitted","input":300}]}`, true},
		{"an axum server's 422", 422, "Failed to deserialize the JSON body into the target type: unknown field `max_tokens`, expected one of `model`, `messages`, `max_completion_tokens` at line 1 column 80", true},
		{"a Go server's DisallowUnknownFields", 400, "json: unknown field \"max_tokens\"\n", true},
		{"a Go server's JSON in a proxy's message", 400, `{"error":{"message":"upstream answered 400: {\"error\":{\"message\":\"json: unknown field \\\"max_tokens\\\"\"}}","type":"upstream_error"}}`, true},
		{"Go's json/v2", 400, "json: cannot unmarshal JSON string into Go api.ChatRequest: unknown object member name \"max_tokens\"\n", true},
		// Refusals of its value, or that merely hold the name.
		{"OpenAI, too large", 400, `{"error":{"message":"max_tokens is too large: 300. This model supports at most 256 completion tokens, whereas you provided 300.","type":"invalid_request_error","param":"max_tokens","code":null}}`, false},
		{"vLLM, the context full", 400, `{"error":{"message":"'max_tokens' or 'max_completion_tokens' is too large: 300. This model's maximum context length is 4096 tokens and your request has 3900 input tokens (300 > 4096 - 3900). (parameter=max_tokens, value=300)","type":"BadRequestError","param":"max_tokens","code":400}}`, false},
		{"older vLLM, the context full", 400, `{"object":"error","message":"'max_tokens' or 'max_completion_tokens' is too large: 300. This model's maximum context length is 4096 tokens and your request has 3900 input tokens (300 > 4096 - 3900). None","type":"BadRequestError","param":null,"code":400}`, false},
		{"a 422 of its range", 422, `{"detail":[{"type":"less_than_equal","loc":["body","max_tokens"],"msg":"Input should be less than or equal to 256","input":300,"ctx":{"le":256}}]}`, false},
		{"a proxy echoing the chat", 400, `{"error":{"message":"upstream rejected the request {\"model\":\"gpt-test\",\"messages\":[{\"role\":\"user\",\"content\":\"should I send max_completion_tokens?\"}],\"max_tokens\":300}","type":"proxy_error"}}`, false},
		{"vLLM's value error echoing the chat", 400, `{"error":{"message":"1 validation error:\n  {'type': 'value_error', 'loc': ('body',), 'msg': 'Value error, n must be 1', 'input': {'model': 'gpt-test', 'messages': [{'role': 'user', 'content': 'should I send max_completion_tokens?'}], 'max_tokens': 300, 'n': 2}}","type":"BadRequestError","param":null,"code":400}}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m *openaitest.Model
			m = openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if strings.Contains(m.Requests()[n-1].Body, `"max_tokens"`) {
					openaitest.Status(tc.code, tc.body)(w, r)
					return
				}
				openaitest.WriteReply(w, "ok", 1, 1)
			})
			logs := &testutil.Buffer{}
			a := MustAgent(t, m, logs, nil, func(c *openai.Config) { c.MaxTokens = 300 })
			resp, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "should I send max_completion_tokens?")}})
			switched := strings.Contains(logs.String(), "the model endpoint refused max_tokens and asks for max_completion_tokens")
			if tc.switch_ {
				if err != nil || resp.Text != "ok" || m.Count() != 2 || !switched || !strings.Contains(m.Body(t, 2), `"max_completion_tokens":300`) {
					t.Errorf("Run() = %+v, %v after %d requests (switch logged: %v); want ok from the request sent again with max_completion_tokens", resp, err, m.Count(), switched)
				}
				return
			}
			if err == nil || m.Count() != 1 || switched {
				t.Errorf("Run() = %+v, %v after %d requests (switch logged: %v); want the refusal after one request, max_tokens kept", resp, err, m.Count(), switched)
			}
		})
	}
}

// TestRefusalEchoingTheChat: a refusal for another reason that echoes the request, and with it
// the chat's own text, does not switch the agent's form when that text quotes a refusal of the
// parameter ("Unsupported parameter: 'stream_options'", pasted by a user who asks about it):
// the chat's words are no endpoint's. The fake model echoes the request it got, as vLLM's
// validation error (Python's repr of the whole request), a proxy (its JSON) and a plain-text
// answer do; the refused turn fails, and the next one still asks for its stream's usage and
// counts it. Such a chat's real refusals still switch: by their param, or by a wording that
// starts their message (after LiteLLM's exception names). Before, the echoed wording switched
// stream_options off for good, and every later stream's tokens went uncounted.
func TestRefusalEchoingTheChat(t *testing.T) {
	const (
		asksStream = "my proxy answered Unsupported parameter: 'stream_options', why?"
		asksMax    = "it says Unsupported parameter: 'max_tokens' is not supported with this model, why?"
	)
	vLLMEcho := func(body string) (int, string) {
		var req any
		if err := json.Unmarshal([]byte(body), &req); err != nil {
			panic(err)
		}
		msg := "1 validation error:\n  {'type': 'value_error', 'loc': ('body',), 'msg': 'Value error, n must be 1', 'input': " + pyRepr(req) + "}"
		return 400, `{"error":{"message":` + jsonString(msg) + `,"type":"BadRequestError","param":null,"code":400}}`
	}
	proxyEcho := func(body string) (int, string) {
		return 400, `{"error":{"message":` + jsonString("upstream rejected the request "+body) + `,"type":"proxy_error"}}`
	}
	textEcho := func(body string) (int, string) { return 400, "bad request: " + body }
	refuse := func(code int, answer string) func(string) (int, string) {
		return func(string) (int, string) { return code, answer }
	}
	for _, tc := range []struct {
		name, chat, param string
		answer            func(body string) (int, string)
		switch_           bool
	}{
		{"vLLM's value error", asksStream, "stream_options", vLLMEcho, false},
		{"a proxy's", asksStream, "stream_options", proxyEcho, false},
		{"a plain-text answer", asksStream, "stream_options", textEcho, false},
		{"vLLM's value error, max_tokens", asksMax, "max_tokens", vLLMEcho, false},
		{"a proxy's, max_tokens", asksMax, "max_tokens", proxyEcho, false},
		// The refusals of such a chat's request that refuse the parameter.
		{"OpenAI's param", asksStream, "stream_options",
			refuse(400, `{"error":{"message":"Unknown parameter: 'stream_options'.","type":"invalid_request_error","param":"stream_options","code":"unknown_parameter"}}`), true},
		{"Azure OpenAI's wording", asksStream, "stream_options",
			refuse(400, `{"error":{"message":"Unrecognized request argument supplied: stream_options","type":"invalid_request_error","param":null,"code":null}}`), true},
		{"LiteLLM passing it on", asksStream, "stream_options",
			refuse(400, `{"error":{"message":"litellm.BadRequestError: OpenAIException - Unknown parameter: 'stream_options'.","type":null,"param":null,"code":"400"}}`), true},
		{"OpenAI's wording, max_tokens", asksMax, "max_tokens",
			refuse(400, `{"error":{"message":"Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.","type":"invalid_request_error"}}`), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream := tc.param == "stream_options"
			var m *openaitest.Model
			m = openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
				body := m.Requests()[n-1].Body
				if strings.Contains(body, `"`+tc.param+`"`) && strings.Contains(body, "why?") {
					code, answer := tc.answer(body)
					openaitest.Status(code, answer)(w, r)
					return
				}
				if !stream {
					openaitest.WriteReply(w, "ok", 12, 3)
					return
				}
				// A stream's usage comes only when asked for, as OpenAI's does.
				var in, out int64
				if strings.Contains(body, `"include_usage":true`) {
					in, out = 12, 3
				}
				openaitest.WriteStream(w, r, nil, in, out, "ok")
			})
			logs := &testutil.Buffer{}
			a := MustAgent(t, m, logs, nil, func(c *openai.Config) { c.MaxTokens = 300 })
			run := func(text string) (*agents.Response, error) {
				req := &agents.Request{Messages: []agents.Message{msg("user", text)}}
				if stream {
					req.Partial = func(string) {}
				}
				return a.Run(t.Context(), req)
			}
			line := noStreamOptionsLine
			if !stream {
				line = "the model endpoint refused max_tokens and asks for max_completion_tokens"
			}
			resp, err := run(tc.chat)
			switched := strings.Contains(logs.String(), line)
			if tc.switch_ {
				if err != nil || resp.Text != "ok" || m.Count() != 2 || !switched {
					t.Errorf("Run() = %+v, %v after %d requests (switch logged: %v); want ok from the request sent again without %s", resp, err, m.Count(), switched, tc.param)
				}
				return
			}
			if err == nil || m.Count() != 1 || switched {
				t.Fatalf("Run() = %+v, %v after %d requests (switch logged: %v); want the refusal after one request, %s kept", resp, err, m.Count(), switched, tc.param)
			}
			// The next turn still sends it, and a stream's usage is still asked for and counted.
			resp, err = run("hi")
			if err != nil || resp.Text != "ok" || resp.Usage != (agents.Usage{InputTokens: 12, OutputTokens: 3}) {
				t.Errorf("next turn: Run() = %+v, %v; want ok with usage {12 3}", resp, err)
			}
			if body := m.Body(t, 2); !strings.Contains(body, `"`+tc.param+`"`) {
				t.Errorf("next turn's request = %s, want it to carry %s", body, tc.param)
			}
		})
	}
}

// jsonString is s as a JSON string.
func jsonString(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// pyRepr is the decoded JSON value v as Python's repr writes it (dict keys sorted), as vLLM's
// validation errors echo a request.
func pyRepr(v any) string {
	switch v := v.(type) {
	case map[string]any:
		keys := slices.Sorted(func(yield func(string) bool) {
			for k := range v {
				if !yield(k) {
					return
				}
			}
		})
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = pyRepr(k) + ": " + pyRepr(v[k])
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = pyRepr(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case string:
		q := "'"
		if strings.Contains(v, "'") && !strings.Contains(v, `"`) {
			q = `"`
		}
		r := strings.NewReplacer(`\`, `\\`, q, `\`+q, "\n", `\n`, "\t", `\t`)
		return q + r.Replace(v) + q
	case bool:
		if v {
			return "True"
		}
		return "False"
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case nil:
		return "None"
	}
	panic(fmt.Sprintf("pyRepr(%T)", v))
}
