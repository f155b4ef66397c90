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
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestOpenEndedWhileTheMigrationBeginsStops: Open's ctx ending while the migration's BEGIN
// waits for a database that stopped answering right after the ping (here a connection that
// drops everything from the BEGIN on, as a host gone silent does) ends Open at once with ctx's
// error, not postgres.ErrMigratedThenEnded: nothing was written, and the next Open migrates
// from the start. Before, the BEGIN ran with a ctx the stop did not end (only a migration that
// has begun must finish), and Open waited for the database for as long as TCP took to give up
// on it (hours): a daemon asked to stop during its start kept waiting.
func TestOpenEndedWhileTheMigrationBeginsStops(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	h := holdAtBegin(t, dsn)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	opened := make(chan error, 1)
	go func() {
		s, err := Open(ctx, h.dsn, Options{})
		if err == nil {
			_ = s.Close()
			err = errors.New("Open returned a store")
		}
		opened <- err
	}()
	select {
	case <-h.held:
	case err := <-opened:
		t.Fatalf("Open = %v before its migration began", err)
	}
	cancel()
	select {
	case err := <-opened:
		if !errors.Is(err, context.Canceled) || errors.Is(err, ErrMigratedThenEnded) {
			t.Fatalf("Open = %v after its ctx ended during the migration's BEGIN, want context.Canceled and not ErrMigratedThenEnded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Open went on waiting for the migration's BEGIN after its ctx ended")
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

// beginHold passes a test database's connections through a Unix socket of its own, and drops
// everything a connection carries (both ways, never closing it) from the first BEGIN a client
// sends on: a server that stops answering between a ping and a transaction.
type beginHold struct {
	dsn  string
	held chan struct{} // closed when a BEGIN is held
}

func holdAtBegin(t *testing.T, dsn string) *beginHold {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(cfg.Host, fmt.Sprintf(".s.PGSQL.%d", cfg.Port))
	dir, err := os.MkdirTemp("", "pgbegin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	l, err := net.Listen("unix", filepath.Join(dir, fmt.Sprintf(".s.PGSQL.%d", cfg.Port)))
	if err != nil {
		t.Fatal(err)
	}
	h := &beginHold{dsn: strings.Replace(dsn, "host="+cfg.Host, "host="+dir, 1), held: make(chan struct{})}
	if h.dsn == dsn {
		t.Fatalf("no host=%s in %s", cfg.Host, dsn)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
		once  sync.Once
	)
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
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
			conns = append(conns, c, up)
			mu.Unlock()
			// A held connection drops what its client sends; the server, which never gets
			// the BEGIN, sends nothing more on it.
			pass := func(dst, src net.Conn, fromClient bool) {
				held := false
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					// A client writes a simple query whole and waits for its answer (pgx's
					// BEGIN: Exec with no arguments), so one read holds all of it.
					if fromClient && !held && isBegin(buf[:n]) {
						held = true
						once.Do(func() { close(h.held) })
					}
					if n > 0 && !held {
						if _, err := dst.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						if !held {
							_ = dst.Close()
						}
						return
					}
				}
			}
			wg.Go(func() { pass(up, c, true) })
			wg.Go(func() { pass(c, up, false) })
		}
	})
	return h
}

// isBegin reports whether b is a simple query message ('Q') whose text begins a transaction.
func isBegin(b []byte) bool {
	const header = 5 // 'Q' and the message's length
	return len(b) > header && b[0] == 'Q' && bytes.HasPrefix(bytes.ToLower(b[header:]), []byte("begin"))
}
