package actors

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/platforms"
)

// readSizes is a store that records the most message text one read of a session's messages
// returned.
type readSizes struct {
	persistence.Store
	most atomic.Int64
}

func (r *readSizes) saw(msgs []persistence.Message) {
	n := int64(0)
	for _, m := range msgs {
		n += int64(len(m.Content))
	}
	for {
		if old := r.most.Load(); n <= old || r.most.CompareAndSwap(old, n) {
			return
		}
	}
}

func (r *readSizes) LoadSession(ctx context.Context, key string, historyLimit, pendingLimit int) (*persistence.Snapshot, error) {
	snap, err := r.Store.LoadSession(ctx, key, historyLimit, pendingLimit)
	if err == nil {
		r.saw(snap.Pending)
	}
	return snap, err
}

func (r *readSizes) PendingAfter(ctx context.Context, sessionID string, after, through int64, limit int) ([]persistence.Message, error) {
	msgs, err := r.Store.PendingAfter(ctx, sessionID, after, through, limit)
	r.saw(msgs)
	return msgs, err
}

func (r *readSizes) TranscriptAfter(ctx context.Context, sessionID string, after int64, limit int) ([]persistence.Message, error) {
	msgs, err := r.Store.TranscriptAfter(ctx, sessionID, after, limit)
	r.saw(msgs)
	return msgs, err
}

// throughStore is a world's setup that gives sessions a queue of cap and the store outer, which
// wraps the world's store (filed in *inner), after setup when not nil.
func throughStore(cap int, inner *persistence.Store, outer persistence.Store, setup func(*Deps)) func(*Deps) {
	return func(d *Deps) {
		d.Config.QueueCap = cap
		if setup != nil {
			setup(d)
		}
		*inner, d.Store = d.Store, outer
	}
}

// check fails t when a read returned more than a queue of cap holds in memory (cap + 1
// messages of size bytes).
func (r *readSizes) check(t *testing.T, cap, size int) {
	t.Helper()
	if most, bound := r.most.Load(), int64((cap+1)*size); most > bound {
		t.Errorf("a read of pending messages returned %d KiB of text, more than the %d KiB a queue of cap %d holds", most>>10, bound>>10, cap)
	}
}

// The backlog of these tests: n messages of size bytes each.
const backlogN, backlogSize = 300, 32 << 10

// TestBacklogAnsweredWithNoticesIsReadInPages: a session that starts with a backlog of messages
// pending that it does not run (sessions.recovery: notice, also when a reset fell due while
// agentgate was down) answers each with a notice, once, in order, and reads the backlog a page
// at a time. Before, the start read the whole backlog at once (here 9 MiB of text; a flooded
// chat's could be gigabytes). TestSpilledQueueLoadsPastItsCapAfterARestart is the backlog that
// runs.
func TestBacklogAnsweredWithNoticesIsReadInPages(t *testing.T) {
	idle := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Second}
	for _, tc := range []struct {
		name  string
		setup func(*Deps)
		down  bool   // agentgate is down long enough for the idle reset to fall due
		note  string // in the notice
	}{
		{name: "recovery notice", setup: func(d *Deps) { d.Config.Recovery = RecoveryNotice },
			note: "agentgate restarted before it could answer this message"},
		// A reset due at the start waits for the backlog (expireOnStart), which the notices
		// answer: the notices are recovery's, not the reset's.
		{name: "recovery notice, reset due at start", down: true, setup: func(d *Deps) {
			d.Config.Recovery = RecoveryNotice
			d.Config.ResetFor = func(string, string) ResetPolicy { return idle }
			d.Config.ResetPolicies = []ResetPolicy{idle}
		}, note: "agentgate restarted before it could answer this message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "agentgate.db")
				setup := func(d *Deps) {
					d.Config.QueueCap = 2
					if tc.setup != nil {
						tc.setup(d)
					}
				}
				a := newRequeueAgent()
				w := newManagerWorldAt(t, path, a, setup)
				m0 := w.deliver(t, "m0", "hold")
				ids := append([]string{"m0"}, w.flood(t, 1, backlogN, backlogSize)...)
				w.stop() // m0's turn is cut short: m0…mn are pending in the store
				synctest.Wait()
				if tc.down {
					time.Sleep(time.Minute)
				}

				b := newRequeueAgent()
				reads := &readSizes{}
				var deps *Deps
				w2 := newManagerWorldWith(t, path, b, throughStore(2, &reads.Store, reads, func(d *Deps) { setup(d); deps = d }), nil,
					spooled(t, func() *atomic.Bool { return &deps.Spooling }))
				w2.waitSetAside(t, ids) // loaded, and every message set aside
				reads.check(t, 2, backlogSize)
				if got := b.order(); len(got) > 0 {
					t.Errorf("turns ran %v; want none: the backlog is answered with notices", got[:min(5, len(got))])
				}
				w2.checkSetAside(t, ids, tc.note)
				s, err := w2.store.Session(w2.ctx, m0.SessionId)
				if err != nil {
					t.Fatal(err)
				}
				if tc.down != (s.EndReason == persistence.EndIdle) {
					t.Errorf("session %s ended %v (%q); want the idle reset only if it fell due", m0.SessionId, s.EndedAt, s.EndReason)
				}
			})
		})
	}
}

// waitSetAside waits until none of ids is pending any more in the store, advancing the bubble's
// clock a second at a time for a minute at most. A read or a commit that SQLite refuses for a
// moment (its busy timeout is real time, which a loaded machine can outlast) is tried again
// after a pause on that clock (a read's asideRetry, the spool's replay), which synctest.Wait
// alone never passes: a loaded run once checked with 78 of 301 messages answered. What the
// caller checks then is unchanged: each message set aside once, in order, read a page at a time.
func (w *managerWorld) waitSetAside(t *testing.T, ids []string) {
	t.Helper()
	for range 60 {
		synctest.Wait()
		pending := false
		for _, id := range ids {
			m, err := w.store.FindInbound(w.ctx, w.src.Platform, w.src.ChatID, id)
			if err != nil {
				t.Fatalf("FindInbound(%s): %v", id, err)
			}
			if pending = m == nil || m.Status == persistence.StatusPending; pending {
				break
			}
		}
		if !pending {
			return
		}
		time.Sleep(time.Second)
	}
}

// spooled is a world's persistence option that gives it a spool in a temporary directory, as
// the daemon has: a commit the database refuses for a moment waits there, acknowledged, and is
// replayed. Without one the write is refused, and a session setting a backlog aside leaves the
// rest of it to the key's next activation. spooling is the world's Deps.Spooling, which the
// sessions read.
func spooled(t *testing.T, spooling func() *atomic.Bool) func(*persistence.ActorOptions) {
	t.Helper()
	sp, err := spool.Open(filepath.Join(t.TempDir(), "spool"))
	if err != nil {
		t.Fatal(err)
	}
	return func(o *persistence.ActorOptions) { o.Spool, o.Spooling = sp, spooling() }
}

// checkSetAside checks that each of ids is failed, archived (it never ran: no later turn reads
// it, unrunOps) and answered by one notice that says note, in order.
func (w *managerWorld) checkSetAside(t *testing.T, ids []string, note string) {
	t.Helper()
	for _, id := range ids {
		m, err := w.store.FindInbound(w.ctx, w.src.Platform, w.src.ChatID, id)
		if err != nil {
			t.Fatalf("FindInbound(%s): %v", id, err)
		}
		if m.Status != persistence.StatusFailed || m.Active || !m.Archived {
			t.Errorf("%s: %s, active %t, archived %t; want failed and archived", id, m.Status, m.Active, m.Archived)
		}
	}
	out, err := w.store.OutboxAfter(w.ctx, w.key, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var answered []string
	for _, e := range out {
		if strings.Contains(e.Text, note) {
			answered = append(answered, e.InReplyTo...)
		}
	}
	if !slicesEqual(answered, ids) {
		t.Errorf("notices answer %d messages, first differing at %d; want each of %d once, in order", len(answered), firstDiff(answered, ids), len(ids))
	}
}

func slicesEqual(a, b []string) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

// storeLeftBehind stores, in a new database at path, a session s-old of the world's chat that
// the key routes to and that has ended (/new) with n messages of size bytes pending, m1…mn,
// and returns their ids.
func storeLeftBehind(t *testing.T, path string, n, size int) []string {
	t.Helper()
	src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1", UserID: "u1"}
	key := identity.Key(src, identity.KeyOptions{})
	now := time.Now()
	ops := []persistence.Op{&persistence.CreateSession{Session: persistence.Session{ID: "s-old", Key: key,
		Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1", UserID: "u1", StartedAt: now, LastActivityAt: now}},
		&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: "s-old", Generation: 1, UpdatedAt: now}}}
	var ids []string
	for i := 1; i <= n; i++ {
		id := fmt.Sprint("m", i)
		ids = append(ids, id)
		ops = append(ops, &persistence.AppendMessage{Message: persistence.Message{SessionID: "s-old", Seq: int64(i),
			Role: persistence.RoleUser, Content: id + " " + strings.Repeat("x", max(0, size-len(id)-1)), Platform: "fake", ChatID: "c1",
			MessageID: id, UserID: "u1", Status: persistence.StatusPending, Active: true, CreatedAt: now}})
	}
	ops = append(ops, &persistence.EndSession{SessionID: "s-old", Reason: persistence.EndNewCommand, At: now})
	store, err := sqlite.Open(t.Context(), path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if errs := store.Commit(t.Context(), [][]persistence.Op{ops}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestBacklogLeftInAnEndedSessionIsSetAsideInPages: messages left pending in the session a key
// routes to, which has ended (a command ended it as their writes landed, and the write that set
// them aside never did), are each answered with a notice when the key next starts, read a page
// at a time, more than a page of them; the message that started the key runs.
func TestBacklogLeftInAnEndedSessionIsSetAsideInPages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		ids := storeLeftBehind(t, path, backlogN, backlogSize)

		a := newRequeueAgent()
		reads := &readSizes{}
		w := newManagerWorldAt(t, path, a, throughStore(2, &reads.Store, reads, nil))
		if r := w.deliver(t, "next", "hello"); r.Disposition != platforms.Started {
			t.Fatalf("next: %+v, want started", r)
		}
		synctest.Wait()
		reads.check(t, 2, backlogSize)
		if got := a.order(); !slicesEqual(got, []string{"next"}) {
			t.Errorf("turns ran %v, want [next]", got)
		}
		w.checkSetAside(t, ids, leftBehindNotice)
	})
}

// downAfterOnePage is a store whose reads of pending messages fail from its second read of
// messages to set aside (PendingRefsAfter) on, while down is set: a database that goes away
// after the first page.
type downAfterOnePage struct {
	unreadablePending
	refs atomic.Int32
}

func (u *downAfterOnePage) PendingRefsAfter(ctx context.Context, sessionID string, after, through int64, limit int) ([]persistence.Message, error) {
	if u.refs.Add(1) == 2 {
		u.down.Store(true)
	}
	return u.unreadablePending.PendingRefsAfter(ctx, sessionID, after, through, limit)
}

// TestBacklogNoticedAtStartDoesNotRunAfterACrash: with sessions.recovery: notice, a session
// whose start answers a backlog of more than a page with notices crashes (a new message's agent
// panics) before the last page is set aside. Its next incarnation must not run what was left
// of that backlog: each message is answered with the notice, once, and never run.
func TestBacklogNoticedAtStartDoesNotRunAfterACrash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		setup := func(d *Deps) {
			d.Config.QueueCap = 2
			d.Config.Recovery = RecoveryNotice
		}
		a := newRequeueAgent()
		w := newManagerWorldAt(t, path, a, setup)
		w.deliver(t, "m0", "hold")
		ids := append([]string{"m0"}, w.flood(t, 1, backlogN, 64)...)
		w.stop() // m0's turn is cut short: m0…mn are pending in the store
		synctest.Wait()

		b := newRequeueAgent()
		reads := &downAfterOnePage{}
		w2 := newManagerWorldAt(t, path, b, throughStore(2, &reads.Store, reads, setup))
		synctest.Wait() // loaded; the first page set aside, the second unreadable
		b.poisoned.Store(true)
		if r := w2.deliver(t, "boom", "boom"); r.ErrorCode != "" {
			t.Fatalf("boom: %+v", r)
		}
		synctest.Wait() // the session crashed on boom and started again
		b.poisoned.Store(false)
		reads.down.Store(false)
		time.Sleep(time.Minute)
		synctest.Wait()
		var ran []string
		for _, id := range b.order() {
			if slices.Contains(ids, id) {
				ran = append(ran, id)
			}
		}
		if len(ran) > 0 {
			t.Errorf("turns ran %d messages of the backlog answered with notices (%v…); want none", len(ran), ran[:min(3, len(ran))])
		}
		w2.checkSetAside(t, ids, "agentgate restarted before it could answer this message")
	})
}

// TestResumedSessionsNewMessagesAreNotLeftBehind: a key's start sets aside, a page at a time,
// the messages left in the ended session it routes to; before it is done (its next page
// unreadable a while), its user goes back to that session (/resume) and writes to it. The
// message written after the /resume is the resumed session's: it runs, and is not set aside as
// one left behind (it was, with a notice that it was not run, while its turn ran and answered).
func TestResumedSessionsNewMessagesAreNotLeftBehind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		ids := storeLeftBehind(t, path, backlogN, 64)
		a := newRequeueAgent()
		reads := &downAfterOnePage{}
		w := newManagerWorldAt(t, path, a, throughStore(2, &reads.Store, reads, nil))
		if r := w.deliver(t, "next", "hello"); r.Disposition != platforms.Started {
			t.Fatalf("next: %+v, want started", r)
		}
		synctest.Wait() // next answered; the first page set aside, the second unreadable
		for len(w.sent) > 0 {
			<-w.sent // (the platform drops what its buffer has no room for)
		}
		if r := w.deliver(t, "resume", "/resume s-old"); r.Disposition != platforms.Command {
			t.Fatalf("/resume: %+v", r)
		}
		if text := w.noticeFor(t, "resume"); !strings.Contains(text, "Resumed session s-old") {
			t.Fatalf("/resume answered %q", text)
		}
		if r := w.deliver(t, "after", "hold"); r.Disposition != platforms.Started {
			t.Fatalf("after: %+v, want started", r)
		}
		synctest.Wait() // its turn holds
		reads.down.Store(false)
		time.Sleep(time.Minute)
		synctest.Wait()
		close(a.hold)
		synctest.Wait()
		if got := a.order(); !slicesEqual(got, []string{"next", "after"}) {
			t.Errorf("turns ran %v, want [next after]", got)
		}
		if st, _ := w.statusOf(t, "after"); st != persistence.StatusDone {
			t.Errorf("after: %s, want done", st)
		}
		w.checkSetAside(t, ids, leftBehindNotice)
	})
}
