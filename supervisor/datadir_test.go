package supervisor

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
)

// TestLockDataDir: the data directory's lock is its lock file, opened for writing (an
// exclusive flock on NFS is a byte-range lock, which a directory opened to read cannot take);
// a second daemon is refused with the file named, and takes it once the first lets go.
func TestLockDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data") // created by the lock
	first, err := LockDataDir(dir, HolderDaemon)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, DirLockFile); first.Name() != want {
		t.Errorf("the lock is held on %s, want %s", first.Name(), want)
	}
	if _, err := first.Write(nil); err != nil {
		t.Errorf("the lock file is not open for writing: %v", err)
	}
	_, err = LockDataDir(dir, HolderDaemon)
	if !errors.Is(err, persistence.ErrLocked) || !strings.Contains(err.Error(), DirLockFile) {
		t.Fatalf("second lock = %v, want ErrLocked naming %s", err, DirLockFile)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second, err := LockDataDir(dir, HolderDaemon)
	if err != nil {
		t.Fatalf("lock once the first let go: %v", err)
	}
	second.Close()
}

// TestStartRefusedForAHeldDataDirMakesNoDatabase: a start on the data directory of a running
// daemon, with a store.dsn that puts its database elsewhere, is refused for the directory's
// lock before the store opens: the file the DSN names, and its lock file, are not made. Before,
// it logged "store opened: a new, empty database" and left both behind (found by a RUNBOOK
// walkthrough).
func TestStartRefusedForAHeldDataDirMakesNoDatabase(t *testing.T) {
	dir := t.TempDir()
	r := startOn(t, dir, 0, echo.New())
	defer r.stop(t)
	other := filepath.Join(t.TempDir(), "other", "other.db")
	cfg := config.Default()
	cfg.DataDir, cfg.Store.DSN, cfg.HTTP.Addr = dir, other, "127.0.0.1:0"
	var logs testutil.Buffer
	d, err := Start(t.Context(), cfg, slog.New(slog.NewTextHandler(&logs, nil)), Options{Agent: echo.New()})
	if err == nil {
		d.Stop(context.Background())
		t.Fatal("Start on a data directory a running daemon holds succeeded, want it refused")
	}
	if !errors.Is(err, ErrDataDirInUse) || !errors.Is(err, persistence.ErrLocked) {
		t.Errorf("Start = %v, want ErrDataDirInUse and persistence.ErrLocked", err)
	}
	if strings.Contains(err.Error(), "locked") {
		t.Errorf("Start = %v, want the refusal worded once, without \"data directory locked\" after it", err)
	}
	for _, p := range []string{other, other + ".lock", filepath.Dir(other)} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after the refused start, %s: %v; want it not made", p, err)
		}
	}
	if strings.Contains(logs.String(), "store opened") || strings.Contains(logs.String(), "serves without a bearer token") {
		t.Errorf("the refused start logged:\n%s\nwant no store opened, and nothing said of serving", logs.String())
	}
}

// TestStartRefusedForItsSpoolMakesNoDatabase: a start whose spool cannot be opened (here a file
// where its directory should be) is refused before the store opens, and makes no database.
// Before, the database was made and written first.
func TestStartRefusedForItsSpoolMakesNoDatabase(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "spool"), []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.DataDir, cfg.HTTP.Addr = dir, "127.0.0.1:0"
	d, err := Start(t.Context(), cfg, slog.New(slog.DiscardHandler), Options{Agent: echo.New()})
	if err == nil {
		d.Stop(context.Background())
		t.Fatal("Start with a file for its spool directory succeeded, want it refused")
	}
	if !strings.Contains(err.Error(), "open spool") {
		t.Errorf("Start = %v, want it refused for its spool", err)
	}
	if _, err := os.Stat(cfg.DSN()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after the refused start, %s: %v; want it not made", cfg.DSN(), err)
	}
}
