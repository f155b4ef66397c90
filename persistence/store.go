// Package persistence defines the durable store of agentgate (the Store interface and the rows it
// keeps), the batching persistence actor that is the only writer, and the spool used when the
// database fails. Implementations live in sqlite/ (the default) and, for cluster mode, postgres/;
// storetest/ is the conformance suite every implementation must pass.
//
// The Store is a plain synchronous interface with no actor code. Writes are described as Ops and
// committed in groups: every group is atomic, and a whole batch of groups shares one transaction
// (group commit). Reads may run concurrently with writes.
//
// Rows are never deleted by an Op: undo and retry archive messages, a boundary ends a session.
// The only deletion is pruning (Store.PruneSessions and PruneStep), and it deletes only
// sessions that ended before the retention cutoff and that nothing still needs (see there).
// Draft records and unread places are the exception: they are bookkeeping of a platform, not
// conversation data, and CloseDraft and ClearUnread delete them.
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

// Outbox delivery states. A pending entry is undelivered: it is sent again when its key's
// session starts. Delivered and failed are final: a failed entry was refused by its platform
// for good (platforms.ErrUndeliverable), and sending it again could not help.
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed"
)

// End reasons. Boundaries are never reopened by recovery; accidental ends may be. Only an
// explicit user action (/resume, through ReopenSession) reopens a boundary.
const (
	EndNewCommand   = "new_command"
	EndResetCommand = "reset_command"
	EndIdle         = "idle"
	EndDaily        = "daily"
	// EndSuspended is DESIGN's boundary for a suspended session; nothing writes it yet, and
	// it is read as an automatic end (idle, daily) wherever a row holds it.
	EndSuspended = "suspended"
	// EndSwitched ends a session the user left with /resume for an earlier one.
	EndSwitched = "switched"
	EndCrash    = "crash"
	EndShutdown = "shutdown"
)

// IsBoundary reports whether an end reason is an intentional boundary (G6).
func IsBoundary(reason string) bool {
	switch reason {
	case EndNewCommand, EndResetCommand, EndIdle, EndDaily, EndSuspended, EndSwitched:
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
	// Epoch is the epoch of the key's claim (Store.Claim) under which the session began: that
	// of the activation that created it, which every write of that activation was fenced with
	// (cluster mode). 0 in a single daemon, which claims nothing. Later activations of the key
	// claim newer epochs and leave it as it is.
	Epoch int64
	// QueueMode is the session's own queue mode (set with /queue); empty means the default.
	QueueMode string
	// InputTokens and OutputTokens are the model tokens the session's turns used, summed by
	// AddUsage.
	InputTokens  int64
	OutputTokens int64
	// ResetDueReason is the reason (EndIdle, EndDaily) of an automatic reset that fell due at
	// ResetDueAt while the session had work in hand (MarkResetDue): the session ends at
	// ResetDueAt once that work is done, whatever its activity says by then. "" when none is
	// due; ResetDueAt may be zero with a reason (a session with no valid activity time).
	ResetDueReason string
	ResetDueAt     time.Time
}

// HasSettings reports whether the session holds settings of its own (a /queue mode, a /title),
// which a session a reset begins starts without: a reset of a session nothing was said in yet
// keeps it only if it holds none (actors' Session.fresh, agentgate sessions reset).
func (s *Session) HasSettings() bool { return s.QueueMode != "" || s.Title != "" }

// Message is one transcript row. (SessionID, Seq) is its identity; Seq is assigned by the
// session actor and increases within a session.
//
// A user message is pending while its Status is StatusPending and it is Active: an archived
// (undone or retried away) message is never run again, so it counts as pending nowhere (not in
// Snapshot.Pending, SessionSummary.Pending, Recoverable nor PruneSessions).
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
	UserID   string
	UserName string
	TurnID   string
	Status   string
	Active   bool // false once undone, retried away, or set aside unrun (archived)
	Archived bool
	// Attempts counts the unclean stops of the daemon (Store.BeginRun) while the message was
	// the head of its session's pending queue. Crashes of its session alone are counted in
	// memory.
	Attempts  int
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
// identity; Seq increases per session key across incarnations and is the SSE event id. An entry
// is undelivered while its State is DeliveryPending; once delivered it stays delivered. Attempts
// counts the sends tried to deliver it as of its last mark (MarkDelivery.Attempt): the tries of
// a pending entry that failed and were retried are counted by the mark that ends them (delivered,
// or failed for good), or by the stop of a run that leaves it pending for the next.
type OutboxEntry struct {
	SessionKey  string
	Seq         int64
	SessionID   string
	Kind        string // reply | notice | pruned (KindPruned)
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
	// Continued is set when the answer to InReplyTo goes on in a later entry (an automatic
	// reset's notice, which the turn's reply follows); an entry without it ends the answer.
	Continued bool
}

// OutboxPageBytes bounds the texts of a page of Store.OutboxAfter: a page ends with the entry
// whose text takes it to this or past it, so it holds at most this and one entry more (the
// exec and openai agents reply at most 1 MiB), and never less than one entry, however large,
// so that its reader goes on.
const OutboxPageBytes = 1 << 20

// TranscriptPageBytes bounds the texts of a page of Store.TranscriptAfter as OutboxPageBytes
// bounds an outbox page's: a page ends with the message whose text takes it to this or past
// it, and holds at least one message. A page of 100 messages of 64 KiB each held 6.4 MiB
// (and its JSON encoding) while its HTTP client did not read it: 60 such clients took the
// daemon's heap to 500 MiB.
const TranscriptPageBytes = OutboxPageBytes

// KindPruned is the kind of the last outbox entry of a key whose session PruneSessions deleted:
// the entry keeps the key's seq and nothing of the session's content, and OutboxAfter never
// returns it.
const KindPruned = "pruned"

// Draft is a streaming reply's draft posted on a platform and not yet finished: the record a
// restart needs to remove a draft whose turn never finished it (the turn runs again and
// answers anew). (Platform, ID) is its identity.
type Draft struct {
	Platform   string
	ID         string // the platform's id of the draft message
	SessionKey string
	TurnID     string
	ChatType   string
	ChatID     string
	ThreadID   string
	// Run identifies the daemon run that posted the draft: a run removes only earlier runs'
	// drafts, never its own.
	Run       string
	CreatedAt time.Time
}

// Unread is a place in a platform's chat after which messages may have gone unread: a
// platform that reads its chats' history back after a disconnection (Discord) failed to read
// past it, and live messages taken since have moved the chat's newest stored message beyond
// it. The record lets the next process (a restart, another cluster member) read from there.
// (Platform, ChatID) is its identity.
type Unread struct {
	Platform string
	ChatID   string // the platform's chat: a Discord channel or thread
	ScopeID  string // the guild or workspace, when the platform needs it to read the chat
	After    string // the platform's id of the last message known read; reading resumes after it
	// At is when the place was first recorded: every message left unread there is older.
	At time.Time
}

// Op is one write. The concrete types below are the only implementations. Every op is
// idempotent (re-sending a write whose acknowledgement was lost is harmless, and so is a spool
// replay of a batch that was in fact committed), but for what spools written by older binaries
// may hold: an IncrementAttempts, which the runtime no longer writes, and a MarkDelivery without
// its Attempt, each of which counts each application. AddUsage adds, but once per turn, so it is
// idempotent too.
type Op interface{ isOp() }

// CreateSession inserts a session row with its full identity. Re-applying it is a no-op.
type CreateSession struct{ Session Session }

// EndSession ends a session with a reason, unless it has already ended. It clears the
// session's due reset (MarkResetDue): the session has ended.
type EndSession struct {
	SessionID string
	Reason    string
	At        time.Time
}

// ReopenSession clears the end (EndedAt and EndReason) of a session, so that it is open again
// (with no due reset: EndSession cleared it).
// It is the write of /resume, an explicit user action, and it reopens boundaries too. Recovery
// never uses it: a boundary (IsBoundary) is never undone by a restart (G6). It does not route
// the key to the session: send a PutRoute in the same group. Re-applying it, or applying it to
// an open or unknown session, is a no-op.
type ReopenSession struct {
	SessionID string
}

// MarkResetDue records on an open session that its automatic reset fell due at At, for Reason
// (EndIdle, EndDaily), while the session had work in hand (a turn running, messages waiting):
// the session is to end at At once that work is done, also when a later activation loads it
// (Session.ResetDueReason), although the work moves its activity past At. It is written only
// then, never per turn. A session that has a due reset keeps it (the first is the one that
// counts); an ended or unknown session is left as it is; EndSession clears it.
// Re-applying it is a no-op. At may be zero (a session with no valid activity time: it ends no
// later than it started); Reason is required.
type MarkResetDue struct {
	SessionID string
	Reason    string
	At        time.Time
}

// TouchSession advances a session's last activity (never backwards).
type TouchSession struct {
	SessionID string
	At        time.Time
}

// SetQueueMode sets a session's own queue mode (/queue).
type SetQueueMode struct {
	SessionID string
	Mode      string
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

// IncrementAttempts counts one crash against rows of one session. It counts each application:
// a re-sent IncrementAttempts counts twice (use SetAttempts where a write may be re-sent). The
// runtime no longer writes it; it is kept for the spools of older binaries, which may hold it.
type IncrementAttempts struct {
	SessionID string
	Seqs      []int64
}

// SetAttempts raises the attempts counter of one message to Attempts: the stored value becomes
// the larger of the two, so a re-sent or late SetAttempts never lowers it and re-applying it is
// a no-op.
type SetAttempts struct {
	SessionID string
	Seq       int64
	Attempts  int
}

// MarkProbation records that a struck message (Attempts at least 1) starts to run in the
// daemon run Run: a suspect (Attempts at least ProbationAfter) alone among suspects before
// its turn starts, any other once its turn has an agent slot. Store.BeginRun counts an
// unclean stop against a struck message only when its mark names the run that died, so
// not against one that merely waited. Re-applying it is a no-op; an unknown message is a
// no-op. (The name and the column, probation_run, date from when only suspects were marked:
// spools written before name the op so.)
type MarkProbation struct {
	SessionID string
	Seq       int64
	Run       string
}

// ProbationAfter is the attempts (unclean stops counted, Message.Attempts) from which a head
// pending message is a suspect: it runs alone among suspects, marked with its run first
// (MarkProbation), and an unclean stop counts against it only when it was running then. It is
// one below the session's quarantine limit (actors.QuarantineAfter), so that every message in
// flight during a crash loop reaches it and only the one that runs when the process dies goes
// past it.
const ProbationAfter = 2

// RequeueMessage runs a quarantined user message again (an operator's requeue): its row moves
// from Seq to NewSeq, the end of its session's transcript, and becomes pending with its counts
// cleared (Attempts, and its probation mark). Pending messages load by seq, so the moved row
// runs after the messages already waiting, in the order the session queued it in memory, also
// after a restart; its text, sender and message id are unchanged (it is the same message, its
// replies answer the same id). Only a user row with status quarantined at Seq moves:
// re-applying it, or applying it to any other row, is a no-op. NewSeq must be unused (the
// session's next seq).
type RequeueMessage struct {
	SessionID string
	Seq       int64
	NewSeq    int64
}

// ArchiveMessages marks rows inactive and archived (undo, retry, a message set aside without
// running); rows are never deleted.
type ArchiveMessages struct {
	SessionID string
	Seqs      []int64
}

// PutRoute upserts a routing row if its generation is newer than the stored one.
type PutRoute struct{ Route Route }

// AddOutbox records a reply or notice before it is sent. Re-applying it is a no-op.
type AddOutbox struct{ Entry OutboxEntry }

// AddUsage adds the model tokens one turn used to its session's totals. It is recorded per
// (SessionID, TurnID): re-applying it for a turn already recorded changes nothing, whatever its
// numbers. The session must exist.
type AddUsage struct {
	SessionID    string
	TurnID       string
	InputTokens  int64
	OutputTokens int64
}

// MarkDelivery records the delivery state of an outbox entry and its delivery attempts: the
// entry's Attempts become the larger of the stored count and Attempt, so re-applying a mark (a
// write re-sent, or a spool replay of a batch that was committed) counts its attempt once, and a
// late mark of an earlier attempt never lowers the count. Delivered is final: marking a
// delivered entry (with any state) changes nothing, not even its attempts. A mark with the
// state DeliveryPending only counts (a stop's, of a reply it leaves to the next start, its tries
// so far): it leaves the entry's state as it is, so a failed entry stays failed.
type MarkDelivery struct {
	SessionKey string
	Seq        int64
	State      string
	At         time.Time
	// Attempt is the number of the delivery attempt the mark ends, from 1: the entry's
	// Attempts as it was loaded, plus the sends tried since, this one included. Zero is a mark
	// spooled by an older binary, which had no number: it counts one attempt more at each
	// application, as such marks always did. It is never negative.
	Attempt int
}

// OpenDraft records a posted draft. Re-applying it is a no-op.
type OpenDraft struct{ Draft Draft }

// CloseDraft deletes the record of a draft that is finished, marked interrupted or removed.
// Closing an unknown draft, or re-applying it, is a no-op.
type CloseDraft struct {
	Platform string
	ID       string
}

// MarkUnread records a chat's unread place, or replaces the one it has. Re-applying it is a
// no-op.
type MarkUnread struct{ Unread Unread }

// ClearUnread deletes a chat's unread place once it was read: the place After, or any when After
// is empty. A place another process recorded since (a newer one) stays: a clear that was held
// up (retried through an outage, or sent by a member that has since handed the gateway over)
// must not delete it. Nor does the same place go once another process has taken the gateway
// over from the one that clears it, in a store that keeps such a hand-over (PostgreSQL, whose
// Lease raises an epoch: postgres.GatewayLease): the new holder may have loaded the place to
// read from it. Clearing an unknown one, or re-applying it, is a no-op.
type ClearUnread struct {
	Platform string
	ChatID   string
	After    string
}

// Fence makes its group commit only while no claim of Key newer than Epoch exists (see
// Store.Claim); otherwise the whole group fails with an error wrapping ErrFenced. It writes
// nothing. A session activation that claimed its key puts a Fence first in every group it
// writes, so a duplicate activation (a brief one during a cluster membership change) can never
// interleave its writes with the newer one's.
type Fence struct {
	Key   string
	Epoch int64
}

func (*Fence) isOp()             {}
func (*OpenDraft) isOp()         {}
func (*CloseDraft) isOp()        {}
func (*MarkUnread) isOp()        {}
func (*ClearUnread) isOp()       {}
func (*CreateSession) isOp()     {}
func (*EndSession) isOp()        {}
func (*ReopenSession) isOp()     {}
func (*MarkResetDue) isOp()      {}
func (*TouchSession) isOp()      {}
func (*SetTitle) isOp()          {}
func (*SetQueueMode) isOp()      {}
func (*AppendMessage) isOp()     {}
func (*SetMessageStatus) isOp()  {}
func (*IncrementAttempts) isOp() {}
func (*SetAttempts) isOp()       {}
func (*MarkProbation) isOp()     {}
func (*ArchiveMessages) isOp()   {}
func (*RequeueMessage) isOp()    {}
func (*PutRoute) isOp()          {}
func (*AddOutbox) isOp()         {}
func (*MarkDelivery) isOp()      {}
func (*AddUsage) isOp()          {}

// Ownership is the current claim of a session key (Store.Claim).
type Ownership struct {
	Key       string
	Epoch     int64
	Owner     string // who claimed it: the cluster member's name
	ClaimedAt time.Time
}

// ClaimSeen is a key's latest claim as a member found it before it asked the other members to
// let go of the key: the condition of its own claim (Store.Claim). The zero ClaimSeen is a key
// never claimed.
type ClaimSeen struct {
	Epoch int64
	Owner string
}

// ResetClaimOwner is the owner `agentgate sessions reset` claims a cluster's session key as when
// no member answers it (it ends the session in the store itself): a claim of this owner is an
// operator's, not a member's.
const ResetClaimOwner = "agentgate sessions reset"

// Claimed is the outcome of Store.Claim.
type Claimed struct {
	Epoch int64
	// Previous is the owner the claim replaced; "" at the key's first claim.
	Previous string
	// Counted is the key's head pending message (as BeginRun counts them) when Previous is a
	// cluster member that is gone without leaving (killed, out of memory, cut off: its
	// registration expired, or a newer member registered its address): the claim added 1 to
	// its Attempts, as a single daemon's unclean stop does. nil otherwise.
	Counted *CountedMessage
}

// Snapshot is what a session actor loads when it starts: everything it needs to carry on
// where its last activation stopped.
type Snapshot struct {
	Route *Route // nil for a key never seen
	// Session is the routed session; nil for a key never seen, and nil when the route points to
	// a session row that does not exist (Route is then still set).
	Session *Session
	// Pending are the routed session's pending (active) user messages, by seq: the first
	// pendingLimit of them when LoadSession was given one.
	Pending []Message
	// PendingCount is how many pending (active) user messages the routed session has: more
	// than len(Pending) when the read stopped at the limit. The rest have seqs after the last
	// of Pending and at most LastSeq (read them with PendingAfter).
	PendingCount int
	// History are the last active messages of the routed session, by seq (at most the limit
	// passed to LoadSession).
	History []Message
	// Unconfirmed are the key's outbox entries not yet delivered, by seq.
	Unconfirmed   []OutboxEntry
	LastSeq       int64 // highest message seq of the routed session
	LastOutboxSeq int64 // highest outbox seq of the key
}

// UncleanStop is a daemon run that never ended cleanly (Store.BeginRun).
type UncleanStop struct {
	Run       string
	StartedAt time.Time
	// Counted are the head pending messages that had one attempt added, by session id.
	Counted []CountedMessage
}

// CountedMessage is a message an unclean stop was counted against (UncleanStop).
type CountedMessage struct {
	Key       string // the session key it routes to
	SessionID string
	MessageID string
	Attempts  int // its attempts now
}

// SessionSummary is one row of a session listing.
type SessionSummary struct {
	Session  Session
	Messages int // every message row, archived ones included
	Pending  int // pending (active) user messages
}

// ListFilter narrows ListSessions.
type ListFilter struct {
	Platform string
	// AfterKey pages: only keys sorted after it are returned.
	AfterKey string
	Limit    int // 0 means 100
}

// Default limits of the Store's listing methods.
const (
	DefaultSessionsOfKeyLimit = 100
	DefaultIdleSessionsLimit  = 1000
	DefaultPruneLimit         = 1000
	DefaultRecentChatsLimit   = 1000
	DefaultOpenDraftsLimit    = 1000
	DefaultUnreadLimit        = 1000
)

// DefaultPruneRows is the row budget of a PruneStep when it is given none: a transaction of
// about 60 ms on SQLite, whose write lock every commit waits for meanwhile (docs/BENCHMARKS.md,
// "Prune steps").
const DefaultPruneRows = 2000

// PruneCount is what one PruneStep did.
type PruneCount struct {
	Sessions int // sessions deleted (their rows)
	Messages int // message rows deleted, of these sessions or of sessions an earlier step began
	// Swept counts the outbox rows the step's sweep deleted or emptied: finished replies of
	// sessions that are gone (one delivered after its session was pruned), and pruned markers
	// that are no longer their key's last (see Store.PruneStep).
	Swept int
	// Rows counts every row the step deleted or emptied: session, message, search index,
	// usage and outbox rows, the swept ones too. It is at most the step's budget (at least two
	// rows).
	Rows int
	// More says that the step spent its budget or its sessions: more may be due.
	More bool
}

// Pardoned is what Store.Pardon cleared.
type Pardoned struct {
	Messages int // messages whose count was cleared
	Sessions int // the sessions they belong to
}

// ChatMark is the newest inbound message a store took from one chat (or thread) of a
// platform: where a platform that can read its chats' history picks up after a restart.
type ChatMark struct {
	ChatID    string // the chat; a thread's parent for a thread
	ThreadID  string // the thread, when the message was in one
	ScopeID   string // the guild or workspace
	MessageID string
	At        time.Time // when it was stored
}

// Searcher is a Store with full-text search over message content (DESIGN §4), for operators
// (agentgate sessions search): Search returns the messages, archived ones included, whose
// content matches query, best match first, at most limit (0 means 100). Words match whole and
// case-blind. The query syntax is the store's own: SQLite's FTS5 or PostgreSQL's web search;
// both take words (all must match), "a phrase" in quotes and OR.
type Searcher interface {
	Search(ctx context.Context, query string, limit int) ([]Message, error)
}

// QuarantineLister is a Store that lists quarantined messages across sessions, for operators
// (agentgate sessions quarantined, GET /v1/quarantined, before a requeue): Quarantined returns
// the user messages whose status is quarantined and that were not taken back (/undo, /retry),
// newest first, at most limit (0 means 100).
type QuarantineLister interface {
	Quarantined(ctx context.Context, limit int) ([]QuarantinedMessage, error)
}

// QuarantinedMessage is a quarantined message with its session's key, and whether that session
// has ended since (then it is not requeued: its conversation is gone).
type QuarantinedMessage struct {
	Message
	SessionKey   string
	SessionEnded bool
}

// Store is the durable state of agentgate. All methods are safe for concurrent use; writes are
// serialised by the persistence actor, which is the only caller of Commit in a process.
//
// A stored time that is missing or cannot be read (NULL, not positive, garbage) reads as the
// zero time, and every method treats it as "long ago", never as "now" (G6): recovery and the
// reset timer use durable times only.
type Store interface {
	// Commit applies groups of writes in one transaction. Each group is atomic on its own: the
	// error for group i is errs[i], and a failed group leaves no trace. If the transaction
	// itself fails, every group gets that error. A group that fails because the database is
	// unavailable (ErrUnavailable) fails the whole batch the same way: its writes go to the
	// spool, and a later group (of the same session, perhaps) must not commit ahead of them.
	Commit(ctx context.Context, groups [][]Op) (errs []error)

	// LoadSession returns the durable state of a session key, with at most historyLimit
	// history messages (none when historyLimit <= 0) and the first pendingLimit pending ones
	// (all when pendingLimit <= 0): a session that starts with a backlog of thousands of
	// messages reads what its queue holds, not the whole backlog at once. A key never seen
	// returns an empty Snapshot; a route that points to a missing session returns the Route
	// with a nil Session.
	LoadSession(ctx context.Context, key string, historyLimit, pendingLimit int) (*Snapshot, error)
	// FindInbound finds a user message by its platform identity; ErrNotFound if absent.
	FindInbound(ctx context.Context, platform, chatID, messageID string) (*Message, error)
	// FindInbounds is FindInbound for many ids of one chat, in one read: the user messages of
	// chatID of platform whose ids are among messageIDs, by message id; those it does not hold
	// (and empty ids) are left out, without an error. A moderator's purge of up to 100 messages
	// costs one read, not one for each.
	FindInbounds(ctx context.Context, platform, chatID string, messageIDs []string) ([]Message, error)
	// RepliesTo returns the outbox entries of a session key with seq > after that answer a
	// message id, by seq. A session reports the key's outbox seq before it took a message
	// (DeliverResult.OutboxAfter): every entry that answers the message comes after it, and a
	// reader that polls reads only those, not a long chat's whole outbox.
	RepliesTo(ctx context.Context, key, messageID string, after int64) ([]OutboxEntry, error)
	// OutboxAfter returns a key's outbox entries with seq > after, by seq, never a KindPruned
	// one. With limit > 0 it returns a page: at most limit entries, and none past the one whose
	// text takes the page's texts to OutboxPageBytes (the first entry is always returned), so
	// that a reader of a long outbox of large replies holds a page's bytes, not limit replies.
	// A page shorter than limit is no sign of the end: read on after its last seq until a page
	// comes back empty. With limit <= 0 it returns every entry.
	OutboxAfter(ctx context.Context, key string, after int64, limit int) ([]OutboxEntry, error)
	// LastOutboxSeq returns the highest outbox seq of a key, a pruned entry's included (0 when
	// it has none): the id of its last event.
	LastOutboxSeq(ctx context.Context, key string) (int64, error)
	// Transcript returns every message of a session (including archived rows), by seq. An
	// unknown session has an empty transcript, not ErrNotFound.
	Transcript(ctx context.Context, sessionID string) ([]Message, error)
	// TranscriptAfter returns the messages of a session with seq > after (archived rows
	// included, as Transcript), by seq: the transcript read in pages, so that a long one is
	// never held whole. With limit > 0 it returns a page: at most limit messages, and none
	// past the one whose text takes the page's texts to TranscriptPageBytes (the first message
	// is always returned). A page shorter than limit whose texts stay under TranscriptPageBytes
	// is the last; one that reaches it is no sign of the end: read on after its last seq. With
	// limit <= 0 it returns every message. An unknown session has none.
	TranscriptAfter(ctx context.Context, sessionID string, after int64, limit int) ([]Message, error)
	// PendingAfter returns a session's pending (active) user messages with after < seq <=
	// through, by seq, at most limit (no limit when limit <= 0): the messages a session holds
	// in the store only, past its queue's cap (sessions.queue.overflow spool), read back in
	// pages as its queue drains.
	PendingAfter(ctx context.Context, sessionID string, after, through int64, limit int) ([]Message, error)
	// PendingRefsAfter is PendingAfter without the messages' text (Content is empty): what a
	// session needs of the messages it drops or sets aside without running them, read without
	// holding a flooded chat's text (up to 64 KiB a message) in memory.
	PendingRefsAfter(ctx context.Context, sessionID string, after, through int64, limit int) ([]Message, error)
	// CountMessages returns how many message rows a session has (archived ones included) and
	// how many of them are pending (active) user messages: SessionSummary's Messages and
	// Pending for one session id, counted without reading the rows. An unknown session has 0
	// and 0.
	CountMessages(ctx context.Context, sessionID string) (messages, pending int, err error)
	// History returns, read in one snapshot, the last limit active user and assistant
	// messages of a session by seq (none when limit <= 0; notices are left out: they are no
	// part of the conversation an agent sees) and its highest message seq (archived rows
	// included). It is what /resume loads into the resumed session's buffer; unlike
	// LoadSession's History, no notice takes the place of a message. An unknown session has
	// none and 0.
	History(ctx context.Context, sessionID string, limit int) (history []Message, lastSeq int64, err error)
	// Route returns the routing row of a key; ErrNotFound if absent.
	Route(ctx context.Context, key string) (*Route, error)
	// Session returns one session row; ErrNotFound if absent.
	Session(ctx context.Context, id string) (*Session, error)
	// SessionsOfKey returns every incarnation ever recorded for a session key, ended ones
	// included, newest started first (ties by ascending id; an unreadable StartedAt sorts as
	// the oldest), at most limit (DefaultSessionsOfKeyLimit when limit <= 0). Sessions of other
	// keys are never returned: /resume may only reach sessions of its own key.
	SessionsOfKey(ctx context.Context, key string, limit int) ([]Session, error)
	// ListSessions lists routed session keys with their current session, by key.
	ListSessions(ctx context.Context, f ListFilter) ([]SessionSummary, error)
	// IdleSessions returns the sessions the durable reset timer must look at: each is the
	// current routed session of its key, is not ended, and its LastActivityAt is before
	// before. A missing or unreadable last activity counts as long ago, so such a session is
	// always returned (never treated as active now). Oldest activity first (ties by id), at
	// most limit (DefaultIdleSessionsLimit when limit <= 0).
	IdleSessions(ctx context.Context, before time.Time, limit int) ([]Session, error)
	// IdleSessionsAfter continues IdleSessions past the last session of the previous page
	// (whose LastActivityAt and ID are given): the sessions with valid activity after it in the
	// same order (the ones with missing activity all come on the first page).
	IdleSessionsAfter(ctx context.Context, before time.Time, lastActivity time.Time, lastID string, limit int) ([]Session, error)
	// Recoverable returns the keys whose current session has pending (active) user messages
	// or whose outbox has undelivered entries.
	Recoverable(ctx context.Context) ([]string, error)
	// RecentChats returns the chats (chat and thread) of platform with an inbound message
	// stored at or after since, each with its newest one, most recent first, at most limit
	// (DefaultRecentChatsLimit when limit <= 0). It reads back from the newest message and
	// stops at the first one stored before since (an unreadable time is before any).
	RecentChats(ctx context.Context, platform string, since time.Time, limit int) ([]ChatMark, error)
	// PruneSessions enforces the retention: it deletes sessions that ended before endedBefore,
	// together with their messages (and their search index entries), their turns' usage and
	// their outbox entries, and returns how many it deleted, at most limit (DefaultPruneLimit
	// when limit <= 0; call again while it returns limit). It runs PruneStep transactions until
	// it has deleted limit sessions and every row of theirs, or nothing more is due; on error it
	// returns what the transactions before the failing one deleted. It and PruneStep are the
	// only methods that delete rows.
	//
	// A session is kept whenever it may still be needed or its safety cannot be established:
	// while it is open, while it has pending user messages or undelivered outbox entries (for
	// its session id), or when its end time is missing or unreadable. A key's last session is
	// pruned like any other once it ended: its routing row stays and points to a session that
	// is gone, which LoadSession returns as a Route with a nil Session, so the key's next
	// message starts a new session. Routing rows are never deleted, and a key's last outbox
	// entry stays with its seq (outbox seqs are SSE event ids and must never be reused): when
	// it is a pruned session's it becomes KindPruned, without text or the ids it answered. It is
	// called by the owner of the persistence actor, not by the actor, and is safe to run
	// concurrently with Commit.
	PruneSessions(ctx context.Context, endedBefore time.Time, limit int) (pruned int, err error)
	// PruneStep does one write transaction of PruneSessions' work (with no limit on sessions),
	// in which it deletes or empties at most rows rows (DefaultPruneRows when rows <= 0), search
	// index entries included, so that the commits waiting for the database's write lock get it
	// between two steps. The persistence actor runs one step per Prune request; call again while
	// PruneCount.More. On error nothing of the step is deleted.
	//
	// A session is deleted as a whole, for every reader, in the step that deletes its row (after
	// the checks of PruneSessions, in the same transaction): from then on no read finds it, its
	// transcript or its search hits, and no write reopens it. A session whose rows do not fit in
	// the rest of that step's budget leaves them behind, without its row, for the next steps,
	// which delete them before anything else (its delivered replies first: until then they stay
	// in its key's OutboxAfter); a stop or crash in between leaves them to the first step after
	// the next start. A store whose foreign keys keep a session's row until its messages are
	// gone (PostgreSQL) deletes a session larger than the budget over several steps instead, its
	// row last: meanwhile the session stays readable without the rows deleted so far, and each
	// step checks it again first, so that one needed again between two steps is kept with what is
	// left of it.
	//
	// A step that finds no session left to delete sweeps the outbox with the rest of its budget
	// (PruneCount.Swept): it reads a window of it after where the last step's sweep stopped, and
	// deletes the entries that are no longer pending of sessions that are gone (an entry has no
	// foreign key: a reply written for a session while or after a step deletes it stays, and is
	// delivered), and the KindPruned markers that are no longer their key's last; an entry of a
	// gone session that is its key's last becomes that marker. It says More until a window
	// reaches the end of the outbox, and the sweep of the next pass begins at the start again.
	// Pending entries, entries of a session that exists and entries without a session id are
	// never swept.
	PruneStep(ctx context.Context, endedBefore time.Time, rows int) (PruneCount, error)
	// PullBack sets the session times that lie after after to to, in one transaction, and
	// returns how many sessions it changed: an open session's last activity (and a reset due
	// time it holds) and an ended session's end, whose last activity moves back with it by as
	// much, so that its quiet time before the end stays the same. Times after now are those
	// of a clock set back since (a clock that ran ahead, then corrected): left there, they
	// delayed the session's resets, and its pruning, by the size of the step. The caller
	// passes a time somewhat after now as after, so that a write of another member whose
	// clock runs a little ahead is left alone. A time that is not a valid one is left as it is.
	PullBack(ctx context.Context, after, to time.Time) (int, error)
	// OpenDrafts returns the drafts of platform recorded and not closed, oldest first (ties by
	// id), at most limit (DefaultOpenDraftsLimit when limit <= 0).
	OpenDrafts(ctx context.Context, platform string, limit int) ([]Draft, error)
	// Unread returns the unread places of platform's chats (MarkUnread), oldest first (ties by
	// chat id), at most limit (DefaultUnreadLimit when limit <= 0).
	Unread(ctx context.Context, platform string, limit int) ([]Unread, error)
	// Claim makes owner the owner of a session key: in a transaction of its own it raises the
	// key's epoch by one (the first claim gets 1) and returns it. From its return on, a group
	// with a Fence of the key and an older epoch fails with ErrFenced, and no such group
	// commits later: a claim waits for the commits in flight that passed their fence. So an
	// activation that claims and then loads its snapshot sees every write its predecessor
	// will ever make. Epochs come from the database, never from a clock, and a key's epoch
	// never goes back (claims are never deleted, not even by PruneSessions). at is recorded
	// as the claim's time. A store that keeps cluster membership (PostgreSQL) counts, in the
	// same transaction, the death of a member that held the key (Claimed.Counted).
	//
	// A claim with seen goes through only while the key's latest claim is still seen (its
	// epoch and owner; the zero ClaimSeen for a key never claimed): otherwise it changes
	// nothing and fails with ErrClaimChanged. A cluster member's activation asks the other
	// members to let go of the key against the claim it looked up; one that claimed the key
	// since is then not fenced by a second claim beside it. nil claims on no condition.
	Claim(ctx context.Context, key, owner string, at time.Time, seen *ClaimSeen) (Claimed, error)
	// Ownership returns the current claim of a key; ErrNotFound if it was never claimed.
	Ownership(ctx context.Context, key string) (*Ownership, error)
	// BeginRun records that a single daemon (the only writer of the store) starts run. When
	// the run before it never ended (no EndRun: the process was killed, ran out of memory or
	// hit a fatal runtime error), it counts that unclean stop in the same transaction: it adds
	// 1 to Attempts of the head pending message (the lowest seq with StatusPending, active,
	// of role user) of each routed session, the message that was running or next to run
	// there, and returns the run before; otherwise it returns nil. A head already counted
	// (Attempts 1 or more) counts only when MarkProbation marked it in the run that died: its
	// turn had started then, and it was not merely waiting (for an agent slot, or as a
	// suspect for its turn on probation). Cluster members, which
	// start and stop independently on one database, never call it.
	BeginRun(ctx context.Context, run string, at time.Time) (*UncleanStop, error)
	// EndRun records that run stopped cleanly. It changes nothing when another run began
	// since.
	EndRun(ctx context.Context, run string) error
	// Pardon clears the unclean stops counted against messages (BeginRun, Claim): in one
	// transaction it sets Attempts to 0 and clears the probation mark (MarkProbation) of every
	// active pending user message that has either, of the session key routes to, or of every
	// routed session when key is empty, and then forgets the last run too (as EndRun does),
	// whose unclean stop the next start would count again. Quarantined messages are left as they are (Requeue
	// runs one again). It is the operator's lever after stops that no message caused (the OOM
	// killer, kill -9, a power loss), which make suspects of the messages then in flight, or
	// merely next to run, and no daemon may run meanwhile: a session in memory keeps the count
	// it loaded.
	Pardon(ctx context.Context, key string) (Pardoned, error)
	// Ping checks that the store can be written.
	Ping(ctx context.Context) error
	// Close releases the store.
	Close() error
}
