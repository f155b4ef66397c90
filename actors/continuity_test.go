package actors

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
)

// notesAgent records each turn's notes by its message id, and fails the turns of "fail".
type notesAgent struct {
	mu    sync.Mutex
	notes map[string][]string
}

func (a *notesAgent) Run(_ context.Context, req *agents.Request) (*agents.Response, error) {
	a.mu.Lock()
	a.notes[req.Identity.MessageID] = req.Notes
	a.mu.Unlock()
	if req.Messages[len(req.Messages)-1].Text == "fail" {
		return nil, errors.New("the model is down")
	}
	return &agents.Response{Text: "ok"}, nil
}

func (a *notesAgent) notesOf(id string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.notes[id]
}

// afterAnIdleReset starts a world whose chat's session (after one message, m0) has been idle
// past its idle reset policy (30 s), with an agent that records the notes of each turn. Called
// in a synctest bubble.
func afterAnIdleReset(t *testing.T) (*notesAgent, *managerWorld) {
	t.Helper()
	a, w := idleResetWorld(t)
	w.deliver(t, "m0", "hello")
	synctest.Wait()
	time.Sleep(time.Minute) // idle past the policy
	synctest.Wait()
	return a, w
}

// idleResetWorld starts a world whose sessions reset after 30 s idle, telling their users, with
// an agent that records the notes of each turn. Called in a synctest bubble.
func idleResetWorld(t *testing.T) (*notesAgent, *managerWorld) {
	t.Helper()
	a := &notesAgent{notes: map[string][]string{}}
	idle := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Second, Notify: true}
	w := newManagerWorld(t, a, func(d *Deps) {
		d.Config.ResetFor = func(string, string) ResetPolicy { return idle }
		d.Config.ResetPolicies = []ResetPolicy{idle}
	})
	return a, w
}

// TestContinuityNoteOutlivesAFailedFirstTurn: the first turn after an automatic reset gets the
// note naming the session the reset ended. When that turn fails, the next turn gets it, as a
// session loaded from the store at that point would (no turn has answered yet); but a /new
// before it starts a session that follows no automatic reset, and its turn gets no note.
//
// Before, the failed turn took the note with it (a soak of the openai agent found it); and a
// note not yet given outlived a /new, naming a session two boundaries back.
func TestContinuityNoteOutlivesAFailedFirstTurn(t *testing.T) {
	for _, newFirst := range []bool{false, true} {
		name := "next turn"
		if newFirst {
			name = "after /new"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a, w := afterAnIdleReset(t) // m1 starts a new session
				first := w.deliver(t, "m1", "fail")
				synctest.Wait()
				if n := a.notesOf("m1"); len(n) != 1 || !strings.Contains(n[0], "reset automatically") {
					t.Fatalf("the first turn after the reset got notes %q, want the continuity note", n)
				}
				if newFirst {
					if r := w.deliver(t, "c1", "/new"); r.ErrorCode != "" {
						t.Fatalf("/new: %+v", r)
					}
					synctest.Wait()
				}
				second := w.deliver(t, "m2", "again")
				synctest.Wait()
				got := a.notesOf("m2")
				switch {
				case newFirst && len(got) != 0:
					t.Errorf("the first turn of a session /new began got notes %q, want none", got)
				case !newFirst && (len(got) != 1 || second.SessionId != first.SessionId || !strings.Contains(got[0], "reset automatically")):
					t.Errorf("the turn after a failed first turn got notes %q (session %s, the reset's %s), want the continuity note again", got, second.SessionId, first.SessionId)
				}
			})
		})
	}
}

// TestNewAfterAnAutomaticResetStartsAfresh: a chat whose first contact after an automatic
// reset is a command (/status) has a session that says nothing yet, but whose first turn would
// be told to continue the session the reset ended. /new there starts a session that follows
// no automatic reset, as the user asked, rather than keep the one that does (as a session
// nothing was said in is kept): its first turn gets no note. Found by a review of the change
// that keeps such sessions.
func TestNewAfterAnAutomaticResetStartsAfresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, w := afterAnIdleReset(t) // the next message begins a new session
		status := w.deliver(t, "s1", "/status")
		synctest.Wait()
		n := w.deliver(t, "n1", "/new")
		synctest.Wait()
		if n.ErrorCode != "" || n.SessionId == status.SessionId {
			t.Errorf("/new after the automatic reset: %+v, want a session after %s", n, status.SessionId)
		}
		w.deliver(t, "m1", "hi")
		synctest.Wait()
		if got := a.notesOf("m1"); len(got) != 0 {
			t.Errorf("the first turn after /new got notes %q, want none", got)
		}
	})
}
