package http

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// Transcript answers a page of session s1's transcript from the store, as the daemon's
// Sessions does, and records the bytes of its texts.
func (s *storeSessions) Transcript(ctx context.Context, key string, r TranscriptRequest) (*Transcript, error) {
	ms, err := s.store.TranscriptAfter(ctx, "s1", r.After, r.Limit)
	if err != nil {
		return nil, err
	}
	t := &Transcript{SessionKey: key, SessionID: "s1", Messages: make([]TranscriptMessage, 0, len(ms))}
	size := 0
	for _, m := range ms {
		t.Messages = append(t.Messages, TranscriptMessage{Seq: m.Seq, Role: m.Role, Text: m.Content,
			MessageID: m.MessageID, TurnID: m.TurnID, Status: m.Status, CreatedAt: m.CreatedAt})
		size += len(m.Content)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.transcriptPages = append(s.transcriptPages, size)
	return t, nil
}

// mustReadTranscriptPagedByBytes fails the test unless the handler read the store's
// transcript, and each page it was given held no more than persistence.TranscriptPageBytes
// and one more message of msgBytes; it forgets the pages read.
func (s *storeSessions) mustReadTranscriptPagedByBytes(t *testing.T, msgBytes int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	mustBeUnder(t, "transcript", s.transcriptPages, persistence.TranscriptPageBytes+msgBytes)
	s.transcriptPages = nil
}

// largeMessageText is the text of message seq of TestTranscriptOfLargeMessages: 64 KiB, so
// that 16 of them fill a page exactly.
func largeMessageText(seq int64) string {
	p := fmt.Sprintf("%d:", seq)
	return p + strings.Repeat("x", 64<<10-len(p))
}

// TestTranscriptOfLargeMessages: a transcript of many large messages (3 MiB, read from SQLite)
// is read from the store a page of about a MiB at a time, whatever the handler's count of a
// page: the whole transcript still comes back whole and in order (its last page full to the
// byte, then an empty one), and ?limit= pages still hold limit messages each and the right
// next. Before, a page was 100 messages whatever their size: a client that asked for a long
// transcript of 64 KiB messages and read none held 6.4 MiB, and 60 of them took the daemon's
// heap to 500 MiB.
func TestTranscriptOfLargeMessages(t *testing.T) {
	const n = 48 // three pages of 1 MiB
	ctx := context.Background()
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { store.Close() })
	ops := []persistence.Op{&persistence.CreateSession{Session: persistence.Session{ID: "s1", Key: streamKey,
		Platform: Name, ChatType: "dm", ChatID: "chat-1", UserID: "u1", Epoch: 1}}}
	var want []TranscriptMessage
	for seq := int64(1); seq <= n; seq++ {
		m := persistence.Message{SessionID: "s1", Seq: seq, Role: persistence.RoleAssistant, Content: largeMessageText(seq),
			TurnID: "t1", Status: persistence.StatusDone, Active: true}
		ops = append(ops, &persistence.AppendMessage{Message: m})
		want = append(want, TranscriptMessage{Seq: seq, Role: m.Role, Text: m.Content, TurnID: m.TurnID, Status: m.Status})
	}
	storetest.MustCommit(t, store, ops...)
	msgBytes := len(largeMessageText(n))
	sessions := &storeSessions{fakeSessions: newFakeSessions(), store: store}
	h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})
	path := "/v1/sessions/" + streamKey + "/transcript"
	ignoreTime := cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".CreatedAt" }, cmp.Ignore())

	t.Run("whole", func(t *testing.T) {
		got := h.do("GET", path, nil, "")
		tr := mustDecode[Transcript](t, got)
		if got.status != 200 || tr.Next != 0 {
			t.Errorf("GET transcript = %d with next %d, want 200 and no next", got.status, tr.Next)
		}
		if d := cmp.Diff(want, tr.Messages, ignoreTime); d != "" {
			t.Errorf("GET transcript mismatch (-want +got):\n%s", d)
		}
		sessions.mustReadTranscriptPagedByBytes(t, msgBytes)
	})
	for _, limit := range []int{5, 16, 20, 100} {
		t.Run(fmt.Sprint("limit ", limit), func(t *testing.T) {
			var all []TranscriptMessage
			for after := int64(0); ; {
				got := h.do("GET", fmt.Sprintf("%s?session_id=s1&after=%d&limit=%d", path, after, limit), nil, "")
				tr := mustDecode[Transcript](t, got)
				if got.status != 200 || len(tr.Messages) == 0 || len(tr.Messages) > limit {
					t.Fatalf("GET page after %d = %d with %d messages, want 200 with 1..%d", after, got.status, len(tr.Messages), limit)
				}
				all = append(all, tr.Messages...)
				if tr.Next == 0 {
					break
				}
				if last := tr.Messages[len(tr.Messages)-1].Seq; tr.Next != last || len(tr.Messages) != limit {
					t.Fatalf("page after %d: next = %d with %d messages, want the last seq %d of a full page of %d",
						after, tr.Next, len(tr.Messages), last, limit)
				}
				after = tr.Next
			}
			if d := cmp.Diff(want, all, ignoreTime); d != "" {
				t.Errorf("the pages mismatch the transcript (-want +got):\n%s", d)
			}
			sessions.mustReadTranscriptPagedByBytes(t, msgBytes)
		})
	}
}
