package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Actor is what agentgate records about the actors of one kind: their mailbox depth (Box), the
// time each takes to handle a message, and how many start and stop. One value serves every
// actor of its kind; all methods are safe for concurrent use and cost a few tens of
// nanoseconds (pre-resolved series, no labels built per message), so they stay on where
// protoactor's own actor metrics (an OpenTelemetry attribute set and a fmt.Sprintf per
// message) are opt-in.
type Actor struct {
	Box      *Mailbox
	handling prometheus.Observer
	starts   prometheus.Counter
	stops    prometheus.Counter
}

// Started counts an actor that received protoactor's Started: a spawn, or a restart after a
// failure.
func (a *Actor) Started() { a.starts.Inc() }

// Stopped counts an actor that received protoactor's Stopped.
func (a *Actor) Stopped() { a.stops.Inc() }

// Handled records the time an actor took to handle one message.
func (a *Actor) Handled(d time.Duration) { a.handling.Observe(d.Seconds()) }

// actorSeries are the labelled collectors behind Actor values.
type actorSeries struct {
	handling *prometheus.HistogramVec
	starts   *prometheus.CounterVec
	stops    *prometheus.CounterVec
	kinds    map[string]*Actor
	other    *Actor // for a kind not in ActorKinds: recorded nowhere that is exported
}

func newActorSeries(boxes *MailboxDepths) *actorSeries {
	s := &actorSeries{
		handling: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "agentgate_actor_message_seconds", Help: "Time an actor took to handle one message, by actor kind.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 11)}, []string{"kind"}),
		starts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentgate_actor_starts_total", Help: "Actors started (spawned, or restarted after a failure), by actor kind."}, []string{"kind"}),
		stops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentgate_actor_stops_total", Help: "Actors stopped, by actor kind."}, []string{"kind"}),
		kinds: map[string]*Actor{},
		other: &Actor{Box: &Mailbox{}, handling: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "unexported"}),
			starts: prometheus.NewCounter(prometheus.CounterOpts{Name: "unexported"}),
			stops:  prometheus.NewCounter(prometheus.CounterOpts{Name: "unexported"})},
	}
	for _, k := range ActorKinds {
		s.kinds[k] = &Actor{Box: boxes.depths[k], handling: s.handling.WithLabelValues(k),
			starts: s.starts.WithLabelValues(k), stops: s.stops.WithLabelValues(k)}
	}
	return s
}

func (s *actorSeries) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.handling, s.starts, s.stops}
}

// Actor returns the recorder of an actor kind (one of ActorKinds). An unknown kind shares one
// that is not exported.
func (m *Metrics) Actor(kind string) *Actor {
	if a, ok := m.actors.kinds[kind]; ok {
		return a
	}
	return m.actors.other
}
