package storetest

import (
	"context"
	"testing"

	"github.com/agentgate/agentgate/persistence"
)

// testUsage checks AddUsage: a turn's tokens are added to its session once, however often the
// write is re-sent (alone, twice in one batch, or next to other turns), and only to its own
// session; a usage for an unknown session fails its group.
func testUsage(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	start(t, s, "s1", "k1", 1)
	start(t, s, "s2", "k2", 1)
	usage := func(id string) [2]int64 {
		t.Helper()
		ss := check(s.Session(ctx, id)).must(t, "Session")
		return [2]int64{ss.InputTokens, ss.OutputTokens}
	}
	if got := usage("s1"); got != [2]int64{} {
		t.Fatalf("usage of a new session = %v, want zero", got)
	}
	t1 := &persistence.AddUsage{SessionID: "s1", TurnID: "t1", InputTokens: 1000, OutputTokens: 200}
	t2 := &persistence.AddUsage{SessionID: "s1", TurnID: "t2", InputTokens: 50, OutputTokens: 7}
	steps := []struct {
		name   string
		groups [][]persistence.Op
		want   [2]int64
	}{
		{"first turn", [][]persistence.Op{{t1}}, [2]int64{1000, 200}},
		{"first turn re-sent", [][]persistence.Op{{t1}}, [2]int64{1000, 200}},
		{"first turn twice in one batch", [][]persistence.Op{{t1}, {t1}}, [2]int64{1000, 200}},
		{"second turn with the first re-sent", [][]persistence.Op{{t1, t2}, {t2}}, [2]int64{1050, 207}},
		{"re-sent with other numbers", [][]persistence.Op{{&persistence.AddUsage{SessionID: "s1", TurnID: "t2", InputTokens: 9, OutputTokens: 9}}}, [2]int64{1050, 207}},
		{"a turn with no tokens", [][]persistence.Op{{&persistence.AddUsage{SessionID: "s1", TurnID: "t3"}}}, [2]int64{1050, 207}},
	}
	for _, st := range steps {
		for i, err := range s.Commit(ctx, st.groups) {
			if err != nil {
				t.Fatalf("%s: group %d: %v", st.name, i, err)
			}
		}
		if got := usage("s1"); got != st.want {
			t.Errorf("after %s: usage of s1 = %v, want %v", st.name, got, st.want)
		}
	}
	// The same turn id in another session is another turn.
	MustCommit(t, s, &persistence.AddUsage{SessionID: "s2", TurnID: "t1", InputTokens: 3, OutputTokens: 1})
	if got := usage("s2"); got != [2]int64{3, 1} {
		t.Errorf("usage of s2 = %v, want [3 1]", got)
	}
	if got := usage("s1"); got != [2]int64{1050, 207} {
		t.Errorf("usage of s1 after a turn of s2 = %v, want [1050 207]", got)
	}
	// Listing shows the totals too.
	for _, sum := range check(s.ListSessions(ctx, persistence.ListFilter{})).must(t, "ListSessions") {
		if sum.Session.ID == "s1" && (sum.Session.InputTokens != 1050 || sum.Session.OutputTokens != 207) {
			t.Errorf("ListSessions: s1 usage = %d/%d, want 1050/207", sum.Session.InputTokens, sum.Session.OutputTokens)
		}
	}
	errs := s.Commit(ctx, [][]persistence.Op{
		{&persistence.AddUsage{SessionID: "nope", TurnID: "t1", InputTokens: 1}},
		{&persistence.AddUsage{SessionID: "s2", TurnID: "t9", InputTokens: 1}},
	})
	if errs[0] == nil {
		t.Errorf("AddUsage for an unknown session: no error")
	}
	if errs[1] != nil {
		t.Errorf("AddUsage next to a failing group: %v", errs[1])
	}
	if got := usage("s2"); got != [2]int64{4, 1} {
		t.Errorf("usage of s2 = %v, want [4 1]", got)
	}
}
