package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
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
