package actors

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// TestRequestEndsWithItsContext: a request whose caller gives up (an HTTP client gone, a
// server closing its connections at the end of a stop) returns when its context ends, not
// when its deadline passes. Before, it waited for the session's answer until the deadline.
func TestRequestEndsWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		system := actor.NewActorSystem()
		defer system.Shutdown()
		// A manager that takes every request and never answers: a session stuck in a long write.
		taken := make(chan struct{}, 1)
		mute := system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			if _, ok := c.Message().(*Routed); ok {
				taken <- struct{}{}
			}
		}))
		r := NewLocalRouter(system.Root, mute)

		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		errc := make(chan error, 1)
		go func() {
			_, err := r.Request(ctx, "http:dm:u1", &Deliver{MessageId: "m1"})
			errc <- err
		}()
		<-taken
		cancel()
		synctest.Wait()
		select {
		case err := <-errc:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Request = %v, want context.Canceled", err)
			}
		default:
			t.Fatal("Request still waits after its context ended")
		}
		time.Sleep(time.Hour) // the abandoned future times out, and its waiter ends
	})
}
