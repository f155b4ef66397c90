// Package persistence defines the durable store of agentgate (the Store interface and the rows it
// keeps), the batching persistence actor that is the only writer, and the spool used when the
// database fails. Implementations live in sqlite/ (the default) and, for cluster mode, postgres/;
// storetest/ is the conformance suite every implementation must pass.
//
// The Store is a plain synchronous interface with no actor code. Writes are described as Ops and
// committed in groups: every group is atomic, and a whole batch of groups shares one transaction
// (group commit). Reads may run concurrently with writes.
//
// This package must not import actors, supervisor or platforms.
package persistence

import (
	"context"
	"time"
)

// Message roles.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleNotice    = "notice"
)

// Message statuses. A user message is pending until a turn answered it.
const (
	StatusPending     = "pending"
	StatusDone        = "done"
	StatusFailed      = "failed"
	StatusQuarantined = "quarantined"
)

// Outbox delivery states.
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed"
)

// End reasons. Boundaries are never reopened by recovery; accidental ends may be.
const (
	EndNewCommand   = "new_command"
	EndResetCommand = "reset_command"
	EndIdle         = "idle"
	EndDaily        = "daily"
	EndSuspended    = "suspended"
	EndCrash        = "crash"
	EndShutdown     = "shutdown"
)

// IsBoundary reports whether an end reason is an intentional boundary (G6).
func IsBoundary(reason string) bool {
	switch reason {
	case EndNewCommand, EndResetCommand, EndIdle, EndDaily, EndSuspended:
		return true
	}
	return false
}

// Session is one incarnation of a conversation. Its identity columns are written in the INSERT
// and never updated.
type Session struct {
	ID             string
	Key            string
	Platform       string
	ChatType       string
	ChatID         string
	ThreadID       string
	UserID         string
	UserName       string
	ScopeID        string
	Profile        string
	StartedAt      time.Time
	LastActivityAt time.Time
	EndedAt        time.Time // zero while open
	EndReason      string
	PrevSessionID  string
	Title          string
	Epoch          int64
}

// Message is one transcript row. (SessionID, Seq) is its identity; Seq is assigned by the
// session actor and increases within a session.
type Message struct {
	SessionID string
	Seq       int64
	Role      string
	Content   string
	// Platform, ChatID and MessageID identify an inbound platform message; (platform, chat id,
	// message id) is unique among user messages and is how duplicates are detected.
	Platform  string
	ChatID    string
	MessageID string
	// UserID and UserName are the sender of a user message: in a shared session each queued
	// message keeps its own sender, so its turn runs with that sender's identity.
	UserID    string
	UserName  string
	TurnID    string
	Status    string
	Active    bool // false once undone or retried away
	Archived  bool
	Attempts  int // times a turn for this message crashed its session
	CreatedAt time.Time
}

// Route maps a session key to its current session id. Generation grows with every change; a
// write with an older generation never replaces a newer one.
type Route struct {
	Key        string
	SessionID  string
	Generation int64
	UpdatedAt  time.Time
}

// OutboxEntry is one reply or notice, recorded before it is sent. (SessionKey, Seq) is its
// identity; Seq increases per session key across incarnations and is the SSE event id.
type OutboxEntry struct {
	SessionKey  string
	Seq         int64
	SessionID   string
	Kind        string // reply | notice
	Text        string
	TurnID      string
	InReplyTo   []string
	Platform    string
	ChatType    string
	ChatID      string
	ThreadID    string
	UserID      string
	State       string
	Attempts    int
	CreatedAt   time.Time
	DeliveredAt time.Time
}

// Op is one write. The concrete types below are the only implementations.
type Op interface{ isOp() }

// CreateSession inserts a session row with its full identity. Re-applying it is a no-op.
type CreateSession struct{ Session Session }

// EndSession ends a session with a reason, unless it has already ended.
type EndSession struct {
	SessionID string
	Reason    string
	At        time.Time
}

// TouchSession advances a session's last activity (never backwards).
type TouchSession struct {
	SessionID string
	At        time.Time
}

// SetTitle sets a session's title.
type SetTitle struct {
	SessionID string
	Title     string
}

// AppendMessage inserts a transcript row. Re-applying an identical row is a no-op; a user row
// whose (platform, chat id, message id) already exists fails with ErrDuplicate.
type AppendMessage struct{ Message Message }

// SetMessageStatus sets the status (and turn id, when not empty) of rows of one session.
type SetMessageStatus struct {
	SessionID string
	Seqs      []int64
	Status    string
	TurnID    string
}

// IncrementAttempts counts one crash against rows of one session.
type IncrementAttempts struct {
	SessionID string
	Seqs      []int64
}

// ArchiveMessages marks rows inactive and archived (undo, retry); rows are never deleted.
type ArchiveMessages struct {
	SessionID string
	Seqs      []int64
}

// PutRoute upserts a routing row if its generation is newer than the stored one.
type PutRoute struct{ Route Route }

// AddOutbox records a reply or notice before it is sent. Re-applying it is a no-op.
type AddOutbox struct{ Entry OutboxEntry }

// MarkDelivery records the delivery state of an outbox entry.
type MarkDelivery struct {
	SessionKey string
	Seq        int64
	State      string
	At         time.Time
}

func (*CreateSession) isOp()     {}
func (*EndSession) isOp()        {}
func (*TouchSession) isOp()      {}
func (*SetTitle) isOp()          {}
func (*AppendMessage) isOp()     {}
func (*SetMessageStatus) isOp()  {}
func (*IncrementAttempts) isOp() {}
func (*ArchiveMessages) isOp()   {}
func (*PutRoute) isOp()          {}
func (*AddOutbox) isOp()         {}
func (*MarkDelivery) isOp()      {}

// Snapshot is what a session actor loads when it starts: everything it needs to carry on
// where its last activation stopped.
type Snapshot struct {
	Route   *Route   // nil for a key never seen
	Session *Session // the routed session; nil for a key never seen
	// Pending are the routed session's user messages with status pending, by seq.
	Pending []Message
	// History are the last active messages of the routed session, by seq (at most the limit
	// passed to LoadSession).
	History []Message
	// Unconfirmed are the key's outbox entries not yet delivered, by seq.
	Unconfirmed   []OutboxEntry
	LastSeq       int64 // highest message seq of the routed session
	LastOutboxSeq int64 // highest outbox seq of the key
}

// SessionSummary is one row of a session listing.
type SessionSummary struct {
	Session  Session
	Messages int
	Pending  int
}

// ListFilter narrows ListSessions.
type ListFilter struct {
	Platform string
	// AfterKey pages: only keys sorted after it are returned.
	AfterKey string
	Limit    int // 0 means 100
}

// Store is the durable state of agentgate. All methods are safe for concurrent use; writes are
// serialised by the persistence actor, which is the only caller of Commit in a process.
type Store interface {
	// Commit applies groups of writes in one transaction. Each group is atomic on its own: the
	// error for group i is errs[i], and a failed group leaves no trace. If the transaction
	// itself fails, every group gets that error.
	Commit(ctx context.Context, groups [][]Op) (errs []error)

	// LoadSession returns the durable state of a session key, with at most historyLimit
	// history messages.
	LoadSession(ctx context.Context, key string, historyLimit int) (*Snapshot, error)
	// FindInbound finds a user message by its platform identity; ErrNotFound if absent.
	FindInbound(ctx context.Context, platform, chatID, messageID string) (*Message, error)
	// RepliesTo returns the outbox entries of a session key that answer a message id.
	RepliesTo(ctx context.Context, key, messageID string) ([]OutboxEntry, error)
	// OutboxAfter returns a key's outbox entries with seq > after, by seq, at most limit.
	OutboxAfter(ctx context.Context, key string, after int64, limit int) ([]OutboxEntry, error)
	// Transcript returns every message of a session (including archived rows), by seq.
	Transcript(ctx context.Context, sessionID string) ([]Message, error)
	// Route returns the routing row of a key; ErrNotFound if absent.
	Route(ctx context.Context, key string) (*Route, error)
	// Session returns one session row; ErrNotFound if absent.
	Session(ctx context.Context, id string) (*Session, error)
	// ListSessions lists routed session keys with their current session, by key.
	ListSessions(ctx context.Context, f ListFilter) ([]SessionSummary, error)
	// Recoverable returns the keys whose current session has pending user messages or whose
	// outbox has undelivered entries.
	Recoverable(ctx context.Context) ([]string, error)
	// Ping checks that the store can be written.
	Ping(ctx context.Context) error
	// Close releases the store.
	Close() error
}
