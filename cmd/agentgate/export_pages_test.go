package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestSessionsExportOfLargeReplies: an outbox page ends early once its texts pass
// persistence.OutboxPageBytes, and a transcript page once they pass
// persistence.TranscriptPageBytes, so a short page is not the last; the export reads on to an
// empty one and writes every entry and message. (Read as the end, a short page cut the export
// after the first megabyte of replies, with no error.)
func TestSessionsExportOfLargeReplies(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	ops := []persistence.Op{
		&persistence.CreateSession{Session: persistence.Session{ID: "s1", Key: keyA, Platform: "http",
			ChatType: "dm", ChatID: "alice", UserID: "alice", StartedAt: sessAt(0), LastActivityAt: sessAt(1), Epoch: 1}},
		&persistence.PutRoute{Route: persistence.Route{Key: keyA, SessionID: "s1", Generation: 1, UpdatedAt: sessAt(0)}},
	}
	const n = 6
	big := strings.Repeat("x", persistence.OutboxPageBytes/2) // two and a bit fill a page
	for seq := int64(1); seq <= n; seq++ {
		ops = append(ops, &persistence.AddOutbox{Entry: persistence.OutboxEntry{
			SessionKey: keyA, Seq: seq, SessionID: "s1", Kind: "reply", Text: big, Platform: "http",
			ChatType: "dm", ChatID: "alice", UserID: "alice", State: persistence.DeliveryDelivered, CreatedAt: sessAt(int(seq))}},
			&persistence.AppendMessage{Message: persistence.Message{SessionID: "s1", Seq: seq, Role: persistence.RoleAssistant,
				Content: big, TurnID: "t1", Status: persistence.StatusDone, Active: true, CreatedAt: sessAt(int(seq))}})
	}
	storetest.MustCommit(t, st, ops...)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	out, _ := MustRunSessions(t, "export", "--data-dir", dir, keyA)
	type seqs []struct {
		Seq int64 `json:"seq"`
	}
	var got struct {
		Sessions []struct {
			Messages seqs `json:"messages"`
		} `json:"sessions"`
		Outbox seqs `json:"outbox"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("decode the export (%d bytes): %v", len(out), err)
	}
	if len(got.Outbox) != n {
		t.Errorf("the export holds outbox entries %v, want all %d", got.Outbox, n)
	}
	if len(got.Sessions) != 1 || len(got.Sessions[0].Messages) != n {
		t.Errorf("the export holds sessions %v, want one of all %d messages", got.Sessions, n)
	}
}
