package storetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/agentgate/agentgate/persistence"
)

// testRequeue checks RequeueMessage: a quarantined message moves to the end of its session as
// pending with its counts cleared, so it loads after the messages that waited before it (the
// order the session queued it in), keeps its text, sender and message id, and nothing else
// moves.
func testRequeue(t *testing.T, s persistence.Store) {
	ctx := context.Background()
	start(t, s, "s1", "k1", 1)
	poison := userMsg("s1", 1, "m1", "crashy")
	poison.Status, poison.Attempts = persistence.StatusQuarantined, 3
	MustCommit(t, s,
		&persistence.AppendMessage{Message: poison},
		&persistence.AppendMessage{Message: replyMsg("s1", 2, "set aside")},
		&persistence.AppendMessage{Message: userMsg("s1", 3, "m3", "waiting")},
		&persistence.MarkProbation{SessionID: "s1", Seq: 1, Run: "r1"})
	requeue := &persistence.RequeueMessage{SessionID: "s1", Seq: 1, NewSeq: 4}
	MustCommit(t, s, requeue)

	snap := check(s.LoadSession(ctx, "k1", 10, 0)).must(t, "LoadSession")
	if snap.LastSeq != 4 {
		t.Errorf("LastSeq = %d, want 4", snap.LastSeq)
	}
	var got []string
	for _, m := range snap.Pending {
		got = append(got, m.MessageID)
	}
	diff(t, "pending message ids, in load order", got, []string{"m3", "m1"})
	m := check(s.FindInbound(ctx, "http", "chat", "m1")).must(t, "FindInbound(m1)")
	want := userMsg("s1", 4, "m1", "crashy")
	want.CreatedAt = poison.CreatedAt // the time it was sent
	diff(t, "the requeued message", m, &want)
	ms := check(s.Transcript(ctx, "s1")).must(t, "Transcript")
	var seqs []int64
	for _, m := range ms {
		seqs = append(seqs, m.Seq)
	}
	diff(t, "transcript seqs", seqs, []int64{2, 3, 4})
	before := readState(t, s, "k1", "s1")

	t.Run("re-applied is a no-op", func(t *testing.T) {
		MustCommit(t, s, requeue)
		diff(t, "state after re-applying", readState(t, s, "k1", "s1"), before)
	})
	t.Run("a message not quarantined does not move", func(t *testing.T) {
		MustCommit(t, s, &persistence.RequeueMessage{SessionID: "s1", Seq: 3, NewSeq: 5}, // pending
			&persistence.RequeueMessage{SessionID: "s1", Seq: 2, NewSeq: 6},  // a reply
			&persistence.RequeueMessage{SessionID: "s1", Seq: 9, NewSeq: 10}, // no row
			&persistence.RequeueMessage{SessionID: "nope", Seq: 1, NewSeq: 11})
		diff(t, "state after requeues of other rows", readState(t, s, "k1", "s1"), before)
	})
	t.Run("quarantined again, it moves again", func(t *testing.T) {
		MustCommit(t, s, &persistence.SetMessageStatus{SessionID: "s1", Seqs: []int64{4}, Status: persistence.StatusQuarantined},
			&persistence.RequeueMessage{SessionID: "s1", Seq: 4, NewSeq: 5})
		m := check(s.FindInbound(ctx, "http", "chat", "m1")).must(t, "FindInbound(m1)")
		if m.Seq != 5 || m.Status != persistence.StatusPending {
			t.Errorf("FindInbound(m1) = seq %d status %q, want seq 5 pending", m.Seq, m.Status)
		}
	})
	t.Run("a new seq that does not follow is refused", func(t *testing.T) {
		errs := s.Commit(ctx, [][]persistence.Op{{&persistence.RequeueMessage{SessionID: "s1", Seq: 5, NewSeq: 5}}})
		if len(errs) != 1 || errs[0] == nil {
			t.Errorf("Commit(RequeueMessage to its own seq) = %v, want an error", errs)
		}
	})
}

// testQuarantined checks Quarantined: the quarantined user messages of every session, newest
// first, without those taken back or requeued since, and at most limit.
func testQuarantined(t *testing.T, s persistence.Store) {
	lister, ok := s.(persistence.QuarantineLister)
	if !ok {
		t.Fatalf("%T has no Quarantined (persistence.QuarantineLister): an operator finds what to requeue with it", s)
	}
	ctx := context.Background()
	start(t, s, "s1", "k1", 1)
	start(t, s, "s2", "k2", 2)
	quarantined := func(m persistence.Message) persistence.Message {
		m.Status = persistence.StatusQuarantined
		return m
	}
	MustCommit(t, s,
		&persistence.AppendMessage{Message: quarantined(userMsg("s1", 1, "m1", "crashy"))},
		&persistence.AppendMessage{Message: userMsg("s1", 2, "m2", "fine")},
		&persistence.AppendMessage{Message: quarantined(userMsg("s1", 3, "m3", "taken back"))},
		&persistence.ArchiveMessages{SessionID: "s1", Seqs: []int64{3}},
		&persistence.AppendMessage{Message: quarantined(userMsg("s2", 5, "m5", "crashy too"))},
		&persistence.AppendMessage{Message: userMsg("s2", 6, "m6", "not yet")})
	ids := func(limit int) []string {
		t.Helper()
		ms, err := lister.Quarantined(ctx, limit)
		if err != nil {
			t.Fatalf("Quarantined(%d): %v", limit, err)
		}
		var got []string
		for _, m := range ms {
			got = append(got, fmt.Sprintf("%s/%s/%s ended=%v", m.SessionKey, m.SessionID, m.MessageID, m.SessionEnded))
		}
		return got
	}
	diff(t, "Quarantined, newest first", ids(0), []string{"k2/s2/m5 ended=false", "k1/s1/m1 ended=false"})
	MustCommit(t, s, &persistence.EndSession{SessionID: "s2", Reason: persistence.EndResetCommand, At: at(8)})
	diff(t, "Quarantined once s2 ended", ids(0), []string{"k2/s2/m5 ended=true", "k1/s1/m1 ended=false"})
	diff(t, "Quarantined with limit 1", ids(1), []string{"k2/s2/m5 ended=true"})
	MustCommit(t, s, &persistence.RequeueMessage{SessionID: "s1", Seq: 1, NewSeq: 7})
	diff(t, "Quarantined after m1's requeue", ids(0), []string{"k2/s2/m5 ended=true"})
}
