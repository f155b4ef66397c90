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
				{Key: "k1", SessionID: "s1", MessageID: "a1", Attempts: 1}, {Key: "k2", SessionID: "s2", MessageID: "b4", Attempts: 1}}},
			attempts: once},
		{name: "a stale end ends nothing", end: "r2", run: "r4",
			unclean: &persistence.UncleanStop{Run: "r3", StartedAt: at(3), Counted: []persistence.CountedMessage{
				{Key: "k1", SessionID: "s1", MessageID: "a1", Attempts: 2}, {Key: "k2", SessionID: "s2", MessageID: "b4", Attempts: 2}}},
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

// testUncleanStopsOnProbation: a head whose attempts reached persistence.ProbationAfter (a
// suspect) counts an unclean stop only when MarkProbation marked it in the run that died: not
// when unmarked (it waited for its turn), nor when marked in an earlier run; no message behind
// it counts in its place. Heads below ProbationAfter count as ever.
func testUncleanStopsOnProbation(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	p := persistence.ProbationAfter
	head := func(sid, key, msgID string, attempts int) {
		t.Helper()
		start(t, s, sid, key, 1)
		MustCommit(t, s, &persistence.AppendMessage{Message: userMsg(sid, 1, msgID, "head")},
			&persistence.AppendMessage{Message: userMsg(sid, 2, msgID+"-next", "behind it")},
			&persistence.SetAttempts{SessionID: sid, Seq: 1, Attempts: attempts})
	}
	head("s1", "k1", "waited", p)      // a suspect that never ran: not counted
	head("s2", "k2", "ran", p)         // the suspect running when the run died: counted
	head("s3", "k3", "ran-before", p)  // a suspect marked in an earlier run: not counted
	head("s4", "k4", "in-flight", p-1) // below probation: counted as ever
	head("s5", "k5", "fresh", 0)       // counted as ever
	attempts := func(t *testing.T) map[string]int {
		t.Helper()
		got := map[string]int{}
		for _, sid := range []string{"s1", "s2", "s3", "s4", "s5"} {
			for _, m := range check(s.Transcript(ctx, sid)).must(t, "Transcript") {
				if m.Role == persistence.RoleUser {
					got[m.MessageID] = m.Attempts
				}
			}
		}
		return got
	}
	begin := func(t *testing.T, run string, sec int) *persistence.UncleanStop {
		t.Helper()
		u, err := s.BeginRun(ctx, run, at(sec))
		if err != nil {
			t.Fatalf("BeginRun(%s) error: %v", run, err)
		}
		return u
	}
	begin(t, "r1", 1)
	MustCommit(t, s, &persistence.MarkProbation{SessionID: "s3", Seq: 1, Run: "r1"})
	if err := s.EndRun(ctx, "r1"); err != nil {
		t.Fatalf("EndRun(r1) error: %v", err)
	}
	begin(t, "r2", 2)
	// Re-sent, as a write whose answer was lost is: a no-op.
	mark := &persistence.MarkProbation{SessionID: "s2", Seq: 1, Run: "r2"}
	MustCommit(t, s, mark)
	MustCommit(t, s, mark)
	MustCommit(t, s, &persistence.MarkProbation{SessionID: "s0", Seq: 1, Run: "r2"}) // unknown: a no-op

	t.Run("only the marked suspect and heads below probation count", func(t *testing.T) {
		got := begin(t, "r3", 3) // r2 died
		diff(t, "BeginRun(r3)", got, &persistence.UncleanStop{Run: "r2", StartedAt: at(2), Counted: []persistence.CountedMessage{
			{Key: "k2", SessionID: "s2", MessageID: "ran", Attempts: p + 1},
			{Key: "k4", SessionID: "s4", MessageID: "in-flight", Attempts: p},
			{Key: "k5", SessionID: "s5", MessageID: "fresh", Attempts: 1}}})
		diff(t, "attempts", attempts(t), map[string]int{
			"waited": p, "waited-next": 0, "ran": p + 1, "ran-next": 0, "ran-before": p, "ran-before-next": 0,
			"in-flight": p, "in-flight-next": 0, "fresh": 1, "fresh-next": 0})
	})
	t.Run("a mark of a run that did not die counts nothing", func(t *testing.T) {
		got := begin(t, "r4", 4) // r3 died; s2's mark names r2, and s4 is a suspect now
		diff(t, "BeginRun(r4)", got, &persistence.UncleanStop{Run: "r3", StartedAt: at(3), Counted: []persistence.CountedMessage{
			{Key: "k5", SessionID: "s5", MessageID: "fresh", Attempts: 2}}})
	})
	if err := s.EndRun(ctx, "r4"); err != nil {
		t.Fatalf("EndRun(r4) error: %v", err)
	}
}
