package actors

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// An operator's requeue of a quarantined message (RequeueMessage). A message set aside after
// repeated crashes may be innocent: the daemon cannot tell an outside kill (the OOM killer
// hitting the host for another process, a power loss, an operator's kill -9) from a message
// that kills it. The session that owns the message runs it again: its row moves to the end of
// the session's transcript (persistence.RequeueMessage), pending, with its strikes cleared, and
// it is queued behind the messages already waiting, under its original sender's identity (the
// sender stored with it, never the operator's). Pending messages load by seq, so a restart after
// the requeue runs it once, in the same place; a crash before its write leaves it quarantined.

// Error codes of RequeueResult (besides ErrCodeStopped and "unavailable").
const (
	ErrCodeNotFound       = "not_found"
	ErrCodeNotQuarantined = "not_quarantined"
	ErrCodeSessionEnded   = "session_ended"
)

// onRequeue queues a quarantined message of the session's current incarnation again.
func (s *Session) onRequeue(c actor.Context, m *RequeueMessage) {
	refuse := func(code, status, format string, args ...any) {
		c.Respond(&RequeueResult{SessionId: s.curID(), MessageId: m.MessageId, ErrorCode: code, Status: status,
			Error: fmt.Sprintf(format, args...)})
	}
	if s.held() != nil {
		s.refuseWhileHeld(c)
		refuse(ErrCodeUnavailable, "", "%s", heldRefusal)
		return
	}
	sess := s.cur
	if sess == nil {
		sess = s.prev
	}
	// The refusal names the key as a key, and the session it looked in: before, "no message
	// ID in session KEY" called the key a session (a CLI review).
	notFound := func() {
		switch {
		case s.cur != nil:
			refuse(ErrCodeNotFound, "", "key %s has no message %s: not in its current session %s, nor in an ended one still stored",
				s.key, m.MessageId, s.cur.ID)
		case s.prev != nil:
			refuse(ErrCodeNotFound, "", "key %s has no message %s: not in its last session %s, which has ended, nor in an earlier one still stored",
				s.key, m.MessageId, s.prev.ID)
		default:
			// The key routes to no stored session (it ended and was pruned). The HTTP API
			// answers that no_session, as GET /v1/sessions/{key} does: the member that took
			// the request says so once it has read the store (sessionsAPI.Requeue). This
			// answer stays the one every member's API knows, in code and text: a member of an
			// earlier version (during a rolling upgrade) fails a code it does not know as an
			// internal error (500), and agentgate sessions requeue reads this text as no
			// session (TestPrunedRouteRequeueAnswersAsEarlierMembersKnow).
			refuse(ErrCodeNotFound, "", "key %s has no message %s: it holds no stored session", s.key, m.MessageId)
		}
	}
	if sess == nil || m.MessageId == "" {
		notFound()
		return
	}
	// A message this activation holds is pending, whatever the store says yet: its requeue (or
	// its first write) may still be in flight. (One in the spill's stored range reads as
	// pending in the store.)
	held := func(it *item) bool { return it.messageID == m.MessageId }
	if slices.ContainsFunc(s.queue, held) || s.spilling() != nil && slices.ContainsFunc(s.spilling().tail, held) ||
		s.running != nil && slices.ContainsFunc(s.running.items, held) {
		refuse(ErrCodeNotQuarantined, persistence.StatusPending, "message %s is pending (queued or running), not quarantined", m.MessageId)
		return
	}
	if s.d.Spooling.Load() {
		// The database does not show the writes waiting in the spool: a message requeued and
		// run meanwhile still reads as quarantined there, and it would run a second time (the
		// replay then makes this requeue a no-op), as /resume refuses for the same reason.
		refuse("unavailable", "", "the database is unavailable and writes wait in the spool, so the message's status cannot be read; retry once it answers")
		return
	}
	row, err := s.findStored(s.sourceOf(sess), m.MessageId)
	if err == nil && (s.cur == nil || row.SessionID != s.cur.ID) {
		err = s.otherSession(row)
	}
	switch {
	case errors.Is(err, persistence.ErrNotFound):
		notFound()
		return
	case errors.Is(err, errEnded):
		refuse(ErrCodeSessionEnded, row.Status, "message %s belongs to session %s, which has ended (reset, /new or switched away from): "+
			"its conversation is gone, so it is not run in the current one; its sender may send it again", m.MessageId, row.SessionID)
		return
	case err != nil:
		s.logger().Warn("read a message to requeue it", "message_id", m.MessageId, logging.Err(err))
		refuse("unavailable", "", "the store cannot be read right now; retry later")
		return
	case !row.Active && row.Status == persistence.StatusFailed && row.TurnID == "":
		// Archived unrun (unrunOps): before, this read as taken back by /undo or /retry.
		refuse(ErrCodeNotQuarantined, row.Status, "message %s never ran: it was dropped unrun by a command (/stop, /new, /reset, /resume, "+
			"an operator's reset) or answered with a notice in place of its turn; only a quarantined message is requeued", m.MessageId)
		return
	case !row.Active:
		refuse(ErrCodeNotQuarantined, row.Status, "message %s was taken back (/undo or /retry); it does not run again", m.MessageId)
		return
	case row.Status != persistence.StatusQuarantined:
		refuse(ErrCodeNotQuarantined, row.Status, "message %s is %s, not quarantined: only a quarantined message is requeued", m.MessageId, row.Status)
		return
	}
	src := s.sourceOf(s.cur)
	src.UserID, src.UserName = row.UserID, row.UserName
	s.lastSeq++
	// Queued at once (not durable yet), so that a message arriving before the write's answer
	// queues behind it, as its seq does in the store.
	it := &item{seq: s.lastSeq, sessionID: row.SessionID, src: src, messageID: row.MessageID, text: row.Content, at: row.CreatedAt,
		outAfter: s.lastOut} // the run's answer comes after; the quarantine notice came before
	s.enqueue(it, false) // behind every queued message, in the spill's tail if there is one
	s.seen.add(row.MessageID)
	requester := c.Sender()
	orphaned := func(c actor.Context, why string) {
		c.Send(requester, &RequeueResult{MessageId: m.MessageId, ErrorCode: ErrCodeStopped,
			Error: "the session stopped before the requeue was stored; look at the message's status before you requeue it again"})
	}
	ops := []persistence.Op{&persistence.RequeueMessage{SessionID: row.SessionID, Seq: row.Seq, NewSeq: it.seq}}
	s.writeFor(c, ops, orphaned, func(c actor.Context, err error) {
		// The message's id delivered again meanwhile (a client's retry) waited for this write
		// (onDeliver): the message is stored, whatever its outcome.
		for _, p := range it.repeats {
			c.Send(p, &DeliverResult{SessionKey: s.key, SessionId: it.sessionID, MessageId: it.messageID,
				Disposition: platforms.Duplicate, QueueDepth: int32(s.waiting())})
		}
		it.repeats = nil
		r := &RequeueResult{SessionId: it.sessionID, MessageId: m.MessageId, OutboxAfter: it.outAfter}
		unsure := false
		if errors.Is(err, persistence.ErrUnavailable) {
			// The commit may have applied though its answer was lost (a connection lost after
			// COMMIT; a cluster member keeps no spool): the row at its new seq says so. Then the
			// message is pending at the end of the session, and runs now, as a stored one;
			// before, it sat in the store, in no queue, and a retry was refused as pending.
			switch stored, ferr := s.storedAt(it.src, it.messageID, it.sessionID, it.seq); {
			case ferr != nil:
				unsure = true
			case stored:
				s.logger().Warn("a requeue whose write was refused as unavailable is stored (the commit's answer was lost); the message runs",
					"message_id", m.MessageId, "seq", it.seq)
				err = nil
			}
		}
		if err != nil {
			s.queue = slices.DeleteFunc(s.queue, func(q *item) bool { return q == it })
			s.leaveTail(it)
			if errors.Is(err, persistence.ErrFenced) {
				s.handOver(c, m, requester) // the key's owner now requeues it
				return
			}
			s.logRefusedWrite("store requeue", err, "message_id", m.MessageId)
			r.ErrorCode, r.Error = "unavailable", "the requeue could not be stored; the message stays quarantined; retry later"
			if unsure {
				r.Error = "the store refused the requeue and cannot be read to tell whether it was stored; look at the message's status before you requeue it again"
				// If it applied, the message is pending at its new seq, in no queue: the key's
				// recovery finds it there and runs it (adoptUnsure), as a message's.
				s.rememberUnsure(it)
			}
			c.Send(requester, r)
			s.tryStart(c)
			return
		}
		it.durable = true
		// A session loaded since the quarantine has the message in its history, where it was
		// sent; it is the turn's own message now, at the end of the transcript, as a reload
		// would show it.
		s.history = slices.DeleteFunc(s.history, func(h histEntry) bool { return h.seq == row.Seq })
		if it.dropped {
			// A command ended the session's work while the write was in flight: the message
			// is set aside with the others it dropped.
			s.setAsideDropped(c, it)
			r.ErrorCode, r.Error = ErrCodeSessionEnded, "a command ended the session's work as the message was requeued; "+
				"it is set aside again (failed), and its sender told, once that command is stored (if it is not, the message runs)"
			c.Send(requester, r)
			s.tryStart(c)
			return
		}
		s.d.Metrics.MessagesRequeued.Inc()
		if it.inTail {
			s.settle() // it waits in the store now, behind the spilled messages
		}
		s.logger().Info("quarantined message requeued by an operator; it runs again", "message_id", m.MessageId, "seq", it.seq,
			"ahead", s.waiting()-1)
		// Start its turn (and say the session is busy) before the answer, as a message's.
		s.tryStart(c)
		r.Disposition = platforms.Queued
		if s.running != nil && slices.Contains(s.running.items, it) {
			r.Disposition = platforms.Started
		}
		r.QueueDepth = int32(s.waiting())
		c.Send(requester, r)
	})
}

// errEnded says a message belongs to an ended session of the key.
var errEnded = errors.New("the message's session has ended")

// otherSession is why a stored message of the chat that is not in the current incarnation is
// not requeued: errEnded when it is in an earlier session of this key, persistence.ErrNotFound
// when it is another key's (another user's session in a group).
func (s *Session) otherSession(row *persistence.Message) error {
	ctx, cancel := context.WithTimeout(s.d.Ctx, duplicateCheckTimeout)
	defer cancel()
	other, err := s.d.Store.Session(ctx, row.SessionID)
	switch {
	case errors.Is(err, persistence.ErrNotFound):
		return err
	case err != nil:
		return fmt.Errorf("read session %s: %w", row.SessionID, err)
	case other.Key != s.key:
		return fmt.Errorf("message of another key: %w", persistence.ErrNotFound)
	}
	return errEnded
}
