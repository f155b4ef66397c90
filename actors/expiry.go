package actors

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"
)

// Automatic resets of Session (DESIGN §3, G6). A session's reset policy is evaluated on every
// arrival, when the session starts (also on recovery, from the durable activity time), and when
// the Timers actor finds it due without traffic. An expired session ends at its due time with
// reason idle or daily; the route keeps pointing at it until the next message creates the
// successor, which records prev_session_id, tells the user once, and gives the agent's first
// turn a continuity note. A boundary is never undone.

// resets reports whether the current session has a reset policy, which reads its activity.
func (s *Session) resets() bool {
	if s.cur == nil {
		return false
	}
	_, _, ok := s.d.Config.resetFor(s.cur.Platform, s.cur.ChatType).Due(s.cur.LastActivityAt)
	return ok
}

// settleActivity sets the current session's activity to now when it lies after now by more than
// clockSlack: the clock was set back since (see "Times after now" in timers.go). stored, when
// not zero, is the activity the store holds, as the timers' scan found it (its nudge,
// onResetDue): the scan has set it to now already, at the first scan after the step, and the
// session takes it, so that its reset comes when the store says, not a reset's length later.
func (s *Session) settleActivity(now, stored time.Time) {
	if s.cur == nil || !s.cur.LastActivityAt.After(now.Add(clockSlack)) {
		return
	}
	if stored.IsZero() || stored.After(now.Add(clockSlack)) {
		stored = now
	}
	s.cur.LastActivityAt = stored
	if s.lastActivity.After(stored) {
		s.lastActivity = stored // (/status)
	}
}

// touch returns the op that advances a session's activity, keeping the in-memory copy in step.
func (s *Session) touch(sid string, now time.Time) persistence.Op {
	s.settleActivity(now, time.Time{})
	if s.cur != nil && s.cur.ID == sid && now.After(s.cur.LastActivityAt) {
		s.cur.LastActivityAt = now
	}
	return &persistence.TouchSession{SessionID: sid, At: now}
}

// expire ends the current session if its reset policy says it is due at now, and returns the op
// that records the end at its due time.
func (s *Session) expire(now time.Time) []persistence.Op {
	if s.cur == nil {
		return nil
	}
	s.settleActivity(now, time.Time{})
	p := s.d.Config.resetFor(s.cur.Platform, s.cur.ChatType)
	at, reason, due := p.Overdue(s.cur.LastActivityAt, now)
	if u := s.unusual; u != nil {
		if o := u.overdue; o != nil && o.sid == s.cur.ID {
			at, reason, due = o.at, o.reason, true // it fell due while the session worked
		}
		u.overdue = nil
	}
	if !due {
		return nil
	}
	if at.IsZero() { // no valid activity time: it ended no later than it started
		at = s.cur.StartedAt
		if at.IsZero() {
			at = now
		}
	}
	ended := *s.cur
	ended.EndedAt, ended.EndReason = at, reason
	s.prev, s.cur = &ended, nil
	// The queue mode is the ended session's own (/queue): the next one starts with the default,
	// as after /new (boundary). Before, it stayed in memory: the session the next message or
	// command began ran in the ended one's mode, and /status said so, while the store held none
	// for it (TestAutomaticResetStartsTheNextSessionWithTheDefaultQueueMode).
	s.mode = s.d.Config.QueueMode
	// At Debug: a daily reset ends thousands of sessions in the same minute, whose lines buried
	// everything else at Info. The timers' scan that finds them due counts them there (scan).
	s.logger().Debug("session reset", "reason", reason, "due", at.UTC().Format(time.RFC3339))
	return []persistence.Op{&persistence.EndSession{SessionID: ended.ID, Reason: reason, At: at}}
}

// expireIfIdle is expire for a session with no work in hand. A session whose turn runs, whose
// messages wait, or that holds a turn's result to write again (heldWrites) is in use: ending it
// would cut its turn off from the transcript it belongs to and run its waiting messages in a
// session they were not sent to. A reset that falls due meanwhile is remembered and done, at its
// due time, once the work is done (endOverdue). It is stored on the session too (storeOverdue),
// for a later run or member that loads it before then.
func (s *Session) expireIfIdle(now time.Time) []persistence.Op {
	s.settleActivity(now, time.Time{})
	if s.running != nil || s.hasQueued() || s.held() != nil {
		// Remember that it fell due: the work's own activity would otherwise move the due time
		// on (a daily reset by a whole day). It ends once the work is done (endOverdue).
		if s.cur != nil && (s.unusual == nil || s.unusual.overdue == nil) {
			p := s.d.Config.resetFor(s.cur.Platform, s.cur.ChatType)
			if at, reason, due := p.Overdue(s.cur.LastActivityAt, now); due {
				s.rare().overdue = &overdue{sid: s.cur.ID, at: at, reason: reason}
			}
		}
		return nil
	}
	return s.expire(now)
}

// overdue is a reset that fell due while its session worked.
type overdue struct {
	sid    string
	at     time.Time
	reason string
	// activity is the session's last activity as the reset saw it, in one filed for the key's
	// next activation (writeReset, expireOnStart).
	activity time.Time
	// stored: the session's row holds it (persistence.MarkResetDue), loaded from there or
	// written by this activation (storeOverdue), or its write is in flight, or was refused for
	// what it holds, or waits to be written again (refusals).
	stored bool
	// refusals counts the refusals in a row of its write as unavailable (storeOverdue).
	refusals int
	// retry is the armed overdueRetry after such a refusal; nil when none is armed.
	retry scheduler.CancelFunc
	// early: the try in flight, or the pause after its refusal, began as the store took another
	// write of the session (markOverdueNow), not at an overdueRetry: that pause is waited out.
	early bool
	// triedAtLeave: a refused write was tried once more as the session was about to hand its
	// key on (markOverdueBeforeLeaving).
	triedAtLeave bool
	// toldHandedOn: a refusal's line said the key's next owner writes it (leavingMarkRefusedLine).
	toldHandedOn bool
}

// leavingMarkRefusedLine is the line of a leaving session's reset mark that the store refused as
// unavailable (storeOverdue). The session does the reset itself when its work is done before it
// hands the key on (nothing left queued: endOverdue, then leaveIfIdle), and hands it on with the
// key only when work is left. Before, the line said only the latter, and a leaving session
// whose running turn was its last work said the key's next owner did a reset it then did itself
// (TestLeavingSessionsMarkOutageLineSaysTheKeysNextOwnerWritesIt, nothing queued).
const leavingMarkRefusedLine = "store the session's due reset; the session does the reset once its work is done, or, with work left as it hands its key on, hands it on with the key, and the key's next owner writes it and does the reset"

// storeOverdue stores the reset that fell due while the session works on the session's row
// (persistence.MarkResetDue), once. Receive calls it after each message it handles: the reset
// may have fallen due at the session's start (expireOnStart), at the timer's nudge (onResetDue),
// at a message's arrival, or come filed (takeFiledReset). A later activation that loads the
// session, in the next run or on another member, takes it from there (overdueOf) and does it
// once the work is done, though the work moved the session's activity past the due time.
// Before, it lived in memory only, and a stop of the daemon before the work was done lost it:
// the next start found the session's last activity (the answers) past the due time, and the
// session went on until its next reset, a daily one a day late
// (TestDueResetOutlivesAStopDuringItsBacklog). It is written only when a reset falls due under
// work, never per turn; the session's end (any reset, /new, an operator's) clears it. A write the
// store refuses as unavailable (the database and the spool both failing) is written again, 1 s
// after the refusal, doubling to maxHeldRetry, as a held turn result is (or at once when the
// store takes another write of the session: markOverdueNow), until the store takes it or the
// reset is done (overdueRetry), or, on a member that leaves, until the session hands
// its key on, once more just before (markOverdueBeforeLeaving): the key's next owner then
// writes it. Meanwhile this activation still does the reset
// (endOverdue), or the next one of this process (fileOverdue, writeReset); only a stop of the
// daemon before the store takes it loses it. Before, a refused write was not tried again, and a
// stop at any time before the work was done lost the reset
// (TestRefusedResetDueMarkIsWrittenAgain). A write fenced by another activation's claim of the
// key is not written again: this activation does nothing more (fence), and its line says who
// does the reset: the key's next owner, with the key, when the session was leaving
// (handsOnAtFence), or else the claimer, only if the session's activity it loaded says it is
// due (TestResetMarkFencedWhileTheSessionWorksSaysTheClaimerDecides).
func (s *Session) storeOverdue(c actor.Context) {
	u := s.unusual
	if u == nil || u.overdue == nil || u.overdue.stored || s.cur == nil || u.overdue.sid != s.cur.ID ||
		s.dead || s.fencedOut || s.passivating || s.unloaded {
		return
	}
	o := u.overdue
	o.stored = true
	s.write(c, []persistence.Op{&persistence.MarkResetDue{SessionID: o.sid, Reason: o.reason, At: o.at}}, func(c actor.Context, err error) {
		switch {
		case err == nil:
			o.refusals = 0
		case errors.Is(err, persistence.ErrFenced):
			// This activation does nothing more (fence): the line says who does the reset. Before,
			// it said this one did, once the session's work was done.
			switch {
			case s.handsOnAtFence():
				s.logRefusedWrite("store the session's due reset; another activation claimed the key, and the reset goes with the key to its next owner", err,
					"reason", o.reason)
			case errors.Is(err, errRestarted):
				// Held behind a turn's result the store refused, and given up as the session
				// starts again from the store (restartFromStore), which filed the reset for its
				// next activation: no other activation claimed the key, though the line below,
				// which took it for a claim, said one did (found by the forty-ninth session's
				// review; TestResetMarkGivenUpAtARestartFromTheStoreSaysTheSessionDoesIt).
				s.logger().Warn("store the session's due reset; the session starts again from the store, and does the reset once its work is done",
					"reason", o.reason)
			default:
				s.logRefusedWrite("store the session's due reset; another activation claimed the key, and does the reset only if the session's activity it loaded says it is due", err,
					"reason", o.reason)
			}
		case errors.Is(err, persistence.ErrUnavailable):
			o.refusals++
			switch { // one line an outage (the persistence actor's says what fails), or two:
			case s.leaving && !o.toldHandedOn && (o.refusals == 1 || o.triedAtLeave):
				// A leaving session writes it again only until it does the reset or hands its key
				// on, the last time just before (markOverdueBeforeLeaving); then the key's next
				// owner, which the reset goes to with the key (handOnFiledReset), writes it.
				// Before, the line said this session wrote it until the store took it
				// (TestLeavingSessionsMarkOutageLineSaysTheKeysNextOwnerWritesIt). Said also at
				// the hand-over when the outage's first line, logged before the session began to
				// leave, said that.
				o.toldHandedOn = true
				s.logRefusedWrite(leavingMarkRefusedLine, err, "reason", o.reason)
			case o.refusals == 1:
				s.logRefusedWrite("store the session's due reset; it is written again until the store takes it, and done once the session's work is", err,
					"reason", o.reason)
			}
			wait := min(heldRetry<<min(o.refusals-1, 6), maxHeldRetry)
			o.retry = s.timers(c).SendOnce(wait, c.Self(), &overdueRetry{o: o})
		default:
			s.logRefusedWrite("store the session's due reset; it is done once the session's work is, unless agentgate stops first", err,
				"reason", o.reason)
		}
	})
}

// overdueRetry wakes a session whose write of the due reset o was refused as unavailable, to
// write it again (storeOverdue) unless the reset is done or another took its place.
type overdueRetry struct{ o *overdue }

func (s *Session) onOverdueRetry(m *overdueRetry) {
	if u := s.unusual; u != nil && u.overdue == m.o && m.o.retry != nil {
		m.o.retry, m.o.early = nil, false
		m.o.stored = false // Receive writes it again once this message is handled (storeOverdue)
	}
}

// markOverdueNow writes the due reset's mark again at once, not at the end of its pause, when
// the store has taken another write of the session (onWriteResult) since it refused the mark as
// unavailable: the store takes writes again, and that write, a turn's answer stored after the
// due time, moved the session's activity past it. Until the mark is stored, a stop of the daemon
// with work left (a drain's deadline) loses the reset: the next start finds the activity past
// the due time, and the session goes on until its next reset, a daily one a day late. Before,
// the mark waited out its pause of up to 10 s, and a stop in it lost the reset
// (TestResetDueMarkIsWrittenOnceTheStoreTakesTheSessionsNextWrite). A try so begun that the
// store refuses (room for the answer, not for the mark) waits out its pause, which keeps its
// backoff, as a held turn result's does (onWritesTaken).
func (s *Session) markOverdueNow() {
	u := s.unusual
	if u == nil || u.overdue == nil || u.overdue.retry == nil || u.overdue.early {
		return
	}
	o := u.overdue
	o.retry()
	o.retry, o.early = nil, true
	o.stored = false // Receive writes it again once this message is handled (storeOverdue)
}

// overdueOf is the reset stored on ss (persistence.MarkResetDue), nil when none is.
func overdueOf(ss *persistence.Session) *overdue {
	if ss.ResetDueReason == "" {
		return nil
	}
	return &overdue{sid: ss.ID, at: ss.ResetDueAt, reason: ss.ResetDueReason, stored: true}
}

// endOverdue ends the session whose reset fell due while it worked, once its work is done.
func (s *Session) endOverdue(c actor.Context) {
	if s.unusual == nil || s.unusual.overdue == nil || s.running != nil || s.hasQueued() || s.held() != nil || s.fencedOut || s.passivating {
		return
	}
	s.writeReset(c, s.expire(s.d.now()))
}

// writeReset writes the ops of an automatic reset (expire's), if any. The session takes itself
// for ended as it sends them; if the store refuses them, it is not, so the session starts again
// from the store, and resets it again (expireOnStart) once it takes writes. (Fenced: the key's
// new owner does.) The reset is filed for that (Deps.resetsDue): one that fell due while the
// session worked is due no longer by the session's activity, which its work moved past the due
// time, and the reload forgot it; a daily reset waited for the next day's
// (TestResetDueWhileWritesAreRefusedIsDoneOnceTheyAreTaken). It is filed with the session's
// activity as the reset saw it (expire just ended s.prev), so that it ends no session that was
// active since. Refused behind a turn's result the session holds, the ops wait behind it
// (holdResult); given up with it as the session hands over (errHandedOver), the reset is filed
// too: else the next activation, finding the session due by the activity the store holds, set
// the held result's message aside unanswered, though it had run
// (TestResetHeldBehindAResultGivenUpIsDoneAfterTheRerun). Once the ops are stored, a session
// with nothing else in hand passivates.
func (s *Session) writeReset(c actor.Context, ops []persistence.Op) {
	if len(ops) == 0 {
		return
	}
	var filed *overdue
	if e, ok := ops[0].(*persistence.EndSession); ok && s.prev != nil && s.prev.ID == e.SessionID {
		filed = &overdue{sid: e.SessionID, at: e.At, reason: e.Reason, activity: s.prev.LastActivityAt}
	}
	w := s.write(c, ops, func(c actor.Context, err error) {
		if err == nil {
			s.passivateIfIdle(c)
			return
		}
		s.logRefusedWrite("store session reset", err)
		if filed != nil && (errors.Is(err, errHandedOver) || !errors.Is(err, persistence.ErrFenced) && !s.fencedOut) {
			s.d.resetsDue.Store(s.key, filed)
		}
		if !errors.Is(err, persistence.ErrFenced) && !s.fencedOut {
			s.restartFromStore(c, "the session's reset was not stored", err)
		}
	})
	// Filed too if the session crashes before the write is answered (onRestarting): the write
	// may be refused after the crash, and the restarted session, which loads the session still
	// open, would find its activity past the due time. The session ended in memory, the crash
	// found no reset of its own to file (fileOverdue), and the session went on until its next
	// reset, a daily one a day late (TestOverdueResetOutlivesACrashBeforeItsOwnWriteIsAnswered).
	w.files = filed
}

// autoReset returns the session that ended automatically and that the next incarnation
// succeeds, or nil.
func (s *Session) autoReset() *persistence.Session {
	if s.cur != nil || s.prev == nil || !endedAutomatically(s.prev.EndReason) {
		return nil
	}
	return s.prev
}

// endedAutomatically reports whether a session that ended for reason ended on its own, not by
// anyone's command.
func endedAutomatically(reason string) bool {
	switch reason {
	case persistence.EndIdle, persistence.EndDaily, persistence.EndSuspended:
		return true
	}
	return false
}

// passOverSilent makes the key's next session follow, in place of the ended session it would
// follow, the one that session followed (or none), when an automatic reset ended it with nothing
// said in it: a session a command began (/new, /status on a new chat, an operator's reset) and
// nobody wrote to before it expired. Such a session holds nothing to go back to. Before, the
// next message was told its previous session had been reset and that /resume would go back to
// it, naming the empty one, and its first turn was told to search it
// (TestAutomaticResetOfASilentSessionOffersNoWayBackToIt). The session a command began after an
// automatic reset, and that expired in its turn, so hands on the note and the notice of the one
// before. An automatic reset waits for the session's queued messages, so the store holds
// everything said in it by then, unless the spool holds it still; then, or when the store
// cannot be read, the session is named as before.
func (s *Session) passOverSilent() {
	p := s.prev
	if p == nil || !endedAutomatically(p.EndReason) || s.d.Spooling.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(s.d.Ctx, duplicateCheckTimeout)
	defer cancel()
	if said, _, err := s.d.Store.History(ctx, p.ID, 1); err != nil || len(said) > 0 {
		return
	}
	if p.PrevSessionID == "" {
		s.prev = nil
		return
	}
	before, err := s.d.Store.Session(ctx, p.PrevSessionID)
	switch {
	case errors.Is(err, persistence.ErrNotFound):
		s.prev = nil // pruned: nothing to name
	case err == nil && !before.EndedAt.IsZero():
		s.prev = before
	}
}

// continuityNote is the note the first turn after an automatic reset gets.
func continuityNote(prevID, why string) string {
	return fmt.Sprintf("This conversation continues an earlier session %s, which was reset automatically (%s); search that session before assuming an unrelated one is the right context.", prevID, why)
}

// restoreContinuity rebuilds the continuity note of a session that succeeded an automatic reset
// and has not answered anything yet, when it starts again (after a restart or a crash between
// the reset and its first turn): the note lives in memory until that turn takes it.
func (s *Session) restoreContinuity(history []persistence.Message) {
	if s.cur == nil || s.cur.PrevSessionID == "" {
		return
	}
	for _, m := range history {
		if m.Role == persistence.RoleAssistant {
			return // a turn has run: it had the note
		}
	}
	prev, err := s.d.Store.Session(s.d.Ctx, s.cur.PrevSessionID)
	if errors.Is(err, persistence.ErrNotFound) {
		return // pruned since (its retention passed while the daemon was down): nothing to name
	}
	if err != nil {
		s.logger().Warn("load the previous session for its continuity note", "prev", s.cur.PrevSessionID, logging.Err(err))
		return
	}
	switch prev.EndReason {
	case persistence.EndIdle, persistence.EndDaily, persistence.EndSuspended:
		p := s.d.Config.resetFor(prev.Platform, prev.ChatType)
		s.rare().continuity = continuityNote(prev.ID, describeReset(prev.EndReason, p, quietSince(prev), prev.EndedAt))
	}
}

// quietSince is the last activity of prev, a session ended automatically, from which its idle
// time is told; zero (told as "too long") when it was active after its end: a start that found
// its reset due ran the messages the last run left pending first (expireOnStart), and their
// answers came after the due time. Before, a user who answered such an answer two minutes
// later was told the session was reset for being "inactive for 2m".
func quietSince(prev *persistence.Session) time.Time {
	if !prev.EndedAt.IsZero() && prev.LastActivityAt.After(prev.EndedAt) {
		return time.Time{}
	}
	return prev.LastActivityAt
}

// afterAutoReset prepares the successor of an automatically ended session: the continuity note
// for its first turn and, unless the platform is quiet, a notice that answers messageID.
func (s *Session) afterAutoReset(prev *persistence.Session, src identity.Source, messageID string, now time.Time) (*platforms.Outbound, []persistence.Op) {
	p := s.d.Config.resetFor(prev.Platform, prev.ChatType)
	// The idle time is told up to now, or up to the reset when the clock was set back since
	// (NTP correcting a clock that ran ahead): before, the notice said "inactive for -15m".
	told := now
	if prev.EndedAt.After(told) {
		told = prev.EndedAt
	}
	why := describeReset(prev.EndReason, p, quietSince(prev), told)
	s.rare().continuity = continuityNote(prev.ID, why)
	if !p.Notify {
		return nil, nil
	}
	text := fmt.Sprintf("%s (%s), so this is a fresh one. Send /resume %s to go back to it.", AutoResetNotice, why, prev.ID)
	s.lastSeq++
	sid := s.cur.ID
	entry := s.outboxEntry(src, sid, platforms.KindNotice, text, "", []string{messageID}, now)
	entry.Continued = true // the answer to the message itself follows
	ops := []persistence.Op{
		&persistence.AppendMessage{Message: persistence.Message{SessionID: sid, Seq: s.lastSeq, Role: persistence.RoleNotice,
			Content: text, Status: persistence.StatusDone, Active: true, CreatedAt: now}},
		&persistence.AddOutbox{Entry: entry},
	}
	return OutboundFromEntry(&entry), ops
}

// AutoResetNotice begins the notice that tells a user their session was reset automatically.
// It lists the message that started the new session, whose own answer follows: it is no
// answer to that message.
const AutoResetNotice = "◐ Your previous session was reset automatically"

// expireOnStart applies the reset policy when a session starts, from its durable activity time:
// a session that became due while nobody wrote (or while agentgate was down) is reset, not
// resurrected. So is one whose reset the store refused before (writeReset), unless it was
// active since: in a cluster the key may have moved to another member meanwhile and come back
// days later, and the reset then ended the session at its old due time, before its last
// activity (TestFiledResetEndsNoSessionActiveSince). A session that starts with messages still
// pending is in use, as a live one is (expireIfIdle): they run in the session they were sent
// to, and the reset is done, at its due time, once they are (endOverdue). Before, the session
// ended at once and its pending messages were set aside with "it was not run", though the
// last run had taken them and a live daemon runs them before the reset
// (TestPendingMessagesOfASessionDueAtStartRunBeforeItsReset).
func (s *Session) expireOnStart(c actor.Context) {
	if v, ok := s.d.resetsDue.LoadAndDelete(s.key); ok {
		// Filed as it waited for the session's queued work (by a member that left with it:
		// leaveIfIdle), it waits for that work still.
		s.takeFiledReset(v.(*overdue))
	}
	s.writeReset(c, s.expireIfIdle(s.d.now()))
}

// takeFiledReset makes o, a reset filed for the key's next activation (writeReset, leaveIfIdle),
// the session's overdue reset, and reports whether it did: not when the session it ends is not
// the current one or was active since.
func (s *Session) takeFiledReset(o *overdue) bool {
	if s.cur == nil || o.sid != s.cur.ID || s.cur.LastActivityAt.After(o.activity) {
		return false
	}
	if had := s.rare().overdue; had != nil && had.stored && had.sid == o.sid && had.at.Equal(o.at) && had.reason == o.reason {
		o.stored = true // the session's row holds it already (its load found it)
	}
	s.rare().overdue = o
	return true
}

// onResetDue is the timer's nudge: end the session now if it is due and idle. Once the end is
// stored, the session passivates (writeReset): it has nothing to do until its chat writes
// again (which activates the key anew, with the notice), and the timer's scan activates every
// due session: at a reset of 20,000 chats at once (a daily one, or the first scan after a
// long stop) all 20,000 session actors (92 MB) stayed in memory for a whole passivate_after.
// A nudge that carries a reset filed on another member (handOnFiledReset) has that reset done,
// as the member would have done it: at once if the session is idle, or once its work is done.
func (s *Session) onResetDue(c actor.Context, m *ResetDue) {
	now := s.d.now()
	if o := filedResetOf(m); o != nil {
		s.takeFiledReset(o)
		answerHandedOnReset(c)
	} else {
		s.settleActivity(now, timeOfNano(m.ActiveAtUnixNano))
	}
	s.writeReset(c, s.expireIfIdle(now))
}

// answerHandedOnReset tells the member that handed a filed reset on (handOnFiledReset) that the
// key's session has it: that member sends it again until it is told.
func answerHandedOnReset(c actor.Context) {
	if c.Sender() != nil {
		c.Respond(&ResetDueTaken{})
	}
}

// supersedes reports whether o, a filed reset, takes the place of had, one filed for the same key
// before it: unless had falls due later, or as late with the session's activity later (the
// same reset filed again once work here moved the activity on). A stale one never replaces a
// newer one: a member whose hand-on was taken here, and whose answer was lost, sends it again,
// and that copy could reach the key's session here as it waits to load with a reset of its own
// filed since (a later session's, or this one's after its work here). It took that one's place,
// named a session no longer current or found it active since, and ended nothing: the newer
// reset was lost (TestStaleFiledResetReplacesNoNewerOne). Keeping the one due later loses
// neither: at worst a session that was not active since the earlier one ends at the later.
func (o *overdue) supersedes(had *overdue) bool {
	if !o.at.Equal(had.at) {
		return o.at.After(had.at)
	}
	return !had.activity.After(o.activity)
}

// fileResetUnlessNewer files o for the next activation of key unless a newer reset is filed for
// it (supersedes).
func (d *Deps) fileResetUnlessNewer(key string, o *overdue) {
	for {
		v, loaded := d.resetsDue.LoadOrStore(key, o)
		if !loaded {
			return
		}
		if had := v.(*overdue); !o.supersedes(had) || d.resetsDue.CompareAndSwap(key, had, o) {
			return
		}
	}
}

// filedResetOf is the filed reset a ResetDue carries (handOnFiledReset); nil for the timer's
// nudge.
func filedResetOf(m *ResetDue) *overdue {
	if m.SessionId == "" {
		return nil
	}
	return &overdue{sid: m.SessionId, reason: m.Reason, at: timeOfNano(m.DueAtUnixNano), activity: timeOfNano(m.ActiveAtUnixNano)}
}

// resetDueOf is the ResetDue that hands o, a reset filed for the key's next activation, to the
// member that takes the key over.
func resetDueOf(o *overdue) *ResetDue {
	return &ResetDue{SessionId: o.sid, Reason: o.reason, DueAtUnixNano: nanoOfTime(o.at), ActiveAtUnixNano: nanoOfTime(o.activity)}
}

// nanoOfTime is t in Unix nanoseconds, 0 for the zero time; timeOfNano is its inverse.
func nanoOfTime(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func timeOfNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
