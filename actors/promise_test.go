package actors

import (
	"context"
	"errors"
	"strings"
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

// promiseBoard holds the asks and promises of a cluster's store beside the claims of the world's
// store (Store.Claim, Ownership), as postgres.Store keeps them in release_asks and in the owners
// row (migration 0022; TestPromiseNamesTheAskerAsTheHolder there): a promise names its taker as
// the key's holder while the key's claim is still at the promise's epoch.
type promiseBoard struct {
	mu       sync.Mutex
	asks     map[string]map[string]time.Time // by key, by asker's node: when it last asked
	promised map[string]boardPromise         // by key
	// fail is how many writes of a promise fail next (as after a lost connection) after
	// writing it or not (failWritten); promises counts the promises written.
	fail        atomic.Int32
	failWritten atomic.Bool
	promises    atomic.Int32
	// older, while set, is a live member of a version whose claims carry no condition: a
	// promise then promises nothing, as postgres.Store.Promise's does while a live member's
	// registration lacks postgres.ClaimsOnCondition.
	older atomic.Bool
}

type boardPromise struct {
	epoch int64
	to    string
}

func newPromiseBoard() *promiseBoard {
	return &promiseBoard{asks: map[string]map[string]time.Time{}, promised: map[string]boardPromise{}}
}

// promisePlacement is a storedPlacement of member node whose store carries asks and promises on
// board (Asks); its lookup of a key's holder names a promise's taker at the claim's epoch, and
// none for a member in gone (its registration expired).
type promisePlacement struct {
	storedPlacement
	node  string
	board *promiseBoard
	gone  *atomic.Pointer[actor.PID]
	// stall, while set, makes the lookups of keys' holders wait out their deadline (a store
	// slow to answer them).
	stall *atomic.Bool
}

// named is the node the store names as key's holder, and the epoch of the key's claim.
func (p promisePlacement) named(ctx context.Context, key string) (string, int64, error) {
	own, err := p.store.Ownership(ctx, key)
	if errors.Is(err, persistence.ErrNotFound) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, err
	}
	if pr, ok := p.board.promised[key]; ok && pr.epoch == own.Epoch {
		return pr.to, own.Epoch, nil
	}
	return own.Owner, own.Epoch, nil
}

// live is the manager of node, when it is a member whose registration is live.
func (p promisePlacement) live(node string) *actor.PID {
	pid := p.nodes[node]
	if pid == nil || p.gone != nil && pid.Equal(p.gone.Load()) {
		return nil
	}
	return pid
}

// The claim it reads (Holder.Seen) names a promise's taker as its owner, as
// postgres.Store.Promise writes it in the owners row; a promisedStore claims on it.
func (p promisePlacement) Holders(ctx context.Context, keys []string) (map[string]Holder, error) {
	if p.stall != nil && p.stall.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	out := map[string]Holder{}
	for _, key := range keys {
		p.board.mu.Lock()
		node, epoch, err := p.named(ctx, key)
		p.board.mu.Unlock()
		if err != nil {
			return nil, err
		}
		out[key] = Holder{Manager: p.live(node), Seen: &persistence.ClaimSeen{Epoch: epoch, Owner: node}}
	}
	return out, nil
}

// promisedStore is the world's store whose claims on a condition (Store.Claim's seen) read the
// board's promises as postgres.Store's claim reads the owners row a promise wrote: the latest
// claim's owner is a promise's taker while the claim is at the promise's epoch (a refusal names
// the promiser, the row's owner, as postgres.Store's does). Under the
// board's lock, as a promise is written (promisePlacement.Promise), so that the two come one
// after the other, as on the row's lock.
type promisedStore struct {
	persistence.Store
	board *promiseBoard
}

func (s promisedStore) Claim(ctx context.Context, key, owner string, at time.Time, seen *persistence.ClaimSeen) (persistence.Claimed, error) {
	if seen == nil {
		return s.Store.Claim(ctx, key, owner, at, nil)
	}
	s.board.mu.Lock()
	defer s.board.mu.Unlock()
	var row, latest persistence.ClaimSeen
	var promisedBy string
	switch own, err := s.Store.Ownership(ctx, key); {
	case err == nil:
		row = persistence.ClaimSeen{Epoch: own.Epoch, Owner: own.Owner}
		latest = row
		if pr, ok := s.board.promised[key]; ok && pr.epoch == own.Epoch {
			latest.Owner, promisedBy = pr.to, own.Owner
		}
	case !errors.Is(err, persistence.ErrNotFound):
		return persistence.Claimed{}, err
	}
	if *seen != latest {
		return persistence.Claimed{}, &persistence.ClaimChangedError{Key: key, Seen: *seen, Latest: &latest, PromisedBy: promisedBy}
	}
	return s.Store.Claim(ctx, key, owner, at, &row)
}

func (p promisePlacement) ExchangeAsks(ctx context.Context, keys []string, within time.Duration) ([]Ask, error) {
	p.board.mu.Lock()
	defer p.board.mu.Unlock()
	now := time.Now()
	for key, by := range p.board.asks {
		delete(by, p.node)
		if len(by) == 0 {
			delete(p.board.asks, key)
		}
	}
	for _, key := range keys {
		if p.board.asks[key] == nil {
			p.board.asks[key] = map[string]time.Time{}
		}
		p.board.asks[key][p.node] = now
	}
	var out []Ask
	for key, by := range p.board.asks {
		node, epoch, err := p.named(ctx, key)
		if err != nil {
			return nil, err
		}
		if node != p.node {
			continue
		}
		for asker, at := range by {
			if pid := p.live(asker); pid != nil && asker != p.node && now.Sub(at) < within {
				out = append(out, Ask{Key: key, Epoch: epoch, Asker: pid, Node: asker})
			}
		}
	}
	return out, nil
}

func (p promisePlacement) Promise(ctx context.Context, ask Ask) (bool, error) {
	fail := p.board.fail.Add(-1) >= 0
	if fail && !p.board.failWritten.Load() {
		return false, errors.New("write the promise: connection reset by peer")
	}
	p.board.mu.Lock()
	defer p.board.mu.Unlock()
	node, epoch, err := p.named(ctx, ask.Key)
	switch {
	case err != nil:
		return false, err
	case epoch != ask.Epoch:
		return false, nil
	case node == ask.Node && p.board.promised[ask.Key].epoch == epoch:
		// (written already: the promise run again)
	case node != p.node || p.board.older.Load():
		return false, nil
	default:
		p.board.promised[ask.Key] = boardPromise{epoch: epoch, to: ask.Node}
		p.board.promises.Add(1)
	}
	if fail {
		return false, errors.New("write the promise: connection reset by peer (after the server took it)")
	}
	return true, nil
}

// promisingMembers is twoMembers whose members' store carries asks and promises (board): a, the
// world's manager, reaches b only through link, which cut cuts (a dead letter, or silence).
func promisingMembers(t *testing.T, agent agents.Agent, silent bool) (w *managerWorld, logs *testutil.Buffer, link *actor.PID,
	ownerA, ownerB, gone *atomic.Pointer[actor.PID], cut *atomic.Bool, board *promiseBoard) {
	w, logs, link, ownerA, ownerB, gone, cut, board, _ = stallingMembers(t, agent, silent)
	return w, logs, link, ownerA, ownerB, gone, cut, board
}

// stallingMembers is promisingMembers whose member a's lookups of keys' holders wait out their
// deadline while stall is set.
func stallingMembers(t *testing.T, agent agents.Agent, silent bool) (w *managerWorld, logs *testutil.Buffer, link *actor.PID,
	ownerA, ownerB, gone *atomic.Pointer[actor.PID], cut *atomic.Bool, board *promiseBoard, stall *atomic.Bool) {
	t.Helper()
	logs = &testutil.Buffer{}
	ownerA, ownerB, gone, cut, stall = &atomic.Pointer[actor.PID]{}, &atomic.Pointer[actor.PID]{}, &atomic.Pointer[actor.PID]{}, &atomic.Bool{}, &atomic.Bool{}
	board = newPromiseBoard()
	w = loggedClusterWorld(t, agent, logs)
	w.d.Store = promisedStore{w.store, board}
	db := &Deps{Ctx: w.ctx, Store: w.d.Store, Agent: agent, Platforms: w.d.Platforms, Log: w.d.Log,
		Metrics: metrics.New("fake"), Node: "b", Config: w.d.Config, Persist: w.d.Persist, Fencing: true, Clustered: true}
	var b *actor.PID
	link = cutLink(w.system, &b, cut, silent)
	nodes := map[string]*actor.PID{"a": w.manager, "b": link}
	w.d.Placement = promisePlacement{storedPlacement{peersPlacement{self: w.manager, peers: []*actor.PID{link}, owner: ownerA}, w.store, nodes}, "a", board, gone, stall}
	db.Placement = promisePlacement{storedPlacement{peersPlacement{self: link, peers: []*actor.PID{w.manager}, owner: ownerB}, w.store, nodes}, "b", board, gone, nil}
	b = w.system.Root.Spawn(NewSessionManager(db))
	t.Cleanup(func() { _ = w.system.Root.StopFuture(b).Wait() })
	ownerA.Store(link)
	ownerB.Store(link)
	return w, logs, link, ownerA, ownerB, gone, cut, board, stall
}

// TestUnreachableHolderPromisesItsClaimThroughTheStore: member b runs the key's slow turn when
// the key moves to member a, which cannot reach b (its Release comes back as a dead letter, or
// goes unanswered), though both reach the store. a waits for b, which the store names as the
// key's holder, and records its ask in the store; b finds it there, tells its session the key
// moved, and while the turn runs promises nothing. Once the turn is done and the session has
// stopped, b promises its claim to a through the store, the store names a, and a takes the key
// over within a few exchanges and runs the next message. Each message runs once.
//
// Before, a waited for as long as it could not reach b, though b held nothing of the key: b's
// claim was the key's latest and its registration was live.
func TestUnreachableHolderPromisesItsClaimThroughTheStore(t *testing.T) {
	for _, silent := range []bool{false, true} {
		name := map[bool]string{false: "dead letter", true: "silent"}[silent]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release := make(chan struct{})
				agent, ran := slowUntil(release)
				w, logs, link, ownerA, ownerB, _, cut, board := promisingMembers(t, agent, silent)

				slow := w.system.Root.RequestFuture(link, &Routed{Key: w.key, Msg: w.message("m1", "slow")}, time.Hour)
				synctest.Wait()
				cut.Store(true)
				ownerA.Store(w.manager) // the key moves to a, which cannot reach b
				ownerB.Store(w.manager)
				next := w.request("m2", "next")
				time.Sleep(time.Minute)
				synctest.Wait()
				if ran("slow") != 1 || ran("next") != 0 {
					t.Fatalf("while b ran the turn the agent ran the slow message %d times and the next %d, want once and not at all",
						ran("slow"), ran("next"))
				}
				if n := board.promises.Load(); n != 0 {
					t.Fatalf("b promised its claim %d times while its session ran the turn, want none", n)
				}

				close(release) // b's turn ends; its session, told the key moved, stops
				if res, err := slow.Result(); err != nil || res.(*DeliverResult).Disposition != "started" {
					t.Errorf("the slow message: %+v %v, want started", res, err)
				}
				begin := time.Now()
				if res, err := next.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
					t.Errorf("the next message: %+v %v, want it taken here", res, err)
				}
				if took, most := time.Since(begin), 3*askEvery; took > most {
					t.Errorf("a took the key over %v after b's turn ended, want at most %v", took, most)
				}
				if t.Failed() {
					t.Fatalf("logs:\n%s", logs.String())
				}
				ranOnceEach(t, w, ran)
				if own, err := w.store.Ownership(w.ctx, w.key); err != nil || own.Owner != "a" {
					t.Errorf("the key's claim is %+v (%v), want a's", own, err)
				}
				if n := board.promises.Load(); n != 1 {
					t.Errorf("b promised its claim %d times, want once", n)
				}
				if got := linesWith(logs, "promised it its claim"); len(got) != 1 || !strings.Contains(got[0], "member="+w.manager.Address) {
					t.Errorf("lines of b's promise: %q, want one that names a", got)
				}
				if got := linesWith(logs, "no longer holds the session; this member takes the key over"); len(got) != 1 {
					t.Errorf("lines of a's takeover: %q, want one", got)
				}
				if t.Failed() {
					t.Logf("logs:\n%s", logs.String())
				}
			})
		})
	}
}

// TestPromiserDefersToTheMemberItPromised: member b promised its claim of the key to member a,
// which cannot reach b, through the store, and a has not taken the key over yet (its lookups of
// the key's holder are slow). Meanwhile the key comes back to b (b's view places it there again)
// and a message reaches b: b's activation asks a, whose own activation (it was handed the key)
// ranks after b's and says it does not hold the key. b does not claim the key on that word: a
// cannot tell b that it goes on to claim the key on the promise (a's ask back of b is a dead
// letter), and it does, once its lookup names it. b waits until the store no longer names a: a
// runs its message, lets go, and, asked through the store in turn, promises the claim back; b
// then runs its message. The key is never claimed by both, and each message runs once.
//
// Without the deferral, b claimed the key at once on a's word, while the store still named a on
// b's promise: a lookup of a's that answered a moment before b's claim let a claim it too (both
// ran the key); here a's answered after it, and a then waited for b for as long as the cut lasted.
//
// So too when b's write of the promise fails and is written again: b's activation, begun
// meanwhile, neither looks the key's holder up nor takes the store's word for a's let-go until the
// write has answered (whether the failed write took effect, "answers lost", or did not,
// "refused"). Before, an activation that found its own claim in the store while the write of its
// promise was still to land took a's word and claimed the key as it landed.
func TestPromiserDefersToTheMemberItPromised(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fail    int32
		written bool
	}{{"written", 0, false}, {"answers lost", 2, true}, {"refused", 2, false}} {
		t.Run(tc.name, func(t *testing.T) { testPromiserDefers(t, tc.fail, tc.written) })
	}
}

// testPromiserDefers is TestPromiserDefersToTheMemberItPromised whose first fail writes of the
// promise fail, having written it or not.
func testPromiserDefers(t *testing.T, fail int32, written bool) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		agent, ran := slowUntil(release)
		w, logs, link, _, ownerB, _, cut, board, stall := stallingMembers(t, agent, false) // a's view places the key on b throughout

		slow := w.system.Root.RequestFuture(link, &Routed{Key: w.key, Msg: w.message("m1", "slow")}, time.Hour)
		synctest.Wait()
		cut.Store(true)
		ownerB.Store(w.manager) // b's view moves the key to a; a's still places it on b
		// A member handed the key to a (a Forward of one hop): a activates it, ranked as one
		// handed the key.
		next := w.system.Root.RequestFuture(w.manager, &Forward{Key: w.key, Hops: 1,
			Msg: &Forward_Deliver{Deliver: w.message("m2", "next")}}, time.Hour)
		time.Sleep(time.Minute)
		synctest.Wait()
		if ran("next") != 0 {
			t.Fatalf("while b ran the turn the next message ran %d times, want not at all", ran("next"))
		}

		stall.Store(true) // a's lookups from now on wait out their deadline
		board.fail.Store(fail)
		board.failWritten.Store(written)
		close(release)
		if _, err := slow.Result(); err != nil {
			t.Fatal(err)
		}
		own, err := w.store.Ownership(w.ctx, w.key)
		if err != nil {
			t.Fatal(err)
		}
		epoch := own.Epoch
		for board.promises.Load() == 0 && board.fail.Load() == fail {
			time.Sleep(100 * time.Millisecond)
		}

		ownerB.Store(link) // the key comes back to b, and a message reaches b
		other := w.system.Root.RequestFuture(link, &Routed{Key: w.key, Msg: w.message("m3", "other")}, time.Hour)
		time.Sleep(30 * time.Second)
		synctest.Wait()
		if own, err := w.store.Ownership(w.ctx, w.key); err != nil || own.Epoch != epoch {
			t.Errorf("while a may claim the key on b's promise, its claim is %+v (%v), want the promised one, epoch %d: b claimed it beside a", own, err, epoch)
		}
		if ran("other") != 0 {
			t.Errorf("b ran its message %d times while a may claim the key on b's promise, want not yet", ran("other"))
		}
		if got := linesWith(logs, "promised the session's claim to another member, which may claim it"); len(got) == 0 {
			t.Errorf("no line says b waits for the member it promised the claim to")
		}
		if got := linesWith(logs, "could not promise a session's claim through the database"); (fail > 0) != (len(got) == 1) {
			t.Errorf("lines of the failed writes of the promise: %q, want one when a write failed (%d did), else none", got, fail)
		}

		stall.Store(false) // a's lookups answer: the store names a
		if res, err := next.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
			t.Errorf("the next message: %+v %v, want it run at a", res, err)
		}
		if res, err := other.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
			t.Errorf("b's message: %+v %v, want it run at b once a let go", res, err)
		}
		deadline := time.Now().Add(time.Minute)
		for ran("other") == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Second)
		}
		time.Sleep(2 * releaseTries * releaseAnswerTimeout)
		synctest.Wait()
		if ran("slow") != 1 || ran("next") != 1 || ran("other") != 1 {
			t.Errorf("the agent ran the slow message %d times, the next %d and b's %d, want once each", ran("slow"), ran("next"), ran("other"))
		}
		if own, err := w.store.Ownership(w.ctx, w.key); err != nil || own.Owner != "b" {
			t.Errorf("the key's claim at the end is %+v (%v), want b's", own, err)
		}
		if t.Failed() {
			t.Logf("logs:\n%s", logs.String())
		}
	})
}
