package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A connection the pool hands out may be dead: the server ended its session while it was idle
// in the pool (pg_terminate_backend, a pooler's or the server's idle_session_timeout, a
// failover, a restart), or it did so between the connection's acquisition and its first
// statement. The first statement on it then fails (FATAL 57P01, a broken pipe, EOF), and pgx
// closes the connection. A call of the store whose connection died so runs once more on
// another one (again, inTx, Commit), when nothing it sent can have taken effect or taking
// effect twice does no harm: a read, an idempotent write, or a transaction that failed before
// its COMMIT was sent (the server commits nothing without one). The second attempt takes a
// connection the pool pings first (shouldPing), destroying each dead idle one (a failover ends
// them all) and dialing a new one once none is left, so that one retry is enough. A call whose
// context ended is not tried again (its bound is spent: explain), nor one that failed for what
// it holds (a constraint, a fence, a serialization failure): its connection stays open.
//
// Before, the pool pinged every connection it handed out (ShouldPing always true): one round
// trip more on every call, a commit's fourth (BEGIN, the pipelined batch, COMMIT), about 10%
// fewer turns/s at small batches on loopback and the network's round trip on every call to a
// remote server; and a session ended between the ping and the first statement still failed
// its call (TestConnectionEndedAfterItsAcquisitionFailsNoCall). pgxpool's own default pings a
// connection idle for more than a second, which is every call of a daemon at low load.

// pingFirst, as a context value of an acquisition, makes the pool ping the connection it hands
// out (shouldPing).
type pingFirst struct{}

// pinged returns ctx with the mark that makes the pool ping the connection it hands out for it.
func pinged(ctx context.Context) context.Context { return context.WithValue(ctx, pingFirst{}, true) }

// shouldPing is the pool's ShouldPing: it pings only the connections handed out for a second
// attempt (attempt) and for a write that cannot be tried again (Claim).
func shouldPing(ctx context.Context, _ pgxpool.ShouldPingParams) bool {
	return ctx.Value(pingFirst{}) != nil
}

// attempt runs f on a connection of the pool (one the pool pinged first when second is set) and
// reports whether f's connection is dead once it returns (pgx closed it: the server ended its
// session or it broke) while ctx still runs. err is f's error, or the acquisition's.
func (s *Store) attempt(ctx context.Context, second bool, f func(c *pgxpool.Conn) error) (dead bool, err error) {
	actx := ctx
	if second {
		actx = pinged(ctx)
	}
	c, err := s.pool.Acquire(actx)
	if err != nil {
		return false, err
	}
	defer c.Release() // which destroys a closed connection
	if s.acquired != nil {
		s.acquired(c.Conn())
	}
	err = f(c)
	return c.Conn().IsClosed() && ctx.Err() == nil, err
}

// again runs f on a connection of the pool, and once more on another when the first was dead
// (attempt). f must be safe to run twice: a read, or a write that changes nothing the second
// time (the first may have taken effect before its connection broke). It builds its pgx.Batch
// afresh each time: a batch sent keeps the statements pgx prepared for it on its connection,
// which another connection lacks.
func (s *Store) again(ctx context.Context, f func(c *pgxpool.Conn) error) error {
	dead, err := s.attempt(ctx, false, f)
	if dead {
		_, err = s.attempt(ctx, true, f)
	}
	return err
}

// inTx runs f in a transaction of opts on a connection of the pool and commits it, and runs it
// once more on another connection when the first was dead before the COMMIT was sent: the
// server commits nothing without one, and ends the transaction with its session (one ended
// while a statement of f waited for a row lock: TestCallEndedWhileItWaitsForARowLockRunsAgain). Once COMMIT is
// sent, a failure is not tried again: whether the server committed is not known. f sets what
// it fills afresh at each run, and builds its batches afresh (again).
func (s *Store) inTx(ctx context.Context, opts pgx.TxOptions, f func(tx pgx.Tx) error) error {
	var sent bool
	run := func(c *pgxpool.Conn) error {
		sent = false
		return pgx.BeginTxFunc(ctx, c, opts, func(tx pgx.Tx) error {
			if err := f(tx); err != nil {
				return err
			}
			sent = true // BeginTxFunc commits next
			return nil
		})
	}
	dead, err := s.attempt(ctx, false, run)
	if dead && !sent {
		_, err = s.attempt(ctx, true, run)
	}
	return err
}

// readAll is queryAll on a connection of s's pool, run again on another when the first was dead.
func readAll[T any](ctx context.Context, s *Store, scan func(scanner) (T, error), query string, args ...any) ([]T, error) {
	var out []T
	err := s.again(ctx, func(c *pgxpool.Conn) (err error) {
		out, err = queryAll(ctx, c, scan, query, args...)
		return err
	})
	return out, err
}
