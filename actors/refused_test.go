package actors

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// TestRefusedTurnResultBacksOff: while the database and the spool both refuse writes, the
// result of a turn cannot be stored. The session keeps it and writes it again, waiting longer
// each time, and does not run the agent again: first, the session started again from the store
// at once and ran its agent in a loop as fast as the agent answered for as long as the outage
// lasted (found by TestOutageHunt: 12,000 calls of one message within a few seconds); then it
// started again after a pause, and ran the agent again after each one
// (TestRefusedTurnResultIsKeptNotRunAgain). Once the database is back, the message is answered
// once.
func TestRefusedTurnResultBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		var mu sync.Mutex
		calls := 0
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			mu.Lock()
			calls++
			n := calls
			mu.Unlock()
			if n == 1 {
				out.Down.Store(true) // the database fails while the first turn runs
			}
			if n > 50 { // a loop: hold it here, so the bubble's clock can run and the test end
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return &agents.Response{Text: "answer"}, nil
		})
		// The world has no spool: a write the database refuses is refused, as when the spool
		// fails too.
		w := newManagerWorldWrites(t, agent, nil, func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		mu.Lock()
		n := calls
		mu.Unlock()
		if n > 5 {
			t.Errorf("the agent ran %d times in 10s while the store refused the turn's result, want a few", n)
		}
		out.Down.Store(false)
		deadline := time.After(2 * time.Minute)
		for {
			select {
			case got := <-w.sent:
				if got.Out.Text != "answer" {
					continue
				}
				synctest.Wait()
				select {
				case again := <-w.sent:
					t.Errorf("m1 answered again: %q", again.Out.Text)
				default:
				}
				return
			case <-deadline:
				t.Fatal("m1 not answered within 2 minutes of the database's return")
			}
		}
	})
}

// TestRefusedSetAsideIsNotSent: a message set aside (here quarantined after its crashes) while
// the database and the spool both refuse writes is not answered with a notice the store does
// not hold: a reply or notice is recorded before it is sent. Before, the notice went out
// although its write was refused, the message stayed pending in the store, and the next
// activation answered it again (found by TestOutageHunt as notices sent twice). Now the session
// starts again from the store once it takes writes, and the message is answered once.
func TestRefusedSetAsideIsNotSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		var mu sync.Mutex
		calls := 0
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			mu.Lock()
			calls++
			n := calls
			mu.Unlock()
			if n == QuarantineAfter {
				out.Down.Store(true) // the database fails before the last crash
			}
			panic("agent bug (test)")
		})
		w := newManagerWorldWrites(t, agent, nil, func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		select {
		case got := <-w.sent:
			t.Errorf("sent %q answering %v while the store refused its write", got.Out.Text, got.Out.InReplyTo)
		default:
		}
		out.Down.Store(false)
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		var answers []string
		for len(w.sent) > 0 {
			got := <-w.sent
			answers = append(answers, got.Out.Text)
		}
		entries, err := w.store.OutboxAfter(w.ctx, w.key, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(answers) != 1 || len(entries) != 1 || entries[0].Text != answers[0] {
			t.Errorf("m1 answered %q with %d outbox entries, want one quarantine notice, recorded", answers, len(entries))
		}
	})
}

// TestFencedSetAsideIsNotSent: a message set aside (here quarantined after its crashes) after
// another activation claimed its key is not answered here: the set-aside write is refused
// (fenced), so the message is still pending in the store and the key's next activation answers
// it; a notice sent here would be the first of two.
func TestFencedSetAsideIsNotSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			panic("agent bug (test)")
		})
		var claimer *claimBefore
		w := newManagerWorldWrites(t, agent, func(d *Deps) { d.Fencing = true }, func(s persistence.Store) persistence.Store {
			claimer = &claimBefore{Store: s, status: persistence.StatusQuarantined}
			return claimer
		})
		claimer.key = w.key
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if !claimer.claimed.Load() {
			t.Fatal("the message was never set aside")
		}
		select {
		case got := <-w.sent:
			t.Errorf("sent %q answering %v although the key's new owner refused its write", got.Out.Text, got.Out.InReplyTo)
		default:
		}
		entries, err := w.store.OutboxAfter(w.ctx, w.key, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 0 {
			t.Errorf("%d outbox entries, want none: the fenced set-aside stored nothing", len(entries))
		}
	})
}

// claimBefore is a store on which another member ("b") claims key just before the first commit
// that gives a message status.
type claimBefore struct {
	persistence.Store
	key     string
	status  string
	claimed atomic.Bool
}

func (s *claimBefore) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	for _, g := range groups {
		for _, op := range g {
			if st, ok := op.(*persistence.SetMessageStatus); ok && st.Status == s.status && s.claimed.CompareAndSwap(false, true) {
				if _, err := s.Store.Claim(ctx, s.key, "b", time.Now(), nil); err != nil {
					panic(err)
				}
			}
		}
	}
	return s.Store.Commit(ctx, groups)
}

// TestRefusedResetIsWrittenOnceTheStoreIsBack: an idle reset whose write the database refuses
// is not done in memory alone. Before, the session took itself for ended while the store kept
// it live until the chat's next message; a reset must be a boundary the store holds. Now the
// session starts again from the store, which ends it once it takes writes.
func TestRefusedResetIsWrittenOnceTheStoreIsBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		idle := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Second, Notify: true}
		w := newManagerWorldWrites(t, agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "ok"}, nil
		}), func(d *Deps) {
			d.Config.ResetFor = func(string, string) ResetPolicy { return idle }
			d.Config.ResetPolicies = []ResetPolicy{idle}
		}, func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		r := w.deliver(t, "m1", "one")
		if r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		<-w.sent
		time.Sleep(time.Minute) // idle past its policy
		out.Down.Store(true)
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
		time.Sleep(10 * time.Second)
		synctest.Wait()
		out.Down.Store(false)
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		sess, err := w.store.Session(w.ctx, r.SessionId)
		if err != nil {
			t.Fatal(err)
		}
		if sess.EndedAt.IsZero() {
			t.Errorf("session %s is live in the store after its idle reset (its write refused during an outage, the store back since)", sess.ID)
		}
	})
}

// TestRedeliveryDuringAnOutageIsADuplicate: a message answered in an earlier activation of its
// session (so this one has not seen it) and delivered again while the database cannot be
// written is a duplicate: while the writes go to the spool, it is not taken again (it would
// run and be answered a second time, and its row be refused at the replay); while the spool
// fails too, it is not refused as "not stored", which it is. Before, the first was
// acknowledged "started" and run again, the second answered "unavailable" (found by
// TestOutageHunt).
func TestRedeliveryDuringAnOutageIsADuplicate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spool bool
	}{{"spooling", true}, {"spool failing", false}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				out := &storetest.Outage{}
				agent, ran := countingEcho()
				dir := t.TempDir()
				var withSpool []func(*persistence.ActorOptions)
				spooling := false
				if tc.spool {
					sp, err := spool.Open(filepath.Join(dir, "spool"))
					if err != nil {
						t.Fatal(err)
					}
					withSpool = append(withSpool, func(o *persistence.ActorOptions) { o.Spool = sp })
					spooling = true
				}
				var deps *Deps
				if spooling {
					withSpool = append(withSpool, func(o *persistence.ActorOptions) { o.Spooling = &deps.Spooling })
				}
				w := newManagerWorldWith(t, filepath.Join(dir, "agentgate.db"), agent,
					func(d *Deps) { d.Config.PassivateAfter, deps = 10*time.Second, d },
					out.Wrap, withSpool...)
				if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
					t.Fatalf("m1: %+v, want started", r)
				}
				w.awaitTurnEnds(1)
				time.Sleep(time.Minute) // the session passivates
				synctest.Wait()
				if r := w.deliver(t, "m2", "two"); r.Disposition != platforms.Started {
					t.Fatalf("m2: %+v, want started", r)
				}
				w.awaitTurnEnds(1)
				out.Down.Store(true)
				if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Duplicate || r.ErrorCode != "" {
					t.Errorf("m1 delivered again while the database is down: %+v, want duplicate", r)
				}
				out.Down.Store(false)
				time.Sleep(10 * time.Second) // the spool drains
				synctest.Wait()
				if n := ran("m1"); n != 1 {
					t.Errorf("m1 ran %d times, want once", n)
				}
			})
		})
	}
}

// TestRedeliveryAfterAnIdleResetDuringAnOutageIsADuplicate: a message taken in an earlier
// activation of its session is delivered again while the database cannot be written, once the
// session is due for an idle reset: the write that would store it also ends the session and
// starts its successor. It is a duplicate, as in TestRedeliveryDuringAnOutageIsADuplicate.
// Before, the store was not read for a write that reset the session: with the spool failing
// too, the message was refused as "not stored", which it is; while the writes went to the
// spool, it was acknowledged and run again (found by TestOutageHunt, seed 1796182942862475634).
func TestRedeliveryAfterAnIdleResetDuringAnOutageIsADuplicate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spool bool
	}{{"spooling", true}, {"spool failing", false}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				out := &storetest.Outage{}
				agent, ran := countingEcho()
				dir := t.TempDir()
				var deps *Deps
				var withSpool []func(*persistence.ActorOptions)
				if tc.spool {
					sp, err := spool.Open(filepath.Join(dir, "spool"))
					if err != nil {
						t.Fatal(err)
					}
					withSpool = append(withSpool, func(o *persistence.ActorOptions) { o.Spool, o.Spooling = sp, &deps.Spooling })
				}
				// The session clock stands still until the test moves it: the session passivates
				// (on the bubble's clock) long before it is due for its reset.
				base := time.Now()
				var skew atomic.Int64
				p := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Second}
				w := newManagerWorldWith(t, filepath.Join(dir, "agentgate.db"), agent, func(d *Deps) {
					deps = d
					d.Config.PassivateAfter = 10 * time.Second
					d.Config.ResetFor = func(string, string) ResetPolicy { return p }
					d.Config.ResetPolicies = []ResetPolicy{p}
					d.Now = func() time.Time { return base.Add(time.Duration(skew.Load())) }
				}, out.Wrap, withSpool...)
				if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
					t.Fatalf("m1: %+v, want started", r)
				}
				w.awaitTurnEnds(1)
				time.Sleep(time.Minute) // the session passivates
				synctest.Wait()
				if r := w.deliver(t, "m2", "two"); r.Disposition != platforms.Started {
					t.Fatalf("m2: %+v, want started", r)
				}
				w.awaitTurnEnds(1)
				// The turn's result is stored: the session is idle, and then due for its reset.
				synctest.Wait()
				skew.Store(int64(time.Hour))
				out.Down.Store(true)
				if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Duplicate || r.ErrorCode != "" {
					t.Errorf("m1 delivered again while the database is down, its session due for a reset: %+v, want duplicate", r)
				}
				out.Down.Store(false)
				time.Sleep(time.Minute) // the spool drains
				synctest.Wait()
				if n := ran("m1"); n != 1 {
					t.Errorf("m1 ran %d times, want once", n)
				}
			})
		})
	}
}

// TestRefusedMessagesAreNotLoggedEachTime: while the database and the spool both refuse
// writes (a full disk), every message is refused, and its sender sends it again and again; the
// line that says so is logged once a minute for all sessions, counting the others (repeats).
// Before, each refusal logged one, next to the HTTP API's own line for it: 200 kB of log in 4
// minutes of a 10-chat load on a full disk.
func TestRefusedMessagesAreNotLoggedEachTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		logs := &testutil.Buffer{}
		// No spool: a write the database refuses is refused, as when the spool fails too.
		w := newManagerWorldWrites(t, echo.New(), func(d *Deps) {
			d.Log = slog.New(slog.NewTextHandler(logs, nil))
		}, func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		if r := w.deliver(t, "m0", "zero"); r.ErrorCode != "" {
			t.Fatalf("m0: %+v, want it taken", r)
		}
		w.awaitTurnEnds(1)
		out.Down.Store(true)
		for i := range 10 {
			if r := w.deliver(t, fmt.Sprint("m", i+1), "x"); r.ErrorCode != "unavailable" {
				t.Fatalf("m%d on a full disk: %+v, want unavailable", i+1, r)
			}
		}
		if n := strings.Count(logs.String(), "store inbound message"); n != 1 {
			t.Errorf("10 refused messages within a minute logged %d lines, want 1:\n%s", n, logs.String())
		}
		out.Down.Store(false)
	})
}

// TestRefusedOperatorResetLeavesTheSessionAsStored: an operator's reset whose write the store
// refuses (the database and the spool both failing; a cluster member spools nothing) is
// answered unavailable, and the session goes on as the store holds it: its running turn's
// message and the one queued run, once, in the session they were sent to. Before, the session
// went on in memory as the new session the store did not hold, its dropped messages neither run
// nor answered, and the operator got an internal error.
func TestRefusedOperatorResetLeavesTheSessionAsStored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		a := newRequeueAgent()
		w := newManagerWorldWrites(t, a, nil, func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		first := w.deliver(t, "m0", "hold")
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Queued {
			t.Fatalf("m1: %+v, want queued", r)
		}
		out.Down.Store(true)
		res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &ResetSession{}}, time.Minute).Result()
		if err != nil {
			t.Fatal(err)
		}
		if r := res.(*ResetResult); r.ErrorCode != ErrCodeUnavailable || r.Error == "" || r.SessionId != "" {
			t.Errorf("the refused reset answered %+v, want unavailable, with a message and no new session", r)
		}
		out.Down.Store(false)
		close(a.hold)
		w.checkNotDropped(t, first.SessionId)
		if r := w.deliver(t, "after", "after"); r.SessionId != first.SessionId || r.ErrorCode != "" {
			t.Errorf("the message after the refused reset: %+v, want it taken in session %s", r, first.SessionId)
		}
		if got := a.order(); len(slices.DeleteFunc(slices.Clone(got), func(id string) bool { return id != "m1" })) != 1 {
			t.Errorf("turns ran %v, want m1 once", got)
		}
	})
}

// TestRefusedInterruptIsNotAnsweredTwice: in interrupt mode, a message whose turn a new one cut
// short is marked failed in the store and answered by the new turn's answer. When the store
// refuses the interrupt's mark, the write of that answer marks it: each message is answered
// once, and a restart runs neither again. Before, the cut message stayed pending in the store
// though answered, and the key's next activation ran it and answered it a second time.
func TestRefusedInterruptIsNotAnsweredTwice(t *testing.T) {
	for _, tc := range []struct {
		name   string
		second string // m2's text
		stop   bool   // a /stop ends m2's turn, and answers m1 and m2
	}{
		{name: "the next turn's answer", second: "two"},
		{name: "a stop", second: "hold", stop: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "agentgate.db")
				a := newRequeueAgent()
				var refuse atomic.Bool // the interrupt's write: it marks the cut turn's messages failed
				refused := &refusedWrites{refuse: func(op persistence.Op) bool {
					st, ok := op.(*persistence.SetMessageStatus)
					return ok && refuse.Load() && st.Status == persistence.StatusFailed && st.TurnID != ""
				}}
				interrupt := func(d *Deps) { d.Config.QueueMode = ModeInterrupt }
				w := newManagerWorldWith(t, path, a, interrupt, func(s persistence.Store) persistence.Store {
					refused.Store = s
					return refused
				})
				if r := w.deliver(t, "m1", "hold"); r.Disposition != platforms.Started {
					t.Fatalf("m1: %+v, want started", r)
				}
				refuse.Store(true)
				if r := w.deliver(t, "m2", tc.second); r.Disposition != platforms.Interrupted {
					t.Fatalf("m2: %+v, want interrupted", r)
				}
				synctest.Wait()
				refuse.Store(false)
				if tc.stop {
					w.deliver(t, "stop", "/stop")
					synctest.Wait()
				}
				w.stop()

				b := newRequeueAgent()
				close(b.hold)
				w2 := newManagerWorldAt(t, path, b, interrupt)
				w2.deliver(t, "m3", "three")
				synctest.Wait()
				if ran := b.order(); !slices.Equal(ran, []string{"m3"}) {
					t.Errorf("after a restart turns ran %v, want m3 alone: m1 and m2 were answered before it", ran)
				}
				for _, id := range []string{"m1", "m2"} {
					replies, err := w2.store.RepliesTo(w2.ctx, w2.key, id, 0)
					if err != nil {
						t.Fatal(err)
					}
					if len(replies) != 1 {
						t.Errorf("%s is answered by %d outbox entries, want 1: %+v", id, len(replies), replies)
					}
				}
			})
		})
	}
}

// TestRefusedCommandDoesNotDropTheMessageInFlight: a message whose write is in flight when an
// operator's reset or a /stop comes is dropped by it, and set aside with a notice once stored.
// When the store refuses the command's write (a database failing for a moment), the command
// did not happen: the message runs, and the session goes on as stored. Before, it was set
// aside all the same, by a write sent after the refused one that the store took: failed, never
// run, its sender told a command had ended the work (found by a review).
func TestRefusedCommandDoesNotDropTheMessageInFlight(t *testing.T) {
	for _, tc := range []struct {
		name    string
		command func(w *managerWorld) *actor.Future
		refuse  func(op persistence.Op) bool // the command's write
	}{
		{"operator reset", func(w *managerWorld) *actor.Future {
			return w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &ResetSession{}}, time.Minute)
		}, func(op persistence.Op) bool { _, ok := op.(*persistence.EndSession); return ok }},
		{"/stop", func(w *managerWorld) *actor.Future { return w.request("stop", "/stop") },
			func(op persistence.Op) bool {
				m, ok := op.(*persistence.AppendMessage)
				return ok && m.Message.MessageID == "stop"
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := newRequeueAgent()
				w, g, refuse := newGatedWorld(t, a, nil, tc.refuse)
				first := w.deliver(t, "m0", "hold")
				g.armed.Store(true)
				m1 := w.request("m1", "one")
				<-g.waiting // m1's write is in flight
				g.armed.Store(false)
				refuse.Store(true)
				cmd := tc.command(w)
				synctest.Wait()
				close(g.open)
				if res, err := m1.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
					t.Fatalf("m1: %v, %v", res, err)
				}
				if _, err := cmd.Result(); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				refuse.Store(false)
				close(a.hold)
				w.checkNotDropped(t, first.SessionId)
			})
		})
	}
}

// checkNotDropped checks that a command that would have dropped m0 (running) and m1 (queued)
// did not happen: m1 is answered by its turn, both end done, and the key routes to session sid.
func (w *managerWorld) checkNotDropped(t *testing.T, sid string) {
	t.Helper()
	if text := w.noticeFor(t, "m1"); text != "answered m1" {
		t.Errorf("m1 answered %q, want its turn's reply: the command that would have dropped it was not stored", text)
	}
	synctest.Wait()
	for _, id := range []string{"m0", "m1"} {
		if st, _ := w.statusOf(t, id); st != persistence.StatusDone {
			t.Errorf("%s: %s, want done", id, st)
		}
	}
	if route, err := w.store.Route(w.ctx, w.key); err != nil || route.SessionID != sid {
		t.Errorf("the key routes to %+v (%v), want session %s", route, err, sid)
	}
}
