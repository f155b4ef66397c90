package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Options configures Open. The zero value is the production default.
type Options struct {
	// Synchronous is the PRAGMA synchronous level: "full" (the default, durable across power
	// loss) or "normal" (durable across process crashes only).
	Synchronous string
	// Logger receives lifecycle and degradation messages (a failing FTS index, checkpoints that
	// cannot finish); the caller sets its component attribute. Nil discards them.
	Logger *slog.Logger
	// CheckpointInterval is how often the background checkpointer runs a PASSIVE WAL checkpoint.
	// Zero means one second.
	CheckpointInterval time.Duration
	// Readers is the size of the reader connection pool. Zero means 4.
	Readers int
	// IndexRows and IndexDelay say when new messages are added to the search index: in bulk, by
	// the Commit that finds IndexRows of them waiting (zero means 1,000), by a timer once the
	// oldest of them has waited IndexDelay (zero means one second), and always before Search
	// answers, on Close and on Open (see index.go).
	IndexRows  int
	IndexDelay time.Duration
	// Corrupt is called once, from whichever goroutine met it first, when the store finds its
	// database damaged while open (reportCorrupt), and once when it finds the database file
	// deleted or replaced (checkFile): either way the database is lost to this store
	// until an operator puts it back, and the daemon shows it in its metrics. Nil calls
	// nothing.
	Corrupt func()
	// NoMigrate opens the database without changing its schema, for an admin command that
	// writes (agentgate sessions reset): an upgrade is one way, and only the daemon, which logs
	// it, makes it. A database whose schema is not this binary's, older or newer, is refused.
	NoMigrate bool
	// MustWrite makes Open take the database's write lock once, as a check, before anything
	// writes (the search index's catch-up), waiting for it as a commit does (writerBusy): for an
	// admin command, which opens the store to write. A lock that another process (a sqlite3
	// shell in a transaction) holds for longer fails Open with one error that says so and what
	// to do. Before, each write waited out the busy timeout in turn (the catch-up, the
	// command's own, the catch-up of Close and of its timer): 15 to 20 s, then "database is
	// locked (5)", which named neither the database nor the cure. A lock held briefly (a
	// checkpoint) is waited for, as the daemon's writes wait for it. A lock taken after the
	// check fails the write that waited for it with the same words (Commit, Pardon).
	MustWrite bool

	// openStep, set only by tests, is called as Open reaches each of its steps after the
	// migration: "migrated" as soon as the migration has returned (after its commit, or its
	// transaction that had nothing to migrate), "write lock taken" as MustWrite's check holds
	// the write lock, before it lets go of it (takeWriteLock), and "prepare" once Open has
	// checked its ctx after it and goes on (to the write statements, the readers): where a
	// test's stop lands.
	openStep func(step string)
}

// Store is the SQLite persistence.Store. It is safe for concurrent use: reads run on a pool of
// reader connections, Commit is serialised on the single writer connection.
type Store struct {
	path     string
	log      *slog.Logger
	readOnly bool
	// mustWrite is Options.MustWrite: an admin command's store, whose writes that wait out a
	// lock taken after its open are worded as the open words it (lockedError).
	mustWrite bool
	// migrated is how many migrations Open applied (Migrated).
	migrated int

	// mu is held shared by every call for its whole duration and exclusively by Close, so a
	// closed flag read under it stays true while the pools are being closed.
	mu     sync.RWMutex
	closed bool

	commitMu writeLock // serialises Commit: the store serialises writers itself
	writer   *sql.DB   // one connection; nil for a read-only store
	reader   *sql.DB   // query_only connections
	// wstmts are the write statements, prepared on the writer's driver connection (writeStmts);
	// read and written only while holding that connection (whose pool has one), under commitMu
	// but for dropWriter.
	wstmts struct {
		conn any
		st   [numStmts]driver.Stmt
	}
	// readStmts are the reader pool's prepared statements, by query (see preparedTx); read
	// only once the store is open.
	readStmts map[string]*sql.Stmt
	lock      *os.File // flock on <path>.lock; nil for a read-only store
	ckpt      *checkpointer
	idx       *indexer // the search index backlog; nil for a read-only store
	now       func() time.Time
	ftsWarn   logging.Counter
	// pruning is what the prune steps know of the rows an earlier step left behind (prune.go).
	pruning pruneState
	// corruptWarn holds back the lines of a corrupt database (reportCorrupt).
	corruptWarn logging.Limiter
	// corrupt is the first error that found the database damaged while open, which Ping
	// reports from then on; onCorrupt is Options.Corrupt.
	corrupt   atomic.Pointer[error]
	onCorrupt func()
	// file is the database file Open opened, which every commit and Ping check the path still
	// names (checkFile); nil for a read-only store. gone is the error of the first check that
	// found it deleted or replaced: from then on every call but Close fails with it (enter, gone.go).
	file     os.FileInfo
	gone     atomic.Pointer[goneError]
	goneWarn logging.Limiter // holds back the lines of a gone file (reportGone)
	// fault, set only by tests, fails an op of Commit before it runs, as a database that
	// cannot take that one write would (a fault at the store's edge).
	fault func(persistence.Op) error
}

var _ persistence.Store = (*Store)(nil)

// String names the database file for logs.
func (s *Store) String() string { return "sqlite " + s.path }

const defaultReaders = 4

// Open opens (creating it and its parent directory if needed) the database at path, takes the
// lock file <path>.lock, checks the database's pages (checkPages), applies the embedded
// migrations and starts the checkpointer. A second Open of the same path while the first is
// open fails with persistence.ErrLocked; under go test the default data directory fails with
// persistence.ErrDefaultDataDir. A corrupt database is refused, its error saying so.
//
// ctx ends Open's wait for the write lock that another process holds, which the migration's
// BEGIN waits for up to the busy timeout of 5 s (TestOpenEndedWhileItWaitsForTheWriteLockStops):
// Open then returns ctx's error at once, having written nothing. The check of every page before
// it runs under ctx too (a read: a cut leaves the database as it was, and is ctx's error, no
// damage: TestOpenEndedWhileItChecksThePagesIsNoDamage), as does the search index catch-up
// after it (a cut pass logs nothing: TestOpenEndedWhileItCatchesUpTheSearchIndexWarnsNothing;
// the store opens all the same, and its Close leaves the rest to the next Open:
// TestCloseAfterACutCatchUpLeavesItToTheNextOpen). A migration that has begun is not cut by
// it: it runs to its end, and Open then returns ErrMigratedThenEnded (and ctx's error) without
// going further, as it does for an end of ctx after the migration and before the catch-up;
// when there was nothing to migrate, Open returns ctx's error alone: it wrote nothing
// (TestOpenEndedAfterItsMigrationSaysWhetherItMigrated). A step that fails for real as ctx
// ends (not with ctx's error or an interrupt: endedByCtx) returns its failure, as without
// the stop (openEnded).
func Open(ctx context.Context, path string, opts Options) (*Store, error) {
	syncMode, err := synchronousPragma(opts.Synchronous)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := checkTestGuard(abs); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o700); err != nil {
		return nil, fmt.Errorf("open %s: %w", abs, err)
	}
	lock, err := lockFile(abs+".lock", abs)
	if err != nil {
		return nil, err
	}
	// SQLite creates a database with the process's umask (0644, as a rule) and gives its -wal
	// and -shm files the database's mode: in a data directory that is not private (one the
	// operator made, or a packaging default of 0755), every conversation was world-readable.
	// A new database is created private, and its WAL and shared memory with it; an existing
	// one keeps the mode its operator gave it.
	created, wasEmpty := false, false
	f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if _, serr := os.Stat(abs); errors.Is(err, fs.ErrExist) && errors.Is(serr, fs.ErrNotExist) {
		// A symbolic link to a file not made yet (an O_EXCL open refuses any link): the file is
		// made at its target, as SQLite made it before the store's connections stopped
		// creating the file (noCreate): the start failed with "unable to open database file"
		// (TestOpenThroughASymlink). The lock file keeps any other store from making it meanwhile.
		f, err = os.OpenFile(abs, os.O_RDWR|os.O_CREATE, 0o600)
	}
	if err == nil {
		f.Close()
		created = true
	} else if !errors.Is(err, fs.ErrExist) {
		lock.Close()
		return nil, fmt.Errorf("open %s: %w", abs, err)
	} else if fi, err := os.Stat(abs); err == nil && fi.Size() == 0 {
		// SQLite takes an empty file for a new database. A restore's copy that stopped at
		// once (a full disk) leaves one, as does a start that stopped before it wrote a page:
		// "there was none at this path" was false, and hid the failed restore (found by an
		// operations walkthrough).
		wasEmpty = true
	}
	s := &Store{path: abs, log: logger(opts.Logger), lock: lock, idx: newIndexer(opts), now: time.Now, commitMu: newWriteLock(),
		onCorrupt: opts.Corrupt, mustWrite: opts.MustWrite}
	if err := s.open(ctx, syncMode, opts); err != nil {
		s.closeAll()
		opts.step("failed")
		if ctx.Err() != nil && endedByCtx(err) { // a stop: what it found done is the error, not the step it cut
			return nil, fmt.Errorf("open %s: %w", abs, openEnded(ctx, s.migrated, err))
		}
		again := "start again"
		if opts.MustWrite {
			again = "run the command again"
		}
		err = explainFull(explainCorrupt(explainAccess(err, abs, true)), abs, again)
		if s.migrated > 0 { // (a stop's error would have said so: openEnded)
			err = fmt.Errorf("%w (after it applied %d migrations to the schema)", err, s.migrated)
		}
		return nil, fmt.Errorf("open %s: %w", abs, err)
	}
	if s.file, err = os.Stat(abs); err != nil { // the file the writer opened (checkFile)
		s.closeAll()
		return nil, fmt.Errorf("open %s: %w", abs, err)
	}
	// Messages committed before a crash, and not indexed yet, are indexed now. A failure is
	// logged and retried by later commits: it never stops the store.
	n, err := s.indexAll(ctx)
	if err == nil && n > 0 {
		s.log.Info("search index caught up", "rows", n)
	}
	s.idx.cutOpen = err != nil && ctx.Err() != nil // (Close)
	s.commitMu.Lock()
	s.indexLater() // after a failed catch-up
	s.commitMu.Unlock()
	s.ckpt = startCheckpointer(s.writer, s.dropWriter, abs, interval(opts.CheckpointInterval), s.log)
	switch {
	case created:
		// A mistyped data_dir or store.dsn makes a new database as readily as a first start
		// does: the line says which it was, so that an operator who expected the
		// conversations sees at once that they are elsewhere, not gone.
		s.log.Info("store opened: a new, empty database (there was none at this path)", "path", abs, "synchronous", syncMode)
	case wasEmpty:
		s.log.Warn("store opened: the database file was empty (0 bytes), so a new, empty database was made in it; "+
			"if a copy or a restore wrote the file, it did not finish", "path", abs, "synchronous", syncMode)
	default:
		s.log.Info("store opened", "path", abs, "synchronous", syncMode)
	}
	return s, nil
}

// open connects the writer, migrates, prepares the write statements and connects the readers.
func (s *Store) open(ctx context.Context, syncMode string, opts Options) error {
	w := s.openDB(dsn(s.path,
		"_pragma=busy_timeout(5000)",
		"_pragma=journal_mode(WAL)",
		"_pragma=foreign_keys(1)",
		"_pragma=synchronous("+syncMode+")",
		// Checkpoints run in the checkpointer, never inside a commit.
		"_pragma=wal_autocheckpoint(0)",
		// After a checkpoint resets the WAL, shrink it back to 64 MiB.
		"_pragma=journal_size_limit(67108864)",
		"_txlock=immediate",
		noCreate,
	))
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	s.writer = w
	// Before anything writes to it (a migration, the daemon), as a damage that writes would
	// spread is best found at once.
	if err := s.checkPages(ctx, w); err != nil {
		return err
	}
	var err error
	if opts.NoMigrate {
		err = checkSchemaToWrite(ctx, w)
	} else {
		s.migrated, err = migrate(ctx, w, s.log)
		opts.step("migrated")
		if err == nil && ctx.Err() != nil {
			// Ended while it migrated, which went on to its end (migrate), or just after:
			// nothing further is done (Open words it: openEnded).
			return ctx.Err()
		}
	}
	again := "start again"
	if err == nil && opts.MustWrite {
		err = takeWriteLock(ctx, w, opts.step)
		again = "run the command again (nothing was changed)"
	}
	if isBusy(err) {
		// Before, only "migrate: database is locked (5)", which said neither who nor what to do
		// (found by a verification walkthrough).
		return &lockedError{path: s.path, again: again, err: err}
	}
	if err != nil {
		return err
	}
	opts.step("prepare")
	if err := s.onWriter(ctx, func(dc any) error { _, err := s.writeStmts(dc); return err }); err != nil {
		return err
	}
	n := opts.Readers
	if n <= 0 {
		n = defaultReaders
	}
	if s.reader, err = openReader(ctx, s.openDB, s.path, n, noCreate); err != nil {
		return err
	}
	s.readStmts = make(map[string]*sql.Stmt, len(activationSQL))
	for _, q := range activationSQL {
		st, err := s.reader.PrepareContext(ctx, q)
		if err != nil {
			return fmt.Errorf("prepare %q: %w", q, err)
		}
		s.readStmts[q] = st
	}
	return nil
}

// step calls the test's openStep, if any.
func (o *Options) step(name string) {
	if o.openStep != nil {
		o.openStep(name)
	}
}

// openEnded is the error of an Open that ctx ended, after err from the step it cut:
// ErrMigratedThenEnded once the Open applied migrations (migrated of them), which it did not cut
// (a cut would roll them all back), and ctx's error otherwise: nothing was written. The daemon's
// stop says which (TestOpenEndedAfterItsMigrationSaysWhetherItMigrated). Before, an Open ended
// after a migration's commit but before its next check of ctx (its statements' preparation, the
// readers' connection) returned ctx's error alone, and the daemon said it had written nothing;
// and one ended during a migration's transaction that had nothing to migrate returned
// ErrMigratedThenEnded, and the daemon said the migrations had finished first.
//
// Only an error that ctx's end caused is a stop's (endedByCtx): a real failure that a stop
// meets (a migration that fails as the stop comes, the readers' files gone as the open ends)
// is Open's error as without the stop, and the daemon fails with it (exit 1). Before, it was
// dropped for the stop's (ErrMigratedThenEnded, or ctx's error with it in its text), and the
// daemon exited 0 saying it had stopped
// (TestOpenEndedAfterItsMigrationSaysWhetherItMigrated/a_real_failure*).
func openEnded(ctx context.Context, migrated int, err error) error {
	if migrated > 0 {
		return fmt.Errorf("%w: %w", ErrMigratedThenEnded, ctx.Err())
	}
	if errors.Is(err, ctx.Err()) {
		return err
	}
	return fmt.Errorf("%w (%v)", ctx.Err(), err) // (the driver's "interrupted", say)
}

// Migrated returns how many migrations Open applied to the database's schema: every one for a
// new database, none when it was at this binary's schema already (or the store opened without
// migrating: Options.NoMigrate, OpenReadOnly). The daemon's stop during its start says so.
func (s *Store) Migrated() int { return s.migrated }

// noCreate is the DSN parameter of the store's connections: SQLite opens the database file,
// never creates it (Open does, private, before they connect). A connection a pool opened after
// the file was deleted made a new, empty one at the path (0644, as the umask had it): a read
// on it failed with "no such table" instead of as unavailable, a commit on the writer's with
// it too, refused for good instead of spooled, and the next start took that file for a new
// database. It now fails to open (SQLITE_CANTOPEN): unavailable, and the store looks at the
// file then (checkFile).
const noCreate = "mode=rw"

// takeWriteLock takes the write lock of the database w writes (BEGIN IMMEDIATE: the writer's
// _txlock), waiting for it at most the writer's busy timeout, and releases it (Options.MustWrite).
// ctx ends the wait (beginUncut), not the transaction it begins: its end is Open's to see, at
// its next step. Before, the transaction was begun with ctx, and database/sql rolled it back
// once ctx ended; an end of ctx between the BEGIN and the ROLLBACK made the ROLLBACK fail with
// sql.ErrTxDone, which is no error of ctx's (endedByCtx), and Open took the stop for a real
// failure ("sql: transaction has already been committed or rolled back")
// (TestOpenEndedAsItTakesTheWriteLockIsAStop). step is Open's openStep, for that test.
func takeWriteLock(ctx context.Context, w *sql.DB, step func(string)) error {
	tx, err := beginUncut(ctx, w)
	if err != nil {
		return fmt.Errorf("take the write lock: %w", err)
	}
	step("write lock taken")
	return tx.Rollback()
}

// largeDatabase is the size from which the start's check of every page is logged.
var largeDatabase int64 = 256 << 20 // a variable for its test

// checkPages runs PRAGMA quick_check on db: it reads every page and checks each b-tree, but
// not that the indexes agree with their tables (about a second per GB, from a warm cache).
// Before, a database damaged past its schema (a failing disk, a copy or a restore gone wrong, a
// tool that wrote into it) opened, and the daemon ran on it, answering every message 503 while
// it logged an outage that would pass (found by an operations walkthrough).
//
// A large database's check is logged, before and after: it takes seconds per GB from a cold
// disk, before the daemon logs or serves anything else (found by a scale walkthrough: 8 to 13 s
// of silence for 1 GB).
func (s *Store) checkPages(ctx context.Context, db *sql.DB) (err error) {
	if fi, serr := os.Stat(s.path); serr == nil && fi.Size() >= largeDatabase {
		start := time.Now()
		s.log.Info("checking every page of the database before anything writes to it (PRAGMA quick_check): "+
			"about a second per GB, more from a cold disk", "path", s.path, "size_mb", fi.Size()>>20)
		defer func() {
			if err == nil { // (a failure is the start's error)
				s.log.Info("database checked", "took", time.Since(start).Round(time.Millisecond))
			}
		}()
	}
	var res string
	if err := db.QueryRowContext(ctx, "PRAGMA quick_check(1)").Scan(&res); err != nil {
		return explainCheckFailure(fmt.Errorf("check the database: %w", err)) // (explainCorrupt words a damage SQLite reports so)
	}
	if !strings.EqualFold(res, "ok") {
		return fmt.Errorf("the database is corrupt (quick_check: %s): %s", strings.Join(strings.Fields(res), " "), corruptFix)
	}
	return nil
}

// OpenReadOnly opens an existing database for reading only, for the admin CLI while the daemon
// runs: it takes no lock, starts no checkpointer, and its Commit and Ping fail with ErrReadOnly.
func OpenReadOnly(ctx context.Context, path string) (*Store, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := checkTestGuard(abs); err != nil {
		return nil, err
	}
	if _, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("open %s: %w", abs, err)
	}
	open := func(params ...string) (*sql.DB, error) {
		r, err := openReader(ctx, openPlain, abs, defaultReaders, params...)
		if err != nil {
			return nil, err
		}
		if err := checkSchema(ctx, r); err != nil {
			r.Close()
			return nil, err
		}
		return r, nil
	}
	r, err := open("mode=ro")
	if err != nil {
		var immutable string
		if immutable, err = immutableFallback(abs, err); immutable != "" {
			r, err = open("mode=ro", immutable)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", abs, explainCorrupt(explainAccess(err, abs, false)))
	}
	return &Store{path: abs, log: logger(nil), readOnly: true, reader: r, commitMu: newWriteLock()}, nil
}

// openReader opens a pool of n query_only connections with openDB (Store.openDB, or
// openPlain), with the DSN parameters params too, and checks that one can be opened.
func openReader(ctx context.Context, openDB func(dsn string) *sql.DB, path string, n int, params ...string) (*sql.DB, error) {
	params = append(params, "_pragma=busy_timeout(5000)", "_pragma=query_only(1)")
	r := openDB(dsn(path, params...))
	r.SetMaxOpenConns(n)
	r.SetMaxIdleConns(n)
	if err := r.PingContext(ctx); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// dsn builds a modernc DSN: a file: URI (so SQLite sees mode=ro) with the path escaped.
func dsn(path string, params ...string) string {
	esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	return "file:" + esc + "?" + strings.Join(params, "&")
}

// synchronousPragma maps Options.Synchronous to a PRAGMA synchronous value.
func synchronousPragma(v string) (string, error) {
	switch strings.ToLower(v) {
	case "", "full":
		return "FULL", nil
	case "normal":
		return "NORMAL", nil
	}
	return "", fmt.Errorf("synchronous %q: want full or normal", v)
}

func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

func interval(d time.Duration) time.Duration {
	if d <= 0 {
		return time.Second
	}
	return d
}

// Path returns the absolute path of the database file.
func (s *Store) Path() string { return s.path }

// enter marks the start of a call; it fails with persistence.ErrClosed once Close has begun,
// and with the goneError once the store has found its database file deleted or replaced
// (gone.go). Every successful enter is paired with leave.
func (s *Store) enter() error {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return persistence.ErrClosed
	}
	if g := s.gone.Load(); g != nil {
		// Nothing is read from the old file either: it holds the commit that found it gone,
		// reported failed (and spooled); a read that found that commit's message made a
		// session take it as stored after all and acknowledge it, into a file that goes when
		// the daemon stops (found by TestDatabaseFileDeletedUnderTheDaemon, once in ten runs).
		s.mu.RUnlock()
		return g
	}
	return nil
}

func (s *Store) leave() { s.mu.RUnlock() }

// pingBusy is how long Ping waits for a write lock that another connection holds. A
// readiness probe must answer within a load balancer's timeout (2 to 5 s), which the writer's
// busy timeout (5 s) exceeds: a database locked by another process made /readyz time out with
// "context deadline exceeded" instead of saying so.
const pingBusy = 200 * time.Millisecond

// Ping checks that the store can be written: it takes and releases the write lock on the writer
// connection, after the commit that holds it (if any), waiting at most pingBusy for a lock held
// outside this store. Its errors say what is wrong in an operator's words: the database locked
// by another process (SQLITE_BUSY), writes of this store that have been waiting for the
// database until ctx ended, or, once the store has found its database damaged, that it is
// corrupt (wrapping persistence.ErrCorrupt), for as long as the store is open: the damage does
// not pass, and the write lock can be taken on a file whose other pages are junk. Likewise once
// the store has found the database file deleted or replaced (persistence.ErrFileGone,
// gone.go), which Ping looks for itself too.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.enter(); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	defer s.leave()
	if s.readOnly {
		return fmt.Errorf("ping: %w", ErrReadOnly)
	}
	if c := s.corrupt.Load(); c != nil {
		return fmt.Errorf("ping: %w", &corruptError{*c})
	}
	if err := s.checkFile(); err != nil {
		// The write lock of the old file could still be taken. Without a commit since the file
		// went (an idle daemon), Ping is the first to find it: the next commit fails at once.
		s.reportGone(err)
		return fmt.Errorf("ping: %w", err)
	}
	start := time.Now()
	conn, err := s.writer.Conn(ctx) // after the commit, index pass or checkpoint in progress
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("ping: no answer within %s: this daemon's writes are waiting for the database "+
				"(locked by another process, or a slow disk): %w", time.Since(start).Round(time.Millisecond), err)
		}
		return fmt.Errorf("ping: %w", s.unavailable(err))
	}
	defer conn.Close()
	// The writer is ours alone until conn.Close: no commit runs with the short busy timeout.
	restore, err := shortBusy(conn, pingBusy, s.dropWriter)
	defer restore()
	if err != nil {
		return fmt.Errorf("ping: %w", s.unavailable(err))
	}
	tx, err := conn.BeginTx(ctx, nil) // BEGIN IMMEDIATE (_txlock): takes the write lock
	if err != nil {
		if isBusy(err) {
			return fmt.Errorf("ping: the database is locked by another process (SQLITE_BUSY): a connection outside "+
				"this daemon (a sqlite3 shell, a backup or sync tool) holds its write lock; writes wait up to 5 s for it, "+
				"then go to the spool: %w",
				persistence.ErrUnavailable)
		}
		return fmt.Errorf("ping: %w", s.unavailable(err))
	}
	if err := tx.Rollback(); err != nil {
		return fmt.Errorf("ping: %w", s.unavailable(err))
	}
	return nil
}

// Close indexes the messages still waiting for the search index, stops the checkpointer, closes
// both pools and releases the lock file. It waits for calls in progress. Closing a closed Store
// returns nil; every other method then returns an error wrapping persistence.ErrClosed. An
// indexing failure is logged, not returned: the next Open indexes what is left, as it does when
// Open's catch-up was cut by its ctx (a stop) and no pass has caught up since, which Close then
// leaves alone.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.idx != nil {
		s.commitMu.Lock()
		// Not into a file gone, nor after Open's catch-up that a stop cut, with nothing indexed
		// since: the next Open indexes them, losing nothing. Before, the close did the catch-up the
		// stop had cut all over again, waiting for it under the stop (up to the busy timeout, then
		// a warning, with the write lock held by another process)
		// (TestCloseAfterACutCatchUpLeavesItToTheNextOpen).
		if s.idx.pending.Load() > 0 && s.gone.Load() == nil && !s.idx.cutOpen {
			_, _ = s.indexAll(context.Background()) // logged by indexPass
		}
		s.stopIndexTimer()
		s.commitMu.Unlock()
	}
	err := s.closeAll()
	logging.FlushAll(&s.corruptWarn, &s.goneWarn) // the lines held back, reported at the close
	if err != nil {
		return fmt.Errorf("close %s: %w", s.path, err)
	}
	s.log.Info("store closed", "path", s.path)
	return nil
}

// closeAll releases everything the Store holds, in reverse order of acquisition, and returns
// the first error.
func (s *Store) closeAll() error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	if s.ckpt != nil {
		s.ckpt.stop()
	}
	if s.gone.Load() != nil {
		keep(s.emptyLostWAL()) // no call is in progress: no reader holds the log back
	}
	for _, st := range s.readStmts {
		keep(st.Close())
	}
	if s.reader != nil {
		keep(s.reader.Close())
	}
	if s.wstmts.conn != nil {
		keep(s.onWriter(context.Background(), func(dc any) error {
			if dc != s.wstmts.conn {
				return nil // that connection was closed: its statements cannot be finalized (writeStmts)
			}
			return closeStmts(s.wstmts.st[:])
		}))
	}
	if s.writer != nil {
		keep(s.writer.Close())
	}
	if s.lock != nil {
		keep(s.lock.Close()) // closing the descriptor releases the flock
	}
	return first
}

// onWriter runs f with the writer's driver connection, which it holds meanwhile.
func (s *Store) onWriter(ctx context.Context, f func(dc any) error) error {
	conn, err := s.writer.Conn(ctx)
	if err != nil {
		return err
	}
	err = conn.Raw(f)
	if cerr := conn.Close(); err == nil {
		err = cerr
	}
	return err
}

// dropWriter makes database/sql close conn, the writer's connection, which a setting that could
// not be restored left unfit for commits (shortBusy, prunePragmas); the pool opens a fresh one
// from the DSN. The write statements prepared on it are finalized first: SQLite keeps a
// connection closed with statements still prepared open for good, holding its lock, and the
// store's last close then left the last commits in the WAL (TestDroppedWriterLeavesNoWAL).
func (s *Store) dropWriter(conn *sql.Conn) {
	_ = conn.Raw(func(dc any) error {
		if s.wstmts.conn == dc {
			_ = closeStmts(s.wstmts.st[:])
			s.wstmts.conn, s.wstmts.st = nil, [numStmts]driver.Stmt{}
		}
		return driver.ErrBadConn
	})
}

// writerTx begins a transaction (BEGIN IMMEDIATE) on the writer's connection for a write that
// ctx may cut short, and returns it with the release of the connection, to defer before the
// transaction's rollback (so that it runs after it). A statement that ctx ends is interrupted,
// and the driver reports its connection unusable until another statement has run on it:
// released so, database/sql dropped the writer's connection with the store's write statements
// prepared on it, which SQLite keeps open for good (writeStmts), holding its lock, so that the
// store's last close left the WAL behind (found by a review: a BEGIN that waited for another
// process's lock beyond BeginRun's retry deadline). releaseWriter runs that statement.
func (s *Store) writerTx(ctx context.Context) (*sql.Tx, func(), error) {
	conn, err := s.writer.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	release := func() { releaseWriter(ctx, conn) }
	tx, err := conn.BeginTx(ctx, nil) // _txlock=immediate: BEGIN IMMEDIATE
	if err != nil {
		release()
		return nil, nil, err
	}
	return tx, release, nil
}

// releaseWriter gives conn, the writer's connection, back to its pool after statements under
// ctx: once ctx has ended, one statement first clears the interrupt it may have left (writerTx).
func releaseWriter(ctx context.Context, conn *sql.Conn) {
	if ctx.Err() != nil {
		_, _ = conn.ExecContext(context.Background(), "SELECT 1")
	}
	_ = conn.Close()
}

// writeLock is the mutex of the store's writers (Store.commitMu). It is a channel, not a
// sync.Mutex, so that a goroutine waiting for it is durably blocked inside a synctest bubble:
// the tests run the store on the bubble's clock, and a commit waiting on a sync.Mutex kept that
// clock still while the lock's holder waited on it (the index pass for the writer's connection,
// the checkpointer holding it in SQLite's busy handler, which sleeps on a timer): the test hung.
type writeLock chan struct{}

func newWriteLock() writeLock { return make(writeLock, 1) }

func (l writeLock) Lock()   { l <- struct{}{} }
func (l writeLock) Unlock() { <-l }
