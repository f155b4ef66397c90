package actors

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
)

// lostClaimAnswer is a store whose first Claim is committed and then answered as the database
// being unavailable: its answer was lost on the way back.
type lostClaimAnswer struct {
	persistence.Store
	lost *atomic.Bool
}

func (s lostClaimAnswer) Claim(ctx context.Context, key, owner string, at time.Time, seen *persistence.ClaimSeen) (persistence.Claimed, error) {
	c, err := s.Store.Claim(ctx, key, owner, at, seen)
	if err == nil && s.lost.CompareAndSwap(false, true) {
		return persistence.Claimed{}, fmt.Errorf("claim %s: connection lost: %w", key, persistence.ErrUnavailable)
	}
	return c, err
}

// heldPromises is a promisePlacement whose first lookup of keys' holders waits at gate once it
// has read the store (heldLookup's, with the board's promises).
type heldPromises struct {
	promisePlacement
	gate  <-chan struct{}
	first *atomic.Bool
}

func (p heldPromises) Holders(ctx context.Context, keys []string) (map[string]Holder, error) {
	hs, err := p.promisePlacement.Holders(ctx, keys)
	if p.first.CompareAndSwap(false, true) {
		select {
		case <-p.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return hs, err
}

// TestRefusedClaimSaysWhoClaimedTheKey: a member's claim of a key is refused on its condition
// (the claim its activation looked up is no longer the key's latest), and its line says who made
// the claim that came since, as the store's refusal names it: an operator's reset (`agentgate
// sessions reset` claims the key when no member answers it), or this member itself (its earlier
// claim, committed, whose answer was lost: the session's wait to load runs the claim again on the
// same condition), or another member, b, whose claim the lookup read and which promised it to
// this member through the store since (promise.go: the claim's owner is this member, at b's
// epoch; the line names b, and says nothing of a lost answer). In each the key is activated
// again, claims it and runs the message. Before, the line said another member had claimed the
// key in every case, and then that this member's own claim, whose answer was lost, had come
// since when b had promised it its claim. (Another member's claim, named
// by its node, is TestRacingClaimsOfOneSeenClaimRunTheMessageOnce's.)
func TestRefusedClaimSaysWhoClaimedTheKey(t *testing.T) {
	const another = "another member claimed the session"
	t.Run("an operator's reset", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			agent, ran := slowUntil(nil)
			logs := &testutil.Buffer{}
			w := loggedClusterWorld(t, agent, logs)
			var owner atomic.Pointer[actor.PID]
			owner.Store(w.manager)
			gate := make(chan struct{})
			w.d.Placement = heldLookup{storedPlacement{peersPlacement{self: w.manager, owner: &owner}, w.store,
				map[string]*actor.PID{"a": w.manager}}, gate, &atomic.Bool{}}
			m1 := w.request("m1", "hi")
			synctest.Wait() // a's lookup has read the store (no claim), and waits at the gate
			if _, err := w.store.Claim(w.ctx, w.key, persistence.ResetClaimOwner, time.Now(), nil); err != nil {
				t.Fatalf("the reset's claim: %v", err)
			}
			close(gate)
			if res, err := m1.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
				t.Fatalf("m1: %+v %v; log:\n%s", res, err, logs.String())
			}
			w.awaitTurnEnds(1)
			synctest.Wait()
			if n := ran("hi"); n != 1 {
				t.Errorf("m1 ran %d times, want once", n)
			}
			lines := linesWith(logs, "an operator's reset (agentgate sessions reset) claimed the session since this member looked up its claim; the key is activated again")
			if len(lines) != 1 || !strings.Contains(lines[0], "epoch=1") {
				t.Errorf("lines that say an operator's reset claimed the key: %q, want one, of epoch 1; log:\n%s", lines, logs.String())
			}
			if l := linesWith(logs, another); len(l) > 0 {
				t.Errorf("a line says another member claimed the key, which an operator's reset did: %q", l)
			}
		})
	})
	t.Run("a claim another member promised to this member", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			agent, ran := slowUntil(nil)
			logs := &testutil.Buffer{}
			w := loggedClusterWorld(t, agent, logs)
			board := newPromiseBoard()
			w.d.Store = promisedStore{w.store, board}
			var owner atomic.Pointer[actor.PID]
			owner.Store(w.manager)
			gate := make(chan struct{})
			// b's registration is gone by a's lookup (it stopped once it had promised): a asks
			// nobody, and claims on the claim it read, b's.
			w.d.Placement = heldPromises{promisePlacement{storedPlacement{peersPlacement{self: w.manager, owner: &owner}, w.store,
				map[string]*actor.PID{"a": w.manager}}, "a", board, nil, nil}, gate, &atomic.Bool{}}
			claimed, err := w.store.Claim(w.ctx, w.key, "b", time.Now(), nil)
			if err != nil {
				t.Fatal(err)
			}
			m1 := w.request("m1", "hi")
			synctest.Wait() // a's lookup has read b's claim, and waits at the gate
			board.mu.Lock()
			board.promised[w.key] = boardPromise{epoch: claimed.Epoch, to: "a"} // b promises its claim to a
			board.mu.Unlock()
			close(gate)
			if res, err := m1.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
				t.Fatalf("m1: %+v %v; log:\n%s", res, err, logs.String())
			}
			w.awaitTurnEnds(1)
			synctest.Wait()
			if n := ran("hi"); n != 1 {
				t.Errorf("m1 ran %d times, want once", n)
			}
			lines := linesWith(logs, "another member promised this member its claim of the session since this one looked up the claim; the key is activated again")
			if len(lines) != 1 || !strings.Contains(lines[0], "promised_by=b") || !strings.Contains(lines[0], "epoch=1") {
				t.Errorf("lines that say b promised this member its claim: %q, want one, of b at epoch 1; log:\n%s", lines, logs.String())
			}
			for _, wrong := range []string{another, "a claim whose answer was lost"} {
				if l := linesWith(logs, wrong); len(l) > 0 {
					t.Errorf("a line says %q, where b promised this member its claim: %q", wrong, l)
				}
			}
			if own, err := w.store.Ownership(w.ctx, w.key); err != nil || own.Owner != "a" || own.Epoch != 2 {
				t.Errorf("the key's claim: %+v (%v), want a's at epoch 2 (its claim on the promised one)", own, err)
			}
		})
	})
	t.Run("this member's own claim whose answer was lost", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			agent, ran := slowUntil(nil)
			logs := &testutil.Buffer{}
			w := newManagerWorld(t, agent, func(d *Deps) {
				d.Node, d.Fencing, d.Clustered = "a", true, true
				d.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
				d.Store = lostClaimAnswer{d.Store, &atomic.Bool{}}
			})
			var owner atomic.Pointer[actor.PID]
			owner.Store(w.manager)
			w.d.Placement = storedPlacement{peersPlacement{self: w.manager, owner: &owner}, w.store,
				map[string]*actor.PID{"a": w.manager}}
			// The session waits to load once its claim's answer is lost, and answers m1
			// unavailable; it claims again a second later, and is refused.
			if res := w.deliver(t, "m1", "hi"); res.ErrorCode != ErrCodeUnavailable {
				t.Fatalf("m1 while the session waits to load: %+v, want %q", res, ErrCodeUnavailable)
			}
			time.Sleep(storeWaitTick)
			synctest.Wait()
			if res := w.deliver(t, "m1", "hi"); res.ErrorCode != "" {
				t.Fatalf("m1 sent again: %+v; log:\n%s", res, logs.String())
			}
			w.awaitTurnEnds(1)
			synctest.Wait()
			if n := ran("hi"); n != 1 {
				t.Errorf("m1 ran %d times, want once", n)
			}
			lines := linesWith(logs, "this member's own claim of the session came since it looked up the claim (a claim whose answer was lost); the key is activated again")
			if len(lines) != 1 || !strings.Contains(lines[0], "epoch=1") {
				t.Errorf("lines that say this member's own claim came since: %q, want one, of epoch 1; log:\n%s", lines, logs.String())
			}
			if l := linesWith(logs, another); len(l) > 0 {
				t.Errorf("a line says another member claimed the key, which this member did: %q", l)
			}
			if own, err := w.store.Ownership(w.ctx, w.key); err != nil || own.Owner != "a" || own.Epoch != 2 {
				t.Errorf("the key's claim: %+v (%v), want a's at epoch 2 (the lost one, then the activation's again)", own, err)
			}
		})
	})
}
