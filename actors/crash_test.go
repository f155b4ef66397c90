package actors

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestSessionStoppedForCrashingStartsAgain: an agent that panics on every message of a chat.
// The first message crashes the session three times and is quarantined; the second one's
// first crash is one too many for the session's restart budget, and its supervisor stops it.
// The manager starts it again crashPause later, from the store, so the second message is not
// left pending until the chat writes again: it is run, and quarantined in its turn. That start
// is no recovery after a restart of agentgate: with sessions.recovery: notice too, the second
// message is run, not answered "agentgate restarted".
func TestSessionStoppedForCrashingStartsAgain(t *testing.T) {
	for _, recovery := range []string{RecoveryRerun, RecoveryNotice} {
		t.Run(recovery, func(t *testing.T) { crashedOutSessionStartsAgain(t, recovery) })
	}
}

func crashedOutSessionStartsAgain(t *testing.T, recovery string) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		crashy := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			<-gate
			panic("agent bug on " + req.Identity.MessageID)
		})
		w := newManagerWorld(t, crashy, func(d *Deps) { d.Config.Recovery = recovery })
		var sid string
		for _, id := range []string{"m1", "m2"} {
			r := w.deliver(t, id, "boom")
			if r.ErrorCode != "" {
				t.Fatalf("deliver %s: %+v", id, r)
			}
			sid = r.SessionId
		}
		close(gate)
		time.Sleep(time.Minute) // crashPause and every restart fit in it
		synctest.Wait()

		msgs, err := w.store.Transcript(w.ctx, sid)
		if err != nil {
			t.Fatal(err)
		}
		status := map[string]string{}
		for _, m := range msgs {
			if m.Role == persistence.RoleUser {
				status[m.MessageID] = m.Status
			}
		}
		if status["m1"] != persistence.StatusQuarantined || status["m2"] != persistence.StatusQuarantined {
			t.Errorf("message statuses %v, want both quarantined", status)
		}
		// Each start sends again what is not confirmed (this platform confirms nothing).
		told := map[string]bool{}
		for len(w.sent) > 0 {
			if m := <-w.sent; strings.Contains(m.Out.Text, "quarantined") {
				told[strings.Join(m.Out.InReplyTo, ",")] = true
			}
		}
		if !told["m1"] || !told["m2"] || len(told) != 2 {
			t.Errorf("quarantine notices answer %v, want m1 and m2", told)
		}
	})
}

// blindRecovery is a store whose first Recoverable calls fail.
type blindRecovery struct {
	persistence.Store
	failures int
}

func (b *blindRecovery) Recoverable(ctx context.Context) ([]string, error) {
	if b.failures > 0 {
		b.failures--
		return nil, errors.New("recoverable: database is locked (test)")
	}
	return b.Store.Recoverable(ctx)
}

// TestRecoveryRetriesItsListing: when the store cannot list the sessions with unfinished work
// at start, the manager tries again until it can, and the message the last run left unanswered
// is run without waiting for the chat's next one.
func TestRecoveryRetriesItsListing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// What a run that died mid-turn leaves: a session with a pending message. It is
		// written before the manager starts, through a store of its own on the same file.
		dir := t.TempDir()
		path := filepath.Join(dir, "agentgate.db")
		now := time.Now()
		src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1", UserID: "u1"}
		key := identity.Key(src, identity.KeyOptions{})
		func() {
			store, err := sqlite.Open(t.Context(), path, sqlite.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			if errs := store.Commit(t.Context(), [][]persistence.Op{{
				&persistence.CreateSession{Session: persistence.Session{ID: "s1", Key: key, Platform: "fake", ChatType: identity.ChatDM,
					ChatID: "c1", UserID: "u1", StartedAt: now, LastActivityAt: now}},
				&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: "s1", Generation: 1, UpdatedAt: now}},
				&persistence.AppendMessage{Message: persistence.Message{SessionID: "s1", Seq: 1, Role: persistence.RoleUser,
					Content: "left over", Platform: "fake", ChatID: "c1", MessageID: "m1", UserID: "u1",
					Status: persistence.StatusPending, Active: true, CreatedAt: now}},
			}}); errs[0] != nil {
				t.Fatal(errs[0])
			}
		}()
		echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "echo: " + req.Messages[0].Text}, nil
		})
		w := newManagerWorldAt(t, path, echo, func(d *Deps) { d.Store = &blindRecovery{Store: d.Store, failures: 2} })
		time.Sleep(time.Minute)
		synctest.Wait()
		select {
		case got := <-w.sent:
			if got.Out.Text != "echo: left over" {
				t.Errorf("reply %q, want the left-over message answered", got.Out.Text)
			}
		default:
			t.Errorf("the left-over message was not run after the store could list it again")
		}
	})
}

// TestUncleanRestartsQuarantine: a message that was at the head of its session when agentgate
// stopped uncleanly QuarantineAfter times (counted by Store.BeginRun) is quarantined when its
// session loads, its sender told, and the session goes on with the next message. In collect
// mode the messages of its sender that merge with it into one turn go with it; another
// sender's message runs.
func TestUncleanRestartsQuarantine(t *testing.T) {
	tests := []struct {
		mode        string
		quarantined []string
		answered    []string
	}{
		{ModeFollowup, []string{"m1"}, []string{"m2", "m3"}},
		{ModeCollect, []string{"m1", "m2"}, []string{"m3"}},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { uncleanRestartsQuarantine(t, tc.mode, tc.quarantined, tc.answered) })
		})
	}
}

func uncleanRestartsQuarantine(t *testing.T, mode string, quarantined, answered []string) {
	path := filepath.Join(t.TempDir(), "agentgate.db")
	now := time.Now()
	src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1", UserID: "u1"}
	key := identity.Key(src, identity.KeyOptions{})
	func() {
		store, err := sqlite.Open(t.Context(), path, sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		msg := func(seq int64, id, user string) persistence.Op {
			return &persistence.AppendMessage{Message: persistence.Message{SessionID: "s1", Seq: seq, Role: persistence.RoleUser,
				Content: "text of " + id, Platform: "fake", ChatID: "c1", MessageID: id, UserID: user,
				Status: persistence.StatusPending, Active: true, CreatedAt: now}}
		}
		if errs := store.Commit(t.Context(), [][]persistence.Op{{
			&persistence.CreateSession{Session: persistence.Session{ID: "s1", Key: key, Platform: "fake", ChatType: identity.ChatDM,
				ChatID: "c1", UserID: "u1", StartedAt: now, LastActivityAt: now}},
			&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: "s1", Generation: 1, UpdatedAt: now}},
			msg(1, "m1", "u1"), msg(2, "m2", "u1"), msg(3, "m3", "u2"),
		}}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		// Four runs, none of them stopped: three unclean stops counted against m1. From its
		// first strike on, a stop counts only once m1 ran in the run that died (MarkProbation),
		// as a session marks it when its turn has its agent slot, or on probation (a suspect)
		// before its turn.
		for i := range QuarantineAfter + 1 {
			if i > 1 {
				mark := &persistence.MarkProbation{SessionID: "s1", Seq: 1, Run: fmt.Sprint("run-", i-1)}
				if errs := store.Commit(t.Context(), [][]persistence.Op{{mark}}); errs[0] != nil {
					t.Fatal(errs[0])
				}
			}
			if _, err := store.BeginRun(t.Context(), fmt.Sprint("run-", i), now); err != nil {
				t.Fatal(err)
			}
		}
	}()
	echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
		return &agents.Response{Text: "echo"}, nil
	})
	w := newManagerWorldAt(t, path, echo, func(d *Deps) { d.Config.QueueMode = mode })
	time.Sleep(time.Minute)
	synctest.Wait()

	msgs, err := w.store.Transcript(w.ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]string{}
	for _, m := range msgs {
		if m.Role == persistence.RoleUser {
			status[m.MessageID] = m.Status
		}
	}
	want := map[string]string{}
	for _, id := range quarantined {
		want[id] = persistence.StatusQuarantined
	}
	for _, id := range answered {
		want[id] = persistence.StatusDone
	}
	if !maps.Equal(status, want) {
		t.Errorf("message statuses %v, want %v", status, want)
	}
	told := map[string]bool{}
	for len(w.sent) > 0 {
		m := <-w.sent
		if strings.Contains(m.Out.Text, "quarantined") {
			if !strings.Contains(m.Out.Text, fmt.Sprintf("restarted %d times", QuarantineAfter)) {
				t.Errorf("quarantine notice %q does not say how often agentgate restarted", m.Out.Text)
			}
			for _, id := range m.Out.InReplyTo {
				told[id] = true
			}
		}
	}
	if len(told) != len(quarantined) {
		t.Errorf("quarantine notices answer %v, want %v", told, quarantined)
	}
	for _, id := range quarantined {
		if !told[id] {
			t.Errorf("quarantine notices answer %v, want %v", told, quarantined)
		}
	}
	if n := testutil.ToFloat64(w.d.Metrics.MessagesQuarantined.WithLabelValues("unclean_restart")); n != float64(len(quarantined)) {
		t.Errorf("messages_quarantined_total{cause=unclean_restart} = %v, want %d", n, len(quarantined))
	}
}

// gatedReads is a store whose reads of inbound messages wait, once armed, until open is closed
// (waiting tells that one waits): it holds a session inside Receive (a command's duplicate
// check) while messages queue up in its mailbox.
type gatedReads struct {
	persistence.Store
	armed   atomic.Bool
	waiting chan struct{} // a read waits (buffered: told once)
	open    chan struct{}
}

func (g *gatedReads) FindInbound(ctx context.Context, platform, chatID, messageID string) (*persistence.Message, error) {
	if g.armed.CompareAndSwap(true, false) {
		g.waiting <- struct{}{}
		<-g.open
	}
	return g.Store.FindInbound(ctx, platform, chatID, messageID)
}

// TestMessageToASessionStoppedForCrashingIsAnswered: a message that reaches a session's mailbox
// behind the crash that exhausts its restart budget is answered. Before, the supervisor's stop
// dropped it with the rest of the mailbox, unanswered: its sender waited in vain (found by
// TestOutageHunt, seed 1796182108935902522: a /undo answered only after an hour).
func TestMessageToASessionStoppedForCrashingIsAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		var ranM3 atomic.Bool
		crashy := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			text := req.Messages[len(req.Messages)-1].Text
			if strings.Contains(text, "gated") {
				<-gate
			}
			if strings.Contains(text, "boom") {
				panic("agent bug on " + req.Identity.MessageID)
			}
			if req.Identity.MessageID == "m3" {
				ranM3.Store(true)
			}
			return &agents.Response{Text: "ok"}, nil
		})
		g := &gatedReads{waiting: make(chan struct{}, 1), open: make(chan struct{})}
		w := newManagerWorld(t, crashy, func(d *Deps) { g.Store = d.Store; d.Store = g })
		if r := w.deliver(t, "m1", "boom"); r.ErrorCode != "" {
			t.Fatalf("m1: %+v", r)
		}
		synctest.Wait() // m1 crashed the session three times, and is quarantined
		if r := w.deliver(t, "m2", "gated boom"); r.ErrorCode != "" {
			t.Fatalf("m2: %+v", r)
		}
		g.armed.Store(true)
		status := w.request("k1", "/status")
		<-g.waiting // the session reads whether k1 is a duplicate
		close(gate) // m2's agent panics: its turn tells the session, behind k1
		synctest.Wait()
		f := w.request("m3", "three") // queued in the session's mailbox behind m2's crash
		synctest.Wait()
		close(g.open)
		if _, err := status.Result(); err != nil {
			t.Fatalf("/status: %v", err)
		}
		res, err := f.Result()
		if err != nil {
			t.Fatalf("m3, sent to the session as its last crash stopped it, was not answered: %v", err)
		}
		r := res.(*DeliverResult)
		t.Logf("m3: %+v", r)
		time.Sleep(time.Minute) // crashPause
		synctest.Wait()
		if r.ErrorCode == "" && !ranM3.Load() {
			t.Errorf("m3 acknowledged %+v but never ran", r)
		}
	})
}

// TestCrashWhileSpoolingRunsAgainOnceLoaded: a session crashes (its agent panics) while the
// database is down and its writes wait in the spool. The restarted incarnation waits for the
// spool to drain before it loads, and then runs the message again. Before, it never ran a turn
// again: it waits for the panicked turn's call to end before the next turn starts, and that
// end (and the timer bounding that wait) reached it while it waited for the spool, which
// dropped them (found by TestOutageHunt, seed 1796189555420442528: four messages acknowledged
// and never answered).
func TestCrashWhileSpoolingRunsAgainOnceLoaded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		var crashed atomic.Bool
		agent := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			if crashed.CompareAndSwap(false, true) {
				panic("agent bug on " + req.Identity.MessageID)
			}
			return &agents.Response{Text: "answer"}, nil
		})
		dir := t.TempDir()
		sp, err := spool.Open(filepath.Join(dir, "spool"))
		if err != nil {
			t.Fatal(err)
		}
		var deps *Deps
		w := newManagerWorldWith(t, filepath.Join(dir, "agentgate.db"), agent, func(d *Deps) { deps = d },
			out.Wrap,
			func(o *persistence.ActorOptions) {
				o.Spool, o.Spooling, o.ReplayEvery = sp, &deps.Spooling, time.Second
			})
		out.Down.Store(true)
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1 while the database is down: %+v, want started (spooled)", r)
		}
		// The agent panicked: the session restarted, and waits for the spool, for longer than
		// it would wait for a cancelled call.
		time.Sleep(time.Minute)
		synctest.Wait()
		out.Down.Store(false)
		select {
		case got := <-w.sent:
			if got.Out.Text != "answer" || !slices.Equal(got.Out.InReplyTo, []string{"m1"}) {
				t.Errorf("sent %q answering %v, want m1's answer", got.Out.Text, got.Out.InReplyTo)
			}
		case <-time.After(time.Minute):
			t.Error("m1 not answered within a minute of the database's return")
		}
	})
}

// refusedWrites is a store that refuses (as unavailable) the write groups holding an op that
// refuse picks (a disk with room for other writes), and commits the others of their batch.
type refusedWrites struct {
	persistence.Store
	refuse func(persistence.Op) bool
}

// refusedOutbox is refusedWrites of the outbox entries that refuse picks.
func refusedOutbox(s persistence.Store, refuse func(persistence.OutboxEntry) bool) *refusedWrites {
	return &refusedWrites{Store: s, refuse: func(op persistence.Op) bool {
		o, ok := op.(*persistence.AddOutbox)
		return ok && refuse(o.Entry)
	}}
}

func (r *refusedWrites) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	errs := make([]error, len(groups))
	var pass [][]persistence.Op
	var at []int
	for i, g := range groups {
		if slices.ContainsFunc(g, r.refuse) {
			errs[i] = fmt.Errorf("%w: disk full (test)", persistence.ErrUnavailable)
			continue
		}
		pass, at = append(pass, g), append(at, i)
	}
	if len(pass) > 0 {
		for j, err := range r.Store.Commit(ctx, pass) {
			errs[at[j]] = err
		}
	}
	return errs
}

// TestDroppedMessageWhoseSetAsideIsRefusedIsAnswered: /new ends the session while the write of
// a message is in flight; the message lands in the ended session, and the write that sets it
// aside with a notice is refused, so the session starts again from the store. The message is
// answered once, by that notice, when the store takes writes again. Before, the activation that
// loaded the new session never looked at the ended one, and the message stayed pending there,
// never answered (found by TestOutageHunt, seed 1796189442418889951).
func TestDroppedMessageWhoseSetAsideIsRefusedIsAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		echo, ran := countingEcho()
		g := &gatedCommits{waiting: make(chan struct{}, 1), open: make(chan struct{})}
		var setAsideRefused atomic.Bool // the writes that set a message aside are refused
		refuse := refusedOutbox(nil, func(e persistence.OutboxEntry) bool {
			return setAsideRefused.Load() && e.Text == leftBehindNotice
		})
		w := newManagerWorldWrites(t, echo, nil, func(s persistence.Store) persistence.Store {
			g.Store = s
			refuse.Store = g
			return refuse
		})
		if r := w.deliver(t, "m0", "zero"); r.Disposition != platforms.Started {
			t.Fatalf("m0: %+v", r)
		}
		w.awaitTurnEnds(1)
		synctest.Wait()
		g.armed.Store(true)
		m1 := w.request("m1", "one")
		<-g.waiting // m1's write is in flight
		g.armed.Store(false)
		setAsideRefused.Store(true)
		k1 := w.request("k1", "/new")
		synctest.Wait()
		close(g.open)
		for _, f := range []*actor.Future{m1, k1} {
			if _, err := f.Result(); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait() // m1's set-aside was refused: the session starts again from the store
		setAsideRefused.Store(false)
		time.Sleep(time.Minute)
		synctest.Wait()
		answered := 0
		for len(w.sent) > 0 {
			if slices.Contains((<-w.sent).Out.InReplyTo, "m1") {
				answered++
			}
		}
		row, err := w.store.FindInbound(w.ctx, w.src.Platform, w.src.ChatID, "m1")
		if err != nil {
			t.Fatal(err)
		}
		if answered != 1 || row.Status != persistence.StatusFailed || ran("m1") != 0 {
			t.Errorf("m1, dropped by /new while its write was in flight: answered %d times, stored %s, ran %d times; want answered once, failed, never run",
				answered, row.Status, ran("m1"))
		}
	})
}
