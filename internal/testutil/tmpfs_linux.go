package testutil

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// namespaceChildEnv marks the run of a test that is inside its own user and mount namespaces,
// where it may mount a file system (TmpfsOfItsOwn).
const namespaceChildEnv = "AGENTGATE_TEST_NAMESPACE_CHILD"

// TmpfsOfItsOwn mounts a tmpfs of size (as "4m") for the test t, on a directory of
// t.TempDir(), and returns the directory; t may fill it or make it read-only. A tmpfs needs
// user and mount namespaces: in the test binary's own run, tmpfsOfItsOwn runs t again inside
// them (unshare), fails t if it failed there, skips it where they cannot be made, and returns
// "": the caller then returns. The store's full-disk and read-only tests use it, and
// check-config's and serve's of a disk nearly full.
func TmpfsOfItsOwn(t *testing.T, size string) string {
	t.Helper()
	if os.Getenv(namespaceChildEnv) == "" {
		cmd := exec.Command("unshare", "--user", "--map-root-user", "--mount",
			os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), namespaceChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		if strings.HasPrefix(string(out), "unshare:") || errors.Is(err, exec.ErrNotFound) {
			t.Skipf("user and mount namespaces cannot be made here: %v: %s", err, out)
		}
		if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
			t.Errorf("the test in its namespaces: %v\n%s", err, out)
		}
		return ""
	}
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size="+size); err != nil {
		t.Fatalf("mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(mnt, 0) }) // before t.TempDir removes mnt
	return mnt
}

// MustFill writes zeros to a new file at path until its file system is full, to the last
// block: in 64 KiB writes, then in 512-byte ones.
func MustFill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, size := range []int{64 << 10, 512} {
		chunk := make([]byte, size)
		for {
			if _, err := f.Write(chunk); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
	}
}

// DataDirLinkedTo returns a new data directory on the test's own disk whose agentgate.db is a
// symbolic link to a file not made yet in dir (a tmpfs of its own): SQLite writes the database,
// its -wal and its -shm at the link's target, on dir's disk.
func DataDirLinkedTo(t *testing.T, dir string) string {
	t.Helper()
	data := t.TempDir()
	if err := os.Symlink(filepath.Join(dir, "agentgate.db"), filepath.Join(data, "agentgate.db")); err != nil {
		t.Fatal(err)
	}
	return data
}
