package pgtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// connect opens dsn with pgx and closes the connection when t ends.
func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatalf("connect %q: %v", dsn, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// userTables returns the number of tables in the public schema.
func userTables(t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// roundTrip creates a table in conn's database, writes a row and reads it back.
func roundTrip(t *testing.T, conn *pgx.Conn, value string) {
	t.Helper()
	ctx := t.Context()
	if _, err := conn.Exec(ctx, "CREATE TABLE t (v text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO t (v) VALUES ($1)", value); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := conn.QueryRow(ctx, "SELECT v FROM t").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != value {
		t.Fatalf("read %q, wrote %q", got, value)
	}
}

func TestDatabasesAreDistinctEmptyAndWritable(t *testing.T) {
	dsnA, dsnB := NewDatabase(t), NewDatabase(t)
	if dsnA == dsnB {
		t.Fatalf("two calls returned the same database %q", dsnA)
	}
	a, b := connect(t, dsnA), connect(t, dsnB)

	var nameA, nameB string
	if err := a.QueryRow(t.Context(), "SELECT current_database()").Scan(&nameA); err != nil {
		t.Fatal(err)
	}
	if err := b.QueryRow(t.Context(), "SELECT current_database()").Scan(&nameB); err != nil {
		t.Fatal(err)
	}
	if nameA == nameB || !strings.Contains(dsnA, "dbname="+nameA) || !strings.Contains(dsnB, "dbname="+nameB) {
		t.Fatalf("connected to %q and %q via %q and %q", nameA, nameB, dsnA, dsnB)
	}
	if n := userTables(t, a); n != 0 {
		t.Fatalf("new database %s has %d tables", nameA, n)
	}
	if n := userTables(t, b); n != 0 {
		t.Fatalf("new database %s has %d tables", nameB, n)
	}

	roundTrip(t, a, "hello")
	var inB *string
	if err := b.QueryRow(t.Context(), "SELECT to_regclass('public.t')::text").Scan(&inB); err != nil {
		t.Fatal(err)
	}
	if inB != nil {
		t.Fatalf("table created in %s exists in %s as %s", nameA, nameB, *inB)
	}
	if n := userTables(t, b); n != 0 {
		t.Fatalf("database %s has %d tables after writing to %s", nameB, n, nameA)
	}
	roundTrip(t, b, "world") // the same table name is free in b
}

func TestParallelDatabases(t *testing.T) {
	var (
		mu    sync.Mutex
		names = map[string]bool{}
	)
	t.Run("group", func(t *testing.T) {
		for i := range 4 {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				conn := connect(t, NewDatabase(t))
				roundTrip(t, conn, fmt.Sprint("value ", i))
				mu.Lock()
				defer mu.Unlock()
				names[conn.Config().Database] = true
			})
		}
	})
	if !t.Failed() && len(names) != 4 {
		t.Fatalf("4 parallel tests got databases %v, want 4 distinct ones", names)
	}
}

func TestDatabaseDroppedWhenTestEnds(t *testing.T) {
	var dsn string
	t.Run("user", func(t *testing.T) {
		dsn = NewDatabase(t)
		connect(t, dsn) // still open when the cleanup drops the database
	})
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	name := cfg.Database
	cfg.Database = "postgres"
	conn, err := pgx.ConnectConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(t.Context(), "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("database %s still exists after its test ended", name)
	}
}

func TestNewDatabaseRequiresMain(t *testing.T) {
	mu.Lock()
	mainRan = false
	mu.Unlock()
	defer func() {
		mu.Lock()
		mainRan = true
		mu.Unlock()
	}()
	_, err := running()
	if err == nil || !strings.Contains(err.Error(), "TestMain must call pgtest.Main") {
		t.Fatalf("running() without Main = %v, want an error naming pgtest.Main", err)
	}
}

func TestBinDir(t *testing.T) {
	dir, err := binDir()
	if err != nil {
		t.Fatal(err)
	}
	if !hasServer(dir) {
		t.Fatalf("binDir() = %s, which holds no initdb and postgres", dir)
	}

	t.Setenv("AGENTGATE_PG_BIN", t.TempDir())
	if dir, err := binDir(); err == nil {
		t.Fatalf("binDir() with AGENTGATE_PG_BIN naming an empty directory = %s, want an error", dir)
	}
}

func TestQuote(t *testing.T) {
	for _, host := range []string{"/tmp/agentgate-pg-1", "/tmp/with space", `/tmp/it's\odd`} {
		cfg, err := pgx.ParseConfig("host=" + quote(host) + " dbname=" + quote("") + " sslmode=disable")
		if err != nil {
			t.Fatalf("quote(%q) = %s: %v", host, quote(host), err)
		}
		if cfg.Host != host {
			t.Fatalf("quote(%q) = %s, parsed as %q", host, quote(host), cfg.Host)
		}
	}
}

func TestLogTailKeepsLastLines(t *testing.T) {
	var l logTail
	for i := range tailLines + 5 {
		l.add(fmt.Sprint("line ", i))
	}
	lines := strings.Split(strings.TrimSuffix(l.String(), "\n"), "\n")
	if len(lines) != tailLines || lines[0] != "line 5" || lines[len(lines)-1] != fmt.Sprint("line ", tailLines+4) {
		t.Fatalf("kept %d lines from %q to %q", len(lines), lines[0], lines[len(lines)-1])
	}
}

// TestCut: a cut database refuses connections and drops the open ones; restored, it takes them
// again.
func TestCut(t *testing.T) {
	dsn := NewDatabase(t)
	ctx := context.Background()
	open, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close(ctx)
	restore := Cut(t, dsn)
	if err := open.Ping(ctx); err == nil {
		t.Error("a connection opened before the cut still answers")
	}
	if c, err := pgx.Connect(ctx, dsn); err == nil {
		c.Close(ctx)
		t.Error("a new connection during the cut succeeded")
	}
	restore()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect after restore: %v", err)
	}
	c.Close(ctx)
}
