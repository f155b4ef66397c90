//go:build !race

// A multi-member cluster test: without -race, as cluster_test.go says why.

package supervisor

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/platforms"
)

// TestClusterThreeViewsMoveAKeyOnce: three members whose views of the cluster differ, as in a
// rolling restart. Member y leaves; member h, which has not renewed since, does not know that y
// leaves; member x joins after y began to leave, and neither y nor h knows of it. A chat of y's
// goes to h (y's successor); h runs its turn with a message queued behind it. The chat's next
// message reaches x, which owns the key in its view and asks h and y to let go of it; h, whose
// view still places the key on y, tells its session that the key moved. Every message of the
// chat still runs once, and is answered once, in order.
//
// Before, h handed what its session left queued to y, the key's owner in h's view; y, leaving,
// sent it back to h, whose new activation asked only y (h did not know of x), claimed the key
// beside x's activation, and ran the queued messages again (one of the two runs was fenced; once
// a message was answered twice).
func TestClusterThreeViewsMoveAKeyOnce(t *testing.T) {
	release, holdout := make(chan struct{}), make(chan struct{})
	releaseOnce, holdoutOnce := sync.OnceFunc(func() { close(release) }), sync.OnceFunc(func() { close(holdout) })
	defer releaseOnce()
	defer holdoutOnce()
	w := newWhereRan(4, func(text string) <-chan struct{} {
		switch {
		case text == "holdout":
			return holdout
		case text == "slow":
			return release
		}
		return nil
	})
	// Renewals every 100 s: the test renews by hand, and no member's view changes on its own.
	slowRenewals := func(c *config.Config) { c.Cluster.MemberTTL = 5 * time.Minute }
	dsn := pgtest.NewDatabase(t)
	h := startClusterMember(t, dsn, w.agent("h"), 2*time.Minute, slowRenewals)
	defer h.stop(t)
	told := &logSignal{want: "its sessions hand their keys on", ready: make(chan struct{})}
	yLeaves := told.ready
	y := MustStartDaemon(t, w.agent("y"), daemonOpts{drain: 2 * time.Minute, logs: told, tweak: func(c *config.Config) {
		clusterOn(dsn)(c)
		slowRenewals(c)
	}})
	live, err := h.d.membership.heartbeat(t.Context()) // h sees y at once, not at its next renewal
	if err != nil {
		t.Fatal(err)
	}
	viewOf(h.d.cluster).publish(live)
	waitUntil(t, func() bool {
		return len(h.d.cluster.MemberList.Members().Members()) == 2 && len(y.d.cluster.MemberList.Members().Members()) == 2
	})
	owner := ownerOf(h.d.cluster.MemberList.Members().Members())
	holdoutChat := 0 // a chat y owns
	for owner(h.d.intake.Key(chat(holdoutChat))) != y.d.system.Address() {
		holdoutChat++
	}
	h.inject(t, chat(holdoutChat), "holdout", "holdout") // its turn holds y's drain open
	<-w.started

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		y.stop(t)
	}()
	select {
	case <-yLeaves:
	case <-time.After(30 * time.Second):
		t.Fatal("the leaving member's manager was not told that it leaves")
	}
	x := startClusterMember(t, dsn, w.agent("x"), 2*time.Minute, slowRenewals)
	defer x.stop(t)
	rs := []*runtime{h, y, x}
	waitUntil(t, func() bool { return len(x.d.cluster.MemberList.Members().Members()) == 3 })
	if n := len(h.d.cluster.MemberList.Members().Members()); n != 2 {
		t.Fatalf("h sees %d members, want 2 (it has not renewed since x joined)", n)
	}
	// A chat of y's in h's view that is x's in x's. The members' share of keys is uneven when
	// their addresses differ only in the port (protoactor's rendezvous hash), so it is looked
	// for among many: among 16 of y's chats, sometimes none was x's.
	ownerX := ownerOf(x.d.cluster.MemberList.Members().Members())
	c := -1
	for i := holdoutChat + 1; i < holdoutChat+10_000; i++ {
		if owner(h.d.intake.Key(chat(i))) == y.d.system.Address() && ownerX(x.d.intake.Key(chat(i))) == x.d.system.Address() {
			c = i
			break
		}
	}
	if c < 0 {
		t.Fatal("none of 10,000 chats is y's in h's view and x's in x's")
	}

	// Sent through h, whose view places the chat on y; y hands it on to h, its successor.
	h.inject(t, chat(c), "slow", "slow")
	if text := <-w.started; text != "slow" {
		t.Fatalf("%s started, want slow", text)
	}
	if ack := h.inject(t, chat(c), "queued", "queued"); ack != nil && ack.Disposition != platforms.Queued {
		t.Errorf("queued: disposition %q, want %q", ack.Disposition, platforms.Queued)
	}
	// Sent through x, which owns the chat in its view: it asks h and y to let go of the key.
	if ack := x.inject(t, chat(c), "next", "next"); ack != nil && ack.Disposition != platforms.Queued {
		t.Errorf("next: disposition %q, want %q", ack.Disposition, platforms.Queued)
	}
	releaseOnce()
	for _, id := range []string{"slow", "queued", "next"} {
		waitReply(t, rs, id)
	}
	holdoutOnce()
	<-stopped
	ran := w.result()
	for _, id := range []string{"slow", "queued", "next"} {
		if got := ran[id]; len(got) != 1 {
			t.Errorf("%s ran on %v, want once", id, got)
		}
		if n := repliesTo(rs, id); n != 1 {
			t.Errorf("%s answered %d times, want once", id, n)
		}
	}
	out, err := x.d.store.OutboxAfter(t.Context(), x.d.intake.Key(chat(c)), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, e := range out {
		order = append(order, e.InReplyTo...)
	}
	if got := strings.Join(order, " "); got != "slow queued next" {
		t.Errorf("the chat's replies answer %s, in that order; want slow queued next", got)
	}
}

// TestClusterStaleMemberAsksTheKeysHolder: member x joins a cluster of h, which has not renewed
// since and does not know of x. A chat x owns in its view runs its turn on x; the chat's next
// message reaches h, whose view (h alone) places the chat on h. h's activation finds the key's
// holder in the store (its claim names x, a live member h does not know yet) and asks x to let
// go of it too: the next message is stored behind the running turn (queued), and every message
// of the chat runs once, on x, and is answered once, in order.
//
// Before, h asked only the members it knew (none), claimed the key at once and ran the chat's
// pending messages beside x: the running turn's agent ran a second time on h.
func TestClusterStaleMemberAsksTheKeysHolder(t *testing.T) {
	release := make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	defer releaseOnce()
	w := newWhereRan(4, func(text string) <-chan struct{} {
		if text == "slow" {
			return release
		}
		return nil
	})
	// Renewals every 100 s: the test renews by hand, and no member's view changes on its own.
	slowRenewals := func(c *config.Config) { c.Cluster.MemberTTL = 5 * time.Minute }
	dsn := pgtest.NewDatabase(t)
	h := startClusterMember(t, dsn, w.agent("h"), 10*time.Second, slowRenewals)
	defer h.stop(t)
	x := startClusterMember(t, dsn, w.agent("x"), 10*time.Second, slowRenewals)
	defer x.stop(t)
	rs := []*runtime{h, x}
	waitUntil(t, func() bool { return len(x.d.cluster.MemberList.Members().Members()) == 2 })
	if n := len(h.d.cluster.MemberList.Members().Members()); n != 1 {
		t.Fatalf("h sees %d members, want 1 (it has not renewed since x joined)", n)
	}
	ownerX := ownerOf(x.d.cluster.MemberList.Members().Members())
	c := -1
	for i := 0; i < 10_000 && c < 0; i++ {
		if ownerX(x.d.intake.Key(chat(i))) == x.d.system.Address() {
			c = i
		}
	}
	if c < 0 {
		t.Fatal("none of 10,000 chats is x's in x's view")
	}

	x.inject(t, chat(c), "slow", "slow")
	if text := <-w.started; text != "slow" {
		t.Fatalf("%s started, want slow", text)
	}
	// Sent through h, whose view places the chat on h.
	if ack := h.inject(t, chat(c), "next", "next"); ack != nil && ack.Disposition != platforms.Queued {
		t.Errorf("next: disposition %q, want %q", ack.Disposition, platforms.Queued)
	}
	key := x.d.intake.Key(chat(c))
	if own, err := x.d.store.Ownership(t.Context(), key); err != nil || own.Owner != x.d.deps.Node {
		t.Errorf("while x ran the chat's turn the key's claim is %+v (%v), want x's (%s)", own, err, x.d.deps.Node)
	}
	releaseOnce()
	for _, id := range []string{"slow", "next"} {
		waitReply(t, rs, id)
	}
	ran := w.result()
	for _, id := range []string{"slow", "next"} {
		if got := ran[id]; len(got) != 1 {
			t.Errorf("%s ran on %v, want once", id, got)
		}
		if n := repliesTo(rs, id); n != 1 {
			t.Errorf("%s answered %d times, want once", id, n)
		}
	}
	out, err := x.d.store.OutboxAfter(t.Context(), key, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, e := range out {
		order = append(order, e.InReplyTo...)
	}
	if got := strings.Join(order, " "); got != "slow next" {
		t.Errorf("the chat's replies answer %s, in that order; want slow next", got)
	}
}
