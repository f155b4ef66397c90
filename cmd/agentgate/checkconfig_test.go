package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// runCmd runs agentgate with args in this process and returns its stdout, stderr and error.
// A serve that starts where it should refuse is stopped after a minute (a bound on a failure).
func runCmd(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	err = run(ctx, args, &out, &errOut)
	return out.String(), errOut.String(), err
}

// TestCheckConfigMalformed: mistakes an operator plausibly makes in the file are named at their
// line, with what to write instead, by check-config and by serve alike.
func TestCheckConfigMalformed(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		name string
		yaml string // after a first line that sets data_dir
		line int
		want string // check-config's line on stderr after FILE:LINE:
		// serve's error, after "config: FILE:LINE: " (or, with a FILE:LINE in it, whole;
		// "same": check-config's line, whole)
		serve string
	}{
		{"a tab indents a key", "http:\n\taddr: 127.0.0.1:0\n", 3,
			"indented with a tab: YAML indents with spaces only", ""},
		{"a duration without its unit", "cluster:\n  member_ttl: 30\n", 3,
			`cluster.member_ttl: "30": must be a duration with its unit, such as 30s or 30m`, ""},
		{"a negative size", "sessions:\n  queue:\n    cap: -5\n", 4, "sessions.queue.cap: -5: must be at least 1", ""},
		{"a port out of range", "http:\n  addr: 127.0.0.1:70000\n", 3,
			`http.addr: "127.0.0.1:70000": port must be a number from 0 to 65535`, ""},
		{"a key set twice", "http:\n  addr: 127.0.0.1:0\n  addr: 127.0.0.1:1\n", 4,
			"http.addr: set twice (first at line 3): keep one", ""},
		// serve refuses it before it starts, in the exec agent's words, at the line as
		// check-config does (before, Start refused it without the line).
		{"an agent command not on PATH", "agent:\n  backend: exec\n  exec:\n    command: [agentgate-test-no-such-agent, --fast]\n", 5,
			`agent.exec.command: exec agent: command "agentgate-test-no-such-agent" is not found in PATH (give its full path); serve refuses to start with it`,
			"same"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agentgate.yaml")
			if err := os.WriteFile(path, []byte("data_dir: "+dir+"\n"+tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("%s:%d: %s\n", path, tt.line, tt.want)
			if _, stderr, err := runCmd(t, "check-config", "--config", path); err == nil || stderr != want {
				t.Errorf("check-config = %v, stderr %q; want an error and stderr %q", err, stderr, want)
			}
			serveWant := tt.serve
			switch serveWant {
			case "":
				serveWant = "config: " + strings.TrimSuffix(want, "\n")
			case "same":
				serveWant = strings.TrimSuffix(want, "\n")
			}
			args := []string{"serve", "--config", path}
			if !strings.Contains(tt.yaml, "addr:") { // (the flag would replace the file's)
				args = append(args, "--http-addr", "127.0.0.1:0")
			}
			if _, _, err := runCmd(t, args...); err == nil || err.Error() != serveWant {
				t.Errorf("serve = %v, want %q", err, serveWant)
			}
		})
	}
}

// TestCheckConfigDataDir: a data_dir that cannot be made is refused by check-config at its line,
// and by serve, which makes nothing; one that can be made is not made by check-config. Before,
// "config ok" of a data_dir under a file, and serve failed where it made the database; and of a
// data_dir that is, or lies under, a symbolic link to a directory that is not there, which serve
// cannot make either ("start: data directory …: mkdir …: file exists").
func TestCheckConfigDataDir(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// A link to a directory not there, as a data_dir on a disk that is not mounted leaves one.
	link, nowhere := filepath.Join(dir, "link"), filepath.Join(dir, "nowhere")
	if err := os.Symlink("nowhere", link); err != nil {
		t.Fatal(err)
	}
	const makeIt = ", which is not there: make that directory, or set another data_dir"
	// A link that leads back to itself (before: "cannot be reached by this user", as if of a
	// permission, and its spool directory named as a second problem).
	loop := filepath.Join(dir, "loop")
	if err := os.Symlink("loop", loop); err != nil {
		t.Fatal(err)
	}
	const loops = " a symbolic link that leads back to itself (too many levels of symbolic links): point it at a directory, or set another data_dir"
	for _, tt := range []struct {
		name, dataDir, want string // want: the problem after `data_dir: "<dataDir>": `; "" is config ok
	}{
		{"under a file", filepath.Join(file, "data"), "cannot be made: " + file + " is not a directory"},
		{"deeper under a file", filepath.Join(file, "a", "b"), "cannot be made: " + file + " is not a directory"},
		{"a link to nowhere", link, "cannot be made: it is a symbolic link to " + nowhere + makeIt},
		{"under a link to nowhere", filepath.Join(link, "a", "b"), "cannot be made: " + link + " is a symbolic link to " + nowhere + makeIt},
		{"a link that loops", loop, "cannot be reached: it is" + loops},
		{"under a link that loops", filepath.Join(loop, "a", "b"), "cannot be reached: " + loop + " is" + loops},
		{"one that can be made", filepath.Join(dir, "new", "data"), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agentgate.yaml")
			if err := os.WriteFile(path, []byte("log: {level: info}\ndata_dir: "+tt.dataDir+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			stdout, stderr, err := runCmd(t, "check-config", "--config", path)
			for _, made := range []string{filepath.Join(dir, "new"), nowhere} {
				if _, statErr := os.Stat(made); !errors.Is(statErr, fs.ErrNotExist) {
					t.Errorf("check-config made %s (stat: %v), want nothing made", made, statErr)
				}
			}
			if tt.want == "" {
				if err != nil || stdout != "config ok\n" {
					t.Errorf("check-config = %v, stdout %q, stderr %q; want config ok", err, stdout, stderr)
				}
				return
			}
			problem := fmt.Sprintf("data_dir: %q: %s", tt.dataDir, tt.want)
			if want := path + ":2: " + problem + "; serve refuses to start with it\n"; err == nil || stderr != want {
				t.Errorf("check-config = %v, stderr %q; want an error and stderr %q", err, stderr, want)
			}
			if _, _, err := runCmd(t, "serve", "--config", path, "--http-addr", "127.0.0.1:0"); err == nil || err.Error() != path+":2: "+problem {
				t.Errorf("serve = %v, want %q", err, path+":2: "+problem)
			}
			// Set by a flag, it is not the file's line's, and the flag is named (before, only a
			// variable was).
			want := problem + " (set by --data-dir); serve refuses to start with it\n"
			if _, stderr, err := runCmd(t, "check-config", "--data-dir", tt.dataDir); err == nil || stderr != want {
				t.Errorf("check-config --data-dir = %v, stderr %q; want an error and stderr %q", err, stderr, want)
			}
		})
	}
}

// TestMachineChecksNameTheVariables: what check-config finds serve would refuse on this machine
// names the AGENTGATE_* variables that set the keys it is of, as the configuration's own
// problems do: a store.dsn outside a data_dir a variable set, and a data_dir a variable set.
// Before, only serve named them, for check-config made its line before it knew of them.
func TestMachineChecksNameTheVariables(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	dsn := filepath.Join(dir, "nodir", "x.db")
	path := filepath.Join(dir, "agentgate.yaml")
	if err := os.WriteFile(path, []byte("store:\n  dsn: "+dsn+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AGENTGATE_DATA_DIR", filepath.Join(dir, "data"))
	want := path + ":2: store.dsn: " + strconv.Quote(dsn) + ": its directory " + filepath.Dir(dsn) + " does not exist: create it, or fix the path " +
		"(serve makes data_dir and directories in it, not one elsewhere that store.dsn names) (data_dir set by AGENTGATE_DATA_DIR)"
	if _, stderr, err := runCmd(t, "check-config", "--config", path); err == nil || stderr != want+"; serve refuses to start with it\n" {
		t.Errorf("check-config = %v, stderr %q; want an error and %q", err, stderr, want+"; serve refuses to start with it\n")
	}
	if _, _, err := runCmd(t, "serve", "--config", path, "--http-addr", "127.0.0.1:0"); err == nil || err.Error() != want {
		t.Errorf("serve = %v, want %q", err, want)
	}

	t.Setenv("AGENTGATE_DATA_DIR", file)
	want = "data_dir: " + strconv.Quote(file) + ": exists but is not a directory (set by AGENTGATE_DATA_DIR); serve refuses to start with it\n"
	if _, stderr, err := runCmd(t, "check-config"); err == nil || stderr != want {
		t.Errorf("check-config = %v, stderr %q; want an error and %q", err, stderr, want)
	}
}

// TestCheckConfigPGEnv: a PG* variable pgx reads that holds a value it refuses is named by
// check-config, serve and the sessions commands, and store.dsn, which sets no sslmode, is not
// blamed; --config-only, for a file checked elsewhere, only warns of it: it is this machine's.
func TestCheckConfigPGEnv(t *testing.T) {
	for _, name := range []string{"PGHOST", "PGPORT", "PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY", "PGSSLCERTMODE", "PGSERVICE", "PGSERVICEFILE"} {
		t.Setenv(name, "") // (restored at the end of the test)
		os.Unsetenv(name)
	}
	t.Setenv("PGSSLMODE", "bogus")
	path := filepath.Join(t.TempDir(), "agentgate.yaml")
	if err := os.WriteFile(path, []byte("data_dir: "+t.TempDir()+"\nstore:\n  driver: postgres\n  dsn: postgres://agentgate@db.invalid/agentgate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const want = `PGSSLMODE: "bogus": failed to configure TLS: sslmode is invalid (pgx reads the variable for the PostgreSQL store where store.dsn leaves the setting out): correct or unset it`
	_, stderr, err := runCmd(t, "check-config", "--config", path)
	if err == nil || !strings.Contains(err.Error(), "serve would refuse to start here: 1 problem(s)") || stderr != want+"; serve refuses to start with it\n" {
		t.Errorf("check-config = %v, stderr %q; want an error and stderr %q", err, stderr, want+"; serve refuses to start with it\n")
	}
	stdout, stderr, err := runCmd(t, "check-config", "--config-only", "--config", path)
	if err != nil || stdout != "config ok\n" || stderr != "warning: "+want+"; serve refuses to start with it\n" {
		t.Errorf("check-config --config-only = %v, stdout %q, stderr %q; want config ok and the warning", err, stdout, stderr)
	}
	for _, args := range [][]string{
		{"serve", "--config", path, "--http-addr", "127.0.0.1:0"},
		{"sessions", "list", "--config", path},
	} {
		if _, _, err := runCmd(t, args...); err == nil || err.Error() != want {
			t.Errorf("%s = %v, want %q", args[0], err, want)
		}
	}
}

// TestCheckConfigSQLitePath: a SQLite store.dsn in a directory that is not there is refused by
// check-config at its line and by serve, which makes nothing; a path with no database yet is a
// note of check-config's, not a problem. Before, "config ok" of both, and serve made the
// directory and a new, empty database (found by a new user's walkthrough).
func TestCheckConfigSQLitePath(t *testing.T) {
	dir := t.TempDir()
	wd := t.TempDir() // where a relative path (file:…) goes
	existing := filepath.Join(dir, "existing.db")
	if err := os.WriteFile(existing, []byte("not read here"), 0o600); err != nil {
		t.Fatal(err)
	}
	newNote := func(path string) string {
		return "there is no database at " + path + " yet: serve will create a new, empty one there " +
			"(right on a first start; if the conversations should be there, the path is wrong)"
	}
	missing := filepath.Join(t.TempDir(), "nonexistent", "dir") // outside data_dir
	for _, tt := range []struct {
		name, dataDir, dsn string
		line               int    // of the key named, in the file
		refused            string // check-config's problem after FILE:LINE:; "" is config ok
		note               string // check-config's note after "note: FILE:LINE: "; "" for none
	}{
		{"a directory that is not there", dir, filepath.Join(missing, "x.db"), 4,
			`store.dsn: "` + filepath.Join(missing, "x.db") + `": its directory ` + missing + ` does not exist: ` +
				"create it, or fix the path (serve makes data_dir and directories in it, not one elsewhere that store.dsn names)", ""},
		{"a file: URI, which the store takes for a path", dir, "file:" + filepath.Join(dir, "x.db"), 4,
			`store.dsn: "file:` + filepath.Join(dir, "x.db") + `": its directory ` + filepath.Join(wd, "file:"+dir) + ` does not exist: ` +
				"create it, or fix the path (serve makes data_dir and directories in it, not one elsewhere that store.dsn names); " +
				"for SQLite, store.dsn is the database file's path, not a file: URI", ""},
		{"no database yet", dir, filepath.Join(dir, "new.db"), 4, "", "store.dsn: " + newNote(filepath.Join(dir, "new.db"))},
		{"a database", dir, existing, 0, "", ""},
		// serve makes data_dir, and so the directory of a database in it: make run on a fresh
		// clone starts.
		{"in a data_dir to be made", filepath.Join(dir, "data"), filepath.Join(dir, "data", "agentgate.db"), 4,
			"", "store.dsn: " + newNote(filepath.Join(dir, "data", "agentgate.db"))},
		{"the default database", filepath.Join(dir, "data"), "", 1, "", "data_dir: " + newNote(filepath.Join(dir, "data", "agentgate.db"))},
		// Nor a directory in data_dir, which the store makes (a database on a new volume).
		{"in a directory of data_dir to be made", filepath.Join(dir, "data"), filepath.Join(dir, "data", "db", "agentgate.db"), 4,
			"", "store.dsn: " + newNote(filepath.Join(dir, "data", "db", "agentgate.db"))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if strings.HasPrefix(tt.dsn, "file:") {
				t.Chdir(wd)
			}
			path := filepath.Join(t.TempDir(), "agentgate.yaml")
			text := "data_dir: " + tt.dataDir + "\nhttp: {addr: 127.0.0.1:0}\nstore:\n  dsn: \"" + tt.dsn + "\"\n"
			if tt.dsn == "" {
				text = "data_dir: " + tt.dataDir + "\nhttp: {addr: 127.0.0.1:0}\n"
			}
			if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			stdout, stderr, err := runCmd(t, "check-config", "--config", path)
			switch {
			case tt.refused != "":
				want := fmt.Sprintf("%s:%d: %s; serve refuses to start with it\n", path, tt.line, tt.refused)
				if err == nil || stderr != want {
					t.Errorf("check-config = %v, stderr %q; want an error and stderr %q", err, stderr, want)
				}
				_, _, err = runCmd(t, "serve", "--config", path)
				if want := fmt.Sprintf("%s:%d: %s", path, tt.line, tt.refused); err == nil || err.Error() != want {
					t.Errorf("serve = %v, want %q", err, want)
				}
				if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("serve made %s (stat: %v), want nothing made", missing, err)
				}
			case tt.note != "":
				want := fmt.Sprintf("note: %s:%d: %s\n", path, tt.line, tt.note)
				if err != nil || stdout != "config ok\n" || stderr != want {
					t.Errorf("check-config = %v, stdout %q, stderr %q; want config ok and stderr %q", err, stdout, stderr, want)
				}
			default:
				if err != nil || stdout != "config ok\n" || stderr != "" {
					t.Errorf("check-config = %v, stdout %q, stderr %q; want config ok alone", err, stdout, stderr)
				}
			}
		})
	}

	t.Run("the note goes with a start that goes ahead only", func(t *testing.T) {
		_, stderr, err := runCmd(t, "check-config", "--data-dir", filepath.Join(dir, "data"), "--log-level", "loud")
		if err == nil || strings.Contains(stderr, "note:") {
			t.Errorf("check-config = %v, stderr %q; want an error, and no note", err, stderr)
		}
	})
	t.Run("a PostgreSQL DSN is not taken for a path", func(t *testing.T) {
		t.Setenv("AGENTGATE_STORE_DSN", "postgres://agentgate:s3cret@db.invalid/x/y")
		_, stderr, err := runCmd(t, "check-config", "--data-dir", dir)
		const want = "store.dsn: is a PostgreSQL connection string, but store.driver is sqlite: set store.driver: postgres (set by AGENTGATE_STORE_DSN)\n"
		if err == nil || stderr != want {
			t.Errorf("check-config = %v, stderr %q; want an error and stderr %q", err, stderr, want)
		}
	})
	// The directory of a database in a data_dir that is not there yet is made with it.
	t.Run("serve makes the data_dir of its store.dsn", func(t *testing.T) {
		dataDir := filepath.Join(t.TempDir(), "data")
		d := MustServe(t, dataDir, "AGENTGATE_STORE_DSN="+filepath.Join(dataDir, "agentgate.db"))
		if err := d.stop(t, 30*time.Second); err != nil {
			t.Errorf("daemon exit: %v", err)
		}
		if _, err := os.Stat(filepath.Join(dataDir, "agentgate.db")); err != nil {
			t.Errorf("the database in the data_dir made: %v", err)
		}
	})
}

// TestCheckConfigPostgresAdvice: check-config warns, at store.dsn's line and without quoting
// it, of a PostgreSQL DSN that holds the password or names no search_path, as README advises
// against both; it says "config ok" all the same. Before, nothing (found by a new user's
// walkthrough).
func TestCheckConfigPostgresAdvice(t *testing.T) {
	for _, name := range []string{"PGOPTIONS", "PGSSLMODE", "PGSERVICE", "PGSERVICEFILE", "PGPASSFILE"} {
		t.Setenv(name, "") // (restored at the end of the test)
		os.Unsetenv(name)
	}
	const (
		password = "warning: %s:4: store.dsn: holds the database password: keep it out of the configuration, in PGPASSWORD or a passfile (~/.pgpass)\n"
		noSchema = "warning: %s:4: store.dsn: names no search_path: the tables go into the first schema of PostgreSQL's default, " +
			`"$user", public, which changes once a schema named after the user exists: name the schema (search_path=public for the default)` + "\n"
	)
	for _, tt := range []struct {
		name, dsn string
		want      []string // formats of stderr's lines, given the file's path
	}{
		{"both", "postgres://u:secretpw@127.0.0.1:5432/db", []string{password, noSchema}},
		{"a password in key=value pairs", "host=127.0.0.1 dbname=db password=secretpw search_path=public", []string{password}},
		{"no search_path", "postgres://u@127.0.0.1:5432/db?sslmode=disable", []string{noSchema}},
		{"neither", "postgres://u@127.0.0.1:5432/db?search_path=public", nil},
		{"search_path in options, as psql takes it", "postgres://u@127.0.0.1:5432/db?options=-csearch_path%3Dteam_a", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agentgate.yaml")
			if err := os.WriteFile(path, []byte("data_dir: "+t.TempDir()+"\nstore:\n  driver: postgres\n  dsn: \""+tt.dsn+"\"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			var want strings.Builder
			for _, w := range tt.want {
				fmt.Fprintf(&want, w, path)
			}
			stdout, stderr, err := runCmd(t, "check-config", "--config", path)
			if err != nil || stdout != "config ok\n" || stderr != want.String() {
				t.Errorf("check-config = %v, stdout %q, stderr %q; want config ok and stderr %q", err, stdout, stderr, want.String())
			}
			if strings.Contains(stderr, "secretpw") || strings.Contains(stderr, "127.0.0.1") {
				t.Errorf("check-config stderr %q quotes the DSN", stderr)
			}
		})
	}
	t.Run("PGOPTIONS names it", func(t *testing.T) {
		t.Setenv("PGOPTIONS", "-c search_path=team_a")
		t.Setenv("AGENTGATE_STORE_DRIVER", "postgres")
		t.Setenv("AGENTGATE_STORE_DSN", "postgres://u@127.0.0.1:5432/db")
		if stdout, stderr, err := runCmd(t, "check-config", "--data-dir", t.TempDir()); err != nil || stdout != "config ok\n" || stderr != "" {
			t.Errorf("check-config = %v, stdout %q, stderr %q; want config ok alone", err, stdout, stderr)
		}
	})
}

// TestServePrintsEachConfigProblem: serve prints a configuration's problems one a line, each
// after "agentgate: " and at its file's line, as check-config does, and ends with their count.
// Before, all of them on one line, hard to read in a journal (found by a new user's
// walkthrough).
func TestServePrintsEachConfigProblem(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte("sessions:\n  queue:\n    mode: fast\n    cap: 0\nbogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"serve"}, {"sessions", "list"}, {"backup", filepath.Join(t.TempDir(), "b.db")}} {
		_, _, err := runCmd(t, append(args, "--config", path)...)
		if err == nil {
			t.Fatalf("%s = nil error, want the problems", args)
		}
		var printed bytes.Buffer
		printError(&printed, err) // what main prints
		want := "agentgate: " + path + `:3: sessions.queue.mode: "fast": must be one of followup, collect, interrupt, steer` + "\n" +
			"agentgate: " + path + ":4: sessions.queue.cap: 0: must be at least 1\n" +
			"agentgate: " + path + ":5: bogus: unknown key\n" +
			"agentgate: config has 3 problem(s)\n"
		if got := printed.String(); got != want {
			t.Errorf("%s prints %q, want %q", args, got, want)
		}
	}
	// One problem is one line, as before.
	if err := os.WriteFile(path, []byte("bogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err := runCmd(t, "serve", "--config", path)
	var printed bytes.Buffer
	printError(&printed, err)
	if got, want := printed.String(), "agentgate: config: "+path+":1: bogus: unknown key\n"; got != want {
		t.Errorf("serve prints %q, want %q", got, want)
	}
}

// TestSessionsPinPostgresRefusalOnItsLine: a file the PostgreSQL DSN names that is not here is
// named by the sessions commands at store.dsn's line, as serve and check-config name it. Before,
// without the line (found by a new user's walkthrough).
func TestSessionsPinPostgresRefusalOnItsLine(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "agentgate.yaml")
	gone := filepath.Join(dir, "gone.pem")
	if err := os.WriteFile(path, []byte("data_dir: "+dir+"\nstore:\n  driver: postgres\n  dsn: \"postgres://db.invalid/agentgate?search_path=public&sslmode=verify-full&sslrootcert="+gone+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := path + ":4: store.dsn: names a file that cannot be read here: failed to configure TLS: unable to read CA file: open " + gone + ": no such file or directory"
	for _, args := range [][]string{{"sessions", "list"}, {"sessions", "show", "agent:main:http:dm:alice"}, {"serve", "--http-addr", "127.0.0.1:0"}} {
		if _, _, err := runCmd(t, append(args, "--config", path)...); err == nil || err.Error() != want {
			t.Errorf("%s = %v, want %q", args, err, want)
		}
	}
}

// TestServeWarnsOfAPostgresDSNAgainstAdvice: serve says what check-config warns of in a
// PostgreSQL store.dsn (the password in it, no search_path), for a deploy that skipped
// check-config, and never quotes the DSN.
func TestServeWarnsOfAPostgresDSNAgainstAdvice(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agentgate.yaml")
	// Nothing listens on port 1: serve stops at the store's open, after its warnings.
	text := "data_dir: " + t.TempDir() + "\nhttp: {addr: 127.0.0.1:0}\nstore:\n  driver: postgres\n" +
		"  dsn: postgres://u:s3cretpw@127.0.0.1:1/db?connect_timeout=2\n"
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	_, stderr, err := runCmd(t, "serve", "--config", path)
	if err == nil {
		t.Fatal("serve with no database = nil error, want its refusal")
	}
	for _, want := range []string{"holds the database password", "names no search_path"} {
		if !strings.Contains(stderr, `WRN store.dsn goes against README's advice; serving all the same err="store.dsn: `+want) {
			t.Errorf("serve's log has no warning %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "s3cretpw") || strings.Contains(err.Error(), "s3cretpw") {
		t.Errorf("serve quoted the password:\n%s\n%v", stderr, err)
	}
}

// TestCheckConfigWarnsOfAKeyOverPlainHTTP: check-config warns, at base_url's line, of an API key
// that the openai backend would send over plain http to another host (serve warns only once it
// runs); a loopback endpoint, https, or no key is no warning.
func TestCheckConfigWarnsOfAKeyOverPlainHTTP(t *testing.T) {
	t.Setenv("WALK_KEY", "sk-test")
	for _, tt := range []struct{ name, baseURL, keyEnv, want string }{
		{"another host", "http://192.0.2.1/v1", "WALK_KEY",
			"warning: %s:6: agent.openai.base_url: sends the API key over plain http to 192.0.2.1, where anyone on the way can read it: use https\n"},
		{"https", "https://192.0.2.1/v1", "WALK_KEY", ""},
		{"loopback", "http://127.0.0.1:8000/v1", "WALK_KEY", ""},
		{"no key", "http://192.0.2.1/v1", `""`, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			checkConfigWarns(t, "agent:\n  backend: openai\n  openai:\n    model: m\n    base_url: "+tt.baseURL+
				"\n    api_key_env: "+tt.keyEnv+"\n", tt.want)
		})
	}
}

// TestCheckConfigWarnsOfAShortToken: check-config warns, at token_env's line, of a bearer token
// shorter than 16 characters (AG_TOKEN=x passed without a word), without the token, and still
// says config ok; a long token is no warning.
func TestCheckConfigWarnsOfAShortToken(t *testing.T) {
	for _, tt := range []struct{ name, token, want string }{
		{"short", "sh0rt\n", `warning: %s:4: http.token_env: "WALK_TOKEN": holds a token shorter than 16 characters, which can be guessed: ` +
			"use a long random one, such as the output of openssl rand -hex 32\n"},
		{"long", "0123456789abcdef", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("WALK_TOKEN", tt.token)
			checkConfigWarns(t, "http:\n  addr: 127.0.0.1:0\n  token_env: WALK_TOKEN\n", tt.want)
		})
	}
}

// TestCheckConfigWarnsOfADiscordTokenOfAnotherShape: check-config warns, at token_env's line,
// of a Discord bot token of a shape no bot token has (the application's ID pasted in its place),
// naming the variable and never the token, and still says config ok (Discord may change the
// format); a token of the shape, with the "Bot " prefix the platform cuts, is no warning.
// Before, any value passed without a word, and only the connection told.
func TestCheckConfigWarnsOfADiscordTokenOfAnotherShape(t *testing.T) {
	for _, tt := range []struct{ name, token, want string }{
		{"an application ID", "123456789012345678\n", `warning: %s:5: platforms.discord.token_env: "WALK_BOT": holds a value that does not look like a bot token: ` +
			"it is all digits, the form of the application's (client) ID or a user's ID, not of a bot token; copy the token from the Developer Portal's Bot page " +
			"(Reset Token shows a new one); serve starts with it all the same, in case Discord changed the format, and Discord refuses a wrong one at the connection\n"},
		{"a bot token", "Bot MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBc12.x_y-Z0123456789abcdefghijKLMNOP", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("WALK_BOT", tt.token)
			checkConfigWarns(t, "platforms:\n  discord:\n    enabled: true\n    token_env: WALK_BOT\n", tt.want)
		})
	}
}

// checkConfigWarns runs check-config on a file of text after its data_dir line (a data directory
// that holds a database, so that check-config notes no new one), and fails the test unless it
// says config ok with want on stderr, in which %s stands for the file's path ("": nothing).
func checkConfigWarns(t *testing.T, text, want string) {
	t.Helper()
	path, dataDir := filepath.Join(t.TempDir(), "agentgate.yaml"), t.TempDir()
	if err := os.WriteFile(filepath.Join(dataDir, "agentgate.db"), []byte("not read here"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("data_dir: "+dataDir+"\n"+text), 0o600); err != nil {
		t.Fatal(err)
	}
	if want != "" {
		want = fmt.Sprintf(want, path)
	}
	stdout, stderr, err := runCmd(t, "check-config", "--config", path)
	if err != nil || stdout != "config ok\n" || stderr != want {
		t.Errorf("check-config = %v, stdout %q, stderr %q; want config ok and stderr %q", err, stdout, stderr, want)
	}
}

// TestCheckConfigNamesTheVariableOfAnotherKey: a problem of one key that a variable on another
// key causes names that variable, in check-config's and serve's words alike, so that an operator
// who never wrote a config file sees where the value came from. Before, AGENTGATE_AGENT_BACKEND=exec
// alone read "agent.exec.command: required when agent.backend is exec".
func TestCheckConfigNamesTheVariableOfAnotherKey(t *testing.T) {
	t.Setenv("AGENTGATE_AGENT_BACKEND", "exec")
	dataDir := filepath.Join(t.TempDir(), "data")
	const problem = "agent.exec.command: required when agent.backend is exec (agent.backend set by AGENTGATE_AGENT_BACKEND)"
	if _, stderr, err := runCmd(t, "check-config", "--data-dir", dataDir); err == nil || stderr != problem+"\n" {
		t.Errorf("check-config = %v, stderr %q; want an error and stderr %q", err, stderr, problem+"\n")
	}
	if _, _, err := runCmd(t, "serve", "--data-dir", dataDir, "--http-addr", "127.0.0.1:0"); err == nil || err.Error() != "config: "+problem {
		t.Errorf("serve = %v, want %q", err, "config: "+problem)
	}
}
