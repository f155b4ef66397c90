package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// MustOpen opens a store on a fresh database of the test server, closed when the test ends.
func MustOpen(t testing.TB) (*Store, string) {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	s, err := Open(context.Background(), dsn, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, dsn
}

// mustConn opens a plain connection to a store's database, bypassing the Store.
func mustConn(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) persistence.Store {
		s, _ := MustOpen(t)
		return s
	})
}

var t0 = time.Unix(1_700_000_000, 0)

func newSession(id, key string) persistence.Session {
	return persistence.Session{ID: id, Key: key, Platform: "http", ChatType: "dm", ChatID: "c-" + key,
		UserID: "u", Profile: "main", StartedAt: t0, LastActivityAt: t0}
}

func TestIdentityImmutable(t *testing.T) {
	s, dsn := MustOpen(t)
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
	c := mustConn(t, dsn)
	for _, col := range []string{"key", "chat_id", "user_id", "profile"} {
		_, err := c.Exec(context.Background(), `UPDATE sessions SET `+col+` = 'other' WHERE id = 's1'`)
		if err == nil || !strings.Contains(err.Error(), "session identity is immutable") {
			t.Errorf("UPDATE sessions SET %s: error = %v, want the identity trigger's", col, err)
		}
	}
	got, err := s.Session(context.Background(), "s1")
	if err != nil || got.Key != "k1" || got.ChatID != "c-k1" {
		t.Errorf("Session(s1) = %+v, %v; want its identity unchanged", got, err)
	}
}

// TestMigrations: opening a database again applies nothing twice, members opening one database
// at once all succeed, and a database migrated by a newer binary is refused.
func TestMigrations(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			s, err := Open(ctx, dsn, Options{})
			if err == nil {
				err = s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent Open %d: %v", i, err)
		}
	}
	c := mustConn(t, dsn)
	var n, max int
	if err := c.QueryRow(ctx, `SELECT COUNT(*), MAX(version) FROM schema_migrations`).Scan(&n, &max); err != nil {
		t.Fatal(err)
	}
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if n != len(ms) || max != ms[len(ms)-1].Version {
		t.Errorf("schema_migrations has %d rows up to %d, want %d up to %d", n, max, len(ms), ms[len(ms)-1].Version)
	}
	if _, err := c.Exec(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES (9999, 0)`); err != nil {
		t.Fatal(err)
	}
	_, err = Open(ctx, dsn, Options{})
	if err == nil || !strings.Contains(err.Error(), "newer than this binary") {
		t.Errorf("Open of a newer schema: error = %v, want it refused", err)
	}
}

// TestMigrationOfAnOlderSchemaIsLogged: opening a database an older binary migrated applies
// the migrations it lacks, each logged, and logs the upgrade's versions and how long it took, as
// README says of both stores. Before, the PostgreSQL store logged no end of an upgrade.
func TestMigrationOfAnOlderSchemaIsLogged(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	c := mustConn(t, dsn)
	if _, err := c.Exec(ctx, `CREATE TABLE schema_migrations (version INTEGER NOT NULL PRIMARY KEY, applied_at BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	older := ms[:len(ms)-1] // as the binary before the latest migration left it
	for _, m := range older {
		if _, err := c.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		if _, err := c.Exec(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES ($1, 0)`, m.Version); err != nil {
			t.Fatal(err)
		}
	}
	var logs testutil.Buffer
	s, err := Open(ctx, dsn, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	latest := ms[len(ms)-1]
	for _, want := range []string{
		`msg="migrating the schema" migration=` + latest.Name,
		fmt.Sprintf(`msg="schema migrated" from=%d to=%d took=`, older[len(older)-1].Version, latest.Version),
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log:\n%s\nwant a line with %s", logs.String(), want)
		}
	}
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	_, err := Open(ctx, "postgres://ann:s3cret@[::1", Options{})
	if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "cannot be parsed") {
		t.Errorf("Open(bad dsn) error = %v, want a parse error without the password", err)
	}
	// A socket directory where no server listens: the error names the place, not the password.
	dir := t.TempDir()
	_, err = Open(ctx, "host="+dir+" port=5432 user=ann password=s3cret dbname=x connect_timeout=5", Options{})
	if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), dir) {
		t.Errorf("Open(no server) error = %v, want one naming %s without the password", err, dir)
	}
	if err != nil && !IsUnavailable(err) {
		t.Errorf("IsUnavailable(%v) = false, want true: no server is unavailability", err)
	}
}

// TestOpenRefusesADatabaseNotInUTF8: a database in another encoding cannot store every chat's
// text, and the pages of transcripts and of the outbox, cut by their stored bytes, could look
// complete when they are not: Open refuses it, saying how to make one that works; UTF8 and
// SQL_ASCII (bytes stored as sent) open.
func TestOpenRefusesADatabaseNotInUTF8(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct{ encoding, refused string }{
		{"LATIN1", "the database's encoding is LATIN1"},
		{"SQL_ASCII", ""},
		{"UTF8", ""},
	} {
		t.Run(tc.encoding, func(t *testing.T) {
			dsn := pgtest.NewDatabaseWith(t, "ENCODING '"+tc.encoding+"' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
			s, err := Open(ctx, dsn, Options{})
			if err == nil {
				s.Close()
			}
			switch {
			case tc.refused == "" && err != nil:
				t.Errorf("Open(a %s database) = %v, want it open", tc.encoding, err)
			case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused) || !strings.Contains(err.Error(), "--encoding UTF8")):
				t.Errorf("Open(a %s database) = %v, want it refused: %q, and how to create one in UTF8", tc.encoding, err, tc.refused)
			}
		})
	}
}

// TestUnavailableWhenTheConnectionsDie: a Commit on a database whose connections were terminated
// and which accepts no new ones fails every group with persistence.ErrUnavailable, so the
// persistence actor spools the writes instead of dropping them.
func TestUnavailableWhenTheConnectionsDie(t *testing.T) {
	s, dsn := MustOpen(t)
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
	ctx := context.Background()
	pgtest.Cut(t, dsn)
	errs := s.Commit(ctx, [][]persistence.Op{
		{&persistence.SetTitle{SessionID: "s1", Title: "a"}},
		{&persistence.SetTitle{SessionID: "s1", Title: "b"}},
	})
	for i, err := range errs {
		if !errors.Is(err, persistence.ErrUnavailable) {
			t.Errorf("group %d: error = %v, want ErrUnavailable", i, err)
		}
	}
	_, err := s.PruneSessions(ctx, time.Now(), 0)
	if !errors.Is(err, persistence.ErrUnavailable) || strings.Count(err.Error(), persistence.ErrUnavailable.Error()) != 1 {
		t.Errorf("PruneSessions: error = %v, want ErrUnavailable (said once)", err)
	}
}

// TestFailingGroupInALargeBatch: a failing group in a large batch fails alone, and every other
// group of the batch is committed (the savepoint retry).
func TestFailingGroupInALargeBatch(t *testing.T) {
	s, _ := MustOpen(t)
	ctx := context.Background()
	var groups [][]persistence.Op
	for i := range 200 {
		id := "s" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		groups = append(groups, []persistence.Op{&persistence.CreateSession{Session: newSession(id, "k"+id)}})
	}
	// Group 100 appends a message to a session that does not exist (a foreign key violation in
	// the database, not a check Commit can make first).
	groups[100] = append(groups[100], &persistence.AppendMessage{Message: persistence.Message{
		SessionID: "missing", Seq: 1, Role: persistence.RoleAssistant, Content: "x", Active: true}})
	errs := s.Commit(ctx, groups)
	for i, err := range errs {
		if (err != nil) != (i == 100) {
			t.Errorf("group %d: error = %v", i, err)
		}
	}
	list, err := s.ListSessions(ctx, persistence.ListFilter{Limit: 500})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 0 {
		t.Errorf("ListSessions = %d rows, want 0 (no routes)", len(list))
	}
	for i, g := range groups {
		id := g[0].(*persistence.CreateSession).Session.ID
		_, err := s.Session(ctx, id)
		if wantGone := i == 100; errors.Is(err, persistence.ErrNotFound) != wantGone {
			t.Errorf("Session(%s) of group %d: error = %v", id, i, err)
		}
	}
}

// TestExclusive: an exclusive store keeps a second daemon off its database; one that lost its
// lock to another process refuses writes (ErrUnavailable, so they are spooled) and is not
// ready, until it has the lock again.
func TestExclusive(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	a, err := Open(ctx, dsn, Options{Exclusive: true})
	if err != nil {
		t.Fatalf("Open A: %v", err)
	}
	defer a.Close()
	if _, err := Open(ctx, dsn, Options{Exclusive: true, LockWait: 50 * time.Millisecond}); !errors.Is(err, persistence.ErrLocked) {
		t.Fatalf("Open B while A runs: error = %v, want ErrLocked", err)
	}
	shared, err := Open(ctx, dsn, Options{}) // not exclusive: a tool reading the database
	if err != nil {
		t.Fatalf("Open a non-exclusive store next to A: %v", err)
	}
	shared.Close()

	// A's lock connection dies and B takes the lock: A must stop writing.
	c := mustConn(t, dsn)
	if _, err := c.Exec(ctx, `SELECT pg_terminate_backend(l.pid) FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.granted`); err != nil {
		t.Fatal(err)
	}
	b, err := Open(ctx, dsn, Options{Exclusive: true})
	if err != nil {
		t.Fatalf("Open B after A lost its lock: %v", err)
	}
	if err := a.Ping(ctx); err == nil {
		t.Error("A.Ping while B holds the lock = nil, want an error")
	}
	errs := a.Commit(ctx, [][]persistence.Op{{&persistence.CreateSession{Session: newSession("s1", "k1")}}})
	if !errors.Is(errs[0], persistence.ErrUnavailable) {
		t.Errorf("A.Commit without the lock: error = %v, want ErrUnavailable", errs[0])
	}
	if _, err := b.Session(ctx, "s1"); !errors.Is(err, persistence.ErrNotFound) {
		t.Errorf("A's write reached the database: Session(s1) error = %v", err)
	}
	// B stops: A takes the lock again at its next Ping and writes again.
	b.Close()
	if err := a.Ping(ctx); err != nil {
		t.Fatalf("A.Ping after B stopped: %v", err)
	}
	storetest.MustCommit(t, a, &persistence.CreateSession{Session: newSession("s1", "k1")})
}

// TestSharedAndExclusiveExcludeEachOther: cluster members (Shared) open one database together,
// but a single daemon (Exclusive) is kept off it while they run, and they are kept off while it
// runs. Before, members took no lock, so a single daemon started next to a cluster (or a member
// next to a single daemon) ran the same sessions with it.
func TestSharedAndExclusiveExcludeEachOther(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	a, err := Open(ctx, dsn, Options{Shared: true})
	if err != nil {
		t.Fatalf("Open member A: %v", err)
	}
	b, err := Open(ctx, dsn, Options{Shared: true, LockWait: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("Open member B next to member A: %v", err)
	}
	if _, err := Open(ctx, dsn, Options{Exclusive: true, LockWait: 50 * time.Millisecond}); !errors.Is(err, persistence.ErrLocked) {
		t.Fatalf("Open a single daemon while members run: error = %v, want ErrLocked", err)
	}
	storetest.MustCommit(t, a, &persistence.CreateSession{Session: newSession("s1", "k1")})
	a.Close()
	if _, err := Open(ctx, dsn, Options{Exclusive: true, LockWait: 50 * time.Millisecond}); !errors.Is(err, persistence.ErrLocked) {
		t.Fatalf("Open a single daemon while member B runs: error = %v, want ErrLocked", err)
	}
	b.Close()
	single, err := Open(ctx, dsn, Options{Exclusive: true})
	if err != nil {
		t.Fatalf("Open a single daemon once the members stopped: %v", err)
	}
	defer single.Close()
	_, err = Open(ctx, dsn, Options{Shared: true, LockWait: 50 * time.Millisecond})
	if !errors.Is(err, persistence.ErrLocked) {
		t.Fatalf("Open a member while a single daemon runs: error = %v, want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), "a single agentgate daemon (not a cluster member) uses this database") {
		t.Errorf("Open a member while a single daemon runs: error %q does not say why", err)
	}
}

// TestLockHoldersFenceCommits: a daemon whose lock connection died commits nothing once another
// daemon has taken the lock, even before its own check of the lock (LockCheckInterval, an hour
// here) has noticed: every commit checks, in its transaction, that the lock's epoch is still
// the one this daemon took. Before, it went on committing next to the other daemon until that
// check ran (5 s by default).
//
// Cluster members (Shared) fence theirs the same way with the epoch they read: when every
// member's hold is gone (a restarted server ends their lock connections) and a single daemon
// takes the lock before they notice, its raise refuses their commits at once.
//
// And the other way round: a cluster member that takes the lock shared after a single daemon
// lost it (a misconfigured member, started again and again by its supervisor, gets in when the
// server restarts) raises the epoch the daemon took, which refuses the daemon's commits at
// once. Before, members only read the epoch: the daemon's commits passed their fence, and it
// wrote the same sessions as the member until its next check of the lock.
func TestLockHoldersFenceCommits(t *testing.T) {
	exclusive := Options{Exclusive: true, LockCheckInterval: time.Hour}
	shared := Options{Shared: true, LockCheckInterval: time.Hour}
	for _, c := range []struct {
		name string
		a, b Options
	}{
		{"exclusive", exclusive, exclusive},
		{"shared", shared, exclusive},
		{"a member after a single daemon", exclusive, shared},
	} {
		t.Run(c.name, func(t *testing.T) { testLockHolderFencesCommits(t, c.a, c.b) })
	}
}

func testLockHolderFencesCommits(t *testing.T, opts, bOpts Options) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	a, err := Open(ctx, dsn, opts)
	if err != nil {
		t.Fatalf("Open A: %v", err)
	}
	defer a.Close()
	storetest.MustCommit(t, a, &persistence.CreateSession{Session: newSession("s0", "k0")})

	c := mustConn(t, dsn)
	if _, err := c.Exec(ctx, `SELECT pg_terminate_backend(l.pid) FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.granted`); err != nil {
		t.Fatal(err)
	}
	b, err := Open(ctx, dsn, bOpts)
	if err != nil {
		t.Fatalf("Open B after A lost its lock: %v", err)
	}
	defer b.Close()
	errs := a.Commit(ctx, [][]persistence.Op{{&persistence.CreateSession{Session: newSession("s1", "k1")}}})
	if !errors.Is(errs[0], persistence.ErrUnavailable) {
		t.Errorf("A.Commit after B took the lock: error = %v, want ErrUnavailable", errs[0])
	}
	if _, err := b.Session(ctx, "s1"); !errors.Is(err, persistence.ErrNotFound) {
		t.Errorf("A's write reached the database while B held the lock: Session(s1) error = %v", err)
	}
	if _, err := a.PruneSessions(ctx, t0.Add(time.Hour), 0); !errors.Is(err, persistence.ErrUnavailable) ||
		strings.Count(err.Error(), persistence.ErrUnavailable.Error()) != 1 {
		t.Errorf("A.PruneSessions after B took the lock: error = %v, want ErrUnavailable (said once)", err)
	}
	if _, err := a.Claim(ctx, "k1", "a", t0, nil); !errors.Is(err, persistence.ErrUnavailable) {
		t.Errorf("A.Claim after B took the lock: error = %v, want ErrUnavailable", err)
	}
	if o, err := b.Ownership(ctx, "k1"); !errors.Is(err, persistence.ErrNotFound) {
		t.Errorf("A's claim reached the database while B held the lock: Ownership(k1) = %+v, %v", o, err)
	}
	storetest.MustCommit(t, b, &persistence.CreateSession{Session: newSession("s1", "k1")})
	if err := a.Ping(ctx); err == nil {
		t.Error("A.Ping while B holds the lock = nil, want an error")
	}
}

// TestStaleLockHolderClaimsNothing: a cluster member whose hold of the daemon lock is gone
// without its knowing (its lock connection died; its check of the lock has not run yet) while a
// single daemon took the lock claims no key: the claim is refused as unavailable, and it counts
// no death. Before, Claim checked only that the member thought it held the lock: the claim
// went through, and it counted the death of the member that last held the key against the
// head pending message of the session the single daemon now runs, one strike of three toward
// quarantine for a message the single daemon may have run fine since.
func TestStaleLockHolderClaimsNothing(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	member, err := Open(ctx, dsn, Options{Shared: true, LockCheckInterval: time.Hour})
	if err != nil {
		t.Fatalf("Open the member: %v", err)
	}
	defer member.Close()
	mustPendingSessions(t, member, "a")
	conn := mustConn(t, dsn)
	dead := Member{ID: "p", Host: "10.0.0.1", Port: 6340, Node: "h1/r_p"}
	if _, err := member.Heartbeat(ctx, "c1", dead, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, member, "ka", dead.Node)
	mustExpire(t, conn, dead.ID)

	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(l.pid) FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.granted`); err != nil {
		t.Fatal(err)
	}
	single, err := Open(ctx, dsn, Options{Exclusive: true})
	if err != nil {
		t.Fatalf("Open a single daemon once the member's hold is gone: %v", err)
	}
	defer single.Close()
	if c, err := member.Claim(ctx, "ka", "h2/r_q", t0, nil); !errors.Is(err, persistence.ErrUnavailable) {
		t.Errorf("the member's Claim after a single daemon took the lock = %s, %v; want ErrUnavailable", counted(c), err)
	}
	var attempts int
	if err := conn.QueryRow(ctx, `SELECT attempts FROM messages WHERE session_id = 'a' AND seq = 1`).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 {
		t.Errorf("attempts of a-m1 = %d after the stale member's claim, want 0", attempts)
	}
	if o, err := single.Ownership(ctx, "ka"); err != nil || o.Epoch != 1 || o.Owner != dead.Node {
		t.Errorf("Ownership(ka) = %+v, %v; want epoch 1 of %s", o, err, dead.Node)
	}
}

// TestTimeout: a server that does not answer (here: a table locked by another session) fails
// a Commit after Options.Timeout with persistence.ErrUnavailable, so the persistence actor
// spools the writes instead of waiting for ever; reads fail the same way; once the server
// answers again, so does the store.
func TestTimeout(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	s, err := Open(ctx, dsn, Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")},
		&persistence.PutRoute{Route: persistence.Route{Key: "k1", SessionID: "s1", Generation: 1}})

	locker := mustConn(t, dsn)
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE sessions, routing IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	errs := s.Commit(ctx, [][]persistence.Op{{&persistence.SetTitle{SessionID: "s1", Title: "t"}}})
	if !errors.Is(errs[0], persistence.ErrUnavailable) || !strings.Contains(errs[0].Error(), "did not answer within 1s") {
		t.Errorf("Commit against a locked table: error = %v, want ErrUnavailable saying it did not answer", errs[0])
	}
	if _, err := s.LoadSession(ctx, "k1", 10, 0); !errors.Is(err, persistence.ErrUnavailable) {
		t.Errorf("LoadSession against a locked table: error = %v, want ErrUnavailable", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	storetest.MustCommit(t, s, &persistence.SetTitle{SessionID: "s1", Title: "after"})
	got, err := s.Session(ctx, "s1")
	if err != nil || got.Title != "after" {
		t.Errorf("Session(s1) after the lock = %+v, %v; want title after", got, err)
	}
}

// TestSchemas: two deployments in different schemas of one database (search_path) keep their
// rows and their daemon locks apart.
func TestSchemas(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	c := mustConn(t, dsn)
	if _, err := c.Exec(ctx, `CREATE SCHEMA blue; CREATE SCHEMA green`); err != nil {
		t.Fatal(err)
	}
	open := func(schema string, wait time.Duration) (*Store, error) {
		return Open(ctx, dsn+" search_path="+schema, Options{Exclusive: true, LockWait: wait})
	}
	blue, err := open("blue", 0)
	if err != nil {
		t.Fatalf("Open blue: %v", err)
	}
	defer blue.Close()
	green, err := open("green", 0)
	if err != nil {
		t.Fatalf("Open green next to blue: %v", err)
	}
	defer green.Close()
	if _, err := open("blue", 50*time.Millisecond); !errors.Is(err, persistence.ErrLocked) {
		t.Errorf("a second daemon on blue: error = %v, want ErrLocked", err)
	}
	storetest.MustCommit(t, blue, &persistence.CreateSession{Session: newSession("s1", "k1")})
	if _, err := green.Session(ctx, "s1"); !errors.Is(err, persistence.ErrNotFound) {
		t.Errorf("green sees blue's session: error = %v, want ErrNotFound", err)
	}
	var n int
	if err := c.QueryRow(ctx, `SELECT COUNT(*) FROM blue.sessions`).Scan(&n); err != nil || n != 1 {
		t.Errorf("blue.sessions has %d rows (%v), want 1", n, err)
	}
	// A schema the operator has not created yet: PostgreSQL says only "no schema has been
	// selected to create in"; the error says which and what to do.
	if _, err := open("red", 0); err == nil || !strings.Contains(err.Error(), "search_path (red)") ||
		!strings.Contains(err.Error(), "CREATE SCHEMA") {
		t.Errorf("Open of a schema that does not exist: error = %v, want one naming search_path red and CREATE SCHEMA", err)
	}
}

// TestSchemaIsPinnedAtOpen: a store keeps to the schema its search_path named when it opened,
// and its String names that schema.
// PostgreSQL's default search_path is "$user", public: a schema named after the user, created
// later for another deployment (as the README suggests), would otherwise come first for the
// running store's statements, and two daemons, each holding its own schema's lock, would write
// one schema.
func TestSchemaIsPinnedAtOpen(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	first, err := Open(ctx, dsn, Options{Exclusive: true})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	c := mustConn(t, dsn)
	var user string
	if err := c.QueryRow(ctx, `SELECT current_user`).Scan(&user); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{user}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	second, err := Open(ctx, dsn+" search_path="+user, Options{Exclusive: true})
	if err != nil {
		t.Fatalf("Open of a second deployment in schema %s: %v", user, err)
	}
	defer second.Close()
	// The daemon's start line names its store: an operator sees which schema each one kept to.
	for st, schema := range map[*Store]string{first: "public", second: user} {
		if !strings.HasSuffix(st.String(), " schema "+schema+")") {
			t.Errorf("store String() = %q, want it to name the schema %s it keeps to", st.String(), schema)
		}
	}

	storetest.MustCommit(t, first, &persistence.CreateSession{Session: newSession("s1", "k1")})
	for schema, want := range map[string]int{"public": 1, user: 0} {
		var n int
		q := `SELECT COUNT(*) FROM ` + pgx.Identifier{schema, "sessions"}.Sanitize()
		if err := c.QueryRow(ctx, q).Scan(&n); err != nil || n != want {
			t.Errorf("%s.sessions has %d rows (%v) after the first store's commit, want %d", schema, n, err, want)
		}
	}
}

// TestNoMigrate: a store opened with NoMigrate (the sessions command) never changes the schema:
// it refuses a database that is not migrated, and reads one that is.
func TestNoMigrate(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	if _, err := Open(ctx, dsn, Options{NoMigrate: true}); err == nil || !strings.Contains(err.Error(), "start the daemon on it once") {
		t.Errorf("Open(NoMigrate) of an empty database: error = %v, want it refused", err)
	}
	var tables int
	if err := mustConn(t, dsn).QueryRow(ctx, `SELECT COUNT(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil || tables != 0 {
		t.Errorf("after Open(NoMigrate): %d tables (%v), want none", tables, err)
	}
	s, err := Open(ctx, dsn, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	r, err := Open(ctx, dsn, Options{NoMigrate: true})
	if err != nil {
		t.Fatalf("Open(NoMigrate) of a migrated database: %v", err)
	}
	r.Close()
}

// TestIsUnavailable: which errors send writes to the spool (the server cannot take them now)
// and which fail the write (something is wrong with the write itself).
func TestIsUnavailable(t *testing.T) {
	pg := func(code string) error { return &pgconn.PgError{Code: code, Message: "m"} }
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"connection failure", pg("08006"), true},
		{"disk full", pg("53100"), true},
		{"too many connections", pg("53300"), true},
		{"admin shutdown", pg("57P01"), true},
		{"cannot connect now (starting)", pg("57P03"), true},
		{"io error", pg("58030"), true},
		{"read-only transaction (a standby)", pg("25006"), true},
		{"serialization failure", pg("40001"), true},
		{"deadlock", pg("40P01"), true},
		{"statement cancelled", pg("57014"), false},
		{"unique violation", pg("23505"), false},
		{"foreign key violation", pg("23503"), false},
		{"syntax error", pg("42601"), false},
		{"wrapped", fmt.Errorf("commit: %w", pg("08006")), true},
		{"caller gave up", context.Canceled, false},
		{"caller's deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), false},
		{"connection closed", errors.New("conn closed"), true},
		{"connection reset", errors.New("read tcp 10.0.0.1:5432: read: connection reset by peer"), true},
		{"a plain error", errors.New("something else"), false},
	} {
		if got := IsUnavailable(c.err); got != c.want {
			t.Errorf("IsUnavailable(%s: %v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// TestUnavailableBatchKeepsRefusedGroupsErrors: when a group the server cannot take (here a
// trigger that raises disk_full for session b's messages) fails the batch, a group the savepoint
// pass had already refused for what it holds (a write fenced out by a newer claim of its key)
// keeps its own error. Before, it got the batch's ErrUnavailable: the persistence actor spooled
// it and acknowledged it as durable, the fenced-out session went on as the key's owner, and the
// replay set the batch aside.
func TestUnavailableBatchKeepsRefusedGroupsErrors(t *testing.T) {
	s, dsn := MustOpen(t)
	ctx := context.Background()
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("a", "ka")},
		&persistence.CreateSession{Session: newSession("b", "kb")})
	claimed, err := s.Claim(ctx, "ka", "first", t0, nil)
	if err != nil {
		t.Fatal(err)
	}
	old := claimed.Epoch
	if _, err := s.Claim(ctx, "ka", "second", t0, nil); err != nil {
		t.Fatal(err)
	}
	c := mustConn(t, dsn)
	if _, err := c.Exec(ctx, `CREATE FUNCTION full_disk() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'no space left (test)' USING ERRCODE = 'disk_full'; END $$;
		CREATE TRIGGER full_disk BEFORE INSERT ON messages FOR EACH ROW
			WHEN (NEW.session_id = 'b') EXECUTE FUNCTION full_disk()`); err != nil {
		t.Fatal(err)
	}
	msg := func(sid, text string) *persistence.AppendMessage {
		return &persistence.AppendMessage{Message: persistence.Message{SessionID: sid, Seq: 1,
			Role: persistence.RoleAssistant, Content: text, Active: true, CreatedAt: t0}}
	}
	errs := s.Commit(ctx, [][]persistence.Op{
		{&persistence.Fence{Key: "ka", Epoch: old}, msg("a", "fenced")},
		{msg("b", "waits in the spool")},
	})
	if !errors.Is(errs[0], persistence.ErrFenced) || errors.Is(errs[0], persistence.ErrUnavailable) {
		t.Errorf("the fenced group: error = %v, want ErrFenced (not ErrUnavailable: the actor would spool it and acknowledge it durable)", errs[0])
	}
	if !errors.Is(errs[1], persistence.ErrUnavailable) {
		t.Errorf("the group the server cannot take: error = %v, want ErrUnavailable", errs[1])
	}
}

// TestSearchPastALongMessage: a message whose words would not fit a tsvector (PostgreSQL caps
// its lexemes at 1 MB; a hyphenated word counts whole and in parts, so a reply of 600 KB of
// identifiers is enough, and replies may hold 1 MiB) neither fails every search nor hides the
// other messages. Before, each search computed that message's tsvector and failed with "string
// is too long for tsvector".
func TestSearchPastALongMessage(t *testing.T) {
	s, dsn := MustOpen(t)
	ctx := context.Background()
	// The index README suggests must not fail the long message's INSERT either.
	if _, err := mustConn(t, dsn).Exec(ctx, `CREATE INDEX messages_search ON messages
		USING gin (to_tsvector('simple', left(content, 65536)))`); err != nil {
		t.Fatal(err)
	}
	var long strings.Builder
	for i := 0; long.Len() < 600<<10; i++ {
		fmt.Fprintf(&long, "id%07d-part%07d ", i, i)
	}
	long.WriteString("needle")
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("a", "ka")},
		&persistence.AppendMessage{Message: persistence.Message{SessionID: "a", Seq: 1,
			Role: persistence.RoleAssistant, Content: long.String(), Active: true, CreatedAt: t0}},
		&persistence.AppendMessage{Message: persistence.Message{SessionID: "a", Seq: 2,
			Role: persistence.RoleAssistant, Content: "the quick brown fox", Active: true, CreatedAt: t0}})
	ms, err := s.Search(ctx, "quick", 0)
	if err != nil {
		t.Fatalf("Search(quick) beside a long message: %v", err)
	}
	if len(ms) != 1 || ms[0].Seq != 2 {
		t.Errorf("Search(quick) = %d messages, want a/2", len(ms))
	}
	ms, err = s.Search(ctx, "id0000001-part0000001", 0)
	if err != nil {
		t.Fatalf("Search in the long message: %v", err)
	}
	if len(ms) != 1 || ms[0].Seq != 1 {
		t.Errorf("Search for a word at the start of the long message = %d messages, want a/1", len(ms))
	}
}

// commitInFlight starts a commit of s of a session id that reads the daemon lock's state (its
// fence's epoch) at once and then waits, before its first statement, until finish is called,
// which returns the commit's error: a commit in flight across whatever the test does meanwhile.
func commitInFlight(t *testing.T, s *Store, id string) (finish func() error) {
	t.Helper()
	entered, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	var once sync.Once
	s.acquired = func(*pgx.Conn) { once.Do(func() { close(entered); <-release }) }
	go func() {
		done <- s.Commit(context.Background(), [][]persistence.Op{{&persistence.CreateSession{Session: newSession(id, "k-"+id)}}})[0]
	}()
	<-entered
	return func() error {
		close(release)
		err := <-done
		s.acquired = nil
		return err
	}
}

// retakeAfter ends the session of the daemon lock's connection from c, runs onLoss, then checks
// s's lock until s has taken it again (taken counts s's retakes: Options.LockTaken), and returns
// the lock's state then.
func retakeAfter(t *testing.T, s *Store, c *pgx.Conn, taken *atomic.Int32, onLoss func()) *lockHold {
	t.Helper()
	ctx := context.Background()
	if _, err := c.Exec(ctx, `SELECT pg_terminate_backend(l.pid, 10000) FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.granted`); err != nil {
		t.Fatal(err)
	}
	onLoss()
	n := taken.Load()
	deadline := time.Now().Add(30 * time.Second)
	for taken.Load() == n {
		if time.Now().After(deadline) {
			t.Fatal("the lock was not taken again within 30 s of its connection's end")
		}
		_ = s.checkLock(ctx)
		time.Sleep(50 * time.Millisecond) // a real server: poll under a deadline
	}
	return s.held.Load()
}

// TestRetakeWithNoOneBetweenKeepsTheEpoch: a single daemon that takes its lock again after its
// connection's end, with no other daemon between (or one that held the lock without raising
// the epoch, which writes nothing), keeps the lock's epoch, and its commit in flight across the
// retake, fenced with that epoch, commits. Before, each retake raised the epoch and fenced that
// commit, which was spooled: under connection kills every 1-3 s, 149 of a soak's 201 spool
// episodes. A retake after another daemon's is TestRetakeAfterAnotherDaemonFencesACommitInFlight.
func TestRetakeWithNoOneBetweenKeepsTheEpoch(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	var taken atomic.Int32
	a, err := Open(ctx, dsn, Options{Exclusive: true, LockCheckInterval: time.Hour, LockTaken: func() { taken.Add(1) }})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer a.Close()
	c := mustConn(t, dsn)
	for _, tc := range []struct {
		name   string
		onLoss func()
	}{
		{"no one", func() {}},
		{"a lock taken without a raise", func() {
			// pg_advisory_lock waits for the ended session's lock to go.
			if _, err := c.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext(current_schema()))`, int32(daemonLock)); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Exec(ctx, `SELECT pg_advisory_unlock($1, hashtext(current_schema()))`, int32(daemonLock)); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := a.held.Load()
			id := "s-" + strings.ReplaceAll(tc.name, " ", "-")
			finish := commitInFlight(t, a, id)
			retaken := retakeAfter(t, a, c, &taken, tc.onLoss)
			if err := finish(); err != nil {
				t.Errorf("the commit in flight across the retake: %v, want nil (committed)", err)
			}
			if _, err := a.Session(ctx, id); err != nil {
				t.Errorf("Session(%s) after the commit in flight across the retake: %v", id, err)
			}
			var epoch int64
			if err := c.QueryRow(ctx, `SELECT epoch FROM daemon_epoch`).Scan(&epoch); err != nil {
				t.Fatal(err)
			}
			if retaken == nil || retaken.epoch != before.epoch || epoch != before.epoch {
				t.Errorf("after the retake the store holds %+v and the database's epoch is %d, want both %d (kept)", retaken, epoch, before.epoch)
			}
		})
	}

	// Another daemon's: a commit of a store whose lock another daemon took says so.
	if _, err := c.Exec(ctx, `SELECT pg_terminate_backend(l.pid, 10000) FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.granted`); err != nil {
		t.Fatal(err)
	}
	b, err := Open(ctx, dsn, Options{Exclusive: true, LockCheckInterval: time.Hour})
	if err != nil {
		t.Fatalf("Open B after A lost its lock: %v", err)
	}
	defer b.Close()
	errs := a.Commit(ctx, [][]persistence.Op{{&persistence.CreateSession{Session: newSession("s2", "k2")}}})
	if !errors.Is(errs[0], persistence.ErrUnavailable) || !strings.Contains(errs[0].Error(), "another agentgate daemon took the database's daemon lock") {
		t.Errorf("A's commit after B took the lock: error = %v, want ErrUnavailable saying another daemon took the lock", errs[0])
	}
}

// TestRetakeAfterAnotherDaemonFencesACommitInFlight: a single daemon that takes its lock again
// after another daemon held it in between raises the epoch, as the other one did, and its
// commit in flight across the retake, fenced with the epoch before, is refused
// (ErrUnavailable: spooled), and says that another daemon held the lock in between (before,
// it said only that this daemon took its lock again, and the other daemon, which may have
// written meanwhile, went unmentioned). So does a retake that finds the epoch it held but set
// by another raise (daemon_epoch.raise_id): a database restored to a point before this
// daemon's raise, where another daemon raised the epoch to the same number since, may have that
// daemon still committing with it.
func TestRetakeAfterAnotherDaemonFencesACommitInFlight(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	opts := Options{Exclusive: true, LockCheckInterval: time.Hour}
	var taken atomic.Int32
	aOpts := opts
	aOpts.LockTaken = func() { taken.Add(1) }
	a, err := Open(ctx, dsn, aOpts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer a.Close()
	c := mustConn(t, dsn)
	for _, tc := range []struct {
		name    string
		onLoss  func()
		between bool // another daemon's raise comes between the write's and the retake's
	}{
		{"another daemon", func() {
			b, err := Open(ctx, dsn, opts)
			if err != nil {
				t.Fatalf("Open B after A lost its lock: %v", err)
			}
			storetest.MustCommit(t, b, &persistence.CreateSession{Session: newSession("b1", "kb1")})
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"a restore", func() {
			if _, err := c.Exec(ctx, `UPDATE daemon_epoch SET raise_id = 'another daemon''s'`); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := a.held.Load()
			finish := commitInFlight(t, a, "s-"+strings.ReplaceAll(tc.name, " ", "-"))
			retaken := retakeAfter(t, a, c, &taken, tc.onLoss)
			err := finish()
			if !errors.Is(err, persistence.ErrUnavailable) {
				t.Fatalf("the commit in flight across the retake: error = %v, want ErrUnavailable (fenced)", err)
			}
			var epoch int64
			if err := c.QueryRow(ctx, `SELECT epoch FROM daemon_epoch`).Scan(&epoch); err != nil {
				t.Fatal(err)
			}
			if retaken == nil || retaken.epoch <= before.epoch || epoch != retaken.epoch {
				t.Fatalf("after the retake the store holds %+v and the database's epoch is %d, want one raised past %d", retaken, epoch, before.epoch)
			}
			want := fmt.Sprintf("this daemon lost its lock on the database and took it again since the write began (the lock's epoch is %d now, the write's %d)",
				retaken.epoch, before.epoch)
			if tc.between {
				want = fmt.Sprintf("this daemon lost its lock on the database and took it again since the write began, and another daemon held it in between (the lock's epoch is %d now, the write's %d)",
					retaken.epoch, before.epoch)
			}
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the commit in flight across the retake: error = %v, want it to say %q", err, want)
			}
		})
	}
}

// TestRestoredEpochUnderAnotherRaiseFencesACommitInFlight: a database restored (or failed over
// to a standby) to a point before a single daemon's raise of the lock's epoch, where another
// daemon then raised the epoch to the same number, refuses the first daemon's commit in flight
// (ErrUnavailable: spooled), which read the epoch before its lock was lost: the fence checks
// the raise's id too (migration 0021). Before, it checked the epoch alone, and the commit went
// through beside the other daemon's, as did every commit of the first daemon until its next
// check of its lock found the lock lost (up to LockCheckInterval, 5 s).
func TestRestoredEpochUnderAnotherRaiseFencesACommitInFlight(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	opts := Options{Exclusive: true, LockCheckInterval: time.Hour}
	a, err := Open(ctx, dsn, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer a.Close()
	before := a.held.Load()
	finish := commitInFlight(t, a, "s-a")
	c := mustConn(t, dsn)
	if _, err := c.Exec(ctx, `SELECT pg_terminate_backend(l.pid, 10000) FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.granted`); err != nil {
		t.Fatal(err)
	}
	// The restore: the row as it was before A's raise.
	if _, err := c.Exec(ctx, `UPDATE daemon_epoch SET epoch = epoch - 1, raise_id = 'before A''s raise'`); err != nil {
		t.Fatal(err)
	}
	b, err := Open(ctx, dsn, opts)
	if err != nil {
		t.Fatalf("Open B after the restore: %v", err)
	}
	defer b.Close()
	if h := b.held.Load(); h == nil || h.epoch != before.epoch {
		t.Fatalf("B holds %+v, want the epoch A held, %d (raised to the same number)", h, before.epoch)
	}
	err = finish()
	if !errors.Is(err, persistence.ErrUnavailable) || !strings.Contains(err.Error(), "another agentgate daemon took the database's daemon lock") {
		t.Errorf("A's commit in flight after B raised the restored epoch to A's: error = %v, want ErrUnavailable saying another daemon took the lock", err)
	}
	if _, err := b.Session(ctx, "s-a"); !errors.Is(err, persistence.ErrNotFound) {
		t.Errorf("Session(s-a) of A's commit in flight = %v, want persistence.ErrNotFound (fenced)", err)
	}
	storetest.MustCommit(t, b, &persistence.CreateSession{Session: newSession("s-b", "k-b")})
}

// TestRetakeWhoseRaiseLostItsAnswerIsNoOtherDaemon: a retake whose raise of the epoch committed
// but whose answer was lost (the connection broke between the COMMIT and its answer, as it may
// in the outage that lost the lock) raised the epoch all the same, as this store: a write fenced
// with the epoch before, refused after the next retake, says that this daemon took its lock
// again, not that another daemon held it in between. Before, the store set its last raise back
// as if the raise had not been made, the next retake's raise did not follow on from it, and the
// write was told that another daemon held the lock in between, which the runbook reads as two
// deployments on one database.
func TestRetakeWhoseRaiseLostItsAnswerIsNoOtherDaemon(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	a, err := Open(ctx, dsn, Options{Exclusive: true, LockCheckInterval: time.Hour})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer a.Close()
	// The lock's next connection closes itself once it has sent its first COMMIT, before the
	// answer comes back: the server commits it, and the store sees the connection lost.
	var cut atomic.Bool
	a.lockMu.Lock()
	dial := a.lockCfg.DialFunc
	a.lockCfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &commitCutter{Conn: conn, cut: &cut}, nil
	}
	a.lockMu.Unlock()

	before := a.held.Load()
	c := mustConn(t, dsn)
	// The retake raises the epoch only when the row no longer holds this store's raise
	// (TestRetakeWithNoOneBetweenKeepsTheEpoch): another raise's id, as a restore of the
	// database may leave, makes it raise with no other daemon between.
	if _, err := c.Exec(ctx, `UPDATE daemon_epoch SET raise_id = 'restored'`); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, `SELECT pg_terminate_backend(l.pid) FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.granted`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !cut.Load() {
		if time.Now().After(deadline) {
			t.Fatal("no retake raised the epoch within 30 s of the lock connection's end")
		}
		_ = a.Ping(ctx)
		time.Sleep(50 * time.Millisecond) // a real server: poll under a deadline
	}
	if h := a.held.Load(); h != nil {
		t.Fatalf("the retake whose COMMIT lost its answer holds the lock (epoch %d), want it lost", h.epoch)
	}
	var epoch int64
	if err := c.QueryRow(ctx, `SELECT epoch FROM daemon_epoch`).Scan(&epoch); err != nil {
		t.Fatal(err)
	}
	if epoch != before.epoch+1 {
		t.Fatalf("the epoch after the retake whose COMMIT lost its answer = %d, want %d (the raise committed)", epoch, before.epoch+1)
	}
	for h := a.held.Load(); h == nil; h = a.held.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the lock was not taken again within 30 s")
		}
		_ = a.Ping(ctx)
		time.Sleep(50 * time.Millisecond)
	}
	retaken := a.held.Swap(before)
	errs := a.Commit(ctx, [][]persistence.Op{{&persistence.CreateSession{Session: newSession("s1", "k1")}}})
	a.held.Store(retaken)
	want := fmt.Sprintf("this daemon lost its lock on the database and took it again since the write began (the lock's epoch is %d now, the write's %d)",
		retaken.epoch, before.epoch)
	if !errors.Is(errs[0], persistence.ErrUnavailable) || !strings.Contains(errs[0].Error(), want) {
		t.Errorf("the commit fenced with the epoch before two raises of A's own: error = %v, want ErrUnavailable saying %q", errs[0], want)
	}
}

// commitCutter is a connection to the server that closes itself once it has sent a COMMIT
// (the first of any commitCutter sharing cut), before the answer comes back.
type commitCutter struct {
	net.Conn
	cut *atomic.Bool
}

func (c *commitCutter) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err == nil && bytes.Contains(bytes.ToLower(p), []byte("commit\x00")) && c.cut.CompareAndSwap(false, true) {
		_ = c.Conn.Close()
	}
	return n, err
}
