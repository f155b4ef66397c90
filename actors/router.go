package actors

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// SessionRouter sends messages to session actors by key. It hides whether sessions are local
// actors (LocalRouter) or cluster virtual actors.
type SessionRouter interface {
	// Tell sends msg to the session of key without waiting for an answer.
	Tell(key string, msg any)
	// Request sends msg to the session of key and waits for its answer.
	Request(ctx context.Context, key string, msg any) (any, error)
}

// ErrTimeout is returned by a request that got no answer in time.
var ErrTimeout = errors.New("actors: session did not answer in time")

// ErrCodeStopped is the DeliverResult.ErrorCode of a message whose session stopped before the
// message's write was acknowledged: its member stops past its drain, for instance. The message
// may or may not be stored; sent again with the same message id it is stored once. The
// cluster router sends it again itself, to the key's next owner.
const ErrCodeStopped = "stopped"

// ErrCodeConflict answers a message whose id is already another conversation's in the same
// chat (platforms.ErrConflict): it is not a re-delivery, so "duplicate" would misstate it, and
// the original's replies are not its sender's to see.
const ErrCodeConflict = "conflict"

// ErrCodeUnavailable answers a request the store could not take or read now (an outage, writes
// waiting in the spool): nothing was done, and it may be sent again shortly.
const ErrCodeUnavailable = "unavailable"

// DefaultRequestTimeout bounds a request whose context has no deadline.
const DefaultRequestTimeout = 30 * time.Second

// LocalRouter routes through the in-process SessionManager.
type LocalRouter struct {
	root    *actor.RootContext
	manager *actor.PID
}

// NewLocalRouter returns a router that sends through manager.
func NewLocalRouter(root *actor.RootContext, manager *actor.PID) *LocalRouter {
	return &LocalRouter{root: root, manager: manager}
}

// Tell sends msg to the session of key.
func (r *LocalRouter) Tell(key string, msg any) {
	r.root.Send(r.manager, &Routed{Key: key, Msg: msg})
}

// Request sends msg to the session of key and waits for the answer, at most until ctx ends or
// DefaultRequestTimeout passes.
func (r *LocalRouter) Request(ctx context.Context, key string, msg any) (any, error) {
	timeout := DefaultRequestTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	if timeout <= 0 {
		return nil, ctx.Err()
	}
	f := r.root.RequestFuture(r.manager, &Routed{Key: key, Msg: msg}, timeout)
	res, err := Await(ctx, f)
	switch {
	case err == nil:
		if res, err = answerOf(res); err != nil { // (only a member of a cluster answers so)
			return nil, fmt.Errorf("request %T to %s: %w", msg, key, err)
		}
		return res, nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case errors.Is(err, actor.ErrTimeout):
		return nil, fmt.Errorf("request %T to %s: %w", msg, key, ErrTimeout)
	default:
		return nil, fmt.Errorf("request %T to %s: %w", msg, key, err)
	}
}

// Await waits for f's answer or for ctx to end, whichever comes first: a caller that gave up
// (an HTTP client gone, a server closing its connections) is not held until the future's
// timeout. An answer that comes after ctx ended is dropped; the request itself is not undone.
func Await(ctx context.Context, f *actor.Future) (any, error) {
	if ctx.Done() == nil {
		return f.Result()
	}
	type answer struct {
		res any
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		res, err := f.Result()
		ch <- answer{res, err}
	}()
	select {
	case a := <-ch:
		return a.res, a.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
