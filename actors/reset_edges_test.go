package actors

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// gatedAgent answers every message "ok" at once, but the one with message id held only once
// release is closed (or its turn is cancelled).
func gatedAgent(held string, release <-chan struct{}) agents.Agent {
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		if req.Identity.MessageID == held {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return &agents.Response{Text: "re " + req.Identity.MessageID}, nil
	})
}

// dailyClock sets up a world's Deps for a daily reset at 04:00 UTC, on a clock the test sets.
func dailyClock(clock *atomic.Int64) func(*Deps) {
	return resetsBy(clock, ResetPolicy{Mode: ResetDaily, AtHour: 4, Notify: true, Location: time.UTC})
}

var (
	before4 = time.Date(2030, 1, 1, 3, 59, 0, 0, time.UTC) // a message's turn starts
	at4     = time.Date(2030, 1, 1, 4, 0, 0, 0, time.UTC)  // the daily reset falls due
	after4  = time.Date(2030, 1, 1, 4, 1, 0, 0, time.UTC)  // the timer's nudge comes
)

// checkEndedAt4 fails t unless the store holds session sid ended by the daily reset at 04:00.
func (w *managerWorld) checkEndedAt4(t *testing.T, sid, when string) {
	t.Helper()
	s, err := w.store.Session(w.ctx, sid)
	if err != nil {
		t.Fatal(err)
	}
	if s.EndReason != persistence.EndDaily || !s.EndedAt.Equal(at4) {
		t.Errorf("%s, session %s ended %v (%q), want the daily reset at %v", when, sid, s.EndedAt, s.EndReason, at4)
	}
}

// TestResetDueWhileATurnRunsWaitsForIt: the timer's nudge comes while a turn runs across the
// daily hour. The session is not ended under the turn: the turn's reply is stored in it and
// sent; once the turn is done, the session ends at the hour, and the next message begins its
// successor, with the notice.
func TestResetDueWhileATurnRunsWaitsForIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var clock atomic.Int64
		clock.Store(before4.UnixNano())
		w := newManagerWorld(t, gatedAgent("m0", release), dailyClock(&clock))
		m0 := w.deliver(t, "m0", "hello")
		synctest.Wait()
		clock.Store(after4.UnixNano())
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
		synctest.Wait()
		if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || !s.EndedAt.IsZero() {
			t.Fatalf("session %s after the nudge: %+v, %v; want it open while its turn runs", m0.SessionId, s, err)
		}
		close(release)
		if got := w.answersTo(t, "m0"); len(got) != 1 || got[0] != "re m0" {
			t.Errorf("m0 was answered %q, want its reply", got)
		}
		synctest.Wait()
		w.checkEndedAt4(t, m0.SessionId, "once the turn is done")
		msgs, err := w.store.Transcript(w.ctx, m0.SessionId)
		if err != nil || len(msgs) != 2 || msgs[1].Content != "re m0" {
			t.Errorf("the transcript of %s: %+v, %v; want m0 and its reply", m0.SessionId, msgs, err)
		}
		m1 := w.deliver(t, "m1", "hi")
		if n := resetNotices(w.answersTo(t, "m1")); m1.SessionId == m0.SessionId || len(n) != 1 {
			t.Errorf("m1 ran in %s (the reset one %s), with the notices %q; want a new session and one notice", m1.SessionId, m0.SessionId, n)
		}
	})
}

// TestResetDueWhileWritesAreRefusedIsDoneOnceTheyAreTaken: a daily reset that fell due while a
// turn ran is written once the turn is done, and that write is refused (the database and the
// spool failing). Once the store takes writes again, the session ends at the hour all the same.
// Before, the reload from the store that follows a refused write forgot it: the turn's reply
// had moved the session's activity past the hour, so it was not due again until the next day's.
func TestResetDueWhileWritesAreRefusedIsDoneOnceTheyAreTaken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var clock atomic.Int64
		clock.Store(before4.UnixNano())
		out := &downAfterReply{}
		w := newManagerWorldWrites(t, gatedAgent("m0", release), dailyClock(&clock), func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		m0 := w.deliver(t, "m0", "hello")
		synctest.Wait()
		clock.Store(after4.UnixNano())
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
		synctest.Wait()
		out.armed.Store(true)
		close(release) // its reply is stored, and then the store refuses writes
		w.answersTo(t, "m0")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || !s.EndedAt.IsZero() {
			t.Fatalf("session %s during the outage: %+v, %v; want it open (its reset refused)", m0.SessionId, s, err)
		}
		out.Down.Store(false)
		time.Sleep(5 * time.Minute) // the session loads again once writes are taken
		synctest.Wait()
		w.checkEndedAt4(t, m0.SessionId, "once the store takes writes again")
	})
}

// downAfterReply is an outage that begins once a turn's reply is committed (armed).
type downAfterReply struct {
	storetest.Outage
	armed atomic.Bool
}

func (o *downAfterReply) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	errs := o.Outage.Commit(ctx, groups)
	for i, g := range groups {
		for _, op := range g {
			if a, ok := op.(*persistence.AppendMessage); ok && a.Message.Role == persistence.RoleAssistant && errs[i] == nil && o.armed.Load() {
				o.Down.Store(true)
			}
		}
	}
	return errs
}

// TestResetDueWhileTheMemberLeavesIsDoneBeforeTheHandOver: a cluster member leaves while a
// turn runs across the daily hour, and the timer's nudge comes meanwhile. The session finishes
// the turn, ends at the hour, and only then hands its key on. Before, it handed the key on
// with the reset still in memory only: the key's next owner found the session's activity (the
// turn's reply) after the hour, and the session went on until the next day's.
func TestResetDueWhileTheMemberLeavesIsDoneBeforeTheHandOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var clock atomic.Int64
		clock.Store(before4.UnixNano())
		daily := dailyClock(&clock)
		w := newManagerWorld(t, gatedAgent("m0", release), func(d *Deps) {
			daily(d)
			d.Node, d.Fencing, d.Clustered = "a", true, true
		})
		successor := w.system.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
		m0 := w.deliver(t, "m0", "hello")
		synctest.Wait()
		clock.Store(after4.UnixNano())
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return successor }})
		synctest.Wait()
		close(release)
		w.answersTo(t, "m0")
		synctest.Wait()
		act, _ := w.system.Root.RequestFuture(w.manager, &ListActive{}, time.Hour).Result()
		if keys := act.(*ActiveList).Keys; len(keys) != 0 {
			t.Errorf("sessions %v still in memory, want the key handed on", keys)
		}
		w.checkEndedAt4(t, m0.SessionId, "once the leaving member handed the key on")
	})
}

// TestResetNoticeComesOnceBeforeTheFirstReply: after an automatic reset, three messages come
// while the first one's turn runs, in each queue mode. The chat gets the reset notice once, as
// the answer to the first message, before any reply, and one turn (the first that answers)
// gets the continuity note. The note is counted in the replies the chat gets, not in the
// agent's calls: in interrupt mode, m3 may interrupt m2 after m2's agent returned with the
// note and before its result was handled, so m2's reply is discarded and m3's turn, the first
// that answers, gets the note again.
func TestResetNoticeComesOnceBeforeTheFirstReply(t *testing.T) {
	for _, mode := range []string{ModeFollowup, ModeCollect, ModeInterrupt} {
		t.Run(mode, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const withNote = " (noted)" // ends the reply of a turn that got the note
				release := make(chan struct{})
				agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
					if req.Identity.MessageID == "m1" {
						select {
						case <-release:
						case <-ctx.Done():
							return nil, ctx.Err()
						}
					}
					text := "re " + req.Identity.MessageID
					if len(req.Notes) > 0 {
						text += withNote
					}
					return &agents.Response{Text: text}, nil
				})
				idle := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Second, Notify: true}
				w := newManagerWorld(t, agent, func(d *Deps) {
					d.Config.QueueMode = mode
					d.Config.ResetFor = func(string, string) ResetPolicy { return idle }
					d.Config.ResetPolicies = []ResetPolicy{idle}
				})
				w.deliver(t, "m0", "hello")
				w.answersTo(t, "m0")
				time.Sleep(time.Minute) // idle past the policy: m1 begins the successor
				for _, id := range []string{"m1", "m2", "m3"} {
					w.deliver(t, id, id)
				}
				close(release)
				var sent []*SendOutbound
				for len(sent) == 0 || !slices.Contains(sent[len(sent)-1].Out.InReplyTo, "m3") || !sent[len(sent)-1].Out.TurnEnd {
					sent = append(sent, <-w.sent)
				}
				var texts []string
				for _, o := range sent {
					texts = append(texts, o.Out.Text)
				}
				if n := resetNotices(texts); len(n) != 1 || texts[0] != n[0] || !slices.Equal(sent[0].Out.InReplyTo, []string{"m1"}) {
					t.Errorf("the chat was sent %q (the first in reply to %v), want the reset notice once, first, in reply to m1", texts, sent[0].Out.InReplyTo)
				}
				var replies []string
				for _, text := range texts {
					if strings.HasPrefix(text, "re ") {
						replies = append(replies, text)
					}
				}
				var noted []string
				for _, r := range replies {
					if strings.HasSuffix(r, withNote) {
						noted = append(noted, r)
					}
				}
				if len(noted) != 1 || replies[0] != noted[0] {
					t.Errorf("the chat was sent the replies %q, of which %q came of a turn with the continuity note; want one, the first", replies, noted)
				}
			})
		})
	}
}

// blindInbound is a store whose FindInbound fails while blind is set: the duplicate check
// before a command cannot read, so the command's write is what refuses a repeat.
type blindInbound struct {
	persistence.Store
	blind atomic.Bool
}

func (b *blindInbound) FindInbound(ctx context.Context, platform, chatID, messageID string) (*persistence.Message, error) {
	if b.blind.Load() {
		return nil, errors.New("find inbound: store unreachable (test)")
	}
	return b.Store.FindInbound(ctx, platform, chatID, messageID)
}

// TestRepeatedCommandFirstAfterAnAutomaticResetLosesNoNotice: a command (/status) is sent
// again after its session was reset automatically and passivated, while the duplicate check
// cannot read the store: it is the chat's first contact after the reset and begins the
// successor in memory, and its write is refused as a duplicate. The session starts again from
// the store, so the next message begins the successor with the reset notice, the link to the
// session the reset ended and the continuity note. Before, memory kept the successor's begun
// state (no previous session, the note set) though nothing was stored: the next message got
// no notice, its session followed none and its turn got no note.
func TestRepeatedCommandFirstAfterAnAutomaticResetLosesNoNotice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := &notesAgent{notes: map[string][]string{}}
		store := &blindInbound{}
		idle := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Second, Notify: true}
		w := newManagerWorld(t, a, func(d *Deps) {
			d.Config.ResetFor = func(string, string) ResetPolicy { return idle }
			d.Config.ResetPolicies = []ResetPolicy{idle}
			store.Store = d.Store
			d.Store = store
		})
		m0 := w.deliver(t, "m0", "hello")
		w.answersTo(t, "m0")
		w.deliver(t, "s0", "/status")
		w.answersTo(t, "s0")
		time.Sleep(time.Minute) // idle past the policy
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
		synctest.Wait()
		if s, err := w.store.Session(w.ctx, m0.SessionId); err != nil || s.EndReason != persistence.EndIdle {
			t.Fatalf("session %s after the timer's nudge: %+v, %v; want it ended idle", m0.SessionId, s, err)
		}
		act, _ := w.system.Root.RequestFuture(w.manager, &ListActive{}, time.Hour).Result()
		if keys := act.(*ActiveList).Keys; len(keys) != 0 {
			t.Fatalf("sessions %v still in memory after the reset, want the key passivated", keys)
		}
		store.blind.Store(true)
		if r := w.deliver(t, "s0", "/status"); r.Disposition != platforms.Duplicate {
			t.Fatalf("/status sent again as s0: %+v, want disposition duplicate", r)
		}
		store.blind.Store(false)
		m1 := w.deliver(t, "m1", "hi")
		answers := w.answersTo(t, "m1")
		if n := resetNotices(answers); len(n) != 1 || !strings.Contains(n[0], "Send /resume "+m0.SessionId+" ") {
			t.Errorf("m1 was answered %q, want the reset notice offering /resume %s", answers, m0.SessionId)
		}
		if s, err := w.store.Session(w.ctx, m1.SessionId); err != nil || s.PrevSessionID != m0.SessionId {
			t.Errorf("m1's session %s: %+v, %v; want it following %s", m1.SessionId, s, err, m0.SessionId)
		}
		if notes := a.notesOf("m1"); len(notes) != 1 || !strings.Contains(notes[0], m0.SessionId) {
			t.Errorf("m1's turn got the notes %q, want the continuity note naming %s", notes, m0.SessionId)
		}
	})
}

// dueWhileM0Runs delivers m0, whose turn the world's agent holds, and m1 queued behind it; then,
// the store refusing what the test says from now on (refusing, unless nil), it moves clock past
// the daily hour and sends the timer's nudge, and returns m0's answer once the session has
// handled the nudge.
func (w *managerWorld) dueWhileM0Runs(t *testing.T, clock *atomic.Int64, refusing *atomic.Bool) *DeliverResult {
	t.Helper()
	m0 := w.deliver(t, "m0", "slow")
	w.deliver(t, "m1", "queued")
	synctest.Wait()
	if refusing != nil {
		refusing.Store(true)
	}
	clock.Store(after4.UnixNano())
	w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
	synctest.Wait()
	return m0
}
