package actors

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"
)

// TestConcurrentActivationsClaimTheKeyOnce: members a and b activate the key at once (each
// waits for its lookup of the key's holder, so both activations are open together), for each
// way their views may place the key and each order of their messages. A member whose view
// places the key on itself is sent a message by its grain; one whose view places it on the
// other was handed its message by a leaving member, keeps it, and activates the key all the
// same. a's manager sorts before b's. Exactly one of them claims the key (the other forwards
// its message there), and each message runs once.
//
// Before, an activation held the key for another only when its own view placed the key on
// itself and its PID sorted first, and did not know whether the asker's view placed the key on
// the asker: when the member handed the key sorted first, or each was handed it, neither held
// it for the other and both claimed it (the first claim fenced, the agent could run twice).
func TestConcurrentActivationsClaimTheKeyOnce(t *testing.T) {
	for _, tc := range []struct {
		name         string
		viewA, viewB string // the member each one's view places the key on
		bKnowsA      bool   // b's view lists a (a's always lists b)
		orders       []string
		claims       string // the member that claims the key
	}{
		{"a handed the key its view places on b", "b", "b", true, []string{"b first", "a first", "at once"}, "b"},
		// b does not ask a. (Had a asked b before b began, neither would ask the other:
		// a member that does not know another and activates after it asked is a known gap.)
		{"a handed the key, b does not know a", "b", "b", false, []string{"b first"}, "b"},
		{"each handed the key its view places on the other", "b", "a", true, []string{"b first", "a first", "at once"}, "a"},
		{"each places the key on itself", "a", "b", true, []string{"b first", "a first", "at once"}, "a"},
		{"b handed the key its view places on a", "a", "a", true, []string{"b first", "a first", "at once"}, "a"},
	} {
		for _, order := range tc.orders {
			t.Run(tc.name+"/"+order, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					agent, ran := slowUntil(nil)
					var ownerA, ownerB atomic.Pointer[actor.PID]
					w := clusterWorld(t, agent)
					db := &Deps{Ctx: w.ctx, Store: w.store, Agent: agent, Platforms: w.d.Platforms, Log: w.d.Log,
						Metrics: metrics.New("fake"), Node: "b", Config: w.d.Config, Persist: w.d.Persist, Fencing: true, Clustered: true}
					b, err := w.system.Root.SpawnNamed(NewSessionManager(db), "zz-manager") // sorts after a
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = w.system.Root.StopFuture(b).Wait() })
					a := w.manager
					members := map[string]*actor.PID{"a": a, "b": b}
					gate := make(chan struct{})
					var bPeers []*actor.PID
					if tc.bKnowsA {
						bPeers = []*actor.PID{a}
					}
					w.d.Placement = gatedHolder{peersPlacement{self: a, peers: []*actor.PID{b}, owner: &ownerA}, w.key, gate}
					db.Placement = gatedHolder{peersPlacement{self: b, peers: bPeers, owner: &ownerB}, w.key, gate}
					ownerA.Store(members[tc.viewA])
					ownerB.Store(members[tc.viewB])

					send := func(to *actor.PID, view, id, text string) *actor.Future {
						msg := w.message(id, text)
						if members[view].Equal(to) {
							return w.system.Root.RequestFuture(to, &Routed{Key: w.key, Msg: msg}, time.Hour)
						}
						// Handed by a leaving member: it stays here.
						return w.system.Root.RequestFuture(to, &Forward{Key: w.key, Hops: 1,
							Msg: &Forward_Deliver{Deliver: msg}}, time.Hour)
					}
					var fa, fb *actor.Future
					switch order {
					case "b first":
						fb = send(b, tc.viewB, "m1", "one")
						synctest.Wait()
						fa = send(a, tc.viewA, "m2", "two")
					case "a first":
						fa = send(a, tc.viewA, "m2", "two")
						synctest.Wait()
						fb = send(b, tc.viewB, "m1", "one")
					case "at once":
						fa = send(a, tc.viewA, "m2", "two")
						fb = send(b, tc.viewB, "m1", "one")
					}
					synctest.Wait()
					close(gate) // the lookups answer: no other member holds the key
					for _, f := range []*actor.Future{fa, fb} {
						if res, err := f.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
							t.Errorf("deliver: %+v %v", res, err)
						}
					}
					w.awaitTurnEnds(2)
					synctest.Wait()
					if own, err := w.store.Ownership(w.ctx, w.key); err != nil || own.Epoch != 1 || own.Owner != tc.claims {
						t.Errorf("the key's claim is %+v (%v), want one claim, %s's", own, err, tc.claims)
					}
					if ran("one") != 1 || ran("two") != 1 {
						t.Errorf("the agent ran one %d times and two %d, want once each", ran("one"), ran("two"))
					}
				})
			})
		}
	}
}

// TestActivationRanks: of two activations of a key that ask each other to let go of it, exactly
// one holds it for the other, however their views placed the key, and the one whose view placed
// it on its own member does. With a member of an earlier version, which holds the key when its
// own view places it there and its PID sorts first, they never both hold it (each would forward
// the key's messages to the other).
func TestActivationRanks(t *testing.T) {
	for _, pids := range [][2]*actor.PID{{actor.NewPID("h", "a"), actor.NewPID("h", "b")}, {actor.NewPID("h", "b"), actor.NewPID("h", "a")}} {
		x, y := pids[0], pids[1]
		for _, ownX := range []bool{false, true} {
			for _, ownY := range []bool{false, true} {
				ax, ay := &activation{owner: ownX}, &activation{owner: ownY}
				holdsX := ax.ranksFirst(x, y, &Release{Owner: proto.Bool(ownY)})
				holdsY := ay.ranksFirst(y, x, &Release{Owner: proto.Bool(ownX)})
				if holdsX == holdsY {
					t.Errorf("%s (owner %v) holds the key for %s (owner %v): %v, and the other way round: %v; want exactly one",
						x.Id, ownX, y.Id, ownY, holdsX, holdsY)
				}
				if ownX != ownY && holdsX != ownX {
					t.Errorf("%s (owner %v) holds the key for %s (owner %v): %v, want %v", x.Id, ownX, y.Id, ownY, holdsX, ownX)
				}
				earlierY := ownY && y.String() < x.String() // y runs an earlier version
				if ax.ranksFirst(x, y, &Release{}) && earlierY {
					t.Errorf("%s (owner %v) and %s of an earlier version (owner %v) both hold the key", x.Id, ownX, y.Id, ownY)
				}
			}
		}
	}
}
