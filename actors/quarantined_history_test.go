package actors

import (
	"path/filepath"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
)

// TestQuarantinedMessageStaysOutOfReloadedHistory: a message set aside as quarantined (it took
// the daemon down three times) never ran, and the live session never gives it to its agent; nor
// does one loaded again from the store. Before, a restart, an upgrade or a passivation put it
// in every later turn's history: the message that killed the process, fed to the agent again
// (found by an upgrade walkthrough on a real daemon).
func TestQuarantinedMessageStaysOutOfReloadedHistory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		now := time.Now()
		src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1", UserID: "u1"}
		key := identity.Key(src, identity.KeyOptions{})
		store, err := sqlite.Open(t.Context(), path, sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		row := func(seq int64, role, id, text, status, turn string) persistence.Op {
			return &persistence.AppendMessage{Message: persistence.Message{SessionID: "s1", Seq: seq, Role: role,
				Content: text, Platform: "fake", ChatID: "c1", MessageID: id, UserID: "u1", TurnID: turn,
				Status: status, Active: true, CreatedAt: now}}
		}
		if errs := store.Commit(t.Context(), [][]persistence.Op{{
			&persistence.CreateSession{Session: persistence.Session{ID: "s1", Key: key, Platform: "fake", ChatType: identity.ChatDM,
				ChatID: "c1", UserID: "u1", StartedAt: now, LastActivityAt: now}},
			&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: "s1", Generation: 1, UpdatedAt: now}},
			row(1, persistence.RoleUser, "q1", "Q1 poison", persistence.StatusQuarantined, ""),
			row(2, persistence.RoleUser, "q2", "Q2", persistence.StatusDone, "t2"),
			row(3, persistence.RoleAssistant, "", "A2", persistence.StatusDone, "t2"),
		}}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		if err := store.Close(); err != nil {
			t.Fatal(err)
		}

		a := newHistoryAgent("")
		w := newManagerWorldAt(t, path, a.agent, nil)
		w.deliver(t, "q3", "Q3")
		synctest.Wait()
		if got, want := a.history(), []string{"Q2", "A2"}; !slices.Equal(got, want) {
			t.Errorf("Q3's turn got the history %q, want %q (Q1 is quarantined)", got, want)
		}
	})
}
