package actors

import (
	"cmp"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"
)

// Held results. A finished turn's result that the store refuses as unavailable (the database
// and the spool both failing: a full or read-only disk) is not given up: the session holds it
// and writes it again, 1 s after the refusal, doubling to maxHeldRetry (each second while the
// daemon stops, and at once when its drain begins: heldWait), or at once when the store takes
// another write (onWritesTaken), until the store takes it; then it
// sends the reply, as it would have. Before, the session started again from the
// store, where the message was still pending, and ran the agent again each time the store
// refused its result: 7 runs a message on a disk full for a minute, each one's tools acting
// on the world again (TestRefusedTurnResultIsKeptNotRunAgain).
//
// The writes the session makes meanwhile wait behind the result and go out after it, one at a
// time, in order, so none lands ahead of it (a command's answer before the reply it follows,
// /new's end of the session before the turn it ends). A message that comes meanwhile waits
// with them, and is refused with the result when the store refuses that again: its sender sends
// it again shortly, as it would on its own refused write. No turn starts until all of them are
// written (a turn that started before the refusal came runs on, and its result waits too). The
// session stays busy (a drain waits for it, within its deadline), does not passivate, and does
// not hand its key on. A write already in flight when the refusal came (sent behind the
// result) is refused with it, so that it cannot commit ahead of it: the store, on a full disk,
// refuses it too as a rule, and the persistence actor refuses it when the store would take it
// (room freed between two batches: persistence.Write). Taken, its outbox entry came ahead of
// the held result's, and an event stream that read it skipped the held reply when that came
// (TestEventStreamSeesAReplyHeldBehindAWriteInFlight). Refused, a turn's result is held too, in
// its place, and so is a write no requester waits for (write: an automatic reset, a set-aside,
// a probation mark, an interrupted turn's mark), as is such a write the store refuses when its
// turn comes among the held writes: it goes out after the result, in its place, and takes
// effect then. Before, such a write had the session start again from the store, which gave up
// the held result, and the held message ran again at the key's next activation, its agent's
// tools acting twice (TestResetBehindAHeldResultWaitsBehindIt,
// TestSetAsideBehindAHeldResultWaitsBehindIt). A session whose automatic reset waits so has
// ended in memory: a message that comes meanwhile is refused at once, before it acts
// (heldEnd), rather than begin the next session. Any other write is refused as it would be on
// its own: a command's, an operator's reset's, and that of a message that begins or resets a
// session have the session start again from the store, which gives up the held result: its
// message runs again, as it did before when the store refused such a write itself (a full
// disk, the common case). If the session stops first (a drain's deadline), the result is lost
// and the message runs again at the next start, as a turn's would whose result was never
// written (at its restart, if it crashes). If it hands over (another activation claimed the
// key, or another write's refusal makes it start again from the store), the held writes are
// answered as refused (errHandedOver): the key's next activation runs the message again, and
// does a held automatic reset once it has (writeReset files it).

// heldWrites are the writes a session holds behind a turn's result the store refused.
type heldWrites struct {
	writes  []*pendingWrite      // in order: writes[0] is in flight, or a refused result waiting to be tried again
	refused int                  // refusals of writes[0] in a row
	retry   scheduler.CancelFunc // the armed heldTick; nil when none is armed
	log     logging.Limiter      // the refusals' line: at once, then at most once a LimitEvery per session
	// early: the try in flight, or the pause after its refusal, began as the store took another
	// write (onWritesTaken), not at a heldTick: that pause is waited out.
	early bool
	// behindLog is log for the refusals of writes other than turn results: an own line, which
	// the results' would hold back.
	behindLog logging.Limiter
}

// first reports whether w is the first of the held writes (h may be nil).
func (h *heldWrites) first(w *pendingWrite) bool {
	return h != nil && len(h.writes) > 0 && h.writes[0] == w
}

// insert puts w among the held writes in its place by id: the order the session made them in.
func (h *heldWrites) insert(w *pendingWrite) {
	at, _ := slices.BinarySearchFunc(h.writes, w.id, func(x *pendingWrite, id uint64) int { return cmp.Compare(x.id, id) })
	h.writes = slices.Insert(h.writes, at, w)
}

// heldTick wakes a session to write again the turn's result it holds.
type heldTick struct{}

// The pause before a held result is written again: heldRetry after its first refusal,
// doubling with each refusal to maxHeldRetry. A try costs one write, not a run of the agent; the
// bound is how long an answer may wait once the disk has room again.
const (
	heldRetry    = time.Second
	maxHeldRetry = 10 * time.Second
)

// heldWait is the pause before the held result, refused refused times in a row, is written
// again (heldRetry doubling to maxHeldRetry), and heldRetry at most once the daemon stops: its
// drain waits for the result, within a deadline a service manager's stop timeout bounds, and
// the store gives no sign that it takes writes again but a write it takes (a lost PostgreSQL
// daemon lock, taken again, is the store's own affair). Before, a drain waited out the
// backoff: a result refused for 15 s was next tried 10 s later, and the stop ended up to that
// long after the store was back (a cluster soak: 7.8 s after PostgreSQL took writes again, on
// the 8th try). A try each second while the daemon stops costs one write per session that
// holds a result, and only until the drain's deadline.
func (s *Session) heldWait(refused int) time.Duration {
	if s.d.Stopping.Load() {
		return heldRetry
	}
	return min(heldRetry<<min(max(refused-1, 0), 6), maxHeldRetry)
}

// drainingNow writes the held result again at once as the daemon's drain begins (draining), and
// the pause before each next try is heldRetry from now on (heldWait): the drain need not wait
// out the rest of a pause of up to maxHeldRetry taken before the stop
// (TestDrainRetriesAHeldResultEachSecond). A result in flight gets its answer; refused, it is
// tried again after heldRetry.
func (s *Session) drainingNow(c actor.Context) {
	h := s.held()
	if h == nil || h.retry == nil {
		return // none held, or the result is in flight and no tick armed: its refusal arms one
	}
	h.retry()
	s.onHeldTick(c)
}

// onWritesTaken writes the held result again at once when the store has taken a write (another
// chat's) since it refused it (persistence.WritesTaken): the store takes writes again, and the
// reply need not wait out the rest of its pause. Before, it did: after an outage of 3-5 s the
// result's pause was up to 10 s, and a reply waited that much more while new turns' writes were
// already taken (TestHeldResultIsWrittenAgainOnceTheStoreTakesAWrite). A try so begun that
// the store refuses (a disk with room for other writes, not for this one) waits out its pause,
// which keeps its backoff: at most one early try per pause, never one per write another chat
// gets through (TestHeldResultKeepsItsBackoffWhileOnlyOtherWritesAreTaken). A result in flight,
// or none held, needs nothing.
func (s *Session) onWritesTaken(c actor.Context) {
	h := s.held()
	if h == nil || h.retry == nil || h.early {
		return
	}
	h.retry()
	h.retry = nil
	h.early = true
	s.retryHeld(c)
}

// errHandedOver answers the writes a session held behind a refused turn result when it hands
// over before they were sent (dropHeld): as refused because another activation owns the key,
// which does their work from the store. errRestarted, which is also errHandedOver, answers them
// when that activation is the session's own next one, as it starts again from the store
// (restartFromStore). Both are persistence.ErrFenced to their callers, but their text says what
// happened: before, it began "session key claimed by a newer activation" in the lines of a
// session that started again from the store, where no activation had claimed the key
// (TestResetHeldBehindAResultGivenUpIsDoneAfterTheRerun).
var (
	errHandedOver = &handOverError{why: "the session handed over"}
	errRestarted  = &handOverError{why: "the session started again from the store"}
)

// handOverError is a held write given up as the session hands over (errHandedOver).
type handOverError struct{ why string }

func (e *handOverError) Error() string {
	return "write given up as " + e.why + ", before it was sent"
}

// Is makes every handOverError errHandedOver and persistence.ErrFenced.
func (e *handOverError) Is(target error) bool {
	return target == errHandedOver || target == persistence.ErrFenced
}

// held returns the writes the session holds behind a refused turn result; nil when it holds none.
func (s *Session) held() *heldWrites {
	if s.unusual == nil {
		return nil
	}
	return s.unusual.held
}

// holdResult holds w, a turn's result the store refused as unavailable, or a write no requester
// waits for (pendingWrite.kept) so refused while the session holds writes, to be written again,
// and reports whether it did. A write of another kind, or one answered otherwise (taken, or
// refused for what it holds, or fenced), is not held; answered as the first of the held writes,
// it makes way for the next (sendHeld, once its own answer is handled).
func (s *Session) holdResult(c actor.Context, w *pendingWrite, err error) bool {
	h := s.held()
	keep := w.turn != "" || w.kept && h != nil
	if !keep || !errors.Is(err, persistence.ErrUnavailable) || errors.Is(err, persistence.ErrFenced) || s.fencedOut {
		if h.first(w) {
			h.writes = h.writes[1:]
			if err == nil && h.refused > 0 && w.turn != "" {
				h.log.Flush() // its refusals held back, reported before the line that ends them
				s.logger().Info("the store took a turn's result it had refused; the reply goes out", "turn", w.turn, "refused", h.refused)
			}
			h.refused = 0
		}
		return false
	}
	if h == nil {
		h = &heldWrites{}
		s.rare().held = h
	}
	if !slices.Contains(h.writes, w) {
		// Sent before the first result was held (a turn that started before its refusal came,
		// or a write sent behind it): it goes back in its place.
		h.insert(w)
	}
	w.refused = true
	if h.writes[0] == w {
		h.refused++
	}
	if w.turn != "" {
		h.log.LogQuiet(s.logger(), slog.LevelWarn, "store turn result; the session keeps it and writes it again, and its next turns wait", "turn", w.turn, logging.Err(err))
	} else {
		h.behindLog.LogQuiet(s.logger(), slog.LevelWarn, "store a write behind a turn result the store refused; the session keeps it and writes it again after that result", logging.Err(err))
	}
	s.refuseBehind(c, err)
	if h.retry == nil {
		h.retry = s.timers(c).SendOnce(s.heldWait(h.refused), c.Self(), &heldTick{})
	}
	return true
}

// refuseBehind refuses with err the inbound messages whose writes wait behind a held result the
// store has just refused again: theirs would be refused too, and their senders, told at once,
// send them again shortly. Waiting, they would wait for the outage to end, past their requests'
// timeouts.
func (s *Session) refuseBehind(c actor.Context, err error) {
	h := s.held()
	var refused []*pendingWrite
	h.writes = slices.DeleteFunc(h.writes, func(w *pendingWrite) bool {
		if w.message && !slices.Contains(s.inflight, w) {
			refused = append(refused, w)
			return true
		}
		return false
	})
	for _, w := range refused {
		w.done(c, err)
	}
}

// heldRefusal is the answer to a command, an operator's reset or a requeue that comes while the
// session holds a turn's result the store refused, and to a message that comes after the
// session ended behind it (heldEnd).
const heldRefusal = "the database refuses writes, and this chat's last answer waits to be stored; send it again shortly"

// refuseWhileHeld is the start of the answer to a command, an operator's reset or a requeue that
// comes while the session holds a refused turn result (or a message: heldEnd): refused at once,
// before it acts, and the result is tried again now. A command acts in memory when it comes
// (/stop cancels the turn, /new starts a session) and only its answer is written; waiting behind
// the result, that answer outlasted the sender's wait (a minute on Discord), who was told to
// send again a command that had acted, and would act twice (found by a review).
func (s *Session) refuseWhileHeld(c actor.Context) {
	s.sendHeld(c)
}

// heldEnd reports whether the session has ended in memory while it holds writes behind a turn's
// result the store refused: an automatic reset decided as the result was written waits behind
// it (holdResult). A message that comes then is refused at once, before it acts, as a command
// is (refuseWhileHeld). It may not run in the session that ended before it came, and the write
// of one that begins the next session would wait behind the held writes for as long as the
// store refuses them, past its sender's wait: it is not refused with the result, as its refusal
// has the session start again from the store, which gives up that result (its message runs
// again).
func (s *Session) heldEnd() bool {
	return s.cur == nil && s.held() != nil
}

// onHeldTick writes again the result the session holds at the end of its pause (retryHeld).
func (s *Session) onHeldTick(c actor.Context) {
	if h := s.held(); h != nil {
		h.retry = nil
		h.early = false
		s.retryHeld(c)
	}
}

// retryHeld writes again the result the session holds, unless it is in flight already, and has
// the drafts of the held results wait for them anew (keepDrafts).
func (s *Session) retryHeld(c actor.Context) {
	if h := s.held(); h != nil {
		s.keepDrafts(c, h)
		s.sendHeld(c)
	}
}

// keepDrafts tells the platform actor again that the turns whose results h holds have ended
// (FinishDraft), which begins their drafts' wait for the reply anew. That wait is bounded
// (finishWait, 30 s) for a session that crashed before its result was written; a result held
// longer had its draft marked interrupted, and its reply, stored later, posted as a message of
// its own (TestHeldResultFinishesItsDraft). A tick comes at most maxHeldRetry after a refusal,
// so each draft hears again well within its wait; one whose session crashed still ends.
func (s *Session) keepDrafts(c actor.Context, h *heldWrites) {
	for _, w := range h.writes {
		if w.turn != "" {
			s.finishDraft(c, w.platform, w.turn)
		}
	}
}

// sendHeld sends the first of the held writes unless it is in flight. With none left, the
// session goes on as usual: its next turn starts.
func (s *Session) sendHeld(c actor.Context) {
	h := s.held()
	if h == nil {
		return
	}
	if !slices.ContainsFunc(h.writes, func(w *pendingWrite) bool { return w.refused }) {
		// The store has taken every write it refused: what is left only waited behind them,
		// and goes out as any write does, in order, at once. Before (found by a review), a
		// set-aside's backlog held so went out one commit at a time, and until its last page
		// no turn started and commands were told the store refused writes.
		s.stopHeld()
		for _, w := range h.writes {
			if !slices.Contains(s.inflight, w) {
				s.sendWrite(c, w)
			}
		}
		s.tryStart(c)
		if s.cur == nil {
			s.passivateIfIdle(c) // an automatic reset's, which declined while writes were held
		}
		return
	}
	if !slices.Contains(s.inflight, h.writes[0]) {
		s.sendWrite(c, h.writes[0])
	}
}

// reportHeldRefusals reports the refusals of the held writes that their lines hold back
// (logging.Limiter.Flush), as the session stops.
func (s *Session) reportHeldRefusals() {
	if h := s.held(); h != nil {
		logging.FlushAll(&h.log, &h.behindLog)
	}
}

// stopHeld forgets the held writes and stops their retry.
func (s *Session) stopHeld() {
	if h := s.held(); h != nil {
		if h.retry != nil {
			h.retry()
		}
		logging.FlushAll(&h.log, &h.behindLog) // their refusals held back, reported as they end
		s.unusual.held = nil
	}
}

// dropHeld gives up the held writes as the session hands over (handOverAll): each not in flight
// is answered as refused (why: errHandedOver or errRestarted); one in flight gets its own answer. Nothing the
// session wrote after a held result reached the store ahead of it (a write in flight when its
// refusal came was refused with it), so a result given up leaves its message pending, and the
// key's next activation runs it again, as the hand-over's line says. Before, an /undo the store
// took ahead of the result had archived the message, which then did not run again, while the
// line said it would; and an /undo whose second application a hand-over cut short left the
// reply of a result stored after it active (TestUndoInFlightBehindARefusedResultIsRefusedWithIt).
func (s *Session) dropHeld(c actor.Context, why *handOverError) {
	h := s.held()
	if h == nil {
		return
	}
	s.stopHeld()
	for _, w := range h.writes {
		if !slices.Contains(s.inflight, w) {
			w.done(c, why)
		}
	}
}

// heldTurns are the turns whose results the session holds, for the line of a session that stops
// with them.
func (s *Session) heldTurns() []string {
	var turns []string
	if h := s.held(); h != nil {
		for _, w := range h.writes {
			if w.turn != "" {
				turns = append(turns, w.turn)
			}
		}
	}
	return turns
}
