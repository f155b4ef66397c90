package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestDataDirThatIsAFile: a --data-dir that names the database file (or a path under it, or
// another file) is said to be no directory, with the directory to name instead, in the same
// words by every command that reads the data directory, and nothing is made or changed there.
// Before, each command said what failed on it: "stat …/agentgate.db/agentgate.db: not a
// directory" (list, show, export, search, quarantined, backup), "data directory …: mkdir …: not a
// directory" (reset, pardon, requeue), and serve that it "exists but is not a directory".
func TestDataDirThatIsAFile(t *testing.T) {
	dir := MustSeedSessions(t)
	db := filepath.Join(dir, "agentgate.db")
	plain := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(plain, []byte("not a database\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	entries := func() []string {
		t.Helper()
		es, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		return names
	}
	was := entries()

	for _, tt := range []struct {
		name, dataDir, want string // want: after `data_dir: "<dataDir>": `
	}{
		{"the database file", db, fmt.Sprintf("is a database file, not a directory: name the directory that holds it (%s), not the file", dir)},
		{"the database file with a slash", db + "/", fmt.Sprintf("is a database file, not a directory: name the directory that holds it (%s), not the file", dir)},
		{"a path under it", filepath.Join(db, "data"), "cannot be made: " + db + " is a database file, not a directory: name the directory that holds agentgate.db, not a path under it"},
		{"another file", plain, "exists but is not a directory"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			want := "data_dir: " + strconv.Quote(tt.dataDir) + ": " + tt.want + " (set by --data-dir)"
			for _, args := range [][]string{
				{"sessions", "list"}, {"sessions", "show", keyA}, {"sessions", "export", keyA},
				{"sessions", "search", "hello"}, {"sessions", "quarantined"}, {"sessions", "reset", keyA},
				{"sessions", "pardon", "--all"}, {"sessions", "requeue", keyA, "m1"},
				{"backup", filepath.Join(t.TempDir(), "copy.db")},
				{"serve", "--http-addr", "127.0.0.1:0"},
			} {
				_, _, err := runCmd(t, append(args, "--data-dir", tt.dataDir)...)
				if err == nil || err.Error() != want {
					t.Errorf("%q = %v, want %q", args, err, want)
				}
			}
			if _, stderr, err := runCmd(t, "check-config", "--data-dir", tt.dataDir); err == nil || stderr != want+"; serve refuses to start with it\n" {
				t.Errorf("check-config = %v, stderr %q; want %q", err, stderr, want+"; serve refuses to start with it\n")
			}
		})
	}
	t.Run("bench", func(t *testing.T) {
		want := "bench: --data-dir " + db + " is not a directory: give it an empty or new directory"
		if _, _, err := runCmd(t, "bench", "--data-dir", db); err == nil || err.Error() != want {
			t.Errorf("bench = %v, want %q", err, want)
		}
	})

	after, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != string(before) {
		t.Error("the database changed")
	}
	if now := entries(); fmt.Sprint(now) != fmt.Sprint(was) {
		t.Errorf("the data directory holds %q, want %q as before", now, was)
	}
}
