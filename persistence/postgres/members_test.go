package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestMembers: members renew their registration with Heartbeat and each gets the live list; a
// member that stops is listed as leaving until it leaves, and is gone at once then; one whose
// heartbeat is older than the ttl (by the database's clock) is not listed, and clusters do not
// see each other's members.
func TestMembers(t *testing.T) {
	s, dsn := MustOpen(t)
	ctx := context.Background()
	const ttl = 5 * time.Second
	a := Member{ID: "a", Host: "10.0.0.1", Port: 6340, Kinds: []string{"session"}}
	b := Member{ID: "b", Host: "10.0.0.2", Port: 6340, Kinds: []string{"session"}}
	ids := func(ms []Member) string {
		var out []string
		for _, m := range ms {
			out = append(out, fmt.Sprintf("%s@%s:%d%v", m.ID, m.Host, m.Port, m.Kinds))
		}
		return fmt.Sprint(out)
	}
	beat := func(cluster string, m Member) string {
		t.Helper()
		live, err := s.Heartbeat(ctx, cluster, m, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return ids(live)
	}
	if got := beat("c1", a); got != "[a@10.0.0.1:6340[session]]" {
		t.Errorf("first member sees %s", got)
	}
	if got, want := beat("c1", b), "[a@10.0.0.1:6340[session] b@10.0.0.2:6340[session]]"; got != want {
		t.Errorf("second member sees %s, want %s", got, want)
	}
	if got := beat("c2", Member{ID: "x", Host: "h", Port: 1}); got != "[x@h:1[]]" {
		t.Errorf("another cluster's member sees %s", got)
	}

	// b stops renewing: once its heartbeat is older than the ttl, a no longer lists it.
	conn := mustConn(t, dsn)
	if _, err := conn.Exec(ctx, `UPDATE members SET heartbeat_at = heartbeat_at - interval '6 seconds' WHERE id = 'b'`); err != nil {
		t.Fatal(err)
	}
	if got := beat("c1", a); got != "[a@10.0.0.1:6340[session]]" {
		t.Errorf("after b's heartbeat expired, a sees %s", got)
	}
	// A renewal brings it back (protoactor itself never readmits an id it saw leave).
	if got, want := beat("c1", b), "[a@10.0.0.1:6340[session] b@10.0.0.2:6340[session]]"; got != want {
		t.Errorf("b renewed: it sees %s, want %s", got, want)
	}
	// b stops: it renews as leaving, and is listed (as leaving) until it removes its row.
	b.Leaving = true
	beat("c1", b)
	live, err := s.Heartbeat(ctx, "c1", a, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 2 || live[0].Leaving || !live[1].Leaving {
		t.Errorf("b leaving: a sees %+v, want a and b, b leaving", live)
	}
	if err := s.Leave(ctx, "c1", "b"); err != nil {
		t.Fatal(err)
	}
	if got := beat("c1", a); got != "[a@10.0.0.1:6340[session]]" {
		t.Errorf("after b left, a sees %s", got)
	}
}
