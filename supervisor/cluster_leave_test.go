//go:build !race

// A multi-member cluster test: without -race, as cluster_test.go says why.

package supervisor

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence/postgres"
	"github.com/agentgate/agentgate/platforms"
)

// TestClusterLeavingMemberKeepsItsKeysUntilDrained: a member stops while a turn of a key it
// owns runs, with a drain long enough for the turn to finish. Until its drain ends the other
// member neither recovers nor activates that key: it routes the chat's next message to the
// leaving member, which stores it behind the running turn (queued), and the key's successor runs
// it once the turn's result is stored. Another chat of the leaving member is answered at once,
// by the successor, while the drain still waits for the turn. The agent never runs twice at once
// for a session, and the running turn's message runs once.
//
// Before, the leaving member withdrew its membership row before it drained: the survivor's next
// renewal dropped it, its recovery activated the key and claimed it, and ran the message whose
// turn the leaving member was still finishing (whose result was then fenced).
func TestClusterLeavingMemberKeepsItsKeysUntilDrained(t *testing.T) {
	release := make(chan struct{})
	started := make(chan string, 4)
	var mu sync.Mutex
	running := map[string]int{} // session key → agent calls running now
	overlaps := 0               // agent calls that began while another one of their session ran
	calls := map[string]int{}   // message text → agent calls
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		key, text := req.Identity.SessionKey, req.Messages[0].Text
		mu.Lock()
		running[key]++
		if running[key] > 1 {
			overlaps++
		}
		calls[text]++
		mu.Unlock()
		defer func() {
			mu.Lock()
			running[key]--
			mu.Unlock()
		}()
		if text == "slow" {
			started <- key
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return &agents.Response{Text: "ok " + text}, nil
	})
	rs := startClusterMembers(t, 2, agent, 30*time.Second)
	a, leaving := rs[0], rs[1]
	defer a.stop(t)
	releaseOnce := sync.OnceFunc(func() { close(release) })
	defer releaseOnce() // a failed test must not hold the leaving member's drain

	// Two chats whose keys the leaving member owns.
	owner := ownerOf(a.d.cluster.MemberList.Members().Members())
	var busy, other identity.Source
	for i, found := 0, 0; found < 2; i++ {
		if owner(a.d.intake.Key(chat(i))) != leaving.d.system.Address() {
			continue
		}
		if found++; found == 1 {
			busy = chat(i)
		} else {
			other = chat(i)
		}
	}
	busyKey := a.d.intake.Key(busy)
	a.inject(t, other, "other-1", "first") // the other chat's session is in memory, idle, on the leaving member
	waitReply(t, rs, "other-1")
	a.inject(t, busy, "slow-1", "slow")
	if key := <-started; key != busyKey {
		t.Fatalf("the slow turn ran for %s, want %s", key, busyKey)
	}

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		leaving.stop(t)
	}()
	// The survivor renews (as its own renewal would) once the leaving member's registration
	// shows that it leaves, and recovers what it then owns.
	waitUntil(t, func() bool {
		live, err := a.d.members.Heartbeat(t.Context(), a.d.cfg.Cluster.Name, a.d.membership.me, a.d.cfg.Cluster.MemberTTL)
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(live, func(m postgres.Member) bool { return m.ID == leaving.d.system.ID && !m.Leaving }) {
			return false
		}
		a.d.membership.publish(a.d.cluster, live)
		return true
	})
	a.d.recoverOwned(a.d.cluster.MemberList.Members().Members())

	// The busy chat's next message is stored by the leaving member, behind the running turn.
	if ack := a.inject(t, busy, "next-1", "next"); ack != nil && ack.Disposition != platforms.Queued {
		t.Errorf("the message after the slow one: disposition %q, want %q", ack.Disposition, platforms.Queued)
	}
	own, err := a.d.store.Ownership(t.Context(), busyKey)
	if err != nil {
		t.Fatal(err)
	}
	if own.Owner != leaving.d.deps.Node {
		t.Errorf("while the leaving member still ran the key's turn, %s claimed the key (the leaving member is %s)", own.Owner, leaving.d.deps.Node)
	}
	// The other chat does not wait for the drain: its successor answers it.
	a.inject(t, other, "other-2", "second")
	waitReply(t, rs, "other-2")
	select {
	case <-stopped:
		t.Error("the leaving member stopped before its running turn finished")
	default:
	}

	releaseOnce()
	for _, id := range []string{"slow-1", "next-1"} {
		waitReply(t, rs, id)
	}
	<-stopped
	for _, id := range []string{"slow-1", "next-1", "other-2"} {
		if n := repliesTo(rs, id); n != 1 {
			t.Errorf("message %s answered %d times, want once", id, n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if overlaps > 0 || calls["slow"] != 1 {
		t.Errorf("the agent ran twice at once for a session %d times, and %d times for the slow message; want never, and once",
			overlaps, calls["slow"])
	}
}

// waitReply waits until one of the members sent the end of a reply to the message id.
func waitReply(t *testing.T, rs []*runtime, id string) {
	t.Helper()
	waitUntil(t, func() bool { return repliesTo(rs, id) > 0 })
}

// repliesTo counts the turns' ends sent in reply to id, over the members.
func repliesTo(rs []*runtime, id string) int {
	n := 0
	for _, r := range rs {
		for _, o := range r.fake.Sent() {
			if o.TurnEnd && slices.Contains(o.InReplyTo, id) {
				n++
			}
		}
	}
	return n
}
