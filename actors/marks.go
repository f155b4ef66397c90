package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"
)

// Delivery marks of Platform. A sent (or finally failed) outbound message is marked in the
// outbox, so the next start does not send it again. The marks of many sends are coalesced into
// one write group: at most one mark write is in flight, and the marks of the sends that finish
// meanwhile wait for it and go together in the next one (at most maxMarks per write). Under
// load a turn then costs the store two groups (its inbound message and its result) and a share
// of a mark group, instead of three. The records of streaming drafts (OpenDraft, CloseDraft; see
// drafts.go) and those a platform keeps itself (platforms.Recorder: Discord's unread places) go
// through the same queue, in order.
//
// A mark not yet written when the process dies means the reply is sent again at the next start:
// delivery is at least once, as it already is for a crash between a send and its mark. Discord
// sends carry a nonce derived from the outbox entry and the HTTP API's event stream is replayed
// by seq, so a client sees a re-sent reply at most as a repeat of the same seq. A mark write
// whose answer does not come is sent again after resendAfter: a mark carries the number of
// attempts made (MarkDelivery.Attempt, job.tries), so a re-applied mark counts them once, as
// does a spool replay of a mark write that was committed (a "delivered" mark is final and
// re-applies as a no-op anyway). A mark write refused because the store cannot be written (the
// database and the spool failing: persistence.ErrUnavailable) is kept, in order, and written
// again after resendAfter; before, it was dropped, and the replies it marked were sent again at
// the next start although they had reached the user
// (TestMarksRefusedAsUnavailableAreWrittenLater, found by TestOutageHunt). A mark write that
// fails otherwise is split into one write per mark, so one bad entry never loses the others'
// marks; those are logged, not retried, like a single mark's failure was.

// msgMarkFailed says that a delivery mark (or a draft's record) was not written and is not
// tried again: its reply stays unconfirmed in the outbox, and is sent again when its session
// next loads.
const msgMarkFailed = "record a delivery mark; not tried again (a reply left unmarked is sent again when its session next loads)"

// msgMarksUnacked says that a mark write got no answer within resendAfter and is sent again.
const msgMarksUnacked = "delivery marks not acknowledged; sending them again"

// opAttrs are the log attributes that name what a mark write was for.
func opAttrs(op persistence.Op) []any {
	switch o := op.(type) {
	case *persistence.MarkDelivery:
		return []any{"session", o.SessionKey, "seq", o.Seq, "state", o.State}
	case *persistence.MarkUnread:
		return []any{"op", "mark unread", "chat", o.Unread.ChatID}
	case *persistence.ClearUnread:
		return []any{"op", "clear unread", "chat", o.ChatID}
	}
	return []any{"op", fmt.Sprintf("%T", op)}
}

// records holds the ops a platform records (platforms.Recorder) from its own goroutines until
// its actor takes them: at each recordOps, and at its stop, once Run has returned
// (writeLateRecords). A platform records while the actor waits for Run at its stop (the
// Discord platform keeps the unread place of a message the stop left for the next start to
// read back), and sent to the actor's mailbox such a record reached an actor that had stopped
// by the time it was read, and was dropped: the next start did not read the message back.
type records struct {
	mu  sync.Mutex
	ops []persistence.Op
}

// add queues ops.
func (r *records) add(ops []persistence.Op) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, ops...)
}

// take returns the ops queued, oldest first, and empties the queue; nil on a nil records.
func (r *records) take() []persistence.Op {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ops := r.ops
	r.ops = nil
	return ops
}

// writeLateRecords sends, at the actor's stop once Run has returned, what its platform
// recorded meanwhile, and the marks the stop's flush held back behind a write in flight, in
// one write of their own: the actor takes no answer now, and the persistence actor, which
// stops after the platforms, still takes it.
func (a *Platform) writeLateRecords(c actor.Context) {
	ops := append(a.marks.waiting, a.records.take()...)
	a.marks.waiting = nil
	if len(ops) == 0 {
		return
	}
	c.Send(a.d.Persist, &persistence.Write{Ops: ops})
}

// maxMarks bounds the marks of one write. It is not below the replies one commit can carry
// (persistence.max_batch: 512 groups by default, config.MaxBatchLimit at most), so one mark
// write per commit keeps pace with any load: with 256, a platform that sent more replies than
// that per commit fell further behind at every commit for as long as the load lasted
// (TestMarksKeepPaceWithSends). The bound keeps the backlog of a long store outage in writes of
// a few milliseconds each.
const maxMarks = 4096

// marks is a platform actor's coalescing buffer of delivery marks.
type marks struct {
	waiting  []persistence.Op     // marks and draft records not yet sent to the persistence actor
	inflight *persistence.Write   // the write awaiting its result, if any
	stopTick scheduler.CancelFunc // cancels the inflight write's re-send tick, or the retry's (paused)
	paused   bool                 // the last write was refused as unavailable: wait for marksRetry
	refused  int                  // writes refused as unavailable in a row (the first, then one a minute, are logged)
	nextID   uint64               // ids of coalesced writes: 1, 2, …; 0 marks a single mark's write
	// unacked holds back msgMarksUnacked while mark writes go unanswered (a database that
	// hangs): it was logged at every resend, each resendAfter, for as long as that lasted.
	unacked logging.Limiter
}

// busy reports whether marks wait to be written or a mark write awaits its result.
func (m *marks) busy() bool { return len(m.waiting) > 0 || m.inflight != nil }

// holds reports whether a delivery mark of key's session waits to be written or is in the
// write in flight.
func (m *marks) holds(key string) bool {
	has := func(ops []persistence.Op) bool {
		for _, op := range ops {
			if d, ok := op.(*persistence.MarkDelivery); ok && d.SessionKey == key {
				return true
			}
		}
		return false
	}
	return has(m.waiting) || m.inflight != nil && has(m.inflight.Ops)
}

// marksTick wakes the platform actor to re-send a mark write that got no answer.
type marksTick struct{ id uint64 }

// marksRetry wakes the platform actor to write again the marks the store refused as unavailable.
type marksRetry struct{}

// mark queues one delivery mark or draft record, and writes it at once when no mark write is
// in flight.
func (a *Platform) mark(c actor.Context, op persistence.Op) {
	a.marks.waiting = append(a.marks.waiting, op)
	if a.marks.inflight == nil {
		a.flushMarks(c)
	}
}

// flushMarks sends the waiting marks (up to maxMarks) as one write group.
func (a *Platform) flushMarks(c actor.Context) {
	m := &a.marks
	if len(m.waiting) == 0 || m.inflight != nil || m.paused {
		return
	}
	n := min(len(m.waiting), maxMarks)
	ops := append([]persistence.Op(nil), m.waiting[:n]...)
	m.waiting = append(m.waiting[:0:0], m.waiting[n:]...)
	if len(m.waiting) == 0 {
		m.waiting = nil
	}
	m.nextID++
	m.inflight = &persistence.Write{ID: m.nextID, Ops: ops}
	c.Request(a.d.Persist, m.inflight)
	m.stopTick = a.timers.SendOnce(resendAfter, c.Self(), &marksTick{id: m.nextID})
}

// onMarksWritten handles the result of a mark write.
func (a *Platform) onMarksWritten(c actor.Context, r *persistence.WriteResult) {
	m := &a.marks
	if r.ID == 0 { // one mark of a split write
		if r.Err != nil {
			a.log.Warn(msgMarkFailed, logging.Err(r.Err))
		}
		return
	}
	w := m.inflight
	if w == nil || w.ID != r.ID {
		return // the answer to a write sent again, already handled
	}
	m.inflight = nil
	cancelTimer(m.stopTick)
	m.stopTick = nil
	m.unacked.Reset() // answered: the next write that goes unanswered says so at once
	if errors.Is(r.Err, persistence.ErrUnavailable) {
		// Nothing of it was written, and the store may take it later: it goes first again.
		m.refused++
		if n := m.refused; n == 1 || n%int(time.Minute/resendAfter) == 0 {
			a.log.Warn("record deliveries; the store is unavailable, trying again shortly", "marks", len(w.Ops),
				"attempt", n, "in", resendAfter, logging.Err(r.Err))
		}
		m.waiting = append(slices.Clip(w.Ops), m.waiting...)
		m.paused = true
		m.stopTick = a.timers.SendOnce(resendAfter, c.Self(), &marksRetry{})
		a.answerQuiesce(c)
		return
	}
	m.refused = 0
	if r.Err != nil {
		if len(w.Ops) == 1 {
			a.log.Warn(msgMarkFailed, append(opAttrs(w.Ops[0]), logging.Err(r.Err))...)
		} else {
			// The group is atomic: none of its marks was written. Each goes alone, so one bad
			// entry does not take the others with it.
			a.log.Warn("record deliveries; writing them one by one", "marks", len(w.Ops), logging.Err(r.Err))
			for _, op := range w.Ops {
				c.Request(a.d.Persist, &persistence.Write{Ops: []persistence.Op{op}})
			}
		}
	}
	a.flushMarks(c)
	a.answerQuiesce(c)
}

// markTries queues, as the actor stops, a mark of the sends tried for each reply it still
// holds (a retry held, or a send whose result the stop cuts): the entry stays pending, and is
// sent again when its session next loads, which hands it over with these attempts
// (SendOutbound.Attempts) for that run to count its tries on from. Before, only a reply's last
// mark (delivered, or failed for good) counted its tries, and those of the runs that stopped
// before it were lost (TestStopRecordsTheTriesOfAReplyStillPending).
func (a *Platform) markTries() {
	for _, key := range slices.Sorted(maps.Keys(a.queues)) {
		for _, j := range a.queues[key] {
			if j.draftTurn == "" && j.out.Seq != 0 && j.tries > j.loaded {
				a.marks.waiting = append(a.marks.waiting, &persistence.MarkDelivery{SessionKey: key, Seq: j.out.Seq,
					State: persistence.DeliveryPending, At: a.d.now(), Attempt: j.tries})
			}
		}
	}
}

// onMarksRetry writes again the marks the store refused as unavailable.
func (a *Platform) onMarksRetry(c actor.Context) {
	if !a.marks.paused {
		return
	}
	a.marks.paused = false
	a.marks.stopTick = nil
	a.flushMarks(c)
}

// onMarksTick re-sends a mark write that got no answer (the persistence actor may have
// restarted and lost its batch).
func (a *Platform) onMarksTick(c actor.Context, t *marksTick) {
	w := a.marks.inflight
	if w == nil || w.ID != t.id {
		return
	}
	a.marks.unacked.Log(a.log, slog.LevelWarn, msgMarksUnacked, "marks", len(w.Ops))
	c.Request(a.d.Persist, w)
	a.marks.stopTick = a.timers.SendOnce(resendAfter, c.Self(), &marksTick{id: t.id})
}
