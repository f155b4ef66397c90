package actors

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
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
