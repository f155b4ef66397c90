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

// GatewayLease names the lease whose holder runs platform's gateway connection in a cluster
// (supervisor's leaderPlatform) and so keeps the platform's unread places: once a store has
// taken it, the ClearUnread ops of platform that it commits apply only while no other process
// has taken the lease since (see Lease).
func GatewayLease(platform string) string { return "gateway/" + platform }

// raiseLeaseSQL raises the epoch of lease $1 (migration 0017) and returns it; the first take of
// a lease gets 1. Its row lock waits for the transactions that found the previous holder's
// epoch held (agentgate_lease_held).
const raiseLeaseSQL = `INSERT INTO leases (name, epoch) VALUES ($1, 1)
	ON CONFLICT (name) DO UPDATE SET epoch = leases.epoch + 1 RETURNING epoch`

// Lease takes the lease called name, shared by every process on this database and schema: at
// most one holds it at a time. It waits until the lease is free or ctx ends. Held, the lease
// lives on a connection of its own; lost is closed when that connection fails (the lease is
// gone then too: another process may take it), and release gives it back. A holder that stops
// answering (its host died) loses it after about leaseIdleLimit, when the server ends its
// idle session.
//
// Taking the lease raises its epoch, which the store keeps: what only the holder may write (the
// clear of an unread place, GatewayLease) changes nothing from the lease's next take on, by
// any process, even before this one learns that it lost the lease. Before, a member whose
// gateway lease was taken over while it stalled (or whose clear waited in its queue of
// delivery marks through an outage) cleared, after the fact, the unread place that the new
// holder had loaded and then failed to read from; when the new holder stopped before reading
// it, what was said there while the gateway moved was never read back
// (TestFormerLeaseHolderClearsNoUnreadPlace).
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
	var epoch int64
	if err := conn.QueryRow(ctx, raiseLeaseSQL, name).Scan(&epoch); err != nil {
		return fail(fmt.Errorf("raise its epoch: %w", err))
	}
	s.leaseMu.Lock()
	if s.leases == nil {
		s.leases = map[string]int64{}
	}
	s.leases[name] = epoch
	s.leaseMu.Unlock()
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

// leaseEpoch returns the epoch of lease name as this store last took it; false when it never
// took it. The epoch is kept once the lease is lost or released: the database tells whether
// another process took it since (agentgate_lease_held).
func (s *Store) leaseEpoch(name string) (int64, bool) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	e, ok := s.leases[name]
	return e, ok
}
