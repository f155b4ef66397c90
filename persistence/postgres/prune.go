package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/internal/sqlstore"
	"github.com/jackc/pgx/v5"
)

// pruneCandidatesSQL selects the sessions PruneSessions may delete (see there), oldest end
// first, and locks them: a concurrent write that would make one needed again (a message for it,
// reopening it) waits, and then finds it gone.
const pruneCandidatesSQL = `SELECT s.id, s.key FROM sessions s
	WHERE s.ended_at IS NOT NULL AND s.ended_at > 0 AND s.ended_at < $1
		AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id AND m.role = 'user'
			AND m.active AND m.status NOT IN ('done', 'failed', 'quarantined'))
		AND NOT EXISTS (SELECT 1 FROM outbox o
			WHERE o.session_key = s.key AND o.state = 'pending' AND o.session_id = s.id)
	ORDER BY s.ended_at, s.id COLLATE "C" LIMIT $2
	FOR UPDATE OF s`

// PruneSessions implements persistence.Store: it deletes, in one transaction, the sessions
// that ended before endedBefore and that nothing needs any more, with their messages, their
// turns' usage and their outbox entries but each key's last (which keeps its seq as a
// KindPruned entry). On error nothing is deleted.
//
// Deleted rows stay in the table files as dead tuples until VACUUM (autovacuum) reclaims
// them; unlike the SQLite store, this store does not overwrite them at once.
func (s *Store) PruneSessions(ctx context.Context, endedBefore time.Time, limit int) (int, error) {
	n, err := s.prune(ctx, endedBefore, limit)
	if err != nil {
		return 0, markUnavailable(fmt.Errorf("prune sessions ended before %v: %w", endedBefore, err))
	}
	return n, nil
}

func (s *Store) prune(ctx context.Context, endedBefore time.Time, limit int) (int, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	if limit <= 0 {
		limit = persistence.DefaultPruneLimit
	}
	fence, err := s.lockHeld()
	if err != nil {
		return 0, err
	}
	pruned := 0
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if fence != nil { // fenced as a commit is: a daemon that lost its lock deletes nothing
			if _, err := tx.Exec(ctx, fence.sql, fence.args...); err != nil {
				return describe(*fence, err)
			}
		}
		type cand struct{ id, key string }
		cands, err := queryAll(ctx, tx, func(r scanner) (cand, error) {
			var c cand
			return c, r.Scan(&c.id, &c.key)
		}, pruneCandidatesSQL, sqlstore.NanoBound(endedBefore), limit)
		if err != nil {
			return fmt.Errorf("select: %w", err)
		}
		if len(cands) == 0 {
			return nil
		}
		b := &pgx.Batch{}
		for _, c := range cands {
			b.Queue(`DELETE FROM outbox WHERE session_key = $1 AND session_id = $2
				AND seq < (SELECT MAX(seq) FROM outbox WHERE session_key = $1)`, c.key, c.id)
			b.Queue(`UPDATE outbox SET kind = $3, text = '', in_reply_to = '{}'
				WHERE session_key = $1 AND session_id = $2`, c.key, c.id, persistence.KindPruned)
			b.Queue(`DELETE FROM messages WHERE session_id = $1`, c.id)
			b.Queue(`DELETE FROM turn_usage WHERE session_id = $1`, c.id)
			b.Queue(`DELETE FROM sessions WHERE id = $1`, c.id)
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		pruned = len(cands)
		return nil
	})
	if err != nil {
		return 0, s.explain(ctx, err)
	}
	return pruned, nil
}
