package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
		// serve's error, after "config: FILE:LINE: " (or, with a FILE:LINE in it, whole)
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
		// serve refuses it at start, in the exec agent's words.
		{"an agent command not on PATH", "agent:\n  backend: exec\n  exec:\n    command: [agentgate-test-no-such-agent, --fast]\n", 5,
			`agent.exec.command: exec agent: command "agentgate-test-no-such-agent" is not found in PATH (give its full path); serve refuses to start with it`,
			`start: agent: exec agent: command "agentgate-test-no-such-agent" is not found in PATH (give its full path)`},
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
			if serveWant == "" {
				serveWant = "config: " + strings.TrimSuffix(want, "\n")
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
// "config ok" of a data_dir under a file, and serve failed where it made the database.
func TestCheckConfigDataDir(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, dataDir, want string // want: the problem after `data_dir: "<dataDir>": `; "" is config ok
	}{
		{"under a file", filepath.Join(file, "data"), "cannot be made: " + file + " is not a directory"},
		{"deeper under a file", filepath.Join(file, "a", "b"), "cannot be made: " + file + " is not a directory"},
		{"one that can be made", filepath.Join(dir, "new", "data"), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agentgate.yaml")
			if err := os.WriteFile(path, []byte("log: {level: info}\ndata_dir: "+tt.dataDir+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			stdout, stderr, err := runCmd(t, "check-config", "--config", path)
			if _, statErr := os.Stat(filepath.Join(dir, "new")); !errors.Is(statErr, fs.ErrNotExist) {
				t.Errorf("check-config made %s (stat: %v), want nothing made", filepath.Join(dir, "new"), statErr)
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
			// Set by a flag, it is not the file's line's.
			if _, stderr, err := runCmd(t, "check-config", "--data-dir", tt.dataDir); err == nil || stderr != problem+"; serve refuses to start with it\n" {
				t.Errorf("check-config --data-dir = %v, stderr %q; want an error and stderr %q", err, stderr, problem+"; serve refuses to start with it\n")
			}
		})
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
	if err := os.WriteFile(path, []byte("data_dir: "+t.TempDir()+"\nstore:\n  driver: postgres\n  dsn: postgres://agentgate:s3cret@db.invalid/agentgate\n"), 0o600); err != nil {
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
