package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/internal/sqlstore"
)

const (
	lastRunSQL = `SELECT run, started_at FROM daemon_run WHERE one = 1`
	// countUncleanStopSQL adds one attempt to the head pending message of each routed session
	// (messages_pending serves the MIN): at once when it has none yet, and when it has, only
	// when its mark (persistence.MarkProbation) names the run that died (?1), the run that
	// started its turn.
	countUncleanStopSQL = `UPDATE messages SET attempts = attempts + 1
		WHERE role = 'user' AND status = 'pending' AND active = 1
			AND session_id IN (SELECT session_id FROM routing)
			AND seq = (SELECT MIN(h.seq) FROM messages h WHERE h.session_id = messages.session_id
				AND h.role = 'user' AND h.status = 'pending' AND h.active = 1)
			AND (attempts = 0 OR probation_run = ?1)
		RETURNING (SELECT r.key FROM routing r WHERE r.session_id = messages.session_id), session_id, message_id, attempts`
	beginRunSQL = `INSERT INTO daemon_run (one, run, started_at) VALUES (1, ?1, ?2)
		ON CONFLICT (one) DO UPDATE SET run = ?1, started_at = ?2`
	endRunSQL = `UPDATE daemon_run SET run = '' WHERE one = 1 AND run = ?`
	// pardonRunSQL forgets the last run, as a clean stop does: a pardon of every session
	// pardons the stop of a run that died too, which the next start would count.
	pardonRunSQL = `UPDATE daemon_run SET run = '' WHERE one = 1`
	// pardonSQL clears the count and the probation mark of the active pending user messages of
	// the session key ?1 routes to, or of every routed session when ?1 is empty.
	pardonSQL = `UPDATE messages SET attempts = 0, probation_run = ''
		WHERE role = 'user' AND status = 'pending' AND active = 1
			AND (attempts > 0 OR probation_run <> '')
			AND session_id IN (SELECT session_id FROM routing WHERE ?1 = '' OR key = ?1)
		RETURNING session_id`
)

// BeginRun implements persistence.Store: one BEGIN IMMEDIATE transaction under the commit
// mutex reads the last run, counts its unclean stop and records run.
func (s *Store) BeginRun(ctx context.Context, run string, at time.Time) (*persistence.UncleanStop, error) {
	u, err := s.beginRun(ctx, run, at)
	if err != nil {
		return nil, s.unavailable(fmt.Errorf("begin run %s: %w", run, err))
	}
	return u, nil
}

func (s *Store) beginRun(ctx context.Context, run string, at time.Time) (_ *persistence.UncleanStop, err error) {
	if run == "" {
		return nil, fmt.Errorf("run id required")
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	if s.readOnly {
		return nil, ErrReadOnly
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	tx, release, err := s.writerTx(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	var u *persistence.UncleanStop
	var last persistence.UncleanStop
	if err := tx.QueryRowContext(ctx, lastRunSQL).Scan(&last.Run, nanoTime{&last.StartedAt}); err != nil {
		return nil, fmt.Errorf("read the last run: %w", err)
	}
	if last.Run != "" {
		counted, err := countUncleanStop(ctx, tx, last.Run)
		if err != nil {
			return nil, fmt.Errorf("count the unclean stop: %w", err)
		}
		last.Counted = sqlstore.SortCounted(counted)
		u = &last
	}
	if _, err := tx.ExecContext(ctx, beginRunSQL, run, timeArg(at)); err != nil {
		return nil, err
	}
	if err := s.commitChecked(tx); err != nil {
		return nil, err
	}
	return u, nil
}

// EndRun implements persistence.Store.
func (s *Store) EndRun(ctx context.Context, run string) error {
	if err := s.endRun(ctx, run); err != nil {
		return s.unavailable(fmt.Errorf("end run %s: %w", run, err))
	}
	return nil
}

func (s *Store) endRun(ctx context.Context, run string) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	if s.readOnly {
		return ErrReadOnly
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	tx, release, err := s.writerTx(ctx)
	if err != nil {
		return err
	}
	defer release()
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, endRunSQL, run); err != nil {
		return err
	}
	return s.commitChecked(tx)
}

// countUncleanStop runs countUncleanStopSQL for the run that died and returns the messages it
// counted against.
func countUncleanStop(ctx context.Context, tx *sql.Tx, died string) ([]persistence.CountedMessage, error) {
	return queryAll(ctx, tx, func(r scanner) (persistence.CountedMessage, error) {
		var c persistence.CountedMessage
		err := r.Scan(&c.Key, &c.SessionID, &c.MessageID, &c.Attempts)
		return c, err
	}, countUncleanStopSQL, died)
}

// Pardon implements persistence.Store: one BEGIN IMMEDIATE transaction under the commit mutex.
func (s *Store) Pardon(ctx context.Context, key string) (persistence.Pardoned, error) {
	p, err := s.pardon(ctx, key)
	if err != nil {
		return persistence.Pardoned{}, s.unavailable(fmt.Errorf("pardon: %w", err))
	}
	return p, nil
}

func (s *Store) pardon(ctx context.Context, key string) (persistence.Pardoned, error) {
	if err := s.enter(); err != nil {
		return persistence.Pardoned{}, err
	}
	defer s.leave()
	if s.readOnly {
		return persistence.Pardoned{}, ErrReadOnly
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	tx, release, err := s.writerTx(ctx)
	if err != nil {
		return persistence.Pardoned{}, err
	}
	defer release()
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	ids, err := queryAll(ctx, tx, func(r scanner) (string, error) {
		var id string
		return id, r.Scan(&id)
	}, pardonSQL, key)
	if err != nil {
		return persistence.Pardoned{}, err
	}
	if key == "" {
		if _, err := tx.ExecContext(ctx, pardonRunSQL); err != nil {
			return persistence.Pardoned{}, err
		}
	}
	if err := s.commitChecked(tx); err != nil {
		return persistence.Pardoned{}, err
	}
	sessions := map[string]bool{}
	for _, id := range ids {
		sessions[id] = true
	}
	return persistence.Pardoned{Messages: len(ids), Sessions: len(sessions)}, nil
}
