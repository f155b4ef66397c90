package actors

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
)

// slowToEnd is an agent whose m1 runs (its first time) until it is cancelled and then takes
// ending to return, as a command does that cleans up on SIGTERM; every other message answers at once.
// It logs when each call starts and returns.
type slowToEnd struct {
	ending time.Duration
	mu     sync.Mutex
	log    []string
	calls  int // of m1
}

func (a *slowToEnd) note(s string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.log = append(a.log, s)
}

func (a *slowToEnd) events() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.log)
}

func (a *slowToEnd) Run(ctx context.Context, req *agents.Request) (*agents.Response, error) {
	id := req.Identity.MessageID
	a.note(id + " starts")
	defer a.note(id + " returns")
	a.mu.Lock()
	first := id == "m1" && a.calls == 0
	if id == "m1" {
		a.calls++
	}
	a.mu.Unlock()
	if first { // a rerun of m1 answers at once
		<-ctx.Done()
		time.Sleep(a.ending)
		return nil, ctx.Err()
	}
	return &agents.Response{Text: "ok " + id}, nil
}

// TestNextTurnWaitsForTheCancelledCall: m1's turn is cancelled while it runs (by an interrupt,
// /stop or /new), and its agent takes 3 s to return, as a command that cleans up on SIGTERM
// does. The next message's turn starts only once m1's call has returned: turns run one at a
// time (G2), and a cancelled command never overlaps the next (before, the next turn started at
// once, while the cancelled one was still running).
func TestNextTurnWaitsForTheCancelledCall(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mode   string
		cancel string // the command that cancels m1's turn ("": m2 interrupts it)
	}{
		{name: "interrupt", mode: ModeInterrupt},
		{name: "stop", mode: ModeFollowup, cancel: "/stop"},
		{name: "new", mode: ModeFollowup, cancel: "/new"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				agent := &slowToEnd{ending: 3 * time.Second}
				w := newManagerWorld(t, agent, func(d *Deps) { d.Config.QueueMode = tc.mode })
				if r := w.deliver(t, "m1", "first"); r.Disposition != platforms.Started {
					t.Fatalf("m1: %+v, want started", r)
				}
				synctest.Wait()
				if tc.cancel != "" {
					if r := w.deliver(t, "k1", tc.cancel); r.Disposition != platforms.Command {
						t.Fatalf("%s: %+v", tc.cancel, r)
					}
					w.deliver(t, "k2", "/status")
					var status string
					for status == "" {
						if o := (<-w.sent).Out; slices.Contains(o.InReplyTo, "k2") {
							status = o.Text
						}
					}
					if !strings.Contains(status, "still ending") {
						t.Errorf("/status while m1's call ends: %q, want it to say so", status)
					}
				}
				want := platforms.Queued // behind the cancelled call, still ending
				if tc.cancel == "" {
					want = platforms.Interrupted
				}
				if r := w.deliver(t, "m2", "second"); r.Disposition != want {
					t.Errorf("m2: %+v, want %s", r, want)
				}
				time.Sleep(time.Minute)
				synctest.Wait()

				calls := []string{"m1 starts", "m1 returns", "m2 starts", "m2 returns"}
				if got := agent.events(); !slices.Equal(got, calls) {
					t.Errorf("agent calls: %q, want %q (m2's turn waits for m1's cancelled call)", got, calls)
				}
			})
		})
	}
}

// TestInterruptWhileTheCancelledCallEndsCutsTheQueuedMessage: in interrupt mode, m2 cuts m1's
// turn short, and m3 comes while m1's command still cleans up on SIGTERM, m2 waiting for it.
// m3 is the newest: it cuts m2 short too, and runs next; m2 never runs, and m3's answer
// answers all three. Before, m3 queued behind m2, whose turn then ran whole (to its timeout,
// for a slow command), uninterrupted (found by an audit).
func TestInterruptWhileTheCancelledCallEndsCutsTheQueuedMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := &slowToEnd{ending: 3 * time.Second}
		var seen []agents.Message
		var mu sync.Mutex
		w := newManagerWorld(t, agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			mu.Lock()
			seen = append(req.History, req.Messages...)
			mu.Unlock()
			return agent.Run(ctx, req)
		}), func(d *Deps) { d.Config.QueueMode = ModeInterrupt })
		w.deliver(t, "m1", "first")
		synctest.Wait()
		if r := w.deliver(t, "m2", "second"); r.Disposition != platforms.Interrupted {
			t.Fatalf("m2: %+v, want interrupted", r)
		}
		if r := w.deliver(t, "m3", "third"); r.Disposition != platforms.Interrupted {
			t.Errorf("m3, while m1's call ends and m2 waits for it: %+v, want interrupted", r)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if got, want := agent.events(), []string{"m1 starts", "m1 returns", "m3 starts", "m3 returns"}; !slices.Equal(got, want) {
			t.Errorf("agent calls: %q, want %q", got, want)
		}
		var answer *platforms.Outbound
		for len(w.sent) > 0 {
			if o := (<-w.sent).Out; o.TurnEnd {
				answer = o
			}
		}
		if answer == nil || !slices.Equal(answer.InReplyTo, []string{"m1", "m2", "m3"}) {
			t.Errorf("the answer: %+v, want it to answer m1, m2 and m3", answer)
		}
		if st, _ := w.statusOf(t, "m2"); st != persistence.StatusFailed {
			t.Errorf("m2: %s, want failed (cut short)", st)
		}
		mu.Lock()
		defer mu.Unlock()
		if !slices.ContainsFunc(seen, func(m agents.Message) bool { return m.Text == "second" }) {
			t.Errorf("m3's turn saw %+v, want m2 among its messages", seen)
		}
	})
}

// TestCancelWaitIsBounded: an agent that ignores its cancelled context does not hold the
// session for ever: the next turn starts once CancelWait has passed.
func TestCancelWaitIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		started := make(chan string, 2)
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			started <- req.Identity.MessageID
			if req.Identity.MessageID == "m1" {
				<-release // deaf to the cancel
			}
			return &agents.Response{Text: "ok"}, nil
		})
		defer close(release)
		w := newManagerWorld(t, agent, func(d *Deps) {
			d.Config.QueueMode = ModeInterrupt
			d.Config.CancelWait = 30 * time.Second
		})
		w.deliver(t, "m1", "first")
		synctest.Wait()
		if r := w.deliver(t, "m2", "second"); r.Disposition != platforms.Interrupted {
			t.Fatalf("m2: %+v, want interrupted", r)
		}
		<-started // m1
		time.Sleep(29 * time.Second)
		synctest.Wait()
		if len(started) != 0 {
			t.Fatal("m2 started before CancelWait had passed")
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if len(started) != 1 || <-started != "m2" {
			t.Fatal("m2 has not started once CancelWait had passed")
		}
	})
}

// sessionsOfKeyPanics is a store whose SessionsOfKey panics: /resume crashes the session.
type sessionsOfKeyPanics struct{ persistence.Store }

func (sessionsOfKeyPanics) SessionsOfKey(context.Context, string, int) ([]persistence.Session, error) {
	panic("store bug")
}

// TestRerunAfterACrashWaitsForTheCancelledCall: the session crashes (a store bug under
// /resume) while m1's turn runs, whose agent takes 3 s to return once cancelled. The restarted
// session runs m1 again only once the first call has returned: a crash is no reason for two
// calls of one session to overlap (before, the rerun started at once).
func TestRerunAfterACrashWaitsForTheCancelledCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := &slowToEnd{ending: 3 * time.Second}
		w := newManagerWorld(t, agent, func(d *Deps) { d.Store = sessionsOfKeyPanics{d.Store} })
		if r := w.deliver(t, "m1", "first"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		synctest.Wait()
		w.request("k1", "/resume earlier") // never answered: the session crashes on it
		time.Sleep(time.Minute)
		synctest.Wait()

		calls := []string{"m1 starts", "m1 returns", "m1 starts", "m1 returns"}
		if got := agent.events(); !slices.Equal(got, calls) {
			t.Errorf("agent calls: %q, want %q (the rerun waits for the cancelled call)", got, calls)
		}
	})
}

// TestRestartFromTheStoreWaitsForTheCancelledCall: the store refuses a command's write while
// m1's turn runs (its agent takes 3 s to return once cancelled), and the session starts again
// from the store. It stops only once the cancelled call has returned, so the next activation
// runs m1 again after it, not beside it (found by the outage hunt).
func TestRestartFromTheStoreWaitsForTheCancelledCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := &slowToEnd{ending: 3 * time.Second}
		out := &storetest.Outage{}
		w := newManagerWorldWrites(t, agent, nil, func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		if r := w.deliver(t, "m1", "first"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		synctest.Wait()
		out.Down.Store(true)
		if r := w.deliver(t, "k1", "/title refused"); r.ErrorCode == "" {
			t.Fatalf("/title: %+v, want it refused", r)
		}
		out.Down.Store(false)
		time.Sleep(time.Minute)
		synctest.Wait()

		calls := []string{"m1 starts", "m1 returns", "m1 starts", "m1 returns"}
		if got := agent.events(); !slices.Equal(got, calls) {
			t.Errorf("agent calls: %q, want %q (the next activation waits for the cancelled call)", got, calls)
		}
	})
}
