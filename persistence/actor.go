package persistence

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"
)

// Spooler keeps writes on disk while the database cannot be written (persistence/spool). It
// belongs to the persistence actor alone.
type Spooler interface {
	// Append stores groups durably as one batch; an error means they are not stored.
	Append(groups [][]Op) (name string, err error)
	// Len is the number of batches waiting.
	Len() int
	// Peek returns the oldest batch ("" when empty); an error wrapping ErrCorruptSpool names a
	// batch that can never be decoded.
	Peek() (name string, groups [][]Op, err error)
	// Remove deletes a replayed batch.
	Remove(name string) error
	// Quarantine sets a batch aside for a human, keeping its data.
	Quarantine(name, reason string) error
}

// ActorOptions configure the persistence actor.
type ActorOptions struct {
	MaxBatch int
	Log      *slog.Logger
	// Observe receives the size and duration of each committed batch (metrics).
	Observe func(groups int, took time.Duration)
	// Spool keeps writes while the database is unavailable; nil answers such writes with the
	// error instead.
	Spool Spooler
	// Spooling is set while the spool holds batches (sessions then stay in memory, since the
	// store does not yet show their writes). May be nil.
	Spooling *atomic.Bool
	// SpoolFiles receives the number of spooled batches whenever it changes (metrics).
	SpoolFiles func(n int)
	// ReplayEvery is how often a non-empty spool is replayed (default 1s).
	ReplayEvery time.Duration
}

// Actor is the persistence actor: the only writer of a Store in a process. It batches every
// Write queued in its mailbox into one transaction (group commit): the first Write of a batch
// sends the actor a flush token, which queues behind everything already in the mailbox, and the
// flush commits all of it (at most MaxBatch groups per transaction) and answers each sender.
//
// When the database cannot be written (persistence.ErrUnavailable), the writes go to the spool
// and their senders are answered as durable. From then on every write goes to the spool, in
// order, until a replay has drained it into the database; a batch that fails for good is
// quarantined, never dropped.
//
// The commit runs inside Receive: blocking is this actor's whole job, and writes that arrive
// meanwhile simply make the next batch bigger. A restart loses only the batch being collected;
// its senders still hold those writes and re-send them.
type Actor struct {
	store Store
	ctx   context.Context
	o     ActorOptions

	batch     []pendingWrite
	scheduled bool
	replaying bool
	timers    *scheduler.TimerScheduler
}

type pendingWrite struct {
	sender *actor.PID
	write  *Write
}

// replayTick asks the actor to replay the spool.
type replayTick struct{}

// NewActor returns a producer of persistence actors over store. ctx is the daemon's lifetime
// context, used to derive per-commit contexts.
func NewActor(ctx context.Context, store Store, o ActorOptions) actor.Producer {
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
	if o.ReplayEvery <= 0 {
		o.ReplayEvery = time.Second
	}
	return func() actor.Actor {
		return &Actor{store: store, ctx: ctx, o: o}
	}
}

// Receive handles Write, Flush, Prune and the internal flush and replay tokens.
func (a *Actor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		a.timers = scheduler.NewTimerScheduler(c)
		a.replay(c)
	case *Write:
		a.batch = append(a.batch, pendingWrite{sender: c.Sender(), write: m})
		if len(a.batch) >= a.o.MaxBatch {
			a.flush(c)
		} else if !a.scheduled {
			a.scheduled = true
			c.Send(c.Self(), &flushNow{})
		}
	case *flushNow:
		a.scheduled = false
		a.flush(c)
	case *replayTick:
		a.replaying = false
		a.replay(c)
	case *Flush:
		a.flush(c)
		if c.Sender() != nil {
			c.Respond(&Flushed{})
		}
	case *Prune:
		a.flush(c)
		n, err := a.store.PruneSessions(a.ctx, m.Before, m.Limit)
		if err != nil {
			a.o.Log.Warn("prune ended sessions", "err", err)
		} else if n > 0 {
			a.o.Log.Info("pruned ended sessions", "count", n, "ended_before", m.Before.UTC().Format(time.RFC3339))
		}
		if c.Sender() != nil {
			c.Respond(&Pruned{Sessions: n, Err: err})
		}
	case *actor.Stopping:
		a.flush(c)
	}
}

func (a *Actor) spoolLen() int {
	if a.o.Spool == nil {
		return 0
	}
	return a.o.Spool.Len()
}

func (a *Actor) flush(c actor.Context) {
	for len(a.batch) > 0 {
		n := min(len(a.batch), a.o.MaxBatch)
		part := a.batch[:n]
		groups := make([][]Op, n)
		for i, p := range part {
			groups[i] = p.write.Ops
		}
		var errs []error
		if a.spoolLen() > 0 {
			errs = a.spool(c, groups, make([]error, n)) // keep order behind what is spooled
		} else {
			start := time.Now()
			errs = a.store.Commit(a.ctx, groups)
			a.o.Observe(n, time.Since(start))
			errs = a.spool(c, groups, errs)
		}
		for i, p := range part {
			if p.sender != nil {
				c.Send(p.sender, &WriteResult{ID: p.write.ID, Err: errs[i]})
			}
		}
		a.batch = a.batch[n:]
	}
	a.batch = nil
}

// spool writes to the spool the groups whose error says the database is unavailable (all of
// them when errs are all nil and the spool is in use) and returns the errors their senders get.
func (a *Actor) spool(c actor.Context, groups [][]Op, errs []error) []error {
	if a.o.Spool == nil {
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
		return errs
	}
	out := make([]error, len(errs))
	copy(out, errs)
	name, err := a.o.Spool.Append(keep)
	for _, i := range idx {
		if err != nil {
			out[i] = fmt.Errorf("%w: spool failed too: %v (database: %v)", ErrUnavailable, err, errs[i])
		} else {
			out[i] = nil
		}
	}
	if err != nil {
		a.o.Log.Error("database and spool both failed; writes refused", "err", err, "groups", len(keep))
		return out
	}
	if !forced {
		a.o.Log.Warn("database unavailable; spooling writes", "batch", name, "err", firstErr(errs))
	}
	a.spoolChanged(c)
	return out
}

// replay drains the spool into the database, oldest batch first. It stops at the first batch
// the database still cannot take and tries again later.
func (a *Actor) replay(c actor.Context) {
	if a.o.Spool == nil {
		return
	}
	for a.o.Spool.Len() > 0 {
		name, groups, err := a.o.Spool.Peek()
		if errors.Is(err, ErrCorruptSpool) {
			a.o.Log.Error("corrupt spool batch quarantined", "batch", name, "err", err)
			if qerr := a.o.Spool.Quarantine(name, err.Error()); qerr != nil {
				a.o.Log.Error("quarantine spool batch", "batch", name, "err", qerr)
				break
			}
			continue
		}
		if err != nil {
			a.o.Log.Error("read spool", "err", err)
			break
		}
		errs := a.store.Commit(a.ctx, groups)
		if anyUnavailable(errs) {
			break // still unavailable; the batch stays and is replayed again later
		}
		var failed []string
		for i, err := range errs {
			if err != nil && !errors.Is(err, ErrDuplicate) {
				failed = append(failed, fmt.Sprintf("group %d: %v", i, err))
			}
		}
		if len(failed) > 0 {
			// The other groups are committed; re-applying them is harmless, so the whole batch is
			// kept aside for a human.
			a.o.Log.Error("spool batch cannot be applied; quarantined", "batch", name, "errors", failed)
			if qerr := a.o.Spool.Quarantine(name, fmt.Sprint(failed)); qerr != nil {
				a.o.Log.Error("quarantine spool batch", "batch", name, "err", qerr)
				break
			}
			continue
		}
		if err := a.o.Spool.Remove(name); err != nil {
			a.o.Log.Error("remove replayed spool batch", "batch", name, "err", err)
			break
		}
	}
	a.spoolChanged(c)
}

// spoolChanged publishes the spool's size and schedules the next replay while it holds batches.
func (a *Actor) spoolChanged(c actor.Context) {
	n := a.spoolLen()
	a.o.SpoolFiles(n)
	if a.o.Spooling != nil {
		was := a.o.Spooling.Swap(n > 0)
		if was && n == 0 {
			a.o.Log.Info("spool drained; writing to the database again")
		}
	}
	if n > 0 && !a.replaying {
		a.replaying = true
		a.timers.SendOnce(a.o.ReplayEvery, c.Self(), &replayTick{})
	}
}

func anyUnavailable(errs []error) bool {
	for _, err := range errs {
		if errors.Is(err, ErrUnavailable) {
			return true
		}
	}
	return false
}

func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
