package openai_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
	"github.com/agentgate/agentgate/internal/identity"
)

// ridersRequest is a turn of session whose history ends with rider, a user message that got no
// answer, sent along merged into the turn's own message, own.
func ridersRequest(session, rider, own string) *agents.Request {
	return &agents.Request{
		Identity: identity.Turn{SessionKey: session, TurnID: "t_1"},
		History:  []agents.Message{msg("user", "hello"), msg("assistant", "hi there"), msg("user", rider)},
		Messages: []agents.Message{msg("user", own)},
	}
}

// TestRefusedRequestIsSentAgainWithoutTheRiders: a request the endpoint refuses without saying
// why (a plain 400) while it carries earlier messages that got no answer is sent once more
// without them; answered, the turn answers with that reply, which says they were left out, and
// Response.RidersLeftOut has the session archive them. Before, the turn failed (the reply the
// endpoint would have given was never asked for), the session left the riders out, and the
// turn's own message had to ride once more with the next one.
func TestRefusedRequestIsSentAgainWithoutTheRiders(t *testing.T) {
	const bad = "a message the endpoint cannot take"
	var m *openaitest.Model
	m = openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if strings.Contains(m.Requests()[n-1].Body, bad) {
			openaitest.Status(http.StatusBadRequest, `{"error":{"message":"Invalid 'messages[3].content': string contains an unsupported sequence"}}`)(w, r)
			return
		}
		openaitest.WriteReply(w, "ok", 1, 1)
	})
	a := MustAgent(t, m, nil, nil, nil)
	resp, err := a.Run(t.Context(), ridersRequest("s1", bad, "and what else?"))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !resp.RidersLeftOut || !strings.HasPrefix(resp.Text, "ok\n\n[") || !strings.Contains(resp.Text, "left out") {
		t.Errorf("Run = %q, RidersLeftOut %v; want ok with a note that the earlier message is left out, and RidersLeftOut", resp.Text, resp.RidersLeftOut)
	}
	if got := m.Count(); got != 2 {
		t.Fatalf("the model got %d requests, want 2 (the request, then the same without the rider)", got)
	}
	if body := m.Body(t, 2); strings.Contains(body, bad) || !strings.Contains(body, "and what else?") || !strings.Contains(body, "hi there") {
		t.Errorf("the second request = %s, want the history and the turn's message without the rider", body)
	}
	// The note is the user's: a later turn gives the model the reply without it.
	resp2, err := a.Run(t.Context(), &agents.Request{History: []agents.Message{msg("user", "and what else?"), msg("assistant", resp.Text)},
		Messages: []agents.Message{msg("user", "next")}})
	if err != nil || resp2.RidersLeftOut {
		t.Fatalf("Run = %+v, %v", resp2, err)
	}
	if body := m.Body(t, 3); strings.Contains(body, "left out") {
		t.Errorf("the next turn's request = %s, want the reply without its note", body)
	}
}

// TestEndpointThatRefusesEveryRequestLeavesNothingOut: an endpoint (or a proxy in front of it)
// that refuses every request with a bare 400 (no body, or a web page) refuses the request
// without the riders too: nothing is left out, the user is told the configuration or the
// endpoint is at fault and that the message is sent again with the next one, and the
// operator gets one ERR with the status and the body's start, not one a turn. Before, each
// turn left out the message before it, and a user who sent one message again was told to
// send /new after the second refusal.
func TestEndpointThatRefusesEveryRequestLeavesNothingOut(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"empty", ""},
		{"web page", "<html><head><title>400 Bad Request</title></head><body><center><h1>400 Bad Request</h1></center><hr><center>nginx</center></body></html>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(t, openaitest.Status(http.StatusBadRequest, tc.body))
			var logs bytes.Buffer
			a := MustAgent(t, m, &logs, nil, nil)
			for i, session := range []string{"s1", "s1", "s2"} {
				resp, err := a.Run(t.Context(), ridersRequest(session, "what is the time?", "and the date?"))
				ref, ok := errors.AsType[*agents.Refusal](err)
				if !ok || !strings.Contains(ref.Notice, "refuses every request") || strings.Contains(ref.Notice, "/new") {
					t.Fatalf("Run %d error = %v, want a Refusal saying the endpoint refuses every request, without /new", i+1, err)
				}
				if resp != nil && resp.RidersLeftOut {
					t.Errorf("Run %d left the riders out", i+1)
				}
			}
			if got := m.Count(); got != 6 {
				t.Errorf("the model got %d requests, want 6 (each turn's, and each without its rider)", got)
			}
			if n := strings.Count(logs.String(), "level=ERROR"); n != 1 || !strings.Contains(logs.String(), "status=400") {
				t.Errorf("logs hold %d ERR lines, want 1 with the status:\n%s", n, logs.String())
			}
			if strings.Contains(tc.body, "nginx") && !strings.Contains(logs.String(), "nginx") {
				t.Errorf("the ERR line does not show the body's start:\n%s", logs.String())
			}
		})
	}
}

// TestSameRefusalInTwoSessionsIsTheEndpoints: a request with nothing to leave out that the
// endpoint refuses as it refused another session's, with no request answered in between, is
// the endpoint's or the configuration's fault, and its notice says so; an answer in between
// makes the next refusal a message's again.
func TestSameRefusalInTwoSessionsIsTheEndpoints(t *testing.T) {
	refuse := openaitest.Status(http.StatusBadRequest, `{"error":{"message":"Bad Request"}}`)
	m := newFakeModel(t, refuse, refuse, openaitest.Reply("ok", 1, 1), refuse)
	var logs bytes.Buffer
	a := MustAgent(t, m, &logs, nil, nil)
	run := func(session string) error {
		_, err := a.Run(t.Context(), &agents.Request{Identity: identity.Turn{SessionKey: session, TurnID: "t_1"}, Messages: []agents.Message{msg("user", "hi")}})
		return err
	}
	notice := func(err error) string {
		ref, ok := errors.AsType[*agents.Refusal](err)
		if !ok {
			t.Fatalf("Run error = %v, want a Refusal", err)
		}
		return ref.Notice
	}
	if n := notice(run("s1")); strings.Contains(n, "refuses every request") {
		t.Errorf("the first refusal's notice = %q, want a message's refusal (nothing shows yet that every request is refused)", n)
	}
	if n := notice(run("s2")); !strings.Contains(n, "refuses every request") {
		t.Errorf("the second session's notice = %q, want it to say the endpoint refuses every request", n)
	}
	if err := run("s3"); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := notice(run("s4")); strings.Contains(n, "refuses every request") {
		t.Errorf("the notice after an answer = %q, want a message's refusal", n)
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
		t.Errorf("logs hold %d ERR lines, want 1:\n%s", n, logs.String())
	}
}

// TestMaxTokensLargerThanTheContext: a refusal that says the request's max_tokens does not fit
// in the model's context next to its input, as vLLM words it, is the agent's max_tokens
// setting's fault when max_tokens alone is the context or more (no conversation fits), and
// partly when the input alone fits: the user is told so, not only to send /new (which does not
// help the first), and the operator gets an ERR. An input longer than the context is the
// conversation's, as before.
func TestMaxTokensLargerThanTheContext(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       string // in the notice
		newHelps   bool   // the notice names /new
		operator   bool   // an ERR for the operator
	}{
		{"vLLM, max_tokens past the context", `{"object":"error","message":"'max_tokens' is too large: 9000. This model's maximum context length is 8192 tokens and your request has 12 input tokens (9000 > 8192 - 12).","type":"BadRequestError","param":null,"code":400}`,
			"max_tokens setting", false, true},
		{"vLLM, max_completion_tokens wording", `{"object":"error","message":"'max_tokens' or 'max_completion_tokens' is too large: 9000. This model's maximum context length is 8192 tokens and your request has 12 input tokens (9000 > 8192 - 12).","type":"BadRequestError","param":null,"code":400}`,
			"max_tokens setting", false, true},
		{"vLLM, the input fits alone", `{"object":"error","message":"'max_tokens' or 'max_completion_tokens' is too large: 4000. This model's maximum context length is 8192 tokens and your request has 5000 input tokens (4000 > 8192 - 5000).","type":"BadRequestError","param":null,"code":400}`,
			"max_tokens setting", true, true},
		{"vLLM 0.20", `{"object":"error","message":"This model's maximum context length is 8192 tokens. However, you requested 9000 output tokens and your prompt contains at least 12 input tokens, for a total of at least 9012 tokens.","code":400}`,
			"max_tokens setting", false, true},
		{"OpenAI's older wording, input too long", `{"error":{"message":"This model's maximum context length is 8192 tokens. However, you requested 12000 tokens (10000 in the messages, 2000 in the completion). Please reduce the length of the messages or completion.","code":"context_length_exceeded"}}`,
			"conversation is too long", true, false},
		{"OpenAI's older wording, the input fits", `{"error":{"message":"This model's maximum context length is 8192 tokens. However, you requested 9000 tokens (7000 in the messages, 2000 in the completion). Please reduce the length of the messages or completion.","code":"context_length_exceeded"}}`,
			"max_tokens setting", true, true},
		// Behind LiteLLM's proxy, whose prefix pushes the numbers past the 200 characters the
		// message is cut to: read whole, not as a conversation too long.
		{"vLLM behind LiteLLM", `{"error":{"message":"litellm.BadRequestError: OpenAIException - Error code: 400 - {'object': 'error', 'message': \"'max_tokens' or 'max_completion_tokens' is too large: 9000. This model's maximum context length is 8192 tokens and your request has 12 input tokens (9000 > 8192 - 12). None\", 'type': 'BadRequestError', 'param': None, 'code': 400}\nReceived Model Group=local\nAvailable Model Group Fallbacks=None","type":null,"param":null,"code":"400"}}`,
			"max_tokens setting", false, true},
		{"OpenAI's older wording behind LiteLLM, the input fits", `{"error":{"message":"litellm.ContextWindowExceededError: litellm.BadRequestError: ContextWindowExceededError: OpenAIException - Error code: 400 - {'error': {'message': \"This model's maximum context length is 8192 tokens. However, you requested 9000 tokens (7000 in the messages, 2000 in the completion). Please reduce the length of the messages or completion.\", 'type': 'invalid_request_error', 'param': 'messages', 'code': 'context_length_exceeded'}}","type":null,"param":null,"code":"400"}}`,
			"max_tokens setting", true, true},
		{"OpenAI behind LiteLLM, no numbers", `{"error":{"message":"litellm.ContextWindowExceededError: litellm.BadRequestError: ContextWindowExceededError: OpenAIException - Error code: 400 - {'error': {'message': \"This model's maximum context length is 128000 tokens. However, your messages resulted in 419624 tokens. Please reduce the length of the messages.\", 'type': 'invalid_request_error', 'param': 'messages', 'code': 'context_length_exceeded'}}","type":null,"param":null,"code":"400"}}`,
			"conversation is too long", true, false},
		// llama.cpp's server: exceed_context_size_error, with n_prompt_tokens and n_ctx, in the
		// wordings of its releases. It refuses for the prompt alone.
		{"llama.cpp, prompt too long", `{"error":{"code":400,"message":"the request exceeds the available context size. try increasing the context size or enable context shift","type":"exceed_context_size_error","n_prompt_tokens":14429,"n_ctx":8192}}`,
			"conversation is too long", true, false},
		{"llama.cpp's later wording", `{"error":{"code":400,"message":"request (4476 tokens) exceeds the available context size (4096 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":4476,"n_ctx":4096}}`,
			"conversation is too long", true, false},
		{"llama.cpp, a wording not known, prompt too long", `{"error":{"code":400,"message":"input is larger than what this slot holds","type":"exceed_context_size_error","n_prompt_tokens":4096,"n_ctx":4096}}`,
			"conversation is too long", true, false},
		{"llama.cpp, the prompt fits", `{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error","n_prompt_tokens":7000,"n_ctx":8192}}`,
			"max_tokens setting", true, true},
		{"llama.cpp, max_tokens past the context", `{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error","n_prompt_tokens":12,"n_ctx":1024}}`,
			"max_tokens setting", false, true},
		// llama.cpp's behind LiteLLM, which passes it on in its message as the OpenAI client's
		// error ("Error code: 400 - " and the body as Python's repr), with n_prompt_tokens and
		// n_ctx, under BadRequestError or ContextWindowExceededError: read as the bare one.
		// Before, by its words alone, a conversation too long whatever its numbers.
		{"llama.cpp behind LiteLLM, the prompt fits", `{"error":{"message":"litellm.BadRequestError: OpenAIException - Error code: 400 - {'error': {'code': 400, 'message': 'the request exceeds the available context size. try increasing the context size or enable context shift', 'type': 'exceed_context_size_error', 'n_prompt_tokens': 7000, 'n_ctx': 8192}}\nReceived Model Group=local\nAvailable Model Group Fallbacks=None","type":null,"param":null,"code":"400"}}`,
			"max_tokens setting", true, true},
		{"llama.cpp behind LiteLLM, max_tokens past the context", `{"error":{"message":"litellm.ContextWindowExceededError: litellm.BadRequestError: ContextWindowExceededError: OpenAIException - Error code: 400 - {'error': {'code': 400, 'message': 'request (12 tokens) exceeds the available context size (1024 tokens), try increasing it', 'type': 'exceed_context_size_error', 'n_prompt_tokens': 12, 'n_ctx': 1024}}","type":null,"param":null,"code":"400"}}`,
			"max_tokens setting", false, true},
		{"llama.cpp behind LiteLLM, prompt too long", `{"error":{"message":"litellm.BadRequestError: OpenAIException - Error code: 400 - {'error': {'code': 400, 'message': 'request (14429 tokens) exceeds the available context size (8192 tokens), try increasing it', 'type': 'exceed_context_size_error', 'n_prompt_tokens': 14429, 'n_ctx': 8192}}","type":null,"param":null,"code":"400"}}`,
			"conversation is too long", true, false},
		// A prompt whose size is not known next to a max_tokens of the context or more: no
		// conversation fits on a server that counts max_tokens in (llama.cpp's own always
		// gives its count), and /new would not help (TestExceedContextOfAPromptOfUnknownSizeIsTooLong
		// is the same error with a max_tokens below n_ctx).
		{"llama.cpp, max_tokens past the context, prompt of a size not known", `{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error","n_ctx":1024}}`,
			"max_tokens setting", false, true},
		{"llama.cpp behind LiteLLM, max_tokens past the context, prompt of a size not known", `{"error":{"message":"litellm.BadRequestError: OpenAIException - Error code: 400 - {'error': {'code': 400, 'message': 'the request exceeds the available context size', 'type': 'exceed_context_size_error', 'n_prompt_tokens': None, 'n_ctx': 1024}}","type":null,"param":null,"code":"400"}}`,
			"max_tokens setting", false, true},
		{"llama.cpp's JSON in a proxy's message, the prompt fits", `{"error":{"message":"upstream answered 400: {\"error\":{\"code\":400,\"message\":\"the request exceeds the available context size\",\"type\":\"exceed_context_size_error\",\"n_prompt_tokens\":7000,\"n_ctx\":8192}}","type":"upstream_error"}}`,
			"max_tokens setting", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) { assertContextRefusal(t, tc.body, tc.want, tc.newHelps, tc.operator) })
	}
}

// assertContextRefusal checks that a turn of an agent whose max_tokens is 2000, refused with a
// 400 whose body is body, fails with a Refusal whose notice says want and names /new when
// newHelps, and that the operator gets an ERR when operator.
func assertContextRefusal(t *testing.T, body, want string, newHelps, operator bool) {
	t.Helper()
	m := newFakeModel(t, openaitest.Status(http.StatusBadRequest, body))
	var logs bytes.Buffer
	a := MustAgent(t, m, &logs, nil, func(c *openai.Config) { c.MaxTokens = 2000 })
	_, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}})
	ref, ok := errors.AsType[*agents.Refusal](err)
	if !ok || !strings.Contains(ref.Notice, want) || strings.Contains(ref.Notice, "/new") != newHelps {
		t.Fatalf("Run error = %v (refusal %v), want a Refusal saying %q, /new named: %v", err, ok, want, newHelps)
	}
	if got := strings.Contains(logs.String(), "level=ERROR"); got != operator {
		t.Errorf("an ERR logged: %v, want %v:\n%s", got, operator, logs.String())
	}
}

// TestExceedContextOfAPromptOfUnknownSizeIsTooLong: llama.cpp's exceed_context_size_error
// whose n_prompt_tokens is missing or no count (negative, a fraction, past an int, as a proxy
// may mangle it), bare or behind LiteLLM, is what its name says: a context exceeded, a
// conversation too long (/new), with no ERR, as a prompt longer than n_ctx is. Before, behind
// LiteLLM any such count, and in the bare error a missing one, read as a prompt of 0 tokens,
// one that fits: the notice blamed the max_tokens setting and the operator got an ERR; and a
// count past an int or a fraction made the bare error none, a refusal of what the request
// holds in a wording not known.
func TestExceedContextOfAPromptOfUnknownSizeIsTooLong(t *testing.T) {
	const known = "the request exceeds the available context size. try increasing the context size or enable context shift"
	bare := func(message, prompt string) string {
		return `{"error":{"code":400,"message":"` + message + `","type":"exceed_context_size_error"` + prompt + `,"n_ctx":8192}}`
	}
	litellm := func(prompt string) string {
		return `{"error":{"message":"litellm.BadRequestError: OpenAIException - Error code: 400 - {'error': {'code': 400, 'message': '` + known + `', 'type': 'exceed_context_size_error'` + prompt + `, 'n_ctx': 8192}}\nReceived Model Group=local","type":null,"param":null,"code":"400"}}`
	}
	for _, tc := range []struct{ name, body string }{
		{"bare, n_prompt_tokens missing", bare(known, "")},
		{"bare, n_prompt_tokens negative", bare(known, `,"n_prompt_tokens":-5`)},
		{"bare, n_prompt_tokens past an int", bare("input is larger than what this slot holds", `,"n_prompt_tokens":99999999999999999999`)},
		{"bare, n_prompt_tokens a fraction", bare("input is larger than what this slot holds", `,"n_prompt_tokens":7000.5`)},
		{"bare, n_prompt_tokens null", bare(known, `,"n_prompt_tokens":null`)},
		{"behind LiteLLM, n_prompt_tokens missing", litellm("")},
		{"behind LiteLLM, n_prompt_tokens negative", litellm(", 'n_prompt_tokens': -5")},
		{"behind LiteLLM, n_prompt_tokens past an int", litellm(", 'n_prompt_tokens': 99999999999999999999")},
		{"behind LiteLLM, n_prompt_tokens None", litellm(", 'n_prompt_tokens': None")},
	} {
		t.Run(tc.name, func(t *testing.T) { assertContextRefusal(t, tc.body, "conversation is too long", true, false) })
	}
}

// TestConversationRefusedWhileOthersAreAnswered: a session whose request the endpoint refuses
// without saying why, also when sent again without the earlier messages that got no answer,
// while it answers other sessions' requests in between, is refused for something its
// conversation holds (an answered message the endpoint now refuses, a conversation too long in
// words the agent does not know), not every request: the notice names /new, and the operator
// gets no ERR. Before, each such turn told its sender the endpoint refuses every request and
// never named /new, so the chat stayed refused for ever, and each logged the ERR again (any
// answer in between cleared it).
func TestConversationRefusedWhileOthersAreAnswered(t *testing.T) {
	const poison = "an answered message the endpoint now refuses"
	var m *openaitest.Model
	m = openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if strings.Contains(m.Requests()[n-1].Body, poison) {
			openaitest.Status(http.StatusBadRequest, `{"error":{"message":"Bad Request"}}`)(w, r)
			return
		}
		openaitest.WriteReply(w, "ok", 1, 1)
	})
	var logs bytes.Buffer
	a := MustAgent(t, m, &logs, nil, nil)
	poisoned := &agents.Request{
		Identity: identity.Turn{SessionKey: "s1", TurnID: "t_1"},
		History:  []agents.Message{msg("user", poison), msg("assistant", "hi there"), msg("user", "an earlier question")},
		Messages: []agents.Message{msg("user", "and what else?")},
	}
	for i := range 2 {
		if _, err := a.Run(t.Context(), &agents.Request{Identity: identity.Turn{SessionKey: "s2", TurnID: "t_1"}, Messages: []agents.Message{msg("user", "hi")}}); err != nil {
			t.Fatalf("s2's Run: %v", err)
		}
		resp, err := a.Run(t.Context(), poisoned)
		ref, ok := errors.AsType[*agents.Refusal](err)
		if !ok {
			t.Fatalf("s1's Run %d error = %v, want a Refusal", i+1, err)
		}
		if strings.Contains(ref.Notice, "refuses every request") || !strings.Contains(ref.Notice, "/new") {
			t.Errorf("s1's Run %d notice = %q, want one that names /new, not one saying the endpoint refuses every request", i+1, ref.Notice)
		}
		if resp != nil && resp.RidersLeftOut {
			t.Errorf("s1's Run %d left the riders out", i+1)
		}
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("logs hold an ERR, want none (the endpoint answers other sessions):\n%s", logs.String())
	}
}

// TestRidersNoteLeftOutOfHistoryAfterASteeredAnswer: the note of a reply whose request left
// the riders out is the user's, also when a steered message's answer follows it in the turn's
// reply (the note then sits between the two answers): a later turn gives the model the reply
// without it. Before, only a note at the reply's end was taken out.
func TestRidersNoteLeftOutOfHistoryAfterASteeredAnswer(t *testing.T) {
	const bad = "a message the endpoint cannot take"
	release := make(chan struct{})
	var m *openaitest.Model
	m = openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
		body := m.Requests()[n-1].Body
		switch {
		case strings.Contains(body, bad):
			openaitest.Status(http.StatusBadRequest, `{"error":{"message":"Bad Request"}}`)(w, r)
		case n == 2: // the request without the rider: answered once a message was steered in
			<-release
			openaitest.WriteReply(w, "First answer.", 1, 1)
		default:
			openaitest.WriteReply(w, "Second answer.", 1, 1)
		}
	})
	a := MustAgent(t, m, nil, nil, nil)
	steer := make(chan agents.Message) // unbuffered: a send returns once the agent took it
	done := make(chan ran, 1)
	go func() {
		req := ridersRequest("s1", bad, "and what else?")
		req.Steer = steer
		resp, err := a.Run(t.Context(), req)
		done <- ran{resp, err}
	}()
	m.WaitRequests(t, 2) // the probe, held
	steer <- msg("user", "and also this")
	close(release)
	got := <-done
	close(steer)
	if got.err != nil || !got.resp.RidersLeftOut || !strings.Contains(got.resp.Text, "left out") || !strings.HasSuffix(got.resp.Text, "Second answer.") {
		t.Fatalf("Run = %+v, %v; want both answers, the note after the first, and RidersLeftOut", got.resp, got.err)
	}
	_, err := a.Run(t.Context(), &agents.Request{History: []agents.Message{msg("user", "and what else?"), msg("user", "and also this"), msg("assistant", got.resp.Text)},
		Messages: []agents.Message{msg("user", "next")}})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if body := m.Body(t, m.Count()); strings.Contains(body, "left out") || !strings.Contains(body, `First answer.\n\nSecond answer.`) {
		t.Errorf("the next turn's request = %s, want the reply without its note", body)
	}
}

// TestRequestWithoutTheRidersCountsItsRetriesOn: the request sent again without the earlier
// messages that got no answer is the same call in another form: its retries count on from the
// refused request's, max_retries in all, as a form a refusal asks for does. Before, it was
// retried max_retries times again: a turn made twice the requests, and waited twice the
// backoffs, against an endpoint in trouble.
func TestRequestWithoutTheRidersCountsItsRetriesOn(t *testing.T) {
	unavailable := openaitest.Status(http.StatusServiceUnavailable, "")
	m := newFakeModel(t, unavailable, openaitest.Status(http.StatusBadRequest, ""), unavailable)
	a := MustAgent(t, m, nil, nil, func(c *openai.Config) { c.MaxRetries = 2 })
	_, err := a.Run(t.Context(), ridersRequest("s1", "an earlier question", "and what else?"))
	if se, ok := errors.AsType[*openai.StatusError](err); !ok || se.Code != http.StatusServiceUnavailable {
		t.Fatalf("Run error = %v, want the 503 of the request without the rider", err)
	}
	// The request (503, retried: 400), then without the rider (503, retried: 503).
	if got := m.Count(); got != 4 {
		t.Errorf("the model got %d requests, want 4 (2 retries in all)", got)
	}
}

// TestRefusalsWithPerRequestIDsAreTheSame: a proxy's error page that names each request's own id
// (Cloudflare's Ray ID) is the same refusal from one request to the next: the request sent
// again without the riders, refused with another id, shows the endpoint refuses every request
// (one ERR), and so does another session's refusal after it. Before, the ids made every
// refusal another one: the turn was told to send /new, as if its conversation were at fault,
// and the operator was never told.
func TestRefusalsWithPerRequestIDsAreTheSame(t *testing.T) {
	assertRefusesEvery(t, func(n int) string {
		return fmt.Sprintf("<html><body><h1>400 Bad Request</h1><p>Cloudflare Ray ID: %016x-FRA</p><p>request %08x-1c2d-4e5f-8a9b-%012x</p></body></html>",
			uint64(0x8a1b2c3d4e5f0000)+uint64(n), 0x1a2b0000+n, 0xc0ffee000000+n)
	})
}

// assertRefusesEvery checks that an endpoint refusing request n with a 400 whose body is
// body(n) is told as one that refuses every request: a turn with a rider, whose request is sent
// again without it, then another session's turn, each fail with a Refusal that says so without
// naming /new and leave no rider out; the model gets 3 requests, and the logs hold one ERR line.
func assertRefusesEvery(t *testing.T, body func(n int) string) {
	t.Helper()
	m := openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
		openaitest.Status(http.StatusBadRequest, body(n))(w, r)
	})
	var logs bytes.Buffer
	a := MustAgent(t, m, &logs, nil, nil)
	for i, req := range []*agents.Request{
		ridersRequest("s1", "what is the time?", "and the date?"),
		{Identity: identity.Turn{SessionKey: "s2", TurnID: "t_1"}, Messages: []agents.Message{msg("user", "hi")}},
	} {
		resp, err := a.Run(t.Context(), req)
		ref, ok := errors.AsType[*agents.Refusal](err)
		if !ok || !strings.Contains(ref.Notice, "refuses every request") || strings.Contains(ref.Notice, "/new") {
			t.Fatalf("Run %d error = %v, want a Refusal saying the endpoint refuses every request, without /new", i+1, err)
		}
		if resp != nil && resp.RidersLeftOut {
			t.Errorf("Run %d left the riders out", i+1)
		}
	}
	if got := m.Count(); got != 3 {
		t.Errorf("the model got %d requests, want 3", got)
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
		t.Errorf("logs hold %d ERR lines, want 1:\n%s", n, logs.String())
	}
}

// alnumID is a per-request id of n characters of base58 that differs with seed, as a proxy's
// request ids do from one request to the next.
func alnumID(seed, n int) string {
	const base58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
	b := make([]byte, n)
	for i := range b {
		b[i] = base58[(seed*7919+i*31+i*i*seed)%len(base58)]
	}
	return string(b)
}

// TestRefusalsWithOtherPerRequestIDsAreTheSame: per-request ids that are no hex run are taken
// out of the refusals compared too, so an endpoint behind the proxy that refuses every request
// is told as one (one ERR), as with Cloudflare's Ray ID: new-api's "(request id: …)", the time
// to the nanosecond then 8 random letters and digits (new-api common/utils.go:
// MessageWithRequestId, GetTimeString() + GetRandomString(8)), and Anthropic's base58
// request_id, which LiteLLM passes on in its message (BerriAI/litellm#16525, HKUDS/nanobot#2200,
// where every call was refused so). Before, each request's id made another refusal: the turn was
// told to send /new, as if its conversation were at fault, and the operator was never told.
func TestRefusalsWithOtherPerRequestIDsAreTheSame(t *testing.T) {
	for _, tc := range []struct {
		name string
		body func(n int) string
	}{
		{"new-api", func(n int) string {
			id := fmt.Sprintf("20251207%06d%d%s", 73841+n, 40213+n*7919, alnumID(n, 8))
			return `{"error":{"message":"bad response status code 400 (request id: ` + id + `)","type":"new_api_error","param":"","code":"bad_response_status_code"}}`
		}},
		{"Anthropic behind LiteLLM", func(n int) string {
			id := "req_011CZ" + alnumID(n, 15)
			return `{"error":{"message":"litellm.BadRequestError: AnthropicException - {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"Error\"},\"request_id\":\"` + id + `\"}","type":null,"param":null,"code":"400"}}`
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { assertRefusesEvery(t, tc.body) })
	}
}

// TestRefusalsThatDifferBesideTheirIDsAreNotTheSame: taking per-request ids out keeps what tells
// two refusals apart, the numbers among it (a message's index, a count of tokens): a request
// refused for its rider's message, and refused for another message without it, each with its own
// request id, is a conversation at fault (the notice names /new), not an endpoint that refuses
// every request (no ERR). Shapes as Anthropic's behind LiteLLM (BerriAI/litellm#16525's
// "messages.4: …" with its request_id) and new-api's "(request id: …)".
func TestRefusalsThatDifferBesideTheirIDsAreNotTheSame(t *testing.T) {
	const rider = "a message the endpoint cannot take"
	for _, tc := range []struct {
		name string
		// body is the refusal of request n, which holds the rider or not: they differ in
		// one number beside the id.
		body func(n int, withRider bool) string
	}{
		{"a message's index, Anthropic behind LiteLLM", func(n int, withRider bool) string {
			index := 1
			if withRider {
				index = 3
			}
			return fmt.Sprintf(`{"error":{"message":"litellm.BadRequestError: AnthropicException - {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"messages.%d: text content blocks must be non-empty\"},\"request_id\":\"req_011CZ%s\"}","type":null,"param":null,"code":"400"}}`,
				index, alnumID(n, 15))
		}},
		{"a count, new-api", func(n int, withRider bool) string {
			count := 604
			if withRider {
				count = 812
			}
			return fmt.Sprintf(`{"error":{"message":"a message holds %d tokens of one word, more than the 512 the upstream takes (request id: 20251207%06d%d%s)","type":"new_api_error","param":"","code":"bad_response_status_code"}}`,
				count, 73841+n, 40213+n*7919, alnumID(n, 8))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m *openaitest.Model
			m = openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
				openaitest.Status(http.StatusBadRequest, tc.body(n, strings.Contains(m.Requests()[n-1].Body, rider)))(w, r)
			})
			var logs bytes.Buffer
			a := MustAgent(t, m, &logs, nil, nil)
			_, err := a.Run(t.Context(), ridersRequest("s1", rider, "and the date?"))
			ref, ok := errors.AsType[*agents.Refusal](err)
			if !ok || strings.Contains(ref.Notice, "refuses every request") || !strings.Contains(ref.Notice, "/new") {
				t.Fatalf("Run error = %v, want a Refusal naming /new, not one saying the endpoint refuses every request", err)
			}
			if m.Count() != 2 {
				t.Errorf("the model got %d requests, want 2", m.Count())
			}
			if strings.Contains(logs.String(), "level=ERROR") {
				t.Errorf("logs hold an ERR:\n%s", logs.String())
			}
		})
	}
}

// TestEchoedChatIsNotAContextRefusal: a refusal that echoes the request it refused (vLLM's
// validation error holds it whole as its input) holds the chat's words, which may speak of the
// model's context, or paste a vLLM refusal of max_tokens: read past the message's first 200
// characters only where the chat does not say the same, they are not the endpoint's; nor is
// llama.cpp's exceed_context_size_error as a proxy passes it on, pasted into the chat. The
// rider the endpoint cannot take is left out (the request without it answers), no ERR blames
// max_tokens, and the user is not told the conversation is too long. Before (7c8252f reads the
// whole message), the echoed words read as a conversation too long, or a max_tokens that does
// not fit (an ERR), and the request was not sent again without the rider: the user was told to
// send /new.
func TestEchoedChatIsNotAContextRefusal(t *testing.T) {
	for _, rider := range []string{
		"what is the context window of this model? \x00",
		"I got this: 'max_tokens' is too large: 9000. This model's maximum context length is 8192 tokens and your request has 12 input tokens (9000 > 8192 - 12). \x00",
		"LiteLLM said {'error': {'code': 400, 'type': 'exceed_context_size_error', 'n_prompt_tokens': 7000, 'n_ctx': 8192}} \x00",
	} {
		t.Run(rider[:20], func(t *testing.T) {
			var m *openaitest.Model
			m = openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
				body := m.Requests()[n-1].Body
				if !strings.Contains(body, `\u0000`) {
					openaitest.WriteReply(w, "ok", 1, 1)
					return
				}
				msg := "1 validation error:\n  {'type': 'value_error', 'loc': ('body', 'messages', 3, 'content'), 'msg': 'Value error, the text holds a NUL character', 'input': " + body + "}"
				b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": "BadRequestError", "param": nil, "code": 400}})
				openaitest.Status(http.StatusBadRequest, string(b))(w, r)
			})
			var logs bytes.Buffer
			a := MustAgent(t, m, &logs, nil, func(c *openai.Config) { c.MaxTokens = 9000 })
			resp, err := a.Run(t.Context(), ridersRequest("s1", rider, "and what else?"))
			if err != nil {
				t.Fatalf("Run: %v, want the answer of the request without the rider", err)
			}
			if !resp.RidersLeftOut {
				t.Errorf("Run = %+v, want the rider left out", resp)
			}
			if strings.Contains(logs.String(), "level=ERROR") {
				t.Errorf("logs hold an ERR:\n%s", logs.String())
			}
		})
	}
}

// TestMessageSentAgainIsNotAnEndpointThatRefusesEveryRequest: a user who sends again the one
// message the endpoint cannot take, with no request answered meanwhile, carries it as a rider
// too: the request without the riders still holds it, and its refusal shows nothing of the
// endpoint. The turn gets the ordinary notice (sent again with the next message), not that the
// endpoint refuses every request, and the operator no ERR; the next message other than it is
// answered without it, and leaves it out. Another session's refusal the same way still shows
// an endpoint that refuses every request (one ERR). Before, the message sent again read as an
// endpoint that refuses every request, with an ERR.
func TestMessageSentAgainIsNotAnEndpointThatRefusesEveryRequest(t *testing.T) {
	const bad = "a message the endpoint cannot take"
	var m *openaitest.Model
	m = openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if strings.Contains(m.Requests()[n-1].Body, bad) {
			openaitest.Status(http.StatusBadRequest, `{"error":{"message":"Bad Request"}}`)(w, r)
			return
		}
		openaitest.WriteReply(w, "ok", 1, 1)
	})
	var logs bytes.Buffer
	a := MustAgent(t, m, &logs, nil, nil)
	history := []agents.Message{msg("user", "hello"), msg("assistant", "hi there")}
	turn := func(riders []string, own string) (*agents.Response, error) {
		h := append([]agents.Message(nil), history...)
		for _, r := range riders {
			h = append(h, msg("user", r))
		}
		return a.Run(t.Context(), &agents.Request{Identity: identity.Turn{SessionKey: "s1", TurnID: "t_1"}, History: h, Messages: []agents.Message{msg("user", own)}})
	}
	for i, riders := range [][]string{nil, {bad}, {bad, bad + "\n"}} {
		resp, err := turn(riders, bad+" ")
		ref, ok := errors.AsType[*agents.Refusal](err)
		if !ok || strings.Contains(ref.Notice, "refuses every request") || !strings.Contains(ref.Notice, "sent again with your next one") {
			t.Fatalf("turn %d error = %v, want a Refusal that sends the message again with the next one", i+1, err)
		}
		if resp != nil && resp.RidersLeftOut {
			t.Errorf("turn %d left the riders out", i+1)
		}
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("logs hold an ERR:\n%s", logs.String())
	}
	resp, err := turn([]string{bad, bad, bad}, "something else")
	if err != nil || !resp.RidersLeftOut {
		t.Fatalf("the next message other than it = %+v, %v; want it answered, the riders left out", resp, err)
	}

	// An endpoint that refuses every request: the message sent again shows it no more, another
	// session's request does.
	m2 := newFakeModel(t, openaitest.Status(http.StatusBadRequest, `{"error":{"message":"Bad Request"}}`))
	logs.Reset()
	a = MustAgent(t, m2, &logs, nil, nil)
	for i, req := range []*agents.Request{
		ridersRequest("s1", "what is the time?", "what is the time?"),
		{Identity: identity.Turn{SessionKey: "s2", TurnID: "t_1"}, Messages: []agents.Message{msg("user", "hi")}},
	} {
		_, err := a.Run(t.Context(), req)
		ref, ok := errors.AsType[*agents.Refusal](err)
		if every := i == 1; !ok || strings.Contains(ref.Notice, "refuses every request") != every {
			t.Fatalf("Run %d error = %v, want a Refusal that says the endpoint refuses every request: %v", i+1, err, every)
		}
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 || !strings.Contains(logs.String(), "the requests of two sessions") {
		t.Errorf("logs hold %d ERR lines, want 1, of two sessions:\n%s", n, logs.String())
	}
}

// TestContextOfNoModelIsNotKnown: a refusal of a request too long for the model's context whose
// context is one no model has (0, or far past any, such as 10^12 tokens, or a number past an
// int), in vLLM's wordings or as llama.cpp's n_ctx, bare or behind LiteLLM, is a context
// exceeded whose size is not known, as a prompt of a size not known is: a conversation too
// long (/new), with no ERR. Before, a prompt of 12 tokens fit such a context: of 0, the
// max_tokens setting left no room in it; of 10^12 (or 999,999,999 as n_ctx), the conversation
// fit only without max_tokens' room; both told the operator with an ERR to lower max_tokens,
// which could not help. (n_ctx 0, negative or 10^12 held before: tokenCount.)
func TestContextOfNoModelIsNotKnown(t *testing.T) {
	vllm := func(ctx string) string {
		return `{"object":"error","message":"'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum context length is ` + ctx + ` tokens and your request has 12 input tokens (1000 > ` + ctx + ` - 12).","type":"BadRequestError","param":null,"code":400}`
	}
	vllm020 := func(ctx string) string {
		return `{"object":"error","message":"This model's maximum context length is ` + ctx + ` tokens. However, you requested 1000 output tokens and your prompt contains at least 12 input tokens, for a total of at least 1012 tokens.","code":400}`
	}
	llama := func(ctx string) string {
		return `{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error","n_prompt_tokens":12,"n_ctx":` + ctx + `}}`
	}
	litellm := func(ctx string) string {
		return `{"error":{"message":"litellm.BadRequestError: OpenAIException - Error code: 400 - {'error': {'code': 400, 'message': 'the request exceeds the available context size', 'type': 'exceed_context_size_error', 'n_prompt_tokens': 12, 'n_ctx': ` + ctx + `}}","type":null,"param":null,"code":"400"}}`
	}
	for _, tc := range []struct{ name, body string }{
		{"vLLM, a context of 0", vllm("0")},
		{"vLLM, a context of 10^12", vllm("1000000000000")},
		{"vLLM, a context past an int", vllm("99999999999999999999999")},
		{"vLLM 0.20, a context of 0", vllm020("0")},
		{"vLLM 0.20, a context of 10^12", vllm020("1000000000000")},
		{"llama.cpp, n_ctx of 999999999", llama("999999999")},
		{"llama.cpp, n_ctx of 0", llama("0")},
		{"llama.cpp, n_ctx negative", llama("-5")},
		{"llama.cpp, n_ctx of 1e12", llama("1e12")},
		{"llama.cpp behind LiteLLM, n_ctx of 999999999", litellm("999999999")},
	} {
		t.Run(tc.name, func(t *testing.T) { assertContextRefusal(t, tc.body, "conversation is too long", true, false) })
	}
}
