package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
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
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, dsn := MustOpen(t)
			mustEndedSession(t, s, "hi")

			writer := mustConn(t, dsn)
			tx, err := writer.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			for _, q := range tc.write {
				if _, err := tx.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}

			done := pruneStepInTheBackground(s)
			waitForALockWait(t, dsn)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil || r.c.Sessions != 0 {
				t.Errorf("PruneStep = %+v, %v; want no session deleted", r.c, r.err)
			}
			if _, err := s.Session(ctx, "old"); err != nil {
				t.Errorf("the session after the step: %v, want it kept", err)
			}
			var n int
			if err := writer.QueryRow(ctx, tc.kept).Scan(&n); err != nil || n != 1 {
				t.Errorf("%s = %d, %v; want 1", tc.kept, n, err)
			}
		})
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
// before) on a goroutine of its own, and sends its result on the channel it returns.
func pruneStepInTheBackground(s *Store) <-chan stepResult {
	done := make(chan stepResult, 1)
	go func() {
		c, err := s.PruneStep(context.Background(), t0.Add(time.Hour), 0)
		done <- stepResult{c, err}
	}()
	return done
}

// waitForALockWait returns once a session of dsn's database waits for a row lock.
func waitForALockWait(t *testing.T, dsn string) {
	t.Helper()
	ctx := context.Background()
	c := mustConn(t, dsn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		err := c.QueryRow(ctx, `SELECT COUNT(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no session waited for a lock in 30 s")
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
// `state <> 'pending'` filters the step deleted or emptied it (ba361e6).
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
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, dsn := MustOpen(t)
			mustEndedSession(t, s, "hi", "more")

			writer := mustConn(t, dsn)
			tx, err := writer.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, tc.write[0]); err != nil {
				t.Fatalf("%s: %v", tc.write[0], err)
			}
			done := pruneStepInTheBackground(s)
			waitForALockWait(t, dsn) // the step checked the session again, and waits in its outbox DELETE
			for _, q := range tc.write[1:] {
				if _, err := tx.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil || r.c.Sessions != 1 {
				t.Errorf("PruneStep = %+v, %v; want the session deleted", r.c, r.err)
			}
			var n int
			if err := writer.QueryRow(ctx, tc.kept).Scan(&n); err != nil || n != 1 {
				t.Errorf("%s = %d, %v; want 1", tc.kept, n, err)
			}
		})
	}
}
