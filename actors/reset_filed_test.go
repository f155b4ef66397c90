package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// later is when the session is active again, elsewhere, after the daily reset it fell due for
// at 04:00 was refused.
var later = time.Date(2030, 1, 1, 9, 0, 0, 0, time.UTC)

// refusedResetWorld starts a world whose chat's session (after one message, m0, whose turn ran
// across 04:00) had its daily reset refused: the store fails writes from the turn's reply on,
// and the reset is filed for the key's next activation (Deps.resetsDue). The session is out of
// memory, waiting out the pause after a refused write. setup runs after the daily clock's.
// Called in a synctest bubble.
func refusedResetWorld(t *testing.T, setup func(*Deps)) (w *managerWorld, out *downAfterReply, clock *atomic.Int64, sid string) {
	t.Helper()
	release := make(chan struct{})
	clock = &atomic.Int64{}
	clock.Store(before4.UnixNano())
	daily := dailyClock(clock)
	out = &downAfterReply{}
	w = newManagerWorldWrites(t, gatedAgent("m0", release), func(d *Deps) {
		daily(d)
		if setup != nil {
			setup(d)
		}
	}, func(s persistence.Store) persistence.Store {
		out.Store = s
		return out
	})
	m0 := w.deliver(t, "m0", "hello")
	synctest.Wait()
	clock.Store(after4.UnixNano())
	w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
	synctest.Wait()
	out.armed.Store(true)
	close(release) // its reply is stored, and then the store refuses writes, the reset's too
	w.answersTo(t, "m0")
	synctest.Wait()
	if _, ok := w.d.resetsDue.Load(w.key); !ok {
		t.Fatal("no reset filed after the store refused it")
	}
	return w, out, clock, m0.SessionId
}

// activeElsewhere records in the store that session sid was active at later, as another
// cluster member that ran its key meanwhile would, and sets the clock there. That member did
// the reset (its load found it stored on the session: persistence.MarkResetDue), and the
// chat's user went back to the session with /resume and wrote in it.
func activeElsewhere(t *testing.T, w *managerWorld, clock *atomic.Int64, sid string) {
	t.Helper()
	clock.Store(later.UnixNano())
	if errs := w.store.Commit(w.ctx, [][]persistence.Op{
		{&persistence.EndSession{SessionID: sid, Reason: persistence.EndDaily, At: at4}},
		{&persistence.ReopenSession{SessionID: sid}},
		{&persistence.TouchSession{SessionID: sid, At: later}},
	}); errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatal(errs)
	}
}

// checkGoesOn fails t unless session sid is open, with its activity at later.
func (w *managerWorld) checkGoesOn(t *testing.T, sid, when string) {
	t.Helper()
	s, err := w.store.Session(w.ctx, sid)
	if err != nil {
		t.Fatal(err)
	}
	if !s.EndedAt.IsZero() || !s.LastActivityAt.Equal(later) {
		t.Errorf("%s, session %s ended %v (%q), last active %v; want it open, last active %v", when, sid, s.EndedAt, s.EndReason, s.LastActivityAt, later)
	}
}

// TestFiledResetEndsNoSessionActiveSince: a daily reset the store refused is filed for the key's
// next activation, and before that activation the session is active again past the reset's
// due time, as it is when the key moved to another cluster member meanwhile, which did the
// reset, and the user went back to the session there with /resume (the store shows that
// activity). The key's next activation here does not end the session again: it goes on.
// Before, it ended at the old due time, hours before its last activity.
func TestFiledResetEndsNoSessionActiveSince(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, out, clock, sid := refusedResetWorld(t, nil)
		activeElsewhere(t, w, clock, sid)
		out.Down.Store(false)
		time.Sleep(5 * time.Minute) // the session loads again once writes are taken
		synctest.Wait()
		w.checkGoesOn(t, sid, "once the key is activated again")
	})
}

// TestResetFiledForAKeyHandedOnIsDropped: a cluster member's session has its daily reset
// refused and filed for the key's next activation, and the key moves to another member before
// that activation. The member does not keep the filed reset once it handed the key on and the
// other member took the reset (it would stay in memory for ever if the key never came back; it
// goes with the key: the other member here takes it and does nothing with it), and when the key
// comes back after being active on the other member, its session goes on, and the chat's next
// message runs in it, with no reset notice.
func TestResetFiledForAKeyHandedOnIsDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &movingPlacement{}
		w, out, clock, sid := refusedResetWorld(t, asMemberA(p))
		p.self.Store(w.manager)
		other := w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			if f, ok := c.Message().(*Forward); ok && f.GetResetDue() != nil {
				c.Respond(&ResetDueTaken{})
			}
		}))
		p.owner.Store(other) // the key moves while its session waits out the pause
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if _, ok := w.d.resetsDue.Load(w.key); ok {
			t.Error("the reset filed for the key stays after the key was handed on")
		}
		activeElsewhere(t, w, clock, sid)
		out.Down.Store(false)
		p.owner.Store(w.manager) // and comes back
		m1 := w.deliver(t, "m1", "hi")
		if n := resetNotices(w.answersTo(t, "m1")); m1.SessionId != sid || len(n) != 0 {
			t.Errorf("m1 ran in session %s (the key's was %s), with the reset notices %q; want it in the key's session, with none", m1.SessionId, sid, n)
		}
	})
}

// TestResetFiledForAKeyHandedOnIsDoneByItsNewOwner: a cluster member's session has its daily
// reset refused and filed for the key's next activation, and the key moves to another member
// before that activation. The new owner's session does the reset: the session ends at the hour
// once the store takes writes, and the chat's next message, on the new owner, begins its
// successor with the reset notice. Before, the member dropped the filed reset as it handed the
// key on, and the new owner, which found the session's activity (m0's reply) after the hour,
// let it go on until the next day's. The new owner's database may still refuse its claim when
// the reset reaches it: the session, waiting to load, keeps the reset for its load.
func TestResetFiledForAKeyHandedOnIsDoneByItsNewOwner(t *testing.T) {
	for _, tc := range []struct {
		name string
		down bool // the database still refuses writes, the new owner's claim too, when the key moves
	}{{name: "store back first"}, {name: "store down at the move", down: true}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := &movingPlacement{}
				w, out, _, sid := refusedResetWorld(t, asMemberA(p))
				p.self.Store(w.manager)
				claims := &downStore{Store: w.store}
				claims.down.Store(tc.down)
				if !tc.down {
					out.Down.Store(false)
				}
				b := w.memberB(t, claims, &p.owner)
				p.owner.Store(b) // the key moves while its session waits out the pause
				time.Sleep(2 * time.Minute)
				synctest.Wait()
				claims.down.Store(false)
				out.Down.Store(false)
				time.Sleep(5 * time.Minute)
				synctest.Wait()
				w.checkEndedAt4(t, sid, "once the new owner's store takes writes")
				m1, err := w.system.Root.RequestFuture(b, &Routed{Key: w.key, Msg: w.message("m1", "hi")}, time.Hour).Result()
				if err != nil {
					t.Fatal(err)
				}
				r := m1.(*DeliverResult)
				if n := resetNotices(w.answersTo(t, "m1")); r.SessionId == sid || len(n) != 1 {
					t.Errorf("m1 ran in session %s (the reset one %s), with the reset notices %q; want a new session, with one", r.SessionId, sid, n)
				}
			})
		})
	}
}

// TestFiledResetHandedOnIsSentAgainUntilItIsTaken: as in
// TestResetFiledForAKeyHandedOnIsDoneByItsNewOwner, a cluster member's session has its daily
// reset refused (its mark, written as the reset fell due under m0's turn, and its end once the
// turn was done: the store holds it nowhere) and filed for the key's next activation, and the
// key moves to member b before that activation (the store takes writes again by then). The ResetDue that hands the
// reset on to b is lost on the way: it comes back as a dead letter (b's manager unreachable), or
// gets no answer (a cut link). The member keeps the reset, says so once, and sends it again until
// b takes it: b's session ends the session at the hour, and the member keeps no entry of it.
// Before, the member dropped the reset as it sent it, without an answer: b, which found the
// session's activity (m0's reply) after the hour, let the session go on until the next day's.
// When b takes the reset and its answer is lost, the member sends it again; b did the reset, and
// the chat's next message began the session's successor there, which the reset sent again does
// not end.
func TestFiledResetHandedOnIsSentAgainUntilItIsTaken(t *testing.T) {
	for _, lostAs := range []string{"dead letter", "no answer", "answer lost"} {
		t.Run(lostAs, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var refusing atomic.Bool
				w, release, clock, p, logs := memberAAcrossTheHour(t, refusingResetWrites(&refusing))
				m0 := w.deliver(t, "m0", "hello")
				synctest.Wait()
				w.resetRefusedAcrossTheHour(t, clock, &refusing, release)
				if _, ok := w.d.resetsDue.Load(w.key); !ok {
					t.Fatal("no reset filed after the store refused it")
				}
				if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || s.ResetDueReason != "" {
					t.Fatalf("session %s: %+v, %v; want no mark stored", m0.SessionId, s, err)
				}
				sid := m0.SessionId
				refusing.Store(false)
				var bOwner atomic.Pointer[actor.PID]
				b := w.memberB(t, w.store, &bOwner)
				bOwner.Store(b)
				var lose atomic.Bool
				var lost atomic.Int32
				lose.Store(true)
				link := w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) { // b, as a reaches it
					switch m := c.Message().(type) {
					case *actor.Started, *actor.Stopping, *actor.Stopped, *actor.Restarting:
						return
					case *Forward:
						if m.GetResetDue() != nil && lose.Load() {
							lost.Add(1)
							switch lostAs {
							case "dead letter":
								c.Respond(&actor.DeadLetterResponse{Target: b})
							case "answer lost": // b takes it, and its answer is lost
								c.Send(b, m)
							}
							return
						}
					}
					c.Forward(b)
				}))
				p.owner.Store(link) // the key moves while its session waits out the pause
				time.Sleep(2 * time.Minute)
				synctest.Wait()
				if lost.Load() == 0 {
					t.Fatal("no ResetDue was handed on (and lost) with the key")
				}
				if got := linesWith(logs, "did not take the reset filed for it"); len(got) != 1 || !strings.Contains(got[0], "level=WARN") {
					t.Errorf("lines of the lost hand-on: %q; want one WRN line", got)
				}
				var m1 *DeliverResult
				if lostAs == "answer lost" {
					// b did the reset, and a sends it again: the chat's next message begins the
					// session's successor on b, which the reset sent again does not end.
					w.checkEndedAt4(t, sid, "once b took the reset handed on")
					res, err := w.system.Root.RequestFuture(b, &Routed{Key: w.key, Msg: w.message("m1", "hi")}, time.Hour).Result()
					if err != nil {
						t.Fatal(err)
					}
					m1 = res.(*DeliverResult)
					if n := resetNotices(w.answersTo(t, "m1")); m1.SessionId == sid || len(n) != 1 {
						t.Errorf("m1 ran in session %s (the reset one %s), with the reset notices %q; want a new session, with one", m1.SessionId, sid, n)
					}
				}
				lose.Store(false)
				time.Sleep(2 * time.Minute)
				synctest.Wait()
				w.checkEndedAt4(t, sid, "once b took the reset handed on again")
				if _, ok := w.d.resetsDue.Load(w.key); ok {
					t.Error("the reset filed for the key stays after b took it")
				}
				if m1 != nil {
					if s, err := w.store.Session(w.ctx, m1.SessionId); err != nil || !s.EndedAt.IsZero() {
						t.Errorf("m1's session %s once a sent the reset again: %+v, %v; want it open", m1.SessionId, s, err)
					}
				}
			})
		})
	}
}

// TestResetDueWhileTheMemberLeavesWithMessagesWaitingIsDoneByItsSuccessor: a cluster member
// leaves while a turn runs across the daily hour, with a message queued behind it, and the
// timer's nudge comes meanwhile. The session hands its key on once the turn is done, the reset
// waiting for the queued message; the successor runs that message in the session and then
// ends it at the hour, also when its database refused its claim at first (its session waited
// to load). Before, the reset stayed in the leaving member's memory: the successor found the
// session's activity (the messages) after the hour, and it went on until the next day's.
func TestResetDueWhileTheMemberLeavesWithMessagesWaitingIsDoneByItsSuccessor(t *testing.T) {
	for _, down := range []bool{false, true} {
		t.Run(fmt.Sprintf("claim refused=%v", down), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release := make(chan struct{})
				var clock atomic.Int64
				clock.Store(before4.UnixNano())
				p := &movingPlacement{}
				w := newManagerWorld(t, gatedAgent("m0", release), dailyMemberA(&clock, p))
				p.self.Store(w.manager)
				p.owner.Store(w.manager)
				claims := &downStore{Store: w.store}
				claims.down.Store(down)
				b := w.memberB(t, claims, &p.owner)
				m0 := w.deliver(t, "m0", "hello")
				clock.Store(after4.UnixNano())
				if r := w.deliver(t, "m1", "more"); r.Disposition != platforms.Queued {
					t.Fatalf("m1: %+v, want queued", r)
				}
				w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
				w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return b }})
				synctest.Wait()
				p.owner.Store(b)
				close(release)
				w.answersTo(t, "m0")
				synctest.Wait()
				claims.down.Store(false)
				if got := w.answersTo(t, "m1"); len(got) != 1 || got[0] != "re m1" {
					t.Errorf("m1 was answered %q, want its reply", got)
				}
				synctest.Wait()
				w.checkEndedAt4(t, m0.SessionId, "once the successor ran the queued message")
			})
		})
	}
}

// memberB starts the manager of a second cluster member, b, on store and the world's writer,
// agent, platforms and clock, which places keys where owner says and asks a's manager to let go
// of a key it activates.
func (w *managerWorld) memberB(t *testing.T, store persistence.Store, owner *atomic.Pointer[actor.PID]) *actor.PID {
	t.Helper()
	db := &Deps{Ctx: w.ctx, Store: store, Agent: w.d.Agent, Platforms: w.d.Platforms, Log: w.d.Log, Now: w.d.Now,
		Metrics: metrics.New("fake"), Node: "b", Config: w.d.Config, Persist: w.d.Persist, Fencing: true, Clustered: true}
	b := w.system.Root.Spawn(NewSessionManager(db))
	t.Cleanup(func() { _ = w.system.Root.StopFuture(b).Wait() })
	db.Placement = peersPlacement{self: b, peers: []*actor.PID{w.manager}, owner: owner}
	return b
}

// movingPlacement places every key on the manager owner names (on none, this member's, until
// it is set), in a cluster of no other members this one asks: a key moves where the test says.
type movingPlacement struct{ self, owner atomic.Pointer[actor.PID] }

func (p *movingPlacement) Owner(string) *actor.PID { return p.owner.Load() }
func (p *movingPlacement) Peers() []*actor.PID     { return nil }
func (p *movingPlacement) Self() *actor.PID        { return p.self.Load() }
func (p *movingPlacement) Holders(context.Context, []string) (map[string]Holder, error) {
	return nil, nil
}

// TestResetDueWhoseMarkWasRefusedOutlivesALostHandOver: a cluster member leaves while a turn runs
// across the daily hour, with a message queued behind it; the timer's nudge comes meanwhile, and
// the store refuses the reset's mark (persistence.MarkResetDue: the database and the spool both
// failing) and then takes writes again. The session hands its key on once the turn is done, and
// the ResetDue that carries the filed reset to the successor is lost on the way (a one-link
// partition, a dead letter); the Recover gets through. The successor runs the queued message in
// the session and then ends it at the hour: the leaving session wrote the mark again before it
// handed the key on. Before, it handed the key on at once, its in-memory copy of the reset went
// with the ResetDue, the successor found the session's activity (the messages) after the hour,
// and the session went on until the next day's reset. A store that still refuses the mark does
// not hold the hand-over up: the session hands the key on after that one more try, and the
// successor does the reset the ResetDue brings it.
func TestResetDueWhoseMarkWasRefusedOutlivesALostHandOver(t *testing.T) {
	for _, stillRefused := range []bool{false, true} {
		t.Run(fmt.Sprintf("mark still refused=%v", stillRefused), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var refusing atomic.Bool
				w, release, clock, p, _ := memberAAcrossTheHour(t, func(s persistence.Store) persistence.Store {
					return &refusedWrites{Store: s, refuse: func(op persistence.Op) bool {
						_, ok := op.(*persistence.MarkResetDue)
						return ok && refusing.Load()
					}}
				})
				var lose atomic.Bool
				var lost atomic.Int32
				var b *actor.PID
				link := lossyLink(w.system, &b, &lose, &lost) // b, as a reaches it
				b = w.memberB(t, w.store, &p.owner)
				m0 := w.refuseTheMarkAcrossTheHour(t, &refusing, clock, nil)
				// The outage ends before the mark is written again, and the ResetDue is lost; or
				// the outage goes on, and the ResetDue gets through.
				refusing.Store(stillRefused)
				lose.Store(!stillRefused)
				w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return link }})
				synctest.Wait()
				p.owner.Store(b)
				close(release)
				w.answersTo(t, "m0")
				if got := w.answersTo(t, "m1"); len(got) != 1 || got[0] != "re m1" {
					t.Errorf("m1 was answered %q, want its reply", got)
				}
				synctest.Wait()
				if !stillRefused && lost.Load() == 0 {
					t.Error("no ResetDue was handed on (and lost) with the key")
				}
				w.checkEndedAt4(t, m0.SessionId, "once the successor ran the queued message")
			})
		})
	}
}

// TestLeavingSessionsMarkOutageLineSaysTheKeysNextOwnerWritesIt: a cluster member leaves while a
// turn runs across the daily hour, with a message queued behind it, and the store refuses the
// reset's mark as unavailable throughout: first while the session leaves already, or before the
// member begins to leave. The session hands its key on with the reset once the turn is done, and
// the successor runs the queued message and ends the session at the hour. A mark refused while
// the session leaves says so in one line: the session hands the reset on with its key, and the
// key's next owner writes it. Before, that line said the session wrote it again until the store
// took it, though it stops at the hand-over. One refused before the member began to leave has the
// outage's usual line, and the line of the hand-over when the mark is refused again just before.
// With nothing queued behind the turn, the session does the reset itself once the turn is done,
// and then hands the key on, without it: the line says that too. Before, it said only that the
// key's next owner did the reset.
func TestLeavingSessionsMarkOutageLineSaysTheKeysNextOwnerWritesIt(t *testing.T) {
	const usual = "it is written again until the store takes it"
	for _, tc := range []struct {
		name        string
		leavesFirst bool // the member begins to leave before the mark's first refusal
		queued      bool // m1 waits behind m0's turn
		lines       []string
		says        string // what the line of the leaving session says, of who does the reset
	}{
		{"refused while leaving", true, true, []string{leavingMarkRefusedLine}, "the key's next owner writes it and does the reset"},
		{"refused before leaving", false, true, []string{usual, leavingMarkRefusedLine}, "the key's next owner writes it and does the reset"},
		{"refused while leaving, nothing queued", true, false, []string{leavingMarkRefusedLine}, "the session does the reset once its work is done"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var refusing atomic.Bool
				w, release, clock, p, logs := memberAAcrossTheHour(t, func(s persistence.Store) persistence.Store {
					return &refusedWrites{Store: s, refuse: func(op persistence.Op) bool {
						_, ok := op.(*persistence.MarkResetDue)
						return ok && refusing.Load()
					}}
				})
				b := w.memberB(t, w.store, &p.owner)
				leave := func() {
					w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return b }})
					synctest.Wait()
				}
				var m0 *DeliverResult
				switch {
				case !tc.queued:
					m0 = w.deliver(t, "m0", "hello")
					synctest.Wait()
					leave()
					refusing.Store(true)
					clock.Store(after4.UnixNano())
					w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
					synctest.Wait()
				case tc.leavesFirst:
					m0 = w.refuseTheMarkAcrossTheHour(t, &refusing, clock, leave)
				default:
					m0 = w.refuseTheMarkAcrossTheHour(t, &refusing, clock, nil)
					leave()
				}
				p.owner.Store(b)
				close(release)
				w.answersTo(t, "m0")
				if !tc.queued {
					synctest.Wait()
					w.checkEndedAt4(t, m0.SessionId, "once m0's turn was done")
					// Member a did it: the reset's line comes before that of the hand-over.
					all := logs.String()
					reset, handedOn := strings.Index(all, `msg="session reset"`), strings.Index(all, `msg="the session hands its key on to another member"`)
					if reset < 0 || handedOn < 0 || reset > handedOn {
						t.Errorf("the reset's line at %d, the hand-over's at %d; want the reset done before the hand-over", reset, handedOn)
					}
				} else {
					if got := w.answersTo(t, "m1"); len(got) != 1 || got[0] != "re m1" {
						t.Errorf("m1 was answered %q, want its reply", got)
					}
					synctest.Wait()
					w.checkEndedAt4(t, m0.SessionId, "once the successor ran the queued message")
				}
				got := linesWith(logs, `msg="store the session's due reset; `)
				ok := len(got) >= len(tc.lines)
				for i, l := range tc.lines {
					ok = ok && strings.Contains(got[i], l) && strings.Contains(got[i], "level=WARN")
				}
				ok = ok && strings.Contains(got[len(tc.lines)-1], tc.says)
				// (A line after those is member b's, whose own write of the mark is refused.)
				if !ok {
					t.Errorf("lines of the reset's mark: %q; want first the WRN lines %q (member a's), the last saying %q", got, tc.lines, tc.says)
				}
			})
		})
	}
}

// refuseTheMarkAcrossTheHour runs m0 (its agent held) before the daily hour, then (after
// first, when it is not nil) after it queues m1 behind it and nudges the session with the store
// refusing the reset's mark (refusing set): the reset falls due while the session works, and no
// mark is stored. It returns m0's answer.
func (w *managerWorld) refuseTheMarkAcrossTheHour(t *testing.T, refusing *atomic.Bool, clock *atomic.Int64, first func()) *DeliverResult {
	t.Helper()
	m0 := w.deliver(t, "m0", "hello")
	synctest.Wait()
	if first != nil {
		first()
	}
	refusing.Store(true)
	clock.Store(after4.UnixNano())
	if r := w.deliver(t, "m1", "more"); r.Disposition != platforms.Queued {
		t.Fatalf("m1: %+v, want queued", r)
	}
	w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
	synctest.Wait()
	if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || s.ResetDueReason != "" {
		t.Fatalf("session %s with its mark refused: %+v, %v; want no mark stored yet", m0.SessionId, s, err)
	}
	return m0
}

// asMemberA sets a world's Deps up as cluster member "a", fenced, placing keys by p.
func asMemberA(p Placement) func(*Deps) {
	return func(d *Deps) { d.Node, d.Fencing, d.Clustered, d.Placement = "a", true, true, p }
}

// dailyMemberA is asMemberA with a daily reset at 04:00 UTC on a clock the test sets (dailyClock).
func dailyMemberA(clock *atomic.Int64, p Placement) func(*Deps) {
	daily, member := dailyClock(clock), asMemberA(p)
	return func(d *Deps) { daily(d); member(d) }
}

// memberAAcrossTheHour starts the world of the tests of a reset that falls due at 04:00 while
// the session works on member a (w.manager), which places the key on itself (p): its clock
// just before the hour, its agent's "m0" held until release is closed, its log in logs, its
// store wrapped by writes.
func memberAAcrossTheHour(t *testing.T, writes func(persistence.Store) persistence.Store) (w *managerWorld, release chan struct{}, clock *atomic.Int64, p *movingPlacement, logs *testutil.Buffer) {
	release, clock, p, logs = make(chan struct{}), new(atomic.Int64), &movingPlacement{}, new(testutil.Buffer)
	clock.Store(before4.UnixNano())
	w = newManagerWorldWrites(t, gatedAgent("m0", release), loggedTo(logs, dailyMemberA(clock, p)), writes)
	p.self.Store(w.manager)
	p.owner.Store(w.manager)
	return w, release, clock, p, logs
}

// lossyLink stands for member b's manager as member a reaches it: it passes everything on to b,
// sender and all, except, while lose is set, a forwarded ResetDue (a filed reset handed on with
// a key), which is lost on the way; lost counts those.
func lossyLink(system *actor.ActorSystem, b **actor.PID, lose *atomic.Bool, lost *atomic.Int32) *actor.PID {
	return system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch m := c.Message().(type) {
		case *actor.Started, *actor.Stopping, *actor.Stopped, *actor.Restarting:
			return
		case *Forward:
			if _, ok := m.Msg.(*Forward_ResetDue); ok && lose.Load() {
				lost.Add(1)
				return
			}
		}
		c.Forward(*b)
	}))
}

// TestResetDueOfALeavingSessionFencedAtItsMarkIsHandedOn: as in
// TestResetDueWhoseMarkWasRefusedOutlivesALostHandOver, a member leaves while a turn runs across
// the daily hour with a message queued, and the store refused the reset's mark meanwhile. The
// leaving session writes the mark once more before it hands the key on, and another activation
// claims the key just before that write (member b's, during a change of membership): the write
// is fenced. The session hands the key on with the reset filed, and b runs the queued message in
// the session (its Recover stands for b's own activation) and then ends it at the hour, once.
// Before, a fenced session filed nothing, b loaded no mark, found the session's activity past the
// hour, and the session went on until the next day's reset. The fenced mark's line says the
// reset goes with the key; until the forty-ninth session it said this session would do it once
// its work was done.
func TestResetDueOfALeavingSessionFencedAtItsMarkIsHandedOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var refusing, claimAtMark atomic.Bool
		var fenced atomic.Int32
		w, release, clock, p, logs := memberAAcrossTheHour(t, func(s persistence.Store) persistence.Store {
			return &claimedAtMark{refusedWrites: refusedWrites{Store: s, refuse: func(op persistence.Op) bool {
				_, ok := op.(*persistence.MarkResetDue)
				return ok && refusing.Load()
			}}, armed: &claimAtMark, fenced: &fenced}
		})
		b := w.memberB(t, w.store, &p.owner)
		m0 := w.refuseTheMarkAcrossTheHour(t, &refusing, clock, nil)
		refusing.Store(false)
		claimAtMark.Store(true)
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return b }})
		synctest.Wait()
		p.owner.Store(b)
		close(release)
		w.answersTo(t, "m0")
		synctest.Wait()
		if fenced.Load() != 1 {
			t.Fatalf("%d marks written at the leave were fenced, want 1", fenced.Load())
		}
		checkFencedMarkLine(t, logs, "another activation claimed the key, and the reset goes with the key to its next owner")
		w.system.Root.Send(b, &Routed{Key: w.key, Msg: &Recover{}})
		if got := w.answersTo(t, "m1"); len(got) != 1 || got[0] != "re m1" {
			t.Errorf("m1 was answered %q, want its reply", got)
		}
		synctest.Wait()
		w.checkEndedAt4(t, m0.SessionId, "once the successor ran the queued message")
		select {
		case m := <-w.sent:
			if slices.Contains(m.Out.InReplyTo, "m1") {
				t.Errorf("m1 answered again: %q", m.Out.Text)
			}
		default:
		}
	})
}

// TestResetMarkFencedWhileTheSessionWorksSaysTheClaimerDecides: a turn runs across the daily
// hour, and another activation claims the key (member b's,
// during a change of membership) just before the session writes the reset's mark at the
// timer's nudge: the write is fenced. This activation does nothing more and files nothing (it is
// not leaving): the line says the activation that claimed the key does the reset only if the
// session's activity it loaded says it is due. Until the forty-ninth session it said this
// session would do it once its work was done.
func TestResetMarkFencedWhileTheSessionWorksSaysTheClaimerDecides(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var claimAtMark atomic.Bool
		var fenced atomic.Int32
		w, release, clock, _, logs := memberAAcrossTheHour(t, func(s persistence.Store) persistence.Store {
			return &claimedAtMark{refusedWrites: refusedWrites{Store: s, refuse: func(persistence.Op) bool { return false }},
				armed: &claimAtMark, fenced: &fenced}
		})
		defer close(release)
		w.deliver(t, "m0", "hello")
		synctest.Wait()
		clock.Store(after4.UnixNano())
		claimAtMark.Store(true)
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
		synctest.Wait()
		if fenced.Load() != 1 {
			t.Fatalf("%d marks written at the nudge were fenced, want 1", fenced.Load())
		}
		checkFencedMarkLine(t, logs, "another activation claimed the key, and does the reset only if the session's activity it loaded says it is due")
	})
}

// TestResetMarkGivenUpAtARestartFromTheStoreSaysTheSessionDoesIt: a turn runs across the daily
// hour with a message queued behind it, and the timer's nudge comes meanwhile; the store refuses
// the reset's mark as unavailable, and then the turn's result, which the session holds while the
// queued message's turn runs. The mark, written again, waits behind that result. The store then refuses the result for what it holds (not an outage), and the session
// starts again from the store, giving up the mark it held (errHandedOver) and filing the reset
// for its next activation. No other activation claimed the key: the mark's line says the session
// starts again from the store and does the reset, and the next activation runs the messages
// again and ends the session at the hour. Until the forty-ninth session's review the line said
// another activation claimed the key and did the reset only if the activity it loaded said it
// was due.
func TestResetMarkGivenUpAtARestartFromTheStoreSaysTheSessionDoesIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release0, release1 := make(chan struct{}), make(chan struct{})
		var clock atomic.Int64
		clock.Store(before4.UnixNano())
		var refusing atomic.Bool
		var logs testutil.Buffer
		store := &brokenOnce{broken: func(op persistence.Op) bool {
			o, ok := op.(*persistence.AddOutbox)
			return ok && o.Entry.Kind == platforms.KindReply
		}}
		w := newManagerWorldWrites(t, twoGates(release0, release1), loggedTo(&logs, dailyClock(&clock)), func(s persistence.Store) persistence.Store {
			store.refusedWrites = refusedWrites{Store: s, refuse: func(op persistence.Op) bool {
				switch o := op.(type) {
				case *persistence.MarkResetDue:
					return refusing.Load()
				case *persistence.AddOutbox:
					return refusing.Load() && o.Entry.Kind == platforms.KindReply
				}
				return false
			}}
			return store
		})
		m0 := w.dueWhileM0Runs(t, &clock, &refusing) // the mark is refused, and written again in a second
		close(release0)
		synctest.Wait() // m0's result is refused: the session holds it, and m1's turn runs
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait() // the mark, written again, waits behind the result
		// The outage ends, and the store refuses the held result for what it holds.
		store.armed.Store(true)
		refusing.Store(false)
		close(release1)
		time.Sleep(time.Minute) // the session starts again from the store, and runs m0 and m1 again
		synctest.Wait()
		if store.armed.Load() {
			t.Fatal("the held result was not written again")
		}
		got := linesWith(&logs, `msg="store the session's due reset; `)
		if len(got) != 2 || !strings.Contains(got[0], "it is written again until the store takes it") ||
			!strings.Contains(got[1], `msg="store the session's due reset; the session starts again from the store, and does the reset once its work is done"`) ||
			!strings.Contains(got[1], "level=WARN") {
			t.Errorf("lines of the reset's mark: %q; want the outage's, then one WRN line that says the session starts again from the store and does it", got)
		}
		if got := append(linesWith(&logs, "another activation claimed the key"), linesWith(&logs, "claimed by a newer activation")...); len(got) > 0 {
			t.Errorf("a line says another activation claimed the key: %q", got)
		}
		if got := w.answersTo(t, "m1"); len(got) == 0 || got[len(got)-1] != "re m1" {
			t.Errorf("m1 was answered %q; want its reply", got)
		}
		w.checkEndedAt4(t, m0.SessionId, "once m0 and m1 ran again after the restart from the store")
	})
}

// brokenOnce is refusedWrites, and while armed is set, fails the first group that holds a write
// broken picks with an error other than an outage's (the database refusing what it holds).
type brokenOnce struct {
	refusedWrites
	broken func(persistence.Op) bool
	armed  atomic.Bool
}

func (b *brokenOnce) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	for i, g := range groups {
		if slices.ContainsFunc(g, b.broken) && b.armed.CompareAndSwap(true, false) {
			rest := slices.Delete(slices.Clone(groups), i, i+1)
			errs := slices.Insert(b.refusedWrites.Commit(ctx, rest), i, error(errors.New("constraint failed (test)")))
			return errs
		}
	}
	return b.refusedWrites.Commit(ctx, groups)
}

// loggedTo is setup that also logs, at Debug, to logs.
func loggedTo(logs *testutil.Buffer, setup func(*Deps)) func(*Deps) {
	return func(d *Deps) {
		setup(d)
		d.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
}

// checkFencedMarkLine fails t unless logs hold one WRN line of a reset's mark whose write was
// fenced, and it says what ends the message, and no line says the session does the reset once its
// work is done unless agentgate stops first (the wording of a mark refused for what it holds).
func checkFencedMarkLine(t *testing.T, logs *testutil.Buffer, says string) {
	t.Helper()
	got := linesWith(logs, `msg="store the session's due reset; another activation claimed the key`)
	if len(got) != 1 || !strings.Contains(got[0], "level=WARN") || !strings.Contains(got[0], says+`"`) {
		t.Errorf("lines of the fenced mark: %q; want one WRN line that says %q", got, says)
	}
	if got := linesWith(logs, "unless agentgate stops first"); len(got) > 0 {
		t.Errorf("a line says the fenced session does the reset: %q", got)
	}
}

// claimedAtMark is refusedWrites, and while armed is set, claims the session's key for member b
// (Store.Claim) just before the first group that writes a reset's mark (MarkResetDue) commits:
// that group, fenced by the claim, fails. fenced counts those groups.
type claimedAtMark struct {
	refusedWrites
	armed  *atomic.Bool
	fenced *atomic.Int32
}

func (r *claimedAtMark) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	mark := -1
	for i, g := range groups {
		if slices.ContainsFunc(g, func(op persistence.Op) bool { _, ok := op.(*persistence.MarkResetDue); return ok }) {
			mark = i
		}
	}
	if mark >= 0 && r.armed.CompareAndSwap(true, false) {
		for _, op := range groups[mark] {
			if f, ok := op.(*persistence.Fence); ok {
				if _, err := r.Store.Claim(ctx, f.Key, "b", time.Now(), nil); err != nil {
					panic(err)
				}
			}
		}
	}
	errs := r.refusedWrites.Commit(ctx, groups)
	if mark >= 0 && errors.Is(errs[mark], persistence.ErrFenced) {
		r.fenced.Add(1)
	}
	return errs
}

// TestFiledResetHandedToTheMemberThatAskedForTheKeyIsNotSentBack: a turn runs across the daily
// hour on member a with a message queued behind it, and the timer's nudge comes meanwhile. The
// key moves to member b, whose activation (for the chat's next message) asks a to let go: a's
// session holds the key, so b forwards what it gets for the key to a (its holder) meanwhile. Once
// the turn is done, a's session hands its key on to b with the reset filed, and a lets go. The
// ResetDue that carries the reset was sent to b before a said it let go, while b still took a for
// the key's holder: b forwarded it back to a, where it came past its last hop, and a activated
// the key again for it, beside b (its session claimed the key, and ran the messages b ran). Now
// a lets go first: b's session runs the messages once and ends the session at the hour, and a
// holds no session of the key.
func TestFiledResetHandedToTheMemberThatAskedForTheKeyIsNotSentBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var clock atomic.Int64
		clock.Store(before4.UnixNano())
		p := &movingPlacement{}
		var mu sync.Mutex
		runs := map[string]int{}
		gated := gatedAgent("m0", release)
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			mu.Lock()
			runs[req.Identity.MessageID]++
			mu.Unlock()
			return gated.Run(ctx, req)
		})
		w := newManagerWorld(t, agent, dailyMemberA(&clock, p))
		p.self.Store(w.manager)
		p.owner.Store(w.manager)
		b := w.memberB(t, w.store, &p.owner)
		m0 := w.deliver(t, "m0", "hello")
		synctest.Wait()
		clock.Store(after4.UnixNano())
		if r := w.deliver(t, "m1", "more"); r.Disposition != platforms.Queued {
			t.Fatalf("m1: %+v, want queued", r)
		}
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
		synctest.Wait()
		p.owner.Store(b) // the key moves to b
		m2 := w.system.Root.RequestFuture(b, &Routed{Key: w.key, Msg: w.message("m2", "again")}, time.Hour)
		synctest.Wait() // b waits for a to let go of the key, and forwards m2 to it
		close(release)
		if _, err := m2.Result(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		w.checkEndedAt4(t, m0.SessionId, "once b ran the queued messages")
		act, _ := w.system.Root.RequestFuture(w.manager, &ListActive{}, time.Hour).Result()
		if keys := act.(*ActiveList).Keys; len(keys) > 0 {
			t.Errorf("member a holds the sessions %q after it handed the key on", keys)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, id := range []string{"m0", "m1", "m2"} {
			if runs[id] != 1 {
				t.Errorf("%s ran %d times, want once (all runs: %v)", id, runs[id], runs)
			}
		}
	})
}
