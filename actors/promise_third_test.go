package actors

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/asynkron/protoactor-go/actor"
)

// TestPromiseToAMemberCutOffFromAThirdThatActivates: four members on one store: a is cut off
// from b and from c (their Releases to each other come back as dead letters), b and c reach each
// other, and d, which c asks too, answers c 4.9 s late (a slow link); all reach the store. b ran
// the key's message; the key moves to a, which waits for b (the store names b) and asks for the
// key through the store; b tells its idle session `moved`, and it stops. A message reaches c,
// whose view places the key on c: c's activation finds a unreachable while the store names b,
// so takes a to hold nothing (the documented open case of an unreachable member that activates
// the key itself), b answers that it holds nothing, and c waits for d's answer. Meanwhile b,
// holding nothing, promises its claim to a at its exchange (the claim's owner becomes a, at its
// epoch), a's next lookup names a, and a claims the key and runs its message. d's answer comes,
// and c claims the key on the claim its lookup read, b's: refused, since b promised it to a
// (the conditional claim), c's session runs nothing, and c activates the key again, finds a
// named, and waits for a, which it cannot reach. Whichever claim comes first, a's or c's, the
// other is refused, and each message runs once, one turn at a time. Before the conditional
// claim, c's claim went through beside a's, and the same pending message ran on both (a's result
// fenced: 15 of 30 runs): the promise turns b's single "let go" into two, one over the link to
// c and one through the store to a, and a and c cannot rank themselves against each other; the
// store's claim settles it. The sweep moves c's activation within the 5 s phase of the
// exchanges.
func TestPromiseToAMemberCutOffFromAThirdThatActivates(t *testing.T) {
	for off := time.Duration(0); off < askEvery; off += 500 * time.Millisecond {
		t.Run(off.String(), func(t *testing.T) { testPromiseThird(t, off, false) })
	}
}

// olderC makes c a member of a version before the conditional claim (its claims carry none).
func testPromiseThird(t *testing.T, off time.Duration, olderC bool) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
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
			if text == "slow" {
				select {
				case <-release:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			} else {
				time.Sleep(10 * time.Second)
			}
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
		// front stands for a member's manager as the others reach it: a Release of a member it
		// is cut off from comes back as a dead letter.
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
		place := func(self *actor.PID, node string, owner *atomic.Pointer[actor.PID], peers ...*actor.PID) Placement {
			return promisePlacement{storedPlacement{peersPlacement{self: self, peers: peers, owner: owner}, w.store, nodes}, node, board, nil, nil}
		}
		w.d.Placement = place(fA, "a", ownerA, fB, fC)
		db, dc := deps("b"), deps("c")
		db.Placement = place(fB, "b", ownerB, fA, fC)
		// d is a member c reaches whose answers take 4.9 s (a slow link): it holds nothing.
		d := w.system.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
			if r, ok := ctx.Message().(*Release); ok {
				to, self, sys := ctx.Sender(), ctx.Self(), ctx.ActorSystem()
				go func() {
					time.Sleep(4900 * time.Millisecond)
					sys.Root.Send(to, &Released{Key: r.Key, Address: self.Address, Id: self.Id, Activation: r.Activation})
				}()
			}
		}))
		dc.Placement = place(fC, "c", ownerC, fA, fB, d)
		if olderC {
			dc.Store = unconditionalClaims{dc.Store}
		}
		for _, o := range []*atomic.Pointer[actor.PID]{ownerA, ownerB, ownerC} {
			o.Store(fB)
		}
		b = w.system.Root.Spawn(NewSessionManager(db))
		c = w.system.Root.Spawn(NewSessionManager(dc))
		t.Cleanup(func() { _ = w.system.Root.StopFuture(b).Wait(); _ = w.system.Root.StopFuture(c).Wait() })

		close(release)
		slow := w.system.Root.RequestFuture(fB, &Routed{Key: w.key, Msg: w.message("m1", "first")}, time.Hour)
		if _, err := slow.Result(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute - time.Since(start) + 200*time.Millisecond)
		synctest.Wait()
		cut.Store(true)
		ownerA.Store(fA) // the key moves to a, which cannot reach b (nor c)
		ownerB.Store(fA)
		ownerC.Store(fC) // c's view places it on c
		next := w.request("m2", "next")
		time.Sleep(10*time.Second + off)
		synctest.Wait()
		other := w.system.Root.RequestFuture(fC, &Routed{Key: w.key, Msg: w.message("m3", "other")}, time.Hour)
		// (c may wait for a for as long as the cut lasts: the futures are not checked.)
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
