//go:build !race

package supervisor

import (
	"context"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestClusterDatabaseClockStepKeepsMembers: the database server's clock steps ahead by more
// than member_ttl (simulated by ageing every registration by as much at once), so that each
// registration looks expired until its member renews. No member drops another, and every one
// runs on. Before, the first member to renew after the step dropped the others, protoactor
// blocked them for ever, and all but the oldest member left as the younger side of a split.
func TestClusterDatabaseClockStepKeepsMembers(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	rs := startClusterOn(t, dsn, 3, okAgent, 0)
	defer stopAll(t, rs)
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	ttl := rs[0].d.cfg.Cluster.MemberTTL
	var stepped time.Time
	if err := conn.QueryRow(t.Context(), `UPDATE members SET heartbeat_at = heartbeat_at - make_interval(secs => $1)
		RETURNING clock_timestamp()`, (ttl + time.Second).Seconds()).Scan(&stepped); err != nil {
		t.Fatal(err)
	}
	// Every member has renewed member_ttl after the step (three renewals each since it), or one
	// has stopped.
	fatal := make([]error, len(rs))
	waitUntil(t, func() bool {
		for i, r := range rs {
			select {
			case fatal[i] = <-r.d.Fatal():
				return true
			default:
			}
		}
		var behind int
		if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM members WHERE heartbeat_at < $1`,
			stepped.Add(ttl)).Scan(&behind); err != nil {
			t.Fatal(err)
		}
		return behind == 0
	})
	for i, r := range rs {
		if fatal[i] != nil {
			t.Errorf("member %d stopped after the database's clock stepped: %v", i, fatal[i])
		}
		if blocked := r.d.cluster.GetBlockedMembers().ToSlice(); len(blocked) > 0 {
			t.Errorf("member %d blocked %v after the database's clock stepped", i, blocked)
		}
		if n := len(r.d.cluster.MemberList.Members().Members()); n != len(rs) {
			t.Errorf("member %d has %d members after the database's clock stepped, want %d", i, n, len(rs))
		}
	}
}
