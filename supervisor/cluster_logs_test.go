//go:build !race

package supervisor

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
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
	logs.await(t, changed("["+b.d.system.Address()+"]", "[]"))
	b.stop(t)
	logs.await(t, changed("[]", "["+b.d.system.Address()+"]"))
}

// TestClusterLogCountsTheKeysTakenOver: a member's "cluster membership changed" counts, in
// recovering, the chats with unfinished work that came to it with the change: none when
// another member joins (the newcomer takes a share of this member's keys), and those of the
// member that left when one leaves. Before, it counted every chat with unfinished work the
// member owned after the change: a member that joined seemed to hand this one chats, and one
// that left seemed to have held them all. (Run without -race, as the other cluster tests are.)
func TestClusterLogCountsTheKeysTakenOver(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	const chats = 16
	started := make(chan string, 2*chats)
	blocking := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		started <- req.Messages[0].Text
		<-ctx.Done()
		return nil, ctx.Err()
	})
	logs := &signalledLog{wrote: make(chan struct{}, 1)}
	a := MustStartDaemon(t, blocking, daemonOpts{drain: 50 * time.Millisecond, logs: logs, tweak: clusterOn(dsn)})
	defer a.stop(t)
	// Every chat has unfinished work until a stops: its message's turn runs on a.
	for i := range chats {
		a.inject(t, chat(i), fmt.Sprint("m", i), fmt.Sprint("m", i))
	}
	for range chats {
		<-started
	}

	b := startClusterMember(t, dsn, blocking, 50*time.Millisecond)
	changed := func(members int, joined, left string, recovering int) string {
		return fmt.Sprintf(`msg="cluster membership changed" members=%d joined=%s left=%s recovering=%d`,
			members, joined, left, recovering)
	}
	logs.await(t, changed(2, "["+b.d.system.Address()+"]", "[]", 0))
	owner := ownerOf(a.d.cluster.MemberList.Members().Members())
	ofB := 0
	for i := range chats {
		if owner(a.d.intake.Key(chat(i))) == b.d.system.Address() {
			ofB++
		}
	}
	if ofB == 0 || ofB == chats {
		t.Fatalf("b owns %d of the %d chats: the counts would not tell its keys from the others", ofB, chats)
	}
	b.stop(t)
	logs.await(t, changed(1, "[]", "["+b.d.system.Address()+"]", ofB))
}

// await waits until the log holds line, for at most 30 s.
func (l *signalledLog) await(t *testing.T, line string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for !strings.Contains(l.String(), line) {
		select {
		case <-l.wrote:
		case <-deadline:
			t.Fatalf("no line %s in:\n%s", line, l.String())
		}
	}
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
