package openai_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
	"github.com/agentgate/agentgate/internal/testutil"
)

// newHeldModel starts a fake model that answers the first request with first once release is
// closed (steered closes it), and the later ones with rest, as newFakeModel does.
func newHeldModel(t *testing.T, first http.HandlerFunc, rest ...http.HandlerFunc) (*openaitest.Model, chan struct{}) {
	t.Helper()
	release := make(chan struct{})
	held := func(w http.ResponseWriter, r *http.Request) {
		<-release
		first(w, r)
	}
	return newFakeModel(t, append([]http.HandlerFunc{held}, rest...)...), release
}

// ran is what a turn run in the background returned.
type ran struct {
	resp *agents.Response
	err  error
}

// startTurn runs a turn of a on "question" in the background, taking messages steered in from
// steer, and returns where its result comes.
func startTurn(t *testing.T, a *openai.Agent, steer chan agents.Message, partial func(string)) <-chan ran {
	done := make(chan ran, 1)
	go func() {
		resp, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "question")}, Steer: steer, Partial: partial})
		done <- ran{resp, err}
	}()
	return done
}

// steered runs a turn of a on "question", steers "and also this" into it once the model got its
// first request, and then lets release go (the first answer waits on it).
func steered(t *testing.T, a *openai.Agent, m *openaitest.Model, release chan struct{}, partial func(string)) (*agents.Response, error) {
	t.Helper()
	steer := make(chan agents.Message) // unbuffered: a send returns once the agent took it
	done := startTurn(t, a, steer, partial)
	m.Wait(t)
	steer <- msg("user", "and also this")
	close(release)
	got := <-done
	close(steer)
	return got.resp, got.err
}

// TestRefusedParameterWithASteeredMessage: a call refused for max_tokens (a reasoning model
// asks for max_completion_tokens) or stream_options, during which a message was steered in,
// is sent again as any other (the switch made), and the steered message joins the call after
// it. Before, the call was not sent again: the turn failed as "its model endpoint refused the
// request", and the switch waited for a later turn.
func TestRefusedParameterWithASteeredMessage(t *testing.T) {
	for _, tc := range []struct {
		name, refusal, want string
		stream              bool
	}{
		{"max_tokens", "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.", `"max_completion_tokens":300`, false},
		{"stream_options", "Unrecognized request argument supplied: stream_options", `"stream":true}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, release := newHeldModel(t, openaitest.Status(http.StatusBadRequest, `{"error":{"message":`+jsonQuote(tc.refusal)+`,"type":"invalid_request_error"}}`),
				openaitest.Reply("First answer.", 10, 2), openaitest.Reply("Second answer.", 20, 3))
			a := MustAgent(t, m, nil, nil, func(c *openai.Config) { c.MaxTokens = 300; c.MaxRetries = 0 })
			var partial func(string)
			if tc.stream {
				partial = func(string) {}
			}
			resp, err := steered(t, a, m, release, partial)
			if err != nil || resp.Text != "First answer.\n\nSecond answer." || resp.Unseen != 0 {
				t.Fatalf("Run() = %+v, %v; want both answers, and nothing unseen", resp, err)
			}
			if n := m.Count(); n != 3 {
				t.Fatalf("%d requests, want 3: refused, sent again, and the steered message's", n)
			}
			if b := m.Body(t, 2); !strings.Contains(b, tc.want) || strings.Contains(b, "and also this") {
				t.Errorf("request sent again = %s; want it with %s, without the steered message", b, tc.want)
			}
			if b := m.Body(t, 3); !strings.Contains(b, tc.want) || !strings.Contains(b, `"First answer."},{"role":"user","content":"and also this"}`) {
				t.Errorf("third request = %s; want it with %s, and the steered message after the first answer", b, tc.want)
			}
		})
	}
}

// TestSteeredMessageAnsweredWithNoText: when the call a turn makes for messages steered into it
// is answered without text (the model declined them, asked for a tool, said nothing), the turn
// answers with the replies before it, and the steered messages run as the next turn, where they
// get an answer, or a notice that says why not. Before, they counted as answered, and their
// senders got nothing.
func TestSteeredMessageAnsweredWithNoText(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer http.HandlerFunc
	}{
		{"content filter", openaitest.Raw("application/json", `{"choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"content_filter"}],"usage":{"prompt_tokens":20,"completion_tokens":0}}`)},
		{"refusal", openaitest.Raw("application/json", `{"choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":"I can't help with that."},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":0}}`)},
		{"empty", openaitest.Reply("", 20, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, release := newHeldModel(t, openaitest.Reply("First answer.", 10, 2), tc.answer)
			logs := &testutil.Buffer{}
			a := MustAgent(t, m, logs, nil, nil)
			resp, err := steered(t, a, m, release, nil)
			if err != nil || resp.Text != "First answer." || resp.Unseen != 1 || resp.Usage != (agents.Usage{InputTokens: 30, OutputTokens: 2}) {
				t.Errorf("Run() = %+v, %v; want First answer., the steered message unseen, and both calls' usage", resp, err)
			}
			if n := m.Count(); n != 2 {
				t.Errorf("%d requests, want 2", n)
			}
			if line := "model answered the messages steered into the turn with no text; they run next, one turn each"; !strings.Contains(logs.String(), line) {
				t.Errorf("logs hold no %q:\n%s", line, logs.String())
			}
		})
	}
}

// TestSteeredIntoASteeredCallAnsweredWithNoText: a call made for a steered message that is
// answered with no text while another message was steered into it leaves both to run as the next
// turn, the answer before them standing. Before, the second message was sent again joined to the
// one the model had just declined: a third call, and the two answered (or declined) as one.
func TestSteeredIntoASteeredCallAnsweredWithNoText(t *testing.T) {
	second := make(chan struct{})
	m, release := newHeldModel(t, openaitest.Reply("First answer.", 10, 2), func(w http.ResponseWriter, r *http.Request) {
		<-second
		openaitest.Raw("application/json", `{"choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"content_filter"}],"usage":{"prompt_tokens":20,"completion_tokens":0}}`)(w, r)
	}, openaitest.Reply("Answered as one.", 30, 3))
	a := MustAgent(t, m, nil, nil, nil)
	steer := make(chan agents.Message) // unbuffered: a send returns once the agent took it
	done := startTurn(t, a, steer, nil)
	m.Wait(t)
	steer <- msg("user", "and also this")
	close(release)
	m.WaitRequests(t, 2) // the call for the steered message
	steer <- msg("user", "and this too")
	close(second)
	got := <-done
	close(steer)
	if got.err != nil || got.resp.Text != "First answer." || got.resp.Unseen != 2 {
		t.Errorf("Run() = %+v, %v; want First answer., both steered messages unseen", got.resp, got.err)
	}
	if n := m.Count(); n != 2 {
		t.Errorf("%d requests, want 2: the declined message is not sent again with the one steered in after it", n)
	}
}

// TestSteeredIntoACallAnsweredWithNoText: messages steered into a turn whose own call is
// answered with no text (the model declined the turn's message, asked for a tool, said nothing)
// run as the next turn (Response.Unseen), and the turn fails as such an answer fails it. Before,
// they were sent again together with the message the model had just declined: answered with no
// text again, they were declined with it (an agents.Refusal that is Declined), left out of the
// conversation, unanswered, and their senders told that the model declined them.
func TestSteeredIntoACallAnsweredWithNoText(t *testing.T) {
	for _, tc := range []struct {
		name     string
		answer   http.HandlerFunc
		declined bool
	}{
		{"content filter", openaitest.Raw("application/json", `{"choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"content_filter"}],"usage":{"prompt_tokens":10,"completion_tokens":0}}`), true},
		{"tool call", openaitest.Raw("application/json", `{"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"search","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":10,"completion_tokens":5}}`), true},
		{"empty", openaitest.Reply("", 10, 0), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, release := newHeldModel(t, tc.answer)
			a := MustAgent(t, m, nil, nil, nil)
			resp, err := steered(t, a, m, release, nil)
			ref, _ := errors.AsType[*agents.Refusal](err)
			if !errors.Is(err, openai.ErrEmptyReply) || (ref != nil && ref.Declined) != tc.declined {
				t.Errorf("Run() error = %v; want ErrEmptyReply, declined %v", err, tc.declined)
			}
			if resp == nil || resp.Unseen != 1 {
				t.Errorf("Run() = %+v; want the steered message unseen, to run as the next turn", resp)
			}
			if n := m.Count(); n != 1 {
				t.Errorf("%d requests, want 1: the declined message is not sent again with the steered one", n)
			}
		})
	}
}
