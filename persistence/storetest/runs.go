package storetest

import (
	"context"
	"testing"

	"github.com/agentgate/agentgate/persistence"
)

// testUncleanStops: BeginRun counts a run that never reached EndRun against the head pending
// message of each routed session, once, in the same call; a head already counted counts again
// only when the run that died marked it (its turn started then); a clean stop counts nothing,
// and a stale EndRun (of a run before the current one) does not end the current one.
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
	twice := map[string]int{"a1": 2, "a2": 0, "b1": 0, "b3": 0, "b4": 1, "c1": 0}
	var last string
	steps := []struct {
		name     string
		mark     []persistence.Op // committed first
		end      string           // EndRun of this run first, when not empty
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
		// a1's turn started in r3 (marked), b4's did not (it waited): only a1 counts.
		{name: "a stale end ends nothing", mark: []persistence.Op{&persistence.MarkProbation{SessionID: "s1", Seq: 1, Run: "r3"}},
			end: "r2", run: "r4",
			unclean: &persistence.UncleanStop{Run: "r3", StartedAt: at(3), Counted: []persistence.CountedMessage{
				{Key: "k1", SessionID: "s1", MessageID: "a1", Attempts: 2}}},
			attempts: twice},
		{name: "clean again", end: "r4", run: "r5", attempts: twice},
	}
	for i, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if len(st.mark) > 0 {
				MustCommit(t, s, st.mark...)
			}
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
// it counts in its place. Heads below ProbationAfter count by the same rule from 1 on, and
// always at 0.
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
	head("s4", "k4", "in-flight", p-1) // below probation, marked in the run that dies: counted
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
	MustCommit(t, s, &persistence.MarkProbation{SessionID: "s4", Seq: 1, Run: "r2"})

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
		// r3 died: s2's and s4's marks name r2 (s4 is a suspect now); s5's turn started in r3.
		MustCommit(t, s, &persistence.MarkProbation{SessionID: "s5", Seq: 1, Run: "r3"})
		got := begin(t, "r4", 4)
		diff(t, "BeginRun(r4)", got, &persistence.UncleanStop{Run: "r3", StartedAt: at(3), Counted: []persistence.CountedMessage{
			{Key: "k5", SessionID: "s5", MessageID: "fresh", Attempts: 2}}})
	})
	if err := s.EndRun(ctx, "r4"); err != nil {
		t.Fatalf("EndRun(r4) error: %v", err)
	}
}

// testUncleanStopsCountOnlyMarkedStruck: a head with no strike counts every unclean stop, and
// one with a strike only the stop of a run that marked it (MarkProbation: its turn started in
// that run), so a head that waited (for an agent slot) during two unclean stops has one strike,
// not two, while a message that kills the process at each start reaches 3 in 3 stops. Neither
// a mark of an earlier run nor a mark of a message behind the head counts.
func testUncleanStopsCountOnlyMarkedStruck(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	for _, h := range []struct{ sid, key, msgID string }{
		{"s1", "k1", "poison"}, {"s2", "k2", "waits"}, {"s3", "k3", "ran-before"}, {"s4", "k4", "merged"}} {
		start(t, s, h.sid, h.key, 1)
		MustCommit(t, s, &persistence.AppendMessage{Message: userMsg(h.sid, 1, h.msgID, "head")},
			&persistence.AppendMessage{Message: userMsg(h.sid, 2, h.msgID+"-next", "behind it")})
	}
	mark := func(t *testing.T, sid string, seq int64, run string) {
		t.Helper()
		MustCommit(t, s, &persistence.MarkProbation{SessionID: sid, Seq: seq, Run: run})
	}
	attempts := func(t *testing.T) map[string]int {
		t.Helper()
		got := map[string]int{}
		for _, sid := range []string{"s1", "s2", "s3", "s4"} {
			for _, m := range check(s.Transcript(ctx, sid)).must(t, "Transcript") {
				if m.Role == persistence.RoleUser && m.Attempts > 0 {
					got[m.MessageID] = m.Attempts
				}
			}
		}
		return got
	}
	begin := func(t *testing.T, run string, sec int, want *persistence.UncleanStop) {
		t.Helper()
		u, err := s.BeginRun(ctx, run, at(sec))
		if err != nil {
			t.Fatalf("BeginRun(%s) error: %v", run, err)
		}
		diff(t, "BeginRun("+run+")", u, want)
	}
	counted := func(key, sid, msgID string, n int) persistence.CountedMessage {
		return persistence.CountedMessage{Key: key, SessionID: sid, MessageID: msgID, Attempts: n}
	}

	begin(t, "r1", 1, nil)
	mark(t, "s3", 1, "r1") // s3's head ran in r1; r1 dies
	t.Run("the first stop counts every head", func(t *testing.T) {
		begin(t, "r2", 2, &persistence.UncleanStop{Run: "r1", StartedAt: at(1), Counted: []persistence.CountedMessage{
			counted("k1", "s1", "poison", 1), counted("k2", "s2", "waits", 1),
			counted("k3", "s3", "ran-before", 1), counted("k4", "s4", "merged", 1)}})
	})
	// In r2 the poison's turn starts (marked) and kills the process; s2 waits for a slot; s3
	// is not run again; s4's turn starts with the message behind its head (a mark there,
	// which a session never writes, must not count the head).
	mark(t, "s1", 1, "r2")
	mark(t, "s4", 2, "r2")
	t.Run("the second stop counts only the heads marked in the run that died", func(t *testing.T) {
		begin(t, "r3", 3, &persistence.UncleanStop{Run: "r2", StartedAt: at(2), Counted: []persistence.CountedMessage{
			counted("k1", "s1", "poison", 2)}})
		diff(t, "attempts", attempts(t), map[string]int{"poison": 2, "waits": 1, "ran-before": 1, "merged": 1})
	})
	// In r3 the poison runs on probation (marked) and kills the process again.
	mark(t, "s1", 1, "r3")
	t.Run("the third stop counts the poison to quarantine", func(t *testing.T) {
		begin(t, "r4", 4, &persistence.UncleanStop{Run: "r3", StartedAt: at(3), Counted: []persistence.CountedMessage{
			counted("k1", "s1", "poison", 3)}})
		diff(t, "attempts", attempts(t), map[string]int{"poison": 3, "waits": 1, "ran-before": 1, "merged": 1})
	})
	t.Run("a stop while nothing ran counts nothing", func(t *testing.T) {
		begin(t, "r5", 5, &persistence.UncleanStop{Run: "r4", StartedAt: at(4)})
		diff(t, "attempts", attempts(t), map[string]int{"poison": 3, "waits": 1, "ran-before": 1, "merged": 1})
	})
	if err := s.EndRun(ctx, "r5"); err != nil {
		t.Fatalf("EndRun(r5) error: %v", err)
	}
}
