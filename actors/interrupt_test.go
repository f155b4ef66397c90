package actors

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/platforms"
)

// TestInterruptedMessageAnsweredAfterRestart: in queue mode interrupt, m2 cuts m1's turn
// short; m1 is answered by the next answer (m2's). When the session restarts before that
// answer (m2's agent crashes it), m2 runs again and its answer must still answer m1. (Before,
// the interrupted messages were kept only in memory: the restarted session answered m2 alone,
// and m1, acknowledged "started", was never answered.)
func TestInterruptedMessageAnsweredAfterRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var crashed atomic.Bool
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
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
