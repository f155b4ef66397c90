package pgtest

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/jackc/pgx/v5"
)

// SchemaOneMigrationShort makes conn's database hold the schema one migration short of this
// checkout's, as an older binary left it: it applies every file of dir (the store's migrations
// directory, persistence/postgres/migrations, relative to the test's package) but the last and
// records each in schema_migrations, as the store's migrator does. It returns the latest
// version, the one a start then migrates to.
func SchemaOneMigrationShort(t testing.TB, ctx context.Context, conn *pgx.Conn, dir string) (latest int) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.sql"))
	if err != nil || len(files) < 2 {
		t.Fatalf("migrations in %s: %v %v", dir, files, err)
	}
	sort.Strings(files)
	if _, err := conn.Exec(ctx, `CREATE TABLE schema_migrations (version INTEGER NOT NULL PRIMARY KEY, applied_at BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for i, f := range files[:len(files)-1] {
		sql, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, string(sql)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations VALUES ($1, 0)`, i+1); err != nil {
			t.Fatal(err)
		}
	}
	return len(files)
}
