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

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// downHolder is a peersPlacement whose lookup of a key's holder fails as unavailable, as a
// cluster member's does while PostgreSQL is down, counting the lookups. Past downTries it
// answers only when its context ends: a loop of activations then waits holderLookupTimeout
// between two, and its test fails on the count instead of never ending (synctest's clock
// stands still while anything runs).
type downHolder struct {
	peersPlacement
	lookups *atomic.Int32
}

func (p downHolder) Holders(ctx context.Context, keys []string) (map[string]Holder, error) {
	return holdersOf(ctx, keys, p.holder)
}

func (p downHolder) holder(ctx context.Context, key string) (*actor.PID, error) {
	if p.lookups.Add(1) > downTries {
		<-ctx.Done()
	}
	return nil, fmt.Errorf("holder of %s: %w", key, persistence.ErrUnavailable)
}

// outageWorld is a cluster member's manager in a database outage: its store refuses claims and
// loads as unavailable (downStore) and its lookups of a key's holder fail (downHolder); it
// logs at Warn to logs.
func outageWorld(t *testing.T, logs *testutil.Buffer, lookups *atomic.Int32, owner *atomic.Pointer[actor.PID]) (*managerWorld, *downStore) {
	t.Helper()
	var store *downStore
	w := newManagerWorld(t, echo.New(), func(d *Deps) {
		d.Node, d.Fencing, d.Clustered = "a", true, true
		store = &downStore{Store: d.Store}
		store.down.Store(true)
		d.Store = store
		d.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	w.d.Placement = downHolder{peersPlacement{self: w.manager, owner: owner}, lookups}
	return w, store
}

// TestLeavingMembersInAnOutageDoNotPassARecoverBackAndForth: PostgreSQL stays down past
// member_ttl, and every member loses its membership and drains: each still sees the others as
// live (no renewal says they leave), so two of them are each other's successor for a key. A
// Recover for the key goes back and forth between them until it has been forwarded often
// enough, and then stops where it is: neither leaving member activates the key (its work stays
// in the store for a member that stays: TestLeavingMemberDoesNotStartAKeyBouncedBackToIt), its
// holder is never looked up and no line says the lookup failed, for the whole drain, while the
// chat's client sends its message again and again (answered stopped: 503, and the cluster
// router sends it again). Once the member sees no other member to hand on to, it runs the key
// itself, and once the database answers, the message is taken.
//
// Before, the member that activated the key handed the Recover on as new, and it came back
// forwarded twice: one activation after another, as fast as the store refused the lookup, each
// with a line (a member wrote 101,820 of them in a 30 s drain, at up to a whole core). A later
// fix ran it where it was, a key activated on a leaving member, whose message ran again on the
// member that took its place.
func TestLeavingMembersInAnOutageDoNotPassARecoverBackAndForth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testutil.Buffer
		var lookups atomic.Int32
		var ownerA, ownerB atomic.Pointer[actor.PID]
		w, store := outageWorld(t, &logs, &lookups, &ownerA)
		db := &Deps{Ctx: w.ctx, Store: store, Agent: echo.New(), Platforms: w.d.Platforms, Log: w.d.Log,
			Metrics: metrics.New("fake"), Node: "b", Config: w.d.Config, Persist: w.d.Persist, Fencing: true, Clustered: true}
		b := w.system.Root.Spawn(NewSessionManager(db))
		t.Cleanup(func() { _ = w.system.Root.StopFuture(b).Wait() })
		w.d.Placement = downHolder{peersPlacement{self: w.manager, peers: []*actor.PID{b}, owner: &ownerA}, &lookups}
		db.Placement = downHolder{peersPlacement{self: b, peers: []*actor.PID{w.manager}, owner: &ownerB}, &lookups}
		ownerA.Store(b)
		ownerB.Store(w.manager)
		var successorOfA atomic.Pointer[actor.PID]
		successorOfA.Store(b)
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return successorOfA.Load() }})
		w.system.Root.Send(b, &Leave{Successor: func(string) *actor.PID { return w.manager }})
		synctest.Wait()

		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &Recover{}})
		time.Sleep(30 * time.Second) // the drain's deadline
		synctest.Wait()
		if n := lookups.Load(); n != 0 {
			t.Errorf("the key's holder was looked up %d times in a 30 s drain, want none (no activation)", n)
		}
		for i := range 20 { // the client sends its message again every half second
			if r := w.deliver(t, "m1", "hi"); r.ErrorCode != ErrCodeStopped {
				t.Fatalf("attempt %d of the message during the outage: %+v, want stopped", i+1, r)
			}
			time.Sleep(500 * time.Millisecond)
		}
		synctest.Wait()
		if n := lookups.Load(); n != 0 {
			t.Errorf("the key's holder was looked up %d times once the client sent its message 20 times, want none", n)
		}
		if n := strings.Count(logs.String(), "could not look up which member holds the session"); n != 0 {
			t.Errorf("%d lines of the failed lookup, want none:\n%s", n, logs.String())
		}

		successorOfA.Store(nil) // its renewal finds no member that stays
		store.down.Store(false)
		ownerA.Store(w.manager)
		time.Sleep(2 * storeWaitTick)
		synctest.Wait()
		if r := w.deliver(t, "m1", "hi"); r.ErrorCode != "" || r.Disposition != platforms.Started {
			t.Errorf("the message once the database answers: %+v, want started", r)
		}
		w.awaitTurnEnds(1)
	})
}

// TestFailedHolderLookupsAreLoggedOnceAMinute: in an outage the lookup of the key's holder
// fails for every chat that writes; the line says so at once, and then at most once a minute,
// counting the failures in between (repeats). Before, each was a line: with the RUNBOOK's
// other lines of the outage among them, journald's rate limit dropped what came next.
func TestFailedHolderLookupsAreLoggedOnceAMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testutil.Buffer
		var lookups atomic.Int32
		var owner atomic.Pointer[actor.PID]
		w, _ := outageWorld(t, &logs, &lookups, &owner)
		owner.Store(w.manager)
		deliver := func(chat string) *DeliverResult {
			t.Helper()
			src := w.src
			src.ChatID = chat
			key := identity.Key(src, w.d.Config.Keys)
			d := &Deliver{SessionKey: key, Source: sourceToProto(src), MessageId: "m-" + chat, Text: "hi",
				ReceivedAtUnixNano: time.Now().UnixNano()}
			res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: key, Msg: d}, time.Hour).Result()
			if err != nil {
				t.Fatalf("message of chat %s: %v", chat, err)
			}
			return res.(*DeliverResult)
		}
		for i := range 30 {
			if r := deliver(fmt.Sprint("c", i)); r.ErrorCode != ErrCodeUnavailable {
				t.Fatalf("message %d during the outage: %+v, want unavailable", i, r)
			}
		}
		synctest.Wait()
		if n := strings.Count(logs.String(), "could not look up which member holds the session"); n != 1 {
			t.Errorf("%d lines for 30 failed lookups within a minute, want 1:\n%s", n, logs.String())
		}
		time.Sleep(time.Minute) // (the sessions' claims come back past downTries: only the lookups fail)
		deliver("late")
		synctest.Wait()
		lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
		var last string
		for _, l := range lines {
			if strings.Contains(l, "could not look up which member holds the session") {
				last = l
			}
		}
		if !strings.Contains(last, "repeats=29") || !strings.Contains(last, "session=") || !strings.Contains(last, "err=") {
			t.Errorf("the line a minute later: %q, want the session, err and repeats=29 (the failures held back)", last)
		}
	})
}

// TestLeavingMemberDoesNotClaimAKeyItWaitedToLoad: a session that waits for the database to
// load (its claim refused as unavailable) when its member starts to leave does not claim the key
// once the database answers: it stops without loading, and its manager hands the key's work on
// to the successor (a Recover), which runs it. Before, the waiting session took no notice of the
// leave; once PostgreSQL was back it claimed the key, fencing the turn the key's new holder was
// running, and ran the same pending message beside it on the leaving member (a black-box cluster
// soak's PostgreSQL restart: the message's agent ran on two members at once).
func TestLeavingMemberDoesNotClaimAKeyItWaitedToLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testutil.Buffer
		var lookups atomic.Int32
		var owner atomic.Pointer[actor.PID]
		w, store := outageWorld(t, &logs, &lookups, &owner)
		owner.Store(w.manager)
		if r := w.deliver(t, "m1", "hi"); r.ErrorCode != ErrCodeUnavailable {
			t.Fatalf("the message during the outage: %+v, want unavailable", r)
		}
		synctest.Wait()
		successor, forwarded := w.forwardSink()
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return successor }})
		synctest.Wait()
		claims := store.claims.Load()

		store.down.Store(false)
		time.Sleep(3 * storeWaitTick)
		synctest.Wait()
		if n := store.claims.Load() - claims; n != 0 {
			t.Errorf("the leaving member's waiting session claimed the key %d times once the database answered, want 0", n)
		}
		if recovers := recoversOf(forwarded, w.key); recovers != 1 {
			t.Errorf("%d Recovers of the key handed to the successor, want 1 (it runs what the store holds)", recovers)
		}
	})
}
