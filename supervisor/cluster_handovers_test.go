//go:build !race

// A multi-member cluster test: without -race, as cluster_test.go says why.

package supervisor

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// chatsOf returns the first n chats (chat(i)) whose keys r owns, in the view of members.
func chatsOf(from, r *runtime, n int) []int {
	owner := ownerOf(from.d.cluster.MemberList.Members().Members())
	var out []int
	for i := 0; len(out) < n; i++ {
		if owner(from.d.intake.Key(chat(i))) == r.d.system.Address() {
			out = append(out, i)
		}
	}
	return out
}

// TestClusterCountsSessionsHandedOn: a member that leaves counts the sessions that handed their
// keys on to another member (agentgate_sessions_handed_on_total), and none of them as fenced.
// Before, no metric counted a hand-over: the README said agentgate_sessions_fenced_total did,
// and it stayed 0 through an operator's rolling restarts.
func TestClusterCountsSessionsHandedOn(t *testing.T) {
	rs := startClusterMembers(t, 2, okAgent, 0)
	a, b := rs[0], rs[1]
	defer a.stop(t)
	for _, i := range chatsOf(a, b, 3) {
		a.inject(t, chat(i), fmt.Sprint("m", i), "hi")
		waitReply(t, rs, fmt.Sprint("m", i))
	}
	b.stop(t)
	if n := testutil.ToFloat64(b.d.metrics.SessionsHandedOn); n != 3 {
		t.Errorf("the leaving member counted %v sessions handed on, want its 3", n)
	}
	if n := testutil.ToFloat64(b.d.metrics.SessionsFenced); n != 0 {
		t.Errorf("the leaving member counted %v sessions fenced, want none", n)
	}
}

// TestClusterCountsSessionsTakenOver: a member dies while a turn of one of its chats runs; the
// member that takes the chat over, with its message pending, counts it
// (agentgate_sessions_taken_over_total). Before, nothing counted such a takeover.
func TestClusterCountsSessionsTakenOver(t *testing.T) {
	started := make(chan struct{}, 1)
	var blockOnce atomic.Bool // the first run blocks; the member that takes the chat over runs it again
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		if req.Messages[0].Text == "slow" && blockOnce.CompareAndSwap(false, true) {
			started <- struct{}{}
			<-ctx.Done() // until its member dies (and stops at the test's end)
			return nil, ctx.Err()
		}
		return &agents.Response{Text: "ok " + req.Messages[0].Text}, nil
	})
	rs := startClusterMembers(t, 2, agent, 0)
	a, b := rs[0], rs[1]
	defer a.stop(t)
	t.Cleanup(func() { // also after a failure: b's goroutines must not outlive the test
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = b.d.Stop(ctx) // a dead member's stop: its errors are the death's
	})
	i := chatsOf(a, b, 1)[0]
	a.inject(t, chat(i), "m1", "slow")
	<-started

	// b dies as a kill -9 would have it: it answers nothing, and renews its registration no
	// more, which expires after member_ttl; a then drops it and takes its chats over.
	b.d.cluster.Remote.Shutdown(false)
	b.d.membership.once.Do(func() { close(b.d.membership.stop) })
	waitReply(t, []*runtime{a}, "m1")
	if n := testutil.ToFloat64(a.d.metrics.SessionsTakenOver); n != 1 {
		t.Errorf("the member that took the chat over counted %v sessions taken over, want 1", n)
	}
}
