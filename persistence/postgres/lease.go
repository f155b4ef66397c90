package postgres

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentgate/agentgate/internal/logging"
)

// leaseLock is the advisory lock class of leases: "agls" in ASCII. The second key is the hash of
// the schema and the lease's name.
const leaseLock = 0x61676c73

// Lease timing: how often a holder checks its connection (and so keeps it busy), and how long
// the server lets a holder's connection sit idle before it ends the session and frees the lock,
// which is what frees the lease of a holder whose host died without closing its connection.
const (
	leaseCheckEvery = 2 * time.Second
	leaseIdleLimit  = 10 * time.Second
	leaseRetryEvery = time.Second
)

// Lease takes the lease called name, shared by every process on this database and schema: at
// most one holds it at a time. It waits until the lease is free or ctx ends. Held, the lease
// lives on a connection of its own; lost is closed when that connection fails (the lease is
// gone then too: another process may take it), and release gives it back. A holder that stops
// answering (its host died) loses it after about leaseIdleLimit, when the server ends its
// idle session.
func (s *Store) Lease(ctx context.Context, name string) (lost <-chan struct{}, release func(), err error) {
	conn, err := pgx.ConnectConfig(ctx, s.connCfg)
	if err != nil {
		return nil, nil, fmt.Errorf("lease %s: %w", name, err)
	}
	fail := func(err error) (<-chan struct{}, func(), error) {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, nil, fmt.Errorf("lease %s: %w", name, err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf(`SET idle_session_timeout = %d`, leaseIdleLimit.Milliseconds())); err != nil {
		return fail(err)
	}
	for {
		var held bool
		err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, hashtext(current_schema() || '/' || $2))`,
			int32(leaseLock), name).Scan(&held)
		if err != nil {
			return fail(err)
		}
		if held {
			break
		}
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-time.After(leaseRetryEvery):
		}
	}
	lostc, stop, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(leaseCheckEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			pctx, cancel := context.WithTimeout(context.Background(), leaseCheckEvery)
			err := conn.Ping(pctx)
			cancel()
			if err != nil {
				s.log.Warn("lease lost: its connection failed", "lease", name, logging.Err(err))
				close(lostc)
				return
			}
		}
	}()
	var once sync.Once
	release = func() { once.Do(func() { s.unlease(conn, name, stop, done) }) }
	return lostc, release, nil
}

// unlease stops a lease's watcher, gives the lock back and closes its connection.
func (s *Store) unlease(conn *pgx.Conn, name string, stop, done chan struct{}) {
	{
		close(stop)
		<-done
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = conn.Exec(rctx, `SELECT pg_advisory_unlock($1, hashtext(current_schema() || '/' || $2))`, int32(leaseLock), name)
		_ = conn.Close(rctx)
	}
}
