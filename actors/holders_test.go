package actors

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/asynkron/protoactor-go/actor"
)

// batchCounter is a Placement that notes, for each lookup of keys' holders (Holders), when it
// came and how many keys it asked for.
type batchCounter struct {
	Placement
	mu      *sync.Mutex
	batches *[]batch
}

type batch struct {
	at   time.Time
	keys int
}

func (p batchCounter) Holders(ctx context.Context, keys []string) (map[string]Holder, error) {
	p.mu.Lock()
	*p.batches = append(*p.batches, batch{at: time.Now(), keys: len(keys)})
	p.mu.Unlock()
	return p.Placement.Holders(ctx, keys)
}

// TestKeysWaitingForAnUnreachableHolderShareLookups: member b runs many keys' sessions when
// they move to member a, which cannot reach b (its Releases come back as dead letters). The
// store names b as each key's holder, so every activation waits, and asks b again every
// releaseAnswerTimeout, each at its own moment (the chats' next messages came 20 ms apart).
// The manager's lookups of the keys' holders go in batches: over releaseAnswerTimeout it asks
// the store at most releaseAnswerTimeout/holderBatchGap + holderBatchBurst times, however many
// keys wait, and every key is still looked up at each ask. Once b can be reached again, every
// message runs once.
//
// Before, each ask looked its key up alone: one store query per waiting key every 5 s (250 in
// 5 s here; a partition that stranded thousands of keys cost PostgreSQL hundreds a second).
func TestKeysWaitingForAnUnreachableHolderShareLookups(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const keys = 250
		release := make(chan struct{})
		close(release)
		agent, ran := slowUntil(release)
		w, _, link, ownerA, ownerB, _, cut := twoMembers(t, agent, false)
		var mu sync.Mutex
		var batches []batch
		w.d.Placement = batchCounter{w.d.Placement, &mu, &batches}
		chat := func(i int) (string, func(id, text string) *Routed) {
			src := w.src
			src.ChatID = fmt.Sprint("c", i)
			key := identity.Key(src, w.d.Config.Keys)
			return key, func(id, text string) *Routed {
				return &Routed{Key: key, Msg: &Deliver{SessionKey: key, Source: sourceToProto(src), MessageId: id, Text: text,
					ReceivedAtUnixNano: time.Now().UnixNano()}}
			}
		}

		// b runs every key's session.
		var first []*actor.Future
		for i := range keys {
			_, msg := chat(i)
			first = append(first, w.system.Root.RequestFuture(link, msg("m1", fmt.Sprint("first ", i)), time.Hour))
		}
		for i, f := range first {
			if res, err := f.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
				t.Fatalf("chat %d's first message on b: %+v %v", i, res, err)
			}
		}
		// The keys move to a, which cannot reach b; each chat's next message comes 20 ms after
		// the one before.
		cut.Store(true)
		ownerA.Store(w.manager)
		var next []*actor.Future
		for i := range keys {
			_, msg := chat(i)
			next = append(next, w.system.Root.RequestFuture(w.manager, msg("m2", fmt.Sprint("next ", i)), time.Hour))
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(3 * releaseAnswerTimeout)
		synctest.Wait()
		mu.Lock()
		from := len(batches)
		mu.Unlock()
		time.Sleep(releaseAnswerTimeout)
		synctest.Wait()
		mu.Lock()
		window := batches[from:]
		mu.Unlock()
		looked := 0
		for _, b := range window {
			looked += b.keys
		}
		if most := int(releaseAnswerTimeout/holderBatchGap) + holderBatchBurst; len(window) > most {
			t.Errorf("%d keys waiting for b: %d lookups in the store within %v, want at most %d", keys, len(window), releaseAnswerTimeout, most)
		}
		if looked < keys*9/10 {
			t.Errorf("%d keys waiting for b: %d looked up within %v, want about every key once", keys, looked, releaseAnswerTimeout)
		}
		for i := range keys {
			if n := ran(fmt.Sprint("next ", i)); n != 0 {
				t.Fatalf("chat %d's next message ran %d times while b could not be reached, want not at all", i, n)
			}
		}

		// b can be reached again, and lets go of every key.
		ownerB.Store(w.manager)
		cut.Store(false)
		for i, f := range next {
			if res, err := f.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
				t.Errorf("chat %d's next message: %+v %v", i, res, err)
			}
		}
		time.Sleep(2 * releaseTries * releaseAnswerTimeout) // long enough for a second run
		synctest.Wait()
		for i := range keys {
			if n, m := ran(fmt.Sprint("first ", i)), ran(fmt.Sprint("next ", i)); n != 1 || m != 1 {
				t.Errorf("chat %d: the first message ran %d times and the next %d, want once each", i, n, m)
			}
		}
	})
}

// gatedBatches is a peersPlacement that names no key's holder and notes the keys of each lookup
// (Holders); the first lookup answers only once gate is closed.
type gatedBatches struct {
	peersPlacement
	gate    <-chan struct{}
	mu      *sync.Mutex
	batches *[][]string
}

func (p gatedBatches) Holders(ctx context.Context, keys []string) (map[string]Holder, error) {
	p.mu.Lock()
	*p.batches = append(*p.batches, slices.Clone(keys))
	n := len(*p.batches)
	p.mu.Unlock()
	if n == 1 {
		select {
		case <-p.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return nil, nil
}

// TestLookupsOfOneKeyQueuedTogetherAreOne: an activation asks two members whose managers are
// gone (their Releases come back as dead letters) while its first lookup of the key's holder
// runs. Each member is looked up (stillHolds) behind that lookup: the next batch asks for the
// key once, and its answer (the store names neither) reaches both, so the activation goes on
// without either, and the message runs here.
func TestLookupsOfOneKeyQueuedTogetherAreOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var owner atomic.Pointer[actor.PID]
		var mu sync.Mutex
		var batches [][]string
		gate := make(chan struct{})
		w := clusterWorld(t, echo.New())
		gone := []*actor.PID{actor.NewPID(w.system.Address(), "no-such-manager"), actor.NewPID(w.system.Address(), "no-other-manager")}
		w.d.Placement = gatedBatches{peersPlacement{self: w.manager, peers: gone, owner: &owner}, gate, &mu, &batches}
		owner.Store(w.manager)
		f := w.request("m1", "hi")
		synctest.Wait() // both dead letters came back during the first lookup
		close(gate)
		if res, err := f.Result(); err != nil || res.(*DeliverResult).Disposition != "started" {
			t.Errorf("deliver: %+v %v, want started", res, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if want := [][]string{{w.key}, {w.key}}; !slices.EqualFunc(batches, want, slices.Equal) {
			t.Errorf("lookups of the store: %q, want %q (the first, then one for both members)", batches, want)
		}
	})
}

// TestActivationsOneAfterAnotherWaitForNoTimer: a member activates one chat's session after
// another, each as soon as the one before has started (a chat's first message, back to back).
// Each activation's lookup of its key's holder goes at once: the bound on batches is for the
// lookups that waits ask again, and no activation waits for it.
func TestActivationsOneAfterAnotherWaitForNoTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var owner atomic.Pointer[actor.PID]
		w := clusterWorld(t, echo.New())
		w.d.Placement = peersPlacement{self: w.manager, owner: &owner}
		owner.Store(w.manager)
		begin := time.Now()
		for i := range 4 * holderBatchBurst {
			src := w.src
			src.ChatID = fmt.Sprint("c", i)
			key := identity.Key(src, w.d.Config.Keys)
			res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: key, Msg: &Deliver{SessionKey: key, Source: sourceToProto(src),
				MessageId: "m1", Text: "hi", ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour).Result()
			if err != nil || res.(*DeliverResult).Disposition != "started" {
				t.Fatalf("chat %d: %+v %v, want started", i, res, err)
			}
		}
		if took := time.Since(begin); took != 0 {
			t.Errorf("%d activations one after another took %v of the clock, want none", 4*holderBatchBurst, took)
		}
	})
}

// TestRestartedManagerLooksUpNothingForItsFormerActivations: the manager restarts while a batch
// of lookups is in flight (chat c1's) and another lookup waits behind it (chat c2's). The
// restart ends both activations (their messages are answered "stopped"), and once the batch
// answers, the store is not asked for c2's key: the incarnation that restarted sends no more
// batches. The new incarnation's lookups go as before.
//
// Before, the former incarnation sent what waited behind its batch as a batch of its own once
// the batch answered: a store query for activations that had ended (and, at a stop, one that
// could outlive the manager and hold the store's close up for its 5 s).
func TestRestartedManagerLooksUpNothingForItsFormerActivations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var owner atomic.Pointer[actor.PID]
		var mu sync.Mutex
		var batches [][]string
		var boom atomic.Bool
		gate := make(chan struct{})
		w := clusterWorld(t, echo.New())
		w.d.Placement = panicsOnce{gatedBatches{peersPlacement{self: w.manager, owner: &owner}, gate, &mu, &batches}, &boom}
		owner.Store(w.manager)
		chat := func(id string) (string, *Routed) {
			src := w.src
			src.ChatID = id
			key := identity.Key(src, w.d.Config.Keys)
			return key, &Routed{Key: key, Msg: &Deliver{SessionKey: key, Source: sourceToProto(src), MessageId: "m-" + id,
				Text: "hi", ReceivedAtUnixNano: time.Now().UnixNano()}}
		}
		k1, m1 := chat("c1")
		_, m2 := chat("c2")
		f1 := w.system.Root.RequestFuture(w.manager, m1, time.Hour) // its lookup is in flight
		synctest.Wait()
		f2 := w.system.Root.RequestFuture(w.manager, m2, time.Hour) // its lookup waits behind
		synctest.Wait()
		boom.Store(true)
		_, m3 := chat("c3")
		w.system.Root.Send(w.manager, m3) // the manager fails on it, and restarts
		synctest.Wait()
		for i, f := range []*actor.Future{f1, f2} {
			if res, err := f.Result(); err != nil || res.(*DeliverResult).ErrorCode != ErrCodeStopped {
				t.Errorf("chat c%d's message at the restart: %+v %v, want %q", i+1, res, err, ErrCodeStopped)
			}
		}
		close(gate) // the batch in flight answers
		synctest.Wait()
		mu.Lock()
		got := slices.Clone(batches)
		mu.Unlock()
		if want := [][]string{{k1}}; !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("lookups of the store after the restart: %q, want %q (the batch in flight only)", got, want)
		}

		k4, m4 := chat("c4")
		if res, err := w.system.Root.RequestFuture(w.manager, m4, time.Hour).Result(); err != nil ||
			res.(*DeliverResult).Disposition != "started" {
			t.Fatalf("chat c4's message after the restart: %+v %v, want started", res, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if want := append(got, []string{k4}); !slices.EqualFunc(batches, want, slices.Equal) {
			t.Errorf("lookups of the store: %q, want %q", batches, want)
		}
	})
}

// stalledFor is a Placement whose lookups of a batch that holds key never answer: they fail when
// their context ends (a store slowed down by a partition's thousands of lookups).
type stalledFor struct {
	Placement
	key *atomic.Pointer[string]
}

func (p stalledFor) Holders(ctx context.Context, keys []string) (map[string]Holder, error) {
	if k := p.key.Load(); k != nil && slices.Contains(keys, *k) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return p.Placement.Holders(ctx, keys)
}

// TestFirstLookupsDoNotShareTheBatchesOfWaits: chat c0's key moves to member a while member b,
// which a cannot reach, runs its session, and every lookup of c0's key stalls until it times out;
// c0 waits for b, asking the store again and again. A new chat's first message then comes to a:
// its lookups go in a batch of their own, so it starts at once, and c0 still waits.
//
// Before, the new chat's lookups rode along in c0's stalled batches (or waited behind them): its
// message started only after holderLookupTimeout, and a first lookup that failed so lets an
// activation go on without asking a holder this member does not know.
func TestFirstLookupsDoNotShareTheBatchesOfWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		close(release)
		agent, ran := slowUntil(release)
		w, _, link, ownerA, _, _, cut := twoMembers(t, agent, false)
		chat := func(id string) (string, func(msgID, text string) *Routed) {
			src := w.src
			src.ChatID = id
			key := identity.Key(src, w.d.Config.Keys)
			return key, func(msgID, text string) *Routed {
				return &Routed{Key: key, Msg: &Deliver{SessionKey: key, Source: sourceToProto(src), MessageId: msgID, Text: text,
					ReceivedAtUnixNano: time.Now().UnixNano()}}
			}
		}
		var stalled atomic.Pointer[string]
		w.d.Placement = stalledFor{w.d.Placement, &stalled}
		k0, c0 := chat("c0")
		if res, err := w.system.Root.RequestFuture(link, c0("m1", "first"), time.Hour).Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
			t.Fatalf("c0's first message on b: %+v %v", res, err)
		}
		stalled.Store(&k0)
		cut.Store(true)
		ownerA.Store(w.manager)
		waiting := w.system.Root.RequestFuture(w.manager, c0("m2", "next"), time.Hour)
		time.Sleep(3 * releaseAnswerTimeout)
		synctest.Wait()

		_, c1 := chat("c1")
		began := time.Now()
		res, err := w.system.Root.RequestFuture(w.manager, c1("n1", "new chat"), time.Hour).Result()
		if err != nil || res.(*DeliverResult).Disposition != "started" {
			t.Fatalf("the new chat's first message: %+v %v, want started", res, err)
		}
		if took := time.Since(began); took > holderBatchGap {
			t.Errorf("the new chat's first message started after %v, want at once (its lookups need not wait for c0's)", took)
		}
		synctest.Wait()
		if n := ran("next"); n != 0 {
			t.Errorf("c0's next message ran %d times while b could not be reached, want not at all", n)
		}
		cut.Store(false)
		if res, err := waiting.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
			t.Errorf("c0's next message once b answers: %+v %v", res, err)
		}
	})
}

// TestMessageSentAgainWhileItsSessionWaitsIsHeldOnce: a chat's key moves to member a while
// member b, which a cannot reach, runs its session, so a's activation waits. The chat's next
// message comes three times meanwhile (a router tries again each time an attempt times out):
// the earlier sends are answered at once (unavailable), the latest is held in their place, and
// once b lets go the message runs once and the latest send gets its answer.
//
// Before, every send was held until the wait ended: a wait of an hour held hundreds of copies
// of each message.
func TestMessageSentAgainWhileItsSessionWaitsIsHeldOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		close(release)
		agent, ran := slowUntil(release)
		w, _, link, ownerA, ownerB, _, cut := twoMembers(t, agent, false)
		msg := func(id, text string) *Routed {
			return &Routed{Key: w.key, Msg: w.message(id, text)}
		}
		if res, err := w.system.Root.RequestFuture(link, msg("m1", "first"), time.Hour).Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
			t.Fatalf("the first message on b: %+v %v", res, err)
		}
		cut.Store(true)
		ownerA.Store(w.manager)
		var sends []*actor.Future
		for range 3 {
			sends = append(sends, w.system.Root.RequestFuture(w.manager, msg("m2", "next"), time.Hour))
			time.Sleep(clusterAttemptTimeout)
		}
		synctest.Wait()
		for i, f := range sends[:2] {
			began := time.Now()
			res, err := f.Result()
			if r, _ := res.(*DeliverResult); err != nil || r.ErrorCode != ErrCodeUnavailable || time.Since(began) > 0 {
				t.Errorf("send %d of m2, sent again since: %+v %v after %v; want unavailable, at once", i+1, res, err, time.Since(began))
			}
		}
		ownerB.Store(w.manager)
		cut.Store(false)
		if res, err := sends[2].Result(); err != nil || res.(*DeliverResult).ErrorCode != "" || res.(*DeliverResult).Disposition == "duplicate" {
			t.Errorf("the latest send of m2: %+v %v, want it taken", res, err)
		}
		time.Sleep(2 * releaseTries * releaseAnswerTimeout)
		synctest.Wait()
		if n := ran("next"); n != 1 {
			t.Errorf("m2 ran %d times, want once", n)
		}
	})
}
