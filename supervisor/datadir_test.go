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
	"testing/synctest"
	"time"

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

// TestStartWaitsForAnAdminCommand: a daemon's start that finds an admin command holding the data
// directory (sessions pardon, which ends in seconds) waits for it, says so once, and starts once
// it is done; one held past adminLockWait is refused, naming the command; a daemon that holds it
// is refused at once. Before, the start failed at once and had to be run again.
func TestStartWaitsForAnAdminCommand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		var logs testutil.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		hold := func(holder string) *os.File {
			t.Helper()
			f, err := LockDataDir(dir, holder)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
		type result struct {
			f   *os.File
			err error
		}
		start := func() chan result {
			done := make(chan result, 1)
			go func() {
				f, err := lockDataDirWaiting(t.Context(), dir, log)
				done <- result{f, err}
			}()
			return done
		}

		pardon := hold("sessions pardon")
		done := start()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		select {
		case r := <-done:
			t.Fatalf("the start ended while the pardon held the data directory: %v", r.err)
		default:
		}
		pardon.Close()
		r := <-done
		if r.err != nil {
			t.Fatalf("the start once the pardon was done: %v", r.err)
		}
		r.f.Close()
		for _, line := range []string{"an admin command holds the data directory; waiting for it to finish",
			"command=\"agentgate sessions pardon\"", "the admin command that held the data directory is done; starting"} {
			if n := strings.Count(logs.String(), line); n != 1 {
				t.Errorf("the log has %q %d times, want once:\n%s", line, n, logs.String())
			}
		}

		pardon = hold("sessions pardon")
		began := time.Now()
		r = <-start()
		pardon.Close()
		var inUse *DataDirInUse
		if !errors.As(r.err, &inUse) || inUse.Holder != "sessions pardon" || time.Since(began) != adminLockWait {
			t.Errorf("a start while a pardon held on: %v after %v, want the pardon named after %v", r.err, time.Since(began), adminLockWait)
		}

		daemon := hold(HolderDaemon)
		began = time.Now()
		r = <-start()
		daemon.Close()
		if !errors.As(r.err, &inUse) || inUse.Holder != HolderDaemon || time.Since(began) != 0 {
			t.Errorf("a start while a daemon holds the data directory: %v after %v, want the daemon named at once", r.err, time.Since(began))
		}
	})
}

// TestStopWhileTheStartWaitsForTheDataDir: a stop asked for (Options.Stop: serve's first stop
// signal) while the start waits for an admin command that holds the data directory ends the
// wait at once: Start returns ErrStopped, says why, and opens no store. Before, the stop was
// acted on only once the wait was over, adminLockWait later. (Not in a bubble: the start
// serves its HTTP listener from the moment it binds it, a goroutine in network I/O.)
func TestStopWhileTheStartWaitsForTheDataDir(t *testing.T) {
	cfg := config.Default()
	cfg.DataDir, cfg.HTTP.Addr = t.TempDir(), "127.0.0.1:0"
	pardon, err := LockDataDir(cfg.DataDir, "sessions pardon")
	if err != nil {
		t.Fatal(err)
	}
	defer pardon.Close()
	const waits = "an admin command holds the data directory; waiting for it to finish"
	logs := &logSignal{want: waits, ready: make(chan struct{})}
	waiting := logs.ready
	stop := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		d, err := Start(t.Context(), cfg, slog.New(slog.NewTextHandler(logs, nil)), Options{Agent: echo.New(), Stop: stop})
		if err == nil {
			err = errors.New("Start returned a daemon")
			_ = d.Stop(context.Background())
		}
		started <- err
	}()
	select {
	case <-waiting:
	case err := <-started:
		t.Fatalf("Start = %v before it waited for the pardon:\n%s", err, logs.String())
	}
	close(stop)
	select {
	case err := <-started:
		if !errors.Is(err, ErrStopped) {
			t.Fatalf("Start = %v after a stop during its wait for the data directory, want ErrStopped:\n%s", err, logs.String())
		}
	case <-time.After(adminLockWait / 2):
		<-started
		t.Fatalf("Start went on waiting for the data directory after the stop:\n%s", logs.String())
	}
	const said = "asked to stop during the start while it waited for the admin command that holds the data directory"
	if got := logs.String(); !strings.Contains(got, said) {
		t.Errorf("the start's log:\n%s\nwant %q", got, said)
	}
	if _, err := os.Stat(cfg.DSN()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after a stop during the wait for the data directory, %s: %v; want it not made", cfg.DSN(), err)
	}
}

// TestStopDuringTheStartKeepsTheDataDirsRefusal: a stop asked for during the start (serve's
// first signal, here before the start even tries the lock) of a start refused for the data
// directory (another daemon holds it: no wait) leaves the refusal as it is: Start returns it,
// serve exits 1 saying why, and nothing says the start stopped while it waited for an admin
// command. Before, any failure of the lock with the stop asked for was taken for the stop's end
// of the wait: ErrStopped (exit 0) and a log line of a wait that never was.
func TestStopDuringTheStartKeepsTheDataDirsRefusal(t *testing.T) {
	cfg := config.Default()
	cfg.DataDir, cfg.HTTP.Addr = t.TempDir(), "127.0.0.1:0"
	daemon, err := LockDataDir(cfg.DataDir, HolderDaemon)
	if err != nil {
		t.Fatal(err)
	}
	defer daemon.Close()
	var logs testutil.Buffer
	stop := make(chan struct{})
	close(stop)
	d, err := Start(t.Context(), cfg, slog.New(slog.NewTextHandler(&logs, nil)), Options{Agent: echo.New(), Stop: stop})
	if err == nil {
		_ = d.Stop(context.Background())
	}
	if !errors.Is(err, persistence.ErrLocked) || errors.Is(err, ErrStopped) {
		t.Errorf("Start on a daemon's data directory with a stop asked for = %v, want its refusal (ErrLocked)", err)
	}
	if got := logs.String(); strings.Contains(got, "while it waited for the admin command") {
		t.Errorf("the start's log says it waited for an admin command, which it did not:\n%s", got)
	}
}
