package actors

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// waiting counts the messages waiting for a turn (not the running one).
func (s *Session) waiting() int {
	n := len(s.queue)
	if sp := s.spilling(); sp != nil {
		n += sp.stored + len(sp.tail)
	}
	return n
}

// dequeue removes the first n items of the queue. A queue that empties drops its backing array:
// the array still holds the items taken out, so an idle session would otherwise keep its last
// message (text, source, requester) alive until the next one arrives.
func (s *Session) dequeue(n int) {
	if n == len(s.queue) {
		s.queue = nil
		return
	}
	s.queue = s.queue[n:]
}

// tryStart starts the next turn if none runs and the head of the queue is durable.
func (s *Session) tryStart(c actor.Context) {
	if s.leaving && s.running == nil {
		// The member leaves the cluster: the key's successor runs what waits here. A reset
		// that fell due while the turn ran is done first when nothing waits: the successor
		// would find the session's activity (the turn's reply) after it, and not do it.
		s.endOverdue(c)
		s.updateBusy(c)
		s.leaveIfIdle(c)
		return
	}
	s.refill(c)
	if s.running != nil || s.ending() || len(s.queue) == 0 || !s.queue[0].durable || s.halted || s.held() != nil {
		s.endOverdue(c)
		s.updateBusy(c)
		return
	}
	if s.fencedOut {
		// Another activation owns the key: it runs what is queued here (its result write
		// would be refused, and the agent would have run for nothing, or twice).
		s.updateBusy(c)
		return
	}
	if wait := s.holdFor(); wait > 0 {
		s.timers(c).SendOnce(wait, c.Self(), &debounceTick{})
		s.updateBusy(c) // (busy: see holding)
		return
	}
	if s.holdForProbation(c) {
		s.updateBusy(c)
		return
	}
	s.d.props()
	group := s.nextGroup()
	s.dequeue(len(group))
	last := group[len(group)-1]
	turnID := newID("t_")
	req := &agents.Request{
		Identity: s.turnIdentity(last, turnID),
		History:  s.agentHistory(),
	}
	for _, it := range group {
		msg := s.agentMessage(it)
		req.Messages = append(req.Messages, msg)
		s.history = append(s.history, s.histOf(it, msg))
	}
	req.Partial = s.partial(c, turnID, group)
	var note string
	if u := s.unusual; u != nil && u.continuity != "" && last.sessionID == s.curID() {
		note, u.continuity = u.continuity, ""
		req.Notes = []string{note}
	}
	s.setBusy(c, true)                                              // before the turn starts: a drain must never miss a running turn
	pid := c.ActorSystem().Root.SpawnPrefix(s.d.turnProps, "turn-") // top level: see Turn
	steers := s.mode == ModeSteer && agents.CanSteer(s.d.Agent)
	marks := s.marksAtSlot(group[0])
	c.Send(pid, &runTurn{req: req, session: c.Self(), steer: steers, mark: marks})
	s.running = &turnRun{pid: pid, id: turnID, items: group, started: s.d.now(), note: note, steers: steers, marks: marks}
	s.trimHistory()
	if s.debugOn() {
		s.logger().Debug("turn started", "turn", turnID, logging.KeyMessage, strings.Join(messageIDs(group), ","))
	}
}

// nextGroup returns the messages the next turn is for: the head of the queue and, in collect
// mode, every durable message behind it from the same sender in the same incarnation (they
// merge into one turn, whose identity is that sender's and whose message id is the last one's).
func (s *Session) nextGroup() []*item {
	n := 1
	for n < len(s.queue) && s.queue[n].durable && s.joins(s.queue[n-1], s.queue[n]) {
		n++
	}
	return s.queue[:n]
}

// joins reports whether it, queued right behind prev, runs in prev's turn: it comes from the
// same sender in the same incarnation, and the mode is collect or it came within the debounce
// window of prev.
func (s *Session) joins(prev, it *item) bool {
	if it.src.UserID != prev.src.UserID || it.sessionID != prev.sessionID {
		return false
	}
	return s.mode == ModeCollect || (s.debounced(it) && it.arrived.Sub(prev.arrived) <= s.debounceFor(it.src.Platform))
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

// holding reports whether the head of the queue waits out its debounce window (holdFor). That
// is work in hand for a drain, which waits the window out and runs the message, as it runs what
// queues behind a running turn: counted idle, it was left for the next start
// (TestDrainRunsADebouncedMessage).
func (s *Session) holding() bool {
	return s.running == nil && len(s.queue) > 0 && s.queue[0].durable && s.debounced(s.queue[0]) &&
		!s.halted && !s.leaving && !s.fencedOut
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
	if !r.steers || len(r.steered) >= MaxSteered || len(s.queue) == 0 || s.queue[0] != it ||
		it.src.UserID != last.src.UserID || it.sessionID != last.sessionID {
		return false
	}
	s.dequeue(1)
	r.steered = append(r.steered, it)
	c.Send(r.pid, &steerIn{msg: s.agentMessage(it)})
	return true
}

// agentMessage is a queued message as the agent sees it.
func (s *Session) agentMessage(it *item) agents.Message {
	return agents.Message{Role: persistence.RoleUser, Text: s.agentText(it.src, it.text), MessageID: it.messageID, At: it.at}
}

// failedNotice is what the sender of a failed turn's message is told: to try again, or, when
// the agent says trying again will not help (agents.Refusal), why. riders is how many earlier
// messages a declined turn left out with its own (leaveOut).
func failedNotice(turnID string, err error, riders int) string {
	if ref, ok := errors.AsType[*agents.Refusal](err); ok && ref.Notice != "" {
		n := "⚠️ The agent could not answer this message (turn " + turnID + " failed): " + ref.Notice + "."
		switch {
		case ref.Declined && riders == 1:
			n += " It is left out of the conversation, with the earlier message sent along with it that got no answer; they will not be sent to the agent again."
		case ref.Declined && riders > 1:
			n += " It is left out of the conversation, with the " + strconv.Itoa(riders) +
				" earlier messages sent along with it that got no answer; they will not be sent to the agent again."
		case ref.Declined:
			n += " It is left out of the conversation and will not be sent to the agent again."
		}
		return n
	}
	return "⚠️ The agent could not answer this message (turn " + turnID + " failed). Please try again."
}

// agentText is a user's text as the agent sees it: in a shared session, prefixed with the
// sender's neutralised name, so the agent can tell the senders apart (G7); a sender without a
// name (the HTTP API's user_name is optional) by their user id: before, every such sender was
// "[unknown]", and the agent could not tell them apart.
func (s *Session) agentText(src identity.Source, text string) string {
	if identity.IsShared(src, s.d.Config.Keys) {
		return identity.Prefix(cmp.Or(src.UserName, src.UserID), text)
	}
	return text
}

// MaxInterrupted bounds the messages of cut-short turns that the next answer answers too
// (rareState.interrupted): the most recent ones.
const MaxInterrupted = 100

// interrupt cancels the running turn for a newer message (interrupt mode): the cancelled turn's
// reply, if it ever comes, is never delivered, and its messages are marked failed. The next turn
// still sees them in its history.
func (s *Session) interrupt(c actor.Context) {
	r := s.running
	if r == nil {
		return
	}
	s.running = nil
	s.cancelAwaited(c, r)
	s.cutTurnCounted(r, "cancelled")
	if s.debugOn() {
		s.logger().Debug("turn interrupted", "turn", r.id)
	}
	// Messages steered into the turn are cut short with it, as stopWork has them: left out,
	// they stayed pending in the store and in no queue, never answered.
	s.cutShort(c, append(slices.Clone(r.items), r.steered...), r.id)
}

// cutShort takes cut, the messages of a turn an interrupt cut short (turnID), as answered by the
// next answer (rareState.interrupted), and marks them failed in the store with that turn's id.
func (s *Session) cutShort(c actor.Context, cut []*item, turnID string) {
	seqs := s.itemSeqs(cut)
	// The next turn's answer answers these too: their senders (a client waiting on one) hear
	// that the conversation moved on, and no notice interrupts it. Only the last
	// MaxInterrupted are kept: a chat that writes faster than its agent answers interrupts
	// every turn, and the list (and the answer's in_reply_to) grew without bound until an answer
	// came. Older ones are failed in the store, as they are; a restart keeps fewer still (those
	// in the loaded history, restoreInterrupted).
	u := s.rare()
	u.interrupted = append(u.interrupted, cut...)
	if n := len(u.interrupted); n > MaxInterrupted {
		u.interrupted = slices.Clone(u.interrupted[n-MaxInterrupted:])
	}
	s.write(c, []persistence.Op{&persistence.SetMessageStatus{SessionID: cut[0].sessionID, Seqs: seqs,
		Status: persistence.StatusFailed, TurnID: turnID}}, func(c actor.Context, err error) {
		if err != nil {
			s.logRefusedWrite("store interrupted turn; its messages are marked failed with the answer that answers them", err, "turn", turnID)
			return // (the answer's write marks them again: markCut)
		}
		s.forgetCopies(cut)
	})
}

// supersede cuts short, in interrupt mode, the messages queued ahead of it while the turn an
// interrupt cancelled still ends (its command cleaning up on SIGTERM): they were to run next,
// and it is newer. Before, it queued behind them, and the next of them ran whole, however long
// it took, uninterrupted (found by an audit). It acts only on a plain queue: every message
// ahead of it stored, of its session and older, none set aside by a command, nothing spilled.
// It reports whether it cut any.
func (s *Session) supersede(c actor.Context, it *item) bool {
	n := len(s.queue) - 1
	if n < 1 || s.queue[n] != it || s.spilling() != nil || s.halted || s.leaving || s.fencedOut {
		return false
	}
	ahead := s.queue[:n]
	for _, q := range ahead {
		if !q.durable || q.dropped || q.sessionID != it.sessionID || q.seq > it.seq {
			return false
		}
	}
	cut := slices.Clone(ahead)
	s.queue = []*item{it}
	for _, q := range cut { // the next turn sees them, as it sees a cut turn's
		s.history = append(s.history, s.histOf(q, s.agentMessage(q)))
	}
	s.trimHistory()
	s.cutShort(c, cut, newID("t_"))
	return true
}

// markCut returns the writes that mark failed the messages an interrupt cut short (cut), for
// the write that records the answer that answers them. The interrupt marked them when it cut
// them; when the store refused that mark, they stayed pending there though answered, and the
// key's next activation ran them and answered them a second time. A mark that landed keeps
// the cut turn's id (no TurnID here).
func (s *Session) markCut(cut []*item) []persistence.Op {
	ops := make([]persistence.Op, 0, len(cut)+4)
	for _, it := range cut {
		ops = append(ops, &persistence.SetMessageStatus{SessionID: it.sessionID, Seqs: s.seqsOf(it), Status: persistence.StatusFailed})
	}
	return ops
}

// restoreInterrupted rebuilds at load the messages of turns an interrupt cut short that no
// answer has answered yet (rareState.interrupted), from the loaded history: user rows marked
// failed with the id of a turn that wrote no answer row, that no outbox entry answers (a
// /stop or a set-aside notice answered those it took). Before, only memory held them: a
// session that restarted (a crash, a daemon restart) before the next answer answered the
// interrupting message alone, and the messages it cut short never.
func (s *Session) restoreInterrupted(history []persistence.Message) {
	cutShort := func(m *persistence.Message) bool {
		return m.Role == persistence.RoleUser && m.Status == persistence.StatusFailed && m.TurnID != "" && m.MessageID != ""
	}
	if !slices.ContainsFunc(history, func(m persistence.Message) bool { return cutShort(&m) }) {
		return // nearly every activation: nothing to look up, nothing allocated
	}
	answered := map[string]bool{} // turns that wrote their answer (a reply, or a failure notice)
	for _, m := range history {
		if m.Role != persistence.RoleUser && m.TurnID != "" {
			answered[m.TurnID] = true
		}
	}
	for _, m := range history {
		if !cutShort(&m) || answered[m.TurnID] {
			continue
		}
		ctx, cancel := context.WithTimeout(s.d.Ctx, duplicateCheckTimeout)
		replies, err := s.d.Store.RepliesTo(ctx, s.key, m.MessageID, 0)
		cancel()
		if err != nil {
			s.logger().Warn("look up the answer of an interrupted message", "message_id", m.MessageID, logging.Err(err))
			continue
		}
		if slices.ContainsFunc(replies, answers) {
			continue
		}
		src := s.sourceOf(s.cur)
		src.UserID, src.UserName = m.UserID, m.UserName
		s.rare().interrupted = append(s.rare().interrupted, &item{seq: m.Seq, sessionID: m.SessionID, src: src,
			messageID: m.MessageID, text: m.Content, at: m.CreatedAt, durable: true})
	}
}

// answers reports whether e answers the messages it lists. The automatic reset notice does not:
// it lists the message that started the new session, whose own answer follows. It is the only
// notice without a turn that begins with its words; a reply may begin with anything.
func answers(e persistence.OutboxEntry) bool {
	return e.Kind != platforms.KindNotice || e.TurnID != "" || !strings.HasPrefix(e.Text, AutoResetNotice)
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

// persistFromRow is a transcript row as the agent sees it.
func persistFromRow(m persistence.Message) agents.Message {
	return agents.Message{Role: m.Role, Text: m.Content, MessageID: m.MessageID, At: m.CreatedAt}
}

// histEntry is one message of the in-memory transcript buffer.
type histEntry struct {
	seq int64
	// copy is the seq of an earlier copy of a user message's write that the store may hold in
	// place of seq's row (noteCopy), 0 when none: what takes the message back out of the
	// conversation (/undo, /retry, a declined turn's riders) archives both (seqs).
	copy   int64
	raw    string // the authored text (msg.Text may carry a sender prefix)
	msg    agents.Message
	sender string // a user message's user id: /undo and /retry take back only the caller's own
}

// histOf is the history entry of it, a message the agent is sent as msg, with the seq of an
// earlier copy of its write the store may hold (noteCopy). The session forgets the copy once
// the write that gives the message its final status lands (forgetCopies), but the rewinds
// come later: before, they archived the later seq only, which the database never held, and the
// message the user took back came back in the conversation at the next load
// (TestRewindOfAMessageSpooledTwiceTakesBackItsStoredCopy).
func (s *Session) histOf(it *item, msg agents.Message) histEntry {
	return histEntry{seq: it.seq, copy: s.copyOf(it), raw: it.text, msg: msg, sender: it.src.UserID}
}

// seqs appends h's seqs to seqs: its own, and its earlier copy's (histEntry.copy).
func (h *histEntry) seqs(seqs []int64) []int64 {
	if h.copy != 0 {
		return append(seqs, h.seq, h.copy)
	}
	return append(seqs, h.seq)
}

// agentHistory is the buffer as the agent sees it.
func (s *Session) agentHistory() []agents.Message {
	out := make([]agents.Message, len(s.history))
	for i, h := range s.history {
		out[i] = h.msg
	}
	return out
}

// trimHistory keeps the last HistoryLimit entries. A full buffer is trimmed twice a turn, so it
// shifts them to the front of the buffer it has, clearing the slots it frees; only a buffer
// with more than historyHeadroom spare slots (grown by a turn of many messages, or a reload) is
// replaced by one of the limit plus that headroom.
func (s *Session) trimHistory() {
	n := s.d.Config.HistoryLimit
	if len(s.history) <= n {
		return
	}
	keep := s.history[len(s.history)-n:]
	if cap(s.history) > n+historyHeadroom {
		s.history = append(make([]histEntry, 0, n+historyHeadroom), keep...)
		return
	}
	k := copy(s.history, keep)
	clear(s.history[k:])
	s.history = s.history[:k]
}

// historyHeadroom is the spare room of a full transcript buffer: a turn's user message and
// reply are appended without growing it.
const historyHeadroom = 2

// onTurnFinished records the agent's reply, sends it and starts the next turn.
func (s *Session) onTurnFinished(c actor.Context, m *TurnFinished) {
	r := s.running
	if r == nil || r.id != m.TurnID {
		return // a cancelled turn's late result: never delivered
	}
	if m.Err != nil && !s.d.Stopping.Load() && errors.Is(m.Err, agents.ErrStopSignal) {
		// A service manager that stops agentgate and its agents' commands at once signals
		// agentgate first, but the command dies at once, and its turn can end before the
		// signal handler has begun the stop. The turn stays running (the session busy, no other
		// turn starts) until stopSignalGrace has passed: a stop begun by then cut it short.
		s.timers(c).SendOnce(stopSignalGrace, c.Self(), &signalledTurn{m})
		return
	}
	s.onTurnEnded(c, m)
}

// giveBackNote keeps the continuity note of a turn that answered nothing (it failed, or was
// cancelled) for the session's next turn, as a reload would (restoreContinuity: no turn has
// answered yet): before, a failed first turn after an automatic reset took the note with it.
func (s *Session) giveBackNote(r *turnRun) {
	if r.note == "" || s.cur == nil || s.cur.ID != r.items[0].sessionID || s.unusual != nil && s.unusual.continuity != "" {
		return
	}
	s.rare().continuity = r.note
}

// stopSignalGrace is how long a turn whose agent a stop signal ended waits for the daemon's
// stop to begin before it counts as failed (onTurnFinished).
const stopSignalGrace = 2 * time.Second

// signalledTurn is a TurnFinished held for stopSignalGrace (onTurnFinished).
type signalledTurn struct{ m *TurnFinished }

// onTurnEnded is onTurnFinished once the turn's result is to be taken.
func (s *Session) onTurnEnded(c actor.Context, m *TurnFinished) {
	r := s.running
	if r == nil || r.id != m.TurnID {
		return // cancelled while its result was held (signalledTurn)
	}
	s.running = nil
	c.Stop(r.pid)
	// An agent (a model endpoint) reports the usage: a negative count would panic the token
	// counter and fail the turn's write, one out of all reason overflow the session's totals.
	m.Usage.InputTokens, m.Usage.OutputTokens = saneTokens(m.Usage.InputTokens), saneTokens(m.Usage.OutputTokens)
	// Steered messages the agent saw belong to this turn; any that arrived after it answered run
	// next, in order.
	k := min(m.Steered, len(r.steered))
	for _, it := range r.steered[:k] {
		r.items = append(r.items, it)
		s.history = append(s.history, s.histOf(it, s.agentMessage(it)))
	}
	s.queue = append(slices.Clone(r.steered[k:]), s.queue...)
	s.d.Metrics.TurnDuration.Observe(m.Took.Seconds())
	if m.Usage.InputTokens > 0 || m.Usage.OutputTokens > 0 {
		s.d.Metrics.AgentTokens.WithLabelValues("input").Add(float64(m.Usage.InputTokens))
		s.d.Metrics.AgentTokens.WithLabelValues("output").Add(float64(m.Usage.OutputTokens))
	}
	if m.Err != nil && s.d.Stopping.Load() && errors.Is(m.Err, agents.ErrStopSignal) {
		if s.d.Aborted.Load() {
			// The daemon's exit killed it (a second stop signal), and its own line says so;
			// the warning below sent a user who pressed Ctrl-C twice to look for a systemd
			// problem that was not there (a new user's walkthrough).
			s.logger().Debug("the agent's process was killed by agentgate's exit; its messages "+s.atNextStart(), "turn", r.id)
		} else {
			s.logger().Warn("the agent's process was ended by a signal while agentgate stops; its messages "+s.atNextStart()+
				" (a service manager signalled it with agentgate: under systemd, set KillMode=mixed)", "turn", r.id, logging.Err(m.Err))
		}
		s.cutShortByStop(c, r)
		return
	}
	if errors.Is(m.Err, ErrAgentCallsClosed) {
		// The stop had already waited for the agent calls: the agent never ran.
		s.logger().Warn("a turn began after agentgate's stop waited for the agent calls, and did not run; its messages "+s.atNextStart(),
			"turn", r.id)
		s.cutShortByStop(c, r)
		return
	}
	s.finishDraft(c, r.items[0].src.Platform, r.id)
	if m.Err != nil {
		s.d.Metrics.TurnsTotal.WithLabelValues("error").Inc()
		s.logTurnFailed(r, m.Err)
		s.giveBackNote(r)
		var archive, riders []int64
		var n int
		switch ref, _ := errors.AsType[*agents.Refusal](m.Err); {
		case ref != nil && ref.Declined:
			riders, n = s.leaveOut(r, true)
			archive = append(s.itemSeqs(r.items), riders...)
		}
		s.finish(c, r, persistence.RoleNotice, failedNotice(r.id, m.Err, n), persistence.StatusFailed, m.Usage, archive)
	} else {
		s.d.Metrics.TurnsTotal.WithLabelValues("ok").Inc()
		var archive []int64
		if m.RidersLeftOut {
			// The agent answered without them, once the endpoint had refused the request
			// with them (agents.Response.RidersLeftOut): its reply says so.
			archive, _ = s.leaveOut(r, false)
		}
		s.finish(c, r, persistence.RoleAssistant, m.Text, persistence.StatusDone, m.Usage, archive)
	}
	s.tryStart(c)
}

// logTurnFailed logs the failure of r with err: at Warn at once, then once a LimitEvery for all
// sessions (Deps.turnFailures), with how many failed turns it held back since the last line
// ("repeats"); each held back at Debug, in full. An agent that fails every turn (a broken
// command, a model endpoint down) logged a line for each message, burying every other line
// (a soak walkthrough); agentgate_turns_total{outcome="error"} counts them all.
func (s *Session) logTurnFailed(r *turnRun, err error) {
	s.d.turnFailures.Log(s.logger(), slog.LevelWarn, "turn failed",
		"turn", r.id, logging.KeyMessage, strings.Join(messageIDs(r.items), ","), logging.Err(err))
}

// atNextStart says, for the lines of a stop that cuts turns short, what becomes of their
// messages: they run again at the next start, or with sessions.recovery: notice are answered
// with a notice then. Before, the lines said they run again in either case (found by a review).
// A cluster member's run again on the member that takes the session over, or at the cluster's
// next start, whatever sessions.recovery says: a cluster's recovery (Recover) runs the work, as
// its manager activates a key not as a recovery (SessionManager.recover), since a Recover there
// follows any change of membership, a member that left cleanly too, whose work no notice may
// answer. Before, a member's line said they would be answered with a notice, and they ran
// (TestCutShortLineSaysWhatBecomesOfTheMessages; the supervisor's drain line said so already).
func (s *Session) atNextStart() string {
	switch {
	case s.d.Clustered:
		return "run again on the member that takes their session over, or at the next start"
	case s.d.Config.Recovery == RecoveryNotice:
		return "are answered at the next start with a notice instead of run (sessions.recovery: notice)"
	}
	return "run again at the next start"
}

// cutTurnCounted counts a turn that ends without its result (cancelled, or crashed with its
// session) under outcome, and how long it ran: the turns with a result are observed as they
// end (onTurnEnded), and those without were missing from agentgate_turn_duration_seconds, whose
// count then fell short of agentgate_turns_total's (found by an audit).
func (s *Session) cutTurnCounted(r *turnRun, outcome string) {
	s.d.Metrics.TurnsTotal.WithLabelValues(outcome).Inc()
	s.d.Metrics.TurnDuration.Observe(max(s.d.now().Sub(r.started), 0).Seconds())
}

// cutShortByStop ends a turn the daemon's stop cut short: its agent's process was ended by a
// stop signal (a service manager that signals agentgate's whole process tree at once, systemd's
// default KillMode=control-group, ends the agents' commands along with it), or it began after
// the stop had waited for the agent calls and never ran (ErrAgentCallsClosed). The turn did
// not fail: its messages stay pending in the store and run again at the next start (or, in a
// cluster, on the key's next owner), as a turn cancelled at the drain deadline does, and the
// session starts no turn before it stops (halted).
func (s *Session) cutShortByStop(c actor.Context, r *turnRun) {
	s.d.Metrics.TurnsTotal.WithLabelValues("cancelled").Inc()
	s.cancelTurn(c, r)
	// Back at the head of the queue, as pending as they are in the store: a leaving member's
	// session then has its successor run them at once (passivate.rerun).
	s.queue = append(slices.Clone(r.items), s.queue...)
	s.history = slices.DeleteFunc(s.history, func(h histEntry) bool {
		return slices.ContainsFunc(r.items, func(it *item) bool { return it.seq == h.seq })
	})
	s.halted = true
	s.tryStart(c)
}

// leaveOut takes the messages of r, a turn the agent declined for what they say
// (agents.Refusal.Declined), out of the transcript buffer when own is set: a failed message
// otherwise stays in the history of later turns, merged into the next user message, and every
// later message was sent with it and declined too, until /new. The user messages right before
// the turn's, which no reply follows (their turns failed, or an interrupt cut them short), go
// with them, and leaveOut returns their seqs (an earlier copy's too: histEntry.copy) and how
// many they are: they rode in the declined request, merged into its message, and may be what
// was declined; left in, they made the next message declined in its turn
// (TestDeclinedRidersAreLeftOut). Of a turn the agent answered without them, once the
// endpoint had refused the request with them (agents.Response.RidersLeftOut), only those go
// (own is not set): a message the endpoint cannot take no longer rides along with every later
// one (TestRefusedRidersAreLeftOut). finish archives all their rows, so that a reload leaves
// them out as well.
func (s *Session) leaveOut(r *turnRun, own bool) (riders []int64, n int) {
	if s.cur == nil || s.cur.ID != r.items[0].sessionID {
		return nil, 0 // the buffer holds another session's messages
	}
	first := slices.IndexFunc(s.history, func(h histEntry) bool { return h.seq == r.items[0].seq })
	for i := first - 1; i >= 0 && s.history[i].msg.Role == persistence.RoleUser; i-- {
		riders = s.history[i].seqs(riders) // and an earlier copy's (histEntry.copy)
		n++
	}
	s.history = slices.DeleteFunc(s.history, func(h histEntry) bool {
		return slices.Contains(riders, h.seq) || own && slices.ContainsFunc(r.items, func(it *item) bool { return it.seq == h.seq })
	})
	return riders, n
}

// maxTurnTokens bounds the tokens one turn may add to its session's totals.
const maxTurnTokens = 1 << 40

func saneTokens(n int64) int64 { return min(max(n, 0), maxTurnTokens) }

// withoutNUL replaces NUL characters, which PostgreSQL cannot store in text, by U+FFFD.
func withoutNUL(s string) string { return strings.ReplaceAll(s, "\x00", "\uFFFD") } // s itself when it has none

// shownText is an agent's text (a reply, a draft's text, a refusal's notice) as agentgate stores
// and sends it, to every platform alike: valid UTF-8 (bytes that are not become U+FFFD, as the
// exec agent makes them), each NUL U+FFFD (withoutNUL), and without the other control characters
// (C0, DEL, C1) but tab, line feed, carriage return and ESC. A chat shows no control character;
// Discord strips them, and refused a reply of nothing else as empty (50006), which was logged
// at ERR as undeliverable for good and recorded failed; an HTTP client got them escaped, a bell
// or a backspace for a terminal that prints the text. ESC stays: Discord's ansi code blocks
// colour text with its codes. The transcript stores what was sent, and the next turn's history
// reads it (TestAgentControlCharactersReachNoChat).
func shownText(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, hiddenControl) {
		return s
	}
	return strings.Map(func(r rune) rune {
		switch {
		case r == 0:
			return '\uFFFD'
		case hiddenControl(r):
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}

// hiddenControl reports whether r is a control character that shownText takes out (NUL, which
// it replaces, included).
func hiddenControl(r rune) bool {
	return unicode.IsControl(r) && r != '\t' && r != '\n' && r != '\r' && r != '\x1b'
}

// finish records the end of a turn (reply row, message status, outbox, activity, route and the
// tokens it used, in one write) and sends the reply once it is durable. It archives the rows of
// the session's messages archive lists too (those leaveOut left out of the conversation), as
// /undo does: History, which a reload reads, skips them. A write the store refuses as
// unavailable is held and written again (heldWrites): the agent does not run again for it.
func (s *Session) finish(c actor.Context, r *turnRun, role, text, status string, usage agents.Usage, archive []int64) {
	now := s.d.now()
	text = shownText(text) // an agent's output: PostgreSQL stores no NUL, and no chat shows a control character
	seqs := s.itemSeqs(r.items)
	var interrupted []*item
	if u := s.unusual; u != nil {
		interrupted, u.interrupted = u.interrupted, nil
	}
	ids := append(messageIDs(interrupted), messageIDs(r.items)...)
	sid := r.items[0].sessionID
	ops := append(s.markCut(interrupted),
		&persistence.SetMessageStatus{SessionID: sid, Seqs: seqs, Status: status, TurnID: r.id})
	if len(archive) > 0 {
		ops = append(ops, &persistence.ArchiveMessages{SessionID: sid, Seqs: archive})
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
		// The route is written when it changes (a new incarnation, a resume), not every turn:
		// nothing reads its time, and the session row carries the activity.
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
	s.submit(c, &pendingWrite{ops: ops, turn: r.id, platform: r.items[0].src.Platform, done: func(c actor.Context, err error) {
		if err != nil {
			switch {
			case errors.Is(err, errHandedOver):
				// Held after the store refused it, and the session hands over first.
				s.logger().Warn("a turn's result the store refused is given up as the session hands over; its message runs again", "turn", r.id)
			case errors.Is(err, persistence.ErrFenced):
				// Another activation owns the key (a cluster moved it, or an operator reset it):
				// it runs the message, and this result is rightly refused.
				s.logger().Warn("turn result refused: another activation owns the session; it runs the message", "turn", r.id, logging.Err(err))
			default:
				s.logRefusedWrite("store turn result", err, "turn", r.id)
			}
			s.dropDraft(c, r) // no reply finishes it: the message answers anew
			if !errors.Is(err, persistence.ErrFenced) && !s.fencedOut {
				// Refused for what it holds (not held: writing it again would not help), nothing
				// of the turn is stored: its message is still pending and runs again. A reply
				// sent now would be the first of two.
				s.restartFromStore(c, "the turn's result was not stored", err)
			}
			return
		}
		s.forgetCopies(r.items)
		s.forgetCopies(interrupted)
		s.sendOutbound(c, OutboundFromEntry(&entry))
	}})
}
