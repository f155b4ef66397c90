//go:build !race

// A multi-member cluster test: without -race, as cluster_test.go says why.

package supervisor

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestClusterMembersStartedTogetherRunEachPendingMessageOnce: the whole cluster stopped with
// messages of several chats pending, and its members (two, or three) start again at one moment,
// as a service manager starts them after an outage longer than member_ttl. Their registrations
// run at once (the test holds their commits and lets them go together), so no registration's
// list of live members holds another. Each pending message's agent runs once. With three, the
// members' second reads (storeMembership.registeredMeanwhile) may list one, two and three
// members: each pair must still have one member that knows of the other.
//
// Before, each member's first topology held itself alone ("cluster membership changed
// members=1"): each recovered every pending chat, claimed it without asking the other (it knew
// of no other member), and ran its agent; the later claim fenced the earlier run's result
// ("turn result refused"), so replies were stored and sent once, but every agent ran twice
// (found by a cluster-mode walkthrough). It fails so in most runs: in some, one member's claims
// came before the other's lookups of each key's holder (actors.Release), which then asked it.
func TestClusterMembersStartedTogetherRunEachPendingMessageOnce(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprint(n, " members"), func(t *testing.T) { testMembersStartedTogether(t, n) })
	}
}

func testMembersStartedTogether(t *testing.T, n int) {
	dsn := pgtest.NewDatabase(t)
	// A member_ttl of 4 s: a registration, which waits on the test's lock below, fails after one.
	ttl := func(c *config.Config) { c.Cluster.MemberTTL = 4 * time.Second }

	// The cluster's last member stops while a turn of every chat runs: its drain cancels them,
	// and their messages stay pending in the store.
	const chats = 32
	started := make(chan string, chats)
	blocking := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		started <- req.Messages[0].Text
		<-ctx.Done()
		return nil, ctx.Err()
	})
	last := startClusterMember(t, dsn, blocking, 50*time.Millisecond, ttl)
	for i := range chats {
		last.inject(t, chat(i), fmt.Sprint("pending-", i), fmt.Sprint("pending-", i))
	}
	for range chats {
		<-started
	}
	last.stop(t)

	admin, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	// Each registration's transaction waits, as it commits, for an advisory lock the test holds
	// (a deferred trigger on a new member's row), so all have read the live members before
	// any commits.
	if _, err := admin.Exec(t.Context(), `
		CREATE FUNCTION hold_registration() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_advisory_xact_lock_shared(4242); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER hold_registration AFTER INSERT ON members
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION hold_registration()`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(t.Context(), `SELECT pg_advisory_lock(4242)`); err != nil {
		t.Fatal(err)
	}

	rec := newTurnRecorder(nil, 0)
	logs := make([]testutil.Buffer, n)
	members := make(chan *runtime, n)
	for i := range n {
		go func() {
			var r *runtime
			defer func() { members <- r }() // nil when the start failed (it said why)
			r = MustStartDaemon(t, rec.agent(), daemonOpts{logs: &logs[i], tweak: func(c *config.Config) {
				clusterOn(dsn)(c)
				ttl(c)
			}})
		}()
	}
	// Every registration waits on the lock to commit; then they commit together.
	waitUntil(t, func() bool {
		var waiting int
		err := admin.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event = 'advisory'`).Scan(&waiting)
		return err == nil && waiting == n
	})
	if _, err := admin.Exec(t.Context(), `SELECT pg_advisory_unlock(4242)`); err != nil {
		t.Fatal(err)
	}
	var rs []*runtime
	for range n {
		if r := <-members; r != nil {
			rs = append(rs, r)
		}
	}
	if len(rs) < n {
		stopAll(t, rs)
		t.FailNow()
	}
	stopped := false
	defer func() {
		if !stopped {
			stopAll(t, rs)
		}
	}()

	for i := range chats {
		waitReply(t, rs, fmt.Sprint("pending-", i))
	}
	// Stopped, the members have ended every run they began.
	stopAll(t, rs)
	stopped = true
	defer func() {
		if t.Failed() {
			for i := range logs {
				t.Logf("member %d:\n%s", i, logs[i].String())
			}
		}
	}()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for i := range chats {
		id := fmt.Sprint("pending-", i)
		if n := rec.calls[id]; n != 1 {
			t.Errorf("the agent ran %s %d times, want once", id, n)
		}
		if n := repliesTo(rs, id); n != 1 {
			t.Errorf("%s answered %d times, want once", id, n)
		}
	}
}
