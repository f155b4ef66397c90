package testutil

import (
	"context"
	"database/sql"
	"sync"
	"testing"

	_ "modernc.org/sqlite" // the "sqlite" driver
)

// LockSQLite takes the write lock of the SQLite database at path from a connection of its own
// (BEGIN EXCLUSIVE), as a sqlite3 shell would: a store's writes then wait out its busy timeout
// and fail as unavailable. unlock releases it, and is safe to call twice; the test's cleanup
// calls it too.
func LockSQLite(t *testing.T, path string) (unlock func()) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(t.Context())
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(t.Context(), "BEGIN EXCLUSIVE"); err != nil {
		conn.Close()
		db.Close()
		t.Fatalf("take the database lock: %v", err)
	}
	var once sync.Once
	unlock = func() {
		once.Do(func() {
			if _, err := conn.ExecContext(context.Background(), "ROLLBACK"); err != nil {
				t.Errorf("release the database lock: %v", err)
			}
			conn.Close()
			db.Close()
		})
	}
	t.Cleanup(unlock)
	return unlock
}
