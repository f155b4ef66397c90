package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"
)

// Platform supervises one platforms.Platform: it runs the platform's inbound loop, restarting
// it with capped exponential backoff when it fails, and delivers outbound messages in order per
// session key, confirming each delivery in the outbox. A failed send is retried with backoff
// until it succeeds; one the platform refuses for good is recorded as failed (final).
//
// For a platforms.Editor it also keeps the draft of each session key's running turn (see
// drafts.go): the draft's posts and edits go through the same per-key queue as the outbound
// messages, so the turn's final reply, which finishes the draft, always comes after them.
//
// A panic in Receive restarts the actor with the same state (see platform_crash.go): its queues,
// sends, drafts, marks and Run loop carry on.
type Platform struct {
	d   *Deps
	p   platforms.Platform
	log *slog.Logger

	started  bool        // Started was handled: a later one is a restart
	stopping bool        // the daemon stops: its Quiesce came (see stopDrafts)
	stopped  atomic.Bool // the actor stopped: a new spawn of its props starts afresh
	handling jobRef      // the job of the message being handled (see jobOf)
	strikes  map[jobRef]int

	runCancel context.CancelFunc
	runDone   chan struct{}
	health    *PlatformHealth

	queues   map[string][]*job
	inflight map[string]bool // a send runs, or a retry is held (held)
	held     map[string]bool // the key's retry waits for its retrySendHeld
	attempts map[string]int
	timers   *scheduler.TimerScheduler
	quiesce  []quiesceWait
	sending  int // sends in flight

	marks   marks    // delivery marks waiting for (or in) their write
	records *records // what the platform recorded (platforms.Recorder), not taken yet; nil for none

	drafts        map[string]*draft // by turn id
	oldDraftsRead bool              // removeOldDrafts has read the drafts earlier runs left
	oldDrafts     map[string]bool   // keys whose drafts of earlier runs removeOldDrafts deletes
	liveDraft     map[string]string // session key → turn id of its latest draft
	ended         endedTurns        // turns whose drafts are finished or dropped
}

// recordOps tells the actor that its platform recorded ops (platforms.Recorder): they wait in
// its records.
type recordOps struct{}

// job is one entry of a key's send queue: an outbound message, or a draft post or edit.
type job struct {
	out       *platforms.Outbound
	draftTurn string // set for a draft job: the turn whose draft it posts or edits
	// tries are the delivery attempts of out: the store's count it came with
	// (SendOutbound.Attempts) and each send of it started since. Its mark carries them
	// (MarkDelivery.Attempt, at least 1), so that a mark applied twice (a spool replay of a
	// batch that was committed) counts them once.
	tries int
	// loaded are the tries it came with (SendOutbound.Attempts): a stop that finds tries
	// beyond them records them (markTries).
	loaded int
}

var (
	errNotStarted = errors.New("not started")
	errStopped    = errors.New("stopped")
)

// Send retry policy: a send that may succeed later is retried, with backoff up to
// sendBackoffMax, until it does, while the key's later messages wait behind it (their order is
// kept); one refused for good (platforms.ErrUndeliverable) is recorded as failed at once.
// sendWarnings is how many failed attempts in a row are logged at Warn; after that one in
// sendWarnEvery is.
const (
	sendWarnings    = 5
	sendWarnEvery   = 20
	sendBackoffBase = 500 * time.Millisecond
	sendBackoffMax  = 30 * time.Second
	runBackoffBase  = time.Second
	runBackoffMax   = time.Minute
	sendTimeout     = 30 * time.Second
	// runStopWait bounds how long a stopping platform actor waits for its Run loop to end.
	runStopWait = 10 * time.Second
)

// PlatformHealth is what a platform actor knows about its platform's Run loop: nil while Run
// runs, the error it returned while the loop waits to restart it. Safe for concurrent use.
type PlatformHealth struct{ err atomic.Pointer[error] }

// Err returns why the platform is not running, or nil.
func (h *PlatformHealth) Err() error {
	if e := h.err.Load(); e != nil {
		return *e
	}
	return nil
}

func (h *PlatformHealth) set(err error) {
	if err == nil {
		h.err.Store(nil)
		return
	}
	h.err.Store(&err)
}

// NewPlatform returns the props of the actor that supervises p; health reports its Run loop.
// Spawn them once.
//
// Unlike other actors', its producer does not return fresh state each time: a restart (a panic
// in Receive) calls it again, and gets the state of the incarnation that crashed, which it
// carries on (restarted). Only once the actor stopped does the producer start afresh.
func NewPlatform(d *Deps, p platforms.Platform, health *PlatformHealth) *actor.Props {
	health.set(errNotStarted)
	var mu sync.Mutex
	var cur *Platform
	return actor.PropsFromProducer(func() actor.Actor {
		mu.Lock()
		defer mu.Unlock()
		if cur == nil || cur.stopped.Load() {
			cur = &Platform{d: d, p: p, health: health}
		}
		return cur
	}, d.Mailbox("platform")...)
}

// Receive runs the platform loop and its outbound queues.
func (a *Platform) Receive(c actor.Context) {
	if j, ok := a.jobOf(c.Message()); ok {
		a.handling = j
	}
	switch m := c.Message().(type) {
	case *actor.Started:
		if a.started {
			a.restarted(c)
			break
		}
		a.log = a.d.Log.With("actor", "platform", "platform", a.p.Name())
		a.queues = map[string][]*job{}
		a.drafts = map[string]*draft{}
		a.liveDraft = map[string]string{}
		a.inflight = map[string]bool{}
		a.held = map[string]bool{}
		a.attempts = map[string]int{}
		a.strikes = map[jobRef]int{}
		// The actor context, and so the timers' sender and the PID they send to, is the same
		// across restarts: timers armed before a crash still reach the actor.
		a.timers = scheduler.NewTimerScheduler(c)
		if r, ok := a.p.(platforms.Recorder); ok {
			// Its records go with the delivery marks: in order, and tried again while the
			// store is unavailable. The PID is the same across restarts.
			root, self, recs := c.ActorSystem().Root, c.Self(), &records{}
			a.records = recs
			r.SetRecord(func(ops ...persistence.Op) {
				recs.add(ops)
				root.Send(self, &recordOps{})
			})
		}
		a.removeOldDrafts(c)
		a.started = true
	case *actor.Restarting:
		a.crashed()
	case *oldDraftsFound:
		a.onOldDraftsFound(c, m)
	case *oldDraftsRemoved:
		a.onOldDraftsRemoved(c, m)
	case *StartIntake:
		if w, ok := a.p.(platforms.Withdrawer); ok && m.Withdraw != nil && a.runCancel == nil {
			w.SetWithdraw(m.Withdraw, m.WithdrawStored)
		}
		a.startRun(c, m.Deliver)
	case *SendOutbound:
		k := m.Out.SessionKey
		out := m.Out
		if m.Again {
			if a.holds(out) {
				break // a session that restarted hands its unconfirmed replies over again
			}
			// The platform is told that an earlier send, not this actor's, may have posted it
			// (platforms.Outbound.Again). A copy: the message is the session's.
			again := *out
			again.InReplyTo = slices.Clone(out.InReplyTo)
			again.Again = true
			out = &again
		}
		if d := a.drafts[out.TurnID]; d != nil && d.key == k {
			d.replied = true // its final outbound is queued: it no longer waits for it (finishWait)
		}
		a.queues[k] = append(a.queues[k], &job{out: out, tries: m.Attempts, loaded: m.Attempts})
		a.pump(c, k)
	case *sendDone:
		a.onSent(c, m)
	case *RelayedOutbound:
		if w, ok := a.p.(platforms.Watched); ok {
			w.Show(outboundFromRelay(m))
		}
	case *DraftText:
		a.onDraftText(c, m)
	case *DropDraft:
		a.onDropDraft(c, m)
	case *FinishDraft:
		a.onFinishDraft(c, m)
	case *finishOverdue:
		a.onFinishOverdue(c, m)
	case *draftDone:
		a.onDraftDone(c, m)
	case *draftTick:
		a.onDraftTick(c, m)
	case *Quiesce:
		if m.Key == "" {
			a.stopDrafts(c) // the daemon stops
		}
		a.quiesce = append(a.quiesce, quiesceWait{pid: c.Sender(), key: m.Key})
		a.answerQuiesce(c)
	case *retrySendHeld:
		// One that finds no retry held was released already (its job dropped after a crash):
		// releasing the key again would start a second send that overtakes the one running.
		if a.held[m.key] {
			delete(a.held, m.key)
			a.inflight[m.key] = false
			a.pump(c, m.key)
		}
	case *recordOps:
		for _, op := range a.records.take() {
			a.mark(c, op)
		}
	case *persistence.WriteResult:
		a.onMarksWritten(c, m)
	case *marksTick:
		a.onMarksTick(c, m)
	case *marksRetry:
		a.onMarksRetry(c)
	case *actor.Stopping:
		a.stopped.Store(true)
		cancelTimer(a.marks.stopTick)
		a.marks.paused = false
		a.warnUnsureDrafts()
		a.marks.waiting = append(a.marks.waiting, a.records.take()...)
		a.markTries()
		a.flushMarks(c) // the persistence actor stops after the platforms: it still takes them
		// No re-send tick can reach a stopped actor; a pending one would only hold the actor
		// system until it fired.
		cancelTimer(a.marks.stopTick)
		if a.runCancel != nil {
			a.runCancel()
			select {
			case <-a.runDone:
			case <-time.After(runStopWait):
				a.log.Warn("platform did not stop in time")
			}
		}
		a.writeLateRecords(c)
		a.marks.unacked.Flush() // its lines held back, reported at the stop (logging.Limiter)
	}
	a.handling = jobRef{} // handled without a panic
}

// holds reports whether the actor already has out: queued (or being sent), or sent with its
// delivery mark not yet written. A session that restarts in a running daemon (a crash, a
// reload from the store) hands over every reply its store shows unconfirmed, and these are
// among them: queued again, they reached the user twice.
func (a *Platform) holds(out *platforms.Outbound) bool {
	if out.Seq == 0 {
		return false
	}
	for _, j := range a.queues[out.SessionKey] {
		if j.draftTurn == "" && j.out.Seq == out.Seq {
			return true
		}
	}
	marked := func(ops []persistence.Op) bool {
		return slices.ContainsFunc(ops, func(op persistence.Op) bool {
			d, ok := op.(*persistence.MarkDelivery)
			return ok && d.SessionKey == out.SessionKey && d.Seq == out.Seq
		})
	}
	return marked(a.marks.waiting) || a.marks.inflight != nil && marked(a.marks.inflight.Ops)
}

// startRun starts the platform's Run loop in a goroutine owned by this actor; it exits when
// the actor stops (runCancel), and restarts Run with capped backoff when it fails.
func (a *Platform) startRun(c actor.Context, deliver platforms.Deliver) {
	if a.runCancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(a.d.Ctx)
	a.runCancel, a.runDone = cancel, make(chan struct{})
	p, log, done, health := a.p, a.log, a.runDone, a.health
	go func() {
		defer close(done)
		// However the loop ends (the stop met Run, or its backoff), what a failed Run left to
		// hand on meets the stop before the actor stops: a stop in the backoff let the
		// platform deliver after the runtime was gone, or never (the process exited).
		defer waitInbound(ctx, p)
		backoff := runBackoffBase
		for {
			health.set(nil)
			began := time.Now()
			err := runPlatform(ctx, p, deliver, log)
			if time.Since(began) > runBackoffMax {
				backoff = runBackoffBase // it ran well for a while: this is a new failure, not a streak
			}
			if ctx.Err() != nil {
				health.set(errStopped)
				return
			}
			if err == nil {
				err = errors.New("run returned")
			}
			health.set(fmt.Errorf("restarting after: %w", err))
			log.Warn("platform stopped; restarting", logging.Err(err), "backoff", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, runBackoffMax)
		}
	}()
}

// waitInbound waits, once ctx has ended, for the inbound messages a failed Run of p left to
// hand on (platforms.InboundWaiter), at most runStopWait.
func waitInbound(ctx context.Context, p platforms.Platform) {
	w, ok := p.(platforms.InboundWaiter)
	if !ok {
		return
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runStopWait)
	defer cancel()
	w.WaitInbound(wctx)
}

// pump starts the next send of a key if none is in flight.
func (a *Platform) pump(c actor.Context, key string) {
	q := a.queues[key]
	if a.inflight[key] || len(q) == 0 {
		return
	}
	a.handling = q[0].ref(key) // a panic from here on is this job's
	if q[0].draftTurn != "" {
		a.sendDraft(c, key, q[0].draftTurn)
	} else {
		q[0].out = a.finishesDraft(c, q[0].out)
		q[0].tries++
		out, p, self, root := q[0].out, a.p, c.Self(), c.ActorSystem().Root
		ctx, log := a.d.Ctx, a.log
		go func() {
			sctx, cancel := context.WithTimeout(ctx, sendTimeout)
			defer cancel()
			root.Send(self, &sendDone{out: out, err: sendPlatform(sctx, p, out, log)})
		}()
	}
	// In flight only now that its result is on its way: a panic before would otherwise leave the
	// key held for ever, with nothing to release it (restarted relies on this).
	a.inflight[key] = true
	a.sending++
}

// A panic in a call into the platform on one of the platform actor's goroutines (Send, a
// draft's post or edit, Run) would take the whole process down, and a reply that makes the
// platform panic would crash-loop it, since unconfirmed replies are sent again at the next
// start. So the calls recover: a panic in Send or a draft call is an error the platform refuses
// for good (platforms.ErrUndeliverable: a retry would only panic again), one in Run is Run
// returning an error, which restarts it with backoff.

// sendPlatform is p.Send with a panic turned into an undeliverable error.
func sendPlatform(ctx context.Context, p platforms.Platform, out *platforms.Outbound, log *slog.Logger) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%w: %w", platformPanicked(log, "send", v, "session", out.SessionKey, "seq", out.Seq), platforms.ErrUndeliverable)
		}
	}()
	return p.Send(ctx, out)
}

// runPlatform is p.Run with a panic turned into an error.
func runPlatform(ctx context.Context, p platforms.Platform, deliver platforms.Deliver, log *slog.Logger) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = platformPanicked(log, "run", v)
		}
	}()
	return p.Run(ctx, deliver)
}

// platformPanicked logs a recovered panic of a platform call, with its stack, and returns it as
// an error. Call it from the deferred function that recovered v.
func platformPanicked(log *slog.Logger, call string, v any, attrs ...any) error {
	log.Error("the platform panicked", append(attrs, "call", call, "panic", v, "stack", string(debug.Stack()))...)
	return fmt.Errorf("%s panicked: %v", call, v)
}

func (a *Platform) onSent(c actor.Context, m *sendDone) {
	key := m.out.SessionKey
	a.inflight[key] = false
	a.sending--
	defer a.answerQuiesce(c)
	name := a.p.Name()
	if m.err == nil {
		a.d.Metrics.OutboundTotal.WithLabelValues(name, "ok").Inc()
		a.closeDraft(c, m.out.DraftID) // it shows the final text now
		if _, ok := a.p.(platforms.Watched); ok && a.d.Relay != nil {
			a.d.Relay(name, m.out) // its client may wait on another member
		}
		a.finishHead(c, key, m.out, persistence.DeliveryDelivered)
		return
	}
	a.d.Metrics.OutboundTotal.WithLabelValues(name, "error").Inc()
	if errors.Is(m.err, platforms.ErrUndeliverable) {
		if errors.Is(m.err, platforms.ErrDeleted) {
			// Its chat, its thread or the message it answers was deleted meanwhile (by its
			// users, a moderator): nothing for the operator to do.
			a.log.Info("where a reply was to go was deleted; recorded as failed",
				"session", key, "seq", m.out.Seq, "kind", m.out.Kind, logging.Err(m.err))
		} else {
			a.log.Error("the platform refused the message for good; recorded as failed",
				"session", key, "seq", m.out.Seq, "kind", m.out.Kind, logging.Err(m.err))
		}
		a.finishHead(c, key, m.out, persistence.DeliveryFailed)
		return
	}
	a.attempts[key]++
	n := a.attempts[key]
	backoff := min(sendBackoffBase<<min(n-1, 16), sendBackoffMax)
	if n <= sendWarnings || n%sendWarnEvery == 0 {
		a.log.Warn("send failed; retrying", "session", key, "seq", m.out.Seq, "attempt", n, "backoff", backoff, logging.Err(m.err))
	}
	a.timers.SendOnce(backoff, c.Self(), &retrySendHeld{key: key})
	a.inflight[key], a.held[key] = true, true // hold the queue until the retry
}

// retrySendHeld releases a held queue for its retry.
type retrySendHeld struct{ key string }

func (a *Platform) finishHead(c actor.Context, key string, out *platforms.Outbound, state string) {
	attempt := 1 // (the head is out's job, whose send started)
	if q := a.queues[key]; len(q) > 0 && q[0].draftTurn == "" && q[0].out == out {
		attempt = max(q[0].tries, 1)
	}
	delete(a.attempts, key)
	a.popHead(key)
	a.mark(c, &persistence.MarkDelivery{SessionKey: out.SessionKey, Seq: out.Seq, State: state, At: a.d.now(), Attempt: attempt})
	a.pump(c, key)
}

// popHead removes the head of a key's queue.
func (a *Platform) popHead(key string) {
	q := a.queues[key]
	if len(q) > 0 {
		delete(a.strikes, q[0].ref(key))
		q = q[1:]
	}
	if len(q) == 0 {
		delete(a.queues, key)
		delete(a.inflight, key)
		delete(a.held, key)
	} else {
		a.queues[key] = q
	}
}

// quiesceWait is a Quiesce request waiting for its answer.
type quiesceWait struct {
	pid *actor.PID
	key string
}

// answerQuiesce answers the waiting Quiesce requests that are met: no send in flight and no
// mark unwritten (of their key's session, or of any). Sends waiting for a retry stay in the
// outbox and are re-sent at the next start. A request for one key does not wait for the other
// keys' sends, which under load never all end at once.
func (a *Platform) answerQuiesce(c actor.Context) {
	if len(a.quiesce) == 0 {
		return
	}
	waiting := a.quiesce[:0]
	for _, q := range a.quiesce {
		// (Marks the store refused as unavailable wait for it to come back: a quiesce does
		// not wait for them.)
		quiet := a.sending == 0 && (!a.marks.busy() || a.marks.paused)
		if q.key != "" {
			quiet = !a.inflight[q.key] && len(a.queues[q.key]) == 0 && (!a.marks.holds(q.key) || a.marks.paused)
		}
		switch {
		case !quiet:
			waiting = append(waiting, q)
		case q.pid != nil:
			c.Send(q.pid, &Quiesced{})
		}
	}
	clear(a.quiesce[len(waiting):])
	a.quiesce = waiting
	if len(a.quiesce) == 0 {
		a.quiesce = nil
	}
}
