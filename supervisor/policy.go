package supervisor

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// OneForOne restarts a failed actor alone, at most max times within the window; past that the
// actor is stopped.
func OneForOne(max int, within time.Duration) actor.SupervisorStrategy {
	return actor.NewOneForOneStrategy(max, within, actor.DefaultDecider)
}

// AlwaysRestart restarts a failed actor every time. The persistence actor uses it: its senders
// keep their writes until acknowledged, so a restart loses nothing.
func AlwaysRestart() actor.SupervisorStrategy {
	return actor.NewRestartingStrategy()
}
