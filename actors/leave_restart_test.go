package actors

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"
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
