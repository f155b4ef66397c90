package actors

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRefusedTurnResultIsKeptNotRunAgain: the store refuses a turn's result as a full disk does
// (the database and the spool both failing) five times, then takes it. The session holds the
// result and writes it again: the agent ran once, the reply is sent once, the message is done
// in the store, and the refusals are logged once, those held back reported with their count
// when the store takes the result. Before, the session started again from the store at each
// refusal and ran the agent again (an exec agent whose tools act on the world acted six times
// for one message), with three WRN lines each time.
func TestRefusedTurnResultIsKeptNotRunAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const refusals = 5
		logs := &testutil.Buffer{}
		agent, ran := countingEcho()
		disk := &fullDisk{left: refusals, result: resultOf("m1")}
		w := newManagerWorldWrites(t, agent, func(d *Deps) {
			d.Log = slog.New(slog.NewTextHandler(logs, nil))
		}, func(s persistence.Store) persistence.Store { disk.Store = s; return disk })
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()

		if got := disk.refusedResults(); got != refusals {
			t.Fatalf("the store refused the turn's result %d times, want %d: the test does not test", got, refusals)
		}
		if n := ran("m1"); n != 1 {
			t.Errorf("the agent ran m1 %d times, want once", n)
		}
		var sent []string
		for len(w.sent) > 0 {
			sent = append(sent, (<-w.sent).Out.Text)
		}
		if !slices.Equal(sent, []string{"echo: one"}) {
			t.Errorf("sent %q, want the reply once", sent)
		}
		if st, _ := w.statusOf(t, "m1"); st != persistence.StatusDone {
			t.Errorf("m1 is %s in the store, want done", st)
		}
		if got := promtest.ToFloat64(w.d.Metrics.TurnsTotal.WithLabelValues("ok")); got != 1 {
			t.Errorf("agentgate_turns_total{outcome=\"ok\"} = %v, want 1", got)
		}
		// The first refusal at once; the four held back reported, with their count and times,
		// when the store takes the result, before the line that says so (not an hour later with
		// another outage's first refusal, nor never).
		var lines []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "store turn result") || strings.Contains(l, "the store took a turn's result") {
				lines = append(lines, l)
			}
		}
		if len(lines) != 3 || strings.Contains(lines[0], "repeats") || !strings.Contains(lines[1], "repeats=4 ") ||
			!strings.Contains(lines[2], "the store took a turn's result") || !strings.Contains(lines[2], "refused=5") {
			t.Errorf("%d refusals of the turn's result logged %q, want its first refusal, then the four held back (repeats=4), then the store's taking it (refused=5):\n%s",
				refusals, lines, logs.String())
		}
		if strings.Contains(logs.String(), "starts again from the store") {
			t.Errorf("the session started again from the store:\n%s", logs.String())
		}
	})
}

// TestHeldTurnResultGoesFirst: while the session holds a turn's result the store refused, what
// it writes meanwhile waits behind it: another turn's result (its turn began before the refusal
// came) is stored and sent after it, in order, and a command is refused at once; the next
// queued message runs only once the held result is stored. Each message runs once.
func TestHeldTurnResultGoesFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate, second := make(chan struct{}), make(chan struct{})
		var mu sync.Mutex
		runs := map[string]int{}
		var w *managerWorld
		m1At3 := ""
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			id := req.Identity.MessageID
			mu.Lock()
			runs[id]++
			mu.Unlock()
			var wait <-chan struct{}
			switch id {
			case "m1":
				wait = gate
			case "m2":
				wait = second // it ends while m1's result is held
			case "m3":
				m1, err := w.store.FindInbound(ctx, w.src.Platform, w.src.ChatID, "m1")
				mu.Lock()
				if err == nil {
					m1At3 = m1.Status
				}
				mu.Unlock()
			}
			if wait != nil {
				select {
				case <-wait:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return &agents.Response{Text: "answer " + id}, nil
		})
		disk := &fullDisk{left: 3, result: resultOf("m1"), refused: func(n int) {
			if n == 2 {
				close(second)
			}
		}}
		w = newManagerWorldWrites(t, agent, nil, func(s persistence.Store) persistence.Store { disk.Store = s; return disk })
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		for _, id := range []string{"m2", "m3"} {
			if r := w.deliver(t, id, id); r.Disposition != platforms.Queued {
				t.Fatalf("%s: %+v, want queued", id, r)
			}
		}
		close(gate)
		synctest.Wait() // m1's result is refused; m2 runs
		if disk.refusedResults() != 1 {
			t.Fatalf("the store refused m1's result %d times, want 1 by now", disk.refusedResults())
		}
		status := w.request("st", "/status")
		time.Sleep(time.Minute)
		synctest.Wait()

		// (Refused before it acts: TestCommandWhileAResultIsHeldIsRefusedBeforeItActs.)
		if res, err := status.Result(); err != nil || res.(*DeliverResult).ErrorCode != ErrCodeUnavailable {
			t.Errorf("/status while a result was held: %v %v, want it refused as unavailable", res, err)
		}
		var sent []string
		for len(w.sent) > 0 {
			text := (<-w.sent).Out.Text
			if strings.HasPrefix(text, "Session ") {
				text = "/status"
			}
			sent = append(sent, text)
		}
		if want := []string{"answer m1", "answer m2", "answer m3"}; !slices.Equal(sent, want) {
			t.Errorf("sent %q, want %q", sent, want)
		}
		mu.Lock()
		defer mu.Unlock()
		if want := map[string]int{"m1": 1, "m2": 1, "m3": 1}; fmt.Sprint(runs) != fmt.Sprint(want) {
			t.Errorf("the agent ran %v, want each message once", runs)
		}
		if m1At3 != persistence.StatusDone {
			t.Errorf("m3 ran while m1 was %q in the store, want it done first", m1At3)
		}
	})
}

// TestMessageBehindAHeldResultIsRefusedWithIt: a message that comes while the session holds a
// turn's result the store refused waits behind it, and is refused with it when the store
// refuses it again: its sender is told at once to send it again. Sent again once the store
// takes writes, it is taken and answered after the held result.
func TestMessageBehindAHeldResultIsRefusedWithIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		agent, ran := countingEcho()
		w := newManagerWorldWrites(t, fillsFirst(out, agent), nil, func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		time.Sleep(30 * time.Second)
		synctest.Wait()
		start := time.Now()
		if r := w.deliver(t, "m2", "two"); r.ErrorCode != ErrCodeUnavailable {
			t.Errorf("m2 while the disk is full: %+v, want unavailable", r)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("m2 answered after %v, want at once", took)
		}
		out.Down.Store(false)
		if r := w.deliver(t, "m2", "two"); r.ErrorCode != "" {
			t.Fatalf("m2 sent again once the disk has room: %+v, want it taken", r)
		}
		w.awaitTurnEndsWithin(t, 2, time.Minute)
		synctest.Wait()
		if n1, n2 := ran("m1"), ran("m2"); n1 != 1 || n2 != 1 {
			t.Errorf("the agent ran m1 %d and m2 %d times, want once each", n1, n2)
		}
	})
}

// TestDrainWaitsForAHeldResult: a drain waits for a turn's result the store refused: once the
// store takes it (within the drain's deadline), the reply goes out and the drain ends. A daemon
// that stops first (the deadline passed) loses the result: the message runs again at the next
// start, and is answered then; with sessions.recovery: notice the line says it is answered
// with a notice then (before, it said it runs again). The refusals held back are reported
// before that line (before, after it, their line saying the session keeps the result).
func TestDrainWaitsForAHeldResult(t *testing.T) {
	for _, tc := range []struct{ room, notice bool }{{true, false}, {false, false}, {false, true}} {
		room := tc.room
		t.Run(fmt.Sprintf("room=%v,notice=%v", room, tc.notice), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "agentgate.db")
				out := &storetest.Outage{}
				logs := &testutil.Buffer{}
				agent, ran := countingEcho()
				w := newManagerWorldWith(t, path, fillsFirst(out, agent), func(d *Deps) {
					d.Log = slog.New(slog.NewTextHandler(logs, nil))
					if tc.notice {
						d.Config.Recovery = RecoveryNotice
					}
				}, out.Wrap)
				if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
					t.Fatalf("m1: %+v, want started", r)
				}
				synctest.Wait()
				drained := w.drain()
				time.Sleep(30 * time.Second)
				synctest.Wait()
				if answered(drained) {
					t.Fatal("the drain ended while the session held a turn's result the store refused")
				}
				if room {
					out.Down.Store(false)
					time.Sleep(time.Minute)
					synctest.Wait()
					if len(w.sent) != 1 || (<-w.sent).Out.Text != "echo: one" {
						t.Errorf("the platform was sent %d replies, want m1's", len(w.sent))
					}
					if !answered(drained) {
						t.Error("the drain did not end once the held result was stored")
					}
					return
				}
				w.stop() // the drain's deadline
				// The refusals held back since the first one's line (the result is written again
				// every few seconds) are reported before the line that says the session stops with
				// it: after it, their line said the session keeps the result and writes it again.
				var refusals []string
				stops := -1
				for i, l := range strings.Split(logs.String(), "\n") {
					switch {
					case strings.Contains(l, "the session stops with turn results the store has not taken"):
						stops = i
					case strings.Contains(l, "store turn result; the session keeps it") && stops < 0:
						refusals = append(refusals, l)
					}
				}
				if stops < 0 {
					t.Errorf("the lost result is not logged:\n%s", logs.String())
				}
				if len(refusals) != 2 || strings.Contains(refusals[0], "repeats=") || !strings.Contains(refusals[1], "repeats=") {
					t.Errorf("refusals logged before the line of the stop %q, want the first, then those held back (repeats):\n%s", refusals, logs.String())
				}
				if tc.notice {
					if !strings.Contains(logs.String(), "not taken; their messages are answered at the next start with a notice instead of run") {
						t.Errorf("the lost result's line does not say its message is answered with a notice:\n%s", logs.String())
					}
					return
				}
				w2 := newManagerWorldAt(t, path, agent, nil)
				if r := w2.deliver(t, "m2", "two"); r.ErrorCode != "" {
					t.Fatalf("m2 after the restart: %+v", r)
				}
				w2.awaitTurnEndsWithin(t, 2, time.Minute)
				if n := ran("m1"); n != 2 {
					t.Errorf("the agent ran m1 %d times, want twice: once before the stop, once after", n)
				}
			})
		})
	}
}

// fillsFirst is agent during whose first turn the disk fills (out refuses every write from
// then on, until the test makes room).
func fillsFirst(out *storetest.Outage, agent agents.Agent) agents.Agent {
	var filled sync.Once
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		filled.Do(func() { out.Down.Store(true) })
		return agent.Run(ctx, req)
	})
}

// fullDisk refuses every commit, as a full disk does (persistence.ErrUnavailable for each
// group), from the first that holds a write result picks until it has refused such a commit
// left times; after that it takes everything.
type fullDisk struct {
	persistence.Store
	result  func(persistence.Op) bool
	refused func(n int) // called with the count after each refusal of a result; may be nil

	mu    sync.Mutex
	left  int
	count int
	full  bool
}

func (f *fullDisk) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	f.mu.Lock()
	if slices.ContainsFunc(groups, func(g []persistence.Op) bool { return slices.ContainsFunc(g, f.result) }) {
		f.full = f.left > 0
		if f.full {
			f.left--
			f.count++
			if f.refused != nil {
				f.refused(f.count)
			}
		}
	}
	full := f.full
	f.mu.Unlock()
	if !full {
		return f.Store.Commit(ctx, groups)
	}
	errs := make([]error, len(groups))
	for i := range errs {
		errs[i] = fmt.Errorf("%w: disk full (test)", persistence.ErrUnavailable)
	}
	return errs
}

// refusedResults is how many commits holding a result the disk refused.
func (f *fullDisk) refusedResults() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count
}

// resultOf picks the op that records the answer to the message with id (its outbox entry).
func resultOf(id string) func(persistence.Op) bool {
	return func(op persistence.Op) bool {
		o, ok := op.(*persistence.AddOutbox)
		return ok && o.Entry.TurnID != "" && slices.Contains(o.Entry.InReplyTo, id)
	}
}

// TestCommandWhileAResultIsHeldIsRefusedBeforeItActs: a command that comes while the session
// holds a turn's result the store refused is refused at once ("unavailable", before it acts),
// and taken once the result is stored. Before, it acted in memory at once and its answer waited
// behind the result for the whole outage: its sender, past the Discord adapter's minute, was
// told to send again a command that had acted (found by a review).
func TestCommandWhileAResultIsHeldIsRefusedBeforeItActs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent, ran := countingEcho()
		disk := &fullDisk{left: 20, result: resultOf("m1")} // minutes of refusals, 10 s apart
		w := newManagerWorldWrites(t, agent, nil, func(s persistence.Store) persistence.Store { disk.Store = s; return disk })
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		synctest.Wait()
		if disk.refusedResults() == 0 {
			t.Fatal("the store took the turn's result: the test does not test")
		}
		sid := w.deliver(t, "s1", "/status").SessionId
		f := w.request("n1", "/new")
		synctest.Wait()
		res, err := f.Result()
		if err != nil {
			t.Fatal(err)
		}
		if r := res.(*DeliverResult); r.ErrorCode != ErrCodeUnavailable {
			t.Fatalf("/new while a result is held = %+v, want refused as unavailable at once", r)
		}
		time.Sleep(10 * time.Minute) // the disk has room again
		synctest.Wait()
		if n := ran("m1"); n != 1 {
			t.Errorf("the agent ran m1 %d times, want once", n)
		}
		if st, _ := w.statusOf(t, "m1"); st != persistence.StatusDone {
			t.Errorf("m1 is %s in the store, want done", st)
		}
		r := w.deliver(t, "n2", "/new")
		if r.ErrorCode != "" || r.SessionId == sid {
			t.Errorf("/new once the result is stored = %+v, want a new session (not %s)", r, sid)
		}
	})
}

// TestHeldResultFinishesItsDraft: the store refuses a streamed turn's result for longer than a
// draft waits for its reply (finishWait), then takes it. The reply finishes the turn's draft:
// the session has the draft wait anew at each retry. Before, the draft was marked interrupted
// 30 s after the turn ended, and the reply, stored later, was posted as a message of its own
// under it.
func TestHeldResultFinishesItsDraft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const refusals = 8 // tried again after 1, 2, 4, 8, 10, 10 and 10 s: 45 s
		disk := &fullDisk{left: refusals, result: resultOf("m1")}
		w := newLongRunWorld(t, streamingAgent, func(d *Deps) { disk.Store = d.Store; d.Store = disk })
		mustAccept(t, "m1", []*actor.Future{w.send(0, "m1", "one")})
		time.Sleep(2 * time.Minute)
		synctest.Wait()

		if got := disk.refusedResults(); got != refusals {
			t.Fatalf("the store refused the turn's result %d times, want %d: the test does not test", got, refusals)
		}
		ds, sent := w.fake.Drafts(), w.fake.Sent()
		if len(ds) != 1 || !ds[0].Final || ds[0].Text() != "answer to one" {
			t.Errorf("drafts %+v, want one, finished with the reply", ds)
		}
		if len(sent) != 1 || len(ds) != 1 || sent[0].DraftID != ds[0].ID {
			t.Errorf("sent %+v, want the reply, finishing the draft", sent)
		}
	})
}

// TestResultInFlightBehindAHeldResultWaitsBehindIt: the store refuses m1's turn result while
// m2's, its turn run meanwhile, waits in the persistence actor's queue, and would take m2's
// (room freed between two batches). m2's result is refused with m1's, held behind it, and
// stored after it: m2's reply goes out after m1's, and each message runs once and is done in the
// store. Before, m2's reply went out at once, ahead of m1's; and then, taken ahead and written
// again, its outbox entry was in the store ahead of m1's
// (TestEventStreamSeesAReplyHeldBehindAWriteInFlight).
func TestResultInFlightBehindAHeldResultWaitsBehindIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		echo, ran := countingEcho()
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			if req.Identity.MessageID == "m1" {
				<-release
			}
			return echo.Run(ctx, req)
		})
		disk := &refusesFirst{pick: resultOf("m1"), gate: make(chan struct{})}
		w := newManagerWorldWrites(t, agent, nil, func(s persistence.Store) persistence.Store {
			disk.Store = s
			return disk
		})
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		if r := w.deliver(t, "m2", "two"); r.Disposition != platforms.Queued {
			t.Fatalf("m2: %+v, want queued", r)
		}
		close(release)
		synctest.Wait() // m1's result waits in its commit, and m2's, its turn run, behind it
		close(disk.gate)
		time.Sleep(time.Minute)
		synctest.Wait()

		if disk.refusals() == 0 {
			t.Fatal("the store took m1's result at once: the test does not test")
		}
		var sent []string
		for len(w.sent) > 0 {
			sent = append(sent, (<-w.sent).Out.Text)
		}
		if want := []string{"echo: one", "echo: two"}; !slices.Equal(sent, want) {
			t.Errorf("sent %q, want %q", sent, want)
		}
		for _, id := range []string{"m1", "m2"} {
			if n := ran(id); n != 1 {
				t.Errorf("the agent ran %s %d times, want once", id, n)
			}
			if st, _ := w.statusOf(t, id); st != persistence.StatusDone {
				t.Errorf("%s is %s in the store, want done", id, st)
			}
		}
	})
}

// TestUndoInFlightBehindARefusedResultIsRefusedWithIt: /undo comes as m1's turn ends, while its
// result waits in the store's commit; the store refuses that result, and would take the /undo's
// write behind it (room freed between two batches). The /undo is refused with it, at once (its
// sender is told to send it again), and the session starts again from the store: it gives up
// m1's held result with a line that says m1 runs again, and m1 does, once, and is answered
// once, its exchange active. Sent again, the /undo takes the exchange back. Before, the store
// took the /undo ahead of m1's result: if the session handed over before it was written again,
// m1's reply, stored after it, stayed active in the history; or, m1's result not stored yet,
// the hand-over's line said m1 would run again, which the /undo's archive of it prevented.
func TestUndoInFlightBehindARefusedResultIsRefusedWithIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &testutil.Buffer{}
		disk := &refusesFirst{pick: resultOf("m1"), gate: make(chan struct{})}
		echo, ran := countingEcho()
		w := newManagerWorldWrites(t, echo, func(d *Deps) {
			d.Log = slog.New(slog.NewTextHandler(logs, nil))
		}, func(s persistence.Store) persistence.Store {
			disk.Store = s
			return disk
		})
		m1 := w.deliver(t, "m1", "one")
		synctest.Wait() // m1's result waits in its commit
		undo := w.request("u1", "/undo")
		synctest.Wait() // the /undo's write waits behind it
		close(disk.gate)
		start := time.Now()
		res, err := undo.Result()
		if err != nil {
			t.Fatal(err)
		}
		if r := res.(*DeliverResult); r.ErrorCode != ErrCodeUnavailable {
			t.Errorf("/undo behind m1's refused result: %+v, want it refused as unavailable", r)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("/undo answered after %v, want at once", took)
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()

		if disk.refusals() == 0 {
			t.Fatal("the store took m1's result at once: the test does not test")
		}
		if !strings.Contains(logs.String(), "a turn's result the store refused is given up as the session hands over; its message runs again") {
			t.Errorf("no line says that m1's held result is given up and m1 runs again:\n%s", logs.String())
		}
		if n := ran("m1"); n != 2 {
			t.Errorf("the agent ran m1 %d times, want twice: its held result was given up, and it ran again", n)
		}
		var sent []string
		for len(w.sent) > 0 {
			sent = append(sent, (<-w.sent).Out.Text)
		}
		if !slices.Equal(sent, []string{"echo: one"}) {
			t.Errorf("sent %q, want m1's reply once", sent)
		}
		history, _, err := w.store.History(w.ctx, m1.SessionId, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(history) != 2 {
			t.Errorf("active history %+v, want m1's exchange: the refused /undo took nothing back", history)
		}
		if r := w.deliver(t, "u2", "/undo"); r.ErrorCode != "" || r.Disposition != platforms.Command {
			t.Fatalf("/undo sent again: %+v, want it answered as a command", r)
		}
		if history, _, err = w.store.History(w.ctx, m1.SessionId, 10); err != nil || len(history) != 0 {
			t.Errorf("active history %+v (%v) after the /undo sent again, want none", history, err)
		}
	})
}

// refusesFirst refuses the first commit that holds a write pick picks, as a full disk does
// (persistence.ErrUnavailable for each group), once gate is closed, and the next times-1 such
// commits too (times 0 is one); it takes every other commit.
type refusesFirst struct {
	persistence.Store
	pick  func(persistence.Op) bool
	gate  chan struct{}
	times int

	mu      sync.Mutex
	refused int
}

func (d *refusesFirst) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	if !slices.ContainsFunc(groups, func(g []persistence.Op) bool { return slices.ContainsFunc(g, d.pick) }) {
		return d.Store.Commit(ctx, groups)
	}
	d.mu.Lock()
	n := d.refused
	if n < max(d.times, 1) {
		d.refused++
	}
	d.mu.Unlock()
	if n >= max(d.times, 1) {
		return d.Store.Commit(ctx, groups)
	}
	if n == 0 {
		<-d.gate
	}
	errs := make([]error, len(groups))
	for i := range errs {
		errs[i] = fmt.Errorf("%w: disk full (test)", persistence.ErrUnavailable)
	}
	return errs
}

// refusals is how many commits d refused.
func (d *refusesFirst) refusals() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.refused
}
