// Package metrics holds agentgate's Prometheus metrics on an own registry (never the default
// one). Labels are bounded: platform names, actor kinds, outcomes and policies, never a session
// key, chat id or user id. Labelled metrics are pre-initialised for every known label value so
// they show from the first scrape.
package metrics

import (
	"fmt"
	"net/http"
	"slices"

	"go.opentelemetry.io/otel"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Known label values.
var (
	TurnOutcomes     = []string{"ok", "error", "crashed", "cancelled"}
	OverflowPolicies = []string{"spool", "reject"}
	ActorKinds       = []string{"session", "turn", "persistence", "manager", "platform"}
	// RestartKinds are ActorKinds and "other": the timers and probation actors, whose
	// mailboxes are not measured but whose failures are counted.
	RestartKinds    = append(slices.Clone(ActorKinds), "other")
	SendOutcomes    = []string{"ok", "error"}
	TokenDirections = []string{"input", "output"}
	// QuarantineCauses: a message crashed its session QuarantineAfter times, or it was running
	// when the daemon stopped uncleanly that often (it may take the whole process down).
	QuarantineCauses = []string{"session_crash", "unclean_restart"}
	// MessageCodes are the statuses of POST /v1/messages whose series exist from the start,
	// so that an alert on a 503's rate has a series before the first one: accepted, answered
	// (?wait), refused for a full queue, and told to send again.
	MessageCodes = []string{"200", "202", "429", "503"}
)

// Metrics are the collectors agentgate updates. All methods are safe for concurrent use.
type Metrics struct {
	Registry *prometheus.Registry

	SessionsActive      prometheus.Gauge
	SessionActivations  prometheus.Counter
	SessionPassivations prometheus.Counter
	SessionsFenced      prometheus.Counter
	// SessionsHandedOn and SessionsTakenOver count a cluster's hand-overs that are not fencing:
	// sessions that handed their key on to another member, and sessions with work pending
	// taken over from a member that died.
	SessionsHandedOn    prometheus.Counter
	SessionsTakenOver   prometheus.Counter
	ClusterMembers      prometheus.Gauge
	TurnsTotal          *prometheus.CounterVec
	TurnDuration        prometheus.Histogram
	QueueDepth          prometheus.Histogram
	QueueOverflow       *prometheus.CounterVec
	PersistBatchSize    prometheus.Histogram
	PersistFlushSeconds prometheus.Histogram
	SpoolFiles          prometheus.Gauge
	ActorRestarts       *prometheus.CounterVec
	// Mailboxes exports agentgate_mailbox_depth; each kind's counter is Actor(kind).Box.
	Mailboxes     *MailboxDepths
	InboundTotal  *prometheus.CounterVec
	OutboundTotal *prometheus.CounterVec
	// AgentTokens counts the model tokens turns used, by direction (input, output).
	AgentTokens *prometheus.CounterVec
	// DeadLetters counts messages sent to actors that no longer exist.
	DeadLetters prometheus.Counter
	// MessagesQuarantined counts messages set aside for crashing, by cause (QuarantineCauses).
	MessagesQuarantined *prometheus.CounterVec
	// MessagesRequeued counts quarantined messages an operator requeued (they run again).
	MessagesRequeued prometheus.Counter
	// ProbationWaiting is how many sessions wait for the probation token to run a suspect
	// message (one the daemon's unclean stops were counted against twice).
	ProbationWaiting prometheus.Gauge
	// AgentCallsWaiting is how many turns wait for a free agent slot (agent.max_concurrent).
	AgentCallsWaiting prometheus.Gauge
	// AgentSlotWait is how long agent calls waited for their slot (0 for one that found it free).
	AgentSlotWait prometheus.Histogram
	// ModelRequests counts the openai agent's requests to its endpoint, each retry its own, by
	// result (openai.RequestResults, which the daemon pre-initialises with InitModelRequests).
	ModelRequests *prometheus.CounterVec
	// HTTPRequests counts the HTTP API's answers by route (the pattern that served the request,
	// method included; "other" for none) and status code: a 503 of POST /v1/messages is a
	// message a client was told to send again.
	HTTPRequests *prometheus.CounterVec
	// HTTPConnectionsOpen, HTTPConnectionsLimit and HTTPConnectionsLimitReached are the HTTP
	// API's connections open, its limit of them (http.max_connections), and the times the last
	// of them was taken: at the limit, new connections wait in the listen backlog unanswered.
	HTTPConnectionsOpen         prometheus.Gauge
	HTTPConnectionsLimit        prometheus.Gauge
	HTTPConnectionsLimitReached prometheus.Counter
	// WritesRefused counts the write groups neither the database nor the spool took (a full
	// or read-only disk, where agentgate_spool_files stays 0).
	WritesRefused prometheus.Counter
	// StoreCorrupt is 1 once the SQLite store has found its database damaged while the daemon
	// runs: what meets the damage fails as in an outage, but it does not pass by itself, and
	// the spool and refusal metrics need not move (a new chat's session fails as it loads).
	StoreCorrupt prometheus.Gauge

	actors *actorSeries
}

// New builds the metrics on a fresh registry with the Go runtime, process and build
// (go_build_info: the module's version) collectors, and
// pre-initialises every labelled series for the given platform names.
func New(platforms ...string) *Metrics {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewBuildInfoCollector())
	f := func(c prometheus.Collector) { r.MustRegister(c) }
	m := &Metrics{
		Registry: r,
		SessionsActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentgate_sessions_active", Help: "Session actors currently in memory."}),
		SessionActivations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentgate_session_activations_total", Help: "Session actors started (first message, timer or recovery)."}),
		SessionPassivations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentgate_session_passivations_total", Help: "Idle session actors stopped; their state is durable."}),
		SessionsFenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentgate_sessions_fenced_total", Help: "Session actors stopped because another activation claimed their key (shared store)."}),
		SessionsHandedOn: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentgate_sessions_handed_on_total", Help: "Sessions that handed their key on to another member: this member left the cluster, or the cluster placed the key elsewhere (cluster mode)."}),
		SessionsTakenOver: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentgate_sessions_taken_over_total", Help: "Sessions with a message pending taken over from a member that stopped uncleanly (cluster mode)."}),
		ClusterMembers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentgate_cluster_members", Help: "Members of the cluster this member sees, itself included (0 outside cluster mode)."}),
		TurnsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentgate_turns_total", Help: "Agent turns by outcome."}, []string{"outcome"}),
		TurnDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "agentgate_turn_duration_seconds", Help: "Wall time of agent turns.",
			Buckets: turnBuckets}),
		QueueDepth: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "agentgate_queue_depth", Help: "Waiting messages of a session, observed at each arrival.",
			Buckets: []float64{0, 1, 2, 5, 10, 20, 50, 100, 500}}),
		QueueOverflow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentgate_queue_overflow_total", Help: "Messages that arrived at a full queue, by overflow policy."}, []string{"policy"}),
		PersistBatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "agentgate_persist_batch_size", Help: "Write groups per committed transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11)}),
		PersistFlushSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "agentgate_persist_flush_seconds", Help: "Time to commit one batch.",
			Buckets: flushBuckets}),
		SpoolFiles: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentgate_spool_files", Help: "Writes waiting in the spool for the database to recover."}),
		WritesRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentgate_persist_writes_refused_total", Help: "Writes refused because neither the database nor the spool took them (a full or read-only disk); their senders were told to send them again."}),
		StoreCorrupt: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentgate_store_corrupt", Help: "1 once the SQLite database was found damaged, or its file deleted or replaced, while the daemon runs (neither mends: stop the daemon and restore the database), else 0."}),
		ActorRestarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentgate_actor_restarts_total", Help: "Supervisor restarts and stops of failed actors, by actor kind."}, []string{"kind"}),
		Mailboxes: newMailboxDepths(ActorKinds),
		InboundTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentgate_inbound_total", Help: "Inbound messages accepted from platforms; a re-delivery answered as a duplicate is not counted."}, []string{"platform"}),
		OutboundTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentgate_outbound_total", Help: "Outbound sends to platforms, by outcome."}, []string{"platform", "outcome"}),
		AgentTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentgate_agent_tokens_total", Help: "Model tokens used by agent turns, by direction (input: prompt, output: completion)."}, []string{"direction"}),
		DeadLetters: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentgate_actor_deadletters_total", Help: "Messages sent to actors that had stopped (protoactor dead letters)."}),
		MessagesQuarantined: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentgate_messages_quarantined_total", Help: "Messages set aside for crashing, by cause (session_crash, unclean_restart)."}, []string{"cause"}),
		MessagesRequeued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentgate_messages_requeued_total", Help: "Quarantined messages an operator requeued to run again."}),
		ProbationWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentgate_probation_waiting", Help: "Sessions whose next message, counted against by 2 unclean stops, waits to run alone among such messages."}),
		AgentCallsWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentgate_agent_calls_waiting", Help: "Turns waiting for a free agent slot: agent.max_concurrent calls are running."}),
		AgentSlotWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "agentgate_agent_slot_wait_seconds", Help: "Time agent calls waited for a free slot (agent.max_concurrent); 0 for a call that found one free.",
			Buckets: slotWaitBuckets}),
		ModelRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentgate_model_requests_total", Help: "Requests of the openai agent to its model endpoint, each retry counted, by result."}, []string{"result"}),
		HTTPRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentgate_http_requests_total", Help: "HTTP API answers by route and status code; an event stream is counted when it ends."}, []string{"route", "code"}),
		HTTPConnectionsOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentgate_http_connections_open", Help: "Connections the HTTP API holds open, idle ones included; at agentgate_http_connections_limit, new connections wait in the listen backlog."}),
		HTTPConnectionsLimit: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentgate_http_connections_limit", Help: "The most connections the HTTP API holds open at once (http.max_connections)."}),
		HTTPConnectionsLimitReached: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentgate_http_connections_limit_reached_total", Help: "Times a connection took the last place under http.max_connections: until one closed, new connections waited in the listen backlog."}),
	}
	m.actors = newActorSeries(m.Mailboxes)
	for _, c := range []prometheus.Collector{m.SessionsActive, m.SessionActivations, m.SessionPassivations, m.SessionsFenced, m.SessionsHandedOn, m.SessionsTakenOver, m.ClusterMembers,
		m.TurnsTotal, m.TurnDuration, m.QueueDepth, m.QueueOverflow, m.PersistBatchSize, m.PersistFlushSeconds,
		m.SpoolFiles, m.WritesRefused, m.StoreCorrupt, m.ActorRestarts, m.Mailboxes, m.InboundTotal, m.OutboundTotal, m.AgentTokens, m.DeadLetters, m.MessagesQuarantined, m.MessagesRequeued, m.ProbationWaiting, m.AgentCallsWaiting, m.AgentSlotWait, m.ModelRequests, m.HTTPRequests,
		m.HTTPConnectionsOpen, m.HTTPConnectionsLimit, m.HTTPConnectionsLimitReached} {
		f(c)
	}
	for _, c := range m.actors.collectors() {
		f(c)
	}
	initSeries(m.TurnsTotal, TurnOutcomes)
	initSeries(m.QueueOverflow, OverflowPolicies)
	initSeries(m.ActorRestarts, RestartKinds)
	initSeries(m.AgentTokens, TokenDirections)
	initSeries(m.MessagesQuarantined, QuarantineCauses)
	initSeries(m.InboundTotal, platforms)
	for _, code := range MessageCodes {
		m.HTTPRequests.WithLabelValues("POST /v1/messages", code)
	}
	for _, p := range platforms {
		for _, o := range SendOutcomes {
			m.OutboundTotal.WithLabelValues(p, o)
		}
	}
	return m
}

// InitModelRequests creates the series of agentgate_model_requests_total for each result, so
// that each reads 0 from the first scrape of a daemon whose agent calls a model.
func (m *Metrics) InitModelRequests(results []string) { initSeries(m.ModelRequests, results) }

// initSeries creates the series of a one-label counter for each of values, so that each reads 0
// before its first count.
func initSeries(c *prometheus.CounterVec, values []string) {
	for _, v := range values {
		c.WithLabelValues(v)
	}
}

// Histogram buckets, in seconds, each list for what its histogram measures, with bounds that
// read as written on a scrape (le="0.0003", not the 0.00030000000000000003 of a computed
// series).
var (
	// turnBuckets resolve agent turns: an echo or a tool's turn takes milliseconds, a model's
	// 1 to 16 s, and agent.exec.timeout is 600 s by default.
	turnBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600}
	// slotWaitBuckets count the calls that found a slot free (0) apart, then waits as long as
	// the turns waited for, up to their timeout.
	slotWaitBuckets = []float64{0, 0.01, 0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600}
	// flushBuckets resolve a commit: a fraction of a millisecond to milliseconds with fsync,
	// up to SQLite's busy timeout (5 s) behind a lock.
	flushBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	// actorReceiveBuckets resolve protoactor's message handling time, from microseconds
	// (most messages) to a slow handler's seconds.
	actorReceiveBuckets = []float64{0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10}
)

// actorReceiveDuration is protoactor's histogram of message handling time. protoactor records
// it in seconds without declaring a unit, so OpenTelemetry gave it its default buckets (0, 5,
// 10 … 10000, meant for milliseconds): every observation fell in le="5".
const actorReceiveDuration = "protoactor_actor_message_receive_duration_seconds"

// ActorMeterProvider returns an OpenTelemetry meter provider that exports into this registry,
// for protoactor's own actor metrics (protoactor_*: spawns, restarts, message durations, dead
// letters), which config metrics.actors turns on. The
// caller passes it to actor.WithMetricProviders and shuts it down on stop. protoactor reads the
// global provider (otel.Meter), so this sets it too: one daemon per process.
func (m *Metrics) ActorMeterProvider() (*sdkmetric.MeterProvider, error) {
	exp, err := otelprom.New(otelprom.WithRegisterer(m.Registry))
	if err != nil {
		return nil, fmt.Errorf("actor metrics exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithView(sdkmetric.NewView(
		sdkmetric.Instrument{Name: actorReceiveDuration},
		sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{Boundaries: actorReceiveBuckets}},
	)))
	otel.SetMeterProvider(mp)
	return mp, nil
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}
