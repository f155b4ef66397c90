package actors

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
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
		var mu sync.Mutex
		running, most := 0, 0
		runs := map[string]int{}
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			text := req.Messages[0].Text
			mu.Lock()
			runs[text]++
			running++
			most = max(most, running)
			mu.Unlock()
			defer func() { mu.Lock(); running--; mu.Unlock() }()
			time.Sleep(10 * time.Second)
			return &agents.Response{Text: "ok " + text}, nil
		})
		start := time.Now()
		logs := &testutil.Buffer{}
		board := newPromiseBoard()
		w := loggedClusterWorld(t, agent, logs)
		w.d.Store = promisedStore{w.store, board}
		deps := func(node string) *Deps {
			return &Deps{Ctx: w.ctx, Store: w.d.Store, Agent: agent, Platforms: w.d.Platforms, Log: w.d.Log,
				Metrics: metrics.New("fake"), Node: node, Config: w.d.Config, Persist: w.d.Persist, Fencing: true, Clustered: true}
		}
		cut := &atomic.Bool{}
		var fA, fB, fC *actor.PID
		front := func(target **actor.PID, cutFrom func() []*actor.PID) *actor.PID {
			return w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
				switch m := c.Message().(type) {
				case *actor.Started, *actor.Stopping, *actor.Stopped, *actor.Restarting:
					return
				case *Release:
					asker := actor.NewPID(m.Address, m.Id)
					for _, p := range cutFrom() {
						if cut.Load() && asker.Equal(p) {
							c.Send(c.Sender(), &actor.DeadLetterResponse{Target: c.Self()})
							return
						}
					}
				}
				c.Forward(*target)
			}))
		}
		var b, c *actor.PID
		a := w.manager
		fA = front(&a, func() []*actor.PID { return []*actor.PID{fB, fC} })
		fB = front(&b, func() []*actor.PID { return []*actor.PID{fA} })
		fC = front(&c, func() []*actor.PID { return []*actor.PID{fA} })
		nodes := map[string]*actor.PID{"a": fA, "b": fB, "c": fC}
		ownerA, ownerB, ownerC := &atomic.Pointer[actor.PID]{}, &atomic.Pointer[actor.PID]{}, &atomic.Pointer[actor.PID]{}
		place := func(self *actor.PID, node string, owner *atomic.Pointer[actor.PID], peers ...*actor.PID) promisePlacement {
			return promisePlacement{storedPlacement{peersPlacement{self: self, peers: peers, owner: owner}, w.store, nodes}, node, board, nil, nil}
		}
		w.d.Placement = place(fA, "a", ownerA, fB, fC)
		db, dc := deps("b"), deps("c")
		db.Placement = place(fB, "b", ownerB, fA, fC)
		failC, downC := &atomic.Int32{}, &atomic.Bool{}
		dc.Placement = failingLookups{place(fC, "c", ownerC, fA, fB), failC}
		dc.Store = claimsDown{dc.Store, downC}
		for _, o := range []*atomic.Pointer[actor.PID]{ownerA, ownerB, ownerC} {
			o.Store(fB)
		}
		b = w.system.Root.Spawn(NewSessionManager(db))
		c = w.system.Root.Spawn(NewSessionManager(dc))
		t.Cleanup(func() { _ = w.system.Root.StopFuture(b).Wait(); _ = w.system.Root.StopFuture(c).Wait() })

		first := w.system.Root.RequestFuture(fB, &Routed{Key: w.key, Msg: w.message("m1", "first")}, time.Hour)
		if _, err := first.Result(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute - time.Since(start) + 200*time.Millisecond)
		synctest.Wait()
		cut.Store(true)
		ownerA.Store(fA) // the key moves to a, which cannot reach b (nor c)
		ownerB.Store(fA)
		ownerC.Store(fC) // c's view places it on c
		next := w.request("m2", "next")
		time.Sleep(5*time.Second + off)
		synctest.Wait()
		failC.Store(1) // c's first lookup fails
		downC.Store(true)
		other := w.system.Root.RequestFuture(fC, &Routed{Key: w.key, Msg: w.message("m3", "other")}, time.Hour)
		time.Sleep(20 * time.Second)
		synctest.Wait()
		downC.Store(false)
		for _, f := range []*actor.Future{next, other} {
			_, _ = f.Result()
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if most > 1 || runs["next"] > 1 || runs["other"] > 1 || runs["first"] != 1 {
			t.Errorf("turns at once at most %d, want 1; runs %v, want each at most once", most, runs)
		}
		if t.Failed() {
			t.Logf("logs:\n%s", logs.String())
		}
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
// asks nor promises, but it is the third member all the same). c takes a, which it cannot reach,
// to hold nothing while the store names b, and b to hold nothing over the link; b promises its
// claim to a, a claims on it, and c's claim, on no condition, goes through beside a's: the key's
// turn runs on both, as it did with the promise built alone (1b41e46). An open hazard: skipped
// unless AGENTGATE_OPEN_HAZARDS is set. A fix needs the promiser to know that every live member
// claims on a condition (a version the registration carries) before it promises.
func TestPromiseToAMemberBesideAThirdOfAnOlderVersion(t *testing.T) {
	if os.Getenv("AGENTGATE_OPEN_HAZARDS") == "" {
		t.Skip("open hazard: a third member of a version before the conditional claim claims beside the member promised the key (set AGENTGATE_OPEN_HAZARDS to run)")
	}
	for off := time.Duration(0); off < askEvery; off += 500 * time.Millisecond {
		t.Run(off.String(), func(t *testing.T) { testPromiseThird(t, off, true) })
	}
}
