//go:build !race

// A multi-member cluster test: protoactor's cluster code is not race-clean, so it runs
// without -race (see cluster_test.go).

package supervisor

import (
	"fmt"
	"testing"
	"time"

	"github.com/agentgate/agentgate/actors"
	"github.com/agentgate/agentgate/internal/config"
)

// TestClusterRouterForgetsPassivatedGrains: a member routes a chat to the grain of its key on
// the other member and caches the grain's address. When the session there passivates and its
// grain stops, the cache entry goes too: a daemon that runs for months must not keep one per
// key it ever routed to another member (before, only a failed request or the other member
// leaving removed it). The chat's next message activates a new grain and is answered.
func TestClusterRouterForgetsPassivatedGrains(t *testing.T) {
	rs := startClusterMembers(t, 2, okAgent, 0, func(c *config.Config) { c.Sessions.PassivateAfter = 200 * time.Millisecond })
	defer stopAll(t, rs)
	a, b := rs[0], rs[1]

	// A chat whose key b owns, sent through a.
	var key string
	for i := 0; key == ""; i++ {
		ack := a.inject(t, chat(i), fmt.Sprint("probe", i), "probe")
		if ack == nil {
			t.FailNow()
		}
		if a.d.managerOf(ack.SessionKey) != a.d.manager {
			key = ack.SessionKey
			if pid, _ := a.d.cluster.PidCache.Get(key, actors.SessionKind); pid == nil {
				t.Fatalf("member a routed %s to b without caching its grain", key)
			}
			waitUntil(t, func() bool { return len(b.fake.Sent()) > 0 })
			src := chat(i)
			waitUntil(t, func() bool { // b's session passivates, and its grain stops
				pid, _ := a.d.cluster.PidCache.Get(key, actors.SessionKind)
				return pid == nil
			})
			a.inject(t, src, "again", "again")
			waitUntil(t, func() bool { return len(b.fake.Sent()) > 1 })
		}
	}
}
