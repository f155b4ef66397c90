package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
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

// pruneCandidatesPage is the most candidates a step reads at a time. A step reads one first,
// then twice as many each time: most steps delete one or two sessions, and each candidate
// costs its checks, a read of every message of its session, inside the write transaction
// (pages of 32 took a fifth of a pass over sessions of 1,040 messages).
const pruneCandidatesPage = 32

// minPruneRows is the least budget a step goes on with: a message and its index entry.
const minPruneRows = 2

// pruneState is what the prune steps know, between two of them, of the sessions whose row a
// committed step deleted and whose other rows it left behind (left). The steps are serialised
// by mu. At Open, and after a failed step, left is not known: the next step finds it again
// (leftBehind).
type pruneState struct {
	mu    sync.Mutex
	known bool
	left  []pruneCandidate
	// sweepAfter is the id after which the next step's sweep of the outbox reads (0: from the
	// start; sweepOutbox).
	sweepAfter int64
}

// PruneSessions deletes at most limit sessions (persistence.DefaultPruneLimit when limit <= 0)
// that ended before endedBefore and that nothing needs any more (see pruneCandidatesSQL),
// oldest end first, in steps of persistence.DefaultPruneRows rows (see PruneStep), and every
// row they leave.
func (s *Store) PruneSessions(ctx context.Context, endedBefore time.Time, limit int) (int, error) {
	return sqlstore.PruneSessions(limit, func(most int) (persistence.PruneCount, error) {
		return s.pruneStep(ctx, endedBefore, persistence.DefaultPruneRows, most)
	})
}

// PruneStep deletes, in one BEGIN IMMEDIATE transaction that deletes or empties at most rows
// rows (persistence.DefaultPruneRows when rows <= 0; at least two), first what earlier steps
// left of the sessions they deleted, then sessions that ended before endedBefore and that
// nothing needs any more (see pruneCandidatesSQL), oldest end first, with their messages,
// their search index entries, their turns' usage and their replies in the outbox. Routing rows
// are never deleted, and neither is the last outbox entry of a key: the key's next reply
// continues its seq, the SSE event id. When that entry is a pruned session's, it keeps its seq
// and state and loses its text, the ids it answered and its kind (persistence.KindPruned), so
// no text of the session is left and readers skip it. It holds the commit mutex, so it never
// interleaves with Commit; the commits waiting meanwhile run before the next step.
//
// A session goes, for every reader, with its row, which the step deletes first, in the
// transaction that checked it: every read of a session starts from its row (a transcript, its
// key's sessions, a resume), Search leaves out the messages of a session without one, and a
// write to it fails. The step then deletes the session's other rows while its budget lasts:
// the key's last outbox entry emptied, its other outbox entries, its usage, then its messages
// oldest first, each with its search index entry. What does not fit is left, without the row
// that would show it, to the next steps; only its delivered replies stay readable meanwhile,
// whole, in its key's outbox (OutboxAfter: the key's event stream), and they go first. So that a session's row can go before its messages, the step runs with
// foreign keys off (only here: restored before the next commit). A stop or crash between two
// steps leaves those rows in the file, unreachable, until the first step of the next run finds
// them (leftBehind) and deletes them before anything else.
//
// The search index is cleaned for the rows it holds (those with a messages_fts_docsize row: a
// row whose indexing failed, or that waits to be indexed, has none, and deleting it from the
// index would corrupt the index). If that cleanup fails, the messages stay, unreachable, with a
// rate-limited warning, and a later step tries again; a store whose search index has been
// dropped prunes without it. When the deleted rows were the highest ones, the search index
// watermark is lowered to the highest row left, so the ids SQLite hands out again are indexed
// (lowerWatermark). A step that finds no session left to delete sweeps the outbox with the rest
// of its budget (sweepOutbox). Any other error rolls the step back and deletes nothing.
func (s *Store) PruneStep(ctx context.Context, endedBefore time.Time, rows int) (persistence.PruneCount, error) {
	if rows <= 0 {
		rows = persistence.DefaultPruneRows
	}
	return s.pruneStep(ctx, endedBefore, rows, math.MaxInt)
}

// pruneStep is PruneStep deleting at most most sessions (none: only what earlier steps left).
func (s *Store) pruneStep(ctx context.Context, endedBefore time.Time, rows, most int) (persistence.PruneCount, error) {
	c, err := s.prune(ctx, endedBefore, max(rows, minPruneRows), most)
	if err != nil {
		return persistence.PruneCount{}, s.unavailable(fmt.Errorf("prune sessions ended before %v: %w", endedBefore, err))
	}
	return c, nil
}

func (s *Store) prune(ctx context.Context, endedBefore time.Time, rows, most int) (_ persistence.PruneCount, err error) {
	if err := s.enter(); err != nil {
		return persistence.PruneCount{}, err
	}
	defer s.leave()
	if s.readOnly {
		return persistence.PruneCount{}, ErrReadOnly
	}
	s.pruning.mu.Lock()
	defer s.pruning.mu.Unlock()
	if !s.pruning.known {
		// Read before the write lock is taken: only a step leaves such rows, and none runs.
		left, err := s.leftBehind(ctx)
		if err != nil {
			return persistence.PruneCount{}, fmt.Errorf("find the rows of pruned sessions: %w", err)
		}
		s.pruning.left, s.pruning.known = left, true
	}
	defer func() {
		if err != nil {
			s.pruning.known = false // a failed commit may have committed
		}
	}()
	s.commitMu.Lock()
	defer s.commitMu.Unlock()

	conn, err := s.writer.Conn(ctx)
	if err != nil {
		return persistence.PruneCount{}, fmt.Errorf("writer connection: %w", err)
	}
	defer conn.Close()
	restore, err := s.prunePragmas(ctx, conn)
	if err != nil {
		return persistence.PruneCount{}, err
	}
	defer restore()
	// Not cancelled with ctx (its statements are): database/sql rolls a cancelled transaction
	// back on a goroutine of its own, and restore, running meanwhile, would turn foreign keys
	// on inside the transaction, where SQLite ignores it. Found by a review: the writer
	// connection then kept them off, and a commit took a message of no session.
	tx, err := conn.BeginTx(context.WithoutCancel(ctx), nil) // _txlock=immediate: BEGIN IMMEDIATE
	if err != nil {
		return persistence.PruneCount{}, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	fts, err := hasFTS(ctx, tx)
	if err != nil {
		return persistence.PruneCount{}, err
	}
	p := &pruner{s: s, tx: tx, fts: fts, budget: rows}
	var left []pruneCandidate
	for _, c := range s.pruning.left {
		done, err := p.rest(ctx, c)
		if err != nil {
			return persistence.PruneCount{}, err
		}
		if !done {
			left = append(left, c)
		}
	}
	// drained: the candidates ran out (or none were asked for).
	bound, drained, size := sqlstore.NanoBound(endedBefore), most <= 0, 1
	for !drained && p.count.Sessions < most && p.room() {
		page := min(size, most-p.count.Sessions)
		size = min(2*size, pruneCandidatesPage)
		cands, err := pruneCandidates(ctx, tx, bound, page)
		if err != nil {
			return persistence.PruneCount{}, err
		}
		drained = len(cands) < page
		for _, c := range cands {
			if !p.room() {
				break
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM sessions WHERE id = ?`, c.id); err != nil {
				return persistence.PruneCount{}, fmt.Errorf("session %s: delete: %w", c.id, err)
			}
			p.spend(1)
			p.count.Sessions++
			done, err := p.rest(ctx, c)
			if err != nil {
				return persistence.PruneCount{}, err
			}
			if !done {
				left = append(left, c)
			}
		}
	}
	// No session is left to delete: the rest of the budget sweeps the outbox.
	sweep := drained && most > 0 && p.room()
	after, end := s.pruning.sweepAfter, false
	if sweep {
		if after, end, err = p.sweepOutbox(ctx, after, sqlstore.SweepWindow(rows)); err != nil {
			return persistence.PruneCount{}, fmt.Errorf("sweep the outbox: %w", err)
		}
	}
	if err := lowerWatermark(ctx, tx); err != nil {
		return persistence.PruneCount{}, fmt.Errorf("search index watermark: %w", err)
	}
	if err := s.commitChecked(tx); err != nil {
		return persistence.PruneCount{}, fmt.Errorf("commit: %w", err)
	}
	s.pruning.left = left
	p.count.More = !p.room() || (!drained && p.count.Sessions == most)
	if sweep {
		p.count.More = p.count.More || !end
		s.pruning.sweepAfter = after
		if end {
			s.pruning.sweepAfter = 0 // the next pass sweeps from the start
		}
	}
	return p.count, nil
}

// prunePragmas sets the writer connection up for a prune step, and returns what sets it back.
// SQLite leaves deleted content in place (in the page, or in a freed page) until it is reused.
// While pruning it overwrites it with zeros instead (secure_delete), so a pruned conversation
// does not stay in the file; only here: on the commit path it would cost a write of every page
// the search index frees. Foreign keys are off, so that a step can delete a session's row
// before the rows that point to it; a connection on which they cannot be turned on again is
// closed, and the pool opens a new one with them.
func (s *Store) prunePragmas(ctx context.Context, conn *sql.Conn) (restore func(), err error) {
	bg := context.WithoutCancel(ctx)
	if _, err := conn.ExecContext(ctx, `PRAGMA secure_delete = ON`); err != nil {
		return nil, fmt.Errorf("secure delete on: %w", err)
	}
	restore = func() {
		var on int
		_, err := conn.ExecContext(bg, `PRAGMA foreign_keys = ON`)
		if err == nil {
			// Read back: the pragma does nothing inside a transaction, and says nothing of it.
			if err = conn.QueryRowContext(bg, `PRAGMA foreign_keys`).Scan(&on); err == nil && on != 1 {
				err = errors.New("still off")
			}
		}
		if err != nil {
			s.log.Warn("foreign keys on after pruning; the writer connection is opened again", logging.Err(err))
			s.dropWriter(conn)
			return
		}
		if _, err := conn.ExecContext(bg, `PRAGMA secure_delete = OFF`); err != nil {
			s.log.Warn("secure delete off after pruning; commits stay correct but write more", logging.Err(err))
		}
	}
	if _, err := conn.ExecContext(ctx, `PRAGMA foreign_keys = OFF`); err != nil {
		restore()
		return nil, fmt.Errorf("foreign keys off: %w", err)
	}
	return restore, nil
}

// pruneCandidate is a session PruneSessions may delete, or one whose rows a step left behind
// (key is empty when only its messages or usage are left).
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

// leftBehindSQL finds the sessions whose row is gone and whose messages, usage or outbox
// entries are not: what a step left for the next ones when the process stopped before them.
// Outbox entries that are no session's, undelivered ones and pruned markers are no such rows.
// It reads the message and usage indexes and the outbox whole: once per process, at its first
// step.
const leftBehindSQL = `
	SELECT m.session_id, '' FROM (SELECT DISTINCT session_id FROM messages) m
		WHERE m.session_id NOT IN (SELECT id FROM sessions)
	UNION
	SELECT u.session_id, '' FROM (SELECT DISTINCT session_id FROM turn_usage) u
		WHERE u.session_id NOT IN (SELECT id FROM sessions)
	UNION
	SELECT DISTINCT o.session_id, o.session_key FROM outbox o
		WHERE o.session_id <> '' AND o.state <> 'pending' AND o.kind <> 'pruned'
			AND o.session_id NOT IN (SELECT id FROM sessions)`

// leftBehind returns the sessions of leftBehindSQL, each once, with its key when it has outbox
// entries left.
func (s *Store) leftBehind(ctx context.Context) ([]pruneCandidate, error) {
	rows, err := queryAll(ctx, s.reader, func(r scanner) (pruneCandidate, error) {
		var c pruneCandidate
		err := r.Scan(&c.id, &c.key)
		return c, err
	}, leftBehindSQL)
	if err != nil {
		return nil, err
	}
	var left []pruneCandidate
	at := make(map[string]int)
	for _, c := range rows {
		if i, ok := at[c.id]; ok {
			left[i].key = max(left[i].key, c.key)
			continue
		}
		at[c.id] = len(left)
		left = append(left, c)
	}
	return left, nil
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

// pruner is one prune step's transaction and what is left of its budget.
type pruner struct {
	s      *Store
	tx     *sql.Tx
	fts    bool
	budget int // rows the step may still delete or empty
	count  persistence.PruneCount
}

// room reports whether the step may go on.
func (p *pruner) room() bool { return p.budget >= minPruneRows }

func (p *pruner) spend(n int) {
	p.budget -= n
	p.count.Rows += n
}

// exec runs a statement of the step and returns the rows it changed.
func (p *pruner) exec(ctx context.Context, query string, args ...any) (int, error) {
	r, err := p.tx.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := r.RowsAffected()
	return int(n), err
}

// rest deletes, within the budget, the rows of a session whose row is gone: it empties its
// key's last outbox entry when that is the session's, and deletes its other outbox entries
// (but undelivered ones), its turns' usage, and its messages, oldest first, with their search
// index entries. It reports whether none is left, false also when it cannot tell; an error
// means the step cannot go on.
func (p *pruner) rest(ctx context.Context, c pruneCandidate) (bool, error) {
	if c.key != "" {
		n, err := p.exec(ctx, `UPDATE outbox SET kind = ?3, text = '', in_reply_to = '[]'
			WHERE session_key = ?1 AND session_id = ?2 AND state <> 'pending' AND kind <> ?3
				AND seq = (SELECT MAX(seq) FROM outbox WHERE session_key = ?1)`, c.key, c.id, persistence.KindPruned)
		if err != nil {
			return false, fmt.Errorf("session %s: clear the key's last outbox entry: %w", c.id, err)
		}
		p.spend(n)
		// By key and session id, so the unique (session_key, seq) index finds them.
		n, err = p.exec(ctx, `DELETE FROM outbox WHERE id IN (SELECT id FROM outbox
			WHERE session_key = ?1 AND session_id = ?2 AND state <> 'pending'
				AND seq < (SELECT MAX(seq) FROM outbox WHERE session_key = ?1) LIMIT ?3)`, c.key, c.id, p.budget)
		if err != nil {
			return false, fmt.Errorf("session %s: delete outbox entries: %w", c.id, err)
		}
		p.spend(n)
	}
	if !p.room() {
		return false, nil
	}
	n, err := p.exec(ctx, `DELETE FROM turn_usage WHERE session_id = ?1
		AND turn_id IN (SELECT turn_id FROM turn_usage WHERE session_id = ?1 LIMIT ?2)`, c.id, p.budget)
	if err != nil {
		return false, fmt.Errorf("session %s: delete turn usage: %w", c.id, err)
	}
	p.spend(n)
	if !p.room() {
		return false, nil
	}
	return p.messages(ctx, c.id)
}

// indexedMessage is a message a step deletes: its rowid, the content it was indexed with and
// whether the search index holds it.
type indexedMessage struct {
	rowid   int64
	seq     int64
	content any // passed back exactly as stored (text or blob)
	indexed bool
}

// messages deletes the oldest messages of a session whose row is gone, with their search
// index entries, as many as the budget allows, and reports whether none is left. When the
// search index refuses to let go of them, they stay (a later step tries again).
func (p *pruner) messages(ctx context.Context, id string) (bool, error) {
	limit, query := p.budget, `SELECT id, seq, NULL, 0 FROM messages WHERE session_id = ? ORDER BY seq LIMIT ?`
	if p.fts {
		limit, query = p.budget/2, `SELECT m.id, m.seq, m.content,
			EXISTS (SELECT 1 FROM messages_fts_docsize d WHERE d.id = m.id)
			FROM messages m WHERE m.session_id = ? ORDER BY m.seq LIMIT ?`
	}
	ms, err := queryAll(ctx, p.tx, func(r scanner) (indexedMessage, error) {
		var m indexedMessage
		err := r.Scan(&m.rowid, &m.seq, &m.content, &m.indexed)
		return m, err
	}, query, id, limit)
	if err != nil {
		return false, fmt.Errorf("session %s: find messages: %w", id, err)
	}
	if len(ms) == 0 {
		return true, nil
	}
	if _, err := p.tx.ExecContext(ctx, `SAVEPOINT prune`); err != nil {
		return false, fmt.Errorf("session %s: savepoint: %w", id, err)
	}
	unindexed, err := p.unindex(ctx, ms)
	if err == nil {
		_, err = p.tx.ExecContext(ctx, `DELETE FROM messages WHERE session_id = ? AND seq <= ?`, id, ms[len(ms)-1].seq)
		if err != nil {
			err = fmt.Errorf("delete messages: %w", err)
		}
	}
	if err != nil {
		if _, rerr := p.tx.ExecContext(ctx, `ROLLBACK TO prune`); rerr != nil {
			return false, fmt.Errorf("session %s: %w (rollback to savepoint: %v)", id, err, rerr)
		}
	}
	if _, rerr := p.tx.ExecContext(ctx, `RELEASE prune`); rerr != nil {
		return false, fmt.Errorf("session %s: release savepoint: %w", id, rerr)
	}
	switch {
	case err == nil:
		p.spend(len(ms) + unindexed)
		p.count.Messages += len(ms)
		return len(ms) < limit, nil
	case errors.Is(err, errKeep) && !IsUnavailable(err) && ctx.Err() == nil:
		if n, ok := p.s.ftsWarn.Allow(); ok {
			p.s.log.Warn("fts index delete failed; a pruned session's messages kept", "session_id", id, "batches", n, logging.Err(err))
		}
		return false, nil
	}
	return false, fmt.Errorf("session %s: %w", id, err)
}

// errKeep marks a failure that keeps a pruned session's messages instead of failing the step.
var errKeep = errors.New("messages kept")

// unindex removes messages from messages_fts, those it holds, and returns how many. The index
// has external content, so each entry is removed with FTS5's delete command and the very
// content it was indexed with (message content is never updated). A failure wraps errKeep.
func (p *pruner) unindex(ctx context.Context, ms []indexedMessage) (int, error) {
	n := 0
	for _, m := range ms {
		if !m.indexed {
			continue
		}
		if _, err := p.tx.ExecContext(ctx, `INSERT INTO messages_fts (messages_fts, rowid, content)
			VALUES ('delete', ?, ?)`, m.rowid, m.content); err != nil {
			return 0, fmt.Errorf("%w: unindex message %d: %w", errKeep, m.rowid, err)
		}
		n++
	}
	return n, nil
}

// sweepWindowSQL reads the window of a sweep: the outbox rows after ?1, at most ?3, in id
// order (?3 is sqlstore.SweepWindow of the step's budget), each with whether the sweep takes
// it (sweepSQL), through the rowid and a look-up of its session each.
const sweepWindowSQL = `SELECT o.id, ` + sweepSQL + ` FROM outbox o WHERE o.id > ?1 ORDER BY o.id LIMIT ?3`

// sweepSQL is what makes an outbox row o one the sweep takes (?2 is persistence.KindPruned): a
// pruned marker that is no longer its key's last, or a reply or notice of a session that is
// gone, which is no longer pending (delivered, or failed: final). An entry has no foreign key:
// one written for a session after a step deleted it (or left pending by a later step, which
// finds the session's rows left behind) was, once delivered, found only by the first step of
// the next run (leftBehind). A marker holds its key's seq (the SSE event id) only while no later
// entry does. Entries without a session id are no session's: none is written, and no
// retention applies to them.
const sweepSQL = `(o.state <> 'pending' AND CASE WHEN o.kind = ?2
		THEN o.seq < (SELECT MAX(m.seq) FROM outbox m WHERE m.session_key = o.session_key)
		ELSE o.session_id <> '' AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = o.session_id) END)`

// sweepOutbox is a step's sweep of the outbox: it reads the window of at most window rows after
// after (sweepWindowSQL), deletes as many of the rows the sweep takes as the budget allows, or
// empties them into pruned markers where they are their key's last, and returns the id the
// next window begins after and whether it reached the end of the outbox. Run at each pass's
// end, it reads the whole outbox over as many steps as that takes, in bounded windows (the rows
// are few: a step deletes a session's finished entries with it). The step holds the write lock,
// so what the window read still holds for the statements.
func (p *pruner) sweepOutbox(ctx context.Context, after int64, window int) (next int64, end bool, err error) {
	rows, err := queryAll(ctx, p.tx, func(r scanner) (sqlstore.SweepRow, error) {
		var w sqlstore.SweepRow
		return w, r.Scan(&w.ID, &w.Taken)
	}, sweepWindowSQL, after, persistence.KindPruned, window)
	if err != nil {
		return 0, false, fmt.Errorf("read: %w", err)
	}
	ids, next, end := sqlstore.SweepPick(rows, after, p.budget, window)
	if len(ids) == 0 {
		return next, end, nil
	}
	list, err := json.Marshal(ids)
	if err != nil {
		return 0, false, err
	}
	for _, st := range []struct {
		what, sql string
		args      []any
	}{{
		// The rows that are not their key's last go.
		"delete", `DELETE FROM outbox AS o WHERE o.id IN (SELECT value FROM json_each(?1))
			AND o.seq < (SELECT MAX(m.seq) FROM outbox m WHERE m.session_key = o.session_key)`, []any{string(list)},
	}, {
		// The rest, a key's last entry, keeps its seq and state and loses its content.
		"empty", `UPDATE outbox AS o SET kind = ?2, text = '', in_reply_to = '[]'
			WHERE o.id IN (SELECT value FROM json_each(?1)) AND o.kind <> ?2`, []any{string(list), persistence.KindPruned},
	}} {
		n, err := p.exec(ctx, st.sql, st.args...)
		if err != nil {
			return 0, false, fmt.Errorf("%s: %w", st.what, err)
		}
		p.spend(n)
		p.count.Swept += n
	}
	return next, end, nil
}
