package sqlite

import (
	"context"
	"fmt"
	"time"

	"github.com/agentgate/agentgate/persistence/internal/sqlstore"
)

// The statements of PullBack: ?1 is the bound (a time after it is pulled back), ?2 the time
// it is set to. Only INTEGER times count: a value of another type is not a valid time (it
// reads as the zero time), and TEXT would compare after any number. Both use the partial
// indexes of open and of ended sessions, which hold no row after now but after a step back.
const (
	pullBackOpenSQL = `UPDATE sessions SET last_activity_at = ?2,
			reset_due_at = CASE WHEN typeof(reset_due_at) = 'integer' AND reset_due_at > ?2 THEN ?2 ELSE reset_due_at END
		WHERE ended_at IS NULL AND last_activity_at > ?1 AND typeof(last_activity_at) = 'integer'`
	// The right-hand sides read the row as it was: the last activity moves back by as much as
	// the end.
	pullBackEndedSQL = `UPDATE sessions SET ended_at = ?2,
			last_activity_at = CASE WHEN typeof(last_activity_at) = 'integer' AND last_activity_at > 0
				THEN last_activity_at - (ended_at - ?2) ELSE last_activity_at END
		WHERE ended_at IS NOT NULL AND ended_at > ?1 AND typeof(ended_at) = 'integer'`
)

// PullBack implements persistence.Store: it sets the times after after to to (see there), in
// one BEGIN IMMEDIATE transaction.
func (s *Store) PullBack(ctx context.Context, after, to time.Time) (int, error) {
	n, err := s.pullBack(ctx, after, to)
	if err != nil {
		return 0, s.unavailable(fmt.Errorf("pull back times after %v: %w", after, err))
	}
	return n, nil
}

func (s *Store) pullBack(ctx context.Context, after, to time.Time) (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.leave()
	if s.readOnly {
		return 0, ErrReadOnly
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	tx, release, err := s.writerTx(ctx)
	if err != nil {
		return 0, err
	}
	defer release()
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	bound, n := sqlstore.NanoBound(after), int64(0)
	for _, q := range []string{pullBackOpenSQL, pullBackEndedSQL} {
		res, err := tx.ExecContext(ctx, q, bound, sqlstore.NanoBound(to))
		if err != nil {
			return 0, err
		}
		changed, err := res.RowsAffected()
		if err != nil {
			return 0, err
		}
		n += changed
	}
	if err := s.commitChecked(tx); err != nil {
		return 0, err
	}
	return int(n), nil
}
