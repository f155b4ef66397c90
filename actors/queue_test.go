package actors

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"testing/synctest"
	"time"
	"weak"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/platforms"
)

// TestDequeueReleasesItems checks that a session which took the last items out of its queue
// (to run them) no longer holds them: an idle session must not keep its last message alive.
func TestDequeueReleasesItems(t *testing.T) {
	s := &Session{}
	first, second := &item{seq: 1, text: "first"}, &item{seq: 2, text: "second"}
	s.queue = append(s.queue, first, second)
	w := weak.Make(first)
	first = nil

	s.dequeue(1)
	if len(s.queue) != 1 || s.queue[0] != second {
		t.Fatalf("after dequeue(1) the queue holds %d items, want the second one", len(s.queue))
	}
	s.dequeue(1)
	if len(s.queue) != 0 {
		t.Fatalf("after dequeue(1) again the queue holds %d items, want none", len(s.queue))
	}
	runtime.GC()
	if w.Value() != nil {
		t.Error("the session still holds an item it took out of its queue")
	}
	runtime.KeepAlive(s) // the session is alive and idle: only its own fields may hold the item
	runtime.KeepAlive(second)
}

// TestRedeliveryToFullQueueIsDuplicate: a platform re-delivers a message the session answered
// in an earlier activation (its id is no longer in memory) while the queue is full with
// overflow reject. The acknowledgment must say what really happened, duplicate (the message
// was taken and answered), not rejected (which tells the sender it was refused). (Before, the
// cap was checked before the store's dedupe, and the re-delivery was answered 429 rejected.)
func TestRedeliveryToFullQueueIsDuplicate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			if req.Identity.MessageID == "m1" {
				<-ctx.Done() // slow: the queue behind it fills
				return nil, ctx.Err()
			}
			return &agents.Response{Text: "ok"}, nil
		})
		w := newManagerWorld(t, agent, func(d *Deps) {
			d.Config.QueueCap, d.Config.Overflow, d.Config.PassivateAfter = 1, "reject", time.Minute
		})
		if r := w.deliver(t, "m0", "zero"); r.Disposition != platforms.Started {
			t.Fatalf("m0: %+v, want started", r)
		}
		time.Sleep(10 * time.Minute) // answered, then passivated: a new activation forgets m0's id
		synctest.Wait()
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		if r := w.deliver(t, "m2", "two"); r.Disposition != platforms.Queued {
			t.Fatalf("m2: %+v, want queued", r)
		}
		if r := w.deliver(t, "m0", "zero"); r.Disposition != platforms.Duplicate || r.ErrorCode != "" {
			t.Errorf("m0 re-delivered to a full queue: disposition %q error %q, want duplicate", r.Disposition, r.ErrorCode)
		}
	})
}

// TestQueueCapHoldsWhileDebounceHoldsTheHead: with debounce, a burst waits for its sender to
// be quiet before any turn runs. The cap still bounds the messages behind the head, which
// runs next: with a cap of 2 under overflow reject, a burst of 5 keeps 3 and rejects 2, and
// one turn answers the 3. (Before, the cap counted only behind a running turn: the whole
// burst was taken, past the cap.)
func TestQueueCapHoldsWhileDebounceHoldsTheHead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ran := make(chan []string, 4)
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			var ids []string
			for _, m := range req.Messages {
				ids = append(ids, m.MessageID)
			}
			ran <- ids
			return &agents.Response{Text: "ok"}, nil
		})
		w := newManagerWorld(t, agent, func(d *Deps) {
			d.Config.Debounce, d.Config.QueueCap, d.Config.Overflow = 2*time.Second, 2, "reject"
		})
		var taken, rejected []string
		for _, id := range []string{"m1", "m2", "m3", "m4", "m5"} {
			switch r := w.deliver(t, id, id); r.Disposition {
			case platforms.Rejected:
				rejected = append(rejected, id)
			default:
				taken = append(taken, id)
			}
		}
		if !slices.Equal(taken, []string{"m1", "m2", "m3"}) || !slices.Equal(rejected, []string{"m4", "m5"}) {
			t.Errorf("taken %v, rejected %v; want [m1 m2 m3] and [m4 m5]", taken, rejected)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if len(ran) != 1 {
			t.Fatalf("%d turns ran, want 1", len(ran))
		}
		if got := <-ran; !slices.Equal(got, []string{"m1", "m2", "m3"}) {
			t.Errorf("the turn ran %v, want [m1 m2 m3]", got)
		}
	})
}
