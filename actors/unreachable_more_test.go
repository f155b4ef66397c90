package actors

// More of the wait for a holder this member cannot reach (stillHolds; unreachable_test.go has
// the wait itself): found by a review of it.

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/asynkron/protoactor-go/actor"
)

// countingHolder is a storedPlacement that notes when each key's lookup came, and names no
// holder from call `upTo` on (so that a test that spins still ends).
type countingHolder struct {
	storedPlacement
	mu    *sync.Mutex
	calls *[]time.Time
	upTo  int
}

func (p countingHolder) Holders(ctx context.Context, keys []string) (map[string]Holder, error) {
	return holdersOf(ctx, keys, p.holder)
}

func (p countingHolder) holder(ctx context.Context, key string) (*actor.PID, error) {
	p.mu.Lock()
	*p.calls = append(*p.calls, time.Now())
	n := len(*p.calls)
	p.mu.Unlock()
	if n >= p.upTo {
		return nil, nil
	}
	return p.storedPlacement.holder(ctx, key)
}

// TestUnreachableHolderThatAnswersAmissIsAskedEveryFewSeconds: b, which the store names as the
// key's holder, answers Release at once with something other than Released (neither a dead
// letter nor a silence). It is asked again releaseAnswerTimeout later, as after a dead letter.
// Before, it was asked again at once, as after a silence, which took that long: a loop of
// Releases and store lookups with no pause, 38 in no time, for as long as the store named b.
func TestUnreachableHolderThatAnswersAmissIsAskedEveryFewSeconds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		agent, ran := slowUntil(release)
		var ownerA, ownerB atomic.Pointer[actor.PID]
		var wrong atomic.Bool
		w := clusterWorldLogged(t, agent)
		db := &Deps{Ctx: w.ctx, Store: w.store, Agent: agent, Platforms: w.d.Platforms, Log: w.d.Log,
			Metrics: metrics.New("fake"), Node: "b", Config: w.d.Config, Persist: w.d.Persist, Fencing: true, Clustered: true}
		var b *actor.PID
		link := w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			switch c.Message().(type) {
			case *actor.Started, *actor.Stopping, *actor.Stopped, *actor.Restarting:
				return
			case *Release:
				if wrong.Load() {
					c.Respond(&DeliverResult{}) // not a Released
					return
				}
			}
			c.Forward(b)
		}))
		b = w.system.Root.Spawn(NewSessionManager(db))
		t.Cleanup(func() { _ = w.system.Root.StopFuture(b).Wait() })
		nodes := map[string]*actor.PID{"a": w.manager, "b": link}
		var mu sync.Mutex
		var calls []time.Time
		w.d.Placement = countingHolder{storedPlacement{peersPlacement{self: w.manager, peers: []*actor.PID{link}, owner: &ownerA}, w.store, nodes}, &mu, &calls, 40}
		db.Placement = storedPlacement{peersPlacement{self: link, peers: []*actor.PID{w.manager}, owner: &ownerB}, w.store, nodes}
		ownerA.Store(link)
		ownerB.Store(link)

		w.system.Root.Send(link, &Routed{Key: w.key, Msg: w.message("m1", "slow")})
		synctest.Wait()
		if ran("slow") != 1 {
			t.Fatalf("slow ran %d", ran("slow"))
		}
		wrong.Store(true)
		ownerA.Store(w.manager)
		next := w.request("m2", "next")
		_, _ = next.Result()
		mu.Lock()
		defer mu.Unlock()
		if len(calls) < 40 {
			t.Fatalf("only %d lookups", len(calls))
		}
		// calls[0] is lookUpHolder's; from calls[1] on, stillHolds'.
		if took := calls[39].Sub(calls[1]); took < 10*releaseAnswerTimeout {
			t.Errorf("38 store lookups (and as many Releases) in %v of the clock: a loop with no pause, want at least %v between asks",
				took, releaseAnswerTimeout)
		}
	})
}

// clusterWorldLogged is loggedClusterWorld with a log no one reads.
func clusterWorldLogged(t *testing.T, agent agents.Agent) *managerWorld {
	t.Helper()
	var logs testutil.Buffer
	return loggedClusterWorld(t, agent, &logs)
}

// TestUnreachableHolderThatAnswersAgainIsLogged: a wait for a holder that cannot be reached ends
// most often by its answer (the connection recovered): a line says so. Before, only a wait that
// ended because the store named the member no longer said so; after one that ended by an
// answer, the operator's last line was the wait's.
func TestUnreachableHolderThatAnswersAgainIsLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		agent, ran := slowUntil(release)
		w, logs, link, ownerA, ownerB, _, cut := twoMembers(t, agent, false)
		slow := w.system.Root.RequestFuture(link, &Routed{Key: w.key, Msg: w.message("m1", "slow")}, time.Hour)
		synctest.Wait()
		cut.Store(true)
		ownerA.Store(w.manager)
		ownerB.Store(w.manager)
		next := w.request("m2", "next")
		time.Sleep(time.Minute)
		synctest.Wait()
		cut.Store(false)
		_, _ = next.Result()
		close(release)
		_, _ = slow.Result()
		for ran("next") == 0 {
			<-w.sent
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		var after []string
		seen := false
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, "cannot be reached; the session waits") {
				seen = true
				continue
			}
			if seen && strings.Contains(l, "member="+link.Address) {
				after = append(after, l)
			}
		}
		if !seen {
			t.Fatalf("no wait line; log:\n%s", logs.String())
		}
		ended := false
		for _, l := range after {
			if strings.Contains(l, "level=INF") && !strings.Contains(l, "still holds the session") {
				ended = true
			}
		}
		if !ended {
			t.Errorf("no line says the wait for %s ended (lines after the wait: %q)", link.Address, after)
		}
	})
}

// TestHolderTheStoreNamesWhileWaitingIsAsked: a waits for b, which it cannot reach and the
// store names as the key's holder. Meanwhile c (whose view does not list a) asks b, which lets
// go, claims the key and runs a slow turn. At a's next ask the store names c, not b: a asks c
// too, and waits for its turn. Before, a took b to hold nothing and claimed the key at once,
// without asking c (lookUpHolder would have): c's running turn was fenced and its message ran
// again on a.
func TestHolderTheStoreNamesWhileWaitingIsAsked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		agent, ran := slowUntil(release)
		h := newHolderWhileWaiting(t, agent)
		w, logs, next := h.w, h.logs, h.next
		if n := len(linesWith(logs, "cannot be reached; the session waits")); n != 1 {
			t.Fatalf("a's wait lines: %d", n)
		}
		// c's view places the key on c; so does b's: c asks b, which lets go, and c runs m3.
		slow := h.moveToC()
		if ran("slow") != 1 {
			t.Fatalf("c ran slow %d times; log:\n%s", ran("slow"), logs.String())
		}
		if own, _ := w.store.Ownership(w.ctx, w.key); own.Owner != "c" {
			t.Fatalf("claim: %+v", own)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if ran("slow") != 1 {
			t.Errorf("c's running turn ran %d times (a took the key over without asking c, which the store named), want once; log:\n%s",
				ran("slow"), logs.String())
		}
		_ = next
		_ = slow
	})
}

// TestEveryUnreachableHolderIsNamed: a cannot reach b or c; the store names b as the holder of
// two keys and c as the holder of a third. Within the first minute of the wait a logs one wait
// line for each member: one for c's key, and one for b's two keys (b's second key is counted in
// the next line's repeats, not logged). Before, one limiter for all members let through only the
// first line of the minute: a member that could not be reached went unnamed while another was.
func TestEveryUnreachableHolderIsNamed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testutil.Buffer
		w := loggedClusterWorld(t, echo.New(), &logs)
		var ownerA, ownerB, ownerC atomic.Pointer[actor.PID]
		var cut atomic.Bool
		deps := func(node string) *Deps {
			return &Deps{Ctx: w.ctx, Store: w.store, Agent: w.d.Agent, Platforms: w.d.Platforms, Log: w.d.Log,
				Metrics: metrics.New("fake"), Node: node, Config: w.d.Config, Persist: w.d.Persist, Fencing: true, Clustered: true}
		}
		db, dc := deps("b"), deps("c")
		var b, c *actor.PID
		linkB, linkC := cutLink(w.system, &b, &cut, false), cutLink(w.system, &c, &cut, false) // b and c as a reaches them
		b = w.system.Root.Spawn(NewSessionManager(db))
		c = w.system.Root.Spawn(NewSessionManager(dc))
		t.Cleanup(func() {
			_ = w.system.Root.StopFuture(b).Wait()
			_ = w.system.Root.StopFuture(c).Wait()
		})
		nodes := map[string]*actor.PID{"a": w.manager, "b": linkB, "c": linkC}
		w.d.Placement = storedPlacement{peersPlacement{self: w.manager, peers: []*actor.PID{linkB, linkC}, owner: &ownerA}, w.store, nodes}
		db.Placement = storedPlacement{peersPlacement{self: linkB, peers: []*actor.PID{w.manager}, owner: &ownerB}, w.store, nodes}
		dc.Placement = storedPlacement{peersPlacement{self: linkC, peers: []*actor.PID{w.manager}, owner: &ownerC}, w.store, nodes}
		ownerA.Store(linkB)
		ownerB.Store(linkB)
		ownerC.Store(linkC)
		chat := func(id string) (string, *Deliver) {
			src := w.src
			src.ChatID = id
			key := identity.Key(src, w.d.Config.Keys)
			return key, &Deliver{SessionKey: key, Source: sourceToProto(src), MessageId: "m-" + id, Text: "hi " + id,
				ReceivedAtUnixNano: time.Now().UnixNano()}
		}
		keys := map[string]*actor.PID{"b1": linkB, "b2": linkB, "c1": linkC} // chat → the member that runs it
		for _, id := range []string{"b1", "b2", "c1"} {
			key, msg := chat(id)
			if res, err := w.system.Root.RequestFuture(keys[id], &Routed{Key: key, Msg: msg}, time.Hour).Result(); err != nil ||
				res.(*DeliverResult).Disposition != "started" {
				t.Fatalf("chat %s on its member: %+v %v", id, res, err)
			}
		}
		cut.Store(true)         // a reaches neither b nor c
		ownerA.Store(w.manager) // and its view places every key on itself
		for _, id := range []string{"b1", "b2", "c1"} {
			key, msg := chat(id)
			msg.MessageId = "next-" + id
			w.system.Root.Send(w.manager, &Routed{Key: key, Msg: msg})
			synctest.Wait()
		}
		time.Sleep(30 * time.Second)
		synctest.Wait()
		waits := linesWith(&logs, "cannot be reached; the session waits")
		b1, _ := chat("b1")
		b2, _ := chat("b2")
		c1, _ := chat("c1")
		named := func(key string) int {
			n := 0
			for _, l := range waits {
				if strings.Contains(l, "session="+key+" ") {
					n++
				}
			}
			return n
		}
		if len(waits) != 2 || named(c1) != 1 || named(b1)+named(b2) != 1 {
			t.Errorf("wait lines within 30 s:\n%s\nwant two: one for c's key %s, one for one of b's keys %s and %s",
				strings.Join(waits, "\n"), c1, b1, b2)
		}
	})
}

// holderWhileWaiting is the world of the tests of a holder the store names while a waits: a
// (the world's manager), b and c (cm) on one store, every view placing the key on b, which
// ran m1; then a is cut off from b, a's view places the key on a, and a's request of m2 (next)
// waits for b.
type holderWhileWaiting struct {
	w              *managerWorld
	logs           *testutil.Buffer
	cm             *actor.PID
	ownerB, ownerC *atomic.Pointer[actor.PID]
	next           *actor.Future
}

func newHolderWhileWaiting(t *testing.T, agent agents.Agent) *holderWhileWaiting {
	var ownerA, ownerB, ownerC atomic.Pointer[actor.PID]
	var cut atomic.Bool
	logs := &testutil.Buffer{}
	w := loggedClusterWorld(t, agent, logs)
	deps := func(node string) *Deps {
		return &Deps{Ctx: w.ctx, Store: w.store, Agent: agent, Platforms: w.d.Platforms, Log: w.d.Log,
			Metrics: metrics.New("fake"), Node: node, Config: w.d.Config, Persist: w.d.Persist, Fencing: true, Clustered: true}
	}
	db, dc := deps("b"), deps("c")
	var b *actor.PID
	link := cutLink(w.system, &b, &cut, false) // b as a reaches it
	b = w.system.Root.Spawn(NewSessionManager(db))
	cm := w.system.Root.Spawn(NewSessionManager(dc))
	t.Cleanup(func() {
		_ = w.system.Root.StopFuture(b).Wait()
		_ = w.system.Root.StopFuture(cm).Wait()
	})
	w.d.Placement = storedPlacement{peersPlacement{self: w.manager, peers: []*actor.PID{link}, owner: &ownerA}, w.store,
		map[string]*actor.PID{"a": w.manager, "b": link, "c": cm}}
	db.Placement = storedPlacement{peersPlacement{self: b, peers: []*actor.PID{cm}, owner: &ownerB}, w.store,
		map[string]*actor.PID{"a": w.manager, "b": b, "c": cm}}
	dc.Placement = storedPlacement{peersPlacement{self: cm, peers: []*actor.PID{b}, owner: &ownerC}, w.store,
		map[string]*actor.PID{"a": w.manager, "b": b, "c": cm}}
	ownerA.Store(b)
	ownerB.Store(b)
	ownerC.Store(b)

	if _, err := w.system.Root.RequestFuture(b, &Routed{Key: w.key, Msg: w.message("m1", "first")}, time.Hour).Result(); err != nil {
		t.Fatal(err)
	}
	cut.Store(true)         // a cannot reach b
	ownerA.Store(w.manager) // a's view places the key on a
	next := w.request("m2", "next")
	synctest.Wait() // a waits for b, named by the claim a's lookup read
	return &holderWhileWaiting{w: w, logs: logs, cm: cm, ownerB: &ownerB, ownerC: &ownerC, next: next}
}

// moveToC places the key on c in b's and c's views and sends c m3 ("slow"): c asks b, which
// lets go, and c claims the key and runs m3. It returns m3's request.
func (h *holderWhileWaiting) moveToC() *actor.Future {
	h.ownerB.Store(h.cm)
	h.ownerC.Store(h.cm)
	slow := h.w.system.Root.RequestFuture(h.cm, &Routed{Key: h.w.key, Msg: h.w.message("m3", "slow")}, time.Hour)
	synctest.Wait()
	return slow
}
