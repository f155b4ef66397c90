package actors

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/asynkron/protoactor-go/actor"
)

// stepStore records the prune steps and commits of the store it wraps, in order, and calls
// duringFirst inside the first step and during (with the step's number, from 1) inside each.
type stepStore struct {
	persistence.Store
	duringFirst func()
	during      func(step int)

	mu     sync.Mutex
	events []string // "step" or "commit"
	steps  []persistence.PruneCount
}

func (s *stepStore) PruneStep(ctx context.Context, before time.Time, rows int) (persistence.PruneCount, error) {
	c, err := s.Store.PruneStep(ctx, before, rows)
	s.mu.Lock()
	first := len(s.steps) == 0
	s.events = append(s.events, "step")
	s.steps = append(s.steps, c)
	n := len(s.steps)
	s.mu.Unlock()
	if first && s.duringFirst != nil {
		s.duringFirst()
	}
	if s.during != nil {
		s.during(n)
	}
	return c, err
}

func (s *stepStore) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	s.mu.Lock()
	s.events = append(s.events, "commit")
	s.mu.Unlock()
	return s.Store.Commit(ctx, groups)
}

// TestPrunePassStepsLetWritesThrough: a prune pass over sessions of thousands of messages asks
// the persistence actor for steps of at most PrunePolicy.Batch rows, and a write that arrives
// during a step commits before the next one, not after the pass; the pass logs one line with
// its totals. Before, a request deleted 250 sessions in one transaction whatever their size: a
// chat's reply waited 21.9 s behind it on a 1 GB database, and the pass logged a line per
// request (502 for one pass).
func TestPrunePassStepsLetWritesThrough(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		store := mustOpenSQLite(t, ctx)
		const sessions, perSession, budget = 3, 2000, 1000
		for i := range sessions {
			mustCommit(t, store, longEndedSession(fmt.Sprint("old-", i), fmt.Sprint("k-", i), perSession)...)
		}
		mustCommit(t, store, &persistence.CreateSession{Session: persistence.Session{ID: "hot", Key: "hot", Platform: "fake",
			StartedAt: time.Now(), LastActivityAt: time.Now()}})
		time.Sleep(2 * time.Hour) // past the retention

		system, _ := quietSystem(t)
		defer system.Shutdown()
		var logs testutil.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		steps := &stepStore{Store: store}
		persist := system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(ctx, steps,
			persistence.ActorOptions{MaxBatch: 256, Log: log})))
		var written *actor.Future
		steps.duringFirst = func() {
			written = system.Root.RequestFuture(persist, &persistence.Write{ID: 1, Ops: []persistence.Op{&persistence.AppendMessage{
				Message: persistence.Message{SessionID: "hot", Seq: 1, Role: persistence.RoleUser, Content: "hi",
					Status: persistence.StatusPending, Active: true, CreatedAt: time.Now()}}}}, time.Hour)
		}
		d := &Deps{Ctx: ctx, Persist: persist, Store: steps, Log: log, Metrics: metrics.New("fake"),
			Config: SessionConfig{Prune: PrunePolicy{Enabled: true, After: time.Hour, Every: 24 * time.Hour, Batch: budget}}}
		timers := system.Root.Spawn(NewTimers(d, nil, time.Minute)) // prunes at start
		synctest.Wait()

		steps.mu.Lock()
		events, counts := strings.Join(steps.events, " "), steps.steps
		steps.mu.Unlock()
		for i, c := range counts {
			if c.Rows > budget {
				t.Errorf("step %d deleted %d rows (%+v), want at most %d", i, c.Rows, c, budget)
			}
		}
		if len(counts) < 10 {
			t.Errorf("the pass took %d steps, want at least 10 (%d messages, their index entries, replies and usage)", len(counts), sessions*perSession)
		}
		if last := strings.LastIndex(events, "step"); !strings.Contains(events[:last], "commit") {
			t.Errorf("steps and commits in order: %s; want the write sent during the first step committed before the last", events)
		}
		if res, err := written.Result(); err != nil || res.(*persistence.WriteResult).Err != nil {
			t.Errorf("the write sent during the pass = %+v, %v, want it committed", res, err)
		}
		var lines []string
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, "prune") {
				lines = append(lines, l)
			}
		}
		if len(lines) != 1 || !strings.Contains(lines[0], `level=INFO msg="pruned ended sessions"`) ||
			!strings.Contains(lines[0], fmt.Sprintf(" sessions=%d messages=%d outbox_swept=0 took=", sessions, sessions*perSession)) {
			t.Errorf("the pass logged %d lines about pruning: %q; want one with its totals", len(lines), lines)
		}
		checkPruned(t, store, keysOf("k-", sessions)...)

		stopPruning(t, system, timers, persist, store)
	})
}

// TestReplacedPrunePassCountsItsSteps: a Prune that comes while a pass runs (its PruneEvery
// came first) replaces the pass, and the pass lines still count every session and message the
// passes deleted: what the replaced pass had deleted in its line, logged then, and what its last
// step deleted in the line of the pass that replaced it. Before, both went uncounted. The
// replaced pass's line says so, cut_short=replaced (before, it looked like a pass that ended),
// and the line of the pass that ran to its end says nothing of the kind.
func TestReplacedPrunePassCountsItsSteps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		const sessions, perSession, budget = 3, 2000, 1000
		store := endedPastRetention(t, ctx, sessions, perSession)

		var logs testutil.Buffer
		system, timers, persist := startPrunePass(t, ctx, store, budget, &logs, nil, func(n int, timers *actor.PID, system *actor.ActorSystem) {
			if n == 3 { // the first pass has had two steps answered: replace it during its third
				system.Root.Send(timers, &Prune{})
			}
		})

		lines, gotSessions, gotMessages := passLines(t, &logs)
		if len(lines) != 2 || gotSessions != sessions || gotMessages != sessions*perSession {
			t.Errorf("pass lines %q count %d sessions and %d messages; want two lines, %d and %d",
				lines, gotSessions, gotMessages, sessions, sessions*perSession)
		}
		if len(lines) == 2 && (!strings.HasSuffix(lines[0], " cut_short=replaced") || strings.Contains(lines[1], "cut_short")) {
			t.Errorf("pass lines %q; want the first cut_short=replaced, the second without cut_short", lines)
		}
		checkPruned(t, store, keysOf("k-", sessions)...)

		stopPruning(t, system, timers, persist, store)
	})
}

// startPrunePass starts a prune test's actor system, with a persistence actor on store logging to
// logs and a Timers that prunes at once (in steps of budget rows, with the clock now unless nil),
// and waits for the bubble to settle. during runs as each step starts, numbered from 1, with the
// Timers and the system. The system shuts down when the test ends.
func startPrunePass(t *testing.T, ctx context.Context, store persistence.Store, budget int, logs *testutil.Buffer,
	now func() time.Time, during func(n int, timers *actor.PID, system *actor.ActorSystem)) (system *actor.ActorSystem, timers, persist *actor.PID) {
	t.Helper()
	system, _ = quietSystem(t)
	t.Cleanup(system.Shutdown)
	log := slog.New(slog.NewTextHandler(logs, nil))
	timersPID := make(chan *actor.PID, 1)
	steps := &stepStore{Store: store, during: func(n int) {
		pid := <-timersPID // sent once Timers is spawned
		timersPID <- pid
		during(n, pid, system)
	}}
	persist = system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(ctx, steps,
		persistence.ActorOptions{MaxBatch: 256, Log: log})))
	d := &Deps{Ctx: ctx, Persist: persist, Store: steps, Log: log, Metrics: metrics.New("fake"), Now: now,
		Config: SessionConfig{Prune: PrunePolicy{Enabled: true, After: time.Hour, Every: 24 * time.Hour, Batch: budget}}}
	timers = system.Root.Spawn(NewTimers(d, nil, time.Minute)) // prunes at start
	timersPID <- timers
	synctest.Wait()
	return system, timers, persist
}

// endedPastRetention opens a fresh SQLite store holding sessions ended sessions of perSession
// messages each, keys k-0, k-1…, and moves the (synctest) clock past the prune tests' retention.
func endedPastRetention(t *testing.T, ctx context.Context, sessions, perSession int) *sqlite.Store {
	t.Helper()
	store := mustOpenSQLite(t, ctx)
	for i := range sessions {
		mustCommit(t, store, longEndedSession(fmt.Sprint("old-", i), fmt.Sprint("k-", i), perSession)...)
	}
	time.Sleep(2 * time.Hour) // past the retention
	return store
}

// passLines returns the lines of prune passes in logs, and the sessions and messages they count.
func passLines(t *testing.T, logs *testutil.Buffer) (lines []string, sessions, messages int) {
	t.Helper()
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if !strings.Contains(l, "pruned ended sessions") {
			continue
		}
		lines = append(lines, l)
		var s, m int
		if _, err := fmt.Sscanf(l[strings.Index(l, " sessions="):], " sessions=%d messages=%d", &s, &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		sessions, messages = sessions+s, messages+m
	}
	return lines, sessions, messages
}

// mustOpenSQLite opens a fresh SQLite store in t's temporary directory.
func mustOpenSQLite(t *testing.T, ctx context.Context) *sqlite.Store {
	t.Helper()
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// stopPruning stops a prune test's Timers and persistence actor, then closes its store.
func stopPruning(t *testing.T, system *actor.ActorSystem, timers, persist *actor.PID, store persistence.Store) {
	t.Helper()
	if err := system.Root.StopFuture(timers).Wait(); err != nil {
		t.Fatal(err)
	}
	if err := system.Root.StopFuture(persist).Wait(); err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
}

// checkPruned fails t unless store holds no session of any of keys.
func checkPruned(t *testing.T, store persistence.Store, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if ss, err := store.SessionsOfKey(t.Context(), k, 0); err != nil || len(ss) != 0 {
			t.Errorf("sessions of %s after pruning = %d, %v, want none", k, len(ss), err)
		}
	}
}

// keysOf returns prefix0 … prefix(n-1).
func keysOf(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint(prefix, i)
	}
	return keys
}

// longEndedSession returns the ops of a session of n messages, every other one a delivered reply
// with its turn's usage, ended now.
func longEndedSession(id, key string, n int) []persistence.Op {
	ops := []persistence.Op{&persistence.CreateSession{Session: persistence.Session{ID: id, Key: key, Platform: "fake",
		StartedAt: time.Now(), LastActivityAt: time.Now()}}}
	for seq := int64(1); seq <= int64(n); seq++ {
		m := persistence.Message{SessionID: id, Seq: seq, Role: persistence.RoleUser, Content: fmt.Sprint("said ", seq),
			Status: persistence.StatusDone, Active: true, CreatedAt: time.Now(), Platform: "fake", ChatID: key,
			MessageID: fmt.Sprint(id, "-", seq)}
		if seq%2 == 0 {
			m.Role, m.MessageID, m.TurnID = persistence.RoleAssistant, "", fmt.Sprint("turn-", seq)
			ops = append(ops,
				&persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: key, Seq: seq / 2, SessionID: id, Kind: "reply",
					Text: m.Content, Platform: "fake", State: persistence.DeliveryPending, CreatedAt: time.Now()}},
				&persistence.MarkDelivery{SessionKey: key, Seq: seq / 2, State: persistence.DeliveryDelivered, At: time.Now()},
				&persistence.AddUsage{SessionID: id, TurnID: m.TurnID, InputTokens: 3, OutputTokens: 1})
		}
		ops = append(ops, &persistence.AppendMessage{Message: m})
	}
	return append(ops, &persistence.EndSession{SessionID: id, Reason: persistence.EndNewCommand, At: time.Now()})
}

func mustCommit(t *testing.T, s persistence.Store, ops ...persistence.Op) {
	t.Helper()
	if errs := s.Commit(context.Background(), [][]persistence.Op{ops}); errs[0] != nil {
		t.Fatal(errs[0])
	}
}

// TestRestartedTimersTakesNoLateStepForItsOwn: Timers restarts (a panic) while a step of its
// prune pass runs, and the new instance starts a pass of its own at once. The old step's answer
// comes after that, and ends no pass of the new instance: the new pass logs one line once its
// own steps are done, with what the old step deleted too. Before, passes were numbered from 1 in
// each instance, the old answer was taken for the new pass 1's, which logged its line then (the
// old step's session alone), and a second line for the rest.
func TestRestartedTimersTakesNoLateStepForItsOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		store := mustOpenSQLite(t, ctx)
		mustCommit(t, store, longEndedSession("old-a", "k-a", 10)...)
		time.Sleep(2 * time.Hour) // past the retention

		system, _ := quietSystem(t)
		defer system.Shutdown()
		var logs testutil.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		inStep, resume := make(chan struct{}), make(chan struct{})
		steps := &stepStore{Store: store, duringFirst: func() {
			close(inStep)
			<-resume
		}}
		persist := system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(ctx, steps,
			persistence.ActorOptions{MaxBatch: 256, Log: log})))
		var panicNow atomic.Bool
		d := &Deps{Ctx: ctx, Persist: persist, Store: steps, Log: log, Metrics: metrics.New("fake"),
			Now: func() time.Time {
				if panicNow.CompareAndSwap(true, false) {
					panic("timers crash (test)")
				}
				return time.Now()
			},
			Config: SessionConfig{Prune: PrunePolicy{Enabled: true, After: time.Hour, Every: 24 * time.Hour, Batch: 1000}}}
		timers := system.Root.Spawn(NewTimers(d, nil, time.Minute)) // prunes at start
		<-inStep                                                    // the first pass's first step deleted old-a, and is not yet answered
		// Another session falls due meanwhile; then Timers crashes, and its new instance
		// starts a pass (at its start), which asks for a step behind the old one.
		mustCommit(t, store, longEndedSession("old-b", "k-b", 10)...)
		time.Sleep(2 * time.Hour)
		panicNow.Store(true)
		system.Root.Send(timers, &CheckResets{})
		synctest.Wait()
		close(resume)
		synctest.Wait()

		var lines []string
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, "pruned ended sessions") {
				lines = append(lines, l)
			}
		}
		if len(lines) != 1 || !strings.Contains(lines[0], " sessions=2 messages=20 ") {
			t.Errorf("pass lines %q; want one, of 2 sessions and 20 messages", lines)
		}
		checkPruned(t, store, "k-a", "k-b")

		stopPruning(t, system, timers, persist, store)
	})
}

// TestPrunePassCutShortLogsWhatItDeleted: Timers restarts (a panic) during the third step of
// a prune pass over sessions of hundreds of messages, two steps of it answered. The old
// instance logs the pass's line with what those two steps deleted, cut_short=restart, and the
// new instance's pass, which counts the third step's answer too, logs the rest: the lines count
// every session and message deleted. Before, the old instance's totals went with it, and the
// lines counted only what the new pass saw (and, when the third step's answer came before the
// new pass began, it made a line of its own, with no cutoff). Stopped there instead (agentgate
// stopping), Timers logs what the two steps deleted, cut_short=stop, and step_running=true: the
// third step's answer comes to no one, and the line says so (before, it said nothing of it).
// Stopped during the first step, Timers logs a line of nothing deleted yet, step_running=true
// (before, no line: the rows that step deleted were told nowhere).
func TestPrunePassCutShortLogsWhatItDeleted(t *testing.T) {
	for _, tc := range []struct {
		name string
		cut  string
		at   int // the step Timers is cut short in
	}{
		{"restart", "restart", 3},
		{"stop", "stop", 3},
		{"stop_in_first_step", "stop", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { prunePassCutShort(t, tc.cut, tc.at) })
		})
	}
}

// prunePassCutShort is TestPrunePassCutShortLogsWhatItDeleted, its pass cut short by cut
// during step at.
func prunePassCutShort(t *testing.T, cut string, at int) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const sessions, perSession, budget = 3, 200, 100
	store := endedPastRetention(t, ctx, sessions, perSession)

	var logs testutil.Buffer
	var panicNow atomic.Bool
	now := func() time.Time {
		if panicNow.CompareAndSwap(true, false) {
			panic("timers crash (test)")
		}
		return time.Now()
	}
	system, timers, persist := startPrunePass(t, ctx, store, budget, &logs, now, func(n int, timers *actor.PID, system *actor.ActorSystem) {
		if n != at { // at-1 steps answered: Timers crashes or stops while the next runs
			return
		}
		if cut == "stop" {
			system.Root.Stop(timers)
			return
		}
		panicNow.Store(true)
		system.Root.Send(timers, &CheckResets{})
	})

	lines, gotSessions, gotMessages := passLines(t, &logs)
	var cutLines int
	for _, l := range lines {
		if strings.HasSuffix(l, " cut_short=restart") && cut == "restart" ||
			strings.HasSuffix(l, " cut_short=stop step_running=true") && cut == "stop" {
			cutLines++
		}
	}
	if cut == "stop" {
		// The running step's answer and the rest of the pass are counted nowhere: the pass
		// stopped, and its line says a step was running.
		if len(lines) != 1 || cutLines != 1 || (gotSessions+gotMessages == 0) != (at == 1) {
			t.Errorf("pass lines %q; want one, cut_short=stop step_running=true, of what %d steps deleted", lines, at-1)
		}
		if err := system.Root.StopFuture(persist).Wait(); err != nil {
			t.Fatal(err)
		}
		if err := store.Close(); err != nil {
			t.Fatal(err)
		}
		return
	}
	if len(lines) != 2 || cutLines != 1 || gotSessions != sessions || gotMessages != sessions*perSession {
		t.Errorf("pass lines %q count %d sessions and %d messages; want two lines, one cut_short=restart, %d and %d",
			lines, gotSessions, gotMessages, sessions, sessions*perSession)
	}
	checkPruned(t, store, keysOf("k-", sessions)...)

	stopPruning(t, system, timers, persist, store)
}

// TestPassLineOfAnInstanceThatBeganNoPass: a restarted Timers counts the late answer to the step
// its old instance had running (onPruned) before its own first pass begins; stopped (or
// restarted again) then, it logs that count with pass=before_restart and no time or cutoff of a
// pass it never began. Before, the line said took=2562047h47m16.854s (time since the zero time:
// 292 years) and ended_before=0001-01-01. The window lies between two messages in Timers' own
// mailbox (the answer, then the Prune its Started sent), which no test outside the actor can
// hold open: the test gives the instance that state and cuts it short, then again: the line
// cleared the totals, and the second cut has nothing to say.
func TestPassLineOfAnInstanceThatBeganNoPass(t *testing.T) {
	for _, cut := range []any{&actor.Stopping{}, &actor.Restarting{}} {
		t.Run(fmt.Sprintf("%T", cut), func(t *testing.T) {
			var logs testutil.Buffer
			tm := &Timers{log: slog.New(slog.NewTextHandler(&logs, nil)), pass: 7}
			tm.onPruned(nil, &persistence.Pruned{Pass: 6, Sessions: 2, Messages: 20, Swept: 3})
			tm.logCutShort(cut)
			line := strings.TrimSpace(logs.String())
			if strings.Count(line, "pruned ended sessions") != 1 || !strings.Contains(line, " sessions=2 messages=20 outbox_swept=3 pass=before_restart cut_short=") ||
				strings.Contains(line, "took=") || strings.Contains(line, "ended_before=") {
				t.Errorf("line %q; want one, of 2 sessions, 20 messages and 3 outbox rows swept, pass=before_restart, no took or ended_before", line)
			}
			// The line cleared the totals: cut short again (a restart's instance is), it has
			// nothing to say.
			tm.logCutShort(cut)
			if got := strings.TrimSpace(logs.String()); got != line {
				t.Errorf("cut short again after its line, the log is %q; want only that line (the totals told once)", got)
			}
		})
	}
}

// TestPrunePassLineCountsTheSweptOutbox: a pass that deletes no session but sweeps the outbox
// (a reply delivered after its session was pruned, Store.PruneStep) logs its line with
// outbox_swept; before, a pass logged its line only when it deleted sessions or messages.
func TestPrunePassLineCountsTheSweptOutbox(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		store := mustOpenSQLite(t, ctx)
		// A step first: the first step of a run deletes what earlier runs left of the sessions
		// they pruned (on SQLite, those entries too, as what a step left), and counts no sweep.
		if _, err := store.PruneStep(ctx, time.Now(), 0); err != nil {
			t.Fatal(err)
		}
		mustCommit(t, store,
			&persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: "k-gone", Seq: 1, SessionID: "gone", Kind: "reply",
				Text: "a late answer", State: persistence.DeliveryPending, CreatedAt: time.Now()}},
			&persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: "k-gone", Seq: 2, SessionID: "gone", Kind: "reply",
				Text: "a later answer", State: persistence.DeliveryPending, CreatedAt: time.Now()}},
			&persistence.MarkDelivery{SessionKey: "k-gone", Seq: 1, State: persistence.DeliveryDelivered, At: time.Now()},
			&persistence.MarkDelivery{SessionKey: "k-gone", Seq: 2, State: persistence.DeliveryDelivered, At: time.Now()})
		var logs testutil.Buffer
		system, timers, persist := startPrunePass(t, ctx, store, 0, &logs, nil, func(int, *actor.PID, *actor.ActorSystem) {})
		lines, sessions, messages := passLines(t, &logs)
		if len(lines) != 1 || sessions != 0 || messages != 0 || !strings.Contains(lines[0], " outbox_swept=2 ") {
			t.Errorf("pass lines %q; want one, of no session and 2 outbox rows swept", lines)
		}
		if got, err := store.OutboxAfter(ctx, "k-gone", 0, 0); err != nil || len(got) != 0 {
			t.Errorf("OutboxAfter(k-gone) after the pass = %+v, %v; want none", got, err)
		}
		stopPruning(t, system, timers, persist, store)
	})
}
