// Package pgtest starts a real PostgreSQL server for tests: one private server per test binary,
// reachable only over a Unix socket in its own temporary directory, and a fresh, empty
// database for each test that asks for one. A test binary that uses it calls Main from its
// TestMain. Tests run the server without fsync; a binary that runs benchmarks gets a durable
// one. Production code never imports it.
package pgtest

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	readyLine    = "database system is ready to accept connections"
	startTimeout = 60 * time.Second
	stopTimeout  = 30 * time.Second
	queryTimeout = 30 * time.Second
	tailLines    = 100
	port         = "5432"
)

var (
	mu       sync.Mutex
	mainRan  bool    // Main is running the tests
	stopped  bool    // Main has stopped the server; no new one may start
	srv      *server // the running server, if one was started
	startErr error   // why the server could not start; not retried

	dbSeq atomic.Int64 // numbers the databases NewDatabase creates
)

// Main runs a test binary's tests (call from TestMain: os.Exit(pgtest.Main(m))) and stops the
// server, if one was started, after they ran. It returns the tests' exit code, or 1 if they
// passed but the server could not be stopped and removed cleanly.
func Main(m *testing.M) int {
	mu.Lock()
	mainRan = true
	mu.Unlock()

	code := m.Run()

	mu.Lock()
	s := srv
	srv, stopped = nil, true
	mu.Unlock()
	if s == nil {
		return code
	}
	if err := s.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\npostgres log:\n%s", err, s.log)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// NewDatabase returns a libpq-style connection string ("host=... port=... user=... dbname=...
// sslmode=disable", which pgx accepts) of a fresh, empty database on the package's server,
// starting the server on first use, and drops the database when t ends. It is safe to call
// from parallel tests. It fails t if the server cannot start, if no PostgreSQL server binaries
// are installed, or if the test binary's TestMain does not call Main.
func NewDatabase(t testing.TB) string {
	t.Helper()
	return NewDatabaseWith(t, "")
}

// NewDatabaseWith is NewDatabase with options for its CREATE DATABASE statement, such as
// "ENCODING 'LATIN1' TEMPLATE template0".
func NewDatabaseWith(t testing.TB, options string) string {
	t.Helper()
	s, err := running()
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("agentgate_test_%d", dbSeq.Add(1))
	if err := s.exec("CREATE DATABASE " + name + " " + options); err != nil {
		t.Fatalf("create database %s: %v\npostgres log:\n%s", name, err, s.log)
	}
	t.Cleanup(func() {
		if err := s.exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	return s.dsn(name)
}

// Cut makes the database of dsn (from NewDatabase) unavailable, as a server restart or a cut
// network looks to a client: it refuses new connections and its open ones are terminated.
// restore lets connections in again; it also runs when t ends.
func Cut(t testing.TB, dsn string) (restore func()) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	name := cfg.Database
	db := pgx.Identifier{name}.Sanitize()
	cfg.Database = "postgres"
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `ALTER DATABASE `+db+` WITH ALLOW_CONNECTIONS false`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, name); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	restore = func() {
		once.Do(func() {
			if _, err := admin.Exec(ctx, `ALTER DATABASE `+db+` WITH ALLOW_CONNECTIONS true`); err != nil {
				t.Errorf("let connections in again: %v", err)
			}
			admin.Close(ctx)
		})
	}
	t.Cleanup(restore)
	return restore
}

// running returns the package's server, starting it on first use.
func running() (*server, error) {
	mu.Lock()
	defer mu.Unlock()
	switch {
	case !mainRan:
		return nil, errors.New("pgtest: TestMain must call pgtest.Main (os.Exit(pgtest.Main(m))), which stops the server after the tests")
	case stopped:
		return nil, errors.New("pgtest: NewDatabase called after pgtest.Main stopped the server")
	case srv != nil:
		return srv, nil
	case startErr != nil:
		return nil, startErr
	}
	start := time.Now()
	srv, startErr = startServer()
	if startErr != nil {
		startErr = fmt.Errorf("start postgres: %w", startErr)
		return nil, startErr
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "pgtest: postgres started in %s in %s\n", srv.dir, time.Since(start).Round(time.Millisecond))
	}
	return srv, nil
}

// server is a postgres process running on a data directory in a private temporary directory,
// which also holds its Unix socket.
type server struct {
	dir    string
	cmd    *exec.Cmd
	log    *logTail
	exited chan struct{} // closed once the process has exited and been waited for
	err    error         // the process's exit status; read after exited is closed
}

// startServer initializes a data directory and starts postgres on it, returning once the
// server accepts connections.
func startServer() (*server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	cred, err := serverUser()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "agentgate-pg-")
	if err != nil {
		return nil, err
	}
	s, err := startIn(dir, bin, cred)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func startIn(dir, bin string, cred *credential, settings ...string) (*server, error) {
	if cred != nil {
		if err := os.Chown(dir, cred.uid, cred.gid); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.Dir = dir
	var err error
	if initdb.SysProcAttr, err = sysProcAttr(cred, false); err != nil {
		return nil, err
	}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}

	return launch(dir, bin, cred, settings...)
}

// drain reads the server's log from r into s.log until the process exits, closes ready when
// the server says it accepts connections, then waits for the process and closes s.exited.
func (s *server) drain(r io.Reader, ready chan<- struct{}) {
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			s.log.add(strings.TrimRight(line, "\n"))
			if ready != nil && strings.Contains(line, readyLine) {
				close(ready)
				ready = nil
			}
		}
		if err != nil {
			break
		}
	}
	s.err = s.cmd.Wait()
	close(s.exited)
}

// stop shuts the server down (fast shutdown, then SIGKILL if it takes longer than
// stopTimeout) and removes its directory.
func (s *server) stop() error {
	var errs []error
	if err := s.cmd.Process.Signal(os.Interrupt); err != nil {
		errs = append(errs, fmt.Errorf("stop postgres: %w", err))
	}
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-s.exited:
		if s.err != nil {
			errs = append(errs, fmt.Errorf("stop postgres: %w", s.err))
		}
	case <-timer.C:
		s.cmd.Process.Kill()
		<-s.exited
		errs = append(errs, fmt.Errorf("stop postgres: not stopped after %s, killed", stopTimeout))
	}
	if err := os.RemoveAll(s.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// benchmarking reports whether the test binary runs benchmarks (-test.bench): their server
// makes its commits durable (fsync, synchronous_commit and full_page_writes on), as a
// production server does, so that they measure what an operator gets.
func benchmarking() bool {
	f := flag.Lookup("test.bench")
	return f != nil && f.Value.String() != ""
}

// exec runs one statement in the server's postgres database.
func (s *server) exec(sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.dsn("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// dsn returns the connection string of database name as user postgres over the socket.
func (s *server) dsn(name string) string {
	return fmt.Sprintf("host=%s port=%s user=postgres dbname=%s sslmode=disable", quote(s.dir), port, quote(name))
}

// quote quotes v as a libpq connection string value if it needs quoting.
func quote(v string) string {
	if v != "" && !strings.ContainsAny(v, ` '\`+"\t\n\r") {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// logTail keeps the last tailLines lines of the server's log; safe for concurrent use.
type logTail struct {
	mu    sync.Mutex
	lines []string
}

func (l *logTail) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) == tailLines {
		copy(l.lines, l.lines[1:])
		l.lines = l.lines[:tailLines-1]
	}
	l.lines = append(l.lines, line)
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) == 0 {
		return "(empty)\n"
	}
	return strings.Join(l.lines, "\n") + "\n"
}

// binDir returns the directory holding the PostgreSQL server binaries: $AGENTGATE_PG_BIN,
// else `pg_config --bindir` if it holds initdb (Debian's may name the client's), else the
// directory of the initdb on PATH, else the newest /usr/lib/postgresql/*/bin.
func binDir() (string, error) {
	if dir := os.Getenv("AGENTGATE_PG_BIN"); dir != "" {
		if !hasServer(dir) {
			return "", fmt.Errorf("AGENTGATE_PG_BIN=%s holds no initdb and postgres", dir)
		}
		return dir, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); hasServer(dir) {
			return dir, nil
		}
	}
	if path, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(path); err == nil {
			path = real // a symlink elsewhere, such as /usr/local/bin: postgres sits next to the target
		}
		if dir := filepath.Dir(path); hasServer(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	best, bestVersion := "", -1.0
	for _, dir := range dirs {
		v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64)
		if err == nil && v > bestVersion && hasServer(dir) {
			best, bestVersion = dir, v
		}
	}
	if best != "" {
		return best, nil
	}
	return "", errors.New("no PostgreSQL server binaries (initdb, postgres) found: install them " +
		"(Debian: apt-get install postgresql-15) or set AGENTGATE_PG_BIN to the directory holding them")
}

// hasServer reports whether dir holds initdb and postgres.
func hasServer(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.IsDir() {
			return false
		}
	}
	return true
}

// credential is the OS user initdb and postgres run as.
type credential struct {
	uid, gid int
}

// serverUser returns the user to run the server as: nil (the current user) unless running as
// root, which initdb and postgres refuse; then the postgres user if it exists, else nobody.
func serverUser() (*credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		if u, err = user.Lookup("nobody"); err != nil {
			return nil, fmt.Errorf("running as root and found no postgres or nobody user to run postgres as: %w", err)
		}
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return nil, fmt.Errorf("user %s: uid %q: %w", u.Username, u.Uid, err)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return nil, fmt.Errorf("user %s: gid %q: %w", u.Username, u.Gid, err)
	}
	return &credential{uid: uid, gid: gid}, nil
}
