package supervisor

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/persistence/postgres"
)

// stalledHeartbeat is a member registry whose first renewal takes stall, then succeeds.
type stalledHeartbeat struct {
	stall time.Duration
	calls int
}

func (s *stalledHeartbeat) Heartbeat(_ context.Context, _ string, m postgres.Member, _ time.Duration) ([]postgres.Member, error) {
	if s.calls++; s.calls == 1 {
		time.Sleep(s.stall) // a paused process, a stalled host or connection
	}
	return []postgres.Member{m}, nil
}

func (s *stalledHeartbeat) Leave(context.Context, string, string) error { return nil }

func (s *stalledHeartbeat) Holder(context.Context, string, string, time.Duration) (postgres.Member, bool, error) {
	return postgres.Member{}, false, nil
}

// TestRenewalAfterAStallLeaves: a member whose renewal comes more than member_ttl after the
// last one was counted as gone (and blocked) by the others, even though the renewal succeeds:
// it reports its membership lost rather than stay, where the younger members, finding an older
// live member they blocked, would leave as the losing side of a split.
func TestRenewalAfterAStallLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lost := make(chan error, 1)
		p := newStoreMembership(&stalledHeartbeat{stall: 3 * time.Second}, "agentgate", "node", "127.0.0.1:8080", 2*time.Second,
			slog.New(slog.DiscardHandler), func(err error) { lost <- err })
		go p.renew(nil) // the stalled renewal reports before it would use the cluster
		select {
		case err := <-lost:
			if !strings.Contains(err.Error(), "past member_ttl") {
				t.Errorf("lost: %v, want the stall named", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("a renewal 3 s after the last, with member_ttl 2 s, kept the membership")
		}
		<-p.done
	})
}

// TestHTTPForCluster: a member registers its HTTP API at the address other hosts reach it at,
// and none that would name another host's process.
func TestHTTPForCluster(t *testing.T) {
	for _, c := range []struct{ addr, host, want string }{
		{"0.0.0.0:8080", "10.0.0.5", "10.0.0.5:8080"},
		{"[::]:8080", "10.0.0.5", "10.0.0.5:8080"},
		{":8080", "node-a.internal", "node-a.internal:8080"},
		{"10.0.0.5:8080", "10.0.0.5", "10.0.0.5:8080"},
		{"127.0.0.1:8080", "127.0.0.1", "127.0.0.1:8080"}, // a cluster on one host
		{"127.0.0.1:8080", "10.0.0.5", ""},                // loopback names another host's process there
		{"localhost:8080", "10.0.0.5", ""},
	} {
		if got := httpForCluster(c.addr, c.host); got != c.want {
			t.Errorf("httpForCluster(%q, %q) = %q, want %q", c.addr, c.host, got, c.want)
		}
	}
}
