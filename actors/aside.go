package actors

import (
	"context"
	"math"

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
type storedAside struct {
	sessionID      string
	after, through int64
	// one sets m aside and calls then once its write is answered (whatever the answer).
	one      func(c actor.Context, m *persistence.Message, then func(actor.Context))
	inFlight int // writes of the last page not answered yet
}

// asidePage is how many stored messages a session reads at a time to set them aside (without
// their text: PendingRefsAfter).
const asidePage = 256

// asideRetry wakes a session whose read of messages to set aside failed, to read again.
type asideRetry struct{}

// setAsideQueue sets aside every queued message with a notice of text, in memory and in the
// store (the spill), as failed: at a start whose backlog is not run (noticePending,
// expireOnStart). from is the session whose chat the notices go to. A spill at a start has no
// tail: nothing has arrived yet.
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
	s.setAsideStored(c, &storedAside{sessionID: sp.sessionID, after: sp.after, through: sp.through,
		one: func(c actor.Context, m *persistence.Message, then func(actor.Context)) {
			src := s.sourceOf(from)
			src.UserID, src.UserName = m.UserID, m.UserName
			it := &item{seq: m.Seq, sessionID: m.SessionID, src: src, messageID: m.MessageID, durable: true}
			s.setAsideThen(c, it, persistence.StatusFailed, text, then)
		}})
}

// setAsideStored adds w to the session's work of setting stored messages aside, done in order.
func (s *Session) setAsideStored(c actor.Context, w *storedAside) {
	u := s.rare()
	u.aside = append(u.aside, w)
	if len(u.aside) == 1 {
		s.asideNext(c)
	}
}

// settingAside reports whether stored messages wait to be set aside: the session does not
// passivate before they are (its next activation would run them).
func (s *Session) settingAside() bool { return s.unusual != nil && len(s.unusual.aside) > 0 }

// asideNext reads the next page of messages to set aside and sets each aside, once the last
// page's writes are answered. A read that fails is tried again after spillRetryAfter. A session
// that stops (fenced, passivating, starting again from the store) drops the work: its next
// activation finds the messages pending.
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
			continue
		}
		ctx, cancel := context.WithTimeout(s.d.Ctx, spillReadTimeout)
		msgs, err := s.d.Store.PendingRefsAfter(ctx, w.sessionID, w.after, w.through, asidePage)
		cancel()
		if err != nil {
			if n, ok := s.d.spillReadFailures.Allow(); ok {
				args := []any{"session_id", w.sessionID, logging.Err(err)}
				if n > 1 {
					args = append(args, "repeats", n-1)
				}
				s.logger().Warn("read pending messages to set aside; retrying in a second", args...)
			}
			s.timers(c).SendOnce(spillRetryAfter, c.Self(), &asideRetry{})
			return
		}
		if len(msgs) < asidePage {
			w.through = math.MinInt64 // the last page: done once its writes are answered
		}
		for i := range msgs {
			w.inFlight++
			w.after = max(w.after, msgs[i].Seq)
			w.one(c, &msgs[i], func(c actor.Context) {
				w.inFlight--
				if w.inFlight == 0 {
					s.asideNext(c)
				}
			})
		}
	}
}
