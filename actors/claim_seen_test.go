package actors

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/asynkron/protoactor-go/actor"
)

// heldLookup is a storedPlacement whose first lookup reads the store at once and answers only
// once gate is closed: the claim it read may have changed by then.
type heldLookup struct {
	storedPlacement
	gate  <-chan struct{}
	first *atomic.Bool
}

func (p heldLookup) Holders(ctx context.Context, keys []string) (map[string]Holder, error) {
	hs, err := p.storedPlacement.Holders(ctx, keys)
	if p.first.CompareAndSwap(false, true) {
		select {
		case <-p.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return hs, err
}

// TestRacingClaimsOfOneSeenClaimRunTheMessageOnce: two members, a and c, neither of which knows
// the other (each alone in its view, which places the key on it), activate the key against the
// same state of the store: it was never claimed. c's lookup reads the store first, but its
// answer comes late; meanwhile a looks up, claims the key, stores m1 and runs it. c's claim,
// made on the claim it looked up (none), is refused: its session loads nothing and runs
// nothing, and c activates the key again, finds a's claim, asks a (which holds the key) and
// forwards its message there. m1 runs once, on a, and c's message after it, on a too; the key's
// only claim is a's.
//
// Before (claims on no condition), c's claim went through beside a's: c loaded m1, pending in
// the store, and ran it while a's turn of it still ran (a's result was then fenced).
func TestRacingClaimsOfOneSeenClaimRunTheMessageOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		agent, ran := slowUntil(release)
		logs := &testutil.Buffer{}
		w := loggedClusterWorld(t, agent, logs)
		dc := &Deps{Ctx: w.ctx, Store: w.store, Agent: agent, Platforms: w.d.Platforms, Log: w.d.Log,
			Metrics: metrics.New("fake"), Node: "c", Config: w.d.Config, Persist: w.d.Persist, Fencing: true, Clustered: true}
		c := w.system.Root.Spawn(NewSessionManager(dc))
		t.Cleanup(func() { _ = w.system.Root.StopFuture(c).Wait() })
		var ownerA, ownerC atomic.Pointer[actor.PID]
		ownerA.Store(w.manager)
		ownerC.Store(c)
		nodes := map[string]*actor.PID{"a": w.manager, "c": c}
		gate := make(chan struct{})
		w.d.Placement = storedPlacement{peersPlacement{self: w.manager, owner: &ownerA}, w.store, nodes}
		dc.Placement = heldLookup{storedPlacement{peersPlacement{self: c, owner: &ownerC}, w.store, nodes}, gate, &atomic.Bool{}}

		other := w.system.Root.RequestFuture(c, &Routed{Key: w.key, Msg: w.message("m2", "other")}, time.Hour)
		synctest.Wait() // c's lookup has read the store (no claim), and waits at the gate
		slow := w.request("m1", "slow")
		synctest.Wait()
		if ran("slow") != 1 {
			t.Fatalf("m1 ran %d times on a, want once", ran("slow"))
		}
		close(gate)
		synctest.Wait()
		if n := ran("slow"); n != 1 {
			t.Errorf("m1 ran %d times while a's turn of it ran, want once: c claimed the key beside a", n)
		}
		if own, err := w.store.Ownership(w.ctx, w.key); err != nil || own.Owner != "a" || own.Epoch != 1 {
			t.Errorf("the key's claim while a ran m1: %+v (%v), want a's, epoch 1, the only one", own, err)
		}
		if l := linesWith(logs, "another member claimed the session since this one looked up its claim"); len(l) != 1 ||
			!strings.Contains(l[0], "claimed_by=a") {
			t.Errorf("lines that say c's claim was refused: %q, want one that names a; logs:\n%s", l, logs.String())
		}
		close(release)
		for _, f := range []*actor.Future{slow, other} {
			if res, err := f.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
				t.Errorf("deliver: %+v %v", res, err)
			}
		}
		w.awaitTurnEnds(2)
		synctest.Wait()
		if ran("slow") != 1 || ran("other") != 1 {
			t.Errorf("m1 ran %d times and m2 %d, want once each", ran("slow"), ran("other"))
		}
		if t.Failed() {
			t.Logf("logs:\n%s", logs.String())
		}
	})
}

// TestHolderTheStoreNamesWhileWaitingIsClaimedAfter: a waits for b, which it cannot reach and
// the store named as the key's holder when a's activation looked the claim up. Meanwhile c asks
// b, which lets go, claims the key and runs a slow turn. At a's next ask the store names c: a
// asks c, whose view places the key on a now, and c hands the key on to a once its turn is done.
// a claims the key on c's claim, the one its wait read and whose member it asked, and runs its
// message. Before, a claimed on the claim its first lookup read (b's): the store refused it, a
// activated the key again and waited for b once more before its message ran.
func TestHolderTheStoreNamesWhileWaitingIsClaimedAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		agent, ran := slowUntil(release)
		h := newHolderWhileWaiting(t, agent)
		w, logs, next, ownerC := h.w, h.logs, h.next, h.ownerC
		slow := h.moveToC()
		if own, _ := w.store.Ownership(w.ctx, w.key); ran("slow") != 1 || own.Owner != "c" {
			t.Fatalf("c ran slow %d times, claim %+v; log:\n%s", ran("slow"), own, logs.String())
		}
		ownerC.Store(w.manager) // c hands the key on to a once asked, after its turn
		time.Sleep(releaseAnswerTimeout)
		synctest.Wait() // a asked b again, found c named, and asked c
		close(release)
		synctest.Wait()
		if res, err := next.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
			t.Fatalf("m2: %+v %v; log:\n%s", res, err, logs.String())
		}
		if ran("next") != 1 || ran("slow") != 1 {
			t.Errorf("m2 ran %d times and m3 %d, want once each", ran("next"), ran("slow"))
		}
		if own, _ := w.store.Ownership(w.ctx, w.key); own.Owner != "a" || own.Epoch != 3 {
			t.Errorf("claim: %+v, want a's at epoch 3", own)
		}
		if lines := linesWith(logs, "another member claimed the session since this one looked up its claim"); len(lines) > 0 {
			t.Errorf("a's claim was refused, on the claim its first lookup read, though its wait read c's and asked c: %q", lines)
		}
		if res, err := slow.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
			t.Errorf("m3: %+v %v", res, err)
		}
	})
}
