package actors

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
)

// gatedCommits is a store whose commits wait, once armed, until open is closed.
type gatedCommits struct {
	persistence.Store
	armed   atomic.Bool
	waiting chan struct{} // a commit waits (buffered: told once)
	open    chan struct{}
}

// newGatedWorld is a manager world whose commits pass a gate (a test arms it to hold a write in
// flight) and then, while refusing is set, refuse the writes that hold an op refuse picks (when
// refuse is not nil), as a database failing for a moment refuses them.
func newGatedWorld(t *testing.T, agent agents.Agent, setup func(*Deps), refuse func(persistence.Op) bool) (w *managerWorld, g *gatedCommits, refusing *atomic.Bool) {
	t.Helper()
	g = &gatedCommits{waiting: make(chan struct{}, 1), open: make(chan struct{})}
	refusing = &atomic.Bool{}
	refused := &refusedWrites{refuse: func(op persistence.Op) bool { return refuse != nil && refusing.Load() && refuse(op) }}
	w = newManagerWorldWrites(t, agent, setup, func(s persistence.Store) persistence.Store {
		refused.Store = s
		g.Store = refused
		return g
	})
	return w, g, refusing
}

func (g *gatedCommits) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	if g.armed.Load() {
		select {
		case g.waiting <- struct{}{}:
		default:
		}
		<-g.open
	}
	return g.Store.Commit(ctx, groups)
}

// TestCommandCaughtByACrashIsAnswered: the session crashes (m1's agent panics) while the write
// of a command (/title) is in flight. Its sender gets an answer: it cannot be told whether the
// command was stored, and is asked to send it again with the same id. (Before, the write's
// answer reached the restarted session, which knew nothing of it: the sender waited in vain,
// though the command was stored and its answer sent to the chat.)
func TestCommandCaughtByACrashIsAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		crash := make(chan struct{})
		var crashed atomic.Bool
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			if req.Identity.MessageID == "m1" && crashed.CompareAndSwap(false, true) {
				<-crash
				panic("agent bug")
			}
			return &agents.Response{Text: "ok"}, nil
		})
		g := &gatedCommits{waiting: make(chan struct{}, 1), open: make(chan struct{})}
		w := newManagerWorldWrites(t, agent, nil, func(s persistence.Store) persistence.Store { g.Store = s; return g })
		if r := w.deliver(t, "m1", "first"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		g.armed.Store(true)
		f := w.request("k1", "/title kept")
		<-g.waiting
		close(crash)
		res, err := f.Result()
		close(g.open)
		if err != nil {
			t.Fatalf("/title was never answered: %v", err)
		}
		if r := res.(*DeliverResult); r.ErrorCode != ErrCodeStopped || r.MessageId != "k1" {
			t.Errorf("/title: %+v, want error %s for k1", r, ErrCodeStopped)
		}
		synctest.Wait()
	})
}

// TestCommandWhoseCommitAnswerWasLostIsAnsweredInOrder: /status is stored, but the answer of
// its commit is lost (a connection lost after COMMIT) and the store cannot be read just then:
// its sender is told it could not be stored, and its answer waits in the outbox. A later /help must not be answered before it:
// the session starts again from the store, which sends the waiting answer first. (Before, the
// session went on: /help's answer went out, and /status's only at the next activation, after
// it.)
func TestCommandWhoseCommitAnswerWasLostIsAnsweredInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		blind := &blindReads{}
		w := newManagerWorldWrites(t, agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "ok"}, nil
		}), blind.wrap, out.Wrap)
		w.deliver(t, "m1", "first")
		w.awaitTurnEnds(1)
		out.Lost.Store(1)
		blind.on.Store(true) // the session cannot read whether the write applied
		if r := w.deliver(t, "k1", "/status"); r.ErrorCode == "" {
			t.Fatalf("/status: %+v, want an error (its commit's answer was lost)", r)
		}
		blind.on.Store(false)
		// /help may come while the session waits out its pause after the lost answer (the
		// store was unavailable to it): it is then refused at once, and sent again, as a
		// platform's client does.
		for r := w.deliver(t, "k2", "/help"); r.ErrorCode == "unavailable"; r = w.deliver(t, "k2", "/help") {
			time.Sleep(time.Second)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		var order []string
		for len(w.sent) > 0 {
			for _, id := range (<-w.sent).Out.InReplyTo {
				if id != "m1" { // sent again by the reload: the world's platform confirms nothing
					order = append(order, id)
				}
			}
		}
		if !slices.Equal(order, []string{"k1", "k2"}) {
			t.Errorf("answers went out for %v, want [k1 k2] (each once, in order)", order)
		}
	})
}
