package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/jackc/pgx/v5"
)

// poolSessionsSQL selects the sessions of a store's pool on the current database: every one but
// the caller's and the daemon lock's.
const poolSessionsSQL = `FROM pg_stat_activity a
	WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
	AND a.pid NOT IN (SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted)`

// mustEndPool ends the sessions of a store's pool connections from c (pg_terminate_backend, as
// an administrator, a pooler's or the server's idle_session_timeout or a failover does), not the
// daemon lock's, waits until the server has ended them, and returns how many it ended.
func mustEndPool(t *testing.T, c *pgx.Conn) int {
	t.Helper()
	ctx := context.Background()
	var n int
	if err := c.QueryRow(ctx, `SELECT count(pg_terminate_backend(a.pid)) `+poolSessionsSQL).Scan(&n); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left int
		if err := c.QueryRow(ctx, `SELECT count(*) `+poolSessionsSQL).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the pool's sessions are still there 10 s after their end", left)
		}
		time.Sleep(time.Millisecond) // polls the server under a deadline
	}
}

// mustUseConns leaves n idle connections in s's pool, each used just now.
func mustUseConns(t *testing.T, s *Store, n int) {
	t.Helper()
	for range n {
		c, err := s.pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		if _, err := c.Exec(context.Background(), `SELECT 1`); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEndedIdleConnectionsFailNoCall: a store's call right after the server ended the sessions
// of its idle pool connections (pg_terminate_backend; a pooler's or the server's
// idle_session_timeout, a failover do the same) runs again on a live connection (again.go) and
// succeeds. Before the pool pinged every connection it handed out, pgxpool pinged only a
// connection idle for more than a second, and the first call on each failed, FATAL 57P01 or a
// broken pipe: a commit's BEGIN ("commit: begin: FATAL: terminating connection due to
// administrator command"), whose batch a daemon spooled with /readyz at 503 for about a second
// (26 of 38 spool episodes in a soak), a read, a ping. With neither the ping nor the retry, every
// case fails.
func TestEndedIdleConnectionsFailNoCall(t *testing.T) {
	s, dsn := openUnchecked(t)
	defer s.Close()
	c := mustConn(t, dsn)
	ctx := context.Background()
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s0", "k0")},
		&persistence.AppendMessage{Message: persistence.Message{SessionID: "s0", Seq: 1,
			Role: persistence.RoleUser, Content: "hi", CreatedAt: t0}})
	n := 0
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"commit", func() error {
			n++
			id := fmt.Sprintf("s%d", n)
			if err := s.Commit(ctx, [][]persistence.Op{{&persistence.CreateSession{Session: newSession(id, "k"+id)}}})[0]; err != nil {
				return err
			}
			_, err := s.Session(ctx, id)
			return err
		}},
		{"read", func() error { _, err := s.Session(ctx, "s0"); return err }},
		{"listing", func() error { _, err := s.ListSessions(ctx, persistence.ListFilter{}); return err }},
		{"transcript page", func() error { _, err := s.TranscriptAfter(ctx, "s0", 0, 10); return err }},
		{"load session", func() error { _, err := s.LoadSession(ctx, "k0", 10, 10); return err }},
		{"ping", func() error { return s.Ping(ctx) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mustUseConns(t, s, 3)
			if ended := mustEndPool(t, c); ended < 3 {
				t.Fatalf("ended %d of the pool's sessions, want 3 or more", ended)
			}
			if err := tc.call(); err != nil {
				t.Errorf("%s after the server ended the idle pool connections: %v, want nil", tc.name, err)
			}
			if err := tc.call(); err != nil {
				t.Errorf("%s again: %v, want nil", tc.name, err)
			}
		})
	}
}

// TestConnectionEndedAfterItsAcquisitionFailsNoCall: a call whose connection's session the
// server ends after the pool handed it out, before the call's first statement on it, runs again
// on another connection and succeeds, once: a commit is applied, a read answers. The ping of
// every connection the pool handed out left this window open (the session ended between the
// ping and the first statement), and such a call failed: a commit's batch was spooled.
func TestConnectionEndedAfterItsAcquisitionFailsNoCall(t *testing.T) {
	s, dsn := openUnchecked(t)
	defer s.Close()
	c := mustConn(t, dsn)
	ctx := context.Background()
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s0", "k0")},
		&persistence.AppendMessage{Message: persistence.Message{SessionID: "s0", Seq: 1,
			Role: persistence.RoleUser, Content: "hi", CreatedAt: t0}})
	var end atomic.Bool // end the session of the next connection handed out
	var ended atomic.Int32
	s.acquired = func(conn *pgx.Conn) {
		if !end.CompareAndSwap(true, false) {
			return
		}
		var gone bool // pg_terminate_backend's timeout waits for the backend's exit
		if err := c.QueryRow(ctx, `SELECT pg_terminate_backend($1, 10000)`, conn.PgConn().PID()).Scan(&gone); err != nil || !gone {
			t.Errorf("end the session of a connection just handed out: %v, %v", gone, err)
			return
		}
		ended.Add(1)
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"commit", func() error {
			return s.Commit(ctx, [][]persistence.Op{{&persistence.CreateSession{Session: newSession("s1", "k1")}}})[0]
		}},
		{"read", func() error { _, err := s.Session(ctx, "s0"); return err }},
		{"listing", func() error { _, err := s.ListSessions(ctx, persistence.ListFilter{}); return err }},
		{"load session", func() error { _, err := s.LoadSession(ctx, "k0", 10, 10); return err }},
		{"transaction", func() error { _, err := s.Pardon(ctx, "k0"); return err }},
		{"batch", func() error { _, err := s.Holders(ctx, "c", []string{"k0"}, time.Minute); return err }},
		{"ping", func() error { return s.Ping(ctx) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := ended.Load()
			end.Store(true)
			if err := tc.call(); err != nil {
				t.Errorf("%s on a connection ended after its acquisition: %v, want nil", tc.name, err)
			}
			if ended.Load() != before+1 {
				t.Fatalf("ended %d sessions, want 1: the test does not test", ended.Load()-before)
			}
		})
	}
	if _, err := s.Session(ctx, "s1"); err != nil {
		t.Errorf("Session(s1) after its commit: %v, want it committed", err)
	}
}

// TestLostCommitAnswerOfAnAbortedTransactionRunsAgain: a commit whose connection dies once its
// COMMIT is sent, and whose transaction the server aborted (a deferred trigger ends its own
// session at the COMMIT, which counts each COMMIT in a sequence, outside any transaction), runs
// once more, on another connection, as one whose connection died before its COMMIT does: the
// server's record of the transaction (pg_xact_status) says nothing was written. Run again, it
// commits, its attempt counter counted once; aborted again, it fails with ErrUnavailable (a
// daemon spools it) and is not run a third time. Before, each failed at once with
// ErrUnavailable: not run again, since the server may have committed it
// (TestLostCommitAnswerOfACommittedTransactionIsTaken). A transaction of the store's own that
// reads its id too (BeginRun: inTxSettled) runs again so; before, it failed at once.
func TestLostCommitAnswerOfAnAbortedTransactionRunsAgain(t *testing.T) {
	s, dsn := openUnchecked(t)
	defer s.Close()
	c := mustConn(t, dsn)
	ctx := context.Background()
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s0", "k0")},
		&persistence.AppendMessage{Message: persistence.Message{SessionID: "s0", Seq: 1,
			Role: persistence.RoleUser, Content: "hi", CreatedAt: t0}})
	for _, q := range []string{
		`CREATE SEQUENCE commits_ended`,
		`CREATE SEQUENCE once_ended`,
		// end_at_commit('always') ends every COMMIT it meets, end_at_commit('once') the first.
		`CREATE FUNCTION end_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF TG_ARGV[0] = 'always' OR nextval('once_ended') = 1 THEN
				PERFORM nextval('commits_ended');
				PERFORM pg_terminate_backend(pg_backend_pid());
			END IF;
			RETURN NULL;
		END $$`,
		`CREATE CONSTRAINT TRIGGER end_at_commit AFTER INSERT ON sessions DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW WHEN (NEW.id = 'doomed') EXECUTE FUNCTION end_at_commit('always')`,
		`CREATE CONSTRAINT TRIGGER end_once_at_commit AFTER INSERT ON sessions DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW WHEN (NEW.id = 'once') EXECUTE FUNCTION end_at_commit('once')`,
		`CREATE CONSTRAINT TRIGGER end_at_commit AFTER UPDATE ON daemon_run DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW WHEN (NEW.run = 'doomed') EXECUTE FUNCTION end_at_commit('always')`,
		`CREATE CONSTRAINT TRIGGER end_once_at_commit AFTER UPDATE ON daemon_run DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW WHEN (NEW.run = 'once') EXECUTE FUNCTION end_at_commit('once')`,
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	commit := func(id string) func() error {
		return func() error {
			return s.Commit(ctx, [][]persistence.Op{{&persistence.CreateSession{Session: newSession(id, "k"+id)},
				&persistence.IncrementAttempts{SessionID: "s0", Seqs: []int64{1}}}})[0]
		}
	}
	for _, tc := range []struct {
		name     string
		call     func() error
		want     error // errors.Is of the call's error; nil for nil
		ended    int64 // COMMITs the trigger ended
		attempts int   // of s0/1, after the call
	}{
		{"commit aborted once", commit("once"), nil, 1, 1},
		{"commit aborted twice", commit("doomed"), persistence.ErrUnavailable, 2, 1},
		{"transaction aborted once", func() error {
			if _, err := c.Exec(ctx, `ALTER SEQUENCE once_ended RESTART`); err != nil { // the commit's took it
				return err
			}
			_, err := s.BeginRun(ctx, "once", t0)
			return err
		}, nil, 1, 1},
		{"transaction aborted twice", func() error { _, err := s.BeginRun(ctx, "doomed", t0); return err }, persistence.ErrUnavailable, 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before int64
			if err := c.QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM commits_ended`).Scan(&before); err != nil {
				t.Fatal(err)
			}
			err := tc.call()
			if (tc.want == nil && err != nil) || !errors.Is(err, tc.want) {
				t.Errorf("%s whose connection died at its COMMIT = %v, want %v", tc.name, err, tc.want)
			}
			var after int64
			if err := c.QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM commits_ended`).Scan(&after); err != nil {
				t.Fatal(err)
			}
			if after-before != tc.ended {
				t.Errorf("%s: the trigger ended %d COMMITs, want %d", tc.name, after-before, tc.ended)
			}
			if n := mustAttempts(t, c, "s0", 1); n != tc.attempts {
				t.Errorf("%s: attempts of s0/1 = %d, want %d (each aborted run counts nothing)", tc.name, n, tc.attempts)
			}
		})
	}
	if _, err := s.Session(ctx, "once"); err != nil {
		t.Errorf("Session(once) = %v, want it stored by the commit run again", err)
	}
	if _, err := s.Session(ctx, "doomed"); !errors.Is(err, persistence.ErrNotFound) {
		t.Errorf("Session(doomed) = %v, want persistence.ErrNotFound (the trigger ended each transaction)", err)
	}
	var run string
	if err := c.QueryRow(ctx, `SELECT run FROM daemon_run`).Scan(&run); err != nil || run != "once" {
		t.Errorf("the run recorded = %q, %v; want once (recorded by its transaction run again; doomed's never)", run, err)
	}
}

// TestCallEndedWhileItWaitsForARowLockRunsAgain: a transaction whose session the server ends
// while a statement of it waits for a row lock another session holds (pg_terminate_backend: an
// administrator, a soak's kills) committed nothing, since its COMMIT was never sent, and runs
// again on another connection (again.go), where it waits for the lock in turn and commits once
// the lock is let go: a commit, and a transaction of the store's own (BeginRun).
func TestCallEndedWhileItWaitsForARowLockRunsAgain(t *testing.T) {
	s, dsn := openUnchecked(t)
	defer s.Close()
	ctx := context.Background()
	admin := mustConn(t, dsn)
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s0", "k0")})
	if _, err := s.BeginRun(ctx, "r0", t0); err != nil {
		t.Fatal(err)
	}
	// waiters returns the sessions of the database that wait for a lock (the store's).
	waiters := func() []uint32 {
		t.Helper()
		rows, err := admin.Query(ctx, `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`)
		if err != nil {
			t.Fatal(err)
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
		if err != nil {
			t.Fatal(err)
		}
		return pids
	}
	for _, tc := range []struct {
		name  string
		lock  string // takes the row lock the call waits for
		call  func() error
		check string // true once the call took effect
	}{
		{"commit", `SELECT 1 FROM sessions WHERE id = 's0' FOR UPDATE`, func() error {
			return s.Commit(ctx, [][]persistence.Op{{&persistence.TouchSession{SessionID: "s0", At: t0.Add(time.Hour)}}})[0]
		}, `SELECT last_activity_at = ` + fmt.Sprint(t0.Add(time.Hour).UnixNano()) + ` FROM sessions WHERE id = 's0'`},
		{"transaction", `SELECT 1 FROM daemon_run FOR UPDATE`, func() error {
			_, err := s.BeginRun(ctx, "r1", t0.Add(time.Hour))
			return err
		}, `SELECT run = 'r1' FROM daemon_run`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			holder := mustConn(t, dsn) // holds the row lock in a transaction of its own
			tx, err := holder.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, tc.lock); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- tc.call() }()
			// waitFor waits until a session other than those of not waits for the lock, and
			// returns its pid; 0 when the call ended first.
			waitFor := func(not ...uint32) uint32 {
				t.Helper()
				deadline := time.Now().Add(10 * time.Second)
				for {
					for _, pid := range waiters() {
						if !slices.Contains(not, pid) {
							return pid
						}
					}
					select {
					case err := <-done:
						done <- err
						return 0
					default:
					}
					if time.Now().After(deadline) {
						t.Fatal("no session of the store waits for the row lock 10 s on")
					}
					time.Sleep(time.Millisecond) // polls the server under a deadline
				}
			}
			first := waitFor()
			if first == 0 {
				t.Fatalf("%s ended before it waited for the row lock: %v", tc.name, <-done)
			}
			var gone bool // pg_terminate_backend's timeout waits for the backend's exit
			if err := admin.QueryRow(ctx, `SELECT pg_terminate_backend($1, 10000)`, first).Scan(&gone); err != nil || !gone {
				t.Fatalf("end the waiting session: %v, %v", gone, err)
			}
			if again := waitFor(first); again == 0 {
				t.Fatalf("%s whose session ended while it waited for a row lock: %v, want it run again", tc.name, <-done)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Errorf("%s run again once the row lock is let go: %v, want nil", tc.name, err)
			}
			var took bool
			if err := admin.QueryRow(ctx, tc.check).Scan(&took); err != nil || !took {
				t.Errorf("%s took effect = %v, %v; want true", tc.name, took, err)
			}
		})
	}
}
