package actors

import (
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
)

// TestOperatorResetOfAFreshSessionKeepsIt: an operator's reset (the admin API, agentgate
// sessions reset) of a session nothing was said in yet, the one the last reset began, is
// answered with that session, which stays open: the key keeps one new session, in the same
// activation and in the next. Before, every reset ended the empty session and began another,
// and resetting a key twice left a chain of empty sessions.
func TestOperatorResetOfAFreshSessionKeepsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newManagerWorld(t, echo.New(), nil)
		m1 := w.deliver(t, "m1", "hello")
		w.awaitTurnEnds(1)
		first := w.reset(t, &ResetSession{})
		if first.PreviousSessionId != m1.SessionId {
			t.Fatalf("reset = %+v, want the end of %s", first, m1.SessionId)
		}
		for _, when := range []string{"at once", "in the next activation"} {
			if when != "at once" {
				time.Sleep(2 * time.Hour) // the session passivates: the reset activates it from the store
				synctest.Wait()
			}
			if got := w.reset(t, &ResetSession{}); got.SessionId != first.SessionId || got.PreviousSessionId != m1.SessionId {
				t.Errorf("a second reset %s = %+v, want session %s kept (following %s)", when, got, first.SessionId, m1.SessionId)
			}
		}
		if n := w.sessionCount(t); n != 2 {
			t.Errorf("the key has %d sessions after resetting it three times, want 2", n)
		}
		if s, err := w.store.Session(w.ctx, first.SessionId); err != nil || !s.EndedAt.IsZero() {
			t.Errorf("the fresh session after the second reset: %+v, %v; want it open", s, err)
		}
	})
}

// TestNewInAFreshSessionKeepsIt: /new (or /reset) in a session nothing was said in yet tells
// the user so and keeps it: typing /new twice starts one session, not two; after a message it
// starts a new one again. With history_limit 0 (no transcript buffer in memory) the session's
// stored messages still count. Before, each /new ended the empty session and began another.
func TestNewInAFreshSessionKeepsIt(t *testing.T) {
	for _, tt := range []struct {
		name         string
		historyLimit int
	}{
		{"with a transcript buffer", 50},
		{"history_limit 0", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newManagerWorld(t, echo.New(), func(d *Deps) { d.Config.HistoryLimit = tt.historyLimit })
				m1 := w.deliver(t, "m1", "hello")
				w.awaitTurnEnds(1)
				n1, answer := w.command(t, "n1", "/new")
				if n1.SessionId == m1.SessionId || !strings.HasPrefix(answer, "✨ Started a new session ("+n1.SessionId+").") {
					t.Fatalf("/new after a message: %s, answered %q; want a new session", n1.SessionId, answer)
				}
				n2, answer := w.command(t, "n2", "/new")
				want := "✨ This session (" + n1.SessionId + ") is new already"
				if n2.SessionId != n1.SessionId || !strings.HasPrefix(answer, want) {
					t.Errorf("a second /new: session %s, answered %q; want %s kept, answered %q…", n2.SessionId, answer, n1.SessionId, want)
				}
				time.Sleep(2 * time.Hour) // the session passivates: the next command loads it from the store
				synctest.Wait()
				if n3, answer := w.command(t, "n3", "/reset"); n3.SessionId != n1.SessionId || !strings.HasPrefix(answer, want) {
					t.Errorf("/reset in the next activation: session %s, answered %q; want %s kept, answered %q…", n3.SessionId, answer, n1.SessionId, want)
				}
				if n := w.sessionCount(t); n != 2 {
					t.Errorf("the key has %d sessions after /new, /new, /reset, want 2", n)
				}
				if m2 := w.deliver(t, "m2", "hi"); m2.SessionId != n1.SessionId {
					t.Errorf("m2 went to session %s, want the fresh %s", m2.SessionId, n1.SessionId)
				}
				w.awaitTurnEnds(1)
				if n4, answer := w.command(t, "n4", "/new"); n4.SessionId == n1.SessionId || !strings.HasPrefix(answer, "✨ Started a new session") {
					t.Errorf("/new after m2: session %s, answered %q; want a new session after %s", n4.SessionId, answer, n1.SessionId)
				}
				if s, err := w.store.Session(w.ctx, n1.SessionId); err != nil || s.EndedAt.IsZero() {
					t.Errorf("the session m2 was said in, after /new: %+v, %v; want it ended", s, err)
				}
			})
		})
	}
}

// TestResetsWhileSpoolingKeepTheSessionTheyBegan: while writes wait in the spool (the store
// does not show them, so it cannot say what a session holds), a session a reset began in this
// activation is fresh until something but a command is said in it, as when the store takes the
// writes: a second /new, an operator's reset after it, and another after a /status keep it; a
// message then makes the next /new begin another. Before, every reset while spooling ended the
// empty session the last one began and began another: a chain of empty sessions.
func TestResetsWhileSpoolingKeepTheSessionTheyBegan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newManagerWorld(t, echo.New(), nil)
		m1 := w.deliver(t, "m1", "hello")
		w.awaitTurnEnds(1)
		w.d.Spooling.Store(true) // (the flag alone: fresh reads it; the store still takes the writes)
		n1, _ := w.command(t, "n1", "/new")
		if n1.SessionId == m1.SessionId {
			t.Fatalf("/new after a message stayed in session %s", n1.SessionId)
		}
		want := "✨ This session (" + n1.SessionId + ") is new already"
		if n2, answer := w.command(t, "n2", "/new"); n2.SessionId != n1.SessionId || !strings.HasPrefix(answer, want) {
			t.Errorf("a second /new while spooling: session %s, answered %q; want %s kept, answered %q…", n2.SessionId, answer, n1.SessionId, want)
		}
		if got := w.reset(t, &ResetSession{}); got.SessionId != n1.SessionId || !got.Kept {
			t.Errorf("an operator's reset after them while spooling = %+v, want %s kept", got, n1.SessionId)
		}
		w.command(t, "s1", "/status")
		if got := w.reset(t, &ResetSession{}); got.SessionId != n1.SessionId || !got.Kept {
			t.Errorf("an operator's reset after /status while spooling = %+v, want %s kept", got, n1.SessionId)
		}
		if m2 := w.deliver(t, "m2", "hi"); m2.SessionId != n1.SessionId {
			t.Errorf("m2 went to session %s, want the fresh %s", m2.SessionId, n1.SessionId)
		}
		w.awaitTurnEnds(1)
		if n3, answer := w.command(t, "n3", "/new"); n3.SessionId == n1.SessionId || !strings.HasPrefix(answer, "✨ Started a new session") {
			t.Errorf("/new after m2 while spooling: session %s, answered %q; want a new session after %s", n3.SessionId, answer, n1.SessionId)
		}
		if n := w.sessionCount(t); n != 3 {
			t.Errorf("the key has %d sessions, want 3: m1's, the one /new began and the resets kept, m2's successor", n)
		}
	})
}

// TestStatusOnANewChat: /status as a new chat's first message names the session the command
// began, the one its answer's session_id names and the chat's next message goes to, and shows
// the reset policy, as /help says it does. Before, it said "Session (none yet)" and had no
// reset policy line.
func TestStatusOnANewChat(t *testing.T) {
	start := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name   string
		policy ResetPolicy
		want   string
	}{
		{"no reset policy", ResetPolicy{Mode: ResetNone}, "Reset policy: none (only /new or /reset end this session)"},
		{"idle", ResetPolicy{Mode: ResetIdle, Idle: time.Hour, Location: time.UTC}, "Reset policy: idle; next reset 2030-01-01T13:00:00Z"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newManagerWorld(t, echo.New(), func(d *Deps) {
					d.Now = func() time.Time { return start }
					d.Config.ResetFor = func(string, string) ResetPolicy { return tt.policy }
				})
				r := w.deliver(t, "s1", "/status")
				if r.ErrorCode != "" || r.SessionId == "" {
					t.Fatalf("/status: %+v", r)
				}
				got := w.noticeFor(t, "s1")
				if !strings.HasPrefix(got, "Session "+r.SessionId+"\n") || !strings.HasSuffix(got, "\n"+tt.want) {
					t.Errorf("/status on a new chat answered %q (session_id %s), want it to name that session and end %q", got, r.SessionId, tt.want)
				}
				if m1 := w.deliver(t, "m1", "hello"); m1.SessionId != r.SessionId {
					t.Errorf("the next message went to session %s, not %s, which /status named", m1.SessionId, r.SessionId)
				}
			})
		})
	}
}

// TestNewBehindANewInFlightKeepsItsSession: a second /new (or /reset) that reaches the session
// while the first one's write is still in flight asks for what is already happening: it is
// answered that the session the first began is new already, and the key gets one new session,
// not two. A message between the two makes that session not fresh: the second /new starts
// another. An operator's reset right behind another is kept the same way. Before, the write in
// flight made the session count as not fresh, and the second /new ended the empty session the
// first had just begun: the chain got a session with no message whose successor began at once.
func TestNewBehindANewInFlightKeepsItsSession(t *testing.T) {
	for _, tt := range []struct {
		name         string
		historyLimit int
	}{
		{"with a transcript buffer", 50},
		{"history_limit 0", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w, g, _ := newGatedWorld(t, echo.New(), func(d *Deps) { d.Config.HistoryLimit = tt.historyLimit }, nil)
				// inFlight sends texts one after the other while the first one's write waits at
				// the store's gate, then opens the gate and returns the answers in order.
				inFlight := func(texts ...[2]string) []*DeliverResult {
					t.Helper()
					g.armed.Store(true)
					g.open = make(chan struct{})
					fs := []*actor.Future{w.request(texts[0][0], texts[0][1])}
					<-g.waiting // the first write is in flight
					g.armed.Store(false)
					for _, m := range texts[1:] {
						fs = append(fs, w.request(m[0], m[1]))
						synctest.Wait() // taken by the session before the next
					}
					close(g.open)
					var rs []*DeliverResult
					for i, f := range fs {
						res, err := f.Result()
						if err != nil {
							t.Fatalf("%s: %v", texts[i][0], err)
						}
						rs = append(rs, res.(*DeliverResult))
					}
					synctest.Wait()
					return rs
				}
				m1 := w.deliver(t, "m1", "hello")
				w.awaitTurnEnds(1)
				synctest.Wait()

				rs := inFlight([2]string{"n1", "/new"}, [2]string{"n2", "/new"})
				n1, n2 := rs[0], rs[1]
				if n1.Disposition != platforms.Command || n1.SessionId == m1.SessionId {
					t.Fatalf("/new after m1: %+v, want a new session after %s", n1, m1.SessionId)
				}
				if a := w.noticeFor(t, "n1"); !strings.HasPrefix(a, "✨ Started a new session ("+n1.SessionId+").") {
					t.Errorf("the first /new answered %q, want a new session %s", a, n1.SessionId)
				}
				want := "✨ This session (" + n1.SessionId + ") is new already"
				if a := w.noticeFor(t, "n2"); n2.Disposition != platforms.Command || n2.SessionId != n1.SessionId || !strings.HasPrefix(a, want) {
					t.Errorf("a /new behind the first's write: %+v, answered %q; want %s kept, answered %q…", n2, a, n1.SessionId, want)
				}
				if n := w.sessionCount(t); n != 2 {
					t.Errorf("the key has %d sessions after m1, /new, /new, want 2", n)
				}
				if route, err := w.store.Route(w.ctx, w.key); err != nil || route.SessionID != n1.SessionId {
					t.Errorf("the key routes to %+v (%v), want %s", route, err, n1.SessionId)
				}
				if s, err := w.store.Session(w.ctx, n1.SessionId); err != nil || !s.EndedAt.IsZero() {
					t.Errorf("the session the first /new began: %+v, %v; want it open", s, err)
				}

				// A message between two /new: it is said in the session the first began, and the
				// second ends that session.
				w.deliver(t, "m1b", "said in the session n1 began")
				w.awaitTurnEnds(1)
				synctest.Wait()
				rs = inFlight([2]string{"r1", "/reset"}, [2]string{"m2", "hi"}, [2]string{"r2", "/reset"})
				r1, m2, r2 := rs[0], rs[1], rs[2]
				if r1.SessionId == n1.SessionId || m2.SessionId != r1.SessionId {
					t.Fatalf("/reset then m2: %+v, %+v; want m2 in the session the reset began after %s", r1, m2, n1.SessionId)
				}
				if a := w.noticeFor(t, "r2"); r2.SessionId == r1.SessionId || !strings.HasPrefix(a, "✨ Started a new session ("+r2.SessionId+").") {
					t.Errorf("/reset behind m2: %+v, answered %q; want a new session after %s", r2, a, r1.SessionId)
				}
				if s, err := w.store.Session(w.ctx, r1.SessionId); err != nil || s.EndedAt.IsZero() {
					t.Errorf("the session m2 was sent to, after the second /reset: %+v, %v; want it ended", s, err)
				}
				if n := w.sessionCount(t); n != 4 {
					t.Errorf("the key has %d sessions after m1b, /reset, m2, /reset, want 4", n)
				}

				// An operator's reset right behind another: the session it began is kept.
				m3 := w.deliver(t, "m3", "again")
				w.awaitTurnEnds(1)
				synctest.Wait()
				g.armed.Store(true)
				g.open = make(chan struct{})
				first := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &ResetSession{}}, time.Minute)
				<-g.waiting
				g.armed.Store(false)
				second := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &ResetSession{}}, time.Minute)
				synctest.Wait()
				close(g.open)
				var got [2]*ResetResult
				for i, f := range []*actor.Future{first, second} {
					res, err := f.Result()
					if err != nil {
						t.Fatalf("reset %d: %v", i+1, err)
					}
					got[i] = res.(*ResetResult)
				}
				if got[0].Error != "" || got[0].PreviousSessionId != m3.SessionId {
					t.Fatalf("the first reset answered %+v, want the end of %s", got[0], m3.SessionId)
				}
				if got[1].Error != "" || got[1].SessionId != got[0].SessionId || !got[1].Kept {
					t.Errorf("a reset behind the first's write answered %+v, want session %s kept", got[1], got[0].SessionId)
				}
				if n := w.sessionCount(t); n != 5 {
					t.Errorf("the key has %d sessions after m3 and two resets, want 5", n)
				}
			})
		})
	}
}

// TestNewBehindARefusedNewIsNotAnsweredDone: the first /new's write is refused (the database
// failing) while a second /new waits behind it. The second, which found the session the first
// began fresh, is not answered as done either: that session is not stored, and the key goes on
// in the session before.
func TestNewBehindARefusedNewIsNotAnsweredDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, g, refuse := newGatedWorld(t, echo.New(), nil, func(op persistence.Op) bool {
			_, ok := op.(*persistence.EndSession)
			return ok
		})
		m1 := w.deliver(t, "m1", "hello")
		w.awaitTurnEnds(1)
		synctest.Wait()
		g.armed.Store(true)
		refuse.Store(true)
		n1 := w.request("n1", "/new")
		<-g.waiting // its write is in flight
		g.armed.Store(false)
		n2 := w.request("n2", "/new")
		synctest.Wait()
		close(g.open)
		for id, f := range map[string]*actor.Future{"n1": n1, "n2": n2} {
			res, err := f.Result()
			if err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			if r := res.(*DeliverResult); r.ErrorCode != ErrCodeUnavailable || r.Disposition != "" {
				t.Errorf("%s answered %+v, want unavailable: the /new is not stored", id, r)
			}
		}
		refuse.Store(false)
		synctest.Wait()
		if route, err := w.store.Route(w.ctx, w.key); err != nil || route.SessionID != m1.SessionId {
			t.Errorf("the key routes to %+v (%v), want the session before the /new, %s", route, err, m1.SessionId)
		}
		if n := w.sessionCount(t); n != 1 {
			t.Errorf("the store holds %d sessions of the key, want 1", n)
		}
	})
}

// TestWritesBehindARefusedBeginningAreOutageRefusals: the write that began a session (a /new's,
// or a key's first message's) is refused as unavailable while a message and a command wait
// behind it; the store refuses theirs too, for their rows name a session it does not hold.
// They are told what an outage tells (the store refused; send it again), with the session the
// key goes on in, and their lines are the outage's WRN. Before, the message's error was
// SQLite's own ("… FOREIGN KEY constraint failed (787)"), both named the session never stored,
// and both lines were an ERR. Sent again, the message is stored in the session it was told.
func TestWritesBehindARefusedBeginningAreOutageRefusals(t *testing.T) {
	for _, tt := range []struct {
		name  string
		begin string // the message whose write begins a session, and is refused
		first bool   // the key has no session before it
	}{
		{"behind a /new", "/new", false},
		{"behind the first message", "hello", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var logs testutil.Buffer
				w, g, refuse := newGatedWorld(t, echo.New(), func(d *Deps) {
					d.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
				}, func(op persistence.Op) bool {
					_, ok := op.(*persistence.CreateSession)
					return ok
				})
				want := "" // the session the key goes on in
				if !tt.first {
					m0 := w.deliver(t, "m0", "before")
					w.awaitTurnEnds(1)
					want = m0.SessionId
				}
				synctest.Wait()
				g.armed.Store(true)
				refuse.Store(true)
				b := w.request("b1", tt.begin)
				<-g.waiting // its write is in flight
				g.armed.Store(false)
				m2 := w.request("m2", "behind")
				s2 := w.request("s2", "/status")
				synctest.Wait()
				close(g.open)
				if res, err := b.Result(); err != nil || res.(*DeliverResult).ErrorCode != ErrCodeUnavailable || res.(*DeliverResult).SessionId != "" {
					t.Fatalf("%s: %v %v, want unavailable, in no session", tt.begin, res, err)
				}
				for id, f := range map[string]*actor.Future{"m2": m2, "s2": s2} {
					res, err := f.Result()
					if err != nil {
						t.Fatalf("%s: %v", id, err)
					}
					r := res.(*DeliverResult)
					if r.ErrorCode != ErrCodeUnavailable || r.Disposition != "" {
						t.Errorf("%s answered %+v, want unavailable", id, r)
					}
					if strings.Contains(r.Error, "FOREIGN KEY") || strings.Contains(r.Error, "constraint") {
						t.Errorf("%s's error = %q, want no store text of a constraint", id, r.Error)
					}
					if r.SessionId != want {
						t.Errorf("%s's session_id = %q, want %q, the session the key goes on in", id, r.SessionId, want)
					}
				}
				synctest.Wait()
				for l := range strings.SplitSeq(logs.String(), "\n") {
					if strings.Contains(l, "level=ERROR") || strings.Contains(l, "FOREIGN KEY") {
						t.Errorf("line %q, want the outage's WRN lines only", l)
					}
				}
				for _, line := range []string{"store inbound message", "message_id=s2"} {
					if !strings.Contains(logs.String(), line) {
						t.Errorf("no line with %q:\n%s", line, logs.String())
					}
				}
				refuse.Store(false)
				time.Sleep(2 * time.Second) // the key's pause after the refusal (1s)
				synctest.Wait()
				r := w.deliver(t, "m2", "behind")
				if r.ErrorCode != "" || r.Disposition != platforms.Started {
					t.Fatalf("m2 sent again: %+v, want started", r)
				}
				if !tt.first && r.SessionId != want {
					t.Errorf("m2 sent again went to session %s, want %s, as it was told", r.SessionId, want)
				}
				w.awaitTurnEnds(map[bool]int{true: 1, false: 2}[tt.first])
			})
		})
	}
}

// TestFreshCountsWritesInFlight: a write in flight keeps a session from counting as fresh (it
// may be a turn's exchange the store does not show yet), unless it is a command's that adds no
// conversation (pendingWrite.quiet), such as the /new that began the session.
func TestFreshCountsWritesInFlight(t *testing.T) {
	for _, tt := range []struct {
		name     string
		inflight []*pendingWrite
		want     bool
	}{
		{"nothing in flight", nil, true},
		{"the /new that began it", []*pendingWrite{{quiet: true}}, true},
		{"a turn's result", []*pendingWrite{{quiet: true}, {turn: "t1"}}, false},
		{"a message's write", []*pendingWrite{{message: true}, {quiet: true}}, false},
		{"an automatic reset's write", []*pendingWrite{{kept: true}}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := &Session{d: &Deps{}, cur: &persistence.Session{ID: "s1"}, inflight: tt.inflight}
			if got := s.fresh(); got != tt.want {
				t.Errorf("fresh() with %d write(s) in flight = %v, want %v", len(tt.inflight), got, tt.want)
			}
		})
	}
}

// command delivers a command as message id and returns its answer: the result and the notice.
func (w *managerWorld) command(t *testing.T, id, text string) (*DeliverResult, string) {
	t.Helper()
	r := w.deliver(t, id, text)
	if r.ErrorCode != "" || r.Disposition != platforms.Command {
		t.Fatalf("%s: %+v, want a command answered", text, r)
	}
	return r, w.noticeFor(t, id)
}

// TestResetOfASessionWithSettingsStartsAnother: a session nothing was said in yet but whose
// queue mode or title was set (/queue steer, /title …) is not as fresh as a reset would make
// it: /new, /reset and an operator's reset end it and start one with the defaults, and say so.
// Before, each kept it as "new already", steer mode and title and all, so /queue steer then
// /new left the chat in steer mode.
func TestResetOfASessionWithSettingsStartsAnother(t *testing.T) {
	for _, tt := range []struct {
		name, set, reset string
	}{
		{"/queue steer, /new", "/queue steer", "/new"},
		{"/queue collect, /reset", "/queue collect", "/reset"},
		{"/title, /new", "/title plans", "/new"},
		{"/queue steer, an operator's reset", "/queue steer", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newManagerWorld(t, echo.New(), nil)
				s1, _ := w.command(t, "c0", "/status") // begins the chat's session (/title needs one)
				w.command(t, "c1", tt.set)
				var sid string
				if tt.reset == "" {
					r := w.reset(t, &ResetSession{})
					if r.Kept || r.PreviousSessionId != s1.SessionId {
						t.Errorf("an operator's reset after %s = %+v, want %s ended", tt.set, r, s1.SessionId)
					}
					sid = r.SessionId
				} else {
					r, answer := w.command(t, "c2", tt.reset)
					if want := "✨ Started a new session (" + r.SessionId + "). The previous session " + s1.SessionId + " has ended."; answer != want {
						t.Errorf("%s after %s answered %q, want %q", tt.reset, tt.set, answer, want)
					}
					sid = r.SessionId
				}
				if sid == s1.SessionId {
					t.Fatalf("the reset after %s kept session %s", tt.set, sid)
				}
				s, err := w.store.Session(w.ctx, sid)
				if err != nil || s.QueueMode != "" || s.Title != "" {
					t.Errorf("the session the reset began: %+v, %v; want no queue mode or title of its own", s, err)
				}
				if _, status := w.command(t, "c3", "/status"); !strings.Contains(status, "(mode "+ModeFollowup+",") {
					t.Errorf("/status after the reset answered %q, want the default mode %s", status, ModeFollowup)
				}
				if r, answer := w.command(t, "c4", "/new"); r.SessionId != sid || !strings.HasPrefix(answer, "✨ This session ("+sid+") is new already") {
					t.Errorf("a /new after it: session %s, answered %q; want %s kept", r.SessionId, answer, sid)
				}
			})
		})
	}
}

// TestAutomaticResetStartsTheNextSessionWithTheDefaultQueueMode: a session whose queue mode
// was set (/queue steer) and that an idle reset ends is followed by one with the default mode,
// as after /new: the mode is the session's own, stored with it, and the session the reset
// begins holds none. Before, the automatic reset ended the session but left its mode in the
// actor's memory: the next session ran in steer mode (and /status said so) while the store
// held no mode for it, until the key's next load found followup.
func TestAutomaticResetStartsTheNextSessionWithTheDefaultQueueMode(t *testing.T) {
	for _, tt := range []struct {
		name  string
		after string // what comes after the idle time: a command, a message, or a restart
	}{
		{"a command after the reset", "/status"},
		{"a message after the reset", "hello"},
		{"a reset found at the key's load", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var clock atomic.Int64
				start := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
				clock.Store(start.UnixNano())
				setup := resetsBy(&clock, ResetPolicy{Mode: ResetIdle, Idle: time.Hour, Location: time.UTC})
				path := filepath.Join(t.TempDir(), "agentgate.db")
				w := newManagerWorldAt(t, path, echo.New(), setup)
				s1, _ := w.command(t, "c1", "/queue steer")
				clock.Store(start.Add(2 * time.Hour).UnixNano()) // idle past the policy's hour
				if tt.after == "" {
					w.stop()
					w = newManagerWorldAt(t, path, echo.New(), setup)
				} else {
					w.deliver(t, "m2", tt.after)
					synctest.Wait()
				}
				r, status := w.command(t, "c3", "/status")
				if r.SessionId == s1.SessionId {
					t.Fatalf("/status after the idle time answered in session %s, want a new one (the idle reset ended it)", r.SessionId)
				}
				if !strings.Contains(status, "(mode "+ModeFollowup+",") {
					t.Errorf("/status in the session the idle reset began answered %q, want the default mode %s", status, ModeFollowup)
				}
				if s, err := w.store.Session(w.ctx, r.SessionId); err != nil || s.QueueMode != "" {
					t.Errorf("the session the idle reset began: %+v, %v; want no queue mode of its own", s, err)
				}
			})
		})
	}
}
