package actors

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
)

// requeueAgent is an agent whose turns of "boom" panic while poisoned (a message that crashes
// its session), whose turns of "hold" wait until hold is closed, and which records every turn's
// message id and identity in order.
type requeueAgent struct {
	poisoned atomic.Bool
	holdAll  atomic.Bool // every turn waits for hold
	hold     chan struct{}
	mu       sync.Mutex
	ran      []identity.Turn
	history  map[string][]agents.Message // each turn's history, by its message id
}

func newRequeueAgent() *requeueAgent {
	return &requeueAgent{hold: make(chan struct{}), history: map[string][]agents.Message{}}
}

func (a *requeueAgent) Run(ctx context.Context, req *agents.Request) (*agents.Response, error) {
	text := req.Messages[len(req.Messages)-1].Text
	if text == "boom" && a.poisoned.Load() {
		panic("agent bug on " + req.Identity.MessageID)
	}
	a.mu.Lock()
	a.ran = append(a.ran, req.Identity)
	a.history[req.Identity.MessageID] = req.History
	a.mu.Unlock()
	if text == "hold" || a.holdAll.Load() {
		select {
		case <-a.hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &agents.Response{Text: "answered " + req.Identity.MessageID}, nil
}

// order is the message ids of the turns run so far.
func (a *requeueAgent) order() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []string
	for _, id := range a.ran {
		ids = append(ids, id.MessageID)
	}
	return ids
}

func (a *requeueAgent) identityOf(id string) (identity.Turn, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	i := slices.IndexFunc(a.ran, func(t identity.Turn) bool { return t.MessageID == id })
	if i < 0 {
		return identity.Turn{}, false
	}
	return a.ran[i], true
}

// requeue asks the world's session to requeue id, as the admin API does.
func (w *managerWorld) requeue(t *testing.T, id string) *RequeueResult {
	t.Helper()
	res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &RequeueMessage{MessageId: id}}, time.Hour).Result()
	if err != nil {
		t.Fatalf("requeue %s: %v", id, err)
	}
	return res.(*RequeueResult)
}

// statusOf is the stored status and seq of the world's inbound message id.
func (w *managerWorld) statusOf(t *testing.T, id string) (string, int64) {
	t.Helper()
	m, err := w.store.FindInbound(w.ctx, w.src.Platform, w.src.ChatID, id)
	if err != nil {
		t.Fatalf("FindInbound(%s): %v", id, err)
	}
	return m.Status, m.Seq
}

// quarantine delivers id ("boom") to a poisoned agent until it is quarantined.
func (w *managerWorld) quarantine(t *testing.T, a *requeueAgent, id string) {
	t.Helper()
	a.poisoned.Store(true)
	if r := w.deliver(t, id, "boom"); r.ErrorCode != "" {
		t.Fatalf("deliver %s: %+v", id, r)
	}
	synctest.Wait()
	if st, _ := w.statusOf(t, id); st != persistence.StatusQuarantined {
		t.Fatalf("status of %s after crashing its session %d times = %q, want quarantined", id, QuarantineAfter, st)
	}
}

// TestRequeueRunsAQuarantinedMessage: an operator's requeue of a message quarantined after
// crashing its session runs it again, at the end of the queue (behind the messages already
// waiting), as a turn of its original sender; its reply answers it and it ends done. A second
// requeue of it is refused while it is pending and once it is done, and so are messages that
// are not quarantined or not there.
func TestRequeueRunsAQuarantinedMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		w := newManagerWorld(t, a, nil)
		w.src.UserName = "Ann"
		w.quarantine(t, a, "m1")
		a.poisoned.Store(false) // the cause went away (it was the OOM killer's, say)

		if r := w.deliver(t, "m2", "hold"); r.Disposition != "started" {
			t.Fatalf("m2: %+v, want started", r)
		}
		if r := w.deliver(t, "m3", "three"); r.Disposition != "queued" {
			t.Fatalf("m3: %+v, want queued", r)
		}
		r := w.requeue(t, "m1")
		if r.ErrorCode != "" || r.Disposition != "queued" || r.QueueDepth != 2 || r.SessionId == "" {
			t.Fatalf("requeue m1 = %+v, want queued behind m3 (queue depth 2)", r)
		}
		if st, seq := w.statusOf(t, "m1"); st != persistence.StatusPending || seq <= 3 {
			t.Errorf("m1 after the requeue: status %q seq %d, want pending after m3", st, seq)
		}
		if again := w.requeue(t, "m1"); again.ErrorCode != ErrCodeNotQuarantined || again.Status != persistence.StatusPending {
			t.Errorf("second requeue while pending = %+v, want not_quarantined (pending)", again)
		}
		for len(w.sent) > 0 {
			<-w.sent // the quarantine notice
		}
		close(a.hold)
		w.awaitTurnEnds(3)
		synctest.Wait()

		if got, want := a.order()[len(a.order())-3:], []string{"m2", "m3", "m1"}; !slices.Equal(got, want) {
			t.Errorf("turns ran %v, want the requeued m1 last: %v", a.order(), want)
		}
		id, _ := a.identityOf("m1")
		if id.UserID != "u1" || id.UserName != "Ann" || id.ChatID != "c1" || id.SessionKey != w.key {
			t.Errorf("requeued m1 ran as %+v, want its sender u1 (Ann) of chat c1", id)
		}
		if st, _ := w.statusOf(t, "m1"); st != persistence.StatusDone {
			t.Errorf("m1 after its turn: %q, want done", st)
		}
		// The history its turn is given does not hold it a second time: a quarantined message
		// is no part of the conversation (the store leaves it out of a session's history).
		a.mu.Lock()
		hist := a.history["m1"]
		a.mu.Unlock()
		if slices.ContainsFunc(hist, func(m agents.Message) bool { return strings.Contains(m.Text, "boom") }) {
			t.Errorf("the requeued m1's turn got itself in its history: %+v", hist)
		}
		replies, err := w.store.RepliesTo(w.ctx, w.key, "m1", 0)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(replies, func(e persistence.OutboxEntry) bool { return e.Text == "answered m1" }) {
			t.Errorf("replies to m1: %+v, want its answer", replies)
		}
		// Past the outbox seq the requeue reported (where a cluster member's ?wait reads), the
		// run's answer alone: not the quarantine notice that answered m1 before.
		after, err := w.store.RepliesTo(w.ctx, w.key, "m1", r.OutboxAfter)
		if err != nil {
			t.Fatal(err)
		}
		if len(replies) < 2 || len(after) != 1 || after[0].Text != "answered m1" {
			t.Errorf("replies to m1 after the requeue's outbox seq %d: %+v, want its new answer alone (of %+v)", r.OutboxAfter, after, replies)
		}
		if n := testutil.ToFloat64(w.d.Metrics.MessagesRequeued); n != 1 {
			t.Errorf("agentgate_messages_requeued_total = %v, want 1", n)
		}

		route, err := w.store.Route(w.ctx, w.key)
		if err != nil {
			t.Fatal(err)
		}
		// A message not there is refused naming the key as a key, and the session looked in
		// (before: "no message nope in session KEY").
		notThere := func(id string) string {
			return "key " + w.key + " has no message " + id + ": not in its current session " + route.SessionID + ", nor in an ended one still stored"
		}
		refusals := []struct {
			id, code, status, msg string
		}{
			{"m1", ErrCodeNotQuarantined, persistence.StatusDone, ""}, // ran once; not again
			{"m3", ErrCodeNotQuarantined, persistence.StatusDone, ""},
			{"nope", ErrCodeNotFound, "", notThere("nope")},
			{"", ErrCodeNotFound, "", notThere("")},
		}
		for _, tc := range refusals {
			if r := w.requeue(t, tc.id); r.ErrorCode != tc.code || r.Status != tc.status || r.Error == "" || tc.msg != "" && r.Error != tc.msg {
				t.Errorf("requeue %q = %+v, want %s (status %q) with a message %q", tc.id, r, tc.code, tc.status, tc.msg)
			}
		}
		if n := len(slices.DeleteFunc(a.order(), func(id string) bool { return id != "m1" })); n != 1 {
			t.Errorf("m1 ran %d times after its requeue, want once", n)
		}
	})
}

// TestRequeuedMessageThatCrashesAgainIsQuarantinedAgain: a requeued message counts its crashes
// from zero and is quarantined again after QuarantineAfter more; the session goes on.
func TestRequeuedMessageThatCrashesAgainIsQuarantinedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		w := newManagerWorld(t, a, nil)
		w.quarantine(t, a, "m1")
		if r := w.requeue(t, "m1"); r.ErrorCode != "" {
			t.Fatalf("requeue m1 = %+v", r)
		}
		time.Sleep(time.Minute) // past the restart budget's window and the crash pause
		synctest.Wait()
		if st, _ := w.statusOf(t, "m1"); st != persistence.StatusQuarantined {
			t.Fatalf("requeued m1, still poison: %q, want quarantined again", st)
		}
		if n := testutil.ToFloat64(w.d.Metrics.MessagesQuarantined.WithLabelValues("session_crash")); n != 2 {
			t.Errorf("agentgate_messages_quarantined_total{cause=session_crash} = %v, want 2", n)
		}
		notices := map[int64]bool{} // by outbox seq: this world's platform confirms nothing, so a reload sends again
		for len(w.sent) > 0 {
			if m := <-w.sent; strings.Contains(m.Out.Text, "quarantined") && slices.Contains(m.Out.InReplyTo, "m1") {
				notices[m.Out.Seq] = true
			}
		}
		if len(notices) != 2 {
			t.Errorf("quarantine notices for m1: %d, want 2 (one per quarantine)", len(notices))
		}
		a.poisoned.Store(false)
		if r := w.requeue(t, "m1"); r.ErrorCode != "" {
			t.Fatalf("requeue m1 again = %+v", r)
		}
		w.awaitTurnEnds(1)
		synctest.Wait()
		if st, _ := w.statusOf(t, "m1"); st != persistence.StatusDone {
			t.Errorf("m1 requeued a second time, cured: %q, want done", st)
		}
	})
}

// TestRequeueOfAnEndedSessionsMessageIsRefused: a quarantined message of a session that has
// ended (/new) belongs to a conversation that is gone; it is not run in the new one.
func TestRequeueOfAnEndedSessionsMessageIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		w := newManagerWorld(t, a, nil)
		w.quarantine(t, a, "m1")
		if r := w.deliver(t, "n1", "/new"); r.ErrorCode != "" {
			t.Fatalf("/new: %+v", r)
		}
		synctest.Wait()
		r := w.requeue(t, "m1")
		if r.ErrorCode != ErrCodeSessionEnded || !strings.Contains(r.Error, "send it again") {
			t.Errorf("requeue of the ended session's m1 = %+v, want session_ended saying its sender may send it again", r)
		}
		if st, _ := w.statusOf(t, "m1"); st != persistence.StatusQuarantined {
			t.Errorf("m1: %q, want still quarantined", st)
		}
	})
}

// TestRequeueOfADroppedMessageSaysItNeverRan: a message /stop dropped unrun (queued behind the
// turn it cancelled) is stored failed and archived, with no turn. Its requeue is refused as
// not quarantined, saying the message never ran and was dropped or answered with a notice.
// Before, the answer said it was taken back by /undo or /retry, which nobody had sent.
func TestRequeueOfADroppedMessageSaysItNeverRan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		w := newManagerWorld(t, a, nil)
		w.deliver(t, "m1", "hold")
		if r := w.deliver(t, "m2", "queued"); r.Disposition != "queued" {
			t.Fatalf("m2 = %+v, want queued behind m1", r)
		}
		mustCommand(t, w, "s1", "/stop")
		m2, err := w.store.FindInbound(w.ctx, w.src.Platform, w.src.ChatID, "m2")
		if err != nil {
			t.Fatal(err)
		}
		if m2.Status != persistence.StatusFailed || m2.Active || m2.TurnID != "" {
			t.Fatalf("m2 after /stop: %s, active %t, turn %q; want failed, archived, no turn: the test does not test", m2.Status, m2.Active, m2.TurnID)
		}
		r := w.requeue(t, "m2")
		if r.ErrorCode != ErrCodeNotQuarantined || !strings.Contains(r.Error, "dropped unrun") || strings.Contains(r.Error, "taken back") {
			t.Errorf("requeue of m2, dropped by /stop = %+v, want not_quarantined saying it was dropped unrun", r)
		}
	})
}

// TestRequeueSurvivesARestartInItsOrder: a requeue is durable once answered, and the restarted
// daemon runs the messages in the order the session had queued them: the ones waiting before
// the requeue first, the requeued message last, once. (A requeue that kept the message's seq
// would load it first.)
func TestRequeueSurvivesARestartInItsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		a := newRequeueAgent()
		w := newManagerWorldAt(t, path, a, nil)
		w.quarantine(t, a, "m1")
		a.poisoned.Store(false)
		w.deliver(t, "m2", "hold")
		w.deliver(t, "m3", "three")
		if r := w.requeue(t, "m1"); r.ErrorCode != "" || r.QueueDepth != 2 {
			t.Fatalf("requeue m1 = %+v, want queued behind m3", r)
		}
		w.stop() // m2's turn is cut short; m2, m3 and m1 are pending in the store
		synctest.Wait()

		b := newRequeueAgent()
		close(b.hold)
		w2 := newManagerWorldAt(t, path, b, nil)
		w2.awaitTurnEnds(3)
		synctest.Wait()
		if got, want := b.order(), []string{"m2", "m3", "m1"}; !slices.Equal(got, want) {
			t.Errorf("after the restart the turns ran %v, want %v", got, want)
		}
		for _, id := range []string{"m1", "m2", "m3"} {
			if st, _ := w2.statusOf(t, id); st != persistence.StatusDone {
				t.Errorf("%s after the restart: %q, want done", id, st)
			}
		}
	})
}

// TestRequeueClearsTheStrikes: a message quarantined after unclean stops of the daemon
// (Message.Attempts at QuarantineAfter) and requeued starts from zero strikes: when the daemon
// stops while it runs, the next start runs it again instead of setting it aside at once.
func TestRequeueClearsTheStrikes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		a := newRequeueAgent()
		w := newManagerWorldAt(t, path, a, nil)
		w.quarantine(t, a, "m1")
		a.poisoned.Store(false)
		m1, err := w.store.FindInbound(w.ctx, w.src.Platform, w.src.ChatID, "m1")
		if err != nil {
			t.Fatal(err)
		}
		// As Store.BeginRun counts unclean stops against a head.
		if errs := w.store.Commit(w.ctx, [][]persistence.Op{{&persistence.SetAttempts{SessionID: m1.SessionID,
			Seq: m1.Seq, Attempts: QuarantineAfter}}}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		a.holdAll.Store(true)
		if r := w.requeue(t, "m1"); r.ErrorCode != "" || r.Disposition != "started" {
			t.Fatalf("requeue m1 = %+v, want started", r)
		}
		w.stop() // its turn is cut short: m1 is the head of the pending queue
		synctest.Wait()

		b := newRequeueAgent()
		w2 := newManagerWorldAt(t, path, b, nil)
		time.Sleep(time.Minute)
		synctest.Wait()
		if st, _ := w2.statusOf(t, "m1"); st != persistence.StatusDone || !slices.Equal(b.order(), []string{"m1"}) {
			t.Errorf("requeued m1 after a restart: %q, ran %v; want done, run once", st, b.order())
		}
	})
}

// TestRequeueAfterAReloadRunsTheMessageOnce: an operator requeues hours after the quarantine,
// when the session has been loaded from the store again (a restart, a passivation). The store
// gives a reloaded session the quarantined message in its history, where it was sent; once it
// is requeued it is the turn's own message, at the end of the transcript, and its turn's history
// does not hold it a second time.
func TestRequeueAfterAReloadRunsTheMessageOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		a := newRequeueAgent()
		w := newManagerWorldAt(t, path, a, nil)
		w.quarantine(t, a, "m1")
		w.stop()
		synctest.Wait()

		b := newRequeueAgent()
		close(b.hold)
		w2 := newManagerWorldAt(t, path, b, nil)
		w2.deliver(t, "m2", "two") // loads the session: m1 is in its history
		w2.awaitTurnEnds(1)
		if r := w2.requeue(t, "m1"); r.ErrorCode != "" {
			t.Fatalf("requeue m1 = %+v", r)
		}
		w2.awaitTurnEnds(1)
		synctest.Wait()
		b.mu.Lock()
		hist := b.history["m1"]
		b.mu.Unlock()
		if n := len(slices.DeleteFunc(slices.Clone(hist), func(m agents.Message) bool { return m.Text != "boom" })); n != 0 {
			t.Errorf("the requeued m1's turn got it %d more times in its history: %+v", n, hist)
		}
		if st, _ := w2.statusOf(t, "m1"); st != persistence.StatusDone {
			t.Errorf("m1: %q, want done", st)
		}
	})
}

// TestPrunedRouteRequeueAnswersAsEarlierMembersKnow: a requeue of a key whose route names a
// session that is no longer stored (pruned after it ended) is refused not_found, with the text
// an earlier version gave, and no session: the codes a member of an earlier version knows, which
// it passes on as a 404 when the request came to it during a rolling upgrade, and the text
// agentgate sessions requeue reads as a key with no session. The member's API answers it
// no_session itself once it has read the store (sessionsAPI.Requeue). Before, the session
// answered no_session, which an earlier member failed as an internal error (500), and the CLI
// read as an answer lost ("it may have requeued the message").
func TestPrunedRouteRequeueAnswersAsEarlierMembersKnow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1", UserID: "u1"}
		key := identity.Key(src, identity.KeyOptions{})
		store, err := sqlite.Open(t.Context(), path, sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		route := &persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: "s-pruned", Generation: 1, UpdatedAt: time.Now()}}
		if errs := store.Commit(t.Context(), [][]persistence.Op{{route}}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		if err := store.Close(); err != nil {
			t.Fatal(err)
		}
		w := newManagerWorldAt(t, path, newRequeueAgent(), nil)
		if w.key != key {
			t.Fatalf("the world's key is %s, the route's %s", w.key, key)
		}
		want := &RequeueResult{MessageId: "q1", ErrorCode: ErrCodeNotFound, Error: "key " + key + " has no message q1: it holds no stored session"}
		if r := w.requeue(t, "q1"); !proto.Equal(r, want) {
			t.Errorf("requeue q1 of a key routed to a pruned session = %v, want %v", r, want)
		}
	})
}
