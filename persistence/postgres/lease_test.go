package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestLease: one holder at a time per name (another name is another lease); a waiting taker
// gets it once the holder releases it; a holder whose connection is cut learns it lost it.
func TestLease(t *testing.T) {
	a, dsn := MustOpen(t)
	b, err := Open(context.Background(), dsn, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	_, releaseA, err := a.Lease(ctx, "discord")
	if err != nil {
		t.Fatal(err)
	}
	_, releaseOther, err := b.Lease(ctx, "another")
	if err != nil {
		t.Fatalf("a lease of another name: %v", err)
	}
	releaseOther()

	taken := make(chan func(), 1)
	go func() {
		_, release, err := b.Lease(ctx, "discord")
		if err != nil {
			t.Error(err)
			close(taken)
			return
		}
		taken <- release
	}()
	select {
	case <-taken:
		t.Fatal("a second holder took a held lease")
	default:
	}
	releaseA()
	releaseA() // twice is harmless
	var releaseB func()
	select {
	case releaseB = <-taken:
	case <-time.After(30 * time.Second):
		t.Fatal("the lease was not taken within 30s of its release")
	}
	lost, _, err := a.Lease(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	restore := pgtest.Cut(t, dsn)
	select {
	case <-lost:
	case <-time.After(30 * time.Second):
		t.Fatal("a lease whose connection was cut was not lost within 30s")
	}
	restore()
	if releaseB != nil {
		releaseB()
	}
}

// TestFormerLeaseHolderClearsNoUnreadPlace: a cluster member whose gateway lease another member
// took while it did not know (its lease connection died; it stalled past the server's idle
// limit) clears no unread place from then on: the new holder loaded the place to read from it,
// and when its read fails the place is all that tells the next holder where to read. Before,
// the former holder's clear, of a read it finished just before (or held up in its queue of
// delivery marks), deleted it, and what was said there while the gateway moved was lost once
// the new holder stopped. The holder clears it, and so does a former holder while no other
// process has taken the lease since its release (its last clears, written as it stops). A place
// a former holder records is not fenced so, but kept: dropped, it could lose what it marks.
func TestFormerLeaseHolderClearsNoUnreadPlace(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	open := func() *Store {
		t.Helper()
		s, err := Open(ctx, dsn, Options{Shared: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := open(), open()
	lease := GatewayLease("discord")
	if _, _, err := a.Lease(ctx, lease); err != nil {
		t.Fatal(err)
	}
	place := persistence.Unread{Platform: "discord", ChatID: "c1", ScopeID: "g1", After: "100", At: t0}
	storetest.MustCommit(t, a, &persistence.MarkUnread{Unread: place})
	places := func(s *Store) []persistence.Unread {
		t.Helper()
		us, err := s.Unread(ctx, "discord", 0)
		if err != nil {
			t.Fatal(err)
		}
		return us
	}

	conn := mustConn(t, dsn)
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
		WHERE locktype = 'advisory' AND classid::bigint = $1 AND granted`, int64(leaseLock)); err != nil {
		t.Fatal(err)
	}
	_, releaseB, err := b.Lease(ctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	if got := places(b); len(got) != 1 || got[0].After != "100" {
		t.Fatalf("the new holder's places = %+v, want c1 after 100", got)
	}
	clear := &persistence.ClearUnread{Platform: "discord", ChatID: "c1", After: "100"}
	storetest.MustCommit(t, a, clear)
	if got := places(b); len(got) != 1 {
		t.Errorf("places after the former holder's clear = %+v, want c1 kept", got)
	}
	// A place the former holder records is kept all the same: it may be all that marks a gap
	// (its record waited out an outage in its queue of delivery marks, and the new holder,
	// which loaded the places before, reads after the messages stored since).
	gap := persistence.Unread{Platform: "discord", ChatID: "c2", ScopeID: "g1", After: "200", At: t0}
	storetest.MustCommit(t, a, &persistence.MarkUnread{Unread: gap})
	if got := places(b); len(got) != 2 || got[1].ChatID != "c2" {
		t.Errorf("places after the former holder's record of c2 = %+v, want c1 and c2", got)
	}
	storetest.MustCommit(t, b, clear, &persistence.ClearUnread{Platform: "discord", ChatID: "c2", After: "200"})
	if got := places(b); len(got) != 0 {
		t.Errorf("places after the holder's clear = %+v, want none", got)
	}

	storetest.MustCommit(t, b, &persistence.MarkUnread{Unread: place})
	releaseB()
	storetest.MustCommit(t, b, clear)
	if got := places(a); len(got) != 0 {
		t.Errorf("places after the clear of a holder that released the lease, taken by none since = %+v, want none", got)
	}
}
