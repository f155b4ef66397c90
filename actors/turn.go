package actors

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/asynkron/protoactor-go/actor"
)

// Turn runs one agent turn as a child of its session, so the session stays responsive to
// commands and new messages while the agent works. The agent runs in a goroutine owned by the
// turn; the goroutine touches nothing but its own arguments and sends its result back with
// system.Root.Send. Stopping the turn cancels the agent's context (interrupt, /stop, shutdown).
//
// A panic in the agent is carried back into Receive and re-raised there, so the session's
// supervisor sees a failed turn and stops it; the session then answers the user with an error.
type Turn struct {
	agent  agents.Agent
	req    *agents.Request
	parent context.Context
	box    *metrics.Mailbox

	cancel context.CancelFunc
	steer  chan agents.Message // into the steering relay; open while the agent runs, when it can steer
}

// MaxSteered bounds the messages steered into one turn; more wait for the next turn.
const MaxSteered = 32

// NewTurn returns the props of a turn that runs agent for req. parent is the daemon's lifetime
// context; box counts the turns' mailbox depth.
func NewTurn(parent context.Context, agent agents.Agent, req *agents.Request, box *metrics.Mailbox) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &Turn{agent: agent, req: req, parent: parent, box: box}
	}, actor.WithMailbox(actor.Unbounded(box)))
}

// Receive starts the agent on Started and reports its result to the session.
func (t *Turn) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		t.start(c)
	case *agentDone:
		// The session stops this actor when it has the result: a Terminated (a system message)
		// would overtake the result in the session's mailbox and look like a crash.
		t.closeSteer()
		fin := &TurnFinished{TurnID: t.req.Identity.TurnID, Text: respText(m.resp), Err: m.err, Took: m.took, Steered: m.steered}
		if m.resp != nil {
			fin.Usage = m.resp.Usage
		}
		c.Send(c.Parent(), fin)
	case *steerIn:
		if t.steer != nil {
			t.steer <- m.msg // never blocks: the session steers at most MaxSteered per turn
		}
	case *agentPanicked:
		t.box.Failed() // the mailbox never sees this message received: it panics
		panic(fmt.Errorf("turn %s: agent panicked: %v", t.req.Identity.TurnID, m.value))
	case *actor.Stopping:
		t.closeSteer()
		if t.cancel != nil {
			t.cancel()
		}
	}
}

func (t *Turn) start(c actor.Context) {
	ctx, cancel := context.WithCancel(t.parent)
	t.cancel = cancel
	self, root := c.Self(), c.ActorSystem().Root
	agent, req := t.agent, t.req
	var relay *steerRelay
	if agents.CanSteer(agent) {
		relay = newSteerRelay()
		t.steer = relay.in
		r := *req
		r.Steer = relay.out
		req = &r
		go relay.run()
	}
	go func() {
		start := time.Now()
		defer func() {
			if v := recover(); v != nil {
				relay.finish()
				root.Send(self, &agentPanicked{value: v})
			}
		}()
		resp, err := agent.Run(ctx, req)
		root.Send(self, &agentDone{resp: resp, err: err, took: time.Since(start), steered: relay.finish()})
	}()
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
