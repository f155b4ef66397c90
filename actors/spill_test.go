package actors

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
)

// heapBytes is the heap the process's live objects take, after a collection.
func heapBytes() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// flood delivers m<from>…m<to> behind a held turn, each size bytes long, and checks that each
// is acknowledged as queued behind all before it. It returns their ids in order.
func (w *managerWorld) flood(t *testing.T, from, to, size int) []string {
	t.Helper()
	var ids []string
	for i := from; i <= to; i++ {
		id := fmt.Sprint("m", i)
		r := w.deliver(t, id, id+" "+strings.Repeat("x", max(0, size-len(id)-1)))
		if r.Disposition != platforms.Queued || r.ErrorCode != "" || int(r.QueueDepth) != i {
			t.Fatalf("%s: %s %s, queue depth %d; want queued, depth %d", id, r.Disposition, r.ErrorCode, r.QueueDepth, i)
		}
		ids = append(ids, id)
	}
	return ids
}

// noticeFor reads what the platform was sent until the answer to id, and returns its text.
func (w *managerWorld) noticeFor(t *testing.T, id string) string {
	t.Helper()
	for {
		select {
		case m := <-w.sent:
			if slices.Contains(m.Out.InReplyTo, id) {
				return m.Out.Text
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s not answered within a minute", id)
		}
	}
}

// TestQueuePastItsCapWaitsInTheStore: with overflow spool, the messages past a session's queue
// cap are stored, acknowledged and run later, in order, and the session does not hold them in
// memory as well. Before, every one stayed in the session's queue: a chat writing faster than
// its agent answered grew the daemon's heap without bound (here by the 16 MiB of text queued).
func TestQueuePastItsCapWaitsInTheStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		w := newManagerWorld(t, a, func(d *Deps) { d.Config.QueueCap = 4 })
		if r := w.deliver(t, "m0", "hold"); r.Disposition != platforms.Started {
			t.Fatalf("m0: %+v, want started", r)
		}
		const n, size = 500, 32 << 10
		before := heapBytes()
		ids := w.flood(t, 1, n, size)
		if grew := heapBytes() - before; grew > n*size/2 {
			t.Errorf("the heap grew by %d KiB with %d messages of %d KiB queued: the session holds them in memory", grew>>10, n, size>>10)
		}
		if r := w.deliver(t, "status", "/status"); r.Disposition != platforms.Command {
			t.Fatalf("/status: %+v", r)
		}
		if text, want := w.noticeFor(t, "status"), fmt.Sprintf("Queue: %d waiting", n); !strings.Contains(text, want) {
			t.Errorf("/status says %q, want %q", text, want)
		}

		close(a.hold)
		w.awaitTurnEnds(n + 1)
		synctest.Wait()
		if got, want := a.order(), append([]string{"m0"}, ids...); !slices.Equal(got, want) {
			t.Errorf("turns ran %d messages, first differing at %d; want each once, in order", len(got), firstDiff(got, want))
		}
		for _, id := range []string{"m1", "m5", "m6", "m250", fmt.Sprint("m", n)} {
			if st, _ := w.statusOf(t, id); st != persistence.StatusDone {
				t.Errorf("%s: %s, want done", id, st)
			}
		}
	})
}

// firstDiff is the first index at which got and want differ.
func firstDiff(got, want []string) int {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return i
		}
	}
	return min(len(got), len(want))
}

// TestSpilledQueueLoadsPastItsCapAfterARestart: a session that starts with more messages pending
// than its queue's cap (the daemon stopped while its chat flooded) runs every one, in order,
// reads of them only what its queue holds, and keeps no more in memory. Before, the start read
// the whole backlog (16 MiB here) and then let go of what was past the cap.
func TestSpilledQueueLoadsPastItsCapAfterARestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		a := newRequeueAgent()
		w := newManagerWorldAt(t, path, a, func(d *Deps) { d.Config.QueueCap = 2 })
		w.deliver(t, "m0", "hold")
		const n, size = 500, 32 << 10
		ids := w.flood(t, 1, n, size)
		w.stop() // m0's turn is cut short: m0…mn are pending in the store
		synctest.Wait()

		b := newRequeueAgent()
		b.holdAll.Store(true)
		before, reads := heapBytes(), &readSizes{}
		w2 := newManagerWorldAt(t, path, b, throughStore(2, &reads.Store, reads, nil))
		synctest.Wait() // loaded, m0 running again
		reads.check(t, 2, size)
		if grew := heapBytes() - before; grew > n*size/2 {
			t.Errorf("the heap grew by %d KiB with %d messages of %d KiB loaded: the session holds them in memory", grew>>10, n, size>>10)
		}
		close(b.hold)
		w2.awaitTurnEnds(n + 1)
		synctest.Wait()
		reads.check(t, 2, size) // the rest read back a page at a time as the queue drained
		b.mu.Lock()
		if h := b.history["m0"]; len(h) > 0 {
			// The last messages stored are in the history the session loads, and pending:
			// each joins the history when its turn runs, not before (m500 would be
			// answered twice).
			t.Errorf("m0's turn had a history of %d messages, the first %.20q; want none: nothing was answered before it", len(h), h[0].Text)
		}
		b.mu.Unlock()
		if got, want := b.order(), append([]string{"m0"}, ids...); !slices.Equal(got, want) {
			t.Errorf("after the restart turns ran %d messages, first differing at %d; want each once, in order", len(got), firstDiff(got, want))
		}
	})
}

// TestCommandsDropSpilledMessages: /stop, /new and an operator's reset drop every queued
// message, those waiting in the store past the cap too, and say how many; none runs after.
// Those in the store are read without their text.
func TestCommandsDropSpilledMessages(t *testing.T) {
	for _, tc := range []struct {
		name string
		drop func(w *managerWorld, t *testing.T) string // the answer to the drop
		want string
	}{
		{"stop", func(w *managerWorld, t *testing.T) string {
			w.deliver(t, "cmd", "/stop")
			return w.noticeFor(t, "cmd")
		}, "Dropped 20 queued message(s)."},
		{"new", func(w *managerWorld, t *testing.T) string {
			w.deliver(t, "cmd", "/new")
			return w.noticeFor(t, "cmd")
		}, "21 message(s) sent before it were not answered."},
		{"operator reset", func(w *managerWorld, t *testing.T) string {
			if r := w.reset(t, &ResetSession{}); r.Error != "" {
				t.Fatalf("reset: %s", r.Error)
			}
			return w.noticeFor(t, "m20")
		}, OperatorResetNotice(21)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := newRequeueAgent()
				reads := &readSizes{}
				w := newManagerWorld(t, a, throughStore(2, &reads.Store, reads, nil))
				w.deliver(t, "m0", "hold")
				const size = 4 << 10
				w.flood(t, 1, 20, size)
				if text := tc.drop(w, t); !strings.Contains(text, tc.want) {
					t.Errorf("answered %q, want %q", text, tc.want)
				}
				// The messages dropped are read without their text: a flood of long ones is
				// not read into memory to be dropped.
				reads.check(t, 2, size)
				close(a.hold)
				w.deliver(t, "after", "after")
				w.awaitTurnEnds(1)
				synctest.Wait()
				if got := a.order(); !slices.Equal(got, []string{"m0", "after"}) {
					t.Errorf("turns ran %v, want m0 (cut short) and the message after the drop", got)
				}
				for i := range 21 {
					if st, _ := w.statusOf(t, fmt.Sprint("m", i)); st != persistence.StatusFailed {
						t.Errorf("m%d: %s, want failed", i, st)
					}
				}
			})
		})
	}
}

// unreadablePending is a store whose reads of pending messages (PendingAfter, PendingRefsAfter)
// fail while down is set, as a database that cannot be reached fails them.
type unreadablePending struct {
	persistence.Store
	down atomic.Bool
}

func (u *unreadablePending) PendingAfter(ctx context.Context, sessionID string, after, through int64, limit int) ([]persistence.Message, error) {
	if u.down.Load() {
		return nil, fmt.Errorf("%w: connection refused (test)", persistence.ErrUnavailable)
	}
	return u.Store.PendingAfter(ctx, sessionID, after, through, limit)
}

func (u *unreadablePending) PendingRefsAfter(ctx context.Context, sessionID string, after, through int64, limit int) ([]persistence.Message, error) {
	if u.down.Load() {
		return nil, fmt.Errorf("%w: connection refused (test)", persistence.ErrUnavailable)
	}
	return u.Store.PendingRefsAfter(ctx, sessionID, after, through, limit)
}

// TestSpilledMessagesWaitOutAnUnreadableStore: while the store cannot be read, the messages
// waiting in it past the cap wait (nothing behind them overtakes them), a /stop or an operator's
// reset that would drop them is refused with an explicit answer, and once the store answers
// they run, in order.
func TestSpilledMessagesWaitOutAnUnreadableStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		var reads *unreadablePending
		w := newManagerWorld(t, a, func(d *Deps) {
			d.Config.QueueCap = 2
			reads = &unreadablePending{Store: d.Store}
			d.Store = reads
		})
		w.deliver(t, "m0", "hold")
		ids := w.flood(t, 1, 10, 10)
		reads.down.Store(true)
		close(a.hold)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := a.order(); !slices.Equal(got, []string{"m0", "m1", "m2"}) {
			t.Errorf("with the store unreadable turns ran %v, want those held in memory: m0 m1 m2", got)
		}
		if r := w.deliver(t, "stop", "/stop"); r.ErrorCode != "unavailable" {
			t.Errorf("/stop with its queued messages unreadable: %+v, want unavailable", r)
		}
		res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &ResetSession{}}, time.Minute).Result()
		if r, ok := res.(*ResetResult); err != nil || !ok || r.ErrorCode != ErrCodeUnavailable || r.SessionId != "" {
			t.Errorf("an operator's reset with the queued messages unreadable: %v %v, want unavailable", res, err)
		}
		if r := w.deliver(t, "m11", "m11"); r.Disposition != platforms.Queued || r.QueueDepth != 9 {
			t.Errorf("m11: %+v, want queued behind the 8 waiting in the store", r)
		}
		ids = append(ids, "m11")

		reads.down.Store(false)
		w.awaitTurnEndsWithin(t, len(ids)+1, time.Minute)
		synctest.Wait()
		if got, want := a.order(), append([]string{"m0"}, ids...); !slices.Equal(got, want) {
			t.Errorf("turns ran %v, want %v", got, want)
		}
	})
}

// TestRefusedWritePastTheCapKeepsTheRestInOrder: the write of one message past the cap is
// refused; its sender is told, the messages behind it are stored and run in order, and the
// message sent again runs after them.
func TestRefusedWritePastTheCapKeepsTheRestInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		var refuseM5 atomic.Bool
		refuseM5.Store(true)
		w := newManagerWorldWrites(t, a, func(d *Deps) { d.Config.QueueCap = 2 }, func(s persistence.Store) persistence.Store {
			return &refusedWrites{Store: s, refuse: func(op persistence.Op) bool {
				m, ok := op.(*persistence.AppendMessage)
				return ok && m.Message.MessageID == "m5" && refuseM5.Load()
			}}
		})
		w.deliver(t, "m0", "hold")
		var ids []string
		for i := 1; i <= 10; i++ {
			id := fmt.Sprint("m", i)
			r := w.deliver(t, id, id)
			if id == "m5" {
				if r.ErrorCode != "unavailable" {
					t.Fatalf("m5: %+v, want unavailable", r)
				}
				continue
			}
			ids = append(ids, id)
		}
		refuseM5.Store(false)
		if r := w.deliver(t, "m5", "m5"); r.Disposition != platforms.Queued || r.ErrorCode != "" {
			t.Fatalf("m5 sent again: %+v, want queued", r)
		}
		ids = append(ids, "m5")
		close(a.hold)
		w.awaitTurnEnds(len(ids) + 1)
		synctest.Wait()
		if got, want := a.order(), append([]string{"m0"}, ids...); !slices.Equal(got, want) {
			t.Errorf("turns ran %v, want %v", got, want)
		}
		_, m5 := w.statusOf(t, "m5")
		if _, m10 := w.statusOf(t, "m10"); m5 < m10 {
			t.Errorf("m5 sent again is stored at seq %d, before m10 (%d)", m5, m10)
		}
	})
}

// TestSpilledMessagesWaitForTheSpool: messages taken past the cap while the database fails wait
// in the spool, which the database does not show yet; they run, in order, once the spool has
// been replayed. A read of the database before would pass over them (never run in this
// activation, although acknowledged).
func TestSpilledMessagesWaitForTheSpool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		dir := t.TempDir()
		sp, err := spool.Open(filepath.Join(dir, "spool"))
		if err != nil {
			t.Fatal(err)
		}
		a := newRequeueAgent()
		var deps *Deps
		w := newManagerWorldWith(t, filepath.Join(dir, "agentgate.db"), a,
			func(d *Deps) { deps, d.Config.QueueCap = d, 2 },
			out.Wrap,
			func(o *persistence.ActorOptions) {
				o.Spool, o.Spooling, o.ReplayEvery = sp, &deps.Spooling, time.Second
			})
		w.deliver(t, "m0", "hold")
		ids := w.flood(t, 1, 2, 10)
		out.Down.Store(true)
		ids = append(ids, w.flood(t, 3, 10, 10)...)
		close(a.hold)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := a.order(); !slices.Equal(got, []string{"m0", "m1", "m2"}) {
			t.Errorf("with writes in the spool turns ran %v, want those held in memory: m0 m1 m2", got)
		}
		out.Down.Store(false)
		w.awaitTurnEndsWithin(t, len(ids)+1, time.Minute)
		synctest.Wait()
		if got, want := a.order(), append([]string{"m0"}, ids...); !slices.Equal(got, want) {
			t.Errorf("turns ran %v, want %v", got, want)
		}
	})
}

// TestResumeDropsSpilledMessages: /resume drops every queued message, those waiting in the store
// past the cap too, read without their text; a /resume that switches to no session drops none
// and reads none of them.
func TestResumeDropsSpilledMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		reads := &readSizes{}
		w := newManagerWorld(t, a, throughStore(2, &reads.Store, reads, nil))
		first := w.deliver(t, "first", "hello")
		synctest.Wait()
		w.deliver(t, "new", "/new")
		w.deliver(t, "m0", "hold")
		const size = 4 << 10
		w.flood(t, 1, 20, size)
		w.deliver(t, "nope", "/resume nope")
		if text := w.noticeFor(t, "nope"); !strings.Contains(text, `No earlier session "nope"`) {
			t.Errorf("/resume nope answered %q", text)
		}
		w.deliver(t, "cmd", "/resume "+first.SessionId)
		if text, want := w.noticeFor(t, "cmd"), "21 message(s) sent before it were not answered."; !strings.Contains(text, want) {
			t.Errorf("/resume answered %q, want %q", text, want)
		}
		reads.check(t, 2, size)
		close(a.hold)
		w.deliver(t, "after", "after")
		w.awaitTurnEnds(1)
		synctest.Wait()
		if got := a.order(); !slices.Equal(got, []string{"first", "m0", "after"}) {
			t.Errorf("turns ran %v, want first, m0 (cut short) and the message after the resume", got)
		}
		for i := range 21 {
			if st, _ := w.statusOf(t, fmt.Sprint("m", i)); st != persistence.StatusFailed {
				t.Errorf("m%d: %s, want failed", i, st)
			}
		}
	})
}

// TestRequeueJoinsTheSpilledMessages: an operator's requeue while messages wait in the store
// past the cap queues the message behind them, in order, and a message sent after it runs after
// it; the messages waiting are not read for it. Before, the requeue read them all back into
// memory, with their text, to queue one message behind them.
func TestRequeueJoinsTheSpilledMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newRequeueAgent()
		reads := &readSizes{}
		w := newManagerWorld(t, a, throughStore(2, &reads.Store, reads, nil))
		w.quarantine(t, a, "q")
		a.poisoned.Store(false)
		w.deliver(t, "m0", "hold")
		const size = 4 << 10
		ids := w.flood(t, 1, 20, size)
		if r := w.requeue(t, "q"); r.ErrorCode != "" || r.Disposition != platforms.Queued || r.QueueDepth != 21 {
			t.Fatalf("requeue q = %+v, want queued behind m1…m20 (queue depth 21)", r)
		}
		if r := w.deliver(t, "after", "after"); r.Disposition != platforms.Queued || r.QueueDepth != 22 {
			t.Fatalf("after: %+v, want queued behind the requeued q (queue depth 22)", r)
		}
		if again := w.requeue(t, "q"); again.ErrorCode != ErrCodeNotQuarantined || again.Status != persistence.StatusPending {
			t.Errorf("second requeue while it waits in the store = %+v, want not_quarantined (pending)", again)
		}
		reads.check(t, 2, size)
		for len(w.sent) > 0 {
			<-w.sent // the quarantine notice
		}
		close(a.hold)
		w.awaitTurnEnds(23)
		synctest.Wait()
		want := append(append([]string{"m0"}, ids...), "q", "after")
		if got := a.order(); !slices.Equal(got, want) {
			t.Errorf("turns ran %v, want %v", got, want)
		}
		if st, _ := w.statusOf(t, "q"); st != persistence.StatusDone {
			t.Errorf("q after its turn: %s, want done", st)
		}
	})
}

// TestLostCommitAnswerJoinsTheSpilledMessages: a message whose write committed although its
// answer was lost, sent while messages wait in the store past the cap, runs at the key's
// recovery (in a cluster, every member_ttl) in its place, behind them, once, whether the
// recovery comes before the chat's next message or after it; they are not read for it. Before,
// the recovery read them all back into memory, with their text, to queue one message behind
// them.
func TestLostCommitAnswerJoinsTheSpilledMessages(t *testing.T) {
	for _, recoverFirst := range []bool{true, false} {
		t.Run(fmt.Sprint("recovery first=", recoverFirst), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := newRequeueAgent()
				out := &storetest.Outage{}
				blind := &blindReads{}
				reads := &readSizes{}
				setup := func(d *Deps) { d.Fencing = true; blind.wrap(d) }
				w := newManagerWorldWrites(t, a, throughStore(2, &reads.Store, reads, setup), func(s persistence.Store) persistence.Store {
					out.Store = s
					return out
				})
				w.deliver(t, "m0", "hold")
				const size = 4 << 10
				ids := w.flood(t, 1, 20, size)
				out.Lost.Store(1)
				blind.on.Store(true) // the session cannot read whether the write applied
				if r := w.deliver(t, "lost", "lost"); r.ErrorCode != "unavailable" {
					t.Fatalf("lost, whose commit answer is lost: %+v, want unavailable", r)
				}
				blind.on.Store(false)
				recovery := func() { w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &Recover{}}) }
				if recoverFirst {
					recovery()
				}
				r := w.deliver(t, "after", "after")
				if recoverFirst && (r.Disposition != platforms.Queued || r.QueueDepth != 22) {
					t.Fatalf("after: %+v, want queued behind the adopted message (queue depth 22)", r)
				}
				if !recoverFirst {
					recovery()
				}
				synctest.Wait()
				reads.check(t, 2, size)
				close(a.hold)
				w.awaitTurnEnds(23)
				synctest.Wait()
				want := append(append([]string{"m0"}, ids...), "lost", "after")
				if got := a.order(); !slices.Equal(got, want) {
					t.Errorf("turns ran %v, want %v", got, want)
				}
				if st, _ := w.statusOf(t, "lost"); st != persistence.StatusDone {
					t.Errorf("lost after its turn: %s, want done", st)
				}
			})
		})
	}
}
