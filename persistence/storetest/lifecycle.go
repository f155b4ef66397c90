package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/persistence"
)

// Tests of the session lifecycle beyond one incarnation: the incarnations of a key (/resume,
// export), the durable reset timer (IdleSessions), /resume (ReopenSession), idempotent crash
// counts (SetAttempts) and retention (PruneSessions).

// sessionIDs returns the ids of sessions, in order.
func sessionIDs(ss []persistence.Session) []string {
	var ids []string
	for _, s := range ss {
		ids = append(ids, s.ID)
	}
	return ids
}

// ended returns a session of key that started at start and ended at end with a boundary.
func ended(id, key string, start, end int) persistence.Session {
	ss := newSession(id, key)
	ss.StartedAt, ss.LastActivityAt = at(start), at(start)
	ss.EndedAt, ss.EndReason = at(end), persistence.EndNewCommand
	return ss
}

func testSessionsOfKey(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	mk := func(id, key string, start int) persistence.Session {
		ss := newSession(id, key)
		ss.StartedAt = at(start)
		return ss
	}
	noStart := mk("k-nostart", "k", 0)
	noStart.StartedAt = time.Time{} // unknown: sorts as the oldest
	sessions := []persistence.Session{
		mk("k-a", "k", 10),
		ended("k-b", "k", 30, 35),
		mk("k-c", "k", 20),
		noStart,
		mk("k-e", "k", 30), // same start as k-b: ties by id
		mk("k2-a", "k2", 40),
		mk("other", "K", 50),
		mk("pct", "k%", 60),
	}
	var ops []persistence.Op
	for _, ss := range sessions {
		ops = append(ops, &persistence.CreateSession{Session: ss})
	}
	ops = append(ops, &persistence.PutRoute{Route: route("k", "k-e", 1)})
	MustCommit(t, s, ops...)

	byID := make(map[string]persistence.Session)
	for _, ss := range sessions {
		byID[ss.ID] = ss
	}
	tests := []struct {
		name  string
		key   string
		limit int
		want  []string
	}{
		{"newest started first", "k", 0, []string{"k-b", "k-e", "k-c", "k-a", "k-nostart"}},
		{"limit", "k", 2, []string{"k-b", "k-e"}},
		{"limit above count", "k", 50, []string{"k-b", "k-e", "k-c", "k-a", "k-nostart"}},
		{"other key", "k2", 0, []string{"k2-a"}},
		{"key is matched exactly, not by case", "K", 0, []string{"other"}},
		{"key is matched exactly, not as a pattern", "k%", 0, []string{"pct"}},
		{"unknown key", "never-seen", 0, nil},
		{"empty key", "", 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := check(s.SessionsOfKey(ctx, tc.key, tc.limit)).must(t, "SessionsOfKey")
			var want []persistence.Session
			for _, id := range tc.want {
				want = append(want, byID[id])
			}
			diff(t, fmt.Sprintf("SessionsOfKey(%q, %d)", tc.key, tc.limit), got, want)
		})
	}

	t.Run("default limit is 100", func(t *testing.T) {
		var ops []persistence.Op
		for i := range persistence.DefaultSessionsOfKeyLimit + 1 {
			ops = append(ops, &persistence.CreateSession{Session: mk(fmt.Sprintf("many-%03d", i), "many", i)})
		}
		MustCommit(t, s, ops...)
		got := check(s.SessionsOfKey(ctx, "many", 0)).must(t, "SessionsOfKey")
		if len(got) != persistence.DefaultSessionsOfKeyLimit {
			t.Fatalf("SessionsOfKey(many, 0) = %d sessions, want %d", len(got), persistence.DefaultSessionsOfKeyLimit)
		}
		if first, last := got[0].ID, got[len(got)-1].ID; first != "many-100" || last != "many-001" {
			t.Errorf("SessionsOfKey(many, 0) runs from %s to %s, want many-100 to many-001", first, last)
		}
	})
}

func testIdleSessions(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	// routed creates a session of its own key, routed to it, last active at sec (zero time
	// when sec < 0).
	routed := func(id string, sec int) []persistence.Op {
		ss := newSession(id, "key-"+id)
		ss.LastActivityAt = at(sec)
		if sec < 0 {
			ss.LastActivityAt = time.Time{}
		}
		return []persistence.Op{
			&persistence.CreateSession{Session: ss},
			&persistence.PutRoute{Route: route(ss.Key, id, 1)},
		}
	}
	var ops []persistence.Op
	for _, r := range []struct {
		id  string
		sec int
	}{
		{"old", 10}, {"older", 5}, {"no-activity", -1}, {"recent", 200}, {"at-cutoff", 100},
		{"ended", 10}, {"also-old", 10},
	} {
		ops = append(ops, routed(r.id, r.sec)...)
	}
	ops = append(ops, &persistence.EndSession{SessionID: "ended", Reason: persistence.EndIdle, At: at(20)})
	// The previous incarnation of "key-old": open (say a crash lost its end) but no longer
	// routed, and idle for long.
	prev := newSession("old-prev", "key-old")
	prev.LastActivityAt = at(1)
	ops = append(ops, &persistence.CreateSession{Session: prev})
	// A route pointing at a session of another key does not make it that key's session.
	stray := newSession("stray", "key-stray")
	stray.LastActivityAt = at(1)
	ops = append(ops, &persistence.CreateSession{Session: stray},
		&persistence.PutRoute{Route: route("key-elsewhere", "stray", 1)})
	MustCommit(t, s, ops...)

	tests := []struct {
		name   string
		before time.Time
		limit  int
		want   []string
	}{
		{"oldest first, unknown activity oldest", at(100), 0, []string{"no-activity", "older", "also-old", "old"}},
		{"limit", at(100), 2, []string{"no-activity", "older"}},
		{"later cutoff", at(201), 0, []string{"no-activity", "older", "also-old", "old", "at-cutoff", "recent"}},
		{"early cutoff", at(5), 0, []string{"no-activity"}},
		{"zero cutoff", time.Time{}, 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := check(s.IdleSessions(ctx, tc.before, tc.limit)).must(t, "IdleSessions")
			diff(t, fmt.Sprintf("IdleSessions(%v, %d) ids", tc.before, tc.limit), sessionIDs(got), tc.want)
		})
	}

	t.Run("rows are complete", func(t *testing.T) {
		got := check(s.IdleSessions(ctx, at(6), 0)).must(t, "IdleSessions")
		want := newSession("older", "key-older")
		want.LastActivityAt = at(5)
		noActivity := newSession("no-activity", "key-no-activity")
		noActivity.LastActivityAt = time.Time{}
		diff(t, "IdleSessions(at(6))", got, []persistence.Session{noActivity, want})
	})

	t.Run("activity moves a session out", func(t *testing.T) {
		MustCommit(t, s, &persistence.TouchSession{SessionID: "older", At: at(150)})
		got := check(s.IdleSessions(ctx, at(100), 0)).must(t, "IdleSessions")
		diff(t, "IdleSessions(at(100)) ids after touching older", sessionIDs(got), []string{"no-activity", "also-old", "old"})
	})

	t.Run("a reopened session is idle again", func(t *testing.T) {
		MustCommit(t, s, &persistence.ReopenSession{SessionID: "ended"})
		got := check(s.IdleSessions(ctx, at(100), 0)).must(t, "IdleSessions")
		diff(t, "IdleSessions(at(100)) ids after reopening ended", sessionIDs(got), []string{"no-activity", "also-old", "ended", "old"})
	})
}

func testReopenSession(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	open := start(t, s, "s1", "k1", 1)
	endedAt := func(reason string, sec int) persistence.Session {
		ss := open
		ss.EndedAt, ss.EndReason = at(sec), reason
		return ss
	}
	steps := []struct {
		name string
		op   persistence.Op
		want persistence.Session
	}{
		{"end with a boundary", &persistence.EndSession{SessionID: "s1", Reason: persistence.EndResetCommand, At: at(5)}, endedAt(persistence.EndResetCommand, 5)},
		{"reopen clears the end", &persistence.ReopenSession{SessionID: "s1"}, open},
		{"reopen again is a no-op", &persistence.ReopenSession{SessionID: "s1"}, open},
		{"the reopened session can end again", &persistence.EndSession{SessionID: "s1", Reason: persistence.EndIdle, At: at(9)}, endedAt(persistence.EndIdle, 9)},
		{"reopen after the second end", &persistence.ReopenSession{SessionID: "s1"}, open},
		{"reopening an unknown session is a no-op", &persistence.ReopenSession{SessionID: "nope"}, open},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			MustCommit(t, s, st.op)
			got := check(s.Session(ctx, "s1")).must(t, "Session")
			diff(t, "Session(s1)", got, &st.want)
		})
	}
	if _, err := s.Session(ctx, "nope"); !errors.Is(err, persistence.ErrNotFound) {
		t.Errorf("Session(nope) after ReopenSession(nope): error = %v, want ErrNotFound", err)
	}

	t.Run("resume routes back", func(t *testing.T) {
		// /resume: the key moves back to an earlier incarnation in one group.
		start(t, s, "s2", "k1", 2)
		MustCommit(t, s,
			&persistence.EndSession{SessionID: "s2", Reason: persistence.EndNewCommand, At: at(20)},
			&persistence.EndSession{SessionID: "s1", Reason: persistence.EndNewCommand, At: at(20)})
		MustCommit(t, s,
			&persistence.ReopenSession{SessionID: "s1"},
			&persistence.PutRoute{Route: route("k1", "s1", 3)})
		snap := check(s.LoadSession(ctx, "k1", 0, 0)).must(t, "LoadSession")
		if snap.Session == nil || snap.Session.ID != "s1" || !snap.Session.EndedAt.IsZero() || snap.Session.EndReason != "" {
			t.Errorf("LoadSession(k1).Session = %+v, want s1 open", snap.Session)
		}
	})
}

func testSetAttempts(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	start(t, s, "s1", "k1", 1)
	MustCommit(t, s, &persistence.AppendMessage{Message: userMsg("s1", 1, "m1", "crashy")},
		&persistence.AppendMessage{Message: userMsg("s1", 2, "m2", "bystander")})
	set := func(n int) persistence.Op { return &persistence.SetAttempts{SessionID: "s1", Seq: 1, Attempts: n} }
	steps := []struct {
		name string
		op   persistence.Op
		want int
	}{
		{"raise", set(2), 2},
		{"re-sent", set(2), 2},
		{"lower is ignored", set(1), 2},
		{"zero is ignored", set(0), 2},
		{"negative is ignored", set(-3), 2},
		{"raise again", set(3), 3},
		{"increment still counts", &persistence.IncrementAttempts{SessionID: "s1", Seqs: []int64{1}}, 4},
		{"late set after increment", set(3), 4},
		{"unknown seq is a no-op", &persistence.SetAttempts{SessionID: "s1", Seq: 99, Attempts: 7}, 4},
		{"unknown session is a no-op", &persistence.SetAttempts{SessionID: "nope", Seq: 1, Attempts: 7}, 4},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			MustCommit(t, s, st.op)
			ms := check(s.Transcript(ctx, "s1")).must(t, "Transcript")
			if len(ms) != 2 {
				t.Fatalf("Transcript(s1) = %d rows, want 2", len(ms))
			}
			if ms[0].Attempts != st.want || ms[1].Attempts != 0 {
				t.Errorf("Attempts of seqs 1, 2 = %d, %d, want %d, 0", ms[0].Attempts, ms[1].Attempts, st.want)
			}
		})
	}
	t.Run("twice in one group", func(t *testing.T) {
		MustCommit(t, s, set(6), set(5), set(6))
		m := check(s.FindInbound(ctx, "http", "chat", "m1")).must(t, "FindInbound")
		if m.Attempts != 6 {
			t.Errorf("Attempts = %d, want 6", m.Attempts)
		}
	})
}

func testLoadSessionMissingSession(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	r := route("k", "ghost", 1)
	MustCommit(t, s, &persistence.PutRoute{Route: r},
		&persistence.AddOutbox{Entry: outboxEntry("k", 3, "ghost")})
	got := check(s.LoadSession(ctx, "k", 10, 0)).must(t, "LoadSession")
	diff(t, "LoadSession(k) routed to a missing session", got, &persistence.Snapshot{
		Route:         &r,
		Unconfirmed:   []persistence.OutboxEntry{outboxEntry("k", 3, "ghost")},
		LastOutboxSeq: 3,
	})
}

// pruneFixture is a store with one session per PruneSessions rule, all ended before at(100)
// unless named otherwise.
type pruneFixture struct {
	prunable []string // deleted by PruneSessions(at(100)), oldest end first
	kept     []string
}

func setUpPrune(t *testing.T, s persistence.Store) pruneFixture {
	t.Helper()
	var ops []persistence.Op
	create := func(ss persistence.Session, more ...persistence.Op) {
		ops = append(append(ops, &persistence.CreateSession{Session: ss}), more...)
	}
	done := func(m persistence.Message) persistence.Message {
		m.Status = persistence.StatusDone
		return m
	}
	// Prunable: ended long ago, answered, delivered, not routed.
	create(ended("plain", "k", 1, 10))
	create(ended("answered", "k", 2, 20),
		&persistence.AppendMessage{Message: done(userMsg("answered", 1, "ans-1", "question"))},
		&persistence.AppendMessage{Message: replyMsg("answered", 2, "answer")},
		&persistence.AddOutbox{Entry: outboxEntry("k", 1, "answered", "ans-1")},
		&persistence.MarkDelivery{SessionKey: "k", Seq: 1, State: persistence.DeliveryDelivered, At: at(21)},
		&persistence.AddUsage{SessionID: "answered", TurnID: "turn-1", InputTokens: 30, OutputTokens: 4})
	create(ended("undone", "k", 3, 30),
		&persistence.AppendMessage{Message: userMsg("undone", 1, "undone-1", "undone, never re-run")},
		&persistence.ArchiveMessages{SessionID: "undone", Seqs: []int64{1}})
	create(ended("quarantined", "k", 4, 40),
		&persistence.AppendMessage{Message: userMsg("quarantined", 1, "q-1", "crashes")},
		&persistence.SetMessageStatus{SessionID: "quarantined", Seqs: []int64{1}, Status: persistence.StatusQuarantined})
	// Its key's last outbox entry is its own: the key's current session has not replied yet.
	create(ended("last-ended", "k-last", 1, 10),
		&persistence.AddOutbox{Entry: outboxEntry("k-last", 1, "last-ended", "last-1")},
		&persistence.AddOutbox{Entry: outboxEntry("k-last", 2, "last-ended", "last-2")},
		&persistence.MarkDelivery{SessionKey: "k-last", Seq: 1, State: persistence.DeliveryDelivered, At: at(5)},
		&persistence.MarkDelivery{SessionKey: "k-last", Seq: 2, State: persistence.DeliveryDelivered, At: at(6)})

	// Kept.
	create(ended("pending", "k", 5, 11),
		&persistence.AppendMessage{Message: userMsg("pending", 1, "p-1", "never answered")},
		&persistence.AddUsage{SessionID: "pending", TurnID: "turn-1", InputTokens: 7, OutputTokens: 1})
	create(ended("undelivered", "k", 6, 12),
		&persistence.AddOutbox{Entry: outboxEntry("k", 2, "undelivered")})
	// Pruned too: its platform refused its reply for good (failed is final). The key's last
	// entry is its own, so it stays, without its content.
	create(ended("failed-delivery", "k", 7, 13),
		&persistence.AddOutbox{Entry: outboxEntry("k", 3, "failed-delivery")},
		&persistence.MarkDelivery{SessionKey: "k", Seq: 3, State: persistence.DeliveryFailed, At: at(14)})
	create(ended("recent", "k", 8, 150))
	create(ended("at-cutoff", "k", 9, 100))
	open := newSession("open", "k")
	open.LastActivityAt = at(1)
	create(open) // open, not routed, idle for long: not ended, so never pruned
	// Pruned too: a key's last session, ended (an idle reset, say) and routed to, goes like any
	// other; its routing row stays.
	create(ended("routed-ended", "k-routed", 1, 10),
		&persistence.AppendMessage{Message: done(userMsg("routed-ended", 1, "routed-1", "said once, long ago"))},
		&persistence.PutRoute{Route: route("k-routed", "routed-ended", 1)})
	create(ended("routed-elsewhere", "k-x", 1, 10),
		&persistence.PutRoute{Route: route("k-y", "routed-elsewhere", 1)})
	current := newSession("current", "k")
	current.LastActivityAt = at(1)
	create(current,
		&persistence.PutRoute{Route: route("k", "current", 9)},
		&persistence.AppendMessage{Message: done(userMsg("current", 1, "cur-1", "hi"))})
	lastCurrent := newSession("last-current", "k-last")
	lastCurrent.LastActivityAt = at(1)
	create(lastCurrent, &persistence.PutRoute{Route: route("k-last", "last-current", 2)})
	MustCommit(t, s, ops...)
	return pruneFixture{
		prunable: []string{"plain", "last-ended", "answered", "undone", "quarantined", "failed-delivery",
			"routed-ended", "routed-elsewhere"},
		kept: []string{"pending", "undelivered", "recent", "at-cutoff", "open", "current", "last-current"},
	}
}

// sessionState is what the suite reads about one session.
type sessionState struct {
	Session    *persistence.Session
	Transcript []persistence.Message
}

func readSession(t testing.TB, s persistence.Store, id string) sessionState {
	t.Helper()
	ctx := context.Background()
	return sessionState{
		Session:    check(s.Session(ctx, id)).must(t, "Session"),
		Transcript: check(s.Transcript(ctx, id)).must(t, "Transcript"),
	}
}

func testPruneSessions(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	f := setUpPrune(t, s)
	keptBefore := make(map[string]sessionState)
	for _, id := range f.kept {
		keptBefore[id] = readSession(t, s, id)
	}
	outboxBefore := check(s.OutboxAfter(ctx, "k", 0, 0)).must(t, "OutboxAfter")

	n := check(s.PruneSessions(ctx, at(100), 0)).must(t, "PruneSessions")
	if n != len(f.prunable) {
		t.Errorf("PruneSessions(at(100), 0) = %d, want %d", n, len(f.prunable))
	}

	t.Run("pruned sessions are gone", func(t *testing.T) {
		for _, id := range f.prunable {
			if _, err := s.Session(ctx, id); !errors.Is(err, persistence.ErrNotFound) {
				t.Errorf("Session(%s) after pruning: error = %v, want ErrNotFound", id, err)
			}
			if ms := check(s.Transcript(ctx, id)).must(t, "Transcript"); len(ms) != 0 {
				t.Errorf("Transcript(%s) after pruning = %d rows, want 0", id, len(ms))
			}
		}
		for _, msgID := range []string{"ans-1", "undone-1", "q-1", "routed-1"} {
			if _, err := s.FindInbound(ctx, "http", "chat", msgID); !errors.Is(err, persistence.ErrNotFound) {
				t.Errorf("FindInbound(%s) after pruning: error = %v, want ErrNotFound", msgID, err)
			}
		}
	})
	t.Run("kept sessions are untouched", func(t *testing.T) {
		for _, id := range f.kept {
			diff(t, "state of kept session "+id, readSession(t, s, id), keptBefore[id])
		}
	})
	t.Run("pruned sessions' replies are gone, kept sessions' stay", func(t *testing.T) {
		// "answered" had k's entry 1; k's last entry (3), failed-delivery's, is kept without its
		// content, and OutboxAfter shows no pruned entry.
		diff(t, "OutboxAfter(k)", check(s.OutboxAfter(ctx, "k", 0, 0)).must(t, "OutboxAfter"), outboxBefore[1:2])
		if got := check(s.RepliesTo(ctx, "k", "ans-1", 0)).must(t, "RepliesTo"); len(got) != 0 {
			t.Errorf("RepliesTo(k, ans-1) after pruning = %+v, want none", got)
		}
	})
	t.Run("a key's last entry keeps its seq, not its content", func(t *testing.T) {
		if got := check(s.OutboxAfter(ctx, "k-last", 0, 0)).must(t, "OutboxAfter"); len(got) != 0 {
			t.Errorf("OutboxAfter(k-last) after pruning its only replying session = %+v, want none", got)
		}
		if got := check(s.RepliesTo(ctx, "k-last", "last-2", 0)).must(t, "RepliesTo"); len(got) != 0 {
			t.Errorf("RepliesTo(k-last, last-2) after pruning = %+v, want none", got)
		}
		if last := check(s.LastOutboxSeq(ctx, "k-last")).must(t, "LastOutboxSeq"); last != 2 {
			t.Errorf("LastOutboxSeq(k-last) after pruning = %d, want 2 (the id of its last event)", last)
		}
		if last := check(s.LastOutboxSeq(ctx, "k-none")).must(t, "LastOutboxSeq"); last != 0 {
			t.Errorf("LastOutboxSeq of a key without entries = %d, want 0", last)
		}
		snap := check(s.LoadSession(ctx, "k-last", 0, 0)).must(t, "LoadSession")
		if snap.LastOutboxSeq != 2 || len(snap.Unconfirmed) != 0 {
			t.Errorf("LoadSession(k-last): LastOutboxSeq %d, %d unconfirmed, want 2 (the next reply is seq 3, never a reused one), 0",
				snap.LastOutboxSeq, len(snap.Unconfirmed))
		}
	})
	t.Run("routing is never deleted", func(t *testing.T) {
		for key, want := range map[string]string{"k": "current", "k-routed": "routed-ended", "k-y": "routed-elsewhere", "k-last": "last-current"} {
			if r := check(s.Route(ctx, key)).must(t, "Route"); r.SessionID != want {
				t.Errorf("Route(%s) = %s, want %s", key, r.SessionID, want)
			}
		}
		snap := check(s.LoadSession(ctx, "k-routed", 10, 0)).must(t, "LoadSession")
		if snap.Route == nil || snap.Session != nil || len(snap.History) != 0 || len(snap.Pending) != 0 {
			t.Errorf("LoadSession(k-routed) after its session was pruned: route %+v, session %+v, %d history, %d pending; want the route alone",
				snap.Route, snap.Session, len(snap.History), len(snap.Pending))
		}
	})
	t.Run("sessions of the key", func(t *testing.T) {
		got := sessionIDs(check(s.SessionsOfKey(ctx, "k", 0)).must(t, "SessionsOfKey"))
		diff(t, "SessionsOfKey(k) ids", got, []string{"at-cutoff", "recent", "undelivered", "pending", "current", "open"})
	})
	t.Run("again prunes nothing", func(t *testing.T) {
		if n := check(s.PruneSessions(ctx, at(100), 0)).must(t, "PruneSessions"); n != 0 {
			t.Errorf("second PruneSessions(at(100), 0) = %d, want 0", n)
		}
	})
	t.Run("once answered and delivered", func(t *testing.T) {
		MustCommit(t, s,
			&persistence.SetMessageStatus{SessionID: "pending", Seqs: []int64{1}, Status: persistence.StatusDone},
			&persistence.MarkDelivery{SessionKey: "k", Seq: 2, State: persistence.DeliveryDelivered, At: at(120)})
		if n := check(s.PruneSessions(ctx, at(100), 0)).must(t, "PruneSessions"); n != 2 {
			t.Errorf("PruneSessions(at(100), 0) = %d, want 2 (pending, undelivered)", n)
		}
		got := sessionIDs(check(s.SessionsOfKey(ctx, "k", 0)).must(t, "SessionsOfKey"))
		diff(t, "SessionsOfKey(k) ids", got, []string{"at-cutoff", "recent", "current", "open"})
		if got := check(s.OutboxAfter(ctx, "k", 0, 0)).must(t, "OutboxAfter"); len(got) != 0 {
			t.Errorf("OutboxAfter(k) once undelivered's entry 2 went with it = %+v, want none", got)
		}
	})
	t.Run("a key's last session is pruned once it ended", func(t *testing.T) {
		MustCommit(t, s, &persistence.EndSession{SessionID: "current", Reason: persistence.EndShutdown, At: at(2)})
		if n := check(s.PruneSessions(ctx, at(1000), 0)).must(t, "PruneSessions"); n != 3 {
			t.Errorf("PruneSessions(at(1000), 0) = %d, want 3 (recent, at-cutoff, current)", n)
		}
		if _, err := s.Session(ctx, "current"); !errors.Is(err, persistence.ErrNotFound) {
			t.Errorf("Session(current) after it ended and was pruned: error = %v, want ErrNotFound", err)
		}
		if ms := check(s.Transcript(ctx, "current")).must(t, "Transcript"); len(ms) != 0 {
			t.Errorf("Transcript(current) after pruning = %d rows, want 0", len(ms))
		}
		if _, err := s.Session(ctx, "open"); err != nil {
			t.Errorf("Session(open) after PruneSessions(at(1000)): %v, want it kept (it never ended)", err)
		}
		// The key still routes, to a session that is gone: its next message starts a new one.
		snap := check(s.LoadSession(ctx, "k", 10, 0)).must(t, "LoadSession")
		if snap.Route == nil || snap.Route.SessionID != "current" || snap.Session != nil || len(snap.History) != 0 {
			t.Errorf("LoadSession(k) after its routed session was pruned: route %+v, session %+v, %d history rows; want the route to current, no session, no history",
				snap.Route, snap.Session, len(snap.History))
		}
	})
}

func testPruneSessionsLimit(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	var ops []persistence.Op
	for i, end := range []int{30, 10, 20, 10} {
		ops = append(ops, &persistence.CreateSession{Session: ended(fmt.Sprintf("s%d", i), "k", 1, end)})
	}
	MustCommit(t, s, ops...)
	steps := []struct {
		name      string
		limit     int
		want      int
		wantLeft  []string
		endedFrom time.Time
	}{
		{"oldest end first, ties by id", 2, 2, []string{"s0", "s2"}, at(100)},
		{"then the next", 1, 1, []string{"s0"}, at(100)},
		{"cutoff is exclusive", 5, 0, []string{"s0"}, at(30)},
		{"default limit", 0, 1, nil, at(31)},
		{"empty store", 0, 0, nil, at(1000)},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			n := check(s.PruneSessions(ctx, st.endedFrom, st.limit)).must(t, "PruneSessions")
			if n != st.want {
				t.Errorf("PruneSessions(%v, %d) = %d, want %d", st.endedFrom, st.limit, n, st.want)
			}
			got := sessionIDs(check(s.SessionsOfKey(ctx, "k", 0)).must(t, "SessionsOfKey"))
			diff(t, "sessions left", got, st.wantLeft)
		})
	}
	if n := check(s.PruneSessions(ctx, time.Time{}, 0)).must(t, "PruneSessions"); n != 0 {
		t.Errorf("PruneSessions(zero time) = %d, want 0", n)
	}
}

// testPruneSteps: PruneStep calls with a small budget delete what one PruneSessions call
// deletes, every due session whole, in steps that each delete or empty at most their budget of
// rows (each session here is smaller than the budget).
func testPruneSteps(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	var ops []persistence.Op
	for i := range 5 {
		id := fmt.Sprint("step-", i)
		ops = append(ops, &persistence.CreateSession{Session: ended(id, "k", 1, 10+i)})
		for seq := int64(1); seq <= 3; seq++ {
			m := userMsg(id, seq, fmt.Sprintf("%s-%d", id, seq), "said")
			m.Status = persistence.StatusDone
			ops = append(ops, &persistence.AppendMessage{Message: m})
		}
		ops = append(ops, &persistence.AddOutbox{Entry: outboxEntry("k", int64(i+1), id, id+"-3")},
			&persistence.MarkDelivery{SessionKey: "k", Seq: int64(i + 1), State: persistence.DeliveryDelivered, At: at(20)},
			&persistence.AddUsage{SessionID: id, TurnID: "turn-1", InputTokens: 5, OutputTokens: 1})
	}
	ops = append(ops, &persistence.CreateSession{Session: ended("recent", "k", 1, 150)})
	MustCommit(t, s, ops...)
	const budget = 20
	var total persistence.PruneCount
	steps := 0
	for {
		c := check(s.PruneStep(ctx, at(100), budget)).must(t, "PruneStep")
		steps++
		if c.Rows > budget || (c.Rows == 0) != (c.Sessions == 0) {
			t.Errorf("PruneStep %d = %+v, want at most %d rows, and rows when it deleted sessions", steps, c, budget)
		}
		total.Sessions += c.Sessions
		total.Messages += c.Messages
		if !c.More {
			break
		}
		if steps > 20 {
			t.Fatalf("%d steps and more to come, want the pass to end", steps)
		}
	}
	if total.Sessions != 5 || total.Messages != 15 || steps < 2 {
		t.Errorf("the steps deleted %d sessions and %d messages in %d steps, want 5 and 15 in several", total.Sessions, total.Messages, steps)
	}
	diff(t, "sessions left", sessionIDs(check(s.SessionsOfKey(ctx, "k", 0)).must(t, "SessionsOfKey")), []string{"recent"})
	if got := check(s.OutboxAfter(ctx, "k", 0, 0)).must(t, "OutboxAfter"); len(got) != 0 {
		t.Errorf("OutboxAfter(k) after the steps = %+v, want none", got)
	}
	if last := check(s.LastOutboxSeq(ctx, "k")).must(t, "LastOutboxSeq"); last != 5 {
		t.Errorf("LastOutboxSeq(k) after the steps = %d, want 5 (kept, emptied)", last)
	}
	if c := check(s.PruneStep(ctx, at(100), budget)).must(t, "PruneStep"); c != (persistence.PruneCount{}) {
		t.Errorf("PruneStep after the pass = %+v, want nothing done", c)
	}
}

// testPruneSweepsTheOutbox: a pass's sweep deletes the finished outbox entries of sessions that
// are gone, a key's last one emptied into a pruned marker, and the pruned markers that are no
// longer their key's last, in steps within their budget; it never touches a pending entry, an
// entry of a live session or one of no session. Such an entry is a reply written for a session
// after a step deleted it (an entry has no foreign key; on PostgreSQL also one committed while
// the step deleted the session), delivered afterwards: before the sweep it stayed for ever,
// its text with it, in its key's SSE replay. A marker stops being its key's last when the
// key's chat comes back.
func testPruneSweepsTheOutbox(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	delivered := func(key string, seq int64) *persistence.MarkDelivery {
		return &persistence.MarkDelivery{SessionKey: key, Seq: seq, State: persistence.DeliveryDelivered, At: at(200)}
	}
	// pass runs the steps of a pass with a budget of budget rows, and returns what they swept.
	pass := func(budget int) (swept, steps int) {
		t.Helper()
		for {
			c := check(s.PruneStep(ctx, at(100), budget)).must(t, "PruneStep")
			steps++
			if c.Rows > max(budget, 2) || c.Swept > c.Rows {
				t.Errorf("PruneStep %d = %+v, want at most %d rows, the swept ones among them", steps, c, budget)
			}
			swept += c.Swept
			if !c.More {
				return swept, steps
			}
			if steps > 20 {
				t.Fatalf("%d steps and more to come, want the pass to end", steps)
			}
		}
	}
	seqs := func(key string) []string {
		t.Helper()
		var got []string
		for _, e := range check(s.OutboxAfter(ctx, key, 0, 0)).must(t, "OutboxAfter") {
			got = append(got, fmt.Sprint(e.Seq, " ", e.SessionID, " ", e.State))
		}
		return got
	}

	// gone ends long ago and is pruned: ka's entry 1 is kept as the key's pruned marker.
	MustCommit(t, s, &persistence.CreateSession{Session: ended("gone", "ka", 1, 10)},
		&persistence.AddOutbox{Entry: outboxEntry("ka", 1, "gone")}, delivered("ka", 1))
	if n := check(s.PruneSessions(ctx, at(100), 0)).must(t, "PruneSessions"); n != 1 {
		t.Fatalf("PruneSessions = %d, want 1", n)
	}
	live := newSession("live", "kb")
	ops := []persistence.Op{
		// Written for gone after it was pruned: a reply pending, the key's last (its marker
		// is no longer), and four delivered ones before kb's live session's.
		&persistence.AddOutbox{Entry: outboxEntry("ka", 2, "gone")},
		&persistence.CreateSession{Session: live},
	}
	for seq := int64(1); seq <= 4; seq++ {
		ops = append(ops, &persistence.AddOutbox{Entry: outboxEntry("kb", seq, "gone")}, delivered("kb", seq))
	}
	ops = append(ops,
		// The live session's replies, delivered and pending, and a delivered entry of no session.
		&persistence.AddOutbox{Entry: outboxEntry("kb", 5, "live")}, delivered("kb", 5),
		&persistence.AddOutbox{Entry: outboxEntry("kb", 6, "live")},
		&persistence.AddOutbox{Entry: outboxEntry("ke", 1, "")}, delivered("ke", 1))
	MustCommit(t, s, ops...)

	// Budget 2: ka's marker and kb's four go over three steps.
	if swept, steps := pass(2); swept != 5 || steps < 3 {
		t.Errorf("the pass swept %d rows in %d steps, want 5 in 3 or more", swept, steps)
	}
	diff(t, "ka's entries", seqs("ka"), []string{"2 gone pending"})
	diff(t, "kb's entries", seqs("kb"), []string{"5 live delivered", "6 live pending"})
	diff(t, "ke's entries", seqs("ke"), []string{"1  delivered"})
	if last := check(s.LastOutboxSeq(ctx, "ka")).must(t, "LastOutboxSeq"); last != 2 {
		t.Errorf("LastOutboxSeq(ka) = %d, want 2", last)
	}

	// Delivered, ka's reply is its key's last: it is emptied, and keeps the key's seq.
	MustCommit(t, s, delivered("ka", 2))
	if swept, _ := pass(persistence.DefaultPruneRows); swept != 1 {
		t.Errorf("the pass after ka's reply was delivered swept %d rows, want 1", swept)
	}
	diff(t, "ka's entries once delivered", seqs("ka"), []string(nil))
	if last := check(s.LastOutboxSeq(ctx, "ka")).must(t, "LastOutboxSeq"); last != 2 {
		t.Errorf("LastOutboxSeq(ka) once swept = %d, want 2 (kept, emptied)", last)
	}
	diff(t, "kb's entries at the end", seqs("kb"), []string{"5 live delivered", "6 live pending"})
	diff(t, "ke's entries at the end", seqs("ke"), []string{"1  delivered"})
	if c := check(s.PruneStep(ctx, at(100), 0)).must(t, "PruneStep"); c != (persistence.PruneCount{}) {
		t.Errorf("PruneStep after the sweeps = %+v, want nothing done", c)
	}
}

// testIdleSessionsPaging: IdleSessionsAfter continues IdleSessions page by page, in the same
// order, without skipping or repeating a session (also when activity times tie).
func testIdleSessionsPaging(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	var want []string
	for i := range 7 {
		id, key := fmt.Sprintf("p%d", i), fmt.Sprintf("pk%d", i)
		sess := newSession(id, key)
		sess.LastActivityAt = at(i / 2) // pairs share a time: ties are ordered by id
		MustCommit(t, s, &persistence.CreateSession{Session: sess},
			&persistence.PutRoute{Route: route(key, id, 1)})
		want = append(want, id)
	}
	var got []string
	page := check(s.IdleSessions(ctx, at(100), 3)).must(t, "IdleSessions")
	for len(page) > 0 {
		got = append(got, sessionIDs(page)...)
		last := page[len(page)-1]
		page = check(s.IdleSessionsAfter(ctx, at(100), last.LastActivityAt, last.ID, 3)).must(t, "IdleSessionsAfter")
	}
	diff(t, "paged idle sessions", got, want)
}

// testPruneConcurrentWithCommit runs PruneSessions while Commit writes new sessions (for the
// race detector, and for the store's own serialisation or locking): every commit succeeds and
// every old session is pruned exactly once.
func testPruneConcurrentWithCommit(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	const old = 40
	var ops []persistence.Op
	for i := range old {
		id := fmt.Sprintf("old-%02d", i)
		ops = append(ops, &persistence.CreateSession{Session: newSession(id, "k")},
			&persistence.EndSession{SessionID: id, Reason: persistence.EndIdle, At: at(1)})
	}
	MustCommit(t, s, ops...)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 30 {
			id := fmt.Sprintf("new-%02d", i)
			errs := s.Commit(ctx, [][]persistence.Op{{
				&persistence.CreateSession{Session: newSession(id, "k")},
				&persistence.AppendMessage{Message: userMsg(id, 1, "m-"+id, "hi")},
			}})
			if errs[0] != nil {
				t.Errorf("Commit %s: %v", id, errs[0])
				return
			}
		}
	})
	total := 0
	for {
		n, err := s.PruneSessions(ctx, at(2), 7)
		if err != nil {
			t.Fatalf("PruneSessions: %v", err)
		}
		total += n
		if n < 7 {
			break
		}
	}
	wg.Wait()
	if total != old {
		t.Errorf("pruned %d sessions in total, want %d", total, old)
	}
	ss := check(s.SessionsOfKey(ctx, "k", 1000)).must(t, "SessionsOfKey")
	if len(ss) != 30 {
		t.Errorf("SessionsOfKey(k) = %d sessions, want the 30 new ones", len(ss))
	}
}
