package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestDataDirDeniedSaysWhatToDo: an admin command run by a user that may not read its data
// directory (the daemon's, 0700), or may not write it to reset or pardon, or may not read the
// database a restore left root's, fails with one line that says so: the data directory, this
// user, whose the path that stops it is and its mode, and what to do: run the command as the
// daemon's user, or give this user access; or, of a file in the data directory that is not its
// owner's, give it to that user. Before, the sessions commands and backup printed the
// raw error of whatever failed first ("open …/agentgate.db: stat …/agentgate.db: permission
// denied", "data directory …: lock: open …/agentgate-dir.flock: permission denied"), which
// named neither the user nor a way out (a CLI review). As root, which may read anything, the
// commands run as nobody; otherwise the directory's mode shuts this user out.
func TestDataDirDeniedSaysWhatToDo(t *testing.T) {
	seeded := MustSeedSessions(t)
	bin := MustBuild(t)
	uid, root := os.Getuid(), os.Geteuid() == 0
	var dir string
	if root {
		dir, bin = dirForAnotherUser(t, bin)
		uid = 65534 // nobody
	} else {
		dir = t.TempDir()
	}
	runAs := func(t *testing.T, args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		if root {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		}
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("agentgate %s: %v", strings.Join(args, " "), err)
		}
		return string(out), cmd.ProcessState.ExitCode()
	}
	// mkData makes a data directory in dir holding the seeded database, with the modes given;
	// as root they are root's, else this user's. nobodyDir gives the directory to nobody (as
	// root only).
	mkData := func(t *testing.T, name string, dirMode, dbMode os.FileMode, nobodyDir bool) string {
		t.Helper()
		data := filepath.Join(dir, name)
		if err := os.Mkdir(data, 0o700); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(seeded, "agentgate.db"))
		if err != nil {
			t.Fatal(err)
		}
		db := filepath.Join(data, "agentgate.db")
		if err := os.WriteFile(db, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if nobodyDir {
			if err := os.Chown(data, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}
		for p, m := range map[string]os.FileMode{db: dbMode, data: dirMode} {
			if err := os.Chmod(p, m); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { os.Chmod(data, 0o700) }) // (so that it can be removed)
		return data
	}

	copies := filepath.Join(dir, "copies") // (backup's FILE: where this user may write)
	if err := os.Mkdir(copies, 0o755); err != nil {
		t.Fatal(err)
	}
	if root {
		if err := os.Chown(copies, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	readers := func(data string) [][]string {
		return [][]string{
			{"sessions", "list", "--data-dir", data},
			{"sessions", "show", "--data-dir", data, keyA},
			{"sessions", "export", "--data-dir", data, keyA},
			{"sessions", "search", "--data-dir", data, "hello"},
			{"sessions", "quarantined", "--data-dir", data},
			{"backup", "--data-dir", data, filepath.Join(copies, "copy.db")},
		}
	}
	writers := func(data string) [][]string {
		return [][]string{
			{"sessions", "reset", "--data-dir", data, keyA},
			{"sessions", "pardon", "--data-dir", data, "--all"},
		}
	}
	// As root the directories are root's, and the way out is to run the command as their
	// owner; otherwise they are this user's own, and it is chmod
	// (TestDeniedByItsOwnModeSaysChmod).
	owner, wayOut := "this user's", "; give this user access to it: chmod u+r"
	if root {
		owner, wayOut = "root's (uid 0)", "; run the command as the daemon's user (sudo -u "
	}
	unreadable := mkData(t, "unreadable", 0o700, 0o600, false)
	if !root {
		if err := os.Chmod(unreadable, 0); err != nil {
			t.Fatal(err)
		}
	}
	unwritable := mkData(t, "unwritable", 0o755, 0o644, false)
	if !root {
		if err := os.Chmod(unwritable, 0o555); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		cmds [][]string
		want []string // in the one line of stderr
	}{
		{"a data directory this user may not read", append(readers(unreadable), writers(unreadable)...), []string{
			"the data directory " + unreadable + " is not ",
			fmt.Sprintf(" by this user, uid %d", uid),
			fmt.Sprintf(": %s is %s, mode d", unreadable, owner),
			wayOut,
		}},
		{"a data directory this user may read, not write", writers(unwritable), []string{
			"the data directory " + unwritable + " is not writable by this user, uid ",
			fmt.Sprintf(": %s is %s, mode d", unwritable, owner),
			wayOut,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, args := range tc.cmds {
				out, code := runAs(t, args...)
				if code != 1 {
					t.Errorf("agentgate %s: exit %d, want 1: %s", strings.Join(args, " "), code, out)
				}
				if n := strings.Count(out, "\n"); n != 1 || !strings.HasPrefix(out, "agentgate: ") {
					t.Errorf("agentgate %s: %d lines, want one error line: %s", strings.Join(args, " "), n, out)
				}
				for _, w := range tc.want {
					if !strings.Contains(out, w) {
						t.Errorf("agentgate %s:\n%s\nwant it to say %q", strings.Join(args, " "), out, w)
					}
				}
			}
		})
	}

	t.Run("a database a restore left root's", func(t *testing.T) {
		if !root {
			t.Skip("a file another user owns needs root to make")
		}
		// What to do is not to run the command as root, whose the file is, but to give it to the
		// daemon's user, whose the data directory is: the daemon cannot use it either.
		data := mkData(t, "restored", 0o700, 0o600, true) // nobody's directory, root's database
		for _, args := range readers(data) {
			out, code := runAs(t, args...)
			for _, want := range []string{
				"the data directory " + data + " is not readable by this user, uid 65534",
				": agentgate.db is root's (uid 0), mode -rw-------",
				"; the data directory is this user's: give the file to the daemon's user (chown nobody " + filepath.Join(data, "agentgate.db") + ")",
			} {
				if code != 1 || !strings.Contains(out, want) {
					t.Errorf("agentgate %s: exit %d: %s\nwant exit 1, and it to say %q", strings.Join(args, " "), code, out, want)
				}
			}
		}
	})
}

// TestDeniedByItsOwnModeSaysChmod: a data directory, or a database, that is this user's own
// but whose mode shuts this user out (chmod 000, a read-only directory for a reset) is not
// mended by running the command as its owner, this user: the error says to give this user
// access with chmod, naming the path. Before, it said "run the command as the daemon's user
// (sudo -u nobody agentgate …)" to nobody, which changes nothing. As root, which its modes do
// not stop, the commands run as nobody on nobody's directories.
func TestDeniedByItsOwnModeSaysChmod(t *testing.T) {
	seeded := MustSeedSessions(t)
	bin := MustBuild(t)
	root := os.Geteuid() == 0
	var dir string
	if root {
		dir, bin = dirForAnotherUser(t, bin)
	} else {
		dir = t.TempDir()
	}
	// mk makes the data directory name holding the seeded database, this user's (nobody's as
	// root), with the modes given.
	mk := func(t *testing.T, name string, dirMode, dbMode os.FileMode) string {
		t.Helper()
		data := filepath.Join(dir, name)
		b, err := os.ReadFile(filepath.Join(seeded, "agentgate.db"))
		if err != nil {
			t.Fatal(err)
		}
		db := filepath.Join(data, "agentgate.db")
		if err := os.Mkdir(data, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(db, b, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{data, db} {
			if root {
				if err := os.Chown(p, 65534, 65534); err != nil {
					t.Fatal(err)
				}
			}
		}
		for p, m := range map[string]os.FileMode{db: dbMode, data: dirMode} {
			if err := os.Chmod(p, m); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { os.Chmod(data, 0o700) })
		return data
	}
	shut := mk(t, "shut", 0, 0o600)
	readOnly := mk(t, "read-only", 0o555, 0o644)
	dbShut := mk(t, "db-shut", 0o700, 0)
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"a data directory of mode 000", []string{"sessions", "list", "--data-dir", shut}, []string{
			"the data directory " + shut + " is not readable by this user",
			fmt.Sprintf(": %s is this user's, mode d---------", shut),
			"; give this user access to it: chmod u+rx " + shut,
		}},
		{"a read-only data directory, for a reset", []string{"sessions", "reset", "--data-dir", readOnly, keyA}, []string{
			"the data directory " + readOnly + " is not writable by this user",
			fmt.Sprintf(": %s is this user's, mode dr-xr-xr-x", readOnly),
			"; give this user access to it: chmod u+rwx " + readOnly,
		}},
		{"a database of mode 000", []string{"sessions", "list", "--data-dir", dbShut}, []string{
			"the data directory " + dbShut + " is not readable by this user",
			": agentgate.db is this user's, mode ----------",
			"; give this user access to it: chmod u+r " + filepath.Join(dbShut, "agentgate.db"),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, tc.args...)
			if root {
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			}
			out, _ := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); code != 1 {
				t.Errorf("agentgate %s: exit %d, want 1: %s", strings.Join(tc.args, " "), code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("agentgate %s:\n%s\nwant it to say %q", strings.Join(tc.args, " "), out, w)
				}
			}
			if strings.Contains(string(out), "sudo -u") {
				t.Errorf("agentgate %s:\n%s\nwant no sudo -u: the path is this user's", strings.Join(tc.args, " "), out)
			}
		})
	}
}

// TestDeniedRestoredDatabaseInARelativeDataDir: a database a restore left root's, in a data
// directory named relative to the working directory (as the default ./data is), is said to be
// given to the daemon's user (chown), as it is in one named in full. Before, the file was not
// recognised as one in the data directory (filepath.Rel of an absolute path to a relative
// directory fails), and the error said to run the command as root, whose the file is.
func TestDeniedRestoredDatabaseInARelativeDataDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a file another user owns needs root to make")
	}
	seeded := MustSeedSessions(t)
	dir, bin := dirForAnotherUser(t, MustBuild(t))
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(data, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(seeded, "agentgate.db"))
	if err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(data, "agentgate.db")
	if err := os.WriteFile(db, b, 0o600); err != nil { // root's
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"sessions", "list", "--data-dir", "data"},
		{"sessions", "list", "--data-dir", "./data"},
		{"backup", "--data-dir", "data", filepath.Join(dir, "copy.db")},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, _ := cmd.CombinedOutput()
		for _, want := range []string{
			": agentgate.db is root's (uid 0), mode -rw-------",
			"; the data directory is this user's: give the file to the daemon's user (chown nobody " + db + ")",
		} {
			if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(string(out), want) {
				t.Errorf("agentgate %s (in %s): exit %d: %s\nwant exit 1, and it to say %q", strings.Join(args, " "), dir, code, out, want)
			}
		}
	}
}

// accessWorld is a directory for a test of what an admin command says of a path this user may
// not use, with bin, the built binary to run there, and uid, the user it runs as: as root,
// which may use anything, nobody (dirForAnotherUser), else this user.
type accessWorld struct {
	dir, bin string
	uid      int
	root     bool
}

func newAccessWorld(t *testing.T) *accessWorld {
	t.Helper()
	dir, bin, uid := dirForAccessTests(t)
	w := &accessWorld{dir: dir, bin: bin, uid: uid, root: bin != ""}
	if !w.root {
		w.bin = MustBuild(t)
	}
	return w
}

// owner is how an error names the owner of the files the test makes: root's as root.
func (w *accessWorld) owner() string {
	if w.root {
		return "root's (uid 0)"
	}
	return "this user's"
}

// give makes the paths the command's user's (as root; else they are already).
func (w *accessWorld) give(t *testing.T, paths ...string) {
	t.Helper()
	if !w.root {
		return
	}
	for _, p := range paths {
		if err := os.Chown(p, w.uid, w.uid); err != nil {
			t.Fatal(err)
		}
	}
}

// shut makes path a directory the command's user may not use: root's with mode (as root), else
// of mode asUser; it gets its mode back at the end, so that it can be removed.
func (w *accessWorld) shut(t *testing.T, path string, mode, asUser os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if !w.root {
		mode = asUser
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(path, 0o700) })
}

// run runs agentgate with args in the test's directory as the command's user.
func (w *accessWorld) run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(w.bin, args...)
	cmd.Dir = w.dir
	if w.root {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(w.uid), Gid: uint32(w.uid)}}
	}
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("agentgate %s: %v", strings.Join(args, " "), err)
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

// seeded makes a data directory named name in the test's directory, the command's user's, with
// the seeded database.
func (w *accessWorld) seeded(t *testing.T, name string) string {
	t.Helper()
	data := filepath.Join(w.dir, name)
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	copyFile(t, filepath.Join(MustSeedSessions(t), "agentgate.db"), filepath.Join(data, "agentgate.db"))
	w.give(t, data, filepath.Join(data, "agentgate.db"))
	return data
}

// TestBackupIntoADirectoryThisUserMayNotWrite: a backup to a directory this user may not write,
// or under one it may not enter, fails with one line that says so: the backup's directory, this
// user, which path stops it, whose that is and its mode, and what to do, as an admin command
// says of a data directory it may not use (denied). Before, it printed the raw error of the
// temporary file it could not make, "back up X to Y: open DIR/.Y.NNN.partial: permission
// denied", or "lstat …: permission denied", which named neither the user nor a way out (a CLI
// review).
func TestBackupIntoADirectoryThisUserMayNotWrite(t *testing.T) {
	w := newAccessWorld(t)
	data := w.seeded(t, "data")
	locked := filepath.Join(w.dir, "locked")
	w.shut(t, locked, 0o755, 0o555)
	private := filepath.Join(w.dir, "private")
	if err := os.MkdirAll(filepath.Join(private, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	w.shut(t, private, 0o700, 0)
	mode := map[bool]string{true: "drwxr-xr-x", false: "dr-xr-xr-x"}[w.root]
	privateMode := map[bool]string{true: "drwx------", false: "d---------"}[w.root]
	for _, tc := range []struct {
		name, out, blocker, mode string
	}{
		{"a directory this user may not write", filepath.Join(locked, "copy.db"), locked, mode},
		{"under a directory this user may not enter", filepath.Join(private, "sub", "copy.db"), private, privateMode},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := w.run(t, "backup", "--data-dir", data, tc.out)
			if code != 1 {
				t.Errorf("backup: exit %d, want 1: %s", code, stderr)
			}
			if n := strings.Count(stderr, "\n"); n != 1 || !strings.HasPrefix(stderr, "agentgate: ") {
				t.Errorf("backup: %d lines, want one error line: %s", n, stderr)
			}
			for _, want := range []string{
				"agentgate: back up " + filepath.Join(data, "agentgate.db") + " to " + tc.out + ": the backup's directory " +
					filepath.Dir(tc.out) + fmt.Sprintf(" is not writable by this user, uid %d", w.uid),
				fmt.Sprintf(": %s is %s, mode %s (", tc.blocker, w.owner(), tc.mode),
				": permission denied); back up into a directory this user may write (one of its own), or give this user access\n",
			} {
				if !strings.Contains(stderr, want) {
					t.Errorf("backup:\n%s\nwant it to say %q", stderr, want)
				}
			}
		})
	}
}

// TestUnreadableSpoolWarningSaysWhatItMeans: a reading command, or backup, run by a user that may
// read the data directory but not its spool (0700, as the daemon makes it; root's, as a run as
// root leaves it) warns on one line what that means for its output, that it may lack writes
// still waiting there, and which path stops this user, whose it is and what to do (denied).
// Before, the warning was the raw "could not read …/spool: spool: open …/spool: permission
// denied" (a CLI review). The data directory is given relative to the working directory, as an
// operator types it: the spool is named as a file of the data directory all the same.
func TestUnreadableSpoolWarningSaysWhatItMeans(t *testing.T) {
	w := newAccessWorld(t)
	data := w.seeded(t, "data")
	if err := os.Chmod(data, 0o755); err != nil {
		t.Fatal(err)
	}
	spool := filepath.Join(data, "spool")
	w.shut(t, spool, 0o700, 0)
	copies := filepath.Join(w.dir, "copies")
	if err := os.Mkdir(copies, 0o755); err != nil {
		t.Fatal(err)
	}
	w.give(t, copies)
	todo := "; run the command as the daemon's user (sudo -u "
	if w.root {
		// The data directory is nobody's, the daemon's user: the spool root's stops the
		// daemon's start too.
		todo = "; the data directory is this user's: give the directory to the daemon's user (chown -R nobody " + spool + ")\n"
	}
	for _, tc := range []struct {
		args  []string
		what  string
		empty bool // (nothing is quarantined: stdout says nothing)
	}{
		{[]string{"sessions", "list"}, "what this prints", false},
		{[]string{"sessions", "show", keyA}, "what this prints", false},
		{[]string{"sessions", "export", keyA}, "what this prints", false},
		{[]string{"sessions", "search", "hello"}, "what this prints", false},
		{[]string{"sessions", "quarantined"}, "what this prints", true},
		{[]string{"backup", filepath.Join("copies", "copy.db")}, "the backup", false},
	} {
		args := append(tc.args, "--data-dir", "data")
		stdout, stderr, code := w.run(t, args...)
		if code != 0 || (stdout == "") != tc.empty {
			t.Errorf("agentgate %s: exit %d, stdout %q, want 0 and its output: %s", strings.Join(args, " "), code, stdout, stderr)
		}
		var warning string
		for line := range strings.Lines(stderr) {
			if strings.HasPrefix(line, "warning: ") {
				warning = line
			}
		}
		for _, want := range []string{
			"warning: " + tc.what + " may lack writes still waiting in the spool, which the database does not have yet: " +
				fmt.Sprintf("the spool directory %s is not readable by this user, uid %d", filepath.Join("data", "spool"), w.uid),
			fmt.Sprintf(": spool is %s, mode d", w.owner()),
			todo,
		} {
			if !strings.Contains(warning, want) {
				t.Errorf("agentgate %s: stderr\n%s\nwant a warning that says %q", strings.Join(args, " "), stderr, want)
			}
		}
	}
}
