package postgres

import (
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/internal/sqlstore"
)

// scanner is pgx.Row or pgx.Rows.
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
	err := r.Scan(&m.SessionID, &m.Seq, &m.Role, &m.Content, &m.Platform, &m.ChatID, &m.MessageID,
		&m.TurnID, &m.Status, &m.Active, &m.Archived, &m.Attempts, nanoTime{&m.CreatedAt}, &m.UserID, &m.UserName)
	return m, err
}

func scanOutbox(r scanner) (persistence.OutboxEntry, error) {
	var e persistence.OutboxEntry
	err := r.Scan(&e.SessionKey, &e.Seq, &e.SessionID, &e.Kind, &e.Text, &e.TurnID, &e.InReplyTo,
		&e.Platform, &e.ChatType, &e.ChatID, &e.ThreadID, &e.UserID, &e.State, &e.Attempts,
		nanoTime{&e.CreatedAt}, nanoTime{&e.DeliveredAt}, &e.Continued)
	if len(e.InReplyTo) == 0 {
		e.InReplyTo = nil
	}
	return e, err
}

// timeArg encodes a time as unix nanoseconds; the zero time is NULL.
func timeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixNano()
}

// nanoTime scans a unix-nanosecond column into a time.Time. NULL, zero and negative values
// read as the zero time, which every caller treats as "long ago" (G6: recovery must never
// mistake a bad timestamp for "now").
type nanoTime struct{ t *time.Time }

// Scan implements sql.Scanner.
func (n nanoTime) Scan(src any) error {
	*n.t = time.Time{}
	if v, ok := src.(int64); ok && v > 0 {
		*n.t = time.Unix(0, v).UTC()
	}
	return nil
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
