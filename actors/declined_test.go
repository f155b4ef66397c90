package actors

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/agentgate/agentgate/agents"
)

// declineAgent declines, as a model endpoint's content policy does (agents.Refusal.Declined),
// every request that holds "#policy" anywhere, and answers the others; it records what each
// request showed it.
type declineAgent struct {
	mu    sync.Mutex
	shown []string // per request, its history and messages, one text
}

func (a *declineAgent) Run(_ context.Context, req *agents.Request) (*agents.Response, error) {
	var b strings.Builder
	for _, m := range append(append([]agents.Message(nil), req.History...), req.Messages...) {
		b.WriteString(m.Role + ": " + m.Text + "\n")
	}
	a.mu.Lock()
	a.shown = append(a.shown, b.String())
	a.mu.Unlock()
	if strings.Contains(b.String(), "#policy") {
		return nil, &agents.Refusal{Notice: "its model endpoint declined this message (its content policy)", Declined: true,
			Err: errors.New("model endpoint answered 400 Bad Request: safety system")}
	}
	return &agents.Response{Text: "ok"}, nil
}

// last is what the last request showed the agent.
func (a *declineAgent) last() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.shown[len(a.shown)-1]
}

// answerTo returns the text of the last outbound of the turn that answers message id (a reload
// sends again what no platform confirmed before it).
func (w *managerWorld) answerTo(id string) string {
	for {
		if m := <-w.sent; m.Out.TurnEnd && slices.Contains(m.Out.InReplyTo, id) {
			return m.Out.Text
		}
	}
}

// TestDeclinedMessageIsLeftOut: a message the model endpoint declines for what it says is left
// out of what later turns send, also after the session reloads from the store, and its sender
// is told so. Before, a failed message stayed in the history, merged into the next user
// message, so every later message was sent with it and declined too, until /new (found by a
// walkthrough with a fake OpenAI endpoint).
func TestDeclinedMessageIsLeftOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		a := &declineAgent{}
		w := newManagerWorldAt(t, path, a, nil)
		w.deliver(t, "m1", "hello")
		if got := w.answerTo("m1"); got != "ok" {
			t.Fatalf("m1 answered %q, want ok", got)
		}
		w.deliver(t, "m2", "bad #policy")
		if got := w.answerTo("m2"); !strings.Contains(got, "content policy") || !strings.Contains(got, "will not be sent to the agent again") {
			t.Errorf("m2 answered %q, want the content policy's notice, saying it will not be sent again", got)
		}
		w.deliver(t, "m3", "a harmless question")
		if got := w.answerTo("m3"); got != "ok" {
			t.Errorf("m3 answered %q, want ok (the agent was shown %q)", got, a.last())
		}
		if got := a.last(); strings.Contains(got, "#policy") || !strings.Contains(got, "hello") {
			t.Errorf("m3's request showed %q, want hello and not the declined message", got)
		}
		if m2, err := w.store.FindInbound(w.ctx, w.src.Platform, w.src.ChatID, "m2"); err != nil || m2 == nil || m2.Active || !m2.Archived {
			t.Errorf("m2's row = %+v, %v; want archived", m2, err)
		}
		w.stop()
		synctest.Wait()

		w2 := newManagerWorldAt(t, path, a, nil)
		w2.deliver(t, "m4", "after the reload")
		if got := w2.answerTo("m4"); got != "ok" {
			t.Errorf("m4 answered %q after the reload, want ok (the agent was shown %q)", got, a.last())
		}
		if got := a.last(); strings.Contains(got, "#policy") || !strings.Contains(got, "a harmless question") {
			t.Errorf("m4's request after the reload showed %q, want the history without the declined message", got)
		}
	})
}
