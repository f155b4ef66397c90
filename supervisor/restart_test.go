package supervisor

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// heldStore holds commits while hold is on, and counts the session loads made meanwhile.
type heldStore struct {
	persistence.Store
	held      atomic.Bool
	gate      chan struct{}
	blocked   chan struct{} // closed when a commit waits at the gate
	blockOnce sync.Once
	loadsHeld atomic.Int32
}

func newHeldStore() *heldStore {
	return &heldStore{gate: make(chan struct{}), blocked: make(chan struct{})}
}

func (h *heldStore) wrap(s persistence.Store) persistence.Store { h.Store = s; return h }

func (h *heldStore) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	if h.held.Load() {
		h.blockOnce.Do(func() { close(h.blocked) })
		<-h.gate
	}
	return h.Store.Commit(ctx, groups)
}

func (h *heldStore) LoadSession(ctx context.Context, key string, limit, pendingLimit int) (*persistence.Snapshot, error) {
	if h.held.Load() {
		h.loadsHeld.Add(1)
	}
	return h.Store.LoadSession(ctx, key, limit, pendingLimit)
}

func (h *heldStore) release() { h.held.Store(false); close(h.gate) }

// TestRestartWaitsForTheFailedIncarnationsWrites: a session that crashes while the write of a
// newly arrived message is still committing restarts only once that write is durable, so the
// new incarnation knows the message: it is run, and the next message gets a seq of its own.
// (Before, the new incarnation loaded its state at once: the message stayed unanswered until
// the next activation, and the next message collided with its seq and was refused.)
func TestRestartWaitsForTheFailedIncarnationsWrites(t *testing.T) {
	started, crash := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		text := req.Messages[len(req.Messages)-1].Text
		if text == "crash" && runs.Add(1) == 1 {
			close(started)
			<-crash
			panic("agent bug")
		}
		return &agents.Response{Text: "ok " + text}, nil
	})
	store := newHeldStore()
	r := MustStartDaemon(t, agent, daemonOpts{wrap: store.wrap})
	defer r.stop(t)

	r.inject(t, dm, "m1", "crash")
	<-started
	store.held.Store(true)
	go func() { // answered "unavailable" by the failing incarnation: it cannot know the outcome
		_, _ = r.fake.Inject(context.WithoutCancel(t.Context()), &platforms.Inbound{Source: dm, MessageID: "m2", Text: "second"})
	}()
	<-store.blocked // m2's write is committing
	close(crash)
	restarts := r.d.metrics.ActorRestarts.WithLabelValues("session")
	waitUntil(t, func() bool { return testutil.ToFloat64(restarts) >= 1 })
	store.release()
	if n := store.loadsHeld.Load(); n > 0 {
		t.Fatalf("the restarted session loaded its state while its predecessor's write was committing (%d loads)", n)
	}
	r.inject(t, dm, "m3", "third")
	got := map[string]string{}
	for _, o := range r.waitSent(t, 3) {
		got[o.InReplyTo[0]] = o.Text
	}
	for id, want := range map[string]string{"m1": "ok crash", "m2": "ok second", "m3": "ok third"} {
		if got[id] != want {
			t.Errorf("reply to %s = %q, want %q (all: %v)", id, got[id], want, got)
		}
	}
}

// TestRerunMessageIsNotInItsOwnHistory: a message run again after a crash is one of its turn's
// messages, not part of the history before it, and later turns see it once. (Before, a session
// that loaded a pending message put it in its history too, so the agent saw it twice.)
func TestRerunMessageIsNotInItsOwnHistory(t *testing.T) {
	var crashed atomic.Bool
	r := MustStart(t, historyAgent(func(text string) {
		if text == "crash" && crashed.CompareAndSwap(false, true) {
			panic("agent bug")
		}
	}), nil)
	r.inject(t, dm, "m1", "crash")
	r.waitSent(t, 1)
	r.inject(t, dm, "m2", "after")
	got := repliesByMessage(r.waitSent(t, 2))
	want := map[string][]string{"m1": {"[] crash"}, "m2": {"[crash] after"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("replies %v, want %v", got, want)
	}
}
