//go:build !race

// A multi-member cluster test: without -race, as cluster_test.go says why.

package supervisor

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/platforms"
)

// TestClusterJoiningMemberWaitsForTheRunningTurn: a member joins while the only other member
// runs a turn for each of many chats; the join moves some of those keys to it. The joining
// member does not claim a moved key while its turn still runs on the other: its recovery and the
// chat's next message wait for the other member to let go (actors.Release). That next message is
// stored behind the running turn (queued), and runs on the new owner once the turn's result is
// stored and sent. Every message runs once, and no session's agent runs twice at once.
//
// Before, the joining member's recovery claimed the moved keys at once: the running turns were
// cancelled, and their messages ran again on the new member, for a moment beside the old runs.
func TestClusterJoiningMemberWaitsForTheRunningTurn(t *testing.T) {
	release := make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	defer releaseOnce() // a failed test must not hold the members' drains
	rec := newTurnRecorder(release, 64)
	agent := rec.agent()
	dsn := pgtest.NewDatabase(t)
	a := startClusterOn(t, dsn, 1, agent, 30*time.Second)[0]
	defer a.stop(t)

	const chats = 12 // the join moves none of them with a chance of 1 in 4,096
	for i := range chats {
		a.inject(t, chat(i), fmt.Sprint("slow-", i), fmt.Sprint("slow-", i))
	}
	for range chats {
		<-rec.started
	}

	b := startClusterMember(t, dsn, agent, 30*time.Second)
	defer b.stop(t)
	rs := []*runtime{a, b}
	waitUntil(t, func() bool {
		return len(a.d.cluster.MemberList.Members().Members()) == 2 && len(b.d.cluster.MemberList.Members().Members()) == 2
	})
	owner := ownerOf(b.d.cluster.MemberList.Members().Members())
	var moved []int
	for i := range chats {
		if owner(b.d.intake.Key(chat(i))) == b.d.system.Address() {
			moved = append(moved, i)
		}
	}
	if len(moved) == 0 {
		t.Fatalf("the join moved none of the %d chats' keys to the new member", chats)
	}
	// Both members recover what they own, as their next sweep would.
	a.d.recoverOwned(a.d.cluster.MemberList.Members().Members())
	b.d.recoverOwned(b.d.cluster.MemberList.Members().Members())

	// A moved chat's next message, sent through the new owner, is stored behind the running turn.
	next := moved[0]
	if ack := b.inject(t, chat(next), "next", "next"); ack != nil && ack.Disposition != platforms.Queued {
		t.Errorf("the message after the running turn: disposition %q, want %q", ack.Disposition, platforms.Queued)
	}
	for _, i := range moved {
		key := b.d.intake.Key(chat(i))
		own, err := b.d.store.Ownership(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		if own.Owner != a.d.deps.Node {
			t.Errorf("chat %d: while the first member still ran its turn, %s claimed the key (the first member is %s)",
				i, own.Owner, a.d.deps.Node)
		}
	}

	releaseOnce()
	for i := range chats {
		waitReply(t, rs, fmt.Sprint("slow-", i))
	}
	waitReply(t, rs, "next")
	for i := range chats {
		if n := repliesTo(rs, fmt.Sprint("slow-", i)); n != 1 {
			t.Errorf("slow-%d answered %d times, want once", i, n)
		}
	}
	if n := repliesTo(rs, "next"); n != 1 {
		t.Errorf("the next message answered %d times, want once", n)
	}
	key := b.d.intake.Key(chat(next))
	if own, err := b.d.store.Ownership(t.Context(), key); err != nil || own.Owner != b.d.deps.Node {
		t.Errorf("after the turn, the moved key is owned by %+v (%v), want the new member %s", own, err, b.d.deps.Node)
	}
	// The chat's replies are in the order of its messages, though two members sent them.
	out, err := b.d.store.OutboxAfter(t.Context(), key, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, e := range out {
		order = append(order, e.InReplyTo...)
	}
	if want := fmt.Sprint([]string{fmt.Sprint("slow-", next), "next"}); fmt.Sprint(order) != want {
		t.Errorf("the moved chat's replies answer %v, in that order; want %s", order, want)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for i := range chats {
		if n := rec.calls[fmt.Sprint("slow-", i)]; n != 1 {
			t.Errorf("the agent ran slow-%d %d times, want once", i, n)
		}
	}
	if rec.overlaps > 0 || rec.calls["next"] != 1 {
		t.Errorf("the agent ran twice at once for a session %d times, and %d times for the next message; want never, and once",
			rec.overlaps, rec.calls["next"])
	}
}
