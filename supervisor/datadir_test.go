package supervisor

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/persistence"
)

// TestLockDataDir: the data directory's lock is its lock file, opened for writing (an
// exclusive flock on NFS is a byte-range lock, which a directory opened to read cannot take);
// a second daemon is refused with the file named, and takes it once the first lets go.
func TestLockDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data") // created by the lock
	first, err := lockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, DirLockFile); first.Name() != want {
		t.Errorf("the lock is held on %s, want %s", first.Name(), want)
	}
	if _, err := first.Write(nil); err != nil {
		t.Errorf("the lock file is not open for writing: %v", err)
	}
	_, err = lockDataDir(dir)
	if !errors.Is(err, persistence.ErrLocked) || !strings.Contains(err.Error(), DirLockFile) {
		t.Fatalf("second lock = %v, want ErrLocked naming %s", err, DirLockFile)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second, err := lockDataDir(dir)
	if err != nil {
		t.Fatalf("lock once the first let go: %v", err)
	}
	second.Close()
}
