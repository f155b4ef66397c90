//go:build !race

// A multi-member cluster test: without -race, as cluster_test.go says why.

package supervisor

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/platforms"
)

// TestClusterMembersLeavingAtOnce: two members of three (or four) stop at the same time, as a
// SIGTERM to both would stop them, while each runs turns of chats it owns with messages queued
// behind them, and holds idle sessions. Each leaving member may for a moment take the other for
// a successor (it learns that the other leaves at its next renewal), so what it hands on may be
// forwarded twice. Still: every acknowledged message runs once and is answered once (a graceful
// stop runs no turn twice), each chat's replies answer its messages in order, nothing is left
// pending or unconfirmed, and both drains end before their deadline (no turn is cut short).
func TestClusterMembersLeavingAtOnce(t *testing.T) {
	for _, n := range []int{3, 4} {
		t.Run(fmt.Sprint(n, "members"), func(t *testing.T) { membersLeavingAtOnce(t, n) })
	}
}

func membersLeavingAtOnce(t *testing.T, n int) {
	release, holdout := make(chan struct{}), make(chan struct{})
	releaseOnce, holdoutOnce := sync.OnceFunc(func() { close(release) }), sync.OnceFunc(func() { close(holdout) })
	defer releaseOnce() // a failed test must not hold the leaving members' drains
	defer holdoutOnce()
	w := newWhereRan(16, func(text string) <-chan struct{} {
		switch {
		case strings.HasPrefix(text, "holdout"):
			return holdout
		case strings.HasPrefix(text, "slow"):
			return release
		}
		return nil
	})
	// Drains long enough never to end before the test lets the turns finish: one that passed its
	// deadline cancels turns (their messages then run again elsewhere), which the test rules out.
	const drain = 2 * time.Minute
	dsn := pgtest.NewDatabase(t)
	var rs, leaving []*runtime
	var logs []*logSignal
	var told []chan struct{} // closed once the leaving member's manager is told (actors.Leave)
	for i := range n {
		name := fmt.Sprint("m", i)
		if i < n-2 {
			rs = append(rs, startClusterMember(t, dsn, w.agent(name), drain))
			continue
		}
		log := &logSignal{want: "its sessions hand their keys on", ready: make(chan struct{})}
		told = append(told, log.ready) // the log sink forgets it once closed
		r := MustStartDaemon(t, w.agent(name), daemonOpts{drain: drain, logs: log, tweak: clusterOn(dsn)})
		rs, leaving, logs = append(rs, r), append(leaving, r), append(logs, log)
	}
	front := rs[0]
	defer stopAll(t, rs[:n-2])
	defer func() {
		if t.Failed() {
			for i, l := range logs {
				t.Logf("log of leaving member %d:\n%s", i, l.String())
			}
		}
	}()
	waitUntil(t, func() bool {
		for _, r := range rs {
			if len(r.d.cluster.MemberList.Members().Members()) != n {
				return false
			}
		}
		return true
	})

	// Per leaving member: a chat whose turn holds its drain open, two chats with a turn running
	// and two messages queued behind it, and a chat whose session is in memory, idle.
	owner := ownerOf(front.d.cluster.MemberList.Members().Members())
	type chats struct{ holdout, idle int }
	var busy []int
	mine := make([]chats, len(leaving))
	for j, l := range leaving {
		var owned []int
		for i := 0; len(owned) < 4; i++ {
			if owner(front.d.intake.Key(chat(i))) == l.d.system.Address() && !slices.Contains(busy, i) {
				owned = append(owned, i)
			}
		}
		mine[j] = chats{holdout: owned[0], idle: owned[1]}
		busy = append(busy, owned[2:]...)
	}
	sent := map[int][]string{} // chat → the ids of its messages, in the order sent
	send := func(i int, id string) *platforms.Ack {
		sent[i] = append(sent[i], id)
		return front.inject(t, chat(i), id, id)
	}
	for _, c := range mine {
		send(c.idle, fmt.Sprint("idle-", c.idle, "-0"))
		waitReply(t, rs, fmt.Sprint("idle-", c.idle, "-0"))
	}
	for _, c := range mine {
		send(c.holdout, fmt.Sprint("holdout-", c.holdout))
	}
	for _, i := range busy {
		send(i, fmt.Sprint("slow-", i))
	}
	for range len(mine) + len(busy) {
		<-w.started
	}
	for _, i := range busy {
		for j := range 2 {
			if ack := send(i, fmt.Sprintf("queued-%d-%d", i, j)); ack != nil && ack.Disposition != platforms.Queued {
				t.Errorf("queued-%d-%d: disposition %q, want %q", i, j, ack.Disposition, platforms.Queued)
			}
		}
	}

	var stopped sync.WaitGroup
	for _, l := range leaving {
		stopped.Go(func() { l.stop(t) })
	}
	for i, ready := range told {
		select {
		case <-ready:
		case <-time.After(30 * time.Second):
			t.Fatalf("leaving member %d's manager was not told that it leaves", i)
		}
	}
	// An idle chat of a leaving member is taken over at once.
	for _, c := range mine {
		id := fmt.Sprint("idle-", c.idle, "-1")
		send(c.idle, id)
		waitReply(t, rs, id)
	}
	// The running turns end; what was queued behind them runs elsewhere, and so do the chats'
	// next messages, while the holdout turns still hold both drains open.
	releaseOnce()
	for _, i := range busy {
		for j := range 2 {
			waitReply(t, rs, fmt.Sprintf("queued-%d-%d", i, j))
		}
	}
	for _, i := range busy {
		id := fmt.Sprint("late-", i)
		send(i, id)
		waitReply(t, rs, id)
	}
	holdoutOnce()
	stopped.Wait()

	for i, l := range logs {
		if s := l.String(); strings.Contains(s, "drain deadline passed") {
			t.Errorf("leaving member %d passed its drain deadline (turns were cancelled)", i)
		}
	}
	ran := w.result()
	ctx := t.Context()
	for i, ids := range sent {
		for _, id := range ids {
			if got := ran[id]; len(got) != 1 {
				t.Errorf("%s ran on %v, want once", id, got)
			}
			if got := repliesTo(rs, id); got != 1 {
				t.Errorf("%s answered %d times, want once", id, got)
			}
		}
		key := front.d.intake.Key(chat(i))
		out, err := front.d.store.OutboxAfter(ctx, key, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		var order []string
		for _, e := range out {
			order = append(order, e.InReplyTo...)
		}
		if fmt.Sprint(order) != fmt.Sprint(ids) {
			t.Errorf("chat %d's replies answer %v, in that order; want %v", i, order, ids)
		}
	}
	// The members that stay confirm the last deliveries (their marks are written in groups).
	waitUntil(t, func() bool {
		for i := range sent {
			snap, err := front.d.store.LoadSession(ctx, front.d.intake.Key(chat(i)), 0, 0)
			if err != nil || len(snap.Pending) > 0 || len(snap.Unconfirmed) > 0 {
				return false
			}
		}
		return true
	})
}
