package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/internal/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// lastRunSQL locks the row: the daemon lock keeps a second daemon out already, but a
	// BeginRun that raced another would count one unclean stop twice.
	lastRunSQL = `SELECT run, started_at FROM daemon_run WHERE one FOR UPDATE`
	// countUncleanStopSQL adds one attempt to the head pending message of each routed session
	// (messages_pending serves the MIN): at once when it has none yet, and when it has, only
	// when its mark (persistence.MarkProbation) names the run that died ($1), the run that
	// started its turn.
	countUncleanStopSQL = `UPDATE messages m SET attempts = m.attempts + 1
		WHERE m.role = 'user' AND m.status = 'pending' AND m.active
			AND m.session_id IN (SELECT session_id FROM routing)
			AND m.seq = (SELECT MIN(h.seq) FROM messages h WHERE h.session_id = m.session_id
				AND h.role = 'user' AND h.status = 'pending' AND h.active)
			AND (m.attempts = 0 OR m.probation_run = $1)
		RETURNING (SELECT r.key FROM routing r WHERE r.session_id = m.session_id), m.session_id, m.message_id, m.attempts`
	beginRunSQL = `INSERT INTO daemon_run (one, run, started_at) VALUES (TRUE, $1, $2)
		ON CONFLICT (one) DO UPDATE SET run = excluded.run, started_at = excluded.started_at`
	endRunSQL = `UPDATE daemon_run SET run = '' WHERE one AND run = $1`
	// pardonRunSQL forgets the last run, as a clean stop does: a pardon of every session
	// pardons the stop of a run that died too, which the next start would count.
	pardonRunSQL = `UPDATE daemon_run SET run = '' WHERE one`
	// pardonSQL clears the count and the probation mark of the active pending user messages of
	// the session key $1 routes to, or of every routed session when $1 is empty.
	pardonSQL = `UPDATE messages m SET attempts = 0, probation_run = ''
		WHERE m.role = 'user' AND m.status = 'pending' AND m.active
			AND (m.attempts > 0 OR m.probation_run <> '')
			AND m.session_id IN (SELECT session_id FROM routing WHERE $1 = '' OR key = $1)
		RETURNING m.session_id`
)

// BeginRun implements persistence.Store: one transaction, fenced by the daemon lock as a
// commit is, reads the last run, counts its unclean stop and records run.
func (s *Store) BeginRun(ctx context.Context, run string, at time.Time) (*persistence.UncleanStop, error) {
	u, err := s.beginRun(ctx, run, at)
	if err != nil {
		return nil, markUnavailable(fmt.Errorf("begin run %s: %w", run, err))
	}
	return u, nil
}

func (s *Store) beginRun(ctx context.Context, run string, at time.Time) (*persistence.UncleanStop, error) {
	if run == "" {
		return nil, errors.New("run id required")
	}
	outer := ctx
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	fence, err := s.lockHeld()
	if err != nil {
		return nil, err
	}
	var u *persistence.UncleanStop
	// A record taken but told refused would be written again, and count this run's own stop
	// (inTxSettled).
	err = s.inTxSettled(ctx, outer, "begin run", func(tx pgx.Tx) error {
		u = nil // (run again when its connection was dead: inTxSettled)
		if fence != nil {
			if _, err := tx.Exec(ctx, fence.sql, fence.args...); err != nil {
				return describe(*fence, err)
			}
		}
		var last persistence.UncleanStop
		if err := tx.QueryRow(ctx, lastRunSQL).Scan(&last.Run, nanoTime{&last.StartedAt}); err != nil {
			return fmt.Errorf("read the last run: %w", err)
		}
		if last.Run != "" {
			rows, err := tx.Query(ctx, countUncleanStopSQL, last.Run)
			if err != nil {
				return fmt.Errorf("count the unclean stop: %w", err)
			}
			counted, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (persistence.CountedMessage, error) {
				var c persistence.CountedMessage
				return c, r.Scan(&c.Key, &c.SessionID, &c.MessageID, &c.Attempts)
			})
			if err != nil {
				return fmt.Errorf("count the unclean stop: %w", err)
			}
			last.Counted = sqlstore.SortCounted(counted)
			u = &last
		}
		_, err := tx.Exec(ctx, beginRunSQL, run, timeArg(at))
		return err
	})
	if err != nil {
		return nil, s.explain(ctx, err)
	}
	return u, nil
}

// EndRun implements persistence.Store.
func (s *Store) EndRun(ctx context.Context, run string) error {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return fmt.Errorf("end run %s: %w", run, err)
	}
	defer done()
	if err := s.again(ctx, func(c *pgxpool.Conn) error { // clears a run id: twice is once
		_, err := c.Exec(ctx, endRunSQL, run)
		return err
	}); err != nil {
		return markUnavailable(fmt.Errorf("end run %s: %w", run, s.explain(ctx, err)))
	}
	return nil
}

// Pardon implements persistence.Store: one statement, fenced by the daemon lock as a commit is.
func (s *Store) Pardon(ctx context.Context, key string) (persistence.Pardoned, error) {
	outer := ctx
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return persistence.Pardoned{}, fmt.Errorf("pardon: %w", err)
	}
	defer done()
	fence, err := s.lockHeld()
	if err != nil {
		return persistence.Pardoned{}, fmt.Errorf("pardon: %w", err)
	}
	var ids []string
	err = s.inTxSettled(ctx, outer, "pardon", func(tx pgx.Tx) error {
		if fence != nil {
			if _, err := tx.Exec(ctx, fence.sql, fence.args...); err != nil {
				return describe(*fence, err)
			}
		}
		rows, err := tx.Query(ctx, pardonSQL, key)
		if err != nil {
			return err
		}
		if ids, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || key != "" {
			return err
		}
		_, err = tx.Exec(ctx, pardonRunSQL)
		return err
	})
	if err != nil {
		return persistence.Pardoned{}, markUnavailable(fmt.Errorf("pardon: %w", s.explain(ctx, err)))
	}
	sessions := map[string]bool{}
	for _, id := range ids {
		sessions[id] = true
	}
	return persistence.Pardoned{Messages: len(ids), Sessions: len(sessions)}, nil
}
