package persistence_test

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/persistence"
)

// TestRefusalsSayWhenWritesAreRefused: the persistence actor records a write that neither the
// database nor the spool took, for /readyz (on a full disk the store still answers its ping),
// forgets it once a write is taken again, and after persistence.RefusalMemory without writes
// (with no traffic nothing tries the disk again).
func TestRefusalsSayWhenWritesAreRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var refusals persistence.Refusals
		w := newBrokenWorld(t, persistence.ActorOptions{Refusals: &refusals}, nil)
		out, broken, write := w.out, w.broken, w.write

		if err := write(1, session("s1", "k1", t0)); err != nil {
			t.Fatal(err)
		}
		if err := refusals.Err(time.Now()); err != nil {
			t.Fatalf("Refusals.Err after a committed write = %v, want nil", err)
		}
		// The disk is full: the database and the spool both refuse.
		out.Down.Store(true)
		broken.append.Store(true)
		if err := write(2, userMessage("s1", 1, "m1")); !errors.Is(err, persistence.ErrUnavailable) {
			t.Fatalf("write on a full disk: %v, want ErrUnavailable", err)
		}
		if err := refusals.Err(time.Now()); err == nil {
			t.Error("Refusals.Err after a refused write = nil, want the refusal")
		}
		time.Sleep(persistence.RefusalMemory)
		if err := refusals.Err(time.Now()); err != nil {
			t.Errorf("Refusals.Err %v after the last refusal = %v, want nil", persistence.RefusalMemory, err)
		}
		if err := write(3, userMessage("s1", 2, "m2")); !errors.Is(err, persistence.ErrUnavailable) {
			t.Fatalf("write on a full disk: %v, want ErrUnavailable", err)
		}
		refused := time.Now()
		time.Sleep(time.Second)
		if refusals.TakenSince(refused) {
			t.Error("Refusals.TakenSince the last refusal = true with no write taken since")
		}
		// Room on the disk again: the write is spooled, so it is taken.
		broken.append.Store(false)
		if err := write(4, userMessage("s1", 3, "m3")); err != nil {
			t.Fatalf("write to the spool: %v", err)
		}
		if err := refusals.Err(time.Now()); err != nil {
			t.Errorf("Refusals.Err after a spooled write = %v, want nil", err)
		}
		if !refusals.TakenSince(refused) || refusals.TakenSince(time.Now().Add(time.Second)) {
			t.Errorf("Refusals.TakenSince: %v since the refusal, %v a second from now; want true, false",
				refusals.TakenSince(refused), refusals.TakenSince(time.Now().Add(time.Second)))
		}
		out.Down.Store(false)
		time.Sleep(2 * time.Second)
		synctest.Wait()
	})
}
