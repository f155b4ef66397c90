package supervisor

import (
	"context"
	"database/sql"
	"fmt"
	goruntime "runtime"
	"testing"
	"time"

	"github.com/agentgate/agentgate/actors"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/workload"
	"github.com/agentgate/agentgate/platforms"
)

// BenchmarkIdleSessionHeap measures the heap an idle session actor holds (issue #9: at most 2
// KiB; perf-anchors §8 G7). Sessions passivate after an hour here, so every activated session
// stays in memory, idle. Each round activates n sessions that were never seen: "empty" ones by
// asking each for its state (the actor loads an empty snapshot, as a known session with no
// transcript does) and "one_turn" ones by running one short message through each (its
// transcript buffer then holds the message and the reply). B/session is the heap and stack in
// use after the round minus before it, per session, both after two collections: everything the
// session costs the daemon, the manager's and the actor registry's map entries included.
//
// Stopping the sessions again does not give a usable "net" figure: PoisonFuture's futures stay
// reachable until their own timeout.
func BenchmarkIdleSessionHeap(b *testing.B) {
	const n = 5000
	bd := mustStartBenchDaemon(b, "", "bench", func(c *config.Config) { c.Sessions.PassivateAfter = time.Hour })
	defer bd.stop(b)
	var empty, oneTurn []float64
	round := 0
	for b.Loop() {
		e := bd.idleHeap(b, fmt.Sprint("empty-", round), n, false)
		o := bd.idleHeap(b, fmt.Sprint("turn-", round), n, true)
		empty, oneTurn = append(empty, e), append(oneTurn, o)
		round++
		if testing.Verbose() {
			b.Logf("round %d: empty %.0f B/session, after one turn %.0f B/session", round, e, o)
		}
	}
	b.ReportMetric(workload.Median(empty), "B/session")
	b.ReportMetric(workload.Median(oneTurn), "B/session_one_turn")
	b.Log(workload.Target{Name: "G7 idle session, empty transcript", Bound: 2048, AtMost: true, Unit: "B"}.Verdict(workload.Median(empty)))
	b.Log(workload.Target{Name: "G7 idle session after one turn", Bound: 2048, AtMost: true, Unit: "B"}.Verdict(workload.Median(oneTurn)))
}

// idleHeap activates n new sessions named after prefix (with one turn each when withTurn) and
// returns the heap they added, per session.
func (bd *benchDaemon) idleHeap(b *testing.B, prefix string, n int, withTurn bool) float64 {
	b.Helper()
	srcs := make([]identity.Source, n)
	keys := make([]string, n)
	for i := range srcs {
		srcs[i] = identity.Source{Platform: "bench", ChatType: identity.ChatDM, ChatID: fmt.Sprintf("%s-%d", prefix, i), UserID: "u"}
		keys[i] = bd.d.intake.Key(srcs[i])
	}
	active := len(bd.activeKeys(b))
	sentBefore := bd.p.sent.Load()
	before := heapInUse()
	parallel(b, n, 32, func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if withTurn {
			_, err := bd.p.deliver(ctx, &platforms.Inbound{Source: srcs[i], MessageID: "m", Text: "hi", ReceivedAt: time.Now()})
			return err
		}
		_, err := bd.d.router.Request(ctx, keys[i], &actors.GetState{})
		return err
	})
	if withTurn {
		bd.waitSent(b, sentBefore+int64(n))
	}
	after := heapInUse()
	if got := len(bd.activeKeys(b)); got != active+n {
		b.Fatalf("%d sessions in memory, want %d", got, active+n)
	}
	return float64(after-before) / float64(n)
}

func (bd *benchDaemon) activeKeys(b testing.TB) []string {
	b.Helper()
	res, err := bd.d.system.Root.RequestFuture(bd.d.manager, &actors.ListActive{}, 30*time.Second).Result()
	if err != nil {
		b.Fatalf("list active sessions: %v", err)
	}
	return res.(*actors.ActiveList).Keys
}

// heapInUse returns the heap and stack bytes in use after two collections.
func heapInUse() int64 {
	goruntime.GC()
	goruntime.GC()
	var m goruntime.MemStats
	goruntime.ReadMemStats(&m)
	return int64(m.HeapAlloc + m.StackInuse)
}

// BenchmarkKnownVsActiveSessions checks that memory follows the active sessions, not the known
// ones (issue #9: 100,000 known sessions with 1,000 active use memory in proportion to the
// active ones). Two data dirs are seeded, with 1,000 and with 100,000 sessions and their routes
// (as TestMemoryIsBoundedByActiveSessions does). Each round, for both dirs in alternating order,
// starts a daemon, runs one message through each of the same 1,000 sessions, counts the session
// actors in memory and stops the daemon. It reports the daemon's heap after start (start_KiB)
// and the heap each active session added (B/active_session) for both, and their ratios
// (100,000 known ÷ 1,000 known; 1.0 means the known sessions cost nothing).
func BenchmarkKnownVsActiveSessions(b *testing.B) {
	const active = 1000
	knowns := []int{active, 100_000}
	dirs := make([]string, len(knowns))
	for i, known := range knowns {
		dirs[i] = mustSeedKnownSessions(b, known)
	}
	start := make([][]float64, len(knowns))
	perActive := make([][]float64, len(knowns))
	for round := 0; b.Loop(); round++ {
		for j := range knowns {
			i := (j + round) % len(knowns)
			s, p := knownRound(b, dirs[i], knowns[i], active, round)
			start[i], perActive[i] = append(start[i], s), append(perActive[i], p)
			if testing.Verbose() {
				b.Logf("round %d, %d known: daemon heap after start %.0f KiB, %.0f B per active session", round+1, knowns[i], s, p)
			}
		}
	}
	for i, known := range knowns {
		b.ReportMetric(workload.Median(start[i]), fmt.Sprintf("start_KiB@%d_known", known))
		b.ReportMetric(workload.Median(perActive[i]), fmt.Sprintf("B/active_session@%d_known", known))
	}
	b.ReportMetric(workload.Median(start[1])/workload.Median(start[0]), "start_ratio")
	b.ReportMetric(workload.Median(perActive[1])/workload.Median(perActive[0]), "active_ratio")
	// The issue asks for memory "in proportion to the active sessions": the heap per active
	// session may not grow with the known ones. The bound allows G6's 25 % of noise and B-tree
	// depth, as for routing.
	b.Log(workload.Target{Name: "heap per active session, 100,000 ÷ 1,000 known", Bound: 1.25, AtMost: true}.Verdict(
		workload.Median(perActive[1]) / workload.Median(perActive[0])))
}

// knownSource is the source of known session i (its key is bench's dm key of chat-<i>).
func knownSource(i int) identity.Source {
	return identity.Source{Platform: "bench", ChatType: identity.ChatDM, ChatID: fmt.Sprint("chat-", i), UserID: "u"}
}

// mustSeedKnownSessions returns a data dir whose store holds n idle sessions with their routes.
func mustSeedKnownSessions(b *testing.B, n int) string {
	b.Helper()
	cfg := config.Default()
	cfg.DataDir = b.TempDir()
	ctx := context.Background()
	store, err := sqlite.Open(ctx, cfg.DSN(), sqlite.Options{}) // creates the schema
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Close(); err != nil {
		b.Fatal(err)
	}
	if k := identity.Key(knownSource(7), identity.DefaultKeyOptions); k != "agent:main:bench:dm:chat-7" {
		b.Fatalf("key layout changed: %s", k)
	}
	db, err := sql.Open("sqlite", "file:"+cfg.DSN())
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	at := time.Now().Add(-time.Hour).UnixNano()
	for _, q := range []string{
		`WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i+1 FROM n WHERE i+1 < ?)
		 INSERT INTO sessions (id, key, platform, chat_type, chat_id, user_id, started_at, last_activity_at)
		 SELECT 's-'||i, 'agent:main:bench:dm:chat-'||i, 'bench', 'dm', 'chat-'||i, 'u', ?2, ?2 FROM n`,
		`INSERT INTO routing (key, session_id, generation, updated_at) SELECT key, id, 1, started_at FROM sessions`,
	} {
		if _, err := db.ExecContext(ctx, q, n, at); err != nil {
			b.Fatal(err)
		}
	}
	return cfg.DataDir
}

// knownRound starts a daemon on dir, runs one message through sessions 0, known/active, … and
// returns the daemon's heap after start (KiB over the heap before it) and the heap per active
// session.
func knownRound(b *testing.B, dir string, known, active, round int) (startKiB, perActive float64) {
	b.Helper()
	before := heapInUse()
	bd := mustStartBenchDaemon(b, dir, "bench", func(c *config.Config) { c.Sessions.PassivateAfter = time.Hour })
	defer bd.stop(b)
	started := heapInUse()
	step := known / active
	parallel(b, active, 32, func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ack, err := bd.p.deliver(ctx, &platforms.Inbound{Source: knownSource(i * step), MessageID: fmt.Sprint("r", round),
			Text: "hi", ReceivedAt: time.Now()})
		if err == nil && ack.SessionID != fmt.Sprint("s-", i*step) {
			err = fmt.Errorf("message to known key chat-%d started session %s", i*step, ack.SessionID)
		}
		return err
	})
	bd.waitSent(b, int64(active))
	live := heapInUse()
	if n := len(bd.activeKeys(b)); n != active {
		b.Fatalf("%d session actors in memory with %d known and %d active, want %d", n, known, active, active)
	}
	return float64(started-before) / 1024, float64(live-started) / float64(active)
}
