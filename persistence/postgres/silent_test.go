package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
)

// TestClaimOutlivesASilentTransaction: a member whose host dies (or is cut off by a network
// partition) in the middle of a commit leaves its transaction open on the server, holding the
// fence of every key it wrote, with nothing that tells the server the client is gone (no
// FIN or RST comes; TCP keepalive notices after about two hours). The server ends such a
// transaction once it has been idle for the store's Timeout, and the member that takes the
// key over claims it then. Before, the claim waited for the dead member's transaction until
// its own timeout, again at every try, and the key's sessions could not start anywhere for
// as long as the server kept that connection.
func TestClaimOutlivesASilentTransaction(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	open := func(timeout time.Duration) *Store {
		t.Helper()
		s, err := Open(ctx, dsn, Options{Timeout: timeout})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	dead, taker := open(2*time.Second), open(20*time.Second)
	claimed, err := dead.Claim(ctx, "k", "dead", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// The dead member's commit has passed the key's fence, and its client falls silent: the
	// server cannot tell a dead host from a slow one.
	tx, err := dead.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, fenceSQL, "k", claimed.Epoch); err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	got, err := taker.Claim(ctx, "k", "taker", time.Now())
	if err != nil {
		t.Fatalf("claim after the holder's transaction fell silent (%v later): %v", time.Since(began).Round(time.Millisecond), err)
	}
	if got.Epoch != claimed.Epoch+1 {
		t.Errorf("claim epoch %d, want %d", got.Epoch, claimed.Epoch+1)
	}
	// The silent transaction commits nothing after the claim.
	if _, err := tx.Exec(ctx, `SELECT 1`); err == nil {
		if err := tx.Commit(ctx); err == nil {
			t.Error("the silent transaction committed after the key was claimed")
		}
	}
	if errs := dead.Commit(ctx, [][]persistence.Op{{&persistence.Fence{Key: "k", Epoch: claimed.Epoch},
		&persistence.CreateSession{Session: newSession("s1", "k")}}}); !errors.Is(errs[0], persistence.ErrFenced) {
		t.Errorf("the old holder's next commit: %v, want ErrFenced", errs[0])
	}
}

// TestSilentLockHolderLosesTheLock: a daemon whose host died (or that a network partition cut
// off) sends no FIN or RST, and the server kept its daemon lock for as long as TCP keepalive
// takes to notice (about two hours by default): a daemon started in its place was refused as
// "another agentgate daemon uses this database" all that time. The server now ends the lock's
// session once its connection has been silent for three lock checks, and the new daemon
// starts; the old one, should it come back, finds its lock lost and its commits fenced.
func TestSilentLockHolderLosesTheLock(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	old, err := Open(ctx, dsn, Options{Exclusive: true, LockCheckInterval: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	// The old daemon falls silent: its lock check (which pings the lock's connection) stops.
	old.lockMu.Lock()
	froze := true
	defer func() {
		if froze {
			old.lockMu.Unlock()
		}
	}()

	began := time.Now()
	successor, err := Open(ctx, dsn, Options{Exclusive: true, LockWait: 20 * time.Second})
	if err != nil {
		t.Fatalf("a daemon started %v after the lock's holder fell silent: %v", time.Since(began).Round(time.Millisecond), err)
	}
	defer successor.Close()

	froze = false
	old.lockMu.Unlock()
	errs := old.Commit(ctx, [][]persistence.Op{{&persistence.CreateSession{Session: newSession("s1", "k")}}})
	if !errors.Is(errs[0], persistence.ErrUnavailable) {
		t.Errorf("the old holder's commit after the successor took the lock: %v, want ErrUnavailable", errs[0])
	}
	if _, err := successor.Session(ctx, "s1"); !errors.Is(err, persistence.ErrNotFound) {
		t.Errorf("the old holder's session row: %v, want none", err)
	}
}
