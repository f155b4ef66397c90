//go:build !race

// A multi-member cluster test: without -race, as cluster_test.go says why.

package supervisor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/platforms"
	"github.com/jackc/pgx/v5"
)

// TestClusterRequestToAMemberRestartedOnItsPortIsSentAgain: a member dies while a message for
// one of its chats waits in another member's cluster router (the dead member had taken the
// request and not answered), and its process supervisor starts it again on the same port
// (systemd Restart=always on a fixed cluster.bind) before its registration expires. The new
// process's registration takes the old one out of the membership, and the waiting attempt is
// given up then, the message sent to the key's owner at once. Before, the address stayed in
// the membership, and the attempt waited out its 10 s (clusterAttemptTimeout), whatever
// member_ttl (2 s here; found by an audit).
func TestClusterRequestToAMemberRestartedOnItsPortIsSentAgain(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	admin, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	// b runs on a database role of its own, so that its death can cut it off the database
	// alone, as a kill -9 would.
	role := fmt.Sprint("restarted_member_", time.Now().UnixNano())
	if _, err := admin.Exec(t.Context(), `CREATE ROLE `+role+` LOGIN SUPERUSER`); err != nil {
		t.Fatal(err)
	}
	// Dropped after b's stop (cleanups run last first): a session whose role is dropped is no
	// superuser any more, and b's stop met "permission denied for table members".
	t.Cleanup(func() { admin.Exec(context.Background(), `DROP ROLE IF EXISTS `+role) })
	bDSN := strings.Replace(dsn, "user=postgres", "user="+role, 1)
	if bDSN == dsn {
		t.Fatalf("the dsn %q names no user postgres", dsn)
	}

	a := startClusterMember(t, dsn, okAgent, 0)
	defer a.stop(t)
	b := startClusterMember(t, bDSN, okAgent, 0)
	t.Cleanup(func() { // also after a failure: b's goroutines must not outlive the test
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = b.d.Stop(ctx) // a dead member's stop: its errors are the death's
	})
	waitUntil(t, func() bool {
		return len(a.d.cluster.MemberList.Members().Members()) == 2 && len(b.d.cluster.MemberList.Members().Members()) == 2
	})
	owner := ownerOf(a.d.cluster.MemberList.Members().Members())
	i := 0
	for owner(a.d.intake.Key(chat(i))) != b.d.system.Address() {
		i++
	}
	src := chat(i)
	key := a.d.intake.Key(src)
	a.inject(t, src, "m1", "one") // a's router now holds the session's grain on b
	waitReply(t, []*runtime{a, b}, "m1")

	// b takes m2 and dies before it answers: its write of m2 waits for a lock the test holds on
	// the key's owner row (each write passes the key's fence, which reads that row FOR SHARE),
	// and then b is cut off as a kill -9 cuts it (its cluster port closed and its remote
	// stopped, its renewals and its database connections ended).
	// On a connection of its own: on admin, the transaction took in the ALTER ROLE below,
	// which no login saw before the transaction's end and its rollback undid, so b's pool
	// dialled anew at once (its commit of m2 ran again and committed).
	locker, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	lock, err := locker.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(context.Background())
	if _, err := lock.Exec(t.Context(), `SELECT 1 FROM owners WHERE key = $1 FOR UPDATE`, key); err != nil {
		t.Fatal(err)
	}
	// The bound is a failure's, not a wait for an effect: below the attempt's 10 s.
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Second)
	defer cancel()
	sent := make(chan error, 1)
	go func() {
		_, err := a.fake.Inject(ctx, &platforms.Inbound{Source: src, MessageID: "m2", Text: "two"})
		sent <- err
	}()
	waitUntil(t, func() bool {
		var n int
		err := admin.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND wait_event_type = 'Lock'`, role).Scan(&n)
		return err == nil && n > 0
	})
	addr := b.d.system.Address()
	// Its remote stops whole: a dead process answers nothing (a closed server alone would
	// still let b's answer out through its own connection to a).
	b.d.endpoints.shutdown(b.d.cluster.Remote, b.d.log)
	b.d.membership.once.Do(func() { close(b.d.membership.stop) })
	b.fake.SetSendError(errors.New("the member is dead"))
	if _, err := admin.Exec(t.Context(), `ALTER ROLE `+role+` NOLOGIN`); err != nil {
		t.Fatal(err)
	}
	// Until none is left: a termination is asynchronous, and a backend that passed its login
	// check just before the NOLOGIN committed shows in pg_stat_activity only a moment later.
	waitUntil(t, func() bool {
		var n int
		err := admin.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = $1`, role).Scan(&n)
		return err == nil && n == 0
	})
	if err := lock.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}

	// b's process supervisor starts it again on its port, within member_ttl of its death.
	c := startClusterMember(t, dsn, okAgent, 0, func(cfg *config.Config) { cfg.Cluster.Bind = addr })
	defer c.stop(t)
	if err := <-sent; err != nil {
		t.Fatalf("m2, sent while the member of its session died and came back on its port: %v; want it taken by the key's owner", err)
	}
	waitReply(t, []*runtime{a, c}, "m2")
	if n := repliesTo([]*runtime{a, b, c}, "m2"); n != 1 {
		t.Errorf("m2 answered %d times, want once", n)
	}
}
