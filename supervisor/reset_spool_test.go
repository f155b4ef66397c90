package supervisor

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	agtest "github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
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
