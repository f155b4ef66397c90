package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"modernc.org/sqlite"

	"github.com/agentgate/agentgate/internal/logging"
)

// Checkpoint policy. Commits never checkpoint (wal_autocheckpoint=0 on the writer): the
// checkpointer copies the WAL back into the database every tick with PASSIVE, which never waits
// and lets the next writer start the WAL over (in FULL mode a reused WAL keeps commit fsyncs
// in place instead of appending). Every restartEvery it runs RESTART, and TRUNCATE once the WAL
// file exceeds truncateAbove; both wait for readers at most checkpointBusy, because they hold
// the writer connection meanwhile.
//
// Commit also wakes the checkpointer once burstPages pages have gone to the WAL since its last
// checkpoint (SQLite's own auto-checkpoint size): the WAL file keeps the size of the most
// frames written between two checkpoints, and a burst of small commits (a spool replay, each
// batch a transaction of its own with its index pages) wrote 25 MB of WAL a second for 0.7 MB
// of data, filling again the disk an operator had just freed (found by an operations
// walkthrough).
const (
	restartEvery   = 30 * time.Second
	truncateAbove  = 64 << 20
	checkpointBusy = 100 * time.Millisecond
	burstPages     = 1000
)

// checkpointer is the goroutine that keeps WAL checkpoints off the commit path. It is owned by
// a Store: started by Open, stopped by Close.
type checkpointer struct {
	db       *sql.DB         // the Store's writer pool: its one connection serialises us with Commit
	drop     func(*sql.Conn) // Store.dropWriter
	wal      string          // path of the -wal file
	log      *slog.Logger
	warn     logging.Counter // a failure that lasts would log at every tick (each second by default)
	pages    atomic.Int64    // pages written to the WAL since the last checkpoint began (wrote)
	burst    chan struct{}   // wakes run once pages reach burstPages
	cancel   context.CancelFunc
	done     chan struct{}
	stopOnce sync.Once
}

func startCheckpointer(db *sql.DB, drop func(*sql.Conn), path string, every time.Duration, log *slog.Logger) *checkpointer {
	ctx, cancel := context.WithCancel(context.Background())
	c := &checkpointer{db: db, drop: drop, wal: path + "-wal", log: log, burst: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	go c.run(ctx, every)
	return c
}

// run checkpoints at every tick, and after a burst of writes, until ctx is cancelled. Exit
// path: stop cancels ctx, which ends a wait for the writer connection; a checkpoint in
// progress finishes (checkpoint says why); run returns and closes done.
func (c *checkpointer) run(ctx context.Context, every time.Duration) {
	defer close(c.done)
	tick := time.NewTicker(every)
	defer tick.Stop()
	lastRestart := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-c.burst:
		}
		c.pages.Store(0)
		mode := "PASSIVE"
		if fi, err := os.Stat(c.wal); err == nil && fi.Size() > truncateAbove {
			mode = "TRUNCATE"
		} else if time.Since(lastRestart) >= restartEvery {
			mode = "RESTART"
		}
		if mode != "PASSIVE" {
			lastRestart = time.Now()
		}
		if _, err := checkpoint(ctx, c.db, c.drop, mode); err != nil && ctx.Err() == nil {
			if n, ok := c.warn.Allow(); ok {
				c.log.Warn("wal checkpoint failed", "mode", mode, "failures", n, logging.Err(err))
			}
		}
	}
}

// wrote adds the pages that dc, the writer's driver connection, has written to the WAL since it
// was last asked (SQLITE_DBSTATUS_CACHE_WRITE), and wakes the checkpointer once burstPages have
// been written since its last checkpoint began. Commit calls it on the connection it holds,
// which the index passes and the other writes share: their pages are counted too.
func (c *checkpointer) wrote(dc any) {
	st, ok := dc.(sqlite.DBStatus)
	if c == nil || !ok {
		return
	}
	n, _, err := st.Status(sqlite.DBStatusCacheWrite, true)
	if err != nil || c.pages.Add(int64(n)) < burstPages {
		return
	}
	select {
	case c.burst <- struct{}{}:
	default: // (already woken)
	}
}

// stop ends the goroutine and waits for it. It is idempotent.
func (c *checkpointer) stop() {
	c.stopOnce.Do(c.cancel)
	<-c.done
}

// ckptResult is the row of PRAGMA wal_checkpoint.
type ckptResult struct {
	Busy         bool // the checkpoint could not finish (readers or a writer in the way)
	Log          int  // frames in the WAL
	Checkpointed int  // frames copied back into the database
}

// writerBusy is the writer's busy timeout (its DSN's busy_timeout).
const writerBusy = 5 * time.Second

// shortBusy sets the busy timeout of conn, the writer's, to d, and returns what sets it back to
// writerBusy, for the caller to defer at once: it runs even when the setting failed, and drops
// the connection with drop (Store.dropWriter) when it cannot set it back. The
// statements run without the caller's ctx: the driver reports a ctx that ended as the
// statement's error even when the statement ran, and a Ping whose deadline ended so left the
// writer at 200 ms; a commit behind a lock then failed after 200 ms and went to the spool
// instead of waiting its 5 s (found by a review).
func shortBusy(conn *sql.Conn, d time.Duration, drop func(*sql.Conn)) (restore func(), err error) {
	restore = func() {
		if _, err := conn.ExecContext(context.Background(), fmt.Sprintf("PRAGMA busy_timeout = %d", writerBusy.Milliseconds())); err != nil {
			drop(conn)
		}
	}
	_, err = conn.ExecContext(context.Background(), fmt.Sprintf("PRAGMA busy_timeout = %d", d.Milliseconds()))
	return restore, err
}

// checkpoint runs one WAL checkpoint on the writer connection. A mode that waits for readers
// (RESTART, TRUNCATE) runs with a short busy timeout, restored afterwards, so it holds up
// Commit for at most checkpointBusy.
//
// ctx ends the wait for the connection, not the checkpoint: an interrupted statement makes
// database/sql drop the writer's connection, and SQLite keeps a connection dropped with the
// store's write statements prepared on it open for good (writeStmts), holding its lock, so that
// the store's last close could not fold the WAL back into the database. The checkpointer's stop
// interrupted the checkpoint in progress: a clean stop then left the last commits in the WAL,
// and a copy of the database file alone lacked them (TestCheckpointStoppedMidwayLeavesNoWAL).
// The checkpoint is short: at most checkpointBusy of waiting, and the copy of the WAL's pages.
func checkpoint(ctx context.Context, db *sql.DB, drop func(*sql.Conn), mode string) (ckptResult, error) {
	var r ckptResult
	conn, err := db.Conn(ctx)
	if err != nil {
		return r, fmt.Errorf("checkpoint %s: %w", mode, err)
	}
	defer conn.Close()
	if mode != "PASSIVE" {
		restore, err := shortBusy(conn, checkpointBusy, drop)
		defer restore()
		if err != nil {
			return r, fmt.Errorf("checkpoint %s: %w", mode, err)
		}
	}
	var busy int
	err = conn.QueryRowContext(context.WithoutCancel(ctx), "PRAGMA wal_checkpoint("+mode+")").Scan(&busy, &r.Log, &r.Checkpointed)
	r.Busy = busy != 0
	if err != nil {
		return r, fmt.Errorf("checkpoint %s: %w", mode, err)
	}
	return r, nil
}
