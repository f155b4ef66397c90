//go:build !race

package supervisor

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestReadyzReportsFailingRenewals: while a member's renewals fail (the database cut off), its
// /readyz fails and its cluster component says so, and when it stops for them, before the
// member stops. Before, /readyz said "cluster":"ok" until the member stopped. (Run without
// -race, as the other cluster tests are.)
func TestReadyzReportsFailingRenewals(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	r := startClusterMember(t, dsn, okAgent, time.Second, func(c *config.Config) { c.Cluster.MemberTTL = 6 * time.Second })
	readyz := func() (int, map[string]string) { t.Helper(); return r.readyz(t) }
	if code, body := readyz(); code != http.StatusOK || body["cluster"] != "ok" {
		t.Fatalf("/readyz before the outage: %d %v, want 200 with the cluster ok", code, body)
	}

	restore := pgtest.Cut(t, dsn)
	var code int
	var body map[string]string
	for deadline := time.Now().Add(6 * time.Second); time.Now().Before(deadline); {
		if code, body = readyz(); strings.Contains(body["cluster"], "renewals failing") {
			break
		}
		select {
		case err := <-r.d.Fatal():
			t.Fatalf("the member stopped (%v) while /readyz said %d %v", err, code, body)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(body["cluster"], "renewals failing for") ||
		!strings.Contains(body["cluster"], "this member stops at member_ttl") {
		t.Errorf("/readyz while the renewals fail: %d %v, want 503 with the cluster's renewals failing", code, body)
	}
	select {
	case <-r.d.Fatal():
	case <-time.After(30 * time.Second):
		t.Fatal("a member cut off from the database for 30s still runs")
	}
	restore()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_ = r.d.Stop(ctx)
}

// TestReadyzReportsAHungRenewal: a renewal the database does not answer (a hung connection, not
// a refused one: the test holds a lock on the member's row) makes /readyz fail once it has been
// in flight for member_ttl/6, before it fails at its deadline of member_ttl/3, and /readyz is ok
// again once the renewal goes through. Before, /readyz said "cluster":"ok" until the renewal
// failed, member_ttl/3 before the member would stop. (Run without -race, as the other cluster
// tests are.)
func TestReadyzReportsAHungRenewal(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	r := startClusterMember(t, dsn, okAgent, time.Second, func(c *config.Config) { c.Cluster.MemberTTL = 6 * time.Second })
	defer r.stop(t)
	if code, body := r.readyz(t); code != http.StatusOK || body["cluster"] != "ok" {
		t.Fatalf("/readyz before the hang: %d %v, want 200 with the cluster ok", code, body)
	}
	admin, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	lock, err := admin.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(context.Background())
	if _, err := lock.Exec(t.Context(), `SELECT 1 FROM members WHERE id = $1 FOR UPDATE`, r.d.system.ID); err != nil {
		t.Fatal(err)
	}
	// The first answer that is not ok comes while the next renewal waits for the lock: from
	// 1 s after it began (member_ttl/6) until it fails, 1 s later.
	code, body := r.readyz(t)
	for deadline := time.Now().Add(10 * time.Second); body["cluster"] == "ok" && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond) // a poll interval under a deadline
		code, body = r.readyz(t)
	}
	if code != http.StatusServiceUnavailable || !strings.HasPrefix(body["cluster"], "renewal in flight for ") ||
		!strings.Contains(body["cluster"], "this member stops at member_ttl (6s after its last renewal), in ") {
		t.Errorf("/readyz while a renewal hangs: %d %v, want 503 with the renewal in flight", code, body)
	}
	if err := lock.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { _, body := r.readyz(t); return body["cluster"] == "ok" })
}
