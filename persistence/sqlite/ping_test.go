package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/persistence"
)

// TestPingNamesALockHeldByAnotherProcess: while another connection holds the database's write
// lock (a sqlite3 shell in BEGIN EXCLUSIVE), Ping says so at once. Before, it waited out the
// writer's busy timeout (5 s) on the write lock, past a readiness probe's deadline, and said
// "ping: context deadline exceeded". The deadline here is shorter than that busy timeout.
// Afterwards the writer's busy timeout is the DSN's again, so commits still wait for a lock.
func TestPingNamesALockHeldByAnotherProcess(t *testing.T) {
	s := MustOpen(t, Options{})
	conn := lockFromAnotherConnection(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	err := s.Ping(ctx)
	if err == nil || !strings.Contains(err.Error(), "locked by another process (SQLITE_BUSY)") || ctx.Err() != nil {
		t.Errorf("Ping with the write lock held elsewhere = %v (deadline: %v), want an error naming the lock before the deadline", err, ctx.Err())
	}
	if !errors.Is(err, persistence.ErrUnavailable) {
		t.Errorf("Ping with the write lock held elsewhere = %v, want it to wrap persistence.ErrUnavailable", err)
	}
	if _, err := conn.ExecContext(t.Context(), "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(t.Context()); err != nil {
		t.Errorf("Ping after the lock is released = %v, want nil", err)
	}
	var busy int
	if err := s.writer.QueryRowContext(t.Context(), "PRAGMA busy_timeout").Scan(&busy); err != nil {
		t.Fatal(err)
	}
	if busy != 5000 {
		t.Errorf("writer's busy_timeout after Ping = %d, want 5000", busy)
	}
}

// TestPingBehindAWaitingCommitSaysWhy: a commit that waits for a lock held by another process
// holds the writer connection; a Ping behind it ends with its caller's deadline and says that
// writes wait for the database, not just "context deadline exceeded".
func TestPingBehindAWaitingCommitSaysWhy(t *testing.T) {
	s := MustOpen(t, Options{CheckpointInterval: time.Hour}) // only the commit takes the writer
	conn := lockFromAnotherConnection(t, s)
	committed := make(chan []error, 1)
	go func() {
		committed <- s.Commit(context.Background(), [][]persistence.Op{{&persistence.CreateSession{Session: newSession("s1", "k1")}}})
	}()
	deadline := time.Now().Add(4 * time.Second)
	for s.writer.Stats().InUse == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the commit did not take the writer connection within 4 s: the test does not test")
		}
		time.Sleep(time.Millisecond) // polling for the commit to take the writer, not waiting for an effect
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if err := s.Ping(ctx); err == nil || !strings.Contains(err.Error(), "writes are waiting for the database") {
		t.Errorf("Ping behind a waiting commit = %v, want an error saying writes wait for the database", err)
	}
	if _, err := conn.ExecContext(t.Context(), "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	for _, err := range <-committed {
		if err != nil {
			t.Errorf("Commit once the lock is released: %v", err)
		}
	}
}

// TestPingAtItsDeadlineKeepsTheWritersBusyTimeout: a Ping whose deadline ends while it sets its
// short busy timeout leaves the writer's 5 s. Before, the driver reported the deadline for a
// pragma that had run, Ping returned before it set the timeout back, and the writer kept
// 200 ms: a commit behind another process's lock then failed after 200 ms and went to the spool
// (found by a review). Deadlines from 0 to 400 µs meet every step of Ping.
func TestPingAtItsDeadlineKeepsTheWritersBusyTimeout(t *testing.T) {
	s := MustOpen(t, Options{CheckpointInterval: time.Hour})
	for i := range 4000 {
		d := time.Duration(i%400) * time.Microsecond
		ctx, cancel := context.WithTimeout(context.Background(), d)
		err := s.Ping(ctx)
		cancel()
		if err == nil {
			continue
		}
		var busy int
		if err := s.writer.QueryRowContext(context.Background(), "PRAGMA busy_timeout").Scan(&busy); err != nil {
			t.Fatal(err)
		}
		if busy != int(writerBusy.Milliseconds()) {
			t.Fatalf("Ping %d with a deadline of %v: %v; the writer's busy_timeout is now %d ms, want %d", i, d, err, busy, writerBusy.Milliseconds())
		}
	}
}

// lockFromAnotherConnection takes s's database's write lock (BEGIN EXCLUSIVE) on a connection
// of its own, as a sqlite3 shell in a transaction does, and returns the connection, which the
// test closes (or ROLLBACKs) to release it.
func lockFromAnotherConnection(t *testing.T, s *Store) *sql.Conn {
	t.Helper()
	conn, err := MustRawDB(t, s.Path()).Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.ExecContext(t.Context(), "BEGIN EXCLUSIVE"); err != nil {
		t.Fatalf("take the write lock: %v", err)
	}
	return conn
}

// TestOpenNamesALockHeldByAnotherProcess: a start while another connection holds the write
// lock (a sqlite3 shell in a transaction) is refused with what holds it and what to do, not
// only "migrate: database is locked (5)". It waits out the busy timeout (5 s) first.
func TestOpenNamesALockHeldByAnotherProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agentgate.db")
	s, err := Open(t.Context(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	conn, err := MustRawDB(t, path).Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(t.Context(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatalf("take the write lock: %v", err)
	}
	s, err = Open(t.Context(), path, Options{})
	if err == nil {
		s.Close()
		t.Fatal("Open with the write lock held elsewhere succeeded, want it refused")
	}
	if msg := err.Error(); !strings.Contains(msg, "locked by another process (SQLITE_BUSY)") || !strings.Contains(msg, "fuser "+path) {
		t.Errorf("Open with the write lock held elsewhere = %v, want it to name the lock and how to find its holder", err)
	}
}
