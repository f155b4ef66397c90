package postgres

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestOpenEndedOnASilentServerStops: Open's ctx ending while Open waits for a server that
// stopped answering after the connect (here a relay that drops everything from a statement on,
// as a host gone silent does) ends Open promptly with ctx's error, at each of its waits that
// ctx ends: the ping, the encoding's check, the daemon lock's, and the migration's BEGIN with
// the daemon lock taken. Before, a cut ping or encoding check closed the pool before Open
// returned, and pgx waits up to 15 s for a silent server to close a connection whose statement
// was cut (it reads until then), which the pool's Close waits for; and a cut BEGIN let go of
// the daemon lock first, which waited up to 5 s for the silent server: a daemon asked to stop
// during its start waited that long. (The daemon lock's wait returned promptly already: pgx
// closes its cut connection, its own, in the background, and the pool's are idle.)
func TestOpenEndedOnASilentServerStops(t *testing.T) {
	for _, c := range []struct {
		name string
		hold func([]byte) bool // the statement the server stops answering at
		opts Options
	}{
		{"ping", isQuery("-- ping"), Options{}},
		{"encoding", isQuery("SHOW server_encoding"), Options{}},
		{"lock", isQuery("SELECT pg_advisory_lock("), Options{Exclusive: true, LockWait: time.Minute}},
		{"begin with the lock", isBegin, Options{Exclusive: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := holdAt(t, pgtest.NewDatabase(t), c.hold)
			// Within well under the lock's 5 s and pgx's 15 s, well over a prompt return.
			if err := h.cutOpen(t, c.opts, 3*time.Second); !errors.Is(err, context.Canceled) {
				t.Fatalf("Open = %v after its ctx ended, want context.Canceled", err)
			}
		})
	}
}

// TestOpenEndedWhileAMigrationWaitsLetsTheLockGo: an Open cut (its ctx ended) while it waits
// for another process's migration, which lets go of its daemon lock in the background
// (closeFailedOpen), still lets go of it: an Open in the same process right after takes it.
func TestOpenEndedWhileAMigrationWaitsLetsTheLockGo(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	admin, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(t.Context(), `SELECT pg_advisory_lock($1, hashtext(current_schema()))`, int32(migrateLock)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	opened := openAside(ctx, dsn, Options{Exclusive: true})
	awaitWaiter(t, admin, "Open", "the migration's lock", `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1 AND NOT granted`, migrateLock)
	cancel()
	if err := <-opened; !errors.Is(err, context.Canceled) || errors.Is(err, ErrMigratedThenEnded) {
		t.Fatalf("Open = %v after its ctx ended while it waited for a migration, want context.Canceled", err)
	}
	if _, err := admin.Exec(t.Context(), `SELECT pg_advisory_unlock($1, hashtext(current_schema()))`, int32(migrateLock)); err != nil {
		t.Fatal(err)
	}
	s, err := Open(t.Context(), dsn, Options{Exclusive: true})
	if err != nil {
		t.Fatalf("Open after a cut Open of the same process = %v, want its daemon lock let go of", err)
	}
	_ = s.Close()
}

// TestOpenCutWhileItWritesIsAStop: a stop that cuts Open while it writes to a server that
// stopped reading (the connection's buffers full: here a relay that reads a connection's first
// bytes and no more, and a startup message longer than the buffers hold, from a long
// application_name) is the stop's: Open returns ctx's error, promptly. pgx ends the write by a
// deadline on the connection (its context watcher), and pgconn turns the write's i/o timeout
// into ctx's error before it returns it (normalizeTimeoutError, as for a cut read), so
// endedByCtx needs no case for a net timeout; one would take a real timeout that a stop meets
// (TCP's ETIMEDOUT, a keepalive's, is a net.Error whose Timeout is true) for the stop's. Only
// the startup message can fill the buffers: each statement of Open is a few kilobytes at most,
// and waits for its answer before the next is sent.
func TestOpenCutWhileItWritesIsAStop(t *testing.T) {
	writing := make(chan struct{}, 1)
	relayed, _ := relayConns(t, pgtest.NewDatabase(t), "pgfull", func(c, up net.Conn) func(dst, src net.Conn, fromClient bool) {
		return func(dst, src net.Conn, fromClient bool) {
			if fromClient {
				if n, _ := src.Read(make([]byte, 1024)); n > 0 {
					select {
					case writing <- struct{}{}: // the client writes, and the rest waits
					default:
					}
				}
			}
			<-t.Context().Done() // (ends before relayConns's stop, a cleanup, waits for this)
		}
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	opened := openAside(ctx, relayed+" application_name="+strings.Repeat("a", 8<<20), Options{})
	select {
	case <-writing:
	case err := <-opened:
		t.Fatalf("Open = %v before it wrote", err)
	}
	cancel()
	select {
	case err := <-opened:
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "write") {
			t.Errorf("Open cut while it wrote = %v, want ctx's error (context.Canceled) from the write", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Open went on for 10 s after its ctx ended while it wrote")
	}
}
