package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/internal/sqlstore"
)

const defaultListLimit = 100

// limitArg is the LIMIT argument of a limit where limit <= 0 means none: SQLite's -1.
func limitArg(limit int) int {
	if limit <= 0 {
		return -1
	}
	return limit
}

// querier is *sql.DB or *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// unconfirmedSQL selects a key's undelivered outbox entries through the partial index that holds
// only those: without INDEXED BY the planner walks the key's whole outbox (every reply it ever
// had) through the primary key, at every activation.
const unconfirmedSQL = `SELECT ` + outboxCols + ` FROM outbox INDEXED BY outbox_undelivered
	WHERE session_key = ? AND state = 'pending' ORDER BY seq`

// LoadSession returns the durable state of a session key, read in one snapshot: its route, the
// routed session, that session's first pendingLimit pending user messages (active rows only, by
// seq; all of them when pendingLimit <= 0) with their count, its last historyLimit active
// messages (by seq), the key's undelivered (not delivered) outbox entries, and the highest
// message and outbox seqs. A key never seen returns an empty Snapshot. A route whose session
// row is missing returns the Route with a nil Session.
func (s *Store) LoadSession(ctx context.Context, key string, historyLimit, pendingLimit int) (*persistence.Snapshot, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("load session %s: %w", key, err)
	}
	defer s.leave()
	snap, err := s.loadSession(ctx, key, historyLimit, pendingLimit)
	if err != nil {
		return nil, s.readError("load session %s: %w", key, err)
	}
	return snap, nil
}

func (s *Store) loadSession(ctx context.Context, key string, historyLimit, pendingLimit int) (*persistence.Snapshot, error) {
	tx, err := s.reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }() // read-only: nothing to commit
	q := preparedTx{tx: tx, s: s}
	// The statements run under a context that is never cancelled: for a cancellable one modernc
	// starts a goroutine per statement to watch it, and every activation would pay seven. A
	// cancelled ctx still ends the snapshot: database/sql rolls the transaction back.
	qctx := context.WithoutCancel(ctx)
	snap := &persistence.Snapshot{}
	route, err := getRoute(qctx, q, key)
	switch {
	case errors.Is(err, persistence.ErrNotFound):
	case err != nil:
		return nil, err
	default:
		snap.Route = route
		sess, err := getSession(qctx, q, route.SessionID)
		switch {
		case errors.Is(err, persistence.ErrNotFound):
		case err != nil:
			return nil, err
		default:
			snap.Session = sess
			if snap.Pending, err = queryMessages(qctx, q, pendingSQL, sess.ID, limitArg(pendingLimit)); err != nil {
				return nil, err
			}
			snap.PendingCount = len(snap.Pending)
			if pendingLimit > 0 && len(snap.Pending) == pendingLimit {
				// Counted along messages_pending only when the page is full: the common
				// activation (a few pending messages, or none) pays nothing for it.
				if err := q.QueryRowContext(qctx, pendingCountSQL, sess.ID).Scan(&snap.PendingCount); err != nil {
					return nil, err
				}
			}
			if historyLimit > 0 {
				if snap.History, err = queryMessages(qctx, q, historySQL, sess.ID, historyLimit); err != nil {
					return nil, err
				}
				slices.Reverse(snap.History)
			}
			if err := q.QueryRowContext(qctx, lastSeqSQL, sess.ID).Scan(&snap.LastSeq); err != nil {
				return nil, err
			}
		}
	}
	if snap.Unconfirmed, err = queryOutbox(qctx, q, unconfirmedSQL, key); err != nil {
		return nil, err
	}
	if err := q.QueryRowContext(qctx, lastOutboxSeqSQL, key).Scan(&snap.LastOutboxSeq); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return snap, nil
}

// The queries of loadSession, prepared on the reader pool when the store opens (activationSQL).
const (
	routeSQL   = `SELECT key, session_id, generation, updated_at FROM routing WHERE key = ?`
	sessionSQL = `SELECT ` + sessionCols + ` FROM sessions WHERE id = ?`
	pendingSQL = `SELECT ` + messageCols + ` FROM messages
		WHERE session_id = ? AND role = 'user' AND status = 'pending' AND active = 1 ORDER BY seq LIMIT ?`
	pendingCountSQL = `SELECT COUNT(*) FROM messages
		WHERE session_id = ? AND role = 'user' AND status = 'pending' AND active = 1`
	historySQL = `SELECT ` + messageCols + ` FROM messages
		WHERE session_id = ? AND active = 1 ORDER BY seq DESC LIMIT ?`
	lastSeqSQL       = `SELECT COALESCE(MAX(seq), 0) FROM messages WHERE session_id = ?`
	lastOutboxSeqSQL = `SELECT COALESCE(MAX(seq), 0) FROM outbox WHERE session_key = ?`
)

var activationSQL = []string{routeSQL, sessionSQL, pendingSQL, historySQL, lastSeqSQL, unconfirmedSQL, lastOutboxSeqSQL}

// preparedTx is a querier that runs the queries of a read transaction that the store prepared
// when it opened (Store.readStmts) as those statements: database/sql prepares each once per
// reader connection, the first time it runs there, and keeps it, instead of parsing and planning
// the SQL at every call (a third of an activation's cost). Other queries run unprepared.
type preparedTx struct {
	tx *sql.Tx
	s  *Store
}

func (p preparedTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st := p.s.readStmts[query]; st != nil {
		return p.tx.StmtContext(ctx, st).QueryContext(ctx, args...)
	}
	return p.tx.QueryContext(ctx, query, args...)
}

func (p preparedTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := p.s.readStmts[query]; st != nil {
		return p.tx.StmtContext(ctx, st).QueryRowContext(ctx, args...)
	}
	return p.tx.QueryRowContext(ctx, query, args...)
}

// FindInbounds implements persistence.Store: one read by the index of inbound ids, with the ids
// as one JSON array (json_each), so that no count of ids meets SQLite's limit on bound
// parameters.
func (s *Store) FindInbounds(ctx context.Context, platform, chatID string, messageIDs []string) ([]persistence.Message, error) {
	ids := slices.DeleteFunc(slices.Clone(messageIDs), func(id string) bool { return id == "" })
	if len(ids) == 0 {
		return nil, nil
	}
	if err := s.enter(); err != nil {
		return nil, s.readError("find inbound: %w", err)
	}
	defer s.leave()
	list, err := json.Marshal(ids)
	if err != nil {
		return nil, fmt.Errorf("find inbound %s/%s: %w", platform, chatID, err)
	}
	ms, err := queryMessages(ctx, s.reader, `SELECT `+messageCols+` FROM messages
		WHERE platform = ? AND chat_id = ? AND message_id IN (SELECT value FROM json_each(?))
		AND role = 'user' AND message_id <> '' ORDER BY message_id`, platform, chatID, string(list))
	if err != nil {
		return nil, s.readError("find inbound %s/%s (%d ids): %w", platform, chatID, len(ids), err)
	}
	return ms, nil
}

// FindInbound finds a user message by its platform identity; persistence.ErrNotFound if absent.
func (s *Store) FindInbound(ctx context.Context, platform, chatID, messageID string) (*persistence.Message, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("find inbound: %w", err)
	}
	defer s.leave()
	if messageID == "" {
		return nil, s.readError("find inbound %s/%s: empty message id: %w", platform, chatID, persistence.ErrNotFound)
	}
	m, err := scanMessage(s.reader.QueryRowContext(ctx, `SELECT `+messageCols+` FROM messages
		WHERE platform = ? AND chat_id = ? AND message_id = ? AND role = 'user' AND message_id <> ''`,
		platform, chatID, messageID))
	if errors.Is(err, sql.ErrNoRows) {
		err = persistence.ErrNotFound
	}
	if err != nil {
		return nil, s.readError("find inbound %s/%s/%s: %w", platform, chatID, messageID, err)
	}
	return &m, nil
}

// RepliesTo returns the outbox entries of a session key with seq > after whose in_reply_to
// lists messageID, by seq.
func (s *Store) RepliesTo(ctx context.Context, key, messageID string, after int64) ([]persistence.OutboxEntry, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("replies to %s: %w", messageID, err)
	}
	defer s.leave()
	// CASE guarantees json_each never sees a corrupt value.
	es, err := queryOutbox(ctx, s.reader, `SELECT `+outboxCols+` FROM outbox o
		WHERE o.session_key = ? AND o.seq > ? AND CASE WHEN json_valid(o.in_reply_to)
			THEN EXISTS (SELECT 1 FROM json_each(o.in_reply_to) j WHERE j.value = ?) ELSE 0 END
		ORDER BY o.seq`, key, after, messageID)
	if err != nil {
		return nil, s.readError("replies to %s: %w", messageID, err)
	}
	return es, nil
}

// OutboxAfter returns a key's outbox entries with seq > after, by seq, except a pruned
// session's (persistence.KindPruned): with limit > 0 a page of at most limit entries and about
// persistence.OutboxPageBytes of texts, with limit <= 0 all of them.
func (s *Store) OutboxAfter(ctx context.Context, key string, after int64, limit int) ([]persistence.OutboxEntry, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("outbox after %d: %w", after, err)
	}
	defer s.leave()
	budget := 0
	if limit > 0 {
		budget = persistence.OutboxPageBytes
	}
	es, err := queryPage(ctx, s.reader, budget, scanOutbox, outboxText, `SELECT `+outboxCols+` FROM outbox
		WHERE session_key = ? AND seq > ? AND kind <> ? ORDER BY seq LIMIT ?`, key, after, persistence.KindPruned, limitArg(limit))
	if err != nil {
		return nil, s.readError("outbox after %d: %w", after, err)
	}
	return es, nil
}

// LastOutboxSeq returns the highest outbox seq of key, 0 when it has none.
func (s *Store) LastOutboxSeq(ctx context.Context, key string) (int64, error) {
	if err := s.enter(); err != nil {
		return 0, s.readError("last outbox seq: %w", err)
	}
	defer s.leave()
	var seq int64
	if err := s.reader.QueryRowContext(ctx, lastOutboxSeqSQL, key).Scan(&seq); err != nil {
		return 0, s.readError("last outbox seq: %w", err)
	}
	return seq, nil
}

// Transcript returns every message of a session, archived rows included, by seq. An unknown
// session has an empty transcript.
func (s *Store) Transcript(ctx context.Context, sessionID string) ([]persistence.Message, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("transcript %s: %w", sessionID, err)
	}
	defer s.leave()
	ms, err := queryMessages(ctx, s.reader, `SELECT `+messageCols+` FROM messages
		WHERE session_id = ? ORDER BY seq`, sessionID)
	if err != nil {
		return nil, s.readError("transcript %s: %w", sessionID, err)
	}
	return ms, nil
}

// transcriptSQL reads a session's messages after a seq along the (session_id, seq) index.
const transcriptSQL = `SELECT ` + messageCols + ` FROM messages
	WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?`

// TranscriptAfter returns a session's messages with seq > after, archived rows included, by
// seq: with limit > 0 a page of at most limit messages and about
// persistence.TranscriptPageBytes of texts, with limit <= 0 all of them.
func (s *Store) TranscriptAfter(ctx context.Context, sessionID string, after int64, limit int) ([]persistence.Message, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("transcript %s after %d: %w", sessionID, after, err)
	}
	defer s.leave()
	budget := 0
	if limit > 0 {
		budget = persistence.TranscriptPageBytes
	}
	ms, err := queryPage(ctx, s.reader, budget, scanMessage, messageText, transcriptSQL, sessionID, after, limitArg(limit))
	if err != nil {
		return nil, s.readError("transcript %s after %d: %w", sessionID, after, err)
	}
	return ms, nil
}

// pendingAfterSQL reads a session's pending messages in a range along messages_pending.
const (
	pendingRange = ` FROM messages
	WHERE session_id = ? AND role = 'user' AND status = 'pending' AND active = 1
	AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?`
	pendingAfterSQL     = `SELECT ` + messageCols + pendingRange
	pendingRefsAfterSQL = `SELECT ` + sqlstore.MessageRefCols + pendingRange
)

// PendingAfter returns a session's pending (active) user messages with after < seq <= through,
// by seq, at most limit (no limit when limit <= 0).
func (s *Store) PendingAfter(ctx context.Context, sessionID string, after, through int64, limit int) ([]persistence.Message, error) {
	return s.pendingAfter(ctx, pendingAfterSQL, sessionID, after, through, limit)
}

// PendingRefsAfter is PendingAfter without the messages' text.
func (s *Store) PendingRefsAfter(ctx context.Context, sessionID string, after, through int64, limit int) ([]persistence.Message, error) {
	return s.pendingAfter(ctx, pendingRefsAfterSQL, sessionID, after, through, limit)
}

func (s *Store) pendingAfter(ctx context.Context, query, sessionID string, after, through int64, limit int) ([]persistence.Message, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("pending messages of %s after %d: %w", sessionID, after, err)
	}
	defer s.leave()
	ms, err := queryMessages(ctx, s.reader, query, sessionID, after, through, limitArg(limit))
	if err != nil {
		return nil, s.readError("pending messages of %s after %d: %w", sessionID, after, err)
	}
	return ms, nil
}

// countMessagesSQL counts along the (session_id, seq) index and messages_pending, never reading
// a row.
const countMessagesSQL = `SELECT
	(SELECT COUNT(*) FROM messages WHERE session_id = ?1),
	(SELECT COUNT(*) FROM messages WHERE session_id = ?1
		AND role = 'user' AND status = 'pending' AND active = 1)`

// CountMessages counts a session's message rows (archived ones included) and its active
// pending user messages, as ListSessions does.
func (s *Store) CountMessages(ctx context.Context, sessionID string) (messages, pending int, err error) {
	if err := s.enter(); err != nil {
		return 0, 0, s.readError("count messages of %s: %w", sessionID, err)
	}
	defer s.leave()
	err = s.reader.QueryRowContext(ctx, countMessagesSQL, sessionID).Scan(&messages, &pending)
	if err != nil {
		return 0, 0, s.readError("count messages of %s: %w", sessionID, err)
	}
	return messages, pending, nil
}

// historyOfSQL reads back along the (session_id, seq) index from the newest message, and stops
// after limit conversation messages.
const historyOfSQL = `SELECT ` + messageCols + ` FROM messages
	WHERE session_id = ? AND active = 1 AND role IN ('user', 'assistant') ORDER BY seq DESC LIMIT ?`

// History returns a session's last limit active user and assistant messages, by seq, and its
// highest message seq, in one snapshot.
func (s *Store) History(ctx context.Context, sessionID string, limit int) ([]persistence.Message, int64, error) {
	if err := s.enter(); err != nil {
		return nil, 0, s.readError("history of %s: %w", sessionID, err)
	}
	defer s.leave()
	h, last, err := s.history(ctx, sessionID, limit)
	if err != nil {
		return nil, 0, s.readError("history of %s: %w", sessionID, err)
	}
	return h, last, nil
}

func (s *Store) history(ctx context.Context, sessionID string, limit int) ([]persistence.Message, int64, error) {
	tx, err := s.reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = tx.Rollback() }() // read-only: nothing to commit
	q := preparedTx{tx: tx, s: s}
	var h []persistence.Message
	if limit > 0 {
		if h, err = queryMessages(ctx, q, historyOfSQL, sessionID, limit); err != nil {
			return nil, 0, err
		}
		slices.Reverse(h)
	}
	var last int64
	if err := q.QueryRowContext(ctx, lastSeqSQL, sessionID).Scan(&last); err != nil {
		return nil, 0, err
	}
	return h, last, nil
}

// Route returns the routing row of a key; persistence.ErrNotFound if absent.
func (s *Store) Route(ctx context.Context, key string) (*persistence.Route, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("route %s: %w", key, err)
	}
	defer s.leave()
	r, err := getRoute(ctx, s.reader, key)
	if err != nil {
		return nil, s.readError("route %s: %w", key, err)
	}
	return r, nil
}

// Session returns one session row; persistence.ErrNotFound if absent.
func (s *Store) Session(ctx context.Context, id string) (*persistence.Session, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("session %s: %w", id, err)
	}
	defer s.leave()
	ss, err := getSession(ctx, s.reader, id)
	if err != nil {
		return nil, s.readError("session %s: %w", id, err)
	}
	return ss, nil
}

// SessionsOfKey returns every session recorded for key, ended ones included, newest started
// first (ties by ascending id), at most limit (persistence.DefaultSessionsOfKeyLimit when limit
// <= 0). The order is that of the decoded StartedAt, so an unreadable start time sorts as the
// oldest; that is why the key's rows are sorted here rather than by SQLite, which would sort a
// garbage text value above every number.
func (s *Store) SessionsOfKey(ctx context.Context, key string, limit int) ([]persistence.Session, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("sessions of key %s: %w", key, err)
	}
	defer s.leave()
	if limit <= 0 {
		limit = persistence.DefaultSessionsOfKeyLimit
	}
	ss, err := querySessions(ctx, s.reader, `SELECT `+sessionCols+` FROM sessions WHERE key = ?`, key)
	if err != nil {
		return nil, s.readError("sessions of key %s: %w", key, err)
	}
	slices.SortFunc(ss, func(a, b persistence.Session) int {
		if c := b.StartedAt.Compare(a.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	if len(ss) > limit {
		ss = ss[:limit]
	}
	return ss, nil
}

// IdleSessions returns the open sessions that are the current routed session of their key and
// whose last activity is before before, oldest first (ties by id), at most limit
// (persistence.DefaultIdleSessionsLimit when limit <= 0). A last activity that is NULL or
// unreadable reads as the zero time, so such a session is always idle.
//
// Two queries in one snapshot keep this exact and indexed: the range scan of
// sessions_open_activity finds every number below the cutoff (zero and negative ones, which
// read as the zero time, included), and a second query finds the values that are no comparable
// number (NULL, and the reals past the int64 range, text and blobs, which SQLite sorts above
// every integer); those are decoded and compared here. "Open" means ended_at IS NULL: a session
// whose ended_at holds an unreadable value is not reset by the timer (it is left to the arrival
// path, which loads it).
func (s *Store) IdleSessions(ctx context.Context, before time.Time, limit int) ([]persistence.Session, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("idle sessions: %w", err)
	}
	defer s.leave()
	if limit <= 0 {
		limit = persistence.DefaultIdleSessionsLimit
	}
	if before.IsZero() {
		return nil, nil // nothing, not even the zero time, is before the zero time
	}
	ss, err := s.idleSessions(ctx, before, limit)
	if err != nil {
		return nil, s.readError("idle sessions before %v: %w", before, err)
	}
	return ss, nil
}

func (s *Store) idleSessions(ctx context.Context, before time.Time, limit int) ([]persistence.Session, error) {
	tx, err := s.reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }() // read-only: nothing to commit
	const open = `s.ended_at IS NULL
		AND EXISTS (SELECT 1 FROM routing r WHERE r.key = s.key AND r.session_id = s.id)`
	// Two index searches: SQLite scans the whole index for the OR of the two conditions.
	odd, err := querySessions(ctx, tx, `SELECT `+sqlstore.Prefixed("s.", sessionCols)+` FROM sessions s
			WHERE `+open+` AND s.last_activity_at IS NULL
		UNION ALL
		SELECT `+sqlstore.Prefixed("s.", sessionCols)+` FROM sessions s
			WHERE `+open+` AND s.last_activity_at >= 9223372036854775808.0`)
	if err != nil {
		return nil, err
	}
	ranged, err := querySessions(ctx, tx, `SELECT `+sqlstore.Prefixed("s.", sessionCols)+` FROM sessions s
		WHERE `+open+` AND s.last_activity_at < ?
		ORDER BY s.last_activity_at, s.id LIMIT ?`, sqlstore.NanoBound(before), limit)
	if err != nil {
		return nil, err
	}
	out := slices.DeleteFunc(append(odd, ranged...), func(ss persistence.Session) bool {
		return !ss.LastActivityAt.Before(before)
	})
	slices.SortFunc(out, func(a, b persistence.Session) int {
		if c := a.LastActivityAt.Compare(b.LastActivityAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// IdleSessionsAfter continues IdleSessions after the session (lastActivity, lastID).
func (s *Store) IdleSessionsAfter(ctx context.Context, before, lastActivity time.Time, lastID string, limit int) ([]persistence.Session, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("idle sessions: %w", err)
	}
	defer s.leave()
	if limit <= 0 {
		limit = persistence.DefaultIdleSessionsLimit
	}
	if before.IsZero() {
		return nil, nil
	}
	// A zero lastActivity continues after the sessions without a valid activity time, which all
	// came on the first page: the range starts at the first valid time.
	from := int64(0)
	if !lastActivity.IsZero() {
		from = lastActivity.UnixNano()
	}
	ss, err := querySessions(ctx, s.reader, `SELECT `+sqlstore.Prefixed("s.", sessionCols)+` FROM sessions s
		WHERE s.ended_at IS NULL
		AND EXISTS (SELECT 1 FROM routing r WHERE r.key = s.key AND r.session_id = s.id)
		AND s.last_activity_at < ?
		AND (s.last_activity_at > ? OR (s.last_activity_at = ? AND s.id > ?))
		ORDER BY s.last_activity_at, s.id LIMIT ?`, sqlstore.NanoBound(before), from, from, lastID, limit)
	if err != nil {
		return nil, s.readError("idle sessions after %s: %w", lastID, err)
	}
	return ss, nil
}

// ListSessions lists routed session keys with their current session, by key. Messages counts
// every row of the session (archived ones included); Pending counts its active pending user
// messages. Keys whose session row is missing are left out.
func (s *Store) ListSessions(ctx context.Context, f persistence.ListFilter) ([]persistence.SessionSummary, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("list sessions: %w", err)
	}
	defer s.leave()
	limit := f.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	out, err := queryAll(ctx, s.reader, func(r scanner) (persistence.SessionSummary, error) {
		var sum persistence.SessionSummary
		err := r.Scan(append(sessionDest(&sum.Session), &sum.Messages, &sum.Pending)...)
		return sum, err
	}, `SELECT `+sqlstore.Prefixed("s.", sessionCols)+`,
			(SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id),
			(SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id
				AND m.role = 'user' AND m.status = 'pending' AND m.active = 1)
		FROM routing r JOIN sessions s ON s.id = r.session_id
		WHERE r.key > ? AND (? = '' OR s.platform = ?)
		ORDER BY r.key LIMIT ?`, f.AfterKey, f.Platform, f.Platform, limit)
	if err != nil {
		return nil, s.readError("list sessions: %w", err)
	}
	return out, nil
}

// Recoverable returns, sorted, the keys whose routed session has active pending user messages or
// whose outbox has undelivered entries.
func (s *Store) Recoverable(ctx context.Context) ([]string, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("recoverable: %w", err)
	}
	defer s.leave()
	keys, err := queryAll(ctx, s.reader, func(r scanner) (string, error) {
		var k string
		err := r.Scan(&k)
		return k, err
	}, `
		SELECT r.key FROM routing r WHERE EXISTS (SELECT 1 FROM messages m
			WHERE m.session_id = r.session_id AND m.role = 'user' AND m.status = 'pending' AND m.active = 1)
		UNION
		SELECT o.session_key FROM outbox o WHERE o.state = 'pending'
		ORDER BY 1`)
	if err != nil {
		return nil, s.readError("recoverable: %w", err)
	}
	return keys, nil
}

// recentChatsSQL walks the inbound messages from the newest stored. It must scan the table
// backwards along its rowid, never sort (TestRecentChatsPlan): RecentChats stops early.
const recentChatsSQL = `SELECT m.platform, m.chat_id, COALESCE(s.thread_id, ''), COALESCE(s.scope_id, ''),
		m.message_id, m.created_at
	FROM messages m NOT INDEXED LEFT JOIN sessions s ON s.id = m.session_id
	WHERE m.role = 'user' AND m.message_id <> '' ORDER BY m.id DESC`

// RecentChats implements persistence.Store. It walks the messages backwards in the order they
// were stored (the rowid), so it reads only the rows stored since since, plus one.
func (s *Store) RecentChats(ctx context.Context, platform string, since time.Time, limit int) ([]persistence.ChatMark, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("recent chats: %w", err)
	}
	defer s.leave()
	if limit <= 0 {
		limit = persistence.DefaultRecentChatsLimit
	}
	rows, err := s.reader.QueryContext(ctx, recentChatsSQL)
	if err != nil {
		return nil, s.readError("recent chats: %w", err)
	}
	defer rows.Close()
	bound := sqlstore.NanoBound(since)
	seen := map[[2]string]bool{}
	var marks []persistence.ChatMark
	for len(marks) < limit && rows.Next() {
		var p string
		var m persistence.ChatMark
		var at any
		if err := rows.Scan(&p, &m.ChatID, &m.ThreadID, &m.ScopeID, &m.MessageID, &at); err != nil {
			return nil, s.readError("recent chats: %w", err)
		}
		n, ok := at.(int64)
		if !ok || n <= 0 || n < bound {
			break // stored before since, or at an unreadable time: long ago
		}
		chat := [2]string{m.ChatID, m.ThreadID}
		if p != platform || seen[chat] {
			continue
		}
		seen[chat] = true
		m.At = time.Unix(0, n).UTC()
		marks = append(marks, m)
	}
	if err := rows.Err(); err != nil {
		return nil, s.readError("recent chats: %w", err)
	}
	return marks, nil
}

// Search returns the messages (archived ones included) whose content matches an FTS5 query
// (https://sqlite.org/fts5.html#full_text_query_syntax), best match first, at most limit (0
// means 100). It is not part of persistence.Store. Messages whose indexing failed are not found,
// nor those a prune step left of a session whose row it deleted (PruneStep).
// A query the index refuses is an ErrBadQuery.
//
// Commits index new messages in bulk (index.go), so the newest committed messages may not be
// indexed yet. A writable store indexes them before it queries, so it finds every message
// committed before the call, ranked by the same bm25 as the others (a LIKE over the unindexed
// rows would have neither the FTS5 query syntax nor the ranking). That indexing runs under the
// commit mutex on the writer connection: a Search that finds messages waiting waits for the
// commit in progress and holds up the next one for as long as it indexes (10–15 µs per
// message; fewer than IndexRows plus one batch normally wait). A store opened with OpenReadOnly
// cannot index: it finds what the writing store has indexed, which leaves out the messages that
// still wait there (until its next indexing pass, Search or Close).
func (s *Store) Search(ctx context.Context, query string, limit int) ([]persistence.Message, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("search: %w", err)
	}
	defer s.leave()
	if limit <= 0 {
		limit = defaultListLimit
	}
	if s.idx != nil && s.idx.pending.Load() > 0 {
		s.commitMu.Lock()
		_, _ = s.indexAll(ctx) // logged by indexPass; what is indexed is still searched
		s.commitMu.Unlock()
	}
	ms, err := queryMessages(ctx, s.reader, `SELECT `+sqlstore.Prefixed("m.", messageCols)+`
		FROM messages_fts f JOIN messages m ON m.id = f.rowid
		WHERE messages_fts MATCH ? AND m.session_id IN (SELECT id FROM sessions)
		ORDER BY f.rank, m.id LIMIT ?`, query, limit)
	if isQueryError(err) {
		return nil, s.readError("search %q: %w: %v", query, ErrBadQuery, err)
	}
	if err != nil {
		return nil, s.readError("search %q: %w", query, err)
	}
	return ms, nil
}

// Quarantined implements persistence.QuarantineLister, from the partial index of migration 0017.
func (s *Store) Quarantined(ctx context.Context, limit int) ([]persistence.QuarantinedMessage, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("quarantined messages: %w", err)
	}
	defer s.leave()
	if limit <= 0 {
		limit = defaultListLimit
	}
	ms, err := queryAll(ctx, s.reader, scanQuarantined, `SELECT `+sqlstore.Prefixed("m.", messageCols)+`, s.key, s.ended_at
		FROM messages m JOIN sessions s ON s.id = m.session_id
		WHERE m.status = 'quarantined' AND m.role = 'user' AND m.active = 1
		ORDER BY m.created_at DESC, m.id DESC LIMIT ?`, limit)
	if err != nil {
		return nil, s.readError("quarantined messages: %w", err)
	}
	return ms, nil
}

func getRoute(ctx context.Context, q querier, key string) (*persistence.Route, error) {
	var r persistence.Route
	err := q.QueryRowContext(ctx, routeSQL, key).Scan(&r.Key, &r.SessionID, &r.Generation, nanoTime{&r.UpdatedAt})
	if errors.Is(err, sql.ErrNoRows) {
		return nil, persistence.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	return &r, nil
}

func getSession(ctx context.Context, q querier, id string) (*persistence.Session, error) {
	ss, err := scanSession(q.QueryRowContext(ctx, sessionSQL, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, persistence.ErrNotFound
	}
	return ss, err
}

// queryAll runs query and scans every row with scan.
func queryAll[T any](ctx context.Context, q querier, scan func(scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func querySessions(ctx context.Context, q querier, query string, args ...any) ([]persistence.Session, error) {
	return queryAll(ctx, q, func(r scanner) (persistence.Session, error) {
		s, err := scanSession(r)
		if err != nil {
			return persistence.Session{}, err
		}
		return *s, nil
	}, query, args...)
}

func queryMessages(ctx context.Context, q querier, query string, args ...any) ([]persistence.Message, error) {
	return queryAll(ctx, q, scanMessage, query, args...)
}

func queryOutbox(ctx context.Context, q querier, query string, args ...any) ([]persistence.OutboxEntry, error) {
	return queryAll(ctx, q, scanOutbox, query, args...)
}

// queryPage is queryAll that stops once the texts of the rows read (text of each) reach
// budget (never when budget <= 0): SQLite steps row by row, so the rows past it are never
// read, and a page of large replies or messages costs its budget rather than its LIMIT of
// them.
func queryPage[T any](ctx context.Context, q querier, budget int, scan func(scanner) (T, error), text func(*T) string, query string, args ...any) ([]T, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	size := 0
	for (budget <= 0 || size < budget) && rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
		size += len(text(&v))
	}
	return out, rows.Err()
}

// The texts a page of queryPage counts.
func outboxText(e *persistence.OutboxEntry) string { return e.Text }
func messageText(m *persistence.Message) string    { return m.Content }

// OpenDrafts implements persistence.Store.
func (s *Store) OpenDrafts(ctx context.Context, platform string, limit int) ([]persistence.Draft, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("open drafts: %w", err)
	}
	defer s.leave()
	if limit <= 0 {
		limit = persistence.DefaultOpenDraftsLimit
	}
	ds, err := queryAll(ctx, s.reader, scanDraft, `SELECT `+sqlstore.DraftCols+` FROM drafts
		WHERE platform = ? ORDER BY created_at, id LIMIT ?`, platform, limit)
	if err != nil {
		return nil, s.readError("open drafts of %s: %w", platform, err)
	}
	return ds, nil
}

// Unread implements persistence.Store.
func (s *Store) Unread(ctx context.Context, platform string, limit int) ([]persistence.Unread, error) {
	if err := s.enter(); err != nil {
		return nil, s.readError("unread places: %w", err)
	}
	defer s.leave()
	if limit <= 0 {
		limit = persistence.DefaultUnreadLimit
	}
	us, err := queryAll(ctx, s.reader, scanUnread, `SELECT `+sqlstore.UnreadCols+` FROM unread
		WHERE platform = ? ORDER BY created_at, chat_id LIMIT ?`, platform, limit)
	if err != nil {
		return nil, s.readError("unread places of %s: %w", platform, err)
	}
	return us, nil
}

// readError is fmt.Errorf for the error of a read: one that means the database cannot be read
// right now (IsUnavailable: busy past the busy timeout, an I/O error …) also wraps
// persistence.ErrUnavailable, as the PostgreSQL store's reads do, so that a caller can tell
// "retry later" from a fault (the HTTP API answers it 503, not 500). A corrupt database is
// also reported (reportCorrupt).
func (s *Store) readError(format string, args ...any) error {
	return s.unavailable(fmt.Errorf(format, args...))
}
