package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestOpenEndedWhileTheMigrationBeginsStops: Open's ctx ending while the migration's BEGIN
// waits for a database that stopped answering right after the ping (here a relay that drops
// everything from the BEGIN on, as a host gone silent does) ends Open at once with ctx's
// error, not postgres.ErrMigratedThenEnded: nothing was written, and the next Open migrates
// from the start. Before, the BEGIN ran with a ctx the stop did not end (only a migration that
// has begun must finish), and Open waited for the database for as long as TCP took to give up
// on it (hours): a daemon asked to stop during its start kept waiting.
func TestOpenEndedWhileTheMigrationBeginsStops(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	h := holdAt(t, dsn, isBegin)
	if err := h.cutOpen(t, Options{}, 10*time.Second); !errors.Is(err, context.Canceled) || errors.Is(err, ErrMigratedThenEnded) {
		t.Fatalf("Open = %v after its ctx ended during the migration's BEGIN, want context.Canceled and not ErrMigratedThenEnded", err)
	}
	admin, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	var migrated bool
	if err := admin.QueryRow(t.Context(), `SELECT to_regclass('schema_migrations') IS NOT NULL`).Scan(&migrated); err != nil {
		t.Fatal(err)
	}
	if migrated {
		t.Error("schema_migrations exists after an Open cut at its migration's BEGIN, want nothing written")
	}
}

// silentRelay passes a test database's connections through a Unix socket of its own, and from
// the first message a client sends that hold picks (isBegin: a BEGIN) on, drops everything
// every connection carries, both ways, never closing one, and passes nothing on a new one: a
// server (its host) that stops answering there, as between a ping and a transaction.
type silentRelay struct {
	dsn  string
	held chan struct{} // closed when a connection is first held
}

func holdAt(t *testing.T, dsn string, hold func(msg []byte) bool) *silentRelay {
	t.Helper()
	h := &silentRelay{held: make(chan struct{})}
	var (
		once  sync.Once
		quiet atomic.Bool // held: the server is silent
	)
	h.dsn, _ = relayConns(t, dsn, "pgbegin", func(c, up net.Conn) func(dst, src net.Conn, fromClient bool) {
		pass := func(dst, src net.Conn, fromClient bool) {
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				// A client writes a query whole and waits for its answer (pgx's BEGIN:
				// Exec with no arguments), so one read holds all of it.
				if fromClient && !quiet.Load() && hold(buf[:n]) {
					quiet.Store(true)
					once.Do(func() { close(h.held) })
				}
				if n > 0 && !quiet.Load() {
					if _, err := dst.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					if !quiet.Load() {
						_ = dst.Close()
					}
					return
				}
			}
		}
		return pass
	})
	return h
}

// isBegin reports whether b is a simple query message ('Q') whose text begins a transaction.
func isBegin(b []byte) bool {
	const header = 5 // 'Q' and the message's length
	return len(b) > header && b[0] == 'Q' && bytes.HasPrefix(bytes.ToLower(b[header:]), []byte("begin"))
}

// isQuery returns a hold for holdAt that picks the first simple query (Q) or the first
// statement parsed (P: a query with arguments, or one pgx prepares) whose text begins with
// prefix.
func isQuery(prefix string) func([]byte) bool {
	return func(b []byte) bool {
		const header = 5 // the message's type and length
		if len(b) <= header {
			return false
		}
		text := b[header:]
		switch b[0] {
		case 'Q':
		case 'P': // the statement's name, then its text
			i := bytes.IndexByte(text, 0)
			if i < 0 {
				return false
			}
			text = text[i+1:]
		default:
			return false
		}
		return bytes.HasPrefix(text, []byte(prefix))
	}
}

// cutOpen opens the store through h with opts, ends Open's ctx once h holds a connection
// (the server went silent), and returns Open's error, failing the test when Open returned
// before the hold or did not return within within of the cut.
func (h *silentRelay) cutOpen(t *testing.T, opts Options, within time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	opened := openAside(ctx, h.dsn, opts)
	select {
	case <-h.held:
	case err := <-opened:
		t.Fatalf("Open = %v before the server stopped answering", err)
	}
	cancel()
	select {
	case err := <-opened:
		return err
	case <-time.After(within):
		t.Fatalf("Open went on for %v after its ctx ended while the server was silent", within)
		return nil
	}
}

// openAside opens the store of dsn with opts on a goroutine of its own and sends Open's error,
// or an error of its own should Open return a store (which it closes): the tests that use it
// end Open's ctx while it waits.
func openAside(ctx context.Context, dsn string, opts Options) <-chan error {
	opened := make(chan error, 1)
	go func() {
		s, err := Open(ctx, dsn, opts)
		if err == nil {
			_ = s.Close()
			err = errors.New("Open returned a store")
		}
		opened <- err
	}()
	return opened
}

// awaitWaiter polls the server on conn until the count that waiters (a query of pg_locks with
// args) reads is above 0, as who waits for a lock, and fails the test as not testing what it
// should after 10 s; who and what name the waiter and the lock in that failure.
func awaitWaiter(t *testing.T, conn *pgx.Conn, who, what, waiters string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting int
		if err := conn.QueryRow(t.Context(), waiters, args...).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not wait for %s within 10 s: the test does not test", who, what)
		}
		time.Sleep(time.Millisecond) // polls the server under a deadline
	}
}

// unixRelay listens on a Unix socket of its own for the test database of dsn, whose own socket
// (target) a relay passes its connections on to: it returns the listener, the target and dsn
// made to connect through the listener. prefix names the socket's temporary directory.
func unixRelay(t *testing.T, dsn, prefix string) (l net.Listener, target, relayed string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	target = filepath.Join(cfg.Host, fmt.Sprintf(".s.PGSQL.%d", cfg.Port))
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if l, err = net.Listen("unix", filepath.Join(dir, fmt.Sprintf(".s.PGSQL.%d", cfg.Port))); err != nil {
		t.Fatal(err)
	}
	if relayed = strings.Replace(dsn, "host="+cfg.Host, "host="+dir, 1); relayed == dsn {
		t.Fatalf("no host=%s in %s", cfg.Host, dsn)
	}
	return l, target, relayed
}

// relayConns passes the connections to the test database of dsn through a Unix socket of its
// own (unixRelay; prefix names its directory) and returns dsn made to connect through it. For
// each connection it accepts, it dials the database and asks serve for the connection's pass,
// which it runs on a goroutine of its own each way: from the client to the server (fromClient)
// and back. A pass passes what it will from src to dst, and returns once it is done. stop, which
// the test's cleanup calls too, closes the listener and every connection (one accepted after is
// closed at once: its passes would wait for its client or the server to close it) and waits for
// the passes to return; it may be called again.
func relayConns(t *testing.T, dsn, prefix string,
	serve func(client, server net.Conn) (pass func(dst, src net.Conn, fromClient bool))) (relayed string, stop func()) {
	t.Helper()
	l, target, relayed := unixRelay(t, dsn, prefix)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
		ended bool // stop closed conns
	)
	stop = func() {
		_ = l.Close()
		mu.Lock()
		ended = true
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
	t.Cleanup(stop)
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("unix", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			if ended {
				mu.Unlock()
				_, _ = c.Close(), up.Close()
				return
			}
			conns = append(conns, c, up)
			mu.Unlock()
			pass := serve(c, up)
			wg.Go(func() { pass(up, c, true) })
			wg.Go(func() { pass(c, up, false) })
		}
	})
	return relayed, stop
}
