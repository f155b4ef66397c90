package actors

import (
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
)

// TestRefusedRidersAreLeftOut: a message whose request the model endpoint refuses with a plain
// 400 (not for what it says: no content policy, no context length) stays in the conversation
// once, merged into the next message; when that request is refused too, the earlier message is
// left out, also after a reload, and the notice says so and names /new. The next message's own
// is sent once more, and answered once the message at fault is gone. Before, the refused
// message rode along with every later message, and every later turn failed with "its model
// endpoint refused the request" until /new, which no notice named (found by a soak).
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
	if got, want := w.answerTo("m2"), "its model endpoint refused the request."; !strings.HasSuffix(got, want) {
		t.Fatalf("m2 answered %q, want it to end %q", got, want)
	}
	w.deliver(t, "m3", "and what else?")
	if got, want := w.answerTo("m3"), "The earlier message sent along with it that got no answer is left out of the conversation"; !strings.Contains(got, want) || !strings.Contains(got, "/new") {
		t.Errorf("m3 answered %q, want it to say %q, and name /new", got, want)
	}
	w.deliver(t, "m4", "a harmless question")
	if got := w.answerTo("m4"); got != "ok" {
		t.Errorf("m4 answered %q, want ok (its request: %s)", got, m.Body(t, 4))
	}
	if body := m.Body(t, 4); strings.Contains(body, bad) || !strings.Contains(body, "and what else?") || !strings.Contains(body, "hello") {
		t.Errorf("m4's request = %s, want hello and m3 in it, and not m2", body)
	}
	if row, err := w.store.FindInbound(w.ctx, w.src.Platform, w.src.ChatID, "m2"); err != nil || row == nil || row.Active || !row.Archived {
		t.Errorf("m2's row = %+v, %v; want archived", row, err)
	}
	if row, err := w.store.FindInbound(w.ctx, w.src.Platform, w.src.ChatID, "m3"); err != nil || row == nil || row.Archived {
		t.Errorf("m3's row = %+v, %v; want kept (m4 answered it)", row, err)
	}
	w.stop()

	answeredWithoutAfterReload(t, path, agent, m, bad)
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
		if got := w.answerTo(id); !strings.HasSuffix(got, "its model endpoint refused the request.") {
			t.Errorf("%s answered %q, want the refusal's notice, which leaves nothing out", id, got)
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

// TestRejectedNoticeCountsTheRiders: the notice of a turn whose request the endpoint refused
// (agents.Refusal.Rejected) says how many earlier messages were left out, and names /new; with
// none, it says nothing more.
func TestRejectedNoticeCountsTheRiders(t *testing.T) {
	rejected := &agents.Refusal{Notice: "its model endpoint refused the request", Rejected: true, Err: errors.New("400")}
	const head = "⚠️ The agent could not answer this message (turn t_1 failed): its model endpoint refused the request."
	const next = "; if it refuses your next message too, send /new to start a fresh session."
	for _, tt := range []struct {
		riders int
		want   string
	}{
		{0, head},
		{1, head + " The earlier message sent along with it that got no answer is left out of the conversation and will not be sent to the agent again, in case it is what the endpoint refuses" + next},
		{3, head + " The 3 earlier messages sent along with it that got no answer are left out of the conversation and will not be sent to the agent again, in case one of them is what the endpoint refuses" + next},
	} {
		if got := failedNotice("t_1", rejected, tt.riders); got != tt.want {
			t.Errorf("failedNotice(%d riders) = %q, want %q", tt.riders, got, tt.want)
		}
	}
}
