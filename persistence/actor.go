package persistence

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"

	"github.com/agentgate/agentgate/internal/logging"
)

// The lines a lasting failure repeats (at every commit, or at every replay tick); they go
// through Actor.repeats. docs/RUNBOOK.md explains each.
const (
	msgSpoolFailed      = "database and spool both failed; writes refused"
	msgSpoolRead        = "cannot read the spool; its writes wait in it and the replay tries again"
	msgSpoolRemove      = "cannot remove a replayed spool batch; the replay stops at it and tries again"
	msgQuarantineFailed = "cannot set a spool batch aside; the replay stops at it and tries again"
	msgReplayWaits      = "database unavailable; the spooled writes wait and the replay tries again"
)

// Spooler keeps writes on disk while the database cannot be written (persistence/spool). It
// belongs to the persistence actor alone.
type Spooler interface {
	// Append stores groups durably as one batch; an error means they are not stored.
	Append(groups [][]Op) (name string, err error)
	// Len is the number of batches waiting.
	Len() int
	// Peek returns the oldest batch behind the one named after ("": the oldest of all; name ""
	// when there is none); an error wrapping ErrCorruptSpool names a batch that can never be
	// decoded.
	Peek(after string) (name string, groups [][]Op, err error)
	// Remove deletes replayed batches, given oldest first.
	Remove(names ...string) error
	// Quarantine sets a batch aside for a human, keeping its data. An error wrapping
	// ErrBatchGone means its file was gone (removed by hand): it left the queue all the same.
	Quarantine(name, reason string) error
}

// ActorOptions configure the persistence actor.
type ActorOptions struct {
	MaxBatch int
	Log      *slog.Logger
	// Observe receives the size and duration of each committed transaction, a spool replay's
	// included (metrics).
	Observe func(groups int, took time.Duration)
	// Spool keeps writes while the database is unavailable; nil answers such writes with the
	// error instead.
	Spool Spooler
	// Spooling is set while the spool holds batches (sessions then stay in memory, since the
	// store does not yet show their writes), from before the replay of a spool the actor finds
	// at its start. May be nil.
	Spooling *atomic.Bool
	// SpoolFiles receives the number of spooled batches whenever it changes, during a replay
	// too (metrics, and the daemon's start barrier).
	SpoolFiles func(n int)
	// ReplayEvery is how often a non-empty spool is replayed (default 1s).
	ReplayEvery time.Duration
	// MaxLinger bounds how long a collected batch may wait for the writers the last commit
	// answered (default DefaultMaxLinger; negative: never wait). See Actor.
	MaxLinger time.Duration
	// Refusals records the writes refused because neither the database nor the spool took
	// them, for /readyz. May be nil.
	Refusals *Refusals
	// WritesRefused receives the number of write groups refused that way (metrics).
	WritesRefused func(groups int)
	// Incarnation counts the actor's restarts: each restart raises it before the new
	// incarnation takes a message. Senders read it to keep their writes in order across a
	// restart (Write.Incarnation). Nil: no write is refused for it.
	Incarnation *atomic.Uint64
}

// DefaultMaxLinger is the default ActorOptions.MaxLinger.
const DefaultMaxLinger = 2 * time.Millisecond

// Group-commit pacing: a batch waits for answered writers for at most lingerShare of the last
// commit's duration, and not at all when that is below minLinger (timers are not that precise,
// and a commit so short costs little to repeat).
const (
	lingerShare = 8
	minLinger   = 100 * time.Microsecond
	// lingerBackoff is how many commits go without lingering after a linger ran out.
	lingerBackoff = 32
)

// Actor is the persistence actor: the only writer of a Store in a process. It batches the
// Writes it receives into one transaction (group commit) and answers each sender once its write
// is durable (or has failed).
//
// Commits run on a committer goroutine the actor owns, one at a time, so the actor keeps
// collecting the next batch while the current one commits (and the commit runs on a long-lived
// stack, not on the mailbox's goroutine of the moment). When a commit ends, the committer
// answers its senders at once (the actor does, after spooling, when the database was
// unavailable) and the actor sends the next batch. That batch holds everything that arrived
// meanwhile, and it waits a little for the writers just answered: until as many writes have arrived as were answered, the
// batch reaches MaxBatch, or lingerShare of the last commit's duration has passed (at most
// MaxLinger). In a closed loop this makes one transaction of all S writers instead of two
// alternating halves (a transaction has a large fixed cost: fsync, WAL pages, an FTS segment);
// a lone writer never waits. When a linger runs out (the writers answered are busy elsewhere,
// as sessions waiting for an agent are), the actor stops lingering for lingerBackoff commits.
// A batch that did not fill up is sent with a flush token, which queues behind the writes
// already in the mailbox, so it takes all of them (at most MaxBatch per transaction).
//
// When the database cannot be written (persistence.ErrUnavailable), the writes go to the spool
// and their senders are answered as durable. From then on every write goes to the spool, in
// order, until a replay has drained it into the database; a batch that fails for good is
// quarantined, never dropped. Only one commit is ever in flight and the spool is decided in
// Receive, so the order of writes is kept.
//
// A restart loses only the batch being collected (and a commit that panicked); its senders
// still hold those writes and send them again. So that a sender's later writes, which may be in
// the mailbox already, do not commit ahead of them, the restart raises ActorOptions.Incarnation,
// and the new incarnation refuses, with ErrResend, a write sent to an earlier one behind
// unacknowledged writes of its sender (see Write). Flush, Prune and stopping wait (in Receive)
// for the commit in flight.
type Actor struct {
	store Store
	ctx   context.Context
	o     ActorOptions

	batch     []pendingWrite // collected, not yet committing
	inflight  *commitJob     // being committed; nil when the committer is idle
	jobs      chan<- *commitJob
	scheduled bool // a flushNow token is queued
	lingering bool // a lingerTick is armed
	waited    bool // the batch being collected has lingered
	lingerOff int  // commits left before lingering is tried again
	replaying bool
	leftover  bool // the spool held batches of the last run at start, not replayed yet
	timers    *scheduler.TimerScheduler
	repeats   lineLimits // the lines a lasting failure would log at every commit or replay tick
	// incarnation is ActorOptions.Incarnation when this incarnation started.
	incarnation uint64
	// alone is how many batches the replay commits one at a time before it builds runs again
	// (see replay).
	alone int
	// refused are the senders answered a write they keep refused as unavailable (Write.Keep)
	// that have sent no write since with nothing unacknowledged before it (Write.After):
	// keepOrder refuses the writes they sent behind it. An entry is a few bytes per session
	// key, and the key's next write with nothing in flight (its next activation's first)
	// removes it.
	refused map[senderID]struct{}
	// waking are the senders answered a write they keep refused as unavailable since the store
	// last took a write: the next write taken tells them (wakeKept).
	waking map[senderID]*actor.PID
	// root sends WritesTaken (wakeKept).
	root *actor.RootContext
	// outage is the outage in which the database and the spool both refuse writes, which
	// the incarnations of the actor share (refusalsEnded).
	outage *outage

	// pacing of the next batch (see Actor)
	answeredAt time.Time
	answered   int // writes the last commit answered
	arrived    int // writes received since then
	lastTook   time.Duration
}

// outage is when the database and the spool began to refuse writes (at; zero while either
// takes them), and how many write groups they refused since (groups): the end of such an
// outage is logged with both (refusalsEnded). It is the one state the incarnations of a
// persistence actor share (NewActor), as Incarnation and Refusals are: a restart during the
// outage (a panic of the actor or of its store, which a full disk makes likelier) forgot it,
// and its end was never logged. Only the incarnation running reads and writes it.
type outage struct {
	at     time.Time
	groups int
}

// senderID names the sender of a Write: a session's PID is the same at each activation of its
// key.
type senderID struct{ address, id string }

type pendingWrite struct {
	sender *actor.PID
	write  *Write
	at     time.Time // arrival
}

// commitJob is one transaction handed to the committer. The committer sets the fields below
// done, then closes done; the actor reads them only after done is closed.
type commitJob struct {
	part   []pendingWrite
	groups [][]Op
	done   chan struct{}

	errs       []error
	took       time.Duration
	answered   bool      // the committer answered the senders
	answeredAt time.Time // when it started to
	panicked   any
}

// committed tells the actor that a commit job has ended.
type committed struct{ job *commitJob }

// lingerTick wakes the actor when a collected batch has waited long enough.
type lingerTick struct{}

// replayTick asks the actor to replay the spool.
type replayTick struct{}

// NewActor returns a producer of persistence actors over store. ctx is the daemon's lifetime
// context, used to derive per-commit contexts.
func NewActor(ctx context.Context, store Store, o ActorOptions) actor.Producer {
	o = o.withDefaults()
	out := &outage{}
	return func() actor.Actor {
		return &Actor{store: store, ctx: ctx, o: o, outage: out}
	}
}

// withDefaults returns o with its zero fields set to their defaults.
func (o ActorOptions) withDefaults() ActorOptions {
	o.MaxBatch = max(o.MaxBatch, 1)
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Observe == nil {
		o.Observe = func(int, time.Duration) {}
	}
	if o.SpoolFiles == nil {
		o.SpoolFiles = func(int) {}
	}
	if o.WritesRefused == nil {
		o.WritesRefused = func(int) {}
	}
	if o.ReplayEvery <= 0 {
		o.ReplayEvery = time.Second
	}
	if o.MaxLinger == 0 {
		o.MaxLinger = DefaultMaxLinger
	}
	return o
}

// Receive handles Write, Flush, PullBack, Prune, StoreRecovered and the internal flush, commit,
// linger and replay tokens.
func (a *Actor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		if a.o.Incarnation != nil {
			a.incarnation = a.o.Incarnation.Load()
		}
		a.timers = scheduler.NewTimerScheduler(c)
		a.root = c.ActorSystem().Root
		a.startCommitter(c)
		if n := a.spoolLen(); n > 0 {
			if a.o.Spooling == nil || !a.o.Spooling.Load() {
				// A new process: the last run stopped (or died) with writes in the spool. The
				// daemon's start waits for this replay while it takes batches out of the spool
				// (its start barrier, supervisor.awaitReplay).
				a.leftover = true
				a.o.Log.Info("writes left in the spool by the last run; replaying them before any session loads", "batches", n)
			}
			// Readers learn of the spool before the replay begins, not once it ends: a start that
			// goes on without waiting for a replay that takes no batch out of the spool (a commit
			// that hangs) loaded sessions from a database without the spooled writes (a reset
			// undone, a message run twice), for the flag was set only after the replay. With it
			// set, a session that must load waits for the spool to drain (actors.Deps.Spooling).
			if a.o.Spooling != nil {
				a.o.Spooling.Store(true)
			}
		}
		a.replay(c)
	case *Write:
		if m.After && a.o.Incarnation != nil && m.Incarnation < a.incarnation {
			// An earlier write of its sender may have been lost with the last incarnation.
			if c.Sender() != nil {
				c.Send(c.Sender(), &WriteResult{ID: m.ID, Err: ErrResend})
			}
			return
		}
		a.batch = append(a.batch, pendingWrite{sender: c.Sender(), write: m, at: time.Now()})
		a.arrived++
		a.pace(c)
	case *flushNow:
		a.scheduled = false
		a.dispatch(c)
	case *committed:
		if m.job == a.inflight { // else it was already finished by a barrier
			a.finish(c)
			a.pace(c)
		}
	case *lingerTick:
		a.lingering = false
		a.pace(c)
	case *replayTick:
		a.replaying = false
		a.replay(c)
	case *StoreRecovered:
		// A cluster member's store refused every write while its daemon lock was lost, and the
		// sessions' held results were woken only at a write taken: a stopping member's retry,
		// once a second, could come after another member had claimed the key, and the result
		// was refused for good (its message ran twice; a cluster soak).
		a.wakeKept()
	case *Flush:
		a.drain(c)
		if c.Sender() != nil {
			c.Respond(&Flushed{})
		}
	case *PullBack:
		a.drain(c)
		if a.spoolLen() > 0 {
			a.replay(c)
		}
		var r PulledBack
		if a.spoolLen() == 0 {
			r.Sessions, r.Err = a.store.PullBack(a.ctx, m.After, m.To)
		}
		if c.Sender() != nil {
			c.Respond(&r)
		}
	case *Prune:
		a.drain(c)
		if a.spoolLen() > 0 {
			a.replay(c)
		}
		if a.spoolLen() > 0 {
			// A spooled write may reopen or write to a session the prune would delete; the
			// next prune runs once the spool has drained.
			a.o.Log.Info("prune put off: writes wait in the spool", "batches", a.spoolLen())
			if c.Sender() != nil {
				c.Respond(&Pruned{Pass: m.Pass})
			}
			return
		}
		start := time.Now()
		n, err := a.store.PruneStep(a.ctx, m.Before, m.Rows)
		if err != nil {
			a.o.Log.Warn("prune ended sessions", logging.Err(err))
		} else if n.Rows > 0 {
			// Per step at Debug: a pass takes hundreds; its sender logs the pass.
			a.o.Log.Debug("prune step", "sessions", n.Sessions, "messages", n.Messages, "swept", n.Swept, "rows", n.Rows,
				"took", time.Since(start).Round(time.Millisecond))
		}
		if c.Sender() != nil {
			c.Respond(&Pruned{Pass: m.Pass, Sessions: n.Sessions, Messages: n.Messages, Swept: n.Swept, More: n.More, Err: err})
		}
	case *actor.Restarting:
		// The collected batch is lost (its senders re-send it); the commit in flight is
		// answered, so that the next incarnation never commits next to it.
		if a.o.Incarnation != nil {
			a.o.Incarnation.Add(1)
		}
		if a.inflight != nil {
			a.finishQuietly(c)
		}
		a.stopCommitter()
	case *actor.Stopping:
		a.drain(c)
		a.stopCommitter()
	case *actor.Stopped:
		a.stopCommitter()
		a.repeats.flush() // the lines held back, reported at the stop (logging.Limiter)
	}
}

// startCommitter starts the goroutine that runs the commit jobs. It owns nothing but the job in
// hand, and it ends when the actor closes its channel (stopping or restarting). When no write of
// a job met an unavailable database, it answers the senders itself, right after the commit (one
// hop less per write); otherwise the actor answers them once it has spooled what it must.
func (a *Actor) startCommitter(c actor.Context) {
	jobs := make(chan *commitJob, 1) // one job in flight: a send never blocks
	a.jobs = jobs
	root, self, ctx, store, refusals := c.ActorSystem().Root, c.Self(), a.ctx, a.store, a.o.Refusals
	go func() {
		for j := range jobs {
			runJob(ctx, store, j)
			if j.answered {
				// Taken before anyone hears of it: a message that follows the answer (to a
				// session waiting out a pause after refused writes) must find the store taking
				// writes again. Recorded by finish, it could come too late.
				refusals.taken()
				j.answeredAt = time.Now()
				for i, p := range j.part {
					if p.sender != nil {
						root.Send(p.sender, &WriteResult{ID: p.write.ID, Err: j.errs[i]})
					}
				}
			}
			close(j.done)
			root.Send(self, &committed{job: j})
		}
	}()
}

// runJob commits j's groups and decides whether the committer may answer them (j.answered). A
// panic in the store is carried back to the actor, which re-raises it in Receive, so that its
// supervisor sees it.
func runJob(ctx context.Context, store Store, j *commitJob) {
	defer func() {
		if v := recover(); v != nil {
			j.panicked = v
			j.answered = false
		}
	}()
	start := time.Now()
	j.errs = store.Commit(ctx, j.groups)
	j.took = time.Since(start)
	j.answered = len(j.errs) == len(j.groups) && !anyUnavailable(j.errs)
}

func (a *Actor) stopCommitter() {
	if a.jobs != nil {
		close(a.jobs)
		a.jobs = nil
	}
}

// pace sends the collected batch to the committer when it may go (see Actor), or arms a
// lingerTick for when it may.
func (a *Actor) pace(c actor.Context) {
	if a.inflight != nil || len(a.batch) == 0 || a.scheduled {
		return
	}
	switch wait := a.linger() - time.Since(a.answeredAt); {
	case a.arrived >= a.answered || len(a.batch) >= a.o.MaxBatch:
		a.dispatch(c)
	case wait <= 0 || a.lingerOff > 0:
		if a.waited {
			// The answered writers did not come back in time: their next writes are not
			// imminent (they wait for an agent, a platform, a user), so waiting for them only
			// idles the disk. Commit greedily for a while.
			a.lingerOff = lingerBackoff
		}
		// The flush token also takes the writes queued behind this one.
		a.scheduled = true
		c.Send(c.Self(), &flushNow{})
	case !a.lingering:
		a.lingering, a.waited = true, true
		root, self := c.ActorSystem().Root, c.Self()
		time.AfterFunc(wait, func() { root.Send(self, &lingerTick{}) })
	}
}

// linger is how long a batch may wait for the writers the last commit answered.
func (a *Actor) linger() time.Duration {
	d := min(a.lastTook/lingerShare, a.o.MaxLinger)
	if d < minLinger {
		return 0
	}
	return d
}

// dispatch hands the first MaxBatch collected writes to the committer when it is idle. While the
// spool is in use, it spools them instead, in order, and answers their senders.
func (a *Actor) dispatch(c actor.Context) {
	for a.inflight == nil && len(a.batch) > 0 {
		n := min(len(a.batch), a.o.MaxBatch)
		part := a.batch[:n:n]
		if a.batch = a.batch[n:]; len(a.batch) == 0 {
			a.batch = nil
		}
		if part = a.keepOrder(c, part); len(part) == 0 {
			continue
		}
		groups := make([][]Op, len(part))
		for i, p := range part {
			groups[i] = p.write.Ops
		}
		if a.spoolLen() > 0 {
			a.answer(c, part, a.spool(c, groups, make([]error, len(part)))) // keep order behind what is spooled
			continue
		}
		if a.jobs == nil {
			panic("persistence: commit after the committer stopped") // a broken invariant of this actor
		}
		a.inflight = &commitJob{part: part, groups: groups, done: make(chan struct{})}
		a.jobs <- a.inflight
	}
}

// finish waits for the commit in flight (it has usually ended already), spools what the
// database could not take and answers the senders.
func (a *Actor) finish(c actor.Context) {
	j := a.inflight
	<-j.done
	a.inflight = nil
	if j.panicked != nil {
		panic(fmt.Errorf("persistence: commit: %v", j.panicked))
	}
	a.o.Observe(len(j.part), j.took)
	a.lastTook = j.took
	if !j.answered { // (the committer recorded the writes taken and answered them itself)
		j.answeredAt = time.Now()
		a.answer(c, j.part, a.spool(c, j.groups, j.errs))
	} else {
		a.refusalsEnded()
		a.wakeKept()
	}
	// The writes that arrived after the answers went out are (mostly) the answered writers'
	// next ones.
	a.answeredAt, a.answered, a.arrived, a.waited = j.answeredAt, len(j.part), 0, false
	if a.lingerOff > 0 {
		a.lingerOff--
	}
	for _, p := range a.batch {
		if !p.at.Before(j.answeredAt) {
			a.arrived++
		}
	}
}

// finishQuietly is finish for an actor that is restarting: a panic of the job is only logged.
func (a *Actor) finishQuietly(c actor.Context) {
	defer func() {
		if v := recover(); v != nil {
			a.o.Log.Error("commit failed while restarting", "panic", fmt.Sprint(v))
		}
	}()
	a.finish(c)
}

// drain commits everything collected and waits for it: the barrier of Flush, Prune and stop.
func (a *Actor) drain(c actor.Context) {
	for a.inflight != nil || len(a.batch) > 0 {
		if a.inflight != nil {
			a.finish(c)
		}
		a.dispatch(c)
	}
}

// answer answers the senders of part with errs, and notes those of a write they keep refused as
// unavailable (keepOrder).
func (a *Actor) answer(c actor.Context, part []pendingWrite, errs []error) {
	for i, p := range part {
		if p.sender == nil {
			continue
		}
		if p.write.Keep && errors.Is(errs[i], ErrUnavailable) {
			if a.refused == nil {
				a.refused = make(map[senderID]struct{})
			}
			a.refused[senderOf(p.sender)] = struct{}{}
			if a.waking == nil {
				a.waking = make(map[senderID]*actor.PID)
			}
			a.waking[senderOf(p.sender)] = p.sender
		}
		c.Send(p.sender, &WriteResult{ID: p.write.ID, Err: errs[i]})
	}
}

// keepOrder answers with errBehindRefused the writes of part sent behind unacknowledged writes
// of a sender that was answered a write it keeps (a session's turn result) refused as
// unavailable since it last sent one with nothing unacknowledged before it (see Write), and
// returns the others. The sender sends the refused write again, and a write it sent behind it
// before it heard of the refusal, taken now (room freed between two batches), would commit ahead
// of it: a later outbox entry of the session's key before an earlier one, which an event stream
// that read the later one skipped when the earlier one came. On a full disk the store refuses
// such a write too, as a rule; now it always does.
func (a *Actor) keepOrder(c actor.Context, part []pendingWrite) []pendingWrite {
	if a.refused == nil {
		return part
	}
	kept := part[:0]
	for _, p := range part {
		if p.sender != nil {
			id := senderOf(p.sender)
			if !p.write.After {
				delete(a.refused, id) // its sender has heard the answers of every write it made before
			} else if _, ok := a.refused[id]; ok {
				c.Send(p.sender, &WriteResult{ID: p.write.ID, Err: errBehindRefused})
				continue
			}
		}
		kept = append(kept, p)
	}
	if len(a.refused) == 0 {
		a.refused = nil
	}
	return kept
}

// errBehindRefused refuses a write sent behind a write of its sender the actor refused as
// unavailable (keepOrder).
var errBehindRefused = fmt.Errorf("%w: sent behind a write of its sender that was refused", ErrUnavailable)

func senderOf(pid *actor.PID) senderID {
	return senderID{pid.Address, pid.Id}
}

// wakeKept tells the senders answered a write they keep refused as unavailable since the store
// last took a write (a session's turn result, which it holds and writes again after a pause of
// 1 s doubling to 10 s) that the store has taken one (WritesTaken): they send it again at once.
// Before, they waited out the pause: after an outage of a few seconds, a reply waited up to 10 s
// more while the writes of other chats' new turns were already taken. Called where the store
// (the database or the spool) took the writes of a commit or a replay, after their senders were
// answered. A store that still refuses takes no write, and tells no one.
func (a *Actor) wakeKept() {
	for _, pid := range a.waking {
		a.root.Send(pid, &WritesTaken{})
	}
	a.waking = nil
}

// refusalsEnded notes that the database or the spool took writes, and logs the end of an
// outage in which both refused them (msgSpoolFailed): its ERR line, once a minute, was its
// only trace, so that the log could not say whether it still lasted, and the refusals after its
// last line were counted in none (found by a disk-full soak of the binary).
func (a *Actor) refusalsEnded() {
	a.repeats.ok(msgSpoolFailed)
	if a.outage.at.IsZero() {
		return
	}
	a.o.Log.Info("writes taken again after the database and spool both refused them",
		"refused", a.outage.groups, "lasted", time.Since(a.outage.at).Round(time.Second))
	*a.outage = outage{}
}

func (a *Actor) spoolLen() int {
	if a.o.Spool == nil {
		return 0
	}
	return a.o.Spool.Len()
}

// spool writes to the spool the groups whose error says the database is unavailable (all of
// them when errs are all nil and the spool is in use) and returns the errors their senders get.
func (a *Actor) spool(c actor.Context, groups [][]Op, errs []error) []error {
	if a.o.Spool == nil {
		if err := firstUnavailable(errs); err != nil {
			a.o.Refusals.Refuse(err, time.Now())
			a.o.WritesRefused(countUnavailable(errs))
		} else {
			a.o.Refusals.taken()
			a.wakeKept()
		}
		return errs
	}
	forced := a.spoolLen() > 0
	var idx []int
	var keep [][]Op
	for i, err := range errs {
		if forced && err == nil || errors.Is(err, ErrUnavailable) {
			idx = append(idx, i)
			keep = append(keep, groups[i])
		}
	}
	if len(keep) == 0 {
		a.refusalsEnded()
		a.o.Refusals.taken()
		a.wakeKept()
		return errs
	}
	out := make([]error, len(errs))
	copy(out, errs)
	name, err := a.o.Spool.Append(keep)
	for _, i := range idx {
		if err != nil {
			// The database's error without its own "database unavailable", which this one
			// begins with: a log line quoted it twice. A write sent to the spool behind the
			// writes waiting there (forced) never met the database, and has no error of its:
			// reading it panicked the actor, and the write was never answered (found by a
			// disk-full soak of the binary).
			dbErr := "earlier writes wait in the spool for it"
			if errs[i] != nil {
				dbErr = strings.TrimPrefix(errs[i].Error(), ErrUnavailable.Error()+": ")
			}
			out[i] = fmt.Errorf("%w: spool failed too: %v (database: %s)", ErrUnavailable, err, dbErr)
		} else {
			out[i] = nil
		}
	}
	if err != nil {
		a.repeats.log(a.o.Log, slog.LevelError, msgSpoolFailed, "groups", len(keep), logging.Err(err))
		a.o.Refusals.Refuse(fmt.Errorf("database and spool both failed: %w", err), time.Now())
		a.o.WritesRefused(len(keep))
		if a.outage.at.IsZero() {
			a.outage.at = time.Now()
		}
		a.outage.groups += len(keep)
		return out
	}
	a.refusalsEnded()
	a.o.Refusals.taken()
	a.wakeKept()
	if !forced {
		a.o.Log.Warn("database unavailable; spooling writes", "batch", name, logging.Err(firstErr(errs)))
		a.alone = max(a.alone, 1) // the first replay probes the database with one batch
	}
	a.spoolChanged(c)
	return out
}

// replay drains the spool into the database (replaySpool) and publishes what is left.
func (a *Actor) replay(c actor.Context) {
	if a.o.Spool == nil {
		return
	}
	if a.inflight != nil {
		a.finish(c) // never two writers: the spool only fills while nothing commits, but be sure
	}
	_ = a.replaySpool() // it logs why it stopped
	a.spoolChanged(c)
}

// replaySpool drains the spool into the database, oldest batch first, several batches a
// transaction (replayRun). It stops at the first batch the database still cannot take, and
// returns why (the database's error, or the spool's): the batches stay, and are tried again
// later. It returns nil when the spool is empty, and the context's error when it ends.
//
// Some batches go alone (Actor.alone). While the database was unavailable at the last try, the
// next try is the oldest batch alone: a run would read and decode up to MaxBatch batches at
// every tick of an outage only to fail. And after a run failed as a whole, its batches go one at
// a time until one is refused on its own (the cause, set aside), or until all of them went: a
// run again from each batch behind the cause would repeat the failing transaction once a batch.
func (a *Actor) replaySpool() error {
	took := false // the database took a run
	for a.o.Spool.Len() > 0 {
		// The replay's progress, as it goes (the start's barrier waits while it moves; an
		// operator watches agentgate_spool_files fall).
		a.o.SpoolFiles(a.o.Spool.Len())
		if err := a.ctx.Err(); err != nil {
			return err
		}
		name, groups, err := a.o.Spool.Peek("")
		if errors.Is(err, ErrCorruptSpool) {
			a.repeats.ok(msgSpoolRead)
			if gone, qerr := a.setAside(name, err.Error()); qerr != nil {
				return qerr
			} else if !gone {
				a.o.Log.Error("corrupt spool batch quarantined", "batch", name, logging.Err(err))
			}
			continue
		}
		if err != nil {
			a.repeats.log(a.o.Log, slog.LevelError, msgSpoolRead, "batches", a.o.Spool.Len(), logging.Err(err))
			return err
		}
		a.repeats.ok(msgSpoolRead)
		run := a.replayRun(name, groups, a.alone > 0)
		start := time.Now()
		errs := a.store.Commit(a.ctx, run.groups)
		if anyUnavailable(errs) || anyTransient(errs) || a.ctx.Err() != nil {
			err := firstUnavailable(errs)
			if err != nil && a.ctx.Err() == nil {
				// Before, a replay that waited said nothing: a start whose spool could not be
				// replayed logged no line of it (found by an operations walkthrough).
				a.repeats.log(a.o.Log, slog.LevelWarn, msgReplayWaits, "batches", a.o.Spool.Len(), logging.Err(err))
				a.alone = max(a.alone, 1)
			}
			if err == nil {
				err = cmp.Or(a.ctx.Err(), firstTransient(errs))
			}
			return err // still unavailable, or stopping; the batches stay and are replayed later
		}
		a.o.Observe(len(run.groups), time.Since(start))
		a.repeats.ok(msgReplayWaits)
		took = true
		if len(run.names) > 1 && failedAsOne(errs) {
			// The transaction failed as a whole, which may be one batch's doing: setting every
			// batch of the run aside would keep the others out of the database. They go alone,
			// as each batch did before runs, and one is set aside only if it fails so.
			a.alone = len(run.names)
			continue
		}
		if err := a.settle(run, errs); err != nil {
			return err
		}
		if a.alone > 0 { // the run was one batch
			a.alone--
			if slices.ContainsFunc(errs, refused) {
				a.alone = 0 // past the batch that failed a run as a whole
			}
		}
	}
	if took {
		// The database took the spool's writes, and the next write goes to it: refusals end
		// here too. Before, only a new write taken ended them, and a daemon with no traffic
		// after the disk had room again said in /readyz that writes were refused for
		// RefusalMemory more. Not before the spool is empty: a write sent meanwhile still goes
		// behind its batches, to a spool that may refuse it. A replay that committed a batch it
		// could not remove (a spool that can be neither written nor emptied) ended them at each
		// tick, and the next write was refused again: the log said ERR and INF in turn every
		// second, and /readyz that the writes waited in the spool
		// (TestAReplayThatLeavesTheSpoolEndsNoRefusals).
		a.refusalsEnded()
		a.o.Refusals.taken()
		a.wakeKept()
	}
	return nil
}

// spooledRun is the batches of the spool that one replay transaction commits, oldest first.
type spooledRun struct {
	names  []string
	sizes  []int // the groups of each batch
	groups [][]Op
}

// replayRun returns the run of batches that starts with the oldest one (name, groups) and takes
// the batches behind it while they fit: MaxBatch groups in all, as a commit of live writes.
// After a long outage the spool holds thousands of small batches, and a transaction a batch
// cost an fsync a batch and wrote the pages they share (the session's, the search index's) to
// the WAL again for each (BenchmarkSpoolReplay). A batch that cannot be read ends the run: the
// next round meets it first, and says why. With alone, the run is the oldest batch only.
func (a *Actor) replayRun(name string, groups [][]Op, alone bool) *spooledRun {
	r := &spooledRun{names: []string{name}, sizes: []int{len(groups)}, groups: groups}
	for !alone && len(r.names) < a.o.MaxBatch {
		next, more, err := a.o.Spool.Peek(name)
		if next == "" || err != nil || len(r.groups)+len(more) > a.o.MaxBatch {
			break
		}
		name = next
		r.names = append(r.names, next)
		r.sizes = append(r.sizes, len(more))
		r.groups = append(r.groups, more...)
	}
	return r
}

// settle removes from the spool the batches of r that the database took (errs are the
// transaction's), and sets aside those it refused for what they hold, in their order. An error
// (the spool's) stops the replay.
func (a *Actor) settle(r *spooledRun, errs []error) error {
	var taken []string // not removed yet
	off := 0
	for i, name := range r.names {
		var failed []string
		for g, err := range errs[off : off+r.sizes[i]] {
			if refused(err) {
				failed = append(failed, fmt.Sprintf("group %d: %v", g, err))
			}
		}
		off += r.sizes[i]
		if len(failed) == 0 {
			taken = append(taken, name)
			continue
		}
		// The batches before it leave first, so that the spool never holds a batch behind one
		// that has left it: what a replay applies again after a crash is the newest batches.
		if err := a.removeReplayed(taken); err != nil {
			return err
		}
		taken = nil
		// The other groups are committed; re-applying them is harmless, so the whole batch is
		// kept aside for a human.
		if gone, qerr := a.setAside(name, fmt.Sprint(failed)); qerr != nil {
			return qerr
		} else if !gone {
			a.o.Log.Error("spool batch cannot be applied; quarantined", "batch", name, "errors", failed)
		}
	}
	return a.removeReplayed(taken)
}

// setAside sets the batch name aside for a human (Spooler.Quarantine), for why. gone reports
// that its file was no longer there (removed by hand during the replay): nothing of it is left
// to replay or to keep, which is said, and the replay goes on. An error (the spool's) stops
// the replay.
func (a *Actor) setAside(name, why string) (gone bool, err error) {
	err = a.o.Spool.Quarantine(name, why)
	if errors.Is(err, ErrBatchGone) {
		a.o.Log.Warn("spool batch gone before it could be set aside; nothing of it is replayed", "batch", name, "why", why)
		return true, nil
	}
	if err != nil {
		a.repeats.log(a.o.Log, slog.LevelError, msgQuarantineFailed, "batch", name, "why", why, logging.Err(err))
		return false, err
	}
	a.repeats.ok(msgQuarantineFailed)
	return false, nil
}

// removeReplayed removes batches the database took, oldest first, and returns the spool's
// error if it could not.
func (a *Actor) removeReplayed(names []string) error {
	if len(names) == 0 {
		return nil
	}
	if err := a.o.Spool.Remove(names...); err != nil {
		a.repeats.log(a.o.Log, slog.LevelError, msgSpoolRemove, "batch", names[0], logging.Err(err))
		return err
	}
	a.repeats.ok(msgSpoolRemove)
	return nil
}

// spoolChanged publishes the spool's size and schedules the next replay while it holds batches.
func (a *Actor) spoolChanged(c actor.Context) {
	n := a.spoolLen()
	a.o.SpoolFiles(n)
	was := a.leftover
	if a.o.Spooling != nil {
		was = a.o.Spooling.Swap(n > 0) || was
	}
	if was && n == 0 {
		a.leftover = false
		a.o.Log.Info("spool drained; writing to the database again")
	}
	if n > 0 && !a.replaying {
		a.replaying = true
		a.timers.SendOnce(a.o.ReplayEvery, c.Self(), &replayTick{})
	}
}

// anyTransient reports whether a replayed batch failed for a reason that is not its own: the
// daemon stopping (its context ended, its store closed). Such a batch stays in the spool; only
// a batch the database refuses for what it holds is set aside.
func anyTransient(errs []error) bool { return firstTransient(errs) != nil }

// firstTransient returns the first of errs that anyTransient counts, or nil.
func firstTransient(errs []error) error {
	for _, err := range errs {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrClosed) {
			return err
		}
	}
	return nil
}

// refused reports whether a replayed group failed for what it holds. A duplicate did not: its
// write is in the database already.
func refused(err error) bool {
	return err != nil && !errors.Is(err, ErrDuplicate)
}

// failedAsOne reports whether a replayed transaction failed as a whole: no group committed, and
// some group was refused. A group the savepoint pass refused as a duplicate keeps that error
// when the transaction fails afterwards (sqlstore.FillUndecided), so a duplicate does not tell
// that the transaction committed; but a run of duplicates alone did commit (it had nothing
// left to write), and leaves the spool.
func failedAsOne(errs []error) bool {
	return len(errs) > 0 && !slices.Contains(errs, nil) && slices.ContainsFunc(errs, refused)
}

func anyUnavailable(errs []error) bool {
	for _, err := range errs {
		if errors.Is(err, ErrUnavailable) {
			return true
		}
	}
	return false
}

func countUnavailable(errs []error) int {
	n := 0
	for _, err := range errs {
		if errors.Is(err, ErrUnavailable) {
			n++
		}
	}
	return n
}

func firstUnavailable(errs []error) error {
	for _, err := range errs {
		if errors.Is(err, ErrUnavailable) {
			return err
		}
	}
	return nil
}

func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
