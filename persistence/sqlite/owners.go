package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/agentgate/agentgate/persistence"
)

const (
	claimSQL = `INSERT INTO owners (key, epoch, owner, claimed_at) VALUES (?1, 1, ?2, ?3)
		ON CONFLICT (key) DO UPDATE SET epoch = owners.epoch + 1, owner = ?2, claimed_at = ?3
		RETURNING epoch`
	ownershipSQL = `SELECT key, epoch, owner, claimed_at FROM owners WHERE key = ?`
	ownerSQL     = `SELECT epoch, owner FROM owners WHERE key = ?`
)

// Claim implements persistence.Store: one BEGIN IMMEDIATE transaction under the commit mutex,
// so it never interleaves with a Commit and every later fence reads its epoch. SQLite keeps
// no cluster membership: a claim counts nothing (Claimed.Counted is nil). Its condition (seen)
// is checked against the row its first statement reads, in the same transaction: no statement
// more.
func (s *Store) Claim(ctx context.Context, key, owner string, at time.Time, seen *persistence.ClaimSeen) (persistence.Claimed, error) {
	c, err := s.claim(ctx, key, owner, at, seen)
	if errors.Is(err, persistence.ErrClaimChanged) {
		return persistence.Claimed{}, err // (a *persistence.ClaimChangedError, which names the key)
	}
	if err != nil {
		return persistence.Claimed{}, s.unavailable(fmt.Errorf("claim %s: %w", key, err))
	}
	return c, nil
}

func (s *Store) claim(ctx context.Context, key, owner string, at time.Time, seen *persistence.ClaimSeen) (c persistence.Claimed, err error) {
	if key == "" {
		return c, errors.New("key required")
	}
	if err := s.enter(); err != nil {
		return c, err
	}
	defer s.leave()
	if s.readOnly {
		return c, ErrReadOnly
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	tx, release, err := s.writerTx(ctx)
	if err != nil {
		return c, err
	}
	defer release()
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	var latest persistence.ClaimSeen
	if err := tx.QueryRowContext(ctx, ownerSQL, key).Scan(&latest.Epoch, &latest.Owner); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return c, err
	}
	if seen != nil && *seen != latest {
		return c, &persistence.ClaimChangedError{Key: key, Seen: *seen, Latest: &latest}
	}
	c.Previous = latest.Owner
	if err := tx.QueryRowContext(ctx, claimSQL, key, owner, timeArg(at)).Scan(&c.Epoch); err != nil {
		return c, err
	}
	if err := s.commitChecked(tx); err != nil {
		return persistence.Claimed{}, err
	}
	return c, nil
}

// Ownership implements persistence.Store.
func (s *Store) Ownership(ctx context.Context, key string) (*persistence.Ownership, error) {
	if err := s.enter(); err != nil {
		return nil, fmt.Errorf("ownership of %s: %w", key, err)
	}
	defer s.leave()
	var o persistence.Ownership
	err := s.reader.QueryRowContext(ctx, ownershipSQL, key).Scan(&o.Key, &o.Epoch, &o.Owner, nanoTime{&o.ClaimedAt})
	if errors.Is(err, sql.ErrNoRows) {
		err = persistence.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("ownership of %s: %w", key, err)
	}
	return &o, nil
}
