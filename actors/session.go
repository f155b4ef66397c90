package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// Session is the actor of one session key. It alone owns the key's identity, its pending queue
// and its transcript buffer: every turn's identity is built here from this state and the
// triggering message, and handed to its Turn by value.
//
// An inbound message is answered only once its write is acknowledged by the persistence actor,
// so an acknowledged message is durable. Turns run one at a time in arrival order; a message
// that arrives while a turn runs waits in the queue (up to the cap). State is rebuilt from the
// store on every start, so a restart after a panic or a passivation carries on where it stopped.
type Session struct {
	d   *Deps
	key string       // the actor's name under the manager
	log *slog.Logger // built on first use (logger): most sessions never log

	cur      *persistence.Session // current incarnation; nil until the first message
	prev     *persistence.Session // the ended session the route still points to, if any
	lastSeq  int64
	lastOut  int64
	routeGen int64
	queue    []*item
	running  *turnRun
	history  []histEntry // the recent active transcript, for the agent and for /undo and /retry
	seen     idSet       // inbound message ids accepted in this activation
	mode     string

	// blankOf names the current session while a reset (/new, /reset, an operator's) began it
	// in this activation, and its rows through seq blankThrough are commands and their answers
	// alone: fresh tells from memory that it holds nothing yet, also while the store lacks the
	// writes the spool holds.
	blankOf      string
	blankThrough int64

	epoch     int64 // the key's claim (Deps.Fencing); 0 when not claimed
	fencedOut bool  // a newer activation claimed the key: this one hands over and stops
	stale     bool  // memory is behind the store: the key is activated again (onRecover, restartFromStore)
	refused   bool  // stale because the store refused a write as unavailable: the next activation waits
	leaving   bool  // the member leaves the cluster: no new turn, and the key goes on once idle (Leave)
	halted    bool  // the daemon stops and a stop signal ended this session's agent: no new turn (stoppedBySignal)
	crashed   bool  // it follows a crash past the restart budget: it stops at once (crashOut)

	inflight   []*pendingWrite      // by write id, ascending
	stopResend scheduler.CancelFunc // the armed resend tick; nil when none is armed

	activatedAt  time.Time
	lastActivity time.Time
	lastTouched  time.Time // last message other than ticks (passivation)
	busy         bool
	dead         bool // set on the failed incarnation once it is being replaced
	passivating  bool // asked the manager to stop it
	unloaded     bool // started while the spool held writes: not loaded yet (waitForStore)
	recovered    bool // spawned to recover work left by the last run (see NewSession)

	// unusual is the state set only while something unusual happens; nil otherwise (rareState).
	unusual *rareState
}

// rareState is the part of a session's state that is set only while something unusual happens:
// a crash, an automatic reset, an interrupt, a hand-over, a write that may have committed. It
// lives behind one pointer, allocated on first need and dropped again once empty (tidyRare), so
// that an idle session stays in a smaller size class (perf-anchors §8 G7: an idle session costs
// at most 2 KiB of heap; TestSessionSize). Set its fields through Session.rare; code that only
// reads checks Session.unusual for nil, so that reading allocates nothing.
type rareState struct {
	// continuity is the note the first turn of a session after an automatic reset gets.
	continuity string
	// interrupted are the messages of turns cut short by a newer message (queue mode
	// interrupt): the next answer answers them too.
	interrupted []*item
	overdue     *overdue // a reset that fell due while the session worked (expireIfIdle)
	// unsure are the inbound writes of this activation that failed in a way that may have
	// committed (a COMMIT whose answer was lost), by message id (adoptStored, adoptUnsure).
	unsure map[string]*item
	// copies are the seqs of earlier writes of messages taken since under another seq, whose
	// answers were lost (unsure then), by message id: such a write may be stored as well (in
	// the spool while the database fails), and the later one is then refused as its duplicate
	// at the replay (noteCopy, withdraw.go).
	copies  map[string]seqOf
	handoff []routed // requests for the key's next activation, sent once the session stops
	// refusedWhy and refusedErr say why the session starts again from the store after a write
	// refused as unavailable (restartFromStoreAt): its manager's line says it (passivate).
	refusedWhy string
	refusedErr error
	// probation is the request for the probation token of a suspect message (Probation); nil
	// when the session neither holds nor waits for it.
	probation *probationRun
	// ending are the turns cancelled by an interrupt, /stop or a boundary whose agent call has
	// not returned yet: no turn starts before they have (cancelAwaited).
	ending []endingCall
	// loadFailed is why the session's last claim or load failed while it waits to load
	// (waitToLoad); nil when it loaded, or waits only for the spool.
	loadFailed error
	// spill is the part of the queue past its cap that waits in the store (spill.go); nil
	// while the whole queue is in memory.
	spill *spill
	// aside are the stored messages to set aside without running them, a page at a time
	// (aside.go), in order.
	aside []*storedAside
	// withdrawals are the messages withdrawn (withdraw.go) whose archives are in flight: a
	// command that drops the queue meanwhile marks them dropped (stopWork), as they were queued
	// when it ran, and a refused archive then sets them aside rather than queue them again.
	withdrawals []*item
	// dropped are the messages a command dropped while their writes were in flight, stored
	// since, waiting for the command's write to be answered (setAsideDropped).
	dropped []droppedItem
	// commands are the commands whose writes are in flight, by message id, with the senders
	// that delivered them again meanwhile (commandInFlight).
	commands map[string][]*actor.PID
	// held are the session's writes behind a turn's result the store refused, which it writes
	// again (heldWrites); nil when it holds none.
	held *heldWrites
	// life survives restarts of this actor, so a new incarnation knows how often it crashed and
	// on which messages. It is nil until the first crash: the failing incarnation creates it
	// and files it in Deps.lifelines, where the next incarnation finds it; the last one removes
	// it when it stops.
	life *lifeline
}

// rare returns the session's rarely set state for a change, allocating it on first need.
func (s *Session) rare() *rareState {
	if s.unusual == nil {
		s.unusual = &rareState{}
	}
	return s.unusual
}

// tidyRare drops the rarely set state once nothing in it is set. Receive calls it after each
// message it handles; no code keeps a pointer to it across messages.
func (s *Session) tidyRare() {
	if r := s.unusual; r != nil && r.continuity == "" && len(r.interrupted) == 0 && r.overdue == nil &&
		len(r.unsure) == 0 && len(r.copies) == 0 && len(r.handoff) == 0 && r.probation == nil && r.life == nil && len(r.ending) == 0 && r.spill == nil && len(r.aside) == 0 &&
		len(r.dropped) == 0 && len(r.commands) == 0 && r.loadFailed == nil && r.held == nil && len(r.withdrawals) == 0 {
		s.unusual = nil
	}
}

// life returns the session's lifeline, nil until its first crash.
func (s *Session) life() *lifeline {
	if s.unusual == nil {
		return nil
	}
	return s.unusual.life
}

// probation returns the session's probation request, nil when it neither holds nor waits for
// the token.
func (s *Session) probation() *probationRun {
	if s.unusual == nil {
		return nil
	}
	return s.unusual.probation
}

// lifeline is what a session actor's incarnations share across supervisor restarts: never
// across passivation or process restarts.
type lifeline struct {
	restarts int
	suspects []int64 // seqs that were running when the last incarnation crashed
	// copies maps a suspect's seq to the seq of an earlier copy of its write that the store
	// may hold it under instead (noteCopy); afterCrash counts the crash under the one the
	// loaded queue holds.
	copies  map[int64]int64
	crashes map[int64]int // seq → crashes while it ran; nil until a crash is counted
	// leaving: the member was leaving the cluster when the last incarnation crashed (Leave);
	// the next one starts no turn either, and hands the key on.
	leaving bool
	// ending are the cancelled turns whose agent calls had not returned when the last
	// incarnation crashed: the next one waits for them as it would (cancelAwaited). Their
	// callEnded and cancelOverdue reach it (the PID survives the restart).
	ending []endingCall
	// busy: the last incarnation had work in hand (a running turn, an unanswered write). The
	// manager goes on counting the key busy until the next incarnation says it is idle
	// (updateBusy): a drain ended by the crash would stop the daemon while the rerun starts.
	busy bool
	// panic is what the last crash panicked with: the crashed-out incarnation hands it to the
	// manager (passivate.panic) for its line.
	panic string
}

// item is one inbound message waiting for (or in) a turn.
type item struct {
	seq       int64
	sessionID string
	src       identity.Source
	messageID string
	text      string
	at        time.Time
	arrived   time.Time // real arrival time (debounce)
	durable   bool
	// outAfter is the key's outbox seq before the message was taken: its answers come after
	// (DeliverResult.OutboxAfter); 0 when not known (a message recovered from the store).
	outAfter int64
	// restarts counts the unclean stops of the daemon while it was its session's head pending
	// message (persistence.Message.Attempts, raised by Store.BeginRun).
	restarts  int
	dropped   bool         // a command dropped it while its write (or its withdrawal's archive) was in flight: set aside when it lands
	inTail    bool         // it waits in the spill's tail (spill.go), not in the queue
	requester *actor.PID   // waits for DeliverResult; nil after the ack or for recovered items
	repeats   []*actor.PID // senders of the same message id while its write was in flight
}

type turnRun struct {
	pid     *actor.PID
	id      string
	items   []*item
	steered []*item // sent into the running turn (queue mode steer), in order
	started time.Time
	note    string // the continuity note the turn was given (rareState.continuity), if any
	steers  bool   // messages may be steered into it (runTurn.steer)
	marks   bool   // its head is marked before its agent starts (runTurn.mark, marksAtSlot)
}

// before reports whether the turn's messages came before it: it is a newer message, which may
// interrupt or steer the turn. An adopted one (its write's answer was lost, and it was sent
// again) may be older than the turn's, though it arrives later and heads the queue: it runs
// after the turn, in its place (queueInPlace).
func (r *turnRun) before(it *item) bool {
	last := r.items[len(r.items)-1]
	if len(r.steered) > 0 {
		last = r.steered[len(r.steered)-1]
	}
	return it.sessionID != last.sessionID || it.seq > last.seq
}

// NewSession returns the props of session actors, spawned as children of the SessionManager
// and named by their key (a session reads its key from its PID). One value serves every session
// of d. recovered marks the activation that recovers unfinished work at daemon start: with
// SessionConfig.Recovery "notice" its pending messages are answered with a notice instead of
// being run again.
func NewSession(d *Deps, recovered bool) *actor.Props {
	d.props()
	if recovered {
		return d.recoveredProps
	}
	return d.sessionProps
}

func newSessionProps(d *Deps, recovered bool) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &Session{d: d, recovered: recovered}
	}, d.Mailbox("session")...)
}

// childName is the name a child was spawned with under its parent.
func childName(c actor.Context) string {
	self, parent := c.Self().Id, c.Parent().Id
	if len(self) > len(parent)+1 && self[:len(parent)] == parent && self[len(parent)] == '/' {
		return self[len(parent)+1:]
	}
	return self
}

// logger returns the session's logger, built on first use.
func (s *Session) logger() *slog.Logger {
	if s.log == nil {
		s.log = s.d.Log.With("actor", "session", "session", s.key)
	}
	return s.log
}

// debugOn reports whether Debug lines are logged, so a session that never logs builds no logger.
func (s *Session) debugOn() bool { return s.d.Log.Enabled(s.d.Ctx, slog.LevelDebug) }

// restarts is how often this session restarted in its current activation.
func (s *Session) restarts() int {
	if s.life() == nil {
		return 0
	}
	return s.life().restarts
}

// QuarantineAfter is how many crashes of its session a message may cause before it is set
// aside. The session's restart budget (SessionConfig.Restarts) must be at least this.
const QuarantineAfter = 3

// Receive dispatches the session's messages.
func (s *Session) Receive(c actor.Context) {
	if _, ok := c.Message().(*actor.Stopped); ok {
		if s.life() != nil {
			s.d.lifelines.Delete(s.key) // the activation is over; the next one starts afresh
		}
		// The actor stays reachable after its stop: protoactor keeps a stopped child's PID, which
		// holds its process and so this actor, in a slot of its parent's set of children until
		// a later child overwrites it (PIDSet.Remove shortens its slice without clearing the
		// slot). So every session of the manager's busiest moment stayed in memory, with its
		// history, after it passivated (TestPassivatedSessionsFreeTheirState). A stopped actor
		// handles nothing more: it lets go of all it holds.
		*s = Session{dead: true}
		return
	}
	if s.dead || (s.passivating || s.fencedOut) && !s.whileStopping(c) || s.unloaded && !s.whileWaiting(c) {
		return
	}
	switch c.Message().(type) {
	case *idleCheck, *resendTick, *heldTick, *draining, *persistence.WritesTaken, *overdueRetry, *debounceTick, *persistence.WriteResult,
		*Recover, *signalledTurn,
		*GetState: // a read of the live state (GET /v1/sessions…) is no activity: a poll must not keep it
	default:
		s.lastTouched = time.Now() // the passivation clock: real time, not the session clock
	}
	switch m := c.Message().(type) {
	case *actor.Started:
		s.start(c)
	case *Deliver:
		s.onDeliver(c, m)
	case *persistence.WriteResult:
		s.onWriteResult(c, m)
	case *TurnFinished:
		s.onTurnFinished(c, m)
	case *signalledTurn:
		s.onTurnEnded(c, m.m)
	case *turnPanicked:
		if s.running != nil && s.running.id == m.TurnID {
			// The session restarts with its state reloaded from the store and runs the message
			// again; a message that crashes its session QuarantineAfter times is quarantined.
			s.d.Metrics.Actor("session").Box.Failed() // the mailbox never sees it received
			// The stack at Debug only: the crash's line (onRestarting, or the manager's
			// crashedOut past the restart budget) names the panic, and a crash loop would
			// otherwise log a stack a second.
			s.logger().Debug("the turn panicked; its stack", "turn", m.TurnID, "panic", m.Err, "stack", string(m.Stack))
			panic(m.Err)
		}
	case *GetState:
		c.Respond(s.state())
	case *ResetSession:
		s.onReset(c, m)
	case *RequeueMessage:
		s.onRequeue(c, m)
	case *Withdraw:
		s.onWithdraw(c, m)
	case *ResetDue:
		s.onResetDue(c, m)
	case *idleCheck:
		s.onIdle(c, m)
	case *moved:
		s.leave(c, "the session's key moved to another member; it hands the key on once its running turn is done")
	case *leaving:
		s.leave(c, "the member leaves the cluster; the session hands its key on once its running turn is done")
	case *Recover:
		s.onRecover(c)
	case *debounceTick, *spillRetry:
		s.tryStart(c)
	case *asideRetry:
		s.asideNext(c)
	case *callEnded:
		s.onCallEnded(c, m.TurnID, false)
	case *cancelOverdue:
		s.onCallEnded(c, m.TurnID, true)
	case *resendTick:
		s.resend(c)
	case *heldTick:
		s.onHeldTick(c)
	case *draining:
		s.drainingNow(c)
	case *persistence.WritesTaken:
		s.onWritesTaken(c)
	case *overdueRetry:
		s.onOverdueRetry(m)
	case *slotTaken:
		s.onSlotTaken(c, m)
	case *probationGranted:
		s.onProbationGranted(c, m)
	case *probationLost:
		s.onProbationLost(c, m)
	case *actor.Restarting:
		s.onRestarting(c)
	case *actor.Stopping:
		// Shutdown or passivation: a running turn is cancelled (stopped here) and its
		// messages stay pending in the store, to run again at the next activation. From here on
		// the session acts on nothing (its turn's termination is not a crash).
		s.dead = true
		s.endProbation(c)
		if s.running != nil {
			c.Stop(s.running.pid)
		}
		if s.stopResend != nil { // a stopped actor re-sends nothing
			s.stopResend()
			s.stopResend = nil
		}
		// The refusals of the held writes that their limiters hold back are reported before
		// the line that says the session stops with them: after it, a line that says the
		// session keeps the result and writes it again told an operator the opposite
		// (TestDrainWaitsForAHeldResult).
		s.reportHeldRefusals()
		if turns := s.heldTurns(); len(turns) > 0 {
			// A drain's deadline passed while the store refused them (or the member let the
			// key go): at-least-once, as for a turn cut short by the stop.
			s.logger().Warn("the session stops with turn results the store has not taken; their messages "+s.atNextStart(),
				"turns", strings.Join(turns, ","))
		}
		if u := s.unusual; u != nil {
			for _, e := range u.ending { // the cancelled calls end on their own; nobody waits
				e.stopTimer()
			}
			u.ending = nil
		}
		// A message whose write is still in flight gets an honest answer, not silence: a stop
		// that does not wait for the session's writes (a daemon stopping past its drain, a
		// key moving off a cluster member) must not leave its sender waiting in vain.
		s.answerUnstored(c, "the session stopped before the message was stored; send it again with the same message_id")
		s.answerOrphans(c, "the session stopped before the message was stored; send it again with the same message_id")
		s.stopHeld()
		if s.busy {
			c.Send(c.Parent(), &busyChanged{key: s.key, busy: false})
		}
	}
	if s.probation() != nil && !s.dead {
		s.settleProbation(c)
	}
	if s.unusual != nil && s.unusual.overdue != nil {
		s.storeOverdue(c)
	}
	s.tidyRare()
}

// start loads the session's durable state and resumes unanswered work.
func (s *Session) start(c actor.Context) {
	s.key = childName(c)
	if l, ok := s.d.lifelines.Load(s.key); ok {
		life := l.(*lifeline)
		s.rare().life = life
		s.leaving = life.leaving
		s.rare().ending, life.ending = life.ending, nil
		s.busy, life.busy = life.busy, false
	}
	if _, out := s.d.crashedOut.LoadAndDelete(c.Self().Id); out {
		s.crashOut(c)
		return
	}
	s.mode = s.d.Config.QueueMode
	s.activatedAt = s.d.now()
	if !s.d.Fencing && s.restarts() > 0 {
		// The failed incarnation's writes may still wait in the persistence actor: load only
		// once they are committed (or spooled), or this one would not know of them (a message
		// stored but never run, a seq used twice). They were sent before this flush, so it
		// waits for them.
		if _, err := c.RequestFuture(s.d.Persist, &persistence.Flush{}, restartFlushTimeout).Result(); err != nil {
			panic(fmt.Errorf("session %s: wait for the writes of the failed incarnation: %w", s.key, err))
		}
	}
	if s.d.Spooling.Load() {
		s.waitForStore(c)
		return
	}
	s.load(c)
}

// crashOut stops the incarnation that follows a crash past the session's restart budget
// (sessionSupervisor) without loading anything: it takes no work, hands what reaches it to
// the manager for the key's next activation, as a passivating session does, and asks to be
// stopped once the calls its predecessor cancelled have returned. The manager starts the key
// again at once with what it was asked meanwhile, or after a pause from the store.
func (s *Session) crashOut(c actor.Context) {
	s.crashed = true
	s.fencedOut = true // (it sends nothing; what it is asked goes to the next activation)
	s.stopWhenSettled(c)
}

// load claims the key (Deps.Fencing), reads the session's durable state and resumes its
// unanswered work.
func (s *Session) load(c actor.Context) {
	if s.d.Fencing {
		// Claim before loading: the snapshot then holds every write the key's previous
		// activation will ever make (its later ones are fenced).
		var seen *persistence.ClaimSeen
		if v, ok := s.d.claimsSeen.Load(s.key); ok {
			cs := v.(persistence.ClaimSeen)
			seen = &cs
		}
		claimed, err := s.d.Store.Claim(s.d.Ctx, s.key, s.d.Node, s.activatedAt, seen)
		if errors.Is(err, persistence.ErrClaimChanged) {
			s.claimedMeanwhile(c, err)
			return
		}
		if err != nil {
			if s.waitToLoad(c, "claim", err) {
				return
			}
			panic(fmt.Errorf("session %s: claim: %w", s.key, err))
		}
		s.epoch = claimed.Epoch
		// An incarnation after a crash claims the key again only while this claim is its latest.
		s.d.claimsSeen.Store(s.key, persistence.ClaimSeen{Epoch: claimed.Epoch, Owner: s.d.Node})
		if h := claimed.Counted; h != nil {
			// The member that held the key died: its death counts against the message it was
			// running (or was next to run), which afterUncleanStops quarantines at the limit.
			s.logger().Warn("took the session over from a cluster member that stopped uncleanly; its head message counts it",
				"previous_owner", claimed.Previous, "epoch", claimed.Epoch, "message_id", h.MessageID, "strikes", fmt.Sprintf("%d/%d", h.Attempts, QuarantineAfter))
			s.d.Metrics.SessionsTakenOver.Inc()
		}
	}
	// The first messages of a backlog only, as many as a queue past its cap holds (spill.go):
	// the rest wait in the store.
	snap, err := s.d.Store.LoadSession(s.d.Ctx, s.key, s.d.Config.HistoryLimit, s.d.Config.QueueCap+1)
	if err != nil {
		if s.waitToLoad(c, "load", err) {
			return
		}
		panic(fmt.Errorf("session %s: load: %w", s.key, err))
	}
	if s.unusual != nil && s.unusual.loadFailed != nil {
		s.unusual.loadFailed = nil
		// The counterpart of waitToLoad's line, which no spool was involved in (a cluster has
		// none): the database answers again. Limited as that line is, for all sessions.
		if n, ok := s.d.loadResumes.Allow(); ok {
			s.logger().Info("the database answers again; the session has loaded", "sessions", n)
		}
	}
	if snap.Route != nil {
		s.routeGen = snap.Route.Generation
	}
	s.lastOut = snap.LastOutboxSeq
	if snap.Session != nil && !snap.Session.EndedAt.IsZero() {
		s.prev = snap.Session
	}
	if snap.Session != nil && snap.Session.EndedAt.IsZero() {
		s.cur = snap.Session
		if s.cur.QueueMode != "" {
			s.mode = s.cur.QueueMode
		}
		s.lastSeq = snap.LastSeq
		s.lastActivity = snap.Session.LastActivityAt
		if o := overdueOf(s.cur); o != nil {
			// A reset fell due while the session worked, in an earlier run or on another
			// member (storeOverdue): it is due whatever the session's activity says.
			s.rare().overdue = o
		}
		for _, m := range runOrder(snap.History) {
			if m.Role == persistence.RoleUser && m.Status == persistence.StatusPending {
				continue // it joins the history when its turn runs, as one of the turn's messages
			}
			if m.Status == persistence.StatusQuarantined {
				// Set aside unrun, as the live session left it out: the message that took the
				// daemon down, fed to the agent again at each load. Requeued, it joins as pending.
				continue
			}
			if m.Role == persistence.RoleUser || m.Role == persistence.RoleAssistant {
				msg := persistFromRow(m)
				if m.Role == persistence.RoleUser {
					// The sender's prefix, as the turn that first showed it had it.
					src := s.sourceOf(s.cur)
					src.UserID, src.UserName = m.UserID, m.UserName
					msg.Text = s.agentText(src, m.Content)
				}
				s.history = append(s.history, histEntry{seq: m.Seq, raw: m.Content, msg: msg, sender: m.UserID})
			}
		}
		s.restoreContinuity(snap.History)
		s.restoreInterrupted(snap.History)
		for _, m := range snap.Pending {
			src := s.sourceOf(s.cur)
			src.UserID, src.UserName = m.UserID, m.UserName
			s.queue = append(s.queue, &item{seq: m.Seq, sessionID: m.SessionID, src: src,
				messageID: m.MessageID, text: m.Content, at: m.CreatedAt, durable: true, restarts: m.Attempts})
			s.seen.add(m.MessageID)
		}
		if rest := snap.PendingCount - len(snap.Pending); rest > 0 && len(snap.Pending) > 0 {
			s.rare().spill = &spill{sessionID: s.cur.ID, after: snap.Pending[len(snap.Pending)-1].Seq,
				through: snap.LastSeq, stored: rest}
		}
	}
	for i := range snap.Unconfirmed {
		s.sendOutboundAgain(c, &snap.Unconfirmed[i])
	}
	s.resumeAside(c)
	s.setAsideLeftBehind(c, snap)
	if s.restarts() > 0 {
		s.afterCrash(c)
	}
	s.afterUncleanStops(c)
	s.expireOnStart(c)
	if s.recovered && s.life() == nil && s.d.Config.Recovery == RecoveryNotice {
		// Only the first incarnation recovers: a restarted one has a lifeline.
		s.noticePending(c)
	}
	if s.debugOn() && (s.hasQueued() || len(snap.Unconfirmed) > 0) {
		// Per session at Debug: a start after a backlog resumes thousands, which the manager's
		// "recovering sessions" line counts.
		s.logger().Debug("session resumed", "pending", s.waiting(), "unconfirmed", len(snap.Unconfirmed))
	}
	s.tryStart(c)
}

// claimedMeanwhile stops the session whose claim the store refused on its condition
// (ErrClaimChanged): another member claimed the key after this activation looked the key's claim
// up, and the members it asked to let go of the key did not know of that claim (views that
// differ: a member that did not know this one, and that this one did not know). The session loads
// nothing and runs nothing, and what it is asked goes back to its manager, which activates the
// key again (passivate.rerun): that activation looks the claim up again and asks the member that
// made it, whose session holds the key, and claims it once that member lets go. Before, the claim
// went through beside the other's, and the key's pending message ran on both members
// (TestRacingClaimsOfOneSeenClaimRunTheMessageOnce).
//
// The claim that came since may also be an operator's (`agentgate sessions reset` with no
// member answering), this member's own: a claim of this session whose answer was lost (the
// store committed it, and the session's wait to load ran it again on the same condition), or
// one another member promised to this member through the store (promise.go) after the lookup
// read it. Its line says which (claimedLine): before, it said another member had claimed the
// key in every case (TestRefusedClaimSaysWhoClaimedTheKey).
func (s *Session) claimedMeanwhile(c actor.Context, err error) {
	msg, args := s.claimedLine(err)
	s.logger().Info(msg, append(args, logging.Err(err))...)
	s.stale = true
	s.handOverAll(c, errHandedOver)
	s.stopWhenSettled(c)
}

// claimedLine returns the line, and its attributes, of a claim the store refused on its
// condition (err): who made the claim that came since, as the store's refusal names it
// (persistence.ClaimChangedError).
func (s *Session) claimedLine(err error) (string, []any) {
	var refusal *persistence.ClaimChangedError
	if !errors.As(err, &refusal) || refusal.Latest == nil {
		// The store could not read the claim that came since (PostgreSQL reads it after the
		// refusal).
		return "the session was claimed again since this member looked up its claim; the key is activated again", nil
	}
	latest := refusal.Latest
	switch {
	case latest.Owner == persistence.ResetClaimOwner:
		return "an operator's reset (agentgate sessions reset) claimed the session since this member looked up its claim; the key is activated again",
			[]any{"epoch", latest.Epoch}
	case latest.Owner == s.d.Node && refusal.PromisedBy != "":
		// The member whose claim the lookup read promised it to this one through the store
		// (promise.go) after the lookup: no answer of this member's was lost
		// (TestRefusedClaimSaysWhoClaimedTheKey).
		return "another member promised this member its claim of the session since this one looked up the claim; the key is activated again",
			[]any{"promised_by", refusal.PromisedBy, "epoch", latest.Epoch}
	case latest.Owner == s.d.Node:
		return "this member's own claim of the session came since it looked up the claim (a claim whose answer was lost); the key is activated again",
			[]any{"epoch", latest.Epoch}
	case refusal.PromisedBy != "":
		return "another member claimed the session since this one looked up its claim; the key is activated again",
			[]any{"claimed_by", latest.Owner, "promised_by", refusal.PromisedBy, "epoch", latest.Epoch}
	}
	return "another member claimed the session since this one looked up its claim; the key is activated again",
		[]any{"claimed_by", latest.Owner, "epoch", latest.Epoch}
}

// Waiting for the store. While the spool holds writes the database does not show them yet, and
// a session that loaded its state then would not know of those that are its own: it would
// reuse their seqs, run a message twice or never. A session in memory keeps its state and goes
// on spooling; one that starts (activated, or restarted after a crash) waits until the spool
// has drained, and refuses messages meanwhile with an explicit "unavailable" (HTTP 503), which
// the sender can retry.

// storeTick wakes a waiting session to check the spool again.
type storeTick struct{}

// storeWaitTick is how often a waiting session checks whether the spool has drained.
const storeWaitTick = time.Second

func (s *Session) waitForStore(c actor.Context) {
	if !s.unloaded {
		s.unloaded = true
		s.logger().Warn("the database is unavailable and writes wait in the spool; the session loads once they are replayed")
	}
	s.timers(c).SendOnce(storeWaitTick, c.Self(), &storeTick{})
}

// waitToLoad makes a session whose claim or load the database refused as unavailable wait as
// it waits for the spool: it refuses messages with "unavailable" (HTTP 503) and tries again
// every storeWaitTick. It reports false for any other error, which crashes the session. Before,
// an outage crashed every session that started: with messages held for its key it crashed out
// and started again at once, thousands of times a second across the chats that wrote, with a
// line each time, for as long as the outage lasted (a cluster soak's PostgreSQL restart).
func (s *Session) waitToLoad(c actor.Context, op string, err error) bool {
	if !errors.Is(err, persistence.ErrUnavailable) || s.d.Ctx.Err() != nil {
		return false
	}
	if s.leaving {
		// A leaving member's session restarted after a crash (its lifeline says the member
		// leaves, and no Leave tells it again) waits no more than one told while it waits.
		s.unloaded = true
		s.leaveUnloaded(c)
		return true
	}
	if s.rare().loadFailed == nil {
		if n, ok := s.d.loadWaits.Allow(); ok {
			s.logger().Warn("the database is unavailable; the session loads once it answers, and refuses messages meanwhile",
				"op", op, "sessions", n, logging.Err(err))
		}
	}
	s.rare().loadFailed = err
	s.unloaded = true
	s.timers(c).SendOnce(storeWaitTick, c.Self(), &storeTick{})
	return true
}

// storedHere reports whether the store holds the inbound message m as one of this key's (a
// waiting session cannot tell from memory). A message only in the spool is not found: its
// sender is told to send it again, and its next delivery, once the session has loaded, is a
// duplicate.
func (s *Session) storedHere(m *Deliver) bool {
	if m.MessageId == "" {
		return false
	}
	row, err := s.findStored(sourceFromProto(m.Source), m.MessageId)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(s.d.Ctx, duplicateCheckTimeout)
	defer cancel()
	sess, err := s.d.Store.Session(ctx, row.SessionID)
	return err == nil && sess.Key == s.key
}

// whileWaiting handles a message of a waiting session and reports whether Receive should go on
// with it: only stopping, restarting and a request for its state.
func (s *Session) whileWaiting(c actor.Context) bool {
	switch m := c.Message().(type) {
	case *storeTick:
		if s.d.Spooling.Load() {
			s.waitForStore(c)
			return false
		}
		s.unloaded = false
		// Only a session that waited for the spool says it drained. One whose claim or load
		// failed tries again silently and says so once it loads (load). tidyRare keeps
		// loadFailed for this: before, it dropped it after the first try, and every waiting
		// cluster member's session said "the spool has drained" each second of an outage.
		if s.unusual == nil || s.unusual.loadFailed == nil {
			s.logger().Info("the spool has drained; the session loads")
		}
		s.load(c)
	case *Deliver:
		if s.storedHere(m) {
			// A re-delivery of a message taken before: "send it again" would say it was not.
			c.Respond(s.result(m, platforms.Duplicate, ""))
			return false
		}
		c.Respond(&DeliverResult{SessionKey: s.key, MessageId: m.MessageId, ErrorCode: "unavailable",
			Error: "the database is unavailable and this chat's session cannot load until it answers (and the writes waiting in the spool are replayed); send the message again shortly"})
	case *idleCheck:
		if m.makeRoom { // nothing is loaded to stop, but the manager must not count it as stopping
			c.Send(c.Parent(), &roomDeclined{key: s.key, pid: c.Self()})
		}
	case *ResetSession:
		c.Respond(&ResetResult{Error: "the database is unavailable; the session cannot load until it answers", ErrorCode: ErrCodeUnavailable})
	case *RequeueMessage:
		c.Respond(&RequeueResult{MessageId: m.MessageId, ErrorCode: "unavailable",
			Error: "the database is unavailable; the session cannot load until it answers; retry later"})
	case *Withdraw:
		c.Respond(&WithdrawResult{Error: "the database is unavailable; the session cannot load until it answers"})
	case *ResetDue:
		// A timer's nudge waits for the next scan; a reset another member filed is done once
		// the session has loaded (expireOnStart), or handed on with the key if it moves first;
		// not in the place of a newer one (supersedes).
		if o := filedResetOf(m); o != nil {
			s.d.fileResetUnlessNewer(s.key, o)
			answerHandedOnReset(c)
		}
	case *moved:
		// The key lives on another member now: this one must not claim it once the spool
		// drains. It stops without loading; what it is asked meanwhile goes to the manager.
		s.logger().Info("the session's key moved to another member while it waited for the spool; it stops")
		s.handOverAll(c, errHandedOver)
		s.stopWhenSettled(c)
	case *leaving:
		s.leaveUnloaded(c)
	case *GetState, *actor.Stopping, *actor.Stopped, *actor.Restarting, *callEnded, *cancelOverdue:
		// (A restarted session waits for the calls its failed incarnation cancelled, the
		// panicked turn's among them, before it runs a turn: their ends must not be lost
		// while it waits. Before, they were dropped, and once loaded the session never ran
		// a turn again: TestCrashWhileSpoolingRunsAgainOnceLoaded.)
		return true
	}
	return false
}

// leaveUnloaded stops a session that has not loaded (its claim or load refused as unavailable:
// a PostgreSQL outage, in which a member that loses its membership leaves) when its member
// leaves the cluster: it must not claim the key once the database answers, which would fence
// the turn the key's next holder runs meanwhile and run the same message beside it. It stops
// without loading, and its manager has the successor run what the store holds (rerun): it knows
// nothing of that work, so it hands on as stale. Before, a waiting session took no notice of
// the leave (a cluster soak's PostgreSQL restart: TestLeavingMemberDoesNotClaimAKeyItWaitedToLoad);
// and one restarted after a crash on a leaving member waited to load, handed the key on without
// a word of the work once its predecessor's cancelled call ended (leaveIfIdle: it had queued
// nothing), or claimed the key once the database answered
// (TestLeavingSessionRestartedInAnOutageDoesNotClaimTheKey).
func (s *Session) leaveUnloaded(c actor.Context) {
	s.logger().Info("the member leaves the cluster while the session waited for the database; it stops without loading and hands the key on")
	s.stale = true
	s.handOverAll(c, errHandedOver)
	s.stopWhenSettled(c)
}

// restartFlushTimeout bounds how long a restarted session waits for its predecessor's writes.
const restartFlushTimeout = time.Minute

// Passivation. protoactor's ReceiveTimeout is not race-clean at the pinned version (its timer
// callback writes the actor context from the timer's goroutine), so a session keeps its own idle
// clock, and the manager's idle sweep (one scheduler tick for all sessions, which only sends
// messages) asks it to check the clock.

func (s *Session) onIdle(c actor.Context, m *idleCheck) {
	if m.makeRoom {
		if s.stopIfIdle(c, true); !s.passivating && !s.leaving { // (leaving, it stops once handed on)
			c.Send(c.Parent(), &roomDeclined{key: s.key, pid: c.Self()})
		}
	} else if time.Since(s.lastTouched) >= s.d.Config.PassivateAfter {
		s.passivateIfIdle(c)
	}
}

// passivateIfIdle asks the manager to stop the session when passivation is on and it has
// nothing in hand.
func (s *Session) passivateIfIdle(c actor.Context) {
	if s.d.Config.PassivateAfter > 0 {
		s.stopIfIdle(c, false)
	}
}

// stopIfIdle asks the manager to stop the session (passivate) when it has nothing in hand, also
// with passivation off: the manager asks so to keep the sessions in memory within
// SessionConfig.MaxInMemory (room: passivate.room). A session whose member leaves hands its key
// on instead (leaveIfIdle).
func (s *Session) stopIfIdle(c actor.Context, room bool) {
	if s.passivating || s.leaving {
		return
	}
	if s.running == nil && !s.ending() && !s.hasQueued() && len(s.inflight) == 0 && s.held() == nil && !s.settingAside() && !s.d.Spooling.Load() {
		s.passivating = true
		c.Send(c.Parent(), &passivate{key: s.key, pid: c.Self(), room: room})
	}
}

// updateBusy tells the manager when the session starts or stops having work in hand: a running
// turn, a write not yet acknowledged (a finished turn's reply is sent only after its write), or
// a message waiting out its debounce window (holding).
// A drain waits until no session is busy.
//
// A session that hands its key over once idle (fenced, moved, stale, or its member leaving)
// stays busy until it has asked its manager to stop it (its Stopping then says it is idle): a
// leaving member's manager answers its drain once no session is busy and none hands over
// (SessionManager.answerDrains). A session that said it was idle first had the drain answered
// before its manager knew of the hand-over; the daemon then stopped the manager, and the key's
// successor was never told to run what the session left queued
// (TestLeavingManagersDrainWaitsForTheHandOver).
func (s *Session) updateBusy(c actor.Context) {
	busy := s.running != nil || s.ending() || len(s.inflight) > 0 || s.held() != nil || s.holding()
	if !busy && (s.leaving || s.fencedOut) && !s.passivating {
		return // it hands over next (leaveIfIdle, stopWhenSettled), and says so first
	}
	s.setBusy(c, busy)
}

func (s *Session) setBusy(c actor.Context, busy bool) {
	if busy != s.busy {
		s.busy = busy
		c.Send(c.Parent(), &busyChanged{key: s.key, busy: busy})
	}
}

func (s *Session) state() *SessionState {
	st := &SessionState{SessionKey: s.key, QueueDepth: int32(s.waiting()), QueueMode: s.mode,
		ActivatedAtUnixNano: s.activatedAt.UnixNano(), Node: s.d.Node, Restarts: int32(s.restarts()), Active: true}
	if s.cur != nil {
		st.SessionId = s.cur.ID
	}
	if !s.lastActivity.IsZero() {
		st.LastActivityUnixNano = s.lastActivity.UnixNano()
	}
	if s.running != nil {
		st.RunningTurnId = s.running.id
		st.RunningSinceUnixNano = s.running.started.UnixNano()
	}
	st.Probation = s.probationState()
	return st
}

func (s *Session) curID() string {
	if s.cur == nil {
		return ""
	}
	return s.cur.ID
}

// sourceOf rebuilds the chat part of a source from a stored session row.
func (s *Session) sourceOf(ss *persistence.Session) identity.Source {
	return identity.Source{Platform: ss.Platform, ChatType: ss.ChatType, ChatID: ss.ChatID, ThreadID: ss.ThreadID,
		UserID: ss.UserID, UserName: ss.UserName, ScopeID: ss.ScopeID, Profile: ss.Profile}
}

// Fencing (Deps.Fencing). Once a write of this activation is refused because another
// activation claimed the key, this one writes and sends nothing more: the newer activation
// loaded its state after its claim, so it holds every write of this one that committed, and it
// runs again whatever this one had not finished. This one waits for the answers to its writes
// still in flight (requests waiting on them get them), hands every request it is sent meanwhile
// to the manager, which gives them to the key's next activation, and then stops.

// fence starts the hand-over. A leaving session that was about to hand its key on, and waited
// only for the store's answer to its reset's mark (markOverdueBeforeLeaving), files the reset
// still, as it would have at the hand-over: the manager hands it on with the key
// (SessionManager.handOnFiledReset). The mark was not stored, so the activation that claimed the
// key did not load it, and found the session's activity (the work the reset waited for) past the
// due time. Before, it filed nothing, and the session went on until its next reset, a daily one a
// day late (TestResetDueOfALeavingSessionFencedAtItsMarkIsHandedOn). Filing writes nothing; the
// key's next owner does the reset only if the session was not active since (takeFiledReset).
func (s *Session) fence(c actor.Context) {
	s.d.Metrics.SessionsFenced.Inc()
	s.logger().Warn("another activation claimed the session; this one hands over and stops",
		"epoch", s.epoch, "pending", s.waiting(), "running", s.running != nil)
	if s.handsOnAtFence() {
		s.fileOverdue()
	}
	s.handOverAll(c, errHandedOver)
}

// handsOnAtFence reports whether the session, fenced, files its overdue reset for the key's next
// owner (fence): it was leaving, and waited only for the store's answer to the reset's mark.
func (s *Session) handsOnAtFence() bool {
	u := s.unusual
	return s.leaving && u != nil && u.overdue != nil && u.overdue.triedAtLeave
}

// handOverAll turns the session into a hand-over (see above).
func (s *Session) handOverAll(c actor.Context, why *handOverError) {
	s.fencedOut = true
	s.dropHeld(c, why)
	if s.running != nil {
		// Its result would be fenced; the new owner runs the message again, in a draft of its
		// own (on its member, perhaps), so this one's is marked interrupted. The session stops
		// only once the cancelled call has returned (stopWhenSettled): the key's next
		// activation here (a restart from the store) must not run beside it.
		s.cancelAwaited(c, s.running)
		s.running = nil
	}
}

// leave starts the session's leaving of its member: its member leaves the cluster (Leave), or
// the cluster placed its key on another member (its grain here stopped, or the key's new owner
// asked this member to let go of it: Release). It starts no turn, lets a running one store and
// send its result, stores what reaches it meanwhile behind it (queued), and then hands the key
// on (leaveIfIdle). A new owner claims the key only once this session has stopped
// (SessionManager.activate); before, a moved session cancelled its running turn at once, and the
// new owner ran the message again.
func (s *Session) leave(c actor.Context, why string) {
	if s.fencedOut || s.leaving {
		return
	}
	if s.debugOn() { // leaveIfIdle logs the hand-over itself
		s.logger().Debug(why, "pending", s.waiting(), "running", s.running != nil)
	}
	s.leaving = true
	s.leaveIfIdle(c)
}

// leaveIfIdle hands the key on when the session leaves its member (leave) and it has nothing in
// hand: no turn running (it
// starts none) and no write in flight (a finished turn's reply is sent once its write is
// stored). It stops as a fenced session does; the messages it still holds queued are pending
// in the store, and its manager has the key's successor run them (passivate.rerun).
func (s *Session) leaveIfIdle(c actor.Context) {
	if !s.leaving || s.fencedOut || s.running != nil || s.ending() || len(s.inflight) > 0 || s.held() != nil {
		return
	}
	if s.markOverdueBeforeLeaving(c) {
		return // it hands the key on once the store has answered the mark's write
	}
	s.logger().Info("the session hands its key on to another member", "pending", s.waiting())
	s.d.Metrics.SessionsHandedOn.Inc()
	// Messages whose commit may have applied though its answer was lost (unsure) may be
	// pending in the store too: the successor looks.
	// So may messages it had yet to set aside (aside.go).
	s.stale = s.hasQueued() || s.settingAside() || s.unusual != nil && len(s.unusual.unsure) > 0
	// A reset that fell due while the session worked, and waits for the messages still queued,
	// goes with the key, for the manager to hand on (SessionManager.handOnFiledReset).
	s.fileOverdue()
	s.handOverAll(c, errHandedOver)
	s.stopWhenSettled(c)
}

// markOverdueBeforeLeaving writes once more, as the session is about to hand its key on, the
// mark of the reset that fell due while it worked (storeOverdue) when the store refused it as
// unavailable and it waits to be written again (overdueRetry), and reports whether it did: the
// session hands the key on once the store has answered, whatever the answer. The key's new
// owner gets the reset in the ResetDue its manager hands on (handOnFiledReset), which the
// manager sends again until it is answered, but only while this member runs (a leaving member's
// drain waits for it, up to its deadline), and the new owner may crash before it stores it: the
// mark is the copy that outlives that. Before, a session whose mark was refused
// handed the key on at once, and if the ResetDue was lost, the new owner found the session's
// activity (the work the reset waited for) past the due time and let the session go on until
// its next reset, a daily one a day late, though the store took writes again by then
// (TestResetDueWhoseMarkWasRefusedOutlivesALostHandOver). It writes once only: a store that
// still refuses does not hold the hand-over up, and the ResetDue alone carries the reset then.
func (s *Session) markOverdueBeforeLeaving(c actor.Context) bool {
	u := s.unusual
	if u == nil || u.overdue == nil || s.cur == nil || u.overdue.sid != s.cur.ID {
		return false
	}
	o := u.overdue
	if o.refusals == 0 || o.triedAtLeave {
		return false
	}
	o.triedAtLeave = true
	o.stored = false
	s.storeOverdue(c)
	return len(s.inflight) > 0 // (storeOverdue writes nothing for a session fenced out or stopping)
}

// fileOverdue files the reset that fell due while the session worked, and waits for the messages
// still queued, for the key's next activation or incarnation, as a refused one is filed
// (writeReset): that one would find the session's activity past the due time, moved there by
// the work, and not see it due. Used when the key moves to another member (leaveIfIdle), when
// the session starts again from the store (restartFromStore), and when it restarts after a
// crash (onRestarting): before, a crash during the backlog
// of a start that found the reset due lost it, and the session went on until its next reset,
// a daily one a day late (found by a review; TestOverdueResetOutlivesACrash). The session's row
// holds it too, once stored (storeOverdue): a stop of the daemon keeps it there. The filed reset
// says nothing of its mark: the next activation takes it for stored only when its load found it
// on the row (takeFiledReset), and writes it otherwise. Before, it was a copy of this one, and a
// mark the store had refused, waiting to be written again by this activation's timer, was taken
// for stored: it was never written, and a stop of the daemon before the work was done lost the
// reset (TestOverdueResetFiledAtARestartFromTheStoreIsMarkedOnceTheStoreTakesWrites).
func (s *Session) fileOverdue() {
	s.fileReset(s.overdueToFile())
}

// overdueToFile is the reset that fell due while the current session worked as fileOverdue
// files it, nil when none did. A reset that begins a new session in memory ahead of its write (a
// chat's /new, /reset or /resume, an operator's reset) takes it first, to file if that write is
// refused (fileReset): the session then starts again from the store, where the old session is
// current still, and fileOverdue, which looks at the session current in memory (the new one),
// filed nothing. The next activation found the old session's activity (the work the reset waited
// for) past the due time, and the session went on until its next reset, a daily one a day late,
// unless someone sent the refused reset again
// (TestOverdueResetWhoseMarkWasRefusedOutlivesARestartFromTheStore).
func (s *Session) overdueToFile() *overdue {
	if u := s.unusual; u != nil && u.overdue != nil && s.cur != nil && u.overdue.sid == s.cur.ID {
		o := u.overdue
		return &overdue{sid: o.sid, at: o.at, reason: o.reason, activity: s.cur.LastActivityAt}
	}
	return nil
}

// fileReset files o, if not nil, for the key's next activation or incarnation.
func (s *Session) fileReset(o *overdue) {
	if o != nil {
		s.d.resetsDue.Store(s.key, o)
	}
}

// claimCheckTimeout bounds onRecover's read of the key's claim: the check repeats at the next
// sweep, so a slow store must not hold the session.
const claimCheckTimeout = 5 * time.Second

// onRecover runs when this member, owning the key, finds work of it in the store (Recover)
// while this activation is in memory. Under fencing an idle activation may not know of that
// work: during a change of membership another member's activation can claim the key after this
// one loaded its state, store a message (acknowledged to its sender) and then hand the key back
// as the cluster's view settles. Only a write would tell this activation it is fenced, and an
// idle one writes nothing, so the message would wait for the chat's next one. If the key's
// claim is no longer this activation's, it stops and the manager activates the key again,
// which claims it and loads everything stored. A session with work in hand needs no check: its
// next write is fenced if its claim is stale. Work of its own that it does not know of is
// checked first: a message whose write committed although its answer was lost (adoptUnsure).
func (s *Session) onRecover(c actor.Context) {
	if s.fencedOut {
		return
	}
	if s.adoptUnsure(c) {
		return
	}
	if !s.d.Fencing || s.running != nil || s.hasQueued() || len(s.inflight) > 0 || s.held() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(s.d.Ctx, claimCheckTimeout)
	defer cancel()
	own, err := s.d.Store.Ownership(ctx, s.key)
	if err != nil {
		s.logger().Warn("check the session's claim", logging.Err(err))
		return
	}
	if own.Epoch == s.epoch {
		return
	}
	s.logger().Warn("another activation claimed the session since this one loaded it; the session starts again",
		"epoch", s.epoch, "claimed", own.Epoch, "by", own.Owner)
	s.d.Metrics.SessionsFenced.Inc()
	s.stale = true
	s.handOverAll(c, errHandedOver)
	s.stopWhenSettled(c)
}

// restartFromStore stops the session, and its manager activates the key again at once, from
// the store. A command changes the session in memory before its write; when that write is
// refused, memory and store disagree, and the store is the truth. What the session was asked
// meanwhile is handed to the next activation, as a fenced session's is; a running turn stops,
// and its message, still pending in the store, runs again. When err says the store cannot be
// written (the database and the spool both failing), the next activation waits a while (see
// SessionManager): it would run the same message again only to have its result refused again.
// A reset that fell due while the session worked is filed for the next activation
// (fileOverdue), as at a crash: the store may not hold its mark (refused as unavailable, and
// waiting to be written again), and the next activation would find the session's activity (the
// work the reset waited for) past the due time. Before, it was lost, and the session went on
// until its next reset, a daily one a day late
// (TestOverdueResetWhoseMarkWasRefusedOutlivesARestartFromTheStore).
func (s *Session) restartFromStore(c actor.Context, why string, err error) {
	s.restartFromStoreAt(c, restartLevel(err), why, err)
}

// restartLevel is the level of the line of a restart from the store for err.
func restartLevel(err error) slog.Level {
	switch {
	case errors.Is(err, persistence.ErrDuplicate):
		// The store's dedupe refused a message, and its sender was told (duplicate, or 409
		// for another conversation's message id): no fault, and any client can repeat it.
		return slog.LevelInfo
	case errors.Is(err, persistence.ErrUnavailable):
		// The manager pauses the key, and its line says so with why and err, at once for the
		// key and then at most once a minute (SessionManager.refusedLines): in an outage this
		// line came at every pause of every chat, unlimited, beside the manager's.
		return slog.LevelDebug
	}
	return slog.LevelWarn
}

// restartFromStoreAt is restartFromStore with its line at level.
func (s *Session) restartFromStoreAt(c actor.Context, level slog.Level, why string, err error) {
	s.logger().Log(context.Background(), level, "the session starts again from the store", "why", why, logging.Err(err))
	s.stale = true
	s.refused = errors.Is(err, persistence.ErrUnavailable)
	if s.refused {
		u := s.rare()
		u.refusedWhy, u.refusedErr = why, err
	}
	s.fileOverdue()
	s.handOverAll(c, errRestarted)
	s.stopWhenSettled(c)
}

// answerUnstored answers the senders of queued messages whose write is not acknowledged, as
// the session stops or restarts (ErrCodeStopped).
func (s *Session) answerUnstored(c actor.Context, why string) {
	queued := s.queue
	if sp := s.spilling(); sp != nil {
		queued = append(slices.Clone(queued), sp.tail...)
	}
	for _, it := range queued {
		if it.durable {
			continue
		}
		for _, p := range append(it.repeats, it.requester) {
			if p != nil {
				c.Send(p, s.unstoredResult(it.messageID, why))
			}
		}
		it.requester, it.repeats = nil, nil
	}
}

// whileStopping handles a message of a session that passivates or is fenced, and reports
// whether Receive should go on with it: only the answers to its writes, its resend timer,
// stopping, and (unless fenced) a request for its state. Requests for work are handed over, so
// a session that asked to stop never takes new work: its manager holds them for the key's next
// activation. (A request routed to it before the manager knew of the stop is one of these.)
func (s *Session) whileStopping(c actor.Context) bool {
	switch c.Message().(type) {
	case *persistence.WriteResult, *resendTick, *callEnded, *cancelOverdue, *actor.Stopping, *actor.Stopped:
		return true
	case *GetState:
		if !s.fencedOut {
			return true // an idle session's state is still the key's
		}
		s.handOver(c, c.Message(), c.Sender())
	case *Deliver, *ResetSession, *RequeueMessage, *Withdraw, *ResetDue:
		s.handOver(c, c.Message(), c.Sender())
	}
	return false
}

// handOver gives a request to the key's next activation: the manager holds it until this actor
// is gone. The answer goes to sender.
func (s *Session) handOver(c actor.Context, msg any, sender *actor.PID) {
	r := routed{msg: msg, sender: sender}
	if !s.passivating {
		s.rare().handoff = append(s.rare().handoff, r) // sent after the passivate, so the manager holds it
		s.stopWhenSettled(c)
		return
	}
	s.sendToManager(c, r)
}

// stopWhenSettled asks the manager to stop a fenced session once no write of it is in flight
// (each request waiting on one gets its answer first), and hands it what was asked meanwhile.
func (s *Session) stopWhenSettled(c actor.Context) {
	if !s.fencedOut || s.passivating || len(s.inflight) > 0 || s.ending() {
		return // (the key's next activation must not run beside a cancelled call still ending)
	}
	s.passivating = true
	p := &passivate{key: s.key, pid: c.Self(), fenced: true, rerun: s.stale, pause: s.refused, crashed: s.crashed}
	if life := s.life(); s.crashed && life != nil {
		p.panic = life.panic
	}
	if u := s.unusual; s.refused && u != nil {
		p.why, p.err = u.refusedWhy, u.refusedErr
	}
	c.Send(c.Parent(), p)
	if s.unusual != nil {
		for _, r := range s.unusual.handoff {
			s.sendToManager(c, r)
		}
		s.unusual.handoff = nil
	}
}

func (s *Session) sendToManager(c actor.Context, r routed) {
	c.Send(c.Parent(), &handedBack{key: s.key, r: r})
}

// handedBack is a request a stopping session gives back to its manager for the key's next
// activation. It reached the session before anything the manager holds for the key (those
// arrived after the session asked to stop), so it goes before them.
type handedBack struct {
	key string
	r   routed
}
