package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/jackc/pgx/v5"
)

// daemonLockClass is the advisory lock class of PostgreSQL's daemon lock ("agdl"), as
// persistence/postgres holds it.
const daemonLockClass = 0x6167646c

// startingServe starts `agentgate serve` on the PostgreSQL database dsn (with env besides) and
// returns its stderr and the channel of its exit; the test's end kills it if it still runs.
func startingServe(t *testing.T, dsn string, env ...string) (*testutil.Buffer, *exec.Cmd, chan error) {
	t.Helper()
	return startingServeIn(t, t.TempDir(), append(pgEnv(dsn), env...)...)
}

// startingServeIn is startingServe on the data directory dir, its store the environment's
// (SQLite in dir by default).
func startingServeIn(t *testing.T, dir string, env ...string) (*testutil.Buffer, *exec.Cmd, chan error) {
	t.Helper()
	cmd := exec.Command(MustBuild(t), "serve", "--data-dir", dir, "--http-addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), env...)
	stderr := &testutil.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		done <- <-done
		if t.Failed() {
			t.Logf("daemon stderr:\n%s", stderr.String())
		}
	})
	return stderr, cmd, done
}

// exitWithin waits up to within for the daemon's exit, and returns its error.
func exitWithin(t *testing.T, done chan error, within time.Duration) error {
	t.Helper()
	select {
	case err := <-done:
		done <- err
		return err
	case <-time.After(within):
		t.Fatalf("the daemon did not exit within %v", within)
		return nil
	}
}

// inOrder reports whether each of lines is in log, each after the one before.
func inOrder(log string, lines ...string) bool {
	at := 0
	for _, l := range lines {
		i := strings.Index(log[at:], l)
		if i < 0 {
			return false
		}
		at += i + len(l)
	}
	return true
}

// TestSIGTERMWhileTheStartWaitsForPostgresLock: a SIGTERM while the start waits for
// PostgreSQL's daemon lock (another daemon holds it: here an admin connection) ends the wait at
// once: the daemon exits 0, says it stopped while it opened the store, and wrote nothing (no
// migration, so no run recorded that the next start could count as an unclean stop). Before, the
// signal was acted on only once the wait was over: the lock's wait of 5 s ran out, and the start
// failed, exit 1, "another agentgate daemon uses this database".
func TestSIGTERMWhileTheStartWaitsForPostgresLock(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary")
	}
	ctx := t.Context()
	dsn := pgtest.NewDatabase(t)
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext(current_schema()))`, int32(daemonLockClass)); err != nil {
		t.Fatal(err)
	}
	stderr, cmd, done := startingServe(t, dsn)
	// The start waits for the lock once PostgreSQL lists its request, not granted.
	waitFor(t, 30*time.Second, func() bool {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid::bigint = $1 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
			int64(daemonLockClass)).Scan(&n)
		return err == nil && n > 0
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := exitWithin(t, done, 20*time.Second); err != nil {
		t.Errorf("exit after a SIGTERM while the start waited for the database's lock: %v, want 0", err)
	}
	log := stderr.String()
	if !inOrder(log, "signal received during the start",
		"asked to stop during the start while it opened the store (connecting to the database, waiting for its lock, or checking it and its schema); stopped without writing anything") {
		t.Errorf("the daemon's log does not say, in order, that it heard the signal and stopped while it opened the store:\n%s", log)
	}
	for _, never := range []string{"agentgate started", "another agentgate daemon uses this database", "start: open store"} {
		if strings.Contains(log, never) {
			t.Errorf("the daemon's log says %q:\n%s", never, log)
		}
	}
	var tables int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Errorf("the database holds %d tables after a stop during the wait for its lock, want none (nothing migrated or written)", tables)
	}
}

// TestSIGTERMWhileTheStartMigratesPostgres: a SIGTERM while the start migrates the schema
// (here held by an admin transaction that locks schema_migrations against writes: the migration
// applies the last file, then waits to record it) lets the
// migration finish, and the daemon stops then, before it serves: exit 0, the schema at this
// binary's version, "schema migrated" logged before the stop's line. A migration runs in one
// transaction, which a cut would roll back, to be done again from the start at the next start:
// the stop waits for it instead (a second signal exits at once, and the database rolls it back).
func TestSIGTERMWhileTheStartMigratesPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary")
	}
	ctx := t.Context()
	dsn := pgtest.NewDatabase(t)
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	// The schema one migration short of this binary's, as an older binary left it.
	latest := pgtest.SchemaOneMigrationShort(t, ctx, admin, "../../persistence/postgres/migrations")
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	// Reads pass, writes wait: the migration reads the version, applies the last file and
	// waits to record it, whatever that file changes. (Before, the test locked the table the
	// last migration indexed, and failed once a later migration touched another.)
	if _, err := tx.Exec(ctx, `LOCK TABLE schema_migrations IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	stderr, cmd, done := startingServe(t, dsn)
	waitFor(t, 30*time.Second, func() bool {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'relation' AND NOT granted
			AND relation = 'schema_migrations'::regclass`).Scan(&n)
		return err == nil && n > 0
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return strings.Contains(stderr.String(), "signal received during the start") })
	select {
	case err := <-done:
		done <- err
		t.Fatalf("the daemon exited (%v) while its migration waited, before the migration ended", err)
	default:
	}
	if err := tx.Commit(ctx); err != nil { // the migration goes on
		t.Fatal(err)
	}
	if err := exitWithin(t, done, 20*time.Second); err != nil {
		t.Errorf("exit after a SIGTERM during the start's migration: %v, want 0", err)
	}
	log := stderr.String()
	if !inOrder(log, "signal received during the start", "schema migrated",
		"asked to stop during the start while it opened the store; the schema's migrations had been applied (one that has begun finishes first), no conversation or run written; stopped before the daemon served") {
		t.Errorf("the daemon's log does not say, in order, the signal, the migration's end and the stop:\n%s", log)
	}
	if strings.Contains(log, "agentgate started") {
		t.Errorf("the daemon started after a SIGTERM during its start:\n%s", log)
	}
	var version int
	if err := admin.QueryRow(ctx, `SELECT max(version) FROM schema_migrations`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version != latest {
		t.Errorf("schema version %d after a stop during the migration, want %d (the migration finished)", version, latest)
	}
	var run string
	if err := admin.QueryRow(ctx, `SELECT run FROM daemon_run`).Scan(&run); err != nil {
		t.Fatal(err)
	}
	if run != "" {
		t.Errorf("run %q recorded after a stop during the start's migration, want none (the next start would count an unclean stop)", run)
	}
}

// TestSIGTERMWhileTheStartsMigrationFailsForReal: a SIGTERM while the start migrates
// PostgreSQL's schema (held as in TestSIGTERMWhileTheStartMigratesPostgres: the migration
// applies the last file, then waits to record it) lets the migration go on, and a migration
// that then fails for real (here the admin transaction that held it records the same version
// first, and the migration's INSERT meets that row: 23505) is no stop: the daemon exits 1 with
// the failure, and says neither that it stopped nor that the migrations had been applied. Only
// an error that the stop caused is the stop's (the store's endedByCtx); the migration, which
// the stop does not cut, fails with its own. The migration rolled back: the schema's tables
// are those it had.
func TestSIGTERMWhileTheStartsMigrationFailsForReal(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary")
	}
	ctx := t.Context()
	dsn := pgtest.NewDatabase(t)
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	latest := pgtest.SchemaOneMigrationShort(t, ctx, admin, "../../persistence/postgres/migrations")
	tables := func() (n int) {
		t.Helper()
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := tables()
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE schema_migrations IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	stderr, cmd, done := startingServe(t, dsn)
	waitFor(t, 30*time.Second, func() bool {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'relation' AND NOT granted
			AND relation = 'schema_migrations'::regclass`).Scan(&n)
		return err == nil && n > 0
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return strings.Contains(stderr.String(), "signal received during the start") })
	// The version the migration records, recorded first: its INSERT fails once it goes on.
	if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES ($1, 0)`, latest); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = exitWithin(t, done, 20*time.Second)
	if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("exit after a SIGTERM during the start's migration, which then failed: %v, want exit status 1", err)
	}
	log := stderr.String()
	if !inOrder(log, "signal received during the start", "start: open store", "duplicate key") {
		t.Errorf("the daemon's log does not say, in order, the signal and the migration's failure:\n%s", log)
	}
	for _, never := range []string{"asked to stop during the start while it opened the store", "schema migrated", "agentgate started"} {
		if strings.Contains(log, never) {
			t.Errorf("the daemon's log says %q, though its migration failed:\n%s", never, log)
		}
	}
	if after := tables(); after != before {
		t.Errorf("%d tables in the schema after the failed migration, want the %d it had (rolled back)", after, before)
	}
}
