package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/internal/sqlstore"
)

// pruneCandidatesSQL selects the sessions PruneSessions may delete (id and key), oldest end
// first. Every
// condition errs on the side of keeping a session:
//   - ended_at must be a positive INTEGER below the cutoff: NULL (open), zero, negative, real,
//     text or blob values are kept, even when they might read as an old time;
//   - no active user message may be unanswered: any status but done, failed and quarantined
//     (a garbage one included) counts as pending;
//   - no outbox entry recorded for its session id (under its key) may be pending (delivered
//     and failed, refused by its platform for good, are final).
//
// A routing row may point to it: a key's last session, once ended, is pruned like any other
// (the row stays, and the key's next message starts a new session).
const pruneCandidatesSQL = `SELECT s.id, s.key FROM sessions s
	WHERE s.ended_at IS NOT NULL AND s.ended_at > 0 AND s.ended_at < ?1
		AND typeof(s.ended_at) = 'integer'
		AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id AND m.role = 'user'
			AND m.active <> 0 AND m.status NOT IN ('done', 'failed', 'quarantined'))
		AND NOT EXISTS (SELECT 1 FROM outbox o INDEXED BY outbox_undelivered
			WHERE o.session_key = s.key AND o.state = 'pending' AND o.session_id = s.id)
	ORDER BY s.ended_at, s.id LIMIT ?2`

// PruneSessions deletes, in one BEGIN IMMEDIATE transaction, at most limit sessions
// (persistence.DefaultPruneLimit when limit <= 0) that ended before endedBefore and that nothing
// needs any more (see pruneCandidatesSQL), oldest end first, with their messages, their search
// index entries, their turns' usage and their replies in the outbox. Routing rows are never
// deleted, and neither is the last outbox entry of a key: the key's next reply continues its
// seq, the SSE event id. When that entry is a pruned session's, it keeps its seq and state
// and loses its text, the ids it answered and its kind (persistence.KindPruned), so no text
// of the session is left and readers skip it. It holds the commit mutex, so it never
// interleaves with Commit.
//
// Each session is deleted inside a savepoint of its own. The search index is cleaned first,
// for the rows it holds (those with a messages_fts_docsize row: a row whose indexing failed, or
// that waits to be indexed, has none, and deleting it from the index would corrupt the index).
// If that cleanup fails the session is kept, with a rate-limited warning, and retried by a later
// call; a store whose search index has been dropped prunes without it. When the deleted rows
// were the highest ones, the search index watermark is lowered to the highest row left, so the
// ids SQLite hands out again are indexed (lowerWatermark). Any other error rolls the whole call
// back and deletes nothing.
func (s *Store) PruneSessions(ctx context.Context, endedBefore time.Time, limit int) (int, error) {
	n, err := s.prune(ctx, endedBefore, limit)
	if err != nil {
		return 0, s.unavailable(fmt.Errorf("prune sessions ended before %v: %w", endedBefore, err))
	}
	return n, nil
}

func (s *Store) prune(ctx context.Context, endedBefore time.Time, limit int) (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.leave()
	if s.readOnly {
		return 0, ErrReadOnly
	}
	if limit <= 0 {
		limit = persistence.DefaultPruneLimit
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()

	conn, err := s.writer.Conn(ctx)
	if err != nil {
		return 0, fmt.Errorf("writer connection: %w", err)
	}
	defer conn.Close()
	// SQLite leaves deleted content in place (in the page, or in a freed page) until it is
	// reused. While pruning it overwrites it with zeros instead, so a pruned conversation does
	// not stay in the file. Only here: on the commit path it would cost a write of every page
	// the search index frees.
	if _, err := conn.ExecContext(ctx, `PRAGMA secure_delete = ON`); err != nil {
		return 0, fmt.Errorf("secure delete on: %w", err)
	}
	defer func() {
		if _, err := conn.ExecContext(context.WithoutCancel(ctx), `PRAGMA secure_delete = OFF`); err != nil {
			s.log.Warn("secure delete off after pruning; commits stay correct but write more", logging.Err(err))
		}
	}()
	tx, err := conn.BeginTx(ctx, nil) // _txlock=immediate: BEGIN IMMEDIATE
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	cands, err := pruneCandidates(ctx, tx, sqlstore.NanoBound(endedBefore), limit)
	if err != nil || len(cands) == 0 {
		return 0, err
	}
	fts, err := hasFTS(ctx, tx)
	if err != nil {
		return 0, err
	}
	pruned := 0
	for _, c := range cands {
		ok, err := s.pruneSession(ctx, tx, c, fts)
		if err != nil {
			return 0, err
		}
		if ok {
			pruned++
		}
	}
	if err := lowerWatermark(ctx, tx); err != nil {
		return 0, fmt.Errorf("search index watermark: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	return pruned, nil
}

// pruneCandidate is a session PruneSessions may delete.
type pruneCandidate struct{ id, key string }

func pruneCandidates(ctx context.Context, tx *sql.Tx, bound int64, limit int) ([]pruneCandidate, error) {
	cands, err := queryAll(ctx, tx, func(r scanner) (pruneCandidate, error) {
		var c pruneCandidate
		err := r.Scan(&c.id, &c.key)
		return c, err
	}, pruneCandidatesSQL, bound, limit)
	if err != nil {
		return nil, fmt.Errorf("select: %w", err)
	}
	return cands, nil
}

// hasFTS reports whether the search index and its docsize shadow table exist (a damaged store
// may have lost them; writes go on without them).
func hasFTS(ctx context.Context, tx *sql.Tx) (bool, error) {
	var n int
	err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM sqlite_schema
		WHERE type = 'table' AND name IN ('messages_fts', 'messages_fts_docsize')`).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("find search index: %w", err)
	}
	return n == 2, nil
}

// errKeep marks a failure that keeps the session instead of failing the call.
var errKeep = errors.New("session kept")

// pruneSession deletes one session inside a savepoint. It reports false, after rolling the
// savepoint back, when the session had to be kept; an error means the transaction cannot go on.
func (s *Store) pruneSession(ctx context.Context, tx *sql.Tx, c pruneCandidate, fts bool) (bool, error) {
	id := c.id
	if _, err := tx.ExecContext(ctx, `SAVEPOINT prune`); err != nil {
		return false, fmt.Errorf("session %s: savepoint: %w", id, err)
	}
	err := deleteSession(ctx, tx, c, fts)
	if err != nil {
		if _, rerr := tx.ExecContext(ctx, `ROLLBACK TO prune`); rerr != nil {
			return false, fmt.Errorf("session %s: %w (rollback to savepoint: %v)", id, err, rerr)
		}
	}
	if _, rerr := tx.ExecContext(ctx, `RELEASE prune`); rerr != nil {
		return false, fmt.Errorf("session %s: release savepoint: %w", id, rerr)
	}
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, errKeep) && !IsUnavailable(err) && ctx.Err() == nil:
		if n, ok := s.ftsWarn.Allow(); ok {
			s.log.Warn("fts index delete failed; session kept", "session_id", id, "batches", n, logging.Err(err))
		}
		return false, nil
	}
	return false, fmt.Errorf("session %s: %w", id, err)
}

// deleteSession removes a session's search index entries, its messages, its turns' usage, its
// outbox entries (all but the key's last, which loses its content instead) and its row. A
// failure to clean the search index wraps errKeep.
func deleteSession(ctx context.Context, tx *sql.Tx, c pruneCandidate, fts bool) error {
	id, key := c.id, c.key
	if fts {
		if err := unindexSession(ctx, tx, id); err != nil {
			return fmt.Errorf("%w: %w", errKeep, err)
		}
	}
	// By key and session id, so the unique (session_key, seq) index finds them. Every entry is
	// delivered: pruneCandidatesSQL keeps a session with any other.
	if _, err := tx.ExecContext(ctx, `DELETE FROM outbox WHERE session_key = ?1 AND session_id = ?2
		AND seq < (SELECT MAX(seq) FROM outbox WHERE session_key = ?1)`, key, id); err != nil {
		return fmt.Errorf("delete outbox entries: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE outbox SET kind = ?3, text = '', in_reply_to = '[]'
		WHERE session_key = ?1 AND session_id = ?2`, key, id, persistence.KindPruned); err != nil {
		return fmt.Errorf("clear the key's last outbox entry: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM messages WHERE session_id = ?`, id); err != nil {
		return fmt.Errorf("delete messages: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM turn_usage WHERE session_id = ?`, id); err != nil {
		return fmt.Errorf("delete turn usage: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM sessions WHERE id = ?`, id); err != nil {
		return fmt.Errorf("delete session: %w", err)
	}
	return nil
}

// unindexSession removes a session's indexed messages from messages_fts. The index has
// external content, so each entry is removed with FTS5's delete command and the very content
// it was indexed with (message content is never updated).
func unindexSession(ctx context.Context, tx *sql.Tx, id string) error {
	type indexed struct {
		rowid   int64
		content any // passed back exactly as stored (text or blob)
	}
	rs, err := queryAll(ctx, tx, func(r scanner) (indexed, error) {
		var v indexed
		err := r.Scan(&v.rowid, &v.content)
		return v, err
	}, `SELECT m.id, m.content FROM messages m
		WHERE m.session_id = ? AND EXISTS (SELECT 1 FROM messages_fts_docsize d WHERE d.id = m.id)`, id)
	if err != nil {
		return fmt.Errorf("find indexed messages: %w", err)
	}
	for _, r := range rs {
		if _, err := tx.ExecContext(ctx, `INSERT INTO messages_fts (messages_fts, rowid, content)
			VALUES ('delete', ?, ?)`, r.rowid, r.content); err != nil {
			return fmt.Errorf("unindex message %d: %w", r.rowid, err)
		}
	}
	return nil
}
