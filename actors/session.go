package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"
)

// Session is the actor of one session key. It alone owns the key's identity, its pending queue
// and its transcript buffer: every turn's identity is built here from this state and the
// triggering message, and handed to a Turn child by value.
//
// An inbound message is answered only once its write is acknowledged by the persistence actor,
// so an acknowledged message is durable. Turns run one at a time in arrival order; a message
// that arrives while a turn runs waits in the queue (up to the cap). State is rebuilt from the
// store on every start, so a restart after a panic or a passivation carries on where it stopped.
type Session struct {
	d         *Deps
	key       string       // the actor's name under the manager
	log       *slog.Logger // built on first use (logger): most sessions never log
	recovered bool         // spawned to recover work left by the last run (see NewSession)

	cur  *persistence.Session // current incarnation; nil until the first message
	prev *persistence.Session // the ended session the route still points to, if any
	// continuity is the note the first turn of a session after an automatic reset gets.
	continuity string
	lastSeq    int64
	lastOut    int64
	routeGen   int64
	queue      []*item
	running    *turnRun
	history    []histEntry // the recent active transcript, for the agent and for /undo and /retry
	seen       idSet       // inbound message ids accepted in this activation
	mode       string

	nextWrite  uint64
	inflight   []*pendingWrite      // by write id, ascending
	stopResend scheduler.CancelFunc // the armed resend tick; nil when none is armed
	sched      *scheduler.TimerScheduler

	activatedAt  time.Time
	lastActivity time.Time
	busy         bool
	dead         bool      // set on the failed incarnation once it is being replaced
	lastTouched  time.Time // last message other than ticks (passivation)
	passivating  bool      // asked the manager to stop it

	// life survives restarts of this actor, so a new incarnation knows how often it crashed and
	// on which messages. It is nil until the first crash: the failing incarnation creates it
	// and files it in Deps.lifelines, where the next incarnation finds it; the last one removes
	// it when it stops.
	life *lifeline
}

// lifeline is what a session actor's incarnations share across supervisor restarts: never
// across passivation or process restarts.
type lifeline struct {
	restarts int
	suspects []int64       // seqs that were running when the last incarnation crashed
	crashes  map[int64]int // seq → crashes while it ran; nil until a crash is counted
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
	requester *actor.PID // waits for DeliverResult; nil after the ack or for recovered items
}

type turnRun struct {
	pid     *actor.PID
	id      string
	items   []*item
	steered []*item // sent into the running turn (queue mode steer), in order
	started time.Time
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
	}, actor.WithMailbox(actor.Unbounded(d.Metrics.Mailboxes.Kind("session"))))
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
	if s.life == nil {
		return 0
	}
	return s.life.restarts
}

// QuarantineAfter is how many crashes of its session a message may cause before it is set
// aside. The session's restart budget (SessionConfig.Restarts) must be at least this.
const QuarantineAfter = 3

// resendAfter is how long a session waits for a write's acknowledgment before sending it
// again: the persistence actor may have restarted and lost its batch. Writes are idempotent.
const resendAfter = 5 * time.Second

// Receive dispatches the session's messages.
func (s *Session) Receive(c actor.Context) {
	if _, ok := c.Message().(*actor.Stopped); ok && s.life != nil {
		s.d.lifelines.Delete(s.key) // the activation is over; the next one starts afresh
	}
	if s.dead {
		return
	}
	switch c.Message().(type) {
	case *idleCheck, *resendTick, *debounceTick, *persistence.WriteResult:
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
	case *turnPanicked:
		if s.running != nil && s.running.id == m.TurnID {
			// The session restarts with its state reloaded from the store and runs the message
			// again; a message that crashes its session QuarantineAfter times is quarantined.
			s.d.Metrics.Mailboxes.Kind("session").Failed() // the mailbox never sees it received
			panic(m.Err)
		}
	case *GetState:
		c.Respond(s.state())
	case *ResetSession:
		s.onReset(c, m)
	case *ResetDue:
		s.onResetDue(c)
	case *idleCheck:
		s.onIdle(c)
	case *debounceTick:
		s.tryStart(c)
	case *resendTick:
		s.resend(c)
	case *actor.Restarting:
		s.onRestarting(c)
	case *actor.Stopping:
		// Shutdown or passivation: a running turn is cancelled with its children and its
		// messages stay pending in the store, to run again at the next activation. From here on
		// the session acts on nothing (its turn's termination is not a crash).
		s.dead = true
		if s.running != nil {
			c.Stop(s.running.pid)
		}
		c.Send(c.Parent(), &stopped{key: s.key, hasWork: s.running != nil || len(s.queue) > 0})
		if s.busy {
			c.Send(c.Parent(), &busyChanged{key: s.key, busy: false})
		}
	}
}

// start loads the session's durable state and resumes unanswered work.
func (s *Session) start(c actor.Context) {
	s.key = childName(c)
	if l, ok := s.d.lifelines.Load(s.key); ok {
		s.life = l.(*lifeline)
	}
	s.mode = s.d.Config.QueueMode
	s.activatedAt = s.d.now()
	snap, err := s.d.Store.LoadSession(s.d.Ctx, s.key, s.d.Config.HistoryLimit)
	if err != nil {
		panic(fmt.Errorf("session %s: load: %w", s.key, err))
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
		for _, m := range snap.History {
			if m.Role == persistence.RoleUser || m.Role == persistence.RoleAssistant {
				msg := persistFromRow(m)
				if m.Role == persistence.RoleUser {
					// The sender's prefix, as the turn that first showed it had it.
					src := s.sourceOf(s.cur)
					src.UserName = m.UserName
					msg.Text = s.agentText(src, m.Content)
				}
				s.history = append(s.history, histEntry{seq: m.Seq, raw: m.Content, msg: msg})
			}
		}
		for _, m := range snap.Pending {
			src := s.sourceOf(s.cur)
			src.UserID, src.UserName = m.UserID, m.UserName
			s.queue = append(s.queue, &item{seq: m.Seq, sessionID: m.SessionID, src: src,
				messageID: m.MessageID, text: m.Content, at: m.CreatedAt, durable: true})
			s.seen.add(m.MessageID)
		}
	}
	for i := range snap.Unconfirmed {
		s.sendOutbound(c, OutboundFromEntry(&snap.Unconfirmed[i]))
	}
	if s.restarts() > 0 {
		s.afterCrash(c)
	}
	s.expireOnStart(c)
	if s.recovered && s.life == nil && s.d.Config.Recovery == RecoveryNotice {
		// Only the first incarnation recovers: a restarted one has a lifeline.
		s.noticePending(c)
	}
	if len(s.queue) > 0 || len(snap.Unconfirmed) > 0 {
		s.logger().Info("session resumed", "pending", len(s.queue), "unconfirmed", len(snap.Unconfirmed))
	}
	s.tryStart(c)
}

// Passivation. protoactor's ReceiveTimeout is not race-clean at the pinned version (its timer
// callback writes the actor context from the timer's goroutine), so a session keeps its own idle
// clock, and the manager's idle sweep (one scheduler tick for all sessions, which only sends
// messages) asks it to check the clock.

func (s *Session) onIdle(c actor.Context) {
	if s.passivating || s.d.Config.PassivateAfter <= 0 {
		return
	}
	if time.Since(s.lastTouched) >= s.d.Config.PassivateAfter && s.running == nil && len(s.queue) == 0 &&
		len(s.inflight) == 0 && !s.d.Spooling.Load() {
		s.passivating = true
		c.Send(c.Parent(), &passivate{key: s.key})
	}
}

// onDeliver accepts one inbound message: a duplicate or a command is answered at once;
// anything else is written durably and then acknowledged and queued.
func (s *Session) onDeliver(c actor.Context, m *Deliver) {
	src := sourceFromProto(m.Source)
	now := s.d.now()
	if m.MessageId != "" && s.seen.has(m.MessageId) {
		c.Respond(s.result(m, platforms.Duplicate, ""))
		return
	}
	if cmd, ok := parseCommand(m.Text); ok {
		s.onCommand(c, m, src, cmd, now)
		return
	}
	waiting := s.waiting()
	if s.running != nil {
		s.d.Metrics.QueueDepth.Observe(float64(waiting + 1)) // this one waits too
	} else {
		s.d.Metrics.QueueDepth.Observe(float64(waiting))
	}
	if s.running != nil && waiting >= s.d.Config.QueueCap {
		s.d.Metrics.QueueOverflow.WithLabelValues(s.d.Config.Overflow).Inc()
		if s.d.Config.Overflow == "reject" {
			r := s.result(m, platforms.Rejected, "")
			r.ErrorCode, r.Error = "rejected", fmt.Sprintf("session queue is full (%d waiting)", waiting)
			c.Respond(r)
			return
		}
	}
	ops := s.expire(now)
	auto := s.autoReset()
	inc, created := s.ensureIncarnation(src, now)
	ops = append(ops, inc...)
	var notice *platforms.Outbound
	if created && auto != nil {
		var noticeOps []persistence.Op
		notice, noticeOps = s.afterAutoReset(auto, src, m.MessageId, now)
		ops = append(ops, noticeOps...)
	}
	s.lastSeq++
	it := &item{seq: s.lastSeq, sessionID: s.cur.ID, src: src, messageID: m.MessageId, text: m.Text,
		at: now, arrived: time.Now(), requester: c.Sender()}
	ops = append(ops,
		&persistence.AppendMessage{Message: persistence.Message{
			SessionID: it.sessionID, Seq: it.seq, Role: persistence.RoleUser, Content: m.Text,
			Platform: src.Platform, ChatID: src.ChatID, MessageID: m.MessageId,
			UserID: src.UserID, UserName: src.UserName,
			Status: persistence.StatusPending, Active: true, CreatedAt: now}})
	if touch := s.touch(it.sessionID, now); !created && s.resets() {
		// The turn's result write records the activity again (later) in any case. The arrival
		// must be durable on its own only where a reset policy reads it: a restart before the
		// result must not reset a session its user just wrote to. A new incarnation's row
		// carries its activity already.
		ops = append(ops, touch)
	}
	s.queue = append(s.queue, it)
	if m.MessageId != "" {
		s.seen.add(m.MessageId)
	}
	s.lastActivity = now
	s.write(c, ops, func(c actor.Context, err error) {
		if err == nil && notice != nil {
			s.sendOutbound(c, notice)
		}
		s.accepted(c, it, m, created, err)
	})
}

// accepted runs when the write of an inbound message is acknowledged.
func (s *Session) accepted(c actor.Context, it *item, m *Deliver, created bool, err error) {

	if err != nil {
		s.queue = slices.DeleteFunc(s.queue, func(q *item) bool { return q == it })
		if created && s.cur != nil && s.cur.ID == it.sessionID {
			s.cur = nil // the incarnation was never written; the next message creates it again
		}
		if errors.Is(err, persistence.ErrDuplicate) {
			c.Send(it.requester, s.result(m, platforms.Duplicate, ""))
			return
		}
		s.seen.remove(m.MessageId)
		s.logger().Error("store inbound message", "err", err)
		r := s.result(m, "", "")
		r.ErrorCode, r.Error = "unavailable", "message could not be stored"
		c.Send(it.requester, r)
		return
	}
	it.durable = true
	disp := platforms.Queued
	switch {
	case s.running == nil && len(s.queue) > 0 && s.queue[0] == it:
		disp = platforms.Started
	case s.running != nil && s.mode == ModeInterrupt && len(s.queue) > 0 && s.queue[0] == it:
		s.interrupt(c) // the new message runs next
		disp = platforms.Interrupted
	case s.running != nil && s.mode == ModeSteer && s.steer(c, it):
		disp = platforms.Steered
	case (s.mode == ModeCollect || s.debounced(it)) && len(s.queue) > 1 && s.queue[len(s.queue)-2].src.UserID == it.src.UserID:
		disp = platforms.Collected // it joins the messages waiting for the next turn
	}
	r := s.result(m, disp, it.sessionID)
	r.QueueDepth = int32(s.waiting())
	if disp == platforms.Started {
		r.QueueDepth--
	}
	// Start the turn (and tell the manager the session is busy) before acknowledging: a drain
	// that follows the acknowledgment must wait for this turn.
	s.tryStart(c)
	if it.requester != nil {
		c.Send(it.requester, r)
		it.requester = nil
	}
}

// ensureIncarnation returns the ops that create a session incarnation when there is none.
func (s *Session) ensureIncarnation(src identity.Source, now time.Time) ([]persistence.Op, bool) {
	if s.cur != nil {
		return nil, false
	}
	prev := ""
	if s.prev != nil {
		prev = s.prev.ID
	}
	return s.newIncarnation(src, now, prev), true
}

// newIncarnation makes a new current session and returns the ops that record it.
func (s *Session) newIncarnation(src identity.Source, now time.Time, prev string) []persistence.Op {
	s.cur = &persistence.Session{
		ID: newSessionID(now), Key: s.key,
		Platform: src.Platform, ChatType: src.ChatType, ChatID: src.ChatID, ThreadID: src.ThreadID,
		UserID: src.UserID, UserName: src.UserName, ScopeID: src.ScopeID, Profile: src.Profile,
		StartedAt: now, LastActivityAt: now, PrevSessionID: prev,
	}
	if identity.IsShared(src, s.d.Config.Keys) {
		s.cur.UserID, s.cur.UserName = "", "" // a shared session belongs to no single user
	}
	s.lastSeq = 0
	s.history = nil
	s.prev = nil
	s.routeGen++
	return []persistence.Op{
		&persistence.CreateSession{Session: *s.cur},
		&persistence.PutRoute{Route: persistence.Route{Key: s.key, SessionID: s.cur.ID, Generation: s.routeGen, UpdatedAt: now}},
	}
}

// waiting counts the messages waiting for a turn (not the running one).
func (s *Session) waiting() int { return len(s.queue) }

// tryStart starts the next turn if none runs and the head of the queue is durable.
func (s *Session) tryStart(c actor.Context) {
	if s.running != nil || len(s.queue) == 0 || !s.queue[0].durable {
		s.updateBusy(c)
		return
	}
	if wait := s.holdFor(); wait > 0 {
		s.timers(c).SendOnce(wait, c.Self(), &debounceTick{})
		s.updateBusy(c)
		return
	}
	s.d.props()
	group := s.nextGroup()
	s.queue = s.queue[len(group):]
	last := group[len(group)-1]
	turnID := newID("t_")
	req := &agents.Request{
		Identity: s.turnIdentity(last, turnID),
		History:  s.agentHistory(),
	}
	for _, it := range group {
		msg := s.agentMessage(it)
		req.Messages = append(req.Messages, msg)
		s.history = append(s.history, histEntry{seq: it.seq, raw: it.text, msg: msg})
	}
	req.Partial = s.partial(c, turnID, group)
	if s.continuity != "" && last.sessionID == s.curID() {
		req.Notes = []string{s.continuity}
		s.continuity = ""
	}
	s.setBusy(c, true)                                              // before the turn starts: a drain must never miss a running turn
	pid := c.ActorSystem().Root.SpawnPrefix(s.d.turnProps, "turn-") // top level: see Turn
	c.Send(pid, &runTurn{req: req, session: c.Self()})
	s.running = &turnRun{pid: pid, id: turnID, items: group, started: s.d.now()}
	s.trimHistory()
	if s.debugOn() {
		s.logger().Debug("turn started", "turn", turnID, "messages", len(group))
	}
}

// nextGroup returns the messages the next turn is for: the head of the queue and, in collect
// mode, every durable message behind it from the same sender in the same incarnation (they
// merge into one turn, whose identity is that sender's and whose message id is the last one's).
func (s *Session) nextGroup() []*item {
	head := s.queue[0]
	n := 1
	for n < len(s.queue) {
		it, prev := s.queue[n], s.queue[n-1]
		if !it.durable || it.src.UserID != head.src.UserID || it.sessionID != head.sessionID {
			break
		}
		if s.mode != ModeCollect && !(s.debounced(it) && it.arrived.Sub(prev.arrived) <= s.debounceFor(it.src.Platform)) {
			break
		}
		n++
	}
	return s.queue[:n]
}

// debounceTick wakes a session whose debounce window may have passed.
type debounceTick struct{}

// debounceFor is the debounce window of a platform.
func (s *Session) debounceFor(platform string) time.Duration {
	if d, ok := s.d.Config.DebounceByPlatform[platform]; ok {
		return d
	}
	return s.d.Config.Debounce
}

// debounced reports whether debounce applies to it: its platform has a window, and it arrived
// live (recovered messages are never held).
func (s *Session) debounced(it *item) bool {
	return s.debounceFor(it.src.Platform) > 0 && !it.arrived.IsZero()
}

// holdFor is how long the head of the queue must still wait for its sender to be quiet: the
// debounce window counts from the last message of the sender's run at the head.
func (s *Session) holdFor() time.Duration {
	head := s.queue[0]
	d := s.debounceFor(head.src.Platform)
	if d <= 0 || !s.debounced(head) {
		return 0
	}
	last := head.arrived
	for _, it := range s.queue[1:] {
		if !it.durable || it.src.UserID != head.src.UserID || it.arrived.Sub(last) > d {
			break
		}
		last = it.arrived
	}
	return time.Until(last.Add(d))
}

// steer delivers it into the running turn when the agent can take it and it comes from the
// turn's own sender in the same incarnation (a turn's identity never changes); otherwise it
// stays queued as in followup. A steered message belongs to the running turn: its reply
// answers it too.
func (s *Session) steer(c actor.Context, it *item) bool {
	r := s.running
	last := r.items[len(r.items)-1]
	if !agents.CanSteer(s.d.Agent) || len(r.steered) >= MaxSteered || len(s.queue) == 0 || s.queue[0] != it ||
		it.src.UserID != last.src.UserID || it.sessionID != last.sessionID {
		return false
	}
	s.queue = s.queue[1:]
	r.steered = append(r.steered, it)
	c.Send(r.pid, &steerIn{msg: s.agentMessage(it)})
	return true
}

// agentMessage is a queued message as the agent sees it.
func (s *Session) agentMessage(it *item) agents.Message {
	return agents.Message{Role: persistence.RoleUser, Text: s.agentText(it.src, it.text), MessageID: it.messageID, At: it.at}
}

// agentText is a user's text as the agent sees it: in a shared session, prefixed with the
// sender's neutralised name, so the agent can tell the senders apart (G7).
func (s *Session) agentText(src identity.Source, text string) string {
	if identity.IsShared(src, s.d.Config.Keys) {
		return identity.Prefix(src.UserName, text)
	}
	return text
}

// interrupt cancels the running turn for a newer message (interrupt mode): the cancelled turn's
// reply, if it ever comes, is never delivered, and its messages are marked failed. The next turn
// still sees them in its history.
func (s *Session) interrupt(c actor.Context) {
	r := s.running
	if r == nil {
		return
	}
	s.running = nil
	s.cancelTurn(c, r)
	s.d.Metrics.TurnsTotal.WithLabelValues("cancelled").Inc()
	seqs := make([]int64, len(r.items))
	for i, it := range r.items {
		seqs[i] = it.seq
	}
	if s.debugOn() {
		s.logger().Debug("turn interrupted", "turn", r.id)
	}
	s.write(c, []persistence.Op{&persistence.SetMessageStatus{SessionID: r.items[0].sessionID, Seqs: seqs,
		Status: persistence.StatusFailed, TurnID: r.id}}, func(c actor.Context, err error) {
		if err != nil {
			s.logger().Error("store interrupted turn", "err", err)
		}
	})
}

// turnIdentity builds the immutable identity of a turn from the session's own state and the
// triggering message: nothing else.
func (s *Session) turnIdentity(it *item, turnID string) identity.Turn {
	return identity.Turn{
		Platform: it.src.Platform, ChatType: it.src.ChatType, ChatID: it.src.ChatID,
		ThreadID: it.src.ThreadID, UserID: it.src.UserID, UserName: it.src.UserName,
		ScopeID: it.src.ScopeID, Profile: it.src.Profile,
		SessionKey: s.key, SessionID: it.sessionID, MessageID: it.messageID, TurnID: turnID,
	}
}

// updateBusy tells the manager when the session starts or stops having work in hand: a running
// turn or a write not yet acknowledged (a finished turn's reply is sent only after its write).
// A drain waits until no session is busy.
func (s *Session) updateBusy(c actor.Context) {
	s.setBusy(c, s.running != nil || len(s.inflight) > 0)
}

func (s *Session) setBusy(c actor.Context, busy bool) {
	if busy != s.busy {
		s.busy = busy
		c.Send(c.Parent(), &busyChanged{key: s.key, busy: busy})
	}
}

// persistFromRow is a transcript row as the agent sees it.
func persistFromRow(m persistence.Message) agents.Message {
	return agents.Message{Role: m.Role, Text: m.Content, MessageID: m.MessageID, At: m.CreatedAt}
}

// histEntry is one message of the in-memory transcript buffer.
type histEntry struct {
	seq int64
	raw string // the authored text (msg.Text may carry a sender prefix)
	msg agents.Message
}

// agentHistory is the buffer as the agent sees it.
func (s *Session) agentHistory() []agents.Message {
	out := make([]agents.Message, len(s.history))
	for i, h := range s.history {
		out[i] = h.msg
	}
	return out
}

func (s *Session) trimHistory() {
	if n := s.d.Config.HistoryLimit; len(s.history) > n {
		s.history = slices.Clone(s.history[len(s.history)-n:])
	}
}

// onTurnFinished records the agent's reply, sends it and starts the next turn.
func (s *Session) onTurnFinished(c actor.Context, m *TurnFinished) {
	r := s.running
	if r == nil || r.id != m.TurnID {
		return // a cancelled turn's late result: never delivered
	}
	s.running = nil
	c.Stop(r.pid)
	// Steered messages the agent saw belong to this turn; any that arrived after it answered run
	// next, in order.
	k := min(m.Steered, len(r.steered))
	for _, it := range r.steered[:k] {
		r.items = append(r.items, it)
		s.history = append(s.history, histEntry{seq: it.seq, raw: it.text, msg: s.agentMessage(it)})
	}
	s.queue = append(slices.Clone(r.steered[k:]), s.queue...)
	s.d.Metrics.TurnDuration.Observe(m.Took.Seconds())
	if m.Usage.InputTokens > 0 || m.Usage.OutputTokens > 0 {
		s.d.Metrics.AgentTokens.WithLabelValues("input").Add(float64(m.Usage.InputTokens))
		s.d.Metrics.AgentTokens.WithLabelValues("output").Add(float64(m.Usage.OutputTokens))
	}
	if m.Err != nil {
		s.d.Metrics.TurnsTotal.WithLabelValues("error").Inc()
		s.logger().Warn("turn failed", "turn", r.id, "err", m.Err)
		s.finish(c, r, persistence.RoleNotice, "⚠️ The agent could not answer this message (turn "+r.id+" failed). Please try again.", persistence.StatusFailed, m.Usage)
	} else {
		s.d.Metrics.TurnsTotal.WithLabelValues("ok").Inc()
		s.finish(c, r, persistence.RoleAssistant, m.Text, persistence.StatusDone, m.Usage)
	}
	s.tryStart(c)
}

// finish records the end of a turn (reply row, message status, outbox, activity, route and the
// tokens it used, in one write) and sends the reply once it is durable.
func (s *Session) finish(c actor.Context, r *turnRun, role, text, status string, usage agents.Usage) {
	now := s.d.now()
	seqs := make([]int64, len(r.items))
	ids := make([]string, len(r.items))
	for i, it := range r.items {
		seqs[i], ids[i] = it.seq, it.messageID
	}
	sid := r.items[0].sessionID
	ops := []persistence.Op{
		&persistence.SetMessageStatus{SessionID: sid, Seqs: seqs, Status: status, TurnID: r.id},
	}
	if usage.InputTokens > 0 || usage.OutputTokens > 0 {
		ops = append(ops, &persistence.AddUsage{SessionID: sid, TurnID: r.id,
			InputTokens: usage.InputTokens, OutputTokens: usage.OutputTokens})
	}
	if s.cur != nil && s.cur.ID == sid {
		s.lastSeq++
		ops = append(ops, &persistence.AppendMessage{Message: persistence.Message{
			SessionID: sid, Seq: s.lastSeq, Role: role, Content: text, TurnID: r.id,
			Status: persistence.StatusDone, Active: true, CreatedAt: now}},
			s.touch(sid, now))
		s.routeGen++
		ops = append(ops, &persistence.PutRoute{Route: persistence.Route{Key: s.key, SessionID: sid, Generation: s.routeGen, UpdatedAt: now}})
		if role == persistence.RoleAssistant {
			s.history = append(s.history, histEntry{seq: s.lastSeq, raw: text, msg: agents.Message{Role: role, Text: text, At: now}})
			s.trimHistory()
		}
	}
	kind := platforms.KindReply
	if role == persistence.RoleNotice {
		kind = platforms.KindNotice
	}
	entry := s.outboxEntry(r.items[0].src, sid, kind, text, r.id, ids, now)
	ops = append(ops, &persistence.AddOutbox{Entry: entry})
	s.lastActivity = now
	s.write(c, ops, func(c actor.Context, err error) {
		if err != nil {
			s.logger().Error("store turn result", "turn", r.id, "err", err)
		}
		out := OutboundFromEntry(&entry)
		out.TurnEnd = true
		s.sendOutbound(c, out)
	})
}

func (s *Session) outboxEntry(src identity.Source, sid, kind, text, turnID string, inReplyTo []string, now time.Time) persistence.OutboxEntry {
	s.lastOut++
	return persistence.OutboxEntry{
		SessionKey: s.key, Seq: s.lastOut, SessionID: sid, Kind: kind, Text: text, TurnID: turnID,
		InReplyTo: inReplyTo, Platform: src.Platform, ChatType: src.ChatType, ChatID: src.ChatID,
		ThreadID: src.ThreadID, UserID: src.UserID, State: persistence.DeliveryPending, CreatedAt: now,
	}
}

// OutboundFromEntry is the platform message for a recorded outbox entry (sent as the end of its
// turn; callers clear TurnEnd when more follows).
func OutboundFromEntry(e *persistence.OutboxEntry) *platforms.Outbound {
	return &platforms.Outbound{
		SessionKey: e.SessionKey, SessionID: e.SessionID, Seq: e.Seq, Kind: e.Kind, Text: e.Text,
		TurnID: e.TurnID, InReplyTo: slices.Clone(e.InReplyTo), CreatedAt: e.CreatedAt, TurnEnd: true,
		Target: identity.Source{Platform: e.Platform, ChatType: e.ChatType, ChatID: e.ChatID, ThreadID: e.ThreadID, UserID: e.UserID},
	}
}

func (s *Session) sendOutbound(c actor.Context, out *platforms.Outbound) {
	pid := s.d.Platforms[out.Target.Platform]
	if pid == nil {
		s.logger().Error("no platform for outbound", "platform", out.Target.Platform)
		return
	}
	c.Send(pid, &SendOutbound{Out: out})
}

// write sends ops to the persistence actor and runs done with the result. The session keeps
// the write until it is acknowledged and sends it again if no answer comes (resend).
func (s *Session) write(c actor.Context, ops []persistence.Op, done func(actor.Context, error)) {
	s.nextWrite++
	w := &pendingWrite{write: &persistence.Write{ID: s.nextWrite, Ops: ops}, done: done, sentAt: s.d.now()}
	s.inflight = append(s.inflight, w)
	c.Request(s.d.Persist, w.write)
	if s.stopResend == nil {
		s.stopResend = s.timers(c).SendOnce(resendAfter, c.Self(), &resendTick{})
	}
}

type pendingWrite struct {
	write  *persistence.Write
	done   func(actor.Context, error)
	sentAt time.Time
}

// resendTick wakes a session to re-send writes that got no answer. It does not count as
// activity for passivation.
type resendTick struct{}

func (s *Session) timers(c actor.Context) *scheduler.TimerScheduler {
	if s.sched == nil {
		s.sched = scheduler.NewTimerScheduler(c)
	}
	return s.sched
}

func (s *Session) resend(c actor.Context) {
	s.stopResend = nil
	if len(s.inflight) == 0 {
		return
	}
	now := s.d.now()
	for _, w := range s.inflight {
		if now.Sub(w.sentAt) >= resendAfter {
			s.logger().Warn("write not acknowledged; sending it again", "write", w.write.ID)
			w.sentAt = now
			c.Request(s.d.Persist, w.write)
		}
	}
	s.stopResend = s.timers(c).SendOnce(resendAfter, c.Self(), &resendTick{})
}

func (s *Session) onWriteResult(c actor.Context, m *persistence.WriteResult) {
	i := slices.IndexFunc(s.inflight, func(w *pendingWrite) bool { return w.write.ID == m.ID })
	if i < 0 {
		return // an answer to a write sent again, already handled
	}
	w := s.inflight[i]
	s.inflight = slices.Delete(s.inflight, i, i+1)
	if len(s.inflight) == 0 {
		s.inflight = nil // an idle session keeps no buffer, and no timer
		if s.stopResend != nil {
			s.stopResend()
			s.stopResend = nil
		}
	}
	w.done(c, m.Err)
	s.updateBusy(c)
}

func (s *Session) result(m *Deliver, disp, sid string) *DeliverResult {
	if sid == "" && s.cur != nil {
		sid = s.cur.ID
	}
	return &DeliverResult{SessionKey: s.key, SessionId: sid, MessageId: m.MessageId, Disposition: disp, QueueDepth: int32(s.waiting())}
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

func errorsIsDuplicate(err error) bool { return errors.Is(err, persistence.ErrDuplicate) }

// idSet is a set of message ids. Most sessions see a few ids per activation, so it is a slice
// until it holds idSetSmall ids, and a map beyond.
type idSet struct {
	small []string
	big   map[string]struct{}
}

const idSetSmall = 16

func (m *idSet) has(id string) bool {
	if m.big != nil {
		_, ok := m.big[id]
		return ok
	}
	return slices.Contains(m.small, id)
}

func (m *idSet) add(id string) {
	switch {
	case m.has(id):
	case m.big != nil:
		m.big[id] = struct{}{}
	case len(m.small) < idSetSmall:
		m.small = append(m.small, id)
	default:
		m.big = make(map[string]struct{}, 2*idSetSmall)
		for _, x := range m.small {
			m.big[x] = struct{}{}
		}
		m.big[id] = struct{}{}
		m.small = nil
	}
}

func (m *idSet) remove(id string) {
	if m.big != nil {
		delete(m.big, id)
		return
	}
	if i := slices.Index(m.small, id); i >= 0 {
		m.small = slices.Delete(m.small, i, i+1)
	}
}
