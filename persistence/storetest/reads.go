package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/agentgate/agentgate/persistence"
)

func testLoadSessionUnknownKey(t *testing.T, s persistence.Store) {
	got := check(s.LoadSession(context.Background(), "never-seen", 10, 0)).must(t, "LoadSession")
	diff(t, "LoadSession(never-seen)", got, &persistence.Snapshot{})
}

func testLoadSession(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	// The previous incarnation: ended, with a pending message and a delivered reply.
	old := start(t, s, "s0", "k", 1)
	MustCommit(t, s,
		&persistence.AppendMessage{Message: userMsg("s0", 1, "old-1", "left behind")},
		&persistence.AddOutbox{Entry: outboxEntry("k", 1, "s0")},
		&persistence.MarkDelivery{SessionKey: "k", Seq: 1, State: persistence.DeliveryDelivered, At: at(2)},
		&persistence.EndSession{SessionID: old.ID, Reason: persistence.EndNewCommand, At: at(3)})
	cur := start(t, s, "s1", "k", 2)

	notice := persistence.Message{SessionID: "s1", Seq: 5, Role: persistence.RoleNotice,
		Content: "session reset", Status: persistence.StatusDone, Active: true, CreatedAt: at(5)}
	msgs := []persistence.Message{
		userMsg("s1", 1, "m1", "one"),
		replyMsg("s1", 2, "two"),
		userMsg("s1", 3, "m3", "three"),
		userMsg("s1", 4, "m4", "four, undone"),
		notice,
		userMsg("s1", 6, "m6", "six"),
		replyMsg("s1", 7, "seven, retried away"),
	}
	var ops []persistence.Op
	for _, m := range msgs {
		ops = append(ops, &persistence.AppendMessage{Message: m})
	}
	ops = append(ops,
		&persistence.SetMessageStatus{SessionID: "s1", Seqs: []int64{1}, Status: persistence.StatusDone, TurnID: "turn-1"},
		&persistence.ArchiveMessages{SessionID: "s1", Seqs: []int64{4, 7}},
		&persistence.AddOutbox{Entry: outboxEntry("k", 2, "s1", "m1")},
		&persistence.AddOutbox{Entry: outboxEntry("k", 3, "s1", "m1")},
		&persistence.AddOutbox{Entry: outboxEntry("k", 4, "s1", "m3")},
		&persistence.MarkDelivery{SessionKey: "k", Seq: 3, State: persistence.DeliveryDelivered, At: at(8)},
		&persistence.MarkDelivery{SessionKey: "k", Seq: 4, State: persistence.DeliveryFailed, At: at(8)},
	)
	MustCommit(t, s, ops...)

	// Expected rows, as the ops above leave them.
	msgs[0].Status, msgs[0].TurnID = persistence.StatusDone, "turn-1"
	for _, i := range []int{3, 6} {
		msgs[i].Active, msgs[i].Archived = false, true
	}
	e2, e4 := outboxEntry("k", 2, "s1", "m1"), outboxEntry("k", 4, "s1", "m3")
	e4.State, e4.Attempts = persistence.DeliveryFailed, 1
	r := route("k", "s1", 2)

	pending := []persistence.Message{msgs[2], msgs[5]}
	tests := []struct {
		name                       string
		historyLimit, pendingLimit int
		wantHistory, wantPending   []persistence.Message
	}{
		{"history limit 3", 3, 0, []persistence.Message{msgs[2], msgs[4], msgs[5]}, pending},
		{"history larger than transcript", 100, 0, []persistence.Message{msgs[0], msgs[1], msgs[2], msgs[4], msgs[5]}, pending},
		{"no history", 0, 0, nil, pending},
		// The first pendingLimit pending messages, and the count of all of them.
		{"first pending message", 0, 1, nil, pending[:1]},
		{"pending limit as many as pending", 0, 2, nil, pending},
		{"pending limit past the pending", 0, 3, nil, pending},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := check(s.LoadSession(ctx, "k", tc.historyLimit, tc.pendingLimit)).must(t, "LoadSession")
			want := &persistence.Snapshot{
				Route:         &r,
				Session:       &cur,
				Pending:       tc.wantPending,
				PendingCount:  len(pending),
				History:       tc.wantHistory,
				Unconfirmed:   []persistence.OutboxEntry{e2}, // e4 failed for good: final
				LastSeq:       7,
				LastOutboxSeq: 4,
			}
			diff(t, "LoadSession(k)", got, want)
		})
	}
}

func testRepliesTo(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	start(t, s, "s1", "k1", 1)
	start(t, s, "s2", "k2", 1)
	notice := outboxEntry("k1", 2, "s1", "m2")
	notice.Continued = true // an automatic reset's notice: the answer to m2 goes on
	MustCommit(t, s,
		&persistence.AddOutbox{Entry: outboxEntry("k1", 1, "s1", "m1")},
		&persistence.AddOutbox{Entry: notice},
		&persistence.AddOutbox{Entry: outboxEntry("k1", 3, "s1", "m1", "m2")},
		&persistence.AddOutbox{Entry: outboxEntry("k1", 4, "s1")},
		&persistence.AddOutbox{Entry: outboxEntry("k2", 1, "s2", "m1")},
	)
	tests := []struct {
		key, id string
		after   int64
		want    []int64
	}{
		{"k1", "m1", 0, []int64{1, 3}},
		{"k1", "m2", 0, []int64{2, 3}},
		{"k1", "m3", 0, nil},
		{"k2", "m1", 0, []int64{1}},
		{"k3", "m1", 0, nil},
		{"k1", "", 0, nil},
		// Only the entries after the key's outbox seq when the message was taken (a requeued
		// message's second answer, not its first; a waiter's polls).
		{"k1", "m1", 1, []int64{3}},
		{"k1", "m2", 2, []int64{3}},
		{"k1", "m1", 3, nil},
		{"k2", "m1", 1, nil},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/%s/after=%d", tc.key, tc.id, tc.after), func(t *testing.T) {
			es := check(s.RepliesTo(ctx, tc.key, tc.id, tc.after)).must(t, "RepliesTo")
			diff(t, fmt.Sprintf("RepliesTo(%s, %s, %d) seqs", tc.key, tc.id, tc.after), outboxSeqs(es), tc.want)
		})
	}
	es := check(s.RepliesTo(ctx, "k1", "m2", 0)).must(t, "RepliesTo")
	diff(t, "RepliesTo(k1, m2)", es, []persistence.OutboxEntry{notice, outboxEntry("k1", 3, "s1", "m1", "m2")})
}

func testOutboxAfter(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	var ops []persistence.Op
	for seq := int64(1); seq <= 5; seq++ {
		ops = append(ops, &persistence.AddOutbox{Entry: outboxEntry("k", seq, "s1")})
	}
	ops = append(ops, &persistence.AddOutbox{Entry: outboxEntry("other", 9, "s2")})
	MustCommit(t, s, ops...)
	tests := []struct {
		name  string
		after int64
		limit int
		want  []int64
	}{
		{"first page", 0, 2, []int64{1, 2}},
		{"second page", 2, 2, []int64{3, 4}},
		{"last page", 4, 2, []int64{5}},
		{"past the end", 5, 2, nil},
		{"no limit", 0, 0, []int64{1, 2, 3, 4, 5}},
		{"resume mid-stream", 3, 10, []int64{4, 5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			es := check(s.OutboxAfter(ctx, "k", tc.after, tc.limit)).must(t, "OutboxAfter")
			diff(t, "OutboxAfter seqs", outboxSeqs(es), tc.want)
		})
	}
}

func testTranscript(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	start(t, s, "s1", "k1", 1)
	m1, m2, m3 := userMsg("s1", 1, "m1", "one"), replyMsg("s1", 2, "two"), userMsg("s1", 3, "m3", "three")
	// Appended out of order, then 2 archived.
	MustCommit(t, s,
		&persistence.AppendMessage{Message: m3},
		&persistence.AppendMessage{Message: m1},
		&persistence.AppendMessage{Message: m2},
		&persistence.ArchiveMessages{SessionID: "s1", Seqs: []int64{2}})
	m2.Active, m2.Archived = false, true
	got := check(s.Transcript(ctx, "s1")).must(t, "Transcript")
	diff(t, "Transcript(s1)", got, []persistence.Message{m1, m2, m3})
	if got := check(s.Transcript(ctx, "unknown")).must(t, "Transcript"); len(got) != 0 {
		t.Errorf("Transcript(unknown) = %d rows, want 0", len(got))
	}
}

// longTranscript writes, out of order, a session of seven messages (2 and 5 archived, 6 a
// notice) next to another session's, and returns them as the store must read them back.
func longTranscript(t *testing.T, s persistence.Store) []persistence.Message {
	t.Helper()
	start(t, s, "s1", "k1", 1)
	start(t, s, "s2", "k2", 1)
	notice := persistence.Message{SessionID: "s1", Seq: 6, Role: persistence.RoleNotice,
		Content: "notice", Status: persistence.StatusDone, Active: true, CreatedAt: at(6)}
	msgs := []persistence.Message{
		userMsg("s1", 1, "m1", "one"), replyMsg("s1", 2, "two, retried away"),
		userMsg("s1", 3, "m3", "three"), replyMsg("s1", 4, "four"),
		userMsg("s1", 5, "m5", "five, undone"), notice, userMsg("s1", 7, "m7", "seven"),
	}
	ops := []persistence.Op{&persistence.AppendMessage{Message: userMsg("s2", 1, "other", "other session")}}
	for _, i := range []int{6, 2, 0, 4, 1, 5, 3} {
		ops = append(ops, &persistence.AppendMessage{Message: msgs[i]})
	}
	ops = append(ops, &persistence.ArchiveMessages{SessionID: "s1", Seqs: []int64{2, 5}},
		&persistence.SetMessageStatus{SessionID: "s1", Seqs: []int64{1}, Status: persistence.StatusDone, TurnID: "turn-1"})
	MustCommit(t, s, ops...)
	for _, i := range []int{1, 4} {
		msgs[i].Active, msgs[i].Archived = false, true
	}
	msgs[0].Status, msgs[0].TurnID = persistence.StatusDone, "turn-1"
	return msgs
}

func testTranscriptAfter(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	msgs := longTranscript(t, s)
	tests := []struct {
		name  string
		sid   string
		after int64
		limit int
		want  []persistence.Message
	}{
		{"all", "s1", 0, 0, msgs},
		{"negative limit is no limit", "s1", 0, -1, msgs},
		{"first page", "s1", 0, 3, msgs[:3]},
		{"middle page with archived rows", "s1", 1, 4, msgs[1:5]},
		{"last page short", "s1", 5, 3, msgs[5:]},
		{"page ending at the last row", "s1", 4, 3, msgs[4:]},
		{"after the last", "s1", 7, 3, nil},
		{"after a missing seq", "s1", 100, 0, nil},
		{"negative after", "s1", -5, 2, msgs[:2]},
		{"unknown session", "nope", 0, 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := check(s.TranscriptAfter(ctx, tc.sid, tc.after, tc.limit)).must(t, "TranscriptAfter")
			diff(t, "TranscriptAfter", got, tc.want)
		})
	}
	t.Run("pages walk the transcript", func(t *testing.T) {
		var got []persistence.Message
		for after := int64(0); ; {
			page := check(s.TranscriptAfter(ctx, "s1", after, 2)).must(t, "TranscriptAfter")
			got = append(got, page...)
			if len(page) < 2 {
				break
			}
			after = page[len(page)-1].Seq
		}
		diff(t, "pages", got, check(s.Transcript(ctx, "s1")).must(t, "Transcript"))
	})
}

func testPendingAfter(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	msgs := longTranscript(t, s)
	// Pending in s1: 3 and 7 (1 is done, 5 archived), then 8; 9 is quarantined, 10 a reply.
	eight, nine := userMsg("s1", 8, "m8", "eight"), userMsg("s1", 9, "m9", "nine, set aside")
	MustCommit(t, s, &persistence.AppendMessage{Message: eight}, &persistence.AppendMessage{Message: nine},
		&persistence.AppendMessage{Message: replyMsg("s1", 10, "ten")},
		&persistence.SetMessageStatus{SessionID: "s1", Seqs: []int64{9}, Status: persistence.StatusQuarantined})
	three, seven := msgs[2], msgs[6]
	tests := []struct {
		name           string
		sid            string
		after, through int64
		limit          int
		want           []persistence.Message
	}{
		{"all", "s1", 0, 100, 0, []persistence.Message{three, seven, eight}},
		{"first page", "s1", 0, 100, 2, []persistence.Message{three, seven}},
		{"after a pending one", "s1", 3, 100, 0, []persistence.Message{seven, eight}},
		{"through a pending one", "s1", 0, 7, 0, []persistence.Message{three, seven}},
		{"inside", "s1", 3, 7, 5, []persistence.Message{seven}},
		{"past the last", "s1", 8, 100, 0, nil},
		{"an empty range", "s1", 5, 4, 0, nil},
		{"another session", "s2", 0, 100, 0, []persistence.Message{userMsg("s2", 1, "other", "other session")}},
		{"unknown session", "nope", 0, 100, 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := check(s.PendingAfter(ctx, tc.sid, tc.after, tc.through, tc.limit)).must(t, "PendingAfter")
			diff(t, "PendingAfter", got, tc.want)
			// The same rows without their text.
			var refs []persistence.Message
			for _, m := range tc.want {
				m.Content = ""
				refs = append(refs, m)
			}
			got = check(s.PendingRefsAfter(ctx, tc.sid, tc.after, tc.through, tc.limit)).must(t, "PendingRefsAfter")
			diff(t, "PendingRefsAfter", got, refs)
		})
	}
}

func testCountMessages(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	longTranscript(t, s)
	sums := check(s.ListSessions(ctx, persistence.ListFilter{})).must(t, "ListSessions")
	if len(sums) != 2 {
		t.Fatalf("ListSessions = %d sessions, want 2", len(sums))
	}
	for _, sum := range sums {
		n, p, err := s.CountMessages(ctx, sum.Session.ID)
		if err != nil || n != sum.Messages || p != sum.Pending {
			t.Errorf("CountMessages(%s) = %d, %d, %v, want %d, %d as ListSessions", sum.Session.ID, n, p, err, sum.Messages, sum.Pending)
		}
	}
	// s1: seven rows (archived ones count); pending: 3 and 7 (1 is done, 5 undone).
	if n, p, err := s.CountMessages(ctx, "s1"); n != 7 || p != 2 || err != nil {
		t.Errorf("CountMessages(s1) = %d, %d, %v, want 7, 2, nil", n, p, err)
	}
	if n, p, err := s.CountMessages(ctx, "nope"); n != 0 || p != 0 || err != nil {
		t.Errorf("CountMessages(unknown) = %d, %d, %v, want 0, 0, nil", n, p, err)
	}
}

func testHistory(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	msgs := longTranscript(t, s)
	// An archived last row still counts for the last seq; a notice is no conversation message.
	last := replyMsg("s1", 9, "nine, retried away")
	notice := persistence.Message{SessionID: "s1", Seq: 8, Role: persistence.RoleNotice,
		Content: "notice", Status: persistence.StatusDone, Active: true, CreatedAt: at(8)}
	MustCommit(t, s, &persistence.AppendMessage{Message: last}, &persistence.AppendMessage{Message: notice},
		&persistence.ArchiveMessages{SessionID: "s1", Seqs: []int64{9}})
	conversation := []persistence.Message{msgs[0], msgs[2], msgs[3], msgs[6]} // active, no notice
	tests := []struct {
		name    string
		sid     string
		limit   int
		want    []persistence.Message
		wantSeq int64
	}{
		{"last 3 past notices and archived rows", "s1", 3, conversation[1:], 9},
		{"last 1", "s1", 1, conversation[3:], 9},
		{"limit past the transcript", "s1", 100, conversation, 9},
		{"no history", "s1", 0, nil, 9},
		{"negative limit", "s1", -1, nil, 9},
		{"other session", "s2", 5, []persistence.Message{userMsg("s2", 1, "other", "other session")}, 1},
		{"unknown session", "nope", 5, nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, seq, err := s.History(ctx, tc.sid, tc.limit)
			if err != nil {
				t.Fatalf("History: %v", err)
			}
			diff(t, "History", got, tc.want)
			if seq != tc.wantSeq {
				t.Errorf("History(%s) last seq = %d, want %d", tc.sid, seq, tc.wantSeq)
			}
		})
	}
	t.Run("last seq as LoadSession", func(t *testing.T) {
		snap := check(s.LoadSession(ctx, "k1", 0, 0)).must(t, "LoadSession")
		if _, seq, err := s.History(ctx, "s1", 2); err != nil || seq != snap.LastSeq {
			t.Errorf("History last seq = %d, %v, LoadSession's = %d", seq, err, snap.LastSeq)
		}
	})
}

func testListSessions(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	for _, k := range []struct{ key, platform string }{{"a", "http"}, {"b", "discord"}, {"c", "http"}, {"d", "http"}} {
		ss := newSession("old-"+k.key, k.key)
		ss.Platform = k.platform
		cur := ss
		cur.ID = "cur-" + k.key
		MustCommit(t, s,
			&persistence.CreateSession{Session: ss},
			&persistence.PutRoute{Route: route(k.key, ss.ID, 1)},
			&persistence.CreateSession{Session: cur},
			&persistence.PutRoute{Route: route(k.key, cur.ID, 2)})
	}
	MustCommit(t, s,
		&persistence.AppendMessage{Message: userMsg("cur-a", 1, "a1", "pending")},
		&persistence.AppendMessage{Message: replyMsg("cur-a", 2, "reply")},
		&persistence.AppendMessage{Message: userMsg("cur-a", 3, "a3", "pending, then archived")},
		&persistence.ArchiveMessages{SessionID: "cur-a", Seqs: []int64{3}},
		&persistence.AppendMessage{Message: userMsg("old-a", 1, "a0", "old session")})

	type row struct {
		Key, ID           string
		Messages, Pending int
	}
	list := func(f persistence.ListFilter) []row {
		t.Helper()
		var out []row
		for _, sum := range check(s.ListSessions(ctx, f)).must(t, "ListSessions") {
			out = append(out, row{sum.Session.Key, sum.Session.ID, sum.Messages, sum.Pending})
		}
		return out
	}
	a, b := row{"a", "cur-a", 3, 1}, row{"b", "cur-b", 0, 0}
	c, d := row{"c", "cur-c", 0, 0}, row{"d", "cur-d", 0, 0}
	tests := []struct {
		name string
		f    persistence.ListFilter
		want []row
	}{
		{"all", persistence.ListFilter{}, []row{a, b, c, d}},
		{"first page", persistence.ListFilter{Limit: 2}, []row{a, b}},
		{"second page", persistence.ListFilter{Limit: 2, AfterKey: "b"}, []row{c, d}},
		{"past the end", persistence.ListFilter{Limit: 2, AfterKey: "d"}, nil},
		{"platform", persistence.ListFilter{Platform: "http"}, []row{a, c, d}},
		{"platform paged", persistence.ListFilter{Platform: "http", AfterKey: "a", Limit: 1}, []row{c}},
		{"unknown platform", persistence.ListFilter{Platform: "irc"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			diff(t, "ListSessions", list(tc.f), tc.want)
		})
	}
}

func testRecoverable(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
		start(t, s, "s-"+k, k, 1)
	}
	start(t, s, "s-d2", "d", 2) // d's pending message belongs to its previous session
	done := userMsg("s-c", 1, "c1", "answered")
	done.Status = persistence.StatusDone
	MustCommit(t, s,
		&persistence.AppendMessage{Message: userMsg("s-a", 1, "a1", "unanswered")},
		&persistence.AddOutbox{Entry: outboxEntry("b", 1, "s-b")},
		&persistence.AppendMessage{Message: done},
		&persistence.AddOutbox{Entry: outboxEntry("c", 1, "s-c", "c1")},
		&persistence.MarkDelivery{SessionKey: "c", Seq: 1, State: persistence.DeliveryDelivered, At: at(2)},
		&persistence.AppendMessage{Message: userMsg("s-d", 1, "d1", "before /new")},
		&persistence.AddOutbox{Entry: outboxEntry("e", 1, "s-e")},
		&persistence.MarkDelivery{SessionKey: "e", Seq: 1, State: persistence.DeliveryFailed, At: at(2)},
		&persistence.AppendMessage{Message: userMsg("s-f", 1, "f1", "undone")},
		&persistence.ArchiveMessages{SessionID: "s-f", Seqs: []int64{1}})
	got := check(s.Recoverable(ctx)).must(t, "Recoverable")
	diff(t, "Recoverable()", got, []string{"a", "b"}) // e's entry failed for good: final
}

func testEndSession(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	start(t, s, "s1", "k1", 1)
	MustCommit(t, s, &persistence.EndSession{SessionID: "s1", Reason: persistence.EndNewCommand, At: at(5)})
	MustCommit(t, s, &persistence.EndSession{SessionID: "s1", Reason: persistence.EndCrash, At: at(9)})
	got := check(s.Session(ctx, "s1")).must(t, "Session")
	if got.EndReason != persistence.EndNewCommand || !got.EndedAt.Equal(at(5)) {
		t.Errorf("Session(s1) end = %q at %v, want %q at %v", got.EndReason, got.EndedAt, persistence.EndNewCommand, at(5))
	}
}

func testTouchSession(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	start(t, s, "s1", "k1", 1)
	tests := []struct {
		name  string
		touch int
		want  int
	}{
		{"forward", 5, 5},
		{"backwards is ignored", 3, 5},
		{"same", 5, 5},
		{"forward again", 7, 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			MustCommit(t, s, &persistence.TouchSession{SessionID: "s1", At: at(tc.touch)})
			got := check(s.Session(ctx, "s1")).must(t, "Session")
			if !got.LastActivityAt.Equal(at(tc.want)) {
				t.Errorf("LastActivityAt after touching %v = %v, want %v", at(tc.touch), got.LastActivityAt, at(tc.want))
			}
		})
	}
}

func testStatusAndTitle(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	start(t, s, "s1", "k1", 1)
	MustCommit(t, s,
		&persistence.AppendMessage{Message: userMsg("s1", 1, "m1", "one")},
		&persistence.AppendMessage{Message: userMsg("s1", 2, "m2", "two")},
		&persistence.SetMessageStatus{SessionID: "s1", Seqs: []int64{1, 2}, Status: persistence.StatusDone, TurnID: "turn-7"},
		&persistence.SetMessageStatus{SessionID: "s1", Seqs: []int64{2}, Status: persistence.StatusQuarantined},
		&persistence.SetTitle{SessionID: "s1", Title: "a title"},
		&persistence.SetTitle{SessionID: "s1", Title: "the title"})
	ms := check(s.Transcript(ctx, "s1")).must(t, "Transcript")
	type st struct{ Status, TurnID string }
	var got []st
	for _, m := range ms {
		got = append(got, st{m.Status, m.TurnID})
	}
	diff(t, "statuses", got, []st{{persistence.StatusDone, "turn-7"}, {persistence.StatusQuarantined, "turn-7"}})
	if ss := check(s.Session(ctx, "s1")).must(t, "Session"); ss.Title != "the title" {
		t.Errorf("Title = %q, want %q", ss.Title, "the title")
	}
}

// testFindInbounds: FindInbounds reads the user messages of one chat among many ids at once, as
// FindInbound reads each (archived and answered ones included), by message id; ids it does not
// hold, empty ones, another chat's and replies are left out, with no error.
func testFindInbounds(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	start(t, s, "s1", "k1", 1)
	other := userMsg("s1", 4, "m9", "another chat's")
	other.ChatID = "chat2"
	MustCommit(t, s,
		&persistence.AppendMessage{Message: userMsg("s1", 1, "m1", "one")},
		&persistence.AppendMessage{Message: replyMsg("s1", 2, "answer")},
		&persistence.AppendMessage{Message: userMsg("s1", 3, "m3", "three")},
		&persistence.AppendMessage{Message: other},
		&persistence.AppendMessage{Message: userMsg("s1", 5, "m5", "five")},
		&persistence.ArchiveMessages{SessionID: "s1", Seqs: []int64{3}})
	ids := []string{"m5", "nope", "", "m9", "m1", "m3"}
	for i := range 300 { // many ids, as a few purges of 100

		ids = append(ids, fmt.Sprint("absent-", i))
	}
	got := check(s.FindInbounds(ctx, "http", "chat", ids)).must(t, "FindInbounds")
	var want []persistence.Message
	for _, id := range []string{"m1", "m3", "m5"} {
		want = append(want, *check(s.FindInbound(ctx, "http", "chat", id)).must(t, "FindInbound("+id+")"))
	}
	diff(t, "FindInbounds(http, chat, m5 nope '' m9 m1 m3 …)", got, want)
	if got := check(s.FindInbounds(ctx, "http", "chat", nil)).must(t, "FindInbounds(none)"); len(got) != 0 {
		t.Errorf("FindInbounds(no ids) = %v, want none", got)
	}
	if got := check(s.FindInbounds(ctx, "http", "chat", []string{"nope", ""})).must(t, "FindInbounds(absent)"); len(got) != 0 {
		t.Errorf("FindInbounds(absent ids) = %v, want none", got)
	}
}

func testNotFound(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	checks := []struct {
		name string
		err  error
	}{
		{"Session", second(s.Session(ctx, "nope"))},
		{"Route", second(s.Route(ctx, "nope"))},
		{"FindInbound", second(s.FindInbound(ctx, "http", "chat", "nope"))},
		{"FindInbound empty id", second(s.FindInbound(ctx, "http", "chat", ""))},
		{"Ownership", second(s.Ownership(ctx, "nope"))},
	}
	for _, c := range checks {
		if !errors.Is(c.err, persistence.ErrNotFound) {
			t.Errorf("%s error = %v, want ErrNotFound", c.name, c.err)
		}
	}
}

func testClosed(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	start(t, s, "s1", "k1", 1)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	errs := s.Commit(ctx, [][]persistence.Op{{&persistence.SetTitle{SessionID: "s1"}}, {}})
	checks := []struct {
		name string
		err  error
	}{
		{"Commit group 0", errs[0]},
		{"Commit group 1", errs[1]},
		{"LoadSession", second(s.LoadSession(ctx, "k1", 1, 0))},
		{"FindInbound", second(s.FindInbound(ctx, "http", "chat", "m1"))},
		{"RepliesTo", second(s.RepliesTo(ctx, "k1", "m1", 0))},
		{"OutboxAfter", second(s.OutboxAfter(ctx, "k1", 0, 1))},
		{"Transcript", second(s.Transcript(ctx, "s1"))},
		{"TranscriptAfter", second(s.TranscriptAfter(ctx, "s1", 0, 1))},
		{"PendingAfter", second(s.PendingAfter(ctx, "s1", 0, 1, 1))},
		{"PendingRefsAfter", second(s.PendingRefsAfter(ctx, "s1", 0, 1, 1))},
		{"CountMessages", third(s.CountMessages(ctx, "s1"))},
		{"History", third(s.History(ctx, "s1", 1))},
		{"Route", second(s.Route(ctx, "k1"))},
		{"Session", second(s.Session(ctx, "s1"))},
		{"ListSessions", second(s.ListSessions(ctx, persistence.ListFilter{}))},
		{"Recoverable", second(s.Recoverable(ctx))},
		{"RecentChats", second(s.RecentChats(ctx, "http", at(0), 0))},
		{"SessionsOfKey", second(s.SessionsOfKey(ctx, "k1", 0))},
		{"IdleSessions", second(s.IdleSessions(ctx, at(100), 0))},
		{"PruneSessions", second(s.PruneSessions(ctx, at(100), 0))},
		{"PullBack", second(s.PullBack(ctx, at(100), at(50)))},
		{"OpenDrafts", second(s.OpenDrafts(ctx, "http", 0))},
		{"Claim", second(s.Claim(ctx, "k1", "member-1", at(0), nil))},
		{"Ownership", second(s.Ownership(ctx, "k1"))},
		{"BeginRun", second(s.BeginRun(ctx, "r1", at(0)))},
		{"EndRun", s.EndRun(ctx, "r1")},
		{"Ping", s.Ping(ctx)},
	}
	for _, c := range checks {
		if !errors.Is(c.err, persistence.ErrClosed) {
			t.Errorf("%s on a closed store: error = %v, want ErrClosed", c.name, c.err)
		}
	}
}

func second[T any](_ T, err error) error { return err }

func third[T, U any](_ T, _ U, err error) error { return err }

// testRecentChats: the chats and threads of one platform with a message stored since a time,
// each with its newest inbound message, most recent first.
func testRecentChats(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	session := func(id, chat, thread, scope string) persistence.Session {
		ss := newSession(id, "k-"+id)
		ss.Platform, ss.ChatType, ss.ChatID, ss.ThreadID, ss.ScopeID = "discord", "channel", chat, thread, scope
		return ss
	}
	msg := func(sid string, seq int64, platform, chat, id string, sec int) persistence.Op {
		m := userMsg(sid, seq, id, "text "+id)
		m.Platform, m.ChatID, m.CreatedAt = platform, chat, at(sec)
		return &persistence.AppendMessage{Message: m}
	}
	MustCommit(t, s,
		&persistence.CreateSession{Session: session("old", "c-old", "", "g")},
		msg("old", 1, "discord", "c-old", "m-old", 1), // before since
		&persistence.CreateSession{Session: session("dm", "c-dm", "", "")},
		msg("dm", 1, "discord", "c-dm", "m1", 10),
		msg("dm", 2, "discord", "c-dm", "m2", 20),
		&persistence.CreateSession{Session: session("thread", "c-chan", "t-1", "g")},
		msg("thread", 1, "discord", "c-chan", "m3", 30),
		&persistence.AppendMessage{Message: replyMsg("thread", 2, "an answer is not inbound")},
		&persistence.CreateSession{Session: session("chan", "c-chan", "", "g")},
		msg("chan", 1, "discord", "c-chan", "m4", 40),
		&persistence.CreateSession{Session: newSession("http", "k-http")},
		msg("http", 1, "http", "c-http", "h1", 50), // another platform
	)
	want := []persistence.ChatMark{
		{ChatID: "c-chan", ScopeID: "g", MessageID: "m4", At: at(40)},
		{ChatID: "c-chan", ThreadID: "t-1", ScopeID: "g", MessageID: "m3", At: at(30)},
		{ChatID: "c-dm", MessageID: "m2", At: at(20)},
	}
	got := check(s.RecentChats(ctx, "discord", at(5), 0)).must(t, "RecentChats")
	diff(t, "RecentChats(discord, since 5s)", got, want)
	got = check(s.RecentChats(ctx, "discord", at(5), 2)).must(t, "RecentChats")
	diff(t, "RecentChats(discord, since 5s, limit 2)", got, want[:2])
	got = check(s.RecentChats(ctx, "discord", at(25), 0)).must(t, "RecentChats")
	diff(t, "RecentChats(discord, since 25s)", got, want[:2])
	got = check(s.RecentChats(ctx, "discord", at(0), 0)).must(t, "RecentChats")
	if len(got) != 4 || got[3].MessageID != "m-old" {
		t.Errorf("RecentChats(discord, since 0) = %+v, want the three and then c-old's m-old", got)
	}
	got = check(s.RecentChats(ctx, "slack", at(0), 0)).must(t, "RecentChats")
	diff(t, "RecentChats(slack)", got, []persistence.ChatMark(nil))
}
