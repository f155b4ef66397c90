package supervisor

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
)

// TestRedeliveredCommandAfterRestart: a command sent again with the id it had before a restart
// (a client's retry, a platform replaying its events) is answered "duplicate" and changes
// nothing: the session it ended stays ended, and the chat's next message is stored and answered
// in the session the first /new started.
func TestRedeliveredCommandAfterRestart(t *testing.T) {
	dir := t.TempDir()
	r := startOn(t, dir, 0, echo.New())
	r.inject(t, dm, "m1", "hello")
	r.waitSent(t, 1)
	fresh := r.inject(t, dm, "n1", "/new")
	r.waitSent(t, 2)
	r.stop(t)

	r = startOn(t, dir, 0, echo.New())
	defer r.stop(t)
	for _, text := range []string{"/new", "/stop"} {
		dup := r.inject(t, dm, "n1", text)
		if dup == nil || dup.Disposition != platforms.Duplicate {
			t.Fatalf("%s sent again as n1: %+v, want disposition duplicate", text, dup)
		}
	}
	next := r.inject(t, dm, "m2", "still here?")
	if next == nil {
		t.Fatal("the message after the duplicate was refused")
	}
	if next.Disposition != platforms.Started || next.SessionID != fresh.SessionID {
		t.Errorf("next message: disposition %q in session %s, want started in %s (the first /new's)",
			next.Disposition, next.SessionID, fresh.SessionID)
	}
	r.waitReplyTo(t, "m2")
	sessions, err := r.d.store.SessionsOfKey(t.Context(), fresh.SessionKey, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(sessions) != 2 {
		t.Errorf("the key has %d sessions, want 2 (the duplicate /new started none)", len(sessions))
	}
}

// TestSharedSessionRewindsOnlyOwnMessages: in a thread shared by several users, /retry and
// /undo take back only the caller's own last message. Bob cannot re-run Alice's message (which
// would run it as Bob) nor archive it; Alice can.
func TestSharedSessionRewindsOnlyOwnMessages(t *testing.T) {
	clk := testutil.NewClock(t0)
	agent := &recorder{}
	r := startClocked(t, t.TempDir(), clk, agent, nil)
	defer r.stop(t)
	alice := identity.Source{Platform: "fake", ChatType: identity.ChatThread, ChatID: "room", ThreadID: "th", UserID: "alice", UserName: "Alice"}
	bob := alice
	bob.UserID, bob.UserName = "bob", "Bob"
	send := func(src identity.Source, id, text string) (*platforms.Ack, string) {
		n := len(r.fake.Sent())
		ack := r.inject(t, src, id, text)
		out := r.waitSent(t, n+1)
		clk.Advance(time.Second)
		return ack, out[len(out)-1].Text
	}
	a1, _ := send(alice, "a1", "transfer 100 to carol")
	turns := agent.count()
	for _, cmd := range []string{"/retry", "/undo"} {
		_, answer := send(bob, "b-"+cmd, cmd)
		if !strings.Contains(answer, "someone else's") {
			t.Errorf("bob's %s answered %q, want a refusal naming someone else's message", cmd, answer)
		}
	}
	if agent.count() != turns {
		t.Errorf("bob's /retry ran a turn: %+v", agent.last().Identity)
	}
	msgs, err := r.d.store.Transcript(t.Context(), a1.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if m.Archived {
			t.Errorf("bob's commands archived %q", m.Content)
		}
	}

	send(alice, "a2", "/retry")
	req := agent.last()
	if req.Identity.UserID != "alice" || req.Identity.MessageID != "a2" || !strings.Contains(req.Messages[0].Text, "transfer 100 to carol") {
		t.Errorf("alice's /retry ran %q as %s (message %s), want her message as alice",
			req.Messages[0].Text, req.Identity.UserID, req.Identity.MessageID)
	}
}

// blindStore is a store that cannot answer FindInbound: the duplicate check before a command
// fails, so the command's write is what refuses it.
type blindStore struct{ persistence.Store }

func (blindStore) FindInbound(context.Context, string, string, string) (*persistence.Message, error) {
	return nil, errors.New("find inbound: store unreachable (test)")
}

// TestRefusedCommandStartsSessionFromStore: when a command's write is refused after it changed
// the session in memory (here a /new re-delivered while the duplicate check cannot read), the
// session starts again from the store, so memory never runs ahead of it: the next message is
// stored and answered in the session the store holds.
func TestRefusedCommandStartsSessionFromStore(t *testing.T) {
	dir := t.TempDir()
	r := startOn(t, dir, 0, echo.New())
	r.inject(t, dm, "m1", "hello")
	r.waitSent(t, 1)
	fresh := r.inject(t, dm, "n1", "/new")
	r.waitSent(t, 2)
	r.stop(t)

	r = MustStartDaemon(t, echo.New(), daemonOpts{dir: dir, wrap: func(s persistence.Store) persistence.Store { return blindStore{s} }})
	defer r.stop(t)
	if dup := r.inject(t, dm, "n1", "/new"); dup == nil || dup.Disposition != platforms.Duplicate {
		t.Fatalf("/new sent again as n1: %+v, want disposition duplicate", dup)
	}
	next := r.inject(t, dm, "m2", "still here?") // handed to the next activation if it is still starting
	if next == nil {
		t.Fatal("the message after the refused command was refused")
	}
	if next.SessionID != fresh.SessionID {
		t.Errorf("next message stored in session %s, want %s (the first /new's)", next.SessionID, fresh.SessionID)
	}
	r.waitReplyTo(t, "m2")
}
