package postgres

import (
	"context"
	"encoding/base64"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestOutboxPagesAreBoundedByBytes: a page of OutboxAfter ends with the entry whose text takes
// the page's texts to persistence.OutboxPageBytes, however many entries its limit allows; an
// entry larger than that is a page of its own; and paging on from each page's last seq until a
// page comes back empty reads every entry once, in order, a pruned marker left out. Before, a
// page was bounded by count alone: an event stream's replay (500 entries a page) of replies of
// up to 1 MiB held up to 500 MiB, while its client read it or not.
func TestOutboxPagesAreBoundedByBytes(t *testing.T) {
	s, _ := MustOpen(t)
	ops, want := outboxOfLargeReplies()
	storetest.MustCommit(t, s, ops...)
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
	if diff := cmp.Diff(want, pages); diff != "" {
		t.Errorf("OutboxAfter pages of 500 (-want +got):\n%s", diff)
	}

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

// TestOutboxPageFetchesOnlyItsTexts: the server cuts a page of OutboxAfter, and fetches the
// stored texts of its entries only, not those of the rest of its LIMIT. A page cut by the
// client instead would be sent every row up to the LIMIT: 500 replies of up to 1 MiB read
// from the database and sent to the member for each page, to be thrown away.
func TestOutboxPageFetchesOnlyItsTexts(t *testing.T) {
	s, dsn := MustOpen(t)
	const n, size = 40, 256 << 10
	rng := rand.New(rand.NewPCG(1, 2))
	var ops []persistence.Op
	for seq := int64(1); seq <= n; seq++ {
		// Random, so that PostgreSQL cannot compress it into its row: it is stored out of line
		// (TOAST), where fetching it shows in the statistics.
		b := make([]byte, size*3/4)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		ops = append(ops, &persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: "k", Seq: seq,
			SessionID: "s1", Kind: "reply", Text: base64.StdEncoding.EncodeToString(b), State: persistence.DeliveryPending}})
	}
	storetest.MustCommit(t, s, ops...)

	// A connection of its own that has read nothing else: the statistics count what its
	// backend read.
	ctx := context.Background()
	tx, err := mustConn(t, dsn).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	page, err := outboxAfter(ctx, tx, "k", 0, 500)
	if err != nil {
		t.Fatalf("outboxAfter(k, 0, 500): %v", err)
	}
	var blocks int64
	if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_blocks_fetched(reltoastrelid) FROM pg_class
		WHERE relname = 'outbox'`).Scan(&blocks); err != nil {
		t.Fatal(err)
	}
	want := persistence.OutboxPageBytes / size // four entries of 256 KiB reach 1 MiB: the page ends
	// Each text takes size/8 KiB pages of the TOAST table, and a few of its index.
	if len(page) != want || blocks > int64(2*want*size/8192) {
		t.Errorf("a page of %d (of %d) entries of %d KiB fetched %d blocks of stored texts, want %d entries and at most %d blocks",
			len(page), n, size>>10, blocks, want, 2*want*size/8192)
	}
}
