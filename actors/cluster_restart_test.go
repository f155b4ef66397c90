package actors

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
)

// listingFails is listingPanics whose Recoverable fails, once the panic is past, while fail is
// set: a store that cannot answer for a moment.
type listingFails struct {
	persistence.Store
	fail *atomic.Bool
}

func (l listingFails) Recoverable(ctx context.Context) ([]string, error) {
	keys, err := l.Store.Recoverable(ctx)
	if l.fail.Load() {
		return nil, errors.New("the store does not answer")
	}
	return keys, err
}

// lettingGoPeer spawns a stand-in for another member's manager that holds no key: it answers
// every Release that it lets go, and takes the keys asked and the Forwards handed on to it into
// the channels returned (8 at most each).
func (w *managerWorld) lettingGoPeer() (pid *actor.PID, asked chan string, forwarded chan *Forward) {
	asked, forwarded = make(chan string, 8), make(chan *Forward, 8)
	pid = w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch m := c.Message().(type) {
		case *Release:
			asked <- m.Key
			c.Respond(&Released{Key: m.Key, Address: c.Self().Address, Id: c.Self().Id, Activation: m.Activation})
		case *Forward:
			forwarded <- m
		}
	}))
	return pid, asked, forwarded
}

// TestRestartedMemberRecoversTheStoppedKeysItOwns: a cluster member that stays (it does not
// leave) has a peer; its manager panics while m1's turn runs, and the restart cancels that turn,
// whose agent takes 3 s to return. Nothing more comes for the chat. Once the cancelled call has
// returned, the new incarnation recovers the key, which this member owns, as a single daemon's
// does (recoverAll): it asks the peer to let go of the key, as every activation does, and runs
// m1 again; the cluster's next recovery sweep then finds the key's session in memory and runs
// nothing twice. Before, the key was let go with nothing held for it, and m1 waited for that
// sweep (every cluster.member_ttl, 6 s by default), unanswered, after a crash the supervisor
// healed at once. A key that another member owns by then is not run here: its Recover goes to
// that member (as a leaving member hands its stopped keys on), and m1 stays pending for it.
// When the store cannot list the keys with work pending as the hold ends, a line says so, and
// m1 waits for the sweep, as before.
func TestRestartedMemberRecoversTheStoppedKeysItOwns(t *testing.T) {
	for _, tc := range []struct {
		name  string
		moves bool // the key moves to the peer during the hold
		fails bool // the store cannot list the keys with work pending as the hold ends
	}{
		{"owned here", false, false},
		{"another member's now", true, false},
		{"the listing fails", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				agent := &slowToEnd{ending: 3 * time.Second}
				var fail atomic.Bool
				var restart func(*testing.T, *managerWorld)
				logs := new(testutil.Buffer)
				w := newManagerWorld(t, agent, loggedTo(logs, func(d *Deps) {
					d.Node, d.Fencing, d.Clustered = "a", true, true
					restart = panicsOnCue(d)
					d.Store = listingFails{d.Store, &fail}
				}))
				peer, asked, forwarded := w.lettingGoPeer()
				var owner atomic.Pointer[actor.PID]
				owner.Store(w.manager)
				w.d.Placement = testPlacement{self: w.manager, peer: peer, owner: &owner}
				if res := w.deliver(t, "m1", "first"); res.Disposition != "started" {
					t.Fatalf("m1: %+v", res)
				}
				synctest.Wait()
				<-asked // (m1's activation's)

				restart(t, w)
				if tc.moves {
					owner.Store(peer)
				}
				fail.Store(tc.fails)
				synctest.Wait()
				if got, want := agent.events(), []string{"m1 starts"}; !slices.Equal(got, want) || len(asked) > 0 || len(forwarded) > 0 {
					t.Errorf("while m1's cancelled call ends: agent calls %q (want %q), peer asked %d times, %d forwarded; want nothing run, asked or handed on yet",
						got, want, len(asked), len(forwarded))
				}

				time.Sleep(3 * time.Second) // (synctest's clock) the cancelled call returns
				synctest.Wait()
				if tc.moves {
					if got, want := agent.events(), []string{"m1 starts", "m1 returns"}; !slices.Equal(got, want) {
						t.Errorf("agent calls %q, want %q (the key is the peer's: m1 does not run here)", got, want)
					}
					if len(forwarded) != 1 || (<-forwarded).GetRecover() == nil {
						t.Error("the peer, which owns the key now, was not handed a Recover for it")
					}
					if l := w.list(t); len(l.Keys) != 0 {
						t.Errorf("sessions %v in memory, want none (the key is the peer's)", l.Keys)
					}
					w.wantPendingAlone(t, "m1")
					return
				}
				if tc.fails {
					if got, want := agent.events(), []string{"m1 starts", "m1 returns"}; !slices.Equal(got, want) {
						t.Errorf("agent calls %q, want %q (with no listing, m1 waits for the sweep)", got, want)
					}
					if !strings.Contains(logs.String(), `level=WARN msg="list the sessions with unfinished work, to recover those the manager's restart stopped; the cluster's recovery sweep recovers their work"`) {
						t.Errorf("no line says the listing failed and the sweep recovers the work; logs:\n%s", logs)
					}
					fail.Store(false)
				}
				want := []string{"m1 starts", "m1 returns", "m1 starts", "m1 returns"}
				if got := agent.events(); !tc.fails && !slices.Equal(got, want) {
					t.Errorf("once m1's cancelled call returned, agent calls %q, want %q (the member recovers the key it owns at once, not at the next recovery sweep)", got, want)
				}
				if !tc.fails && (len(asked) != 1 || <-asked != w.key) {
					t.Error("the recovery did not ask the peer to let go of the key before it ran m1")
				}
				if len(forwarded) > 0 {
					t.Errorf("%d forwarded to the peer, want none (the key is this member's)", len(forwarded))
				}

				// The cluster's recovery sweep, at its next pass, finds nothing left to run (m1, if
				// the listing failed).
				w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &Recover{}})
				synctest.Wait()
				if got := agent.events(); !slices.Equal(got, want) {
					t.Errorf("after the recovery sweep, agent calls %q, want %q (m1 runs again once)", got, want)
				}
			})
		})
	}
}
