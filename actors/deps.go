package actors

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// Queue modes.
const (
	ModeFollowup  = "followup"
	ModeCollect   = "collect"
	ModeInterrupt = "interrupt"
	ModeSteer     = "steer"
)

// Overflow policies: what a session does with a message that arrives when its queue is full.
const (
	OverflowSpool  = "spool"  // take it: it waits in the store, and runs later (the default; spill.go)
	OverflowReject = "reject" // refuse it with an explicit answer
)

// Recovery modes: what a daemon does at start with messages the last run left unanswered.
const (
	RecoveryRerun  = "rerun"  // run them again (the default)
	RecoveryNotice = "notice" // answer each with a notice asking the user to send it again
)

// SessionConfig is the part of the configuration that session actors read.
type SessionConfig struct {
	Keys           identity.KeyOptions
	PassivateAfter time.Duration
	QueueMode      string
	QueueCap       int
	// MaxInMemory bounds the sessions a manager keeps in memory (0: no bound): past it, the
	// least recently used idle session passivates to make room for a new one. The bound is
	// soft: with every session busy, a new one starts all the same (SessionManager.makeRoom).
	MaxInMemory int
	// Debounce merges rapid consecutive messages from one sender into one turn: a turn starts
	// only once its sender has been quiet this long (0: off).
	Debounce time.Duration
	// DebounceByPlatform overrides Debounce per platform.
	DebounceByPlatform map[string]time.Duration
	Overflow           string // OverflowSpool (also when empty) | OverflowReject
	HistoryLimit       int
	Recovery           string // rerun | notice
	// Restarts and RestartWindow bound how often a session may crash before it is stopped.
	Restarts      int
	RestartWindow time.Duration
	// ResetFor returns the reset policy of a platform and chat type (nil: never reset).
	ResetFor func(platform, chatType string) ResetPolicy
	// ResetPolicies are every distinct policy ResetFor can return (the timer scans for them).
	ResetPolicies []ResetPolicy
	// Prune configures the deletion of old ended sessions (off by default).
	Prune PrunePolicy
	// CancelWait bounds how long a session waits for the agent call of a turn it cancelled
	// (an interrupt, /stop, a boundary) to return before it starts its next turn anyway
	// (0: DefaultCancelWait).
	CancelWait time.Duration
}

// DefaultCancelWait is SessionConfig.CancelWait when it is zero: twice the exec agent's default
// kill grace, and a second, the longest its Run takes to return after a cancel.
const DefaultCancelWait = 11 * time.Second

// cancelWait is CancelWait, or its default.
func (c *SessionConfig) cancelWait() time.Duration {
	if c.CancelWait > 0 {
		return c.CancelWait
	}
	return DefaultCancelWait
}

// PrunePolicy says when ended sessions are deleted.
type PrunePolicy struct {
	Enabled bool
	After   time.Duration // sessions that ended longer ago than this
	Every   time.Duration
	// Batch is the most rows one prune step deletes (persistence.DefaultPruneRows when 0):
	// a pass asks for another step while one spends its budget.
	Batch int
}

// resetFor returns the policy of a session row.
func (c *SessionConfig) resetFor(platform, chatType string) ResetPolicy {
	if c.ResetFor == nil {
		return ResetPolicy{Mode: ResetNone}
	}
	return c.ResetFor(platform, chatType)
}

// Placement is the cluster's placement of session keys, as one member sees it.
type Placement interface {
	// Owner is the SessionManager of the member that owns key; nil when no member does.
	Owner(key string) *actor.PID
	// Peers are the SessionManagers of the other members.
	Peers() []*actor.PID
	// Self is this member's SessionManager as the other members reach it.
	Self() *actor.PID
	// Holders are, by key, the latest claims of keys in the store (Store.Claim): each with the
	// SessionManager of the live member that made it, which this member's view may not list
	// yet (one joined since this member's last renewal), and the claim itself (Holder.Seen),
	// the condition of this member's claim of the key. A key missing from the map has no
	// holder, and its activation claims it on no condition. It reads the store: the manager
	// calls it off the actor, once for all the lookups its activations queued meanwhile
	// (holderOf).
	Holders(ctx context.Context, keys []string) (map[string]Holder, error)
}

// Holder is a key's latest claim in the store as a lookup of it found it (Placement.Holders).
type Holder struct {
	// Manager is the SessionManager of the live member that made the claim; nil when there is
	// none (the key was never claimed, its member is gone, or the claim was no member's).
	Manager *actor.PID
	// Seen is the claim's epoch and owner (the zero ClaimSeen for a key never claimed): the
	// activation that looked it up claims the key only while it is still the key's latest
	// claim (Store.Claim's seen). nil when the lookup did not read it: no condition.
	Seen *persistence.ClaimSeen
}

// Asks is implemented by a Placement whose store carries asks to let go of a key and promises of
// its claim between members that cannot reach each other (cluster mode on PostgreSQL; see
// promise.go).
type Asks interface {
	// ExchangeAsks records that this member waits, for each of keys, for a holder the store
	// names and this member cannot reach (in place of the asks it recorded before), and returns
	// the asks of other live members, renewed within within, for keys whose latest claim is
	// this member's.
	ExchangeAsks(ctx context.Context, keys []string, within time.Duration) ([]Ask, error)
	// Promise hands this member's claim of ask.Key at ask.Epoch over to the asker, and reports
	// whether it did: false when the key's latest claim is no longer this member's at that
	// epoch, or while a live member of an older version (whose claims carry no condition) is
	// registered. The store names the asker as the key's holder from then on (Holders).
	Promise(ctx context.Context, ask Ask) (bool, error)
}

// Ask is another member's ask, through the store, that this member let go of a key (Asks).
type Ask struct {
	Key   string
	Epoch int64      // of the key's claim the store names this member the holder of
	Asker *actor.PID // the asking member's SessionManager
	Node  string     // the name the asker claims keys with (Deps.Node): the claim's new owner
}

// Deps are the shared, immutable dependencies of the session runtime. One value is built by the
// supervisor and read by every actor; nothing in it is mutated after start.
type Deps struct {
	// Ctx is the daemon's lifetime context; actors derive per-call timeouts from it.
	Ctx     context.Context
	Store   persistence.Store
	Persist *actor.PID
	Agent   agents.Agent
	// Platforms maps a platform name to the PID of its platform actor.
	Platforms map[string]*actor.PID
	// Editors names the platforms that implement platforms.Editor: their turns stream into a
	// draft that grows in place.
	Editors map[string]bool
	// DraftInterval is the least time between two edits of one turn's draft (DefaultDraftInterval
	// when zero).
	DraftInterval time.Duration
	Config        SessionConfig
	Log           *slog.Logger
	Metrics       *metrics.Metrics
	Now           func() time.Time
	Node          string
	// Run identifies this daemon run: drafts record it, so that a start removes only the
	// drafts earlier runs left unfinished (see drafts.go). Empty turns that removal off.
	Run string
	// Probation is the probation actor (NewProbation): a session asks it for the token before
	// it runs a suspect message (ProbationAfter), and marks it with Run. nil (or an empty Run)
	// turns probation off: cluster mode, where deaths are counted at claim time (Store.Claim)
	// and Store.BeginRun is never called.
	Probation *actor.PID
	// Dispatcher runs every actor's mailbox (nil: protoactor's default, a new goroutine per
	// mailbox run).
	Dispatcher actor.Dispatcher
	// Fencing makes every session activation claim its key in the store before it loads it,
	// and fence every write with the claim's epoch (persistence.Store.Claim): members that share
	// one store can then never interleave the writes of a key, whatever their routing does.
	// A fenced session stops, and what it was asked hands over to the key's next activation.
	Fencing bool
	// Clustered is set on the members of a cluster: sessions are reached through their cluster
	// grains (SessionGrain), and the manager recovers only the keys it is sent Recover for.
	Clustered bool
	// Placement is where the cluster places session keys (cluster mode; nil otherwise): the
	// manager asks the other members to let go of a key before it activates it (Release), and
	// hands what it no longer runs to the key's owner.
	Placement Placement
	// Relay hands a reply sent on a platforms.Watched platform to the same platform on the
	// other members of the cluster (RelayedOutbound); nil outside cluster mode.
	Relay func(platform string, out *platforms.Outbound)
	// Spooling is true while the persistence actor holds writes in the spool: the store does not
	// show them yet, so sessions stay in memory instead of passivating.
	Spooling atomic.Bool
	// Stopping is true once the daemon has begun to stop (Daemon.Stop): a turn whose agent a
	// stop signal ended then is cut short by the stop, not failed (agents.ErrStopSignal).
	Stopping atomic.Bool
	// Aborted is true once the daemon exits at once (Daemon.Abort, a second stop signal): it
	// killed the agents' commands itself, and says so; a turn they end is no service manager's
	// doing.
	Aborted atomic.Bool
	// AgentCalls counts the agent calls the turns have in flight: a stopping daemon waits for
	// them (AgentCalls.Wait), so that nothing an agent started outlives it.
	AgentCalls AgentCalls
	// AgentSlots bounds the agent calls that run at once (agent.max_concurrent); nil: no bound.
	AgentSlots *AgentSlots
	// Refusals are the persistence actor's (persistence.ActorOptions.Refusals): a session that
	// waits out a pause after the store refused its writes starts early when a message comes
	// for it and the store has taken writes since. May be nil.
	Refusals *persistence.Refusals
	// PersistIncarnation counts the persistence actor's restarts (its
	// persistence.ActorOptions.Incarnation): a session sends its unacknowledged writes again,
	// in order, once it has grown past the incarnation they were sent to.
	PersistIncarnation atomic.Uint64

	// realElapsed, when set, is the real time passed since a fixed point (elapsed); tests set
	// it to step Now apart from it.
	realElapsed func() time.Duration

	// loadWaits limits the line of sessions that wait for the database to load (waitToLoad):
	// in an outage every chat that writes starts one.
	loadWaits logging.Counter
	// loadResumes limits the line of waiting sessions that loaded once the database answered
	// again: at the end of an outage they all load within a second.
	loadResumes logging.Counter
	// inboundRefusals limits the line of messages whose write was refused in an outage (the
	// database and the spool both failing: a full disk): every message, and each retry of it,
	// would log one.
	inboundRefusals logging.Limiter
	// duplicateChecks limits the line of commands whose duplicate check could not read the
	// store (Session.storedBefore): in an outage a client resends its command, refused, again
	// and again, and each resend's check fails.
	duplicateChecks logging.Limiter
	// commandRefusals limits, by command, the line of a command whose write was refused in an
	// outage (Session.logRefusedCommand): its client
	// resends it, refused, again and again.
	commandRefusals logging.KeyedLimiter
	// queueFull limits the line of messages a full queue refused (overflow: reject): a chat
	// that floods logs one for each message.
	queueFull logging.Limiter
	// probationWaits limits the line of sessions whose suspect message begins to wait for
	// probation (Probation.logWaiting): after an unclean stop during a backlog, every chat's.
	// Here, not in Probation, so that a restart of Probation loses no count.
	probationWaits logging.Counter
	// recoveryNotices limits the line of sessions whose pending messages a start answers with a
	// notice (Session.logNoticed): after a backlog, every chat's.
	recoveryNotices logging.Limiter
	// turnFailures limits the line of failed turns (Session.logTurnFailed): an agent that fails
	// every turn (a broken command, a model endpoint down) logged one for each message.
	turnFailures logging.Limiter
	// spillReadFailures limits the line of sessions whose spilled messages cannot be read back
	// (refill): in an outage every session past its cap logs one a second.
	spillReadFailures logging.Limiter

	// The props every session and turn is spawned from, built once: props hold nothing per
	// actor (a session learns its key from its PID), so per-actor props would only cost memory.
	propsOnce                               sync.Once
	sessionProps, recoveredProps, turnProps *actor.Props
	// writeIDs numbers the writes of every session: an answer meant for a write of a session's
	// previous incarnation never matches a write of the current one.
	writeIDs atomic.Uint64
	// managerKept is what the session manager's incarnations share across its supervisor's
	// restarts (see managerKept).
	managerKept managerKept
	// lifelines holds the lifeline of each session that has crashed in its current activation,
	// by key: the one thing a session's incarnations share (see lifeline).
	lifelines sync.Map
	// claimsSeen holds, by key, the claim (a persistence.ClaimSeen) the session's activation
	// found as the key's latest before it asked the other members to let go of the key, and, once
	// the session has claimed the key, its own claim: the condition of the claim of its load
	// and of its incarnations' after a crash (Session.load). Set or cleared as the manager
	// starts the session (spawnWith).
	claimsSeen sync.Map
	// crashedOut holds the keys of the sessions that crashed past their restart budget, between
	// their supervisor's decision and their next incarnation's start, which then stops
	// (sessionSupervisor, Session.crashOut).
	crashedOut sync.Map
	// crashPanics holds, by a session's PID's id, what its last crash panicked with, between its
	// supervisor's decision and the failed incarnation's onRestarting, which logs the crash's
	// line with it (or, past the restart budget, hands it to the manager's line).
	crashPanics sync.Map
	// asides holds, by key, the work of setting stored messages aside (aside.go) that a
	// session's activation has not finished: the key's next activation or incarnation takes it
	// up if this one stops or crashes first (Session.resumeAside).
	asides sync.Map
	// resetsDue holds, by key, the automatic reset whose write the store refused (an
	// *overdue): the key's next activation or incarnation does it, at its due time, if it
	// loads the session the reset ends, not active since (Session.expireOnStart). A key this
	// member hands on to another takes it along (SessionManager.handOnFiledReset).
	resetsDue sync.Map
}

// props builds the shared props on first use.
func (d *Deps) props() {
	d.propsOnce.Do(func() {
		d.sessionProps = newSessionProps(d, false)
		d.recoveredProps = newSessionProps(d, true)
		d.turnProps = NewTurn(d.Ctx, d.Agent, &d.AgentCalls, d.AgentSlots, d.Metrics.Actor("turn"), d.Dispatcher)
	})
}

// Mailbox returns the props options of an actor of kind: an unbounded mailbox run by
// d.Dispatcher, and the kind's actor metrics (mailbox depth, handling time, starts and stops).
func (d *Deps) Mailbox(kind string) []actor.PropsOption {
	return mailbox(d.Metrics.Actor(kind), d.Dispatcher)
}

func mailbox(rec *metrics.Actor, dispatcher actor.Dispatcher) []actor.PropsOption {
	return dispatchedBy(dispatcher, actor.WithMailbox(actor.Unbounded(rec.Box)), actor.WithReceiverMiddleware(measured(rec)))
}

// measured is the receiver middleware behind agentgate_actor_*: it times every message an actor
// handles and counts its starts and stops. A message the actor panics on is not timed; its
// failure shows as a restart.
func measured(rec *metrics.Actor) actor.ReceiverMiddleware {
	return func(next actor.ReceiverFunc) actor.ReceiverFunc {
		return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
			switch env.Message.(type) {
			case *actor.Started:
				rec.Started()
			case *actor.Stopped:
				rec.Stopped()
			}
			start := time.Now()
			next(c, env)
			rec.Handled(time.Since(start))
		}
	}
}

// dispatchedBy returns opts with dispatcher, when there is one.
func dispatchedBy(dispatcher actor.Dispatcher, opts ...actor.PropsOption) []actor.PropsOption {
	if dispatcher != nil {
		opts = append(opts, actor.WithDispatcher(dispatcher))
	}
	return opts
}

func (d *Deps) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}

// processStart is the fixed point elapsed counts from; its monotonic reading is what counts.
var processStart = time.Now()

// elapsed is the real time passed since a fixed point of this process: the monotonic clock,
// which a step of the wall clock (NTP, an operator's date -s, a VM resumed) does not move. It
// tells such a step from time passing (Timers.prune). With an injected clock (Now) it is that
// clock, whose moves are time passing for the tests that make them.
func (d *Deps) elapsed() time.Duration {
	switch {
	case d.realElapsed != nil:
		return d.realElapsed()
	case d.Now != nil:
		return time.Duration(d.Now().UnixNano())
	}
	return time.Since(processStart)
}

// newID returns prefix followed by 16 random hex digits. The digits come from math/rand/v2's
// runtime source (ChaCha8, seeded by the OS): an id names a turn, it guards nothing, and
// crypto/rand's getrandom call was ~3 % of the daemon's CPU at its write ceiling.
func newID(prefix string) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], mrand.Uint64())
	return prefix + hex.EncodeToString(b[:])
}

// newSessionID returns a session id: local start time and 8 random hex digits.
func newSessionID(now time.Time) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return now.Format("20060102_150405_") + hex.EncodeToString(b[:])
}

// flushLines reports what the sessions' limited lines hold back (logging.Limiter.Flush): the
// manager calls it as it stops, its sessions stopped.
func (d *Deps) flushLines() {
	logging.FlushAll(&d.inboundRefusals, &d.duplicateChecks, &d.queueFull, &d.recoveryNotices, &d.turnFailures, &d.spillReadFailures)
}
