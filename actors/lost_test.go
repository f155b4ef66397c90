package actors

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
)

// TestRetryAfterALostCommitAnswerRuns: the write of a message commits, but its answer is lost
// (a connection that broke after COMMIT; a member of a shared store keeps no spool that would
// replay it), and the store cannot be read just then either (the session cannot tell the write
// applied: TestLostCommitAnswerOfAMessageIsTaken), so the sender is told the message was not
// stored. Its retry is refused by the
// store as a duplicate of that very write: the message is stored, and it runs now, in this
// activation, once. Before, the retry was answered "duplicate" and the stored message sat in
// no queue until the key's next activation. A re-delivery after that is a duplicate, and the
// seq the refused retry took is used by the next row, so the transcript has no gap.
func TestRetryAfterALostCommitAnswerRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		echo, ran := countingEcho()
		out := &storetest.Outage{}
		blind := &blindReads{}
		w := newManagerWorldWrites(t, echo, blind.wrap, func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		reply := func(want string) {
			t.Helper()
			select {
			case got := <-w.sent:
				if got.Out.Text != want {
					t.Fatalf("reply %q, want %q", got.Out.Text, want)
				}
			case <-time.After(time.Minute):
				t.Fatalf("no reply %q within a minute", want)
			}
		}

		if r := w.deliver(t, "m0", "zero"); r.Disposition != platforms.Started {
			t.Fatalf("m0: %+v", r)
		}
		reply("echo: zero")

		out.Lost.Store(1)
		blind.on.Store(true) // the session cannot read whether the write applied
		if r := w.deliver(t, "m1", "one"); r.ErrorCode != "unavailable" {
			t.Fatalf("m1 whose commit answer is lost: %+v, want unavailable", r)
		}
		blind.on.Store(false)
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started || r.ErrorCode != "" {
			t.Errorf("the retry of m1 (stored, its answer lost): %+v, want started", r)
		}
		reply("echo: one")
		synctest.Wait()
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Duplicate {
			t.Errorf("m1 delivered again once it ran: %+v, want duplicate", r)
		}
		if r := w.deliver(t, "m2", "two"); r.Disposition != platforms.Started {
			t.Fatalf("m2: %+v", r)
		}
		reply("echo: two")
		synctest.Wait()

		if n := ran("m1"); n != 1 {
			t.Errorf("m1 ran %d times, want once", n)
		}
		snap, err := w.store.LoadSession(w.ctx, w.key, 100, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range snap.History {
			if m.Seq != int64(i+1) {
				t.Errorf("row %d has seq %d, want %d (no gap)", i, m.Seq, i+1)
			}
			if m.Role == persistence.RoleUser && m.Status != persistence.StatusDone {
				t.Errorf("message %s is %s, want done", m.MessageID, m.Status)
			}
		}
		if len(snap.History) != 6 {
			t.Errorf("the session holds %d rows, want 6 (three messages and their replies)", len(snap.History))
		}
	})
}

// TestLostCommitAnswerRunsAtTheKeysRecovery: as above, but the sender does not send the
// message again. The store lists the key as having pending work, and the recovery that
// follows (in a cluster, every member_ttl) finds the message in the live activation and runs
// it, once, rather than leave it to the key's next activation.
func TestLostCommitAnswerRunsAtTheKeysRecovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		echo, ran := countingEcho()
		out := &storetest.Outage{}
		blind := &blindReads{}
		w := newManagerWorldWrites(t, echo, func(d *Deps) { d.Fencing = true; blind.wrap(d) }, func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		if r := w.deliver(t, "m0", "zero"); r.Disposition != platforms.Started {
			t.Fatalf("m0: %+v", r)
		}
		<-w.sent
		out.Lost.Store(1)
		blind.on.Store(true) // the session cannot read whether the write applied
		if r := w.deliver(t, "m1", "one"); r.ErrorCode != "unavailable" {
			t.Fatalf("m1 whose commit answer is lost: %+v, want unavailable", r)
		}
		blind.on.Store(false)
		synctest.Wait()
		keys, err := w.store.Recoverable(w.ctx)
		if err != nil || len(keys) != 1 || keys[0] != w.key {
			t.Fatalf("Recoverable() = %v, %v; want the key, whose m1 is stored and pending", keys, err)
		}
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &Recover{}})
		select {
		case got := <-w.sent:
			if got.Out.Text != "echo: one" {
				t.Errorf("reply %q, want m1 answered", got.Out.Text)
			}
		case <-time.After(time.Minute):
			t.Fatalf("m1, stored and pending, did not run at the key's recovery")
		}
		synctest.Wait()
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &Recover{}})
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Duplicate {
			t.Errorf("m1 sent again after it ran: %+v, want duplicate", r)
		}
		synctest.Wait()
		if n := ran("m1"); n != 1 {
			t.Errorf("m1 ran %d times, want once", n)
		}
	})
}

// TestAdoptedMessageRunsInItsPlace: a message whose write committed but was answered as failed
// (the session could not read whether it applied) is adopted later, when its sender sends it
// again or at the key's recovery, after a message that came behind it was queued. It runs in
// its place, by its seq, before that message, as the store holds them and as a restart would
// run them. Before, it was queued behind every message in memory.
func TestAdoptedMessageRunsInItsPlace(t *testing.T) {
	for _, how := range []string{"sent again", "recovery"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := newRequeueAgent()
				w, lost := newLostWorld(t, a, func(d *Deps) { d.Fencing = true })
				w.deliver(t, "m0", "hold")
				lost.deliver(t, w, "lost", "lost")
				if r := w.deliver(t, "after", "after"); r.Disposition != platforms.Queued {
					t.Fatalf("after: %+v, want queued", r)
				}
				if how == "recovery" {
					w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &Recover{}})
				} else if r := w.deliver(t, "lost", "lost"); r.ErrorCode != "" {
					t.Fatalf("lost sent again: %+v, want taken", r)
				}
				synctest.Wait()
				close(a.hold)
				w.awaitTurnEnds(3)
				synctest.Wait()
				if got, want := a.order(), []string{"m0", "lost", "after"}; !slices.Equal(got, want) {
					t.Errorf("turns ran %v, want %v", got, want)
				}
			})
		})
	}
}

// TestAdoptedMessageDoesNotInterruptANewerTurn: in interrupt mode, a message adopted when it is
// sent again heads the queue while a newer message's turn runs. It is no newer message: it does not interrupt that turn, and runs after it. Before, it
// was taken for the newest arrival, and the newer message's turn was cut short and never
// answered on its own (found by review).
func TestAdoptedMessageDoesNotInterruptANewerTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		first, hold := make(chan struct{}), make(chan struct{})
		var mu sync.Mutex
		var ran []string
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			id := req.Identity.MessageID
			mu.Lock()
			ran = append(ran, id)
			mu.Unlock()
			if id == "m0" {
				<-first // its call ends late after its cancel: what comes meanwhile queues
				return nil, ctx.Err()
			}
			select {
			case <-hold:
				return &agents.Response{Text: "answered " + id}, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
		w, lost := newLostWorld(t, agent, func(d *Deps) { d.Fencing, d.Config.QueueMode = true, ModeInterrupt })
		w.deliver(t, "m0", "zero")
		lost.deliver(t, w, "lost", "lost")
		if r := w.deliver(t, "after", "after"); r.Disposition != platforms.Interrupted {
			t.Fatalf("after: %+v, want interrupted", r)
		}
		close(first)
		synctest.Wait() // after runs
		if r := w.deliver(t, "lost", "lost"); r.ErrorCode != "" || r.Disposition == platforms.Interrupted {
			t.Errorf("lost sent again while after runs: %+v, want taken, not interrupting", r)
		}
		close(hold)
		w.awaitTurnEndsWithin(t, 2, time.Minute)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if want := []string{"m0", "after", "lost"}; !slices.Equal(ran, want) {
			t.Errorf("turns ran %v, want %v", ran, want)
		}
		if st, _ := w.statusOf(t, "after"); st != persistence.StatusDone {
			t.Errorf("after: %s, want done (answered on its own)", st)
		}
	})
}

// TestLostCommitAnswerOfAMessageIsTaken: the write of a message commits, but its answer is lost
// (a connection that broke after COMMIT, the spool failing too), and the store shows the
// message as that write put it. The message is stored, so it is taken: acknowledged, run and
// answered once. Before, its sender was told it was not stored, and the stored message ran
// only if it was sent again while its session lasted: a /resume or /new in between left it
// pending for ever, never answered (found by TestOutageHunt, seed 1796183174495401148).
func TestLostCommitAnswerOfAMessageIsTaken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		echo, ran := countingEcho()
		out := &storetest.Outage{}
		w := newManagerWorldWrites(t, echo, nil, func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		if r := w.deliver(t, "m0", "zero"); r.Disposition != platforms.Started {
			t.Fatalf("m0: %+v", r)
		}
		<-w.sent
		out.Lost.Store(1)
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started || r.ErrorCode != "" {
			t.Errorf("m1, stored by a commit whose answer was lost: %+v, want started", r)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		var answers []string
		for len(w.sent) > 0 {
			answers = append(answers, (<-w.sent).Out.Text)
		}
		if len(answers) != 1 || answers[0] != "echo: one" || ran("m1") != 1 {
			t.Errorf("m1 answered %q, ran %d times; want answered once", answers, ran("m1"))
		}
	})
}

// TestLostCommitAnswerOfACommandIsAnswered: the write of a command commits, but its answer is
// lost, and the store shows the command as that write put it: the command acted, and its
// sender is told so. Before, it was told the command was not stored while the session the
// command started went on (found by TestOutageHunt, seed 1796183174495401153: a /reset
// answered "unavailable", and the next message acknowledged in the session it started).
func TestLostCommitAnswerOfACommandIsAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		echo, _ := countingEcho()
		out := &storetest.Outage{}
		w := newManagerWorldWrites(t, echo, nil, func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		first := w.deliver(t, "m0", "zero")
		if first.Disposition != platforms.Started {
			t.Fatalf("m0: %+v", first)
		}
		<-w.sent
		out.Lost.Store(1)
		r := w.deliver(t, "k1", "/new")
		if r.Disposition != platforms.Command || r.ErrorCode != "" || r.SessionId == "" || r.SessionId == first.SessionId {
			t.Fatalf("/new, stored by a commit whose answer was lost: %+v, want a command that started a new session", r)
		}
		route, err := w.store.Route(w.ctx, w.key)
		if err != nil || route.SessionID != r.SessionId {
			t.Errorf("the key routes to %+v (%v), want the session /new started, %s", route, err, r.SessionId)
		}
		if next := w.deliver(t, "m2", "two"); next.SessionId != r.SessionId {
			t.Errorf("m2 after /new: %+v, want it in the session /new started, %s", next, r.SessionId)
		}
	})
}

// countingEcho is an agent that echoes the last message of its turn, and ran, how many turns
// each message id ran in.
func countingEcho() (agent agents.Agent, ran func(id string) int) {
	var mu sync.Mutex
	runs := map[string]int{}
	agent = agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range req.Messages {
			runs[m.MessageID]++
		}
		return &agents.Response{Text: "echo: " + req.Messages[len(req.Messages)-1].Text}, nil
	})
	return agent, func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return runs[id]
	}
}

// lostAnswers loses, on cue, the commit answer of a world's write while its sessions cannot
// read whether the write applied (newLostWorld).
type lostAnswers struct {
	out   *storetest.Outage
	blind *blindReads
}

// newLostWorld is newManagerWorld, set up by setup, whose writes lostAnswers.deliver can lose
// the answer of.
func newLostWorld(t *testing.T, agent agents.Agent, setup func(*Deps)) (*managerWorld, *lostAnswers) {
	t.Helper()
	l := &lostAnswers{out: &storetest.Outage{}, blind: &blindReads{}}
	w := newManagerWorldWrites(t, agent, func(d *Deps) {
		if setup != nil {
			setup(d)
		}
		l.blind.wrap(d)
	}, func(s persistence.Store) persistence.Store {
		l.out.Store = s
		return l.out
	})
	return w, l
}

// deliver sends a message of w's chat whose write commits but whose commit answer is lost,
// while the session cannot read whether it applied: its sender is told it is unavailable.
func (l *lostAnswers) deliver(t *testing.T, w *managerWorld, id, text string) {
	t.Helper()
	l.out.Lost.Store(1)
	l.blind.on.Store(true)
	defer l.blind.on.Store(false)
	if r := w.deliver(t, id, text); r.ErrorCode != "unavailable" {
		t.Fatalf("%s, whose commit answer is lost: %+v, want unavailable", id, r)
	}
}

// blindReads makes the sessions' reads of inbound messages fail while on is set, as a database
// that cannot be reached fails them: a session that reads whether a write refused as
// unavailable applied cannot tell.
type blindReads struct {
	persistence.Store
	on atomic.Bool
}

// wrap puts b between the sessions of d and their store (a newManagerWorld setup).
func (b *blindReads) wrap(d *Deps) {
	b.Store = d.Store
	d.Store = b
}

func (b *blindReads) FindInbound(ctx context.Context, platform, chatID, messageID string) (*persistence.Message, error) {
	if b.on.Load() {
		return nil, fmt.Errorf("%w: connection refused (test)", persistence.ErrUnavailable)
	}
	return b.Store.FindInbound(ctx, platform, chatID, messageID)
}
