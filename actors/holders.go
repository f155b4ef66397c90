package actors

import (
	"context"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// Lookups of keys' holders in the store, gathered into batches (holderOf).
//
// Every activation looks up its key's holder in the store (lookUpHolder), and one that waits for
// a member it cannot reach looks it up again each time it asks that member (stillHolds, every
// releaseAnswerTimeout). One query a lookup cost a partition that strands thousands of keys
// hundreds of queries a second on PostgreSQL for as long as it lasted, and a rebalance one query
// for each key it moved. So a manager has at most one batch of lookups in flight, and sends every
// lookup queued meanwhile in the next: one Placement.Holders call, however many keys (the store
// reads them in queries of a bounded size). Two lookups of one key queued at once are one key of
// the batch, and its answer reaches both. A lookup queued while a batch runs waits for it: at
// most holderLookupTimeout, and then its own batch, bounded alike.
//
// One batch in flight gathers what comes at once (a rebalance's activations), but not the asks
// of waits that go on: each activation that waits for a member it cannot reach asks again every
// releaseAnswerTimeout, at its own moment, and as fast as the store answers, each batch would
// hold one or two keys. So a lookup that a wait asks again (again, in holderOf) goes in a lane
// of its own, whose batch begins only when the batches of it begun lately left room:
// holderBatchBurst in a row, then one every holderBatchGap (a token bucket). An activation's
// other lookups (its first, and the first after a member did not answer) go in the other lane,
// whose next batch goes at once: a chat's first message waits for no timer, however many
// activations a second the manager runs. The lanes do not share batches: a partition's
// thousands of lookups asked again make a batch that a slow store may fail or time out, and a
// first lookup that failed with it would let its activation go on without asking a holder this
// member does not know (that path can run a turn twice); nor does a first lookup wait for it.

// holderBatchBurst and holderBatchGap bound the batches of lookups asked again: at most
// holderBatchBurst in a row, then one every holderBatchGap.
const (
	holderBatchGap   = 100 * time.Millisecond
	holderBatchBurst = 4
)

// holdersFound is the answer of a batch of lookups of keys' holders in the store (lookUpHolders).
type holdersFound struct {
	holders map[string]Holder
	err     error
}

// lookupsDue tells the manager that its batches of lookups asked again have room for one again
// (holderBatchGap): the lookups queued since go out.
type lookupsDue struct{}

// lookupLane is one lane of lookups (holderOf): those queued for its next batch, by key, the
// keys in the order they were first queued, and whether a batch of it is in flight.
type lookupLane struct {
	found map[string][]func(holder Holder, err error)
	keys  []string
	busy  bool
}

// holderOf looks up the holder of key in the store (Placement.Holders), off the actor, in the
// next batch of lookups, and calls found on the actor with its answer: the key's claim and its
// holder (Holder.Manager, nil for none), or an error when the batch failed or took longer than
// holderLookupTimeout. again marks a lookup that a wait for a member asks again (stillHolds): it
// goes in the lane whose batches may wait for room.
func (m *SessionManager) holderOf(c actor.Context, key string, again bool, found func(holder Holder, err error)) {
	l := &m.firstLookups
	if again {
		l = &m.againLookups
	}
	if l.found == nil {
		l.found = map[string][]func(Holder, error){}
	}
	if _, queued := l.found[key]; !queued {
		l.keys = append(l.keys, key)
	}
	l.found[key] = append(l.found[key], found)
	m.lookUpHolders(c)
}

// lookUpHolders sends each lane's queued lookups (holderOf) as one batch, unless one of the lane
// is in flight (its answer sends them), or, for the lookups asked again, the batches of them
// begun lately used up the room (a timer sends them once there is room again). A manager that
// stops or restarts sends none: its activations ended, and a batch would ask the store for
// nothing, after the manager's stop (its answer is dropped), or for an incarnation that knows
// none of them (the one that restarts goes on answering the continuations of its batch in
// flight).
func (m *SessionManager) lookUpHolders(c actor.Context) {
	if m.closing {
		return
	}
	m.sendLookups(c, &m.firstLookups)
	if l := &m.againLookups; l.busy || len(l.keys) == 0 || m.lookupsDue {
		return
	}
	now := time.Now()
	full := m.batchesTo
	if full.Before(now) {
		full = now
	}
	if wait := full.Sub(now) - (holderBatchBurst-1)*holderBatchGap; wait > 0 {
		m.lookupsDue = true
		m.timers.SendOnce(wait, c.Self(), &lookupsDue{})
		return
	}
	m.batchesTo = full.Add(holderBatchGap)
	m.sendLookups(c, &m.againLookups)
}

// sendLookups sends the lookups queued in l as one batch, unless one of l is in flight.
func (m *SessionManager) sendLookups(c actor.Context, l *lookupLane) {
	if l.busy || len(l.keys) == 0 {
		return
	}
	keys, found := l.keys, l.found
	l.keys, l.found, l.busy = nil, nil, true
	system, placement, ctx := c.ActorSystem(), m.d.Placement, m.d.Ctx
	// The future outlives the lookup's own deadline, so that it is answered, not timed out:
	// protoactor's future takes an answer without its lock, and one that arrived as the future
	// timed out raced with the timeout's reading of it (the race detector met it in
	// TestActivationDoesNotWaitForAFailedHolderLookup, where both timers fire at one instant).
	f := actor.NewFuture(system, holderLookupTimeout+time.Second)
	go func() { // owned by the batch: it ends with the store call, bounded by holderLookupTimeout
		ctx, cancel := context.WithTimeout(ctx, holderLookupTimeout)
		defer cancel()
		holders, err := placement.Holders(ctx, keys)
		system.Root.Send(f.PID(), &holdersFound{holders: holders, err: err})
	}()
	c.ReenterAfter(f, func(res any, err error) {
		l.busy = false
		h, _ := res.(*holdersFound)
		switch {
		case err != nil:
		case h == nil:
			err = fmt.Errorf("unexpected answer %T", res)
		default:
			err = h.err
		}
		for _, key := range keys {
			var holder Holder
			if err == nil {
				holder = h.holders[key]
			}
			for _, f := range found[key] {
				f(holder, err)
			}
		}
		m.lookUpHolders(c)
	})
}
