package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestSessionsShowSaysWhichSessionIsCurrent: show labels the session it shows as the key's
// current one, says of one that has ended that the key's next message starts a new one, and
// shows the key's claim (its owner row: the cluster member whose activation runs the key or
// ran it last, with the claim's epoch and time), as text and in --json; a key no member ever
// claimed (a single daemon's) has none, said as such. Before, show printed "session: ID" and
// the route, and nothing of the owner row, so an operator could not tell the session the key
// runs in, nor which member holds it (a CLI review).
func TestSessionsShowSaysWhichSessionIsCurrent(t *testing.T) {
	dir := MustSeedSessions(t)

	out, _ := MustRunSessions(t, "show", keyA, "--data-dir", dir)
	for _, f := range []struct{ label, want string }{
		{"current session", "sa2"},
		{"claim", "none (only a cluster's members claim a key)"},
		{"ended", "open"},
	} {
		if got := fieldOf(out, f.label); got != f.want {
			t.Errorf("show %s: %s = %q, want %q\n%s", keyA, f.label, got, f.want, out)
		}
	}
	js, _ := MustRunSessions(t, "show", "--json", keyA, "--data-dir", dir)
	if strings.Contains(js, `"claim"`) {
		t.Errorf("show --json of a key never claimed has a claim:\n%s", js)
	}

	// A cluster member claims keyA; the reset, with no daemon, ends its session.
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	for _, owner := range []string{"node-a", "node-b"} {
		if _, err := st.Claim(context.Background(), keyA, owner, sessAt(50), nil); err != nil {
			t.Fatal(err)
		}
	}
	storetest.MustCommit(t, st, &persistence.EndSession{SessionID: "sa2", Reason: persistence.EndResetCommand, At: sessAt(55)})
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	out, _ = MustRunSessions(t, "show", keyA, "--data-dir", dir)
	for _, f := range []struct{ label, want string }{
		{"current session", "sa2"},
		{"claim", "node-b, epoch 2, claimed 2025-03-01T12:50:00Z"},
		{"ended", "2025-03-01T12:55:00Z (reset_command): the key's next message starts a new session"},
	} {
		if got := fieldOf(out, f.label); got != f.want {
			t.Errorf("show %s: %s = %q, want %q\n%s", keyA, f.label, got, f.want, out)
		}
	}
	js, _ = MustRunSessions(t, "show", "--json", keyA, "--data-dir", dir)
	var got struct {
		Route struct {
			SessionID string `json:"session_id"`
		} `json:"route"`
		Claim *struct {
			Owner     string    `json:"owner"`
			Epoch     int64     `json:"epoch"`
			ClaimedAt time.Time `json:"claimed_at"`
		} `json:"claim"`
	}
	if err := json.Unmarshal([]byte(js), &got); err != nil {
		t.Fatalf("show --json: %v\n%s", err, js)
	}
	if got.Route.SessionID != "sa2" || got.Claim == nil || got.Claim.Owner != "node-b" || got.Claim.Epoch != 2 || !got.Claim.ClaimedAt.Equal(sessAt(50)) {
		t.Errorf("show --json: route.session_id %q, claim %+v; want sa2, and node-b's claim of epoch 2 at %v\n%s", got.Route.SessionID, got.Claim, sessAt(50), js)
	}
}
