//go:build !race

package supervisor

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
)

// TestReadyzReportsFailingRenewals: while a member's renewals fail (the database cut off), its
// /readyz fails and its cluster component says so, and when it stops for them, before the
// member stops. Before, /readyz said "cluster":"ok" until the member stopped. (Run without
// -race, as the other cluster tests are.)
func TestReadyzReportsFailingRenewals(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	r := startClusterMember(t, dsn, okAgent, time.Second, func(c *config.Config) { c.Cluster.MemberTTL = 6 * time.Second })
	readyz := func() (int, map[string]string) {
		t.Helper()
		resp, err := http.Get("http://" + r.d.Addr().String() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct{ Components map[string]string }
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatalf("/readyz body: %v", err)
		}
		return resp.StatusCode, body.Components
	}
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
