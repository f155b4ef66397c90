package actors

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"slices"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// onDeliver accepts one inbound message: a duplicate or a command is answered at once;
// anything else is written durably and then acknowledged and queued.
func (s *Session) onDeliver(c actor.Context, m *Deliver) {
	src := sourceFromProto(m.Source)
	now := s.d.now()
	if m.MessageId != "" && s.seen.has(m.MessageId) {
		if r := s.seenRepeat(m, src); r != nil {
			c.Respond(r)
			return
		}
		if it := s.inFlight(m.MessageId); it != nil && c.Sender() != nil {
			// The first's write is not answered yet: it may still fail, and "duplicate" would
			// then acknowledge a message nobody stored. This one gets the first's outcome.
			it.repeats = append(it.repeats, c.Sender())
			return
		}
		if s.repeatCommand(m.MessageId, c.Sender()) {
			return // so does a command's
		}
		c.Respond(s.result(m, platforms.Duplicate, ""))
		return
	}
	if cmd, ok := parseCommand(m.Text); ok {
		if row := s.storedBefore(m, src); row != nil {
			c.Respond(s.storedRepeat(m, row))
			return
		}
		if s.held() != nil {
			s.refuseWhileHeld(c)
			r := s.result(m, "", s.curID())
			r.ErrorCode, r.Error = ErrCodeUnavailable, heldRefusal
			c.Respond(r)
			return
		}
		s.onCommand(c, m, src, cmd, now)
		return
	}
	if s.heldEnd() {
		s.refuseWhileHeld(c)
		r := s.result(m, "", "")
		r.ErrorCode, r.Error = ErrCodeUnavailable, heldRefusal
		c.Respond(r)
		return
	}
	waiting := s.waiting()
	// The cap counts the messages behind the next turn: behind the running one, or behind the
	// head of the queue when a debounce window or a cancelled call still ending holds it (it
	// runs next). Before, only a running turn counted, and a held head let the queue grow
	// past the cap.
	behind := waiting
	if s.running == nil && waiting > 0 {
		behind--
	}
	over := behind >= s.d.Config.QueueCap
	if over {
		s.d.Metrics.QueueOverflow.WithLabelValues(s.d.Config.Overflow).Inc()
		if s.d.Config.Overflow == OverflowReject {
			if m.MessageId != "" {
				// A re-delivery of a message this activation does not remember (one taken
				// before a restart or passivation) is a duplicate, not refused: the store's
				// dedupe decides after the cap for every other message, but a rejection
				// would tell its sender that a message taken (and answered) was not.
				if row, err := s.findStored(src, m.MessageId); err == nil {
					c.Respond(s.storedRepeat(m, row))
					return
				}
			}
			r := s.result(m, platforms.Rejected, "")
			r.ErrorCode, r.Error = "rejected", fmt.Sprintf("session queue is full (%d waiting)", waiting)
			// Else only the overflow counter said so: nothing in the log tied a sender's
			// refused message to its session (found by an audit).
			s.d.queueFull.LogQuiet(s.logger(), slog.LevelWarn, "session queue full; message refused, its sender told to send it later", "message_id", m.MessageId, "waiting", waiting, "cap", s.d.Config.QueueCap)
			c.Respond(r)
			return
		}
	}
	// The depth this message waits at: a refused one waits at none (it was observed before
	// the cap, as a depth past it that never was).
	if s.running != nil {
		s.d.Metrics.QueueDepth.Observe(float64(waiting + 1)) // this one waits too
	} else {
		s.d.Metrics.QueueDepth.Observe(float64(waiting))
	}
	outAfter := s.lastOut // every answer to the message (an automatic reset's notice first) comes after
	ops := s.expireIfIdle(now)
	expired := len(ops) > 0
	inc, created, auto := s.ensureIncarnation(src, now)
	ops = append(ops, inc...)
	var notice *platforms.Outbound
	if created && auto != nil {
		var noticeOps []persistence.Op
		notice, noticeOps = s.afterAutoReset(auto, src, m.MessageId, now)
		ops = append(ops, noticeOps...)
	}
	s.lastSeq++
	it := &item{seq: s.lastSeq, sessionID: s.cur.ID, src: src, messageID: m.MessageId, text: m.Text,
		at: now, arrived: time.Now(), requester: c.Sender(), outAfter: outAfter}
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
	s.enqueue(it, over)
	if m.MessageId != "" {
		s.seen.addSum(m.MessageId, contentSum(m))
	}
	s.lastActivity = now
	// (A message that begins or ends a session is not refused with a held turn result: its
	// refusal starts the session again from the store, which would drop that result.)
	s.submit(c, &pendingWrite{ops: ops, message: !created && !expired, done: func(c actor.Context, err error) {
		if errors.Is(err, persistence.ErrDuplicate) && !created && !expired && s.adoptStored(it) {
			err = nil // an earlier write of it applied; only its answer was lost
		}
		err = s.outageOutcome(it, err, !created && !expired)
		if err == nil && notice != nil {
			s.sendOutbound(c, notice)
		}
		s.accepted(c, it, m, created, err)
		if err != nil && (created || expired) && !s.fencedOut {
			// The write that was refused also ended the session or started its successor:
			// memory (the reset's link, its notice, its continuity note) is ahead of the store.
			why := "the write of the message that began the session was refused"
			if expired {
				why = "the write of a message that reset the session was refused"
			}
			s.restartFromStore(c, why, err)
		}
	}})
}

// rememberUnsure notes that the write of it failed in a way that does not tell whether it
// committed: a connection lost after COMMIT fails a write that applied. Its sender is told it
// was not stored and may send it again; if the store then refuses that as a duplicate of this
// very write, the message is stored and adoptStored queues it. If no retry comes, the key's
// recovery (Recover: the store lists the message as pending) finds it (adoptUnsure). At most
// idSetMax are kept; forgetting one leaves its message to the key's next activation.
func (s *Session) rememberUnsure(it *item) {
	if it.messageID == "" {
		return
	}
	r := s.rare()
	if r.unsure == nil {
		r.unsure = map[string]*item{}
	}
	for k := range r.unsure {
		if len(r.unsure) < idSetMax {
			break
		}
		delete(r.unsure, k)
	}
	u := *it
	u.requester, u.repeats = nil, nil // answered already
	r.unsure[it.messageID] = &u
}

// storedAsWritten returns the stored message u's write put in the store, if it is there as
// that write left it: in the current incarnation, at its seq, from its sender, with its text,
// and still pending, not archived (a withdrawal archives a message that waits: it is no work
// to adopt). ErrNotFound means the write did not apply.
func (s *Session) storedAsWritten(u *item) (*persistence.Message, error) {
	orig, err := s.findStored(u.src, u.messageID)
	if err != nil {
		return nil, err
	}
	if s.cur == nil || orig.SessionID != s.cur.ID || orig.SessionID != u.sessionID || orig.Seq != u.seq ||
		orig.Status != persistence.StatusPending || !orig.Active || orig.Archived ||
		orig.Content != u.text || orig.UserID != u.src.UserID {
		return nil, fmt.Errorf("message %s: stored as %s/%d (%s), not as written: %w", u.messageID, orig.SessionID, orig.Seq, orig.Status, persistence.ErrDuplicate)
	}
	return orig, nil
}

// adoptStored reports whether the write of it, refused as a duplicate, repeats an earlier
// write of this activation whose answer was lost (rememberUnsure) and that applied
// (storedAsWritten). Then it becomes that stored message (its seq), to be acknowledged and
// run like any accepted one; the refused write took nothing, so its seq is free again if no
// later one was given out. Any other duplicate (a platform's re-delivery of a message this
// activation holds, or ran, or one stored in another incarnation) stays a duplicate: a
// message runs at most once.
func (s *Session) adoptStored(it *item) bool {
	if s.unusual == nil {
		return false
	}
	u, ok := s.unusual.unsure[it.messageID]
	if !ok || u.text != it.text || u.src.UserID != it.src.UserID {
		return false
	}
	orig, err := s.storedAsWritten(u)
	if err != nil {
		return false
	}
	s.forgetUnsure(it.messageID)
	if s.lastSeq == it.seq {
		s.lastSeq--
	}
	it.seq, it.sessionID, it.at, it.outAfter = orig.Seq, orig.SessionID, orig.CreatedAt, u.outAfter
	if i := slices.Index(s.queue, it); i >= 0 {
		// It was queued behind every message as it arrived again: it runs where it is stored.
		s.queue = slices.Delete(s.queue, i, i+1)
		s.queueInPlace(it)
	}
	s.logAdopted(it)
	return true
}

// queueInPlace queues it, a message whose seq may be earlier than those of messages queued in
// memory behind it (an adopted one: its first write applied, only its answer was lost), before
// the first of its session's queued messages with a later seq: in the store's order, which is
// the order its sender sent them in, and the one a restart would run them in
// (TestAdoptedMessageRunsInItsPlace). Before, it was queued behind them all.
func (s *Session) queueInPlace(it *item) {
	at := slices.IndexFunc(s.queue, func(q *item) bool { return q.sessionID == it.sessionID && q.seq > it.seq })
	if at < 0 {
		s.queue = append(s.queue, it)
		return
	}
	s.queue = slices.Insert(s.queue, at, it)
}

// logAdopted says that it, whose write was reported failed, is stored and runs now.
func (s *Session) logAdopted(it *item) {
	s.logger().Warn("a message whose write was reported failed is stored (the commit's answer was lost); it runs now",
		"message_id", it.messageID, "seq", it.seq)
}

// seqOf names a message row by its session and seq.
type seqOf struct {
	sessionID string
	seq       int64
}

// noteCopy remembers, for a withdrawal, the seq of an earlier write of it whose answer was lost
// (rememberUnsure), when it was taken under another seq of the same session: that write may be
// stored too. So it is when it went to the spool though the spool reported it failed (a batch
// it could not take back), or when it committed and its answer was lost while the database
// could not be read: its sender sends the message again, the write again goes to the spool
// while the database fails (no dedupe there), and at the replay the earlier copy is stored and
// the later one refused as its duplicate. A withdrawal that archived the later seq only
// archived nothing, said the message was withdrawn, and the earlier copy ran
// (TestWithdrawnMessageSpooledTwiceDoesNotRun). The seq is this activation's and the
// message's alone: no other write of the session is given it, nor is it by a /resume back
// to the session (refusedSeq). At most idSetMax are kept.
func (s *Session) noteCopy(it *item) {
	u := s.unusual
	if u == nil {
		return
	}
	e, ok := u.unsure[it.messageID]
	if !ok || e.sessionID != it.sessionID || e.seq == it.seq {
		return
	}
	if u.copies == nil {
		u.copies = map[string]seqOf{}
	}
	for k := range u.copies {
		if len(u.copies) < idSetMax {
			break
		}
		delete(u.copies, k)
	}
	u.copies[it.messageID] = seqOf{e.sessionID, e.seq}
}

// copyOf returns the seq of an earlier copy of it's write that may be stored too (noteCopy), 0
// when there is none.
func (s *Session) copyOf(it *item) int64 {
	if u := s.unusual; u != nil && len(u.copies) > 0 {
		if e, ok := u.copies[it.messageID]; ok && e.sessionID == it.sessionID && e.seq != it.seq {
			return e.seq
		}
	}
	return 0
}

// seqsOf returns the seqs of it's rows: its own, and an earlier copy's that may be stored too
// (noteCopy).
func (s *Session) seqsOf(it *item) []int64 {
	if e := s.copyOf(it); e != 0 {
		return []int64{it.seq, e}
	}
	return []int64{it.seq}
}

// itemSeqs returns the seqs of items' rows, those of earlier copies of their writes that may be
// stored too (noteCopy) after their own. A write that gives them a final status (a turn's
// result, an interrupt's or /stop's mark, a set-aside) covers both: the spool's replay may have
// stored the earlier copy and refused the later one as its duplicate, and a mark of the later
// seq alone marked nothing, left the earlier copy pending, and the session's next load ran it
// and answered it a second time (TestMessageSpooledTwiceIsAnsweredOnce). Only a session that
// remembers a copy does more than one allocation.
func (s *Session) itemSeqs(items []*item) []int64 {
	seqs := make([]int64, len(items))
	for i, it := range items {
		seqs[i] = it.seq
	}
	if u := s.unusual; u != nil && len(u.copies) > 0 {
		for _, it := range items {
			if e := s.copyOf(it); e != 0 {
				seqs = append(seqs, e)
			}
		}
	}
	return seqs
}

// forgetCopy forgets the earlier copy of messageID's write, if any (noteCopy): its rows are
// archived.
func (s *Session) forgetCopy(messageID string) {
	if s.unusual != nil {
		delete(s.unusual.copies, messageID)
	}
}

// forgetCopies forgets the earlier copies of items' writes (noteCopy) once a write that gave
// their rows, and so the copies' (itemSeqs, seqsOf), a final status has landed.
func (s *Session) forgetCopies(items []*item) {
	if u := s.unusual; u != nil && len(u.copies) > 0 {
		for _, it := range items {
			delete(u.copies, it.messageID)
		}
	}
}

// forgetUnsure forgets the unsure write of messageID, if any (rememberUnsure).
func (s *Session) forgetUnsure(messageID string) {
	if s.unusual != nil {
		delete(s.unusual.unsure, messageID)
	}
}

// adoptUnsure queues the messages whose writes failed unsure (rememberUnsure) and are stored
// as written, and forgets those the store does not hold; it reports whether it queued any.
// Recover runs it: the store lists the key's pending work, and a message whose sender did not
// send it again is pending there but known to no queue.
func (s *Session) adoptUnsure(c actor.Context) bool {
	if s.unusual == nil || len(s.unusual.unsure) == 0 {
		return false
	}
	adopted := false
	for id, u := range s.unusual.unsure {
		_, err := s.storedAsWritten(u)
		switch {
		case err == nil:
			u.durable = true
			s.queueAdopted(u)
			s.seen.add(id)
			adopted = true
			s.logAdopted(u)
		case !errors.Is(err, persistence.ErrNotFound) && !errors.Is(err, persistence.ErrDuplicate):
			continue // the store cannot tell now; the next recovery asks again
		}
		delete(s.unusual.unsure, id)
	}
	if adopted {
		s.tryStart(c)
	}
	return adopted
}

// queueAdopted queues u, an adopted message stored at its seq (adoptUnsure), in its place by
// seq: among the messages queued in memory (queueInPlace); when a spill waits in the store,
// among the spilled ones, without reading them: before the stored range it joins the queue in
// memory, within it the range's read back takes it, and past it it joins the spill's tail.
func (s *Session) queueAdopted(u *item) {
	sp := s.spilling()
	switch {
	case sp == nil || u.seq <= sp.after:
		s.queueInPlace(u)
	case u.seq <= sp.through:
		sp.stored++ // counted now: its refused write was not (leaveTail)
	default:
		u.inTail = true
		at, _ := slices.BinarySearchFunc(sp.tail, u.seq, func(q *item, seq int64) int { return cmp.Compare(q.seq, seq) })
		sp.tail = slices.Insert(sp.tail, at, u)
		s.settle()
	}
}

// setAsideDropped takes out of the queue a message a command dropped while its write was in
// flight (stopWork), now that it is stored, and sets it aside with a notice of its own once the
// command's write is answered: that write was sent after the message's, and is in flight still.
// If the store refuses it, the command did not happen, and the session starts again from the
// store, where the message is pending and runs. Before, the message was set aside at once: a
// /stop, /new or reset whose write was refused (a database failing, then back) left it failed
// and never run, with a notice that a command had ended the work.
func (s *Session) setAsideDropped(c actor.Context, it *item) {
	s.queue = slices.DeleteFunc(s.queue, func(q *item) bool { return q == it })
	if len(s.inflight) == 0 {
		s.setAside(c, it, persistence.StatusFailed, leftBehindNotice)
		return
	}
	r := s.rare()
	r.dropped = append(r.dropped, droppedItem{it: it, until: s.inflight[len(s.inflight)-1].id})
}

// droppedItem is a message a command dropped while its write was in flight, stored since, that
// is set aside once the session's write until (the command's, or one sent after it) is answered.
type droppedItem struct {
	it    *item
	until uint64
}

// setAsideDroppedUntil sets aside the dropped messages that waited for the session's writes up
// to answered, which is answered now (writes are answered in the order they were sent). A
// session that starts again from the store (a refused write) or is fenced sets none aside: they
// are pending in the store, and the key's next activation runs them, or, if the command was
// stored, finds them left in the session it ended and sets them aside (setAsideLeftBehind).
func (s *Session) setAsideDroppedUntil(c actor.Context, answered uint64) {
	r := s.unusual
	if r == nil || len(r.dropped) == 0 {
		return
	}
	if s.stale || s.fencedOut {
		r.dropped = nil
		return
	}
	var later []droppedItem
	for _, d := range r.dropped {
		if d.until > answered {
			later = append(later, d)
			continue
		}
		s.setAside(c, d.it, persistence.StatusFailed, leftBehindNotice)
	}
	r.dropped = later
}

// inFlight returns the queued message with id whose write is not answered yet, or nil.
func (s *Session) inFlight(id string) *item {
	for _, it := range s.queue {
		if !it.durable && it.messageID == id {
			return it
		}
	}
	if sp := s.spilling(); sp != nil {
		for _, it := range sp.tail {
			if !it.durable && it.messageID == id {
				return it
			}
		}
	}
	return nil
}

// answerRepeats answers the repeats of a message that arrived while its write was in flight
// (a client's or the cluster router's retry), with that write's outcome: "duplicate" once it is
// stored, the same refusal if it was not.
func (s *Session) answerRepeats(c actor.Context, it *item, m *Deliver, err error, conflict bool) {
	for _, p := range it.repeats {
		r := s.result(m, platforms.Duplicate, it.sessionID)
		switch {
		case conflict:
			r = s.conflictResult(m)
		case errors.Is(err, errReused):
			r = s.reusedResult(m)
		case err == nil, errors.Is(err, persistence.ErrDuplicate):
		case errors.Is(err, persistence.ErrFenced):
			r.Disposition, r.ErrorCode, r.Error = "", ErrCodeStopped, "the session handed the message to its next activation; send it again with the same message_id"
		default:
			r.Disposition, r.ErrorCode, r.Error = "", "unavailable", err.Error() // as accepted gives it
			r.SessionId = sessionOf(it.sessionID, err)
		}
		c.Send(p, r)
	}
	it.repeats = nil
}

// storedBefore returns the stored inbound message with m's id, which this activation has not
// seen, or nil: a command re-delivered after a restart (a client's retry, a platform replaying
// its events). A command acts before its write, which is what refuses a duplicate, and its
// action cannot be taken back (a cancelled turn, a session ended), so a command is checked
// first. Commands are rare; a read each costs little. If the store cannot answer, the command
// runs, and its write decides (onCommand restarts the session if it is refused).
func (s *Session) storedBefore(m *Deliver, src identity.Source) *persistence.Message {
	if m.MessageId == "" {
		return nil
	}
	row, err := s.findStored(src, m.MessageId)
	switch {
	case err == nil:
		s.seen.add(m.MessageId)
		return row
	case !errors.Is(err, persistence.ErrNotFound):
		// At once, then once a LimitEvery for all sessions (at Debug between): in an outage the
		// client resends the command, its write refused too, and each resend's check fails.
		s.d.duplicateChecks.Log(s.logger(), slog.LevelWarn, "check a command for a duplicate", "message_id", m.MessageId, logging.Err(err))
	}
	return nil
}

// storedRepeat answers m, whose id the store holds for row: a duplicate, or, where m's platform
// asks (strict_id) and row is another message, the reuse of its id.
func (s *Session) storedRepeat(m *Deliver, row *persistence.Message) *DeliverResult {
	if m.StrictId && !sameMessage(m, row.UserID, row.Content) {
		return s.reusedResult(m)
	}
	return s.result(m, platforms.Duplicate, "")
}

// duplicateOf tells what the stored message that the write of it repeated (ErrDuplicate) is
// to m, the message it holds. conflict: another session key's (in a chat whose sessions are
// per user, a group, two users' messages sharing an id are no re-delivery of each other).
// reused: this key's, but another message than m, where m's platform asks (strict_id). If the
// store cannot answer, it is neither: a duplicate, as before the read.
func (s *Session) duplicateOf(it *item, m *Deliver) (conflict, reused bool) {
	orig, err := s.findStored(it.src, it.messageID)
	if err != nil {
		return false, false
	}
	if s.cur == nil || orig.SessionID != s.cur.ID {
		ctx, cancel := context.WithTimeout(s.d.Ctx, duplicateCheckTimeout)
		defer cancel()
		if other, err := s.d.Store.Session(ctx, orig.SessionID); err == nil && other.Key != s.key {
			return true, false
		}
	}
	return false, m.StrictId && !sameMessage(m, orig.UserID, orig.Content)
}

// seenRepeat answers m, whose id this activation has seen, where m's platform asks for the
// check of a reused id (strict_id): the reuse's refusal when m is another message than the one
// that came with the id, nil when it is that message again (a duplicate, answered as ever).
// The id's content sum, noted as the first arrived, answers at once (a client's retry costs no
// read); an id noted without one (a message recovered from the store or requeued, a /retry)
// is compared with its queued message, or else read from the store, as the duplicate checks
// read it. If the store cannot answer, m is a duplicate, as before the check.
func (s *Session) seenRepeat(m *Deliver, src identity.Source) *DeliverResult {
	if !m.StrictId {
		return nil
	}
	if sum := s.seen.sum(m.MessageId); sum != 0 {
		switch {
		case sum == contentSum(m):
			return nil
		case s.inFlight(m.MessageId) == nil:
			return s.reusedResult(m)
		}
		// The message noted with the id has its write in flight, and that write may itself be
		// refused for reusing an id the store holds from before this activation: m may then be
		// a retry of the stored message, a duplicate answered now (among the in-flight one's
		// repeats it would be refused with it). The store tells; if it holds nothing, the id
		// is the in-flight one's.
		if row, err := s.findStored(src, m.MessageId); err == nil {
			return s.storedRepeat(m, row)
		}
		return s.reusedResult(m)
	}
	if it := s.queued(m.MessageId); it != nil {
		if sameMessage(m, it.src.UserID, it.text) {
			return nil
		}
		return s.reusedResult(m)
	}
	if row, err := s.findStored(src, m.MessageId); err == nil && !sameMessage(m, row.UserID, row.Content) {
		return s.reusedResult(m)
	}
	return nil
}

// queued returns the message with id queued in memory (in the queue or the spill's tail), or nil.
func (s *Session) queued(id string) *item {
	if i := slices.IndexFunc(s.queue, func(q *item) bool { return q.messageID == id }); i >= 0 {
		return s.queue[i]
	}
	if sp := s.spilling(); sp != nil {
		if i := slices.IndexFunc(sp.tail, func(q *item) bool { return q.messageID == id }); i >= 0 {
			return sp.tail[i]
		}
	}
	return nil
}

// sameMessage reports whether m is the message stored from user with text: a re-delivery of it.
// Both are compared as stored (the intake replaced a NUL by U+FFFD before m got here). A /retry's
// row holds the text it runs again, not "/retry": a /retry is its sender's repeat of any of
// their messages.
func sameMessage(m *Deliver, user, text string) bool {
	if m.GetSource().GetUserId() != user {
		return false
	}
	if m.Text == text {
		return true
	}
	cmd, ok := parseCommand(m.Text)
	return ok && cmd.name == "retry"
}

// contentSum is the sum of m's sender and text that its id is noted with (idSet), or 0 when m's
// platform asks for no check of a reused id (strict_id). The sums stay in memory, so a seed of
// this process's own will do; two messages that differ share one with a chance of 2⁻⁶³, and
// then the second is answered as a duplicate, as it was before the check.
func contentSum(m *Deliver) uint64 {
	if !m.StrictId {
		return 0
	}
	return maphash.Comparable(contentSeed, [2]string{m.GetSource().GetUserId(), m.Text}) | 1 // never 0
}

var contentSeed = maphash.MakeSeed()

// reusedResult refuses m, whose id is already another message's in this session's chat.
func (s *Session) reusedResult(m *Deliver) *DeliverResult {
	r := s.result(m, "", "")
	r.ErrorCode, r.Error = ErrCodeMessageIDReused, "message id "+m.MessageId+
		" is already used in this chat for another message (by another user, or with another text); send this one with a new id"
	return r
}

// conflictResult refuses m, whose id is already another conversation's in this chat.
func (s *Session) conflictResult(m *Deliver) *DeliverResult {
	r := s.result(m, "", "")
	r.ErrorCode, r.Error = ErrCodeConflict, "message id "+m.MessageId+" is already another conversation's in this chat"
	return r
}

// ErrCodeMessageIDReused answers a message whose id its chat already holds for another message
// (another sender's, or the same sender's with another text), where its platform asks for the
// check (Deliver.strict_id: HTTP, whose clients choose their ids). Like a key of Stripe's
// idempotent requests reused with other parameters, it is an error, not a replay: answered
// "duplicate", the message would be acknowledged though nobody stored it. Nothing is stored or
// run for it; sent with a new id, it is taken.
const ErrCodeMessageIDReused = "message_id_reused"

// errReused marks the write of a message refused as a duplicate of another message
// (ErrCodeMessageIDReused), for the repeats that waited for it (answerRepeats).
var errReused = errors.New("message id already used for another message")

// outageOutcome is the outcome of the write of it when that write did not meet the store's
// dedupe: it went to the spool (err nil while the spool holds writes) or was refused as
// unavailable. The session then reads whether the store holds the message:
//   - as this very write put it (its session, its seq): the write applied, whether it was
//     spooled after a commit whose answer was lost or refused as unavailable for the same
//     reason (a connection lost after COMMIT, the spool failing too). The message is stored,
//     so it is taken: nil. Before, its sender was told it was not stored, and the stored
//     message ran only if it was sent again while its session lasted (or at the key's next
//     recovery): a boundary or a /resume in between left it pending, never answered.
//   - from before (a message taken in an earlier activation, which this one has not seen,
//     delivered again): ErrDuplicate. Taken, it would run and be answered a second time, and
//     its row be refused at the replay; refused, its sender would be told it is not stored,
//     which it is. This holds also when the write started or ended the session (created,
//     expired: the caller starts again from the store).
//   - as an unsure earlier write of this activation put it (rememberUnsure): adopted when
//     adopt allows it (adoptStored), else as err says.
//
// Such writes are rare (an outage), and so are these reads. A store that cannot answer leaves
// err as it is.
func (s *Session) outageOutcome(it *item, err error, adopt bool) error {
	spooled := err == nil && s.d.Spooling.Load()
	if it.messageID == "" || !spooled && !errors.Is(err, persistence.ErrUnavailable) {
		return err
	}
	row, ferr := s.findStored(it.src, it.messageID)
	switch {
	case ferr != nil:
		return err
	case row.SessionID == it.sessionID && row.Seq == it.seq:
		if err != nil {
			s.logger().Warn("a message whose write was refused as unavailable is stored (the commit's answer was lost); it is taken",
				"message_id", it.messageID, "seq", it.seq)
		}
		return nil
	}
	if u := s.unusual; u != nil {
		if _, ok := u.unsure[it.messageID]; ok {
			if adopt && s.adoptStored(it) {
				return nil
			}
			return err
		}
	}
	return fmt.Errorf("%w: message %s was stored before this activation", persistence.ErrDuplicate, it.messageID)
}

// storedAt reports whether the store holds the inbound message id of src's chat in session sid
// at seq: as the write that gave it that seq put it. err is the read's when it failed (then
// the answer is unknown).
func (s *Session) storedAt(src identity.Source, id, sid string, seq int64) (bool, error) {
	if id == "" {
		return false, nil
	}
	row, err := s.findStored(src, id)
	if err != nil {
		return false, err
	}
	return row.SessionID == sid && row.Seq == seq, nil
}

// findStored reads the stored inbound message of src's chat with id, within
// duplicateCheckTimeout.
func (s *Session) findStored(src identity.Source, id string) (*persistence.Message, error) {
	ctx, cancel := context.WithTimeout(s.d.Ctx, duplicateCheckTimeout)
	defer cancel()
	return s.d.Store.FindInbound(ctx, src.Platform, src.ChatID, id)
}

// duplicateCheckTimeout bounds each read of the duplicate checks.
const duplicateCheckTimeout = 5 * time.Second

// accepted runs when the write of an inbound message is acknowledged.
func (s *Session) accepted(c actor.Context, it *item, m *Deliver, created bool, err error) {
	// A message id another conversation of the chat holds is no re-delivery: neither the
	// message nor its repeats are duplicates (before, a repeat that arrived while the write was
	// in flight was told "duplicate", a 202 for a message nobody stored). Nor, where its
	// platform asks, is one that another message of this conversation holds.
	var conflict, reused bool
	if errors.Is(err, persistence.ErrDuplicate) {
		conflict, reused = s.duplicateOf(it, m)
	}
	if reused {
		err = fmt.Errorf("%w: %w", errReused, err)
	}
	if err != nil {
		s.answerRepeats(c, it, m, err, conflict)
		s.queue = slices.DeleteFunc(s.queue, func(q *item) bool { return q == it })
		s.leaveTail(it)
		if created && s.cur != nil && s.cur.ID == it.sessionID {
			s.cur = nil // the incarnation was never written; the next message creates it again
		}
		if errors.Is(err, persistence.ErrDuplicate) {
			s.forgetUnsure(m.MessageId)
			switch {
			case conflict:
				s.seen.remove(m.MessageId)
				c.Send(it.requester, s.conflictResult(m))
				return
			case reused:
				// The id was noted with this message's sum: kept, this message's retry would be
				// answered as a duplicate of the stored one. Forgotten, the store refuses it again.
				s.seen.remove(m.MessageId)
				c.Send(it.requester, s.reusedResult(m))
				return
			}
			c.Send(it.requester, s.result(m, platforms.Duplicate, ""))
			return
		}
		if errors.Is(err, persistence.ErrFenced) {
			s.handOver(c, m, it.requester) // the key's next activation stores it
			return
		}
		s.seen.remove(m.MessageId)
		s.rememberUnsure(it)
		s.logRefusedInbound(err, m.MessageId, it.seq)
		r := s.result(m, "", "")
		r.SessionId = sessionOf(r.SessionId, err)
		// The cause, for the platform's line (platforms.ErrUnavailable says the rest). Before,
		// "message could not be stored" here made it say so twice, and nothing of why.
		r.ErrorCode, r.Error = "unavailable", err.Error()
		c.Send(it.requester, r)
		return
	}
	it.durable = true
	s.noteCopy(it)
	s.forgetUnsure(it.messageID) // stored now, whether or not the earlier write was
	if it.dropped {
		// A command dropped the session's work while this write was in flight: the message is
		// stored, so it is set aside like the others, with its own notice.
		r := s.result(m, platforms.Queued, it.sessionID)
		r.OutboxAfter = it.outAfter
		c.Send(it.requester, r)
		it.requester = nil
		s.setAsideDropped(c, it)
		s.tryStart(c)
		s.answerRepeats(c, it, m, nil, false)
		return
	}
	if it.inTail {
		// It waits in the store, behind the queue's cap (spill.go).
		r := s.result(m, platforms.Queued, it.sessionID)
		r.OutboxAfter, r.QueueDepth = it.outAfter, int32(s.waiting())
		s.settle()
		s.tryStart(c)
		s.answerRepeats(c, it, m, nil, false)
		if it.requester != nil {
			c.Send(it.requester, r)
			it.requester = nil
		}
		return
	}
	disp := platforms.Queued
	switch {
	case s.running == nil && !s.ending() && len(s.queue) > 0 && s.queue[0] == it && !s.leaving && !s.fencedOut:
		// (A leaving or fenced session starts no turn: it hands the key on. A cancelled turn
		// still ending holds the next: the message is queued behind it.)
		disp = platforms.Started
	case s.running != nil && s.mode == ModeInterrupt && len(s.queue) > 0 && s.queue[0] == it && s.running.before(it):
		s.interrupt(c) // the new message runs next
		disp = platforms.Interrupted
	case s.running == nil && s.mode == ModeInterrupt && s.ending() && s.supersede(c, it):
		disp = platforms.Interrupted // the messages queued behind the cancelled call are cut short
	case s.running != nil && s.mode == ModeSteer && s.running.before(it) && s.steer(c, it):
		disp = platforms.Steered
	case s.mode == ModeCollect || s.debounced(it):
		if i := slices.Index(s.queue, it); i > 0 && s.joins(s.queue[i-1], it) {
			// It joins the messages waiting for the next turn. (Before, a message from the
			// same sender past the debounce window was told so too, and ran in a turn of its
			// own: TestCollectedIsToldOnlyOfAMessageThatJoins.)
			disp = platforms.Collected
		}
	}
	r := s.result(m, disp, it.sessionID)
	r.OutboxAfter = it.outAfter
	r.QueueDepth = int32(s.waiting())
	if disp == platforms.Started {
		r.QueueDepth--
	}
	// Start the turn (and tell the manager the session is busy) before acknowledging: a drain
	// that follows the acknowledgment must wait for this turn.
	s.tryStart(c)
	s.answerRepeats(c, it, m, nil, false) // after the start: the queue no longer holds the one that started
	if it.requester != nil {
		c.Send(it.requester, r)
		it.requester = nil
	}
}

// ensureIncarnation returns the ops that create a session incarnation when there is none, and
// the session an automatic reset ended that the new one succeeds, if any (autoReset): the
// caller tells its user and gives its first turn the note (afterAutoReset).
func (s *Session) ensureIncarnation(src identity.Source, now time.Time) (ops []persistence.Op, created bool, auto *persistence.Session) {
	if s.cur != nil {
		return nil, false, nil
	}
	s.passOverSilent()
	s.forgetPruned(now)
	auto = s.autoReset()
	prev := ""
	if s.prev != nil {
		prev = s.prev.ID
	}
	return s.newIncarnation(src, now, prev), true, auto
}

// forgetPruned forgets the ended session the key routes to once pruning may have deleted it
// (it ended longer ago than the retention), so that its successor names it nowhere
// (prev_session_id, the reset notice's /resume), as when the key loads after the session was
// pruned. A session stays in memory that long only when passivation is off or slower.
func (s *Session) forgetPruned(now time.Time) {
	if p := s.d.Config.Prune; s.prev != nil && p.Enabled && s.prev.EndedAt.Before(now.Add(-p.After)) {
		s.prev = nil
	}
}

// newIncarnation makes a new current session and returns the ops that record it.
func (s *Session) newIncarnation(src identity.Source, now time.Time, prev string) []persistence.Op {
	s.cur = &persistence.Session{
		ID: newSessionID(now), Key: s.key,
		Platform: src.Platform, ChatType: src.ChatType, ChatID: src.ChatID, ThreadID: src.ThreadID,
		UserID: src.UserID, UserName: src.UserName, ScopeID: src.ScopeID, Profile: src.Profile,
		StartedAt: now, LastActivityAt: now, PrevSessionID: prev,
		Epoch: s.epoch, // the claim this activation holds (0 in a single daemon)
	}
	if identity.IsShared(src, s.d.Config.Keys) {
		s.cur.UserID, s.cur.UserName = "", "" // a shared session belongs to no single user
	}
	s.lastSeq = 0
	s.history = nil
	s.prev = nil
	if u := s.unusual; u != nil {
		// A note not yet given names the ended session's predecessor, not this one's: an
		// automatic reset sets this session's own after this (afterAutoReset).
		u.continuity = ""
	}
	s.routeGen++
	return []persistence.Op{
		&persistence.CreateSession{Session: *s.cur},
		&persistence.PutRoute{Route: persistence.Route{Key: s.key, SessionID: s.cur.ID, Generation: s.routeGen, UpdatedAt: now}},
	}
}

func (s *Session) result(m *Deliver, disp, sid string) *DeliverResult {
	if sid == "" && s.cur != nil {
		sid = s.cur.ID
	}
	return &DeliverResult{SessionKey: s.key, SessionId: sid, MessageId: m.MessageId, Disposition: disp, QueueDepth: int32(s.waiting())}
}

func errorsIsDuplicate(err error) bool { return errors.Is(err, persistence.ErrDuplicate) }

// idSet is the set of the most recent inbound message ids of an activation: the fast path that
// answers a re-delivered message (a platform retry, Discord replaying events after a RESUME) as a
// duplicate without a write. It holds at most idSetMax ids and forgets the oldest beyond that,
// so a session that stays active for weeks does not keep every id it ever saw; an older
// duplicate is still refused, by the store's unique index of inbound ids (ErrDuplicate). Most
// sessions see a few ids per activation, so it is a slice until it holds idSetSmall ids, and a
// map with an insertion-order ring beyond. Each id is noted with the content sum of its message
// (contentSum; 0 when not known), which tells a client's retry from the reuse of its id for
// another message without a read.
type idSet struct {
	small []seenID
	big   *bigIDSet // nil while the set is small
}

// seenID is an id of an idSet with its message's content sum.
type seenID struct {
	id  string
	sum uint64
}

// bigIDSet is an idSet past idSetSmall ids. It lives behind a pointer so that the small set of
// most sessions takes 32 B of their Session, not 64 (perf-anchors §8 G7; TestSessionSize).
type bigIDSet struct {
	ids   map[string]uint64 // the content sums by id
	order []string          // the ids added to ids, oldest first from next, once it is full
	next  int
}

func (m *idSet) has(id string) bool {
	if m.big != nil {
		_, ok := m.big.ids[id]
		return ok
	}
	return slices.ContainsFunc(m.small, func(x seenID) bool { return x.id == id })
}

// sum returns the content sum id was noted with; 0 when it was noted without one, or is not held.
func (m *idSet) sum(id string) uint64 {
	if m.big != nil {
		return m.big.ids[id]
	}
	if i := slices.IndexFunc(m.small, func(x seenID) bool { return x.id == id }); i >= 0 {
		return m.small[i].sum
	}
	return 0
}

// add notes id without a content sum.
func (m *idSet) add(id string) { m.addSum(id, 0) }

// addSum notes id with the content sum of its message (0: not known). An id held already keeps
// the sum it has.
func (m *idSet) addSum(id string, sum uint64) {
	switch {
	case m.has(id):
	case m.big != nil:
		m.big.add(id, sum)
	case len(m.small) < idSetSmall:
		m.small = append(m.small, seenID{id, sum})
	default:
		m.big = &bigIDSet{ids: make(map[string]uint64, 2*idSetSmall)}
		for _, x := range m.small {
			m.big.add(x.id, x.sum)
		}
		m.big.add(id, sum)
		m.small = nil
	}
}

// add adds id, which the set does not hold, and appends it to the ring, forgetting the oldest
// id once idSetMax are held. An id that was removed and added again is in the ring twice;
// forgetting the older entry forgets it early, which only sends its duplicate to the store.
func (b *bigIDSet) add(id string, sum uint64) {
	b.ids[id] = sum
	if len(b.order) < idSetMax {
		b.order = append(b.order, id)
		return
	}
	delete(b.ids, b.order[b.next])
	b.order[b.next] = id
	b.next = (b.next + 1) % idSetMax
}

func (m *idSet) remove(id string) {
	if m.big != nil {
		delete(m.big.ids, id)
		return
	}
	if i := slices.IndexFunc(m.small, func(x seenID) bool { return x.id == id }); i >= 0 {
		m.small = slices.Delete(m.small, i, i+1)
	}
}

// idSetSmall is the size up to which an idSet is a slice; idSetMax the most ids it holds.
const (
	idSetSmall = 16
	idSetMax   = 1024
)
