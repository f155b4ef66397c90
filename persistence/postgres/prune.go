package postgres

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/internal/sqlstore"
	"github.com/jackc/pgx/v5"
)

// pruneDueSQL is what makes a session s due for pruning: it ended before $1 and nothing needs it
// any more (see PruneSessions).
const pruneDueSQL = `s.ended_at IS NOT NULL AND s.ended_at > 0 AND s.ended_at < $1
		AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id AND m.role = 'user'
			AND m.active AND m.status NOT IN ('done', 'failed', 'quarantined'))
		AND NOT EXISTS (SELECT 1 FROM outbox o
			WHERE o.session_key = s.key AND o.state = 'pending' AND o.session_id = s.id)`

// pruneCandidatesSQL selects the sessions PruneSessions may delete, oldest end first, and locks
// them: a write that would make one needed again (a message for it, reopening it) and comes
// later waits, and then finds it gone. One that came first holds the step up until it commits,
// and the step checks the session again then (pruneRowsSQL).
const pruneCandidatesSQL = `SELECT s.id, s.key FROM sessions s WHERE ` + pruneDueSQL + `
	ORDER BY s.ended_at, s.id COLLATE "C" LIMIT $2
	FOR UPDATE OF s`

// pruneCandidatesPage is the most candidates a step reads (and locks) at a time: one first,
// then twice as many each time, as most steps delete one or two sessions and each candidate
// costs its checks.
const pruneCandidatesPage = 32

// pruneRowsSQL checks a locked candidate again ($2, its id, with its key $3: still due before
// $1), and counts the rows its deletion deletes or empties, besides its own: its messages, its
// outbox entries but pending ones, and its turns' usage. The check is not the candidates'
// SELECT's over again: under READ COMMITTED that SELECT saw the tables as they were when it
// began, and a writer that held the session's row (a message's foreign key check locks it, FOR
// KEY SHARE) while the SELECT waited for it committed meanwhile without changing the row, so
// PostgreSQL handed the row over unchecked. This statement sees what that writer committed, and
// no message or usage row of the session can commit while the step holds its row.
const pruneRowsSQL = `SELECT EXISTS (SELECT 1 FROM sessions s WHERE s.id = $2 AND ` + pruneDueSQL + `),
	(SELECT COUNT(*) FROM messages WHERE session_id = $2),
	(SELECT COUNT(*) FROM outbox WHERE session_key = $3 AND session_id = $2 AND state <> 'pending'),
	(SELECT COUNT(*) FROM turn_usage WHERE session_id = $2)`

// PruneSessions implements persistence.Store: it runs steps (see PruneStep) of
// persistence.DefaultPruneRows rows until they have deleted limit sessions or nothing more is
// due.
func (s *Store) PruneSessions(ctx context.Context, endedBefore time.Time, limit int) (int, error) {
	return sqlstore.PruneSessions(limit, func(most int) (persistence.PruneCount, error) {
		return s.pruneStep(ctx, endedBefore, persistence.DefaultPruneRows, most)
	})
}

// PruneStep implements persistence.Store: it deletes, in one transaction, sessions that ended
// before endedBefore and that nothing needs any more, whole, while their rows fit in the budget
// of rows rows (persistence.DefaultPruneRows when rows <= 0), with their messages, their turns'
// usage and their outbox entries but each key's last (which keeps its seq as a KindPruned
// entry). A session larger than the budget is deleted whole, alone in its step: unlike SQLite's
// write lock, its row locks hold up no other session's writes, and splitting it would need its
// messages' foreign key gone. On error nothing is deleted. Earlier steps leave nothing behind.
//
// Deleted rows stay in the table files as dead tuples until VACUUM (autovacuum) reclaims
// them; unlike the SQLite store, this store does not overwrite them at once.
func (s *Store) PruneStep(ctx context.Context, endedBefore time.Time, rows int) (persistence.PruneCount, error) {
	if rows <= 0 {
		rows = persistence.DefaultPruneRows
	}
	return s.pruneStep(ctx, endedBefore, rows, math.MaxInt)
}

// pruneStep is PruneStep deleting at most most sessions.
func (s *Store) pruneStep(ctx context.Context, endedBefore time.Time, rows, most int) (persistence.PruneCount, error) {
	c, err := s.prune(ctx, endedBefore, rows, most)
	if err != nil {
		return persistence.PruneCount{}, markUnavailable(fmt.Errorf("prune sessions ended before %v: %w", endedBefore, err))
	}
	return c, nil
}

func (s *Store) prune(ctx context.Context, endedBefore time.Time, rows, most int) (persistence.PruneCount, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return persistence.PruneCount{}, err
	}
	defer done()
	fence, err := s.lockHeld()
	if err != nil {
		return persistence.PruneCount{}, err
	}
	var c persistence.PruneCount
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		c = persistence.PruneCount{}
		if fence != nil { // fenced as a commit is: a daemon that lost its lock deletes nothing
			if _, err := tx.Exec(ctx, fence.sql, fence.args...); err != nil {
				return describe(*fence, err)
			}
		}
		bound, drained, full, size := sqlstore.NanoBound(endedBefore), most <= 0, false, 1
		for !drained && !full && c.Sessions < most {
			page := min(size, most-c.Sessions)
			size = min(2*size, pruneCandidatesPage)
			type cand struct{ id, key string }
			cands, err := queryAll(ctx, tx, func(r scanner) (cand, error) {
				var c cand
				return c, r.Scan(&c.id, &c.key)
			}, pruneCandidatesSQL, bound, page)
			if err != nil {
				return fmt.Errorf("select: %w", err)
			}
			drained = len(cands) < page
			for _, cd := range cands {
				// The candidate is locked: no message or usage row of it can be added meanwhile.
				var due bool
				var messages, outbox, usage int
				if err := tx.QueryRow(ctx, pruneRowsSQL, bound, cd.id, cd.key).Scan(&due, &messages, &outbox, &usage); err != nil {
					return fmt.Errorf("count the rows of session %s: %w", cd.id, err)
				}
				if !due {
					continue // needed again since the SELECT began (a later page leaves it out)
				}
				n := 1 + messages + outbox + usage
				if c.Sessions > 0 && c.Rows+n > rows {
					full = true
					break
				}
				b := &pgx.Batch{}
				// An outbox entry has no foreign key: one may still come, and is kept if pending.
				b.Queue(`DELETE FROM outbox WHERE session_key = $1 AND session_id = $2 AND state <> 'pending'
					AND seq < (SELECT MAX(seq) FROM outbox WHERE session_key = $1)`, cd.key, cd.id)
				b.Queue(`UPDATE outbox SET kind = $3, text = '', in_reply_to = '{}'
					WHERE session_key = $1 AND session_id = $2 AND state <> 'pending'`, cd.key, cd.id, persistence.KindPruned)
				b.Queue(`DELETE FROM messages WHERE session_id = $1`, cd.id)
				b.Queue(`DELETE FROM turn_usage WHERE session_id = $1`, cd.id)
				b.Queue(`DELETE FROM sessions WHERE id = $1`, cd.id)
				if err := tx.SendBatch(ctx, b).Close(); err != nil {
					return fmt.Errorf("delete session %s: %w", cd.id, err)
				}
				c.Sessions++
				c.Messages += messages
				c.Rows += n
			}
		}
		c.More = full || (!drained && c.Sessions == most)
		return nil
	})
	if err != nil {
		return persistence.PruneCount{}, s.explain(ctx, err)
	}
	return c, nil
}
