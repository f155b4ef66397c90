//go:build !race

package supervisor

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
)

// consecutiveAddrs returns n loopback addresses on free ports that differ only in their last
// digit (…1, …2, …).
func consecutiveAddrs(t *testing.T, n int) []string {
	t.Helper()
	for range 50 {
		base := freeAddr(t)
		_, port, _ := net.SplitHostPort(base)
		var p int
		fmt.Sscan(port, &p)
		p -= p % 10
		var held []net.Listener
		for i := 1; i <= n; i++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+i))
			if err != nil {
				break
			}
			held = append(held, l)
		}
		var addrs []string
		for _, l := range held {
			addrs = append(addrs, l.Addr().String())
			l.Close()
		}
		if len(addrs) == n {
			return addrs
		}
	}
	t.Fatalf("found no %d free consecutive ports", n)
	return nil
}

// TestClusterWarnsOfAddressesPlacedUnevenly: three members on one host whose cluster ports
// differ only in their last digit (as an operator's walkthrough set them up: 19611, 19612,
// 19613) are told at start that the cluster places about half of their sessions on one of
// them, with the addresses. Before, nothing said so: the walkthrough found one member running
// 149 of 300 chats. (Run without -race, as the other cluster tests are.)
func TestClusterWarnsOfAddressesPlacedUnevenly(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	binds := consecutiveAddrs(t, 3)
	at := func(bind string) func(*config.Config) {
		return func(c *config.Config) {
			clusterOn(dsn)(c)
			c.Cluster.Bind = bind
		}
	}
	logs := &signalledLog{wrote: make(chan struct{}, 1)}
	a := MustStartDaemon(t, okAgent, daemonOpts{logs: logs, tweak: at(binds[0])})
	defer a.stop(t)
	b := startClusterMember(t, dsn, okAgent, 0, at(binds[1]))
	defer b.stop(t)
	c := startClusterMember(t, dsn, okAgent, 0, at(binds[2]))
	defer c.stop(t)
	logs.await(t, fmt.Sprintf(`msg="cluster members' addresses differ only in their last character; the cluster places their sessions unevenly (of three, half on one): give each member its own host address" addresses="%v"`, binds))
	if n := strings.Count(logs.String(), "addresses differ only in their last character"); n != 1 {
		t.Errorf("the line came %d times, want once", n)
	}
}
