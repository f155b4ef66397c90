//go:build !race

// Like the other cluster tests, this one runs without -race (cluster_test.go).

package supervisor

import (
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"net/http"
	"strings"
	"testing"
	"time"

	httpplatform "github.com/agentgate/agentgate/platforms/http"
)

// TestClusterMemberThatLostItsMembershipSaysWhy: a member whose membership is lost (the others
// count it as gone) refuses new messages from then on, and says why: the other members take
// its chats, so its client sends again at once (Retry-After: 1). Before, it answered only
// "draining", as a daemon that stops for good does, and only once its owner stopped it.
func TestClusterMemberThatLostItsMembershipSaysWhy(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	r := startClusterOn(t, dsn, 1, okAgent, 0)[0]
	defer r.stop(t)
	restore := pgtest.Cut(t, dsn)
	defer restore()
	select {
	case err := <-r.d.Fatal():
		if !strings.Contains(err.Error(), "cluster membership lost") {
			t.Errorf("Fatal: %v, want the lost membership", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a member whose membership is lost did not report it (Fatal)")
	}
	status, retry, body := postMessage(t, r.d)
	if status != http.StatusServiceUnavailable || body.Error.Code != httpplatform.CodeDraining ||
		!strings.Contains(body.Error.Message, "lost its membership") || !strings.Contains(body.Error.Message, "other members take its chats") ||
		retry != "1" {
		t.Errorf("POST /v1/messages to a member that lost its membership = %d %+v Retry-After %q, want 503 %s naming the lost membership, with Retry-After 1",
			status, body.Error, retry, httpplatform.CodeDraining)
	}
}
