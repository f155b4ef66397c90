//go:build !race

// A multi-member cluster test: without -race, as cluster_test.go says why.

package supervisor

import (
	"context"
	"testing"
	"time"

	"github.com/agentgate/agentgate/platforms"
)

// TestClusterRequestToAMemberThatLeftIsSentAgainAtOnce: a message for a chat whose session
// ran on a member that stops answering (killed: here, its gRPC server shut) waits in the
// cluster router's attempt to that member; once the membership drops the member, the attempt
// is given up and the message goes to the key's new owner at once. Before, the attempt waited
// out its 10 s (clusterAttemptTimeout) whatever member_ttl (2 s here): a message for a dead
// member's chat was answered some 8 s after the takeover (found by an audit).
func TestClusterRequestToAMemberThatLeftIsSentAgainAtOnce(t *testing.T) {
	rs := startClusterMembers(t, 2, okAgent, 0)
	a, b := rs[0], rs[1]
	defer a.stop(t)
	t.Cleanup(func() { // also after a failure: b's goroutines must not outlive the test
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = b.d.Stop(ctx) // a dead member's stop: its errors are the death's
	})
	owner := ownerOf(a.d.cluster.MemberList.Members().Members())
	i := 0
	for owner(a.d.intake.Key(chat(i))) != b.d.system.Address() {
		i++
	}
	src := chat(i)
	a.inject(t, src, "m1", "one") // a's router now holds the session's grain on b
	waitReply(t, rs, "m1")

	// b dies as a kill -9 would have it: it answers nothing, and renews its registration no
	// more, which expires after member_ttl; a then drops it from the membership.
	b.d.cluster.Remote.Shutdown(false)
	b.d.membership.once.Do(func() { close(b.d.membership.stop) })
	// The bound is a failure's, not a wait for an effect: below the attempt's 10 s.
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Second)
	defer cancel()
	sent := make(chan error, 1)
	go func() {
		_, err := a.fake.Inject(ctx, &platforms.Inbound{Source: src, MessageID: "m2", Text: "two"})
		sent <- err
	}()
	if err := <-sent; err != nil {
		t.Fatalf("m2, sent while the member of its session died: %v; want it taken by the key's new owner", err)
	}
	waitReply(t, []*runtime{a}, "m2")
}
