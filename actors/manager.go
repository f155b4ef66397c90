package actors

import (
	"container/list"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"
)

// SessionManager routes messages to session actors by key, spawning a session on its first
// message and stopping it when it passivates. It supervises its sessions one for one with a
// restart budget; a session that keeps crashing is stopped, and started again from the store
// crashPause later (or at its next message), so the messages it still holds are run (or
// quarantined: each start counts their crashes anew) without waiting for the chat's next one.
//
// While a passivating session stops, messages for its key are held here and handed to its
// successor, so two actors never run for one key.
type SessionManager struct {
	d   *Deps
	log *slog.Logger

	sessions map[string]*actor.PID
	stopping map[string][]routed // key → messages held until the old actor is gone
	handed   map[string]int      // key → how many of those its stopping session handed back (they come first)
	// crashStops counts, per key, the times its supervisor stopped the session for crashing
	// since it last passivated for idleness (the pause before it starts again grows with it;
	// one passivated to make room keeps it for a while: keptBackoffs).
	crashStops map[string]int
	crashed    map[string]string // key → its stopping session crashed past its budget (passivate.crashed): with what it panicked
	rerun      map[string]bool   // key → activate again once its stopping session is gone (passivate.rerun)
	// refused counts, per key, the restarts from the store since it last passivated for
	// idleness that the store caused by refusing a write as unavailable (passivate.pause; the
	// pause before the next activation grows with it); paused holds the keys whose next
	// activation waits, with the refusal its line says.
	refused map[string]int
	paused  map[string]*refusal
	// waitingOut holds the keys whose next activation waits out such a pause (startSuccessor),
	// with the time it began: a message for one is answered unavailable at once rather than
	// held, unless the store has taken writes since (see route).
	waitingOut map[string]pause
	// startedEarly holds the keys whose session last started before its pause was over: if
	// the store refuses its writes again, its next pause is waited out (see pause.early).
	startedEarly map[string]bool
	// keptBackoffs orders the keys whose session passivated to make room while they had a
	// backoff (crashStops, refused, startedEarly), with the time each left memory, the longest
	// gone at the back; keptAt finds a key's element. See keepBackoffs.
	keptBackoffs *list.List
	keptAt       map[string]*list.Element
	stopKept     scheduler.CancelFunc // the armed keptCheck, while backoffs are kept
	keptChecks   uint64               // numbers the keptChecks armed (keptCheck.n)
	pauses       uint64               // numbers the pauses (pause.n)
	stopPauses   scheduler.CancelFunc // the armed pauseCheck, while keys wait out a pause
	pauseChecks  uint64               // numbers the pauseChecks armed (pauseCheck.n)
	busy         map[string]bool
	// loading holds the keys whose session this manager started while its member leaves, until
	// the session has loaded (and begun the turn of its pending work, if any: busy): a leaving
	// member's drain waits for them (answerDrains, probeLoad).
	loading map[string]bool
	// kept is what this manager's incarnations share (Deps.managerKept): the member's leave and
	// the drains asked.
	kept *managerKept
	// grains are the cluster grains of the sessions in memory, by key (cluster mode).
	grains map[string]*actor.PID
	// stoppedGrains are the grains the manager stopped, by key, until they report their stop:
	// a message such a grain still hands on is no sign of the key's live grain (ownGrain).
	stoppedGrains map[string][]*actor.PID

	stopSweep scheduler.CancelFunc // the armed idle sweep; nil without passivation
	// idle orders the keys of the sessions in memory with nothing in hand, the least recently
	// used at the back, for the bound on the sessions in memory (makeRoom); idleAt finds a
	// key's element, so that keeping the order costs O(1). evicting holds the keys asked to
	// make room that have not stopped or changed their busy state since.
	idle      *list.List
	idleAt    map[string]*list.Element
	evicting  map[string]bool
	overBound logging.Limiter // the line of a bound exceeded with every session busy
	// refusedLines limits, by key, the line of a session paused after the store refused its
	// write (passivated): in an outage a client resends its message, refused again, and each
	// resend paused the session and logged it at WARN.
	refusedLines logging.KeyedLimiter
	timers       *scheduler.TimerScheduler
	closing      bool // the manager stops or restarts
	// leavers holds the keys of the sessions told that the member leaves (onLeave) that have not
	// yet asked to stop: a leaving member's drain waits for them to hand their keys on
	// (answerDrains). A session started since, for a key no member takes over, runs here as in
	// a single daemon, and is not waited for.
	leavers map[string]bool
	quieted map[string]bool // keys whose platform confirmed the stopped session's sends (startSuccessor)
	// activating are the keys whose session waits for the other members to let go of them;
	// waiters, the managers of other members waiting for this one to let go of a key (Release).
	activating map[string]*activation
	waiters    map[string][]waiter
	// strangers are the managers of members this one's view does not list that asked it to let
	// go of a key while it held nothing of it, by key (onRelease): this member's own activation
	// of the key asks them too (activate). prunedStrangers is when those older than strangerFor
	// were last dropped.
	strangers       map[string][]waiter
	prunedStrangers time.Time
	// activations numbers the activations that ask the other members to let go (Release), on
	// from a random start (NewSessionManager).
	activations uint64
	// listFails counts the failed listings of the recoverable keys since the last one that
	// worked: only the first and then one a minute are logged.
	listFails int
	// firstLookups and againLookups are the lanes of lookups of keys' holders in the store
	// (holderOf): an activation's own, and those its wait for a member asks again. lookupsDue
	// is set while a timer waits to send the next batch of the second. batchesTo counts the
	// batches of lookups asked again begun so far, holderBatchGap each, on from the time each
	// began or the count of the one before ended, whichever is later: such a batch begins at
	// once while batchesTo is less than holderBatchBurst-1 gaps ahead of now.
	firstLookups, againLookups lookupLane
	lookupsDue                 bool
	batchesTo                  time.Time
	// holderFails limits the line of an activation whose lookup of the key's holder failed
	// (lookUpHolder).
	holderFails logging.Limiter
	// unreachableHolders limit, by the PID of the member's manager, the line of an activation
	// that waits for a member it cannot reach, which the store names as the key's holder
	// (stillHolds); it forgets a member not waited for since (KeyedForget).
	unreachableHolders logging.KeyedLimiter
	// leftRecovers limits the line of a Recover that reached the manager as it stopped and
	// could not be handed on (whileClosing).
	leftRecovers logging.Limiter
	// bouncedRecovers limits the line of a Recover that leaving members passed back to this
	// leaving one, and that it leaves to a member that stays (bouncedBack).
	bouncedRecovers logging.Limiter
	// handingOn holds the keys whose filed reset was handed on to another member and not yet
	// taken there, in flight or waiting to be sent again (handOnFiledReset); handOnRetries, the
	// cancels of the timers of those waiting to be sent again (sendFiledReset). resetHandOnFails
	// limits the line of one the other member did not take; resetHandOnsGivenUp, that of one
	// begun as the manager stops that was not taken (the stop's line counts the others:
	// giveUpHandOns).
	handingOn           map[string]bool
	handOnRetries       map[string]scheduler.CancelFunc
	resetHandOnFails    logging.Limiter
	resetHandOnsGivenUp logging.Limiter
	// unsupported limits the line of a forwarded request of a kind this version does not know
	// (answerUnsupported).
	unsupported logging.Limiter
	// afterRestart holds the keys whose filed reset a restarted manager hands on once the
	// members that waited for its incarnation before have asked again (handOnFiledResets).
	afterRestart map[string]bool
	// stopAsks ends the exchanges of asks with the store (promise.go), asksBusy is set while
	// one is in flight, and askFails and promiseFails limit the lines of the exchanges and the
	// writes of promises that failed.
	stopAsks     scheduler.CancelFunc
	asksBusy     bool
	askFails     logging.Limiter
	promiseFails logging.Limiter
}

// managerKept is what a SessionManager's incarnations share across its supervisor's restarts
// (Deps.managerKept), as a session's lifeline is for a session: the member's leave
// (Leave.Successor; nil while it does not leave) and the drains asked and not yet answered
// (Drain). A restart stops the sessions and starts a fresh manager; before, these lived in the
// manager's own fields, and one restarted while its member left no longer left (it activated
// keys here and ran their turns instead of handing them on to their successors) and never
// answered the daemon's drain, whose stop waited out its whole deadline
// (TestManagerRestartedWhileItsMemberLeavesGoesOnLeaving). Only the manager touches it, one
// incarnation at a time.
type managerKept struct {
	successor func(key string) *actor.PID
	drains    []*actor.PID
	// stopped holds the keys held here (a session in memory or stopping, an activation) when
	// the manager last restarted, until the agent calls its restart cancelled have returned and
	// the new incarnation has let them go on (holdStopped); stoppedN numbers those holds.
	stopped  map[string]bool
	stoppedN uint64
	// promised holds, by key, the member this one promised its claim of the key to through the
	// store (promise.go), until the store names another member or this one claims the key;
	// promising, the promises being written, by key, numbered by promises. A restart must not
	// lose them: an activation of the key would claim it beside the member promised.
	promised  map[string]*actor.PID
	promising map[string]uint64
	promises  uint64
}

// recoverAll asks the manager to list the keys with unfinished work and start their sessions
// (at start, and again after a failed listing).
type recoverAll struct{}

// restartCrashed asks the manager to start again a session its supervisor stopped.
type restartCrashed struct{ key string }

const (
	// recoverRetry is how long the manager waits to list the recoverable keys again when the
	// store could not; recoverListTimeout bounds one listing.
	recoverRetry       = 5 * time.Second
	recoverListTimeout = 5 * time.Second
	// crashPause is how long a session stopped for crashing too often stays stopped, the first
	// time; each time again doubles it, up to maxCrashPause, until the session passivates for
	// idleness (or, passivated to make room, stays out of memory for backoffKeptFor).
	crashPause    = 10 * time.Second
	maxCrashPause = 10 * time.Minute
	// refusedPause is how long a session the store refused a write of waits before it starts
	// again from the store, the first time; each time again doubles it, up to maxRefusedPause.
	refusedPause    = time.Second
	maxRefusedPause = time.Minute
)

// idleSweep is the manager's tick: it asks every session in memory to check its idle clock.
// One ticker for all sessions costs less than a timer per session, and a stopped session is
// never kept reachable by a pending timer of its own.
type idleSweep struct{}

// sweepEvery is how often the manager sweeps for sessions idle for passivateAfter: a session
// passivates between passivateAfter and 1.25 × passivateAfter after its last message.
func sweepEvery(passivateAfter time.Duration) time.Duration {
	return max(passivateAfter/4, 10*time.Millisecond)
}

type routed struct {
	msg    any
	sender *actor.PID
	hops   int32 // how many members forwarded it here (Forward)
	// toHolder: a member waiting to activate the key forwarded it here, to the key's holder
	// (Forward.to_holder).
	toHolder bool
}

// maxForwardHops bounds how often a message is forwarded from a leaving member to another
// (members that leave at once may each see the other as the successor for a moment): past it, a
// member that does not leave, or that knows no successor of the key, runs it, and one that
// leaves and knows one does not start the key for it (bouncedBack).
const maxForwardHops = 2

// NewSessionManager returns the props of the session manager.
func NewSessionManager(d *Deps) *actor.Props {
	restarts, window := d.Config.Restarts, d.Config.RestartWindow
	if restarts <= 0 {
		restarts = 3
	}
	if window <= 0 {
		window = time.Minute
	}
	return actor.PropsFromProducer(func() actor.Actor {
		// Activations are numbered from a random start in each incarnation, not from 1: another
		// member's late answer to an earlier incarnation's activation (a restart, or a member
		// restarted on its address: its manager's PID is the same) would be taken for the answer
		// to the new one of the same number, which then started the session while that member
		// still held the key (TestLateAnswerToAnEarlierIncarnationIsNotTaken).
		return &SessionManager{d: d, activations: rand.Uint64()}
	}, append(d.Mailbox("manager"),
		actor.WithSupervisor(&sessionSupervisor{d: d, restarts: restarts, window: window}))...)
}

// sessionSupervisor is the manager's supervisor strategy for its sessions: protoactor's
// OneForOne (restart, at most restarts times within window), except that a session past its
// budget is restarted too, and told to stop (Deps.crashedOut, Session.crashOut), rather than
// stopped. protoactor's stop is a system message: it drops the requests waiting in the
// session's mailbox (a message routed to it while it crashed), and their senders waited in
// vain (TestMessageToASessionStoppedForCrashingIsAnswered). The incarnation that stops hands
// them to the manager, as a passivating session does. The event published is the one
// OneForOne publishes (a stop), which the supervisor logs and counts.
type sessionSupervisor struct {
	d        *Deps
	restarts int
	window   time.Duration
}

func (s *sessionSupervisor) HandleFailure(system *actor.ActorSystem, supervisor actor.Supervisor, child *actor.PID,
	rs *actor.RestartStatistics, reason, _ any) {
	directive := actor.RestartDirective
	rs.Fail()
	if rs.NumberOfFailures(s.window) > s.restarts {
		rs.Reset()
		directive = actor.StopDirective
		s.d.crashedOut.Store(child.Id, struct{}{})
	}
	s.d.crashPanics.Store(child.Id, fmt.Sprint(reason)) // for the crash's one line (onRestarting)
	system.EventStream.Publish(&actor.SupervisorEvent{Child: child, Reason: reason, Directive: directive})
	supervisor.RestartChildren(child)
}

// Receive routes, spawns and stops sessions.
func (m *SessionManager) Receive(c actor.Context) {
	switch msg := c.Message().(type) {
	case *actor.Started:
		m.start(c)
	case *idleSweep:
		for _, pid := range m.sessions {
			c.Send(pid, sweepCheck)
		}
		if !m.closing {
			m.armSweep(c)
		}
	case *actor.Stopping, *actor.Restarting:
		m.closing = true // its sessions stop with it: none is started again
		if m.stopSweep != nil {
			m.stopSweep()
			m.stopSweep = nil
		}
		m.stopPauseChecks()
		if m.stopAsks != nil {
			m.stopAsks()
			m.stopAsks = nil
		}
		_, restarting := msg.(*actor.Restarting)
		m.giveUpHandOns(restarting)
		m.keepStopped(restarting) // (before the activations go, below)
		if m.stopKept != nil {
			m.stopKept()
			m.stopKept = nil
		}
		// Requests held for a session that will not start here get an honest answer: a
		// message is sent again (ClusterRouter), with its id, to wherever its key lives next.
		// The activations are given up: an answer to one (a lookup, a Released) that arrives
		// during the stop must not start a session under a manager whose stop has already
		// stopped the others (it waited for that child for ever, and the session ran what was
		// just answered "stopped").
		for key, a := range m.activating {
			answerStopped(c, a.held)
			delete(m.activating, key)
		}
		// Their lookups queued behind a batch in flight go nowhere: the batch's answer sends
		// no more (lookUpHolders).
		m.firstLookups.keys, m.firstLookups.found = nil, nil
		m.againLookups.keys, m.againLookups.found = nil, nil
		for _, held := range m.stopping {
			answerStopped(c, held)
		}
	case *actor.Stopped:
		// What the limited lines hold back is reported as the manager stops, its sessions
		// stopped: the limiters' timer would report it up to a minute later, when a daemon that
		// stops has exited (TestHeldRefusalLinesAreReportedAtTheStop).
		m.refusedLines.Flush()
		m.d.commandRefusals.Flush()
		m.unreachableHolders.Flush()
		logging.FlushAll(&m.overBound, &m.holderFails, &m.leftRecovers, &m.bouncedRecovers, &m.resetHandOnFails, &m.resetHandOnsGivenUp, &m.unsupported, &m.askFails, &m.promiseFails)
		m.d.flushLines()
	case *Routed:
		if msg.Grain != nil && !m.stoppedByManager(msg.Key, msg.Grain) {
			m.grains[msg.Key] = msg.Grain
		}
		if _, ok := msg.Msg.(*Recover); ok {
			m.recover(c, msg.Key, 0)
			return
		}
		m.route(c, msg.Key, routed{msg: msg.Msg, sender: c.Sender()})
	case *Forward:
		m.onForward(c, msg)
	case *Release:
		m.onRelease(c, msg)
	case *Released:
		m.onReleased(c, msg)
	case *askAgain:
		m.onAskAgain(c, msg)
	case *lookupsDue:
		m.lookupsDue = false
		m.lookUpHolders(c)
	case *exchangeAsks:
		m.armAsks(c)
		m.onExchangeAsks(c)
	case *asksExchanged:
		m.onAsksExchanged(c, msg)
	case *promiseWritten:
		m.onPromiseWritten(msg)
	case *Leave:
		m.onLeave(c, msg)
	case *grainStopped:
		m.onGrainStopped(c, msg)
	case *handedBack:
		if m.closing {
			m.whileClosing(c, msg.key, msg.r)
			break
		}
		held, ok := m.stopping[msg.key]
		if !ok {
			m.route(c, msg.key, msg.r)
			break
		}
		i := m.handed[msg.key] // after those handed back before it, before what came later
		if held, n, ok := handBackFiledReset(held, i, msg.r); ok {
			m.stopping[msg.key], m.handed[msg.key] = held, n
			break
		}
		m.stopping[msg.key] = slices.Insert(held, i, msg.r)
		m.handed[msg.key] = i + 1
	case *successor:
		if m.kept.stopped[msg.key] {
			// The old incarnation's, for a session of the key that stopped as it restarted: the
			// key is held until the calls the restart cancelled have returned (holdStopped).
			break
		}
		m.startSuccessor(c, msg.key)
	case *pauseOver:
		if p, ok := m.waitingOut[msg.key]; ok && p.n == msg.n {
			m.startSuccessor(c, msg.key)
		}
	case *pauseCheck:
		if msg.n == m.pauseChecks { // (not one cancelled as it fired)
			m.stopPauses = nil
			m.endPausesEarly(c)
			m.armPauseCheck(c)
		}
	case *keptCheck:
		if msg.n == m.keptChecks { // (not one cancelled as it fired)
			m.stopKept = nil
			m.expireBackoffs(c)
		}
	case *recoverAll:
		m.recoverAll(c)
	case *restartStopped:
		m.onRestartStopped(c, msg)
	case *retryHandOn:
		m.onRetryHandOn(c, msg)
	case *restartCrashed:
		if _, stopping := m.stopping[msg.key]; !m.closing && m.sessions[msg.key] == nil && !stopping && m.activating[msg.key] == nil {
			m.activate(c, msg.key, false) // not a recovery: its messages run (sessions.recovery is for restarts of agentgate)
		}
	case *passivate:
		// Only from the session in memory: one that stopped meanwhile (its Terminated, a
		// system message, overtakes what it sent before) must not stop its successor, count a
		// passivation, or reset the key's crash backoff.
		if pid, ok := m.sessions[msg.key]; ok && pid.Equal(msg.pid) {
			delete(m.sessions, msg.key)
			delete(m.leavers, msg.key)
			m.setIdle(msg.key, false)
			m.stopping[msg.key] = nil
			if msg.rerun {
				m.rerun[msg.key] = true
			}
			if msg.pause {
				m.paused[msg.key] = &refusal{why: msg.why, err: msg.err}
			}
			if msg.crashed {
				m.crashed[msg.key] = msg.panic
			}
			if !msg.fenced {
				m.d.Metrics.SessionPassivations.Inc()
				if msg.room {
					m.keepBackoffs(c, msg.key) // it may have started seconds ago
				} else {
					m.clearBackoffs(msg.key) // it ran well long enough to be idle
				}
			}
			c.Poison(pid)
		}
	case *roomDeclined:
		if pid, ok := m.sessions[msg.key]; ok && pid.Equal(msg.pid) && m.evicting[msg.key] {
			m.setIdle(msg.key, !m.busy[msg.key]) // at the front: asked last next time
		}
	case *SessionState:
		m.onLoaded(c, msg)
	case *busyChanged:
		m.setIdle(msg.key, !msg.busy && m.sessions[msg.key] != nil)
		if msg.busy {
			m.busy[msg.key] = true
		} else {
			delete(m.busy, msg.key)
			m.answerDrains(c)
		}
	case *actor.Terminated:
		m.onTerminated(c, msg)
	case *Drain:
		m.kept.drains = append(m.kept.drains, c.Sender())
		for key := range m.busy {
			if pid := m.sessions[key]; pid != nil {
				c.Send(pid, &draining{}) // a held result is tried again now (drainingNow)
			}
		}
		m.answerDrains(c)
	case *Peek:
		if pid := m.sessions[msg.Key]; pid != nil && !m.closing { // a session stopped with the manager answers nothing
			m.forward(c, pid, routed{msg: &GetState{}, sender: c.Sender()})
		} else {
			c.Respond(&SessionState{SessionKey: msg.Key})
		}
	case *ListActive:
		keys := make([]string, 0, len(m.sessions))
		for k := range m.sessions {
			keys = append(keys, k)
		}
		busy := make([]string, 0, len(m.busy))
		for k := range m.busy {
			busy = append(busy, k)
		}
		slices.Sort(busy)
		c.Respond(&ActiveList{Keys: keys, Busy: busy, HandingOn: m.handingOnKeys()})
	}
}

func (m *SessionManager) start(c actor.Context) {
	m.log = m.d.Log.With("actor", "manager")
	m.kept = &m.d.managerKept
	m.sessions = map[string]*actor.PID{}
	m.stopping = map[string][]routed{}
	m.handed = map[string]int{}
	m.crashStops = map[string]int{}
	m.crashed = map[string]string{}
	m.rerun = map[string]bool{}
	m.refused = map[string]int{}
	m.paused = map[string]*refusal{}
	m.waitingOut = map[string]pause{}
	m.startedEarly = map[string]bool{}
	m.keptBackoffs = list.New()
	m.keptAt = map[string]*list.Element{}
	m.busy = map[string]bool{}
	m.loading = map[string]bool{}
	m.grains = map[string]*actor.PID{}
	m.stoppedGrains = map[string][]*actor.PID{}
	m.quieted = map[string]bool{}
	m.activating = map[string]*activation{}
	m.waiters = map[string][]waiter{}
	m.strangers = map[string][]waiter{}
	m.idle = list.New()
	m.idleAt = map[string]*list.Element{}
	m.evicting = map[string]bool{}
	m.timers = scheduler.NewTimerScheduler(c)
	m.armSweep(c)
	m.armAsks(c)
	if m.kept.successor != nil {
		// Restarted while its member leaves: it goes on leaving. Its sessions stopped with the
		// incarnation before: it hands on the keys of those that left work pending
		// (onRestartStopped); what it is asked now goes to the successors.
		m.log.Info("the manager restarted while its member leaves the cluster; it goes on handing keys on")
	}
	// Restarted: the keys its restart stopped wait for the agent calls it cancelled to return.
	holding := m.holdStopped(c)
	// The drains asked of the incarnation before are answered once nothing runs and, while the
	// member leaves, no filed reset is still being handed on (handOnFiledResets).
	defer m.answerDrains(c)
	if m.d.Clustered {
		m.handOnFiledResets(c)
		return // each member recovers the keys the cluster gives it (Recover)
	}
	if !holding {
		m.recoverAll(c) // (after a restart, once the keys it stopped go on: onRestartStopped)
	}
}

// recoverAll starts the session of every key with unfinished work: unanswered messages run
// (or are answered with a notice), unconfirmed replies are sent again. When the store cannot
// list them, it tries again recoverRetry later, until it can.
func (m *SessionManager) recoverAll(c actor.Context) {
	// While the spool holds writes, the database does not show the messages they hold, and
	// those of a run that stopped before they were answered would wait for their chat's next
	// message: the listing runs again until one has begun after the spool drained (read before
	// the listing: the spool may drain meanwhile). A key listed again whose session is in
	// memory is left alone.
	spooling := m.d.Spooling.Load()
	// The read runs on the manager, which routes every message: a store that does not answer
	// must not hold it for long.
	ctx, cancel := context.WithTimeout(m.d.Ctx, recoverListTimeout)
	keys, err := m.d.Store.Recoverable(ctx)
	cancel()
	if err != nil {
		m.listFails++
		if n := m.listFails; n == 1 || n%int(time.Minute/recoverRetry) == 0 {
			m.log.Warn("list the sessions with unfinished work; trying again (their unanswered messages wait meanwhile)",
				"attempt", n, "in", recoverRetry, logging.Err(err))
		}
		m.timers.SendOnce(recoverRetry, c.Self(), &recoverAll{})
		return
	}
	m.listFails = 0
	if spooling {
		m.timers.SendOnce(storeWaitTick, c.Self(), &recoverAll{})
	}
	started := 0
	for _, k := range keys {
		if m.sessions[k] == nil && m.activating[k] == nil {
			started++ // not one the listing found before (while spooling, it runs every tick)
		}
		m.recover(c, k, 0)
	}
	if started > 0 {
		m.log.Info("recovering sessions", "count", started)
	}
}

func (m *SessionManager) route(c actor.Context, key string, r routed) {
	if m.closing {
		m.whileClosing(c, key, r)
		return
	}
	if held, ok := m.stopping[key]; ok {
		if p, waiting := m.waitingOut[key]; waiting && r.sender != nil {
			if d, ok := r.msg.(*Deliver); ok && m.mayEnd(p) {
				// The store takes writes again (room was made on the disk): the session need
				// not wait out the rest of its pause, up to a minute, to take the message.
				m.log.Info("the store takes writes again; a paused session starts early", "session", key, "message", d.MessageId)
				m.stopping[key] = append(held, r)
				m.startEarly(c, key)
				return
			} else if ok {
				// The session waits out a pause after the store refused its writes (a full
				// disk), which grows to a minute: held, the message would outwait its sender's
				// request, and its write would most likely be refused too. Its sender sends it
				// again.
				m.refusePaused(c, key, d, r.sender)
				return
			}
		}
		if !holdsFiledReset(held, r) {
			m.stopping[key] = append(held, r)
		}
		return
	}
	if pid := m.sessions[key]; pid != nil { // the common case first: a key is never both
		m.forward(c, pid, r)
		return
	}
	if a := m.activating[key]; a != nil {
		m.whileActivating(c, key, a, r)
		return
	}
	if m.handOn(c, key, r) {
		return
	}
	if m.bouncedBack(c, key, r) {
		answerStopped(c, []routed{r}) // the cluster router sends it again
		return
	}
	m.activate(c, key, false, r)
}

// refusePaused answers d, a message for key while its session waits out a pause after refused
// writes: unavailable, or duplicate when the store holds it as one of the key's already (a
// re-delivery of a message taken before the pause: "send it again" would say it was not, as a
// session waiting to load reads too: storedHere). The read runs beside the manager, which routes
// every message: in an outage, a store that does not answer must not hold it.
func (m *SessionManager) refusePaused(c actor.Context, key string, d *Deliver, sender *actor.PID) {
	unavailable := &DeliverResult{SessionKey: d.SessionKey, MessageId: d.MessageId, ErrorCode: ErrCodeUnavailable,
		Error: "the session waits for the store to take writes again; send the message again shortly"}
	if d.MessageId == "" {
		c.Send(sender, unavailable)
		return
	}
	root, store := c.ActorSystem().Root, m.d.Store
	go func() {
		ctx, cancel := context.WithTimeout(m.d.Ctx, duplicateCheckTimeout)
		defer cancel()
		src := sourceFromProto(d.Source)
		if row, err := store.FindInbound(ctx, src.Platform, src.ChatID, d.MessageId); err == nil {
			if sess, err := store.Session(ctx, row.SessionID); err == nil && sess.Key == key {
				root.Send(sender, &DeliverResult{SessionKey: d.SessionKey, SessionId: row.SessionID, MessageId: d.MessageId,
					Disposition: platforms.Duplicate})
				return
			}
		}
		root.Send(sender, unavailable)
	}()
}

func (m *SessionManager) forward(c actor.Context, pid *actor.PID, r routed) {
	if r.sender != nil {
		c.RequestWithCustomSender(pid, r.msg, r.sender)
	} else {
		c.Send(pid, r.msg)
	}
}

// spawnWith starts the session of key; recovered marks the activation that recovers a
// session's unfinished work at daemon start. seen is the key's latest claim as the activation
// looked it up before it asked the other members to let go of the key: the session claims the
// key only while it is still so (Session.load); nil claims it on no condition.
func (m *SessionManager) spawnWith(c actor.Context, key string, recovered bool, seen *persistence.ClaimSeen) *actor.PID {
	if seen != nil {
		m.d.claimsSeen.Store(key, *seen)
	} else {
		m.d.claimsSeen.Delete(key)
	}
	m.makeRoom(c)
	pid, err := c.SpawnNamed(NewSession(m.d, recovered), key)
	if err != nil {
		// The name is taken only while an old actor for the key is still registered; that is
		// a broken invariant of this manager.
		panic("session manager: spawn " + key + ": " + err.Error())
	}
	m.sessions[key] = pid
	m.setIdle(key, true)
	m.unkeep(key) // its backoffs are its session's again
	m.probeLoad(c, key, pid)
	m.d.Metrics.SessionActivations.Inc()
	m.d.Metrics.SessionsActive.Inc()
	return pid
}

// The bound on the sessions in memory (SessionConfig.MaxInMemory). Passivation bounds them by
// time only: a client that wrote to a new chat at every message (a flood, or an integrator that
// made up a chat_id per message) kept every one of them for passivate_after, some 4 to 6 KiB
// each, gigabytes within minutes. An activation past the bound asks the least recently used
// session with nothing in hand to passivate, which it does as after the idle sweep's check, by
// the same checks and path (Session.stopIfIdle). The manager knows which sessions have nothing
// in hand from their busyChanged, and orders them by when they last had work in hand (every
// message does until its write is acknowledged; a read of the state, which is no activity for
// passivation either, does not): O(1) at each change, nothing on the routing path.

// setIdle puts key at the front of the idle order or takes it out, and forgets that its session
// was asked to make room: one that changed its busy state since, or stopped, has answered.
func (m *SessionManager) setIdle(key string, idle bool) {
	delete(m.evicting, key)
	e := m.idleAt[key]
	switch {
	case idle && e == nil:
		m.idleAt[key] = m.idle.PushFront(key)
	case !idle && e != nil:
		m.idle.Remove(e)
		delete(m.idleAt, key)
	}
}

// makeRoom asks sessions with nothing in hand, the least recently used first, to passivate
// until a new session fits within the bound, counting out those asked already. A session that
// has work in hand after all declines (roomDeclined, or its busyChanged on its way) and counts
// again; while writes wait in the spool none is asked, as none would stop (stopIfIdle). With no idle session left the new one starts all the same: the bound is soft,
// as refusing it would turn a busy daemon away from its chats, and the activations after the
// busy sessions' turns are done make room again.
func (m *SessionManager) makeRoom(c actor.Context) {
	bound := m.d.Config.MaxInMemory
	if bound <= 0 || m.d.Spooling.Load() {
		// While writes wait in the spool no session passivates (stopIfIdle), as for the idle
		// sweep: each would decline, and be asked again at the next activation.
		return
	}
	for len(m.sessions)-len(m.evicting) >= bound {
		e := m.idle.Back()
		if e == nil {
			m.overBound.LogQuiet(m.log, slog.LevelWarn, "sessions in memory exceed sessions.max_in_memory: every session is busy, none can passivate to make room", "count", len(m.sessions)+1, "bound", bound)
			return
		}
		key := e.Value.(string)
		m.idle.Remove(e)
		delete(m.idleAt, key)
		m.evicting[key] = true
		c.Send(m.sessions[key], roomCheck)
	}
}

func (m *SessionManager) onTerminated(c actor.Context, t *actor.Terminated) {
	// Every child is a session, named by its key.
	prefix := c.Self().Id + "/"
	if !strings.HasPrefix(t.Who.Id, prefix) {
		return
	}
	key := t.Who.Id[len(prefix):]
	// A crash no incarnation took up (onRestarting) leaves nothing behind.
	p, _ := m.d.crashPanics.LoadAndDelete(t.Who.Id)
	why, _ := p.(string)
	m.d.Metrics.SessionsActive.Dec()
	if pid := m.sessions[key]; pid != nil && pid.Equal(t.Who) && !m.closing {
		// Stopped by its supervisor after too many crashes, with work it may still hold. In a
		// cluster the recovery sweep starts it again, wherever the key lives by then.
		delete(m.sessions, key)
		delete(m.leavers, key)
		m.setIdle(key, false)
		m.crashedOut(c, key, true, why)
	}
	delete(m.busy, key)
	if pid := m.sessions[key]; pid == nil || pid.Equal(t.Who) {
		delete(m.loading, key) // (it answers no probeLoad now)
	}
	if m.sessions[key] == nil {
		m.d.claimsSeen.Delete(key) // (the key's next session is started with its own: spawnWith)
	}
	m.answerDrains(c)
	if g := m.grains[key]; g != nil && !m.stoppingWithWork(key) {
		// The session stopped for good (passivated, or fenced out): so does its grain, and the
		// cluster activates a new one on the key's next message.
		delete(m.grains, key)
		m.stoppedGrains[key] = append(m.stoppedGrains[key], g)
		c.Poison(g)
	}
	if _, ok := m.stopping[key]; ok {
		// Terminated is a system message: it overtakes what the session handed back before
		// it stopped (handedBack, still in the mailbox). The successor starts once those are
		// in the held list, in their place.
		c.Send(c.Self(), &successor{key: key})
	} else {
		m.letGo(c, key)
	}
}

// refusal is the write the store refused as unavailable that paused a session, as its line
// says it.
type refusal struct {
	why string
	err error
}

// crashedOut counts a stop of the session of key for crashing too often (Session.crashOut) and,
// when restart is set, has it start again from the store after a pause that grows with each
// such stop, so that a session that cannot even load backs off. In a cluster the recovery
// sweep starts it again, wherever the key lives by then.
// It is the one line of the crash that stopped the session, with what it panicked with (panic)
// and the pause (in): the session's own line of that crash is at Debug (onRestarting).
func (m *SessionManager) crashedOut(c actor.Context, key string, restart bool, why string) {
	n := m.crashStops[key]
	if !m.d.Clustered {
		// Counted only where a pause follows: in a cluster the key may start on another member,
		// and its count would stay here for ever (TestClusterSessionCrashedOutLeavesNoCount).
		m.crashStops[key] = n + 1
	}
	switch {
	case !restart:
		m.log.Error("session stopped after crashing too often; it starts again at once with what was asked meanwhile", "session", key, "panic", why)
	case m.d.Clustered:
		m.log.Error("session stopped after crashing too often; the cluster's recovery starts it again", "session", key, "panic", why)
	default:
		pause := min(crashPause<<min(n, 6), maxCrashPause)
		m.log.Error("session stopped after crashing too often; it starts again from the store", "session", key, "panic", why, "in", pause)
		m.timers.SendOnce(pause, c.Self(), &restartCrashed{key: key})
	}
}

// Backoffs kept across a passivation to make room. A session passivated for idleness ran well
// long enough: its key's backoffs (crashStops, refused, startedEarly) go with it. One passivated
// to make room (sessions.max_in_memory) may have started seconds before, after the pause of a
// crash-out or of refused writes: had they gone with it, a chat that crashes (or whose writes
// the store refuses) again and again under a full bound would lose its growing pause each time
// it was evicted between two of them, and never back off. So they stay, stamped with the time
// the key left memory, until its session starts again (spawnWith: they are the session's again,
// cleared when it passivates for idleness) or the key has stayed out of memory for
// backoffKeptFor: then they go (expireBackoffs), so that the keys of a flood, evicted and never
// seen again, leave nothing behind, also with passivate_after 0s. The check has a timer of its
// own, as the idle sweep is off then, armed only while backoffs are kept: a manager that keeps
// none pays nothing, and the cost is O(1) per passivation or activation, nothing per message.

// backoffKeptFor is how long a key whose session passivated to make room keeps its backoffs out
// of memory: the longest pause they can make it wait (maxCrashPause; that of refused writes,
// maxRefusedPause, is shorter). A key that crashes out (or is refused) again within it resumes
// its backoff where it left it. One that stayed away longer already comes back no more often
// than its longest pause would let it; it starts again from the first pause, as after a
// passivation for idleness. It is also passivate_after's default: left in memory, an idle
// session would have kept them about as long.
const backoffKeptFor = maxCrashPause

// backoffCheckEvery is the least time between two keptChecks: kept backoffs go between
// backoffKeptFor and backoffKeptFor + backoffCheckEvery after their key left memory, and a
// flood of evictions wakes the manager at most once per backoffCheckEvery for them.
const backoffCheckEvery = time.Minute

// keptCheck wakes the manager to drop the kept backoffs that expired (expireBackoffs).
type keptCheck struct{ n uint64 }

// keptBackoff is a key in keptBackoffs, with the time its session passivated to make room.
type keptBackoff struct {
	key   string
	since time.Time
}

// keepBackoffs keeps the backoffs of key, whose session passivated to make room, if it has any:
// at the front of keptBackoffs, which stays in the order of the times keys left memory.
func (m *SessionManager) keepBackoffs(c actor.Context, key string) {
	m.unkeep(key)
	_, crashed := m.crashStops[key]
	_, refused := m.refused[key]
	if !crashed && !refused && !m.startedEarly[key] {
		return
	}
	m.keptAt[key] = m.keptBackoffs.PushFront(keptBackoff{key: key, since: time.Now()})
	m.armKeptCheck(c)
}

// unkeep takes key out of keptBackoffs, leaving its backoffs as they are.
func (m *SessionManager) unkeep(key string) {
	if e := m.keptAt[key]; e != nil {
		m.keptBackoffs.Remove(e)
		delete(m.keptAt, key)
	}
}

// clearBackoffs forgets the backoffs of key.
func (m *SessionManager) clearBackoffs(key string) {
	delete(m.crashStops, key)
	delete(m.refused, key)
	delete(m.startedEarly, key)
	m.unkeep(key)
}

// expireBackoffs forgets the kept backoffs of the keys out of memory for backoffKeptFor, from
// the back of keptBackoffs, and arms the next check while others are kept.
func (m *SessionManager) expireBackoffs(c actor.Context) {
	for e := m.keptBackoffs.Back(); e != nil; e = m.keptBackoffs.Back() {
		if k := e.Value.(keptBackoff); time.Since(k.since) >= backoffKeptFor {
			m.clearBackoffs(k.key)
		} else {
			break
		}
	}
	m.armKeptCheck(c)
}

// armKeptCheck arms a keptCheck for when the backoffs kept longest expire, no sooner than
// backoffCheckEvery, while backoffs are kept and none is armed: one timer at a time, for the
// reason armPauseCheck gives. (One armed for a key that started again since finds nothing to
// forget, and arms the next.)
func (m *SessionManager) armKeptCheck(c actor.Context) {
	e := m.keptBackoffs.Back()
	if m.stopKept != nil || e == nil || m.closing {
		return
	}
	m.keptChecks++
	wait := max(time.Until(e.Value.(keptBackoff).since.Add(backoffKeptFor)), backoffCheckEvery)
	m.stopKept = m.timers.SendOnce(wait, c.Self(), &keptCheck{n: m.keptChecks})
}

// answerStopped answers the requests among rs, which no session of this manager will take: a
// Deliver with ErrCodeStopped (sent again with the same id, it is stored once), any other with a
// dead letter, as a manager that has stopped answers (the cluster router sends both again, to
// the key's next owner).
func answerStopped(c actor.Context, rs []routed) {
	for _, r := range rs {
		if r.sender == nil {
			continue
		}
		if d, ok := r.msg.(*Deliver); ok {
			c.Send(r.sender, &DeliverResult{SessionKey: d.SessionKey, MessageId: d.MessageId, ErrorCode: ErrCodeStopped,
				Error: "the session's member stopped before the message was stored; send it again with the same message_id"})
		} else {
			c.Send(r.sender, &actor.DeadLetterResponse{Target: c.Self()})
		}
	}
}

// whileClosing takes a message for key that reaches the manager while it stops or restarts
// (closing), after its stop has stopped its sessions. A session started now would be one the
// stop waits for in vain, and it would run a message whose sender may already have been told to
// send it elsewhere; one in memory stops without taking it. So the message goes to the member
// that takes the key over when there is one (handOn: this member leaves, or the key is another
// member's), and is answered as the requests held at the stop are otherwise (answerStopped).
// A Recover goes nowhere else: the work stays in the store for the key's next activation.
func (m *SessionManager) whileClosing(c actor.Context, key string, r routed) {
	if m.handOn(c, key, r) {
		return
	}
	if _, ok := r.msg.(*Recover); ok {
		// No one to answer, but the key's pending work waits for it: said.
		m.leftRecovers.LogQuiet(m.log, slog.LevelInfo, "the manager stops; a recovery of the session is left to the next sweep", "session", key)
	}
	answerStopped(c, []routed{r})
}

// successor asks the manager to start the successor of a stopped session of key, with the
// requests held for it, if it has any or must run again (passivate.rerun).
type successor struct{ key string }

// pause is one wait of a key's next activation after the store refused the session's writes
// (waitingOut): its number among the manager's pauses, when it began, and whether it may end
// early once the store takes writes again (mayEnd). A pause after an early start may not: on a
// disk with room for small writes but not for the session's, every early start would run the
// session's turn again, its agent with it, each time another write got through; waited out,
// the pauses keep their backoff.
type pause struct {
	n     uint64
	began time.Time
	early bool
}

// mayEnd reports whether pause p may end now: it may end early, and the store has taken a
// write since it began, and refused none since.
func (m *SessionManager) mayEnd(p pause) bool {
	return p.early && m.d.Refusals.TakenSince(p.began)
}

// startEarly starts key's session before its pause is over (mayEnd).
func (m *SessionManager) startEarly(c actor.Context, key string) {
	m.startedEarly[key] = true
	m.startSuccessor(c, key)
}

// pauseOver is successor at the end of pause n, unless the session started early (route) or
// paused again since.
type pauseOver struct {
	key string
	n   uint64
}

// pauseCheck wakes the manager every pauseCheckEvery while keys wait out a pause, to start
// early those whose store has taken writes since their pause began (endPausesEarly).
type pauseCheck struct{ n uint64 }

// pauseCheckEvery is how often the manager looks whether the store takes writes again while
// sessions wait out a pause after refused writes.
const pauseCheckEvery = time.Second

// endPausesEarly starts the sessions that wait out a pause after refused writes once the store
// has taken a write since the pause began, and refused none since (any chat's message, a
// delivery mark): room was made on the disk, and what they hold (a turn to run again) need not
// wait out the rest of a pause of up to a minute. With no key waiting, the ticker stops.
func (m *SessionManager) endPausesEarly(c actor.Context) {
	m.handOnPaused(c)
	started := 0
	for key, p := range m.waitingOut {
		if m.mayEnd(p) {
			started++
			m.startEarly(c, key)
		}
	}
	if started > 0 {
		m.log.Info("the store takes writes again; paused sessions start early", "count", started)
	}
	if len(m.waitingOut) == 0 {
		m.stopPauseChecks()
	}
}

// armPauseCheck arms the next pauseCheck while keys wait out a pause and none is armed: one
// timer at a time, armed again at each check. (protoactor's SendRepeatedly reads its timer's
// state without synchronisation when it fires as it is cancelled, a data race the race detector
// reported once; the checks stop whenever the last pause ends.)
func (m *SessionManager) armPauseCheck(c actor.Context) {
	if m.stopPauses != nil || len(m.waitingOut) == 0 {
		return
	}
	m.pauseChecks++
	m.stopPauses = m.timers.SendOnce(pauseCheckEvery, c.Self(), &pauseCheck{n: m.pauseChecks})
}

// armSweep arms the next idle sweep when passivation is on: one timer at a time, armed again at
// each sweep, for the reason armPauseCheck gives.
func (m *SessionManager) armSweep(c actor.Context) {
	if p := m.d.Config.PassivateAfter; p > 0 {
		m.stopSweep = m.timers.SendOnce(sweepEvery(p), c.Self(), &idleSweep{})
	}
}

func (m *SessionManager) stopPauseChecks() {
	if m.stopPauses != nil {
		m.stopPauses()
		m.stopPauses = nil
	}
}

func (m *SessionManager) startSuccessor(c actor.Context, key string) {
	delete(m.waitingOut, key)
	if m.closing {
		// The manager stops: the requests held for the key were answered as the stop began
		// (later ones are not held: whileClosing), and no session starts here any more.
		if m.rerun[key] {
			m.whileClosing(c, key, routed{msg: &Recover{}})
		}
		delete(m.stopping, key)
		delete(m.handed, key)
		delete(m.rerun, key)
		delete(m.quieted, key)
		delete(m.paused, key)
		delete(m.crashed, key)
		m.letGo(c, key)
		m.handOnFiledReset(c, m.elsewhere(key), key) // (after letGo: see below)
		return
	}
	if why, crashed := m.crashed[key]; crashed {
		// The session crashed past its restart budget. With requests handed back or held, it
		// starts again at once (as a message that reached a stopped session started it);
		// otherwise after its pause, from the store.
		delete(m.crashed, key)
		if len(m.stopping[key]) == 0 && !m.rerun[key] {
			delete(m.stopping, key)
			delete(m.handed, key)
			m.crashedOut(c, key, true, why)
			// The reset filed for the key (the crash filed it, and the incarnation that stopped
			// loaded nothing) goes on with the key when it is another member's, to the same
			// member and after letGo, as below. Before, it stayed here, and so did a send again
			// of it held back while the session stopped (holdsKey): the key's next owner let the
			// session go on until its next reset
			// (TestFiledResetOfASessionCrashedOutGoesOnWithTheKey).
			to := m.elsewhere(key)
			if asker := m.takingOver(key); to != nil && asker != nil {
				to = asker
			}
			m.letGo(c, key)
			m.handOnFiledReset(c, to, key)
			m.answerDrains(c)
			return
		}
		m.crashedOut(c, key, false, why)
	}
	// A key handed on waits out no pause here, nor keeps the note of one: it stayed, and the
	// key's next normal passivation here waited out a pause for nothing
	// (TestRefusedSessionOfAKeyThatMovedLeavesNoPause).
	paused := m.paused[key]
	delete(m.paused, key)
	if paused != nil && m.elsewhere(key) == nil {
		// The store refused the session's write: started again at once, it would run its
		// message again only to have the result refused again, in a loop as fast as the agent
		// answers. What comes for the key meanwhile is held, in order.
		n := m.refused[key]
		m.refused[key] = n + 1
		wait := min(refusedPause<<min(n, 6), maxRefusedPause)
		// At once, then once a LimitEvery for the key, with the pauses between (repeats),
		// each at Debug, and of many keys one line a minute
		// (TestRefusedSessionPausesAreLoggedOnceAMinute, TestRefusedPausesOfManySessionsAreFolded).
		// It says which write was refused and why: the session's own line of it is at Debug.
		const msg = "the store refused a session's write; it starts again from the store"
		m.refusedLines.Log(m.log, slog.LevelWarn, msg, key, "session", key, "in", wait, "why", paused.why, logging.Err(paused.err))
		m.pauses++
		p := pause{n: m.pauses, began: time.Now(), early: !m.startedEarly[key]}
		delete(m.startedEarly, key)
		m.timers.SendOnce(wait, c.Self(), &pauseOver{key: key, n: p.n})
		m.waitingOut[key] = p
		m.armPauseCheck(c)
		m.answerDrains(c) // a leaving member's drain does not wait for the pause (handsOn)
		return
	}
	if !m.quieted[key] && (m.elsewhere(key) != nil && (len(m.stopping[key]) > 0 || m.rerun[key]) || len(m.waiters[key]) > 0) {
		if pid := m.platformOf(key); pid != nil {
			// The key goes on to another member (this one leaves, or the key moved), which loads
			// the replies whose delivery is not yet confirmed and sends them again: first let the
			// platform send and confirm those the stopped session handed it. Meanwhile what comes
			// for the key is held, in order.
			m.quieted[key] = true
			c.ReenterAfter(c.RequestFuture(pid, &Quiesce{Key: key}, handOnQuiesceTimeout), func(any, error) {
				m.startSuccessor(c, key)
			})
			return
		}
	}
	delete(m.quieted, key)
	held := m.stopping[key]
	delete(m.stopping, key)
	delete(m.handed, key)
	rerun := m.rerun[key]
	delete(m.rerun, key)
	defer m.answerDrains(c) // a leaving member's drain waits for its hand-overs
	if to := m.elsewhere(key); to != nil {
		// The key is another member's now: it runs what the session left queued, and gets
		// what was asked meanwhile. The members waiting for this one to let go of the key are
		// told first, so that what follows finds their session. A member that asked for the
		// key (Release) is the one that takes it over: it claims the key once this one let go.
		// What is left goes to it, not to the owner in this member's view, which may be older
		// than the asker's: a member that had not renewed since another joined and a third
		// began to leave sent it to the leaving one, which sent it back here, where a new
		// activation, asking only the members this one knew, claimed the key beside the
		// asker's (TestClusterThreeViewsMoveAKeyOnce). An asker that stopped asking (it died,
		// or gave its activation up) takes nothing over: what is left goes to the owner
		// (TestHandOverSkipsAWaiterThatDied).
		if asker := m.takingOver(key); asker != nil {
			to = asker
		}
		// Its backoffs go with it: they count since the key last passivated here, which it
		// may never do again.
		m.clearBackoffs(key)
		// The filed reset goes after the members waiting for the key were told this one let
		// go: sent before, it reached a waiter that still took this member for the key's
		// holder, which forwarded it back here, past its last hop, and this member activated
		// the key again for it, beside the waiter (both ran the messages handed on:
		// TestFiledResetHandedToTheMemberThatAskedForTheKeyIsNotSentBack). It still goes
		// ahead of what was held for the key.
		m.letGo(c, key)
		m.handOnFiledReset(c, to, key)
		var local []routed
		onward := false
		for _, r := range held {
			switch {
			case m.handOnTo(c, to, key, r):
				onward = true
			case m.bouncedBack(c, key, r):
				answerStopped(c, []routed{r}) // not started here either (bouncedBack)
			default:
				local = append(local, r)
			}
		}
		// Held messages activate the key where they go; without any, a Recover does.
		rerun = rerun && !onward && len(local) == 0 && !m.handOnTo(c, to, key, routed{msg: &Recover{}})
		held = local
	}
	if len(held) > 0 || rerun {
		m.activate(c, key, false, held...)
		return
	}
	m.letGo(c, key)
}

// handOnFiledReset hands the reset the session of key filed for the key's next activation here
// (Session.writeReset: the store refused its write; Session.leaveIfIdle: it waits for the
// messages handed on with the key) to the manager to, which takes the key over, ahead of what
// was held for the key: its session does the reset unless the session was active since
// (Session.onResetDue). Before, it was dropped, and the new owner, which found the session's
// activity past the due time (the work the reset waited for), let the session go on until its
// next reset: a daily one a day late (TestResetFiledForAKeyHandedOnIsDoneByItsNewOwner). With no
// other member to hand it to (to is nil: a manager that restarts), it stays for the key's next
// activation here.
//
// The hand-on is answered (ResetDueTaken) once the new owner's session has the reset, and the
// entry stays here until then: the store may hold the reset nowhere (it refused the session's
// mark and its end), and a ResetDue lost on the way (a dead letter: the member gone, a cut link)
// lost it. The new owner found the session's activity past the due time, and let the session go
// on until its next reset (TestFiledResetHandedOnIsSentAgainUntilItIsTaken). One that comes
// back as a dead letter, or goes unanswered for resetHandOnTimeout, is sent again (retryHandOn)
// to the member that takes the key over then, until it is taken, the key's session here takes
// it (the key came back), or the manager stops. A reset sent twice is done once: the new owner's
// session ends only the session it names, while it is open, and not if it was active since
// (Session.takeFiledReset). A leaving member's drain waits for the answers
// (SessionManager.answerDrains).
func (m *SessionManager) handOnFiledReset(c actor.Context, to *actor.PID, key string) {
	if to == nil || to.Equal(c.Self()) || m.handingOn[key] || m.holdsKey(key) {
		return // (one in flight, or waiting to be sent again, goes to the key's owner then)
	}
	if v, ok := m.d.resetsDue.Load(key); ok {
		m.sendFiledReset(c, to, key, v.(*overdue), 0)
	}
}

// resetHandOnTimeout bounds the wait for the answer to a filed reset handed on
// (handOnFiledReset); maxResetHandOnWait, the wait before it is sent again, which begins at 1 s
// and doubles with each failure.
const (
	resetHandOnTimeout = 30 * time.Second
	maxResetHandOnWait = 30 * time.Second
)

// sendFiledReset sends o, the reset filed for key, to the manager to, failures times sent before
// in vain, and takes the answer (handOnFiledReset).
func (m *SessionManager) sendFiledReset(c actor.Context, to *actor.PID, key string, o *overdue, failures int) {
	if m.handingOn == nil {
		m.handingOn = map[string]bool{}
	}
	m.handingOn[key] = true
	begunClosing := m.closing // (not counted by the stop's line: giveUpHandOns)
	f := &Forward{Key: key, Hops: 1, Msg: &Forward_ResetDue{ResetDue: resetDueOf(o)}}
	c.ReenterAfter(c.RequestFuture(to, f, resetHandOnTimeout), func(res any, err error) {
		if _, ok := res.(*ResetDueTaken); err == nil && ok {
			delete(m.handingOn, key)
			if !m.d.resetsDue.CompareAndDelete(key, o) && !m.closing {
				// Another was filed since (the key came back, and its session here took o and
				// filed one of its own before it let go again): it goes on too.
				m.handOnFiledReset(c, m.elsewhere(key), key)
			}
			m.answerDrains(c)
			return
		}
		if err == nil {
			err = fmt.Errorf("unexpected answer %T", res)
		}
		if m.closing {
			// Not sent again. One in flight as the stop began was said so then (giveUpHandOns);
			// one begun since (startSuccessor) is said so now, with a limiter of its own: one
			// shared with the first failure's line was held back by a line of another key.
			delete(m.handingOn, key) // (the entry stays for the key's next activation here)
			if begunClosing {
				m.resetHandOnsGivenUp.LogQuiet(m.log, slog.LevelWarn, handOnGivenUpLine, "session", key, "member", to.Address, "sent", failures+1, logging.Err(err))
			}
			return
		}
		if failures == 0 {
			m.resetHandOnFails.LogQuiet(m.log, slog.LevelWarn, handOnFailedLine, "session", key, "member", to.Address, logging.Err(err))
		}
		wait := min(time.Second<<min(failures, 6), maxResetHandOnWait)
		if m.handOnRetries == nil {
			m.handOnRetries = map[string]scheduler.CancelFunc{}
		}
		m.handOnRetries[key] = m.timers.SendOnce(wait, c.Self(), &retryHandOn{key: key, failures: failures + 1})
	})
}

// giveUpHandOns ends, as the manager stops or restarts, the hand-ons of filed resets the key's
// next owner has not taken: the timers of those waiting to be sent again are cancelled. At a
// stop none is sent again, and each not taken stays in memory for its key's next activation
// here: it says so in one line, with how many, how many of them still await an answer (taken
// if it says so), and their keys. Before, a send again only waiting for its timer was dropped
// without a word (the last line about it said "sent again until it does"), and the line of a
// failure as the manager stopped came only if the answer came back before the stop was over,
// and shared its limiter with the first failure's line, which held it back. At a restart the
// next incarnation sends every filed reset whose key is another member's on shortly after it
// starts (handOnFiledResets), so nothing is said here; a timer left to fire would send one twice.
func (m *SessionManager) giveUpHandOns(restarting bool) {
	keys := slices.Sorted(maps.Keys(m.handingOn))
	for key, cancel := range m.handOnRetries {
		cancel()
		delete(m.handingOn, key)
	}
	m.handOnRetries = nil
	if len(keys) == 0 || restarting {
		return
	}
	m.log.Warn(handOnsLeftLine, "count", len(keys), "awaiting", len(m.handingOn), "sessions", keys[:min(len(keys), maxKeysLogged)])
}

// handOnFiledResets hands on, after a restarted manager starts, every reset filed for a key that
// is another member's (handOnFiledReset): the incarnation before may have been handing it on
// (its answer or its timer went with it), and no activation here will take it. Before, such a
// reset stayed in memory until the key came back here, if ever: the key's owner let the session
// go on until its next reset (TestFiledResetHandedOnIsSentAgainAfterTheManagerRestarts). Sent
// twice (the answer to the incarnation before was on its way), it is done once
// (Session.takeFiledReset). A first start has none: the entries live in this process's Deps.
//
// It goes restartHandOnDelay later, as a send again does (onRetryHandOn, which sends it to the
// key's owner then, unless the key is held here by then). The members that waited for the
// incarnation before to let go of the key went with it (waiters): none was told it let go, and
// each still takes this member for the key's holder until it asks again. Sent at once, the
// reset reached such a member, which forwarded it back here past its last hop, and this member
// activated the key for it beside that member's activation (or, each asking the other, the two
// passed it back and forth until that member asked again): the 6746264 double activation
// (TestFiledResetHandedOnAfterARestartIsNotSentBack). A send again of the incarnation before
// whose timer fired as it failed reaches this one: it is dropped (retryHandOn.restarted).
func (m *SessionManager) handOnFiledResets(c actor.Context) {
	m.d.resetsDue.Range(func(k, _ any) bool {
		key := k.(string)
		if m.elsewhere(key) != nil {
			if m.handingOn == nil {
				m.handingOn = map[string]bool{}
			}
			if m.handOnRetries == nil {
				m.handOnRetries = map[string]scheduler.CancelFunc{}
			}
			if m.afterRestart == nil {
				m.afterRestart = map[string]bool{}
			}
			m.handingOn[key], m.afterRestart[key] = true, true
			m.handOnRetries[key] = m.timers.SendOnce(restartHandOnDelay, c.Self(), &retryHandOn{key: key, restarted: true})
		}
		return true
	})
}

// restartHandOnDelay is how long a restarted manager waits before it hands on the filed resets
// of keys other members own (handOnFiledResets): waiterGone, the time in which a member that
// waits for this one asks it again (every releaseAnswerTimeout, at once after a silence), and
// is told it holds nothing, or is taken to have given up.
const restartHandOnDelay = waiterGone

// maxKeysLogged bounds the keys a line names (giveUpHandOns).
const maxKeysLogged = 10

// The lines of a filed reset handed on that the key's new owner did not take (sendFiledReset):
// the first failure of a hand-on, which is sent again; a failure of one begun as the manager
// stops, which is not; and, at the manager's stop, those not taken then (giveUpHandOns).
// Before, the first said "sent again" also as the manager stopped.
const (
	handOnFailedLine  = "the member that takes a session's key over did not take the reset filed for it; it is sent again until it does"
	handOnGivenUpLine = "the member that takes a session's key over did not take the reset filed for it, and the manager stops: it is not sent again; it stays in memory for the key's next activation here"
	handOnsLeftLine   = "the manager stops with filed resets handed on that the key's next owner has not taken: none is sent again; each one not taken stays in memory for its key's next activation here"
)

// retryHandOn sends the reset filed for key again (handOnFiledReset), failures times sent in
// vain so far.
type retryHandOn struct {
	key      string
	failures int
	// restarted: armed by a restarted manager as it started (handOnFiledResets). Until it
	// fires, another one for its key is the incarnation before's, whose timer fired as it
	// failed: it is dropped, or the reset went at once to a member that still took this one
	// for the key's holder.
	restarted bool
}

// onRetryHandOn sends the reset filed for a key again to the member that takes the key over now,
// unless the key's session here took it meanwhile (the key came back), or the key is this
// member's again: the entry then stays for the key's next activation here. (A session of the
// key in memory here has taken it as it loaded: Session.expireOnStart.)
func (m *SessionManager) onRetryHandOn(c actor.Context, r *retryHandOn) {
	if m.afterRestart[r.key] && !r.restarted {
		return
	}
	delete(m.afterRestart, r.key)
	delete(m.handingOn, r.key)
	delete(m.handOnRetries, r.key)
	defer m.answerDrains(c)
	v, ok := m.d.resetsDue.Load(r.key)
	to := m.elsewhere(r.key)
	if !ok || m.closing || to == nil || m.holdsKey(r.key) {
		return
	}
	m.sendFiledReset(c, to, r.key, v.(*overdue), r.failures)
}

// holdsKey reports whether the session of key is in memory here, stops here, or waits to be
// activated here. A filed reset
// is not sent on meanwhile (handOnFiledReset, onRetryHandOn): the member that takes the key over
// may wait for this one to let go, and forwards what reaches it for the key to this one, its
// holder, past its last hop; this member then activated the key again for it, beside that
// member (both ran the messages handed on:
// TestFiledResetHandedToTheMemberThatAskedForTheKeyIsNotSentBack, on a hand-on's first send).
// It goes with the key's hand-on once this member let go (startSuccessor), or stays for the
// session here. Before, a send again, or the send of a reset filed since the last was taken,
// went at once (TestFiledResetSentAgainWaitsWhileTheKeyIsHeldHere). An activation that waits
// here may hold the key for the member that takes it over too (it ranks first: that member
// waits, and forwards what reaches it here); it ends in a session here, which takes the reset
// as it loads, or is given up, and hands the reset on after it let go (cancelActivation).
// Until the fifty-first session's review it was not counted, as an activation given up handed
// no filed reset on.
func (m *SessionManager) holdsKey(key string) bool {
	_, stopping := m.stopping[key]
	return stopping || m.sessions[key] != nil || m.activating[key] != nil
}

// handingOnKeys are the keys, sorted, whose sessions a leaving member's drain waits for to hand
// them on or stop, busy or not, those whose filed reset it waits for the key's next owner to
// take, and those of the sessions a restart of the manager stopped until it has handed on the
// ones with work pending (answerDrains); nil when the member does not leave. Before, the filed resets' keys were
// left out: a drain that ran out waiting for those alone said it cancelled the turns of
// "sessions 0" (TestLeavingManagerListsTheFiledResetsItsDrainWaitsFor).
func (m *SessionManager) handingOnKeys() []string {
	if m.kept.successor == nil {
		return nil
	}
	keys := slices.Collect(maps.Keys(m.leavers))
	for k := range m.stopping {
		if m.handsOn(k) {
			keys = append(keys, k)
		}
	}
	keys = slices.AppendSeq(keys, maps.Keys(m.handingOn))
	keys = slices.AppendSeq(keys, maps.Keys(m.kept.stopped))
	slices.Sort(keys)
	return slices.Compact(keys)
}

// handsOn reports whether the key of a session that stops here is one a leaving member's drain
// waits for: all are but a key that waits out a pause after the store refused its session's
// writes and that no member takes over (its pause began as the key's successor answered nil,
// and still does). Its session starts here again once the pause is over, as in a single daemon,
// and hands nothing on; before, the drain waited for the pause (1 s doubling to a minute) and
// for the turn run again after it, and so did the stop
// (TestLeavingManagersDrainDoesNotWaitOutAPauseOfAKeyNoMemberTakes). The stop stops the pause:
// the work stays pending in the store for the key's next activation, wherever it is.
func (m *SessionManager) handsOn(key string) bool {
	_, paused := m.waitingOut[key]
	return !paused || m.elsewhere(key) != nil
}

// leftToHandOn reports whether a leaving member's drain still waits for a session to hand its
// key on or stop, for a filed reset to be taken, or for the keys of the sessions a restart of
// the manager stopped to be handed on (answerDrains, holdStopped).
func (m *SessionManager) leftToHandOn() bool {
	if len(m.leavers) > 0 || len(m.handingOn) > 0 || len(m.kept.stopped) > 0 {
		return true
	}
	for k := range m.stopping {
		if m.handsOn(k) {
			return true
		}
	}
	return false
}

// answerDrains ends the drains asked once no turn runs; while the member leaves, also once every
// session told so has handed its key on and stopped, and every filed reset has been taken. The
// daemon asks the drain right behind the Leave: a session that has not yet read its leaving
// (onLeave) has no turn running, and the drain ended before it had handed on, so the stop that
// follows stopped it without (TestLeavingManagersDrainWaitsForIdleSessionsToHandOn). A session
// started since for a key no member takes over (Leave.Successor answers nil) runs here, as in a
// single daemon, and hands nothing on: the drain waited for it to leave memory, and the stop
// waited out the whole drain deadline (TestLeavingManagersDrainEndsWithTheKeysNoMemberTakes).
// Nor is the key of such a session waited for while it waits out a pause after refused writes
// (handsOn).
func (m *SessionManager) answerDrains(c actor.Context) {
	if len(m.busy) > 0 || len(m.kept.drains) == 0 || m.kept.successor != nil && (m.leftToHandOn() || m.starting()) {
		return
	}
	for _, p := range m.kept.drains {
		if p != nil {
			c.Send(p, &Drained{})
		}
	}
	m.kept.drains = nil
}

// starting reports whether a session this leaving member starts (a key no member takes over)
// has yet to load: its activation is in flight, or the session has not answered probeLoad. Its
// pending work makes it busy as it loads, and the drain waits for that turn as for any other.
// Before, a restarted manager's recovery of such a key (onRestartStopped), or a Recover for
// one, answered the drain as the session was started, before it had loaded its pending
// message: the daemon stopped with the turn beginning behind the drain, and the stop cut it
// (TestManagerRestartedWhileItsMemberLeavesRunsAKeyNoMemberTakesBeforeItsDrainEnds).
func (m *SessionManager) starting() bool {
	return len(m.activating) > 0 || len(m.loading) > 0
}

// probeLoad has a leaving member's drain wait for the session of key, just started (pid), to
// load (starting): the session answers a GetState (SessionState, onLoaded) once its start has
// run, behind the busyChanged of the turn that start began. The answer comes to the mailbox,
// not to a future: ReenterAfter's continuation is a system message, which overtook that
// busyChanged.
func (m *SessionManager) probeLoad(c actor.Context, key string, pid *actor.PID) {
	if m.kept.successor == nil {
		return
	}
	m.loading[key] = true
	c.Request(pid, &GetState{})
}

// onLoaded is a session's answer to probeLoad: it has loaded. (The answer names no sender; a
// session answers the probe as it starts, so that an answer of an earlier session of the key,
// stopped since, is not to be had.)
func (m *SessionManager) onLoaded(c actor.Context, st *SessionState) {
	if !m.loading[st.SessionKey] {
		return
	}
	delete(m.loading, st.SessionKey)
	m.answerDrains(c)
}

// stoppingWithWork reports whether the stopped session of key is about to be replaced here.
func (m *SessionManager) stoppingWithWork(key string) bool {
	return len(m.stopping[key]) > 0 || m.rerun[key]
}

// recover activates the session of key as a recovery (see Recover). A session in memory is
// told instead: under fencing it may have loaded its state before another member's activation
// claimed the key and stored work it does not know of (Session.onRecover). hops counts the
// leaving members that forwarded the Recover here.
func (m *SessionManager) recover(c actor.Context, key string, hops int32) {
	if m.closing {
		m.whileClosing(c, key, routed{msg: &Recover{}, hops: hops})
		return
	}
	if _, ok := m.stopping[key]; ok {
		// Its session stops: the one started once it is gone (or, while the member leaves,
		// the key's successor) loads and runs the work. Dropped, it waited for the key's next
		// message or recovery sweep (TestRecoverWhileTheSessionStopsRunsTheWork).
		m.rerun[key] = true
		return
	}
	if a := m.activating[key]; a != nil {
		m.recovers(a, hops)
		return
	}
	if pid := m.sessions[key]; pid != nil {
		if m.d.Fencing {
			c.Send(pid, &Recover{})
		}
		return
	}
	if r := (routed{msg: &Recover{}, hops: hops}); m.handOn(c, key, r) {
		return
	} else if m.bouncedBack(c, key, r) {
		m.leaveBouncedRecover(key)
		return
	}
	// In a cluster a Recover follows a change of membership: the key moved, and its work is
	// no restart's to answer with a notice (sessions.recovery: notice), it runs. (Nor can a
	// Recover tell a dead member's work from that of one that left cleanly.) The lines of a
	// member's turns a stop cut short say so (Session.atNextStart).
	m.activate(c, key, !m.d.Clustered)
	if a := m.activating[key]; a != nil {
		m.recovers(a, hops) // given up, the activation hands the Recover on, hops and all (cancelActivation)
	}
}

// onGrainStopped stops the session of a key whose grain stopped: the cluster placed the key on
// another member (whose activation claims it, so this one's next write would be refused
// anyway), or this member leaves. The session is told, not poisoned: it answers the messages
// whose writes are in flight first.
func (m *SessionManager) onGrainStopped(c actor.Context, g *grainStopped) {
	if stopped := m.stoppedGrains[g.key]; len(stopped) > 0 {
		stopped = slices.DeleteFunc(stopped, g.grain.Equal)
		if len(stopped) == 0 {
			delete(m.stoppedGrains, g.key)
		} else {
			m.stoppedGrains[g.key] = stopped
		}
	}
	if cur := m.grains[g.key]; cur == nil || !cur.Equal(g.grain) {
		return // a grain the manager stopped itself, or one already replaced
	}
	delete(m.grains, g.key)
	if pid, ok := m.sessions[g.key]; ok {
		// It hands over once its turn is done, then asks to passivate (Session.leave).
		c.Send(pid, &moved{})
	}
	if m.activating[g.key] != nil && m.elsewhere(g.key) != nil {
		m.cancelActivation(c, g.key)
	}
}

// stoppedByManager reports whether grain is one the manager stopped for key (its session had
// stopped for good) and that has not yet reported its stop. Such a grain may still hand on a
// message that was in its mailbox before the stop; the session started for that message is
// not the grain's, and the grain's stop is no move of the key (the cluster activates a new
// grain for the key's next message).
func (m *SessionManager) stoppedByManager(key string, grain *actor.PID) bool {
	return slices.ContainsFunc(m.stoppedGrains[key], grain.Equal)
}

// Leaving the cluster (Leave). The member keeps its keys until its drain ends: the other members
// route them here and recover none of them, so a key whose turn still runs here is never
// activated elsewhere (it was, when the member withdrew before it drained: the agent ran on two
// members at once, and the first result was fenced). What this member does not run any more it
// forwards to the key's successor, so the drain is not fed and nothing waits for it.

// onLeave starts the member's leaving: every session in memory is told, and from now on a key
// without a session here goes to its successor.
func (m *SessionManager) onLeave(c actor.Context, l *Leave) {
	if l.Successor == nil {
		return
	}
	m.kept.successor = l.Successor
	m.leavers = make(map[string]bool, len(m.sessions))
	for key, pid := range m.sessions {
		m.leavers[key] = true
		c.Send(pid, &leaving{})
	}
	m.log.Info("the member leaves the cluster; its sessions hand their keys on", "sessions", len(m.sessions), "running", len(m.busy))
	m.handOnPaused(c)
}

// handOnPaused ends, while the member leaves, the pause of every key that waits one out after
// the store refused its session's writes and that another member takes over: the key goes on to
// its successor at once (startSuccessor), with what was held for it and a Recover for the work
// the refusal left pending, as it would at the pause's end. It runs at the Leave and at each
// pauseCheck, for a key that gains a successor during its pause (a member joins). Before, a key
// paused before the Leave held the drain, and the stop, for the rest of its pause (1 s doubling
// to a minute: TestLeaveHandsOnAKeyPausedBeforeIt), and one paused with no successor that gained
// one was handed on only if its pause ended before the stop; its work otherwise waited for the
// member's withdrawal and the recovery of the key's owner then
// (TestLeavingMemberHandsOnAPausedKeyThatGainsASuccessor). The successor's writes may be refused
// too: its session then waits out a pause of its own.
func (m *SessionManager) handOnPaused(c actor.Context) {
	if m.kept.successor == nil || m.closing {
		return
	}
	for _, key := range slices.Sorted(maps.Keys(m.waitingOut)) {
		if m.elsewhere(key) != nil {
			m.startSuccessor(c, key)
		}
	}
}

// bouncedBack reports whether r, for a key without a session here, must not start the key on
// this member: it leaves, another member takes its keys (the key's successor), and r has been
// forwarded as often as a message may be (maxForwardHops): members that leave at once (in a
// database outage, each losing its membership) each see the other as the successor, and passed
// it back and forth. Its work stays in the store for a member that stays (its recovery sweep,
// every member_ttl, or its change of membership once this one has gone), and a message is
// answered stopped, for its sender to send it again. Before, it ran where it was: a new session,
// never told that its member leaves (onLeave tells those in memory), claimed the key and ran
// the pending message, while the member that restarted in this one's place, which found no live
// holder of the key, ran it again (TestLeavingMemberDoesNotStartAKeyBouncedBackToIt). A member
// with no other member to hand on to runs the key, as a single daemon does.
func (m *SessionManager) bouncedBack(c actor.Context, key string, r routed) bool {
	if m.kept.successor == nil || r.hops < maxForwardHops || !crossesMembers(r.msg) {
		return false
	}
	to := m.elsewhere(key)
	return to != nil && !to.Equal(c.Self())
}

// leaveBouncedRecover drops the Recover of key that bouncedBack keeps from starting the key
// here, and says so: the key's work waits in the store for a member that stays.
func (m *SessionManager) leaveBouncedRecover(key string) {
	m.bouncedRecovers.LogQuiet(m.log, slog.LevelInfo, "the member leaves; a recovery of the session forwarded back to it is left to a member that stays", "session", key)
}

// handOnQuiesceTimeout bounds how long a leaving member waits for a platform to confirm a
// stopped session's sends before it hands the key on (a send left unconfirmed is sent again by
// the successor).
const handOnQuiesceTimeout = 10 * time.Second

// platformOf is the platform actor that sends the replies of key; nil when there is none.
func (m *SessionManager) platformOf(key string) *actor.PID {
	k, err := identity.ParseKey(key)
	if err != nil {
		return nil
	}
	return m.d.Platforms[k.Platform]
}

// handOn forwards r to the manager of the member that takes key over (elsewhere: the key's
// successor while this member leaves, or its owner when the key moved to another member), and
// reports whether it did. It does not when the key stays here, the message has been forwarded
// often enough already, or it is not a session message that crosses members.
func (m *SessionManager) handOn(c actor.Context, key string, r routed) bool {
	return m.handOnTo(c, m.elsewhere(key), key, r)
}

// handOnTo forwards r to the manager to as handOn does, and reports whether it did. r keeps
// its to_holder (Forward.to_holder): the manager that sent it here as to the key's holder
// still waits to activate the key, and does the request once this member has let go of it. A
// member that does not know its kind (an older one, in a rolling upgrade) answers Unsupported
// with it, and the requester sends it again until that owner does it; dropped here, the
// requester gave up at once, told to upgrade the member r was handed on to
// (TestHandedOnRequestForTheHolderIsSentAgainPastAnOlderSuccessor).
func (m *SessionManager) handOnTo(c actor.Context, to *actor.PID, key string, r routed) bool {
	if !m.mayHandOn(r) || to == nil || to.Equal(c.Self()) {
		return false
	}
	return m.forwardTo(c, to, key, r, r.toHolder)
}

// mayHandOn reports whether r may go on to another member (handOn): not past maxForwardHops,
// and not at all from a member that does not leave when another member handed it here (a
// leaving member's hand-over: that member chose this one, and this member's view of the
// cluster may be the older one), unless it was sent here as to the key's holder, which has let
// go of the key since. (A member that had not yet renewed since
// another began to leave sent the keys handed to it back, until its next renewal:
// TestClusterLeavingMemberHandsOnBeforeTheOthersRenew.)
func (m *SessionManager) mayHandOn(r routed) bool {
	return r.hops < maxForwardHops && (r.hops == 0 || m.kept.successor != nil || r.toHolder)
}

// forwardTo forwards r to the manager to (Forward), and reports whether it did: not a message
// that does not cross members. toHolder marks a message sent to the key's holder by a manager
// that waits to activate the key (Forward.to_holder), or one that came so and is handed on
// (handOnTo).
func (m *SessionManager) forwardTo(c actor.Context, to *actor.PID, key string, r routed, toHolder bool) bool {
	f := &Forward{Key: key, Hops: r.hops + 1, ToHolder: toHolder}
	switch msg := r.msg.(type) {
	case *Deliver:
		f.Msg = &Forward_Deliver{Deliver: msg}
	case *GetState:
		f.Msg = &Forward_GetState{GetState: msg}
	case *ResetSession:
		f.Msg = &Forward_ResetSession{ResetSession: msg}
	case *RequeueMessage:
		f.Msg = &Forward_RequeueMessage{RequeueMessage: msg}
	case *Withdraw:
		f.Msg = &Forward_Withdraw{Withdraw: msg}
	case *ResetDue:
		f.Msg = &Forward_ResetDue{ResetDue: msg}
	case *Recover:
		f.Msg = &Forward_Recover{Recover: msg}
	default:
		return false
	}
	m.forward(c, to, routed{msg: f, sender: r.sender})
	return true
}

// crossesMembers reports whether msg is a session message that can be forwarded to another
// member (forwardTo).
func crossesMembers(msg any) bool {
	switch msg.(type) {
	case *Deliver, *GetState, *ResetSession, *RequeueMessage, *Withdraw, *ResetDue, *Recover:
		return true
	}
	return false
}

// onForward routes a message another member forwarded here (a leaving member's hand-over, a
// request for the key's holder) as the key's grain would have. One of a kind this version does
// not know is answered Unsupported (answerUnsupported).
func (m *SessionManager) onForward(c actor.Context, f *Forward) {
	var msg any
	switch x := f.Msg.(type) {
	case *Forward_Deliver:
		msg = x.Deliver
	case *Forward_GetState:
		msg = x.GetState
	case *Forward_ResetSession:
		msg = x.ResetSession
	case *Forward_RequeueMessage:
		msg = x.RequeueMessage
	case *Forward_Withdraw:
		msg = x.Withdraw
	case *Forward_ResetDue:
		msg = x.ResetDue
	case *Forward_Recover:
		m.recover(c, f.Key, f.Hops)
		return
	default:
		// A kind of message a later version added (a rolling upgrade is under way): answered
		// at once, so that its requester does not wait out its timeout for nothing.
		m.answerUnsupported(c, f)
		return
	}
	m.route(c, f.Key, routed{msg: msg, sender: c.Sender(), hops: f.Hops, toHolder: f.ToHolder})
}
