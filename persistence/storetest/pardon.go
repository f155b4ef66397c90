package storetest

import (
	"context"
	"testing"

	"github.com/agentgate/agentgate/persistence"
)

// testPardon: Pardon clears the count and the probation mark of the active pending user
// messages of one key's routed session, or of every routed session, and says how many messages
// of how many sessions it cleared; it leaves quarantined, answered, archived and unrouted
// messages as they are. A pardoned suspect that an unclean stop makes a suspect again is not
// counted by its old mark.
func testPardon(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	p := persistence.ProbationAfter
	msg := func(sid string, seq int64, id, status string, attempts int) []persistence.Op {
		m := userMsg(sid, seq, id, "text of "+id)
		m.Status = status
		return []persistence.Op{&persistence.AppendMessage{Message: m},
			&persistence.SetAttempts{SessionID: sid, Seq: seq, Attempts: attempts}}
	}
	pending, done, quarantined := persistence.StatusPending, persistence.StatusDone, persistence.StatusQuarantined
	var ops []persistence.Op
	start(t, s, "s1", "k1", 1) // a suspect, marked in the run that dies, with one behind it
	ops = append(ops, msg("s1", 1, "a1", pending, p)...)
	ops = append(ops, msg("s1", 2, "a2", pending, 0)...)
	ops = append(ops, msg("s1", 3, "a3", pending, 1)...)
	ops = append(ops, &persistence.ArchiveMessages{SessionID: "s1", Seqs: []int64{3}})
	start(t, s, "s2", "k2", 1) // one quarantined, one counted once
	ops = append(ops, msg("s2", 1, "b0", quarantined, persistence.ProbationAfter+1)...)
	ops = append(ops, msg("s2", 2, "b1", pending, 1)...)
	start(t, s, "s3", "k3", 1) // answered after its count, then one never counted
	ops = append(ops, msg("s3", 1, "c1", done, 1)...)
	ops = append(ops, msg("s3", 2, "c2", pending, 0)...)
	ops = append(ops, &persistence.CreateSession{Session: newSession("s0", "k0")}) // no key routes to it
	ops = append(ops, msg("s0", 1, "d1", pending, p)...)
	MustCommit(t, s, ops...)
	if _, err := s.BeginRun(ctx, "r1", at(1)); err != nil {
		t.Fatalf("BeginRun(r1) error: %v", err)
	}
	MustCommit(t, s, &persistence.MarkProbation{SessionID: "s1", Seq: 1, Run: "r1"})
	attempts := func(t *testing.T) map[string]int {
		t.Helper()
		got := map[string]int{}
		for _, sid := range []string{"s0", "s1", "s2", "s3"} {
			for _, m := range check(s.Transcript(ctx, sid)).must(t, "Transcript") {
				got[m.MessageID] = m.Attempts
			}
		}
		return got
	}
	want := map[string]int{"a1": p, "a2": 0, "a3": 1, "b0": p + 1, "b1": 1, "c1": 1, "c2": 0, "d1": p}
	pardon := func(t *testing.T, key string, n persistence.Pardoned) {
		t.Helper()
		got, err := s.Pardon(ctx, key)
		if err != nil {
			t.Fatalf("Pardon(%q) error: %v", key, err)
		}
		diff(t, "Pardon("+key+")", got, n)
		diff(t, "attempts", attempts(t), want)
	}

	t.Run("a key", func(t *testing.T) {
		want["b1"] = 0
		pardon(t, "k2", persistence.Pardoned{Messages: 1, Sessions: 1})
	})
	t.Run("a key no message of which counts", func(t *testing.T) {
		pardon(t, "k3", persistence.Pardoned{})
		pardon(t, "k9", persistence.Pardoned{})
	})
	t.Run("all", func(t *testing.T) {
		want["a1"] = 0
		pardon(t, "", persistence.Pardoned{Messages: 1, Sessions: 1})
		// The run that died is forgotten with its counts: the next start counts nothing.
		got, err := s.BeginRun(ctx, "r1b", at(1))
		if err != nil {
			t.Fatalf("BeginRun(r1b) error: %v", err)
		}
		diff(t, "BeginRun(r1b) after a pardon of all", got, (*persistence.UncleanStop)(nil))
		diff(t, "attempts", attempts(t), want)
	})
	t.Run("the probation mark is cleared", func(t *testing.T) {
		// Back at ProbationAfter, a1 counts r1b's death only by a mark of r1b, which it does
		// not have (r1's was cleared); the heads below count as ever.
		MustCommit(t, s, &persistence.SetAttempts{SessionID: "s1", Seq: 1, Attempts: p})
		got, err := s.BeginRun(ctx, "r2", at(2))
		if err != nil {
			t.Fatalf("BeginRun(r2) error: %v", err)
		}
		diff(t, "BeginRun(r2)", got, &persistence.UncleanStop{Run: "r1b", StartedAt: at(1), Counted: []persistence.CountedMessage{
			{Key: "k2", SessionID: "s2", MessageID: "b1", Attempts: 1}, {Key: "k3", SessionID: "s3", MessageID: "c2", Attempts: 1}}})
		want["a1"], want["b1"], want["c2"] = 0, 0, 0
		pardon(t, "", persistence.Pardoned{Messages: 3, Sessions: 3})
	})
	if err := s.EndRun(ctx, "r2"); err != nil {
		t.Fatalf("EndRun(r2) error: %v", err)
	}
}
