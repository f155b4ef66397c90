package supervisor

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
)

// TestReadyzNamesWritesRefusedBehindTheSpool: while writes wait in the spool, the database's
// ping fails (another process holds its write lock) and the spool can take no more (its disk
// is full now), /readyz says that writes are refused, and why. Before, it said only that the
// database refused writes and that "they wait in the spool until it takes them again", with the
// lock in parentheses, while every new message was refused: the refusals were looked at only
// when the ping passed (found by a disk-full soak of the binary).
func TestReadyzNamesWritesRefusedBehindTheSpool(t *testing.T) {
	o := &storetest.Outage{}
	r := startWithOutage(t, t.TempDir(), o, echo.New())
	defer r.stop(t)
	readyz := func() (int, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.d.Addr().String()+"/readyz", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c", UserID: "u"}
	r.inject(t, src, "m1", "one")
	r.waitSent(t, 1)

	o.Down.Store(true) // the database refuses writes: they wait in the spool
	r.inject(t, src, "m2", "two")
	unlock := r.lockDatabase(t)
	defer unlock()
	roomAgain := fillDisk(t, r, o) // and now the spool's disk is full
	if _, err := r.fake.Inject(t.Context(), &platforms.Inbound{Source: src, MessageID: "m3", Text: "three"}); !errors.Is(err, platforms.ErrUnavailable) {
		t.Fatalf("Inject(m3) with the database and the spool failing = %v, want platforms.ErrUnavailable", err)
	}
	code, body := readyz()
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "writes refused") ||
		!strings.Contains(body, "database and spool both failed") {
		t.Errorf("/readyz = %d %s, want 503 saying writes are refused, the database and the spool both failing", code, body)
	}

	roomAgain()
	unlock()
	o.Down.Store(false)
	waitUntil(t, func() bool { code, _ := readyz(); return code == http.StatusOK })
}
