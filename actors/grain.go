package actors

import (
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
)

// SessionKind is the cluster kind of sessions; a session's cluster identity is its key.
const SessionKind = "session"

// SessionGrain is the cluster grain of a session key: a shell through which the cluster
// reaches the key's session on the member that owns the key. It hands every message to the
// member's SessionManager, which runs the Session actor exactly as in a single daemon (spawns
// it, passivates it, supervises it, counts it busy for drains). When the session stops for good
// the manager stops the grain; when the grain stops (the cluster moved the key to another
// member, or this member leaves) the manager stops the session.
//
// The grain is a child of the cluster's placement actor, whose supervision the grain cannot
// choose; it holds no state and cannot fail, so all of that stays with the manager.
type SessionGrain struct {
	manager *actor.PID
	key     string
}

// NewSessionKind returns the cluster kind of sessions, whose grains hand their messages to the
// manager that manager returns (called once per grain: the manager is spawned after the kind
// is configured).
func NewSessionKind(manager func() *actor.PID) *cluster.Kind {
	return cluster.NewKind(SessionKind, actor.PropsFromProducer(func() actor.Actor {
		return &SessionGrain{manager: manager()}
	}))
}

// Receive forwards the session's messages with their sender, so a reply goes straight to the
// requester, on whichever member it waits.
func (g *SessionGrain) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		g.key = cluster.GetClusterIdentity(c).Identity
	case *actor.Stopping:
		c.Send(g.manager, &grainStopped{key: g.key, grain: c.Self()})
	case *actor.Stopped, *actor.Restarting, *cluster.ClusterInit:
	case *actor.PoisonPill, *actor.Terminated:
	default:
		r := &Routed{Key: g.key, Msg: m, Grain: c.Self()}
		if c.Sender() != nil {
			c.RequestWithCustomSender(g.manager, r, c.Sender())
		} else {
			c.Send(g.manager, r)
		}
	}
}
