package supervisor

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/eventstream"
)

// eventLog logs supervisor events at Warn with the actor kind and counts them (protoactor
// itself logs them only at Info), and counts dead letters. stopped, when set, hears of every
// actor a supervisor stopped for failing (StopDirective): one that failed more often than its
// policy restarts.
type eventLog struct {
	system *actor.ActorSystem
	sub    *eventstream.Subscription
}

func watchEvents(system *actor.ActorSystem, log *slog.Logger, m *metrics.Metrics, stopped func(pid *actor.PID, reason any)) *eventLog {
	log = log.With("component", "supervisor")
	sub := system.EventStream.Subscribe(func(evt any) {
		if _, ok := evt.(*actor.DeadLetterEvent); ok {
			m.DeadLetters.Inc()
			return
		}
		e, ok := evt.(*actor.SupervisorEvent)
		if !ok {
			return
		}
		kind := kindOf(e.Child)
		if e.Directive == actor.StopDirective && stopped != nil {
			stopped(e.Child, e.Reason) // before the count, which a test may wait for
		}
		// An escalation is counted where it lands: as the restart (or stop) of the parent.
		if e.Directive != actor.EscalateDirective {
			m.ActorRestarts.WithLabelValues(kind).Inc()
		}
		// A session's crash is logged by the session (or its manager) in one line with its key,
		// the panic and what follows; here it is at Debug, not a second line of each crash
		// (TestSessionCrashLogsOneLinePerCrash). The actor's id names a session's key
		// (sessions/<key>).
		level := slog.LevelWarn
		if kind == "session" {
			level = slog.LevelDebug
		}
		log.Log(context.Background(), level, "actor failed", "kind", kind, logging.KeyActor, e.Child.GetId(), "directive", e.Directive.String(), "reason", fmt.Sprint(e.Reason))
	})
	return &eventLog{system: system, sub: sub}
}

func (e *eventLog) close() { e.system.EventStream.Unsubscribe(e.sub) }

// kindOf maps an actor's PID to its bounded kind label.
func kindOf(pid *actor.PID) string {
	if pid == nil {
		return "unknown"
	}
	id := pid.Id
	switch {
	case strings.HasPrefix(id, "turn-"): // top level (actors.Turn)
		return "turn"
	case strings.HasPrefix(id, "sessions/"):
		return "session"
	case id == "sessions":
		return "manager"
	case strings.HasPrefix(id, "persistence"):
		return "persistence"
	case strings.HasPrefix(id, "platform-"):
		return "platform"
	}
	return "other"
}
