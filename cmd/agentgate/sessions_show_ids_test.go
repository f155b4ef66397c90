package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestSessionsShowQuotesTheKeysIDs: show prints the ids a key is made of (chat, thread, user,
// scope) as it prints the key, Go-quoted when one holds a character that does not display,
// so that the chat id can be told from the key's part it is. Before, the key line was quoted
// and the chat id line showed U+FFFD.
func TestSessionsShowQuotesTheKeysIDs(t *testing.T) {
	const (
		chat = "ops\u200eroom"
		key  = "agent:main:http:group:" + chat + ":t\u202e1"
	)
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	storetest.MustCommit(t, st,
		&persistence.CreateSession{Session: persistence.Session{ID: "se1", Key: key, Platform: "http", ChatType: "group", ChatID: chat,
			ThreadID: "t\u202e1", UserID: "bob", ScopeID: "team 1", StartedAt: sessAt(0), LastActivityAt: sessAt(1), Epoch: 1}},
		&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: "se1", Generation: 1, UpdatedAt: sessAt(0)}},
	)
	st.Close()

	out, _ := MustRunSessions(t, "show", key, "--data-dir", dir)
	for _, tc := range []struct{ label, want string }{
		{"key", `'"agent:main:http:group:ops\u200eroom:t\u202e1"'`},
		{"chat id", `'"ops\u200eroom"'`},
		{"thread id", `'"t\u202e1"'`},
		{"user id", "bob"},
		{"scope id", `'"team 1"'`},
	} {
		if got := fieldOf(out, tc.label); got != tc.want {
			t.Errorf("sessions show: %s %q, want %q", tc.label, got, tc.want)
		}
	}
	if strings.ContainsRune(out, '\uFFFD') {
		t.Errorf("sessions show prints U+FFFD for an id:\n%s", out)
	}
}
