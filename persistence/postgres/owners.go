package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/jackc/pgx/v5"
)

// claimSQL claims key $1 for owner $2 at $3 and counts the death of the owner it replaces
// (migration 0009). The claim's row lock waits for the transactions that passed a fence of the
// key (their FOR SHARE lock, see agentgate_fence in migration 0003) and makes the fences that
// follow wait for it; owners.owner in DO UPDATE is the row as locked, so of two claims at once
// the second replaces the first's owner, which is alive: a death is counted once. The count
// adds 1 to attempts of the routed session's head pending message, as BeginRun does (the
// session that loads next quarantines it at QuarantineAfter).
var claimSQL = `WITH claimed AS (
		INSERT INTO owners (key, epoch, owner, claimed_at) VALUES ($1, 1, $2, $3)
		ON CONFLICT (key) DO UPDATE SET epoch = owners.epoch + 1, previous = owners.owner,
			owner = excluded.owner, claimed_at = excluded.claimed_at
		RETURNING epoch, previous
	), counted AS (
		UPDATE messages h SET attempts = h.attempts + 1
		FROM claimed c, routing r
		WHERE c.previous <> '' AND c.previous <> $2
			AND EXISTS (SELECT 1 FROM members m WHERE m.node = c.previous
				AND ` + gone("NULLIF(m.ttl_secs, 0)", "NULLIF(n.ttl_secs, 0)") + `)
			AND r.key = $1 AND h.session_id = r.session_id
			AND h.role = 'user' AND h.status = 'pending' AND h.active
			AND h.seq = (SELECT MIN(p.seq) FROM messages p WHERE p.session_id = r.session_id
				AND p.role = 'user' AND p.status = 'pending' AND p.active)
		RETURNING h.session_id, h.message_id, h.attempts
	)
	SELECT c.epoch, c.previous, k.session_id, k.message_id, k.attempts
	FROM claimed c LEFT JOIN counted k ON true`

const (
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
func (s *Store) Claim(ctx context.Context, key, owner string, at time.Time) (persistence.Claimed, error) {
	var c persistence.Claimed
	if key == "" {
		return c, errors.New("claim: key required")
	}
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return c, fmt.Errorf("claim %s: %w", key, err)
	}
	defer done()
	if _, err := s.lockHeld(); err != nil {
		return c, fmt.Errorf("claim %s: %w", key, err)
	}
	var sessionID, messageID *string
	var attempts *int
	err = s.pool.QueryRow(ctx, claimSQL, key, owner, timeArg(at)).Scan(&c.Epoch, &c.Previous, &sessionID, &messageID, &attempts)
	if err != nil {
		return persistence.Claimed{}, markUnavailable(fmt.Errorf("claim %s: %w", key, s.explain(ctx, err)))
	}
	if sessionID != nil {
		c.Counted = &persistence.CountedMessage{Key: key, SessionID: *sessionID, MessageID: *messageID, Attempts: *attempts}
	}
	return c, nil
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
