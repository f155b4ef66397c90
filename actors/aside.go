package actors

import (
	"context"
	"log/slog"
	"math"
	"slices"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
)

// Pending messages a session sets aside without running them, read from the store a page at a
// time. A session that starts reads only the first messages of its backlog (what its queue
// holds: LoadSession's pendingLimit); the rest wait in the store as a spill (spill.go). Most of
// the time they run as the queue drains, but at a start that answers the backlog with notices
// instead (sessions.recovery: notice, a reset that fell due while agentgate was down, messages
// left in a session the key has left) every one of them is set aside. Those are read here
// without their text, in pages, and set aside, the next page once the last one's writes are
// answered, so that a backlog of tens of thousands of long messages is never in memory at once,
// neither as rows nor as writes waiting for the persistence actor.

// storedAside is the work of setting aside the pending messages of one session with
// after < seq <= through, which wait in the store only.
//
// It is data only: a session that stops or crashes before its work is done leaves it in
// Deps.asides, and the key's next activation or incarnation takes it up (resumeAside). Before,
// it was dropped, and the next one ran what was left of a backlog its start had answered with
// notices (sessions.recovery: notice): TestBacklogNoticedAtStartDoesNotRunAfterACrash.
type storedAside struct {
	sessionID      string
	after, through int64
	upTo           int64                // the through it was given (through changes on its last page)
	text           string               // the notice each message is set aside with
	leftBehind     bool                 // a message left in a session the key has left (leaveBehind; text unused)
	from           *persistence.Session // whose chat the notices go to
	inFlight       int                  // writes of the last page not answered yet
	logged         bool                 // the line for messages left behind is written
}

// asidePage is how many stored messages a session reads at a time to set them aside (without
// their text: PendingRefsAfter).
const asidePage = 256

// asideRetry wakes a session whose read of messages to set aside failed, to read again.
type asideRetry struct{}

// setAsideQueue sets aside every queued message with a notice of text, in memory and in the
// store (the spill), as failed: at a start whose backlog is not run (noticePending). from is
// the session whose chat the notices go to. A spill at a start has no tail: nothing has
// arrived yet.
func (s *Session) setAsideQueue(c actor.Context, from *persistence.Session, text string) {
	for _, it := range s.queue {
		s.setAside(c, it, persistence.StatusFailed, text)
	}
	s.queue = nil
	sp := s.spilling()
	if sp == nil {
		return
	}
	s.unusual.spill = nil
	s.setAsideStored(c, &storedAside{sessionID: sp.sessionID, after: sp.after, through: sp.through, text: text, from: from})
}

// asideThrough bounds the work of setting aside stored messages of sessionID at seq: a session
// /resume reopens (left behind, its messages were to be set aside up to its last one) takes
// new messages from here on, which are its own and run. Before, the work went on to every
// pending message of the session and set aside, with a notice that it was not run, a message
// the resumed session ran (TestResumedSessionsNewMessagesAreNotLeftBehind).
func (s *Session) asideThrough(sessionID string, seq int64) {
	if !s.settingAside() {
		return
	}
	for _, w := range s.unusual.aside {
		if w.sessionID == sessionID {
			w.through, w.upTo = min(w.through, seq), min(w.upTo, seq)
		}
	}
	s.noteAside()
}

// setAsideOne sets aside m, one of the messages of w, and calls then once its write is answered
// (whatever the answer).
func (s *Session) setAsideOne(c actor.Context, w *storedAside, m *persistence.Message, then func(actor.Context)) {
	if w.leftBehind {
		if !w.logged { // one line for them all: a flood's backlog left there is thousands
			w.logged = true
			s.logger().Warn("messages were left pending in a session the key has left; each is set aside with a notice",
				"session_id", m.SessionID, "first_message_id", m.MessageID)
		}
		s.leaveBehind(c, w.from, m, then)
		return
	}
	src := s.sourceOf(w.from)
	src.UserID, src.UserName = m.UserID, m.UserName
	it := &item{seq: m.Seq, sessionID: m.SessionID, src: src, messageID: m.MessageID, durable: true}
	s.setAsideThen(c, it, persistence.StatusFailed, w.text, then)
}

// setAsideStored adds w to the session's work of setting stored messages aside, done in order.
func (s *Session) setAsideStored(c actor.Context, w *storedAside) {
	w.upTo = w.through
	u := s.rare()
	u.aside = append(u.aside, w)
	s.noteAside()
	if len(u.aside) == 1 {
		s.asideNext(c)
	}
}

// noteAside files the session's unfinished work of setting stored messages aside in
// Deps.asides, where the key's next activation or incarnation finds it if this one stops
// before it is done (resumeAside).
func (s *Session) noteAside() {
	if !s.settingAside() {
		s.d.asides.Delete(s.key)
		return
	}
	s.d.asides.Store(s.key, slices.Clone(s.unusual.aside))
}

// resumeAside takes up, as the session loads, the work of setting stored messages aside that
// the key's last activation or incarnation left unfinished (it crashed, or stopped to start
// again from the store): each of its messages still pending is set aside as that one would
// have. Its messages in the session the key routes to are taken out of the queue just loaded,
// in memory and in the store: they must not run.
func (s *Session) resumeAside(c actor.Context) {
	v, ok := s.d.asides.LoadAndDelete(s.key)
	if !ok {
		return
	}
	for _, old := range v.([]*storedAside) {
		// From the start: a message of its last page whose write was refused is still pending.
		w := &storedAside{sessionID: old.sessionID, through: old.upTo, text: old.text, leftBehind: old.leftBehind, from: old.from}
		if s.cur != nil && s.cur.ID == w.sessionID {
			if w.leftBehind && w.through == math.MaxInt64 {
				continue // reopened since, and not here (asideThrough): its messages are its own
			}
			s.passOver(w.through)
		}
		s.setAsideStored(c, w)
	}
}

// passOver takes out of the queue just loaded (in memory, and the spill) the messages with
// seq <= through, which a work of setting messages aside has.
func (s *Session) passOver(through int64) {
	s.queue = slices.DeleteFunc(s.queue, func(it *item) bool { return it.seq <= through })
	sp := s.spilling()
	if sp == nil || sp.after >= through {
		return
	}
	if sp.through <= through {
		s.unusual.spill = nil
		return
	}
	// What is left came after: count it, without its text (on error the count stays an
	// over-count until the spill is read back).
	sp.after = through
	ctx, cancel := context.WithTimeout(s.d.Ctx, spillReadTimeout)
	defer cancel()
	if refs, err := s.d.Store.PendingRefsAfter(ctx, sp.sessionID, sp.after, sp.through, 0); err == nil {
		sp.stored = len(refs)
		if len(refs) == 0 {
			s.unusual.spill = nil
		}
	}
}

// settingAside reports whether stored messages wait to be set aside: the session does not
// passivate before they are.
func (s *Session) settingAside() bool { return s.unusual != nil && len(s.unusual.aside) > 0 }

// asideNext reads the next page of messages to set aside and sets each aside, once the last
// page's writes are answered. A read that fails is tried again after spillRetryAfter. A session
// that stops (fenced, passivating, starting again from the store) lets go of the work: it stays
// filed in Deps.asides for the key's next activation (noteAside, resumeAside).
func (s *Session) asideNext(c actor.Context) {
	for s.settingAside() {
		if s.fencedOut || s.passivating || s.dead {
			s.unusual.aside = nil
			return
		}
		w := s.unusual.aside[0]
		if w.inFlight > 0 {
			return
		}
		if w.after >= w.through {
			s.unusual.aside[0] = nil
			s.unusual.aside = s.unusual.aside[1:]
			s.noteAside()
			continue
		}
		ctx, cancel := context.WithTimeout(s.d.Ctx, spillReadTimeout)
		msgs, err := s.d.Store.PendingRefsAfter(ctx, w.sessionID, w.after, w.through, asidePage)
		cancel()
		if err != nil {
			s.d.spillReadFailures.LogQuiet(s.logger(), slog.LevelWarn, "read pending messages to set aside; retrying in a second", "session_id", w.sessionID, logging.Err(err))
			s.timers(c).SendOnce(spillRetryAfter, c.Self(), &asideRetry{})
			return
		}
		if len(msgs) < asidePage {
			w.through = math.MinInt64 // the last page: done once its writes are answered
		}
		for i := range msgs {
			w.inFlight++
			w.after = max(w.after, msgs[i].Seq)
			s.setAsideOne(c, w, &msgs[i], func(c actor.Context) {
				w.inFlight--
				if w.inFlight == 0 {
					s.asideNext(c)
				}
			})
		}
	}
}
