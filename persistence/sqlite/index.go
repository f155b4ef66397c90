package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/agentgate/agentgate/internal/logging"
)

// Search indexing policy. New message rows are not indexed by the transaction that writes them:
// FTS5 writes a new index segment at every commit (and savepoint release), at a cost that
// hardly shrinks with the rows it holds, so indexing inside small commits made them up to ~1.8×
// as expensive (docs/BENCHMARKS.md). Instead the rows above the watermark (fts_watermark.last_id,
// migration 0006) are indexed in bulk, in a transaction of their own that also advances the
// watermark (10–15 µs a row, so ~15 ms for 1,000 rows on the reference VM):
//
//   - by the Commit that finds at least Options.IndexRows rows waiting, right after its own
//     transaction has committed (so an indexing failure can never fail or roll back a
//     transcript write), at most max(IndexRows, 5,000) rows per Commit;
//   - by a timer Options.IndexDelay after the oldest waiting row was committed, so a quiet
//     daemon's last messages are found by a read-only Search (agentgate sessions search) within
//     about IndexDelay, not only after its next commit;
//   - by Search (all of them, before it queries), by Close (all, unless a stop cut Open's catch-up
//     and no pass has caught up since: the next Open does it), and by Open (all, which is what
//     recovers from a crash between a commit and its indexing).
//
// Every pass runs under the commit mutex on the one writer connection, so a pass and a commit
// never compete for the write lock: a commit waits for a timer's pass as it would for the pass
// of the Commit before it.
const (
	defaultIndexRows  = 1000
	defaultIndexDelay = time.Second
	// minPassLimit bounds the rows one indexing transaction takes (IndexRows when that is
	// larger), so a backlog is indexed a bounded pass per Commit and never stalls one commit.
	minPassLimit = 5000
)

// indexer is the Store's in-memory view of the indexing backlog. The watermark in the database
// is the truth; pending only decides when a pass is worth running.
type indexer struct {
	rows  int           // pending rows that make a Commit run a pass
	delay time.Duration // age of the oldest pending row that makes a Commit run a pass
	limit int           // rows per pass

	// pending counts the rows committed above the watermark (an estimate: a pruned row stays
	// counted until the next pass). Atomic so that Search can skip the commit mutex when it is 0.
	pending atomic.Int64
	retryAt time.Time   // no pass before this, after a failed one; guarded by commitMu
	timer   *time.Timer // the pass IndexDelay after the oldest pending row; guarded by commitMu
	// cutOpen says that Open's catch-up was cut by its ctx (a stop) and that no pass has caught
	// up since: Close leaves the backlog to the next Open. Guarded by commitMu.
	cutOpen bool
}

func newIndexer(opts Options) *indexer {
	x := &indexer{rows: opts.IndexRows, delay: opts.IndexDelay}
	if x.rows <= 0 {
		x.rows = defaultIndexRows
	}
	if x.delay <= 0 {
		x.delay = defaultIndexDelay
	}
	x.limit = max(x.rows, minPassLimit)
	return x
}

// indexCommitted is called by Commit, under the commit mutex, after a transaction that inserted
// added message rows has committed. It runs one bounded pass when one is due.
func (s *Store) indexCommitted(ctx context.Context, added int) {
	x := s.idx
	n := x.pending.Add(int64(added))
	if n >= int64(x.rows) && !s.now().Before(x.retryAt) {
		s.indexPass(ctx)
	}
	s.indexLater()
}

// indexLater arms the timer of the next pass, IndexDelay from now, when rows wait and none is
// armed. The caller holds the commit mutex.
func (s *Store) indexLater() {
	if x := s.idx; x.pending.Load() > 0 && x.timer == nil {
		x.timer = time.AfterFunc(x.delay, s.indexDue)
	}
}

// indexDue is the timer's pass: it indexes what waits (one bounded pass) and arms the timer
// again if rows still wait, after more than a pass's worth or a failed pass.
func (s *Store) indexDue() {
	if s.enter() != nil {
		return // closed: Close indexed what it could, Open indexes the rest
	}
	defer s.leave()
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.idx.timer = nil
	if s.idx.pending.Load() > 0 {
		s.indexPass(context.Background())
	}
	s.indexLater()
}

// stopIndexTimer cancels a pending timer pass. The caller holds the commit mutex.
func (s *Store) stopIndexTimer() {
	if x := s.idx; x.timer != nil {
		x.timer.Stop()
		x.timer = nil
	}
}

// indexAll indexes every pending row, a bounded transaction at a time, and stops at the first
// pass that fails. The caller holds the commit mutex (or is Open or Close). It returns the rows
// indexed and the error of the failed pass, which has been logged.
func (s *Store) indexAll(ctx context.Context) (int, error) {
	total := 0
	for {
		n, more, err := s.indexPass(ctx)
		total += n
		if err != nil || !more {
			return total, err
		}
	}
}

// indexPass indexes, in one transaction, up to max(IndexRows, minPassLimit) message rows above
// the watermark and advances the watermark past them. It reports the rows dealt with and whether more may wait.
//
// Search must never block a transcript write, and a row that cannot be indexed must not stop the
// rows after it: if the rows fail to index together they are retried one by one, rows that still
// fail stay unindexed (the watermark moves past them), and a rate-limited warning is logged. Any
// other failure (the transaction, the watermark) leaves everything as it was, is logged, and the
// next pass is not tried before IndexDelay has passed; one that ctx's end cut is not logged.
func (s *Store) indexPass(ctx context.Context) (n int, more bool, err error) {
	x := s.idx
	n, failed, ferr, err := s.indexTx(ctx, x.limit)
	now := s.now()
	if err != nil {
		err = s.unavailable(err) // a corrupt database, or its file gone, is said so too
		x.retryAt = now.Add(x.delay)
		if x.pending.Load() == 0 {
			x.pending.Store(1) // unknown, but Open could not catch up: try again later
		}
		if ctx.Err() != nil {
			// Cut by its caller (the daemon's stop during Open's catch-up, a search whose client
			// went; the error is ctx's, or database/sql's ErrTxDone for a commit it cut): nothing
			// is lost, its rows wait for the next pass, which meets and logs any real fault.
			// Before, each such stop logged this warning
			// (TestOpenEndedWhileItCatchesUpTheSearchIndexWarnsNothing).
			return 0, false, err
		}
		if c, ok := s.ftsWarn.Allow(); ok {
			s.log.Warn("fts index pass failed; messages wait unindexed", "batches", c, logging.Err(err))
		}
		return 0, false, err
	}
	if failed > 0 {
		if c, ok := s.ftsWarn.Allow(); ok {
			s.log.Warn("fts index write failed; messages stored unindexed",
				"rows", failed, "batches", c, logging.Err(ferr))
		}
	}
	more = n == x.limit
	if more {
		x.pending.Store(max(x.pending.Load()-int64(n), 1))
	} else {
		x.pending.Store(0)
		x.cutOpen = false
		s.stopIndexTimer()
	}
	return n, more, nil
}

// indexTx is indexPass's transaction: it returns the rows it took, how many of them could not be
// indexed with the last such error, and an error if nothing was committed.
func (s *Store) indexTx(ctx context.Context, limit int) (n, failed int, ferr, err error) {
	if g := s.gone.Load(); g != nil {
		return 0, 0, nil, fmt.Errorf("index: %w", g) // nothing more goes to the old file (Close's pass)
	}
	tx, release, err := s.writerTx(ctx)
	if err != nil {
		return 0, 0, nil, fmt.Errorf("index: begin: %w", err)
	}
	defer release()
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	var last, hi int64
	if err := tx.QueryRowContext(ctx, `SELECT last_id FROM fts_watermark WHERE id = 1`).Scan(&last); err != nil {
		return 0, 0, nil, fmt.Errorf("index: read watermark: %w", err)
	}
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(id), ?1), COUNT(*)
		FROM (SELECT id FROM messages WHERE id > ?1 ORDER BY id LIMIT ?2)`, last, limit).Scan(&hi, &n); err != nil {
		return 0, 0, nil, fmt.Errorf("index: find new messages: %w", err)
	}
	if n == 0 {
		return 0, 0, nil, nil
	}
	failed, ferr, err = indexRange(ctx, tx, last, hi)
	if err != nil {
		return 0, 0, nil, fmt.Errorf("index messages %d to %d: %w", last+1, hi, err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE fts_watermark SET last_id = ? WHERE id = 1`, hi); err != nil {
		return 0, 0, nil, fmt.Errorf("index: advance watermark: %w", err)
	}
	if err := s.commitChecked(tx); err != nil {
		return 0, 0, nil, fmt.Errorf("index: commit: %w", err)
	}
	return n, failed, ferr, nil
}

// indexRange adds the messages with from < id <= to to messages_fts, all in one statement inside
// the savepoint fts, or else one by one, each in its own. It returns how many rows could not be
// indexed with the last indexing error, or an error when the transaction cannot go on.
func indexRange(ctx context.Context, tx *sql.Tx, from, to int64) (failed int, ferr, err error) {
	ferr, err = indexIn(ctx, tx, `INSERT INTO messages_fts (rowid, content)
		SELECT id, content FROM messages WHERE id > ? AND id <= ? ORDER BY id`, from, to)
	if ferr == nil || err != nil {
		return 0, nil, err
	}
	ids, err := queryAll(ctx, tx, func(r scanner) (int64, error) {
		var id int64
		err := r.Scan(&id)
		return id, err
	}, `SELECT id FROM messages WHERE id > ? AND id <= ? ORDER BY id`, from, to)
	if err != nil {
		return 0, nil, err
	}
	ferr = nil
	for _, id := range ids {
		e, err := indexIn(ctx, tx, `INSERT INTO messages_fts (rowid, content)
			SELECT id, content FROM messages WHERE id = ?`, id)
		if err != nil {
			return 0, nil, err
		}
		if e != nil {
			failed++
			ferr = fmt.Errorf("index message %d: %w", id, e)
		}
	}
	return failed, ferr, nil
}

// indexIn runs an indexing statement inside the savepoint fts, all or nothing. It returns the
// statement's error (after rolling the savepoint back), or err when the savepoint itself fails.
func indexIn(ctx context.Context, tx *sql.Tx, query string, args ...any) (ferr, err error) {
	if _, err := tx.ExecContext(ctx, `SAVEPOINT fts`); err != nil {
		return nil, fmt.Errorf("fts savepoint: %w", err)
	}
	if _, ferr = tx.ExecContext(ctx, query, args...); ferr != nil {
		if _, err := tx.ExecContext(ctx, `ROLLBACK TO fts`); err != nil {
			return nil, fmt.Errorf("fts rollback to savepoint: %w (after %v)", err, ferr)
		}
	}
	if _, err := tx.ExecContext(ctx, `RELEASE fts`); err != nil {
		return nil, fmt.Errorf("fts release: %w", err)
	}
	return ferr, nil
}

// lowerWatermark keeps the watermark at or below the highest message id after rows were
// deleted, inside the deleting transaction: SQLite hands out max(id)+1 to the next row, which
// must be above the watermark to be indexed. A store without the watermark table (damaged)
// skips it.
func lowerWatermark(ctx context.Context, tx *sql.Tx) error {
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM sqlite_schema
		WHERE type = 'table' AND name = 'fts_watermark'`).Scan(&n); err != nil || n == 0 {
		return err
	}
	_, err := tx.ExecContext(ctx, `UPDATE fts_watermark
		SET last_id = (SELECT COALESCE(MAX(id), 0) FROM messages)
		WHERE id = 1 AND last_id > (SELECT COALESCE(MAX(id), 0) FROM messages)`)
	return err
}

// Unindexed returns how many message rows wait above the search index's watermark: rows
// Search does not find yet. A daemon's store indexes them within IndexDelay; a read-only store
// (OpenReadOnly: `agentgate sessions search`) indexes none, and rows that a crash, or a stop
// that cut Open's catch-up, left waiting wait until the next writable Open. The search
// command says how many it did not look at (TestSearchSaysHowFarTheIndexIsBehind).
func (s *Store) Unindexed(ctx context.Context) (int64, error) {
	if err := s.enter(); err != nil {
		return 0, s.readError("count the messages not indexed: %w", err)
	}
	defer s.leave()
	var n int64
	if err := s.reader.QueryRowContext(ctx, `SELECT COUNT(*) FROM messages
		WHERE id > (SELECT last_id FROM fts_watermark WHERE id = 1)`).Scan(&n); err != nil {
		return 0, s.readError("count the messages not indexed: %w", err)
	}
	return n, nil
}
