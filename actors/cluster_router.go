package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/cluster"
	"google.golang.org/protobuf/proto"
)

// ClusterRouter routes to sessions as cluster grains (SessionKind): the cluster finds the
// member that owns a key and activates its grain there. Every message must be a protobuf
// message (messages.proto), since it may cross members.
type ClusterRouter struct {
	c   *cluster.Cluster
	log *slog.Logger
}

// NewClusterRouter returns a router over c.
func NewClusterRouter(c *cluster.Cluster, log *slog.Logger) *ClusterRouter {
	return &ClusterRouter{c: c, log: log}
}

// clusterRetries is how often a request is tried: the cluster retries when the grain it had
// cached is gone (a dead letter: the session passivated or moved) or the member it places the
// key on does not answer (it just left, and the topology does not show it yet).
const clusterRetries = 8

// retryBackoff waits before retry i+1 and returns i+1: 50 ms doubling to 1 s, about 3.5 s over
// all retries, which outlasts a membership renewal (member_ttl/3) after a member leaves.
// protoactor's default retries at once, so a leaving member made requests fail in a burst.
func retryBackoff(i int) int {
	time.Sleep(min(50*time.Millisecond<<i, time.Second))
	return i + 1
}

// Tell sends msg to the session of key without waiting. Finding (or activating) the grain
// may take a network round trip, so it happens on a goroutine of its own; a message the
// cluster cannot place is logged and dropped (Tell carries only timer nudges, which repeat).
func (r *ClusterRouter) Tell(key string, msg any) {
	if _, ok := msg.(proto.Message); !ok {
		r.log.Error("cluster router: not a protobuf message", "type", fmt.Sprintf("%T", msg))
		return
	}
	go func() {
		pid := r.c.Get(key, SessionKind)
		if pid == nil {
			r.log.Warn("cluster router: no member took the session", "message", fmt.Sprintf("%T", msg))
			return
		}
		r.c.ActorSystem.Root.Send(pid, msg)
	}()
}

// Request sends msg to the session of key and waits for its answer, at most until ctx ends or
// DefaultRequestTimeout passes. The cluster may deliver a retried request twice; every session
// request is idempotent (a Deliver is recognised by its message id).
func (r *ClusterRouter) Request(ctx context.Context, key string, msg any) (any, error) {
	if _, ok := msg.(proto.Message); !ok {
		return nil, fmt.Errorf("request %T to %s: not a protobuf message", msg, key)
	}
	timeout := DefaultRequestTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	if timeout <= 0 {
		return nil, ctx.Err()
	}
	res, err := r.c.Request(key, SessionKind, msg, cluster.WithTimeout(timeout), cluster.WithRetryCount(clusterRetries),
		cluster.WithRetryAction(retryBackoff))
	switch {
	case err == nil && res == nil:
		return nil, fmt.Errorf("request %T to %s: %w", msg, key, ErrTimeout)
	case errors.Is(err, context.DeadlineExceeded):
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("request %T to %s: %w", msg, key, ErrTimeout)
	case err != nil:
		return nil, fmt.Errorf("request %T to %s: %w", msg, key, err)
	}
	return res, nil
}
