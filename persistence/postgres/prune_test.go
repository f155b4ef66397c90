package postgres

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/jackc/pgx/v5"
)

// TestPruneRechecksASessionItLocked: a write to an ended session that commits while a prune
// step waits for the session's row lock makes the session needed again, and the step keeps it.
// Under READ COMMITTED the step's SELECT ... FOR UPDATE checked the session with the snapshot it
// began with; a writer's foreign key check had locked the row (FOR KEY SHARE) but not changed
// it, so PostgreSQL handed the row over without checking it again. Before, the step then
// deleted the session with the pending message that had just committed (or the reply about to
// be sent). Found by a review in the forty-second session ("FOR UPDATE snapshot").
func TestPruneRechecksASessionItLocked(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write []string // the concurrent transaction's statements
		kept  string   // a query that counts what must be kept
	}{{
		name: "a pending message",
		write: []string{`INSERT INTO messages (session_id, seq, role, content, platform, chat_id, message_id, status, created_at)
			VALUES ('old', 3, 'user', 'are you there?', 'http', 'c-k', 'm3', 'pending', 1)`},
		kept: `SELECT COUNT(*) FROM messages WHERE session_id = 'old' AND seq = 3 AND status = 'pending'`,
	}, {
		name: "an undelivered reply",
		write: []string{
			`INSERT INTO messages (session_id, seq, role, content, status, created_at) VALUES ('old', 3, 'assistant', 'late answer', 'done', 1)`,
			`INSERT INTO outbox (session_key, seq, session_id, kind, text, state) VALUES ('k', 2, 'old', 'reply', 'late answer', 'pending')`,
		},
		kept: `SELECT COUNT(*) FROM outbox WHERE session_key = 'k' AND seq = 2 AND state = 'pending' AND text = 'late answer'`,
	}} {
		// With a budget of 2 rows the session (4 rows) is larger than the step's budget, and
		// the step would delete its oldest rows (pruneChunk): it checks the session first too.
		for _, rows := range []int{0, 2} {
			t.Run(fmt.Sprintf("%s, a budget of %d rows", tc.name, rows), func(t *testing.T) {
				ctx := context.Background()
				s, dsn := MustOpen(t)
				mustEndedSession(t, s, "hi")

				tx := mustWriteInTx(t, dsn, tc.write...)

				done := pruneStepInTheBackground(s, rows)
				waitForLockWaits(t, dsn, 1, nil)
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				r := <-done
				if r.err != nil || r.c != (persistence.PruneCount{}) {
					t.Errorf("PruneStep = %+v, %v; want nothing deleted", r.c, r.err)
				}
				if _, err := s.Session(ctx, "old"); err != nil {
					t.Errorf("the session after the step: %v, want it kept", err)
				}
				var n int
				if err := mustConn(t, dsn).QueryRow(ctx, tc.kept).Scan(&n); err != nil || n != 1 {
					t.Errorf("%s = %d, %v; want 1", tc.kept, n, err)
				}
			})
		}
	}
}

// mustEndedSession commits session "old" of key "k", ended at t0: a user's message, the reply
// "hi", and an outbox entry, delivered, for each of replies.
func mustEndedSession(t *testing.T, s *Store, replies ...string) {
	t.Helper()
	ops := []persistence.Op{
		&persistence.CreateSession{Session: newSession("old", "k")},
		&persistence.AppendMessage{Message: persistence.Message{SessionID: "old", Seq: 1, Role: persistence.RoleUser,
			Content: "hello", Status: persistence.StatusDone, Active: true, CreatedAt: t0}},
		&persistence.AppendMessage{Message: persistence.Message{SessionID: "old", Seq: 2, Role: persistence.RoleAssistant,
			Content: "hi", Status: persistence.StatusDone, Active: true, CreatedAt: t0}},
	}
	for i, text := range replies {
		ops = append(ops, &persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: "k", Seq: int64(i + 1), SessionID: "old",
			Kind: "reply", Text: text, State: persistence.DeliveryDelivered, CreatedAt: t0}})
	}
	storetest.MustCommit(t, s, append(ops, &persistence.EndSession{SessionID: "old", Reason: persistence.EndIdle, At: t0})...)
}

// stepResult is what a PruneStep returned.
type stepResult struct {
	c   persistence.PruneCount
	err error
}

// pruneStepInTheBackground runs one prune step of s (sessions ended an hour after t0 or
// before, a budget of rows rows) on a goroutine of its own, and sends its result on the
// channel it returns.
func pruneStepInTheBackground(s *Store, rows int) <-chan stepResult {
	done := make(chan stepResult, 1)
	go func() {
		c, err := s.PruneStep(context.Background(), t0.Add(time.Hour), rows)
		done <- stepResult{c, err}
	}()
	return done
}

// waitForLockWaits returns once n sessions of dsn's database wait for a lock, or done is
// closed (a nil done never is).
func waitForLockWaits(t *testing.T, dsn string, n int, done <-chan struct{}) {
	t.Helper()
	ctx := context.Background()
	c := mustConn(t, dsn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		err := c.QueryRow(ctx, `SELECT COUNT(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting >= n {
			return
		}
		select {
		case <-done:
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions waited for a lock in 30 s, want %d", waiting, n)
		}
		time.Sleep(5 * time.Millisecond) // between two looks, not in place of one
	}
}

// TestPruneKeepsAPendingOutboxEntry: an outbox entry of a pruned session that is pending once
// the step has checked the session again (the entry has no foreign key, so nothing holds it up)
// is kept, whole, though the session goes: it is still to be delivered. Here the writer holds
// the session's first delivered entry, which the step's outbox DELETE waits for; it then adds a
// pending reply (seen by the step's UPDATE, which would make it an empty pruned marker), or sets
// the entry it holds pending again (seen by the DELETE as it takes the row). Without the
// `state <> 'pending'` filters the step deleted or emptied it (ba361e6). With a budget of 2 rows
// the session (5 rows) is larger than the step's budget, and the step deletes its oldest rows
// (pruneChunk), the held entry first, and keeps its row: it keeps a pending entry too.
func TestPruneKeepsAPendingOutboxEntry(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write []string
		kept  string
	}{{
		name: "a reply added",
		write: []string{
			`SELECT 1 FROM outbox WHERE session_key = 'k' AND seq = 1 FOR UPDATE`,
			`INSERT INTO outbox (session_key, seq, session_id, kind, text, state) VALUES ('k', 3, 'old', 'reply', 'late answer', 'pending')`,
		},
		kept: `SELECT COUNT(*) FROM outbox WHERE session_key = 'k' AND seq = 3 AND state = 'pending' AND kind = 'reply' AND text = 'late answer'`,
	}, {
		name: "an entry pending again",
		write: []string{
			`UPDATE outbox SET state = 'pending' WHERE session_key = 'k' AND seq = 1`,
		},
		kept: `SELECT COUNT(*) FROM outbox WHERE session_key = 'k' AND seq = 1 AND state = 'pending' AND kind = 'reply' AND text = 'hi'`,
	}} {
		for _, rows := range []int{0, 2} {
			t.Run(fmt.Sprintf("%s, a budget of %d rows", tc.name, rows), func(t *testing.T) {
				ctx := context.Background()
				s, dsn := MustOpen(t)
				mustEndedSession(t, s, "hi", "more")

				tx := mustWriteInTx(t, dsn, tc.write[0])
				done := pruneStepInTheBackground(s, rows)
				waitForLockWaits(t, dsn, 1, nil) // the step checked the session again, and waits in its outbox DELETE
				mustExecIn(t, tx, tc.write[1:]...)
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				r := <-done
				want := 1 // the session, whole
				if rows > 0 {
					want = 0 // its oldest rows only
				}
				if r.err != nil || r.c.Sessions != want {
					t.Errorf("PruneStep = %+v, %v; want %d sessions deleted", r.c, r.err, want)
				}
				var n int
				if err := mustConn(t, dsn).QueryRow(ctx, tc.kept).Scan(&n); err != nil || n != 1 {
					t.Errorf("%s = %d, %v; want 1", tc.kept, n, err)
				}
			})
		}
	}
}

// mustBigSession commits session id of key, ended at t0 plus ended seconds: messages
// messages (seq 1 on, done), replies outbox entries, delivered (seq 1 on), and the usage of
// usage turns.
func mustBigSession(t *testing.T, s *Store, id, key string, ended, messages, replies, usage int) {
	t.Helper()
	ops := []persistence.Op{&persistence.CreateSession{Session: newSession(id, key)}}
	for seq := range int64(messages) {
		role := persistence.RoleUser
		if seq%2 == 1 {
			role = persistence.RoleAssistant
		}
		ops = append(ops, &persistence.AppendMessage{Message: persistence.Message{SessionID: id, Seq: seq + 1, Role: role,
			Content: fmt.Sprint("message ", seq+1), Status: persistence.StatusDone, Active: true, CreatedAt: t0}})
	}
	for seq := range int64(replies) {
		ops = append(ops, &persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: key, Seq: seq + 1, SessionID: id,
			Kind: "reply", Text: fmt.Sprint("reply ", seq+1), State: persistence.DeliveryDelivered, CreatedAt: t0}})
	}
	for i := range usage {
		ops = append(ops, &persistence.AddUsage{SessionID: id, TurnID: fmt.Sprint("turn-", i), InputTokens: 1, OutputTokens: 1})
	}
	at := t0.Add(time.Duration(ended) * time.Second)
	storetest.MustCommit(t, s, append(ops, &persistence.EndSession{SessionID: id, Reason: persistence.EndIdle, At: at})...)
}

// leftOf is what is left of session id of key: whether its row is, its messages' seqs, its
// outbox entries (seq and kind) and its usage rows.
type leftOf struct {
	session  bool
	messages []int64
	outbox   []string
	usage    int
}

func mustLeftOf(t *testing.T, c *pgx.Conn, id, key string) leftOf {
	t.Helper()
	ctx := context.Background()
	var l leftOf
	err := c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM sessions WHERE id = $1),
		ARRAY(SELECT seq FROM messages WHERE session_id = $1 ORDER BY seq),
		ARRAY(SELECT seq || ' ' || kind FROM outbox WHERE session_key = $2 AND session_id = $1 ORDER BY seq),
		(SELECT COUNT(*) FROM turn_usage WHERE session_id = $1)`, id, key).Scan(&l.session, &l.messages, &l.outbox, &l.usage)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestPruneStepsDeleteABigSessionInChunks: a session larger than a step's budget goes over
// several steps, each within its budget: its outbox entries first, then its usage, then its
// messages oldest first, and its row last, with its key's last entry emptied. Before, it went
// whole in one step, alone, whatever its size: 0.65 s for 100,000 messages and 50,000 replies,
// all that time in the persistence actor.
func TestPruneStepsDeleteABigSessionInChunks(t *testing.T) {
	ctx := context.Background()
	s, dsn := MustOpen(t)
	c := mustConn(t, dsn)
	mustBigSession(t, s, "big", "k", 0, 30, 10, 5) // 46 rows
	mustBigSession(t, s, "small", "k2", 1, 2, 0, 0)
	const budget = 8
	var total persistence.PruneCount
	steps := 0
	for {
		r, err := s.PruneStep(ctx, t0.Add(time.Hour), budget)
		if err != nil {
			t.Fatal(err)
		}
		steps++
		if r.Rows > budget {
			t.Errorf("step %d = %+v, want at most %d rows", steps, r, budget)
		}
		total.Sessions += r.Sessions
		total.Messages += r.Messages
		total.Rows += r.Rows
		l := mustLeftOf(t, c, "big", "k")
		if l.session {
			// The oldest rows go first: outbox entries but the key's last, usage, messages.
			if len(l.messages) < 30 && (len(l.outbox) > 1 || l.usage > 0) {
				t.Errorf("after step %d: %+v, want its outbox entries and usage gone before its messages", steps, l)
			}
			if n := len(l.messages); n > 0 && (l.messages[0] != int64(30-n+1) || l.messages[n-1] != 30) {
				t.Errorf("after step %d: messages %v, want the newest left", steps, l.messages)
			}
		}
		if !r.More {
			break
		}
		if steps > 20 {
			t.Fatalf("%d steps and more to come, want the pass to end", steps)
		}
	}
	if want := (persistence.PruneCount{Sessions: 2, Messages: 32, Rows: 49}); total != want || steps < 6 {
		t.Errorf("the steps deleted %+v in %d steps, want %+v in 6 or more", total, steps, want)
	}
	if got, want := mustLeftOf(t, c, "big", "k"), (leftOf{outbox: []string{"10 pruned"}, messages: []int64{}}); !reflect.DeepEqual(got, want) {
		t.Errorf("left of big: %+v, want %+v", got, want)
	}
	if got := mustLeftOf(t, c, "small", "k2"); got.session || len(got.messages) > 0 {
		t.Errorf("left of small: %+v, want nothing", got)
	}
}

// TestPruneStepsKeepABigSessionNeededAgain: a write between two steps that makes a session
// being deleted over several steps needed again (a pending message, a reopening, an
// undelivered reply) keeps it, with the write and what the earlier steps left: a step deletes
// rows of a session only once it has found it due, under its row lock (the write here comes
// between two steps; one that comes while a step waits for the row is
// TestPruneRechecksASessionItLocked's, with a budget of 2 rows).
func TestPruneStepsKeepABigSessionNeededAgain(t *testing.T) {
	for _, tc := range []struct {
		name   string
		write  []persistence.Op
		kept31 bool   // the write's message 31 is kept
		kept   string // the write's outbox entry kept, if any
	}{{
		name:   "a pending message",
		kept31: true,
		write: []persistence.Op{&persistence.AppendMessage{Message: persistence.Message{SessionID: "big", Seq: 31,
			Role: persistence.RoleUser, Content: "are you there?", Platform: "http", ChatID: "c-k", MessageID: "m31",
			Status: persistence.StatusPending, Active: true, CreatedAt: t0.Add(2 * time.Hour)}}},
	}, {
		name:  "reopened",
		write: []persistence.Op{&persistence.ReopenSession{SessionID: "big"}},
	}, {
		name:   "an undelivered reply",
		kept31: true,
		kept:   "11 reply",
		write: []persistence.Op{
			&persistence.AppendMessage{Message: persistence.Message{SessionID: "big", Seq: 31, Role: persistence.RoleAssistant,
				Content: "late answer", Status: persistence.StatusDone, Active: true, CreatedAt: t0.Add(2 * time.Hour)}},
			&persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: "k", Seq: 11, SessionID: "big", Kind: "reply",
				Text: "late answer", State: persistence.DeliveryPending, CreatedAt: t0.Add(2 * time.Hour)}},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, dsn := MustOpen(t)
			c := mustConn(t, dsn)
			mustBigSession(t, s, "big", "k", 0, 30, 10, 5)
			for range 3 { // outbox entries, usage, the first 10 messages
				if r, err := s.PruneStep(ctx, t0.Add(time.Hour), 8); err != nil || r.Sessions != 0 || r.Rows != 8 || !r.More {
					t.Fatalf("PruneStep = %+v, %v; want 8 rows of big deleted, and more", r, err)
				}
			}
			before := mustLeftOf(t, c, "big", "k")
			storetest.MustCommit(t, s, tc.write...)
			if r, err := s.PruneStep(ctx, t0.Add(time.Hour), 8); err != nil || r != (persistence.PruneCount{}) {
				t.Errorf("PruneStep after the write = %+v, %v; want nothing deleted", r, err)
			}
			got, want := mustLeftOf(t, c, "big", "k"), before
			if tc.kept31 {
				want.messages = append(slices.Clone(want.messages), 31)
			}
			if tc.kept != "" {
				want.outbox = append(slices.Clone(want.outbox), tc.kept)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("left of big after the write and a step: %+v, want %+v", got, want)
			}
		})
	}
}

// mustOutboxOf returns the outbox rows of key k: seq, session id, kind, state and text of each.
func mustOutboxOf(t *testing.T, c *pgx.Conn, key string) []string {
	t.Helper()
	var rows []string
	err := c.QueryRow(context.Background(), `SELECT ARRAY(SELECT seq || ' ' || session_id || ' ' || kind || ' ' || state || ' ' || text
		FROM outbox WHERE session_key = $1 ORDER BY seq)`, key).Scan(&rows)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// mustPass runs the steps of a prune pass (sessions ended an hour after t0 or before), and
// returns what they swept.
func mustPass(t *testing.T, s *Store) int {
	t.Helper()
	swept := 0
	for range 20 {
		c, err := s.PruneStep(context.Background(), t0.Add(time.Hour), 0)
		if err != nil {
			t.Fatal(err)
		}
		swept += c.Swept
		if !c.More {
			return swept
		}
	}
	t.Fatal("20 steps and more to come, want the pass to end")
	return 0
}

// TestPruneSweepsAReplyDeliveredAfterItsSessionWent: a reply committed for a session while a
// step deletes it (after the step checked it again: an outbox entry has no foreign key, and
// the row lock holds it up not) is kept, pending, as the session goes; once it is delivered,
// the next pass's sweep empties it into the key's pruned marker. The step's own sweep deleted
// the marker the step had made, no longer the key's last. Before, the reply stayed for ever, its text with
// it, in the key's SSE replay: a prune step finds outbox rows only through their session.
func TestPruneSweepsAReplyDeliveredAfterItsSessionWent(t *testing.T) {
	ctx := context.Background()
	s, dsn := MustOpen(t)
	mustEndedSession(t, s, "hi", "more")
	tx := mustWriteInTx(t, dsn, `SELECT 1 FROM outbox WHERE session_key = 'k' AND seq = 1 FOR UPDATE`)
	done := pruneStepInTheBackground(s, 0)
	waitForLockWaits(t, dsn, 1, nil) // the step checked the session again, and waits in its outbox DELETE
	mustExecIn(t, tx, `INSERT INTO outbox (session_key, seq, session_id, kind, text, state)
		VALUES ('k', 3, 'old', 'reply', 'late answer', 'pending')`)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// The step's sweep deleted the marker it had made of entry 2: entry 3 is the key's last.
	if r := <-done; r.err != nil || r.c.Sessions != 1 || r.c.Swept != 1 {
		t.Fatalf("PruneStep = %+v, %v; want the session deleted and 1 row swept", r.c, r.err)
	}
	c := mustConn(t, dsn)
	want := []string{"3 old reply pending late answer"}
	if got := mustOutboxOf(t, c, "k"); !reflect.DeepEqual(got, want) {
		t.Fatalf("k's outbox after the step = %q, want %q", got, want)
	}
	if n := mustPass(t, s); n != 0 {
		t.Errorf("a pass swept %d rows while the reply was pending, want none", n)
	}
	if got := mustOutboxOf(t, c, "k"); !reflect.DeepEqual(got, want) {
		t.Errorf("k's outbox after a pass while the reply was pending = %q, want %q", got, want)
	}

	storetest.MustCommit(t, s, &persistence.MarkDelivery{SessionKey: "k", Seq: 3, State: persistence.DeliveryDelivered, At: t0.Add(2 * time.Hour)})
	if n := mustPass(t, s); n != 1 {
		t.Errorf("the pass after the reply was delivered swept %d rows, want 1", n)
	}
	if got, want := mustOutboxOf(t, c, "k"), []string{"3 old pruned delivered "}; !reflect.DeepEqual(got, want) {
		t.Errorf("k's outbox after the pass = %q, want %q", got, want)
	}
}

// TestPruneSweepWaitsForNoRowLock: the sweep skips an outbox row a commit holds (a delivery
// mark, say) rather than wait for it: the step holds the row locks of the sessions it deleted,
// and the commit may wait for one of those. The next pass takes the row.
func TestPruneSweepWaitsForNoRowLock(t *testing.T) {
	ctx := context.Background()
	s, dsn := MustOpen(t)
	storetest.MustCommit(t, s,
		&persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: "k", Seq: 1, SessionID: "gone", Kind: "reply",
			Text: "late answer", State: persistence.DeliveryDelivered, CreatedAt: t0}},
		&persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: "k", Seq: 2, SessionID: "gone", Kind: "reply",
			Text: "later answer", State: persistence.DeliveryDelivered, CreatedAt: t0}})
	tx := mustWriteInTx(t, dsn, `SELECT 1 FROM outbox WHERE session_key = 'k' AND seq = 1 FOR UPDATE`)
	done := pruneStepInTheBackground(s, 0)
	finished := make(chan struct{})
	var r stepResult
	go func() { r = <-done; close(finished) }()
	waitForLockWaits(t, dsn, 1, finished)
	select {
	case <-finished:
	default:
		t.Fatal("the step waits for the row the writer holds")
	}
	if r.err != nil || r.c.Swept != 1 {
		t.Errorf("PruneStep = %+v, %v; want 1 row swept (seq 2, emptied), seq 1 skipped", r.c, r.err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := mustPass(t, s); n != 1 {
		t.Errorf("the next pass swept %d rows, want 1", n)
	}
	if got, want := mustOutboxOf(t, mustConn(t, dsn), "k"), []string{"2 gone pruned delivered "}; !reflect.DeepEqual(got, want) {
		t.Errorf("k's outbox after the next pass = %q, want %q", got, want)
	}
}

// mustWriteInTx begins a transaction on a connection of its own to dsn, runs qs in it (a test's
// write, or the row locks it holds while a prune step runs) and returns it open; it is rolled
// back at the test's end unless the test commits it.
func mustWriteInTx(t *testing.T, dsn string, qs ...string) pgx.Tx {
	t.Helper()
	tx, err := mustConn(t, dsn).Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	mustExecIn(t, tx, qs...)
	return tx
}

// mustExecIn runs qs in tx.
func mustExecIn(t *testing.T, tx pgx.Tx, qs ...string) {
	t.Helper()
	for _, q := range qs {
		if _, err := tx.Exec(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}
