package supervisor

import (
	"log/slog"
	goruntime "runtime"
	"strings"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
)

// endpointGuard keeps protoactor's remote from panicking when a peer's connection ends while
// the remote stops (asynkron/protoactor-go at the pinned version).
//
// The remote's endpoint manager hears of an ended connection through the event stream: the
// goroutine that reads the connection (the endpoint writer's receive loop) publishes an
// EndpointTerminatedEvent, and the manager's handler removes the endpoint from its map. Its
// graceful stop unsubscribes that handler and, two actor stops later, sets the map to nil. The
// event stream calls the handlers of a snapshot taken before the call, so a publication whose
// snapshot predates the unsubscription still reaches the handler, and if it does so after the
// map was set to nil, the handler dereferences it on protoactor's goroutine and the process
// ends with a panic (exit status 2), after a stop that had otherwise finished.
//
// The guard subscribes before the remote starts, so it comes before the manager in every
// snapshot (the event stream moves its last subscription into a freed place, and none before
// the guard is ever freed: protoactor's own, made with the actor system). On a receive loop's
// event it publishes the event again itself, under a read lock, so that every handler runs
// while the stop cannot begin, and then ends that goroutine (runtime.Goexit) so that the
// original publication goes no further. Once the stop has begun it ends such a goroutine
// without publishing: the manager is going away. Ending the loop is what it does after every
// lost connection; after a peer's DisconnectRequest it would read on until the connection
// ends, which the endpoint writer the event stops does by closing it.
//
// Events published elsewhere (an endpoint writer that could not connect, on its actor's
// goroutine) pass through: the stop waits for that actor before it sets the map to nil.
type endpointGuard struct {
	system *actor.ActorSystem

	mu       sync.RWMutex
	stopping bool
	again    sync.Map // events being published again, by pointer

	hold func() // tests: runs as a receive loop's event reaches the guard
}

// receiveLoop names the endpoint writer's receive loop, the closure in initializeInternal.
const receiveLoop = "github.com/asynkron/protoactor-go/remote.(*endpointWriter).initializeInternal.func"

func guardEndpoints(system *actor.ActorSystem) *endpointGuard {
	g := &endpointGuard{system: system}
	system.EventStream.SubscribeWithPredicate(g.handle, func(evt any) bool {
		_, ok := evt.(*remote.EndpointTerminatedEvent)
		return ok
	})
	return g
}

func (g *endpointGuard) handle(evt any) {
	if _, again := g.again.Load(evt); again || !fromReceiveLoop() {
		return
	}
	if g.hold != nil {
		g.hold()
	}
	g.mu.RLock()
	if !g.stopping {
		g.again.Store(evt, struct{}{})
		g.system.EventStream.Publish(evt)
		g.again.Delete(evt)
	}
	g.mu.RUnlock()
	goruntime.Goexit()
}

// shutdown stops the remote (shutdownRemote) once no receive loop's event is on its way to
// the handlers.
func (g *endpointGuard) shutdown(r *remote.Remote, log *slog.Logger) {
	g.mu.Lock()
	g.stopping = true
	g.mu.Unlock()
	shutdownRemote(r, log)
}

// fromReceiveLoop reports whether the calling goroutine is an endpoint writer's receive loop.
func fromReceiveLoop() bool {
	var pcs [32]uintptr
	frames := goruntime.CallersFrames(pcs[:goruntime.Callers(2, pcs[:])])
	for {
		f, more := frames.Next()
		if strings.HasPrefix(f.Function, receiveLoop) {
			return true
		}
		if !more {
			return false
		}
	}
}
