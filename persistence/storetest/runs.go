package storetest

import (
	"context"
	"testing"

	"github.com/agentgate/agentgate/persistence"
)

// testUncleanStops: BeginRun counts a run that never reached EndRun against the head pending
// message of each routed session, once, in the same call; a clean stop counts nothing, and a
// stale EndRun (of a run before the current one) does not end the current one.
func testUncleanStops(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	start(t, s, "s1", "k1", 1) // two pending: only the head counts
	MustCommit(t, s, &persistence.AppendMessage{Message: userMsg("s1", 1, "a1", "poison")},
		&persistence.AppendMessage{Message: userMsg("s1", 2, "a2", "waits")})
	start(t, s, "s2", "k2", 1) // answered, then one archived, then the head
	done := userMsg("s2", 1, "b1", "answered")
	done.Status = persistence.StatusDone
	MustCommit(t, s, &persistence.AppendMessage{Message: done},
		&persistence.AppendMessage{Message: replyMsg("s2", 2, "ok")},
		&persistence.AppendMessage{Message: userMsg("s2", 3, "b3", "undone")},
		&persistence.ArchiveMessages{SessionID: "s2", Seqs: []int64{3}},
		&persistence.AppendMessage{Message: userMsg("s2", 4, "b4", "head")})
	// A session no key routes to any more runs nothing: it is not counted.
	MustCommit(t, s, &persistence.CreateSession{Session: newSession("s0", "k3")},
		&persistence.AppendMessage{Message: userMsg("s0", 1, "c1", "orphan")})
	attempts := func(t *testing.T) map[string]int {
		t.Helper()
		got := map[string]int{}
		for _, sid := range []string{"s0", "s1", "s2"} {
			for _, m := range check(s.Transcript(ctx, sid)).must(t, "Transcript") {
				if m.Role == persistence.RoleUser {
					got[m.MessageID] = m.Attempts
				}
			}
		}
		return got
	}
	zero := map[string]int{"a1": 0, "a2": 0, "b1": 0, "b3": 0, "b4": 0, "c1": 0}
	once := map[string]int{"a1": 1, "a2": 0, "b1": 0, "b3": 0, "b4": 1, "c1": 0}
	twice := map[string]int{"a1": 2, "a2": 0, "b1": 0, "b3": 0, "b4": 2, "c1": 0}
	var last string
	steps := []struct {
		name     string
		end      string // EndRun of this run first, when not empty
		run      string
		unclean  *persistence.UncleanStop
		attempts map[string]int
	}{
		{name: "first run", run: "r1", attempts: zero},
		{name: "after a clean stop", end: "r1", run: "r2", attempts: zero},
		{name: "after an unclean stop", run: "r3",
			unclean: &persistence.UncleanStop{Run: "r2", StartedAt: at(2), Counted: []persistence.CountedMessage{
				{SessionID: "s1", MessageID: "a1", Attempts: 1}, {SessionID: "s2", MessageID: "b4", Attempts: 1}}},
			attempts: once},
		{name: "a stale end ends nothing", end: "r2", run: "r4",
			unclean: &persistence.UncleanStop{Run: "r3", StartedAt: at(3), Counted: []persistence.CountedMessage{
				{SessionID: "s1", MessageID: "a1", Attempts: 2}, {SessionID: "s2", MessageID: "b4", Attempts: 2}}},
			attempts: twice},
		{name: "clean again", end: "r4", run: "r5", attempts: twice},
	}
	for i, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if st.end != "" {
				if err := s.EndRun(ctx, st.end); err != nil {
					t.Fatalf("EndRun(%s) error: %v", st.end, err)
				}
			}
			got, err := s.BeginRun(ctx, st.run, at(i+1))
			if err != nil {
				t.Fatalf("BeginRun(%s) error: %v", st.run, err)
			}
			diff(t, "BeginRun("+st.run+")", got, st.unclean)
			diff(t, "attempts", attempts(t), st.attempts)
			last = st.run
		})
	}
	if err := s.EndRun(ctx, last); err != nil {
		t.Fatalf("EndRun(%s) error: %v", last, err)
	}
}
