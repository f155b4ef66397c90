package actors

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
)

// cutShortThenCrash is the agent of the tests below: m1's turn runs until it is cut short
// (by m2), and m2's agent crashes its session once, before m2's answer.
func cutShortThenCrash() agents.Agent {
	var crashed atomic.Bool
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		switch req.Identity.MessageID {
		case "m1":
			<-ctx.Done() // slow: cut short by m2
			return nil, ctx.Err()
		case "m2":
			if crashed.CompareAndSwap(false, true) {
				panic("agent bug")
			}
		}
		return &agents.Response{Text: "ok " + req.Identity.MessageID}, nil
	})
}

// TestInterruptedMessageAnsweredAfterRestart: in queue mode interrupt, m2 cuts m1's turn
// short; m1 is answered by the next answer (m2's). When the session restarts before that
// answer (m2's agent crashes it), m2 runs again and its answer must still answer m1. (Before,
// the interrupted messages were kept only in memory: the restarted session answered m2 alone,
// and m1, acknowledged "started", was never answered.)
func TestInterruptedMessageAnsweredAfterRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := cutShortThenCrash()
		w := newManagerWorld(t, agent, func(d *Deps) { d.Config.QueueMode = ModeInterrupt })
		if r := w.deliver(t, "m1", "first"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		synctest.Wait()
		if r := w.deliver(t, "m2", "second"); r.Disposition != platforms.Interrupted {
			t.Fatalf("m2: %+v, want interrupted", r)
		}
		time.Sleep(time.Minute) // the crash, the restart and the rerun of m2
		synctest.Wait()

		var answers [][]string
		for len(w.sent) > 0 {
			o := (<-w.sent).Out
			answers = append(answers, o.InReplyTo)
		}
		for _, id := range []string{"m1", "m2"} {
			n := 0
			for _, ids := range answers {
				if slices.Contains(ids, id) {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%s answered %d times, want once (answers' in_reply_to: %v)", id, n, answers)
			}
		}
	})
}

// TestInterruptedMessageAnsweredByQuarantine: m2 cuts m1's turn short and then crashes its
// session every time it runs, until it is quarantined. The quarantine notice is the answer
// that takes m2's turn's place, so it answers m1 too. (Before, it answered m2 alone, and m1
// waited for a next answer that never came: the chat had nothing more to run.)
func TestInterruptedMessageAnsweredByQuarantine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			if req.Identity.MessageID == "m1" {
				<-ctx.Done() // slow: cut short by m2
				return nil, ctx.Err()
			}
			panic("agent bug")
		})
		w := newManagerWorld(t, agent, func(d *Deps) { d.Config.QueueMode = ModeInterrupt })
		if r := w.deliver(t, "m1", "first"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		synctest.Wait()
		if r := w.deliver(t, "m2", "second"); r.Disposition != platforms.Interrupted {
			t.Fatalf("m2: %+v, want interrupted", r)
		}
		time.Sleep(time.Minute) // three crashes and the quarantine
		synctest.Wait()

		var answers [][]string
		for len(w.sent) > 0 {
			answers = append(answers, (<-w.sent).Out.InReplyTo)
		}
		if want := [][]string{{"m1", "m2"}}; !slices.EqualFunc(answers, want, slices.Equal) {
			t.Errorf("answers' in_reply_to: %v, want %v (the quarantine notice answers the interrupted m1 too)", answers, want)
		}
	})
}

// steeringAgent takes steered messages into m1's turn, which runs until it is cancelled; it
// reports the id of each message it takes.
type steeringAgent struct{ took chan string }

func (steeringAgent) CanSteer() bool { return true }

func (a steeringAgent) Run(ctx context.Context, req *agents.Request) (*agents.Response, error) {
	steer := req.Steer
	for req.Identity.MessageID == "m1" {
		select {
		case m, ok := <-steer:
			if !ok {
				steer = nil
				continue
			}
			a.took <- m.MessageID
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &agents.Response{Text: "ok " + req.Identity.MessageID}, nil
}

// TestInterruptAnswersSteeredMessages: m2 is steered into m1's running turn, then the queue
// mode becomes interrupt and m3 cuts that turn short. m2 belongs to the cut-short turn as m1
// does: m3's answer answers both, and none stays pending. (Before, an interrupt took only
// the turn's own messages: m2 was left pending in the store and in no queue, never answered.)
func TestInterruptAnswersSteeredMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := steeringAgent{took: make(chan string, 1)}
		w := newManagerWorld(t, agent, func(d *Deps) { d.Config.QueueMode = ModeSteer })
		w.startAndSteer(t, agent.took)
		if r := w.deliver(t, "k1", "/queue interrupt"); r.Disposition != platforms.Command {
			t.Fatalf("/queue interrupt: %+v", r)
		}
		r := w.deliver(t, "m3", "third")
		if r.Disposition != platforms.Interrupted {
			t.Fatalf("m3: %+v, want interrupted", r)
		}
		time.Sleep(time.Minute)
		synctest.Wait()

		var last []string
		for len(w.sent) > 0 {
			last = (<-w.sent).Out.InReplyTo
		}
		if want := []string{"m1", "m2", "m3"}; !slices.Equal(last, want) {
			t.Errorf("m3's answer answers %v, want %v", last, want)
		}
		m2, err := w.store.FindInbound(w.ctx, "fake", "c1", "m2")
		if err != nil {
			t.Fatal(err)
		}
		if m2.Status != persistence.StatusFailed {
			t.Errorf("m2 is %s in the store, want failed (cut short with its turn)", m2.Status)
		}
	})
}

// TestInterruptedQueuedMessageAnsweredAfterRestart: m2 waits behind m1 and is stored before
// m1's answer; it starts, m3 cuts it short, and m3's agent crashes the session before m3's
// answer. The restarted session must still know m2 waits for that answer, though m2's row
// comes before an answer row (m1's) in the transcript. (Before, the loading session looked
// for cut-short messages only after the last answer row.)
func TestInterruptedQueuedMessageAnsweredAfterRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var crashed atomic.Bool
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			switch req.Identity.MessageID {
			case "m1":
				<-release
			case "m2":
				<-ctx.Done() // slow: cut short by m3
				return nil, ctx.Err()
			case "m3":
				if crashed.CompareAndSwap(false, true) {
					panic("agent bug")
				}
			}
			return &agents.Response{Text: "ok " + req.Identity.MessageID}, nil
		})
		w := newManagerWorld(t, agent, nil)
		for _, m := range []struct{ id, text, want string }{
			{"m1", "first", platforms.Started},
			{"m2", "second", platforms.Queued},
			{"k1", "/queue interrupt", platforms.Command},
		} {
			if r := w.deliver(t, m.id, m.text); r.Disposition != m.want {
				t.Fatalf("%s: %+v, want %s", m.id, r, m.want)
			}
		}
		close(release) // m1's answer is stored after m2's row; m2 starts
		synctest.Wait()
		if r := w.deliver(t, "m3", "third"); r.Disposition != platforms.Interrupted {
			t.Fatalf("m3: %+v, want interrupted", r)
		}
		time.Sleep(time.Minute) // the crash, the restart and the rerun of m3
		synctest.Wait()

		var last []string
		for len(w.sent) > 0 {
			last = (<-w.sent).Out.InReplyTo
		}
		if want := []string{"m2", "m3"}; !slices.Equal(last, want) {
			t.Errorf("m3's answer answers %v, want %v", last, want)
		}
	})
}

// TestUndoAnswersTheCutShortMessageItTakesBack: with a debounce window, m2 cuts m1's turn
// short and waits; /undo then takes m1 back, and m2's agent crashes the session before m2's
// answer. The /undo's answer answers m1 (as /stop's answers what it drops). (Before, m1 was
// left to m2's answer, and the restarted session, which loads no archived row, forgot it: m1
// was never answered.)
func TestUndoAnswersTheCutShortMessageItTakesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := cutShortThenCrash()
		w := newManagerWorld(t, agent, func(d *Deps) { d.Config.QueueMode, d.Config.Debounce = ModeInterrupt, 2*time.Second })
		if r := w.deliver(t, "m1", "first"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		time.Sleep(3 * time.Second) // m1's turn starts
		synctest.Wait()
		if r := w.deliver(t, "m2", "second"); r.Disposition != platforms.Interrupted {
			t.Fatalf("m2: %+v, want interrupted", r)
		}
		if r := w.deliver(t, "k1", "/undo"); r.Disposition != platforms.Command {
			t.Fatalf("/undo: %+v", r)
		}
		time.Sleep(time.Minute)
		synctest.Wait()

		var answers [][]string
		seen := map[int64]bool{} // this world's platform confirms nothing: a restart sends again
		for len(w.sent) > 0 {
			if o := (<-w.sent).Out; !seen[o.Seq] {
				seen[o.Seq] = true
				answers = append(answers, o.InReplyTo)
			}
		}
		if want := [][]string{{"m1", "k1"}, {"m2"}}; !slices.EqualFunc(answers, want, slices.Equal) {
			t.Errorf("answers' in_reply_to: %v, want %v", answers, want)
		}
	})
}

// TestInterruptedAfterIdleResetAnsweredAfterRestart: m1 is the first message after an idle
// reset, so the reset notice lists it (the answer to m1 itself follows); m2 cuts m1's turn
// short and crashes the session before m2's answer. The restarted session must not take the
// reset notice for m1's answer. (Before, it did, and m1 was never answered.)
func TestInterruptedAfterIdleResetAnsweredAfterRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := cutShortThenCrash()
		idle := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Second, Notify: true}
		w := newManagerWorld(t, agent, func(d *Deps) {
			d.Config.QueueMode = ModeInterrupt
			d.Config.ResetFor = func(string, string) ResetPolicy { return idle }
			d.Config.ResetPolicies = []ResetPolicy{idle}
		})
		w.deliver(t, "m0", "zero")
		time.Sleep(time.Minute) // the session is idle past its policy: m1 starts a new one
		synctest.Wait()
		if r := w.deliver(t, "m1", "first"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		if r := w.deliver(t, "m2", "second"); r.Disposition != platforms.Interrupted {
			t.Fatalf("m2: %+v, want interrupted", r)
		}
		time.Sleep(time.Minute) // the crash, the restart and the rerun of m2
		synctest.Wait()

		var last []string
		for len(w.sent) > 0 {
			if o := (<-w.sent).Out; !strings.HasPrefix(o.Text, AutoResetNotice) {
				last = o.InReplyTo
			}
		}
		if want := []string{"m1", "m2"}; !slices.Equal(last, want) {
			t.Errorf("m2's answer answers %v, want %v", last, want)
		}
	})
}

// TestReplyThatReadsLikeAResetNoticeAnswers: the agent's answer to m2, which cut m1 short,
// begins with the words of the automatic reset notice (an echo of what a user typed). It is a
// reply, not that notice: after a restart the session must take m1 as answered. (Before, a
// text prefix alone told them apart, and m1 was answered again with the next turn.)
func TestReplyThatReadsLikeAResetNoticeAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var crashed atomic.Bool
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			switch req.Identity.MessageID {
			case "m1":
				<-ctx.Done() // slow: cut short by m2
				return nil, ctx.Err()
			case "m2":
				return &agents.Response{Text: AutoResetNotice + ", or so I was told"}, nil
			case "m3":
				if crashed.CompareAndSwap(false, true) {
					panic("agent bug") // the session restarts and loads its history
				}
			}
			return &agents.Response{Text: "ok " + req.Identity.MessageID}, nil
		})
		w := newManagerWorld(t, agent, func(d *Deps) { d.Config.QueueMode = ModeInterrupt })
		w.deliver(t, "m1", "first")
		if r := w.deliver(t, "m2", "second"); r.Disposition != platforms.Interrupted {
			t.Fatalf("m2: %+v, want interrupted", r)
		}
		w.awaitTurnEnds(1)
		w.deliver(t, "m3", "third")
		time.Sleep(time.Minute) // the crash, the restart and the rerun of m3
		synctest.Wait()

		var last []string
		for len(w.sent) > 0 {
			last = (<-w.sent).Out.InReplyTo
		}
		if want := []string{"m3"}; !slices.Equal(last, want) {
			t.Errorf("m3's answer answers %v, want %v", last, want)
		}
	})
}

// startAndSteer delivers m1, which starts a turn, and m2, which is steered into it, and waits
// until the agent took m2 (took: what a steering agent takes).
func (w *managerWorld) startAndSteer(t *testing.T, took <-chan string) {
	t.Helper()
	if r := w.deliver(t, "m1", "first"); r.Disposition != platforms.Started {
		t.Fatalf("m1: %+v, want started", r)
	}
	if r := w.deliver(t, "m2", "second"); r.Disposition != platforms.Steered {
		t.Fatalf("m2: %+v, want steered", r)
	}
	if got := <-took; got != "m2" {
		t.Fatalf("the agent took %s, want m2", got)
	}
}

// TestInterruptsKeepTheLastCutShortMessages: a chat that writes faster than its agent answers,
// in queue mode interrupt, cuts every turn short. The answer that finally comes answers the
// last MaxInterrupted messages cut short and its own, not every message since the last
// answer: before, that list, held in memory, grew without bound until an answer came.
func TestInterruptsKeepTheLastCutShortMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = MaxInterrupted + 50
		last := fmt.Sprint("m", n)
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			if req.Identity.MessageID != last {
				<-ctx.Done() // slow: cut short by the next message
				return nil, ctx.Err()
			}
			return &agents.Response{Text: "at last"}, nil
		})
		w := newManagerWorld(t, agent, func(d *Deps) { d.Config.QueueMode = ModeInterrupt })
		for i := 1; i <= n; i++ {
			id := fmt.Sprint("m", i)
			want := platforms.Interrupted
			if i == 1 {
				want = platforms.Started
			}
			if r := w.deliver(t, id, id); r.Disposition != want {
				t.Fatalf("%s: %+v, want %s", id, r, want)
			}
			synctest.Wait() // the cut-short call has ended; this message's turn runs
		}
		var got []string
		for m := range w.sent {
			if m.Out.TurnEnd {
				got = m.Out.InReplyTo
				break
			}
		}
		var want []string
		for i := n - MaxInterrupted; i <= n; i++ {
			want = append(want, fmt.Sprint("m", i))
		}
		if !slices.Equal(got, want) {
			t.Errorf("the answer answers %d messages (%v … %v), want the last %d cut short and its own", len(got), got[:min(2, len(got))], got[max(0, len(got)-2):], MaxInterrupted)
		}
	})
}
