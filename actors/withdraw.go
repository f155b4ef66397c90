package actors

import (
	"cmp"
	"slices"

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
// a duplicate.
func (s *Session) onWithdraw(c actor.Context, m *Withdraw) {
	src := sourceFromProto(m.Source)
	i := slices.IndexFunc(s.queue, func(it *item) bool {
		return it.messageID == m.MessageId && it.src.Platform == src.Platform && it.src.ChatID == src.ChatID
	})
	if m.MessageId == "" || i < 0 || !s.queue[i].durable || s.queue[i].dropped {
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
	it := s.queue[i]
	s.queue = slices.Delete(s.queue, i, i+1)
	if s.debugOn() {
		s.logger().Debug("message withdrawn by its sender", "message_id", it.messageID, "seq", it.seq)
	}
	requester := c.Sender()
	orphaned := func(c actor.Context, why string) { c.Send(requester, &WithdrawResult{Error: why}) }
	ops := []persistence.Op{&persistence.ArchiveMessages{SessionID: it.sessionID, Seqs: []int64{it.seq}}}
	s.writeFor(c, ops, orphaned, func(c actor.Context, err error) {
		if err != nil {
			// The row is still pending in the store: the message goes back in the queue, in
			// the place its seq gives it, and runs after all. Not a start again from the store,
			// which would cancel a turn begun meanwhile and run its message again (found by a
			// review); one begun meanwhile from behind it runs first.
			if !s.fencedOut {
				at, _ := slices.BinarySearchFunc(s.queue, it.seq, func(q *item, seq int64) int { return cmp.Compare(q.seq, seq) })
				s.queue = slices.Insert(s.queue, at, it)
				s.tryStart(c)
			}
			c.Send(requester, &WithdrawResult{Error: "the withdrawal could not be stored: " + err.Error()})
			return
		}
		c.Send(requester, &WithdrawResult{Withdrawn: true})
	})
	s.tryStart(c) // the next message may run now (the withdrawn one headed the queue)
}
