package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestCheckConfigEmptyDatabase: a database file of 0 bytes, which a restore's copy onto a full
// disk leaves, is a note of check-config's, at the line of the key that puts the database
// there: serve makes a new, empty database in it. Before, "config ok" alone, and serve's log
// said there had been no database at that path (found by an operations walkthrough).
func TestCheckConfigEmptyDatabase(t *testing.T) {
	for _, tt := range []struct {
		name string
		dsn  bool // the file is store.dsn's, not data_dir's default database
		line int
		key  string
	}{
		{"the default database", false, 1, "data_dir"},
		{"store.dsn's", true, 3, "store.dsn"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			db := filepath.Join(dir, "agentgate.db")
			if err := os.WriteFile(db, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			text := "data_dir: " + dir + "\nhttp: {addr: 127.0.0.1:0}\n"
			if tt.dsn {
				text = "data_dir: " + dir + "\nhttp: {addr: 127.0.0.1:0}\nstore: {dsn: \"" + db + "\"}\n"
			}
			path := filepath.Join(t.TempDir(), "agentgate.yaml")
			if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			stdout, stderr, err := runCmd(t, "check-config", "--config", path)
			want := fmt.Sprintf("note: %s:%d: %s: the database %s is an empty file (0 bytes): serve will make a new, empty database in it "+
				"(if a copy or a restore wrote the file, it did not finish)\n", path, tt.line, tt.key, db)
			if err != nil || stdout != "config ok\n" || stderr != want {
				t.Errorf("check-config = %v, stdout %q, stderr %q; want config ok and stderr %q", err, stdout, stderr, want)
			}
		})
	}
}
