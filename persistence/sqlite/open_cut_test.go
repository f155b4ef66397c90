package sqlite

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestOpenEndedWhileItWaitsForTheWriteLockStops: an Open whose ctx ends (the daemon's stop)
// while its migration waits for the database's write lock, which another process holds (a
// sqlite3 shell in a transaction, an offline admin command, a backup), returns at once with
// ctx's error, not after the writer's busy timeout (5 s) with "database is locked", and leaves
// the database as it was: opened again once the lock is let go of, it is at this binary's
// schema and takes a write. The lock is let go of only after Open returned, so an Open that
// waited out the busy timeout fails on the error's kind.
func TestOpenEndedWhileItWaitsForTheWriteLockStops(t *testing.T) {
	// In a bubble: modernc.org/sqlite's busy handler sleeps on Go timers, so synctest.Wait
	// returns once Open waits for the lock (every goroutine of the bubble durably blocked), and
	// the bubble's clock says how long Open took without a real wait.
	testutil.BubbleTest(t, 2*time.Minute, "a wait on the store's mutex behind the busy handler's sleep holds the bubble's clock still", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		s, err := Open(t.Context(), path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		unlock := testutil.LockSQLite(t, path)

		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		type opened struct {
			s   *Store
			err error
		}
		done := make(chan opened, 1)
		start := time.Now()
		go func() {
			s, err := Open(ctx, path, Options{})
			done <- opened{s, err}
		}()
		synctest.Wait() // Open sleeps in the busy handler, waiting for the lock
		select {
		case r := <-done:
			t.Fatalf("Open returned (%v) before it was cut, while another connection held the write lock", r.err)
		default:
		}
		cancel()
		r := <-done
		took := time.Since(start)
		unlock()
		if r.err == nil {
			r.s.Close()
			t.Fatal("Open cut while it waited for the write lock returned a store")
		}
		if !errors.Is(r.err, context.Canceled) || errors.Is(r.err, ErrMigratedThenEnded) || errors.Is(r.err, persistence.ErrUnavailable) {
			t.Errorf("Open cut while it waited for the write lock = %v, want ctx's error (context.Canceled), not the lock's", r.err)
		}
		if took >= time.Second {
			t.Errorf("Open cut while it waited for the write lock returned after %v, want at once (not the busy timeout)", took)
		}

		s, err = Open(t.Context(), path, Options{})
		if err != nil {
			t.Fatalf("Open after the cut one and the lock's release = %v", err)
		}
		defer s.Close()
		current, latest, err := schemaVersions(t.Context(), s.writer)
		if err != nil || current != latest {
			t.Errorf("schema version after a cut Open = %d, %v; want %d", current, err, latest)
		}
		if err := s.Commit(t.Context(), [][]persistence.Op{{&persistence.SetTitle{SessionID: "s1", Title: "t"}}})[0]; err != nil {
			t.Errorf("a commit after a cut Open = %v", err)
		}
	})
}

// TestOpenEndedAsItTakesTheWriteLockIsAStop: an admin command's Open (MustWrite) whose ctx
// ends as its check holds the write lock, between the BEGIN IMMEDIATE and the ROLLBACK, returns
// ctx's error, a stop's: nothing was written. Before, the check's transaction was begun with
// ctx, which database/sql rolls back once ctx ends; the check's ROLLBACK then failed with
// sql.ErrTxDone, no error of ctx's, and Open returned it as a real failure ("sql: transaction
// has already been committed or rolled back").
func TestOpenEndedAsItTakesTheWriteLockIsAStop(t *testing.T) {
	// In a bubble: synctest.Wait returns once database/sql's goroutine that rolls back a
	// transaction whose ctx ended has done so (a transaction begun with a ctx that has not
	// ended leaves it waiting), so that the check's ROLLBACK comes after it, as it may outside
	// a test.
	testutil.BubbleTest(t, 2*time.Minute, "a wait on a mutex behind a goroutine that sleeps on the bubble's clock", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		s, err := Open(t.Context(), path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		cut := false
		s, err = Open(ctx, path, Options{NoMigrate: true, MustWrite: true, openStep: func(step string) {
			if step == "write lock taken" {
				cancel()
				synctest.Wait()
				cut = true
			}
		}})
		if err == nil {
			s.Close()
			t.Fatal("Open cut as it held the write lock returned a store")
		}
		if !cut {
			t.Fatalf("Open = %v before it took the write lock: the test does not test", err)
		}
		if !errors.Is(err, context.Canceled) || !endedByCtx(err) {
			t.Errorf("Open cut as it held the write lock = %v, want ctx's error (context.Canceled): a stop's", err)
		}
	})
}

// TestOpenEndedWhileItMigratesFinishesTheMigration: an Open whose ctx ends once its migration
// has begun (here as it logs the migration it applies) does not cut it: the migration runs to
// its end, and Open returns ErrMigratedThenEnded with ctx's error, no store. A cut would roll
// the whole migration back (database/sql rolls a transaction back once its BeginTx's ctx
// ends), to be done again from the start at the next Open. The database is at this binary's
// schema then, and opens again without migrating.
func TestOpenEndedWhileItMigratesFinishesTheMigration(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agentgate.db")
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	latest := ms[len(ms)-1].Version
	mustSchemaAt(t, path, latest-1).Close()

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs := &testutil.Buffer{}
	log := slog.New(onLine{slog.NewTextHandler(logs, nil), "migrating the schema", cancel})
	s, err := Open(ctx, path, Options{Logger: log})
	if err == nil {
		s.Close()
		t.Fatalf("Open cut during its migration returned a store; log:\n%s", logs.String())
	}
	if !errors.Is(err, ErrMigratedThenEnded) || !errors.Is(err, context.Canceled) {
		t.Errorf("Open cut during its migration = %v, want ErrMigratedThenEnded and context.Canceled", err)
	}
	if !strings.Contains(logs.String(), "schema migrated") {
		t.Errorf("the log of an Open cut during its migration does not say the migration ended:\n%s", logs.String())
	}

	logs = &testutil.Buffer{}
	s, err = Open(t.Context(), path, Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatalf("Open after the cut one = %v", err)
	}
	defer s.Close()
	if strings.Contains(logs.String(), "migrating the schema") {
		t.Errorf("the Open after one cut during its migration migrated again:\n%s", logs.String())
	}
	current, _, err := schemaVersions(t.Context(), s.writer)
	if err != nil || current != latest {
		t.Errorf("schema version after an Open cut during its migration = %d, %v; want %d", current, err, latest)
	}
	if err := s.Commit(t.Context(), [][]persistence.Op{{&persistence.SetTitle{SessionID: "s1", Title: "t"}}})[0]; err != nil {
		t.Errorf("a commit after an Open cut during its migration = %v", err)
	}
}

// onLine is a slog.Handler that calls f when a record whose message is msg is handled, before
// h handles it.
type onLine struct {
	slog.Handler
	msg string
	f   func()
}

func (o onLine) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == o.msg {
		o.f()
	}
	return o.Handler.Handle(ctx, r)
}

// TestOpenEndedWhileItCatchesUpTheSearchIndexWarnsNothing: an Open whose ctx ends (the
// daemon's stop) during its catch-up of the search index (here while the catch-up's
// transaction waits for the write lock another process took just after the migration) logs no
// warning: the cut pass lost nothing (its rows wait for the next pass: the store's Close, or
// the next Open), and a stop must log the stop only. Before, it logged "WRN fts index pass
// failed; messages wait unindexed" with "context canceled" at every such stop. The store
// opens all the same, and its Close indexes what waits.
func TestOpenEndedWhileItCatchesUpTheSearchIndexWarnsNothing(t *testing.T) {
	testutil.BubbleTest(t, 2*time.Minute, "a wait on the store's mutex behind the busy handler's sleep holds the bubble's clock still", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		ms, err := migrations()
		if err != nil {
			t.Fatal(err)
		}
		mustSchemaAt(t, path, ms[len(ms)-1].Version-1).Close()

		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var unlock func()
		logs := &testutil.Buffer{}
		// Once the migration has committed, another process takes the write lock: the
		// catch-up's BEGIN IMMEDIATE waits for it, in the busy handler.
		log := slog.New(onLine{slog.NewTextHandler(logs, nil), "schema migrated", func() { unlock = testutil.LockSQLite(t, path) }})
		type opened struct {
			s   *Store
			err error
		}
		done := make(chan opened, 1)
		go func() {
			s, err := Open(ctx, path, Options{Logger: log})
			done <- opened{s, err}
		}()
		synctest.Wait() // the catch-up waits for the write lock
		select {
		case r := <-done:
			t.Fatalf("Open returned (%v) before it was cut, while another connection held the write lock; log:\n%s", r.err, logs.String())
		default:
		}
		cancel()
		r := <-done
		if unlock == nil {
			t.Fatalf("the migration was not logged: the write lock was never taken; log:\n%s", logs.String())
		}
		unlock()
		if r.err != nil {
			t.Fatalf("Open cut during its search index catch-up = %v, want a store (the catch-up never stops it)", r.err)
		}
		if err := r.s.Close(); err != nil {
			t.Errorf("Close of the store whose catch-up was cut = %v", err)
		}
		for _, alarm := range []string{"level=WARN", "level=ERROR"} {
			if strings.Contains(logs.String(), alarm) {
				t.Errorf("an Open cut during its search index catch-up logged a %s line:\n%s", alarm, logs.String())
			}
		}
	})
}

// TestOpenEndedWhileItChecksThePagesIsNoDamage: an Open whose ctx ends (the daemon's stop)
// during its check of every page (PRAGMA quick_check; here as it logs the check of a large
// database) returns ctx's error, which says nothing of a damage: not "the database is
// corrupt", no Options.Corrupt, no line at WRN or ERR. The database is as it was, and opens.
func TestOpenEndedWhileItChecksThePagesIsNoDamage(t *testing.T) {
	defer func(was int64) { largeDatabase = was }(largeDatabase)
	largeDatabase = 1 // every database's check is logged: the line the cut hangs on
	path := filepath.Join(t.TempDir(), "agentgate.db")
	s, err := Open(t.Context(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	storetest.MustCommit(t, s, &persistence.SetTitle{SessionID: "s1", Title: "t"})
	s.Close()

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	logs := &testutil.Buffer{}
	log := slog.New(onLine{slog.NewTextHandler(logs, nil), "checking every page of the database before anything writes to it (PRAGMA quick_check): " +
		"about a second per GB, more from a cold disk", cancel})
	corrupt := false
	s, err = Open(ctx, path, Options{Logger: log, Corrupt: func() { corrupt = true }})
	if err == nil {
		s.Close()
		t.Fatalf("Open cut during its check of the pages returned a store; log:\n%s", logs.String())
	}
	if !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "corrupt") || errors.Is(err, ErrMigratedThenEnded) {
		t.Errorf("Open cut during its check of the pages = %v, want ctx's error (context.Canceled), no damage", err)
	}
	if corrupt {
		t.Error("Open cut during its check of the pages called Options.Corrupt")
	}
	for _, alarm := range []string{"level=WARN", "level=ERROR"} {
		if strings.Contains(logs.String(), alarm) {
			t.Errorf("an Open cut during its check of the pages logged a %s line:\n%s", alarm, logs.String())
		}
	}
	if s, err = Open(t.Context(), path, Options{}); err != nil {
		t.Fatalf("Open after the cut one = %v", err)
	}
	s.Close()
}

// TestOpenEndedAfterItsMigrationSaysWhetherItMigrated: an Open whose ctx ends (the daemon's
// stop) after its migration returns ErrMigratedThenEnded (and ctx's error) when it applied
// migrations, which stay applied, whether the stop landed right after the migration's commit
// or as the open went on after its check of ctx (to its write statements and its readers), and
// ctx's error alone when there was nothing to migrate (its transaction wrote nothing), wherever
// the stop landed: the daemon's line says which. Before, a stop that landed after that check
// returned ctx's error alone, and the daemon said it had written nothing though the migration
// had; and one during the transaction with nothing to migrate returned ErrMigratedThenEnded,
// and the daemon said the migrations had finished first. Opened again, the database is at this
// binary's schema, and Migrated says what that Open applied.
func TestOpenEndedAfterItsMigrationSaysWhetherItMigrated(t *testing.T) {
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	latest := ms[len(ms)-1].Version
	for _, tc := range []struct {
		name     string
		schema   int // -1: no database yet
		step     string
		migrated bool
	}{
		{"one migration to apply, stopped right after it", latest - 1, "migrated", true},
		{"one migration to apply, stopped as the open goes on", latest - 1, "prepare", true},
		{"a new database, stopped right after its migrations", -1, "migrated", true},
		{"a new database, stopped as the open goes on", -1, "prepare", true},
		{"nothing to migrate, stopped right after the migration's transaction", latest, "migrated", false},
		{"nothing to migrate, stopped as the open goes on", latest, "prepare", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agentgate.db")
			if tc.schema >= 0 {
				mustSchemaAt(t, path, tc.schema).Close()
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			s, err := Open(ctx, path, Options{openStep: func(step string) {
				if step == tc.step {
					cancel()
				}
			}})
			if err == nil {
				s.Close()
				t.Fatal("Open cut after its migration returned a store")
			}
			if !errors.Is(err, context.Canceled) || errors.Is(err, ErrMigratedThenEnded) != tc.migrated {
				t.Errorf("Open cut after its migration = %v, want context.Canceled, and ErrMigratedThenEnded: %v", err, tc.migrated)
			}

			s, err = Open(t.Context(), path, Options{})
			if err != nil {
				t.Fatalf("Open after the cut one = %v", err)
			}
			defer s.Close()
			if got := s.Migrated(); got != 0 {
				t.Errorf("Migrated() of the Open after the cut one = %d, want 0 (the cut one migrated, or there was nothing to)", got)
			}
			if current, _, err := schemaVersions(t.Context(), s.writer); err != nil || current != latest {
				t.Errorf("schema version after the cut Open = %d, %v; want %d", current, err, latest)
			}
		})
	}
	// A real failure that the stop meets is Open's error, not the stop's: a migration that
	// fails (a column it adds is there already), the stop coming as it returns; and the
	// readers that cannot open the database (its file deleted once the migration committed),
	// the stop coming as the open returns their error.
	for _, tc := range []struct {
		name, step, cut string // the step that breaks the database (none: before Open), the one the stop comes at
		want            string
	}{
		{"a real failure of the migration", "", "migrated", "duplicate column name"},
		{"a real failure after the migration", "prepare", "failed", "unable to open"},
	} {
		t.Run(tc.name+" that a stop meets wins", func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agentgate.db")
			raw := mustSchemaAt(t, path, latest-1)
			if tc.step == "" {
				mustExec(t, raw, `ALTER TABLE sessions ADD COLUMN reset_due_at INTEGER`) // what 0019 adds
			}
			raw.Close()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			s, err := Open(ctx, path, Options{openStep: func(step string) {
				switch step {
				case tc.step:
					if err := os.Remove(path); err != nil {
						t.Error(err)
					}
				case tc.cut:
					cancel()
				}
			}})
			if err == nil {
				s.Close()
				t.Fatal("Open that failed returned a store")
			}
			if errors.Is(err, context.Canceled) || errors.Is(err, ErrMigratedThenEnded) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Open that failed as a stop came = %v, want its failure (%q), neither context.Canceled nor ErrMigratedThenEnded", err, tc.want)
			}
		})
	}
	t.Run("Migrated of an Open that went through", func(t *testing.T) {
		older := filepath.Join(t.TempDir(), "agentgate.db")
		mustSchemaAt(t, older, latest-1).Close()
		path := filepath.Join(t.TempDir(), "agentgate.db")
		for _, c := range []struct {
			what, path string
			want       int
		}{{"a new database", path, len(ms)}, {"the same again", path, 0}, {"one migration short", older, 1}} {
			s, err := Open(t.Context(), c.path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got := s.Migrated(); got != c.want {
				t.Errorf("Migrated() of %s = %d, want %d", c.what, got, c.want)
			}
			s.Close()
		}
	})
}

// TestCloseAfterACutCatchUpLeavesItToTheNextOpen: the Close of a store whose Open's search index
// catch-up a stop cut (here while it waited for the write lock another process took just after
// the migration) leaves the messages waiting for the index to the next Open, which indexes them
// all: it does not do the catch-up the stop cut again, under the stop. Before, the Close waited
// for the write lock up to the busy timeout (5 s), then warned "fts index pass failed".
func TestCloseAfterACutCatchUpLeavesItToTheNextOpen(t *testing.T) {
	testutil.BubbleTest(t, 2*time.Minute, "a wait on the store's mutex behind the busy handler's sleep holds the bubble's clock still", func(t *testing.T) {
		s := MustOpen(t, never)
		path := s.Path()
		storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
		storetest.MustCommit(t, s, msgs("s1", 1, 5, "waiting")...)
		abandon(t, s) // as a crash: the five wait for the index

		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var unlock func()
		logs := &testutil.Buffer{}
		opts := never
		opts.Logger = slog.New(slog.NewTextHandler(logs, nil))
		opts.openStep = func(step string) {
			if step == "migrated" { // another process takes the write lock: the catch-up waits for it
				unlock = testutil.LockSQLite(t, path)
			}
		}
		type opened struct {
			s   *Store
			err error
		}
		done := make(chan opened, 1)
		go func() {
			s, err := Open(ctx, path, opts)
			done <- opened{s, err}
		}()
		synctest.Wait() // the catch-up waits for the write lock
		cancel()
		r := <-done
		if r.err != nil {
			unlock()
			t.Fatalf("Open cut during its search index catch-up = %v, want a store", r.err)
		}
		start := time.Now()
		err := r.s.Close() // the lock still held
		took := time.Since(start)
		unlock()
		if err != nil {
			t.Errorf("Close after a cut catch-up = %v", err)
		}
		if took >= time.Second {
			t.Errorf("Close after a cut catch-up, with the write lock held by another process, took %v; want at once", took)
		}
		for _, alarm := range []string{"level=WARN", "level=ERROR"} {
			if strings.Contains(logs.String(), alarm) {
				t.Errorf("the Open cut during its catch-up and its Close logged a %s line:\n%s", alarm, logs.String())
			}
		}
		if w, n, maxID := indexState(t, path); n != 0 || w >= maxID {
			t.Errorf("after the Close: watermark %d (max id %d), %d rows indexed; want the five waiting", w, maxID, n)
		}

		logs = &testutil.Buffer{}
		opts.Logger, opts.openStep = slog.New(slog.NewTextHandler(logs, nil)), nil
		s, err = Open(t.Context(), path, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if !strings.Contains(logs.String(), "search index caught up") || !strings.Contains(logs.String(), "rows=5") {
			t.Errorf("the next Open did not catch the search index up on the five:\n%s", logs.String())
		}
		if got, err := s.Search(t.Context(), "waiting", 10); err != nil || len(got) != 5 {
			t.Errorf("Search(waiting) after the next Open = %d rows, %v; want 5", len(got), err)
		}
	})
}
