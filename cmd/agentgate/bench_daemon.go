package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/supervisor"
)

// benchDaemon starts the daemon with a bench platform, runs the load and stops the daemon. It
// returns the report and the transactions the daemon committed during the load.
func benchDaemon(ctx context.Context, cfg *config.Config, log *slog.Logger, n, m int, texts []string, cpuProfile string, progress bool, stderr io.Writer) (_ *benchReport, _ [][][]persistence.Op, err error) {
	p := newBenchPlatform()
	agent := &holdingAgent{inner: echo.New()}
	rec := &recordingStore{}
	wrap := func(s persistence.Store) persistence.Store { rec.Store = s; return rec }
	d, err := supervisor.Start(ctx, cfg, log, supervisor.Options{Agent: agent, Platforms: []platforms.Platform{p}, WrapStore: wrap})
	if err != nil {
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.Shutdown.DrainTimeout+config.StopMargin)
		defer cancel()
		if serr := d.Stop(stopCtx); serr != nil && err == nil {
			err = fmt.Errorf("bench: stop daemon: %w", serr)
		}
	}()
	deliver, err := p.waitDeliver(ctx, benchStartTimeout)
	if err != nil {
		return nil, nil, err
	}

	total := n * m
	lat := make([][]time.Duration, n)
	for i := range lat {
		lat[i] = make([]time.Duration, 0, m)
	}
	errs := make([]error, n)

	var done atomic.Int64
	stopProgress := func() {}
	if progress {
		stopProgress = startProgress(stderr, &done, total)
	}
	stopProfile, err := startCPUProfile(cpuProfile)
	if err != nil {
		return nil, nil, err
	}
	var wg sync.WaitGroup
	rec.record(true)
	gcs, cpu, start := gcCycles(), processCPU(), time.Now()
	for i := range n {
		wg.Go(func() {
			lat[i], errs[i] = benchSession(ctx, p, deliver, i, m, texts[2*i*m:], lat[i], &done)
		})
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), processCPU()-cpu
	gcs = gcCycles() - gcs
	txns := rec.record(false)
	stopProgress()
	if err := stopProfile(); err != nil {
		return nil, nil, err
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, fmt.Errorf("bench: %w", err)
	}

	metricsURL := "http://" + d.Addr().String() + "/metrics"
	meanBatch, commitSeconds, err := scrapeCommits(ctx, metricsURL)
	if err != nil {
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	// The n sessions are in memory and idle now; they passivate benchPassivateAfter after their
	// last message. Their heap is what goes away then (what the load left elsewhere, such as the
	// actor registry's map growth or SQLite's caches, stays).
	idle := heapInUse()
	turns, err := benchActiveHeap(ctx, p, deliver, agent, n)
	if err != nil {
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	gone, err := benchPassivated(ctx, metricsURL)
	if err != nil {
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	return &benchReport{
		Cores:        runtime.GOMAXPROCS(0),
		Sessions:     n,
		Messages:     m,
		Turns:        total,
		Seconds:      elapsed.Seconds(),
		TurnsPerSec:  float64(total) / elapsed.Seconds(),
		LatencyP50ms: ms(percentile(all, 0.50)),
		LatencyP99ms: ms(percentile(all, 0.99)),
		RowsPerSec:   float64(total*benchRowsPerTurn) / elapsed.Seconds(),
		MeanBatch:    meanBatch,
		WriterBusy:   commitSeconds / elapsed.Seconds(),
		CPUPerTurnUS: perTurnUS(cpu, total),
		GCCycles:     int(gcs),
		HeapIdle:     (idle - gone) / int64(n),
		HeapActive:   (idle - gone + turns) / int64(n),
	}, txns, nil
}

// benchSession is one closed-loop session: it sends m messages, each after the previous one's
// reply was sent, and returns the end-to-end latency of each.
func benchSession(ctx context.Context, p *benchPlatform, deliver platforms.Deliver, i, m int, texts []string, lat []time.Duration, done *atomic.Int64) ([]time.Duration, error) {
	src := benchSource(i)
	timer := time.NewTimer(benchReplyTimeout)
	defer timer.Stop()
	for k := range m {
		id := benchMessageID(i, k)
		replied := p.expect(id)
		start := time.Now()
		if _, err := deliver(ctx, &platforms.Inbound{Source: src, MessageID: id, Text: texts[2*k], ReceivedAt: start}); err != nil {
			return nil, fmt.Errorf("session %d message %d: deliver: %w", i, k, err)
		}
		timer.Reset(benchReplyTimeout)
		select {
		case at := <-replied:
			lat = append(lat, at.Sub(start))
			done.Add(1)
		case <-timer.C:
			return nil, fmt.Errorf("session %d message %d: no reply after %v", i, k, benchReplyTimeout)
		case <-ctx.Done():
			return nil, fmt.Errorf("session %d message %d: %w", i, k, ctx.Err())
		}
	}
	return lat, nil
}

// benchMessageID is the platform id of session i's message k.
func benchMessageID(i, k int) string { return fmt.Sprintf("bench-%d-%d", i, k) }

func benchSource(i int) identity.Source {
	return identity.Source{Platform: "bench", ChatType: "dm", ChatID: fmt.Sprintf("bench-%d", i), UserID: "u"}
}

// benchActiveHeap sends one more message to each of the n (idle) sessions while the agent holds
// every turn, and returns the heap those running turns add, once all n run. It then lets them
// finish and waits for the replies.
func benchActiveHeap(ctx context.Context, p *benchPlatform, deliver platforms.Deliver, agent *holdingAgent, n int) (int64, error) {
	h := agent.hold()
	ids := make([]string, n)
	replies := make([]<-chan time.Time, n)
	for i := range n {
		ids[i] = fmt.Sprintf("bench-%d-active", i)
		replies[i] = p.expect(ids[i])
	}
	before := heapInUse()
	for i := range n {
		if _, err := deliver(ctx, &platforms.Inbound{Source: benchSource(i), MessageID: ids[i], Text: "active", ReceivedAt: time.Now()}); err != nil {
			agent.release(h)
			return 0, fmt.Errorf("active heap: deliver: %w", err)
		}
	}
	err := h.waitEntered(ctx, n, benchReplyTimeout)
	running := heapInUse()
	agent.release(h)
	if err != nil {
		return 0, fmt.Errorf("active heap: %w", err)
	}
	timer := time.NewTimer(benchReplyTimeout)
	defer timer.Stop()
	for i, ch := range replies {
		select {
		case <-ch:
		case <-timer.C:
			return 0, fmt.Errorf("active heap: session %d: no reply after %v", i, benchReplyTimeout)
		case <-ctx.Done():
			return 0, fmt.Errorf("active heap: %w", ctx.Err())
		}
	}
	return running - before, nil
}

// gcCycles returns the number of garbage collections the process has completed.
func gcCycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// heapInUse returns the bytes of heap and goroutine stacks in use after two collections.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc + m.StackInuse)
}

// holdingAgent is the agent of `agentgate bench`: inner (echo), except that while a hold is set
// every turn waits until it is released, so that the bench can measure sessions with a turn
// running.
type holdingAgent struct {
	inner agents.Agent
	cur   atomic.Pointer[agentHold]
}

// agentHold is one hold: turns wait on release and count themselves in entered.
type agentHold struct {
	release chan struct{}
	entered atomic.Int64
	changed chan struct{} // gets a token for every turn that enters
}

// Run implements agents.Agent.
func (a *holdingAgent) Run(ctx context.Context, req *agents.Request) (*agents.Response, error) {
	if h := a.cur.Load(); h != nil {
		h.entered.Add(1)
		select {
		case h.changed <- struct{}{}:
		default:
		}
		select {
		case <-h.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return a.inner.Run(ctx, req)
}

func (a *holdingAgent) hold() *agentHold {
	h := &agentHold{release: make(chan struct{}), changed: make(chan struct{}, 1)}
	a.cur.Store(h)
	return h
}

func (a *holdingAgent) release(h *agentHold) {
	a.cur.CompareAndSwap(h, nil)
	close(h.release)
}

// waitEntered waits until n turns wait in the hold.
func (h *agentHold) waitEntered(ctx context.Context, n int, timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for h.entered.Load() < int64(n) {
		select {
		case <-h.changed:
		case <-timer.C:
			return fmt.Errorf("%d of %d turns running after %v", h.entered.Load(), n, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// scrapeCommits reads the daemon's /metrics and returns the mean number of write groups per
// transaction (agentgate_persist_batch_size) and the seconds spent in commits
// (agentgate_persist_flush_seconds), both since the daemon started.
func scrapeCommits(ctx context.Context, url string) (meanBatch, seconds float64, err error) {
	families, err := scrape(ctx, url)
	if err != nil {
		return 0, 0, err
	}
	hist := func(name string) (*dto.Histogram, error) {
		mf := families[name]
		if mf == nil || len(mf.GetMetric()) == 0 {
			return nil, fmt.Errorf("scrape metrics: no %s", name)
		}
		h := mf.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() == 0 {
			return nil, fmt.Errorf("scrape metrics: %s is empty", name)
		}
		return h, nil
	}
	batch, err := hist("agentgate_persist_batch_size")
	if err != nil {
		return 0, 0, err
	}
	flush, err := hist("agentgate_persist_flush_seconds")
	if err != nil {
		return 0, 0, err
	}
	return batch.GetSampleSum() / float64(batch.GetSampleCount()), flush.GetSampleSum(), nil
}

// benchPassivated waits until no session actor is left in memory (agentgate_sessions_active is
// 0) and their timers have fired, and returns the lowest heap in use seen meanwhile.
func benchPassivated(ctx context.Context, url string) (int64, error) {
	deadline := time.Now().Add(benchPassivateAfter + benchReplyTimeout)
	for {
		families, err := scrape(ctx, url)
		if err != nil {
			return 0, err
		}
		mf := families["agentgate_sessions_active"]
		if mf == nil || len(mf.GetMetric()) == 0 {
			return 0, errors.New("scrape metrics: no agentgate_sessions_active")
		}
		if mf.GetMetric()[0].GetGauge().GetValue() == 0 {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("sessions still in memory after %v", benchPassivateAfter+benchReplyTimeout)
		}
		time.Sleep(100 * time.Millisecond) // a poll interval under a deadline
	}
	low := heapInUse()
	for end := time.Now().Add(benchTimerGrace); time.Now().Before(end); {
		time.Sleep(time.Second) // the stopped sessions' last timers fire meanwhile
		low = min(low, heapInUse())
	}
	return low, nil
}

// scrape reads the daemon's /metrics.
func scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("scrape metrics: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape metrics: status %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape metrics: %w", err)
	}
	return families, nil
}

// benchPlatform is the in-process platform of `agentgate bench`: Run hands its deliver func to
// the load generator, and Send records when the reply to each expected message arrives.
type benchPlatform struct {
	ready     chan struct{}
	readyOnce sync.Once

	mu      sync.Mutex
	deliver platforms.Deliver
	waiting map[string]chan time.Time // by the inbound message id a reply answers
}

func newBenchPlatform() *benchPlatform {
	return &benchPlatform{ready: make(chan struct{}), waiting: map[string]chan time.Time{}}
}

// Name implements platforms.Platform.
func (p *benchPlatform) Name() string { return "bench" }

// Run implements platforms.Platform: it keeps deliver and blocks until ctx ends.
func (p *benchPlatform) Run(ctx context.Context, deliver platforms.Deliver) error {
	p.mu.Lock()
	p.deliver = deliver
	p.mu.Unlock()
	p.readyOnce.Do(func() { close(p.ready) })
	<-ctx.Done()
	return nil
}

// Send implements platforms.Platform: it records the arrival time of an expected reply.
func (p *benchPlatform) Send(_ context.Context, out *platforms.Outbound) error {
	at := time.Now()
	if len(out.InReplyTo) == 0 {
		return nil
	}
	p.mu.Lock()
	ch, ok := p.waiting[out.InReplyTo[0]]
	delete(p.waiting, out.InReplyTo[0])
	p.mu.Unlock()
	if ok {
		ch <- at
	}
	return nil
}

// expect registers the message id whose reply the caller waits for; the channel receives the
// time the reply was sent.
func (p *benchPlatform) expect(id string) <-chan time.Time {
	ch := make(chan time.Time, 1)
	p.mu.Lock()
	p.waiting[id] = ch
	p.mu.Unlock()
	return ch
}

// waitDeliver waits until the daemon called Run and returns the deliver func it gave.
func (p *benchPlatform) waitDeliver(ctx context.Context, timeout time.Duration) (platforms.Deliver, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.ready:
	case <-t.C:
		return nil, fmt.Errorf("bench: platform not started after %v", timeout)
	case <-ctx.Done():
		return nil, fmt.Errorf("bench: %w", ctx.Err())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deliver, nil
}
