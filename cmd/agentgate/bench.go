package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/workload"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/supervisor"
)

// Parameters of `agentgate bench`.
const (
	benchRowsPerTurn  = 3                // the user message, the assistant message and the outbox row
	benchRawBatch     = 500              // turns per transaction of the raw SQLite ceiling
	benchReplyTimeout = time.Minute      // one reply may take at most this long
	benchStartTimeout = 30 * time.Second // until the bench platform's Run is called
	// Sessions passivate this long after their last message, so that the bench can measure the
	// heap without them. A passivated session's memory is free once its last scheduler timer
	// (the 5 s write re-send check) has fired: benchTimerGrace.
	benchPassivateAfter = 2 * time.Second
	benchTimerGrace     = 6 * time.Second
)

// benchReport is the result of one bench run; its JSON form is the --json output.
type benchReport struct {
	Sessions       int     `json:"sessions"`
	Messages       int     `json:"messages"`
	Turns          int     `json:"turns"`
	Seconds        float64 `json:"seconds"`
	TurnsPerSec    float64 `json:"turns_per_sec"`
	LatencyP50ms   float64 `json:"latency_p50_ms"`
	LatencyP99ms   float64 `json:"latency_p99_ms"`
	RowsPerSec     float64 `json:"rows_per_sec"`
	MeanBatch      float64 `json:"mean_batch"`
	WriterBusy     float64 `json:"writer_busy"`
	HeapIdle       int64   `json:"heap_per_idle_session_bytes"`
	HeapActive     int64   `json:"heap_per_active_session_bytes"`
	RawTurnsPerSec float64 `json:"raw_turns_per_sec"`
	RatioToRaw     float64 `json:"ratio_to_raw"`
	// The daemon's own transactions of the load, committed again into a fresh store by one
	// goroutine: what the daemon's writes cost with no actors around them.
	Transactions      int     `json:"transactions"`
	ReplayTurnsPerSec float64 `json:"replay_turns_per_sec"`
	RatioToReplay     float64 `json:"ratio_to_replay"`
	ReplayToRaw       float64 `json:"replay_to_raw"`
	// With --rounds K > 1 every figure above is the median over the rounds, and Rounds holds
	// each round's report.
	Rounds []*benchReport `json:"rounds,omitempty"`
}

// bench runs `agentgate bench`: it starts the daemon in-process with a bench platform, drives
// N closed-loop sessions of M messages each through it, measures the heap per idle session (after
// the load) and per active session (one more message each, held in the agent), then replays the
// daemon's transactions and measures the raw batched SQLite ceiling on fresh stores, so the
// ratios compare measurements taken in the same run. --rounds repeats all of it, alternating the
// order, and reports medians.
func bench(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	sessions := fs.Int("sessions", 100, "concurrent sessions `N`")
	messages := fs.Int("messages", 20, "messages `M` each session sends, one after the other")
	dataDir := fs.String("data-dir", "", "data `directory` (default: a new temporary directory, removed afterwards)")
	configFile := fs.String("config", "", "YAML config `file` whose persistence, sessions and metrics settings the daemon runs with (AGENTGATE_* variables apply too; default: built-in defaults)")
	asJSON := fs.Bool("json", false, "print only one JSON object on stdout")
	rounds := fs.Int("rounds", 1, "repeat the whole measurement `K` times, each on a fresh data directory, and report medians")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the first round's load phase to `file` (go tool pprof reads it)")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if *sessions < 1 || *messages < 1 || *rounds < 1 {
		return fmt.Errorf("bench: --sessions %d --messages %d --rounds %d: all must be at least 1", *sessions, *messages, *rounds)
	}
	dir := *dataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "agentgate-bench-*"); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer func() {
			if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
				err = fmt.Errorf("bench: %w", rerr)
			}
		}()
	}
	cfg, err := config.Load(*configFile, os.Environ(), func(c *config.Config) {
		c.DataDir = dir
		c.HTTP.Addr = "127.0.0.1:0"
		c.Log.Level = "warn"
		c.Sessions.PassivateAfter = benchPassivateAfter
		c.Platforms.Discord.Enabled = false // the load comes from the bench platform only
	})
	if err != nil {
		return fmt.Errorf("bench: config: %w", err)
	}
	var level slog.LevelVar
	level.Set(cfg.SlogLevel())
	log := logging.New(stderr, &level, cfg.Log.Format)

	texts := workload.Texts(rand.New(rand.NewPCG(1, 2)), 2**sessions**messages)
	var reps []*benchReport
	for k := range *rounds {
		rc := *cfg
		if *rounds > 1 {
			rc.DataDir = filepath.Join(dir, fmt.Sprintf("round-%d", k+1))
		}
		profile := *cpuProfile
		if k > 0 {
			profile = ""
		}
		rep, err := benchRound(ctx, &rc, log, *sessions, *messages, texts, k%2 == 1, profile, isTTY(stderr), stderr)
		if err != nil {
			if *rounds > 1 {
				return fmt.Errorf("%w (round %d of %d)", err, k+1, *rounds)
			}
			return err
		}
		reps = append(reps, rep)
	}
	rep := reps[0]
	if len(reps) > 1 {
		rep = medianReport(reps)
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(rep)
	}
	printBenchReport(stdout, rep)
	return nil
}

// benchRound is one measurement: the daemon under load, then the replay of its transactions and
// the raw ceiling (the raw ceiling first when rawFirst).
func benchRound(ctx context.Context, cfg *config.Config, log *slog.Logger, n, m int, texts []string, rawFirst bool, cpuProfile string, progress bool, stderr io.Writer) (*benchReport, error) {
	var rawElapsed time.Duration
	var err error
	if rawFirst {
		if rawElapsed, err = benchRaw(ctx, n, m, texts); err != nil {
			return nil, err
		}
	}
	rep, txns, err := benchDaemon(ctx, cfg, log, n, m, texts, cpuProfile, progress, stderr)
	if err != nil {
		return nil, err
	}
	replayElapsed, err := benchReplay(ctx, txns)
	if err != nil {
		return nil, err
	}
	if !rawFirst {
		if rawElapsed, err = benchRaw(ctx, n, m, texts); err != nil {
			return nil, err
		}
	}
	rep.Transactions = len(txns)
	rep.ReplayTurnsPerSec = float64(rep.Turns) / replayElapsed.Seconds()
	rep.RatioToReplay = rep.TurnsPerSec / rep.ReplayTurnsPerSec
	rep.RawTurnsPerSec = float64(rep.Turns) / rawElapsed.Seconds()
	rep.RatioToRaw = rep.TurnsPerSec / rep.RawTurnsPerSec
	rep.ReplayToRaw = rep.ReplayTurnsPerSec / rep.RawTurnsPerSec
	return rep, nil
}

// medianReport returns a report whose every figure is the median of rs, with rs as its rounds.
func medianReport(rs []*benchReport) *benchReport {
	med := func(f func(*benchReport) float64) float64 {
		xs := make([]float64, len(rs))
		for i, r := range rs {
			xs[i] = f(r)
		}
		return workload.Median(xs)
	}
	r0 := rs[0]
	return &benchReport{
		Sessions: r0.Sessions, Messages: r0.Messages, Turns: r0.Turns,
		Seconds:           med(func(r *benchReport) float64 { return r.Seconds }),
		TurnsPerSec:       med(func(r *benchReport) float64 { return r.TurnsPerSec }),
		LatencyP50ms:      med(func(r *benchReport) float64 { return r.LatencyP50ms }),
		LatencyP99ms:      med(func(r *benchReport) float64 { return r.LatencyP99ms }),
		RowsPerSec:        med(func(r *benchReport) float64 { return r.RowsPerSec }),
		MeanBatch:         med(func(r *benchReport) float64 { return r.MeanBatch }),
		WriterBusy:        med(func(r *benchReport) float64 { return r.WriterBusy }),
		HeapIdle:          int64(med(func(r *benchReport) float64 { return float64(r.HeapIdle) })),
		HeapActive:        int64(med(func(r *benchReport) float64 { return float64(r.HeapActive) })),
		RawTurnsPerSec:    med(func(r *benchReport) float64 { return r.RawTurnsPerSec }),
		RatioToRaw:        med(func(r *benchReport) float64 { return r.RatioToRaw }),
		Transactions:      int(med(func(r *benchReport) float64 { return float64(r.Transactions) })),
		ReplayTurnsPerSec: med(func(r *benchReport) float64 { return r.ReplayTurnsPerSec }),
		RatioToReplay:     med(func(r *benchReport) float64 { return r.RatioToReplay }),
		ReplayToRaw:       med(func(r *benchReport) float64 { return r.ReplayToRaw }),
		Rounds:            rs,
	}
}

// spread formats the range of one ratio over the rounds, or nothing for a single round.
func spread(r *benchReport, f func(*benchReport) float64) string {
	if len(r.Rounds) < 2 {
		return ""
	}
	lo, hi := f(r.Rounds[0]), f(r.Rounds[0])
	for _, x := range r.Rounds[1:] {
		lo, hi = min(lo, f(x)), max(hi, f(x))
	}
	return fmt.Sprintf(" [%.3f–%.3f]", lo, hi)
}

func printBenchReport(w io.Writer, r *benchReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(r.Rounds) > 1 {
		fmt.Fprintf(tw, "rounds\t%d\t(medians, [min–max] over the rounds)\n", len(r.Rounds))
	}
	fmt.Fprintf(tw, "sessions × messages\t%d × %d = %d turns\n", r.Sessions, r.Messages, r.Turns)
	fmt.Fprintf(tw, "wall time\t%.2f s\n", r.Seconds)
	fmt.Fprintf(tw, "turns/s\t%.0f\n", r.TurnsPerSec)
	fmt.Fprintf(tw, "latency p50 / p99\t%.2f ms / %.2f ms\t(deliver → reply sent)\n", r.LatencyP50ms, r.LatencyP99ms)
	fmt.Fprintf(tw, "persisted rows/s\t%.0f\t(%d rows per turn: 2 messages + 1 outbox)\n", r.RowsPerSec, benchRowsPerTurn)
	fmt.Fprintf(tw, "mean batch\t%.1f\t(write groups per transaction)\n", r.MeanBatch)
	fmt.Fprintf(tw, "writer busy\t%.0f %%\t(share of the wall time spent in commits: near 100 %% the store bounds the run)\n", 100*r.WriterBusy)
	fmt.Fprintf(tw, "heap per idle session\t%.1f KiB\t(heap + stacks, after GC, freed when the idle sessions passivate, ÷ N)\n", float64(r.HeapIdle)/1024)
	fmt.Fprintf(tw, "heap per active session\t%.1f KiB\t(idle plus what one running turn adds: its actor, goroutine, request)\n", float64(r.HeapActive)/1024)
	fmt.Fprintf(tw, "replayed writes\t%.0f turns/s\t(the daemon's %d transactions committed again, no actors, fresh store)\n", r.ReplayTurnsPerSec, r.Transactions)
	fmt.Fprintf(tw, "raw SQLite ceiling\t%.0f turns/s\t(%d turns per transaction, fresh store)\n", r.RawTurnsPerSec, benchRawBatch)
	fmt.Fprintf(tw, "ratio to replayed\t%.3f%s\t(the cost of the runtime around the writes)\n", r.RatioToReplay, spread(r, func(x *benchReport) float64 { return x.RatioToReplay }))
	fmt.Fprintf(tw, "replayed ÷ raw\t%.3f%s\t(the cost of the daemon's write pattern: two commits per turn, smaller transactions)\n", r.ReplayToRaw, spread(r, func(x *benchReport) float64 { return x.ReplayToRaw }))
	fmt.Fprintf(tw, "ratio to raw\t%.3f%s\n", r.RatioToRaw, spread(r, func(x *benchReport) float64 { return x.RatioToRaw }))
	tw.Flush()
}

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
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.Shutdown.DrainTimeout+30*time.Second)
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
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			lat[i], errs[i] = benchSession(ctx, p, deliver, i, m, texts[2*i*m:], lat[i], &done)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
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
		HeapIdle:     (idle - gone) / int64(n),
		HeapActive:   (idle - gone + turns) / int64(n),
	}, txns, nil
}

// startCPUProfile starts writing a CPU profile to path (nothing when path is empty) and returns
// the function that ends it.
func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("bench: cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("bench: cpu profile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("bench: cpu profile: %w", err)
		}
		return nil
	}, nil
}

// benchSession is one closed-loop session: it sends m messages, each after the previous one's
// reply was sent, and returns the end-to-end latency of each.
func benchSession(ctx context.Context, p *benchPlatform, deliver platforms.Deliver, i, m int, texts []string, lat []time.Duration, done *atomic.Int64) ([]time.Duration, error) {
	src := benchSource(i)
	timer := time.NewTimer(benchReplyTimeout)
	defer timer.Stop()
	for k := range m {
		id := fmt.Sprintf("bench-%d-%d", i, k)
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

// startProgress prints a progress line on stderr (a terminal) until the returned func is called.
func startProgress(w io.Writer, done *atomic.Int64, total int) (stop func()) {
	quit, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				fmt.Fprintf(w, "\rbench: %d/%d turns", done.Load(), total)
			case <-quit:
				fmt.Fprintf(w, "\rbench: %d/%d turns\n", done.Load(), total)
				return
			}
		}
	}()
	return func() { close(quit); <-exited }
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

// benchRaw commits n×m turns (the ops of persistence/bench_test.go) to a fresh store from one
// goroutine, benchRawBatch turns per transaction, and returns the time the commits took.
func benchRaw(ctx context.Context, n, m int, texts []string) (time.Duration, error) {
	sessions, turns := rawTurns(n, m, texts)
	var took time.Duration
	err := withFreshStore(ctx, "raw", func(store *sqlite.Store) error {
		if err := commitAll(ctx, store, sessions); err != nil {
			return fmt.Errorf("create sessions: %w", err)
		}
		runtime.GC()
		start := time.Now()
		for i := 0; i < len(turns); i += benchRawBatch {
			if err := commitAll(ctx, store, turns[i:min(i+benchRawBatch, len(turns))]); err != nil {
				return fmt.Errorf("turn %d: %w", i, err)
			}
		}
		took = time.Since(start)
		return nil
	})
	return took, err
}

// benchReplay commits the daemon's transactions again, in order, to a fresh store from one
// goroutine, and returns the time the commits took.
func benchReplay(ctx context.Context, txns [][][]persistence.Op) (time.Duration, error) {
	var took time.Duration
	err := withFreshStore(ctx, "replay", func(store *sqlite.Store) error {
		runtime.GC()
		start := time.Now()
		for i, groups := range txns {
			if err := commitAll(ctx, store, groups); err != nil {
				return fmt.Errorf("transaction %d: %w", i, err)
			}
		}
		took = time.Since(start)
		return nil
	})
	return took, err
}

// withFreshStore runs f on a new store in a temporary directory that it removes afterwards.
func withFreshStore(ctx context.Context, name string, f func(*sqlite.Store) error) (err error) {
	dir, err := os.MkdirTemp("", "agentgate-bench-"+name+"-*")
	if err != nil {
		return fmt.Errorf("bench %s: %w", name, err)
	}
	defer func() {
		if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
			err = fmt.Errorf("bench %s: %w", name, rerr)
		}
	}()
	store, err := sqlite.Open(ctx, filepath.Join(dir, name+".db"), sqlite.Options{})
	if err != nil {
		return fmt.Errorf("bench %s: %w", name, err)
	}
	defer func() {
		if cerr := store.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("bench %s: close store: %w", name, cerr)
		}
	}()
	if err := f(store); err != nil {
		return fmt.Errorf("bench %s: %w", name, err)
	}
	return nil
}

// recordingStore is the daemon's store as `agentgate bench` wraps it: while recording, it keeps
// the groups of every transaction the daemon commits, for benchReplay.
type recordingStore struct {
	persistence.Store

	mu        sync.Mutex
	recording bool
	txns      [][][]persistence.Op
}

// Commit implements persistence.Store.
func (r *recordingStore) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	r.mu.Lock()
	if r.recording {
		r.txns = append(r.txns, slices.Clone(groups))
	}
	r.mu.Unlock()
	return r.Store.Commit(ctx, groups)
}

// record starts or stops recording and returns what was recorded so far.
func (r *recordingStore) record(on bool) [][][]persistence.Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recording = on
	return r.txns
}

func commitAll(ctx context.Context, store *sqlite.Store, groups [][]persistence.Op) error {
	return errors.Join(store.Commit(ctx, groups)...)
}

// rawTurns returns the groups creating n sessions and their n×m turns, turn k of every session
// before turn k+1, each a user message, an assistant message, a status change, a touch, a route
// and an outbox entry.
func rawTurns(n, m int, texts []string) (create, turns [][]persistence.Op) {
	base := time.Now().UTC()
	ss := make([]persistence.Session, n)
	for i := range n {
		ss[i] = persistence.Session{
			ID: fmt.Sprintf("sess-%d", i), Key: fmt.Sprintf("bench:dm:bench-%d", i),
			Platform: "bench", ChatType: "dm", ChatID: fmt.Sprintf("bench-%d", i), UserID: "u",
			Profile: "default", StartedAt: base, LastActivityAt: base, Epoch: 1,
		}
		create = append(create, []persistence.Op{&persistence.CreateSession{Session: ss[i]}})
	}
	for k := range m {
		for i := range n {
			at := base.Add(time.Duration(k+1) * time.Millisecond)
			turns = append(turns, workload.Turn(ss[i], k, texts[2*(i*m+k)], texts[2*(i*m+k)+1], at))
		}
	}
	return create, turns
}

// percentile returns the nearest-rank q-quantile of sorted.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// isTTY reports whether w is a terminal (a character device).
func isTTY(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
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
