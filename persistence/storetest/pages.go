package storetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/persistence"
)

// testOutboxPagesBoundedByBytes: a page of OutboxAfter ends with the entry whose text takes
// the page's texts to persistence.OutboxPageBytes, however many entries its limit allows; an
// entry larger than that is a page of its own; and paging on from each page's last seq until a
// page comes back empty reads every entry once, in order, a pruned marker left out. Before, a
// page was bounded by count alone: an event stream's replay (500 entries a page) of replies of
// up to 1 MiB held up to 500 MiB, while its client read it or not.
func testOutboxPagesBoundedByBytes(t *testing.T, s persistence.Store) {
	ops, want := outboxOfLargeReplies()
	MustCommit(t, s, ops...)
	ctx := context.Background()

	var pages [][]int64
	for after := int64(0); ; {
		page, err := s.OutboxAfter(ctx, "k", after, 500)
		if err != nil {
			t.Fatalf("OutboxAfter(k, %d, 500): %v", after, err)
		}
		if len(page) == 0 {
			break
		}
		var seqs []int64
		for _, e := range page {
			seqs = append(seqs, e.Seq)
		}
		pages = append(pages, seqs)
		after = page[len(page)-1].Seq
	}
	diff(t, "OutboxAfter pages of 500", pages, want)

	// A smaller limit still ends a page first, and no limit reads every entry at once.
	if page, err := s.OutboxAfter(ctx, "k", 0, 2); err != nil || len(page) != 2 {
		t.Errorf("OutboxAfter(k, 0, 2) = %d entries, %v; want 2", len(page), err)
	}
	all, err := s.OutboxAfter(ctx, "k", 0, 0)
	if n := len(slices.Concat(want...)); err != nil || len(all) != n {
		t.Errorf("OutboxAfter(k, 0, 0) = %d entries, %v; want all %d", len(all), err, n)
	}
}

// outboxOfLargeReplies returns the ops that record key k's outbox, and the seqs of its pages
// of OutboxAfter(k, after, 500): replies of 300 KiB (four of them reach 1 MiB), of which seq 5
// was a pruned session's (an empty marker), and seqs 9 and 10 of 3 MiB (one ends a page, the
// next is one alone), then small ones; and a reply of another key.
func outboxOfLargeReplies() ([]persistence.Op, [][]int64) {
	var ops []persistence.Op
	add := func(key string, seq int64, kind string, size int) {
		ops = append(ops, &persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: key, Seq: seq, SessionID: "s1",
			Kind: kind, Text: strings.Repeat("x", size), Platform: "http", ChatType: "dm", ChatID: "c",
			State: persistence.DeliveryPending}})
	}
	for seq := int64(1); seq <= 20; seq++ {
		switch {
		case seq == 5:
			add("k", seq, persistence.KindPruned, 0)
		case seq == 9 || seq == 10:
			add("k", seq, "reply", 3<<20)
		case seq <= 12:
			add("k", seq, "reply", 300<<10)
		default:
			add("k", seq, "reply", 100)
		}
	}
	add("other", 1, "reply", 100)
	return ops, [][]int64{{1, 2, 3, 4}, {6, 7, 8, 9}, {10}, {11, 12, 13, 14, 15, 16, 17, 18, 19, 20}}
}

// testTranscriptPagesBoundedByBytes: a page of TranscriptAfter ends with the message whose
// text takes the page's texts to persistence.TranscriptPageBytes, however many messages its
// limit allows; a message larger than that is a page of its own; paging on from each page's
// last seq reads every message once, in order, and the last page is short of both its limit
// and the bound. Before, a page was bounded by count alone: the HTTP API's transcript (100
// messages a page) of messages of 64 KiB held 6.4 MiB a request while its client did not read.
func testTranscriptPagesBoundedByBytes(t *testing.T, s persistence.Store) {
	ops, want := transcriptOfLargeMessages(t, s)
	MustCommit(t, s, ops...)
	ctx := context.Background()

	var pages [][]int64
	for after := int64(0); ; {
		page := check(s.TranscriptAfter(ctx, "s1", after, 500)).must(t, "TranscriptAfter")
		if len(page) == 0 {
			t.Errorf("TranscriptAfter(s1, %d, 500) is empty, want the rest of the transcript", after)
			break
		}
		var seqs []int64
		size := 0
		for _, m := range page {
			seqs = append(seqs, m.Seq)
			size += len(m.Content)
		}
		pages = append(pages, seqs)
		if size < persistence.TranscriptPageBytes { // and shorter than its limit: the last
			break
		}
		after = page[len(page)-1].Seq
	}
	diff(t, "TranscriptAfter pages of 500", pages, want)

	// A smaller limit still ends a page first, and no limit reads every message at once.
	if page, err := s.TranscriptAfter(ctx, "s1", 0, 2); err != nil || len(page) != 2 {
		t.Errorf("TranscriptAfter(s1, 0, 2) = %d messages, %v; want 2", len(page), err)
	}
	all, err := s.TranscriptAfter(ctx, "s1", 0, 0)
	if n := len(slices.Concat(want...)); err != nil || len(all) != n {
		t.Errorf("TranscriptAfter(s1, 0, 0) = %d messages, %v; want all %d", len(all), err, n)
	}
}

// transcriptOfLargeMessages starts session s1 (and s2) and returns the ops that record its
// transcript, and the seqs of its pages of TranscriptAfter(s1, after, 500): messages of 300 KiB
// (four of them reach 1 MiB), seqs 8 and 9 of 3 MiB (one ends a page, the next is one alone),
// then small ones; and a large message of s2.
func transcriptOfLargeMessages(t *testing.T, s persistence.Store) ([]persistence.Op, [][]int64) {
	start(t, s, "s1", "k1", 1)
	start(t, s, "s2", "k2", 1)
	ops := []persistence.Op{&persistence.AppendMessage{Message: userMsg("s2", 1, "other", strings.Repeat("o", 300<<10))}}
	for seq := int64(1); seq <= 20; seq++ {
		size := 100
		switch {
		case seq == 8 || seq == 9:
			size = 3 << 20
		case seq <= 11:
			size = 300 << 10
		}
		m := replyMsg("s1", seq, strings.Repeat("x", size))
		if seq%2 == 1 {
			m = userMsg("s1", seq, fmt.Sprint("m", seq), strings.Repeat("x", size))
		}
		ops = append(ops, &persistence.AppendMessage{Message: m})
	}
	return ops, [][]int64{{1, 2, 3, 4}, {5, 6, 7, 8}, {9}, {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}}
}
