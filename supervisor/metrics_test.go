package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape reads /metrics from the daemon's HTTP listener.
func (r *runtime) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + r.d.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(raw)))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return families
}

// value returns the value of family name's series whose labels include want (counter, gauge,
// or a histogram's sample count).
func value(fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		ok := true
		for i := 0; i+1 < len(want); i += 2 {
			ok = ok && labels[want[i]] == want[i+1]
		}
		if !ok {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

// TestMetricsMoveWithTheLoad scrapes /metrics around a load: every DESIGN metric is there from
// the first scrape and moves as it must, agentgate's actor metrics account for every actor
// kind, protoactor's own metrics stay off by default, and no label value anywhere is a session
// key, chat id or user id.
func TestMetricsMoveWithTheLoad(t *testing.T) {
	release := make(chan struct{})
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		switch req.Messages[0].Text {
		case "panic":
			panic("injected")
		case "slow":
			<-release
		}
		return &agents.Response{Text: "ok"}, nil
	})
	var logs logSignal
	r := MustStartDaemon(t, agent, daemonOpts{logs: &logs})
	t.Cleanup(func() { r.stop(t) })
	before := r.scrape(t)
	for _, name := range []string{"agentgate_sessions_active", "agentgate_session_activations_total",
		"agentgate_session_passivations_total", "agentgate_turns_total", "agentgate_turn_duration_seconds",
		"agentgate_queue_depth", "agentgate_queue_overflow_total", "agentgate_persist_batch_size",
		"agentgate_persist_flush_seconds", "agentgate_spool_files", "agentgate_persist_writes_refused_total", "agentgate_actor_restarts_total",
		"agentgate_mailbox_depth", "agentgate_inbound_total", "agentgate_outbound_total",
		"agentgate_agent_tokens_total", "agentgate_actor_message_seconds", "agentgate_actor_starts_total",
		"agentgate_actor_stops_total", "agentgate_actor_deadletters_total", "agentgate_messages_quarantined_total"} {
		if before[name] == nil {
			t.Errorf("%s missing from the first scrape", name)
		}
	}
	// Every platform agentgate has, configured or not, and every actor kind, has its series.
	if v := value(before, "agentgate_inbound_total", "platform", "discord"); v != 0 {
		t.Errorf("agentgate_inbound_total{platform=\"discord\"} = %v, want 0 from the first scrape", v)
	}
	if v := value(before, "agentgate_actor_restarts_total", "kind", "other"); v != 0 {
		t.Errorf("agentgate_actor_restarts_total{kind=\"other\"} = %v, want 0 from the first scrape", v)
	}
	// The scrape's own connection is open while it is answered.
	if limit, open := value(before, "agentgate_http_connections_limit"), value(before, "agentgate_http_connections_open"); limit < 64 || open < 1 {
		t.Errorf("agentgate_http_connections_limit = %v, agentgate_http_connections_open = %v, want the limit and at least the scrape's connection", limit, open)
	}

	var ids []string
	src := func(i int) identity.Source {
		return identity.Source{Platform: "fake", ChatType: identity.ChatGroup, ChatID: fmt.Sprint("chat-", i), UserID: fmt.Sprint("user-", i)}
	}
	const sessions, each = 10, 3
	for i := range sessions {
		for j := range each {
			id := fmt.Sprintf("m-%d-%d", i, j)
			r.inject(t, src(i), id, "hello")
			ids = append(ids, id)
		}
	}
	r.waitSent(t, sessions*each)
	busy := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "busy-chat", UserID: "busy-user"}
	r.inject(t, busy, "b1", "slow")
	r.inject(t, busy, "b2", "hello") // waits behind b1: the queue depth histogram sees 1
	r.inject(t, src(99), "p1", "panic")
	r.waitReplyTo(t, "p1") // quarantined after 3 crashes
	close(release)
	r.waitReplyTo(t, "b2")

	// Block the writer: writes pile up in the persistence actor's mailbox.
	unlock := r.lockDatabase(t)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.inject(t, src(200+i), fmt.Sprint("burst-", i), "hello")
		}()
	}
	waitUntil(t, func() bool { return value(r.scrape(t), "agentgate_mailbox_depth", "kind", "persistence") > 0 })
	unlock()
	wg.Wait()
	r.waitSent(t, sessions*each+3+20)
	waitUntil(t, func() bool { // every mailbox drains once the load is over
		fams := r.scrape(t)
		for _, k := range []string{"session", "turn", "persistence", "manager", "platform"} {
			if value(fams, "agentgate_mailbox_depth", "kind", k) != 0 {
				return false
			}
		}
		return true
	})

	after := r.scrape(t)
	okTurns := value(after, "agentgate_turns_total", "outcome", "ok") - value(before, "agentgate_turns_total", "outcome", "ok")
	if want := float64(sessions*each + 2 + 20); okTurns != want {
		t.Errorf("turns_total{ok} rose by %v, want %v", okTurns, want)
	}
	if got := value(after, "agentgate_actor_restarts_total", "kind", "session"); got != 3 {
		t.Errorf("actor_restarts_total{session} = %v, want 3 (one per injected panic)", got)
	}
	// Each crash's line names the session that crashed, by its actor's id (its key).
	if got, want := strings.Count(logs.String(), "actor=sessions/"+identity.Key(src(99), identity.DefaultKeyOptions)), 3; got != want {
		t.Errorf("%d lines name the crashed session's actor, want %d:\n%s", got, want, logs.String())
	}
	if f := after["agentgate_queue_depth"]; f == nil || f.Metric[0].Histogram.GetBucket()[0].GetCumulativeCount() == f.Metric[0].Histogram.GetSampleCount() {
		t.Errorf("queue depth histogram never saw a waiting message")
	}
	if v := value(after, "agentgate_inbound_total", "platform", "fake"); v < float64(sessions*each) {
		t.Errorf("inbound_total{fake} = %v", v)
	}
	// A client's retry of a message taken is answered as a duplicate, and is no message more.
	if ack := r.inject(t, src(0), "m-0-0", "hello"); ack.Disposition != platforms.Duplicate {
		t.Errorf("m-0-0 again: %q, want duplicate", ack.Disposition)
	}
	if got, was := value(r.scrape(t), "agentgate_inbound_total", "platform", "fake"), value(after, "agentgate_inbound_total", "platform", "fake"); got != was {
		t.Errorf("inbound_total{fake} rose from %v to %v for a duplicate", was, got)
	}
	protoactor := false
	forbidden := map[string]bool{}
	for i := range 220 {
		s := src(i)
		forbidden[s.ChatID], forbidden[s.UserID], forbidden[identity.Key(s, identity.DefaultKeyOptions)] = true, true, true
	}
	for _, s := range []identity.Source{busy} {
		forbidden[s.ChatID], forbidden[s.UserID], forbidden[identity.Key(s, identity.DefaultKeyOptions)] = true, true, true
	}
	for name, f := range after {
		protoactor = protoactor || strings.HasPrefix(name, "protoactor_")
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if forbidden[l.GetValue()] || strings.HasPrefix(l.GetValue(), "agent:") {
					t.Errorf("%s has label %s=%q, an identity value", name, l.GetName(), l.GetValue())
				}
			}
		}
	}
	if protoactor {
		t.Errorf("protoactor_* metrics in the scrape, though metrics.actors is off by default")
	}
	for _, k := range []string{"session", "turn", "persistence", "manager", "platform"} {
		if n := value(after, "agentgate_actor_message_seconds", "kind", k); n <= 0 {
			t.Errorf("actor_message_seconds{%s} counted %v messages", k, n)
		}
	}
	if n := value(after, "agentgate_actor_starts_total", "kind", "turn"); n < okTurns {
		t.Errorf("actor_starts_total{turn} = %v for %v turns", n, okTurns)
	}
	waitUntil(t, func() bool { // every turn actor stops once its turn is over
		fams := r.scrape(t)
		return value(fams, "agentgate_actor_stops_total", "kind", "turn") == value(fams, "agentgate_actor_starts_total", "kind", "turn")
	})
	if len(ids) != sessions*each {
		t.Fatalf("sent %d messages", len(ids))
	}
}

// TestProtoactorMetricsOptIn: metrics.actors adds protoactor's own actor metrics to the scrape.
func TestProtoactorMetricsOptIn(t *testing.T) {
	r := MustStart(t, agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
		return &agents.Response{Text: "ok"}, nil
	}), func(c *config.Config) { c.Metrics.Actors = true })
	r.inject(t, identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c", UserID: "u"}, "m1", "hello")
	r.waitSent(t, 1)
	fams := r.scrape(t)
	var names []string
	for name := range fams {
		if strings.HasPrefix(name, "protoactor_") {
			names = append(names, name)
		}
	}
	if !slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "protoactor_actor_message_receive_duration") }) {
		t.Errorf("protoactor metrics with metrics.actors on: %v, want protoactor_actor_message_receive_duration_seconds among them", names)
	}
	if value(fams, "agentgate_actor_message_seconds", "kind", "session") <= 0 {
		t.Errorf("agentgate_actor_message_seconds{session} missing beside protoactor's metrics")
	}
}

// TestLiveSessionState: GET /v1/sessions/{key} reports the live actor state of an active
// session, and of a passivated one reports none — without activating it. The session is read
// while its turn runs, which no passivation ends: before, it was read just after its reply,
// and on a loaded machine the 300 ms passivate_after had passed by then (the live state was
// gone).
func TestLiveSessionState(t *testing.T) {
	release := make(chan struct{})
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return &agents.Response{Text: "ok"}, nil
	})
	r := MustStart(t, agent, func(c *config.Config) { c.Sessions.PassivateAfter = 300 * time.Millisecond })
	ack := r.inject(t, dm, "m1", "hi")
	get := func() map[string]any {
		resp, err := http.Get("http://" + r.d.Addr().String() + "/v1/sessions/" + ack.SessionKey)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET session = %d, %v", resp.StatusCode, err)
		}
		return body
	}
	live, _ := get()["live"].(map[string]any)
	if live == nil || live["active"] != true || live["queue_mode"] != "followup" || live["activated_at"] == nil || live["node"] == "" {
		t.Errorf("live state of an active session = %v", live)
	}
	close(release)
	r.waitReplyTo(t, "m1")
	waitUntil(t, func() bool { return len(r.activeKeys(t)) == 0 })
	activations := testutil.ToFloat64(r.d.metrics.SessionActivations)
	body := get()
	if body["live"] != nil || body["session_id"] != ack.SessionID {
		t.Errorf("passivated session = %v, want its stored session and no live state", body)
	}
	if len(r.activeKeys(t)) != 0 || testutil.ToFloat64(r.d.metrics.SessionActivations) != activations {
		t.Errorf("reading a passivated session's state activated it")
	}
}

// brokenPlatform cannot connect: Run fails at once, every time.
type brokenPlatform struct{}

func (brokenPlatform) Name() string { return "broken" }
func (brokenPlatform) Run(ctx context.Context, _ platforms.Deliver) error {
	return errors.New("cannot reach the platform")
}
func (brokenPlatform) Send(context.Context, *platforms.Outbound) error { return nil }

// TestReadyzReportsEachComponent: /readyz lists every component; a platform whose Run keeps
// failing makes it fail with that platform's error, while /healthz still says the process serves.
func TestReadyzReportsEachComponent(t *testing.T) {
	cfg := config.Default()
	cfg.DataDir, cfg.HTTP.Addr = t.TempDir(), "127.0.0.1:0"
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	d, err := Start(t.Context(), cfg, log, Options{Platforms: []platforms.Platform{brokenPlatform{}}})
	if err != nil {
		t.Fatal(err)
	}
	r := &runtime{d: d}
	defer r.stop(t)
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + d.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitUntil(t, func() bool {
		code, body := get("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "cannot reach the platform")
	})
	_, body := get("/readyz")
	for _, c := range []string{`"store":"ok"`, `"platform.http":"ok"`, `"platform.broken"`} {
		if !strings.Contains(body, c) {
			t.Errorf("/readyz = %s, want %s", body, c)
		}
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d while a platform is down, want 200", code)
	}
}

// readOnlyRuns is a store whose database refuses the daemon's first write, the record of its
// run, as a read-only database file does.
type readOnlyRuns struct{ persistence.Store }

func (readOnlyRuns) BeginRun(context.Context, string, time.Time) (*persistence.UncleanStop, error) {
	return nil, errors.New("attempt to write a readonly database (8)")
}

// TestReadyzFailsWhenTheStartsWriteIsRefused: a daemon whose database refuses the record of its
// run at start (the file is read-only to it) is not ready: /readyz names the refusal. Before, it
// answered ready until the first message found out (found by an audit).
func TestReadyzFailsWhenTheStartsWriteIsRefused(t *testing.T) {
	r := MustStartDaemon(t, echo.New(), daemonOpts{wrap: func(s persistence.Store) persistence.Store { return readOnlyRuns{s} }})
	defer r.stop(t)
	resp, err := http.Get("http://" + r.d.Addr().String() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "readonly database") {
		t.Errorf("/readyz = %d %s, want 503 naming the refused write", resp.StatusCode, body)
	}
}

// TestActorKinds: each actor of the daemon's tree is counted under its kind.
func TestActorKinds(t *testing.T) {
	for id, want := range map[string]string{"sessions/agent:main:http:dm:c1": "session", "turn-17": "turn",
		"sessions": "manager", "persistence": "persistence", "platform-discord": "platform",
		"timers": "other", "probation": "other"} {
		if got := kindOf(actor.NewPID("nonhost", id)); got != want {
			t.Errorf("kindOf(%q) = %q, want %q", id, got, want)
		}
	}
}
