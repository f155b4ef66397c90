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
// outbox entries but pending ones, and its turns' usage, each up to $4 (what is left of the
// step's budget, and one: a count that reaches it says the session does not fit, and a step
// does not read a large session's rows whole to say so; each in its index's order, so that
// statistics taken before earlier steps deleted most of a session do not make PostgreSQL scan
// the table instead). The check is not the candidates'
// SELECT's over again: under READ COMMITTED that SELECT saw the tables as they were when it
// began, and a writer that held the session's row (a message's foreign key check locks it, FOR
// KEY SHARE) while the SELECT waited for it committed meanwhile without changing the row, so
// PostgreSQL handed the row over unchecked. This statement sees what that writer committed, and
// no message or usage row of the session can commit while the step holds its row.
const pruneRowsSQL = `SELECT EXISTS (SELECT 1 FROM sessions s WHERE s.id = $2 AND ` + pruneDueSQL + `),
	(SELECT COUNT(*) FROM (SELECT 1 FROM messages WHERE session_id = $2 ORDER BY seq LIMIT $4) m),
	(SELECT COUNT(*) FROM (SELECT 1 FROM outbox
		WHERE session_key = $3 AND session_id = $2 AND state <> 'pending' ORDER BY seq LIMIT $4) o),
	(SELECT COUNT(*) FROM (SELECT 1 FROM turn_usage WHERE session_id = $2 ORDER BY turn_id LIMIT $4) u)`

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
// of rows rows (persistence.DefaultPruneRows when rows <= 0; at least minPruneRows), with their
// messages, their turns' usage and their outbox entries but each key's last (which keeps its seq
// as a KindPruned entry). A session larger than the budget is deleted over several steps, alone
// in each but the last: first its oldest rows, within the budget (pruneChunk), its row last,
// with the rest, once they fit. Its messages' foreign key keeps its row until they are gone, so
// unlike on SQLite it stays readable meanwhile, without the rows deleted so far. Each step
// locks and checks it again (pruneRowsSQL), so a message or reply that makes it needed again
// between two steps keeps it, with what is left of it; no step deletes a row of a session it
// has not found due under its lock. Before, such a session went in one step, which took 0.45
// to 0.9 s for 100,000 messages and 50,000 replies, all that time in the persistence actor. A
// step that finds no session left to delete sweeps the outbox with the rest of its budget
// (sweepOutbox). On error nothing is deleted.
//
// Deleted rows stay in the table files as dead tuples until VACUUM (autovacuum) reclaims
// them; unlike the SQLite store, this store does not overwrite them at once.
func (s *Store) PruneStep(ctx context.Context, endedBefore time.Time, rows int) (persistence.PruneCount, error) {
	if rows <= 0 {
		rows = persistence.DefaultPruneRows
	}
	return s.pruneStep(ctx, endedBefore, rows, math.MaxInt)
}

// minPruneRows is the least budget of a step: a session's row and its key's last outbox entry,
// what is left of a session once its other rows are gone, which go together.
const minPruneRows = 2

// pruneStep is PruneStep deleting at most most sessions.
func (s *Store) pruneStep(ctx context.Context, endedBefore time.Time, rows, most int) (persistence.PruneCount, error) {
	c, err := s.prune(ctx, endedBefore, max(rows, minPruneRows), most)
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
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	var c persistence.PruneCount
	after, next, swept := s.sweepAfter, int64(0), false
	err = s.inTx(ctx, pgx.TxOptions{}, func(tx pgx.Tx) error {
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
				room := rows - c.Rows
				if err := tx.QueryRow(ctx, pruneRowsSQL, bound, cd.id, cd.key, room+1).Scan(&due, &messages, &outbox, &usage); err != nil {
					return fmt.Errorf("count the rows of session %s: %w", cd.id, err)
				}
				if !due {
					continue // needed again since the SELECT began (a later page leaves it out)
				}
				n := 1 + messages + outbox + usage // exact when it fits: each count is below room+1
				if n > room {
					full = true
					if c.Rows > 0 {
						break // the next step begins with it
					}
					// Alone in its step and larger than the budget: its oldest rows go now,
					// its row last, in a later step that checks it again as this one did.
					k, m, err := pruneChunk(ctx, tx, cd.id, cd.key, rows)
					if err != nil {
						return fmt.Errorf("delete the oldest rows of session %s: %w", cd.id, err)
					}
					c.Messages += m
					c.Rows += k
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
		swept = false
		if !c.More && most > 0 && rows-c.Rows > 0 {
			// No session is left to delete: the rest of the budget sweeps the outbox.
			n, a, end, err := sweepOutbox(ctx, tx, after, rows-c.Rows, sqlstore.SweepWindow(rows))
			if err != nil {
				return fmt.Errorf("sweep the outbox: %w", err)
			}
			c.Swept, c.Rows, next, swept = n, c.Rows+n, a, true
			c.More = !end
			if end {
				next = 0 // the next pass sweeps from the start
			}
		}
		return nil
	})
	if err != nil {
		return persistence.PruneCount{}, s.explain(ctx, err)
	}
	if swept {
		s.sweepAfter = next
	}
	return c, nil
}

// sweepWindowSQL reads the window of a sweep: the outbox rows after $1, at most $3, in id
// order ($3 is sqlstore.SweepWindow of the step's budget), each with whether the sweep takes
// it (sweepSQL). It reads them through the primary key, and looks up the session of each.
const sweepWindowSQL = `SELECT o.id, ` + sweepSQL + ` FROM outbox o WHERE o.id > $1 ORDER BY o.id LIMIT $3`

// sweepSQL is what makes an outbox row o one the sweep takes ($2 is persistence.KindPruned): a
// pruned marker that is no longer its key's last, or a reply or notice of a session that is
// gone, which is no longer pending (delivered, or failed: final). A step keeps a pending entry
// of the session it deletes, and one may be added after the step (an entry has no foreign
// key); delivered later, it stayed for ever, its text with it, before the sweep. A marker
// holds its key's seq (the SSE event id) only while no later entry does. Entries without a
// session id are no session's: none is written, and no retention applies to them.
const sweepSQL = `o.state <> 'pending' AND CASE WHEN o.kind = $2
		THEN o.seq < (SELECT MAX(m.seq) FROM outbox m WHERE m.session_key = o.session_key)
		ELSE o.session_id <> '' AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = o.session_id) END`

// sweepOutbox is a prune step's sweep of the outbox: it reads the window of at most window
// rows after after (sweepWindowSQL), deletes at most room of the rows the sweep takes, or
// empties them into pruned markers where they are their key's last, and returns how many,
// the id the next window begins after, and whether it reached the end of the outbox. Run at
// each pass's end, it reads the whole outbox over as many steps as that takes, in bounded
// windows (the rows are few: pruning deletes a session's finished entries with it). Each
// statement takes the rows it changes FOR UPDATE SKIP LOCKED, with its checks again: it never
// waits for a row a commit holds (a delivery mark), which the next pass's sweep takes, and so
// never deadlocks with a commit, though the step holds the row locks of the sessions it
// deleted.
func sweepOutbox(ctx context.Context, tx pgx.Tx, after int64, room, window int) (swept int, next int64, end bool, err error) {
	rows, err := queryAll(ctx, tx, func(r scanner) (sqlstore.SweepRow, error) {
		var w sqlstore.SweepRow
		return w, r.Scan(&w.ID, &w.Taken)
	}, sweepWindowSQL, after, persistence.KindPruned, window)
	if err != nil {
		return 0, 0, false, fmt.Errorf("read: %w", err)
	}
	ids, next, end := sqlstore.SweepPick(rows, after, room, window)
	if len(ids) == 0 {
		return 0, next, end, nil
	}
	for _, st := range []struct{ what, sql string }{{
		// The rows that are not their key's last go.
		"delete", `DELETE FROM outbox WHERE id = ANY (ARRAY (SELECT o.id FROM outbox o
			WHERE o.id = ANY ($1) AND ` + sweepSQL + `
				AND o.seq < (SELECT MAX(m.seq) FROM outbox m WHERE m.session_key = o.session_key)
			ORDER BY o.id FOR UPDATE SKIP LOCKED))`,
	}, {
		// The rest, a key's last entry, keeps its seq and state and loses its content.
		"empty", `UPDATE outbox SET kind = $2, text = '', in_reply_to = '{}'
			WHERE id = ANY (ARRAY (SELECT o.id FROM outbox o WHERE o.id = ANY ($1) AND o.kind <> $2 AND ` + sweepSQL + `
			ORDER BY o.id FOR UPDATE SKIP LOCKED))`,
	}} {
		tag, err := tx.Exec(ctx, st.sql, ids, persistence.KindPruned)
		if err != nil {
			return 0, 0, false, fmt.Errorf("%s: %w", st.what, err)
		}
		swept += int(tag.RowsAffected())
	}
	return swept, next, end, nil
}

// pruneChunk deletes at most rows rows of session id (of key key), locked and checked by the
// step, oldest first: its outbox entries but pending ones and its key's last, then its turns'
// usage, then its messages by seq. Its row stays, as do the rows past the budget, for the next
// steps: the messages' foreign key keeps the row until they are gone. It returns the rows and
// the messages it deleted. Each statement deletes by the primary key, from an array of the rows
// it picked in its index's order: with IN (subquery) PostgreSQL read the whole table.
func pruneChunk(ctx context.Context, tx pgx.Tx, id, key string, rows int) (deleted, messages int, err error) {
	for _, st := range []struct {
		what, sql string
		args      []any
	}{{
		// state is checked again outside the subquery: a row set pending since the subquery
		// read it is then kept (a concurrent UPDATE makes PostgreSQL check the outer condition
		// again on the new row, not the subquery's).
		"outbox entries", `DELETE FROM outbox WHERE id = ANY (ARRAY (SELECT id FROM outbox
			WHERE session_key = $1 AND session_id = $2 AND state <> 'pending'
				AND seq < (SELECT MAX(seq) FROM outbox WHERE session_key = $1)
			ORDER BY seq LIMIT $3)) AND state <> 'pending'`, []any{key, id},
	}, {
		"turn usage", `DELETE FROM turn_usage WHERE session_id = $1
			AND turn_id = ANY (ARRAY (SELECT turn_id FROM turn_usage WHERE session_id = $1
				ORDER BY turn_id LIMIT $2))`, []any{id},
	}, {
		"messages", `DELETE FROM messages WHERE id = ANY (ARRAY (SELECT id FROM messages WHERE session_id = $1
			ORDER BY seq LIMIT $2))`, []any{id},
	}} {
		if deleted == rows {
			break
		}
		tag, err := tx.Exec(ctx, st.sql, append(st.args, rows-deleted)...)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %w", st.what, err)
		}
		n := int(tag.RowsAffected())
		deleted += n
		if st.what == "messages" {
			messages = n
		}
	}
	return deleted, messages, nil
}
