package actors

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"
)

// holdersOf answers a batch of lookups of keys' holders (Placement.Holders) with holder, one key
// after another: an error for any key fails the whole batch, as a failed query does.
// The claims it reads none of: the activations claim on no condition.
func holdersOf(ctx context.Context, keys []string, holder func(context.Context, string) (*actor.PID, error)) (map[string]Holder, error) {
	out := map[string]Holder{}
	for _, key := range keys {
		h, err := holder(ctx, key)
		if err != nil {
			return nil, err
		}
		if h != nil {
			out[key] = Holder{Manager: h}
		}
	}
	return out, nil
}

// storedPlacement is a peersPlacement whose lookup of a key's holder reads the key's claim in the
// store and names the member that made it by its node, as the cluster's membership registry
// does; the claim read is the condition of the activation's claim (Holder.Seen), as the
// cluster's placement has it.
type storedPlacement struct {
	peersPlacement
	store persistence.Store
	nodes map[string]*actor.PID
}

func (p storedPlacement) Holders(ctx context.Context, keys []string) (map[string]Holder, error) {
	out := map[string]Holder{}
	for _, key := range keys {
		h, err := p.lookup(ctx, key)
		if err != nil {
			return nil, err
		}
		out[key] = h
	}
	return out, nil
}

func (p storedPlacement) holder(ctx context.Context, key string) (*actor.PID, error) {
	h, err := p.lookup(ctx, key)
	return h.Manager, err
}

func (p storedPlacement) lookup(ctx context.Context, key string) (Holder, error) {
	own, err := p.store.Ownership(ctx, key)
	if errors.Is(err, persistence.ErrNotFound) {
		return Holder{Seen: &persistence.ClaimSeen{}}, nil
	}
	if err != nil {
		return Holder{}, err
	}
	return Holder{Manager: p.nodes[own.Owner], Seen: &persistence.ClaimSeen{Epoch: own.Epoch, Owner: own.Owner}}, nil
}

// TestActivationAsksTheHolderItDoesNotKnow: member b joined, and member a has not renewed since:
// a's view lists no other member and places every key on a, b's lists a and places the key on
// b. b runs the key's turn (its activation asked a, which held nothing). The chat's next message
// reaches a, whose activation finds b's claim in the store and asks b to let go too: the message
// is stored behind b's turn (queued), b keeps its claim, and each message runs once.
//
// Before, a asked no member, claimed the key at once, and ran b's turn's message again beside it.
func TestActivationAsksTheHolderItDoesNotKnow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		agent, ran := slowUntil(release)
		var ownerA, ownerB atomic.Pointer[actor.PID]
		w := clusterWorld(t, agent)
		db := &Deps{Ctx: w.ctx, Store: w.store, Agent: agent, Platforms: w.d.Platforms, Log: w.d.Log,
			Metrics: metrics.New("fake"), Node: "b", Config: w.d.Config, Persist: w.d.Persist, Fencing: true, Clustered: true}
		b := w.system.Root.Spawn(NewSessionManager(db))
		t.Cleanup(func() { _ = w.system.Root.StopFuture(b).Wait() })
		nodes := map[string]*actor.PID{"a": w.manager, "b": b}
		w.d.Placement = storedPlacement{peersPlacement{self: w.manager, owner: &ownerA}, w.store, nodes}
		db.Placement = storedPlacement{peersPlacement{self: b, peers: []*actor.PID{w.manager}, owner: &ownerB}, w.store, nodes}
		ownerA.Store(w.manager)
		ownerB.Store(b)

		slow := w.system.Root.RequestFuture(b, &Routed{Key: w.key, Msg: w.message("m1", "slow")}, time.Hour)
		synctest.Wait()
		if ran("slow") != 1 {
			t.Fatalf("the slow message ran %d times on b, want once", ran("slow"))
		}
		res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: w.message("m2", "next")}, time.Hour).Result()
		if err != nil || res.(*DeliverResult).Disposition != "queued" {
			t.Errorf("the next message, sent to a: %+v %v, want it queued behind b's running turn", res, err)
		}
		synctest.Wait()
		if own, err := w.store.Ownership(w.ctx, w.key); err != nil || own.Owner != "b" {
			t.Errorf("while b ran the turn the key's claim is %+v (%v), want b's", own, err)
		}
		close(release)
		if res, err := slow.Result(); err != nil || res.(*DeliverResult).Disposition != "started" {
			t.Errorf("the slow message: %+v %v, want started", res, err)
		}
		w.awaitTurnEnds(2)
		synctest.Wait()
		if ran("slow") != 1 || ran("next") != 1 {
			t.Errorf("the agent ran the slow message %d times and the next %d, want once each", ran("slow"), ran("next"))
		}
	})
}

// failingHolder is a Placement of a member alone in its view whose lookup of a key's holder
// fails, at once or when its context ends.
type failingHolder struct {
	peersPlacement
	wait bool
}

func (p failingHolder) Holders(ctx context.Context, keys []string) (map[string]Holder, error) {
	return holdersOf(ctx, keys, p.holder)
}

func (p failingHolder) holder(ctx context.Context, _ string) (*actor.PID, error) {
	if p.wait {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return nil, errors.New("store unavailable")
}

// TestActivationDoesNotWaitForAFailedHolderLookup: an activation whose lookup of the key's
// holder fails goes on at once, and one whose lookup does not answer goes on after
// holderLookupTimeout: the message runs here.
func TestActivationDoesNotWaitForAFailedHolderLookup(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait bool
		took time.Duration
	}{{"error", false, 0}, {"silent", true, holderLookupTimeout}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var owner atomic.Pointer[actor.PID]
				w := clusterWorld(t, echo.New())
				w.d.Placement = failingHolder{peersPlacement{self: w.manager, owner: &owner}, tc.wait}
				owner.Store(w.manager)
				begin := time.Now()
				if res := w.deliver(t, "m1", "hi"); res.Disposition != "started" {
					t.Errorf("deliver: %+v, want started", res)
				}
				if took := time.Since(begin); took != tc.took {
					t.Errorf("the message was stored after %v, want %v", took, tc.took)
				}
			})
		})
	}
}

// TestActivationAsksAnotherActivationOfTheKey: members a and b both place the key on
// themselves (their views differ), and a's PID sorts first. b activates the key first: a
// holds nothing then, and b waits for a third member that does not answer. Meanwhile a activates
// the key and asks b, which says it does not hold it (b's PID sorts after a's). b asks a back:
// a's activation holds the key, so b waits for a rather than claim the key once the silent
// member is given up, and b's message goes to a. Each message runs once, on a.
//
// Before, b did not ask a again: it claimed the key when the silent member was given up, which
// fenced a's running turn, and ran its message again.
func TestActivationAsksAnotherActivationOfTheKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		agent, ran := slowUntil(release)
		var ownerA, ownerB atomic.Pointer[actor.PID]
		w := clusterWorld(t, agent)
		db := &Deps{Ctx: w.ctx, Store: w.store, Agent: agent, Platforms: w.d.Platforms, Log: w.d.Log,
			Metrics: metrics.New("fake"), Node: "b", Config: w.d.Config, Persist: w.d.Persist, Fencing: true, Clustered: true}
		b, err := w.system.Root.SpawnNamed(NewSessionManager(db), "zz-manager") // sorts after w.manager
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.system.Root.StopFuture(b).Wait() })
		silent := w.system.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
		w.d.Placement = peersPlacement{self: w.manager, peers: []*actor.PID{b}, owner: &ownerA}
		db.Placement = peersPlacement{self: b, peers: []*actor.PID{w.manager, silent}, owner: &ownerB}
		ownerA.Store(w.manager)
		ownerB.Store(b)

		hi := w.system.Root.RequestFuture(b, &Routed{Key: w.key, Msg: w.message("m1", "hi")}, time.Hour)
		synctest.Wait()
		slow := w.request("m2", "slow")
		synctest.Wait()
		if ran("slow") != 1 {
			t.Fatalf("the slow message ran %d times on a, want once", ran("slow"))
		}
		time.Sleep(releaseTries * releaseAnswerTimeout) // b gives the silent member up
		synctest.Wait()
		if own, err := w.store.Ownership(w.ctx, w.key); err != nil || own.Owner != "a" {
			t.Errorf("while a ran the turn the key's claim is %+v (%v), want a's", own, err)
		}
		close(release)
		for _, f := range []*actor.Future{slow, hi} {
			if res, err := f.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
				t.Errorf("deliver: %+v %v", res, err)
			}
		}
		w.awaitTurnEnds(2)
		synctest.Wait()
		if ran("slow") != 1 || ran("hi") != 1 {
			t.Errorf("the agent ran the slow message %d times and hi %d, want once each", ran("slow"), ran("hi"))
		}
	})
}

// gatedHolder is a Placement of a member alone in its view whose lookup of key's holder answers
// "none" once gate is closed (or fails when its context ends); other keys' lookups answer at once.
type gatedHolder struct {
	peersPlacement
	key  string
	gate <-chan struct{}
}

func (p gatedHolder) Holders(ctx context.Context, keys []string) (map[string]Holder, error) {
	return holdersOf(ctx, keys, p.holder)
}

func (p gatedHolder) holder(ctx context.Context, key string) (*actor.PID, error) {
	if key != p.key {
		return nil, nil
	}
	select {
	case <-p.gate:
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestStoppingManagerStartsNoSessionForALateLookup: a manager stops (another session in memory
// keeps it stopping for a moment) while an activation waits for its lookup of the key's holder;
// the waiting message is answered "stopped". The lookup's answer, arriving during the stop,
// starts no session: the manager stops, and the message, which the cluster router sends again
// to the key's next owner, is not stored here.
//
// Before, the late answer started the key's session under the stopping manager, which then
// waited for that child for ever (its stop had already stopped the others), and the session
// stored and ran the message its sender had been told to send again elsewhere (and answered it
// a second time, "started").
func TestStoppingManagerStartsNoSessionForALateLookup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var owner atomic.Pointer[actor.PID]
		var slow *slowListing
		w := newManagerWorld(t, echo.New(), func(d *Deps) {
			d.Node, d.Fencing, d.Clustered = "a", true, true
			slow = &slowListing{Store: d.Store, gate: make(chan chan struct{}, 1)}
			d.Store = slow
		})
		gate := make(chan struct{})
		w.d.Placement = gatedHolder{peersPlacement{self: w.manager, owner: &owner}, w.key, gate}
		owner.Store(w.manager)

		other := w.src
		other.ChatID = "c2"
		otherKey := identity.Key(other, w.d.Config.Keys)
		res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: otherKey, Msg: &Deliver{SessionKey: otherKey,
			Source: sourceToProto(other), MessageId: "m0", Text: "hi", ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour).Result()
		if err != nil || res.(*DeliverResult).Disposition != "started" {
			t.Fatalf("the other chat's message: %+v %v, want started", res, err)
		}
		f := w.request("m1", "hi") // its activation waits for the lookup
		synctest.Wait()
		busy := make(chan struct{})
		slow.gate <- busy
		w.system.Root.Send(w.manager, &recoverAll{}) // the manager is busy while the stop and the lookup's answer arrive
		synctest.Wait()
		stopped := w.system.Root.StopFuture(w.manager)
		close(gate) // the lookup answers behind the stop
		synctest.Wait()
		close(busy)
		if err := stopped.Wait(); err != nil {
			t.Errorf("the manager did not stop: %v", err)
		}
		if res, err := f.Result(); err != nil || res.(*DeliverResult).ErrorCode != ErrCodeStopped {
			t.Errorf("the waiting message: %+v %v, want %q", res, err, ErrCodeStopped)
		}
		synctest.Wait()
		if m, err := w.store.FindInbound(w.ctx, "fake", "c1", "m1"); !errors.Is(err, persistence.ErrNotFound) {
			t.Errorf("the message answered %q was stored here all the same: %+v %v", ErrCodeStopped, m, err)
		}
	})
}

// TestActivationsAskEachOtherBackOnce: members a and b activate the key at once, each waiting
// for its lookup of the key's holder; b does not know a, and a's view places the key on b (a
// was handed the message). a runs an earlier version: its Releases do not say that its view
// places the key elsewhere (a relay in front of b drops Release.owner). Neither holds the key
// for the other (a because the key is b's in its view, b because it holds the key for a member
// of an earlier version only when its PID sorts first, as that version decides), so each asks
// the asker back. That happens once per activation of the other: the two do not ask each other
// back and forth while they wait. (Between members of this version b holds the key for a:
// TestConcurrentActivationsClaimTheKeyOnce.)
//
// Before, each answer to an ask-back came before the next Release, so each manager found the
// other no longer asked and asked it back again: a loop of Releases between the two members for
// as long as the lookups took (up to holderLookupTimeout; here, until the test cut it short).
func TestActivationsAskEachOtherBackOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ownerA, ownerB atomic.Pointer[actor.PID]
		w := clusterWorld(t, echo.New())
		db := &Deps{Ctx: w.ctx, Store: w.store, Agent: w.d.Agent, Platforms: w.d.Platforms, Log: w.d.Log,
			Metrics: metrics.New("fake"), Node: "b", Config: w.d.Config, Persist: w.d.Persist, Fencing: true, Clustered: true}
		b, err := w.system.Root.SpawnNamed(NewSessionManager(db), "zz-manager") // sorts after a
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.system.Root.StopFuture(b).Wait() })
		bRelay, err := w.system.Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
			switch m := c.Message().(type) {
			case *actor.Started, *actor.Stopping, *actor.Stopped, *actor.Restarting:
				return
			case *Release:
				earlier := proto.Clone(m).(*Release)
				earlier.Owner = nil
				c.RequestWithCustomSender(b, earlier, c.Sender())
				return
			}
			c.Forward(b)
		}), "zz-relay") // sorts after a
		if err != nil {
			t.Fatal(err)
		}
		// a is reached through a relay that counts the Releases it is sent; past a bound the
		// lookups answer, so that a loop ends.
		gate := make(chan struct{})
		openGate := sync.OnceFunc(func() { close(gate) })
		defer openGate()
		var releases atomic.Int32
		a := w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			switch c.Message().(type) {
			case *actor.Started, *actor.Stopping, *actor.Stopped, *actor.Restarting:
				return
			case *Release:
				if releases.Add(1) > 100 {
					openGate()
				}
			}
			c.Forward(w.manager)
		}))
		w.d.Placement = gatedHolder{peersPlacement{self: a, peers: []*actor.PID{bRelay}, owner: &ownerA}, w.key, gate}
		db.Placement = gatedHolder{peersPlacement{self: bRelay, owner: &ownerB}, w.key, gate}
		ownerA.Store(bRelay)
		ownerB.Store(bRelay)

		fb := w.system.Root.RequestFuture(bRelay, &Routed{Key: w.key, Msg: w.message("m1", "one")}, time.Hour)
		synctest.Wait()
		// Handed to a by a leaving member: a does not send it on, and activates the key.
		fa := w.system.Root.RequestFuture(w.manager, &Forward{Key: w.key, Hops: 1,
			Msg: &Forward_Deliver{Deliver: w.message("m2", "two")}}, time.Hour)
		synctest.Wait()
		if n := releases.Load(); n != 1 {
			t.Errorf("a was sent %d Releases while both activations waited for their lookups, want one (b asks it back once)", n)
		}
		openGate()
		for _, f := range []*actor.Future{fa, fb} {
			if _, err := f.Result(); err != nil {
				t.Errorf("deliver: %v", err)
			}
		}
	})
}
