package http

import (
	"context"
	"errors"
	"time"

	"github.com/agentgate/agentgate/platforms"
)

// Sessions answers the session queries of the HTTP API. The daemon implements it over the
// store and the session manager. Methods return persistence.ErrNotFound (possibly wrapped)
// for an unknown key or session: answered 404 no_session (the key has no session), but for a
// transcript's named session (TranscriptRequest.SessionID), 404 not_found.
type Sessions interface {
	// List returns one page of known sessions.
	List(ctx context.Context, f ListRequest) (*SessionList, error)
	// Get returns a session key's current session with its live actor state.
	Get(ctx context.Context, key string) (*SessionInfo, error)
	// Reset ends the key's current session (reason reset_command) and returns the new one. A
	// refusal with a message for the client is a *RefusedError.
	Reset(ctx context.Context, key string) (*SessionInfo, error)
	// Requeue has the key's session run its quarantined message messageID again, at the end of
	// its queue, as its original sender's turn. It returns once that is durable; a refusal is a
	// *RefusedError.
	Requeue(ctx context.Context, key, messageID string) (*MessageResponse, error)
	// Transcript returns one page of the messages of one incarnation of key (see
	// TranscriptRequest). The answer names the incarnation, so that the next page can ask for
	// the same one.
	Transcript(ctx context.Context, key string, r TranscriptRequest) (*Transcript, error)
	// OutboxAfter returns a page of the key's outbox entries with Seq > after, by Seq: at most
	// limit, and fewer once their texts reach the store's bound of a page's bytes
	// (persistence.OutboxPageBytes), so only an empty page says that no more follow.
	OutboxAfter(ctx context.Context, key string, after int64, limit int) ([]*platforms.Outbound, error)
	// LastOutboxSeq returns the Seq of the key's last outbox entry (0: none), or
	// math.MaxInt64 when it cannot tell (the entries are not all readable yet).
	LastOutboxSeq(ctx context.Context, key string) (int64, error)
	// RepliesTo returns the key's outbox entries with Seq > after that answer messageID, by
	// Seq.
	RepliesTo(ctx context.Context, key, messageID string, after int64) ([]*platforms.Outbound, error)
	// Quarantined returns at most limit quarantined messages of every session, newest first.
	Quarantined(ctx context.Context, limit int) ([]QuarantinedMessage, error)
}

// Limits of GET /v1/quarantined.
const (
	DefaultQuarantinedLimit = 100
	MaxQuarantinedLimit     = 1000
)

// QuarantinedList is the body of GET /v1/quarantined.
type QuarantinedList struct {
	Messages []QuarantinedMessage `json:"messages"`
}

// QuarantinedMessage is a message set aside after repeated crashes, with what its requeue
// (POST /v1/sessions/{key}/messages/{message_id}/requeue) names. SessionEnded says its session
// has ended since: such a message is not requeued (its sender may send it again).
type QuarantinedMessage struct {
	SessionKey   string    `json:"session_key"`
	SessionID    string    `json:"session_id"`
	SessionEnded bool      `json:"session_ended"`
	MessageID    string    `json:"message_id"`
	Seq          int64     `json:"seq"`
	UserID       string    `json:"user_id"`
	UserName     string    `json:"user_name"`
	Text         string    `json:"text"`
	CreatedAt    time.Time `json:"created_at"`
}

// Session states a ListRequest can filter on.
const (
	StateActive     = "active"     // the session actor is running
	StatePassivated = "passivated" // known, but no actor is running
)

// Limits of a session listing.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// ListRequest selects a page of sessions for GET /v1/sessions.
type ListRequest struct {
	Platform string `json:"platform,omitempty"`
	State    string `json:"state,omitempty"` // StateActive, StatePassivated or "" for both
	After    string `json:"after,omitempty"` // only keys sorted after this one
	Limit    int    `json:"limit,omitempty"` // 1..MaxListLimit; the handler fills in the default
}

// SessionList is one page of GET /v1/sessions.
type SessionList struct {
	Sessions []*SessionInfo `json:"sessions"`
	// Next is the After of the next page; empty on the last page.
	Next string `json:"next,omitempty"`
}

// SessionInfo describes a session key's current session, as GET /v1/sessions/{key} returns it.
type SessionInfo struct {
	SessionKey     string     `json:"session_key"`
	SessionID      string     `json:"session_id"`
	PrevSessionID  string     `json:"prev_session_id,omitempty"`
	Platform       string     `json:"platform"`
	ChatType       string     `json:"chat_type"`
	ChatID         string     `json:"chat_id"`
	ThreadID       string     `json:"thread_id"`
	UserID         string     `json:"user_id"`
	UserName       string     `json:"user_name,omitempty"`
	Profile        string     `json:"profile,omitempty"`
	StartedAt      time.Time  `json:"started_at"`
	LastActivityAt time.Time  `json:"last_activity_at"`
	EndedAt        *time.Time `json:"ended_at"` // null while the session is open
	EndReason      string     `json:"end_reason"`
	Title          string     `json:"title"`
	Messages       int        `json:"messages"`
	Pending        int        `json:"pending"`
	// InputTokens and OutputTokens are the model tokens this session's turns used.
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// Live is the session actor's state; nil when no actor is running.
	Live *LiveState `json:"live,omitempty"`
	// Kept, in the answer to a reset, says that the session held no conversation yet (commands
	// and notices do not count) and no setting of its own (/queue, /title), and the reset left
	// it as it is (it would have begun another just as empty).
	Kept bool `json:"kept,omitempty"`
}

// LiveState is the state of a running session actor.
type LiveState struct {
	Active        bool      `json:"active"`
	QueueDepth    int       `json:"queue_depth"`
	QueueMode     string    `json:"queue_mode"`
	RunningTurnID string    `json:"running_turn_id,omitempty"`
	RunningSince  time.Time `json:"running_since,omitzero"`
	ActivatedAt   time.Time `json:"activated_at,omitzero"`
	Restarts      int       `json:"restarts"`
	// MailboxDepth is the number of messages queued in all session actors' mailboxes (it is
	// counted per actor kind, not per session).
	MailboxDepth int `json:"mailbox_depth"`
	// Node is the name the daemon that runs the actor claims sessions under in the store (a
	// session's owner there): its host name, followed in cluster mode (and on a store shared
	// by several daemons) by "/" and its run, the Agentgate-Run of its answers.
	Node string `json:"node,omitempty"`
	// MemberAddress is, in cluster mode, the cluster address of the member that runs the actor
	// (its cluster.advertise, else its cluster.bind), which may be another member than the one
	// asked; empty on a daemon that is no cluster member.
	MemberAddress string `json:"member_address,omitempty"`
	// Probation is "waiting" while the next message, run during 2 unclean stops of the daemon,
	// waits to run alone among such messages, and "running" while it runs so.
	Probation string `json:"probation,omitempty"`
}

// MaxTranscriptLimit caps the limit of GET /v1/sessions/{key}/transcript.
const MaxTranscriptLimit = 1000

// TranscriptRequest selects one page of a transcript: the messages with Seq > After, by Seq,
// at most Limit (every one when Limit <= 0), and fewer once their texts reach the store's
// bound of a page's bytes (persistence.TranscriptPageBytes), of the incarnation SessionID of
// the key (the current one when empty). A page short of both Limit and that bound is the
// last; one that reached the bound may be followed by more.
type TranscriptRequest struct {
	SessionID string
	After     int64
	Limit     int
}

// Transcript is the body of GET /v1/sessions/{key}/transcript.
type Transcript struct {
	SessionKey string              `json:"session_key"`
	SessionID  string              `json:"session_id"`
	Messages   []TranscriptMessage `json:"messages"`
	// Next is the after of the next page, when a limit was asked for and more messages follow.
	Next int64 `json:"next,omitempty"`
}

// TranscriptMessage is one transcript row. Role is user, assistant or notice.
type TranscriptMessage struct {
	Seq       int64     `json:"seq"`
	Role      string    `json:"role"`
	Text      string    `json:"text"`
	MessageID string    `json:"message_id"`
	TurnID    string    `json:"turn_id"`
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
	// Archived marks rows left out of the agent's history (taken back by /undo or /retry, or
	// never run: dropped by /stop or answered with a notice); they are kept, never deleted.
	Archived bool `json:"archived,omitempty"`
}

// MessageRequest is the body of POST /v1/messages. ChatID, UserID and Text are required.
type MessageRequest struct {
	ChatID    string `json:"chat_id"`
	ChatType  string `json:"chat_type,omitempty"` // dm (default), group, channel or thread
	ThreadID  string `json:"thread_id,omitempty"` // required for chat_type thread
	UserID    string `json:"user_id"`
	UserName  string `json:"user_name,omitempty"`
	MessageID string `json:"message_id,omitempty"` // generated when absent; dedupe key
	Profile   string `json:"profile,omitempty"`
	Text      string `json:"text"`
}

// MessageResponse is the answer to POST /v1/messages: 202 with the acknowledgment, or 200 with
// Replies when ?wait saw the turn end.
type MessageResponse struct {
	MessageID   string `json:"message_id"`
	SessionKey  string `json:"session_key"`
	SessionID   string `json:"session_id"`
	Disposition string `json:"disposition"`
	QueueDepth  int    `json:"queue_depth"`
	// Replies is set only on a 200 answer to ?wait.
	Replies []Reply `json:"replies,omitempty"`
	// OutboxAfter is, for a requeue (Sessions.Requeue), the key's outbox seq before it: the
	// entries that answer the message's new run come after (platforms.Ack.OutboxAfter). Not
	// sent to the client.
	OutboxAfter int64 `json:"-"`
}

// Reply is one outbound message that answered a waited-for message.
type Reply struct {
	Text   string `json:"text"`
	TurnID string `json:"turn_id"`
	Kind   string `json:"kind"` // reply or notice
	Seq    int64  `json:"seq"`
}

// RejectedResponse is the 429 body of a message refused by the session's queue cap: it says
// both what happened to the message and why.
type RejectedResponse struct {
	Disposition string   `json:"disposition"` // always rejected
	MessageID   string   `json:"message_id,omitempty"`
	SessionKey  string   `json:"session_key,omitempty"`
	SessionID   string   `json:"session_id,omitempty"`
	QueueDepth  int      `json:"queue_depth,omitempty"`
	Error       APIError `json:"error"`
}

// Event is the data of one Server-Sent Event of GET /v1/sessions/{key}/events.
type Event struct {
	Text      string   `json:"text"`
	TurnID    string   `json:"turn_id"`
	SessionID string   `json:"session_id"`
	InReplyTo []string `json:"in_reply_to"`
}

// RefusedError is a request the session refused, with its own message for the client: Code is
// CodeNoSession or CodeNotFound (404), CodeUnavailable (503), or for a requeue
// CodeNotQuarantined (Status says what the message is) or CodeSessionEnded (409).
type RefusedError struct {
	Code    string
	Status  string
	Message string
}

func (e *RefusedError) Error() string { return "refused: " + e.Code + ": " + e.Message }

// ErrNotTaken marks a Sessions error of a request that reached no session (its actors had
// stopped): nothing was done. While the daemon drains, it is answered 503 draining, which says
// that nothing was changed; any other error then is 503 unavailable, since the request may
// have been done.
var ErrNotTaken = errors.New("http: the request reached no session")

// ErrorResponse is the body of every error answer: {"error":{"code","message"}}.
type ErrorResponse struct {
	Error APIError `json:"error"`
	// MessageID is the id of a message whose POST was answered 503 (draining or unavailable):
	// the one it was sent with, or the one agentgate made for it. Such a message may have been
	// stored; sent again with this id, it is stored once (a duplicate).
	MessageID string `json:"message_id,omitempty"`
}

// APIError is a machine-readable code and a human-readable message.
type APIError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ReadyResponse is the body of GET /readyz.
type ReadyResponse struct {
	Status string `json:"status"` // ready or not_ready
	// Components maps each checked component to ComponentOK or its error text; without the
	// bearer token (when one is set), to ComponentOK or ComponentFailing.
	Components map[string]string `json:"components"`
	Draining   bool              `json:"draining,omitempty"`
	// Starting says that the daemon has not finished its start: Components holds only
	// ComponentStart then, which says what the start waits for.
	Starting bool `json:"starting,omitempty"`
	// Detail says how to see the errors Components leaves out; "" when it leaves none out.
	Detail string `json:"detail,omitempty"`
}

// The words of ReadyResponse.Components for a component that is ready, and for one that is
// not, told to a request without the bearer token.
const (
	ComponentOK      = "ok"
	ComponentFailing = "failing"
)
