//go:build !race

package supervisor

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
)

// TestClusterLogsTellMembersApart: a member's "joined the cluster" names its node (host and
// run id), its cluster address and its HTTP address, and its "cluster membership changed"
// names the cluster addresses of the members that joined and left. Before, the first named
// only the cluster address and the second counted members, so two members' logs could not be
// told apart or matched to each other. (Run without -race, as the other cluster tests are.)
func TestClusterLogsTellMembersApart(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	logs := &signalledLog{wrote: make(chan struct{}, 1)}
	a := MustStartDaemon(t, okAgent, daemonOpts{logs: logs, tweak: clusterOn(dsn)})
	defer a.stop(t)
	joined := fmt.Sprintf(`msg="joined the cluster" cluster=agentgate node=%s address=%s http=%s`,
		a.d.deps.Node, a.d.system.Address(), a.d.addr)
	if !strings.Contains(logs.String(), joined) || !strings.Contains(a.d.deps.Node, "/r_") {
		t.Errorf("no line %s (a node with its run id) in:\n%s", joined, logs.String())
	}

	b := startClusterMember(t, dsn, okAgent, 0)
	changed := func(joined, left string) string {
		return fmt.Sprintf(`msg="cluster membership changed" members=%d joined=%s left=%s`,
			map[bool]int{true: 2, false: 1}[left == "[]"], joined, left)
	}
	awaitLine := func(line string) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for !strings.Contains(logs.String(), line) {
			select {
			case <-logs.wrote:
			case <-deadline:
				t.Fatalf("no line %s in:\n%s", line, logs.String())
			}
		}
	}
	awaitLine(changed("["+b.d.system.Address()+"]", "[]"))
	b.stop(t)
	awaitLine(changed("[]", "["+b.d.system.Address()+"]"))
}

// signalledLog is a log sink that signals each write on wrote (capacity 1: a write while the
// signal waits adds none), so a test waits for a line without polling.
type signalledLog struct {
	testutil.Buffer
	wrote chan struct{}
}

func (l *signalledLog) Write(p []byte) (int, error) {
	n, err := l.Buffer.Write(p)
	select {
	case l.wrote <- struct{}{}:
	default:
	}
	return n, err
}
