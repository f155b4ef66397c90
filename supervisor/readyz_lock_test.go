package supervisor

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
)

// TestReadyzNamesADatabaseLockedByAnotherProcess: while another process holds the database's
// write lock (BEGIN EXCLUSIVE from a connection of its own), /readyz answers 503 promptly, well
// within a load balancer's probe timeout, and its store says the database is locked by another
// process. Before, the store's ping waited out SQLite's busy timeout (5 s) and /readyz said
// "ping: context deadline exceeded" after 5 s. The request's deadline here (2 s) is shorter.
func TestReadyzNamesADatabaseLockedByAnotherProcess(t *testing.T) {
	r := startOn(t, t.TempDir(), 5*time.Second, echo.New())
	defer r.stop(t)
	readyz := func(within time.Duration) (int, string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), within)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.d.Addr().String()+"/readyz", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	if code, body, err := readyz(5 * time.Second); err != nil || code != http.StatusOK {
		t.Fatalf("/readyz = %d %s (%v) before the lock, want 200", code, body, err)
	}

	unlock := r.lockDatabase(t)
	code, body, err := readyz(2 * time.Second)
	if err != nil {
		t.Fatalf("/readyz with the database locked by another process: %v, want an answer within 2s", err)
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "locked by another process (SQLITE_BUSY)") {
		t.Errorf("/readyz with the database locked by another process = %d %s, want 503 naming the lock", code, body)
	}

	unlock()
	waitUntil(t, func() bool { code, _, err := readyz(5 * time.Second); return err == nil && code == http.StatusOK })
}
