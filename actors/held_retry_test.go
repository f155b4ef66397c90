package actors

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
)

// TestHeldResultRetriedWhileAWriteBehindItIsInFlightIsTaken: the store refuses m1's turn result
// (a full disk) while m2's, its turn run meanwhile, is still on its way to the persistence actor
// (parked in a relay). The disk gets room, and m3 comes: the session writes m1's result again
// at once, and the store takes it, and then m3. Before, the result went out as sent behind
// m2's unanswered write; the persistence actor, keeping m1's refusal, refused it again although
// the disk had room, and refused m3 with it ("sent behind a write of its sender that was
// refused"), its sender told to send it again.
func TestHeldResultRetriedWhileAWriteBehindItIsInFlightIsTaken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent, disk, release, ran := m1HeldM2InFlight()
		w := newManagerWorldWrites(t, agent, nil, func(s persistence.Store) persistence.Store {
			disk.Store = s
			return disk
		})
		var parked atomic.Bool
		w.d.Persist = relayWrites(w.system, w.d.Persist, func(wr *persistence.Write) bool {
			if slices.ContainsFunc(wr.Ops, resultOf("m2")) {
				parked.Store(true)
				return true
			}
			return false
		}, func(*persistence.Write) {}, func(*persistence.Write, error) {})

		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		if r := w.deliver(t, "m2", "two"); r.Disposition != platforms.Queued {
			t.Fatalf("m2: %+v, want queued", r)
		}
		close(release)
		synctest.Wait() // m1's result waits in its commit; m2's waits in the relay
		if !parked.Load() {
			t.Fatal("m2's result did not reach the relay: the test does not test")
		}
		close(disk.gate)
		synctest.Wait() // the store refused m1's result, and the session holds it
		disk.full.Store(false)

		if r := w.deliver(t, "m3", "three"); r.ErrorCode != "" || r.Disposition != platforms.Queued && r.Disposition != platforms.Started {
			t.Errorf("m3 while m1's result was held and the disk had room: %+v, want it taken", r)
		}
		w.system.Root.Send(w.d.Persist, releaseParked{})
		time.Sleep(time.Minute)
		synctest.Wait()

		var replies []string
		for len(w.sent) > 0 {
			replies = append(replies, (<-w.sent).Out.Text)
		}
		if n := countOf(replies, "echo: one"); n != 1 {
			t.Errorf("m1's reply was sent %d times (all sent: %q), want once", n, replies)
		}
		entries, err := w.store.OutboxAfter(w.ctx, w.key, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		stored := 0
		for _, e := range entries {
			if e.TurnID != "" && slices.Contains(e.InReplyTo, "m1") {
				stored++
			}
		}
		if stored != 1 {
			t.Errorf("the store holds %d replies to m1, want 1", stored)
		}
		if st, _ := w.statusOf(t, "m1"); st != persistence.StatusDone {
			t.Errorf("m1 is %s in the store, want done", st)
		}
		for _, id := range []string{"m1", "m3"} {
			if n := ran(id); n != 1 {
				t.Errorf("the agent ran %s %d times, want once", id, n)
			}
		}
	})
}

// countOf is how many of ss are s.
func countOf(ss []string, s string) int {
	n := 0
	for _, x := range ss {
		if x == s {
			n++
		}
	}
	return n
}

// TestDrainRetriesAHeldResultEachSecond: a stopping daemon writes again the turn result it
// holds at once as its drain begins, and then each heldRetry, so that its drain ends within a
// second of the store taking writes again. Before its stop, the retries back off (1 s doubling
// to maxHeldRetry): a store that stays down is not tried each second. Before, the drain kept the
// backoff: a result refused for 15 s was next tried 10 s later, and the drain, with it the
// stop, ended up to 10 s after the store was back (a cluster soak: 7.8 s after PostgreSQL
// took writes again), while a service manager's stop timeout ran.
func TestDrainRetriesAHeldResultEachSecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		tries := &resultTries{result: resultOf("m1")}
		agent, ran := countingEcho()
		w := newManagerWorldWrites(t, fillsFirst(out, agent), nil, func(s persistence.Store) persistence.Store {
			out.Store = s
			tries.Store = out
			return tries
		})
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		synctest.Wait()
		time.Sleep(16 * time.Second) // tries at 0, 1, 3, 7 and 15 s; the next at 25 s
		synctest.Wait()
		if got := tries.n.Load(); got != 5 {
			t.Fatalf("the store was asked to take the held result %d times in 16 s, want 5 (1 s doubling)", got)
		}

		w.d.Stopping.Store(true) // as Daemon.Stop does before it asks the drain
		drained := w.drain()
		time.Sleep(2500 * time.Millisecond) // tries at 16, 17 and 18 s, refused
		synctest.Wait()
		if answered(drained) {
			t.Fatal("the drain ended while the store refused the held result")
		}
		out.Down.Store(false)
		time.Sleep(time.Second)
		synctest.Wait()
		if !answered(drained) {
			t.Errorf("the drain had not ended 1 s after the store took writes again (the held result tried %d times)", tries.n.Load())
		}
		if len(w.sent) != 1 || (<-w.sent).Out.Text != "echo: one" {
			t.Errorf("the platform was sent %d replies, want m1's", len(w.sent))
		}
		if n := ran("m1"); n != 1 {
			t.Errorf("the agent ran m1 %d times, want once", n)
		}
	})
}

// resultTries counts the commits that hold a write result picks.
type resultTries struct {
	persistence.Store
	result func(persistence.Op) bool
	n      atomic.Int32
}

func (r *resultTries) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	if slices.ContainsFunc(groups, func(g []persistence.Op) bool { return slices.ContainsFunc(g, r.result) }) {
		r.n.Add(1)
	}
	return r.Store.Commit(ctx, groups)
}
