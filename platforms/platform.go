// Package platforms is the neutral contract between agentgate and the chat platforms it serves:
// the Platform interface, the Inbound message a platform hands in, the Ack it gets back and the
// Outbound reply it is asked to send. Adapters live in sub-packages (http, discord); the runtime
// that drives them lives in actors and supervisor.
//
// This package must not import actors, supervisor or any adapter (persistence, which imports
// none of them, it may: a Recorder writes its ops).
package platforms

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
)

// Inbound is one message a platform received from a user.
type Inbound struct {
	Source     identity.Source
	MessageID  string // the platform's id; dedupe is by (platform, chat, message id)
	Text       string
	ReceivedAt time.Time
	// StrictID is set by a platform whose clients choose their message ids (HTTP): a message
	// with an id its chat holds already for another message (another sender's, or another
	// text) is refused with ErrReused, not taken as a re-delivery of it. A platform's own ids
	// (Discord's) are never reused, and its re-delivery of a message edited since is that
	// message still: it leaves StrictID unset.
	StrictID bool
}

// Dispositions say what happened to an inbound message (DESIGN §5, G4).
const (
	Started     = "started"
	Queued      = "queued"
	Collected   = "collected"
	Steered     = "steered"
	Interrupted = "interrupted"
	Rejected    = "rejected"
	Duplicate   = "duplicate"
	Command     = "command"
	Spooled     = "spooled"
)

// Ack is the runtime's answer to an Inbound: it is returned only once the message is durable
// (or rejected), and says exactly what happened to it.
type Ack struct {
	SessionKey  string
	SessionID   string
	MessageID   string
	Disposition string
	QueueDepth  int
	// OutboxAfter is the key's outbox seq before the message was taken: every outbound that
	// answers it has a greater Seq. 0 when not known (a duplicate).
	OutboxAfter int64
}

// Deliver hands one inbound message to the runtime and returns its acknowledgment. It blocks
// until the message is durable or refused; an error means nothing was accepted.
type Deliver func(ctx context.Context, in *Inbound) (*Ack, error)

// Withdraw takes back message id, delivered earlier with src, which its sender deleted on the
// platform: a message still waiting for its turn never runs, and its row is archived; one whose
// turn has begun is left as it is. It reports whether the message was taken back.
type Withdraw func(ctx context.Context, src identity.Source, id string) (bool, error)

// WithdrawStored takes back the messages ids, posted in chat chatID of platform (in its thread
// threadID; "" for those posted in the chat itself), which their senders deleted on the platform
// (one, or a moderator's purge) and whose Sources the platform does not know: it did not deliver
// them itself (another process did, before a restart, or another cluster member that held the
// platform's connection then). The runtime finds the messages in the store, by the index of
// inbound ids, all in one read, and asks the session that holds each, by the session's own key,
// as Withdraw does; only if that session is the thread's (for a message posted in the chat
// itself, the chat's or the thread opened from the message): the store's index names the chat,
// and a thread's chat is its parent, shared with its sibling threads. It returns the outcome of
// each id, in the order of ids. Messages the store does not hold, or holds answered, cost that
// one read together.
type WithdrawStored func(ctx context.Context, platform, chatID, threadID string, ids []string) []StoredWithdrawal

// StoredWithdrawal is the outcome of WithdrawStored for message ID: whether it was taken back
// and, if so, the Source of its session (UserID and UserName the message's sender's). With an
// error, Source is zero when the store could not tell whether it holds the message (its read
// failed: it may be chatter the platform never delivered), and names the message's chat when it
// holds it waiting (it is answered).
type StoredWithdrawal struct {
	ID     string
	Source identity.Source
	Taken  bool
	Err    error
}

// Outbound kinds.
const (
	KindReply  = "reply"  // what the agent said
	KindNotice = "notice" // what agentgate itself tells the user
)

// Outbound is one reply or notice to deliver to a chat. It is already in the durable outbox
// when Send is called; Seq is its outbox sequence number within the session key.
type Outbound struct {
	SessionKey string
	SessionID  string
	Seq        int64
	Kind       string
	Text       string
	TurnID     string
	InReplyTo  []string // platform message ids this answers
	Target     identity.Source
	// TurnEnd is set on the last outbound of a turn or command, so a platform can tell a
	// waiting caller that everything for those messages has been said.
	TurnEnd   bool
	CreatedAt time.Time
	// DraftID, set only for an Editor, is the id of the draft this reply finishes (see Editor).
	DraftID string
	// Again says the runtime sends this outbound again, and an earlier send, by another process
	// or at any time before, may have posted it: the outbox showed it unconfirmed when its
	// session loaded (a restart, a cluster hand-over, a session started again from the store).
	// A platform that cannot tell a repeated post from a new one after a while (Discord's nonce
	// holds a few minutes) looks for the earlier post first. Without it, any earlier send of the
	// outbound was this process's, through the same platform value.
	Again bool
}

// Platform is one chat platform adapter.
type Platform interface {
	// Name is the platform's identifier in session keys and metrics ("http", "discord").
	Name() string
	// Run connects and feeds inbound messages to deliver until ctx ends. It returns nil when
	// ctx ended, or an error after which the platform supervisor restarts it with backoff.
	Run(ctx context.Context, deliver Deliver) error
	// Send delivers one outbound message. A nil error confirms delivery. An error wrapping
	// ErrUndeliverable says the platform refused it for good; any other is retried until it
	// succeeds.
	Send(ctx context.Context, out *Outbound) error
}

// Watched is implemented by a platform whose clients wait for replies on the agentgate process
// they are connected to (HTTP's ?wait and event streams). In cluster mode a session runs on the
// member that owns its key, so a reply sent there is also shown on every other member: Show
// hands it to that member's waiting clients. It sends nothing out of the process, must not
// block, and must tolerate a reply it has shown already.
type Watched interface {
	Show(out *Outbound)
}

// Checker is implemented by a platform that knows whether it is connected (a gateway session,
// say); /readyz reports its answer. A platform without it is ready while its Run is running.
type Checker interface {
	Ready(ctx context.Context) error
}

// Editor is implemented by a platform that can edit a message it has sent, so a streaming
// agent's reply grows in place (Discord). The runtime posts a draft with the first partial text,
// edits it as the text grows, and then sends the final reply as an Outbound whose DraftID names
// the draft: Send then edits the draft into the final text (posting any overflow as further
// messages) instead of posting anew. The runtime records each draft until its turn finishes
// it; a draft a crashed run left behind is removed at the next start (DeleteDraft), and its
// message runs again and answers anew.
type Editor interface {
	// SendDraft posts text into target's chat, answering inReplyTo, and returns the platform's
	// id of the new message. key names the draft: a SendDraft with the same key, after one that
	// failed, returns the message the first one posted when the platform can tell (its answer
	// may be lost after the post), edited to show text. When it finds that message but cannot
	// make it show text, it returns the message's id with the error: the draft is made.
	SendDraft(ctx context.Context, target identity.Source, inReplyTo []string, key, text string) (id string, err error)
	// EditDraft replaces the text of the draft id in target's chat.
	EditDraft(ctx context.Context, target identity.Source, id, text string) error
	// DeleteDraft removes the draft id from target's chat. A draft that is already gone is not
	// an error.
	DeleteDraft(ctx context.Context, target identity.Source, id string) error
}

// Recorder is implemented by a platform that keeps records of its own in the store (Discord's
// unread places, persistence.Unread). Before its Run starts, the runtime hands it record, which
// queues ops to be written through the persistence actor, in order after the ops queued before
// them, with the platform's delivery marks. record never blocks; a write the store refuses as
// unavailable is tried again, one refused otherwise is logged and dropped.
type Recorder interface {
	SetRecord(record func(ops ...persistence.Op))
}

// Withdrawer is implemented by a platform that learns when its users delete their messages
// (Discord's MESSAGE_DELETE). Before its Run starts, the runtime hands it withdraw, which it
// calls with the Source and id a deleted message was delivered with, and stored, which it calls
// with the chat and id of a deleted message it may not have delivered itself.
type Withdrawer interface {
	SetWithdraw(withdraw Withdraw, stored WithdrawStored)
}

// InboundWaiter is implemented by a platform whose Run, when it returns with an error, may
// leave inbound messages still to be handed to deliver (Discord: a lost connection returns at
// once, while the messages its gateway reader queued are handed on behind a delivery the
// runtime has not answered). A Run that ctx ends waits for them before it returns. When the
// daemon stops while Run is not running (the platform actor waits to run it again after a
// failure; a cluster member waits for the gateway lease), the runtime calls WaitInbound
// instead, once Run's ctx has ended and before the platform's actor stops: it returns when
// each of them has met the stop as in Run (delivered, left for the next start, or its sender
// told), or when ctx ends.
type InboundWaiter interface {
	WaitInbound(ctx context.Context)
}

// ErrLetGo is the cause (context.Cause) of a Run ctx that ends because the process lets the
// platform's connection go while the daemon goes on: a cluster member whose gateway connection
// was lost, or whose lease on it went with its database connection, gives the lease back for
// another member to take. Run closes the connection and returns as after a lost connection;
// what it received is still handed to deliver, with a ctx that a stop ends (WaitInbound), not
// left as a stop leaves it for the next start's read-back: the member may take the connection
// again and resume it, and a resume reads nothing back. Another member's read-back of the same
// message is a duplicate of it (the store's message ids). What a resume's replay held when the
// connection went (Discord) waits for the member's next Run a while first (30 s of its wait
// for the gateway), as it waits after a lost connection outside a cluster: that Run's resume
// replays the deletions and edits that came after it.
var ErrLetGo = errors.New("platforms: the connection is let go; the daemon does not stop")

// InterruptedMark ends the text of a draft whose turn was cancelled or crashed (EditDraft). An
// adapter that cuts a draft too long for one message keeps it.
const InterruptedMark = "\n\n⏹ (interrupted)"

// Errors a Deliver may return, so adapters can map them to their own answers.
var (
	// ErrDraining means the daemon is stopping and takes no new messages.
	ErrDraining = errors.New("platforms: draining, not accepting messages")
	// ErrUnavailable means the message was not taken for now, and sending it again later may
	// succeed: it could not be made durable (database and spool failed), its session did not
	// answer in time, or the cluster member holding its session runs an older agentgate
	// (OutdatedMemberError, which wraps it).
	ErrUnavailable = errors.New("platforms: message could not be stored")
	// ErrRejected means the session's queue is full and its overflow policy is reject.
	ErrRejected = errors.New("platforms: queue full")
	// ErrConflict means the message's id is already another conversation's in its chat.
	ErrConflict = errors.New("platforms: message id already used in this chat")
	// ErrReused means the message's id is already another message's in its conversation: by
	// another sender, or with another text (Inbound.StrictID). Nothing was stored.
	ErrReused = errors.New("platforms: message id already used in this chat for another message")
)

// OutdatedMemberError is the error of a request that the cluster member holding its session
// did not know: that member runs an older agentgate (a rolling upgrade is under way), which
// answered that it does not know the request (actors.Unsupported). Nothing was done; it can be
// done once that member is upgraded. The HTTP API answers it 503 member_outdated, Discord with a
// notice to send the message again in a few minutes. It wraps ErrUnavailable: it ends when the
// rolling upgrade does, so a caller that tells its sender to try again later on ErrUnavailable
// does so for it too (TestOutdatedMemberErrorIsUnavailable).
type OutdatedMemberError struct {
	Address string // the member's cluster address
	Node    string // its node name
	Version string // its build (agentgate version)
	Request string // what it did not know ("Forward field 11")
}

// Error says which member did not know the request, and what to do.
func (e *OutdatedMemberError) Error() string {
	return fmt.Sprintf("the cluster member that holds the session (%s, node %s) runs an older agentgate (%s), which does not know this request (%s): nothing was done; upgrade it (finish the rolling upgrade) and try again",
		e.Address, e.Node, e.Version, e.Request)
}

// Unwrap returns ErrUnavailable: the request may be sent again once the member is upgraded.
func (e *OutdatedMemberError) Unwrap() error { return ErrUnavailable }

// ErrUndeliverable is wrapped by a Send error when the platform refused the message for good:
// the chat is gone, the bot may not post there, the user does not take messages from it.
// Sending it again cannot help; the outbox records it as failed.
var ErrUndeliverable = errors.New("platforms: undeliverable")

// ErrDeleted is wrapped by a Send error, with ErrUndeliverable, when the message sent could not
// be placed because where it was to go was deleted meanwhile (Discord: its channel or thread,
// or the message its auto-thread was to open from), not because the bot may not post there. It
// is recorded as failed like any undeliverable message, but logged at Info: there is nothing
// for the operator to fix.
var ErrDeleted = errors.New("platforms: where it was to go was deleted")
