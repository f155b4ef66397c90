package actors

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
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

// TestHeldResultIsWrittenAgainOnceTheStoreTakesAWrite: a session holds m1's turn result, which
// the store refused in an outage of a few seconds (tries at 0, 1 and 3 s; the next at 7 s).
// The store takes writes again at 4 s, and another chat's message is stored: the held result is
// written again at once (persistence.WritesTaken), and m1's reply goes out, not at the next
// step of the result's backoff. Before, it waited for that step: up to 10 s after the store was
// back, while other chats' new turns were already stored and answered.
func TestHeldResultIsWrittenAgainOnceTheStoreTakesAWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		tries := &resultTries{result: resultOf("m1")}
		agent, ran := countingEcho()
		w := newManagerWorldWrites(t, fillsFirst(out, agent), nil, func(s persistence.Store) persistence.Store {
			tries.Store = out.Wrap(s)
			return tries
		})
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		synctest.Wait()
		time.Sleep(4 * time.Second) // tries at 0, 1 and 3 s; the next at 7 s
		synctest.Wait()
		if got := tries.n.Load(); got != 3 {
			t.Fatalf("the store was asked to take the held result %d times in 4 s, want 3 (1 s doubling)", got)
		}

		out.Down.Store(false)
		if r := w.deliverTo(t, "c2", "o1", "hello"); r.ErrorCode != "" {
			t.Fatalf("another chat's message once the store takes writes: %+v", r)
		}
		synctest.Wait() // no time passes
		var sent []string
		for len(w.sent) > 0 {
			sent = append(sent, (<-w.sent).Out.Text)
		}
		if !slices.Contains(sent, "echo: one") {
			t.Errorf("sent %q once another chat's message was stored, want m1's reply too (the held result tried %d times)", sent, tries.n.Load())
		}
		if n := ran("m1"); n != 1 {
			t.Errorf("the agent ran m1 %d times, want once", n)
		}
	})
}

// TestHeldResultKeepsItsBackoffWhileOnlyOtherWritesAreTaken: on a disk with room for other
// chats' writes but not for m1's turn result, another chat's message is stored every 100 ms for
// 30 s; each tells the session the store takes writes (persistence.WritesTaken). The held
// result is tried at most once early per pause of its backoff (1 s doubling to 10 s: 6 tries
// in 30 s without early ones), not at each write another chat gets through (300).
func TestHeldResultKeepsItsBackoffWhileOnlyOtherWritesAreTaken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var full atomic.Bool
		full.Store(true)
		refuse := resultOf("m1")
		tries := &resultTries{result: refuse}
		agent, ran := countingEcho()
		w := newManagerWorldWrites(t, agent, nil, func(s persistence.Store) persistence.Store {
			tries.Store = &refusedWrites{Store: s, refuse: func(op persistence.Op) bool { return full.Load() && refuse(op) }}
			return tries
		})
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		synctest.Wait()
		for i := range 300 {
			if r := w.deliverTo(t, "c2", fmt.Sprint("o", i), "hello"); r.ErrorCode != "" {
				t.Fatalf("another chat's message %d: %+v", i, r)
			}
			time.Sleep(100 * time.Millisecond)
			for len(w.sent) > 0 {
				if m := <-w.sent; m.Out.Text == "echo: one" {
					t.Fatalf("m1's reply was sent while the disk had no room for its result (message %d)", i)
				}
			}
		}
		synctest.Wait()
		t.Logf("the held result was tried %d times in 30 s", tries.n.Load())
		if got := tries.n.Load(); got > 12 || got < 6 {
			t.Errorf("the store was asked to take the held result %d times in 30 s, want 6 to 12 (at most one early try a pause)", got)
		}

		full.Store(false)
		time.Sleep(maxHeldRetry) // the end of its pause at the latest
		synctest.Wait()
		var sent []string
		for len(w.sent) > 0 {
			sent = append(sent, (<-w.sent).Out.Text)
		}
		if !slices.Contains(sent, "echo: one") {
			t.Errorf("sent %q once the disk had room, want m1's reply", sent)
		}
		if n := ran("m1"); n != 1 {
			t.Errorf("the agent ran m1 %d times, want once", n)
		}
	})
}

// deliverTo routes a message of chat (a DM of the world's platform) through the manager, as
// deliver does for the world's chat, and returns the session's answer.
func (w *managerWorld) deliverTo(t *testing.T, chat, id, text string) *DeliverResult {
	t.Helper()
	src := identity.Source{Platform: w.src.Platform, ChatType: identity.ChatDM, ChatID: chat, UserID: "u-" + chat}
	key := identity.Key(src, w.d.Config.Keys)
	res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: key, Msg: &Deliver{SessionKey: key, Source: sourceToProto(src),
		MessageId: id, Text: text, ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour).Result()
	if err != nil {
		t.Fatalf("deliver %s to %s: %v", id, chat, err)
	}
	return res.(*DeliverResult)
}
