package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/actors"
	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// newThenStop runs a daemon on dir in which the chat says hello, then /new (as n1), and stops
// it; it returns /new's acknowledgment.
func newThenStop(t *testing.T, dir string) *platforms.Ack {
	t.Helper()
	r := startOn(t, dir, 0, echo.New())
	defer r.stop(t)
	r.inject(t, dm, "m1", "hello")
	r.waitSent(t, 1)
	fresh := r.inject(t, dm, "n1", "/new")
	r.waitSent(t, 2)
	return fresh
}

// TestRedeliveredCommandAfterRestart: a command sent again with the id it had before a restart
// (a client's retry, a platform replaying its events) is answered "duplicate" and changes
// nothing: the session it ended stays ended, and the chat's next message is stored and answered
// in the session the first /new started.
func TestRedeliveredCommandAfterRestart(t *testing.T) {
	dir := t.TempDir()
	fresh := newThenStop(t, dir)
	r := startOn(t, dir, 0, echo.New())
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
	fresh := newThenStop(t, dir)
	r := MustStartDaemon(t, echo.New(), daemonOpts{dir: dir, wrap: func(s persistence.Store) persistence.Store { return blindStore{s} }})
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

// blockOn is an agent that holds the turn of message id until release is closed (or the turn
// is cancelled), records the history every turn saw, and echoes.
type blockOn struct {
	id      string
	release chan struct{}
	started chan struct{} // closed when the held turn starts

	mu      sync.Mutex
	history map[string][]string // message id → the texts of the history its turn saw
}

func newBlockOn(id string) *blockOn {
	return &blockOn{id: id, release: make(chan struct{}), started: make(chan struct{}), history: map[string][]string{}}
}

func (b *blockOn) Run(ctx context.Context, req *agents.Request) (*agents.Response, error) {
	var h []string
	for _, m := range req.History {
		h = append(h, m.Text)
	}
	b.mu.Lock()
	b.history[req.Identity.MessageID] = h
	b.mu.Unlock()
	if req.Identity.MessageID == b.id {
		close(b.started)
		select {
		case <-b.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &agents.Response{Text: "re " + req.Messages[0].Text}, nil
}

func (b *blockOn) historyOf(id string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.history[id]
}

// TestDailyResetWaitsForTheSessionsWork: a daily boundary that passes while a turn runs and a
// message waits does not end the session under them when the next message arrives. All three
// messages are answered in the session they were sent to, each turn sees the one before, and
// the session is reset (at the boundary it passed) once its work is done.
func TestDailyResetWaitsForTheSessionsWork(t *testing.T) {
	clk := testutil.NewClock(time.Date(2026, 11, 10, 3, 58, 0, 0, time.UTC))
	agent := newBlockOn("m1")
	r := startClocked(t, t.TempDir(), clk, agent, func(c *config.Config) {
		c.Sessions.Reset.Mode, c.Sessions.Reset.AtHour = "daily", 4
	})
	defer r.stop(t)
	a1 := r.inject(t, dm, "m1", "one")
	<-agent.started
	r.inject(t, dm, "m2", "two")
	clk.Advance(3 * time.Minute) // 04:01: the boundary has passed
	a3 := r.inject(t, dm, "m3", "three")
	if a3.SessionID != a1.SessionID || a3.Disposition != platforms.Queued {
		t.Errorf("m3 after the boundary while the session works: %s in %s, want queued in %s", a3.Disposition, a3.SessionID, a1.SessionID)
	}
	close(agent.release)
	r.waitReplyTo(t, "m3")
	if h := agent.historyOf("m3"); len(h) < 4 || h[len(h)-1] != "re two" {
		t.Errorf("m3's turn saw the history %q, want it to end with the answers to m1 and m2", h)
	}
	msgs, err := r.d.store.Transcript(t.Context(), a1.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, m := range msgs {
		rows = append(rows, m.Role+":"+m.Content)
	}
	want := []string{"user:one", "user:two", "user:three", "assistant:re one", "assistant:re two", "assistant:re three"} // by seq: arrival
	if fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Errorf("the session's transcript is %q, want %q", rows, want)
	}

	waitUntil(t, func() bool { return r.session(t, a1.SessionID).EndReason == persistence.EndDaily })
	if s := r.session(t, a1.SessionID); !s.EndedAt.Equal(time.Date(2026, 11, 10, 4, 0, 0, 0, time.UTC)) {
		t.Errorf("the session ended at %v, want at the boundary it passed, 04:00", s.EndedAt)
	}
	a4 := r.inject(t, dm, "m4", "four")
	if a4.SessionID == a1.SessionID {
		t.Errorf("m4, after the reset, is in the old session %s", a4.SessionID)
	}
}

// TestNewAnswersTheMessagesItDrops: /new cancels the running turn and drops the waiting
// messages, and its answer says so and answers them too, so no sender waits in vain: their
// rows are marked failed, not left pending.
func TestNewAnswersTheMessagesItDrops(t *testing.T) {
	agent := newBlockOn("a1")
	r := MustStart(t, agent, nil)
	th := func(user string) identity.Source {
		return identity.Source{Platform: "fake", ChatType: identity.ChatThread, ChatID: "chan", ThreadID: "th", UserID: user, UserName: user}
	}
	a1 := r.inject(t, th("alice"), "a1", "long task")
	<-agent.started
	r.inject(t, th("alice"), "a2", "and then this")
	r.inject(t, th("bob"), "b1", "/new")
	r.waitReplyTo(t, "b1")
	var answer *platforms.Outbound
	for _, o := range r.fake.Sent() {
		if slices.Contains(o.InReplyTo, "b1") {
			answer = o
		}
	}
	if !strings.Contains(answer.Text, "2 message(s) sent before it were not answered") {
		t.Errorf("/new answered %q, want it to say 2 messages were not answered", answer.Text)
	}
	if got := fmt.Sprint(answer.InReplyTo); got != "[a1 a2 b1]" {
		t.Errorf("/new's answer is in reply to %s, want [a1 a2 b1]", got)
	}
	msgs, err := r.d.store.Transcript(t.Context(), a1.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if m.Role == persistence.RoleUser && m.Status != persistence.StatusFailed {
			t.Errorf("dropped message %s has status %s, want failed", m.MessageID, m.Status)
		}
	}
}

// TestDuplicateFirstAfterResetKeepsTheLink: after an idle reset, the first message to reach the
// session is a re-delivery of one already stored (a platform's replay), whose write is refused.
// The successor the chat's next message starts still records the reset: its prev_session_id,
// the notice to the user and the agent's continuity note.
func TestDuplicateFirstAfterResetKeepsTheLink(t *testing.T) {
	dir := t.TempDir()
	clk := testutil.NewClock(t0)
	r := startClocked(t, dir, clk, &recorder{}, idleHour)
	a1 := r.inject(t, dm, "m1", "hello")
	r.waitSent(t, 1)
	r.stop(t)

	clk.Advance(2 * time.Hour)
	agent := &recorder{}
	r = startClocked(t, dir, clk, agent, idleHour)
	defer r.stop(t)
	if dup := r.inject(t, dm, "m1", "hello"); dup == nil || dup.Disposition != platforms.Duplicate {
		t.Fatalf("m1 again: %+v, want duplicate", dup)
	}
	a2 := r.inject(t, dm, "m2", "back again")
	r.waitReplyTo(t, "m2")
	notified := false
	for _, o := range r.fake.Sent() {
		notified = notified || o.Kind == platforms.KindNotice && strings.Contains(o.Text, "reset automatically")
	}
	succ := r.session(t, a2.SessionID)
	if succ.PrevSessionID != a1.SessionID || !notified || len(agent.last().Notes) == 0 {
		t.Errorf("the successor %s lost its reset: prev_session_id %q (want %s), notice sent %v, notes %q",
			a2.SessionID, succ.PrevSessionID, a1.SessionID, notified, agent.last().Notes)
	}
}

// TestMessageIDOfAnotherConversationIsAConflict: in a group, where each user has a session of
// their own, a message that reuses the id of another user's message is refused as a conflict,
// not answered "duplicate" (it is no re-delivery, and the other's replies are not its sender's);
// it is not stored, and sent again with its own id it is taken. The same user's repeat is still
// a duplicate.
func TestMessageIDOfAnotherConversationIsAConflict(t *testing.T) {
	r := MustStart(t, echo.New(), nil)
	alice := identity.Source{Platform: "fake", ChatType: identity.ChatGroup, ChatID: "room", UserID: "alice"}
	bob := alice
	bob.UserID = "bob"
	r.inject(t, alice, "id-1", "hello from alice")
	r.waitReplyTo(t, "id-1")
	if dup := r.inject(t, alice, "id-1", "hello from alice"); dup == nil || dup.Disposition != platforms.Duplicate {
		t.Errorf("alice's repeat: %+v, want duplicate", dup)
	}
	_, err := r.fake.Inject(t.Context(), &platforms.Inbound{Source: bob, MessageID: "id-1", Text: "hello from bob"})
	if !errors.Is(err, platforms.ErrConflict) {
		t.Fatalf("bob's message with alice's id: %v, want ErrConflict", err)
	}
	if ack := r.inject(t, bob, "id-2", "hello from bob"); ack == nil || ack.Disposition != platforms.Started {
		t.Errorf("bob's message with its own id: %+v, want started", ack)
	}
}

// stallThenRefuse is a store whose first commit of a batch holding message id stalls until
// release is closed and then refuses that message's group for good. A later commit of id (a
// write of a repeat of its own) goes to the store it wraps: it is counted in commits, and its
// message is stored, so that a repeat given a fresh outcome is told "started", not the refusal.
type stallThenRefuse struct {
	persistence.Store
	id      string
	stalled chan struct{} // closed when the commit stalls
	release chan struct{}
	commits atomic.Int32 // commits of a batch holding id
}

func (s *stallThenRefuse) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	hit := -1
	for i, g := range groups {
		for _, op := range g {
			if a, ok := op.(*persistence.AppendMessage); ok && a.Message.MessageID == s.id {
				hit = i
			}
		}
	}
	if hit < 0 || s.commits.Add(1) > 1 {
		return s.Store.Commit(ctx, groups)
	}
	close(s.stalled)
	<-s.release
	errs := make([]error, len(groups))
	for i := range errs {
		errs[i] = errors.New("constraint failed (test)")
	}
	return errs
}

// TestRepeatWhileTheWriteIsInFlightGetsItsOutcome: a message sent again with its id while its
// first write is still in flight (a client's retry after a timeout, the cluster router's) is
// not answered "duplicate" at once: that write may fail, and the repeat would acknowledge a
// message nobody stored. It gets the first write's outcome, and makes no write of its own.
//
// The repeat is the Deliver the intake sends (Intake.Deliver), sent through the session manager
// as the intake's router does, from a probe actor, and a GetState follows it from the probe
// the same way. The manager and the session take them in that order, and the probe gets the
// session's answers in the order the session sent them, so GetState's answer coming first
// proves that the repeat reached the session while the write was in flight and was not
// answered then; a repeat that never reaches it gets no answer, and the test fails. Before, the repeat came
// through the fake platform and the test looked for an answer for a second: a repeat that
// reached the session only after the write was refused passed it too.
func TestRepeatWhileTheWriteIsInFlightGetsItsOutcome(t *testing.T) {
	st := &stallThenRefuse{id: "m1", stalled: make(chan struct{}), release: make(chan struct{})}
	r := MustStartDaemon(t, echo.New(), daemonOpts{wrap: func(s persistence.Store) persistence.Store { st.Store = s; return st }})
	defer r.stop(t)
	release := sync.OnceFunc(func() { close(st.release) })
	defer release() // before the stop, when the test fails with the write stalled
	first := make(chan error, 1)
	go func() {
		_, err := r.fake.Inject(t.Context(), &platforms.Inbound{Source: dm, MessageID: "m1", Text: "hello"})
		first <- err
	}()
	<-st.stalled

	answers := make(chan any, 2)
	probe := r.d.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch m := c.Message().(type) {
		case *actors.SessionState, *actors.DeliverResult:
			answers <- m
		}
	}))
	defer r.d.system.Root.Stop(probe)
	key := r.d.intake.Key(dm)
	repeat := &actors.Deliver{SessionKey: key, MessageId: "m1", Text: "hello", ReceivedAtUnixNano: time.Now().UnixNano(),
		Source: &actors.Source{Platform: dm.Platform, ChatType: dm.ChatType, ChatId: dm.ChatID, UserId: dm.UserID}}
	r.d.system.Root.RequestWithCustomSender(r.d.manager, &actors.Routed{Key: key, Msg: repeat}, probe)
	r.d.system.Root.RequestWithCustomSender(r.d.manager, &actors.Routed{Key: key, Msg: &actors.GetState{}}, probe)
	answer := func(what string) any {
		t.Helper()
		select {
		case a := <-answers:
			return a
		case <-time.After(30 * time.Second): // a deadline for a failure, not a wait for the effect
			t.Fatalf("no answer to %s", what)
			return nil
		}
	}
	if a := answer("the repeat or the GetState behind it"); fmt.Sprintf("%T", a) != "*actors.SessionState" {
		t.Fatalf("the repeat was answered while the first write was in flight: %+v", a)
	}

	release()
	if err := <-first; !errors.Is(err, platforms.ErrUnavailable) {
		t.Errorf("the first: %v, want ErrUnavailable", err)
	}
	if a, ok := answer("the repeat").(*actors.DeliverResult); !ok || a.ErrorCode != actors.ErrCodeUnavailable {
		t.Errorf("the repeat: %+v, want the first's refusal (error_code %q)", a, actors.ErrCodeUnavailable)
	}
	if n := st.commits.Load(); n != 1 {
		t.Errorf("commits of m1: %d, want 1 (the repeat writes nothing of its own)", n)
	}
}

// refuseFirstResult is a store that refuses, once, the group recording a turn's result.
type refuseFirstResult struct {
	persistence.Store
	refused atomic.Bool
}

func (s *refuseFirstResult) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	for i, g := range groups {
		for _, op := range g {
			if a, ok := op.(*persistence.AddOutbox); ok && a.Entry.Kind == platforms.KindReply && s.refused.CompareAndSwap(false, true) {
				errs := s.Store.Commit(ctx, append(slices.Clone(groups[:i]), groups[i+1:]...))
				return slices.Insert(errs, i, error(errors.New("constraint failed (test)")))
			}
		}
	}
	return s.Store.Commit(ctx, groups)
}

// TestUnstoredTurnResultIsNotSent: a turn whose result could not be stored sends no reply: its
// message is still pending and runs again, and the chat gets one answer, the stored one.
func TestUnstoredTurnResultIsNotSent(t *testing.T) {
	var runs atomic.Int32
	agent := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
		return &agents.Response{Text: fmt.Sprint("answer ", runs.Add(1))}, nil
	})
	st := &refuseFirstResult{}
	r := MustStartDaemon(t, agent, daemonOpts{wrap: func(s persistence.Store) persistence.Store { st.Store = s; return st }})
	defer r.stop(t)
	ack := r.inject(t, dm, "m1", "hello")
	r.waitReplyTo(t, "m1")
	waitUntil(t, func() bool { // the reply's delivery mark: the turn is over
		snap, err := r.d.store.LoadSession(t.Context(), ack.SessionKey, 0, 0)
		return err == nil && len(snap.Unconfirmed) == 0 && len(snap.Pending) == 0
	})
	var got []string
	for _, o := range r.fake.Sent() {
		got = append(got, o.Text)
	}
	if fmt.Sprint(got) != "[answer 2]" {
		t.Errorf("replies %q, want only the stored answer of the second run", got)
	}
}
