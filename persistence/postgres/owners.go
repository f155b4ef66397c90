package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/jackc/pgx/v5"
)

const (
	// The claim's row lock waits for the transactions that passed a fence of the key (their
	// FOR SHARE lock, see agentgate_fence in migration 0003) and makes the fences that follow
	// wait for it.
	claimSQL = `INSERT INTO owners (key, epoch, owner, claimed_at) VALUES ($1, 1, $2, $3)
		ON CONFLICT (key) DO UPDATE SET epoch = owners.epoch + 1, owner = excluded.owner,
			claimed_at = excluded.claimed_at
		RETURNING epoch`
	ownershipSQL = `SELECT key, epoch, owner, claimed_at FROM owners WHERE key = $1`
	fenceSQL     = `SELECT agentgate_fence($1, $2)`
	// fencedCode is the SQLSTATE agentgate_fence raises.
	fencedCode = "AG001"
	// daemonFenceSQL fails a commit of an exclusive store whose daemon lock another process has
	// taken since (migration 0006), with daemonFencedCode.
	daemonFenceSQL   = `SELECT agentgate_daemon_fence($1)`
	daemonFencedCode = "AG002"
)

// Claim implements persistence.Store. It is one statement in a transaction of its own.
func (s *Store) Claim(ctx context.Context, key, owner string, at time.Time) (int64, error) {
	if key == "" {
		return 0, errors.New("claim: key required")
	}
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return 0, fmt.Errorf("claim %s: %w", key, err)
	}
	defer done()
	if _, err := s.lockHeld(); err != nil {
		return 0, fmt.Errorf("claim %s: %w", key, err)
	}
	var epoch int64
	if err := s.pool.QueryRow(ctx, claimSQL, key, owner, timeArg(at)).Scan(&epoch); err != nil {
		err = fmt.Errorf("claim %s: %w", key, s.explain(ctx, err))
		if IsUnavailable(err) && !errors.Is(err, persistence.ErrUnavailable) {
			err = fmt.Errorf("%w: %w", persistence.ErrUnavailable, err)
		}
		return 0, err
	}
	return epoch, nil
}

// Ownership implements persistence.Store.
func (s *Store) Ownership(ctx context.Context, key string) (*persistence.Ownership, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("ownership of %s: %w", key, err)
	}
	defer done()
	var o persistence.Ownership
	err = s.pool.QueryRow(ctx, ownershipSQL, key).Scan(&o.Key, &o.Epoch, &o.Owner, nanoTime{&o.ClaimedAt})
	if errors.Is(err, pgx.ErrNoRows) {
		err = persistence.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("ownership of %s: %w", key, s.explain(ctx, err))
	}
	return &o, nil
}
