package actors

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
)

// TestRefusedRidersAreLeftOut: a message whose request the model endpoint refuses with a plain
// 400 (not for what it says: no content policy, no context length) stays in the conversation
// once, merged into the next message; when that request is refused too, the agent sends it
// again without the earlier message, and the endpoint's answer to that answers the next message,
// saying the earlier one is left out, which the session archives (also after a reload). Before,
// the refused message rode along with every later message, and every later turn failed with
// "its model endpoint refused the request" until /new; then, the next message's turn failed
// too, leaving the earlier one out, and its own rode once more with the one after it.
//
// It runs the openai agent against a fake endpoint on loopback, with real time: the agent's
// HTTP connections cannot live in a synctest bubble.
func TestRefusedRidersAreLeftOut(t *testing.T) {
	const bad = "a message the endpoint cannot take"
	var m *openaitest.Model
	m = openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if strings.Contains(m.Requests()[n-1].Body, bad) {
			openaitest.Status(http.StatusBadRequest, `{"error":{"message":"Invalid 'messages[3].content': string contains an unsupported sequence","type":"invalid_request_error"}}`)(w, r)
			return
		}
		openaitest.WriteReply(w, "ok", 1, 1)
	})
	agent, err := openai.New(openai.Config{BaseURL: m.URL(), Model: "test-model", MaxHistory: 50})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "agentgate.db")
	w := newManagerWorldAt(t, path, agent, nil)
	w.deliver(t, "m1", "hello")
	if got := w.answerTo("m1"); got != "ok" {
		t.Fatalf("m1 answered %q, want ok", got)
	}
	w.deliver(t, "m2", bad)
	if got, want := w.answerTo("m2"), "its model endpoint refused the request"; !strings.Contains(got, want) || strings.Contains(got, "/new") {
		t.Fatalf("m2 answered %q, want it to say %q, without /new", got, want)
	}
	w.deliver(t, "m3", "and what else?")
	if got := w.answerTo("m3"); !strings.HasPrefix(got, "ok\n\n[") || !strings.Contains(got, "left out") {
		t.Errorf("m3 answered %q, want ok with a note that the earlier message is left out", got)
	}
	if body := m.Body(t, 4); strings.Contains(body, bad) || !strings.Contains(body, "and what else?") {
		t.Errorf("m3's request without the rider = %s, want m3 in it, and not m2", body)
	}
	w.deliver(t, "m4", "a harmless question")
	if got := w.answerTo("m4"); got != "ok" {
		t.Errorf("m4 answered %q, want ok (its request: %s)", got, m.Body(t, 5))
	}
	if body := m.Body(t, 5); strings.Contains(body, bad) || !strings.Contains(body, "and what else?") || !strings.Contains(body, "hello") ||
		strings.Contains(body, "left out") {
		t.Errorf("m4's request = %s, want hello and m3 in it, and neither m2 nor the note", body)
	}
	if row, err := w.store.FindInbound(w.ctx, w.src.Platform, w.src.ChatID, "m2"); err != nil || row == nil || row.Active || !row.Archived {
		t.Errorf("m2's row = %+v, %v; want archived", row, err)
	}
	if row, err := w.store.FindInbound(w.ctx, w.src.Platform, w.src.ChatID, "m3"); err != nil || row == nil || row.Archived {
		t.Errorf("m3's row = %+v, %v; want kept", row, err)
	}
	w.stop()

	answeredWithoutAfterReload(t, path, agent, m, bad, 6)
}

// TestEndpointRefusingEveryRequestKeepsEveryMessage: while the model endpoint (or a proxy in
// front of it) refuses every request with a bare 400, whose refusal names nothing, every
// message is refused and none is left out, also for a user who sends one message again: a
// notice after a different message's refusal says the configuration or the endpoint is at
// fault, each says the message is sent again with the next one, and none names /new. Once it is put right, the next
// request carries every message of the outage. Before, each refused turn archived the message
// before it, and the second told the user to send /new.
func TestEndpointRefusingEveryRequestKeepsEveryMessage(t *testing.T) {
	var broken atomic.Bool
	m := openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if broken.Load() {
			openaitest.Status(http.StatusBadRequest, "")(w, r)
			return
		}
		openaitest.WriteReply(w, "ok", 1, 1)
	})
	agent, err := openai.New(openai.Config{BaseURL: m.URL(), Model: "test-model", MaxHistory: 50})
	if err != nil {
		t.Fatal(err)
	}
	w := newManagerWorldAt(t, filepath.Join(t.TempDir(), "agentgate.db"), agent, nil)
	w.deliver(t, "m1", "hello")
	if got := w.answerTo("m1"); got != "ok" {
		t.Fatalf("m1 answered %q, want ok", got)
	}
	broken.Store(true)
	outage := []string{"what is the time?", "what is the time?", "what is the time?!"}
	for i, text := range outage {
		id := fmt.Sprint("o", i+1)
		w.deliver(t, id, text)
		got := w.answerTo(id)
		if strings.Contains(got, "/new") || strings.Contains(got, "left out of the conversation") {
			t.Errorf("%s answered %q, want no message left out, and no /new", id, got)
		}
		// o2 is o1 sent again: a refusal of the request without o1 still held o2's text, which
		// proves nothing about the endpoint (b55cd18), so o2 is told its message goes again with
		// the next one; o3 differs, and its refusal without the two shows every request refused.
		switch resent := i == 1; {
		case resent && (strings.Contains(got, "refuses every request") || !strings.Contains(got, "sent again with your next one")):
			t.Errorf("%s (o1 sent again) answered %q, want it sent again with the next one, not that the endpoint refuses every request", id, got)
		case i == 2 && !strings.Contains(got, "refuses every request"):
			t.Errorf("%s answered %q, want it to say the endpoint refuses every request", id, got)
		}
	}
	broken.Store(false)
	w.deliver(t, "m2", "is it back?")
	if got := w.answerTo("m2"); got != "ok" {
		t.Fatalf("m2 answered %q, want ok", got)
	}
	if body := m.Body(t, m.Count()); strings.Count(body, "what is the time?") != 3 {
		t.Errorf("the request after the outage = %s; want it to carry the 3 messages of the outage", body)
	}
	for i := range outage {
		id := fmt.Sprint("o", i+1)
		if row, err := w.store.FindInbound(w.ctx, w.src.Platform, w.src.ChatID, id); err != nil || row == nil || row.Archived {
			t.Errorf("%s's row = %+v, %v; want it kept in the conversation", id, row, err)
		}
	}
}

// TestRefusalOfTheConfigurationLeavesNoMessageOut: while the agent's configuration is one the
// model endpoint refuses, and its refusal names the setting (max_tokens too large for the
// model), every message is refused, and none is left out: once the operator puts it right, the
// next request carries every message of the outage, as after an outage of the endpoint. Before,
// each refused turn archived the message before it (agents.Refusal.Rejected), and the
// conversation kept only the last message of the outage, though the refusal said the
// configuration was at fault.
//
// It runs the openai agent against a fake endpoint on loopback, with real time: the agent's
// HTTP connections cannot live in a synctest bubble.
func TestRefusalOfTheConfigurationLeavesNoMessageOut(t *testing.T) {
	var broken atomic.Bool
	m := openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if broken.Load() {
			openaitest.Status(http.StatusBadRequest, `{"error":{"message":"max_tokens is too large: 100000. This model supports at most 16384 completion tokens, whereas you provided 100000.","type":"invalid_request_error","param":"max_tokens","code":null}}`)(w, r)
			return
		}
		openaitest.WriteReply(w, "ok", 1, 1)
	})
	agent, err := openai.New(openai.Config{BaseURL: m.URL(), Model: "test-model", MaxHistory: 50, MaxTokens: 100000})
	if err != nil {
		t.Fatal(err)
	}
	w := newManagerWorldAt(t, filepath.Join(t.TempDir(), "agentgate.db"), agent, nil)
	w.deliver(t, "m1", "hello")
	if got := w.answerTo("m1"); got != "ok" {
		t.Fatalf("m1 answered %q, want ok", got)
	}
	broken.Store(true)
	outage := []string{"first question", "second question", "third question"}
	for i, text := range outage {
		id := fmt.Sprint("o", i+1)
		w.deliver(t, id, text)
		if got := w.answerTo(id); !strings.Contains(got, "its model endpoint refused the request for a setting of the agent") || strings.Contains(got, "left out") {
			t.Errorf("%s answered %q, want the notice of a setting's refusal, which leaves nothing out", id, got)
		}
	}
	broken.Store(false)
	w.deliver(t, "m2", "is it back?")
	if got := w.answerTo("m2"); got != "ok" {
		t.Fatalf("m2 answered %q, want ok", got)
	}
	body := m.Body(t, m.Count())
	for i, text := range outage {
		if !strings.Contains(body, text) {
			t.Errorf("the request after the outage = %s; want it to carry %q", body, text)
		}
		id := fmt.Sprint("o", i+1)
		if row, err := w.store.FindInbound(w.ctx, w.src.Platform, w.src.ChatID, id); err != nil || row == nil || row.Archived {
			t.Errorf("%s's row = %+v, %v; want it kept in the conversation", id, row, err)
		}
	}
}
