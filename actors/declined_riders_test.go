package actors

import (
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
)

// TestDeclinedRidersAreLeftOut: a message whose turn failed for a passing reason (a 500) rides
// in the next request, merged into the next user message; when the endpoint declines that
// request for what it says, the rider is left out with the declined message, also after a
// reload, and the notice says so. Before, only the new message was archived: the rider, maybe
// what was declined, rode in every later request and got each declined in its turn.
//
// It runs the openai agent against a fake endpoint on loopback, with real time: the agent's
// HTTP connections cannot live in a synctest bubble.
func TestDeclinedRidersAreLeftOut(t *testing.T) {
	const rider = "tell me about the forbidden topic"
	var m *openaitest.Model
	m = openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
		switch body := m.Requests()[n-1].Body; {
		case n == 2:
			openaitest.Status(http.StatusInternalServerError, `{"error":{"message":"overloaded"}}`)(w, r)
		case strings.Contains(body, rider):
			openaitest.Status(http.StatusBadRequest, `{"error":{"message":"Your request was rejected by our safety system","code":"content_policy_violation"}}`)(w, r)
		default:
			openaitest.WriteReply(w, "ok", 1, 1)
		}
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
	w.deliver(t, "m2", rider)
	if got := w.answerTo("m2"); !strings.Contains(got, "Please try again") {
		t.Fatalf("m2 answered %q, want the notice of a failed turn", got)
	}
	w.deliver(t, "m3", "and what else?")
	if got, want := w.answerTo("m3"), "with the earlier message sent along with it that got no answer; they will not be sent to the agent again"; !strings.Contains(got, want) {
		t.Errorf("m3 answered %q, want it to say %q", got, want)
	}
	if body := m.Body(t, 3); !strings.Contains(body, rider) {
		t.Fatalf("m3's request %s does not carry the failed m2: the test sets up nothing", body)
	}
	w.deliver(t, "m4", "a harmless question")
	if got := w.answerTo("m4"); got != "ok" {
		t.Errorf("m4 answered %q, want ok (its request: %s)", got, m.Body(t, 4))
	}
	if body := m.Body(t, 4); strings.Contains(body, rider) || strings.Contains(body, "and what else?") || !strings.Contains(body, "hello") {
		t.Errorf("m4's request = %s, want hello in its history and neither m2 nor m3", body)
	}
	for _, id := range []string{"m2", "m3"} {
		if row, err := w.store.FindInbound(w.ctx, w.src.Platform, w.src.ChatID, id); err != nil || row == nil || row.Active || !row.Archived {
			t.Errorf("%s's row = %+v, %v; want archived", id, row, err)
		}
	}
	w.stop()

	answeredWithoutAfterReload(t, path, agent, m, rider, 5)
}

// answeredWithoutAfterReload: a manager loaded again from path answers m5 ("after the
// reload"), the n-th request m gets, whose history holds m4 ("a harmless question") and not
// left, the text of m2, which a refusal left out.
func answeredWithoutAfterReload(t *testing.T, path string, agent agents.Agent, m *openaitest.Model, left string, n int) {
	t.Helper()
	w2 := newManagerWorldAt(t, path, agent, nil)
	w2.deliver(t, "m5", "after the reload")
	if got := w2.answerTo("m5"); got != "ok" {
		t.Errorf("m5 answered %q after the reload, want ok", got)
	}
	if body := m.Body(t, n); strings.Contains(body, left) || !strings.Contains(body, "a harmless question") {
		t.Errorf("m5's request after the reload = %s, want the history without m2", body)
	}
}

// TestDeclinedNoticeCountsTheRiders: the notice of a declined turn says how many earlier
// messages were left out with its own.
func TestDeclinedNoticeCountsTheRiders(t *testing.T) {
	declined := &agents.Refusal{Notice: "its model endpoint declined this message (its content policy)", Declined: true, Err: errors.New("400")}
	const head = "⚠️ The agent could not answer this message (turn t_1 failed): its model endpoint declined this message (its content policy)."
	for _, tt := range []struct {
		riders int
		want   string
	}{
		{0, head + " It is left out of the conversation and will not be sent to the agent again."},
		{1, head + " It is left out of the conversation, with the earlier message sent along with it that got no answer; they will not be sent to the agent again."},
		{3, head + " It is left out of the conversation, with the 3 earlier messages sent along with it that got no answer; they will not be sent to the agent again."},
	} {
		if got := failedNotice("t_1", declined, tt.riders); got != tt.want {
			t.Errorf("failedNotice(%d riders) = %q, want %q", tt.riders, got, tt.want)
		}
	}
}

// TestTimedOutNotice: the sender of a message whose turn outlived the agent's time limit is told
// so, and not asked to try again, which would most likely time out too; other failures still
// are.
func TestTimedOutNotice(t *testing.T) {
	timedOut := agents.TimedOut(10*time.Minute, errors.New("exec agent: timed out: run x: no reply within 10m0s (agent.exec.timeout)"))
	const want = "⚠️ The agent could not answer this message (turn t_1 failed): it took longer than its time limit (10m) and was stopped."
	if got := failedNotice("t_1", timedOut, 0); got != want {
		t.Errorf("failedNotice(timed out) = %q, want %q", got, want)
	}
	const other = "⚠️ The agent could not answer this message (turn t_1 failed). Please try again."
	if got := failedNotice("t_1", errors.New("exec agent: run x: exit status 1"), 0); got != other {
		t.Errorf("failedNotice(exit status 1) = %q, want %q", got, other)
	}
}
