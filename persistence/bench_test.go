package persistence_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/workload"
)

// The benchmarks in this file check the goals G1, G2, G3 and G9 of
// shared/reference/perf-anchors.md §8 the way that document measures them: one b.Loop iteration
// is one round that runs the persistence actor and the raw Store.Commit baseline back to back,
// each on a fresh database (synchronous FULL, the default), so every ratio compares measurements
// taken seconds apart. The order alternates between rounds, and each metric is the median over
// the rounds: run -benchtime=5x or more for a figure worth comparing (docs/BENCHMARKS.md).
// -v logs every round.

const (
	benchMaxBatch = 512 // ActorOptions.MaxBatch, as in production
	rawBatch      = 500 // groups per transaction of the raw baseline: the physical ceiling
	phaseTimeout  = 2 * time.Minute
)

// BenchmarkPersistenceActor measures G1 and G3. Each round persists the same turns three ways:
// through the persistence actor, fed by one closed-loop sender actor per session; by one
// goroutine calling Commit with rawBatch turns per transaction (the physical ceiling); and by
// that goroutine with the actor's mean batch size, which tells the cost of the actor layer apart
// from the cost of smaller transactions. It reports actor_turns/s, raw_turns/s, ratio (actor ÷
// raw, G1), mean_batch (groups per actor transaction, G3) and ratio_same_batch.
func BenchmarkPersistenceActor(b *testing.B) {
	for _, tc := range []struct{ sessions, turns int }{
		{1, 2000},
		{100, 10000},
		{1000, 10000},
	} {
		b.Run(fmt.Sprintf("sessions=%d", tc.sessions), func(b *testing.B) {
			w := newWorkload(tc.sessions, tc.turns/tc.sessions)
			var actorRate, rawRate, ratio, meanBatch, sameBatch, busy []float64
			round := 0
			for b.Loop() {
				b.StopTimer()
				var a actorRun
				var raw, rawSame time.Duration
				if round%2 == 0 {
					a = runActor(b, w)
					rawSame = runRawBatched(b, w, int(a.meanBatch+0.5))
					raw = runRawBatched(b, w, rawBatch)
				} else {
					raw = runRawBatched(b, w, rawBatch)
					a = runActor(b, w)
					rawSame = runRawBatched(b, w, int(a.meanBatch+0.5))
				}
				round++
				ar := float64(w.total) / a.elapsed.Seconds()
				rr := float64(w.total) / raw.Seconds()
				rs := float64(w.total) / rawSame.Seconds()
				actorRate = append(actorRate, ar)
				rawRate = append(rawRate, rr)
				ratio = append(ratio, ar/rr)
				meanBatch = append(meanBatch, a.meanBatch)
				sameBatch = append(sameBatch, ar/rs)
				busy = append(busy, a.busy)
				if testing.Verbose() {
					b.Logf("round %d: actor %.0f turns/s, raw %.0f turns/s, ratio %.3f, mean batch %.1f, raw at that batch %.0f turns/s (ratio %.3f), committer busy %.3f",
						round, ar, rr, ar/rr, a.meanBatch, rs, ar/rs, a.busy)
				}
				b.StartTimer()
			}
			b.ReportMetric(workload.Median(actorRate), "actor_turns/s")
			b.ReportMetric(workload.Median(rawRate), "raw_turns/s")
			b.ReportMetric(workload.Median(ratio), "ratio")
			b.ReportMetric(workload.Median(meanBatch), "mean_batch")
			b.ReportMetric(workload.Median(sameBatch), "ratio_same_batch")
			b.ReportMetric(workload.Median(busy), "commit_busy")
			if bound, ok := g1Targets[tc.sessions]; ok {
				b.Log(workload.Target{Name: fmt.Sprintf("G1 persistence actor ÷ raw at %d sessions", tc.sessions), Bound: bound}.Verdict(workload.Median(ratio)))
				b.Log(workload.Target{Name: fmt.Sprintf("G3 mean batch ÷ sessions at %d sessions", tc.sessions), Bound: 0.3}.Verdict(workload.Median(meanBatch) / float64(tc.sessions)))
			}
		})
	}
}

// g1Targets are G1's bounds by number of sessions (issue #9, perf-anchors §8).
var g1Targets = map[int]float64{100: 0.75, 1000: 0.85}

// BenchmarkRawBatchSize shows why no closed-loop writer reaches the raw ceiling at S=100: it
// commits the turns of 100 sessions from one goroutine (no actors) at several transaction sizes
// in every round, each on a fresh database, and reports turns/s per size and each size's rate ÷
// the 500-turn rate (median over rounds). A closed loop of S sessions has at most one write per
// session in flight, so its transactions hold at most S turns, each of a different session.
func BenchmarkRawBatchSize(b *testing.B) {
	const sessions, perSession = 100, 50
	sizes := []int{10, 50, 100, 200, 500, 1000}
	w := newWorkload(sessions, perSession)
	rates := make([][]float64, len(sizes))
	rel := make([][]float64, len(sizes))
	round := 0
	for b.Loop() {
		b.StopTimer()
		got := make([]float64, len(sizes))
		for k := range sizes {
			i := k
			if round%2 == 1 {
				i = len(sizes) - 1 - k // alternate the order
			}
			got[i] = float64(w.total) / runRawBatched(b, w, sizes[i]).Seconds()
		}
		round++
		for i := range sizes {
			rates[i] = append(rates[i], got[i])
			rel[i] = append(rel[i], got[i]/got[slices.Index(sizes, rawBatch)])
		}
		if testing.Verbose() {
			b.Logf("round %d: turns/s by turns per transaction %v: %.0f", round, sizes, got)
		}
		b.StartTimer()
	}
	for i, n := range sizes {
		b.ReportMetric(workload.Median(rates[i]), fmt.Sprintf("turns/s@%d", n))
		if n != rawBatch {
			b.ReportMetric(workload.Median(rel[i]), fmt.Sprintf("ratio@%d", n))
		}
	}
}

// BenchmarkSingleTurnLatency measures G2 and G9 for one session. Each round alternates, turn by
// turn, a turn through the persistence actor (sender actor → persistence actor → WriteResult)
// and the same turn committed alone by a bare goroutine, each path on its own fresh database, so
// both see the same disk at the same moments. It reports the p50 and p99 of both paths, added_us
// (actor p50 − raw p50, G2) and p50_ratio (G9).
func BenchmarkSingleTurnLatency(b *testing.B) {
	const turns = 2000
	w := newWorkload(1, turns)
	var actorP50, actorP99, rawP50, rawP99, added, ratio []float64
	round := 0
	for b.Loop() {
		b.StopTimer()
		al, rl := runPaired(b, w, round%2 == 1)
		round++
		ap50, ap99 := workload.QuantileUS(al, 0.50), workload.QuantileUS(al, 0.99)
		rp50, rp99 := workload.QuantileUS(rl, 0.50), workload.QuantileUS(rl, 0.99)
		actorP50 = append(actorP50, ap50)
		actorP99 = append(actorP99, ap99)
		rawP50 = append(rawP50, rp50)
		rawP99 = append(rawP99, rp99)
		added = append(added, ap50-rp50)
		ratio = append(ratio, ap50/rp50)
		if testing.Verbose() {
			b.Logf("round %d: actor p50 %.0f µs p99 %.0f µs, raw p50 %.0f µs p99 %.0f µs, added %.0f µs",
				round, ap50, ap99, rp50, rp99, ap50-rp50)
		}
		b.StartTimer()
	}
	b.ReportMetric(workload.Median(actorP50), "actor_p50_us")
	b.ReportMetric(workload.Median(rawP50), "raw_p50_us")
	b.ReportMetric(workload.Median(added), "added_us")
	b.ReportMetric(workload.Median(ratio), "p50_ratio")
	b.ReportMetric(workload.Median(actorP99), "actor_p99_us")
	b.ReportMetric(workload.Median(rawP99), "raw_p99_us")
	b.Log(workload.Target{Name: "G2 one session's added p50 over a bare transaction", Bound: 50, AtMost: true, Unit: "µs"}.Verdict(workload.Median(added)))
	b.Log(workload.Target{Name: "G2 p99 over the bare transaction's p99", Bound: 1000, AtMost: true, Unit: "µs"}.Verdict(workload.Median(actorP99) - workload.Median(rawP99)))
	b.Log(workload.Target{Name: "G9 single-turn p50 ÷ bare transaction p50", Bound: 1.25, AtMost: true}.Verdict(workload.Median(ratio)))
}

// TestBenchActorHarness runs the closed loop of BenchmarkPersistenceActor small (and under
// -race in CI): every write is acknowledged once, in order per sender, and every turn is in the
// store afterwards, whatever the batch size and pacing.
func TestBenchActorHarness(t *testing.T) {
	for _, tc := range []struct {
		name              string
		sessions, perSess int
		maxBatch          int
		maxLinger         time.Duration
	}{
		{"one_session", 1, 30, benchMaxBatch, 0},
		{"merged", 20, 10, benchMaxBatch, 0},
		{"batch_cap", 20, 10, 7, 0},
		{"no_linger", 20, 10, benchMaxBatch, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorkload(tc.sessions, tc.perSess)
			env, stop := startActors(t, w, nil, persistence.ActorOptions{MaxBatch: tc.maxBatch, MaxLinger: tc.maxLinger})
			defer stop()
			env.wg.Add(len(env.senders))
			for _, pid := range env.senders {
				env.system.Root.Send(pid, &begin{})
			}
			if !waitTimeout(&env.wg, phaseTimeout) {
				t.Fatalf("not finished after %v", phaseTimeout)
			}
			if err := env.err(); err != nil {
				t.Fatal(err)
			}
			env.stop() // the store stays open until the deferred stop
			if got, want := env.groups.Load(), int64(w.total); got != want {
				t.Errorf("committed %d groups, want %d", got, want)
			}
			for _, ss := range w.sessions {
				msgs, err := env.store.Transcript(t.Context(), ss.ID)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := len(msgs), 2*tc.perSess; got != want {
					t.Errorf("session %s: %d messages, want %d", ss.ID, got, want)
				}
				for i, m := range msgs {
					if m.Seq != int64(i+1) {
						t.Errorf("session %s: message %d has seq %d, want %d", ss.ID, i, m.Seq, i+1)
						break
					}
				}
			}
		})
	}
}

// load is the pre-built, read-only data of a benchmark: S sessions and their turns. Both
// paths write exactly these groups.
type load struct {
	sessions []persistence.Session
	turns    [][][]persistence.Op // turns[i][k]: the ops of session i's turn k, in order
	byTurn   [][]persistence.Op   // every turn, turn k of every session before turn k+1
	total    int
}

// newWorkload builds perSession turns for each of s sessions, deterministically.
func newWorkload(s, perSession int) *load {
	texts := workload.Texts(rand.New(rand.NewPCG(1, 2)), 2*s*perSession)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := &load{total: s * perSession}
	for i := range s {
		ss := persistence.Session{
			ID:             fmt.Sprintf("sess-%04d", i),
			Key:            fmt.Sprintf("bench:dm:%04d", i),
			Platform:       "bench",
			ChatType:       "dm",
			ChatID:         fmt.Sprintf("chat-%04d", i),
			UserID:         fmt.Sprintf("user-%04d", i),
			UserName:       fmt.Sprintf("User %d", i),
			Profile:        "default",
			StartedAt:      base,
			LastActivityAt: base,
			Epoch:          1,
		}
		w.sessions = append(w.sessions, ss)
		turns := make([][]persistence.Op, perSession)
		for k := range perSession {
			at := base.Add(time.Duration(k+1)*time.Minute + time.Duration(i)*time.Millisecond)
			n := 2 * (i*perSession + k)
			turns[k] = workload.Turn(ss, k, texts[n], texts[n+1], at)
		}
		w.turns = append(w.turns, turns)
	}
	for k := range perSession {
		for i := range s {
			w.byTurn = append(w.byTurn, w.turns[i][k])
		}
	}
	return w
}

// mustOpenStore opens a fresh store (synchronous FULL, the default) in its own temporary
// directory and commits the load's sessions. The phase that opened it defers closeStore, so
// no store (nor its checkpointer) outlives its phase.
func mustOpenStore(b testing.TB, w *load) (store *sqlite.Store, closeStore func()) {
	b.Helper()
	dir := b.TempDir()
	store, err := sqlite.Open(context.Background(), filepath.Join(dir, "bench.db"), sqlite.Options{})
	if err != nil {
		b.Fatalf("open store: %v", err)
	}
	closeStore = func() {
		if err := store.Close(); err != nil {
			b.Errorf("close store: %v", err)
		}
		// Free the disk now rather than when the whole benchmark ends.
		if err := os.RemoveAll(dir); err != nil {
			b.Errorf("remove %s: %v", dir, err)
		}
	}
	groups := make([][]persistence.Op, len(w.sessions))
	for i := range w.sessions {
		groups[i] = []persistence.Op{&persistence.CreateSession{Session: w.sessions[i]}}
	}
	for i, err := range store.Commit(context.Background(), groups) {
		if err != nil {
			closeStore()
			b.Fatalf("create session %d: %v", i, err)
		}
	}
	return store, closeStore
}

// actorRun is the outcome of one actor phase.
type actorRun struct {
	elapsed   time.Duration
	meanBatch float64 // groups per committed transaction
	busy      float64 // share of elapsed the store spent in Commit
}

// actorEnv is an actor system with a persistence actor over a fresh store and one sender actor
// per session of a workload.
type actorEnv struct {
	b       testing.TB
	store   *sqlite.Store
	system  *actor.ActorSystem
	persist *actor.PID
	senders []*actor.PID
	outs    []*senderOut
	wg      sync.WaitGroup
	commits atomic.Int64
	groups  atomic.Int64
	busy    atomic.Int64 // nanoseconds spent in Commit

	stopOnce sync.Once
}

// startActors opens a fresh store and starts the actor system. The caller defers the returned
// stop, which stops every actor, shuts the system down and closes the store (once; the persistence
// actor has reported every commit to Observe when it returns). With stepped set,
// each sender persists one turn per begin message and reports it on stepped; otherwise a begin
// starts a closed loop over all its turns and wg is done when the last is acknowledged.
func startActors(b testing.TB, w *load, stepped chan error, o persistence.ActorOptions) (env *actorEnv, stop func()) {
	b.Helper()
	store, closeStore := mustOpenStore(b, w)
	env = &actorEnv{b: b, store: store}
	env.system = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	if o.MaxBatch == 0 {
		o.MaxBatch = benchMaxBatch
	}
	o.Observe = func(n int, took time.Duration) {
		env.commits.Add(1)
		env.groups.Add(int64(n))
		env.busy.Add(int64(took))
	}
	env.persist = env.system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(context.Background(), store, o)))
	for i := range w.sessions {
		out := &senderOut{}
		cfg := senderConfig{persist: env.persist, turns: w.turns[i], out: out, stepped: stepped, wg: &env.wg}
		env.outs = append(env.outs, out)
		env.senders = append(env.senders, env.system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor {
			return &sender{senderConfig: cfg}
		})))
	}
	var once sync.Once
	return env, func() {
		env.stop()
		once.Do(closeStore)
	}
}

// stop stops the senders, then the persistence actor (which commits what it still holds), then
// the system; only the first call does anything.
func (env *actorEnv) stop() {
	env.stopOnce.Do(func() {
		for _, pid := range env.senders {
			if err := env.system.Root.PoisonFuture(pid).Wait(); err != nil {
				env.b.Errorf("stop sender: %v", err)
			}
		}
		if err := env.system.Root.PoisonFuture(env.persist).Wait(); err != nil {
			env.b.Errorf("stop persistence actor: %v", err)
		}
		env.system.Shutdown()
	})
}

func (env *actorEnv) err() error {
	for _, out := range env.outs {
		if out.err != nil {
			return out.err
		}
	}
	return nil
}

// runActor persists the load through the persistence actor, every sender in a closed loop.
// The timer runs only while the turns are being persisted.
func runActor(b *testing.B, w *load) actorRun {
	b.Helper()
	env, stop := startActors(b, w, nil, persistence.ActorOptions{})
	defer stop()
	env.wg.Add(len(env.senders))
	runtime.GC() // don't bill the previous phase's garbage to this one

	b.StartTimer()
	start := time.Now()
	for _, pid := range env.senders {
		env.system.Root.Send(pid, &begin{})
	}
	finished := waitTimeout(&env.wg, phaseTimeout)
	elapsed := time.Since(start)
	b.StopTimer()

	if !finished {
		b.Fatalf("actor phase: not finished after %v", phaseTimeout)
	}
	if err := env.err(); err != nil {
		b.Fatalf("actor phase: %v", err)
	}
	stop() // the last commit's answers can overtake its report to Observe
	run := actorRun{elapsed: elapsed, busy: float64(env.busy.Load()) / float64(elapsed)}
	if n := env.commits.Load(); n > 0 {
		run.meanBatch = float64(env.groups.Load()) / float64(n)
	}
	return run
}

// runRawBatched commits the load from one goroutine, batch groups per transaction, and
// returns how long that took.
func runRawBatched(b *testing.B, w *load, batch int) time.Duration {
	b.Helper()
	batch = max(batch, 1)
	store, closeStore := mustOpenStore(b, w)
	defer closeStore()
	runtime.GC()
	ctx := context.Background()
	b.StartTimer()
	start := time.Now()
	for i := 0; i < len(w.byTurn); i += batch {
		for j, err := range store.Commit(ctx, w.byTurn[i:min(i+batch, len(w.byTurn))]) {
			if err != nil {
				b.Fatalf("raw commit group %d: %v", i+j, err)
			}
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	return elapsed
}

// runPaired persists a one-session load turn by turn, alternating between the persistence
// actor and a bare Commit of one turn on a second fresh store (raw first on odd turns, or on even
// turns when rawFirst is set). It returns both paths' per-turn latencies.
func runPaired(b *testing.B, w *load, rawFirst bool) (actorLat, rawLat []time.Duration) {
	b.Helper()
	if len(w.sessions) != 1 {
		b.Fatalf("runPaired: %d sessions, want 1", len(w.sessions))
	}
	stepped := make(chan error, 1)
	env, stop := startActors(b, w, stepped, persistence.ActorOptions{})
	defer stop()
	raw, closeRaw := mustOpenStore(b, w)
	defer closeRaw()
	ctx := context.Background()
	timeout := time.NewTimer(phaseTimeout)
	defer timeout.Stop()

	rawLat = make([]time.Duration, 0, len(w.byTurn))
	runtime.GC()
	b.StartTimer()
	for i := range w.byTurn {
		rawTurnFirst := (i%2 == 1) != rawFirst
		for _, rawTurn := range []bool{rawTurnFirst, !rawTurnFirst} {
			if rawTurn {
				start := time.Now()
				errs := raw.Commit(ctx, w.byTurn[i:i+1])
				rawLat = append(rawLat, time.Since(start))
				if errs[0] != nil {
					b.Fatalf("raw commit turn %d: %v", i, errs[0])
				}
				continue
			}
			env.system.Root.Send(env.senders[0], &begin{})
			select {
			case err := <-stepped:
				if err != nil {
					b.Fatalf("actor turn %d: %v", i, err)
				}
			case <-timeout.C:
				b.Fatalf("actor turn %d: no result after %v", i, phaseTimeout)
			}
		}
	}
	b.StopTimer()
	return env.outs[0].latencies, rawLat
}

// begin makes a sender start its closed loop, or persist its next turn when stepped.
type begin struct{}

type senderConfig struct {
	persist *actor.PID
	turns   [][]persistence.Op
	out     *senderOut
	stepped chan<- error // nil: closed loop over all turns
	wg      *sync.WaitGroup
}

// senderOut is what a sender leaves for the benchmark, which reads it after the sender has
// reported (wg or stepped).
type senderOut struct {
	latencies []time.Duration
	err       error
}

// sender plays one session: it sends a turn's Write, waits for its WriteResult and sends the
// next, as a session actor does when its turns follow each other. The latency of a turn is
// measured from the Request to the WriteResult's arrival in Receive.
type sender struct {
	senderConfig
	next int
	sent time.Time
}

func (s *sender) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *begin:
		s.send(c)
	case *persistence.WriteResult:
		s.out.latencies = append(s.out.latencies, time.Since(s.sent))
		var err error
		switch {
		case m.Err != nil:
			err = fmt.Errorf("write %d: %w", m.ID, m.Err)
		case m.ID != uint64(s.next):
			err = fmt.Errorf("write result %d, want %d", m.ID, s.next)
		}
		if s.stepped != nil {
			s.out.err = err
			s.stepped <- err // buffered, and one turn is in flight at a time: never blocks
			return
		}
		if err != nil || s.next == len(s.turns) {
			s.out.err = err
			s.wg.Done()
			return
		}
		s.send(c)
	}
}

func (s *sender) send(c actor.Context) {
	if s.next == len(s.turns) {
		s.out.err = fmt.Errorf("sender: all %d turns sent", s.next)
		if s.stepped != nil {
			s.stepped <- s.out.err
		}
		return
	}
	s.next++
	s.sent = time.Now()
	c.Request(s.persist, &persistence.Write{ID: uint64(s.next), Ops: s.turns[s.next-1]})
}

// waitTimeout waits for wg and reports whether it finished within d.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
