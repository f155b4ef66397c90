package http

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
)

// storeSessions answers the outbox and transcript reads of Sessions from a real store, as the
// daemon's do, and records the texts of each page it returns: what an event stream or a
// transcript answer holds at a time.
type storeSessions struct {
	*fakeSessions
	store persistence.Store

	mu              sync.Mutex
	pages           []int // the bytes of each outbox page's texts
	transcriptPages []int // the bytes of each transcript page's texts
}

func (s *storeSessions) OutboxAfter(ctx context.Context, key string, after int64, limit int) ([]*platforms.Outbound, error) {
	es, err := s.store.OutboxAfter(ctx, key, after, limit)
	if err != nil {
		return nil, err
	}
	outs := make([]*platforms.Outbound, len(es))
	size := 0
	for i, e := range es {
		outs[i] = &platforms.Outbound{SessionKey: e.SessionKey, SessionID: e.SessionID, Seq: e.Seq, Kind: e.Kind,
			Text: e.Text, TurnID: e.TurnID, InReplyTo: e.InReplyTo}
		size += len(e.Text)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pages = append(s.pages, size)
	return outs, nil
}

func (s *storeSessions) LastOutboxSeq(ctx context.Context, key string) (int64, error) {
	return s.store.LastOutboxSeq(ctx, key)
}

// mustBePagedByBytes fails the test unless the stream read the store's outbox, and each page
// it was given held less than persistence.OutboxPageBytes and one more entry of entryBytes.
func (s *storeSessions) mustBePagedByBytes(t *testing.T, entryBytes int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	mustBeUnder(t, "outbox", s.pages, persistence.OutboxPageBytes+entryBytes)
}

// mustBeUnder fails the test unless pages (the bytes of texts of each page of the outbox or
// the transcript read) holds a page, and each below bound (1 MiB and one more entry).
func mustBeUnder(t *testing.T, what string, pages []int, bound int) {
	t.Helper()
	if len(pages) == 0 {
		t.Errorf("no page of the %s was read", what)
	}
	for i, size := range pages {
		if size >= bound {
			t.Errorf("page %d of the %s held %d bytes of texts, want less than %d (1 MiB and one more entry)", i, what, size, bound)
		}
	}
}

// largeReplyText is the text of the reply seq of TestEventsReplayOfLargeReplies.
func largeReplyText(seq int64) string {
	return fmt.Sprintf("%d:%s", seq, strings.Repeat("x", 200<<10))
}

// TestEventsReplayOfLargeReplies: an event stream replays a key of many large replies (6 MB,
// read from SQLite) a page of about a MiB at a time: a client that reads it gets every event
// once, in order, a pruned session's marker left out, then what comes live; a client that
// never reads holds a page, until the stream is cut off, which its log line says naming the
// session. Before, a page was 500 entries whatever their size: one stream of a chat whose
// replies ran to 1 MiB could hold 500 MiB (a soak measured 147 MB live for twenty streams of
// 5.4 MB that were not read).
func TestEventsReplayOfLargeReplies(t *testing.T) {
	const n, pruned = 30, 15 // 6 MB: six pages
	ctx := context.Background()
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { store.Close() })
	entry := func(seq int64, kind, text string) persistence.Op {
		return &persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: streamKey, Seq: seq, SessionID: "s1",
			Kind: kind, Text: text, TurnID: "t1", Platform: Name, ChatType: "dm", ChatID: "chat-1",
			State: persistence.DeliveryDelivered}}
	}
	var ops []persistence.Op
	for seq := int64(1); seq <= n; seq++ {
		if seq == pruned {
			ops = append(ops, entry(seq, persistence.KindPruned, ""))
			continue
		}
		ops = append(ops, entry(seq, platforms.KindReply, largeReplyText(seq)))
	}
	storetest.MustCommit(t, store, ops...)
	entryBytes := len(largeReplyText(n))

	t.Run("a client that reads", func(t *testing.T) {
		sessions := &storeSessions{fakeSessions: newFakeSessions(), store: store}
		h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})
		s := h.openSSE(streamKey, "", "")
		defer s.close()
		// A reply recorded and sent while the stream replays comes after the replay, once.
		live := &platforms.Outbound{SessionKey: streamKey, SessionID: "s1", Seq: n + 1, Kind: platforms.KindReply,
			Text: largeReplyText(n + 1), TurnID: "t1"}
		storetest.MustCommit(t, store, entry(live.Seq, live.Kind, live.Text))
		if err := h.p.Send(ctx, live); err != nil {
			t.Fatalf("Send(%d) = %v", live.Seq, err)
		}
		for want := int64(1); want <= n+1; want++ {
			if want == pruned {
				continue
			}
			ev := s.mustNextEvent()
			if ev.id != want || ev.data.Text != largeReplyText(want) {
				t.Fatalf("event %d (%d bytes), want event %d", ev.id, len(ev.data.Text), want)
			}
		}
		sessions.mustBePagedByBytes(t, entryBytes)
	})

	t.Run("a client that never reads", func(t *testing.T) {
		sessions := &storeSessions{fakeSessions: newFakeSessions(), store: store}
		logs, _ := getNeverRead(t, sessions, "/v1/sessions/"+streamKey+"/events")
		waitFor(t, "the stream cut off", func() bool { return strings.Contains(logs.String(), "answer cut off") })
		if !strings.Contains(logs.String(), "session="+streamKey) {
			t.Errorf("the log line of the stream cut off names no session: %s", logs)
		}
		sessions.mustBePagedByBytes(t, entryBytes)
	})
}
