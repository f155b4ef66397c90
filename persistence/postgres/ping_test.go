package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestPingSaysWritesWaitForATableLock: while another session holds a lock that a commit waits
// for (LOCK TABLE messages, as a migration or an operator's transaction may), Ping says that
// this daemon's writes are waiting for the database, as the SQLite store's does when its writer
// stays busy; once the lock is let go, the commit goes through and Ping passes. Before, Ping
// passed all along (the lock check and SHOW do not touch the table), and /readyz said ready
// while every commit waited, up to the store's 15 s.
func TestPingSaysWritesWaitForATableLock(t *testing.T) {
	s, dsn := openUnchecked(t)
	defer s.Close()
	ctx := context.Background()
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
	locker := mustConn(t, dsn)
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `LOCK TABLE messages IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() {
		committed <- s.Commit(ctx, [][]persistence.Op{{&persistence.AppendMessage{Message: persistence.Message{
			SessionID: "s1", Seq: 1, Role: persistence.RoleUser, Content: "hi", CreatedAt: t0}}}})[0]
	}()
	watcher := mustConn(t, dsn)
	awaitWaiter(t, watcher, "the commit", "the table lock", `SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
		WHERE c.relname = 'messages' AND NOT l.granted`)
	pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = s.Ping(pctx)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "ping: no answer within") ||
		!strings.Contains(err.Error(), "this daemon's writes are waiting for the database") {
		t.Errorf("Ping while a commit waits for a table lock = %v, want an error saying the writes wait for the database", err)
	}
	if !errors.Is(err, persistence.ErrUnavailable) {
		t.Errorf("Ping while a commit waits for a table lock = %v, want it to wrap persistence.ErrUnavailable", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-committed; err != nil {
		t.Errorf("Commit once the lock is let go: %v", err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping once the lock is let go = %v, want nil", err)
	}
}
