package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
)

// Turn runs one agent turn for its session, so the session stays responsive to commands and new
// messages while the agent works. The agent runs in a goroutine owned by the turn; the goroutine
// touches nothing but its own arguments and sends its result back with system.Root.Send.
// Stopping the turn cancels the agent's context (shutdown, a session's stop or restart); the
// session stops its turn when it has the result, when it stops, and when it restarts. A turn
// the conversation moves past (an interrupt, /stop, a boundary) is cancelled instead
// (cancelRun): it tells its session when the agent's call has returned (callEnded), so the next
// turn never overlaps the cancelled command, and then stops itself.
//
// A panic in the agent is carried back into Receive and handed to the session (turnPanicked),
// which re-raises it: the session restarts with its state reloaded and runs the message again,
// and a message that keeps crashing it is quarantined (G5).
//
// A turn is spawned at the top level, not as a child of its session, from the same Props for
// every turn (Deps.turnProps), and gets its request as its first message (runTurn). A child
// would cost every session that ever ran a turn its children set, and protoactor keeps the last
// stopped child reachable from its parent (PIDSet.Remove leaves the vacated slot of the children
// slice set, and a PID caches its process): ~1.2 KiB per idle session. A stopped turn also
// drops its request and agent at once.
type Turn struct {
	agent   agents.Agent
	req     *agents.Request
	session *actor.PID
	turnID  string
	parent  context.Context
	calls   *AgentCalls
	slots   *AgentSlots

	cancel context.CancelFunc
	steer  chan agents.Message // into the steering relay; open while the agent runs, when it can steer
	marked chan struct{}       // closed on startAgent; only for a turn that marks its head (runTurn.mark)

	ended     bool // the agent's call has returned (its result went to the session)
	cancelled bool // the session cancelled the call and waits for it to return (cancelRun)
}

// MaxSteered bounds the messages steered into one turn; more wait for the next turn.
const MaxSteered = 32

// NewTurn returns the props of the turns that run agent; a turn starts when it receives its
// request (runTurn). parent is the daemon's lifetime context; calls counts the agent calls in
// flight (nil: not counted); slots bounds how many run at once (nil: no bound); rec records
// the turns' actor metrics; dispatcher runs their mailboxes (nil: protoactor's default). The
// props hold nothing per turn, so one value serves every turn of a daemon.
func NewTurn(parent context.Context, agent agents.Agent, calls *AgentCalls, slots *AgentSlots, rec *metrics.Actor, dispatcher actor.Dispatcher) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &Turn{agent: agent, parent: parent, calls: calls, slots: slots}
	}, mailbox(rec, dispatcher)...)
}

// Receive starts the agent on runTurn and reports its result to the session.
func (t *Turn) Receive(c actor.Context) {
	defer func() {
		// A turn has no supervisor of its own (the top-level guardian would restart it empty):
		// a failure of the turn is its session's to handle.
		if v := recover(); v != nil && t.session != nil {
			c.Send(t.session, &turnPanicked{TurnID: t.turnID, Err: fmt.Errorf("turn %s: %v", t.turnID, v), Stack: debug.Stack()})
		}
	}()
	switch m := c.Message().(type) {
	case *runTurn:
		if t.req == nil && t.agent != nil {
			t.req, t.session, t.turnID = m.req, m.session, m.req.Identity.TurnID
			t.start(c, m.steer, m.mark)
		}
	case *startAgent:
		if t.marked != nil {
			close(t.marked)
			t.marked = nil
		}
	case *agentDone:
		if t.session == nil {
			return // stopped: the session no longer waits for it
		}
		t.ended = true
		if t.cancelled {
			t.callEnded(c)
			return
		}
		// The session stops this actor when it has the result: a Terminated (a system message)
		// would overtake the result in the session's mailbox and look like a crash.
		t.closeSteer()
		fin := &TurnFinished{TurnID: t.turnID, Text: respText(m.resp), Err: m.err, Took: m.took, Steered: m.steered}
		if m.resp != nil {
			fin.Usage, fin.RidersLeftOut = m.resp.Usage, m.resp.RidersLeftOut
		}
		c.Send(t.session, fin)
	case *steerIn:
		if t.steer != nil {
			t.steer <- m.msg // never blocks: the session steers at most MaxSteered per turn
		}
	case *agentPanicked:
		if t.session == nil {
			return
		}
		t.ended = true
		if t.cancelled {
			t.callEnded(c) // the session no longer runs this turn: its panic is nobody's to handle
			return
		}
		t.closeSteer()
		c.Send(t.session, &turnPanicked{TurnID: t.turnID, Err: fmt.Errorf("turn %s: agent panicked: %v", t.turnID, m.value), Stack: m.stack})
	case *cancelRun:
		if t.session == nil || t.cancelled {
			return
		}
		t.cancelled = true
		if t.ended {
			t.callEnded(c) // it returned before the cancel: its result is the session's to ignore
			return
		}
		t.closeSteer()
		t.cancel()
	case *actor.Stopping:
		t.closeSteer()
		if t.cancel != nil {
			t.cancel()
		}
		t.release()
	case *actor.Stopped:
		t.release()
	}
}

// callEnded tells the session that the call it cancelled has returned, and stops the turn.
func (t *Turn) callEnded(c actor.Context) {
	c.Send(t.session, &callEnded{TurnID: t.turnID})
	c.Stop(c.Self())
}

// release drops what the turn references beyond its own small state: the request (with its
// copy of the history) and the agent. The agent's goroutine keeps its own copies until it
// returns.
func (t *Turn) release() {
	t.req, t.agent, t.cancel, t.session, t.marked = nil, nil, nil, nil, nil
}

// start runs the agent in a goroutine once the call has its slot. With mark, the goroutine
// then tells the session (slotTaken) and waits for startAgent, the session's mark of the
// turn's head stored, holding its slot: a message struck by an unclean stop is counted again
// only if its agent started (Store.BeginRun), not while it waited for a slot.
func (t *Turn) start(c actor.Context, steer, mark bool) {
	ctx, cancel := context.WithCancel(t.parent)
	t.cancel = cancel
	self, root := c.Self(), c.ActorSystem().Root
	call, ok := t.calls.add()
	if !ok {
		// The daemon stops and has waited for the agent calls (AgentCalls.Close): a call that
		// started now would outlive it. The turn's messages stay pending for the next start.
		c.Send(self, &agentDone{err: ErrAgentCallsClosed})
		return
	}
	agent, req := t.agent, t.req
	var relay *steerRelay
	if steer && agents.CanSteer(agent) {
		relay = newSteerRelay()
		t.steer = relay.in
		r := *req
		r.Steer = relay.out
		req = &r
		go relay.run()
	}
	calls, slots := t.calls, t.slots
	session, turnID := t.session, t.turnID
	var marked chan struct{}
	if mark {
		t.marked = make(chan struct{})
		marked = t.marked
	}
	go func() {
		start := time.Now()
		defer calls.done(call)
		defer func() {
			if v := recover(); v != nil {
				relay.finish()
				root.Send(self, &agentPanicked{value: v, stack: debug.Stack()})
			}
		}()
		if err := slots.acquire(ctx); err != nil {
			// Cancelled while it waited (a /stop, an interrupt, the stop's deadline): the
			// agent never ran, as one that returned at once on its context.
			root.Send(self, &agentDone{err: err, took: time.Since(start), steered: relay.finish()})
			return
		}
		defer slots.release()
		if marked != nil {
			root.Send(session, &slotTaken{TurnID: turnID})
			select {
			case <-marked:
			case <-ctx.Done():
				root.Send(self, &agentDone{err: context.Cause(ctx), took: time.Since(start), steered: relay.finish()})
				return
			}
		}
		resp, err := agent.Run(ctx, req)
		steered := relay.finish()
		if resp != nil {
			steered = max(steered-resp.Unseen, 0) // the last ones it took: they run next
		}
		root.Send(self, &agentDone{resp: resp, err: err, took: time.Since(start), steered: steered})
	}()
}

// AgentSlots bounds the agent calls that run at once, over every session (agent.max_concurrent):
// a burst of chats (a Discord backfill of many channels, the recovery of a restart, a busy
// hour) would otherwise start an exec command or a model request for each at once, hundreds
// of processes on the host or a storm of 429s from the endpoint. A call waits for a slot, first
// come first served, and a session runs one turn at a time, so each chat keeps its order. A
// nil *AgentSlots bounds nothing.
type AgentSlots struct {
	free    chan struct{} // one token per running call
	waiting prometheus.Gauge
	waited  prometheus.Histogram
	log     *slog.Logger
	warn    logging.Counter // the line of calls that wait
}

// NewAgentSlots returns slots for n calls at once; nil when n <= 0 (no bound). waiting counts
// the calls that wait (agentgate_agent_calls_waiting), waited how long each call that got its
// slot waited for it (agentgate_agent_slot_wait_seconds).
func NewAgentSlots(n int, waiting prometheus.Gauge, waited prometheus.Histogram, log *slog.Logger) *AgentSlots {
	if n <= 0 {
		return nil
	}
	return &AgentSlots{free: make(chan struct{}, n), waiting: waiting, waited: waited, log: log}
}

// acquire takes a slot, waiting while every one is taken, until ctx ends.
func (s *AgentSlots) acquire(ctx context.Context) error {
	if s == nil {
		return nil
	}
	select {
	case s.free <- struct{}{}:
		s.waited.Observe(0)
		return nil
	default:
	}
	start := time.Now()
	s.waiting.Inc()
	defer s.waiting.Dec()
	if n, ok := s.warn.Allow(); ok {
		s.log.Warn("agent calls wait for a free slot: agent.max_concurrent calls are running", "max_concurrent", cap(s.free), "waits", n)
	}
	select {
	case s.free <- struct{}{}:
		s.waited.Observe(time.Since(start).Seconds())
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// release gives a slot back.
func (s *AgentSlots) release() {
	if s != nil {
		<-s.free
	}
}

// steerRelay hands steered messages to the agent one at a time over an unbuffered channel, and
// counts exactly those the agent received: a message still waiting when the agent answers was
// not seen by it, so the session runs it as the next turn instead of counting it answered.
type steerRelay struct {
	in   chan agents.Message // from the Turn actor, which closes it when the turn ends
	out  chan agents.Message // Request.Steer; closed by the relay when it ends
	stop chan struct{}       // closed by finish
	once sync.Once
	mu   sync.Mutex // held across each hand-over, so finish reads a settled count
	n    int
}

func newSteerRelay() *steerRelay {
	return &steerRelay{in: make(chan agents.Message, MaxSteered), out: make(chan agents.Message), stop: make(chan struct{})}
}

// run forwards in to out until in is closed or finish is called. Its goroutine is owned by the
// turn: it ends with the agent's call at the latest.
func (r *steerRelay) run() {
	defer close(r.out)
	for {
		select {
		case m, ok := <-r.in:
			if !ok {
				return
			}
			r.mu.Lock()
			select {
			case r.out <- m:
				r.n++
				r.mu.Unlock()
			case <-r.stop:
				r.mu.Unlock()
				return
			}
		case <-r.stop:
			return
		}
	}
}

// finish stops the relay (the agent has returned) and reports how many messages the agent
// received. It is safe on a nil relay (no steering) and to call twice.
func (r *steerRelay) finish() int {
	if r == nil {
		return 0
	}
	r.once.Do(func() { close(r.stop) })
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

func respText(r *agents.Response) string {
	if r == nil {
		return ""
	}
	return r.Text
}

// closeSteer ends the steering channel: the agent has answered (or is being cancelled).
func (t *Turn) closeSteer() {
	if t.steer != nil {
		close(t.steer)
		t.steer = nil
	}
}

// AgentCalls counts the agent calls in flight, so that a stopping daemon can wait for them
// (Close, Wait): a stop cancels every turn, but an agent needs a moment to end what it started
// (the exec agent signals its command's process group and kills it after its grace period). A
// daemon that exited first left the processes its commands started running, reparented to
// init. Once closed, no call starts: a turn whose request reached it after the stop's wait (a
// session restarted by a crash as the daemon stopped) would otherwise run its agent beside the
// next start's rerun of the same message. A restarted session manager waits for the calls in
// flight as it starts, and for those alone (inFlight). The zero value counts; a nil
// *AgentCalls counts nothing.
type AgentCalls struct {
	mu      sync.Mutex
	running map[chan struct{}]struct{} // each call's, closed as it returns
	closed  bool
	waiters []chan struct{} // closed when none runs
}

// ErrAgentCallsClosed is a turn's error when its call would start after the daemon's stop
// waited for the agent calls (AgentCalls.Close).
var ErrAgentCallsClosed = errors.New("the daemon is stopping: no agent call starts")

// add counts a call that starts, and returns what done takes when it returns; ok is false once
// closed.
func (a *AgentCalls) add() (call chan struct{}, ok bool) {
	if a == nil {
		return nil, true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, false
	}
	if a.running == nil {
		a.running = map[chan struct{}]struct{}{}
	}
	call = make(chan struct{})
	a.running[call] = struct{}{}
	return call, true
}

// Close lets no more calls start; those in flight go on, and Wait waits for them.
func (a *AgentCalls) Close() {
	if a == nil {
		return
	}
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
}

// done counts off the call add returned.
func (a *AgentCalls) done(call chan struct{}) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.running, call)
	close(call)
	if len(a.running) == 0 {
		for _, w := range a.waiters {
			close(w)
		}
		a.waiters = nil
	}
}

// Running returns how many agent calls are in flight.
func (a *AgentCalls) Running() int {
	if a == nil {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.running)
}

// Wait returns nil once no agent call is in flight, or ctx's error if ctx ends first.
func (a *AgentCalls) Wait(ctx context.Context) error {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	if len(a.running) == 0 {
		a.mu.Unlock()
		return nil
	}
	idle := make(chan struct{})
	a.waiters = append(a.waiters, idle)
	a.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// inFlight returns the agent calls in flight now, to wait for them alone (callsInFlight.wait):
// a call that starts later is not among them.
func (a *AgentCalls) inFlight() callsInFlight {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	calls := make(callsInFlight, 0, len(a.running))
	for call := range a.running {
		calls = append(calls, call)
	}
	return calls
}

// callsInFlight are some agent calls in flight (AgentCalls.inFlight).
type callsInFlight []chan struct{}

// wait returns nil once every one of the calls has returned, or ctx's error if ctx ends first.
func (calls callsInFlight) wait(ctx context.Context) error {
	for _, call := range calls {
		select {
		case <-call:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
