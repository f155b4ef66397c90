package actors

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// Dispatcher runs the mailboxes of agentgate's actors on a pool of long-lived goroutines.
//
// protoactor's default dispatcher starts a new goroutine every time an idle mailbox gets a
// message. A new goroutine starts with a small stack, and a session's or turn's call chain
// grows it several times (runtime.copystack was ~10 % of the daemon's CPU at its write
// ceiling). A pool worker keeps its grown stack from one mailbox run to the next. When no
// worker is idle, Schedule starts a new one (up to max; beyond that a plain goroutine runs the
// mailbox once), so a mailbox never waits for a busy worker and an actor that blocks cannot
// hold up another.
type Dispatcher struct {
	throughput int
	max        int32
	work       chan func() // unbuffered: a send succeeds only when a worker is idle
	done       chan struct{}
	stopOnce   sync.Once
	workers    atomic.Int32 // pool workers alive
}

var _ actor.Dispatcher = (*Dispatcher)(nil)

// NewDispatcher returns a dispatcher with at most perProc pool workers per GOMAXPROCS that lets
// a mailbox handle throughput messages before it yields.
func NewDispatcher(throughput, perProc int) *Dispatcher {
	return &Dispatcher{throughput: throughput, max: int32(perProc * runtime.GOMAXPROCS(0)),
		work: make(chan func()), done: make(chan struct{})}
}

// Schedule implements actor.Dispatcher.
func (d *Dispatcher) Schedule(fn func()) {
	select {
	case d.work <- fn:
		return
	default:
	}
	if d.workers.Add(1) <= d.max {
		go d.worker(fn)
		return
	}
	d.workers.Add(-1)
	go fn()
}

// Throughput implements actor.Dispatcher.
func (d *Dispatcher) Throughput() int { return d.throughput }

// Stop ends the idle workers; a busy one ends when its mailbox run returns. Mailboxes scheduled
// afterwards run on plain goroutines.
func (d *Dispatcher) Stop() {
	d.stopOnce.Do(func() { close(d.done) })
}

func (d *Dispatcher) worker(fn func()) {
	defer d.workers.Add(-1)
	for {
		fn()
		fn = nil // an idle worker keeps no mailbox reachable
		select {
		case fn = <-d.work:
		case <-d.done:
			return
		}
	}
}
