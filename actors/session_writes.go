package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"
)

// logRefusedWrite logs a write of the session the store refused, with err. Refused as
// unavailable (the database, and the spool if there is one, failing) it is a Warn: the outage
// is no one session's, and the persistence actor's ERR line reports it once for them all.
// Refused as fenced, another activation owns the key and does the work. Any other refusal is an
// Error: a human must look (a bug, a database that refuses what it holds).
func (s *Session) logRefusedWrite(msg string, err error, args ...any) {
	level := slog.LevelError
	if errors.Is(err, persistence.ErrUnavailable) || errors.Is(err, persistence.ErrFenced) {
		level = slog.LevelWarn
	}
	s.logger().Log(s.d.Ctx, level, msg, append(args, logging.Err(err))...)
}

// logRefusedInbound logs a message's refused write (logRefusedWrite). A refusal of an outage
// (persistence.ErrUnavailable) is logged at most once a LimitEvery for all sessions, with how
// many it stands for (repeats): the persistence actor's ERR line says what fails.
func (s *Session) logRefusedInbound(err error, messageID string, seq int64) {
	const msg = "store inbound message; its sender is told to send it again"
	if !errors.Is(err, persistence.ErrUnavailable) {
		s.logRefusedWrite(msg, err, "message_id", messageID, "seq", seq)
		return
	}
	// (At Warn, as logRefusedWrite logs a refusal as unavailable.)
	s.d.inboundRefusals.LogQuiet(s.logger(), slog.LevelWarn, msg, "message_id", messageID, "seq", seq, logging.Err(err))
}

// logRefusedCommand logs a command's refused write (logRefusedWrite). A refusal of an outage
// (persistence.ErrUnavailable) is logged once a LimitEvery for each command (its session and
// message id), with how many resends it stands for (repeats), and at Debug between, and the
// commands of many sessions in one line a minute (logging.KeyedLimiter): its client resends the
// command, refused again, until the outage ends, and each resend logged it
// (TestRefusedCommandResendsAreLoggedOnceAMinute). Another command is logged at once.
func (s *Session) logRefusedCommand(err error, messageID, command string) {
	const msg = "store command; its sender is told to send it again"
	if !errors.Is(err, persistence.ErrUnavailable) || messageID == "" {
		s.logRefusedWrite(msg, err, "message_id", messageID, "command", command)
		return
	}
	// (At Warn, as logRefusedWrite logs a refusal as unavailable.)
	s.d.commandRefusals.Log(s.logger(), slog.LevelWarn, msg, s.key+" "+messageID, "message_id", messageID, "command", command, logging.Err(err))
}

// outboxEntry is the outbox entry of one reply or notice to src, with the next outbox seq.
func (s *Session) outboxEntry(src identity.Source, sid, kind, text, turnID string, inReplyTo []string, now time.Time) persistence.OutboxEntry {
	s.lastOut++
	return NewOutboxEntry(s.key, s.lastOut, src, sid, kind, text, turnID, inReplyTo, now)
}

// NewOutboxEntry is the pending outbox entry seq of key: a message of kind to the chat of src,
// under the session sid (also for `agentgate sessions reset`, which writes its notice without
// a session actor).
func NewOutboxEntry(key string, seq int64, src identity.Source, sid, kind, text, turnID string, inReplyTo []string, now time.Time) persistence.OutboxEntry {
	return persistence.OutboxEntry{
		SessionKey: key, Seq: seq, SessionID: sid, Kind: kind, Text: text, TurnID: turnID,
		InReplyTo: inReplyTo, Platform: src.Platform, ChatType: src.ChatType, ChatID: src.ChatID,
		ThreadID: src.ThreadID, UserID: src.UserID, State: persistence.DeliveryPending, CreatedAt: now,
	}
}

// OutboundFromEntry is the platform message for a recorded outbox entry: the end of its turn
// unless the entry says its answer goes on (Continued).
func OutboundFromEntry(e *persistence.OutboxEntry) *platforms.Outbound {
	return &platforms.Outbound{
		SessionKey: e.SessionKey, SessionID: e.SessionID, Seq: e.Seq, Kind: e.Kind, Text: e.Text,
		TurnID: e.TurnID, InReplyTo: slices.Clone(e.InReplyTo), CreatedAt: e.CreatedAt, TurnEnd: !e.Continued,
		Target: identity.Source{Platform: e.Platform, ChatType: e.ChatType, ChatID: e.ChatID, ThreadID: e.ThreadID, UserID: e.UserID},
	}
}

func (s *Session) sendOutbound(c actor.Context, out *platforms.Outbound) {
	s.toPlatform(c, &SendOutbound{Out: out})
}

// sendOutboundAgain hands over a reply the store shows unconfirmed at load (SendOutbound.Again),
// with the delivery attempts the store counts for it.
func (s *Session) sendOutboundAgain(c actor.Context, e *persistence.OutboxEntry) {
	s.toPlatform(c, &SendOutbound{Out: OutboundFromEntry(e), Again: true, Attempts: e.Attempts})
}

func (s *Session) toPlatform(c actor.Context, m *SendOutbound) {
	if s.fencedOut {
		return // the write behind it was refused, or the new owner sends it
	}
	pid := s.d.Platforms[m.Out.Target.Platform]
	if pid == nil {
		s.logger().Error("no platform for a reply; it is not sent and stays unconfirmed in the outbox",
			"platform", m.Out.Target.Platform, "seq", m.Out.Seq)
		return
	}
	c.Send(pid, m)
}

// write sends ops to the persistence actor and runs done with the result. The session keeps
// the write until it is acknowledged and sends it again, in order with its other unacknowledged
// writes, when the persistence actor has restarted since it sent it (resendAll). No requester
// waits for it (an automatic reset, a set-aside, a probation mark, an interrupted turn's
// mark): refused as unavailable while the session holds a turn's result, it is held behind
// that result and written again after it (holdResult). It returns the write, as writeFor does.
func (s *Session) write(c actor.Context, ops []persistence.Op, done func(actor.Context, error)) *pendingWrite {
	w := &pendingWrite{ops: ops, done: done, kept: true}
	s.submit(c, w)
	return w
}

// writeFor is write for a request whose requester waits for done's answer: if this incarnation
// of the session ends (a crash or a stop) before the write is answered, orphaned answers it
// instead with why (answerOrphans). The write may still commit: why says to send the request
// again with the same message id, which the store's dedupe makes safe.
// It returns the write, for its caller to note what a crash before its answer must not lose
// (pendingWrite.files).
func (s *Session) writeFor(c actor.Context, ops []persistence.Op, orphaned func(c actor.Context, why string), done func(actor.Context, error)) *pendingWrite {
	w := &pendingWrite{ops: ops, done: done, orphaned: orphaned}
	s.submit(c, w)
	return w
}

// writeQuietFor is writeFor for a command's write that adds nothing to the conversation of the
// session it leaves current (pendingWrite.quiet).
func (s *Session) writeQuietFor(c actor.Context, ops []persistence.Op, orphaned func(c actor.Context, why string), done func(actor.Context, error)) *pendingWrite {
	w := &pendingWrite{ops: ops, done: done, orphaned: orphaned, quiet: true}
	s.submit(c, w)
	return w
}

// submit numbers w (behind the key's Fence when it is claimed) and sends it. While the session
// holds a turn's result the store refused (heldWrites), w waits behind it instead: no write made
// since goes ahead of that result, and the result is tried again at once.
func (s *Session) submit(c actor.Context, w *pendingWrite) {
	if s.epoch > 0 {
		w.ops = append([]persistence.Op{&persistence.Fence{Key: s.key, Epoch: s.epoch}}, w.ops...)
	}
	w.id = s.d.writeIDs.Add(1)
	if h := s.held(); h != nil {
		h.writes = append(h.writes, w)
		s.sendHeld(c)
		return
	}
	s.sendWrite(c, w)
}

// sendWrite sends w, numbered, to the persistence actor and keeps it until it is answered.
func (s *Session) sendWrite(c actor.Context, w *pendingWrite) {
	inc := s.d.PersistIncarnation.Load()
	if s.lostSome(inc) {
		s.resendAll(c, inc) // nothing newer goes ahead of them
	}
	s.send(c, w, inc, s.behind(w))
	s.inflight = append(s.inflight, w)
	if s.stopResend == nil {
		s.stopResend = s.timers(c).SendOnce(resendAfter, c.Self(), &resendTick{})
	}
}

// behind reports whether a write the session made before w is unacknowledged: w goes after it
// (persistence.Write.After). A write made after w does not count. One is in flight only when w
// is a held result written again (sendHeld) and the write was sent behind it before its
// refusal came: the persistence actor refuses that write (it reaches it first, and it keeps
// the refusal), or it comes after w, which is then stored or refused before it. Counted, it had
// the persistence actor refuse w again, as sent behind the refusal it keeps, although the disk
// had room, and with w the messages waiting behind it
// (TestHeldResultRetriedWhileAWriteBehindItIsInFlightIsTaken).
func (s *Session) behind(w *pendingWrite) bool {
	return slices.ContainsFunc(s.inflight, func(x *pendingWrite) bool { return x.id < w.id })
}

type pendingWrite struct {
	id       uint64
	ops      []persistence.Op
	done     func(actor.Context, error)
	orphaned func(actor.Context, string) // answers its requester if the session ends first (writeFor)
	inc      uint64                      // the persistence actor's incarnation when the write was last sent
	// turn is the id of the turn whose result this is (finish); "" for any other write. Such a
	// write the store refuses as unavailable is held and written again (holdResult).
	turn     string
	platform string // the platform of turn's chat, whose draft waits for this result (keepDrafts)
	// message: the write of an inbound message that neither begins nor ends a session. Held
	// behind a turn's result that the store refuses again, it is refused with it (refuseBehind).
	message bool
	// kept: a write no requester waits for (write). Refused as unavailable while the session
	// holds a turn's result, it is held in its place behind it (holdResult).
	kept bool
	// quiet: a command's write that adds nothing to the conversation of the session it leaves
	// current (a /new or /reset, which began that session; /status, /title…). In flight, it
	// does not keep that session from counting as fresh (Session.fresh).
	quiet bool
	// refused: held because the store refused it (holdResult), not only made behind such a
	// write. Once no held write is, the rest go out as any write does (sendHeld).
	refused bool
	// unbegun: sent behind a write that began a session, which the store refused
	// (behindUnbegun).
	unbegun *unbegunError
	// files is the reset that fell due while the session worked, taken before a command that
	// ended the session in memory ahead of this write (overdueToFile), or the automatic reset
	// this write stores (writeReset): filed for the key's next incarnation if the session
	// crashes before the write is answered (filesOfUnanswered).
	files *overdue
}

// filesOfUnanswered is the reset of the first write still unanswered, in flight or held, that
// files one (pendingWrite.files); nil when none does. A session that crashes files it for its
// next incarnation (onRestarting): that write may be refused after the crash, and the store then
// holds the old session still, whose activity (the work the reset waited for) lies past the due
// time.
func (s *Session) filesOfUnanswered() *overdue {
	writes := s.inflight
	if h := s.held(); h != nil {
		writes = append(slices.Clone(writes), h.writes...)
	}
	for _, w := range writes {
		if w.files != nil {
			return w.files
		}
	}
	return nil
}

// answerOrphans answers the requesters of the writes still in flight when this incarnation
// ends (a crash or a stop): their answers would reach the next incarnation, which knows nothing
// of them, and the requester would wait in vain although the command may have been stored
// and its answer sent to the chat.
func (s *Session) answerOrphans(c actor.Context, why string) {
	writes := s.inflight
	if h := s.held(); h != nil {
		writes = append(slices.Clone(writes), h.writes...) // (one may be in both: answered once)
	}
	for _, w := range writes {
		if w.orphaned != nil {
			w.orphaned(c, why)
			w.orphaned = nil
		}
	}
}

// unstoredResult answers the request of message id whose write this session cannot see through.
func (s *Session) unstoredResult(id, why string) *DeliverResult {
	return &DeliverResult{SessionKey: s.key, MessageId: id, ErrorCode: ErrCodeStopped, Error: why}
}

// send sends w to the persistence actor's incarnation inc; after says that earlier writes of
// this session are unacknowledged, and a turn's result is kept if refused (persistence.Write).
func (s *Session) send(c actor.Context, w *pendingWrite, inc uint64, after bool) {
	w.inc = inc
	c.Request(s.d.Persist, &persistence.Write{ID: w.id, Ops: w.ops, Incarnation: inc, After: after, Keep: w.turn != ""})
}

// lostSome reports whether an unacknowledged write was sent to an incarnation of the
// persistence actor older than inc: the restart may have lost it.
func (s *Session) lostSome(inc uint64) bool {
	return slices.ContainsFunc(s.inflight, func(w *pendingWrite) bool { return w.inc < inc })
}

// resendAll sends every unacknowledged write again, in the order they were first sent, to the
// persistence actor's incarnation inc. A write the restart did not lose is applied twice, in
// order (writes are idempotent); the first answer for it settles it. A write sent behind the
// turn result the session holds, before its refusal came, is refused instead, as the incarnation
// that refused the result would have refused it (persistence.Write): the restart lost what it
// knew of that refusal, and sent again the write could commit ahead of the result.
func (s *Session) resendAll(c actor.Context, inc uint64) {
	s.logger().Warn("the persistence actor restarted; sending the unacknowledged writes again", "writes", len(s.inflight))
	h, after := s.held(), false
	for _, w := range s.inflight {
		if h != nil && len(h.writes) > 0 && w.id > h.writes[0].id {
			w.inc = inc // answered below: it counts as sent to inc (lostSome)
			c.Send(c.Self(), &persistence.WriteResult{ID: w.id, Err: errBehindHeld})
			continue
		}
		s.send(c, w, inc, after)
		after = true
	}
}

// errBehindHeld refuses a write sent behind a turn result the session holds when the persistence
// actor restarts before it answered the write (resendAll).
var errBehindHeld = fmt.Errorf("%w: sent behind a turn result the store refused", persistence.ErrUnavailable)

// resendTick wakes a session that has unacknowledged writes to check whether the persistence
// actor restarted since it sent them. It does not count as activity for passivation.
type resendTick struct{}

// timers returns a scheduler that sends from c. It is made for each use, not kept: it is only
// a SenderContext, and a session that kept one would hold it while idle (G7).
func (s *Session) timers(c actor.Context) *scheduler.TimerScheduler {
	return scheduler.NewTimerScheduler(c)
}

func (s *Session) resend(c actor.Context) {
	s.stopResend = nil
	if len(s.inflight) == 0 {
		return
	}
	if inc := s.d.PersistIncarnation.Load(); s.lostSome(inc) {
		s.resendAll(c, inc)
	}
	s.stopResend = s.timers(c).SendOnce(resendAfter, c.Self(), &resendTick{})
}

func (s *Session) onWriteResult(c actor.Context, m *persistence.WriteResult) {
	i := slices.IndexFunc(s.inflight, func(w *pendingWrite) bool { return w.id == m.ID })
	if i < 0 {
		return // an answer to a write sent again, already handled
	}
	w := s.inflight[i]
	if errors.Is(m.Err, persistence.ErrResend) {
		// Sent behind writes a restart of the persistence actor may have lost; unless they
		// were sent again since, send them again, in order, and this one after them.
		if inc := s.d.PersistIncarnation.Load(); w.inc < inc {
			s.resendAll(c, inc)
		}
		return
	}
	s.inflight = slices.Delete(s.inflight, i, i+1)
	if len(s.inflight) == 0 {
		s.inflight = nil // an idle session keeps no buffer, and no timer
		if s.stopResend != nil {
			s.stopResend()
			s.stopResend = nil
		}
	}
	if m.Err == nil {
		s.markOverdueNow()
	}
	first := s.held().first(w)
	if s.holdResult(c, w, m.Err) {
		s.updateBusy(c)
		return
	}
	if errors.Is(m.Err, persistence.ErrFenced) && !s.fencedOut {
		s.fence(c)
	}
	err := m.Err
	if err != nil {
		err = s.behindUnbegun(w, err)
	}
	w.done(c, err)
	if first {
		s.sendHeld(c) // the next held write, if any
	}
	s.setAsideDroppedUntil(c, w.id)
	s.updateBusy(c)
	s.stopWhenSettled(c)
	s.leaveIfIdle(c)
}

// unbegunError refuses a write sent behind the refused write that began session sid, which is
// not stored: the store refused this one for it (a message's row in no session: SQLite's
// "FOREIGN KEY constraint failed"). prev is the session the key goes on in, as stored (the one
// that write would have ended; "" if none): the one a message sent again goes to. It is an
// outage's refusal (persistence.ErrUnavailable): its sender sends it again. Before, its sender
// was given the store's own text and the unstored session, and the line was an ERR as if the
// store had failed on its own.
type unbegunError struct{ sid, prev string }

func (e *unbegunError) Error() string {
	return persistence.ErrUnavailable.Error() + ": sent behind the refused write that began session " + e.sid
}

func (e *unbegunError) Unwrap() error { return persistence.ErrUnavailable }

// behindUnbegun returns err, the refusal of w, as an unbegunError when w was sent behind a
// refused write that began a session and err is the store's own (no outage, duplicate, fence or
// closed store). When w began a session, the writes still in flight behind it are marked.
func (s *Session) behindUnbegun(w *pendingWrite, err error) error {
	if w.unbegun != nil && !errors.Is(err, persistence.ErrUnavailable) && !errors.Is(err, persistence.ErrDuplicate) &&
		!errors.Is(err, persistence.ErrFenced) && !errors.Is(err, persistence.ErrClosed) {
		err = w.unbegun
	}
	for _, op := range w.ops {
		if cs, ok := op.(*persistence.CreateSession); ok {
			u := &unbegunError{sid: cs.Session.ID, prev: cs.Session.PrevSessionID}
			for _, x := range s.inflight {
				if x.id > w.id {
					x.unbegun = u
				}
			}
		}
	}
	return err
}

// sessionOf is the session a refused message or command belongs to: sid, or, when it was sent
// behind the refused write that began sid, the session the key goes on in (unbegunError).
func sessionOf(sid string, err error) string {
	if u, ok := errors.AsType[*unbegunError](err); ok {
		return u.prev
	}
	return sid
}

// resendAfter is how often a session with unacknowledged writes checks whether the persistence
// actor restarted (and lost its batch) since it sent them, and how long the platform actor
// waits for a mark write's acknowledgment before sending it again. Writes are idempotent.
const resendAfter = 5 * time.Second
