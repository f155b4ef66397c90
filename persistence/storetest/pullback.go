package storetest

import (
	"context"
	"testing"

	"github.com/agentgate/agentgate/persistence"
)

// testPullBack: a clock set back leaves times after now in the store. PullBack sets an open
// session's activity (and the reset due time it holds) and an ended session's end to the time
// it is given, moving the ended one's last activity back by as much; the times at or before
// its bound stay. The sessions then reset, and are pruned, by the time they were given.
func testPullBack(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	session := func(id string, active, ended int) {
		ss := newSession(id, "k-"+id)
		ss.LastActivityAt = at(active)
		ops := []persistence.Op{&persistence.CreateSession{Session: ss}, &persistence.PutRoute{Route: route(ss.Key, id, 1)}}
		if ended != 0 {
			ops = append(ops, &persistence.EndSession{SessionID: id, Reason: persistence.EndIdle, At: at(ended)})
		}
		MustCommit(t, s, ops...)
	}
	session("open-past", 10, 0)
	session("open-edge", 1000, 0) // at the bound: a member whose clock runs a little ahead
	session("open-ahead", 5000, 0)
	MustCommit(t, s, &persistence.MarkResetDue{SessionID: "open-ahead", Reason: persistence.EndDaily, At: at(4000)})
	session("ended-past", 10, 20)
	session("ended-ahead", 3000, 4800)

	const after, to = 1000, 500
	if n := check(s.PullBack(ctx, at(after), at(to))).must(t, "PullBack"); n != 2 {
		t.Errorf("PullBack changed %d sessions, want 2 (open-ahead, ended-ahead)", n)
	}
	want := map[string][3]int{ // last activity, end, reset due
		"open-past":   {10, 0, 0},
		"open-edge":   {1000, 0, 0},
		"open-ahead":  {to, 0, to},
		"ended-past":  {10, 20, 0},
		"ended-ahead": {to - 1800, to, 0}, // quiet for 30 min before its end, as before
	}
	for id, w := range want {
		got := check(s.Session(ctx, id)).must(t, "Session "+id)
		ended, due := got.EndedAt, got.ResetDueAt
		if !got.LastActivityAt.Equal(at(w[0])) || w[1] == 0 && !ended.IsZero() || w[1] != 0 && !ended.Equal(at(w[1])) ||
			w[2] == 0 && !due.IsZero() || w[2] != 0 && !due.Equal(at(w[2])) {
			t.Errorf("%s: last activity %v, ended %v, reset due %v; want %v, %v, %v (0: none)", id,
				got.LastActivityAt.Sub(t0), ended, due, at(w[0]).Sub(t0), w[1], w[2])
		}
	}
	if n := check(s.PullBack(ctx, at(after), at(to))).must(t, "PullBack again"); n != 0 {
		t.Errorf("PullBack again changed %d sessions, want none", n)
	}

	idle := check(s.IdleSessions(ctx, at(to+1), 0)).must(t, "IdleSessions")
	var ids []string
	for _, ss := range idle {
		ids = append(ids, ss.ID)
	}
	diff(t, "sessions idle since before the time pulled back to", ids, []string{"open-past", "open-ahead"})
	if n := check(s.PruneSessions(ctx, at(to+1), 0)).must(t, "PruneSessions"); n != 2 {
		t.Errorf("PruneSessions(ended before the time pulled back to) = %d, want 2 (ended-past, ended-ahead)", n)
	}
}
