package actors

import (
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// In-process messages, grouped by the actor that receives them. Messages that cross the session
// boundary are the protobuf types of messages.proto.

// Received by SessionManager.

// Routed carries a session message to the session actor of Key, spawning it if needed. The
// manager forwards Msg with the original sender, so a reply goes straight to the requester.
type Routed struct {
	Key string
	Msg any
	// Grain is the cluster grain that routed Msg here (cluster mode; see SessionGrain): the
	// manager stops it when the session stops, and stops the session when it stops.
	Grain *actor.PID
}

// moved tells a session that the cluster placed its key on another member: it hands over.
type moved struct{}

// grainStopped tells the manager that the grain of key stopped: the cluster moved the key to
// another member, or the member leaves.
type grainStopped struct {
	key   string
	grain *actor.PID
}

// Drain asks the manager to answer *Drained once no session runs a turn (and, after Leave,
// once every session that hands its key on has stopped and what it handed back is forwarded).
type Drain struct{}

// Leave tells the manager that its member leaves the cluster (Daemon.Stop, before Drain). The
// member stays the owner of its keys (its membership row says it is leaving) until its drain
// ends, so that no other member claims a key of which it still runs a turn. Meanwhile its
// sessions start no turn: one with no turn running hands its key on at once, one with a turn
// running once the turn's result is stored and sent. The manager starts no session: what it
// is asked for a key without one goes to Successor(key), the manager of the member that takes
// the key over (Forward), and so does what a stopped session handed back, or a Recover when it
// left messages queued. So nothing waits for the drain but the messages that arrive for a key
// whose turn still runs here: they are stored and acknowledged (queued), and run at the
// successor once that turn is done.
type Leave struct {
	// Successor returns the manager of the member that takes key over; nil when none does
	// (every other member leaves too), and the manager then runs the key itself.
	Successor func(key string) *actor.PID
}

// Drained answers Drain.
type Drained struct{}

// ListActive asks the manager for the keys of the session actors in memory; reply *ActiveList.
type ListActive struct{}

// ActiveList answers ListActive: the keys of the sessions in memory, and (sorted) those of them
// with work in hand (a running turn or a write not yet acknowledged: what a drain waits for);
// while the member leaves, also (sorted) those whose sessions have yet to hand their keys on or
// stop, whose filed reset the key's next owner has yet to take, or whose sessions a restart of
// the manager stopped and that it has yet to hand on, which a leaving member's drain waits for
// too.
type ActiveList struct{ Keys, Busy, HandingOn []string }

// passivate is sent by an idle session to ask its manager to stop it. From then on the session
// hands every request for work to the manager, which holds them for the key's next activation:
// a stopping session is never left with work.
type passivate struct {
	key    string
	pid    *actor.PID // the session asking: a late request of a stopped one leaves its successor alone
	fenced bool       // another activation claimed the key (Deps.Fencing)
	rerun  bool       // the key is activated again once the session is gone (its state was stale)
	pause  bool       // ... after a pause: the store refused the session's write as unavailable
	why    string     // with pause: which write was refused (Session.restartFromStoreAt)
	err    error      // with pause: the refusal
	// crashed: the session crashed past its restart budget (Session.crashOut); the key starts
	// again after crashPause, or at once with the requests it handed back.
	crashed bool
	panic   string // with crashed: what its last crash panicked with, for the manager's line
	// room: it stops to make room (roomCheck), not for idleness; its key keeps its backoffs
	// for a while (SessionManager.keepBackoffs).
	room bool
}

// busyChanged is sent by a session when it starts running turns or becomes idle.
type busyChanged struct {
	key  string
	busy bool
}

// roomDeclined tells the manager that the session of key (pid) did not passivate when asked to
// make room (roomCheck): it has something in hand its busy state does not show (a set-aside, a
// held result, a load that waits for the store). The manager counts it in memory again.
type roomDeclined struct {
	key string
	pid *actor.PID
}

// Received by Session.

// leaving tells a session that its member leaves the cluster (Leave): it starts no turn, and
// hands its key on once no turn of it runs and no write of it is in flight.
type leaving struct{}

// draining tells a busy session that the daemon drains (Drain): a turn result it holds for the
// store is written again at once, not at the end of its backoff (drainingNow).
type draining struct{}

// idleCheck asks a session to passivate if it has been idle for PassivateAfter (from the
// manager's idle sweep), or, with makeRoom, if it has nothing in hand however recently it was
// used (from the manager, to keep the sessions in memory within MaxInMemory: makeRoom).
type idleCheck struct{ makeRoom bool }

// sweepCheck is the one idleCheck every sweep sends; roomCheck, the one makeRoom sends.
var (
	sweepCheck = &idleCheck{}
	roomCheck  = &idleCheck{makeRoom: true}
)

// TurnFinished is sent by a Turn to its session when the agent returned.
type TurnFinished struct {
	TurnID string
	Text   string
	Err    error
	Took   time.Duration
	// Steered is how many steered messages the agent received before it answered; later ones
	// arrived too late and run in the next turn.
	Steered int
	// Usage is what the turn cost in model tokens (also when it failed, if the agent knows).
	Usage agents.Usage // RidersLeftOut is the agent's agents.Response.RidersLeftOut: the answer left out the
	// unanswered user messages before the turn's, which the session archives.
	RidersLeftOut bool
}

// turnPanicked is sent by a Turn whose agent panicked; the session re-raises it (G5).
type turnPanicked struct {
	TurnID string
	Err    error
	Stack  []byte // where it panicked, logged at Debug by the session
}

// slotTaken is sent by a Turn whose head was struck once (turnRun.marks) when its agent call
// has its slot: the session marks the head with this run, then lets the agent start
// (startAgent).
type slotTaken struct{ TurnID string }

// probationGranted gives a session the probation token it asked for (askProbation id): its
// suspect message may run.
type probationGranted struct{ id string }

// probationLost tells a session that Probation restarted and forgot its request id: it asks
// again.
type probationLost struct{ id string }

// Received by Probation.

// askProbation asks for the probation token for a session's suspect message (the key, the
// message id and its strikes are for the logs). The answer is a probationGranted with the same
// id.
type askProbation struct {
	id      string
	session *actor.PID
	key     string
	message string
	strikes string // as against QuarantineAfter: "2/3"
}

// endProbation gives the token of request id back, or withdraws the request if it waits.
// Unknown ids are ignored.
type endProbation struct{ id string }

// Received by Turn.

// runTurn is a turn's first message, from its session: the request to run, and the session to
// report to.
type runTurn struct {
	req     *agents.Request
	session *actor.PID
	// steer: messages may be steered into the turn (queue mode steer, an agent that can take
	// them). Only then does an exec agent's stdin stay open while the command runs: in the
	// other modes it closes after the request, as for an agent that cannot steer, and a
	// command that reads stdin to its end is not left waiting until its timeout.
	steer bool
	// mark: once the call has its agent slot, the turn tells its session (slotTaken) and
	// starts the agent only on startAgent, when the session's mark of its head is durable.
	mark bool
}

// startAgent tells a turn that waits with its agent slot (runTurn.mark) that its head's mark
// is durable: the agent starts.
type startAgent struct{}

// agentDone carries the agent's result from the turn's goroutine back into the actor.
type agentDone struct {
	resp    *agents.Response
	err     error
	took    time.Duration
	steered int // steered messages the agent received
}

// steerIn delivers a message into the running turn (queue mode steer).
type steerIn struct{ msg agents.Message }

// agentPanicked carries a panic of the agent back into the actor, which hands it to the session.
type agentPanicked struct {
	value any
	stack []byte // the agent's goroutine's, logged at Debug by its session
}

// cancelRun asks a turn to cancel its agent's call and to tell its session (callEnded) once
// the call has returned; the turn then stops itself (Session.cancelAwaited).
type cancelRun struct{}

// callEnded tells a session that the agent call of a turn it cancelled has returned: the
// cancelled command has exited, so the next turn may start (Session.cancelAwaited).
type callEnded struct{ TurnID string }

// cancelOverdue bounds a session's wait for a callEnded (SessionConfig.CancelWait).
type cancelOverdue struct{ TurnID string }

// Received by Platform.

// StartIntake tells a platform actor to start its platform's Run loop with Deliver, and to hand
// a platforms.Withdrawer Withdraw and WithdrawStored first.
type StartIntake struct {
	Deliver        platforms.Deliver
	Withdraw       platforms.Withdraw
	WithdrawStored platforms.WithdrawStored
}

// Quiesce asks a platform actor to answer *Quiesced once it has no send in flight and no
// delivery mark unwritten: of Key's session, or of any when Key is empty. One with an empty Key
// comes as the daemon stops: the draft posts that wait for a retry are tried at once first, and
// a draft post that fails meanwhile is tried again at once (a few times), not after a backoff.
type Quiesce struct{ Key string }

// Quiesced answers Quiesce.
type Quiesced struct{}

// SendOutbound asks a platform actor to send one recorded outbound message. Again marks a
// reply that a loading session found unconfirmed in the store and hands over again: the
// platform actor may still hold it (queued, or sent with its mark not yet written). Attempts
// are the delivery attempts the store counts for it (persistence.OutboxEntry.Attempts, as it
// was loaded; 0 for a new entry): the platform actor numbers its tries on from there
// (persistence.MarkDelivery.Attempt).
type SendOutbound struct {
	Out      *platforms.Outbound
	Again    bool
	Attempts int
}

// sendDone is the result of one platforms.Platform.Send, from the sending goroutine.
type sendDone struct {
	out *platforms.Outbound
	err error
}

// DraftText is the whole reply of a running turn so far, sent by the turn's Request.Partial
// (from the agent's goroutine) when the platform is a platforms.Editor. The platform actor
// posts it as a draft, then edits the draft as the text grows (throttled); the turn's final
// outbound finishes the draft.
type DraftText struct {
	SessionKey string
	TurnID     string
	Target     identity.Source
	InReplyTo  []string
	Text       string
}

// DropDraft tells the platform actor that a turn was cancelled: its draft is marked as
// interrupted and is never finished with a reply.
type DropDraft struct {
	SessionKey string
	TurnID     string
}

// FinishDraft tells the platform actor that a turn has ended and its final outbound follows
// once stored: its draft waits for it, though the key's next turn may stream meanwhile.
type FinishDraft struct {
	SessionKey string
	TurnID     string
}

// draftDone is the result of one SendDraft or EditDraft, from the sending goroutine.
type draftDone struct {
	key  string
	turn string
	id   string // the new draft's id (SendDraft)
	text string // the text the platform now shows
	err  error
}

// draftTick wakes the platform actor when a throttled draft edit may go out.
type draftTick struct{ turn string }

// finishOverdue ends the wait of a finished turn's draft for the turn's final outbound
// (finishWait), unless a later FinishDraft began it anew.
type finishOverdue struct {
	turn   string
	finish int // the FinishDraft whose wait this ends (draft.finishes)
}

// sourceToProto converts an identity.Source to its wire form.
func sourceToProto(s identity.Source) *Source {
	return &Source{
		Platform: s.Platform, ChatType: s.ChatType, ChatId: s.ChatID, ThreadId: s.ThreadID,
		ProspectiveThreadId: s.ProspectiveThreadID, UserId: s.UserID, UserName: s.UserName,
		ScopeId: s.ScopeID, Profile: s.Profile,
	}
}

// sourceFromProto converts a wire Source to an identity.Source.
func sourceFromProto(s *Source) identity.Source {
	if s == nil {
		return identity.Source{}
	}
	return identity.Source{
		Platform: s.Platform, ChatType: s.ChatType, ChatID: s.ChatId, ThreadID: s.ThreadId,
		ProspectiveThreadID: s.ProspectiveThreadId, UserID: s.UserId, UserName: s.UserName,
		ScopeID: s.ScopeId, Profile: s.Profile,
	}
}

var _ = actor.PID{}

// RelayOf is the RelayedOutbound of out (see Deps.Relay).
func RelayOf(out *platforms.Outbound) *RelayedOutbound {
	return &RelayedOutbound{SessionKey: out.SessionKey, SessionId: out.SessionID, Seq: out.Seq, Kind: out.Kind,
		Text: out.Text, TurnId: out.TurnID, InReplyTo: out.InReplyTo, Target: sourceToProto(out.Target),
		TurnEnd: out.TurnEnd, CreatedAtUnixNano: out.CreatedAt.UnixNano()}
}

func outboundFromRelay(m *RelayedOutbound) *platforms.Outbound {
	return &platforms.Outbound{SessionKey: m.SessionKey, SessionID: m.SessionId, Seq: m.Seq, Kind: m.Kind,
		Text: m.Text, TurnID: m.TurnId, InReplyTo: m.InReplyTo, Target: sourceFromProto(m.Target),
		TurnEnd: m.TurnEnd, CreatedAt: time.Unix(0, m.CreatedAtUnixNano)}
}
