package persistence_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestTheEndOfRefusedWritesIsLogged: once the database or the spool takes writes again after
// both refused them (a full disk that has room again), the actor says so at Info, with how
// many write groups it refused in all and for how long. Before, the outage's ERR line, once a
// minute, was its only trace: its end was not logged, and the refusals after its last line were
// counted in none, so that at 3 a.m. the log could not say whether the disk was still full, nor
// how many messages were refused (found by a disk-full soak of the binary). A second outage
// logs its own ERR line at once, and its own end.
func TestTheEndOfRefusedWritesIsLogged(t *testing.T) {
	for _, tt := range []struct {
		name string
		room func(out *storetest.Outage, broken *brokenSpool) // the disk has room again
	}{
		{"the database takes them", func(out *storetest.Outage, broken *brokenSpool) {
			out.Down.Store(false)
			broken.append.Store(false)
		}},
		{"the spool takes them", func(_ *storetest.Outage, broken *brokenSpool) { broken.append.Store(false) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newBrokenWorld(t, persistence.ActorOptions{}, nil)
				out, broken, logs := w.out, w.broken, w.logs
				id := uint64(0)
				write := func(ops ...persistence.Op) error {
					t.Helper()
					id++
					return w.write(id, ops...)
				}
				if err := write(session("s1", "k1", t0)); err != nil {
					t.Fatal(err)
				}
				seq := int64(0)
				outage := func(writes int, every time.Duration) {
					t.Helper()
					out.Down.Store(true)
					broken.append.Store(true)
					for range writes {
						seq++
						if err := write(userMessage("s1", seq, "m"+string(rune('a'+seq)))); !errors.Is(err, persistence.ErrUnavailable) {
							t.Fatalf("write during the outage: %v, want ErrUnavailable", err)
						}
						time.Sleep(every)
					}
				}
				const end = "writes taken again after the database and spool both refused them"

				outage(15, 5*time.Second) // 75 s: two ERR lines, the second with repeats=11, and 3 refusals after it
				if strings.Contains(logs.String(), end) {
					t.Fatalf("the end logged during the outage:\n%s", logs.String())
				}
				tt.room(out, broken)
				seq++
				if err := write(userMessage("s1", seq, "m-room")); err != nil {
					t.Fatalf("write once the disk has room: %v", err)
				}
				synctest.Wait()
				lines := strings.Split(logs.String(), "\n")
				var got []string
				for _, l := range lines {
					if strings.Contains(l, end) {
						got = append(got, l)
					}
				}
				if len(got) != 1 || !strings.Contains(got[0], "level=INFO") || !strings.Contains(got[0], "refused=15 ") ||
					!strings.Contains(got[0], "lasted=1m15s") {
					t.Fatalf("lines of the end = %q, want one INFO line with refused=15 and lasted=1m15s:\n%s", got, logs.String())
				}

				// A second outage: its own ERR line at once, and its own end.
				before := strings.Count(logs.String(), "database and spool both failed; writes refused")
				outage(2, time.Second)
				if n := strings.Count(logs.String(), "database and spool both failed; writes refused") - before; n != 1 {
					t.Errorf("a second outage logged %d ERR lines at its start, want 1:\n%s", n, logs.String())
				}
				tt.room(out, broken)
				seq++
				if err := write(userMessage("s1", seq, "m-room2")); err != nil {
					t.Fatalf("write once the disk has room again: %v", err)
				}
				synctest.Wait()
				if !strings.Contains(logs.String(), end+`" refused=2 lasted=2s`) {
					t.Errorf("the second outage's end not logged with refused=2 lasted=2s:\n%s", logs.String())
				}
			})
		})
	}
}

// TestASpoolReplayEndsTheRefusals: writes wait in the spool, the spool then refuses writes too
// (its disk full), and the disk has room again with no new write coming: the replay that
// drains the spool into the database ends the refusals (/readyz's Refusals.Err) and logs their
// end. Before, only a new write taken ended them: a daemon that had no traffic once the disk had
// room said in /readyz, for RefusalMemory more, that writes were refused, while the database
// had just taken every spooled write (found by TestReadyzNamesWritesRefusedBehindTheSpool, which
// waited for a ready daemon in vain when no turn's write came after the replay).
func TestASpoolReplayEndsTheRefusals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		refusals := &persistence.Refusals{}
		w := newBrokenWorld(t, persistence.ActorOptions{Refusals: refusals}, nil)
		broken, out, write := w.broken, w.out, w.write
		w.spoolOne()
		broken.append.Store(true)
		if err := write(3, userMessage("s1", 2, "refused")); !errors.Is(err, persistence.ErrUnavailable) {
			t.Fatalf("write with the database and the spool failing = %v, want ErrUnavailable", err)
		}
		if refusals.Err(time.Now()) == nil {
			t.Fatal("Refusals.Err after a refusal = nil, want the refusal")
		}

		broken.append.Store(false) // the disk has room again; no write comes
		out.Down.Store(false)
		time.Sleep(2 * time.Second) // two replay ticks (ReplayEvery) of the fake clock
		synctest.Wait()
		w.wantRefusalsEnded(refusals, 1)
	})
}

// TestAReplayThatLeavesTheSpoolEndsNoRefusals: the spool holds writes and can be neither
// written nor emptied (its directory's owner or mode changed, a disk remounted read-only
// under it), while the database takes writes: each replay commits the oldest batch again
// and cannot remove it, and every new write, sent behind it, is refused. Such a replay does
// not end the refusals: /readyz keeps saying writes are refused, and no INF line says they
// are taken again. Before, each replay tick logged the end and cleared the refusal, so that
// the log said ERR and INF in turn every second, each ERR at once (the end resets its once
// a minute), and /readyz said the writes waited in the spool while each was refused.
func TestAReplayThatLeavesTheSpoolEndsNoRefusals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		refusals := &persistence.Refusals{}
		w := newBrokenWorld(t, persistence.ActorOptions{Refusals: refusals}, nil)
		sp, broken, out, logs, write := w.sp, w.broken, w.out, w.logs, w.write
		w.spoolOne()
		broken.append.Store(true)
		broken.remove.Store(true)
		out.Down.Store(false) // the database takes writes; the spool takes none, nor lets go of its batch
		for i := range 3 {
			if err := write(uint64(3+i), userMessage("s1", int64(2+i), "refused")); !errors.Is(err, persistence.ErrUnavailable) {
				t.Fatalf("write behind the spool that cannot be written = %v, want ErrUnavailable", err)
			}
			time.Sleep(1500 * time.Millisecond) // a replay tick (ReplayEvery) of the fake clock
			synctest.Wait()
			if n := sp.Len(); n != 1 {
				t.Fatalf("the spool holds %d batches, want its 1, which it cannot remove", n)
			}
			if err := refusals.Err(time.Now()); err == nil {
				t.Errorf("Refusals.Err after a replay that left the spool as it was = nil, want the refusal: " +
					"the next write is refused too")
			}
		}
		if l := logs.String(); strings.Contains(l, "writes taken again") {
			t.Errorf("the end of the refusals logged while every write was refused:\n%s", l)
		}
		if n := strings.Count(logs.String(), "database and spool both failed; writes refused"); n != 1 {
			t.Errorf("%d ERR lines of the refusals within 5 s, want 1 (then once a minute):\n%s", n, logs.String())
		}

		broken.append.Store(false)
		broken.remove.Store(false)
		time.Sleep(time.Second)
		synctest.Wait()
		w.wantRefusalsEnded(refusals, 3)
	})
}

// TestTheEndOfRefusedWritesIsLoggedAcrossARestart: the persistence actor restarts while the
// database and the spool both refuse writes (a panic of its own, or of the store), and the
// disk then has room again: the end of the outage is logged all the same, counting the writes
// refused before the restart too, and how long since the first. Before, a restart forgot the
// outage (the producer's new incarnation): its end was never logged, and the RUNBOOK's
// `INF writes taken again …`, which an operator waits for, did not come.
func TestTheEndOfRefusedWritesIsLoggedAcrossARestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var store *panicOnce
		w := newBrokenWorld(t, persistence.ActorOptions{}, func(out *storetest.Outage) persistence.Store {
			store = &panicOnce{Store: out}
			return store
		})
		broken, out, logs, system, pid, write := w.broken, w.out, w.logs, w.system, w.pid, w.write
		if err := write(1, session("s1", "k1", t0)); err != nil {
			t.Fatal(err)
		}
		out.Down.Store(true)
		broken.append.Store(true)
		for i := range 2 {
			if err := write(uint64(2+i), userMessage("s1", int64(1+i), "refused")); !errors.Is(err, persistence.ErrUnavailable) {
				t.Fatalf("write with the database and the spool failing = %v, want ErrUnavailable", err)
			}
			time.Sleep(5 * time.Second)
		}
		store.armed.Store(true)
		system.Root.Send(pid, &persistence.Write{ID: 4, Ops: []persistence.Op{userMessage("s1", 3, "lost")}})
		synctest.Wait() // the commit panicked and the actor restarted

		out.Down.Store(false)
		broken.append.Store(false)
		if err := write(5, userMessage("s1", 3, "taken")); err != nil {
			t.Fatalf("write once the disk has room: %v", err)
		}
		synctest.Wait()
		if l := logs.String(); !strings.Contains(l, `msg="writes taken again after the database and spool both refused them" refused=2 lasted=10s`) {
			t.Errorf("the end of the refusals after a restart not logged with refused=2 lasted=10s:\n%s", l)
		}
	})
}

// spoolOne writes session s1 (key k1) to the database, then, the database down, a message of
// it, which the spool takes.
func (w *brokenWorld) spoolOne() {
	w.t.Helper()
	if err := w.write(1, session("s1", "k1", t0)); err != nil {
		w.t.Fatal(err)
	}
	w.out.Down.Store(true)
	if err := w.write(2, userMessage("s1", 1, "spooled")); err != nil {
		w.t.Fatalf("write with the database down = %v, want it taken by the spool", err)
	}
}

// wantRefusalsEnded checks that the spool's replay emptied it and ended the refusals: refusals
// holds none, and the end is logged, counting refused writes.
func (w *brokenWorld) wantRefusalsEnded(refusals *persistence.Refusals, refused int) {
	w.t.Helper()
	if n := w.sp.Len(); n != 0 {
		w.t.Fatalf("the spool holds %d batches once the database and the spool take writes and a replay ran, want none", n)
	}
	if err := refusals.Err(time.Now()); err != nil {
		w.t.Errorf("Refusals.Err once the replay drained the spool = %v, want nil: the database takes writes", err)
	}
	if l := w.logs.String(); !strings.Contains(l, fmt.Sprintf(`msg="writes taken again after the database and spool both refused them" refused=%d `, refused)) {
		w.t.Errorf("the replay that drained the spool did not log the refusals' end with refused=%d:\n%s", refused, l)
	}
}
