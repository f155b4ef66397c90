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

// triangle is the world of the promise's third-member tests: a (the world's manager), b and c
// on one store, each behind a front that stands for its manager as the others reach it (once
// cut, a Release of a member it is cut off from comes back as a dead letter): a is cut off from
// b and from c, b and c reach each other. Its agent counts the runs of each message's text and
// the turns at once, each turn 10 s. The test sets c's Placement (and any other deps), then
// starts b and c (spawn).
type triangle struct {
	w          *managerWorld
	logs       *testutil.Buffer
	start      time.Time
	cut        *atomic.Bool
	fA, fB, fC *actor.PID
	b, c       *actor.PID // b's and c's managers, behind fB and fC
	// owners are the members' views of the key's owner.
	ownerA, ownerB, ownerC *atomic.Pointer[actor.PID]
	db, dc                 *Deps
	board                  *promiseBoard
	place                  func(self *actor.PID, node string, owner *atomic.Pointer[actor.PID], peers ...*actor.PID) promisePlacement

	mu            sync.Mutex
	running, most int
	runs          map[string]int
}

func newTriangle(t *testing.T) *triangle {
	tr := &triangle{logs: &testutil.Buffer{}, start: time.Now(), cut: &atomic.Bool{}, runs: map[string]int{},
		ownerA: &atomic.Pointer[actor.PID]{}, ownerB: &atomic.Pointer[actor.PID]{}, ownerC: &atomic.Pointer[actor.PID]{}}
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		text := req.Messages[0].Text
		tr.mu.Lock()
		tr.runs[text]++
		tr.running++
		tr.most = max(tr.most, tr.running)
		tr.mu.Unlock()
		defer func() { tr.mu.Lock(); tr.running--; tr.mu.Unlock() }()
		time.Sleep(10 * time.Second)
		return &agents.Response{Text: "ok " + text}, nil
	})
	board := newPromiseBoard()
	w := loggedClusterWorld(t, agent, tr.logs)
	tr.w, tr.board = w, board
	w.d.Store = promisedStore{w.store, board}
	deps := func(node string) *Deps {
		return &Deps{Ctx: w.ctx, Store: w.d.Store, Agent: agent, Platforms: w.d.Platforms, Log: w.d.Log,
			Metrics: metrics.New("fake"), Node: node, Config: w.d.Config, Persist: w.d.Persist, Fencing: true, Clustered: true}
	}
	front := func(target **actor.PID, cutFrom func() []*actor.PID) *actor.PID {
		return w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			switch m := c.Message().(type) {
			case *actor.Started, *actor.Stopping, *actor.Stopped, *actor.Restarting:
				return
			case *Release:
				asker := actor.NewPID(m.Address, m.Id)
				for _, p := range cutFrom() {
					if tr.cut.Load() && asker.Equal(p) {
						c.Send(c.Sender(), &actor.DeadLetterResponse{Target: c.Self()})
						return
					}
				}
			}
			c.Forward(*target)
		}))
	}
	a := w.manager
	tr.fA = front(&a, func() []*actor.PID { return []*actor.PID{tr.fB, tr.fC} })
	tr.fB = front(&tr.b, func() []*actor.PID { return []*actor.PID{tr.fA} })
	tr.fC = front(&tr.c, func() []*actor.PID { return []*actor.PID{tr.fA} })
	nodes := map[string]*actor.PID{"a": tr.fA, "b": tr.fB, "c": tr.fC}
	tr.place = func(self *actor.PID, node string, owner *atomic.Pointer[actor.PID], peers ...*actor.PID) promisePlacement {
		return promisePlacement{storedPlacement{peersPlacement{self: self, peers: peers, owner: owner}, w.store, nodes}, node, board, nil, nil}
	}
	w.d.Placement = tr.place(tr.fA, "a", tr.ownerA, tr.fB, tr.fC)
	tr.db, tr.dc = deps("b"), deps("c")
	tr.db.Placement = tr.place(tr.fB, "b", tr.ownerB, tr.fA, tr.fC)
	return tr
}

// spawn starts b and c, every view placing the key on b; b runs m1 ("first") and, a minute in,
// the key moves to a, which cannot reach b (nor c), and c's view places it on c. It returns
// a's request of m2 ("next").
func (tr *triangle) spawn(t *testing.T) *actor.Future {
	w := tr.w
	for _, o := range []*atomic.Pointer[actor.PID]{tr.ownerA, tr.ownerB, tr.ownerC} {
		o.Store(tr.fB)
	}
	b, c := w.system.Root.Spawn(NewSessionManager(tr.db)), w.system.Root.Spawn(NewSessionManager(tr.dc))
	tr.b, tr.c = b, c
	t.Cleanup(func() { _ = w.system.Root.StopFuture(b).Wait(); _ = w.system.Root.StopFuture(c).Wait() })
	first := w.system.Root.RequestFuture(tr.fB, &Routed{Key: w.key, Msg: w.message("m1", "first")}, time.Hour)
	if _, err := first.Result(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Minute - time.Since(tr.start) + 200*time.Millisecond)
	synctest.Wait()
	tr.cut.Store(true)
	tr.ownerA.Store(tr.fA)
	tr.ownerB.Store(tr.fA)
	tr.ownerC.Store(tr.fC)
	return w.request("m2", "next")
}

// check waits for futures (c may wait for a for as long as the cut lasts: their answers are not
// checked) and two minutes more, and fails t unless each message ran at most once ("first"
// once), one turn at a time.
func (tr *triangle) check(t *testing.T, futures ...*actor.Future) {
	for _, f := range futures {
		_, _ = f.Result()
	}
	time.Sleep(2 * time.Minute)
	synctest.Wait()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.most > 1 || tr.runs["next"] > 1 || tr.runs["other"] > 1 || tr.runs["first"] != 1 {
		t.Errorf("turns at once at most %d, want 1; runs %v, want each at most once", tr.most, tr.runs)
	}
	if t.Failed() {
		t.Logf("logs:\n%s", tr.logs.String())
	}
}

// olderC makes c a member of a version before the conditional claim (its claims carry none),
// whose registration lacks the mark of this version's (the board's older).
func testPromiseThird(t *testing.T, off time.Duration, olderC bool) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTriangle(t)
		w := tr.w
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
		tr.dc.Placement = tr.place(tr.fC, "c", tr.ownerC, tr.fA, tr.fB, d)
		if olderC {
			tr.dc.Store = unconditionalClaims{tr.dc.Store}
			tr.board.older.Store(true)
		}
		next := tr.spawn(t)
		time.Sleep(10*time.Second + off)
		synctest.Wait()
		other := w.system.Root.RequestFuture(tr.fC, &Routed{Key: w.key, Msg: w.message("m3", "other")}, time.Hour)
		tr.check(t, next, other)
		if n := tr.board.promises.Load(); olderC && n != 0 {
			t.Errorf("%d promises written while a member of an older version was live, want none (a waits, as before the promise)", n)
		}
	})
}
