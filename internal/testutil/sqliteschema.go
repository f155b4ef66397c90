package testutil

import (
	"database/sql"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// SQLiteSchemaOneMigrationShort makes a SQLite database at path holding the schema one
// migration short of this checkout's, as an older binary left it: it applies every file of dir
// (persistence/sqlite/migrations, relative to the test's package) but the last and records
// each in schema_migrations, as the store's migrator does (pgtest.SchemaOneMigrationShort is
// PostgreSQL's). It returns the latest version, the one a start then migrates to.
func SQLiteSchemaOneMigrationShort(t testing.TB, path, dir string) (latest int) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.sql"))
	if err != nil || len(files) < 2 {
		t.Fatalf("migrations in %s: %v %v", dir, files, err)
	}
	sort.Strings(files)
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE schema_migrations (version INTEGER NOT NULL PRIMARY KEY, applied_at INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for i, f := range files[:len(files)-1] {
		q, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(string(q)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if _, err := db.Exec(`INSERT INTO schema_migrations VALUES (?, 0)`, i+1); err != nil {
			t.Fatal(err)
		}
	}
	return len(files)
}
