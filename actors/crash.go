package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// Crash handling of Session. A panic in a session (or in its turn's agent, which escalates)
// restarts the session: the old incarnation notes what was running, the new one reloads
// everything from the store and runs the pending messages again. A message that was running
// during QuarantineAfter crashes is quarantined: kept, marked, and the user told (G5).

// crashLine is the line of a session's crash within its restart budget.
const crashLine = "session crashed; it restarts from the store and runs what was running again"

// onRestarting runs on the failed incarnation, just before it is replaced.
func (s *Session) onRestarting(c actor.Context) {
	life := s.life()
	if life == nil {
		life = &lifeline{}
		s.rare().life = life
		s.d.lifelines.Store(s.key, life) // the next incarnation takes it in start
	}
	life.restarts++
	life.leaving = s.leaving // a restart is no reason to run turns on a leaving member
	// A command that ended the session in memory ahead of its write (a chat's /new, an
	// operator's reset), unanswered still, files the reset that fell due while the old session
	// worked: the write may yet be refused, and the store then holds the old session, with its
	// activity past the due time. Before, only the session current in memory (the new one) was
	// looked at, and the reset was lost if its mark had been refused too
	// (TestOverdueResetOutlivesACrashBeforeACommandThatEndedItIsAnswered). The write may commit
	// instead: the filed reset then names a session no longer current, and the next incarnation
	// drops it (takeFiledReset). A reset of the session current in memory takes its place. So
	// is an automatic reset whose own write is unanswered (writeReset), for the same reason
	// (TestOverdueResetOutlivesACrashBeforeItsOwnWriteIsAnswered).
	s.fileReset(s.filesOfUnanswered())
	s.fileOverdue()
	life.suspects, life.copies = nil, nil
	s.endProbation(c) // the next incarnation asks again if its head is still a suspect
	if s.running != nil {
		// The turn is no child of the session: cancel it here, and have the next incarnation
		// wait for its agent's call to return before it runs the message again. Its draft is
		// marked interrupted now: a message quarantined at its last crash has no rerun whose
		// stream would.
		s.cancelAwaited(c, s.running)
		s.cutTurnCounted(s.running, "crashed")
		for _, it := range s.running.items {
			life.suspects = append(life.suspects, it.seq)
			// And an earlier copy's seq (noteCopy): the next incarnation loads the message
			// from the store, which may hold it under that seq (afterCrash). Counted under
			// the later seq alone, its first crash was lost, it crashed the session once more
			// before its quarantine, past the restart budget, and the key's next activation
			// counted from zero again: 7 crashes, not QuarantineAfter
			// (TestMessageSpooledTwiceThatCrashesItsSessionIsQuarantinedOnce).
			if seq := s.copyOf(it); seq != 0 {
				if life.copies == nil {
					life.copies = map[int64]int64{}
				}
				life.copies[it.seq] = seq
			}
		}
	}
	// Inbound messages whose write is still in flight get an honest answer: we cannot know
	// whether they became durable. A client that retries with the same message id is safe:
	// a durable one is answered as a duplicate.
	s.answerUnstored(c, "session restarted before the message was stored; retry with the same message_id")
	s.answerOrphans(c, "session restarted before the message was stored; retry with the same message_id")
	s.stopHeld() // after answerOrphans, which answers the held writes too: the next incarnation reloads
	// The key stays busy for the manager: the next incarnation reruns what was running, and a
	// drain waits for it (TestDrainWaitsForTheRerunOfACrashedTurn). It says when it is idle.
	life.busy = s.busy
	if u := s.unusual; u != nil {
		life.ending, u.ending = u.ending, nil
	}
	// One line per crash, here, with what it panicked with (its stack is at Debug where the
	// turn's panic is re-raised): the supervisor's "actor failed" of a session is at Debug,
	// and a crash past the restart budget is the manager's line alone (crashedOut), which
	// says the pause. Before, each crash logged two lines and the last one three, nine a
	// pause in a crash loop (TestSessionCrashLogsOneLinePerCrash).
	id := c.Self().Id
	p, _ := s.d.crashPanics.LoadAndDelete(id)
	life.panic, _ = p.(string)
	if _, out := s.d.crashedOut.Load(id); out {
		s.logger().Debug("session crashed past its restart budget; it stops", "panic", life.panic, "restarts", life.restarts, "running", life.suspects)
	} else {
		s.logger().Warn(crashLine, "panic", life.panic, "restarts", life.restarts, "running", life.suspects)
	}
	// The failed incarnation still sees its children terminate before it is replaced; it must
	// act on nothing more.
	s.dead = true
}

// afterCrash runs on the new incarnation after it loaded its state: it counts the crash against
// the messages that were running and quarantines those that reached QuarantineAfter.
func (s *Session) afterCrash(c actor.Context) {
	life := s.life()
	suspects, copies := life.suspects, life.copies
	life.suspects, life.copies = nil, nil
	held := func(seq int64) bool {
		return slices.ContainsFunc(s.queue, func(it *item) bool { return it.seq == seq })
	}
	for _, seq := range suspects {
		if e, ok := copies[seq]; ok {
			// A message whose write was in the spool twice: counted under the seq the store
			// holds it under, which the loaded queue shows, and under both while it shows
			// neither. The replay refused the later copy as a duplicate, and the session
			// numbers its next message with that seq: counted there too, the crash was
			// charged to that message, quarantined a crash early
			// (TestCrashOfACopyIsNotChargedToTheNextMessageOfItsSeq).
			switch {
			case held(e) && !held(seq):
				seq = e
			case !held(seq):
				s.countCrash(c, life, e)
			}
		}
		s.countCrash(c, life, seq)
	}
}

// countCrash counts a crash against the message of seq, and quarantines it once it reaches
// QuarantineAfter.
func (s *Session) countCrash(c actor.Context, life *lifeline, seq int64) {
	if life.crashes == nil {
		life.crashes = map[int64]int{}
	}
	life.crashes[seq]++
	if life.crashes[seq] < QuarantineAfter {
		return
	}
	delete(life.crashes, seq)
	i := slices.IndexFunc(s.queue, func(it *item) bool { return it.seq == seq })
	if i < 0 {
		return
	}
	it := s.queue[i]
	s.queue = slices.Delete(s.queue, i, i+1)
	s.quarantine(c, it)
}

// afterUncleanStops runs whenever the session loads: it quarantines the head of the queue
// while the daemon stopped uncleanly QuarantineAfter times when it was next to run (the store
// counts those stops at start, Store.BeginRun). Such a message may take the whole process down
// (out of memory, a fatal runtime error), which no in-memory count survives; run again at every
// start, it would crash-loop the daemon under a process supervisor. In collect mode the
// messages that merge with it (nextGroup) ran in the same turn and go with it, as the
// in-memory path quarantines every message of the crashed turn. The next message runs.
func (s *Session) afterUncleanStops(c actor.Context) {
	for len(s.queue) > 0 && s.queue[0].restarts >= QuarantineAfter {
		group := slices.Clone(s.nextGroup())
		s.dequeue(len(group))
		n := group[0].restarts
		text := fmt.Sprintf("⚠️ agentgate restarted %d times without stopping cleanly while this message was running (it may crash the whole gateway), so it was set aside (quarantined) and will not be retried unless the gateway's operator runs it again.", n)
		if s.d.Clustered {
			// Its deaths were those of the cluster members that ran it, not restarts of one.
			text = fmt.Sprintf("⚠️ agentgate went down %d times while this message was running (it may crash the whole gateway), so it was set aside (quarantined) and will not be retried unless the gateway's operator runs it again.", n)
		}
		for _, it := range group {
			s.logger().Error("message quarantined after repeated unclean restarts of agentgate",
				"message_id", it.messageID, "restarts", n)
			s.d.Metrics.MessagesQuarantined.WithLabelValues("unclean_restart").Inc()
			s.setAside(c, it, persistence.StatusQuarantined, text)
		}
	}
}

// noticePending answers every message the last run left unanswered with a notice instead of
// running it (sessions.recovery: notice), and marks it failed. The messages at the head of the
// queue, those its next turn would take (and, in queue mode steer, those from the same sender
// behind them, which a running turn takes in), may be those of a turn that was running when
// agentgate stopped (a kill -9, a stop past the drain's deadline): their agent may have begun
// the work. Their notice says so, and the others' that they were not run. Before, every notice
// said "it was not run", and the sender of a message whose agent had side effects sent it again
// and had the work done twice (TestRecoveryNoticeSaysTheHeadMayHaveBeenPartlyRun). A head whose
// turn never began (it waited for an agent slot or its debounce window) is told it may have run
// too: the store marks no turn's start (only a struck head's, MarkProbation, and a strike means
// it may have run at an earlier unclean stop), and a mark for every turn would cost a durable
// commit before each agent starts.
func (s *Session) noticePending(c actor.Context) {
	s.logNoticed()
	if n := s.mayHaveRun(); n > 0 {
		head := slices.Clone(s.queue[:n])
		s.dequeue(n)
		for _, it := range head {
			s.setAside(c, it, persistence.StatusFailed, MayHaveRunNotice)
		}
	}
	s.setAsideQueue(c, s.cur, NotRunNotice)
}

// noticedLine is the line of a session whose pending messages a start answers with a notice
// instead of running them (sessions.recovery: notice).
const noticedLine = "answered the messages the last run left pending with a notice instead of running them (sessions.recovery: notice)"

// logNoticed logs noticedLine for the session, at once and then one a minute for all sessions
// (Deps.recoveryNotices), with how many lines it stands for, and the others at Debug: a start
// after a backlog answers thousands of sessions so. Before, nothing named the messages a start
// set aside: only their notices in the transcripts did (found by a walkthrough).
func (s *Session) logNoticed() {
	sp := s.spilling()
	if len(s.queue) == 0 && sp == nil {
		return
	}
	args := []any{"messages", len(s.queue)}
	if sp != nil {
		args = append(args, "and_stored_beyond_the_queue", true)
	}
	s.d.recoveryNotices.Log(s.logger(), slog.LevelInfo, noticedLine, args...)
}

// mayHaveRun is how many messages at the head of the queue a turn running when the last run
// stopped may have had: the next turn's; with debounce, those its sender sent within the window
// of the one before, by their times of receipt (a recovered message has no arrival time, so
// nextGroup, which merges by it, leaves them out: they were told they were not run, found by a
// review); and in queue mode steer, those from the same sender behind them, up to as many as a
// turn takes in (MaxSteered).
func (s *Session) mayHaveRun() int {
	if len(s.queue) == 0 {
		return 0
	}
	n := len(s.nextGroup())
	if d := s.debounceFor(s.queue[0].src.Platform); d > 0 {
		for n < len(s.queue) {
			prev, it := s.queue[n-1], s.queue[n]
			if it.src.UserID != prev.src.UserID || it.sessionID != prev.sessionID || it.at.Sub(prev.at) > d {
				break
			}
			n++
		}
	}
	if s.mode == ModeSteer {
		last := s.queue[n-1]
		for k := 0; k < MaxSteered && n < len(s.queue) && s.queue[n].src.UserID == last.src.UserID && s.queue[n].sessionID == last.sessionID; k++ {
			n++
		}
	}
	return n
}

// The notices of sessions.recovery: notice (noticePending). MayHaveRunNotice answers a message
// whose agent may have started before agentgate stopped; NotRunNotice one that never ran.
const (
	MayHaveRunNotice = "⚠️ agentgate restarted before it could answer this message, so it was not answered; it may have been partly run before agentgate stopped, and it will not be run again. Check whether it took effect before you send it again."
	NotRunNotice     = "⚠️ agentgate restarted before it could answer this message, so it was not run. Please send it again if it still matters."
)

// quarantine sets a message aside: its row is kept with status quarantined, and the user is
// told it will not be retried.
func (s *Session) quarantine(c actor.Context, it *item) {
	s.logger().Error("message quarantined after repeated crashes", "message_id", it.messageID, "crashes", QuarantineAfter)
	s.d.Metrics.MessagesQuarantined.WithLabelValues("session_crash").Inc()
	s.setAside(c, it, persistence.StatusQuarantined,
		fmt.Sprintf("⚠️ This message crashed the session %d times, so it was set aside (quarantined) and will not be retried unless the gateway's operator runs it again.", QuarantineAfter))
}

// setAside gives a message a final status without running it and tells its sender why. A
// failed one is archived too (unrunOps); a quarantined one stays active, for an operator to
// requeue.
func (s *Session) setAside(c actor.Context, it *item, status, text string) {
	s.setAsideThen(c, it, status, text, nil)
}

// setAsideThen is setAside that calls then, when not nil, once the write is answered.
func (s *Session) setAsideThen(c actor.Context, it *item, status, text string, then func(actor.Context)) {
	now := s.d.now()
	// The notice takes the place of the message's turn: it is the answer that answers the
	// messages an interrupt cut short, as the turn's would have (finish).
	var interrupted []*item
	if u := s.unusual; u != nil {
		interrupted, u.interrupted = u.interrupted, nil
	}
	ops := s.markCut(interrupted)
	if status == persistence.StatusFailed {
		ops = append(ops, unrunOps(it.sessionID, s.seqsOf(it)...)...) // out of the conversation too (and an earlier copy's row: seqsOf)
	} else {
		ops = append(ops, &persistence.SetMessageStatus{SessionID: it.sessionID, Seqs: s.seqsOf(it), Status: status})
	}
	if s.cur != nil && s.cur.ID == it.sessionID {
		s.lastSeq++
		ops = append(ops, &persistence.AppendMessage{Message: persistence.Message{SessionID: it.sessionID, Seq: s.lastSeq,
			Role: persistence.RoleNotice, Content: text, Status: persistence.StatusDone, Active: true, CreatedAt: now}})
	}
	ids := append(messageIDs(interrupted), it.messageID)
	entry := s.outboxEntry(it.src, it.sessionID, platforms.KindNotice, text, "", ids, now)
	ops = append(ops, &persistence.AddOutbox{Entry: entry})
	id := it.messageID // (not it: its text need not wait for the write)
	s.write(c, ops, func(c actor.Context, err error) {
		if then != nil {
			defer then(c)
		}
		if err != nil {
			s.logRefusedWrite("store set-aside message", err, "message_id", id, "status", status)
			if !errors.Is(err, persistence.ErrFenced) && !s.fencedOut {
				// Nothing of it is stored: the message is still pending, and the notice would
				// be one the store does not hold (and the next activation answers the message
				// again). The session starts again from the store.
				s.restartFromStore(c, "a message set aside was not stored", err)
			}
			return // fenced: the key's new owner answers the message
		}
		s.forgetCopy(id)
		s.forgetCopies(interrupted)
		s.sendOutbound(c, OutboundFromEntry(&entry))
	})
}

// leftBehindNotice answers a message left pending in a session its key has left.
const leftBehindNotice = "⚠️ This message arrived as a command ended or stopped the session's work, so it was not run. Please send it again if it still matters."

// setAsideLeftBehind sets aside, with a notice each, the messages left pending in a session the
// key has left: the routed session when it has ended, or the current session's predecessor.
// Only a current session's pending messages run, and only a current session's make the key
// recoverable, so such a message was never answered. One is left there when a command ends
// the session while the message's write is in flight and the write that sets it aside once it
// lands is refused (the database and the spool failing), or the process dies before that write:
// the session that started again from the store knew nothing of it (found by TestOutageHunt,
// seed 1796189442418889951: TestDroppedMessageWhoseSetAsideIsRefusedIsAnswered). The
// predecessor costs one read of its pending messages (along messages_pending) per activation
// that has one.
func (s *Session) setAsideLeftBehind(c actor.Context, snap *persistence.Snapshot) {
	var sessionID string
	var from *persistence.Session   // whose chat the notices go to
	through := int64(math.MaxInt64) // (a predecessor's last seq is not known; /resume bounds it: asideThrough)
	switch {
	case snap.Session != nil && !snap.Session.EndedAt.IsZero():
		sessionID, from, through = snap.Session.ID, snap.Session, snap.LastSeq
	case s.cur != nil && s.cur.PrevSessionID != "":
		sessionID, from = s.cur.PrevSessionID, s.cur
	default:
		return
	}
	s.setAsideStored(c, &storedAside{sessionID: sessionID, through: through, leftBehind: true, from: from})
}

// leaveBehind sets aside m, a message left pending in a session the key has left
// (setAsideLeftBehind), and calls then once its write is answered.
func (s *Session) leaveBehind(c actor.Context, from *persistence.Session, m *persistence.Message, then func(actor.Context)) {
	src := s.sourceOf(from)
	src.UserID, src.UserName = m.UserID, m.UserName
	entry := s.outboxEntry(src, m.SessionID, platforms.KindNotice, leftBehindNotice, "", []string{m.MessageID}, s.d.now())
	ops := append(unrunOps(m.SessionID, m.Seq), &persistence.AddOutbox{Entry: entry})
	id := m.MessageID
	s.write(c, ops, func(c actor.Context, err error) {
		defer then(c)
		if err != nil {
			s.logRefusedWrite("store set-aside message", err, "message_id", id, "status", persistence.StatusFailed)
			if !errors.Is(err, persistence.ErrFenced) && !s.fencedOut {
				s.restartFromStore(c, "a message left in a session the key has left was not set aside", err)
			}
			return
		}
		s.sendOutbound(c, OutboundFromEntry(&entry))
	})
}
