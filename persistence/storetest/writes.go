package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/agentgate/agentgate/persistence"
)

func testCreateSessionIdentity(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	want := persistence.Session{
		ID: "s1", Key: "agent:main:discord:thread:c1:th1:u1", Platform: "discord",
		ChatType: "thread", ChatID: "c1", ThreadID: "th1", UserID: "u1", UserName: "Ann Example",
		ScopeID: "guild-1", Profile: "main", StartedAt: at(1), LastActivityAt: at(2),
		PrevSessionID: "s0", Title: "first title", Epoch: 7,
	}
	MustCommit(t, s, &persistence.CreateSession{Session: want})
	got := check(s.Session(ctx, "s1")).must(t, "Session")
	diff(t, "Session(s1)", got, &want)

	// Re-creating the same id with another identity is a no-op: identity is never updated.
	other := want
	other.Key, other.ChatID, other.UserID, other.UserName, other.Profile = "k2", "c2", "u2", "Bob", "other"
	MustCommit(t, s, &persistence.CreateSession{Session: other})
	got = check(s.Session(ctx, "s1")).must(t, "Session")
	diff(t, "Session(s1) after re-create with other identity", got, &want)
}

// idempotentOps is one of every idempotent op, in an order that can be applied to an empty store.
// ReopenSession is idempotent too but undoes EndSession (re-sending either alone changes the
// state), so testReopenSession covers it.
func idempotentOps() []persistence.Op {
	ss := newSession("s1", "k1")
	return []persistence.Op{
		&persistence.CreateSession{Session: ss},
		&persistence.PutRoute{Route: route("k1", "s1", 1)},
		&persistence.AppendMessage{Message: userMsg("s1", 1, "m1", "hello")},
		&persistence.AppendMessage{Message: replyMsg("s1", 2, "hi")},
		&persistence.AppendMessage{Message: userMsg("s1", 3, "m3", "undo me")},
		&persistence.SetMessageStatus{SessionID: "s1", Seqs: []int64{1}, Status: persistence.StatusDone, TurnID: "turn-1"},
		&persistence.SetAttempts{SessionID: "s1", Seq: 1, Attempts: 2},
		&persistence.MarkProbation{SessionID: "s1", Seq: 1, Run: "r1"},
		&persistence.ArchiveMessages{SessionID: "s1", Seqs: []int64{3}},
		&persistence.TouchSession{SessionID: "s1", At: at(5)},
		&persistence.SetTitle{SessionID: "s1", Title: "greetings"},
		&persistence.MarkResetDue{SessionID: "s1", Reason: persistence.EndDaily, At: at(4)},
		&persistence.AddOutbox{Entry: outboxEntry("k1", 1, "s1", "m1")},
		&persistence.MarkDelivery{SessionKey: "k1", Seq: 1, State: persistence.DeliveryDelivered, At: at(6)},
		&persistence.AddOutbox{Entry: outboxEntry("k1", 2, "s1", "m1")},
		&persistence.AddUsage{SessionID: "s1", TurnID: "turn-1", InputTokens: 120, OutputTokens: 30},
		&persistence.EndSession{SessionID: "s1", Reason: persistence.EndIdle, At: at(9)},
	}
}

// storeState is everything the suite can read about one key and session.
type storeState struct {
	Session    *persistence.Session
	Route      *persistence.Route
	Transcript []persistence.Message
	Outbox     []persistence.OutboxEntry
	Snapshot   *persistence.Snapshot
}

func readState(t testing.TB, s persistence.Store, key, sid string) storeState {
	t.Helper()
	ctx := context.Background()
	return storeState{
		Session:    check(s.Session(ctx, sid)).must(t, "Session"),
		Route:      check(s.Route(ctx, key)).must(t, "Route"),
		Transcript: check(s.Transcript(ctx, sid)).must(t, "Transcript"),
		Outbox:     check(s.OutboxAfter(ctx, key, 0, 0)).must(t, "OutboxAfter"),
		Snapshot:   check(s.LoadSession(ctx, key, 10, 0)).must(t, "LoadSession"),
	}
}

func testIdempotentReapply(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	ops := idempotentOps()
	MustCommit(t, s, ops...)
	want := readState(t, s, "k1", "s1")

	// Re-sent as its own batch, then twice in one batch, and op by op.
	MustCommit(t, s, ops...)
	diff(t, "state after re-sending the group", readState(t, s, "k1", "s1"), want)
	for i, err := range s.Commit(ctx, [][]persistence.Op{ops, ops}) {
		if err != nil {
			t.Fatalf("Commit(group twice): group %d: %v", i, err)
		}
	}
	diff(t, "state after re-sending the group twice in one batch", readState(t, s, "k1", "s1"), want)
	for _, op := range ops {
		MustCommit(t, s, op)
		diff(t, fmt.Sprintf("state after re-sending %T", op), readState(t, s, "k1", "s1"), want)
	}
}

// testCounters checks the two ops that count each application (so they are not idempotent):
// IncrementAttempts and a MarkDelivery without its Attempt, as the spools of older binaries hold
// them. And that a delivered outbox entry stays delivered.
func testCounters(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	start(t, s, "s1", "k1", 1)
	MustCommit(t, s,
		&persistence.AppendMessage{Message: userMsg("s1", 1, "m1", "crashy")},
		&persistence.AddOutbox{Entry: outboxEntry("k1", 1, "s1", "m1")})
	inc := &persistence.IncrementAttempts{SessionID: "s1", Seqs: []int64{1}}
	MustCommit(t, s, inc)
	MustCommit(t, s, inc)
	m := check(s.FindInbound(ctx, "http", "chat", "m1")).must(t, "FindInbound")
	if m.Attempts != 2 {
		t.Errorf("Attempts after 2 IncrementAttempts = %d, want 2", m.Attempts)
	}

	failed := &persistence.MarkDelivery{SessionKey: "k1", Seq: 1, State: persistence.DeliveryFailed, At: at(3)}
	delivered := &persistence.MarkDelivery{SessionKey: "k1", Seq: 1, State: persistence.DeliveryDelivered, At: at(4)}
	steps := []struct {
		op           *persistence.MarkDelivery
		state        string
		attempts     int
		deliveredSet bool
	}{
		{failed, persistence.DeliveryFailed, 1, false},
		{failed, persistence.DeliveryFailed, 2, false},
		{delivered, persistence.DeliveryDelivered, 3, true},
		{failed, persistence.DeliveryDelivered, 3, true},    // delivered is final
		{delivered, persistence.DeliveryDelivered, 3, true}, // and re-marking it is a no-op
	}
	for i, st := range steps {
		MustCommit(t, s, st.op)
		es := check(s.OutboxAfter(ctx, "k1", 0, 0)).must(t, "OutboxAfter")
		if len(es) != 1 {
			t.Fatalf("step %d: OutboxAfter returned %d entries, want 1", i, len(es))
		}
		e := es[0]
		if e.State != st.state || e.Attempts != st.attempts || !e.DeliveredAt.IsZero() != st.deliveredSet {
			t.Errorf("step %d (mark %s): state %q attempts %d delivered_at %v, want %q %d set=%v",
				i, st.op.State, e.State, e.Attempts, e.DeliveredAt, st.state, st.attempts, st.deliveredSet)
		}
		if st.deliveredSet && !e.DeliveredAt.Equal(at(4)) {
			t.Errorf("step %d: DeliveredAt = %v, want %v", i, e.DeliveredAt, at(4))
		}
	}
}

// testDeliveryAttempts: a MarkDelivery with its attempt's number keeps the larger count, so a
// mark applied twice (a write re-sent, a spool replay of a batch that was committed) counts its
// attempt once and a late mark of an earlier attempt does not lower it; a mark without a number
// (an older binary's spool) still counts one more; delivered stays final. A pending mark (a
// stop's, of a reply still to send) counts but changes no state: before, it made a failed
// entry pending again, to be sent again.
func testDeliveryAttempts(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	start(t, s, "s1", "k1", 1)
	MustCommit(t, s, &persistence.AddOutbox{Entry: outboxEntry("k1", 1, "s1", "m1")})
	mark := func(state string, attempt int) *persistence.MarkDelivery {
		return &persistence.MarkDelivery{SessionKey: "k1", Seq: 1, State: state, At: at(4), Attempt: attempt}
	}
	pending := persistence.DeliveryPending
	failed := persistence.DeliveryFailed
	delivered := persistence.DeliveryDelivered
	steps := []struct {
		name     string
		ops      []persistence.Op
		state    string
		attempts int
	}{
		{"a pending mark counts", []persistence.Op{mark(pending, 1)}, pending, 1},
		{"attempt 2", []persistence.Op{mark(failed, 2)}, failed, 2},
		{"attempt 2 applied again", []persistence.Op{mark(failed, 2)}, failed, 2},
		{"attempt 2 twice in one group", []persistence.Op{mark(failed, 2), mark(failed, 2)}, failed, 2},
		{"a late attempt 1", []persistence.Op{mark(failed, 1)}, failed, 2},
		{"a mark without a number adds one", []persistence.Op{mark(failed, 0)}, failed, 3},
		{"attempt 3 is no more", []persistence.Op{mark(failed, 3)}, failed, 3},
		{"a pending mark of a failed entry only counts", []persistence.Op{mark(pending, 4)}, failed, 4},
		{"attempt 5 delivered", []persistence.Op{mark(delivered, 5)}, delivered, 5},
		{"attempt 5 delivered applied again", []persistence.Op{mark(delivered, 5)}, delivered, 5},
		{"delivered is final", []persistence.Op{mark(failed, 7), mark(failed, 0), mark(pending, 8)}, delivered, 5},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			MustCommit(t, s, st.ops...)
			es := check(s.OutboxAfter(ctx, "k1", 0, 0)).must(t, "OutboxAfter")
			if len(es) != 1 {
				t.Fatalf("OutboxAfter returned %d entries, want 1", len(es))
			}
			if e := es[0]; e.State != st.state || e.Attempts != st.attempts {
				t.Errorf("state %q attempts %d, want %q %d", e.State, e.Attempts, st.state, st.attempts)
			}
		})
	}
	t.Run("a negative attempt is refused", func(t *testing.T) {
		if err := s.Commit(ctx, [][]persistence.Op{{mark(failed, -1)}})[0]; err == nil {
			t.Errorf("Commit(MarkDelivery{Attempt: -1}) = nil, want an error")
		}
	})
}

func testGroupAtomicity(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	start(t, s, "s0", "k0", 1)
	MustCommit(t, s, &persistence.AppendMessage{Message: userMsg("s0", 1, "taken", "first")})

	group := func(id, key, msgID string, last ...persistence.Op) []persistence.Op {
		return append([]persistence.Op{
			&persistence.CreateSession{Session: newSession(id, key)},
			&persistence.PutRoute{Route: route(key, id, 1)},
			&persistence.AppendMessage{Message: userMsg(id, 1, msgID, "text of "+id)},
			&persistence.AddOutbox{Entry: outboxEntry(key, 1, id, msgID)},
			&persistence.TouchSession{SessionID: id, At: at(3)},
			// A counter: it must count once even if the store runs the batch twice.
			&persistence.IncrementAttempts{SessionID: id, Seqs: []int64{1}},
		}, last...)
	}
	tests := []struct {
		name    string
		failing persistence.Op
		wantIs  error
	}{
		{"unknown op", unknownOp{}, nil},
		{"duplicate inbound", &persistence.AppendMessage{Message: userMsg("b-duplicate inbound", 2, "taken", "again")}, persistence.ErrDuplicate},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b, c := "a-"+tc.name, "b-"+tc.name, "c-"+tc.name
			errs := s.Commit(ctx, [][]persistence.Op{
				group(a, "key-"+a, "msg-"+a),
				group(b, "key-"+b, "msg-"+b, tc.failing),
				group(c, "key-"+c, "msg-"+c),
			})
			if len(errs) != 3 {
				t.Fatalf("Commit(3 groups) returned %d errors, want 3", len(errs))
			}
			if errs[0] != nil || errs[2] != nil {
				t.Errorf("Commit errors for the good groups = %v, %v, want nil, nil", errs[0], errs[2])
			}
			if errs[1] == nil {
				t.Fatalf("Commit error for the failing group = nil, want an error")
			}
			if tc.wantIs != nil && !errors.Is(errs[1], tc.wantIs) {
				t.Errorf("Commit error for the failing group = %v, want errors.Is %v", errs[1], tc.wantIs)
			}
			// The failing group left no trace.
			if _, err := s.Session(ctx, b); !errors.Is(err, persistence.ErrNotFound) {
				t.Errorf("Session(%s) error = %v, want ErrNotFound", b, err)
			}
			if _, err := s.Route(ctx, "key-"+b); !errors.Is(err, persistence.ErrNotFound) {
				t.Errorf("Route(key-%s) error = %v, want ErrNotFound", b, err)
			}
			if ms := check(s.Transcript(ctx, b)).must(t, "Transcript"); len(ms) != 0 {
				t.Errorf("Transcript(%s) = %d rows, want 0", b, len(ms))
			}
			if es := check(s.OutboxAfter(ctx, "key-"+b, 0, 0)).must(t, "OutboxAfter"); len(es) != 0 {
				t.Errorf("OutboxAfter(key-%s) = %d entries, want 0", b, len(es))
			}
			if _, err := s.FindInbound(ctx, "http", "chat", "msg-"+b); !errors.Is(err, persistence.ErrNotFound) {
				t.Errorf("FindInbound(msg-%s) error = %v, want ErrNotFound", b, err)
			}
			// Its neighbours committed in full.
			for _, id := range []string{a, c} {
				snap := check(s.LoadSession(ctx, "key-"+id, 10, 0)).must(t, "LoadSession")
				if snap.Session == nil || snap.Session.ID != id || len(snap.Pending) != 1 || len(snap.Unconfirmed) != 1 {
					t.Fatalf("LoadSession(key-%s) = %+v, want session %s with 1 pending and 1 unconfirmed", id, snap, id)
				}
				if got := snap.Pending[0].Attempts; got != 1 {
					t.Errorf("LoadSession(key-%s): pending message attempts = %d, want 1", id, got)
				}
			}
		})
	}
}

// testFailedTransaction: when the transaction itself cannot run, every group gets the error.
func testFailedTransaction(t *testing.T, s persistence.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := s.Commit(ctx, [][]persistence.Op{
		{&persistence.CreateSession{Session: newSession("s1", "k1")}},
		{&persistence.CreateSession{Session: newSession("s2", "k2")}},
	})
	if len(errs) != 2 {
		t.Fatalf("Commit(2 groups) returned %d errors, want 2", len(errs))
	}
	for i, err := range errs {
		if err == nil {
			t.Errorf("Commit(cancelled ctx) group %d error = nil, want an error", i)
		}
	}
	for _, id := range []string{"s1", "s2"} {
		if _, err := s.Session(context.Background(), id); !errors.Is(err, persistence.ErrNotFound) {
			t.Errorf("Session(%s) after a failed transaction: error = %v, want ErrNotFound", id, err)
		}
	}
}

func testEmptyCommit(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	if errs := s.Commit(ctx, nil); len(errs) != 0 {
		t.Errorf("Commit(nil) = %v, want no errors", errs)
	}
	errs := s.Commit(ctx, [][]persistence.Op{{}, {&persistence.CreateSession{Session: newSession("s1", "k1")}}})
	if len(errs) != 2 || errs[0] != nil || errs[1] != nil {
		t.Errorf("Commit(empty group, good group) = %v, want [nil nil]", errs)
	}
}

func testDuplicateInbound(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	start(t, s, "a", "ka", 1)
	start(t, s, "b", "kb", 1)
	first := userMsg("a", 1, "m1", "hello")
	MustCommit(t, s, &persistence.AppendMessage{Message: first})

	otherChat := userMsg("b", 4, "m1", "hello")
	otherChat.ChatID = "other-chat"
	assistant := replyMsg("b", 5, "same id, not a user message")
	assistant.Platform, assistant.ChatID, assistant.MessageID = "http", "chat", "m1"
	tests := []struct {
		name   string
		msg    persistence.Message
		wantIs error // nil: must succeed
	}{
		{"identical re-send", first, nil},
		{"same platform message in another session", userMsg("b", 1, "m1", "hello"), persistence.ErrDuplicate},
		{"same platform message at another seq", userMsg("a", 2, "m1", "hello"), persistence.ErrDuplicate},
		{"same message id in another chat", otherChat, nil},
		{"assistant row with the same message id", assistant, nil},
		{"empty message id", userMsg("b", 6, "", "no id"), nil},
		{"empty message id again", userMsg("b", 7, "", "no id"), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := s.Commit(ctx, [][]persistence.Op{{&persistence.AppendMessage{Message: tc.msg}}})[0]
			switch {
			case tc.wantIs == nil && err != nil:
				t.Errorf("AppendMessage(%s/%d) = %v, want nil", tc.msg.SessionID, tc.msg.Seq, err)
			case tc.wantIs != nil && !errors.Is(err, tc.wantIs):
				t.Errorf("AppendMessage(%s/%d) = %v, want errors.Is %v", tc.msg.SessionID, tc.msg.Seq, err, tc.wantIs)
			}
		})
	}

	got := check(s.FindInbound(ctx, "http", "chat", "m1")).must(t, "FindInbound")
	diff(t, "FindInbound(http, chat, m1)", got, &first)

	// Two groups of one batch carrying the same inbound message: the second is the duplicate.
	errs := s.Commit(ctx, [][]persistence.Op{
		{&persistence.AppendMessage{Message: userMsg("a", 10, "m9", "x")}},
		{&persistence.AppendMessage{Message: userMsg("b", 10, "m9", "x")}},
	})
	if errs[0] != nil || !errors.Is(errs[1], persistence.ErrDuplicate) {
		t.Errorf("Commit(same inbound in two groups) = %v, want [nil ErrDuplicate]", errs)
	}
}

func testRoutingGenerations(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	tests := []struct {
		name    string
		puts    []persistence.Route
		wantSID string
		wantGen int64
	}{
		{"newer replaces", []persistence.Route{route("k", "s1", 1), route("k", "s2", 2)}, "s2", 2},
		{"older never replaces", []persistence.Route{route("k", "s3", 3), route("k", "s1", 1)}, "s3", 3},
		{"equal generation never replaces", []persistence.Route{route("k", "s1", 1), route("k", "s2", 1)}, "s1", 1},
		{"out of order", []persistence.Route{route("k", "s2", 2), route("k", "s5", 5), route("k", "s4", 4), route("k", "s3", 3)}, "s5", 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := "key-" + tc.name
			for _, r := range tc.puts {
				r.Key = key
				MustCommit(t, s, &persistence.PutRoute{Route: r})
			}
			got := check(s.Route(ctx, key)).must(t, "Route")
			if got.SessionID != tc.wantSID || got.Generation != tc.wantGen {
				t.Errorf("Route(%s) = %s gen %d, want %s gen %d", key, got.SessionID, got.Generation, tc.wantSID, tc.wantGen)
			}
		})
	}
}

func testConcurrentRouting(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	const n = 40
	errc := make(chan error, n)
	var wg sync.WaitGroup
	// Goroutines start in reverse generation order so that late, old writes are likely.
	for i := n; i >= 1; i-- {
		wg.Go(func() {
			gen := int64(i)
			errs := s.Commit(ctx, [][]persistence.Op{
				{&persistence.PutRoute{Route: route("k", fmt.Sprintf("s%d", gen), gen)}},
				{&persistence.PutRoute{Route: route(fmt.Sprintf("k%d", i%4), fmt.Sprintf("s%d", gen), gen)}},
			})
			errc <- errors.Join(errs...)
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Fatalf("concurrent Commit: %v", err)
		}
	}
	got := check(s.Route(ctx, "k")).must(t, "Route")
	if got.Generation != n || got.SessionID != fmt.Sprintf("s%d", n) {
		t.Errorf("Route(k) after %d concurrent puts = %s gen %d, want s%d gen %d", n, got.SessionID, got.Generation, n, n)
	}
	for r := range 4 {
		key := fmt.Sprintf("k%d", r)
		want := int64(n - (n-r)%4) // the largest i in 1..n with i%4 == r
		got := check(s.Route(ctx, key)).must(t, "Route")
		if got.Generation != want {
			t.Errorf("Route(%s) generation = %d, want %d", key, got.Generation, want)
		}
	}
}

// testRoutingRebuildNeverRollsBack: a full rebuild of the routing table (one group rewriting
// every key's route from a snapshot taken earlier) races single-row upserts of newer
// generations; whatever the interleaving, every key ends at its newest generation.
func testRoutingRebuildNeverRollsBack(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	const keys, rounds = 20, 15
	var snapshot []persistence.Op // every key at generation 1: older than anything below
	for k := range keys {
		key := fmt.Sprintf("rk%d", k)
		snapshot = append(snapshot, &persistence.PutRoute{Route: route(key, "stale", 1)})
	}
	errc := make(chan error, keys*rounds+rounds)
	var wg sync.WaitGroup
	for k := range keys {
		wg.Go(func() {
			for g := int64(2); g < rounds+2; g++ {
				errc <- errors.Join(s.Commit(ctx, [][]persistence.Op{{
					&persistence.PutRoute{Route: route(fmt.Sprintf("rk%d", k), fmt.Sprintf("s%d", g), g)}}})...)
			}
		})
	}
	for range rounds {
		wg.Go(func() { errc <- errors.Join(s.Commit(ctx, [][]persistence.Op{snapshot})...) })
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Fatalf("concurrent Commit: %v", err)
		}
	}
	for k := range keys {
		got := check(s.Route(ctx, fmt.Sprintf("rk%d", k))).must(t, "Route")
		if got.Generation != rounds+1 || got.SessionID != fmt.Sprintf("s%d", rounds+1) {
			t.Errorf("Route(rk%d) = %s gen %d after a stale rebuild, want s%d gen %d", k, got.SessionID, got.Generation, rounds+1, rounds+1)
		}
	}
}

// testConcurrentReadsAndWrites runs readers while a writer commits, for the race detector and
// for the snapshot invariant (a pending message is never seen without its session).
func testConcurrentReadsAndWrites(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	start(t, s, "s1", "k1", 1)
	const writes = 30
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(done)
		for i := range int64(writes) {
			errs := s.Commit(ctx, [][]persistence.Op{{
				&persistence.AppendMessage{Message: userMsg("s1", i+1, fmt.Sprintf("m%d", i+1), "text")},
				&persistence.TouchSession{SessionID: "s1", At: at(int(i))},
			}})
			if errs[0] != nil {
				t.Errorf("Commit %d: %v", i, errs[0])
				return
			}
		}
	})
	for range 3 {
		wg.Go(func() {
			var last int64
			for {
				finished := false
				select {
				case <-done:
					finished = true // one more read sees every write
				default:
				}
				snap, err := s.LoadSession(ctx, "k1", 5, 0)
				if err != nil {
					t.Errorf("LoadSession: %v", err)
					return
				}
				if snap.Session == nil || int64(len(snap.Pending)) != snap.LastSeq || snap.LastSeq < last {
					t.Errorf("LoadSession: LastSeq %d with %d pending (previous %d), want them equal and growing",
						snap.LastSeq, len(snap.Pending), last)
					return
				}
				last = snap.LastSeq
				if finished {
					return
				}
			}
		})
	}
	wg.Wait()
}

// testUnread: a chat's unread place is recorded by MarkUnread, replaced by another and deleted
// by ClearUnread, all idempotent; Unread lists one platform's, oldest first, up to a limit.
func testUnread(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	place := func(platform, chat, after string, sec int) persistence.Unread {
		return persistence.Unread{Platform: platform, ChatID: chat, ScopeID: "g-" + chat, After: after, At: at(sec)}
	}
	u1, u2, u3, other := place("discord", "c1", "100", 3), place("discord", "c2", "200", 1), place("discord", "c3", "300", 2), place("slack", "c1", "9", 0)
	MustCommit(t, s, &persistence.MarkUnread{Unread: u1}, &persistence.MarkUnread{Unread: u2},
		&persistence.MarkUnread{Unread: u3}, &persistence.MarkUnread{Unread: other})
	MustCommit(t, s, &persistence.MarkUnread{Unread: u2}) // re-applied: no change
	diff(t, "Unread(discord)", check(s.Unread(ctx, "discord", 0)).must(t, "Unread"), []persistence.Unread{u2, u3, u1})
	diff(t, "Unread(discord, limit 2)", check(s.Unread(ctx, "discord", 2)).must(t, "Unread"), []persistence.Unread{u2, u3})

	u1 = place("discord", "c1", "150", 9)
	u1.ScopeID = "moved"
	MustCommit(t, s, &persistence.MarkUnread{Unread: u1})
	diff(t, "Unread(discord) after c1 moved", check(s.Unread(ctx, "discord", 0)).must(t, "Unread"), []persistence.Unread{u2, u3, u1})

	MustCommit(t, s, &persistence.ClearUnread{Platform: "discord", ChatID: "c3"})
	MustCommit(t, s, &persistence.ClearUnread{Platform: "discord", ChatID: "c3"},
		&persistence.ClearUnread{Platform: "discord", ChatID: "never marked"})
	diff(t, "Unread(discord) after clearing c3", check(s.Unread(ctx, "discord", 0)).must(t, "Unread"), []persistence.Unread{u2, u1})
	// A clear of the place c1 had before it moved (held up, or another member's) leaves the
	// newer one; a clear of the place it has deletes it.
	MustCommit(t, s, &persistence.ClearUnread{Platform: "discord", ChatID: "c1", After: "100"})
	diff(t, "Unread(discord) after clearing c1's old place", check(s.Unread(ctx, "discord", 0)).must(t, "Unread"), []persistence.Unread{u2, u1})
	MustCommit(t, s, &persistence.ClearUnread{Platform: "discord", ChatID: "c1", After: "150"})
	diff(t, "Unread(discord) after clearing c1's place", check(s.Unread(ctx, "discord", 0)).must(t, "Unread"), []persistence.Unread{u2})
	diff(t, "Unread(slack)", check(s.Unread(ctx, "slack", 0)).must(t, "Unread"), []persistence.Unread{other})

	for _, bad := range []persistence.Op{
		&persistence.MarkUnread{Unread: persistence.Unread{Platform: "discord"}},
		&persistence.ClearUnread{ChatID: "c1"},
	} {
		if errs := s.Commit(ctx, [][]persistence.Op{{bad}}); errs[0] == nil {
			t.Errorf("Commit(%T without its identity) = nil error, want one", bad)
		}
	}
}

// testDrafts: a draft is open from OpenDraft until CloseDraft, both idempotent; OpenDrafts
// lists one platform's, oldest first, up to a limit.
func testDrafts(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	draft := func(platform, id string, sec int) persistence.Draft {
		return persistence.Draft{Platform: platform, ID: id, SessionKey: "k-" + id, TurnID: "t-" + id,
			ChatType: "thread", ChatID: "c-" + id, ThreadID: "th-" + id, Run: "run-1", CreatedAt: at(sec)}
	}
	d1, d2, d3, other := draft("discord", "d1", 3), draft("discord", "d2", 1), draft("discord", "d3", 2), draft("slack", "d1", 0)
	MustCommit(t, s, &persistence.OpenDraft{Draft: d1}, &persistence.OpenDraft{Draft: d2},
		&persistence.OpenDraft{Draft: d3}, &persistence.OpenDraft{Draft: other})
	changed := d1
	changed.TurnID = "another turn"
	MustCommit(t, s, &persistence.OpenDraft{Draft: changed}) // re-applied: no change
	got := check(s.OpenDrafts(ctx, "discord", 0)).must(t, "OpenDrafts")
	diff(t, "OpenDrafts(discord)", got, []persistence.Draft{d2, d3, d1})
	got = check(s.OpenDrafts(ctx, "discord", 2)).must(t, "OpenDrafts")
	diff(t, "OpenDrafts(discord, limit 2)", got, []persistence.Draft{d2, d3})

	MustCommit(t, s, &persistence.CloseDraft{Platform: "discord", ID: "d3"})
	MustCommit(t, s, &persistence.CloseDraft{Platform: "discord", ID: "d3"},
		&persistence.CloseDraft{Platform: "discord", ID: "never opened"})
	got = check(s.OpenDrafts(ctx, "discord", 0)).must(t, "OpenDrafts")
	diff(t, "OpenDrafts(discord) after closing d3", got, []persistence.Draft{d2, d1})
	got = check(s.OpenDrafts(ctx, "slack", 0)).must(t, "OpenDrafts")
	diff(t, "OpenDrafts(slack)", got, []persistence.Draft{other})

	for _, bad := range []persistence.Op{
		&persistence.OpenDraft{Draft: persistence.Draft{Platform: "discord"}},
		&persistence.CloseDraft{ID: "d1"},
	} {
		if errs := s.Commit(ctx, [][]persistence.Op{{bad}}); errs[0] == nil {
			t.Errorf("Commit(%T without its identity) = nil error, want one", bad)
		}
	}
}
