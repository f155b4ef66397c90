package sqlite

import (
	"encoding/json"
	"math"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/internal/sqlstore"
)

// Column lists, in the order the scan functions read them.
const (
	sessionCols = sqlstore.SessionCols
	messageCols = sqlstore.MessageCols
	outboxCols  = sqlstore.OutboxCols
)

// scanner is *sql.Row or *sql.Rows.
type scanner interface{ Scan(dest ...any) error }

func scanSession(r scanner) (*persistence.Session, error) {
	var s persistence.Session
	if err := r.Scan(sessionDest(&s)...); err != nil {
		return nil, err
	}
	return &s, nil
}

// sessionDest is where the columns of sessionCols scan into s.
func sessionDest(s *persistence.Session) []any {
	return []any{&s.ID, &s.Key, &s.Platform, &s.ChatType, &s.ChatID, &s.ThreadID, &s.UserID,
		&s.UserName, &s.ScopeID, &s.Profile, nanoTime{&s.StartedAt}, nanoTime{&s.LastActivityAt},
		nanoTime{&s.EndedAt}, &s.EndReason, &s.PrevSessionID, &s.Title, &s.Epoch, &s.QueueMode,
		&s.InputTokens, &s.OutputTokens, nanoTime{&s.ResetDueAt}, &s.ResetDueReason}
}

func scanMessage(r scanner) (persistence.Message, error) {
	var m persistence.Message
	var active, archived int64
	err := r.Scan(&m.SessionID, &m.Seq, &m.Role, &m.Content, &m.Platform, &m.ChatID, &m.MessageID,
		&m.TurnID, &m.Status, &active, &archived, &m.Attempts, nanoTime{&m.CreatedAt}, &m.UserID, &m.UserName)
	m.Active, m.Archived = active != 0, archived != 0
	return m, err
}

func scanOutbox(r scanner) (persistence.OutboxEntry, error) {
	var e persistence.OutboxEntry
	var inReplyTo string
	err := r.Scan(&e.SessionKey, &e.Seq, &e.SessionID, &e.Kind, &e.Text, &e.TurnID, &inReplyTo,
		&e.Platform, &e.ChatType, &e.ChatID, &e.ThreadID, &e.UserID, &e.State, &e.Attempts,
		nanoTime{&e.CreatedAt}, nanoTime{&e.DeliveredAt}, &e.Continued)
	e.InReplyTo = decodeIDs(inReplyTo)
	return e, err
}

// encodeIDs stores a message id list as a JSON array (queried with json_each).
func encodeIDs(ids []string) string {
	if len(ids) == 0 {
		return "[]"
	}
	b, err := json.Marshal(ids)
	if err != nil { // unreachable: a []string always marshals
		return "[]"
	}
	return string(b)
}

// decodeIDs reads a JSON array of message ids; a corrupt value reads as no ids rather than
// making the whole row (and the session that loads it) unreadable.
func decodeIDs(s string) []string {
	var ids []string
	if json.Unmarshal([]byte(s), &ids) != nil || len(ids) == 0 {
		return nil
	}
	return ids
}

// timeArg encodes a time as unix nanoseconds; the zero time is NULL.
func timeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixNano()
}

// nanoTime scans a unix-nanosecond column into a time.Time. It never fails: NULL, zero,
// negative and unparseable values read as the zero time, which every caller treats as "long
// ago" (G6: recovery must never mistake a bad timestamp for "now").
type nanoTime struct{ t *time.Time }

// Scan implements sql.Scanner.
func (n nanoTime) Scan(src any) error {
	*n.t = decodeTime(src)
	return nil
}

func decodeTime(src any) time.Time {
	switch v := src.(type) {
	case int64:
		if v > 0 {
			return time.Unix(0, v).UTC()
		}
	case float64:
		if v > 0 && v < math.MaxInt64 {
			return time.Unix(0, int64(v)).UTC()
		}
	case string:
		return parseTimeText(v)
	case []byte:
		return parseTimeText(string(v))
	case time.Time:
		if v.Unix() > 0 {
			return v.UTC()
		}
	}
	return time.Time{}
}

// parseTimeText accepts an RFC 3339 timestamp written by hand or by another tool; anything else
// is the zero time.
func parseTimeText(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || t.Unix() <= 0 {
		return time.Time{}
	}
	return t.UTC()
}

func scanUnread(r scanner) (persistence.Unread, error) {
	var u persistence.Unread
	err := r.Scan(&u.Platform, &u.ChatID, &u.ScopeID, &u.After, nanoTime{&u.At})
	return u, err
}

func scanDraft(r scanner) (persistence.Draft, error) {
	var d persistence.Draft
	err := r.Scan(&d.Platform, &d.ID, &d.SessionKey, &d.TurnID, &d.ChatType, &d.ChatID, &d.ThreadID,
		&d.Run, nanoTime{&d.CreatedAt})
	return d, err
}

// scanQuarantined scans a message's columns followed by its session's key and ended_at.
func scanQuarantined(r scanner) (persistence.QuarantinedMessage, error) {
	var q persistence.QuarantinedMessage
	var ended time.Time
	m, err := scanMessage(sqlstore.WithMore{Scanner: r, More: []any{&q.SessionKey, nanoTime{&ended}}})
	q.Message, q.SessionEnded = m, !ended.IsZero()
	return q, err
}
