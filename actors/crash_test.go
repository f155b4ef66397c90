package actors

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
)

// TestSessionStoppedForCrashingStartsAgain: an agent that panics on every message of a chat.
// The first message crashes the session three times and is quarantined; the second one's
// first crash is one too many for the session's restart budget, and its supervisor stops it.
// The manager starts it again crashPause later, from the store, so the second message is not
// left pending until the chat writes again: it is run, and quarantined in its turn. That start
// is no recovery after a restart of agentgate: with sessions.recovery: notice too, the second
// message is run, not answered "agentgate restarted".
func TestSessionStoppedForCrashingStartsAgain(t *testing.T) {
	for _, recovery := range []string{RecoveryRerun, RecoveryNotice} {
		t.Run(recovery, func(t *testing.T) { crashedOutSessionStartsAgain(t, recovery) })
	}
}

func crashedOutSessionStartsAgain(t *testing.T, recovery string) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		crashy := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			<-gate
			panic("agent bug on " + req.Identity.MessageID)
		})
		w := newManagerWorld(t, crashy, func(d *Deps) { d.Config.Recovery = recovery })
		var sid string
		for _, id := range []string{"m1", "m2"} {
			r := w.deliver(t, id, "boom")
			if r.ErrorCode != "" {
				t.Fatalf("deliver %s: %+v", id, r)
			}
			sid = r.SessionId
		}
		close(gate)
		time.Sleep(time.Minute) // crashPause and every restart fit in it
		synctest.Wait()

		msgs, err := w.store.Transcript(w.ctx, sid)
		if err != nil {
			t.Fatal(err)
		}
		status := map[string]string{}
		for _, m := range msgs {
			if m.Role == persistence.RoleUser {
				status[m.MessageID] = m.Status
			}
		}
		if status["m1"] != persistence.StatusQuarantined || status["m2"] != persistence.StatusQuarantined {
			t.Errorf("message statuses %v, want both quarantined", status)
		}
		// Each start sends again what is not confirmed (this platform confirms nothing).
		told := map[string]bool{}
		for len(w.sent) > 0 {
			if m := <-w.sent; strings.Contains(m.Out.Text, "quarantined") {
				told[strings.Join(m.Out.InReplyTo, ",")] = true
			}
		}
		if !told["m1"] || !told["m2"] || len(told) != 2 {
			t.Errorf("quarantine notices answer %v, want m1 and m2", told)
		}
	})
}

// blindRecovery is a store whose first Recoverable calls fail.
type blindRecovery struct {
	persistence.Store
	failures int
}

func (b *blindRecovery) Recoverable(ctx context.Context) ([]string, error) {
	if b.failures > 0 {
		b.failures--
		return nil, errors.New("recoverable: database is locked (test)")
	}
	return b.Store.Recoverable(ctx)
}

// TestRecoveryRetriesItsListing: when the store cannot list the sessions with unfinished work
// at start, the manager tries again until it can, and the message the last run left unanswered
// is run without waiting for the chat's next one.
func TestRecoveryRetriesItsListing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// What a run that died mid-turn leaves: a session with a pending message. It is
		// written before the manager starts, through a store of its own on the same file.
		dir := t.TempDir()
		path := filepath.Join(dir, "agentgate.db")
		now := time.Now()
		src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1", UserID: "u1"}
		key := identity.Key(src, identity.KeyOptions{})
		func() {
			store, err := sqlite.Open(t.Context(), path, sqlite.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			if errs := store.Commit(t.Context(), [][]persistence.Op{{
				&persistence.CreateSession{Session: persistence.Session{ID: "s1", Key: key, Platform: "fake", ChatType: identity.ChatDM,
					ChatID: "c1", UserID: "u1", StartedAt: now, LastActivityAt: now}},
				&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: "s1", Generation: 1, UpdatedAt: now}},
				&persistence.AppendMessage{Message: persistence.Message{SessionID: "s1", Seq: 1, Role: persistence.RoleUser,
					Content: "left over", Platform: "fake", ChatID: "c1", MessageID: "m1", UserID: "u1",
					Status: persistence.StatusPending, Active: true, CreatedAt: now}},
			}}); errs[0] != nil {
				t.Fatal(errs[0])
			}
		}()
		echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "echo: " + req.Messages[0].Text}, nil
		})
		w := newManagerWorldAt(t, path, echo, func(d *Deps) { d.Store = &blindRecovery{Store: d.Store, failures: 2} })
		time.Sleep(time.Minute)
		synctest.Wait()
		select {
		case got := <-w.sent:
			if got.Out.Text != "echo: left over" {
				t.Errorf("reply %q, want the left-over message answered", got.Out.Text)
			}
		default:
			t.Errorf("the left-over message was not run after the store could list it again")
		}
	})
}
