package actors

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
)

// handedOnAgain is the Forward by which the member that handed the key here sends the filed
// reset rd again (SessionManager.sendFiledReset): its answer was lost, or did not come in time.
func handedOnAgain(key string, rd *ResetDue) *Forward {
	return &Forward{Key: key, Hops: 1, Msg: &Forward_ResetDue{ResetDue: rd}}
}

// TestStaleFiledResetReplacesNoNewerOne: a cluster member's session has its daily reset refused
// (its mark, and its end once m0's turn across 04:00 was done) and filed for the key's next
// activation, and the session, started again, waits to load: the store refuses its claim.
// Meanwhile the member that handed the key here earlier sends again a reset it filed then,
// which this member took long ago (the answer was lost): one of the key's earlier session, or
// this session's own from before its work here (m0's), which moved its activity on. The
// session answers that it has it, and once it loads it ends the session at 04:00. Before, the
// stale reset took the place of the newer one filed here: at the load it named a session no
// longer current, or found the session active since, and ended nothing; the session went on
// until the next day's reset.
func TestStaleFiledResetReplacesNoNewerOne(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stale func(sid string) *ResetDue
	}{
		{"an earlier session's", func(string) *ResetDue {
			return &ResetDue{SessionId: "an-earlier-session", Reason: persistence.EndDaily,
				DueAtUnixNano: at4.AddDate(0, 0, -1).UnixNano(), ActiveAtUnixNano: before4.AddDate(0, 0, -1).UnixNano()}
		}},
		{"this one's before its work here", func(sid string) *ResetDue {
			return &ResetDue{SessionId: sid, Reason: persistence.EndDaily,
				DueAtUnixNano: at4.UnixNano(), ActiveAtUnixNano: before4.UnixNano()}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w, sid, claims := resetOnlyInMemoryWaitingToLoad(t)
				res, err := w.system.Root.RequestFuture(w.manager, handedOnAgain(w.key, tc.stale(sid)), time.Hour).Result()
				if _, ok := res.(*ResetDueTaken); err != nil || !ok {
					t.Fatalf("the stale reset sent again was answered %#v, %v; want ResetDueTaken", res, err)
				}
				claims.down.Store(false)
				time.Sleep(5 * time.Minute)
				synctest.Wait()
				w.checkEndedAt4(t, sid, "once the session loaded")
			})
		})
	}
}

// resetOnlyInMemoryWaitingToLoad starts a world of cluster member a whose session's daily reset
// fell due at 04:00 under m0's turn and is held only in memory, filed for the key's next
// activation: the store refused both its mark and the session's end (then took writes again).
// The session, started again from the store, waits to load: the store refuses its claim while
// claims is down. It returns the session's id. Called in a synctest bubble.
func resetOnlyInMemoryWaitingToLoad(t *testing.T) (w *managerWorld, sid string, claims *downStore) {
	t.Helper()
	release, p := make(chan struct{}), &movingPlacement{}
	var clock atomic.Int64
	clock.Store(before4.UnixNano())
	var refusing atomic.Bool
	w = newManagerWorldWrites(t, gatedAgent("m0", release), func(d *Deps) {
		dailyMemberA(&clock, p)(d)
		claims = &downStore{Store: d.Store}
		d.Store = claims
	}, refusingResetWrites(&refusing))
	p.self.Store(w.manager)
	p.owner.Store(w.manager)
	m0 := w.deliver(t, "m0", "hello")
	synctest.Wait()
	claims.down.Store(true)
	w.resetRefusedAcrossTheHour(t, &clock, &refusing, release)
	refusing.Store(false)
	time.Sleep(10 * time.Second) // past its pause the session waits to load
	synctest.Wait()
	if _, ok := w.d.resetsDue.Load(w.key); !ok {
		t.Fatal("no reset filed after the store refused it")
	}
	if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || s.ResetDueReason != "" || !s.EndedAt.IsZero() {
		t.Fatalf("session %s: %+v, %v; want neither its end nor its mark stored", m0.SessionId, s, err)
	}
	if claims.claims.Load() == 0 {
		t.Fatal("the session did not try to claim the key again")
	}
	return w, m0.SessionId, claims
}

// TestFiledResetSentAgainIsHeldOnceWhileTheKeyWaits: member b runs the key's slow turn when the
// key moves to member a, which cannot reach b, and waits for it to let go. Meanwhile the member
// that handed a the key before sends its filed reset again and again, a minute apart (each time
// the last went unanswered for 30 s: a holds it until the key's session starts). Once b can be
// reached, the reset goes on to the key's session, and is answered once: a held one copy, the
// last one sent, whose sender still waits for it. Before, every copy was held, one more each
// minute of the wait, and each was answered.
func TestFiledResetSentAgainIsHeldOnceWhileTheKeyWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		agent, ran := slowUntil(release)
		w, _, link, ownerA, ownerB, _, cut := twoMembers(t, agent, false)
		slow := w.system.Root.RequestFuture(link, &Routed{Key: w.key, Msg: w.message("m1", "slow")}, time.Hour)
		synctest.Wait()
		cut.Store(true)
		ownerA.Store(w.manager) // the key moves to a, which cannot reach b
		ownerB.Store(w.manager)
		next := w.request("m2", "next")
		synctest.Wait()
		filed := &ResetDue{SessionId: "an-earlier-session", Reason: persistence.EndDaily,
			DueAtUnixNano: at4.UnixNano(), ActiveAtUnixNano: before4.UnixNano()}
		var sends []*actor.Future
		for range 3 {
			sends = append(sends, w.system.Root.RequestFuture(w.manager, handedOnAgain(w.key, filed), 10*time.Minute))
			time.Sleep(time.Minute)
			synctest.Wait()
		}
		cut.Store(false) // b can be reached again
		close(release)
		for _, f := range []*actor.Future{slow, next} {
			if _, err := f.Result(); err != nil {
				t.Fatal(err)
			}
		}
		ranOnceEach(t, w, ran)
		var taken []int
		for i, f := range sends {
			if res, err := f.Result(); err == nil {
				if _, ok := res.(*ResetDueTaken); ok {
					taken = append(taken, i+1)
				}
			}
		}
		// The copy held is the last one sent: its sender waits for the answer, and gave up the
		// earlier ones (holdsFiledReset).
		if len(taken) != 1 || taken[0] != len(sends) {
			t.Errorf("of the filed reset sent %d times while the key waited, copies %v were taken, want only the last (one copy held, the latest)", len(sends), taken)
		}
	})
}

// TestFiledResetHandedBackKeepsItsPlace: a session asks to stop (it passivates; its mailbox is
// suspended, so it has not stopped yet) while a filed reset handed on with its key and the chat's
// next message, m2, wait in its mailbox in that order. A copy of the reset, sent again by the
// member that handed it on (the first went unanswered for 30 s), reaches the manager first and
// is held for the session's successor; then the session hands the first copy back, and m2
// after it (Session.handOver). The successor takes the reset before m2: it ends the session at
// 04:00, answers the copy sent again (whose sender still waits), and m2 begins the session's
// successor. Before, the copy handed back took the place of the one held, after what was held
// before it, and m2, handed back after it, went in front of it (the count of those handed back
// was not moved on): m2 ran in the session, which was then active since, and the reset ended
// nothing; the session went on until the next day's.
func TestFiledResetHandedBackKeepsItsPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var clock atomic.Int64
		clock.Store(before4.UnixNano())
		w := newManagerWorld(t, gatedAgent("m0", release), dailyClock(&clock))
		f0 := w.request("m0", "hello")
		synctest.Wait()
		clock.Store(after4.UnixNano())
		close(release) // m0's reply is stored after the hour: the session is not due by its activity
		res, err := f0.Result()
		if err != nil {
			t.Fatal(err)
		}
		sid := res.(*DeliverResult).SessionId
		w.answersTo(t, "m0")
		synctest.Wait()
		s, err := w.store.Session(w.ctx, sid)
		if err != nil {
			t.Fatal(err)
		}
		filed := func() *ResetDue { // the reset another member filed for the session under m0's turn
			return &ResetDue{SessionId: sid, Reason: persistence.EndDaily, DueAtUnixNano: at4.UnixNano(),
				ActiveAtUnixNano: s.LastActivityAt.UnixNano()}
		}

		resume := w.suspendAndPassivate(t)
		again := w.system.Root.RequestFuture(w.manager, handedOnAgain(w.key, filed()), time.Hour)
		first, m2 := actor.NewFuture(w.system, time.Hour), actor.NewFuture(w.system, time.Hour)
		w.system.Root.Send(w.manager, &handedBack{key: w.key, r: routed{msg: filed(), sender: first.PID()}})
		w.system.Root.Send(w.manager, &handedBack{key: w.key, r: routed{msg: w.message("m2", "next"), sender: m2.PID()}})
		synctest.Wait()
		resume()

		res, err = m2.Result()
		if err != nil {
			t.Fatal(err)
		}
		if r := res.(*DeliverResult); r.SessionId == sid {
			t.Errorf("m2 ran in session %s, the one the reset ends; want its successor", r.SessionId)
		}
		w.checkEndedAt4(t, sid, "once the successor took what was held and handed back")
		if res, err := again.Result(); err != nil {
			t.Errorf("the copy sent again was answered %#v, %v; want ResetDueTaken", res, err)
		} else if _, ok := res.(*ResetDueTaken); !ok {
			t.Errorf("the copy sent again was answered %#v; want ResetDueTaken", res)
		}
	})
}

// TestFiledResetSentAgainWaitsWhileTheKeyIsHeldHere: member a's hand-on of a filed reset waits
// to be sent again when the key is this member's session's once more, and that session asks to
// stop (suspended, it has not stopped yet) with a reset of its own filed, as the key moves to
// member b. The reset is not sent again to b while a still holds the key: b, which waits for a
// to let go, would forward it back here, past its last hop, and a would activate the key again
// for it beside b (TestFiledResetHandedToTheMemberThatAskedForTheKeyIsNotSentBack, on the
// hand-on's first send). It goes to b once a has let go. Before, the send again went at once.
func TestFiledResetSentAgainWaitsWhileTheKeyIsHeldHere(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &movingPlacement{}
		w := newManagerWorld(t, gatedAgent("", nil), asMemberA(p))
		p.self.Store(w.manager)
		p.owner.Store(w.manager)
		if r := w.deliver(t, "m0", "hello"); r.ErrorCode != "" {
			t.Fatalf("m0: %+v", r)
		}
		synctest.Wait()
		b, got := resetTaker(w, takesIt)

		resume := w.suspendAndPassivate(t)
		w.fileReset("the-sessions")
		p.owner.Store(b) // the key moves
		w.system.Root.Send(w.manager, &retryHandOn{key: w.key, failures: 1})
		synctest.Wait()
		if n := got.Load(); n != 0 {
			t.Errorf("the filed reset was sent to b %d times while a still held the key; want none before a lets go", n)
		}
		resume()
		synctest.Wait()
		if n := got.Load(); n != 1 {
			t.Errorf("the filed reset was sent to b %d times once a let go of the key; want once", n)
		}
		if _, ok := w.d.resetsDue.Load(w.key); ok {
			t.Error("the reset filed for the key stays after b took it")
		}
	})
}

// TestFiledResetsLeftUnsentAtTheManagersStopAreSaid: member a's session stops as its key moves
// to member b, with a reset filed for it, which a hands on to b. b does not take it (a dead
// letter: a sends it again a second later; or no answer yet), and a's manager stops meanwhile.
// Its stop says, in one WRN line, that the reset is not sent again and stays in memory, with
// the session's key, and it is not sent again. Before, a send again waiting for its timer was
// dropped without a word (the last line about the reset said it was sent again until b took
// it), and so was one whose answer had not come back before the stop was over.
func TestFiledResetsLeftUnsentAtTheManagersStopAreSaid(t *testing.T) {
	for _, tc := range []struct {
		name     string
		awaiting string // the line's count of hand-ons whose answer is still awaited
		answer   func(c actor.Context)
	}{
		{"waiting to be sent again", "awaiting=0", func(c actor.Context) { c.Respond(&actor.DeadLetterResponse{}) }},
		{"awaiting its answer", "awaiting=1", func(actor.Context) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p, logs := &movingPlacement{}, new(testutil.Buffer)
				w := newManagerWorld(t, gatedAgent("", nil), loggedTo(logs, asMemberA(p)))
				p.self.Store(w.manager)
				p.owner.Store(w.manager)
				if r := w.deliver(t, "m0", "hello"); r.ErrorCode != "" {
					t.Fatalf("m0: %+v", r)
				}
				synctest.Wait()
				b, got := resetTaker(w, func(c actor.Context, _ int32) { tc.answer(c) })
				w.fileReset("the-sessions")
				p.owner.Store(b) // the key moves
				session := actor.NewPID(w.system.Address(), w.manager.Id+"/"+w.key)
				w.system.Root.Send(w.manager, &passivate{key: w.key, pid: session})
				synctest.Wait()
				if n := got.Load(); n != 1 {
					t.Fatalf("the filed reset was handed on %d times as the session stopped; want once", n)
				}
				if err := w.system.Root.StopFuture(w.manager).Wait(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(time.Minute)
				synctest.Wait()
				if n := got.Load(); n != 1 {
					t.Errorf("the filed reset was handed on %d times in all; want once (not again after the stop)", n)
				}
				var lines []string // of the reset's hand-on: those of sendFiledReset and the stop's
				for _, l := range strings.Split(logs.String(), "\n") {
					if strings.Contains(l, "reset filed for it") || strings.Contains(l, "filed resets handed on") {
						lines = append(lines, l)
					}
				}
				if len(lines) == 0 || !strings.Contains(lines[len(lines)-1], handOnsLeftLine) {
					t.Fatalf("lines of the filed reset: %q; want the last to say %q", lines, handOnsLeftLine)
				}
				last := lines[len(lines)-1]
				for _, want := range []string{"level=WARN", "count=1", tc.awaiting, w.key} {
					if !strings.Contains(last, want) {
						t.Errorf("the stop's line %q does not hold %q", last, want)
					}
				}
				if n := len(linesWith(logs, handOnsLeftLine)); n != 1 {
					t.Errorf("the stop's line came %d times; want once", n)
				}
				if _, ok := w.d.resetsDue.Load(w.key); !ok {
					t.Error("the reset not taken is no longer filed")
				}
			})
		})
	}
}

// TestFiledResetOfAnActivationGivenUpGoesOnWithTheKey: member b runs the key's slow turn when the
// key moves to member a, which cannot reach b; a's activation, for the chat's next message (m2),
// waits for b, with a reset filed here for the key (its session here stopped with the store
// refusing its end and the reset's mark). The key moves back to b, and a gives its activation up
// (its grain stops): m2 goes on to b, and so does the filed reset, which b's session takes. A send
// again meanwhile waits for the activation's end, as for a session here (holdsKey). Before, the
// activation given up handed the reset on nowhere: it stayed in a's memory, and b, which found the
// session's activity past the due time, let the session go on until its next reset.
func TestFiledResetOfAnActivationGivenUpGoesOnWithTheKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		agent, ran := slowUntil(release)
		w, _, link, ownerA, ownerB, _, cut := twoMembers(t, agent, false)
		slow := w.system.Root.RequestFuture(link, &Routed{Key: w.key, Msg: w.message("m1", "slow")}, time.Hour)
		synctest.Wait()
		cut.Store(true)
		ownerA.Store(w.manager) // the key moves to a, which cannot reach b
		ownerB.Store(w.manager)
		filed := &overdue{sid: "an-earlier-session", reason: persistence.EndDaily, at: at4, activity: before4}
		w.d.resetsDue.Store(w.key, filed)
		grain := w.system.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
		next := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Grain: grain, Msg: w.message("m2", "next")}, time.Hour)
		synctest.Wait()
		// The key moves back to b, which a can reach again; a's placement names b through
		// toB, which counts the filed resets a hands on to b (a's link to b passes them on).
		toB, handedOn := forwardCounter(w, link)
		ownerA.Store(toB)
		ownerB.Store(link)
		cut.Store(false)
		w.system.Root.Send(w.manager, &grainStopped{key: w.key, grain: grain})
		synctest.Wait()
		close(release)
		for _, f := range []*actor.Future{slow, next} {
			if _, err := f.Result(); err != nil {
				t.Fatal(err)
			}
		}
		ranOnceEach(t, w, ran)
		synctest.Wait()
		if n := handedOn.Load(); n != 1 {
			t.Errorf("the reset filed at a was handed on to b %d times after a gave its activation up; want once", n)
		}
		if v, ok := w.d.resetsDue.Load(w.key); ok {
			t.Errorf("the reset filed at a stays there (%+v) after a gave its activation up and b took the key; want it handed on to b", v)
		}
	})
}

// TestFiledResetSentAgainWaitsWhileTheKeysActivationWaitsHere: as in
// TestFiledResetOfAnActivationGivenUpGoesOnWithTheKey, a's activation waits for b with a reset
// filed here, and the key moves on to a third member, c, before a's grain stops. A send again
// of the reset meanwhile waits for the activation's end: c may itself wait for a (whose
// activation may rank first) and forward it back here past its last hop, where it kept a's
// activation going beside c's (the case of holdsKey). Once a gives its activation up, the reset
// goes to c, once. Before, it went to c at once.
func TestFiledResetSentAgainWaitsWhileTheKeysActivationWaitsHere(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		agent, _ := slowUntil(release)
		w, _, link, ownerA, ownerB, _, cut := twoMembers(t, agent, false)
		slow := w.system.Root.RequestFuture(link, &Routed{Key: w.key, Msg: w.message("m1", "slow")}, time.Hour)
		synctest.Wait()
		cut.Store(true)
		ownerA.Store(w.manager) // the key moves to a, which cannot reach b
		ownerB.Store(w.manager)
		w.fileReset("an-earlier-session")
		grain := w.system.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Grain: grain, Msg: w.message("m2", "next")})
		synctest.Wait()
		third, got := resetTaker(w, takesIt)
		ownerA.Store(third) // the key moves on to c
		w.system.Root.Send(w.manager, &retryHandOn{key: w.key, failures: 1})
		synctest.Wait()
		if n := got.Load(); n != 0 {
			t.Errorf("the filed reset was sent to c %d times while a's activation waited; want none before it ends", n)
		}
		w.system.Root.Send(w.manager, &grainStopped{key: w.key, grain: grain})
		synctest.Wait()
		if n := got.Load(); n != 1 {
			t.Errorf("the filed reset was sent to c %d times once a gave its activation up; want once", n)
		}
		cut.Store(false)
		close(release)
		if _, err := slow.Result(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFiledResetOfASessionCrashedOutGoesOnWithTheKey: member a's session crashes past its
// restart budget (its agent panics on m1 three times, then on m2) with a reset filed for the key
// (Session.onRestarting files it; the incarnation that stops for crashing loads nothing, so it
// does not take it), while the key moves to member b. The manager lets go of the key and hands
// the reset on to b, as for a session that stops otherwise. Before, it let go and handed nothing
// on: the reset stayed in a's memory (with a send again of it, which waited while the session
// stopped here: holdsKey, dropped), and b let the session go on until its next reset.
func TestFiledResetOfASessionCrashedOutGoesOnWithTheKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		first, last := make(chan struct{}), make(chan struct{})
		crashy := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			if req.Identity.MessageID == "m2" {
				<-last
			} else {
				<-first
			}
			panic("agent bug on " + req.Identity.MessageID)
		})
		p := &movingPlacement{}
		w := newManagerWorld(t, crashy, asMemberA(p))
		p.self.Store(w.manager)
		p.owner.Store(w.manager)
		for _, id := range []string{"m1", "m2"} {
			if r := w.deliver(t, id, "boom"); r.ErrorCode != "" {
				t.Fatalf("deliver %s: %+v", id, r)
			}
		}
		close(first) // m1 crashes the session three times and is quarantined; m2 runs
		synctest.Wait()
		b, got := resetTaker(w, takesIt)
		w.fileReset("the-sessions")
		p.owner.Store(b) // the key moves
		close(last)      // m2's crash is one too many
		synctest.Wait()
		if n := got.Load(); n != 1 {
			t.Errorf("the filed reset was handed on to b %d times once the session crashed out; want once", n)
		}
		if _, ok := w.d.resetsDue.Load(w.key); ok {
			t.Error("the reset filed for the key stays at a")
		}
	})
}

// TestFiledResetHandedOnIsSentAgainAfterTheManagerRestarts: member a hands a reset filed for a
// key on to member b, which does not take it (a dead letter: a would send it again a second
// later), and a's manager restarts (a panic) meanwhile. The restarted manager sends the reset
// on to b once, shortly after it starts (not again when the first incarnation's timer would
// have fired: b takes it 5 s later), and says nothing of resets left unsent. Before, the restart
// cancelled the send again and the reset stayed in a's memory until the key came back to a, if
// ever: b's session went on until its next reset.
func TestFiledResetHandedOnIsSentAgainAfterTheManagerRestarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, logs := &movingPlacement{}, new(testutil.Buffer)
		var boom atomic.Bool
		w := newManagerWorld(t, gatedAgent("", nil), loggedTo(logs, asMemberA(ownerPanicsOnce{p, "other-key", &boom})))
		p.self.Store(w.manager)
		p.owner.Store(w.manager)
		if r := w.deliver(t, "m0", "hello"); r.ErrorCode != "" {
			t.Fatalf("m0: %+v", r)
		}
		synctest.Wait()
		b, got := resetTaker(w, func(c actor.Context, n int32) {
			switch n {
			case 1:
				c.Respond(&actor.DeadLetterResponse{})
			case 2:
				// Taken 5 s later: past the second the first incarnation's send again waited
				// for, whose timer the restart cancelled (else it sends a third copy).
				sender := c.Sender()
				go func() {
					time.Sleep(5 * time.Second)
					w.system.Root.Send(sender, &ResetDueTaken{})
				}()
			default:
				c.Respond(&ResetDueTaken{})
			}
		})
		w.fileReset("the-sessions")
		p.owner.Store(b) // the key moves
		w.system.Root.Send(w.manager, &passivate{key: w.key, pid: actor.NewPID(w.system.Address(), w.manager.Id+"/"+w.key)})
		synctest.Wait()
		if n := got.Load(); n != 1 {
			t.Fatalf("the filed reset was handed on %d times as the session stopped; want once", n)
		}

		// The manager restarts: another chat's request meets a failing placement.
		w.restartManager(t, &boom)
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := got.Load(); n != 2 {
			t.Errorf("the filed reset was handed on %d times in all; want twice (again by the restarted manager)", n)
		}
		if _, ok := w.d.resetsDue.Load(w.key); ok {
			t.Error("the reset b took is still filed here")
		}
		if n := len(linesWith(logs, handOnsLeftLine)); n != 0 {
			t.Errorf("a restart said %d times that filed resets are left unsent; want never", n)
		}
	})
}

// TestFiledResetHandedOnAfterARestartIsNotSentBack: member a's session runs m0 as its key moves
// to member b, whose activation waits for a to let go and forwards m2 to it; a reset is filed
// for the key at a, and a's manager restarts (a panic) meanwhile. Its sessions stop with it, and
// b waits for a until it asks again (releaseAnswerTimeout later): the restarted manager did not
// say it let go (its waiters went with the incarnation before). The restarted manager hands the
// reset on once b has asked it again, and a holds no session of the key. Before, it sent the
// reset to b as it started, while b still took a for the key's holder: b forwarded it back past
// its last hop, and a activated the key for it beside b's activation (with peers asking each
// other, the two members passed it back and forth until b asked again).
func TestFiledResetHandedOnAfterARestartIsNotSentBack(t *testing.T) {
	for _, stale := range []bool{false, true} {
		t.Run(map[bool]string{false: "alone", true: "a send again of the incarnation before left in the mailbox"}[stale], func(t *testing.T) {
			filedResetHandedOnAfterARestart(t, stale)
		})
	}
}

func filedResetHandedOnAfterARestart(t *testing.T, stale bool) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		p := &movingPlacement{}
		var boom atomic.Bool
		w := newManagerWorld(t, gatedAgent("m0", release), asMemberA(ownerPanicsOnce{p, "other-key", &boom}))
		p.self.Store(w.manager)
		p.owner.Store(w.manager)
		b := w.memberB(t, w.store, &p.owner)
		m0 := w.request("m0", "hello")
		synctest.Wait()
		p.owner.Store(b) // the key moves to b
		m2 := w.system.Root.RequestFuture(b, &Routed{Key: w.key, Msg: w.message("m2", "again")}, time.Hour)
		synctest.Wait() // b waits for a to let go of the key, and forwards m2 to it
		w.d.resetsDue.Store(w.key, &overdue{sid: "the-sessions", reason: persistence.EndDaily, at: at4, activity: before4})

		boom.Store(true) // a's manager restarts: another chat's request meets a failing placement
		w.system.Root.Send(w.manager, &Routed{Key: "other-key", Msg: &Recover{}})
		if stale {
			// The incarnation before's timer fired as it failed: the restarted manager has it.
			w.system.Root.Send(w.manager, &retryHandOn{key: w.key, failures: 1})
		}
		synctest.Wait()
		if boom.Load() {
			t.Fatal("the manager did not restart")
		}
		act, _ := w.system.Root.RequestFuture(w.manager, &ListActive{}, time.Hour).Result()
		if keys := act.(*ActiveList).Keys; len(keys) > 0 {
			t.Errorf("member a holds the sessions %q after its restart, though the key is b's", keys)
		}
		close(release)
		time.Sleep(time.Minute)
		synctest.Wait()
		for _, f := range []*actor.Future{m0, m2} {
			if _, err := f.Result(); err != nil {
				t.Fatal(err)
			}
		}
		act, _ = w.system.Root.RequestFuture(w.manager, &ListActive{}, time.Hour).Result()
		if keys := act.(*ActiveList).Keys; len(keys) > 0 {
			t.Errorf("member a holds the sessions %q at the end, though the key is b's", keys)
		}
		if _, ok := w.d.resetsDue.Load(w.key); ok {
			t.Error("the reset filed for the key is still at a: b's session never took it")
		}
	})
}

// ownerPanicsOnce is a Placement whose Owner panics once for key when boom is set.
type ownerPanicsOnce struct {
	Placement
	key  string
	boom *atomic.Bool
}

func (p ownerPanicsOnce) Owner(key string) *actor.PID {
	if key == p.key && p.boom.CompareAndSwap(true, false) {
		panic("the placement fails")
	}
	return p.Placement.Owner(key)
}

// resetTaker spawns another member's manager as the filed-reset tests see it: it counts the
// Forwards that carry a ResetDue (got) and answers each with answer, given the count so far.
func resetTaker(w *managerWorld, answer func(c actor.Context, n int32)) (pid *actor.PID, got *atomic.Int32) {
	got = new(atomic.Int32)
	pid = w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if f, ok := c.Message().(*Forward); ok && f.GetResetDue() != nil {
			answer(c, got.Add(1))
		}
	}))
	return pid, got
}

// forwardCounter spawns a stand-in for another member's manager to, as a member's placement
// names it: it passes every message on to to, with its sender, and counts the Forwards that
// carry a ResetDue (got), the filed resets handed on to to.
func forwardCounter(w *managerWorld, to *actor.PID) (pid *actor.PID, got *atomic.Int32) {
	got = new(atomic.Int32)
	pid = w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch m := c.Message().(type) {
		case *actor.Started, *actor.Stopping, *actor.Stopped, *actor.Restarting:
			return
		case *Forward:
			if m.GetResetDue() != nil {
				got.Add(1)
			}
		}
		c.Forward(to)
	}))
	return pid, got
}

// takesIt answers a filed reset handed on: taken (resetTaker).
func takesIt(c actor.Context, _ int32) { c.Respond(&ResetDueTaken{}) }

// fileReset files a daily reset due at 04:00 for the key's session sid, active before the hour,
// as a session that stopped with the store refusing its end and the reset's mark does.
func (w *managerWorld) fileReset(sid string) {
	w.d.resetsDue.Store(w.key, &overdue{sid: sid, reason: persistence.EndDaily, at: at4, activity: before4})
}

// refusingResetWrites has a store refuse a session's reset mark and its end while refusing is
// set: a reset that falls due then is held only in memory (Deps.resetsDue).
func refusingResetWrites(refusing *atomic.Bool) func(persistence.Store) persistence.Store {
	return func(s persistence.Store) persistence.Store {
		return &refusedWrites{Store: s, refuse: func(op persistence.Op) bool {
			switch op.(type) {
			case *persistence.MarkResetDue, *persistence.EndSession:
				return refusing.Load()
			}
			return false
		}}
	}
}

// resetRefusedAcrossTheHour has the daily reset fall due at 04:00 (clock) while m0's turn runs,
// held until release is closed, with the store refusing (refusing, refusingResetWrites) its mark
// as the timer's nudge comes and the session's end once m0 is answered: the reset is filed in
// memory only. Called in a synctest bubble; refusing stays set.
func (w *managerWorld) resetRefusedAcrossTheHour(t *testing.T, clock *atomic.Int64, refusing *atomic.Bool, release chan struct{}) {
	t.Helper()
	refusing.Store(true)
	clock.Store(after4.UnixNano())
	w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}}) // its mark is refused
	synctest.Wait()
	close(release) // its reply is stored after the hour; the session's end is refused
	w.answersTo(t, "m0")
	synctest.Wait()
}
