package actors

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
)

// TestRetriedResetResetsOnce: the cluster router sends an operator's reset again when an
// attempt got no answer (its member was slow, or died after the reset committed), marked
// Retry. A session that has held nothing since its predecessor ended is answered as that
// reset, in the same activation or in the next one (a member that died: the key activates
// again from the store); a session that has held a message since is reset. So is a reset that
// is not a retry, unless the session holds nothing yet.
//
// Before, the retry reset the session the first attempt had started: an empty session ended
// for nothing, and a conversation begun in it meanwhile was ended too.
func TestRetriedResetResetsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newManagerWorld(t, echo.New(), nil)
		reset := func(retry bool) *ResetResult { t.Helper(); return w.reset(t, &ResetSession{Retry: retry}) }
		sessions := func() int { t.Helper(); return w.sessionCount(t) }
		if r := w.deliver(t, "m1", "hello"); r.ErrorCode != "" {
			t.Fatalf("m1: %+v", r)
		}
		w.awaitTurnEnds(1)
		first := reset(false)
		if got := reset(true); got.SessionId != first.SessionId || got.PreviousSessionId != first.PreviousSessionId {
			t.Errorf("a retried reset of the session the reset began = %v, want it answered as that reset %v", got, first)
		}
		time.Sleep(2 * time.Hour) // the session passivates: the next request activates it from the store
		synctest.Wait()
		if got := reset(true); got.SessionId != first.SessionId || got.PreviousSessionId != first.PreviousSessionId {
			t.Errorf("a retried reset in the next activation = %v, want it answered as the reset %v", got, first)
		}
		if n := sessions(); n != 2 {
			t.Errorf("the key has %d sessions after one reset and its retries, want 2", n)
		}

		if r := w.deliver(t, "m2", "after the reset"); r.ErrorCode != "" || r.SessionId != first.SessionId {
			t.Fatalf("m2: %+v", r)
		}
		w.awaitTurnEnds(1)
		last := reset(true)
		if last.PreviousSessionId != first.SessionId {
			t.Errorf("a retried reset of a session that held a message since = %v, want it reset (its predecessor %s)", last, first.SessionId)
		}
		if again := reset(false); again.SessionId != last.SessionId {
			t.Errorf("an operator's reset of the empty session %s = %v, want it kept (TestOperatorResetOfAFreshSessionKeepsIt)", last.SessionId, again)
		}
		if n := sessions(); n != 3 {
			t.Errorf("the key has %d sessions after these resets, want 3 (two ended by them, the fresh one)", n)
		}
		s, err := w.store.Session(w.ctx, last.PreviousSessionId)
		if err != nil || s.EndReason != persistence.EndResetCommand {
			t.Errorf("the session that held m2: its end %v, %v; want it ended by the reset", s, err)
		}
	})
}

// TestRetriedResetKeepsTheConversationBegunSince: a message can come for the key between the
// two attempts of an operator's reset (held with them while the key's activation is slow, or
// sent while the router waits out the first attempt), and the session the first attempt began
// then holds it when the retry comes. The retry says when its first attempt went out; a
// session begun since is answered as that reset, with its conversation kept, in the same
// activation or the next one. A session that began before the first attempt went out was not
// begun by it, and is reset.
//
// Before, only an empty session was answered so: the retry ended the conversation the user
// had begun after the reset (a turn still running was cancelled and its message dropped).
func TestRetriedResetKeepsTheConversationBegunSince(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newManagerWorld(t, echo.New(), nil)
		reset := func(m *ResetSession) *ResetResult { t.Helper(); return w.reset(t, m) }
		sessions := func() int { t.Helper(); return w.sessionCount(t) }
		if r := w.deliver(t, "m1", "hello"); r.ErrorCode != "" {
			t.Fatalf("m1: %+v", r)
		}
		w.awaitTurnEnds(1)
		time.Sleep(time.Minute)
		sent := time.Now() // the first attempt goes out, and is done
		first := reset(&ResetSession{})
		if r := w.deliver(t, "m2", "after the reset"); r.ErrorCode != "" || r.SessionId != first.SessionId {
			t.Fatalf("m2: %+v", r)
		}
		w.awaitTurnEnds(1)
		retry := &ResetSession{Retry: true, FirstSentAtUnixNano: sent.UnixNano()}
		if got := reset(retry); got.SessionId != first.SessionId || got.PreviousSessionId != first.PreviousSessionId {
			t.Errorf("a retried reset of the session its first attempt began, which took a message since, = %v, want it answered as that reset %v", got, first)
		}
		time.Sleep(2 * time.Hour) // the session passivates: the next request activates it from the store
		synctest.Wait()
		if got := reset(retry); got.SessionId != first.SessionId || got.PreviousSessionId != first.PreviousSessionId {
			t.Errorf("the retried reset in the next activation = %v, want it answered as the reset %v", got, first)
		}
		if n := sessions(); n != 2 {
			t.Errorf("the key has %d sessions after one reset and its retries, want 2", n)
		}
		msgs, _, err := w.store.History(w.ctx, first.SessionId, 100)
		if err != nil || len(msgs) != 2 || msgs[0].MessageID != "m2" || msgs[0].Status != persistence.StatusDone {
			t.Errorf("the session the reset began holds %+v, %v; want m2 and its answer", msgs, err)
		}

		// A retry whose first attempt went out after the session began (two hours later: more
		// than any clock skew between members) did not begin it: it resets.
		if got := reset(&ResetSession{Retry: true, FirstSentAtUnixNano: time.Now().UnixNano()}); got.PreviousSessionId != first.SessionId {
			t.Errorf("a retried reset first sent after the session began = %v, want it reset (its predecessor %s)", got, first.SessionId)
		}
		if n := sessions(); n != 3 {
			t.Errorf("the key has %d sessions after two resets, want 3", n)
		}
	})
}

// reset sends m to the world's key through the manager, as the router does, and returns the
// answer, which must be a reset done.
func (w *managerWorld) reset(t *testing.T, m *ResetSession) *ResetResult {
	t.Helper()
	res, err := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: m}, time.Minute).Result()
	r, ok := res.(*ResetResult)
	if err != nil || !ok || r.Error != "" || r.SessionId == "" {
		t.Fatalf("reset %v: %v, %v", m, res, err)
	}
	return r
}

// sessionCount is how many sessions of the world's key the store holds.
func (w *managerWorld) sessionCount(t *testing.T) int {
	t.Helper()
	ss, err := w.store.SessionsOfKey(w.ctx, w.key, 100)
	if err != nil {
		t.Fatal(err)
	}
	return len(ss)
}

// TestRetryBehindARefusedResetIsNotAnsweredDone: the cluster router's retry of an operator's
// reset reaches the session while the first attempt's write is still in flight, and that write
// is then refused (the database failing). The retry finds the fresh session the attempt began
// in memory, and is answered unavailable, as the attempt is: that session is not stored, and
// the key's session goes on as it was. Before, the retry was answered as a reset done, naming
// the session the store never got (found by a review).
func TestRetryBehindARefusedResetIsNotAnsweredDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, g, refuse := newGatedWorld(t, echo.New(), nil, func(op persistence.Op) bool {
			_, ok := op.(*persistence.EndSession)
			return ok
		})
		first := w.deliver(t, "m0", "hello")
		w.awaitTurnEnds(1)
		synctest.Wait()
		sent := time.Now()
		g.armed.Store(true)
		refuse.Store(true)
		attempt := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: &ResetSession{}}, time.Minute)
		<-g.waiting // the attempt's write is in flight
		g.armed.Store(false)
		retry := w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key,
			Msg: &ResetSession{Retry: true, FirstSentAtUnixNano: sent.UnixNano()}}, time.Minute)
		synctest.Wait()
		close(g.open)
		for name, f := range map[string]*actor.Future{"attempt": attempt, "retry": retry} {
			res, err := f.Result()
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if r := res.(*ResetResult); r.ErrorCode != ErrCodeUnavailable || r.SessionId != "" || r.Error == "" {
				t.Errorf("%s answered %+v, want unavailable: the reset is not stored", name, r)
			}
		}
		refuse.Store(false)
		synctest.Wait()
		if route, err := w.store.Route(w.ctx, w.key); err != nil || route.SessionID != first.SessionId {
			t.Errorf("the key routes to %+v (%v), want the session before the reset, %s", route, err, first.SessionId)
		}
		if n := w.sessionCount(t); n != 1 {
			t.Errorf("the store holds %d sessions of the key, want 1", n)
		}
	})
}

// TestFencedResetIsHandedToTheKeysOwner: an operator's reset whose write is fenced (another
// activation claimed the key since this one loaded it: a cluster moved it) is handed to the
// key's next activation, which resets the session and answers. Before, the operator was told
// it failed.
func TestFencedResetIsHandedToTheKeysOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newManagerWorld(t, echo.New(), func(d *Deps) { d.Fencing = true })
		first := w.deliver(t, "m0", "hello")
		w.awaitTurnEnds(1)
		synctest.Wait()
		if _, err := w.store.Claim(w.ctx, w.key, "b", time.Now(), nil); err != nil {
			t.Fatal(err)
		}
		r := w.reset(t, &ResetSession{})
		if r.PreviousSessionId != first.SessionId {
			t.Errorf("reset answered %+v, want the reset of session %s", r, first.SessionId)
		}
		if route, err := w.store.Route(w.ctx, w.key); err != nil || route.SessionID != r.SessionId {
			t.Errorf("the key routes to %+v (%v), want the session the reset began, %s", route, err, r.SessionId)
		}
	})
}
