package actors

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
)

// gatedCommits is a store whose commits wait, once armed, until open is closed.
type gatedCommits struct {
	persistence.Store
	armed   atomic.Bool
	waiting chan struct{} // a commit waits (buffered: told once)
	open    chan struct{}
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
