package actors

import (
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/persistence"
)

// answersTo reads what the platform was sent until the answer to id that ends its turn or
// command, and returns the texts of those that answer id, in order.
func (w *managerWorld) answersTo(t *testing.T, id string) []string {
	t.Helper()
	var texts []string
	for {
		select {
		case m := <-w.sent:
			if slices.Contains(m.Out.InReplyTo, id) {
				texts = append(texts, m.Out.Text)
				if m.Out.TurnEnd {
					return texts
				}
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s not answered within a minute (so far %q)", id, texts)
		}
	}
}

// resetNotices are the automatic reset notices among texts.
func resetNotices(texts []string) []string {
	var n []string
	for _, s := range texts {
		if strings.HasPrefix(s, AutoResetNotice) {
			n = append(n, s)
		}
	}
	return n
}

// TestAutomaticResetOfASilentSessionOffersNoWayBackToIt: an automatic reset ends a session
// nothing was said in (one /new or /status began, and nobody wrote to), by the timer or as the
// next message arrives. That message's session follows the one the silent session followed, if
// any: its user is not offered a /resume of the empty session, and its first turn is not told to
// search it. When the silent session followed an automatic reset itself, the notice and the
// note name the session that reset ended, which holds the conversation. Before, the message
// was told "Your previous session was reset automatically … Send /resume <the empty session>".
func TestAutomaticResetOfASilentSessionOffersNoWayBackToIt(t *testing.T) {
	for _, tt := range []struct {
		name  string
		timer bool // the reset timer ends the silent session; else the next message does
		// begin begins the silent session and returns the session the next one must follow
		// ("" for none) and whether the notice and the note must name it.
		begin func(t *testing.T, w *managerWorld) (silent, prev string, named bool)
	}{
		{"after /new, ended by the timer", true, afterNew},
		{"after /new, ended as a message arrives", false, afterNew},
		{"begun by /status after an automatic reset", true, func(t *testing.T, w *managerWorld) (string, string, bool) {
			m0 := w.deliver(t, "m0", "hello")
			w.answersTo(t, "m0")
			time.Sleep(time.Minute) // idle past the policy: /status begins the successor
			s0 := w.deliver(t, "s0", "/status")
			w.answersTo(t, "s0")
			return s0.SessionId, m0.SessionId, true
		}},
		{"begun by /status on a new chat", true, func(t *testing.T, w *managerWorld) (string, string, bool) {
			s0 := w.deliver(t, "s0", "/status")
			w.answersTo(t, "s0")
			return s0.SessionId, "", false
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a, w := idleResetWorld(t)
				silent, prev, named := tt.begin(t, w)
				time.Sleep(time.Minute) // the silent session is idle past the policy
				if tt.timer {
					w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
					synctest.Wait()
					if s, err := w.store.Session(w.ctx, silent); err != nil || s.EndReason != persistence.EndIdle {
						t.Fatalf("the silent session after the timer's nudge: %+v, %v; want it ended idle", s, err)
					}
				}
				m1 := w.deliver(t, "m1", "hi")
				answers := w.answersTo(t, "m1")
				for _, text := range answers {
					if strings.Contains(text, silent) {
						t.Errorf("m1 was answered %q, naming the session %s nothing was said in", text, silent)
					}
				}
				notes := a.notesOf("m1")
				for _, n := range notes {
					if strings.Contains(n, silent) {
						t.Errorf("m1's turn got the note %q, naming the session %s nothing was said in", n, silent)
					}
				}
				switch notices := resetNotices(answers); {
				case named && (len(notices) != 1 || !strings.Contains(notices[0], "Send /resume "+prev+" ")):
					t.Errorf("m1 got the reset notices %q, want one offering /resume %s", notices, prev)
				case named && (len(notes) != 1 || !strings.Contains(notes[0], prev)):
					t.Errorf("m1's turn got the notes %q, want the continuity note naming %s", notes, prev)
				case !named && len(notices)+len(notes) != 0:
					t.Errorf("m1 got the reset notices %q and its turn the notes %q, want none", notices, notes)
				}
				s, err := w.store.Session(w.ctx, m1.SessionId)
				if err != nil {
					t.Fatal(err)
				}
				if m1.SessionId == silent || s.PrevSessionID != prev {
					t.Errorf("m1's session %s follows %q, want a new one following %q", m1.SessionId, s.PrevSessionID, prev)
				}
			})
		})
	}
}

// afterNew begins a silent session with /new after a conversation (m0): the next session
// follows the one /new ended, which is named nowhere (/new ended it).
func afterNew(t *testing.T, w *managerWorld) (silent, prev string, named bool) {
	m0 := w.deliver(t, "m0", "hello")
	w.answersTo(t, "m0")
	n0 := w.deliver(t, "n0", "/new")
	w.answersTo(t, "n0")
	return n0.SessionId, m0.SessionId, false
}

// TestCommandFirstAfterAnAutomaticResetTellsTheUser: a command (/status) that is a chat's first
// contact after an automatic reset begins the successor. Its answer comes after the reset
// notice, which the chat gets once (the next message gets none), and the first turn gets the
// continuity note, as when a message comes first. Before, the notice never came, and the note
// came only if the session was loaded again from the store before that turn.
func TestCommandFirstAfterAnAutomaticResetTellsTheUser(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, w := idleResetWorld(t)
		m0 := w.deliver(t, "m0", "hello")
		w.answersTo(t, "m0")
		time.Sleep(time.Minute) // idle past the policy
		s1 := w.deliver(t, "s1", "/status")
		got := w.answersTo(t, "s1")
		if len(got) != 2 || !strings.HasPrefix(got[0], AutoResetNotice) || !strings.Contains(got[0], "Send /resume "+m0.SessionId+" ") ||
			!strings.HasPrefix(got[1], "Session "+s1.SessionId+"\n") {
			t.Errorf("/status after the reset was answered %q, want the reset notice offering /resume %s, then the status of %s", got, m0.SessionId, s1.SessionId)
		}
		w.deliver(t, "m1", "hi")
		if n := resetNotices(w.answersTo(t, "m1")); len(n) != 0 {
			t.Errorf("m1 got the reset notices %q after /status had one", n)
		}
		if notes := a.notesOf("m1"); len(notes) != 1 || !strings.Contains(notes[0], m0.SessionId) {
			t.Errorf("the first turn after the reset got the notes %q, want the continuity note naming %s", notes, m0.SessionId)
		}
	})
}
