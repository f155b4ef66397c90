package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/agentgate/agentgate/persistence"
)

// testResetDueMark: MarkResetDue records on an open session the automatic reset that fell due
// while it worked, and Session and LoadSession read it back with the rest of the row. The first
// mark is the one that counts; an ended or unknown session takes none; EndSession clears it, so
// a session reopened (/resume) has none; a mark needs a reason, and its time may be zero.
func testResetDueMark(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	open := start(t, s, "s1", "k1", 1)
	marked := func(reason string, due time.Time) persistence.Session {
		ss := open
		ss.ResetDueReason, ss.ResetDueAt = reason, due
		return ss
	}
	ended := open
	ended.EndedAt, ended.EndReason = at(8), persistence.EndDaily
	steps := []struct {
		name string
		op   persistence.Op
		want persistence.Session
	}{
		{"an open session takes the mark", &persistence.MarkResetDue{SessionID: "s1", Reason: persistence.EndDaily, At: at(4)}, marked(persistence.EndDaily, at(4))},
		{"re-applying it is a no-op", &persistence.MarkResetDue{SessionID: "s1", Reason: persistence.EndDaily, At: at(4)}, marked(persistence.EndDaily, at(4))},
		{"a later mark leaves the first", &persistence.MarkResetDue{SessionID: "s1", Reason: persistence.EndIdle, At: at(6)}, marked(persistence.EndDaily, at(4))},
		{"activity leaves it", &persistence.TouchSession{SessionID: "s1", At: at(7)}, func() persistence.Session {
			ss := marked(persistence.EndDaily, at(4))
			ss.LastActivityAt = at(7)
			return ss
		}()},
		{"ending the session clears it", &persistence.EndSession{SessionID: "s1", Reason: persistence.EndDaily, At: at(8)}, func() persistence.Session {
			ss := ended
			ss.LastActivityAt = at(7)
			return ss
		}()},
		{"an ended session takes none", &persistence.MarkResetDue{SessionID: "s1", Reason: persistence.EndIdle, At: at(9)}, func() persistence.Session {
			ss := ended
			ss.LastActivityAt = at(7)
			return ss
		}()},
		{"reopened, it has none", &persistence.ReopenSession{SessionID: "s1"}, func() persistence.Session {
			ss := open
			ss.LastActivityAt = at(7)
			return ss
		}()},
		{"an unknown session is a no-op", &persistence.MarkResetDue{SessionID: "nope", Reason: persistence.EndIdle, At: at(9)}, func() persistence.Session {
			ss := open
			ss.LastActivityAt = at(7)
			return ss
		}()},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			MustCommit(t, s, st.op)
			got := check(s.Session(ctx, "s1")).must(t, "Session")
			diff(t, "Session(s1)", got, &st.want)
		})
	}

	t.Run("LoadSession reads it", func(t *testing.T) {
		start(t, s, "s2", "k2", 1)
		MustCommit(t, s, &persistence.MarkResetDue{SessionID: "s2", Reason: persistence.EndIdle, At: at(3)})
		snap := check(s.LoadSession(ctx, "k2", 10, 0)).must(t, "LoadSession")
		if snap.Session == nil || snap.Session.ResetDueReason != persistence.EndIdle || !snap.Session.ResetDueAt.Equal(at(3)) {
			t.Errorf("LoadSession(k2).Session = %+v, want the idle reset due at %v", snap.Session, at(3))
		}
	})
	t.Run("a zero due time", func(t *testing.T) {
		start(t, s, "s3", "k3", 1)
		MustCommit(t, s, &persistence.MarkResetDue{SessionID: "s3", Reason: persistence.EndIdle})
		got := check(s.Session(ctx, "s3")).must(t, "Session")
		if got.ResetDueReason != persistence.EndIdle || !got.ResetDueAt.IsZero() {
			t.Errorf("Session(s3) reset due %q at %v, want %q at the zero time", got.ResetDueReason, got.ResetDueAt, persistence.EndIdle)
		}
	})
	t.Run("a reason is required", func(t *testing.T) {
		errs := s.Commit(ctx, [][]persistence.Op{{&persistence.MarkResetDue{SessionID: "s2", At: at(5)}}})
		if errs[0] == nil {
			t.Error("Commit(MarkResetDue with no reason) = nil error, want an error")
		}
		got := check(s.Session(ctx, "s2")).must(t, "Session")
		if got.ResetDueReason != persistence.EndIdle || !got.ResetDueAt.Equal(at(3)) {
			t.Errorf("Session(s2) reset due %q at %v after a refused mark, want %q at %v", got.ResetDueReason, got.ResetDueAt, persistence.EndIdle, at(3))
		}
	})
	t.Run("a created session keeps it", func(t *testing.T) {
		ss := newSession("s4", "k4")
		ss.ResetDueReason, ss.ResetDueAt = persistence.EndDaily, at(2)
		MustCommit(t, s, &persistence.CreateSession{Session: ss})
		got := check(s.Session(ctx, "s4")).must(t, "Session")
		diff(t, "Session(s4)", got, &ss)
	})
}
