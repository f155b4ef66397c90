package actors

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
)

// A queue past its cap (sessions.queue.overflow: spool) is "persisted, runs later": every
// message is stored before it is acknowledged, so the messages behind the cap need not be held
// in memory as well. Before, they were: a chat writing faster than its agent answers grew its
// session's queue without bound (measured: 176 MB for 47,500 messages queued behind a slow exec
// agent), the memory of one chat's flood taken from every other.
//
// Now the queue in memory (Session.queue) holds at most about the cap; the messages behind it
// wait in the store only, as its pending rows of one session in a range of seqs, and are read
// back in pages as the queue drains (refill), in order. A message that arrives while any wait
// there joins them, so that order holds: it waits in the spill's tail while its write is in
// flight (its requester waits for that write's answer, and a refused write leaves no row), and
// joins the stored range once its write and those of every message ahead of it in the tail
// have landed (settle). A requeued message joins them the same way; one whose write's answer
// was lost and that is adopted takes its place among them by seq (queueAdopted). The few
// operations that drop the whole queue (a boundary, /stop, /resume) first read it back whole,
// without the text (unspill). A session that starts reads only what a queue past its cap holds
// (LoadSession's pendingLimit); the rest of its backlog is its spill from the start, and is set
// aside a page at a time when the start does not run it (aside.go).

// spill is the part of a session's queue past its cap that waits in the store (see above).
type spill struct {
	sessionID string
	// after and through bound the stored range: the session's pending user messages with
	// after < seq <= through are the spilled ones not read back yet.
	after, through int64
	stored         int     // how many there are, as far as this activation counted them (waiting)
	tail           []*item // arrivals whose writes have not all landed, in seq order (item.inTail)
	// withdrawing holds the seqs of spilled messages withdrawn (withdraw.go) whose archives are
	// in flight: pending still in the store, they are not read back.
	withdrawing map[int64]bool
	// spooled are the latest (at most maxSpooledIDs) of the spilled messages that joined the
	// stored range while writes waited in the spool, which the database does not show yet, in
	// the order they joined: their ids and seqs, for a withdrawal (withdraw.go), which cannot
	// find them by the store's index. Emptied when the spill is read back: the spool has
	// drained by then. Memory only: a restart loses it, and loads the session once the spool
	// has been replayed, when the store's index finds them.
	spooled []spooledID
	// forgot counts the messages spooled forgot past maxSpooledIDs since it was last emptied.
	forgot int
}

// spooledID is the message id and seq of a spilled message the spool holds (spill.spooled).
type spooledID struct {
	id  string
	seq int64
}

// maxSpooledIDs bounds spill.spooled: a session keeps the ids of at most the latest 4,096 of
// its spilled messages while writes wait in the spool (some 200 KiB), the ones their senders
// are likely to delete; an older one deleted then is not withdrawn, and is answered.
const maxSpooledIDs = 4096

// noteSpooled remembers it, a spilled message joining the stored range while writes wait in the
// spool, for its withdrawal.
func (sp *spill) noteSpooled(it *item) {
	if it.messageID == "" {
		return
	}
	if len(sp.spooled) >= maxSpooledIDs {
		sp.spooled[0] = spooledID{}
		sp.spooled = sp.spooled[1:]
		sp.forgot++
	}
	sp.spooled = append(sp.spooled, spooledID{id: it.messageID, seq: it.seq})
}

// takeSpooled returns the seq of spilled message id in the spool, and forgets it; 0 when
// spooled does not hold it, or holds it out of the stored range.
func (sp *spill) takeSpooled(id string) int64 {
	for i := len(sp.spooled) - 1; i >= 0; i-- {
		if e := sp.spooled[i]; e.id == id {
			sp.spooled = slices.Delete(sp.spooled, i, i+1)
			if e.seq <= sp.after || e.seq > sp.through || sp.withdrawing[e.seq] {
				return 0
			}
			return e.seq
		}
	}
	return 0
}

// spilling returns the session's spill, nil when its whole queue is in memory.
func (s *Session) spilling() *spill {
	if s.unusual == nil {
		return nil
	}
	return s.unusual.spill
}

// hasQueued reports whether any message waits for a turn, in memory or in the store.
func (s *Session) hasQueued() bool { return len(s.queue) > 0 || s.spilling() != nil }

// enqueue queues it, a message just taken (its write in flight), behind every other: in memory,
// or in the spill's tail when the queue is past its cap (over) or messages wait in the store
// already.
func (s *Session) enqueue(it *item, over bool) {
	sp := s.spilling()
	if sp == nil && (!over || s.d.Config.Overflow == OverflowReject) {
		s.queue = append(s.queue, it)
		return
	}
	if sp == nil {
		sp = &spill{sessionID: it.sessionID, after: it.seq - 1, through: it.seq - 1}
		s.rare().spill = sp
	}
	it.inTail = true
	sp.tail = append(sp.tail, it)
}

// leaveTail takes it out of the spill's tail after its write was refused (it is stored
// nowhere), and lets those behind it settle.
func (s *Session) leaveTail(it *item) {
	sp := s.spilling()
	if sp == nil || !it.inTail {
		return
	}
	it.inTail = false
	sp.tail = slices.DeleteFunc(sp.tail, func(q *item) bool { return q == it })
	s.settle()
}

// settle moves the tail's front messages whose writes have landed into the stored range, and
// lets go of them: from here on the store holds them for the session. A message whose landed
// write adopted an earlier one's seq (adoptStored) lies before the range: it joins the queue in
// memory, in its place (queueInPlace). A spill with nothing left to read back and no tail ends.
func (s *Session) settle() {
	sp := s.spilling()
	for len(sp.tail) > 0 && sp.tail[0].durable {
		it := sp.tail[0]
		sp.tail[0] = nil
		sp.tail = sp.tail[1:]
		it.inTail = false
		if it.seq <= sp.after {
			s.queueInPlace(it)
			continue
		}
		sp.through = max(sp.through, it.seq)
		sp.stored++
		if s.d.Spooling.Load() {
			sp.noteSpooled(it)
		}
	}
	if len(sp.tail) == 0 {
		sp.tail = nil // (its array still holds the items let go of)
		if sp.after >= sp.through {
			s.unusual.spill = nil
		}
	}
}

// spillRetry wakes a session whose read of its spilled messages failed, to read again.
type spillRetry struct{}

// spillRetryAfter is how long a session waits to read its spilled messages again after a read
// failed.
const spillRetryAfter = time.Second

// spillReadTimeout bounds one read of spilled messages.
const spillReadTimeout = 5 * time.Second

// refill reads spilled messages back into the queue once it has drained to half its cap, up to
// the cap. A read that fails is tried again after spillRetryAfter; the queue meanwhile runs what
// it holds (and, drained, waits: nothing behind the read may overtake it). So does a read while
// writes wait in the spool (the database failed): the database does not show them yet, and a
// read would pass over the spilled messages among them.
func (s *Session) refill(c actor.Context) {
	sp := s.spilling()
	if sp == nil || sp.after >= sp.through || len(s.queue) > s.d.Config.QueueCap/2 {
		return
	}
	if s.d.Spooling.Load() {
		s.timers(c).SendOnce(spillRetryAfter, c.Self(), &spillRetry{})
		return
	}
	want := s.d.Config.QueueCap + 1 - len(s.queue)
	if err := s.readBack(sp, want, true); err != nil {
		s.d.spillReadFailures.LogQuiet(s.logger(), slog.LevelWarn, "read the messages waiting in the store past the queue's cap; retrying in a second", "spilled", sp.stored, logging.Err(err))
		s.timers(c).SendOnce(spillRetryAfter, c.Self(), &spillRetry{})
	}
}

// unspill reads every spilled message back into the queue, and puts the tail behind them: the
// whole queue is in memory again, for an operation that drops all of it (a boundary, /stop,
// /resume). On error nothing changed. The messages are read without their text, as the refs of
// messages that never run: the caller drops them (stopWork) before it returns, and a flood of
// long messages is not read into memory to be dropped.
func (s *Session) unspill() error {
	sp := s.spilling()
	if sp == nil {
		return nil
	}
	if s.d.Spooling.Load() {
		return fmt.Errorf("%w: writes wait in the spool, and the database does not show them yet", persistence.ErrUnavailable)
	}
	if err := s.readBack(sp, 0, false); err != nil {
		return fmt.Errorf("read the session's waiting messages back from the store: %w", err)
	}
	for _, it := range sp.tail {
		it.inTail = false
	}
	s.queue = append(s.queue, sp.tail...)
	s.unusual.spill = nil
	return nil
}

// readBack appends to the queue the first limit spilled messages (all of them when limit <= 0),
// with their text when they are to run (refill), else without (unspill). A read that returns
// fewer than it asked for has read the whole range. A message whose write's answer was lost
// (rememberUnsure) but that is stored is adopted: it runs in its place.
func (s *Session) readBack(sp *spill, limit int, text bool) error {
	if s.cur == nil || s.cur.ID != sp.sessionID {
		// Every boundary reads the spill back first (unspill): no message of an ended
		// session runs in its successor.
		panic(fmt.Errorf("session %s: messages spilled under session %s, now %s", s.key, sp.sessionID, s.curID()))
	}
	ctx, cancel := context.WithTimeout(s.d.Ctx, spillReadTimeout)
	defer cancel()
	read := s.d.Store.PendingAfter
	if !text {
		read = s.d.Store.PendingRefsAfter
	}
	rows, err := read(ctx, sp.sessionID, sp.after, sp.through, limit)
	if err != nil {
		return err
	}
	// Read while no write waits in the spool (refill, unspill): the database holds every
	// message spooled noted, and a withdrawal finds them there.
	sp.spooled, sp.forgot = nil, 0
	passed := 0
	for i := range rows {
		sp.after = rows[i].Seq
		if sp.withdrawing[rows[i].Seq] {
			passed++ // withdrawn, its archive in flight (not counted in stored)
			continue
		}
		s.queue = append(s.queue, s.storedItem(&rows[i]))
		if s.unusual.unsure[rows[i].MessageID] != nil {
			s.forgetUnsure(rows[i].MessageID)
			s.logAdopted(s.queue[len(s.queue)-1])
		}
	}
	sp.stored = max(0, sp.stored-(len(rows)-passed))
	if limit <= 0 || len(rows) < limit {
		sp.after, sp.stored = sp.through, 0
	}
	if sp.after >= sp.through && len(sp.tail) == 0 {
		s.unusual.spill = nil
	}
	return nil
}

// storedItem is the queue item of a pending message read from the store.
func (s *Session) storedItem(m *persistence.Message) *item {
	src := s.sourceOf(s.cur)
	src.UserID, src.UserName = m.UserID, m.UserName
	s.seen.add(m.MessageID)
	return &item{seq: m.Seq, sessionID: m.SessionID, src: src, messageID: m.MessageID, text: m.Content,
		at: m.CreatedAt, durable: true, restarts: m.Attempts}
}
