package supervisor

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	agtest "github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
)

// countHook is a store that runs its armed hook, once, before a CountMessages: what a test
// does while an admin query (GET of a session, the answer to a reset) reads the store.
type countHook struct {
	persistence.Store
	hook atomic.Pointer[func()]
}

func (c *countHook) CountMessages(ctx context.Context, sessionID string) (int, int, error) {
	if h := c.hook.Swap(nil); h != nil {
		(*h)()
	}
	return c.Store.CountMessages(ctx, sessionID)
}

// TestResetWhileSpoolingAnswersItsStartAsStored: the answer to an operator's reset while writes
// wait in the spool gives the new session's started_at as the session stored it, which GET of
// the key shows once the spool has drained, also when a message reaches the new session
// between the reset and its answer. Before, it was the session actor's last activity when the
// answer was made, which that message had moved on (to the message's time).
func TestResetWhileSpoolingAnswersItsStartAsStored(t *testing.T) {
	clk := agtest.NewClock(t0)
	o := &storetest.Outage{}
	hooked := &countHook{Store: o}
	r := MustStartDaemon(t, echo.New(), daemonOpts{now: clk.Now, wrap: func(s persistence.Store) persistence.Store {
		o.Store = s
		return hooked
	}})
	defer r.stop(t)
	a1 := r.inject(t, dm, "m1", "one")
	r.waitSent(t, 1)

	o.Down.Store(true)
	clk.Advance(time.Minute)
	resetAt := clk.Now()
	var raced error
	race := func() {
		// The answer reads the store once the session has reset: a message comes meanwhile, a
		// minute later.
		clk.Advance(time.Minute)
		_, raced = r.fake.Inject(context.Background(), &platforms.Inbound{Source: dm, MessageID: "m2", Text: "two"})
	}
	hooked.hook.Store(&race)
	got := r.resetOK(t, a1.SessionKey, "reset while writes wait in the spool")
	if hooked.hook.Load() != nil {
		t.Fatal("the reset's answer read no message count: the test raced nothing")
	}
	if raced != nil {
		t.Fatalf("the message sent between the reset and its answer: %v", raced)
	}
	if !r.d.deps.Spooling.Load() {
		t.Fatal("the reset's write did not go to the spool: the test shows nothing")
	}
	if got.PrevSessionID != a1.SessionID || !got.StartedAt.Equal(resetAt) {
		t.Errorf("reset while writes wait in the spool answered session %s (prev %s) started %v, want a session after %s started %v, at the reset",
			got.SessionID, got.PrevSessionID, got.StartedAt, a1.SessionID, resetAt)
	}

	after := r.sessionOnceDrained(t, o, a1.SessionKey)
	if after.SessionID != got.SessionID || !after.StartedAt.Equal(got.StartedAt) {
		t.Errorf("once the spool drained the key's session is %s started %v, want %s started %v, as the reset answered",
			after.SessionID, after.StartedAt, got.SessionID, got.StartedAt)
	}
}

// TestTwoResetsAtOnceWhileSpoolingStartOneSession: two operator's resets of a chat at once
// while writes wait in the spool are answered as when the database takes the writes: one ends
// the session and begins another, the other finds that one holding nothing yet and keeps it
// ("kept": true), both answers naming it, with the same start, and the key has one new
// session, as GET shows once the spool has drained. Before, the second reset while spooling
// ended the empty session the first had begun and began another (a chain of empty sessions,
// which docs/HTTP-API.md says two resets never make), and the first's answer named a session
// that had ended already.
func TestTwoResetsAtOnceWhileSpoolingStartOneSession(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spool bool
	}{
		{"database takes the writes", false},
		{"writes wait in the spool", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &storetest.Outage{}
			r := startWithOutage(t, t.TempDir(), o, echo.New())
			defer r.stop(t)
			a1 := r.inject(t, dm, "m1", "one")
			r.waitSent(t, 1)
			o.Down.Store(tc.spool)
			r.inject(t, dm, "m2", "two") // (while spooling, its write sets the daemon spooling)
			r.waitSent(t, 2)
			if r.d.deps.Spooling.Load() != tc.spool {
				t.Fatalf("spooling = %v, want %v", !tc.spool, tc.spool)
			}

			var got [2]httpplatform.SessionInfo
			var wg sync.WaitGroup
			for i := range got {
				wg.Go(func() { got[i] = r.resetOK(t, a1.SessionKey, "one of two resets at once") })
			}
			wg.Wait()
			if got[1].Kept {
				got[0], got[1] = got[1], got[0] // got[1] the one that reset, got[0] the one kept
			}
			reset, kept := got[1], got[0]
			if reset.Kept || !kept.Kept || reset.SessionID != kept.SessionID || reset.PrevSessionID != a1.SessionID ||
				kept.PrevSessionID != a1.SessionID || !reset.StartedAt.Equal(kept.StartedAt) || reset.EndedAt != nil || kept.EndedAt != nil {
				t.Errorf("two resets at once answered session %s (prev %s, kept %v, started %v, ended %v) and %s (prev %s, kept %v, started %v, ended %v); want one open session after %s, begun by one and kept by the other",
					reset.SessionID, reset.PrevSessionID, reset.Kept, reset.StartedAt, reset.EndedAt,
					kept.SessionID, kept.PrevSessionID, kept.Kept, kept.StartedAt, kept.EndedAt, a1.SessionID)
			}

			after := r.sessionOnceDrained(t, o, a1.SessionKey)
			if after.SessionID != reset.SessionID || !after.StartedAt.Equal(reset.StartedAt) || after.PrevSessionID != a1.SessionID {
				t.Errorf("the key's session is %s (prev %s) started %v, want %s (prev %s) started %v, as the resets answered",
					after.SessionID, after.PrevSessionID, after.StartedAt, reset.SessionID, a1.SessionID, reset.StartedAt)
			}
			ss, err := r.d.store.SessionsOfKey(t.Context(), a1.SessionKey, 100)
			if err != nil {
				t.Fatal(err)
			}
			if len(ss) != 2 {
				t.Errorf("the key has %d sessions after two resets at once, want 2: the first and the one they began", len(ss))
			}
		})
	}
}
