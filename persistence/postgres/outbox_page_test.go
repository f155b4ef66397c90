package postgres

import (
	"context"
	"encoding/base64"
	"math/rand/v2"
	"testing"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
)

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
