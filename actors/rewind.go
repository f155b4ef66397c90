package actors

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// /undo, /retry and /resume of Session. Rewinding archives rows (active=0, archived=1) and never
// deletes them; /resume reaches only earlier sessions of the same key.

// lastExchange returns the index in the history of the last user message (the exchange is it
// and everything after it), or -1.
func (s *Session) lastExchange() int {
	for i := len(s.history) - 1; i >= 0; i-- {
		if s.history[i].msg.Role == persistence.RoleUser {
			return i
		}
	}
	return -1
}

// ownLastExchange is lastExchange when its message is by the user of src, else -1. In a
// shared session (a thread, a group keyed per chat) /undo and /retry take back only the
// caller's own message, and only while it is the latest: another user's message is theirs,
// and a retry of it would run it under the caller's identity.
func (s *Session) ownLastExchange(src identity.Source) int {
	i := s.lastExchange()
	if i >= 0 && s.history[i].sender != "" && s.history[i].sender != src.UserID {
		return -1
	}
	return i
}

// undo archives the caller's last exchange; nil ops when there is none (or a turn runs).
func (s *Session) undo(src identity.Source) ([]persistence.Op, string) {
	i := s.ownLastExchange(src)
	if s.running != nil || s.cur == nil || i < 0 {
		return nil, ""
	}
	seqs := make([]int64, 0, len(s.history)-i)
	for j := range s.history[i:] {
		seqs = s.history[i+j].seqs(seqs) // and an earlier copy's (histEntry.copy)
	}
	preview := preview(s.history[i].raw)
	s.history = slices.Clone(s.history[:i])
	return []persistence.Op{&persistence.ArchiveMessages{SessionID: s.cur.ID, Seqs: seqs}}, preview
}

// retry archives the caller's last exchange and returns a new item that runs its user text
// again, with the /retry message's id (its row holds the original text).
func (s *Session) retry(src identity.Source, m *Deliver, now time.Time) (*item, []persistence.Op, bool) {
	i := s.ownLastExchange(src)
	if s.cur == nil || i < 0 {
		return nil, nil, false
	}
	text := s.history[i].raw
	ops, _ := s.undo(src)
	s.lastSeq++
	it := &item{seq: s.lastSeq, sessionID: s.cur.ID, src: src, messageID: m.MessageId, text: text, at: now}
	ops = append(ops,
		&persistence.AppendMessage{Message: persistence.Message{SessionID: it.sessionID, Seq: it.seq,
			Role: persistence.RoleUser, Content: text, Platform: src.Platform, ChatID: src.ChatID,
			MessageID: m.MessageId, UserID: src.UserID, UserName: src.UserName,
			Status: persistence.StatusPending, Active: true, CreatedAt: now}},
		s.touch(it.sessionID, now))
	return it, ops, true
}

// enqueueRetry writes the retried message and queues it; the /retry is acknowledged as a command
// once durable, and the retried turn's reply answers it.
func (s *Session) enqueueRetry(c actor.Context, m *Deliver, it *item, ops []persistence.Op) {
	s.queue = append(s.queue, it) // nothing runs or waits: it runs next
	if m.MessageId != "" {
		s.seen.add(m.MessageId)
	}
	requester := c.Sender()
	orphaned := func(c actor.Context, why string) { c.Send(requester, s.unstoredResult(m.MessageId, why)) }
	outAfter := s.lastOut // the retried turn's answer comes after
	s.writeFor(c, ops, orphaned, func(c actor.Context, err error) {
		if err != nil {
			s.answerRepeats(c, it, m, err, false) // the /retry delivered again meanwhile (onDeliver)
			r := s.result(m, platforms.Duplicate, it.sessionID)
			r.OutboxAfter = outAfter
			s.queue = slices.DeleteFunc(s.queue, func(q *item) bool { return q == it })
			if !errorsIsDuplicate(err) {
				s.seen.remove(m.MessageId)
				s.logRefusedWrite("store retry; its sender is told to send it again", err, "message_id", m.MessageId)
				r.Disposition, r.ErrorCode, r.Error = "", "unavailable", "retry could not be stored"
			}
			if !s.fencedOut {
				s.restartFromStore(c, "the write of /retry was refused", err) // its exchange was archived in memory
			}
			c.Send(requester, r)
			s.tryStart(c)
			return
		}
		it.durable = true
		if it.dropped {
			s.setAsideDropped(c, it) // a command stopped the session's work while this write was in flight
		}
		// Start the retried turn before answering, as accepted does: the answer's queue_depth
		// (and its repeats') then counts what waits behind it, not the message that runs.
		s.tryStart(c)
		s.answerRepeats(c, it, m, nil, false) // the /retry delivered again meanwhile (onDeliver)
		r := s.result(m, platforms.Command, it.sessionID)
		r.OutboxAfter = outAfter
		c.Send(requester, r)
	})
}

// resume switches the key to an earlier session of the same key, chosen by id or title. The
// current session ends (reason switched) and the target is reopened: an explicit user action,
// unlike recovery, which never reopens a boundary.
func (s *Session) resume(c actor.Context, arg string, now time.Time) ([]persistence.Op, string, []*item) {
	arg = strings.TrimSpace(arg)
	if arg == "" {
		return nil, "Usage: /resume <session id or title>. /status shows the current session.", nil
	}
	if s.d.Spooling.Load() {
		// The database does not show the writes waiting in the spool: a session reopened from
		// it would give its next rows the seqs of spooled ones, and the replay would set the
		// batch aside, /resume and all.
		return nil, "⚠️ The database is unavailable right now, so earlier sessions cannot be reopened; please try /resume again shortly.", nil
	}
	all, err := s.d.Store.SessionsOfKey(s.d.Ctx, s.key, 100)
	if err != nil {
		s.logger().Warn("list the earlier sessions for /resume; the user is asked to try again", logging.Err(err))
		return nil, "⚠️ Could not look up earlier sessions right now; please try again.", nil
	}
	var target *persistence.Session
	for i := range all {
		if all[i].ID == arg || (all[i].Title != "" && strings.EqualFold(all[i].Title, arg)) {
			target = &all[i]
			break
		}
	}
	switch {
	case target == nil:
		return nil, fmt.Sprintf("No earlier session %q in this chat.", arg), nil
	case s.cur != nil && target.ID == s.cur.ID:
		return nil, "That is the current session.", nil
	}
	// Only what the buffer keeps: a session of months must not be read whole on the actor's
	// goroutine.
	msgs, lastSeq, err := s.d.Store.History(s.d.Ctx, target.ID, s.d.Config.HistoryLimit)
	if err == nil {
		msgs, err = s.withFailureNotices(target.ID, msgs)
	}
	if err != nil {
		s.logger().Warn("load the history of the session to resume; the user is asked to try again", "session_id", target.ID, logging.Err(err))
		return nil, "⚠️ Could not load that session right now; please try again.", nil
	}
	// It drops every queued message, those waiting in the store past the cap too, read without
	// their text: stopWork drops them all.
	if err := s.unspill(); err != nil {
		s.logger().Warn("read the messages queued in the store for /resume, which drops them; the user is asked to try again", logging.Err(err))
		return nil, "⚠️ Could not read the messages queued in this session right now; please try /resume again shortly.", nil
	}
	ops, _, dropped := s.stopWork(c)
	if s.cur != nil {
		ops = append(ops, &persistence.EndSession{SessionID: s.cur.ID, Reason: persistence.EndSwitched, At: now})
	}
	resumed := *target
	resumed.EndedAt, resumed.EndReason = time.Time{}, ""
	s.cur, s.prev = &resumed, nil
	s.mode = s.d.Config.QueueMode
	if resumed.QueueMode != "" {
		s.mode = resumed.QueueMode
	}
	s.lastSeq, s.history = max(lastSeq, s.inflightSeq(resumed.ID), s.refusedSeq(resumed.ID)), nil
	s.asideThrough(resumed.ID, s.lastSeq)
	for _, m := range runOrder(msgs) {
		if m.Role == persistence.RoleUser || m.Role == persistence.RoleAssistant {
			s.history = append(s.history, histEntry{seq: m.Seq, raw: m.Content,
				msg: persistFromRow(m), sender: m.UserID})
		}
	}
	s.trimHistory()
	s.routeGen++
	ops = append(ops,
		&persistence.ReopenSession{SessionID: resumed.ID},
		s.touch(resumed.ID, now), // resuming is activity: the reset clock starts again
		&persistence.PutRoute{Route: persistence.Route{Key: s.key, SessionID: resumed.ID, Generation: s.routeGen, UpdatedAt: now}})
	name := resumed.ID
	if resumed.Title != "" {
		name += " (" + resumed.Title + ")"
	}
	return ops, "⏪ Resumed session " + name + "." + unanswered(dropped), dropped
}

// withFailureNotices adds to msgs, the conversation rows of session sid that History read for
// /resume, the notices of its failed turns, which History leaves out: runOrder places a failed
// message by its turn's notice, as an activation's load, which reads them, does. A message
// whose write was in the spool twice is stored under its first write's seq, before the rows
// that came between its two writes; without its turn's notice a failed one came back there
// at a /resume, ahead of turns that ran before it
// (TestFailedMessageSpooledTwiceKeepsItsPlaceAfterAReload). Only when msgs holds a failed
// message of a turn it holds no answer of does it read the session's rows after that message
// (in pages, keeping the notices of turns alone), and only the notices join msgs.
func (s *Session) withFailureNotices(sid string, msgs []persistence.Message) ([]persistence.Message, error) {
	answered := map[string]bool{}
	for _, m := range msgs {
		if m.Role == persistence.RoleAssistant && m.TurnID != "" {
			answered[m.TurnID] = true
		}
	}
	first := slices.IndexFunc(msgs, func(m persistence.Message) bool {
		return m.Role == persistence.RoleUser && m.Status == persistence.StatusFailed && m.TurnID != "" && !answered[m.TurnID]
	})
	if first < 0 {
		return msgs, nil // nearly every /resume: no failed turn in its window
	}
	var notices []persistence.Message
	for after := msgs[first].Seq; ; {
		page, err := s.d.Store.TranscriptAfter(s.d.Ctx, sid, after, noticePage)
		if err != nil {
			return nil, err
		}
		if len(page) == 0 {
			break
		}
		for _, m := range page {
			if m.Role == persistence.RoleNotice && m.TurnID != "" && m.Active {
				notices = append(notices, m)
			}
		}
		after = page[len(page)-1].Seq
	}
	if len(notices) == 0 {
		return msgs, nil
	}
	out := append(slices.Clone(msgs), notices...)
	slices.SortFunc(out, func(a, b persistence.Message) int { return cmp.Compare(a.Seq, b.Seq) })
	return out, nil
}

// noticePage is how many rows withFailureNotices reads at a time.
const noticePage = 500

// inflightSeq is the highest message seq of session sid among this session's writes not yet
// acknowledged: rows the store does not show yet (appended, or moved there by a requeue). A
// /resume back to the session a command just ended (/new, then /resume at once) numbers its
// rows after them; from the store's last seq alone, its write collided with theirs and was
// refused.
func (s *Session) inflightSeq(sid string) int64 {
	var seq int64
	for _, w := range s.inflight {
		for _, op := range w.ops {
			switch o := op.(type) {
			case *persistence.AppendMessage:
				if o.Message.SessionID == sid {
					seq = max(seq, o.Message.Seq)
				}
			case *persistence.RequeueMessage:
				if o.SessionID == sid {
					seq = max(seq, o.NewSeq)
				}
			}
		}
	}
	return seq
}

// refusedSeq is the highest message seq of session sid among this activation's inbound writes
// refused in a way that may have committed (rememberUnsure) and the earlier copies it remembers
// (noteCopy): rows the store may not show, whose seqs a copy names. A /resume back to sid
// numbers its rows after them: from the store's last seq alone, it gave a refused write's seq
// to the next message, and the message's copy, sent again, named that one's row, which the
// writes that mark or withdraw the copy marked too
// (TestCopyOfAWriteRefusedBeforeAResumeMarksNoOtherMessage).
func (s *Session) refusedSeq(sid string) int64 {
	var seq int64
	if u := s.unusual; u != nil {
		for _, it := range u.unsure {
			if it.sessionID == sid {
				seq = max(seq, it.seq)
			}
		}
		for _, e := range u.copies {
			if e.sessionID == sid {
				seq = max(seq, e.seq)
			}
		}
	}
	return seq
}

// preview shortens text for an answer: one line, at most 200 characters.
func preview(text string) string {
	t := identity.NeutraliseName(text)
	if r := []rune(t); len(r) > 200 {
		t = string(r[:199]) + "…"
	}
	return t
}
