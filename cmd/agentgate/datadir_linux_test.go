package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestCheckConfigDataDirNotWritable: a data_dir this user may not write, or one whose nearest
// existing parent it may not write, is refused by check-config at its line, and by serve. Before,
// check-config said "config ok", and serve failed where it made the database or its lock. As
// root, which may write anything, the commands run as nobody, from the built binary.
func TestCheckConfigDataDirNotWritable(t *testing.T) {
	dir, bin, uid := dirForAccessTests(t)
	root := bin != ""
	ro := filepath.Join(dir, "ro") // this user's, 0700, or root's, 0755 (nobody may read it)
	if err := os.Mkdir(ro, 0o755); err != nil {
		t.Fatal(err)
	}
	if !root {
		if err := os.Chmod(ro, 0o500); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(ro, 0o700) }) // for t.TempDir's removal
	}
	agentgate := func(args ...string) (stderr string, err error) {
		t.Helper()
		if !root {
			_, stderr, err = runCmd(t, args...)
			return stderr, err
		}
		cmd := exec.Command(bin, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		var out strings.Builder
		cmd.Stderr = &out
		err = cmd.Run()
		return out.String(), err
	}
	for _, tt := range []struct {
		name, dataDir, want string
	}{
		{"a directory it may not write", ro,
			fmt.Sprintf("is not writable by this user, uid %d (permission denied): give it to the daemon's user, or set another data_dir", uid)},
		{"a parent it may not write", filepath.Join(ro, "data"),
			fmt.Sprintf("cannot be made: %s is not writable by this user, uid %d (permission denied): give it to the daemon's user, or set another data_dir", ro, uid)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-")+".yaml")
			if err := os.WriteFile(path, []byte("data_dir: "+tt.dataDir+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			problem := fmt.Sprintf("%s:1: data_dir: %q: %s", path, tt.dataDir, tt.want)
			if stderr, err := agentgate("check-config", "--config", path); err == nil || !strings.Contains(stderr, problem+"; serve refuses to start with it\n") {
				t.Errorf("check-config = %v, stderr %q; want an error and %q", err, stderr, problem+"; serve refuses to start with it")
			}
			stderr, err := agentgate("serve", "--config", path, "--http-addr", "127.0.0.1:0")
			if err == nil || !strings.Contains(stderr+fmt.Sprint(err), problem) {
				t.Errorf("serve = %v, stderr %q; want it refused with %q", err, stderr, problem)
			}
		})
	}
}

// TestCheckConfigDataDirOnReadOnlyMount: a data_dir on a read-only mount, or one to be made
// there, is refused by check-config and by serve with the fix that helps (mount it writable), not
// the one for a directory of another user (give it to the daemon's user), which no chown mends.
// It mounts a read-only tmpfs in a mount namespace of its own (unshare -m, which leaves the
// host's mounts alone), so it needs root and unshare(1); it is skipped without them.
func TestCheckConfigDataDirOnReadOnlyMount(t *testing.T) {
	unshare, ro := readOnlyTmpfs(t)
	bin := MustBuild(t)
	const fix = "(read-only file system): mount it writable, or set another data_dir"
	for _, tt := range []struct {
		name, dataDir, want string
	}{
		{"on it", ro, "is not writable by this user, uid 0 " + fix},
		{"to be made on it", filepath.Join(ro, "data"), "cannot be made: " + ro + " is not writable by this user, uid 0 " + fix},
	} {
		t.Run(tt.name, func(t *testing.T) {
			problem := fmt.Sprintf("data_dir: %q: %s (set by --data-dir)", tt.dataDir, tt.want)
			for _, args := range [][]string{{"check-config"}, {"serve", "--http-addr", "127.0.0.1:0"}} {
				// The mount lives as long as the namespace: the command runs in it, after it.
				script := `mount -t tmpfs -o ro tmpfs "$1" && shift && exec "$@"`
				cmd := exec.Command(unshare, append([]string{"-m", "sh", "-c", script, "sh", ro, bin}, append(args, "--data-dir", tt.dataDir)...)...)
				out, err := cmd.CombinedOutput()
				if err == nil || !strings.Contains(string(out), problem) {
					t.Errorf("%s = %v, output %q; want it refused with %q", args[0], err, out, problem)
				}
			}
		})
	}
}

// TestCheckConfigDataDirInTheKernelsFileSystems: a data_dir in /proc or /sys, or to be made
// there, is refused by check-config and serve, also as root, whom access(2) lets write there.
// Before, as root, check-config said "config ok" of /proc/agentgate or /sys/agentgate.
func TestCheckConfigDataDirInTheKernelsFileSystems(t *testing.T) {
	for _, d := range []string{"/proc", "/sys"} {
		if _, ok := kernelFS(d); !ok {
			t.Skipf("%s is not the kernel's file system here", d)
		}
	}
	const elsewhere = " file system, which holds no files: set another data_dir"
	for _, tt := range []struct{ dataDir, want string }{
		{"/proc/agentgate-test/data", "cannot be made: /proc is in the kernel's proc" + elsewhere},
		{"/sys/agentgate-test", "cannot be made: /sys is in the kernel's sysfs" + elsewhere},
		{"/proc/self", "is in the kernel's proc" + elsewhere},
	} {
		t.Run(tt.dataDir, func(t *testing.T) {
			problem := fmt.Sprintf("data_dir: %q: %s (set by --data-dir)", tt.dataDir, tt.want)
			if _, stderr, err := runCmd(t, "check-config", "--data-dir", tt.dataDir); err == nil || stderr != problem+"; serve refuses to start with it\n" {
				t.Errorf("check-config = %v, stderr %q; want an error and %q", err, stderr, problem+"; serve refuses to start with it\n")
			}
			if _, _, err := runCmd(t, "serve", "--data-dir", tt.dataDir, "--http-addr", "127.0.0.1:0"); err == nil || err.Error() != problem {
				t.Errorf("serve = %v, want %q", err, problem)
			}
		})
	}
}

// TestOfflineCommandsOnReadOnlyMount: sessions reset, pardon and requeue on a data directory on
// a read-only mount say what to do, as serve says it of the same mount (mount it writable), and
// that the commands that only read work there, which list does. Before, they said only "data
// directory …: lock: open …/agentgate-dir.flock: read-only file system". It mounts a tmpfs in a
// mount namespace of its own, copies a data directory onto it and makes it read-only, so it
// needs root and unshare(1); it is skipped without them.
func TestOfflineCommandsOnReadOnlyMount(t *testing.T) {
	unshare, ro := readOnlyTmpfs(t)
	bin := MustBuild(t)
	seed := MustSeedSessions(t)
	// The mount lives as long as the namespace: the command runs in it, after it.
	agentgate := func(args ...string) (string, error) {
		script := `mount -t tmpfs tmpfs "$1" && cp -a "$2"/. "$1"/ && mount -o remount,ro "$1" && shift 2 && exec "$@"`
		cmd := exec.Command(unshare, append([]string{"-m", "sh", "-c", script, "sh", ro, seed, bin}, append(args, "--data-dir", ro)...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, args := range [][]string{
		{"sessions", "reset", keyA}, {"sessions", "pardon", "--all"}, {"sessions", "pardon", keyA}, {"sessions", "requeue", keyA, "m1"},
	} {
		want := "agentgate: " + args[0] + " " + args[1] + ": the data directory " + ro + " is on a read-only file system, and this command writes there " +
			"(its lock, and the database): mount it writable (list, show, export, search and quarantined only read it)\n"
		if out, err := agentgate(args...); err == nil || out != want {
			t.Errorf("%q = %v, output %q; want it refused with %q", args, err, out, want)
		}
	}
	if out, err := agentgate("sessions", "list"); err != nil || !strings.Contains(out, keyA) {
		t.Errorf("sessions list = %v, output %q; want it to list %s", err, out, keyA)
	}
}

// readOnlyTmpfs checks that a read-only tmpfs can be mounted in a mount namespace of its own
// (unshare -m, which leaves the host's mounts alone) at ro, a new directory, and skips the test
// when it cannot (it needs root and unshare(1)). The mount lives only as long as its namespace:
// a command that is to meet it runs in one of its own (unshare -m, mount, then the command).
func readOnlyTmpfs(t *testing.T) (unshare, ro string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounts a read-only tmpfs: needs root")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("needs unshare(1)")
	}
	ro = filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(ro, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(unshare, "-m", "mount", "-t", "tmpfs", "-o", "ro", "tmpfs", ro).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs in a mount namespace of its own: %v: %s", err, out)
	}
	return unshare, ro
}
