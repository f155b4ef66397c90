package supervisor

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// Child is one top-level actor of the supervision tree.
type Child struct {
	// Name is the actor's registered name and its "kind" in logs and metrics.
	Name string
	// Props builds the actor's props from the daemon (called once, at start).
	Props func(d *Daemon) *actor.Props
	// Policy supervises the actor itself (it becomes the props' guardian).
	Policy actor.SupervisorStrategy
}

// tree returns the top-level actors in start order; they stop in reverse order. Platform
// actors come before the session manager so that recovered sessions can send replies, and stop
// after it so that turns finishing during the drain can still deliver. The reset timer comes
// last: it talks to sessions through the manager. The probation actor (a single daemon's)
// comes before the manager, whose sessions ask it.
func tree(d *Daemon) []Child {
	children := []Child{
		{Name: "persistence", Props: persistenceProps, Policy: AlwaysRestart()},
	}
	for _, p := range d.platforms {
		children = append(children, Child{Name: "platform-" + p.Name(), Props: platformProps(p), Policy: OneForOne(10, time.Minute)})
	}
	if !d.deps.Fencing {
		// A single daemon counts its unclean stops (Store.BeginRun); its suspect messages run
		// one at a time (actors.Probation). Sessions ask it, so it starts before them.
		children = append(children, Child{Name: "probation", Props: probationProps, Policy: OneForOne(10, time.Minute)})
	}
	return append(children,
		Child{Name: "sessions", Props: managerProps, Policy: OneForOne(10, time.Minute)},
		Child{Name: "timers", Props: timersProps, Policy: OneForOne(10, time.Minute)})
}
