package postgres

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Options configures Open. The zero value is the production default.
type Options struct {
	// Logger receives lifecycle messages (migrations); the caller sets its component attribute.
	// Nil discards them.
	Logger *slog.Logger
	// MaxConns bounds the connection pool (reads run concurrently with the one writer). Zero
	// means 8, or pool_max_conns when the DSN sets it.
	MaxConns int32
	// Exclusive makes the store the database's only user among agentgate processes, as the
	// SQLite store's lock file does for its data directory: Open takes a session advisory lock
	// on a connection of its own and fails with persistence.ErrLocked while another process
	// holds it. A single daemon must run exclusive (two daemons on one database would both
	// activate a session and interleave its writes). Cluster members share the database and
	// fence their writes instead (docs/ARCHITECTURE.md); they open it Shared.
	Exclusive bool
	// Shared makes the store one of the database's cluster members: Open takes the daemon lock
	// shared, so that members do not exclude each other while a single (Exclusive) daemon and
	// they do: each one's Open fails with persistence.ErrLocked while the other kind runs. A
	// member that lost the lock and cannot take it again refuses writes, as an exclusive store
	// does. Ignored with Exclusive.
	Shared bool
	// Timeout bounds every call of the store, a Commit with all its groups included: a server
	// that does not answer in time (hung, or behind a lost network) fails the call with
	// persistence.ErrUnavailable, so writes are spooled. Zero means 15 seconds. A commit (or
	// BeginRun, Pardon) whose COMMIT goes unanswered in time asks for its transaction's fate
	// within a Timeout of its own (xact.go), so it may take up to twice Timeout.
	Timeout time.Duration
	// LockWait is how long Open waits for the daemon lock while another process holds it: a
	// daemon restarted right after a crash finds its predecessor's lock until the server has
	// noticed that connection's end. Zero means five seconds.
	LockWait time.Duration
	// NoMigrate opens the database without changing its schema: a tool that reads next to a
	// running daemon must not migrate the database under it. A database whose schema is older
	// than this binary's is refused.
	NoMigrate bool
	// LockCheckInterval is how often an exclusive store checks that it still holds its lock
	// (and takes it again when its connection was lost). Zero means five seconds. Between two
	// checks the store's commits are fenced by the lock's epoch: once another daemon has
	// taken the lock, none of them commits. A lock found lost is tried again each second (or
	// each interval, if shorter), so that writes resume soon after the database does.
	LockCheckInterval time.Duration
	// LockTaken, when set, is called each time the store takes its daemon lock again after it
	// was lost, once its writes are taken again: its writes were refused meanwhile (a cluster
	// member's) or spooled, and the caller tells the persistence actor
	// (persistence.StoreRecovered), which tells the senders of the writes it refused to send
	// them again at once. It is called with the lock's check held (on the lock watcher's
	// goroutine, or on one a Ping started), so it must not block.
	LockTaken func()

	// openStep, set only by tests, is called as Open reaches each of its steps that a test
	// makes a stop come at: "failed", as a step has failed and before Open looks at its ctx.
	openStep func(step string)
}

// step calls the test's openStep, if any.
func (o *Options) step(name string) {
	if o.openStep != nil {
		o.openStep(name)
	}
}

// Store is the PostgreSQL persistence.Store. It is safe for concurrent use; Commit calls of one
// Store are serialised (the persistence actor is the only writer of a process).
type Store struct {
	pool  *pgxpool.Pool
	log   *slog.Logger
	where string // the database, for logs: where(cfg)
	// migrated is how many migrations Open applied (Migrated).
	migrated int

	timeout  time.Duration
	noAnswer error // the cause of a call's context when timeout ran out

	// mu is held shared by every call for its whole duration and exclusively by Close, so a
	// closed flag read under it stays true while the pool is being closed.
	mu     sync.RWMutex
	closed bool

	// commits holds one token while a Commit runs (Commits are serialised): Ping waits for the
	// commit in progress to end (pingCommits), so that its answer says when this daemon's writes
	// wait for the database.
	commits chan struct{}

	// lockMu lets one check of the daemon lock (checkLock: a ping of its connection, or a
	// retake once it is lost) or Close's release of it run at a time; it guards lockConn and
	// lockLost, and is held across the check's network I/O. Commits do not take it: they read
	// the lock's state the checks publish (held).
	lockMu   sync.Mutex
	lockCfg  *pgx.ConnConfig // nil unless Exclusive or Shared
	shared   bool            // the daemon lock is held shared (a cluster member), unfenced
	connCfg  *pgx.ConnConfig // for connections of their own (Lease)
	lockConn *pgx.Conn       // holds the advisory lock; nil while lost
	lockLost bool            // the last check failed (logged once per loss)
	// lockLostAt is when the lock was found lost (lockLost), and lockAlarmed is set once its
	// loss has lasted lockLostAlarm and was logged at ERR (checkLock). Guarded by lockMu.
	lockLostAt  time.Time
	lockAlarmed bool
	// lockTaken is Options.LockTaken (nil: none), called by checkLock at each retake.
	lockTaken func()
	// held is the daemon lock as the checks last left it, for lockHeld: the epoch of the lock
	// lockConn holds, once it is taken with its epoch raised (or kept: raiseEpoch) and its idle
	// session bounded; nil while it is lost, being released or being taken again. Set with
	// lockMu held (or before the store is shared), read without it: a commit neither waits
	// for a check's ping (a round trip, or the whole check's timeout when the server does not
	// answer) nor for a retake (a connection and four statements), which held every commit,
	// the persistence actor's whole batch, for as long (TestLockCheckHoldsNoCommit).
	held atomic.Pointer[lockHold]
	// closing ends as Close begins: it ends the lock watcher, and gives up the check or the
	// retake of the lock it has in progress (watchLock).
	closing       context.Context
	cancelClosing context.CancelFunc
	watcher       sync.WaitGroup
	// lockEpoch is the daemon lock's epoch this store raised (exclusive, or the first member
	// after a single daemon) or read (the other members) when it took the lock (raiseEpoch);
	// every commit is fenced with it (agentgate_daemon_fence), as held publishes it. Guarded
	// as lockConn is.
	lockEpoch int64
	// lockRaise is the id of the raise that made lockEpoch (daemon_epoch.raise_id, migration
	// 0020; "" for a member, and before the first raise): a retake that finds the epoch, this
	// id and the exclusive mark unchanged keeps the epoch (raiseEpoch). Guarded as lockConn is.
	lockRaise string
	// raised is the epoch this store last raised the daemon lock's to, published before the
	// raise commits (nil: none; set back when it does not): a write of its own fenced with an
	// earlier epoch that meets it was refused by this store's retake, not by another daemon
	// (describe). Its from tells whether another daemon raised it in between.
	raised atomic.Pointer[ownRaise]
	// lockIdle is how long the server keeps the lock's session once its connection falls
	// silent (endIdleLock); 0 until Open has migrated.
	lockIdle time.Duration
	// lockEvery is the lock check's interval (watchLock), which also bounds Ping's check.
	lockEvery time.Duration
	// probe is the lock check a Ping started and that has not ended yet (nil: none); pings
	// that come meanwhile wait for it (pingLock) rather than start checks of their own behind
	// it. Guarded by probeMu.
	probeMu sync.Mutex
	probe   *lockProbe

	// sweepMu serialises the prune steps of this store, for sweepAfter: the id after which the
	// next step's sweep of the outbox reads (0: from the start; sweepOutbox).
	sweepMu    sync.Mutex
	sweepAfter int64

	leaseMu sync.Mutex
	// leases holds the epoch of each lease this store took (Lease), by name; nil until the first.
	leases map[string]int64

	// acquired, when set (by tests), is called with each connection a call takes from the pool
	// (attempt), before the call's first statement on it.
	acquired func(*pgx.Conn)
	// lost, when set (by tests), is called with the call's context when a connection broke
	// once its COMMIT was sent, before the transaction's fate is asked (commitTxs, inTxSettled).
	lost func(ctx context.Context)
	// asked, when set (by tests), is called with each answer of the server to xactFate's ask
	// for a transaction's fate: its status, "null" for none, or "error: " and why it could not ask.
	asked func(status string)
}

var _ persistence.Store = (*Store)(nil)

const defaultMaxConns = 8

// Open connects to the database named by dsn (a postgres:// URL or a libpq key=value string,
// as pgx accepts), checks that it answers and applies the embedded migrations that it lacks.
// The store keeps to the schema the search_path resolves to at Open (pinSchema). Members of a
// cluster may open the same database at once: migrations take an advisory lock.
//
// ctx ends Open's waits at once: the connects, the ping, the wait for the daemon lock (up to
// Options.LockWait), the migration's BEGIN (TestOpenEndedWhileTheMigrationBeginsStops) and the
// wait for another process's migration; Open then returns at once, and lets go of what it
// took in the background (closeFailedOpen). A migration that has begun is not cut by it: it runs
// to its end (a cut would roll all of it back, to be done again from the start at the next
// Open), and Open then returns ErrMigratedThenEnded (and ctx's error) without going further,
// as it does for a stop after the migration; one that had nothing to migrate returns ctx's error
// alone: it wrote nothing.
// An error that ctx's end caused wraps context.Canceled (or DeadlineExceeded): `agentgate
// serve` takes it for its stop signal's (TestSIGTERMWhileTheStartWaitsForPostgresLock). A
// step after the migration that fails for real as ctx ends (not with ctx's error: endedByCtx)
// returns its failure, as without the stop, saying how many migrations Open applied first
// (TestOpenFailedForRealAsAStopCameIsNoStop).
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's message quotes the DSN and redacts its password only as far as it can parse it.
		return nil, errors.New("open postgres: the dsn cannot be parsed; write it as " +
			"postgres://user:password@host:port/database?sslmode=... or as key=value pairs " +
			"(host=... port=... dbname=... user=...)")
	}
	switch {
	case opts.MaxConns > 0:
		cfg.MaxConns = opts.MaxConns
	case !strings.Contains(dsn, "pool_max_conns"):
		cfg.MaxConns = defaultMaxConns
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	schema, err := pinSchema(ctx, cfg.ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("open postgres %s: %w", where(cfg), err)
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	endSilentTransactions(cfg.ConnConfig, timeout)
	cfg.ShouldPing = shouldPing // a dead connection's call runs again instead (again.go)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres %s: %w", where(cfg), err)
	}
	var st *Store // once made: its daemon lock, if taken, goes first
	migrated := 0 // the migrations applied, after which a stop is ErrMigratedThenEnded
	fail := func(err error) (*Store, error) {
		closeFailedOpen(ctx, st, pool)
		opts.step("failed")
		if migrated > 0 { // a failure after the migration (raiseEpoch, endIdleLock)
			if ctx.Err() != nil && endedByCtx(err) { // a stop: what it found done is the error
				err = fmt.Errorf("%w: %w (%v)", ErrMigratedThenEnded, ctx.Err(), err)
			} else { // a real failure, a stop or not: the start fails with it (endedByCtx)
				err = fmt.Errorf("%w (after it applied %d migrations to the schema)", err, migrated)
			}
		}
		return nil, fmt.Errorf("open postgres %s: %w", where(cfg), err)
	}
	if err := pool.Ping(ctx); err != nil {
		return fail(err)
	}
	if err := checkEncoding(ctx, pool); err != nil {
		return fail(err)
	}
	named := where(cfg)
	if schema != "" {
		// The schema the store keeps to, which its DSN's search_path may name or not.
		named = strings.TrimSuffix(named, ")") + " schema " + schema + ")"
	}
	st = &Store{pool: pool, log: log, where: named, timeout: timeout, connCfg: cfg.ConnConfig.Copy(), commits: make(chan struct{}, 1),
		noAnswer: fmt.Errorf("%w: postgres did not answer within %v", persistence.ErrUnavailable, timeout)}
	st.closing, st.cancelClosing = context.WithCancel(context.Background())
	if opts.Exclusive || opts.Shared {
		st.lockCfg, st.shared, st.lockTaken = cfg.ConnConfig.Copy(), !opts.Exclusive, opts.LockTaken
		wait := opts.LockWait
		if wait <= 0 {
			wait = 5 * time.Second
		}
		if err := st.lock(ctx, wait); err != nil {
			return fail(err)
		}
	}
	if opts.NoMigrate {
		err = checkSchema(ctx, pool, log)
	} else {
		migrated, err = migrate(ctx, pool, log)
	}
	if err != nil {
		return fail(err)
	}
	st.migrated = migrated
	if err := ctx.Err(); err != nil { // ended while it migrated, which went on to its end
		// The server answered the migration just now: the lock is let go of before Open
		// returns, not in the background, so that the process's exit, which follows, does
		// not cut its release short, and a start right after finds it free.
		closeFailedOpen(context.WithoutCancel(ctx), st, pool)
		if migrated == 0 {
			// Nothing to migrate: its transaction wrote nothing, and the error says so
			// (TestOpenEndedDuringAMigrationWithNothingToMigrate). Before, it was
			// ErrMigratedThenEnded, and the daemon said the migrations had finished first.
			return nil, fmt.Errorf("open postgres %s: %w", where(cfg), err)
		}
		return nil, fmt.Errorf("open postgres %s: %w: %w", where(cfg), ErrMigratedThenEnded, err)
	}
	if opts.Exclusive || opts.Shared {
		if err := st.raiseEpoch(ctx); err != nil { // the table exists once migrated
			return fail(err)
		}
		every := opts.LockCheckInterval
		if every <= 0 {
			every = 5 * time.Second
		}
		// Only now: a long migration leaves the lock's connection idle.
		st.lockIdle, st.lockEvery = lockIdleChecks*every, every
		if err := st.endIdleLock(ctx); err != nil {
			return fail(err)
		}
		st.held.Store(&lockHold{epoch: st.lockEpoch, raise: st.lockRaise})
		st.watcher.Go(func() { st.watchLock(every) })
	}
	return st, nil
}

// Migrated returns how many migrations Open applied to the database's schema: every one for a
// new database, none when it was at this binary's schema already (or the store opened without
// migrating: Options.NoMigrate). The daemon's stop during its start says so.
func (s *Store) Migrated() int { return s.migrated }

// closeFailedOpen lets go of what an Open that failed took: st's daemon lock, when st was made
// (nil before), then the pool. When Open's ctx has ended (a stop), it does so in the
// background: ctx may have cut a statement of the ping, the encoding's check, the migration's
// BEGIN or the wait for another process's migration on a server that stopped answering, and
// pgx then closes that connection in the background, reading for up to 15 s for the server to
// close it, which pool.Close waits for; the lock's release waits up to 5 s for such a server.
// The stop waits for neither (TestOpenEndedWhileTheMigrationBeginsStops,
// TestOpenEndedOnASilentServerStops); before, only a cut migration closed the pool in the
// background, after the lock's release (up to 5 s), and a stop during the ping or the
// encoding's check waited 15 s. The lock is
// still let go of, as soon as the server answers: an Open in the same process after this one
// waits for it (Options.LockWait) as for another daemon's, and takes it
// (TestOpenEndedWhileAMigrationWaitsLetsTheLockGo). Any other failure (a connection
// refused, a wrong password, a wrong encoding, the lock held by another daemon) lets go of both
// before Open returns, as Close does.
func closeFailedOpen(ctx context.Context, st *Store, pool *pgxpool.Pool) {
	release := func() {
		if st != nil {
			st.unlock()
		}
		pool.Close()
	}
	if ctx.Err() != nil {
		go release()
		return
	}
	release()
}

// pinSchema sets the search_path of cfg's connections to the schema it resolves to now
// (current_schema), so that every connection of the store, its lock's included, stays in that
// schema for the store's life. PostgreSQL resolves a search_path at each statement: under its
// default, "$user", public, a schema named after the user that another deployment creates
// later would come first, and this store would write that deployment's tables under its own
// schema's lock. A search_path naming no schema that exists is left as it is, for migrate to
// report. It returns the schema ("" for none), which String names.
func pinSchema(ctx context.Context, cfg *pgx.ConnConfig) (string, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var schema *string
	if err := conn.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return "", err
	}
	if schema == nil {
		return "", nil
	}
	// A SET after connecting rather than a startup parameter, which poolers such as PgBouncer
	// refuse unless told to pass it on.
	set := "SET search_path TO " + pgx.Identifier{*schema}.Sanitize()
	after := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgconn.PgConn) error {
		if after != nil {
			if err := after(ctx, c); err != nil {
				return err
			}
		}
		return c.Exec(ctx, set).Close()
	}
	return *schema, nil
}

// endSilentTransactions makes the server end a session of cfg's connections whose transaction
// has waited for its client for longer than timeout (idle_in_transaction_session_timeout),
// which no call of the store does: every call, its transaction included, ends within timeout
// (enter). A client whose host died, or that a network partition cut off, in the middle of a
// transaction sends neither FIN nor RST, and the server would keep that transaction for as long
// as TCP keepalive takes to notice (about two hours by default), with the locks it holds: a
// commit's fences (FOR SHARE of each key's owner row), which make every claim of those keys
// wait, so that no other member could take the dead member's sessions over
// (TestClaimOutlivesASilentTransaction), and the daemon fence, which a single daemon's start
// waits for.
func endSilentTransactions(cfg *pgx.ConnConfig, timeout time.Duration) {
	set := fmt.Sprintf("SET idle_in_transaction_session_timeout = %d", max(timeout.Milliseconds(), 1))
	after := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgconn.PgConn) error {
		if after != nil {
			if err := after(ctx, c); err != nil {
				return err
			}
		}
		return c.Exec(ctx, set).Close()
	}
}

// watchLock checks the daemon lock every interval until the store closes, so that a lost lock
// stops the writes (lockHeld) without waiting for a readiness probe, and once it is lost (by
// this check or Ping's) tries to take it again every lockRetakeEvery.
func (s *Store) watchLock(every time.Duration) {
	tick := min(every, lockRetakeEvery)
	t := time.NewTicker(tick)
	defer t.Stop()
	var waited time.Duration
	for {
		select {
		case <-s.closing.Done():
			return
		case <-t.C:
		}
		if waited += tick; waited < every && !s.lockGone() {
			continue
		}
		waited = 0
		// Given up as the store closes: a retake's connection to a server behind a partition
		// (no RST) waits out the whole interval, and Close waited for it at the end of a
		// daemon's stop (TestCloseEndsALockRetakeTheServerDoesNotAnswer).
		_ = s.checkLockWithin(every) // logged by checkLock
	}
}

// lockRetakeEvery is how often a store that lost its daemon lock tries to take it again
// (watchLock). Until it has, every write is refused, a cluster member's outright and a single
// daemon's into its spool, however long the database has answered again: a server restarted,
// or every connection of the store ended, takes the lock's connection with it. Before, the
// lock was tried again only at the lock check (LockCheckInterval, 5 s), and writes were
// refused for up to that long after the database was back: a cluster soak's stopping member
// waited about 4 s for it to write the turn results it held, on top of their retry's pause. A
// try is one connection and a lock that is not waited for (checkLock), once a second only
// while the lock is lost.
const lockRetakeEvery = time.Second

// lockGone reports whether the store has lost its daemon lock and not taken it again. It does
// not wait for a check in progress (a ping of Ping's, or a retake), which the retake it leads
// to waits for instead.
func (s *Store) lockGone() bool {
	return s.held.Load() == nil
}

// lockHold is the daemon lock as a store holds it (Store.held).
type lockHold struct {
	epoch int64 // the lock's epoch, every commit's fence
	// raise is the id of this store's raise that made epoch (Store.lockRaise), which the fence
	// checks too (migration 0021); "" for a cluster member, which read the epoch: the epoch
	// alone is checked.
	raise string
}

// fenceArgs are the arguments of daemonFenceSQL for h.
func (h *lockHold) fenceArgs() []any {
	if h.raise == "" {
		return []any{h.epoch, nil}
	}
	return []any{h.epoch, h.raise}
}

// daemonLock is the advisory lock class an exclusive store holds, and every cluster member
// (Shared) holds shared: "agdl" in ASCII. The lock's second key is the hash of the schema the
// store's tables are in (current_schema), so that deployments in different schemas of one
// database do not exclude each other.
const daemonLock = 0x6167646c

// lock takes the daemon lock on a connection of its own, waiting up to wait (the server's
// lock_timeout) while another session holds it. Called with lockMu held or before the store is
// shared.
func (s *Store) lock(ctx context.Context, wait time.Duration) error {
	conn, err := pgx.ConnectConfig(ctx, s.lockCfg)
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, fmt.Sprintf(`SET lock_timeout = %d`, max(wait.Milliseconds(), 1)))
	if err == nil {
		_, err = conn.Exec(ctx, fmt.Sprintf(`SELECT %s($1, hashtext(current_schema()))`, s.lockFunc("lock")), int32(daemonLock))
	}
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "55P03" { // lock_not_available: lock_timeout ran out
			if s.shared {
				return fmt.Errorf("a single agentgate daemon (not a cluster member) uses this database: %w", persistence.ErrLocked)
			}
			return fmt.Errorf("another agentgate daemon uses this database (a single daemon, or the members of a cluster): %w", persistence.ErrLocked)
		}
		return err
	}
	s.lockConn = conn
	return nil
}

// raiseEpoch raises the daemon lock's epoch (a cluster member, which holds the lock shared,
// only reads it unless a single daemon raised it last), on the lock's connection, right after
// this store took the lock, and keeps it for the fence of its commits. The raise waits for the
// commits of the lock's previous holder that passed their fence, and no later one of them
// passes it. Called with lockMu held or before the store is shared.
//
// An exclusive store's retake keeps the epoch instead when the row still holds this store's
// last raise (its epoch, its id and the exclusive mark): the lock's previous holder is this
// store, and its commits in flight, fenced with that epoch, go through rather than be spooled
// (TestRetakeWithNoOneBetweenKeepsTheEpoch). That keeps the fence's guarantee, that a daemon
// that lost its lock commits nothing once another one has taken it, because only a holder
// with an epoch of its own raise can write: an exclusive store raises at each take but such
// a retake (Open always raises), a member raises after a single daemon (exclusive) and reads
// otherwise, and a store whose raise failed holds no epoch (held stays nil) and writes
// nothing. So a process that took the lock in between and could write changed the row, and
// the retake raises (TestRetakeAfterAnotherDaemonFencesACommitInFlight); one that took it
// without a raise (it lost it again first) wrote nothing. The row is read without a lock: no
// other process changes it while this one holds the lock exclusively (a raise takes the lock
// first, and a raise in progress when its session ended is rolled back before the lock goes).
// Not the epoch alone: a database restored to a point before this store's raise may since
// hold the same epoch raised by another daemon, which may still commit with it.
func (s *Store) raiseEpoch(ctx context.Context) error {
	var epoch int64
	var raise string // the id of this raise; "" when the epoch is kept or only read
	prev := s.raised.Load()
	published := false
	publish := func() { // before the commit, which a fence that meets it waits for
		r := &ownRaise{epoch: epoch, from: epoch}
		// prev.epoch == epoch: prev's raise was not committed after all (below).
		if prev != nil && prev.epoch >= epoch-1 {
			r.from = prev.from
		}
		s.raised.Store(r)
		published = true
	}
	err := pgx.BeginFunc(ctx, s.lockConn, func(tx pgx.Tx) error {
		// The lock's own lock_timeout may be a millisecond (checkLock); a commit in flight of
		// the previous holder is worth waiting for.
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '15s'`); err != nil {
			return err
		}
		if !s.shared {
			if s.lockRaise != "" { // a retake
				var kept bool
				err := tx.QueryRow(ctx, `SELECT epoch = $1 AND exclusive AND raise_id IS NOT DISTINCT FROM $2
					FROM daemon_epoch`, s.lockEpoch, s.lockRaise).Scan(&kept)
				if err != nil || kept {
					epoch = s.lockEpoch
					return err
				}
			}
			raise = rand.Text()
			err := tx.QueryRow(ctx, `UPDATE daemon_epoch SET epoch = epoch + 1, exclusive = true, raise_id = $1
				RETURNING epoch`, raise).Scan(&epoch)
			if err == nil {
				publish()
			}
			return err
		}
		// Members fence their writes against each other per session key (Claim). They read
		// the epoch, not raise it (a raise would fence the other members), and fence their
		// commits with it: a single daemon can take the lock only once every member's hold is
		// gone, and its raise then refuses the members' commits, even before they notice. But
		// the first member to take the lock after a single daemon held it raises it: the
		// daemon may have lost its lock without noticing yet (its connection died), and its
		// commits must be refused from now on (TestLockHoldersFenceCommits). Of two members
		// that take it at once, the second's UPDATE waits for the first's and then finds the
		// row no longer exclusive.
		err := tx.QueryRow(ctx, `UPDATE daemon_epoch SET epoch = epoch + 1, exclusive = false, raise_id = NULL
			WHERE exclusive RETURNING epoch`).Scan(&epoch)
		switch {
		case err == nil:
			publish()
		case errors.Is(err, pgx.ErrNoRows):
			err = tx.QueryRow(ctx, `SELECT epoch FROM daemon_epoch`).Scan(&epoch)
		}
		return err
	})
	if err != nil {
		if !published {
			s.raised.Store(prev) // (before the caller lets go of the lock: no other raise came yet)
		}
		// Else only its COMMIT failed, and may have been committed all the same: the
		// connection broke between the COMMIT and its answer, as it may in the outage that
		// lost the lock. The raise stays this store's, so that the next one follows on from it
		// (or makes the same epoch, when it was not committed). Before, it was set back, and
		// a write fenced with the epoch before it, refused after the next retake, was told that
		// another daemon held the lock in between (TestRetakeWhoseRaiseLostItsAnswerIsNoOtherDaemon).
		return fmt.Errorf("raise the daemon lock's epoch: %w", err)
	}
	s.lockEpoch = epoch
	if raise != "" {
		s.lockRaise = raise
	}
	return nil
}

// ownRaise is a raise of the daemon lock's epoch by this store (Store.raised): to epoch, and
// from, the first of the raises of this store's own that led to it one by one (epoch when the
// raise before it was not this store's). A write fenced with an epoch before from-1 met the
// raise of another daemon too: it held the lock between this store's loss of it and its
// retake. A raise whose COMMIT failed counts as this store's (raiseEpoch): whether it was
// committed is not known. Should it not have been, and another daemon then raised the epoch
// once to the same, it is taken for this store's: a write's error then leaves that daemon
// unnamed, rather than name one that was not there in the far likelier case.
type ownRaise struct{ epoch, from int64 }

// lockIdleChecks is how many lock check intervals the server keeps the lock's session once its
// connection falls silent (endIdleLock). The check pings the connection every interval.
const lockIdleChecks = 3

// endIdleLock makes the server end the lock's session once its connection has been idle for
// lockIdle (idle_session_timeout): the lock check keeps it busy, so only a holder that stopped
// answering (its host died, or a network partition cut it off, without a FIN or RST) loses the
// lock that way, as a lease's holder does. Before, the server kept such a holder's lock for as
// long as TCP keepalive takes to notice (about two hours by default), and a daemon started in
// its place (on another host) was refused as "another agentgate daemon uses this database"
// all that time (TestSilentLockHolderLosesTheLock). Called with lockMu held or before the
// store is shared.
func (s *Store) endIdleLock(ctx context.Context) error {
	if s.lockIdle <= 0 {
		return nil
	}
	if _, err := s.lockConn.Exec(ctx, fmt.Sprintf(`SET idle_session_timeout = %d`, s.lockIdle.Milliseconds())); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42704" {
			// undefined_object: a server before PostgreSQL 14 has no idle_session_timeout. The
			// lock works as before there: kept until TCP keepalive notices a silent holder.
			return nil
		}
		return fmt.Errorf("bound the daemon lock's idle session: %w", err)
	}
	return nil
}

// unlock releases the daemon lock before it closes the lock's connection: the server ends a
// closed connection's session (and its locks) only some time after the client went, and a
// daemon restarted at once must find the lock free.
func (s *Store) unlock() {
	s.held.Store(nil) // first: no commit is fenced with a lock being let go
	if s.lockConn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = s.lockConn.Exec(ctx, fmt.Sprintf(`SELECT %s($1, hashtext(current_schema()))`, s.lockFunc("unlock")), int32(daemonLock))
		_ = s.lockConn.Close(ctx)
		s.lockConn = nil
	}
}

// lockFunc names the advisory lock function op (lock or unlock) for this store's hold of the
// daemon lock: exclusive or shared.
func (s *Store) lockFunc(op string) string {
	if s.shared {
		return "pg_advisory_" + op + "_shared"
	}
	return "pg_advisory_" + op
}

// lockHeld returns an error when a store that holds the daemon lock (exclusive or shared) has
// lost it and not taken it again (checkLock, run by Ping, does): its writes wait, spooled,
// rather than race another daemon. Otherwise it returns the fence of the lock's epoch, which
// Commit runs first in its transaction (nil for a store that holds no lock: no fence). A lock
// connection that died unnoticed still counts as held here; the fence refuses the commit once
// another daemon has taken the lock exclusively. It reads the state the last check left (held)
// and waits for no check in progress: a check's ping is of a lock held until it fails, and a
// retake's lock counts as lost until its epoch is raised (or kept: raiseEpoch).
func (s *Store) lockHeld() (fence *stmt, err error) {
	if s.lockCfg == nil {
		return nil, nil
	}
	h := s.held.Load()
	if h == nil {
		return nil, fmt.Errorf("%w: the daemon lock on the database is lost", persistence.ErrUnavailable)
	}
	return &stmt{sql: daemonFenceSQL, args: h.fenceArgs(), raised: &s.raised}, nil
}

// checkLock checks that an exclusive store still holds its lock, and takes it again on a new
// connection when the old one was lost (a restarted server, a dropped connection).
func (s *Store) checkLock(ctx context.Context) error {
	if s.lockCfg == nil {
		return nil
	}
	s.lockMu.Lock()
	defer s.lockMu.Unlock()
	return s.checkLockLocked(ctx)
}

// checkLockWithin is checkLock bounded by within from the moment it holds lockMu, and given
// up as the store closes (the lock watcher's check, and a ping's: pingLock). Its bound does not
// run while it waits for the check in progress: behind one that took most of its own (a server
// slow to answer, a retake's connection and four statements), it pinged the lock's live
// connection with little or no time left, took the ping that ran out for a dead connection and
// let the lock go, for another daemon to take (TestLockCheckBehindAnotherKeepsItsBound).
func (s *Store) checkLockWithin(within time.Duration) error {
	if s.lockCfg == nil {
		return nil
	}
	s.lockMu.Lock()
	defer s.lockMu.Unlock()
	ctx, cancel := context.WithTimeout(s.closing, within)
	defer cancel()
	return s.checkLockLocked(ctx)
}

// checkLockLocked is checkLock with lockMu held.
func (s *Store) checkLockLocked(ctx context.Context) error {
	if s.lockConn != nil {
		err := s.lockConn.Ping(ctx)
		if err == nil {
			return nil
		}
		if s.closing.Err() != nil {
			return fmt.Errorf("check the daemon lock: %w", err) // cut short by Close, which lets go of the lock
		}
		s.unlock()
	}
	err := s.lock(ctx, time.Millisecond)
	if err == nil {
		if err = s.raiseEpoch(ctx); err == nil {
			err = s.endIdleLock(ctx)
		}
		if err != nil {
			s.unlock()
		}
	}
	if err != nil {
		s.logLockLost(err)
		return fmt.Errorf("daemon lock lost: %w", err)
	}
	s.held.Store(&lockHold{epoch: s.lockEpoch, raise: s.lockRaise})
	var args []any
	if s.lockLost { // (else the check found the connection dead and took the lock again at once)
		args = []any{"lost_for", time.Since(s.lockLostAt).Round(100 * time.Millisecond)}
	}
	s.log.Warn("took the database's daemon lock again after its connection was lost", args...)
	s.lockLost, s.lockAlarmed = false, false
	if s.lockTaken != nil {
		s.lockTaken()
	}
	return nil
}

// lockLostAlarm is how long the daemon lock stays lost before its loss is logged at ERR (a human
// must act): the lines of an outage that lasts are logged once a minute (logging.LimitEvery),
// and an outage of PostgreSQL (a restart, a failover, a read-only spell) of seconds loses the
// lock's connection, whose retake (each second, lockRetakeEvery) heals it by itself. Before,
// every such outage logged an ERR for each daemon and cluster member, though it healed within
// about a second of the database answering (a soak of the binary).
const lockLostAlarm = logging.LimitEvery

// logLockLost logs a failed check or retake of the daemon lock (err): at WRN once per loss, and
// at ERR once if the loss lasts lockLostAlarm. Called with lockMu held.
func (s *Store) logLockLost(err error) {
	// A cluster member has no spool: its writes are refused meanwhile.
	if !s.lockLost {
		s.lockLost, s.lockLostAt = true, time.Now()
		if s.shared {
			s.log.Warn("lost the database's shared daemon lock; writes are refused until it is taken again", logging.Err(err))
		} else {
			s.log.Warn("lost the database's daemon lock; writes are spooled until it is taken again", logging.Err(err))
		}
		return
	}
	lost := time.Since(s.lockLostAt)
	if s.lockAlarmed || lost < lockLostAlarm {
		return
	}
	s.lockAlarmed = true
	if s.shared {
		s.log.Error("the database's shared daemon lock is still lost; writes are refused until it is taken again",
			"lost_for", lost.Round(time.Second), logging.Err(err))
	} else {
		s.log.Error("the database's daemon lock is still lost; writes are spooled until it is taken again",
			"lost_for", lost.Round(time.Second), logging.Err(err))
	}
}

// where names the database of cfg for error messages, without its password.
func where(cfg *pgxpool.Config) string {
	c := cfg.ConnConfig
	return fmt.Sprintf("(host %s port %d database %s user %s)", c.Host, c.Port, c.Database, c.User)
}

// String names the database for logs, without its password.
func (s *Store) String() string { return "postgres " + s.where }

// enter starts a call: it fails once the store is closed, and otherwise returns ctx bounded
// by the store's Timeout and the function that ends the call. A call that outlives the bound
// fails with an error that wraps persistence.ErrUnavailable (explain), so a hung server or a
// lost network spools writes instead of stopping the persistence actor.
func (s *Store) enter(ctx context.Context) (context.Context, func(), error) {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return ctx, func() {}, persistence.ErrClosed
	}
	ctx, cancel := context.WithTimeoutCause(ctx, s.timeout, s.noAnswer)
	return ctx, func() { cancel(); s.mu.RUnlock() }, nil
}

// explain returns err, or, when the call's bound (enter) ran out, an error that says so and
// wraps persistence.ErrUnavailable; an error that means the server cannot be reached or cannot
// serve now (IsUnavailable) wraps it too, so that a reader can tell "retry later" from a fault.
//
// A call whose deadline ran out (the store's bound or its caller's) also closes the pool's
// idle connections (pgxpool.Pool.Reset; those in use as they come back), so that the next call
// dials afresh. A server that does not answer at all is gone, hung or behind a network that
// drops packets: after a failover to a new primary, the pool's other connections, as old as
// this one, still lead to the old one, and each made a call wait out its deadline in turn. A
// cluster member's renewals, each given member_ttl/3, failed on one dead connection after
// another past member_ttl, and every member stopped (TestSilentServerIsLeftAtOnce).
func (s *Store) explain(ctx context.Context, err error) error {
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		s.pool.Reset()
	}
	switch {
	case err == nil || errors.Is(err, persistence.ErrUnavailable):
		return err
	case errors.Is(context.Cause(ctx), s.noAnswer):
		return fmt.Errorf("%w (%v)", s.noAnswer, err)
	case IsUnavailable(err):
		return fmt.Errorf("%w: %w", persistence.ErrUnavailable, err)
	}
	return err
}

// Ping checks that the database answers, that this store's writes are not waiting for it (a
// commit in progress for as long as ctx allows: pingCommits) and that this session can write (a
// standby, or a database set read-only, fails).
func (s *Store) Ping(ctx context.Context) error {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	defer done()
	if err := s.pingLock(ctx); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	if err := s.pingCommits(ctx); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	var readOnly string
	if err := s.again(ctx, func(c *pgxpool.Conn) error {
		return c.QueryRow(ctx, `SHOW transaction_read_only`).Scan(&readOnly)
	}); err != nil {
		return fmt.Errorf("ping: %w", s.explain(ctx, err))
	}
	if readOnly == "on" {
		return fmt.Errorf("ping: %w: the database accepts no writes (transaction_read_only is on)", persistence.ErrUnavailable)
	}
	return nil
}

// pingCommits waits for the commit in progress, if any, to end, no longer than ctx allows, and
// says that this daemon's writes are waiting for the database when ctx ends first, as the SQLite
// store's ping does when its writer stays busy. A commit waits for a lock another session holds
// (a LOCK TABLE, a migration's ALTER TABLE, a long transaction that updated the same rows), or
// for a slow server, for up to the store's Timeout (15 s; twice that when its COMMIT goes
// unanswered and its fate is asked for) before it fails and its writes are spooled, and the
// persistence actor's next batches wait behind it. Before, /readyz said ready all that time,
// the lock check and SHOW being answered at once (TestPingSaysWritesWaitForATableLock).
func (s *Store) pingCommits(ctx context.Context) error {
	start := time.Now()
	select {
	case s.commits <- struct{}{}:
		<-s.commits
		return nil
	case <-ctx.Done():
		return fmt.Errorf("no answer within %s: this daemon's writes are waiting for the database "+
			"(a lock held by another session: a LOCK TABLE, a migration, a long transaction; or a slow server): %w",
			time.Since(start).Round(time.Millisecond), persistence.ErrUnavailable)
	}
}

// lockProbe is a check of the daemon lock a Ping started (pingLock): done is closed once it has
// ended, with its error in err.
type lockProbe struct {
	done chan struct{}
	err  error
}

// pingLock checks the daemon lock for Ping, and waits for the check no longer than ctx allows.
// The check runs on a context of its own, bounded as the lock watcher's check is and ended by
// Close: a caller that gives up (a readiness probe's client that timed out or hung up) does not
// make a live lock connection look dead, which checkLock lets go of, leaving the lock free
// until the next check, for another daemon to take (TestPingWhoseCallerGaveUpKeepsTheLock).
// Called between enter and its done, so that Close waits for the check it starts (watcher).
//
// Before, Ping waited for the check itself: against a server that does not answer (hung, or
// behind a partition) each /readyz took the check's whole 5 s, after waiting for the check in
// progress (the watcher's, another probe's), which holds lockMu as long, though the daemon
// gives the store's ping 0.8 s to answer within a probe's timeout (1 s by default for
// Kubernetes): in a soak of the binary with PostgreSQL stopped by SIGSTOP for 30 s, none of
// 143 probes with a 1 s timeout was answered. A ping now answers once ctx ends, the database
// unavailable, and the pings that come while a check it started runs wait for that check, not
// behind it (TestPingAnswersWhileTheLockCheckWaits).
func (s *Store) pingLock(ctx context.Context) error {
	s.probeMu.Lock()
	p := s.probe
	if p == nil {
		p = &lockProbe{done: make(chan struct{})}
		s.probe = p
		s.watcher.Go(func() {
			p.err = s.checkLockWithin(s.lockEvery)
			s.probeMu.Lock()
			s.probe = nil
			s.probeMu.Unlock()
			close(p.done)
		})
	}
	s.probeMu.Unlock()
	select {
	case <-p.done:
		return s.explain(ctx, p.err)
	case <-ctx.Done():
		return fmt.Errorf("%w: the check of the daemon lock got no answer in time", persistence.ErrUnavailable)
	}
}

// Close waits for the calls in progress and closes the pool. It is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.cancelClosing()
	s.watcher.Wait()
	s.lockMu.Lock()
	s.unlock()
	s.lockMu.Unlock()
	s.pool.Close()
	return nil
}

// checkEncoding refuses a database whose encoding is not UTF8 (or SQL_ASCII, which stores the
// client's UTF-8 bytes as they come). Chats hold any script and emoji, which a LATIN1 or EUC_TW
// database refuses to store (every such turn's write would fail), and the pages of transcripts
// and of the outbox are cut by their texts' stored bytes (octet_length), which the daemon
// counts as UTF-8: in another encoding a page could look complete when it is not.
func checkEncoding(ctx context.Context, pool *pgxpool.Pool) error {
	var enc string
	if err := pool.QueryRow(ctx, "SHOW server_encoding").Scan(&enc); err != nil {
		return fmt.Errorf("read the database's encoding: %w", err)
	}
	if enc == "UTF8" || enc == "SQL_ASCII" {
		return nil
	}
	return fmt.Errorf("the database's encoding is %s, which cannot store every chat's text (most "+
		"scripts, emoji): create the database with UTF8 (createdb --encoding UTF8 --template template0 …; "+
		"a database's encoding cannot be changed, its rows can be copied with pg_dump and pg_restore)", enc)
}
