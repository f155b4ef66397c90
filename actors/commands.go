package actors

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// command is a parsed slash command.
type command struct {
	name string // without the slash, lower case
	args string
}

// commandHelp lists the commands a session understands, in the order /help shows them.
var commandHelp = []struct{ name, help string }{
	{"new", "end this session and start a fresh one (one nothing was said or set in yet goes on)"},
	{"reset", "same as /new"},
	{"stop", "cancel the running turn and drop queued messages"},
	{"status", "show the session id, queue, running turn and reset policy"},
	{"retry", "run your last message again (the old answer is archived, not deleted)"},
	{"undo", "take back your last message and its answer (archived, not deleted)"},
	{"resume <id|title>", "go back to an earlier session of this chat"},
	{"title <text>", "name this session"},
	{"queue <mode>", "what happens to messages sent while a turn runs: followup, collect, interrupt or steer"},
	{"help", "show this list"},
}

// parseCommand recognises "/word" or "/word args". Text like "/etc/passwd is…" or "/ this" is
// not a command.
func parseCommand(text string) (command, bool) {
	t := strings.TrimSpace(text)
	if len(t) < 2 || t[0] != '/' {
		return command{}, false
	}
	name, args, _ := strings.Cut(t[1:], " ")
	if i := strings.IndexAny(name, "\n\t"); i >= 0 {
		name, args = name[:i], strings.TrimSpace(t[1+i:])
	}
	if name == "" {
		return command{}, false // "/ like this": text, not a command without a name
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_') {
			return command{}, false
		}
	}
	return command{name: strings.ToLower(name), args: strings.TrimSpace(args)}, true
}

// onCommand runs a command outside the queue. The command and its answer are recorded in one
// write; the requester is acknowledged with disposition "command" once that write is durable.
func (s *Session) onCommand(c actor.Context, m *Deliver, src identity.Source, cmd command, now time.Time) {
	switch cmd.name {
	case "new", "reset", "stop":
		// They drop every queued message, those waiting in the store past the cap too (read
		// without their text: stopWork drops them all; /resume reads them once it knows it
		// switches).
		if err := s.unspill(); err != nil {
			s.logger().Warn("a command that drops the queued messages cannot read those waiting in the store; its sender is told to send it again",
				"command", cmd.name, "message_id", m.MessageId, logging.Err(err))
			r := s.result(m, "", s.curID())
			r.ErrorCode, r.Error = "unavailable", "the messages queued in the session could not be read; send the command again"
			c.Respond(r)
			return
		}
	}
	outAfter := s.lastOut         // the command's answer comes after
	dueReset := s.overdueToFile() // filed if the command ends the session and its write is refused
	expired := s.expireIfIdle(now)
	var ops []persistence.Op
	var answer string
	var dropped []*item // messages the command leaves unanswered: its answer answers them too
	queueChanged := false
	switch cmd.name {
	case "new", "reset":
		reason := persistence.EndNewCommand
		if cmd.name == "reset" {
			reason = persistence.EndResetCommand
		}
		if s.fresh() {
			// Ending a session that holds nothing yet (no conversation, no setting of its own)
			// would only start another just as empty: a user typing /new twice built a chain
			// of empty sessions.
			answer = fmt.Sprintf("✨ This session (%s) is new already: nothing has been said in it yet. Your next message starts the conversation.", s.cur.ID)
			break
		}
		var prev string
		ops, prev, dropped = s.boundary(c, src, reason, now)
		answer = fmt.Sprintf("✨ Started a new session (%s).", s.cur.ID)
		if prev != "" {
			answer += " The previous session " + prev + " has ended."
		}
		answer += unanswered(dropped)
	case "stop":
		var cancelled int
		ops, cancelled, dropped = s.stopWork(c)
		switch queued := len(dropped) - cancelled; {
		case len(dropped) == 0:
			answer = "Nothing is running."
		case queued > 0:
			answer = fmt.Sprintf("⏹️ Stopped. Dropped %d queued message(s).", queued)
		default:
			answer = "⏹️ Stopped."
		}
	case "status":
		// Written below, once the session the command is recorded in exists and its activity
		// includes the command (statusText).
	case "retry":
		if len(expired) == 0 && s.running == nil && !s.hasQueued() { // the retry runs next, in order
			if it, rops, ok := s.retry(src, m, now); ok {
				s.enqueueRetry(c, m, it, rops)
				return
			}
		}
		answer = s.cannotRewind("retry", src)
	case "undo":
		var preview string
		if ops, preview = s.undo(src); ops != nil {
			// A message it takes back that a turn's interrupt left for the next answer is
			// answered by this one (a restarted session loads no archived row: it would never be).
			dropped = s.takeInterrupted(ops[0].(*persistence.ArchiveMessages).Seqs)
			answer = "↩️ Took back your last message and its answer (kept in the archive): “" + preview + "”"
		} else {
			answer = s.cannotRewind("undo", src)
		}
	case "title":
		title := identity.NeutraliseName(cmd.args)
		if title == "" || s.cur == nil {
			answer = "Usage: /title <text> (in a session that has started)."
		} else {
			ops = []persistence.Op{&persistence.SetTitle{SessionID: s.cur.ID, Title: title}}
			s.cur.Title = title
			answer = "🏷️ Title set: " + title
		}
	case "queue":
		before := s.mode
		answer = s.setQueueMode(cmd.args)
		queueChanged = s.mode != before
	case "resume":
		ops, answer, dropped = s.resume(c, cmd.args, now)
	case "help":
		answer = helpText()
	default:
		answer = fmt.Sprintf("Unknown command /%s.\n%s", cmd.name, helpText())
	}
	acted := len(ops) > 0 || len(expired) > 0 || queueChanged // memory changed ahead of the write
	// The write adds nothing to the conversation of the session the command leaves current: a
	// /new or /reset behind it still finds that session fresh. A /new's ops end the session
	// before (its running turn and queued messages are that session's); the command's own rows
	// are no conversation. /stop, /undo and /resume change a conversation.
	quiet := len(ops) == 0 || cmd.name == "new" || cmd.name == "reset" || cmd.name == "title"
	ops = append(expired, ops...)
	created := false
	var notice *platforms.Outbound
	var auto *persistence.Session // the session an automatic reset ended, when the command begins its successor
	if s.cur == nil {
		var o []persistence.Op
		o, created, auto = s.ensureIncarnation(src, now)
		ops = append(ops, o...)
		if auto != nil {
			// The command begins the successor of an automatic reset: its user is told first,
			// as a message would have them told, and the first turn gets the note. Before, the
			// notice never came (the next message found the session begun), and the note came
			// only if the session was loaded again before that turn.
			var noticeOps []persistence.Op
			notice, noticeOps = s.afterAutoReset(auto, src, m.MessageId, now)
			ops = append(ops, noticeOps...)
		}
		// Beginning an incarnation changed memory too (the link to the ended session, the
		// route's generation, the reset's note): its write refused, even as a duplicate (a
		// command sent again while its duplicate check could not read the store), the session
		// starts again from the store. Before, memory stayed ahead of it: the next message
		// followed no session, and its user got no reset notice
		// (TestRepeatedCommandFirstAfterAnAutomaticResetLosesNoNotice).
		acted = acted || created
	}
	sid := s.cur.ID
	if queueChanged { // stored with the session (created just above if it is new)
		s.cur.QueueMode = s.mode
		ops = append(ops, &persistence.SetQueueMode{SessionID: sid, Mode: s.mode})
	}
	touch := s.touch(sid, now)
	if cmd.name == "status" {
		answer = s.statusText(now, created, auto)
	}
	s.lastSeq++
	userSeq := s.lastSeq
	s.lastSeq++
	if s.blankOf == sid && s.blankThrough == userSeq-1 {
		s.blankThrough = s.lastSeq // a command's rows are no conversation (fresh)
	}
	ops = append(ops,
		&persistence.AppendMessage{Message: persistence.Message{SessionID: sid, Seq: userSeq, Role: persistence.RoleUser,
			Content: m.Text, Platform: src.Platform, ChatID: src.ChatID, MessageID: m.MessageId,
			UserID: src.UserID, UserName: src.UserName, Status: persistence.StatusDone, CreatedAt: now}}, // not part of the conversation
		&persistence.AppendMessage{Message: persistence.Message{SessionID: sid, Seq: s.lastSeq, Role: persistence.RoleNotice,
			Content: answer, Status: persistence.StatusDone, Active: true, CreatedAt: now}},
		touch)
	// The answer also answers the messages the command dropped (a waiting client gets it), and
	// it refers to the command (a platform references the last message answered).
	inReplyTo := append(messageIDs(dropped), m.MessageId)
	entry := s.outboxEntry(src, sid, platforms.KindNotice, answer, "", inReplyTo, now)
	ops = append(ops, &persistence.AddOutbox{Entry: entry})
	if m.MessageId != "" {
		s.seen.addSum(m.MessageId, contentSum(m))
		s.commandInFlight(m.MessageId)
	}
	s.lastActivity = now
	requester := c.Sender()
	orphaned := func(c actor.Context, why string) {
		for _, p := range append(s.commandLanded(m.MessageId), requester) {
			c.Send(p, s.unstoredResult(m.MessageId, why))
		}
	}
	write := s.writeFor
	if quiet {
		write = s.writeQuietFor
	}
	w := write(c, ops, orphaned, func(c actor.Context, err error) {
		repeats := s.commandLanded(m.MessageId)
		if errors.Is(err, persistence.ErrUnavailable) {
			// Refused as unavailable, but perhaps applied: the commit's answer may have been lost
			// (see outageOutcome). If so, the command acted, and its answer is stored: it is
			// answered as one that was stored. Before, its sender was told it was not, while the
			// session it ended or started went on. An unreadable store counts as not stored.
			if stored, _ := s.storedAt(src, m.MessageId, sid, userSeq); stored {
				s.logger().Warn("a command whose write was refused as unavailable is stored (the commit's answer was lost)",
					"message_id", m.MessageId, "command", cmd.name)
				err = nil
			}
		}
		if err != nil {
			if created && s.cur != nil && s.cur.ID == sid {
				s.cur = nil
			}
			r := s.result(m, "", sid)
			r.SessionId = sessionOf(sid, err)
			restart := restartLevel(err)
			if errorsIsDuplicate(err) {
				r.Disposition = platforms.Duplicate
			} else {
				s.seen.remove(m.MessageId)
				s.logRefusedCommand(err, m.MessageId, cmd.name)
				r.ErrorCode, r.Error = "unavailable", "command could not be stored"
			}
			if (acted || !errorsIsDuplicate(err)) && !s.fencedOut {
				// The session starts again from what is stored: memory changed ahead of the
				// write, or the write may have applied though its answer was lost (a
				// connection lost after COMMIT), and then its answer waits in the outbox, to
				// go out before any later one (the reload sends it, in order).
				r.SessionId = ""
				s.fileReset(dueReset)
				s.restartFromStoreAt(c, restart, "the write of /"+cmd.name+" was refused", err)
			}
			for _, p := range append(repeats, requester) {
				c.Send(p, r)
			}
			return
		}
		s.forgetCopies(dropped)
		r := s.result(m, platforms.Command, sid)
		r.OutboxAfter = outAfter
		c.Send(requester, r)
		for _, p := range repeats {
			c.Send(p, s.result(m, platforms.Duplicate, sid))
		}
		if notice != nil {
			s.sendOutbound(c, notice)
		}
		s.sendOutbound(c, OutboundFromEntry(&entry))
	})
	if dueReset != nil && dueReset.sid != sid {
		// Filed if the session crashes before the write is answered (onRestarting), but only
		// for a command that ended the session: one that left it current (/status, /stop…)
		// touched it, and the crash files its reset with that activity (fileOverdue). Kept by
		// such a command's write too, the reset filed was the first unanswered write's, with
		// the activity before the touch: under a later /new's refused write, the restarted
		// session found the session active since and dropped it
		// (TestOverdueResetOutlivesACrashBeforeACommandThatEndedItIsAnswered, /status then /new).
		w.files = dueReset
	}
}

// commandInFlight notes that the write of the command with message id is in flight: the same id
// delivered again meanwhile (a client's retry) waits for its outcome (repeatCommand). Answered
// "duplicate" at once, as it was, it acknowledged a command whose write could still be refused:
// its sender, told it was taken, never sent it again.
func (s *Session) commandInFlight(id string) {
	r := s.rare()
	if r.commands == nil {
		r.commands = map[string][]*actor.PID{}
	}
	r.commands[id] = nil
}

// repeatCommand files sender to hear the outcome of the command with message id if its write
// is in flight, and reports whether it did.
func (s *Session) repeatCommand(id string, sender *actor.PID) bool {
	if s.unusual == nil || sender == nil {
		return false
	}
	repeats, ok := s.unusual.commands[id]
	if ok {
		s.unusual.commands[id] = append(repeats, sender)
	}
	return ok
}

// commandLanded returns the senders that repeated the command with message id while its write
// was in flight, and forgets the command.
func (s *Session) commandLanded(id string) []*actor.PID {
	if s.unusual == nil {
		return nil
	}
	repeats := s.unusual.commands[id]
	delete(s.unusual.commands, id)
	return repeats
}

// boundary ends the current incarnation with reason and starts a new one. A running turn is
// cancelled and queued messages are dropped (marked failed; see stopWork): a boundary is never
// undone.
func (s *Session) boundary(c actor.Context, src identity.Source, reason string, now time.Time) ([]persistence.Op, string, []*item) {
	ops, _, dropped := s.stopWork(c)
	prev := ""
	if s.cur != nil {
		prev = s.cur.ID
		ops = append(ops, &persistence.EndSession{SessionID: prev, Reason: reason, At: now})
	}
	ops = append(ops, s.newIncarnation(src, now, prev)...)
	// Its predecessor ended by a reset, not automatically: fresh can tell from memory.
	s.blankOf, s.blankThrough = s.cur.ID, 0
	s.mode = s.d.Config.QueueMode // a new session starts with the default queue mode
	return ops, prev, dropped
}

// fresh reports whether the current session holds nothing yet: no setting of its own
// (persistence.Session.HasSettings) and no message of a conversation since it began (commands and their answers are none; an exchange /undo took back, archived,
// no longer counts), no turn running and none waiting. A reset of it (/new, /reset, an operator's) would end it only
// to start another just as empty. A session that succeeded an automatic reset (idle, daily,
// suspended) is not fresh: its first turn is told to continue that one. The store is asked
// only when memory cannot tell (the session holds rows, none of them in its transcript buffer,
// which history_limit 0 keeps empty; or how its predecessor ended); a store that cannot be
// read, or lacks the spooled writes, counts as not fresh. Memory tells of a session a reset
// began in this activation (blankOf). A write in flight counts as
// conversation unless it is a command's that adds none (pendingWrite.quiet): a second /new
// right behind the first, its write still in flight, finds the session the first began fresh.
// Before, it ended that empty session and began another (a chain got a session with no message).
func (s *Session) fresh() bool {
	if s.cur == nil || s.running != nil || s.hasQueued() || len(s.history) > 0 || s.saidInFlight() || s.held() != nil {
		return false // (a write in flight may be a turn's exchange the store does not show yet)
	}
	if s.cur.HasSettings() {
		// Its queue mode or title was set (/queue steer, /title): a reset starts one with the
		// defaults. Before, /queue steer then /new kept the session, in steer mode.
		return false
	}
	if r := s.unusual; r != nil && r.continuity != "" {
		// It succeeded an automatic reset, and its first turn would be told to continue that
		// session: a reset asks for a start afresh (a review's finding).
		return false
	}
	if s.lastSeq == 0 && s.cur.PrevSessionID == "" {
		return true
	}
	if s.blankOf == s.cur.ID && s.lastSeq == s.blankThrough {
		// A reset began it here, and it holds commands and their answers alone since: memory
		// tells what the store would. Before, while writes waited in the spool, it counted as
		// not fresh, and the second of two resets at once ended the session the first began
		// and began another (TestTwoResetsAtOnceWhileSpoolingStartOneSession).
		return true
	}
	if s.d.Spooling.Load() {
		return false
	}
	ctx, cancel := context.WithTimeout(s.d.Ctx, duplicateCheckTimeout)
	defer cancel()
	if s.cur.PrevSessionID != "" {
		// A command that came first after an automatic reset began this one without the note,
		// which a load from the store gives it (restoreContinuity): it is no fresh start either.
		prev, err := s.d.Store.Session(ctx, s.cur.PrevSessionID)
		switch {
		case errors.Is(err, persistence.ErrNotFound): // pruned: no note names it
		case err != nil:
			return false
		case prev.EndReason == persistence.EndIdle, prev.EndReason == persistence.EndDaily, prev.EndReason == persistence.EndSuspended:
			return false
		}
		if s.lastSeq == 0 {
			return true
		}
	}
	said, _, err := s.d.Store.History(ctx, s.cur.ID, 1)
	return err == nil && len(said) == 0
}

// saidInFlight reports whether a write in flight may add to a conversation: any but a command's
// that adds none (pendingWrite.quiet).
func (s *Session) saidInFlight() bool {
	for _, w := range s.inflight {
		if !w.quiet {
			return true
		}
	}
	return false
}

// stopWork cancels the running turn and drops the queued messages. It returns the ops that
// mark them failed (the queued ones archived too, out of the conversation: unrunOps), how many
// were in cancelled turns (the running one, and any cut short by an interrupt and not yet
// answered), and the dropped messages (those first, then the queued ones in order), whose
// senders the caller must tell: nothing is dropped silently. A message whose write is still in
// flight stays queued, marked dropped: it is set aside with a notice of its own when its write
// lands (accepted). One withdrawn whose archive is in flight is marked dropped too: if the store
// refuses the archive, it is set aside, not queued again (onWithdraw).
func (s *Session) stopWork(c actor.Context) (ops []persistence.Op, cancelled int, dropped []*item) {
	if r := s.unusual; r != nil {
		dropped, r.interrupted = r.interrupted, nil // cut short by an interrupt, not answered yet
		ops = s.markCut(dropped)
		for _, it := range r.withdrawals {
			// Queued until its sender deleted it, its archive in flight: were the archive
			// refused, it would be queued again, after this command dropped the queue (onWithdraw).
			it.dropped = true
		}
	}
	cancelled = len(dropped)
	if r := s.running; r != nil {
		s.running = nil
		s.cancelAwaited(c, r)
		s.cutTurnCounted(r, "cancelled")
		for _, it := range append(slices.Clone(r.items), r.steered...) {
			ops = append(ops, &persistence.SetMessageStatus{SessionID: it.sessionID, Seqs: s.seqsOf(it), Status: persistence.StatusFailed, TurnID: r.id})
			dropped = append(dropped, it)
			cancelled++
		}
	}
	var keep []*item
	for _, it := range s.queue {
		if !it.durable {
			it.dropped = true
			keep = append(keep, it)
			continue
		}
		dropped = append(dropped, it)
		ops = append(ops, unrunOps(it.sessionID, s.seqsOf(it)...)...)
	}
	s.queue = keep
	s.updateBusy(c)
	return ops, cancelled, dropped
}

// unrunOps returns the writes that set aside the user message at seq of sessionID, one that
// never ran and never will (a command dropped it, or a notice answers it in place of its
// turn): it is failed, and archived, as /undo archives, so that no later turn reads it as part
// of the conversation, also after a restart or a /resume (a load reads no archived row).
// Before, it stayed active, failed as the message of a turn /stop cancelled is (which stays in
// the conversation), and every reload gave it to the agent
// (TestDroppedMessagesStayOutOfReloadedHistory).
func unrunOps(sessionID string, seqs ...int64) []persistence.Op {
	return []persistence.Op{
		&persistence.SetMessageStatus{SessionID: sessionID, Seqs: seqs, Status: persistence.StatusFailed},
		&persistence.ArchiveMessages{SessionID: sessionID, Seqs: seqs},
	}
}

// takeInterrupted removes from the messages waiting for the next answer after an interrupt
// (rareState.interrupted) those with one of seqs, and returns them.
func (s *Session) takeInterrupted(seqs []int64) []*item {
	u := s.unusual
	if u == nil {
		return nil
	}
	var taken []*item
	u.interrupted = slices.DeleteFunc(u.interrupted, func(it *item) bool {
		if slices.Contains(seqs, it.seq) {
			taken = append(taken, it)
			return true
		}
		return false
	})
	return taken
}

// messageIDs are the platform ids of items, those that have one, in order: what an answer to
// them lists in its in_reply_to.
func messageIDs(items []*item) []string {
	ids := make([]string, 0, len(items)+1)
	for _, it := range items {
		if it.messageID != "" {
			ids = append(ids, it.messageID)
		}
	}
	return ids
}

// unanswered is what a command's answer adds about the messages it dropped.
func unanswered(dropped []*item) string {
	if len(dropped) == 0 {
		return ""
	}
	return fmt.Sprintf(" %d message(s) sent before it were not answered.", len(dropped))
}

// OperatorResetNotice tells the senders of n messages that an operator's reset (the admin API,
// or agentgate sessions reset) left them unanswered.
func OperatorResetNotice(n int) string {
	return fmt.Sprintf("⏹️ The session was reset by an operator; %d message(s) were not answered. Please send them again.", n)
}

// onReset ends the session from the admin API.
func (s *Session) onReset(c actor.Context, m *ResetSession) {
	if s.held() != nil {
		s.refuseWhileHeld(c)
		c.Respond(&ResetResult{ErrorCode: ErrCodeUnavailable, Error: heldRefusal})
		return
	}
	now := s.d.now()
	if s.cur == nil {
		// Its session has ended already (an idle or daily reset, and no message since; or it
		// was pruned): there is nothing to end, and the key's next message starts a new one,
		// as after a reset. Answered as done, with no successor, as the offline reset says
		// "already ended"; the answer names the ended session and how it ended, which the
		// database does not show while the end waits in the spool.
		r := &ResetResult{}
		if p := s.prev; p != nil && !p.EndedAt.IsZero() {
			r.EndedSessionId, r.EndedAtUnixNano, r.EndReason = p.ID, p.EndedAt.UnixNano(), p.EndReason
		}
		c.Respond(r)
		return
	}
	requester := c.Sender()
	orphaned := func(c actor.Context, _ string) {
		c.Send(requester, &ResetResult{ErrorCode: ErrCodeStopped,
			Error: "the session stopped before the reset was confirmed; it may have taken effect: look at the session before resetting it again"})
	}
	retried := m.Retry && s.cur.PrevSessionID != "" && s.begunSince(m.FirstSentAtUnixNano)
	if retried || s.fresh() {
		// The session holds nothing yet (fresh): a reset would end it only to start another
		// just as empty, and an operator who reset a key twice built a chain of empty
		// sessions. Or the cluster router sends the reset again after an attempt that got no
		// answer, and the session began after that attempt was sent (that attempt's reset,
		// as a rule): resetting it again would end the conversation the user started after
		// the reset, dropping its running turn and queued messages (a message that came for
		// the key while its activation was slow is held between the two attempts). Either
		// is answered as the reset, with the session as it is, once the session's earlier
		// writes (a retried attempt's among them) are durable. A fresh session is as fresh
		// as a reset would make it.
		sid, prev, started := s.cur.ID, s.cur.PrevSessionID, s.cur.StartedAt.UnixNano()
		s.writeQuietFor(c, nil, orphaned, func(c actor.Context, err error) {
			r := &ResetResult{SessionId: sid, PreviousSessionId: prev, Kept: !retried, StartedAtUnixNano: started}
			switch {
			case errors.Is(err, persistence.ErrFenced):
				s.handOver(c, m, requester) // the key's owner answers it
				return
			case err != nil:
				r = &ResetResult{ErrorCode: ErrCodeUnavailable, Error: "the reset could not be confirmed: " + err.Error() +
					"; look at the session before you reset it again"}
			case s.stale && !s.routedTo(sid):
				// The write that began the session (the attempt this answers, or a /new) was
				// refused (the session starts again from the store): it is not stored.
				r = &ResetResult{ErrorCode: ErrCodeUnavailable, Error: resetNotStored}
			}
			c.Send(requester, r)
		})
		return
	}
	if err := s.unspill(); err != nil { // the reset drops every queued message
		c.Respond(&ResetResult{Error: err.Error(), ErrorCode: ErrCodeUnavailable})
		return
	}
	reason := m.Reason
	if reason == "" {
		reason = persistence.EndResetCommand
	}
	src := s.sourceOf(s.cur)
	dueReset := s.overdueToFile() // filed if the write is refused
	ops, prev, dropped := s.boundary(c, src, reason, now)
	s.lastActivity = now // the new session's start, not the ended one's last message (/status)
	var notice *persistence.OutboxEntry
	if len(dropped) > 0 {
		// Their senders are told, in their chat, under the session they wrote to.
		entry := s.outboxEntry(dropped[0].src, dropped[0].sessionID, platforms.KindNotice, OperatorResetNotice(len(dropped)), "", messageIDs(dropped), now)
		ops = append(ops, &persistence.AddOutbox{Entry: entry})
		notice = &entry
	}
	sid, started := s.cur.ID, s.cur.StartedAt.UnixNano()
	w := s.writeQuietFor(c, ops, orphaned, func(c actor.Context, err error) { // (ops end the session before)
		r := &ResetResult{SessionId: sid, PreviousSessionId: prev, StartedAtUnixNano: started}
		if errors.Is(err, persistence.ErrUnavailable) && s.routedTo(sid) {
			// Refused as unavailable, but applied: the commit's answer was lost (see
			// outageOutcome). The reset is done.
			s.logger().Warn("an operator's reset whose write was refused as unavailable is stored (the commit's answer was lost)",
				"session_id", sid)
			err = nil
		}
		if errors.Is(err, persistence.ErrFenced) {
			// Another activation owns the key (a cluster moved it): it resets the session.
			s.handOver(c, m, requester)
			return
		}
		if err != nil {
			// The session was reset in memory ahead of the write: it starts again from what
			// is stored, where the reset did not happen (its running turn's message and those
			// queued are pending there, and run again). Before, it went on as the new session
			// the store did not hold, and its dropped messages were neither run nor answered.
			s.logRefusedWrite("store an operator's reset; the operator is told to retry", err, "session_id", sid)
			r = &ResetResult{ErrorCode: ErrCodeUnavailable, Error: resetNotStored}
			if !s.fencedOut {
				s.fileReset(dueReset)
				s.restartFromStore(c, "the write of an operator's reset was refused", err)
			}
		} else {
			s.forgetCopies(dropped)
			if notice != nil {
				s.sendOutbound(c, OutboundFromEntry(notice))
			}
		}
		c.Send(requester, r)
	})
	w.files = dueReset // filed if the session crashes before the write is answered (onRestarting)
}

// routedTo reports whether the store routes the key to session id. A store that cannot be read
// counts as not.
func (s *Session) routedTo(id string) bool {
	ctx, cancel := context.WithTimeout(s.d.Ctx, duplicateCheckTimeout)
	defer cancel()
	route, err := s.d.Store.Route(ctx, s.key)
	return err == nil && route.SessionID == id
}

// resetNotStored answers an operator's reset whose write the store refused.
const resetNotStored = "the reset could not be stored (the database is unavailable): " +
	"the session goes on as the store holds it, most likely not reset; look at it before you retry"

// resetRetrySkew is how much earlier than the first attempt of a retried reset, by this
// member's clock, the session may have begun and still count as begun after it (begunSince):
// that attempt was stamped by the clock of the router's member.
const resetRetrySkew = time.Second

// begunSince reports whether the current session began after sent (unix nanoseconds, 0 when
// not known), the first attempt of a retried reset.
func (s *Session) begunSince(sent int64) bool {
	return sent != 0 && !s.cur.StartedAt.Before(time.Unix(0, sent).Add(-resetRetrySkew))
}

// statusText answers /status in the current session, which the command began if there was none:
// the answer names the session the response's session_id names and the chat's next message
// goes to. Before, a new chat's first /status said "(none yet)" beside that session_id, and
// left out the reset policy its /help promises. began says the command began the session: the
// answer says that it started now, by this command, and, when an automatic reset ended the one
// before (after), when and why. Before, it gave the ended session's last activity beside the
// new session's id, as if the session had been active then (TestStatusAfterAnIdleReset), also
// after the reset of a session nothing was said in, which names no automatic reset
// (TestStatusAfterTheResetOfASilentSession).
func (s *Session) statusText(now time.Time, began bool, after *persistence.Session) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Session %s\nKey: %s\nQueue: %d waiting (mode %s, cap %d)\n", s.cur.ID, s.key, s.waiting(), s.mode, s.d.Config.QueueCap)
	switch {
	case s.running != nil:
		fmt.Fprintf(&b, "Running: turn %s for %s\n", s.running.id, now.Sub(s.running.started).Round(time.Second))
	case s.ending():
		b.WriteString("Running: nothing (a cancelled turn's command is still ending; the next turn waits for it)\n")
	default:
		b.WriteString("Running: nothing\n")
	}
	switch {
	case began && after != nil:
		fmt.Fprintf(&b, "Started: %s, by this command (the previous session, %s, was reset automatically (%s) at %s)\n",
			s.cur.StartedAt.UTC().Format(time.RFC3339), after.ID, after.EndReason, after.EndedAt.UTC().Format(time.RFC3339))
	case began:
		fmt.Fprintf(&b, "Started: %s, by this command\n", s.cur.StartedAt.UTC().Format(time.RFC3339))
	case !s.lastActivity.IsZero():
		fmt.Fprintf(&b, "Last activity: %s\n", s.lastActivity.UTC().Format(time.RFC3339))
	}
	p := s.d.Config.resetFor(s.cur.Platform, s.cur.ChatType)
	if at, _, ok := p.Due(s.cur.LastActivityAt); ok {
		fmt.Fprintf(&b, "Reset policy: %s; next reset %s", p.Mode, at.UTC().Format(time.RFC3339))
	} else {
		b.WriteString("Reset policy: none (only /new or /reset end this session)")
	}
	return b.String()
}

func (s *Session) cannotRewind(what string, src identity.Source) string {
	switch {
	case s.running != nil:
		return "A turn is running; send /stop first, then /" + what + "."
	case what == "retry" && s.hasQueued():
		return "Messages are waiting to run; send /retry once they have."
	case s.lastExchange() >= 0 && s.ownLastExchange(src) < 0:
		return "The last message here is someone else's; /" + what + " takes back only your own, while it is the latest."
	}
	return "Nothing to " + what + " in this session."
}

// setQueueMode sets the session's own queue mode (DESIGN §3); it is stored with the session, so
// it outlives passivation and restarts, and a new session starts with the default. steer needs an
// agent that can take messages into a running turn (the openai agent, an exec agent with steer:
// true); with another, a steer session behaves as followup, its acknowledgments say "queued",
// and the answer says so. Before, it said so for every agent, the ones that steer too.
func (s *Session) setQueueMode(mode string) string {
	switch m := strings.ToLower(mode); m {
	case "":
		return "Queue mode: " + s.mode + ". Usage: /queue followup|collect|interrupt|steer"
	case ModeFollowup:
		s.mode = m
		return "Queue mode set to followup: each message sent while a turn runs gets its own turn, in order."
	case ModeCollect:
		s.mode = m
		return "Queue mode set to collect: messages sent while a turn runs are answered together in the next turn."
	case ModeInterrupt:
		s.mode = m
		return "Queue mode set to interrupt: a new message cancels the running turn and runs next."
	case ModeSteer:
		s.mode = m
		if agents.CanSteer(s.d.Agent) {
			return SteerModeNotice
		}
		return SteerModeQueuedNotice
	}
	return "Unknown queue mode " + mode + ". Modes: followup, collect, interrupt, steer."
}

// The answers to /queue steer: with an agent that can take messages into a running turn, and
// with one that cannot.
const (
	SteerModeNotice       = "Queue mode set to steer: a message you send while your turn runs joins it, and the reply answers both."
	SteerModeQueuedNotice = "Queue mode set to steer. This agent cannot take messages into a running turn, so they are queued as in followup."
)

func helpText() string {
	var b strings.Builder
	b.WriteString("Commands:")
	for _, h := range commandHelp {
		fmt.Fprintf(&b, "\n/%s — %s", h.name, h.help)
	}
	return b.String()
}
