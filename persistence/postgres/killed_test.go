package postgres

import (
	"context"
	"fmt"
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
// idle_session_timeout, a failover do the same) takes a live connection and succeeds. Before,
// pgxpool pinged only a connection idle for more than a second, and the first call on each
// failed, FATAL 57P01 or a broken pipe: a commit's BEGIN ("commit: begin: FATAL: terminating
// connection due to administrator command"), whose batch a daemon spooled with /readyz at 503
// for about a second (26 of 38 spool episodes in a soak), a read, a ping.
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
