package persistence_test

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/persistence"
)

// TestAWriteBehindTheSpoolIsRefusedWhenTheSpoolFails: while writes wait in the spool (the
// database refused them: locked by another process, or on another disk), a write goes to the
// spool behind them without trying the database; when the spool cannot take it either (its
// disk is now full too), its sender is answered at once that it was refused, in words that say
// why, and the actor carries on. Before, the actor read the database's error of a write that
// never met the database (nil) to word the refusal, and panicked: each such write restarted it
// and was never answered, so that a session waited for it until its own timeout (found by a
// disk-full soak of the binary).
func TestAWriteBehindTheSpoolIsRefusedWhenTheSpoolFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var incarnation atomic.Uint64
		w := newBrokenWorld(t, persistence.ActorOptions{Incarnation: &incarnation}, nil)
		st, sp, broken, out := w.st, w.sp, w.broken, w.out
		id := uint64(0)
		write := func(ops ...persistence.Op) error {
			t.Helper()
			id++
			return w.send(&persistence.Write{ID: id, Ops: ops, Incarnation: incarnation.Load()})
		}
		if err := write(session("s1", "k1", t0)); err != nil {
			t.Fatal(err)
		}
		out.Down.Store(true)
		if err := write(userMessage("s1", 1, "m1")); err != nil {
			t.Fatalf("write while the database is down: %v, want it spooled", err)
		}
		broken.append.Store(true) // the spool's disk is full now too
		for seq := int64(2); seq <= 3; seq++ {
			err := write(userMessage("s1", seq, "m"+string(rune('0'+seq))))
			const why = "spool failed too: no space left on device (database: earlier writes wait in the spool for it)"
			if !errors.Is(err, persistence.ErrUnavailable) || !strings.Contains(err.Error(), why) {
				t.Errorf("write behind the spool with the spool failing = %v, want ErrUnavailable saying %q", err, why)
			}
		}
		if n := incarnation.Load(); n != 0 {
			t.Errorf("the actor restarted %d times, want 0", n)
		}

		// Room again, the database back: all the writes taken are stored, in order.
		broken.append.Store(false)
		out.Down.Store(false)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if sp.Len() != 0 {
			t.Fatalf("spool holds %d batches, want it drained", sp.Len())
		}
		if err := write(userMessage("s1", 2, "m2")); err != nil {
			t.Fatalf("m2 sent again: %v", err)
		}
		msgs, err := st.Transcript(t.Context(), "s1")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range msgs {
			got = append(got, m.MessageID)
		}
		if strings.Join(got, " ") != "m1 m2" {
			t.Errorf("stored messages = %q, want m1 m2", got)
		}
	})
}
