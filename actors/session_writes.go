package actors

import (
	"errors"
	"slices"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"
)

// outboxEntry is the outbox entry of one reply or notice to src, with the next outbox seq.
func (s *Session) outboxEntry(src identity.Source, sid, kind, text, turnID string, inReplyTo []string, now time.Time) persistence.OutboxEntry {
	s.lastOut++
	return persistence.OutboxEntry{
		SessionKey: s.key, Seq: s.lastOut, SessionID: sid, Kind: kind, Text: text, TurnID: turnID,
		InReplyTo: inReplyTo, Platform: src.Platform, ChatType: src.ChatType, ChatID: src.ChatID,
		ThreadID: src.ThreadID, UserID: src.UserID, State: persistence.DeliveryPending, CreatedAt: now,
	}
}

// OutboundFromEntry is the platform message for a recorded outbox entry (sent as the end of its
// turn; callers clear TurnEnd when more follows).
func OutboundFromEntry(e *persistence.OutboxEntry) *platforms.Outbound {
	return &platforms.Outbound{
		SessionKey: e.SessionKey, SessionID: e.SessionID, Seq: e.Seq, Kind: e.Kind, Text: e.Text,
		TurnID: e.TurnID, InReplyTo: slices.Clone(e.InReplyTo), CreatedAt: e.CreatedAt, TurnEnd: true,
		Target: identity.Source{Platform: e.Platform, ChatType: e.ChatType, ChatID: e.ChatID, ThreadID: e.ThreadID, UserID: e.UserID},
	}
}

func (s *Session) sendOutbound(c actor.Context, out *platforms.Outbound) {
	if s.fencedOut {
		return // the write behind it was refused, or the new owner sends it
	}
	pid := s.d.Platforms[out.Target.Platform]
	if pid == nil {
		s.logger().Error("no platform for outbound", "platform", out.Target.Platform)
		return
	}
	c.Send(pid, &SendOutbound{Out: out})
}

// write sends ops to the persistence actor and runs done with the result. The session keeps
// the write until it is acknowledged and sends it again if no answer comes (resend).
func (s *Session) write(c actor.Context, ops []persistence.Op, done func(actor.Context, error)) {
	if s.epoch > 0 {
		ops = append([]persistence.Op{&persistence.Fence{Key: s.key, Epoch: s.epoch}}, ops...)
	}
	w := &pendingWrite{write: &persistence.Write{ID: s.d.writeIDs.Add(1), Ops: ops}, done: done, sentAt: s.d.now()}
	s.inflight = append(s.inflight, w)
	c.Request(s.d.Persist, w.write)
	if s.stopResend == nil {
		s.stopResend = s.timers(c).SendOnce(resendAfter, c.Self(), &resendTick{})
	}
}

type pendingWrite struct {
	write  *persistence.Write
	done   func(actor.Context, error)
	sentAt time.Time
}

// resendTick wakes a session to re-send writes that got no answer. It does not count as
// activity for passivation.
type resendTick struct{}

func (s *Session) timers(c actor.Context) *scheduler.TimerScheduler {
	if s.sched == nil {
		s.sched = scheduler.NewTimerScheduler(c)
	}
	return s.sched
}

func (s *Session) resend(c actor.Context) {
	s.stopResend = nil
	if len(s.inflight) == 0 {
		return
	}
	now := s.d.now()
	for _, w := range s.inflight {
		if now.Sub(w.sentAt) >= resendAfter {
			s.logger().Warn("write not acknowledged; sending it again", "write", w.write.ID)
			w.sentAt = now
			c.Request(s.d.Persist, w.write)
		}
	}
	s.stopResend = s.timers(c).SendOnce(resendAfter, c.Self(), &resendTick{})
}

func (s *Session) onWriteResult(c actor.Context, m *persistence.WriteResult) {
	i := slices.IndexFunc(s.inflight, func(w *pendingWrite) bool { return w.write.ID == m.ID })
	if i < 0 {
		return // an answer to a write sent again, already handled
	}
	w := s.inflight[i]
	s.inflight = slices.Delete(s.inflight, i, i+1)
	if len(s.inflight) == 0 {
		s.inflight = nil // an idle session keeps no buffer, and no timer
		if s.stopResend != nil {
			s.stopResend()
			s.stopResend = nil
		}
	}
	if errors.Is(m.Err, persistence.ErrFenced) && !s.fencedOut {
		s.fence(c)
	}
	w.done(c, m.Err)
	s.updateBusy(c)
	s.stopWhenSettled(c)
}

// resendAfter is how long a session waits for a write's acknowledgment before sending it
// again: the persistence actor may have restarted and lost its batch. Writes are idempotent.
const resendAfter = 5 * time.Second
