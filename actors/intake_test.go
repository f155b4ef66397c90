package actors

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
)

// TestMessageCaughtByTheStopIsDraining: a message taken in just before the daemon began to
// drain, whose session then stops before its write is acknowledged, fails with
// platforms.ErrDraining (and ErrUnavailable): the daemon is stopping. Before, it failed with
// ErrUnavailable alone, so Discord told its sender the message could not be stored and to send
// it again, and the next start's backfill read it back and answered it all the same.
func TestMessageCaughtByTheStopIsDraining(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		held := &heldCommits{hold: make(chan struct{}), release: make(chan struct{}), held: make(chan struct{}, 1)}
		close(held.hold)
		w := newManagerWorldWrites(t, echo.New(), nil, func(s persistence.Store) persistence.Store {
			held.Store = s
			return held
		})
		in := NewIntake(NewLocalRouter(w.system.Root, w.manager), identity.DefaultKeyOptions, metrics.New("fake"))
		errc := make(chan error, 1)
		go func() {
			_, err := in.Deliver(w.ctx, &platforms.Inbound{Source: w.src, MessageID: "m1", Text: "hi", ReceivedAt: time.Now()})
			errc <- err
		}()
		<-held.held // its write waits in the commit
		in.Drain()
		stopped := w.system.Root.PoisonFuture(w.manager)
		err := <-errc
		if !errors.Is(err, platforms.ErrDraining) || !errors.Is(err, platforms.ErrUnavailable) {
			t.Errorf("Deliver = %v, want ErrDraining and ErrUnavailable", err)
		}
		close(held.release)
		if err := stopped.Wait(); err != nil {
			t.Errorf("the manager did not stop: %v", err)
		}
	})
}

// TestDeliverUnansweredInTimeIsUnavailable: a message for a session that the manager holds
// while it backs off from refused writes (the database and the spool both failing: a full
// disk) gets no answer within the router's DefaultRequestTimeout, since the pause grows to a
// minute. Deliver then fails with platforms.ErrUnavailable, which a platform answers "send it
// again" (HTTP 503; sent again with the same id, it is stored once). Before, it failed with a
// bare ErrTimeout, which the HTTP API answered 500 "internal error" and logged as
// `ERR deliver failed`, on a real full disk, for every message of such a chat.
func TestDeliverUnansweredInTimeIsUnavailable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			out.Down.Store(true) // the disk fills while the first turn runs
			return &agents.Response{Text: "answer"}, nil
		})
		// No spool: a write the database refuses is refused, as when the spool fails too.
		w := newManagerWorldWrites(t, agent, nil, func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		// The session's restarts back off 1 s, 2 s, … while the turn's result is refused: it
		// starts again 1, 3, 7, 15, 31 and 63 s in, then 60 s later. A message that comes just
		// after one is held longer than a request waits.
		time.Sleep(64 * time.Second)
		synctest.Wait()
		in := NewIntake(NewLocalRouter(w.system.Root, w.manager), identity.DefaultKeyOptions, metrics.New("fake"))
		_, err := in.Deliver(context.Background(), &platforms.Inbound{Source: w.src, MessageID: "m2", Text: "two", ReceivedAt: time.Now()})
		if !errors.Is(err, platforms.ErrUnavailable) {
			t.Errorf("Deliver to a session held while writes are refused = %v, want platforms.ErrUnavailable", err)
		}
		out.Down.Store(false)
	})
}
