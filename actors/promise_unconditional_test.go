package actors

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/persistence"
)

// failingLookups is a member's promisePlacement whose next fail lookups of keys' holders fail
// at once (a store that refuses a batch: a pool that ran out, a connection reset).
type failingLookups struct {
	promisePlacement
	fail *atomic.Int32
}

func (p failingLookups) Holders(ctx context.Context, keys []string) (map[string]Holder, error) {
	if p.fail.Add(-1) >= 0 {
		return nil, errors.New("look up holders: connection reset by peer")
	}
	return p.promisePlacement.Holders(ctx, keys)
}

// claimsDown is a member's store whose claims fail as unavailable while down is set (the
// member's own connection to the database fails; the other members' do not).
type claimsDown struct {
	persistence.Store
	down *atomic.Bool
}

func (s claimsDown) Claim(ctx context.Context, key, owner string, at time.Time, seen *persistence.ClaimSeen) (persistence.Claimed, error) {
	if s.down.Load() {
		return persistence.Claimed{}, fmt.Errorf("claim %s: %w", key, persistence.ErrUnavailable)
	}
	return s.Store.Claim(ctx, key, owner, at, seen)
}

// TestPromiseToAMemberBesideAThirdWhoseLookupFailed: the members of
// TestPromiseToAMemberCutOffFromAThirdThatActivates (a cut off from b and from c; b and c reach
// each other; all reach the store), but c's activation's first lookup of the key's holder fails
// ("activating without asking it"), and c's own claims fail
// as unavailable for 20 s (its connection to the database, not the others'). c asks a (a dead
// letter; the store, which still names b, says a holds nothing) and b (which holds nothing) and
// goes on; its session waits to claim. Meanwhile b promises its claim to a through the store, and
// a claims the key on the promise and runs its message. c's claim is on the claim of the first
// lookup that answered (the one that found a no holder): b's, which the promise changed, so it is
// refused, and c activates the key again. Before, c's claim carried no condition and went through
// beside a's: the key's turn ran on both, one result fenced (4 of the 10 offsets).
func TestPromiseToAMemberBesideAThirdWhoseLookupFailed(t *testing.T) {
	for off := time.Duration(0); off < askEvery; off += 500 * time.Millisecond {
		t.Run(off.String(), func(t *testing.T) { testPromiseThirdUnconditional(t, off) })
	}
}

func testPromiseThirdUnconditional(t *testing.T, off time.Duration) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTriangle(t)
		w := tr.w
		failC, downC := &atomic.Int32{}, &atomic.Bool{}
		tr.dc.Placement = failingLookups{tr.place(tr.fC, "c", tr.ownerC, tr.fA, tr.fB), failC}
		tr.dc.Store = claimsDown{tr.dc.Store, downC}
		next := tr.spawn(t)
		time.Sleep(5*time.Second + off)
		synctest.Wait()
		failC.Store(1) // c's first lookup fails
		downC.Store(true)
		other := w.system.Root.RequestFuture(tr.fC, &Routed{Key: w.key, Msg: w.message("m3", "other")}, time.Hour)
		time.Sleep(20 * time.Second)
		synctest.Wait()
		downC.Store(false)
		tr.check(t, next, other)
	})
}

// unconditionalClaims is the store of a member of a version before the conditional claim: its
// claims carry no condition (Store.Claim's seen).
type unconditionalClaims struct{ persistence.Store }

func (s unconditionalClaims) Claim(ctx context.Context, key, owner string, at time.Time, _ *persistence.ClaimSeen) (persistence.Claimed, error) {
	return s.Store.Claim(ctx, key, owner, at, nil)
}

// TestPromiseToAMemberBesideAThirdOfAnOlderVersion: the members of
// TestPromiseToAMemberCutOffFromAThirdThatActivates, c of a version before the conditional claim
// (a rolling upgrade to the promise: that version claims on no condition, and it neither records
// asks nor promises, but it is the third member all the same), whose registration lacks the mark
// this version's carries (postgres.ClaimsOnCondition; the board's older). c takes a, which it
// cannot reach, to hold nothing while the store names b, and b to hold nothing over the link. b
// promises nothing while c is live, so a waits for b (and then for c, which claimed the key), as
// before the promise, and each message runs at most once. Before, b promised its claim to a, a
// claimed on it, and c's claim, on no condition, went through beside a's: the key's turn ran on
// both (14 of 30 runs), as it did with the promise built alone (1b41e46).
func TestPromiseToAMemberBesideAThirdOfAnOlderVersion(t *testing.T) {
	for off := time.Duration(0); off < askEvery; off += 500 * time.Millisecond {
		t.Run(off.String(), func(t *testing.T) { testPromiseThird(t, off, true) })
	}
}
