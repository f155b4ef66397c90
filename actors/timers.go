package actors

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"
)

// Timers is the durable reset timer: it fires resets without traffic. Every CheckEvery it pages
// through the open sessions idle since before the latest cutoff any reset policy could have,
// and nudges each one its own policy finds due (ResetDue) — the session itself decides and ends
// at its due time. It reads a page once the sessions nudged from the one before have taken
// their nudges (scanPage). Because the scan reads durable activity times, a reset that fell due while
// the daemon was down happens at the first scan after start.
//
// When pruning is enabled it also asks the persistence actor, every PruneEvery, to delete
// sessions that ended more than PruneAfter ago (the store keeps any whose safety check fails).
// A pass is a chain of steps (Store.PruneStep), each a transaction of at most PrunePolicy.Batch
// rows; while a step spends its budget, the pass asks for the next at once, with the same
// cutoff, so a pass clears the backlog however large it is. Each step is its own request: the
// writes that arrive meanwhile commit between two steps, and SQLite's write lock is never held
// for long. The pass logs one line with its totals; a pass cut short by a stop or a restart of
// the actor (logCutShort), or replaced by a new Prune (prune), logs what it deleted until then.
type Timers struct {
	d      *Deps
	router SessionRouter
	every  time.Duration
	log    *slog.Logger
	timers *scheduler.TimerScheduler
	// stopScan and stopPrune cancel the pending next scan and prune. A pending timer holds the
	// actor system until it fires, which would keep a stopped daemon in memory for up to
	// CheckEvery or PruneEvery (one process may start several: tests, agentgate bench).
	stopScan, stopPrune scheduler.CancelFunc
	// The prune pass in progress: its number (a Prune sent again starts a new pass, and the
	// answers to the steps of the one it replaced end that one), its cutoff, which its later
	// steps keep so that it ends, when it started and what it deleted so far. Passes are
	// numbered on from a random start in each incarnation (NewTimers).
	pass                   uint64
	pruneBefore, passStart time.Time
	sessions, messages     int
	swept                  int // outbox rows of sessions gone, and stale pruned markers (Store.PruneStep)
	// stepping says that the pass in progress waits for the answer to a step: it has not ended.
	// The persistence actor answers steps in order, so no step of an earlier pass waits then.
	stepping bool
	// lastCutoff is the cutoff of the last pass and lastCutoffAt the real time it was taken at
	// (Deps.elapsed); heldBack says that pass's cutoff was held back (pruneCutoff).
	lastCutoff   time.Time
	lastCutoffAt time.Duration
	heldBack     bool
	// pulledBack says that the last PullBack set times (onPulledBack).
	pulledBack bool
	// told holds the sessions the last scan found due: one whose work the reset waits for is
	// due at every scan until the work is done, and is counted in the scan's line only the
	// first time. Each scan replaces it, so it holds no more than the sessions due at once.
	told map[string]struct{}
	// scanning is the scan in progress, nil between two; scans counts them, so that the
	// pages of a scan that a newer one replaced are dropped.
	scanning *scanState
	scans    uint64
	// stopWait ends the wait of the scan in progress for its page's sessions (scanPage).
	stopWait context.CancelFunc
}

// scanState is a scan in progress: it reads the idle sessions a page at a time and nudges the
// due ones, and it reads the next page only once the sessions of this one have taken their
// nudges (scanPage).
type scanState struct {
	n           uint64
	now, cutoff time.Time
	// after is where the next page starts: the last session read.
	afterAt     time.Time
	afterID     string
	idle, daily int
	told        map[string]struct{}
}

// scanNext asks Timers for the next page of scan n; sent once the sessions nudged from the
// last page have taken their nudges (or their answer timed out).
type scanNext struct{ n uint64 }

// Prune asks Timers to prune old ended sessions now (when pruning is enabled).
type Prune struct{}

// CheckResets asks Timers to scan now (also used by tests with an injected clock).
type CheckResets struct{}

// timersBatch is the page size of a scan; a scan reads every page. A page's nudges are in
// flight at once (scanPage): each activates its session, which loads it from the store, and a
// new chat's load waits behind them. Pages of 100 reset 100,000 sessions as fast as nudging
// them all at once did (29 s on two cores); pages of 200 took a seventh longer, with a new
// chat's reply at 80 to 125 ms at the median where 100 gave 22 to 90 ms. A variable so that
// tests can make pages small.
var timersBatch = 100

// scanPageWait bounds how long a scan waits for the sessions of a page to take their nudges
// before it reads the next page.
const scanPageWait = 10 * time.Second

// NewTimers returns the props of the timers actor.
func NewTimers(d *Deps, router SessionRouter, every time.Duration) *actor.Props {
	if every <= 0 {
		every = time.Minute
	}
	return actor.PropsFromProducer(func() actor.Actor {
		// Prune passes are numbered from a random start in each incarnation, not from 1: the
		// late answer to a step of a pass of the instance a restart replaced would be taken
		// for the answer to the new instance's pass of the same number, which then logged its
		// line before it ended and asked for a step beside its own
		// (TestRestartedTimersTakesNoLateStepForItsOwn).
		return &Timers{d: d, router: router, every: every, pass: rand.Uint64()}
	}, dispatchedBy(d.Dispatcher)...)
}

// Receive scans on start and on every tick.
func (t *Timers) Receive(c actor.Context) {
	switch msg := c.Message().(type) {
	case *actor.Started:
		t.log = t.d.Log.With("actor", "timers")
		t.timers = scheduler.NewTimerScheduler(c)
		c.Send(c.Self(), &CheckResets{})
		c.Send(c.Self(), &Prune{})
	case *CheckResets:
		t.scan(c)
	case *scanNext:
		if t.scanning != nil && msg.n == t.scanning.n {
			t.scanPage(c)
		}
	case *Prune:
		t.prune(c)
	case *persistence.Pruned:
		t.onPruned(c, msg)
	case *persistence.PulledBack:
		t.onPulledBack(msg)
	case *actor.Stopping, *actor.Restarting: // a restarted instance starts its own
		cancelTimer(t.stopScan)
		cancelTimer(t.stopPrune)
		t.endWait()
		t.logCutShort(msg)
	}
}

// logCutShort logs the line of the prune pass in progress as this instance stops or restarts
// (a panic), with what its steps deleted so far and why it was cut short (cut_short: stop or
// restart). Before, those totals went with the instance, and no line counted the sessions and
// messages the pass had deleted (TestPrunePassCutShortLogsWhatItDeleted). After a restart,
// the answer to the step still running comes to the new instance, whose own pass counts it
// (onPruned). At a stop, that answer goes to no one: the persistence actor, stopped after
// this one, still runs the step, and Receive may not wait for its answer. So the line says
// step_running=true, and is logged even when the steps before deleted nothing: else a pass
// stopped during its first step left no line for the rows that step deleted.
func (t *Timers) logCutShort(msg any) {
	if _, ok := msg.(*actor.Restarting); ok {
		t.logPass(false, "cut_short", "restart")
		return
	}
	if t.stepping {
		t.logPass(true, "cut_short", "stop", "step_running", true)
		return
	}
	t.logPass(false, "cut_short", "stop")
}

// endWait ends the wait of a scan for its page's sessions, if one waits.
func (t *Timers) endWait() {
	if t.stopWait != nil {
		t.stopWait()
		t.stopWait = nil
	}
}

func (t *Timers) prune(c actor.Context) {
	p := t.d.Config.Prune
	if !p.Enabled {
		return
	}
	if t.stepping {
		// A pass still running (it took longer than PruneEvery, or a test sent a Prune)
		// is replaced: what it deleted so far is told now, cut_short=replaced, and what its
		// running step deletes counts in this pass's line (onPruned).
		t.logPass(false, "cut_short", "replaced")
	}
	// Else, in the instance's first pass, what it counted already is the late answer to the
	// step its old instance's pass had running as it restarted (logCutShort), which this pass's
	// line counts. Logged here, it made a line of its own, with no cutoff or start.
	t.pass++
	t.pruneBefore, t.passStart = t.pruneCutoff(p.After), time.Now()
	t.step(c)
	cancelTimer(t.stopPrune) // a Prune sent before its time (tests) replaces the pending one
	t.stopPrune = t.timers.SendOnce(p.Every, c.Self(), &Prune{})
}

// pruneCutoff is the cutoff of a new pass: the clock less after, but no more than twice the
// real time since the last pass's cutoff after it (and a minute). A wall clock stepped forward
// (an operator's date -s with a wrong year, a bad NTP server, a VM resumed with a stale clock
// that NTP then corrects) moved the cutoff with it at once: a year ahead, every ended session
// was deleted at the next pass, and setting the clock right again brought none of them back.
// Held back, the cutoff catches up at twice the pace of real time; a clock set back moves it
// back. The first pass after a start has no earlier one to go by.
func (t *Timers) pruneCutoff(after time.Duration) time.Time {
	cut, real := t.d.now().Add(-after), t.d.elapsed()
	held := false
	if !t.lastCutoff.IsZero() {
		if most := t.lastCutoff.Add(2*(real-t.lastCutoffAt) + time.Minute); cut.After(most) {
			if !t.heldBack {
				t.log.Warn("the clock moved ahead faster than time passed; pruning deletes only what real time allows and catches up",
					"ahead", cut.Sub(most).Round(time.Second), "ended_before", most.UTC().Format(time.RFC3339))
			}
			cut, held = most, true
		}
	}
	t.lastCutoff, t.lastCutoffAt, t.heldBack = cut, real, held
	return cut
}

// step asks for the next step of the pass.
func (t *Timers) step(c actor.Context) {
	t.stepping = true
	c.Request(t.d.Persist, &persistence.Prune{Before: t.pruneBefore, Rows: t.d.Config.Prune.Batch, Pass: t.pass})
}

// onPruned asks for the next step of the pass when this one spent its budget: more may be due.
// Any other step, or an error (logged by the persistence actor), ends the pass, and the next
// one comes at PruneEvery. The pass logs what it deleted in one line (its steps are at Debug).
//
// The answer to the step a replaced pass had asked for ends that pass; what the step deleted
// counts in the pass that replaced it, whose line comes later (its own steps are answered after
// that one). Before, it was counted nowhere, nor was what the replaced pass had deleted until
// then: a pass that lasted longer than PruneEvery logged less than it deleted.
func (t *Timers) onPruned(c actor.Context, r *persistence.Pruned) {
	t.sessions += r.Sessions
	t.messages += r.Messages
	t.swept += r.Swept
	if r.Pass != t.pass {
		return // of a pass a newer one replaced
	}
	if t.d.Config.Prune.Enabled && r.Err == nil && r.More {
		t.step(c)
		return
	}
	t.stepping = false
	t.logPass(false)
}

// logPass logs the line of the pass, when it deleted anything or always, with args after its
// own, and clears its totals. An instance that began no pass yet counts only the late answer to
// the step its old instance had running as it restarted; cut short before its own first pass
// began (stopped, or restarted again), it logs that with no start or cutoff of its own: before,
// the line said "took" 292 years (since the zero time) and "ended_before" the year 1
// (TestPassLineOfAnInstanceThatBeganNoPass).
func (t *Timers) logPass(always bool, args ...any) {
	if always || t.sessions+t.messages+t.swept > 0 {
		line := []any{"sessions", t.sessions, "messages", t.messages, "outbox_swept", t.swept}
		if !t.passStart.IsZero() {
			line = append(line, "took", time.Since(t.passStart).Round(time.Millisecond),
				"ended_before", t.pruneBefore.UTC().Format(time.RFC3339))
		} else {
			line = append(line, "pass", "before_restart")
		}
		t.log.Info("pruned ended sessions", append(line, args...)...)
	}
	t.sessions, t.messages, t.swept = 0, 0, 0
}

func (t *Timers) scan(c actor.Context) {
	// A CheckResets sent before its time (tests do) replaces the pending scan, and a scan still in progress: the
	// new one reads from the start, and the next is scheduled when it ends (endScan).
	cancelTimer(t.stopScan)
	t.endWait()
	t.scans++
	t.scanning = nil
	now := t.d.now()
	var cutoff time.Time
	for _, p := range t.d.Config.ResetPolicies {
		if cut, ok := p.LatestCutoff(now); ok && cut.After(cutoff) {
			cutoff = cut
		}
	}
	if !cutoff.IsZero() || t.d.Config.Prune.Enabled {
		// Before the prune pass at start too: both messages go the same way.
		c.Request(t.d.Persist, &persistence.PullBack{After: now.Add(clockSlack), To: now})
	}
	if cutoff.IsZero() {
		t.endScan(c, nil, false) // no policy ever resets
		return
	}
	t.scanning = &scanState{n: t.scans, now: now, cutoff: cutoff, told: map[string]struct{}{}}
	t.scanPage(c)
}

// scanPage reads the next page of the scan in progress and nudges each session its policy
// finds due. A nudge activates its session, which loads it from the store to end it, so the
// next page is read only once the last session nudged has taken its nudge (its answer to a
// GetState sent behind it), at most scanPageWait later: a daily reset of 100,000 chats, or the
// first scan after a quiet night, nudged them all at once, and for the half minute the loads
// took a new chat's first reply waited behind them (0.15 to 0.3 s at the median, up to 2.2 s,
// and 0.5 to 1 s, up to 6 s, on a busier machine, where it takes milliseconds). With a page in
// flight at a time, the loads of other chats wait behind at most a page of them.
func (t *Timers) scanPage(c actor.Context) {
	st := t.scanning
	var ss []persistence.Session
	var err error
	if st.afterID == "" {
		ss, err = t.d.Store.IdleSessions(t.d.Ctx, st.cutoff, timersBatch)
	} else {
		ss, err = t.d.Store.IdleSessionsAfter(t.d.Ctx, st.cutoff, st.afterAt, st.afterID, timersBatch)
	}
	if err != nil {
		t.log.Warn("scan for due resets", logging.Err(err))
		t.endScan(c, st, false)
		return
	}
	last := ""
	for _, s := range ss {
		if _, reason, ok := t.d.Config.resetFor(s.Platform, s.ChatType).Overdue(s.LastActivityAt, st.now); ok {
			// With the activity it found: a session in memory whose own copy lies after
			// now takes it (Session.settleActivity).
			t.router.Tell(s.Key, &ResetDue{ActiveAtUnixNano: nanoOfTime(s.LastActivityAt)})
			last = s.Key
			st.told[s.ID] = struct{}{}
			if _, again := t.told[s.ID]; again {
				continue // counted when a scan first found it due; its work holds the reset
			}
			if reason == persistence.EndDaily {
				st.daily++
			} else {
				st.idle++
			}
		}
	}
	if len(ss) < timersBatch {
		t.endScan(c, st, true)
		return
	}
	st.afterAt, st.afterID = ss[len(ss)-1].LastActivityAt, ss[len(ss)-1].ID
	next := &scanNext{n: st.n}
	if last == "" { // nothing nudged: nothing to wait for
		c.Send(c.Self(), next)
		return
	}
	// The session's answer comes once it has taken its nudge, which is in its mailbox ahead
	// of the GetState. The goroutine only waits and sends; it touches neither c nor t.
	ctx, cancel := context.WithTimeout(t.d.Ctx, scanPageWait)
	t.stopWait = cancel
	router, root, self := t.router, c.ActorSystem().Root, c.Self()
	go func() {
		defer cancel()
		_, _ = router.Request(ctx, last, &GetState{}) // an error: go on all the same
		if !errors.Is(ctx.Err(), context.Canceled) {  // not replaced, nor stopped
			root.Send(self, next)
		}
	}()
}

// endScan ends the scan in progress, st (nil when there is none): it logs what st found and,
// when st read every page (whole), st becomes the last scan (told). The next scan comes
// CheckEvery later.
func (t *Timers) endScan(c actor.Context, st *scanState, whole bool) {
	t.scanning = nil
	t.stopWait = nil
	t.stopScan = t.timers.SendOnce(t.every, c.Self(), &CheckResets{})
	if st == nil {
		return
	}
	if whole {
		t.told = st.told
	}
	// One line for the scan, by reason: each session's own reset is at Debug (expire), as a
	// daily reset ends thousands in the same minute.
	if st.idle+st.daily > 0 {
		t.log.Info("sessions due for reset", "idle", st.idle, "daily", st.daily)
	}
}

// clockSlack is how far after now a stored time may be before it counts as one of a clock set
// back since (Store.PullBack, Session.settleActivity): a member of a cluster whose clock runs a little ahead
// writes such times, and they are left alone.
const clockSlack = time.Minute

// Times after now. A clock set back (NTP correcting a clock that ran ahead) leaves the times
// written before the step after now: the stores keep the latest activity of a session (writes
// may commit out of order, and a key's next member must not move its activity back), so a
// session active then kept its activity "in the future", and its resets came that much late,
// a day for a clock a day ahead; a session that ended then was pruned that much late. Treating
// such a time as now where it is read would not help: now moves on with the clock, and the
// session would never fall due before the clock reached its time. So each scan has the store
// set the times after now (and clockSlack) to now (Store.PullBack), once: an open session's
// resets then count from the scan that found it, up to its reset's length late, and an
// ended session's retention from there. A session in memory does the same with its own copy
// (Session.settleActivity).

// onPulledBack logs what a PullBack set to now: at Warn when the one before set nothing, at
// Debug while every scan finds more (a member of a cluster whose clock runs ahead writes them
// at each message).
func (t *Timers) onPulledBack(r *persistence.PulledBack) {
	switch {
	case r.Err != nil: // at Debug: the scan's own read warns of the outage
		t.log.Debug("set back the times after now", logging.Err(r.Err))
		return
	case r.Sessions > 0 && !t.pulledBack:
		t.log.Warn("the clock is behind times the store holds; they are set to now", "sessions", r.Sessions)
	case r.Sessions > 0:
		t.log.Debug("the clock is behind times the store holds; they are set to now", "sessions", r.Sessions)
	}
	t.pulledBack = r.Sessions > 0
}

// cancelTimer cancels a pending timer, if any.
func cancelTimer(cancel scheduler.CancelFunc) {
	if cancel != nil {
		cancel()
	}
}
