package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/agentgate/agentgate/persistence/internal/sqlstore"
	"github.com/jackc/pgx/v5"
)

// The statements of PullBack: $1 is the bound (a time after it is pulled back), $2 the time it
// is set to. Both use the partial indexes of open and of ended sessions, which hold no row
// after now but after a step back. The right-hand sides read the row as it was: an ended
// session's last activity moves back by as much as its end.
const (
	pullBackOpenSQL = `UPDATE sessions SET last_activity_at = $2,
			reset_due_at = CASE WHEN reset_due_at > $2 THEN $2 ELSE reset_due_at END
		WHERE ended_at IS NULL AND last_activity_at > $1`
	pullBackEndedSQL = `UPDATE sessions SET ended_at = $2,
			last_activity_at = CASE WHEN last_activity_at > 0 THEN last_activity_at - (ended_at - $2) ELSE last_activity_at END
		WHERE ended_at IS NOT NULL AND ended_at > $1`
)

// PullBack implements persistence.Store: it sets the times after after to to (see there), in
// one transaction, fenced as a commit is.
func (s *Store) PullBack(ctx context.Context, after, to time.Time) (int, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return 0, fmt.Errorf("pull back times after %v: %w", after, err)
	}
	defer done()
	fence, err := s.lockHeld()
	if err != nil {
		return 0, fmt.Errorf("pull back times after %v: %w", after, err)
	}
	var n int64
	err = s.inTx(ctx, pgx.TxOptions{}, func(tx pgx.Tx) error {
		n = 0
		if fence != nil { // a daemon that lost its lock changes nothing
			if _, err := tx.Exec(ctx, fence.sql, fence.args...); err != nil {
				return describe(*fence, err)
			}
		}
		for _, q := range []string{pullBackOpenSQL, pullBackEndedSQL} {
			tag, err := tx.Exec(ctx, q, sqlstore.NanoBound(after), sqlstore.NanoBound(to))
			if err != nil {
				return err
			}
			n += tag.RowsAffected()
		}
		return nil
	})
	if err != nil {
		return 0, markUnavailable(fmt.Errorf("pull back times after %v: %w", after, s.explain(ctx, err)))
	}
	return int(n), nil
}
