//go:build !race

// A multi-member cluster test: protoactor's cluster code is not race-clean, so it runs
// without -race (see cluster_test.go).

package supervisor

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/agentgate/agentgate/actors"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestClusterHolderPromisesItsClaimThroughTheStore: member b ran a chat's session (its claim is
// the key's latest) and the session passivated. Member a asks for the key through the database,
// as an activation of a's that waits for b, which it cannot reach, does (Placement.ExchangeAsks):
// b's manager finds the ask at its next exchange, holds nothing of the key, and promises its
// claim to a, and the store names a as the key's holder (Placement.Holders). The chat's next
// message, which b owns, is then answered once, by b: b's activation defers to a, asks a
// through the database in turn, and a, holding nothing of the key, promises the claim back.
// Before, nothing in the database could hand a claim over: it named b for as long as b's
// registration lived, and a member that could not reach b waited that long.
func TestClusterHolderPromisesItsClaimThroughTheStore(t *testing.T) {
	rs := startClusterMembers(t, 2, okAgent, 0, func(c *config.Config) { c.Sessions.PassivateAfter = 200 * time.Millisecond })
	defer stopAll(t, rs)
	a, b := rs[0], rs[1]
	ctx := context.Background()

	var key string
	var src identity.Source
	for i := 0; key == ""; i++ {
		ack := a.inject(t, chat(i), fmt.Sprint("probe", i), "probe")
		if ack == nil {
			t.FailNow()
		}
		if a.d.managerOf(ack.SessionKey) != a.d.manager {
			key, src = ack.SessionKey, chat(i)
		}
	}
	waitUntil(t, func() bool { return len(b.fake.Sent()) > 0 })
	if own, err := b.d.store.Ownership(ctx, key); err != nil || own.Owner != b.d.deps.Node {
		t.Fatalf("the key's claim after b ran it: %+v %v, want b's (%s)", own, err, b.d.deps.Node)
	}
	waitUntil(t, func() bool { return testutil.ToFloat64(b.d.metrics.SessionsActive) == 0 }) // b's session passivates

	pa := a.d.deps.Placement
	asks, ok := pa.(actors.Asks)
	if !ok {
		t.Fatalf("a's placement %T carries no asks", pa)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		// a renews its ask as a waiting activation does (its manager's own exchange replaces
		// it with none every few seconds: it waits for nothing).
		if _, err := asks.ExchangeAsks(ctx, []string{key}, 15*time.Second); err != nil {
			t.Fatal(err)
		}
		hs, err := pa.Holders(ctx, []string{key})
		if err != nil {
			t.Fatal(err)
		}
		if h := hs[key].Manager; h != nil && h.Equal(pa.Self()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b did not promise its claim to a within 30s: the store names %v as the key's holder", hs[key].Manager)
		}
		time.Sleep(100 * time.Millisecond) // a poll interval under a deadline
	}
	if own, err := b.d.store.Ownership(ctx, key); err != nil || own.Owner != a.d.deps.Node {
		t.Errorf("the key's claim after b's promise: %+v %v, want a's node (%s)", own, err, a.d.deps.Node)
	}
	if _, err := asks.ExchangeAsks(ctx, nil, 15*time.Second); err != nil { // a asks nothing more
		t.Fatal(err)
	}

	sent := len(b.fake.Sent())
	if ack := b.inject(t, src, "after", "after"); ack == nil {
		t.FailNow()
	}
	waitUntil(t, func() bool { return len(b.fake.Sent()) > sent })
	time.Sleep(time.Second) // long enough for a second answer
	answers := 0
	for _, r := range []*runtime{a, b} {
		for _, o := range r.fake.Sent() {
			if len(o.InReplyTo) > 0 && o.InReplyTo[0] == "after" {
				answers++
			}
		}
	}
	if answers != 1 {
		t.Errorf("the message after the promise was answered %d times, want once", answers)
	}
	if own, err := b.d.store.Ownership(ctx, key); err != nil || own.Owner != b.d.deps.Node {
		t.Errorf("the key's claim once b ran the chat again: %+v %v, want b's", own, err)
	}
}
