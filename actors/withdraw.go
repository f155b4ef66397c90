package actors

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"

	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
)

// A message its sender deleted before its turn started (Withdraw). The user took it back: it
// must not be answered, nor read by the agent later as part of the conversation. Only a
// message still waiting in the queue is taken back (a debounce window or collect mode may be
// holding it to merge it with others: it alone leaves). The session's actor orders the
// withdrawal against the turn's start, so each message has one outcome: removed from the queue
// before its turn, it never runs; once its turn has begun, the withdrawal changes nothing.

// onWithdraw removes a queued message of the session and archives its row, as /undo archives,
// so that neither this activation nor a later one (which loads no archived row) runs it. No
// answer is posted: the user deleted the message. The row stays, so a re-delivery of its id is
// a duplicate. A message of a queue past its cap that waits in the store only (spill.go: in the
// spill's tail, or in its stored range, found there by one read of the store's index of
// inbound ids) is withdrawn the same way; before, it was not, and ran and was answered. While
// writes wait in the spool the database does not show the spilled messages they hold: the
// spill remembers their ids (spill.spooled), and the archive follows the message's write in the
// spool; before, the store's index found nothing, and the message ran and was answered.
func (s *Session) onWithdraw(c actor.Context, m *Withdraw) {
	src := sourceFromProto(m.Source)
	match := func(it *item) bool {
		return it.messageID == m.MessageId && it.src.Platform == src.Platform && it.src.ChatID == src.ChatID
	}
	i := slices.IndexFunc(s.queue, match)
	sp, tail := s.spilling(), -1
	if i < 0 && sp != nil {
		tail = slices.IndexFunc(sp.tail, match)
	}
	switch {
	case m.MessageId == "",
		i >= 0 && (!s.queue[i].durable || s.queue[i].dropped),
		tail >= 0 && (!sp.tail[tail].durable || sp.tail[tail].dropped),
		i < 0 && tail < 0 && (sp == nil || sp.after >= sp.through):
		// Running or answered already, unknown here, or not stored yet (its sender has no
		// acknowledgment: a platform withdraws only what it delivered).
		c.Respond(&WithdrawResult{})
		return
	}
	if s.held() != nil {
		// Its archive would wait behind the turn's result the store refused, for the whole
		// outage, and the platform's gateway reader with it: the message is left to run.
		c.Respond(&WithdrawResult{Error: heldRefusal})
		return
	}
	if s.unusual != nil && len(s.unusual.interrupted) > 0 {
		// In interrupt mode, messages the queue's head cut short are answered with it: taken
		// back, it would leave them unanswered until the user writes again (found by a review).
		c.Respond(&WithdrawResult{})
		return
	}
	var it *item
	fromSpool := false // found among the spilled messages in the spool (spill.spooled), without its text
	switch {
	case i >= 0:
		it = s.queue[i]
		s.queue = slices.Delete(s.queue, i, i+1)
	case tail >= 0:
		it = sp.tail[tail]
		it.inTail = false
		sp.tail = slices.Delete(sp.tail, tail, tail+1)
	default:
		if seq := sp.takeSpooled(m.MessageId); seq > 0 && s.cur != nil && s.cur.ID == sp.sessionID {
			// Its write waits in the spool, which the database does not show yet: its archive
			// follows it there, and is replayed after it.
			fromSpool = true
			it = &item{seq: seq, sessionID: sp.sessionID, src: s.sourceOf(s.cur), messageID: m.MessageId, durable: true}
			it.src.UserID, it.src.UserName = src.UserID, src.UserName
		} else {
			var err error
			var found bool
			if it, found, err = s.spilledItem(sp, src, m.MessageId); err != nil || it == nil {
				r := &WithdrawResult{}
				switch {
				case err != nil:
					r.Error = "the store could not be read for the message: " + err.Error()
				case !found && sp.forgot > 0 && s.d.Spooling.Load():
					// Not in the database: perhaps in the spool, among those spooled forgot. One
					// the database holds outside the spilled messages (its turn running, or
					// answered) is nothing to withdraw, as without a spool: before, it got this
					// error too, and the platform warned that it was not withdrawn
					// (TestDeletedRunningMessageWhileTheSpoolHoldsMoreThanItRemembersIsNoError).
					r.Error = fmt.Sprintf("it may be one of the %d oldest messages past the queue's cap whose writes wait in the spool, which the session no longer remembers (it keeps the latest %d)", sp.forgot, maxSpooledIDs)
				}
				c.Respond(r)
				return
			}
		}
		sp.stored = max(0, sp.stored-1)
		// A message whose write's answer was lost (rememberUnsure) is this one: withdrawn, it
		// is no longer the key's recovery's to adopt and run (adoptUnsure), nor is its archived
		// row pending work (storedAsWritten). Before, a recovery after the spill was read back
		// past it ran it (TestWithdrawnSpilledMessageWhoseAnswerWasLostStaysWithdrawn).
		s.forgetUnsure(it.messageID)
	}
	spilled := i < 0
	if spilled {
		// Until its archive lands, a read of the spill back passes over its row, pending still.
		if sp.withdrawing == nil {
			sp.withdrawing = map[int64]bool{}
		}
		sp.withdrawing[it.seq] = true
	}
	if s.debugOn() {
		s.logger().Debug("message withdrawn by its sender", "message_id", it.messageID, "seq", it.seq, "spilled", spilled)
	}
	requester := c.Sender()
	orphaned := func(c actor.Context, why string) { c.Send(requester, &WithdrawResult{Error: why}) }
	// With the seq of an earlier copy of its write that the store may hold (noteCopy): the
	// copy the replay of the spool stores may be that one, the later refused as its duplicate.
	seqs := s.seqsOf(it)
	ops := []persistence.Op{&persistence.ArchiveMessages{SessionID: it.sessionID, Seqs: seqs}}
	r := s.rare()
	r.withdrawals = append(r.withdrawals, it)
	s.writeFor(c, ops, orphaned, func(c actor.Context, err error) {
		if spilled {
			delete(sp.withdrawing, it.seq)
		}
		if r := s.unusual; r != nil {
			r.withdrawals = slices.DeleteFunc(r.withdrawals, func(q *item) bool { return q == it })
		}
		if err != nil {
			// The row is still pending in the store: the message goes back in the queue, in
			// the place its seq gives it, and runs after all. Not a start again from the store,
			// which would cancel a turn begun meanwhile and run its message again (found by a
			// review); one begun meanwhile from behind it runs first.
			switch {
			case s.fencedOut:
			case it.dropped || s.cur == nil || s.cur.ID != it.sessionID:
				// A command that drops the queue (/stop; a boundary, /new or a reset, which
				// also ends the session; /resume) ran meanwhile (stopWork marked it dropped), or
				// its session ended: it is dropped as the queue was (failed, archived), not run
				// after the /stop or in the new session, nor left pending in the ended one, to
				// run if it is resumed (TestRefusedWithdrawalAfterANewSessionRunsNothing,
				// TestRefusedWithdrawalAfterAStopRunsNothing).
				s.writeFor(c, unrunOps(it.sessionID, seqs...), orphaned, func(c actor.Context, err error) {
					if err != nil {
						if s.cur != nil && s.cur.ID == it.sessionID {
							s.logger().Warn("a message its sender deleted, dropped since by a /stop, could not be set aside; it stays pending in the store and runs when the session next loads from it (a restart)",
								"message_id", it.messageID, "session_id", it.sessionID, logging.Err(err))
						} else {
							s.logger().Warn("a message its sender deleted, of a session that has ended since, could not be set aside; it stays pending in that session and runs if the session is resumed",
								"message_id", it.messageID, "session_id", it.sessionID, logging.Err(err))
						}
						c.Send(requester, &WithdrawResult{Error: "the withdrawal could not be stored: " + err.Error()})
						return
					}
					s.forgetCopy(it.messageID)
					c.Send(requester, &WithdrawResult{Withdrawn: true})
				})
				return
			case fromSpool:
				s.unwithdrawSpooled(it, err)
				s.tryStart(c)
			case spilled:
				// Where its seq puts it now: in memory if the spill was read back past it,
				// else among the spilled messages (queueAdopted).
				s.queueAdopted(it)
				s.tryStart(c)
			default:
				at, _ := slices.BinarySearchFunc(s.queue, it.seq, func(q *item, seq int64) int { return cmp.Compare(q.seq, seq) })
				s.queue = slices.Insert(s.queue, at, it)
				s.tryStart(c)
			}
			c.Send(requester, &WithdrawResult{Error: "the withdrawal could not be stored: " + err.Error()})
			return
		}
		s.forgetCopy(it.messageID)
		c.Send(requester, &WithdrawResult{Withdrawn: true})
	})
	if spilled && s.spilling() == sp {
		s.settle() // a tail that empties ends; a stored range left empty ends at its next read back
	}
	s.tryStart(c) // the next message may run now (the withdrawn one headed the queue)
}

// spilledItem finds message id of src's chat among the spilled messages of sp that wait in the
// store (after < seq <= through), by one read of the store's index of inbound ids, and returns
// its queue item; nil when the store holds it elsewhere (another session's, or this one's
// outside the range: running, answered, or read back) or not at all. Only this session's, the
// one that holds the message, is withdrawn. found reports whether the store holds the message at
// all.
func (s *Session) spilledItem(sp *spill, src identity.Source, id string) (it *item, found bool, err error) {
	row, err := s.findStored(src, id)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if row.SessionID != sp.sessionID || row.Seq <= sp.after || row.Seq > sp.through || sp.withdrawing[row.Seq] ||
		row.Status != persistence.StatusPending || !row.Active || row.Archived || s.cur == nil || s.cur.ID != sp.sessionID {
		return nil, true, nil
	}
	return s.storedItem(row), true, nil
}

// unwithdrawSpooled puts it, a spilled message found in the spool (spill.spooled) whose
// withdrawal's archive the store refused (refused: the database failing, and the spool too),
// back where its seq puts it: among the spilled messages, still to be read back with its text,
// and remembered again while writes wait in the spool; or, if the spill was read back past it
// meanwhile (the spool drained), in memory, read from the store for its text. If that read
// fails it does not run now; the spool's replay stored it, as a rule (else it set the write
// aside, or refused it as an earlier copy's duplicate), pending, and it runs when the session
// next loads from the store. The line says so, with both errors: before, it said that the store
// refused the withdrawal and that the message stayed pending in the store and ran at a restart,
// though the session could not read the store and the load need not be a restart
// (TestRefusedSpooledWithdrawalTheDatabaseCannotReadBackSaysWhatItKnows).
func (s *Session) unwithdrawSpooled(it *item, refused error) {
	if sp := s.spilling(); sp != nil && it.seq > sp.after && it.seq <= sp.through {
		sp.stored++
		if s.d.Spooling.Load() {
			sp.noteSpooled(it)
		}
		return
	}
	row, err := s.findStored(it.src, it.messageID)
	if err == nil && (row.SessionID != it.sessionID || row.Seq != it.seq || row.Status != persistence.StatusPending || !row.Active || row.Archived) {
		return // not pending there: nothing to run
	}
	if err != nil {
		s.logger().Warn(msgUnwithdrawnUnread,
			"message_id", it.messageID, "seq", it.seq, "archive", refused.Error(), logging.Err(err))
		return
	}
	s.queueInPlace(s.storedItem(row))
}

// msgUnwithdrawnUnread is unwithdrawSpooled's line; docs/RUNBOOK.md explains it.
const msgUnwithdrawnUnread = "a message its sender deleted could not be withdrawn (the database and the spool both refused its archive) nor read back to run in its place (the database did not answer); it does not run now, and runs at the session's next load from the store if the spool's replay stored it"
