package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence/workload"
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
	Cores        int     `json:"cores"` // GOMAXPROCS: the CPUs the process may use at once
	Sessions     int     `json:"sessions"`
	Messages     int     `json:"messages"`
	Turns        int     `json:"turns"`
	Seconds      float64 `json:"seconds"`
	TurnsPerSec  float64 `json:"turns_per_sec"`
	LatencyP50ms float64 `json:"latency_p50_ms"`
	LatencyP99ms float64 `json:"latency_p99_ms"`
	RowsPerSec   float64 `json:"rows_per_sec"`
	MeanBatch    float64 `json:"mean_batch"`
	WriterBusy   float64 `json:"writer_busy"`
	HeapIdle     int64   `json:"heap_per_idle_session_bytes"`
	HeapActive   int64   `json:"heap_per_active_session_bytes"`
	// CPU time the process spent per turn during the load (user and system, all cores), and
	// the garbage collections meanwhile.
	CPUPerTurnUS   float64 `json:"cpu_per_turn_us"`
	GCCycles       int     `json:"gc_cycles"`
	RawTurnsPerSec float64 `json:"raw_turns_per_sec"`
	RatioToRaw     float64 `json:"ratio_to_raw"`
	// CPU time per turn of the replay and of the raw ceiling (one goroutine each).
	ReplayCPUPerTurnUS float64 `json:"replay_cpu_per_turn_us"`
	RawCPUPerTurnUS    float64 `json:"raw_cpu_per_turn_us"`
	// Bytes the process wrote per turn during the replay and during the raw ceiling: the WAL
	// frames of their commits, nearly all of it (Linux only; 0 elsewhere). A commit appends every
	// page it changed, whole, so smaller transactions write more per turn.
	ReplayWrittenPerTurn float64 `json:"replay_written_bytes_per_turn"`
	RawWrittenPerTurn    float64 `json:"raw_written_bytes_per_turn"`
	// The daemon's own transactions of the load, committed again into a fresh store by one
	// goroutine: what the daemon's writes cost with no actors around them.
	Transactions      int     `json:"transactions"`
	ReplayTurnsPerSec float64 `json:"replay_turns_per_sec"`
	RatioToReplay     float64 `json:"ratio_to_replay"`
	ReplayToRaw       float64 `json:"replay_to_raw"`
	// Issue #9's bound on RatioToRaw at this many sessions (100 and 1,000 have one), and by
	// how much RatioToRaw misses it (0 when met: before, left out then, as at a count with no
	// target, which a script could not tell apart). Both absent at other session counts, and
	// in a round's report.
	Target          float64  `json:"target_ratio_to_raw,omitempty"`
	TargetShortfall *float64 `json:"target_shortfall,omitempty"`
	// Targets says of each target at this many sessions what it bounds, the value measured,
	// the bound and whether it is met; [] when none has one. Each round's report says its own.
	Targets []benchTargetJSON `json:"targets"`
	// With --rounds K > 1 every figure above is the median over the rounds, and Rounds holds
	// each round's report.
	Rounds []*benchReport `json:"rounds,omitempty"`
}

// benchTargetJSON is a target's verdict in bench --json: explicit, where target_shortfall
// alone left a met target and one not measured looking the same.
type benchTargetJSON struct {
	Name      string  `json:"name"`
	Figure    string  `json:"figure"` // the report's field it bounds
	Measured  float64 `json:"measured"`
	Bound     float64 `json:"bound"`
	AtMost    bool    `json:"at_most"`
	Met       bool    `json:"met"`
	Shortfall float64 `json:"shortfall"`
}

// setTargets sets the verdicts of r's targets (benchTarget), and of each of its rounds'.
func setTargets(r *benchReport) {
	r.Targets = targetVerdicts(r)
	if t, ok := benchTarget(r.Sessions); ok {
		shortfall := t.Shortfall(r.RatioToRaw)
		r.Target, r.TargetShortfall = t.Bound, &shortfall
	}
	for _, x := range r.Rounds {
		x.Targets = targetVerdicts(x)
	}
}

// targetVerdicts is Targets of r: one verdict per target at its session count, [] for none.
func targetVerdicts(r *benchReport) []benchTargetJSON {
	out := []benchTargetJSON{}
	if t, ok := benchTarget(r.Sessions); ok {
		out = append(out, benchTargetJSON{Name: t.Name, Figure: "ratio_to_raw", Measured: r.RatioToRaw, Bound: t.Bound,
			AtMost: t.AtMost, Met: t.Met(r.RatioToRaw), Shortfall: t.Shortfall(r.RatioToRaw)})
	}
	return out
}

// benchUsage is what bench's -h prints before its flags, as every other command's does.
const benchUsage = `usage: agentgate bench [flags]

Measures the whole runtime on this machine: a daemon in this process (echo agent, real SQLite)
driven by N sessions of M messages each, then the raw batched SQLite ceiling on the same
schema, and reports turns/s, latency, batch sizes and heap per session, each also as a ratio
to the ceiling measured in the same run (docs/BENCHMARKS.md). It writes only to a temporary or
an empty --data-dir, never to a daemon's.
`

// bench runs `agentgate bench`: it starts the daemon in-process with a bench platform, drives
// N closed-loop sessions of M messages each through it, measures the heap per idle session (after
// the load) and per active session (one more message each, held in the agent), then replays the
// daemon's transactions and measures the raw batched SQLite ceiling on fresh stores, so the
// ratios compare measurements taken in the same run. --rounds repeats all of it, alternating the
// order, and reports medians.
func bench(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	sessions := fs.Int("sessions", 100, "concurrent sessions `N`")
	messages := fs.Int("messages", 50, "messages `M` each session sends, one after the other")
	dataDir := fs.String("data-dir", "", "an empty or new data `directory` to keep the run's data in (default: a new temporary directory, removed afterwards)")
	configFile := fs.String("config", "", "YAML config `file` whose persistence, sessions and metrics settings the daemon runs with (AGENTGATE_* variables apply too; default: built-in defaults)")
	asJSON := fs.Bool("json", false, "print only one JSON object on stdout")
	rounds := fs.Int("rounds", 1, "repeat the whole measurement `K` times, each on a fresh data directory, and report medians")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the first round's load phase to `file` (go tool pprof reads it)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), benchUsage, "\nflags:\n")
		fs.PrintDefaults()
	}
	if err := parse(fs, args, stdout, stderr); err != nil {
		return err
	}
	var small []string // each flag whose value is too small, alone (not those beside it)
	for _, f := range []struct {
		name string
		v    int
	}{{"sessions", *sessions}, {"messages", *messages}, {"rounds", *rounds}} {
		if f.v < 1 {
			small = append(small, fmt.Sprintf("--%s %d", f.name, f.v))
		}
	}
	if len(small) > 0 {
		return usagef("bench: %s: must be at least 1", strings.Join(small, ", "))
	}
	dir := *dataDir
	if dir != "" {
		// A benchmark writes thousands of sessions: never into a real data directory.
		switch entries, err := os.ReadDir(dir); {
		case err == nil && len(entries) > 0:
			return fmt.Errorf("bench: --data-dir %s is not empty; bench writes sessions of its own there, so give it an empty or new directory", dir)
		case errors.Is(err, syscall.ENOTDIR):
			// (a file, such as a daemon's agentgate.db: before, "open …: not a directory")
			return fmt.Errorf("bench: --data-dir %s is not a directory: give it an empty or new directory", dir)
		case err != nil && !errors.Is(err, iofs.ErrNotExist):
			return fmt.Errorf("bench: --data-dir: %w", err)
		}
	}
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
	// Through config.Check, as serve's flags: a problem of the data directory --data-dir names
	// says "(set by --data-dir)", and one the daemon could not make or write is refused here,
	// as serve refuses it, not by the daemon's start with a bare mkdir error.
	flags := map[string]string{}
	if *dataDir != "" {
		flags["data_dir"] = "--data-dir"
	}
	cfg, problems, refused := config.Check(*configFile, os.Environ(), func(c *config.Config) {
		c.DataDir = dir
		c.Store.Driver, c.Store.DSN = "sqlite", "" // in dir, whatever the environment names
		c.HTTP.Addr = "127.0.0.1:0"
		c.Log.Level = "warn"
		c.Sessions.PassivateAfter = benchPassivateAfter
		c.Platforms.Discord.Enabled = false // the load comes from the bench platform only
	}, flags, func(c *config.Config) []error { return nonNil(dirProblem(c)) })
	if problems != nil {
		return fmt.Errorf("bench: %w", configError(problems))
	}
	if refused != nil {
		return fmt.Errorf("bench: %w", refused)
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
		rep, err := benchRound(ctx, &rc, log, *sessions, *messages, texts, k%2 == 1, profile, logging.IsTerminal(stderr), stderr)
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
	setTargets(rep)
	if *asJSON {
		return json.NewEncoder(stdout).Encode(rep)
	}
	printBenchReport(stdout, rep)
	return nil
}

// benchRound is one measurement: the daemon under load, then the replay of its transactions and
// the raw ceiling (the raw ceiling first when rawFirst).
func benchRound(ctx context.Context, cfg *config.Config, log *slog.Logger, n, m int, texts []string, rawFirst bool, cpuProfile string, progress bool, stderr io.Writer) (*benchReport, error) {
	var raw spent
	var err error
	if rawFirst {
		if raw, err = benchRaw(ctx, n, m, texts); err != nil {
			return nil, err
		}
	}
	rep, txns, err := benchDaemon(ctx, cfg, log, n, m, texts, cpuProfile, progress, stderr)
	if err != nil {
		return nil, err
	}
	replay, err := benchReplay(ctx, txns)
	if err != nil {
		return nil, err
	}
	if !rawFirst {
		if raw, err = benchRaw(ctx, n, m, texts); err != nil {
			return nil, err
		}
	}
	rep.Transactions = len(txns)
	rep.ReplayTurnsPerSec = float64(rep.Turns) / replay.wall.Seconds()
	rep.ReplayCPUPerTurnUS = perTurnUS(replay.cpu, rep.Turns)
	rep.RatioToReplay = rep.TurnsPerSec / rep.ReplayTurnsPerSec
	rep.RawTurnsPerSec = float64(rep.Turns) / raw.wall.Seconds()
	rep.RawCPUPerTurnUS = perTurnUS(raw.cpu, rep.Turns)
	rep.ReplayWrittenPerTurn = float64(replay.written) / float64(rep.Turns)
	rep.RawWrittenPerTurn = float64(raw.written) / float64(rep.Turns)
	rep.RatioToRaw = rep.TurnsPerSec / rep.RawTurnsPerSec
	rep.ReplayToRaw = rep.ReplayTurnsPerSec / rep.RawTurnsPerSec
	return rep, nil
}

// benchTarget is issue #9's end-to-end target at n sessions: the whole daemon's persisted
// turns/s ÷ the raw batched ceiling of the same run. The issue sets it at 100 and 1,000.
func benchTarget(n int) (workload.Target, bool) {
	bound, ok := map[int]float64{100: 0.75, 1000: 0.85}[n]
	return workload.Target{Name: fmt.Sprintf("daemon ÷ raw at %d sessions (issue #9)", n), Bound: bound}, ok
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
		Cores: r0.Cores, Sessions: r0.Sessions, Messages: r0.Messages, Turns: r0.Turns,
		Seconds:              med(func(r *benchReport) float64 { return r.Seconds }),
		TurnsPerSec:          med(func(r *benchReport) float64 { return r.TurnsPerSec }),
		LatencyP50ms:         med(func(r *benchReport) float64 { return r.LatencyP50ms }),
		LatencyP99ms:         med(func(r *benchReport) float64 { return r.LatencyP99ms }),
		RowsPerSec:           med(func(r *benchReport) float64 { return r.RowsPerSec }),
		MeanBatch:            med(func(r *benchReport) float64 { return r.MeanBatch }),
		WriterBusy:           med(func(r *benchReport) float64 { return r.WriterBusy }),
		CPUPerTurnUS:         med(func(r *benchReport) float64 { return r.CPUPerTurnUS }),
		GCCycles:             int(med(func(r *benchReport) float64 { return float64(r.GCCycles) })),
		ReplayCPUPerTurnUS:   med(func(r *benchReport) float64 { return r.ReplayCPUPerTurnUS }),
		RawCPUPerTurnUS:      med(func(r *benchReport) float64 { return r.RawCPUPerTurnUS }),
		ReplayWrittenPerTurn: med(func(r *benchReport) float64 { return r.ReplayWrittenPerTurn }),
		RawWrittenPerTurn:    med(func(r *benchReport) float64 { return r.RawWrittenPerTurn }),
		HeapIdle:             int64(med(func(r *benchReport) float64 { return float64(r.HeapIdle) })),
		HeapActive:           int64(med(func(r *benchReport) float64 { return float64(r.HeapActive) })),
		RawTurnsPerSec:       med(func(r *benchReport) float64 { return r.RawTurnsPerSec }),
		RatioToRaw:           med(func(r *benchReport) float64 { return r.RatioToRaw }),
		Transactions:         int(med(func(r *benchReport) float64 { return float64(r.Transactions) })),
		ReplayTurnsPerSec:    med(func(r *benchReport) float64 { return r.ReplayTurnsPerSec }),
		RatioToReplay:        med(func(r *benchReport) float64 { return r.RatioToReplay }),
		ReplayToRaw:          med(func(r *benchReport) float64 { return r.ReplayToRaw }),
		Rounds:               rs,
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
	if r.CPUPerTurnUS > 0 {
		fmt.Fprintf(tw, "cpu per turn\t%.0f µs\t(user + system, all cores; replayed writes %.0f µs, raw ceiling %.0f µs)\n", r.CPUPerTurnUS, r.ReplayCPUPerTurnUS, r.RawCPUPerTurnUS)
	}
	fmt.Fprintf(tw, "garbage collections\t%d\t(during the load)\n", r.GCCycles)
	fmt.Fprintf(tw, "heap per idle session\t%s\t(heap + stacks, after GC, freed when the idle sessions passivate, ÷ N)\n", heapFigure(r.HeapIdle))
	fmt.Fprintf(tw, "heap per active session\t%s\t(idle plus what one running turn adds: its actor, goroutine, request)\n", heapFigure(r.HeapActive))
	fmt.Fprintf(tw, "replayed writes\t%.0f turns/s\t(the daemon's %d transactions committed again, no actors, fresh store)\n", r.ReplayTurnsPerSec, r.Transactions)
	fmt.Fprintf(tw, "raw SQLite ceiling\t%.0f turns/s\t(the same writes, %d turns per transaction, no actors, fresh store)\n", r.RawTurnsPerSec, benchRawBatch)
	if r.ReplayWrittenPerTurn > 0 && r.RawWrittenPerTurn > 0 {
		fmt.Fprintf(tw, "written per turn\t%.1f KiB replayed, %.1f KiB raw\t(bytes written, nearly all WAL: a commit appends every page it changed, whole)\n",
			r.ReplayWrittenPerTurn/1024, r.RawWrittenPerTurn/1024)
	}
	fmt.Fprintf(tw, "ratio to replayed\t%.3f%s\t(the cost of the runtime around the writes)\n", r.RatioToReplay, spread(r, func(x *benchReport) float64 { return x.RatioToReplay }))
	fmt.Fprintf(tw, "replayed ÷ raw\t%.3f%s\t(the cost of the daemon's write pattern: two commits per turn, a closed loop's smaller transactions)\n", r.ReplayToRaw, spread(r, func(x *benchReport) float64 { return x.ReplayToRaw }))
	fmt.Fprintf(tw, "ratio to raw\t%.3f%s\n", r.RatioToRaw, spread(r, func(x *benchReport) float64 { return x.RatioToRaw }))
	tw.Flush()
	if t, ok := benchTarget(r.Sessions); ok {
		fmt.Fprintln(w, t.Verdict(r.RatioToRaw))
		if !t.Met(r.RatioToRaw) {
			fmt.Fprintf(w, "  why: daemon ÷ raw = write pattern × runtime (docs/BENCHMARKS.md has the analysis)\n"+
				"  write pattern (replayed ÷ raw) %.3f: the daemon's own transactions, committed again with no actors;\n"+
				"    the same rows and updates as the raw ceiling, in two durable commits per turn (the inbound\n"+
				"    before its ack, the reply before it is sent) and a closed loop's smaller transactions than\n"+
				"    the raw %d turns\n", r.ReplayToRaw, benchRawBatch)
			if r.ReplayWrittenPerTurn > 0 && r.RawWrittenPerTurn > 0 {
				fmt.Fprintf(w, "    (%.1f× the bytes per turn: every commit rewrites whole the pages of each session's index\n"+
					"    entries and rows it touches, which the raw ceiling's transactions share among 500 turns)\n",
					r.ReplayWrittenPerTurn/r.RawWrittenPerTurn)
			}
			fmt.Fprintf(w, "  runtime (daemon ÷ replayed) %.3f: actors, agent, platform and actor metrics around the same writes,\n"+
				"    on the same cores\n", r.RatioToReplay)
			if r.CPUPerTurnUS > 0 && r.Cores > 0 {
				rate := t.Bound * r.RawTurnsPerSec
				fmt.Fprintf(w, "  cpu budget: at the target rate (%.0f turns/s) %d cores allow %.0f µs of CPU per turn;\n"+
					"    the daemon spent %.0f µs, the same writes replayed alone %.0f µs\n",
					rate, r.Cores, float64(r.Cores)*1e6/rate, r.CPUPerTurnUS, r.ReplayCPUPerTurnUS)
			}
		}
	}
}

// heapFigure formats a heap difference per session. With few sessions the difference drowns in
// what the rest of the process allocates and frees meanwhile, and can come out at or below
// zero: that says nothing about a session, so it is not shown as a size.
func heapFigure(perSession int64) string {
	if perSession <= 0 {
		return "not measurable (below the heap's noise at this N: use more sessions)"
	}
	return fmt.Sprintf("%.1f KiB", float64(perSession)/1024)
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

// percentile returns the nearest-rank q-quantile of sorted.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// perTurnUS returns d ÷ turns in microseconds.
func perTurnUS(d time.Duration, turns int) float64 {
	return float64(d) / float64(time.Microsecond) / float64(turns)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
