package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/internal/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const defaultListLimit = 100

// limitArg is the LIMIT argument of a limit where limit <= 0 means none: NULL.
func limitArg(limit int) any {
	if limit <= 0 {
		return nil
	}
	return limit
}

// querier is the pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// The queries of LoadSession. Each finds the routed session through the key, so that all of
// them go to the server at once (one batch, one round trip).
const (
	routeSQL        = `SELECT key, session_id, generation, updated_at FROM routing WHERE key = $1`
	routedSession   = `(SELECT session_id FROM routing WHERE key = $1)`
	sessionOfKeySQL = `SELECT ` + sessionCols + ` FROM sessions WHERE id = ` + routedSession
	pendingSQL      = `SELECT ` + messageCols + ` FROM messages
		WHERE session_id = ` + routedSession + ` AND role = 'user' AND status = 'pending' AND active
		ORDER BY seq LIMIT $2`
	pendingCountSQL = `SELECT COUNT(*) FROM messages
		WHERE session_id = $1 AND role = 'user' AND status = 'pending' AND active`
	historySQL = `SELECT * FROM (SELECT ` + messageCols + ` FROM messages
		WHERE session_id = ` + routedSession + ` AND active ORDER BY seq DESC LIMIT $2) h ORDER BY seq`
	lastSeqSQL       = `SELECT COALESCE(MAX(seq), 0) FROM messages WHERE session_id = ` + routedSession
	unconfirmedSQL   = `SELECT ` + outboxCols + ` FROM outbox WHERE session_key = $1 AND state = 'pending' ORDER BY seq`
	lastOutboxSeqSQL = `SELECT COALESCE(MAX(seq), 0) FROM outbox WHERE session_key = $1`
	sessionSQL       = `SELECT ` + sessionCols + ` FROM sessions WHERE id = $1`
)

// LoadSession returns the durable state of a session key, read in one snapshot: its route, the
// routed session, that session's first pendingLimit pending user messages (active rows only, by
// seq; all of them when pendingLimit <= 0) with their count, its last historyLimit active
// messages (by seq), the key's undelivered outbox entries, and the highest message and outbox
// seqs. A key never seen returns an empty Snapshot. A route whose session row is missing
// returns the Route with a nil Session.
func (s *Store) LoadSession(ctx context.Context, key string, historyLimit, pendingLimit int) (*persistence.Snapshot, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("load session %s: %w", key, err)
	}
	defer done()
	var snap *persistence.Snapshot
	err = s.again(ctx, func(c *pgxpool.Conn) (err error) {
		snap, err = loadSession(ctx, c, key, historyLimit, pendingLimit)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("load session %s: %w", key, s.explain(ctx, err))
	}
	return snap, nil
}

// loadSession is LoadSession's read on c.
func loadSession(ctx context.Context, c *pgxpool.Conn, key string, historyLimit, pendingLimit int) (*persistence.Snapshot, error) {
	tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // read-only: nothing to commit
	b := &pgx.Batch{}
	b.Queue(routeSQL, key)
	b.Queue(sessionOfKeySQL, key)
	var limit any // LIMIT NULL: all of them
	if pendingLimit > 0 {
		limit = pendingLimit
	}
	b.Queue(pendingSQL, key, limit)
	if historyLimit > 0 {
		b.Queue(historySQL, key, historyLimit)
	}
	b.Queue(lastSeqSQL, key)
	b.Queue(unconfirmedSQL, key)
	b.Queue(lastOutboxSeqSQL, key)
	br := tx.SendBatch(ctx, b)
	defer br.Close()

	snap := &persistence.Snapshot{}
	var r persistence.Route
	switch err := br.QueryRow().Scan(&r.Key, &r.SessionID, &r.Generation, nanoTime{&r.UpdatedAt}); {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, err
	default:
		snap.Route = &r
	}
	switch ss, err := scanSession(br.QueryRow()); {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, err
	default:
		snap.Session = ss
	}
	pending, err := collect(br.Query())
	if err != nil {
		return nil, err
	}
	var history []persistence.Message
	if historyLimit > 0 {
		if history, err = collect(br.Query()); err != nil {
			return nil, err
		}
	}
	if snap.Session != nil { // as the SQLite store: messages only of a session that exists
		snap.Pending, snap.History, snap.PendingCount = pending, history, len(pending)
	}
	if err := br.QueryRow().Scan(&snap.LastSeq); err != nil {
		return nil, err
	}
	if snap.Session == nil {
		snap.LastSeq = 0
	}
	if snap.Unconfirmed, err = collectOutbox(br.Query()); err != nil {
		return nil, err
	}
	if err := br.QueryRow().Scan(&snap.LastOutboxSeq); err != nil {
		return nil, err
	}
	if snap.Session != nil && pendingLimit > 0 && len(snap.Pending) == pendingLimit {
		// Counted in the same snapshot, a round trip more, only when the page is full.
		if err := br.Close(); err != nil {
			return nil, err
		}
		if err := tx.QueryRow(ctx, pendingCountSQL, snap.Session.ID).Scan(&snap.PendingCount); err != nil {
			return nil, err
		}
	}
	return snap, nil
}

// collect reads every message row of a batch result.
func collect(rows pgx.Rows, err error) ([]persistence.Message, error) {
	if err != nil {
		return nil, err
	}
	return scanAll(rows, scanMessage)
}

func collectOutbox(rows pgx.Rows, err error) ([]persistence.OutboxEntry, error) {
	if err != nil {
		return nil, err
	}
	return scanAll(rows, scanOutbox)
}

// scanAll scans every row with scan and closes rows.
func scanAll[T any](rows pgx.Rows, scan func(scanner) (T, error)) ([]T, error) {
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

// queryAll runs query and scans every row with scan.
func queryAll[T any](ctx context.Context, q querier, scan func(scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return scanAll(rows, scan)
}

func scanSessionValue(r scanner) (persistence.Session, error) {
	s, err := scanSession(r)
	if err != nil {
		return persistence.Session{}, err
	}
	return *s, nil
}

// FindInbounds implements persistence.Store: one read by the index of inbound ids, with the ids
// as one array.
func (s *Store) FindInbounds(ctx context.Context, platform, chatID string, messageIDs []string) ([]persistence.Message, error) {
	ids := slices.DeleteFunc(slices.Clone(messageIDs), func(id string) bool { return id == "" })
	if len(ids) == 0 {
		return nil, nil
	}
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("find inbound: %w", err)
	}
	defer done()
	ms, err := readAll(ctx, s, scanMessage, `SELECT `+messageCols+` FROM messages
		WHERE platform = $1 AND chat_id = $2 AND message_id = ANY($3::text[])
		AND role = 'user' AND message_id <> '' ORDER BY message_id`, platform, chatID, ids)
	if err != nil {
		return nil, fmt.Errorf("find inbound %s/%s (%d ids): %w", platform, chatID, len(ids), s.explain(ctx, err))
	}
	return ms, nil
}

// FindInbound finds a user message by its platform identity; persistence.ErrNotFound if absent.
func (s *Store) FindInbound(ctx context.Context, platform, chatID, messageID string) (*persistence.Message, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("find inbound: %w", err)
	}
	defer done()
	if messageID == "" {
		return nil, fmt.Errorf("find inbound %s/%s: empty message id: %w", platform, chatID, persistence.ErrNotFound)
	}
	var m persistence.Message
	err = s.again(ctx, func(c *pgxpool.Conn) (err error) {
		m, err = scanMessage(c.QueryRow(ctx, `SELECT `+messageCols+` FROM messages
			WHERE platform = $1 AND chat_id = $2 AND message_id = $3 AND role = 'user' AND message_id <> ''`,
			platform, chatID, messageID))
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		err = persistence.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find inbound %s/%s/%s: %w", platform, chatID, messageID, s.explain(ctx, err))
	}
	return &m, nil
}

// RepliesTo returns the outbox entries of a session key with seq > after whose in_reply_to
// lists messageID, by seq.
func (s *Store) RepliesTo(ctx context.Context, key, messageID string, after int64) ([]persistence.OutboxEntry, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("replies to %s: %w", messageID, err)
	}
	defer done()
	es, err := readAll(ctx, s, scanOutbox, `SELECT `+outboxCols+` FROM outbox
		WHERE session_key = $1 AND seq > $3 AND $2 = ANY (in_reply_to) ORDER BY seq`, key, messageID, after)
	if err != nil {
		return nil, fmt.Errorf("replies to %s: %w", messageID, s.explain(ctx, err))
	}
	return es, nil
}

// outboxAfterSQL reads a key's outbox entries after a seq along (session_key, seq), at most
// $4 of them, and keeps those whose earlier entries' texts fall short of $5 bytes. The cut is
// made by the server, as the rows come: a client that stopped reading early would still be
// sent every row up to the LIMIT, texts and all. octet_length takes a stored text's size from
// its header, without fetching it, so a row past the cut costs its index entry and its tuple,
// not its text.
const outboxAfterSQL = `SELECT ` + outboxCols + ` FROM (
	SELECT ` + outboxCols + `,
		sum(octet_length(text)) OVER (ORDER BY seq ROWS UNBOUNDED PRECEDING) - octet_length(text) AS before
	FROM outbox WHERE session_key = $1 AND seq > $2 AND kind <> $3 ORDER BY seq LIMIT $4) page
	WHERE before < $5 ORDER BY seq`

// OutboxAfter returns a key's outbox entries with seq > after, by seq, except a pruned
// session's (persistence.KindPruned): with limit > 0 a page of at most limit entries and about
// persistence.OutboxPageBytes of texts, with limit <= 0 all of them.
func (s *Store) OutboxAfter(ctx context.Context, key string, after int64, limit int) ([]persistence.OutboxEntry, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("outbox after %d: %w", after, err)
	}
	defer done()
	var es []persistence.OutboxEntry
	err = s.again(ctx, func(c *pgxpool.Conn) (err error) {
		es, err = outboxAfter(ctx, c, key, after, limit)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox after %d: %w", after, s.explain(ctx, err))
	}
	return es, nil
}

// outboxAfter is OutboxAfter's read on q.
func outboxAfter(ctx context.Context, q querier, key string, after int64, limit int) ([]persistence.OutboxEntry, error) {
	budget := int64(math.MaxInt64)
	if limit > 0 {
		budget = persistence.OutboxPageBytes
	}
	return queryAll(ctx, q, scanOutbox, outboxAfterSQL, key, after, persistence.KindPruned, limitArg(limit), budget)
}

// LastOutboxSeq returns the highest outbox seq of key, 0 when it has none.
func (s *Store) LastOutboxSeq(ctx context.Context, key string) (int64, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return 0, fmt.Errorf("last outbox seq: %w", err)
	}
	defer done()
	var seq int64
	if err := s.again(ctx, func(c *pgxpool.Conn) error {
		return c.QueryRow(ctx, lastOutboxSeqSQL, key).Scan(&seq)
	}); err != nil {
		return 0, fmt.Errorf("last outbox seq: %w", s.explain(ctx, err))
	}
	return seq, nil
}

// Transcript returns every message of a session, archived rows included, by seq. An unknown
// session has an empty transcript.
func (s *Store) Transcript(ctx context.Context, sessionID string) ([]persistence.Message, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("transcript %s: %w", sessionID, err)
	}
	defer done()
	ms, err := readAll(ctx, s, scanMessage, `SELECT `+messageCols+` FROM messages
		WHERE session_id = $1 ORDER BY seq`, sessionID)
	if err != nil {
		return nil, fmt.Errorf("transcript %s: %w", sessionID, s.explain(ctx, err))
	}
	return ms, nil
}

// transcriptAfterSQL is a page of TranscriptAfter: the messages after $2, at most $3 of them
// and none past the one whose content takes the page's to $4 bytes, cut by the server (as
// outboxAfterSQL), so that it sends only the page's texts.
const transcriptAfterSQL = `SELECT ` + messageCols + ` FROM (
	SELECT ` + messageCols + `,
		sum(octet_length(content)) OVER (ORDER BY seq ROWS UNBOUNDED PRECEDING) - octet_length(content) AS before
	FROM messages WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3) page
	WHERE before < $4 ORDER BY seq`

// TranscriptAfter returns a session's messages with seq > after, archived rows included, by
// seq: with limit > 0 a page of at most limit messages and about
// persistence.TranscriptPageBytes of texts, with limit <= 0 all of them.
func (s *Store) TranscriptAfter(ctx context.Context, sessionID string, after int64, limit int) ([]persistence.Message, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("transcript %s after %d: %w", sessionID, after, err)
	}
	defer done()
	budget := int64(math.MaxInt64)
	if limit > 0 {
		budget = persistence.TranscriptPageBytes
	}
	ms, err := readAll(ctx, s, scanMessage, transcriptAfterSQL, sessionID, after, limitArg(limit), budget)
	if err != nil {
		return nil, fmt.Errorf("transcript %s after %d: %w", sessionID, after, s.explain(ctx, err))
	}
	return ms, nil
}

// PendingAfter returns a session's pending (active) user messages with after < seq <= through,
// by seq, at most limit (no limit when limit <= 0).
func (s *Store) PendingAfter(ctx context.Context, sessionID string, after, through int64, limit int) ([]persistence.Message, error) {
	return s.pendingAfter(ctx, messageCols, sessionID, after, through, limit)
}

// PendingRefsAfter is PendingAfter without the messages' text.
func (s *Store) PendingRefsAfter(ctx context.Context, sessionID string, after, through int64, limit int) ([]persistence.Message, error) {
	return s.pendingAfter(ctx, sqlstore.MessageRefCols, sessionID, after, through, limit)
}

func (s *Store) pendingAfter(ctx context.Context, cols, sessionID string, after, through int64, limit int) ([]persistence.Message, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("pending messages of %s after %d: %w", sessionID, after, err)
	}
	defer done()
	ms, err := readAll(ctx, s, scanMessage, `SELECT `+cols+` FROM messages
		WHERE session_id = $1 AND role = 'user' AND status = 'pending' AND active
		AND seq > $2 AND seq <= $3 ORDER BY seq LIMIT $4`, sessionID, after, through, limitArg(limit))
	if err != nil {
		return nil, fmt.Errorf("pending messages of %s after %d: %w", sessionID, after, s.explain(ctx, err))
	}
	return ms, nil
}

// CountMessages counts a session's message rows (archived ones included) and its active
// pending user messages, as ListSessions does.
func (s *Store) CountMessages(ctx context.Context, sessionID string) (messages, pending int, err error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("count messages of %s: %w", sessionID, err)
	}
	defer done()
	err = s.again(ctx, func(c *pgxpool.Conn) error {
		return c.QueryRow(ctx, `SELECT
			(SELECT COUNT(*) FROM messages WHERE session_id = $1),
			(SELECT COUNT(*) FROM messages WHERE session_id = $1
				AND role = 'user' AND status = 'pending' AND active)`, sessionID).Scan(&messages, &pending)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("count messages of %s: %w", sessionID, s.explain(ctx, err))
	}
	return messages, pending, nil
}

// The queries of History: the last conversation messages and the last seq of a session.
const (
	historyOfSQL = `SELECT * FROM (SELECT ` + messageCols + ` FROM messages
		WHERE session_id = $1 AND active AND role IN ('user', 'assistant') ORDER BY seq DESC LIMIT $2) h ORDER BY seq`
	lastSeqOfSQL = `SELECT COALESCE(MAX(seq), 0) FROM messages WHERE session_id = $1`
)

// History returns a session's last limit active user and assistant messages, by seq, and its
// highest message seq, in one snapshot (one round trip).
func (s *Store) History(ctx context.Context, sessionID string, limit int) ([]persistence.Message, int64, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("history of %s: %w", sessionID, err)
	}
	defer done()
	var h []persistence.Message
	var last int64
	err = s.again(ctx, func(c *pgxpool.Conn) (err error) {
		h, last, err = history(ctx, c, sessionID, limit)
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("history of %s: %w", sessionID, s.explain(ctx, err))
	}
	return h, last, nil
}

// history is History's read on c.
func history(ctx context.Context, c *pgxpool.Conn, sessionID string, limit int) ([]persistence.Message, int64, error) {
	tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // read-only: nothing to commit
	b := &pgx.Batch{}
	if limit > 0 {
		b.Queue(historyOfSQL, sessionID, limit)
	}
	b.Queue(lastSeqOfSQL, sessionID)
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	var h []persistence.Message
	if limit > 0 {
		if h, err = collect(br.Query()); err != nil {
			return nil, 0, err
		}
	}
	var last int64
	if err := br.QueryRow().Scan(&last); err != nil {
		return nil, 0, err
	}
	return h, last, nil
}

// Search returns the messages (archived ones included) whose content matches query, best match
// first, at most limit (0 means 100). The query is web-search syntax (websearch_to_tsquery):
// words must all match, "a phrase" in quotes, OR between alternatives, -word to exclude; it
// never fails on syntax, and a query of no words matches nothing. Words are matched whole and
// case-blind, with no stemming (the 'simple' configuration, as FTS5's default tokenizer).
//
// It scans the messages (about 16 µs a message on the reference VM: 1.6 s for 100,000): an
// index of every message's words would make it instant but halved the store's commit rate in
// BenchmarkCommitTurns (docs/BENCHMARKS.md), for an operator's occasional search. An operator
// who wants it fast creates the index by hand; the query uses it as it is:
//
//	CREATE INDEX CONCURRENTLY messages_search ON messages USING gin (to_tsvector('simple', left(content, 65536)));
//
// Only a message's first 65,536 characters are searched: a tsvector holds at most 1 MB of
// words, and a reply may hold 1 MiB of them (a hyphenated word counts whole and in parts, so
// 600 KB of identifiers overflow it). One such message failed every search, and with the index
// above on the whole content its INSERT would fail: a search index must never fail a
// transcript write. 65,536 characters hold any inbound message whole (64 KiB at most) and make
// at most 512 KiB of words (4 bytes a character, twice).
func (s *Store) Search(ctx context.Context, query string, limit int) ([]persistence.Message, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("search: %w", err)
	}
	defer done()
	if limit <= 0 {
		limit = defaultListLimit
	}
	// The WHERE clause is the expression of the optional index above, so the planner uses it.
	ms, err := readAll(ctx, s, scanMessage, `SELECT `+messageCols+`
		FROM messages, websearch_to_tsquery('simple', $1) AS q
		WHERE `+searchVector+` @@ q
		ORDER BY ts_rank(`+searchVector+`, q) DESC, id LIMIT $2`, query, limit)
	if err != nil {
		return nil, fmt.Errorf("search %q: %w", query, s.explain(ctx, err))
	}
	return ms, nil
}

// Quarantined implements persistence.QuarantineLister, from the partial index of migration 0013.
func (s *Store) Quarantined(ctx context.Context, limit int) ([]persistence.QuarantinedMessage, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("quarantined messages: %w", err)
	}
	defer done()
	if limit <= 0 {
		limit = defaultListLimit
	}
	ms, err := readAll(ctx, s, scanQuarantined, `SELECT `+sqlstore.Prefixed("m.", messageCols)+`, s.key, s.ended_at
		FROM messages m JOIN sessions s ON s.id = m.session_id
		WHERE m.status = 'quarantined' AND m.role = 'user' AND m.active
		ORDER BY m.created_at DESC, m.id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("quarantined messages: %w", s.explain(ctx, err))
	}
	return ms, nil
}

// searchVector is the expression Search matches, on a message's first 65,536 characters (see
// there); an operator's index must repeat it.
const searchVector = `to_tsvector('simple', left(content, 65536))`

// Route returns the routing row of a key; persistence.ErrNotFound if absent.
func (s *Store) Route(ctx context.Context, key string) (*persistence.Route, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("route %s: %w", key, err)
	}
	defer done()
	var r persistence.Route
	err = s.again(ctx, func(c *pgxpool.Conn) error {
		return c.QueryRow(ctx, routeSQL, key).Scan(&r.Key, &r.SessionID, &r.Generation, nanoTime{&r.UpdatedAt})
	})
	if errors.Is(err, pgx.ErrNoRows) {
		err = persistence.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("route %s: %w", key, s.explain(ctx, err))
	}
	return &r, nil
}

// Session returns one session row; persistence.ErrNotFound if absent.
func (s *Store) Session(ctx context.Context, id string) (*persistence.Session, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("session %s: %w", id, err)
	}
	defer done()
	var ss *persistence.Session
	err = s.again(ctx, func(c *pgxpool.Conn) (err error) {
		ss, err = scanSession(c.QueryRow(ctx, sessionSQL, id))
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		err = persistence.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("session %s: %w", id, s.explain(ctx, err))
	}
	return ss, nil
}

// validNanos is a stored time column as the nanoseconds it reads as: NULL, zero and negative
// values read as the zero time, so they sort as 0.
func validNanos(col string) string { return `GREATEST(COALESCE(` + col + `, 0), 0)` }

// SessionsOfKey returns every session recorded for key, ended ones included, newest started
// first (ties by ascending id), at most limit (persistence.DefaultSessionsOfKeyLimit when limit
// <= 0). A missing start time sorts as the oldest.
func (s *Store) SessionsOfKey(ctx context.Context, key string, limit int) ([]persistence.Session, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("sessions of key %s: %w", key, err)
	}
	defer done()
	if limit <= 0 {
		limit = persistence.DefaultSessionsOfKeyLimit
	}
	ss, err := readAll(ctx, s, scanSessionValue, `SELECT `+sessionCols+` FROM sessions
		WHERE key = $1 ORDER BY `+validNanos("started_at")+` DESC, id COLLATE "C" LIMIT $2`, key, limit)
	if err != nil {
		return nil, fmt.Errorf("sessions of key %s: %w", key, s.explain(ctx, err))
	}
	return ss, nil
}

// openRouted restricts sessions s to the open ones that their key routes to.
const openRouted = `s.ended_at IS NULL
	AND EXISTS (SELECT 1 FROM routing r WHERE r.key = s.key AND r.session_id = s.id)`

// IdleSessions returns the open sessions that are the current routed session of their key and
// whose last activity is before before, oldest first (ties by id), at most limit
// (persistence.DefaultIdleSessionsLimit when limit <= 0). A missing last activity reads as the
// zero time, so such a session is always idle.
func (s *Store) IdleSessions(ctx context.Context, before time.Time, limit int) ([]persistence.Session, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("idle sessions: %w", err)
	}
	defer done()
	if limit <= 0 {
		limit = persistence.DefaultIdleSessionsLimit
	}
	if before.IsZero() {
		return nil, nil // nothing, not even the zero time, is before the zero time
	}
	ss, err := readAll(ctx, s, scanSessionValue, `SELECT `+sqlstore.Prefixed("s.", sessionCols)+`
		FROM sessions s WHERE `+openRouted+`
			AND (s.last_activity_at IS NULL OR s.last_activity_at < $1)
		ORDER BY `+validNanos("s.last_activity_at")+`, s.id COLLATE "C" LIMIT $2`, sqlstore.NanoBound(before), limit)
	if err != nil {
		return nil, fmt.Errorf("idle sessions before %v: %w", before, s.explain(ctx, err))
	}
	return ss, nil
}

// IdleSessionsAfter continues IdleSessions after the session (lastActivity, lastID).
func (s *Store) IdleSessionsAfter(ctx context.Context, before, lastActivity time.Time, lastID string, limit int) ([]persistence.Session, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("idle sessions: %w", err)
	}
	defer done()
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
	ss, err := readAll(ctx, s, scanSessionValue, `SELECT `+sqlstore.Prefixed("s.", sessionCols)+`
		FROM sessions s WHERE `+openRouted+`
			AND s.last_activity_at < $1
			AND (s.last_activity_at > $2 OR (s.last_activity_at = $2 AND s.id COLLATE "C" > $3))
		ORDER BY s.last_activity_at, s.id COLLATE "C" LIMIT $4`, sqlstore.NanoBound(before), from, lastID, limit)
	if err != nil {
		return nil, fmt.Errorf("idle sessions after %s: %w", lastID, s.explain(ctx, err))
	}
	return ss, nil
}

// ListSessions lists routed session keys with their current session, by key. Messages counts
// every row of the session (archived ones included); Pending counts its active pending user
// messages. Keys whose session row is missing are left out.
func (s *Store) ListSessions(ctx context.Context, f persistence.ListFilter) ([]persistence.SessionSummary, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	defer done()
	limit := f.Limit
	if limit <= 0 {
		limit = defaultListLimit
	}
	out, err := readAll(ctx, s, func(r scanner) (persistence.SessionSummary, error) {
		var sum persistence.SessionSummary
		err := r.Scan(append(sessionDest(&sum.Session), &sum.Messages, &sum.Pending)...)
		return sum, err
	}, `SELECT `+sqlstore.Prefixed("s.", sessionCols)+`,
			(SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id),
			(SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id
				AND m.role = 'user' AND m.status = 'pending' AND m.active)
		FROM routing r JOIN sessions s ON s.id = r.session_id
		WHERE r.key COLLATE "C" > $1 AND ($2 = '' OR s.platform = $2)
		ORDER BY r.key COLLATE "C" LIMIT $3`, f.AfterKey, f.Platform, limit)
	if err != nil {
		return nil, fmt.Errorf("list sessions: %w", s.explain(ctx, err))
	}
	return out, nil
}

// Recoverable returns, sorted, the keys whose routed session has active pending user messages or
// whose outbox has undelivered entries.
func (s *Store) Recoverable(ctx context.Context) ([]string, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("recoverable: %w", err)
	}
	defer done()
	keys, err := readAll(ctx, s, func(r scanner) (string, error) {
		var k string
		return k, r.Scan(&k)
	}, `SELECT k FROM (
			SELECT r.key FROM routing r WHERE EXISTS (SELECT 1 FROM messages m
				WHERE m.session_id = r.session_id AND m.role = 'user' AND m.status = 'pending' AND m.active)
			UNION
			SELECT o.session_key FROM outbox o WHERE o.state = 'pending') u (k)
		ORDER BY k COLLATE "C"`)
	if err != nil {
		return nil, fmt.Errorf("recoverable: %w", s.explain(ctx, err))
	}
	return keys, nil
}

// recentChatsSQL reads one page of inbound messages backwards from the newest stored (by id,
// through the primary key; never a sort of the whole table).
const recentChatsSQL = `SELECT m.id, m.platform, m.chat_id, COALESCE(s.thread_id, ''),
		COALESCE(s.scope_id, ''), m.message_id, m.created_at
	FROM messages m LEFT JOIN sessions s ON s.id = m.session_id
	WHERE m.role = 'user' AND m.message_id <> '' AND m.id < $1 ORDER BY m.id DESC LIMIT $2`

// recentChatsPage is how many messages RecentChats reads per query.
const recentChatsPage = 500

// RecentChats implements persistence.Store. It walks the messages backwards in the order they
// were stored, a page at a time, so it reads only the rows stored since since, plus a page.
func (s *Store) RecentChats(ctx context.Context, platform string, since time.Time, limit int) ([]persistence.ChatMark, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("recent chats: %w", err)
	}
	defer done()
	if limit <= 0 {
		limit = persistence.DefaultRecentChatsLimit
	}
	bound := sqlstore.NanoBound(since)
	seen := map[[2]string]bool{}
	var marks []persistence.ChatMark
	for before := int64(math.MaxInt64); ; {
		type row struct {
			id       int64
			platform string
			mark     persistence.ChatMark
			at       *int64
		}
		page, err := readAll(ctx, s, func(r scanner) (row, error) {
			var v row
			err := r.Scan(&v.id, &v.platform, &v.mark.ChatID, &v.mark.ThreadID, &v.mark.ScopeID, &v.mark.MessageID, &v.at)
			return v, err
		}, recentChatsSQL, before, recentChatsPage)
		if err != nil {
			return nil, fmt.Errorf("recent chats: %w", s.explain(ctx, err))
		}
		for _, v := range page {
			if v.at == nil || *v.at <= 0 || *v.at < bound {
				return marks, nil // stored before since, or at an unreadable time: long ago
			}
			chat := [2]string{v.mark.ChatID, v.mark.ThreadID}
			if v.platform != platform || seen[chat] {
				continue
			}
			seen[chat] = true
			v.mark.At = time.Unix(0, *v.at).UTC()
			if marks = append(marks, v.mark); len(marks) == limit {
				return marks, nil
			}
		}
		if len(page) < recentChatsPage {
			return marks, nil
		}
		before = page[len(page)-1].id
	}
}

// Unread implements persistence.Store.
func (s *Store) Unread(ctx context.Context, platform string, limit int) ([]persistence.Unread, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("unread places: %w", err)
	}
	defer done()
	if limit <= 0 {
		limit = persistence.DefaultUnreadLimit
	}
	us, err := readAll(ctx, s, scanUnread, `SELECT `+sqlstore.UnreadCols+` FROM unread
		WHERE platform = $1 ORDER BY `+validNanos("created_at")+`, chat_id COLLATE "C" LIMIT $2`, platform, limit)
	if err != nil {
		return nil, fmt.Errorf("unread places of %s: %w", platform, s.explain(ctx, err))
	}
	return us, nil
}

// OpenDrafts implements persistence.Store.
func (s *Store) OpenDrafts(ctx context.Context, platform string, limit int) ([]persistence.Draft, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("open drafts: %w", err)
	}
	defer done()
	if limit <= 0 {
		limit = persistence.DefaultOpenDraftsLimit
	}
	ds, err := readAll(ctx, s, scanDraft, `SELECT `+sqlstore.DraftCols+` FROM drafts
		WHERE platform = $1 ORDER BY `+validNanos("created_at")+`, id COLLATE "C" LIMIT $2`, platform, limit)
	if err != nil {
		return nil, fmt.Errorf("open drafts of %s: %w", platform, s.explain(ctx, err))
	}
	return ds, nil
}
