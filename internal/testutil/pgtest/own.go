package pgtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Server is a PostgreSQL server of one test's own (NewServer), for a test that restarts it:
// the package's shared server (NewDatabase) serves every test of the binary and is never
// restarted.
type Server struct {
	dir      string
	bin      string
	cred     *credential
	settings []string

	mu sync.Mutex
	s  *server // the running process
}

// NewServer starts a server of t's own in a temporary directory, reachable over a Unix socket
// there, and stops and removes it when t ends. Starting one takes an initdb (about a second).
// It needs no TestMain. settings ("name=value") are server settings on top of the tests'
// (postgres -c), for a test that needs a server-level one, such as
// "synchronous_standby_names=nosuch", which the shared server must not have.
func NewServer(t testing.TB, settings ...string) *Server {
	t.Helper()
	bin, err := binDir()
	if err != nil {
		t.Fatal(err)
	}
	cred, err := serverUser()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "agentgate-pg-")
	if err != nil {
		t.Fatal(err)
	}
	s, err := startIn(dir, bin, cred, settings...)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("start postgres: %v", err)
	}
	srv := &Server{dir: dir, bin: bin, cred: cred, settings: settings, s: s}
	t.Cleanup(func() {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		if err := srv.s.stop(); err != nil { // stop removes dir too
			t.Errorf("pgtest: %v\npostgres log:\n%s", err, srv.s.log)
		}
	})
	return srv
}

// DSN returns the connection string of the server's database postgres, as user postgres.
func (srv *Server) DSN() string {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return srv.s.dsn("postgres")
}

// Restart stops the server (a fast shutdown: its clients' connections are terminated) and
// starts it again on the same data directory, as an operator's restart or a host's reboot
// does. It returns once the server accepts connections again.
func (srv *Server) Restart(t testing.TB) {
	t.Helper()
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if err := srv.s.halt(); err != nil {
		t.Fatalf("pgtest: restart: %v\npostgres log:\n%s", err, srv.s.log)
	}
	s, err := launch(srv.dir, srv.bin, srv.cred, srv.settings...)
	if err != nil {
		t.Fatalf("pgtest: restart: %v", err)
	}
	srv.s = s
}

// halt stops the server as stop does, but keeps its directory.
func (s *server) halt() error {
	if err := s.cmd.Process.Signal(os.Interrupt); err != nil {
		return fmt.Errorf("stop postgres: %w", err)
	}
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-s.exited:
		return s.err
	case <-timer.C:
		s.cmd.Process.Kill()
		<-s.exited
		return fmt.Errorf("stop postgres: not stopped after %s, killed", stopTimeout)
	}
}

// launch starts postgres on the data directory startIn initialized in dir (again, for a
// restart), with settings (NewServer's) after the tests' own, and returns once it accepts
// connections.
func launch(dir, bin string, cred *credential, settings ...string) (*server, error) {
	// Tests need no durability across a crash of the machine; benchmarks measure it.
	durability := "off"
	if benchmarking() {
		durability = "on"
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", filepath.Join(dir, "data"), "-k", dir,
		"-c", "listen_addresses=", "-c", "fsync="+durability, "-c", "synchronous_commit="+durability,
		"-c", "full_page_writes="+durability, "-c", "max_connections=200", "-c", "lc_messages=C",
		"-p", port)
	for _, kv := range settings {
		cmd.Args = append(cmd.Args, "-c", kv)
	}
	cmd.Dir = dir
	var err error
	if cmd.SysProcAttr, err = sysProcAttr(cred, true); err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{dir: dir, cmd: cmd, log: &logTail{}, exited: make(chan struct{})}
	ready := make(chan struct{})
	go s.drain(stderr, ready)
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case <-ready:
		return s, nil
	case <-s.exited:
		return nil, fmt.Errorf("postgres exited before it was ready: %v\n%s", s.err, s.log)
	case <-timer.C:
		cmd.Process.Kill()
		<-s.exited
		return nil, fmt.Errorf("postgres not ready after %s\n%s", startTimeout, s.log)
	}
}
