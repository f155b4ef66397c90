package persistence

import (
	"context"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// BatchObserver receives the size and duration of each committed batch (metrics).
type BatchObserver func(groups int, took time.Duration)

// Actor is the persistence actor: the only writer of a Store in a process. It batches every
// Write queued in its mailbox into one transaction (group commit): the first Write of a batch
// sends the actor a flush token, which queues behind everything already in the mailbox, and the
// flush commits all of it (at most maxBatch groups per transaction) and answers each sender.
//
// The commit runs inside Receive: blocking is this actor's whole job, and writes that arrive
// meanwhile simply make the next batch bigger. A restart loses only the batch being collected;
// its senders still hold those writes and re-send them.
type Actor struct {
	store    Store
	ctx      context.Context
	maxBatch int
	log      *slog.Logger
	observe  BatchObserver

	batch     []pendingWrite
	scheduled bool
}

type pendingWrite struct {
	sender *actor.PID
	write  *Write
}

// NewActor returns a producer of persistence actors over store. ctx is the daemon's lifetime
// context, used to derive per-commit contexts.
func NewActor(ctx context.Context, store Store, maxBatch int, log *slog.Logger, observe BatchObserver) actor.Producer {
	if maxBatch < 1 {
		maxBatch = 1
	}
	if observe == nil {
		observe = func(int, time.Duration) {}
	}
	return func() actor.Actor {
		return &Actor{store: store, ctx: ctx, maxBatch: maxBatch, log: log, observe: observe}
	}
}

// Receive handles Write, Flush and the internal flush token.
func (a *Actor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *Write:
		a.batch = append(a.batch, pendingWrite{sender: c.Sender(), write: m})
		if len(a.batch) >= a.maxBatch {
			a.flush(c)
		} else if !a.scheduled {
			a.scheduled = true
			c.Send(c.Self(), &flushNow{})
		}
	case *flushNow:
		a.scheduled = false
		a.flush(c)
	case *Flush:
		a.flush(c)
		if c.Sender() != nil {
			c.Respond(&Flushed{})
		}
	case *actor.Stopping:
		a.flush(c)
	}
}

func (a *Actor) flush(c actor.Context) {
	for len(a.batch) > 0 {
		n := min(len(a.batch), a.maxBatch)
		part := a.batch[:n]
		groups := make([][]Op, n)
		for i, p := range part {
			groups[i] = p.write.Ops
		}
		start := time.Now()
		errs := a.store.Commit(a.ctx, groups)
		a.observe(n, time.Since(start))
		for i, p := range part {
			var err error
			if i < len(errs) {
				err = errs[i]
			}
			if p.sender != nil {
				c.Send(p.sender, &WriteResult{ID: p.write.ID, Err: err})
			}
		}
		a.batch = a.batch[n:]
	}
	a.batch = nil
}
