package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/workload"
	"github.com/agentgate/agentgate/platforms"
)

// The benchmarks in this file drive the whole daemon in-process (real actor system, real SQLite
// in b.TempDir() with synchronous FULL, echo agent) through benchPlatform, an in-process
// platform that only signals replies (the platformtest Fake keeps and copies every reply, which
// would dominate a benchmark). Figures that are compared against a target are ratios or
// quantiles measured in the same run, reported with b.ReportMetric; nothing here asserts a
// timing. docs/BENCHMARKS.md has the commands and the latest results.

// benchPlatform is the platform of these benchmarks: Run hands over the intake's deliver func,
// Send counts replies and wakes whoever waits for the reply to a message id.
type benchPlatform struct {
	name  string
	ready chan struct{}
	once  sync.Once
	sent  atomic.Int64

	mu      sync.Mutex
	deliver platforms.Deliver
	waiting map[string]chan struct{} // by chat id and the message id a reply answers
}

func newBenchPlatform(name string) *benchPlatform {
	return &benchPlatform{name: name, ready: make(chan struct{}), waiting: map[string]chan struct{}{}}
}

func (p *benchPlatform) Name() string { return p.name }

func (p *benchPlatform) Run(ctx context.Context, deliver platforms.Deliver) error {
	p.mu.Lock()
	p.deliver = deliver
	p.mu.Unlock()
	p.once.Do(func() { close(p.ready) })
	<-ctx.Done()
	return nil
}

func (p *benchPlatform) Send(_ context.Context, out *platforms.Outbound) error {
	p.sent.Add(1)
	if len(out.InReplyTo) == 0 {
		return nil
	}
	k := out.Target.ChatID + "\x00" + out.InReplyTo[0]
	p.mu.Lock()
	ch, ok := p.waiting[k]
	delete(p.waiting, k)
	p.mu.Unlock()
	if ok {
		close(ch)
	}
	return nil
}

// expect returns a channel closed when the reply to message id of chat is sent.
func (p *benchPlatform) expect(chat, id string) <-chan struct{} {
	ch := make(chan struct{})
	p.mu.Lock()
	p.waiting[chat+"\x00"+id] = ch
	p.mu.Unlock()
	return ch
}

// benchDaemon is a daemon started for a benchmark, with benchPlatform at its edge.
type benchDaemon struct {
	d *Daemon
	p *benchPlatform
}

// mustStartBenchDaemon starts a daemon on dir (a temp dir when empty) with the echo agent and a
// benchPlatform named platform; the caller stops it.
func mustStartBenchDaemon(b testing.TB, dir, platform string, tweak func(*config.Config)) *benchDaemon {
	b.Helper()
	cfg := config.Default()
	cfg.DataDir = dir
	if dir == "" {
		cfg.DataDir = b.TempDir()
	}
	cfg.HTTP.Addr = "127.0.0.1:0"
	cfg.Shutdown.DrainTimeout = 5 * time.Second
	if tweak != nil {
		tweak(cfg)
	}
	p := newBenchPlatform(platform)
	log := slog.New(slog.NewTextHandler(b.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	d, err := Start(context.Background(), cfg, log, Options{Agent: echo.New(), Platforms: []platforms.Platform{p}})
	if err != nil {
		b.Fatalf("Start: %v", err)
	}
	select {
	case <-p.ready:
	case <-time.After(10 * time.Second):
		b.Fatal("bench platform never ran")
	}
	return &benchDaemon{d: d, p: p}
}

func (bd *benchDaemon) stop(b testing.TB) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := bd.d.Stop(ctx); err != nil {
		b.Errorf("Stop: %v", err)
	}
}

// turn delivers one message and waits until its reply has been sent.
func (bd *benchDaemon) turn(src identity.Source, id, text string) error {
	replied := bd.p.expect(src.ChatID, id)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := bd.p.deliver(ctx, &platforms.Inbound{Source: src, MessageID: id, Text: text, ReceivedAt: time.Now()}); err != nil {
		return fmt.Errorf("deliver %s: %w", id, err)
	}
	select {
	case <-replied:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("reply to %s: %w", id, ctx.Err())
	}
}

// waitSent waits until the platform has sent n replies in all.
func (bd *benchDaemon) waitSent(b testing.TB, n int64) {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for bd.p.sent.Load() < n {
		if time.Now().After(deadline) {
			b.Fatalf("sent %d replies, want %d", bd.p.sent.Load(), n)
		}
		time.Sleep(5 * time.Millisecond) // a poll interval under a deadline
	}
}

// BenchmarkSessionTurn is one turn through a session actor, from the platform's deliver call to
// the reply handed to the platform's Send: intake, router, session manager, session (inbound
// write, durable before the ack), turn actor and echo agent, result write, platform actor. One
// session, closed loop. After each turn it commits the same writes with no actors to a second
// store, as three bare transactions like the runtime makes them (the inbound message; the reply,
// status, activity, route and outbox; the delivery mark), so both paths see the same disk at the
// same moments. ns/op covers both halves; the metrics separate them: turn_p50_us and
// turn_p99_us (the runtime), raw_p50_us (the bare transactions) and added_us (the p50
// difference: what the actors, the agent call and the platform hop add to one turn).
func BenchmarkSessionTurn(b *testing.B) {
	bd := mustStartBenchDaemon(b, "", "bench", nil)
	defer bd.stop(b)
	raw := mustRawTurns(b)
	src := identity.Source{Platform: "bench", ChatType: identity.ChatDM, ChatID: "turn", UserID: "u"}
	if err := bd.turn(src, "warm-up", "hello"); err != nil { // creates the session
		b.Fatal(err)
	}
	var turns, raws []time.Duration
	i := 0
	for b.Loop() {
		start := time.Now()
		if err := bd.turn(src, fmt.Sprint("m", i), raw.texts[i%len(raw.texts)]); err != nil {
			b.Fatal(err)
		}
		turns = append(turns, time.Since(start))
		raws = append(raws, raw.commit(b, i))
		i++
	}
	b.ReportMetric(workload.QuantileUS(turns, 0.50), "turn_p50_us")
	b.ReportMetric(workload.QuantileUS(turns, 0.99), "turn_p99_us")
	b.ReportMetric(workload.QuantileUS(raws, 0.50), "raw_p50_us")
	b.ReportMetric(workload.QuantileUS(turns, 0.50)-workload.QuantileUS(raws, 0.50), "added_us")
}

// rawTurns commits a session's turns with no actors, as the runtime's three writes per turn.
type rawTurns struct {
	store   *sqlite.Store
	session persistence.Session
	texts   []string
}

func mustRawTurns(b *testing.B) *rawTurns {
	b.Helper()
	store, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "raw.db"), sqlite.Options{})
	if err != nil {
		b.Fatalf("open raw store: %v", err)
	}
	b.Cleanup(func() {
		if err := store.Close(); err != nil {
			b.Errorf("close raw store: %v", err)
		}
	})
	now := time.Now()
	r := &rawTurns{store: store, texts: workload.Texts(rand.New(rand.NewPCG(1, 2)), 256), session: persistence.Session{
		ID: "raw", Key: "agent:main:bench:dm:raw", Platform: "bench", ChatType: identity.ChatDM,
		ChatID: "raw", UserID: "u", StartedAt: now, LastActivityAt: now,
	}}
	if err := errors.Join(store.Commit(context.Background(), [][]persistence.Op{{&persistence.CreateSession{Session: r.session}}})...); err != nil {
		b.Fatalf("create raw session: %v", err)
	}
	return r
}

// commit writes turn k as the runtime does (three transactions) and returns how long that took.
func (r *rawTurns) commit(b *testing.B, k int) time.Duration {
	at := time.Now()
	ops := workload.Turn(r.session, k, r.texts[k%len(r.texts)], "echo: "+r.texts[k%len(r.texts)], at)
	// ops: 0 user message, 1 reply, 2 status, 3 activity, 4 route, 5 outbox
	txns := [][]persistence.Op{
		{ops[0], ops[3]},
		{ops[2], ops[1], ops[3], ops[4], ops[5]},
		{&persistence.MarkDelivery{SessionKey: r.session.Key, Seq: int64(k + 1), State: persistence.DeliveryDelivered, At: at, Attempt: 1}},
	}
	start := time.Now()
	for _, txn := range txns {
		if err := errors.Join(r.store.Commit(context.Background(), [][]persistence.Op{txn})...); err != nil {
			b.Fatalf("raw turn %d: %v", k, err)
		}
	}
	return time.Since(start)
}

// parallel runs f(0..n-1) on workers goroutines and fails b with the first error.
func parallel(b testing.TB, n, workers int, f func(i int) error) {
	b.Helper()
	var next atomic.Int64
	var first atomic.Pointer[error]
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := f(i); err != nil {
					first.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := first.Load(); err != nil {
		b.Fatal(*err)
	}
}
