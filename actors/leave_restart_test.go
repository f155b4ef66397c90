package actors

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/asynkron/protoactor-go/actor"
)

// TestManagerRestartedWhileItsMemberLeavesHandsOnItsStoppedKeys: a leaving member's manager
// panics while m1's turn runs, after the daemon has asked its drain, and its supervisor restarts
// it: the restart stops m1's session and cancels its turn, whose agent takes 3 s to return. Once
// it has returned, the new incarnation hands the key on (a Recover to its successor, which runs
// m1, pending in the store), and only then answers the drain. Before, nothing handed the key on:
// m1 waited for the member's withdrawal, after the drain the new incarnation answered at once,
// and for the recovery of the key's owner then.
func TestManagerRestartedWhileItsMemberLeavesHandsOnItsStoppedKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent, w, forwarded, drained := restartedWhileLeaving(t)
		if n := recoversOf(forwarded, w.key); n != 0 {
			t.Errorf("the key was handed on %d times while m1's cancelled call had yet to return, want none yet", n)
		}
		if l := w.list(t); len(l.Keys) != 0 || len(l.Busy) != 0 || !slices.Equal(l.HandingOn, []string{w.key}) || answered(drained) {
			t.Errorf("while m1's cancelled call ends: sessions %v, busy %v, handing on %v, drained %v; want none in memory or busy, %s handing on, the drain waiting",
				l.Keys, l.Busy, l.HandingOn, answered(drained), w.key)
		}

		time.Sleep(3 * time.Second) // (synctest's clock) the cancelled call returns
		synctest.Wait()
		if n := recoversOf(forwarded, w.key); n != 1 {
			t.Errorf("the restarted manager handed the key of its stopped session on %d times, want once (m1 is pending)", n)
		}
		if !answered(drained) {
			t.Error("the drain was not answered once the key was handed on")
		}
		if l := w.list(t); len(l.Keys) != 0 || len(l.HandingOn) != 0 {
			t.Errorf("once handed on: sessions %v, handing on %v; want none", l.Keys, l.HandingOn)
		}
		if got, want := agent.events(), []string{"m1 starts", "m1 returns"}; !slices.Equal(got, want) {
			t.Errorf("agent calls %q, want %q (m1 runs again at the successor only)", got, want)
		}
		w.wantPendingAlone(t, "m1")
	})
}

// TestManagerRestartedWhileItsMemberLeavesHoldsItsStoppedKeysMessages: as in
// TestManagerRestartedWhileItsMemberLeavesHandsOnItsStoppedKeys, the restart of a leaving
// member's manager cancels m1's turn, whose agent takes 3 s to return; meanwhile the chat's next
// message, m2, reaches the new incarnation (a client's retry of a message answered "stopped" at
// the restart comes at once). It is held with the key until the cancelled call has returned, and
// then handed on: the key's successor, which loads m1 pending in the store, would run it again
// beside the call still ending here. Before, m2 went on to the successor at once, and the wait
// for the cancelled calls held back only the Recover.
func TestManagerRestartedWhileItsMemberLeavesHoldsItsStoppedKeysMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent, w, forwarded, drained := restartedWhileLeaving(t)
		w.request("m2", "second")
		synctest.Wait()
		for len(forwarded) > 0 {
			f := <-forwarded
			t.Errorf("forwarded %s's %T while m1's cancelled call had yet to return, want nothing yet", f.Key, f.Msg)
		}
		if l := w.list(t); !slices.Equal(l.HandingOn, []string{w.key}) || answered(drained) {
			t.Errorf("while m1's cancelled call ends: handing on %v, drained %v; want %s handing on, the drain waiting",
				l.HandingOn, answered(drained), w.key)
		}

		time.Sleep(3 * time.Second) // (synctest's clock) the cancelled call returns
		synctest.Wait()
		var got []string
		for len(forwarded) > 0 {
			f := <-forwarded
			if f.Key != w.key {
				continue
			}
			if d := f.GetDeliver(); d != nil {
				got = append(got, d.MessageId)
			} else if f.GetRecover() != nil {
				got = append(got, "recover")
			}
		}
		if len(got) == 0 || got[0] != "m2" {
			t.Errorf("handed on %q once m1's call returned, want m2 first (its activation runs m1 too)", got)
		}
		if !answered(drained) {
			t.Error("the drain was not answered once the key was handed on")
		}
		if got, want := agent.events(), []string{"m1 starts", "m1 returns"}; !slices.Equal(got, want) {
			t.Errorf("agent calls %q, want %q (m1 runs again at the successor only)", got, want)
		}
	})
}

// restartedWhileLeaving opens the tests of a leaving member's restarted manager: m1's turn runs
// on a member leaving to a sink successor (leaveToASink), the daemon's drain is asked, and the
// manager restarts while m1's cancelled agent call takes 3 s to return.
func restartedWhileLeaving(t *testing.T) (*slowToEnd, *managerWorld, chan *Forward, <-chan struct{}) {
	t.Helper()
	agent := &slowToEnd{ending: 3 * time.Second}
	w := newManagerWorld(t, agent, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true })
	if res := w.deliver(t, "m1", "first"); res.Disposition != "started" {
		t.Fatalf("m1: %+v", res)
	}
	synctest.Wait()
	forwarded, drained, restart := w.leaveToASink(t)
	restart()
	return agent, w, forwarded, drained
}

// TestManagerRestartedWhileItsMemberLeavesRunsAKeyNoMemberTakesBeforeItsDrainEnds: a leaving
// member with no member to take m1's key over (Leave.Successor answers nil: the whole cluster
// stops) has its manager restarted while m1's turn runs, after the daemon asked its drain. Once
// the cancelled call has returned, the new incarnation recovers the key here, as a member that
// stays does, and the drain waits for m1's turn run again, as it waits for any turn. Before, the
// drain was answered as the recovery began, before the key's session had loaded m1: the daemon
// went on to stop with m1's turn starting behind the drain, and the stop cut it.
func TestManagerRestartedWhileItsMemberLeavesRunsAKeyNoMemberTakesBeforeItsDrainEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		gate := make(chan struct{})
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			if calls.Add(1) == 1 { // m1's first turn: cancelled by the restart, it takes 3 s to end
				<-ctx.Done()
				time.Sleep(3 * time.Second)
				return nil, ctx.Err()
			}
			<-gate // m1's turn run again
			return &agents.Response{Text: "ok"}, nil
		})
		w := newManagerWorld(t, agent, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true })
		if res := w.deliver(t, "m1", "first"); res.Disposition != "started" {
			t.Fatalf("m1: %+v", res)
		}
		synctest.Wait()
		var boom atomic.Bool
		w.system.Root.Send(w.manager, &Leave{Successor: func(key string) *actor.PID {
			if key == "other-key" && boom.CompareAndSwap(true, false) {
				panic("the successor's lookup fails")
			}
			return nil // no member takes a key over
		}})
		drained := w.drain()
		synctest.Wait()
		w.restartManager(t, &boom)
		if answered(drained) {
			t.Fatal("the drain was answered while m1's cancelled call had yet to return")
		}

		time.Sleep(3 * time.Second) // (synctest's clock) the cancelled call returns
		synctest.Wait()
		if n := calls.Load(); n != 2 {
			t.Fatalf("%d agent calls once m1's cancelled call returned, want 2 (m1 runs again here: no member takes its key)", n)
		}
		if answered(drained) {
			t.Error("the drain was answered while m1's turn run again by the recovery ran, want it to wait for that turn")
		}
		close(gate)
		w.awaitTurnEnds(1)
		synctest.Wait()
		if !answered(drained) {
			t.Error("the drain was not answered once m1's turn run again had ended")
		}
	})
}

// TestLeavingManagerRestartedWithNoListingSaysWhereTheWorkGoes: a leaving member's manager
// restarts while m1's turn runs, and once the cancelled call has returned the store cannot list
// the keys with work pending. A line says so, and what becomes of that work: a key another
// member takes over has it recovered there once this member has withdrawn; a key no member takes
// over (the whole cluster stops) keeps it in the store, pending, for the member that owns the key
// next, unless a recovery (the member's recovery sweep) or a message came for it while its
// session stopped: then its work runs here, before the drain ends. Before, the line said the
// member that takes each key over recovers its work for all three, and for the last two there
// is none (a review); then that the third's work stays pending, counted in no_successor, while
// it ran here (a review of that fix).
func TestLeavingManagerRestartedWithNoListingSaysWhereTheWorkGoes(t *testing.T) {
	const (
		listing   = `level=WARN msg="list the sessions with unfinished work, to hand on those the manager's restart stopped; `
		handed    = listing + `the member that takes each over recovers its work once this one has withdrawn"`
		noneTakes = listing + `a key another member takes over has its work recovered there once this one has withdrawn, ` +
			`and one no member takes over keeps it in the store, pending, for the member that owns the key next (no_successor: at its start or recovery sweep), ` +
			`or runs it here before the drain ends when a message or a recovery came for it meanwhile (run_here)"`
	)
	for _, tc := range []struct {
		name      string
		successor bool
		recovered bool // a Recover for the key comes while its session stops
		want      string
		counts    string // the line's counts, when it has them
		events    []string
	}{
		{"another member takes the key over", true, false, handed, "", []string{"m1 starts", "m1 returns"}},
		{"no member takes the key over", false, false, noneTakes, "no_successor=1 run_here=0",
			[]string{"m1 starts", "m1 returns"}},
		{"no member takes the key over, and a recovery comes for it", false, true, noneTakes, "no_successor=0 run_here=1",
			[]string{"m1 starts", "m1 returns", "m1 starts", "m1 returns"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				agent := &slowToEnd{ending: 3 * time.Second}
				var fail atomic.Bool
				logs := new(testutil.Buffer)
				w := newManagerWorld(t, agent, loggedTo(logs, func(d *Deps) {
					d.Node, d.Fencing, d.Clustered = "a", true, true
					d.Store = listingFails{d.Store, &fail}
				}))
				if res := w.deliver(t, "m1", "first"); res.Disposition != "started" {
					t.Fatalf("m1: %+v", res)
				}
				synctest.Wait()
				sink, _ := w.forwardSink()
				var boom atomic.Bool
				w.system.Root.Send(w.manager, &Leave{Successor: func(key string) *actor.PID {
					if key == "other-key" && boom.CompareAndSwap(true, false) {
						panic("the successor's lookup fails")
					}
					if tc.successor {
						return sink
					}
					return nil
				}})
				drained := w.drain()
				synctest.Wait()
				w.restartManager(t, &boom)
				fail.Store(true)
				if tc.recovered {
					w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &Recover{}})
					synctest.Wait()
				}

				time.Sleep(3 * time.Second) // (synctest's clock) the cancelled call returns
				synctest.Wait()
				lines := linesWith(logs, listing)
				if len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
					t.Fatalf("the listing's lines: %q, want one with %s", lines, tc.want)
				}
				if tc.counts != "" && !strings.Contains(lines[0], tc.counts) {
					t.Errorf("the listing's line %q does not count the key as %s", lines[0], tc.counts)
				}
				if tc.recovered {
					w.awaitTurnEnds(1) // m1 run again here
					synctest.Wait()
				}
				if !answered(drained) {
					t.Error("the drain was not answered")
				}
				if got := agent.events(); !slices.Equal(got, tc.events) {
					t.Errorf("agent calls %q, want %q", got, tc.events)
				}
				if !tc.recovered {
					w.wantPendingAlone(t, "m1")
				}
			})
		})
	}
}
