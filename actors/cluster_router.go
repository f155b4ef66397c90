package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/protobuf/proto"
)

// ClusterRouter routes to sessions as cluster grains (SessionKind): the cluster finds the
// member that owns a key and activates its grain there. Every message must be a protobuf
// message (messages.proto), since it may cross members.
type ClusterRouter struct {
	c   *cluster.Cluster
	log *slog.Logger

	mu sync.Mutex
	// left is closed at the next change of membership that drops a member, and then replaced:
	// an attempt waiting for the answer of a session on that member stops waiting (Request).
	left chan struct{}
	// members are the ids of the members in the last membership by their address; nil before
	// the first.
	members map[string]string
}

// NewClusterRouter returns a router over c.
//
// The router caches the grain of each key it routes to (the cluster's PidCache); a grain on
// this member leaves the cache when it stops, one on another member only when a request to it
// fails or its member leaves. So the router also forgets a grain when the cluster announces
// that it stopped anywhere (the placement actor broadcasts ActivationTerminated to every
// member when a grain passivates, moves or its member leaves): otherwise a daemon that runs
// for months keeps one entry per key it ever routed to another member. An announcement that
// is lost (its member unreachable at that moment) or that overtakes the caching of the grain
// it names leaves one entry, until a request to it fails.
//
// An attempt sent to a session on a member that then leaves the membership (it died, or was
// dropped) is given up at once, and sent again to the key's new owner: before, it waited out
// clusterAttemptTimeout, and a message for a dead member's chat was answered up to 10 s after
// the takeover, whatever member_ttl (found by an audit). So is one whose member is replaced
// in the membership by a newer one on its address (a process restarted on its port, as
// under systemd's Restart=always: the store takes the old one for gone once the new one
// registers); before, the address stayed in the membership and the attempt waited out its
// 10 s (found by an audit).
func NewClusterRouter(c *cluster.Cluster, log *slog.Logger) *ClusterRouter {
	r := &ClusterRouter{c: c, log: log, left: make(chan struct{})}
	c.ActorSystem.EventStream.Subscribe(func(ev any) {
		switch t := ev.(type) {
		case *cluster.ActivationTerminated:
			if t.Pid != nil && t.ClusterIdentity != nil && t.ClusterIdentity.Kind == SessionKind {
				c.PidCache.RemoveByValue(t.ClusterIdentity.Identity, SessionKind, t.Pid)
			}
		case *cluster.ClusterTopology:
			r.topology(t)
		}
	})
	return r
}

// topology notes a change of membership.
func (r *ClusterRouter) topology(t *cluster.ClusterTopology) {
	members := make(map[string]string, len(t.Members))
	for _, m := range t.Members {
		members[m.Address()] = m.Id
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.members = members
	if len(t.Left) > 0 {
		close(r.left)
		r.left = make(chan struct{})
	}
}

// errMemberLeft is an attempt given up because the member of its session left the membership
// (or another member took its address).
var errMemberLeft = errors.New("the session's member left the cluster")

// memberAt returns the id of the member at pid's address in the last membership; "" when it
// has none, or before the first membership.
func (r *ClusterRouter) memberAt(pid *actor.PID) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.members[pid.Address]
}

// await waits for the answer of an attempt sent to pid, until ctx ends or pid's member leaves
// the membership (errMemberLeft): no member is at its address any more, or one other than
// member, the one there when the attempt was sent ("" when unknown: only the address is
// judged). An attempt that a member restarted on the address had answered (it reached the
// new process, whose view of the cluster was newer than this one's) is then sent again, as
// after a timeout: every session request may arrive twice.
func (r *ClusterRouter) await(ctx context.Context, f *actor.Future, pid *actor.PID, member string) (any, error) {
	type answer struct {
		res any
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		res, err := f.Result() // it ends at the attempt's timeout at the latest
		ch <- answer{res, err}
	}()
	for {
		r.mu.Lock()
		left := r.left
		id, ok := r.members[pid.Address]
		gone := r.members != nil && (!ok || member != "" && id != member)
		r.mu.Unlock()
		if gone { // checked with left taken: a member that left before is not missed
			return nil, errMemberLeft
		}
		select {
		case a := <-ch:
			return a.res, a.err
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-left:
		}
	}
}

// gone reports whether pid's member is not in the last membership.
func (r *ClusterRouter) gone(pid *actor.PID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.members[pid.Address]
	return r.members != nil && !ok
}

// clusterAttemptTimeout bounds one attempt of a request. A request in flight to a member that
// dies or leaves is never answered; it is tried again (with the grain looked up anew) instead
// of waiting out the whole request. A retried request may arrive twice; every session request
// is idempotent (a Deliver is recognised by its message id, a reset sent again is marked Retry).
const clusterAttemptTimeout = 10 * time.Second

// retryBackoff is the wait before attempt i+1: 50 ms doubling to 1 s, so that the retries
// outlast a membership renewal (member_ttl/3) after a member leaves and its grains are gone.
func retryBackoff(i int) time.Duration { return min(50*time.Millisecond<<i, time.Second) }

// Tell sends msg to the session of key without waiting. Finding (or activating) the grain
// may take a network round trip, so it happens on a goroutine of its own; a message the
// cluster cannot place is logged and dropped (Tell carries only timer nudges, which repeat).
func (r *ClusterRouter) Tell(key string, msg any) {
	if _, ok := msg.(proto.Message); !ok {
		r.log.Error("cluster router: not a protobuf message", "session", key, "type", fmt.Sprintf("%T", msg))
		return
	}
	go func() {
		pid := r.c.Get(key, SessionKind)
		if pid == nil {
			r.log.Warn("cluster router: no member took the session", "session", key, "type", fmt.Sprintf("%T", msg))
			return
		}
		r.c.ActorSystem.Root.Send(pid, msg)
	}()
}

// Request sends msg to the session of key and waits for its answer, at most until ctx ends or
// DefaultRequestTimeout passes. It looks the key's grain up (activating it on the member that
// owns the key) and tries again, after a short backoff, when the grain is gone (a dead
// letter: the session passivated or moved), no member takes the key, an attempt gets no
// answer within clusterAttemptTimeout or its member leaves the membership (it died or left, or
// a newer member registered its address),
// or the answer says the session stopped before it stored the message or reset
// (ErrCodeStopped: its member is leaving). A reset sent again after an attempt with no answer, or answered stopped, says so
// (ResetSession.Retry), with when the first attempt went out, so that the session does not
// reset twice. An Unsupported answer (the key's member runs an older version, which does not
// know the request) ends it at once with a *platforms.OutdatedMemberError: nothing was done.
// One from the key's holder (Unsupported.to_holder: the key's owner waits for it to let go of
// the key, and then does the request itself) is sent again as after an answer stopped, until
// the deadline, which ends it with that error; before, it ended at once, a moment before the
// owner would have done it. After an attempt that may have done the request (no answer, or
// answered stopped), an Unsupported answer ends it as such an attempt ends (the stopped answer,
// or ErrTimeout), never with that error, which says nothing was done; before, it did
// (TestClusterRouterUnsupportedAnswers).
func (r *ClusterRouter) Request(ctx context.Context, key string, msg any) (any, error) {
	if _, ok := msg.(proto.Message); !ok {
		return nil, fmt.Errorf("request %T to %s: not a protobuf message", msg, key)
	}
	timeout := DefaultRequestTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	sent := time.Now()
	deadline := sent.Add(timeout)
	lastErr := errors.New("no member took the session")
	var stopped any    // the last ErrCodeStopped answer, given if no attempt succeeds
	var outdated error // the last Unsupported answer of the key's holder, given if no attempt succeeds
	reached := false   // an attempt may have stored the message: no answer, or stopped
	for attempt := 0; ; attempt++ {
		remaining := time.Until(deadline)
		if remaining <= 0 {
			break
		}
		pid, _ := r.c.PidCache.Get(key, SessionKind)
		if pid != nil && r.gone(pid) {
			r.c.PidCache.RemoveByValue(key, SessionKind, pid) // its member left since it was cached
			pid = nil
		}
		if pid == nil {
			if pid = r.c.Get(key, SessionKind); pid != nil {
				r.c.PidCache.Set(key, SessionKind, pid)
			}
		}
		if pid != nil {
			if reset, ok := msg.(*ResetSession); ok && reached && !reset.Retry {
				// The last attempt may have done it, and the session may have taken messages since.
				msg = &ResetSession{Reason: reset.Reason, Retry: true, FirstSentAtUnixNano: sent.UnixNano()}
			}
			member := r.memberAt(pid) // before the send: a member that replaces it later is seen
			res, err := r.await(ctx, r.c.ActorSystem.Root.RequestFuture(pid, msg, min(remaining, clusterAttemptTimeout)), pid, member)
			if err != nil && ctx.Err() != nil {
				return nil, ctx.Err()
			}
			u, unsupported := res.(*Unsupported)
			unsupported = unsupported && err == nil
			if unsupported {
				_, uerr := answerOf(res)
				uerr = fmt.Errorf("request %T to %s: %w", msg, key, uerr)
				switch {
				case u.ToHolder && time.Until(deadline) > retryBackoff(attempt):
					// The key's holder, which the key's owner asked to let go of it: once it has,
					// the owner does the request itself. Sent again, as after an answer stopped.
					outdated, lastErr = uerr, uerr
					r.log.Debug("cluster router: the session's holder runs an older version, which does not know the request; sending it again",
						"session", key, "member", u.Address, "attempt", attempt+1)
				case reached:
					// An attempt before may have done it: not "nothing was done".
					return r.unanswered(msg, key, stopped, uerr)
				default:
					// The key's member runs an older version, which does not know the request:
					// nothing was done, and no other attempt does better until it is upgraded.
					return nil, uerr
				}
			} else if dr, ok := res.(*DeliverResult); ok && err == nil && dr.ErrorCode == ErrCodeStopped {
				stopped, err = dr, errors.New(dr.Error)
				reached = true // its write may have committed
				r.log.Debug("cluster router: the session stopped before it stored the message; sending it again",
					"session", key, "message_id", dr.MessageId, "attempt", attempt+1)
			} else if rr, ok := res.(*ResetResult); ok && err == nil && rr.ErrorCode == ErrCodeStopped {
				// Its write may have committed: the next attempt is a retry (see above).
				stopped, err = rr, errors.New(rr.Error)
				reached = true
				r.log.Debug("cluster router: the session stopped before it stored the reset; sending it again",
					"session", key, "attempt", attempt+1)
			} else if err == nil {
				if reached {
					return taken(msg, res), nil
				}
				return res, nil
			} else if !errors.Is(err, actor.ErrTimeout) && !errors.Is(err, actor.ErrDeadLetter) &&
				!errors.Is(err, remote.ErrTimeout) && !errors.Is(err, remote.ErrDeadLetter) && !errors.Is(err, errMemberLeft) {
				return nil, fmt.Errorf("request %T to %s: %w", msg, key, err)
			}
			if !unsupported {
				r.c.PidCache.RemoveByValue(key, SessionKind, pid)
				lastErr = err
				// Unanswered, it may have been done: as after a timeout.
				reached = reached || errors.Is(err, actor.ErrTimeout) || errors.Is(err, remote.ErrTimeout) || errors.Is(err, errMemberLeft)
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(min(retryBackoff(attempt), max(time.Until(deadline), 0))):
		}
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if outdated != nil && !reached {
		return nil, outdated
	}
	return r.unanswered(msg, key, stopped, lastErr)
}

// unanswered ends a request none of whose attempts was answered for good: with stopped, the
// last answer stopped, if there was one (its write may have committed), else ErrTimeout
// (last: lastErr). Either says that the request may have been done.
func (r *ClusterRouter) unanswered(msg any, key string, stopped any, lastErr error) (any, error) {
	if stopped != nil {
		return stopped, nil
	}
	return nil, fmt.Errorf("request %T to %s: %w (last: %v)", msg, key, ErrTimeout, lastErr)
}

// taken is the answer to a Deliver sent again after an attempt that got no answer (its member
// was slow to activate the session, or died) or was answered ErrCodeStopped (its session
// stopped before its write was answered). When that attempt stored the message, the
// session answers the new one as a duplicate; but the sender delivered it once, and the
// acknowledgment must say that it was taken (G4), not that it had been sent before. What the
// first attempt was answered is lost: the message is stored and its turn comes (or came), so it
// is acknowledged queued, a command as a command. A platform's own re-delivery that meets such
// a retry is acknowledged the same way; it is answered once all the same.
//
// A RequeueMessage sent again after such an attempt finds its message pending (or, its turn
// quick, done) when that attempt requeued it: that is the requeue the operator asked for,
// answered as done, not refused as "not quarantined".
func taken(msg, res any) any {
	if _, ok := msg.(*RequeueMessage); ok {
		r, isResult := res.(*RequeueResult)
		if !isResult || r.ErrorCode != ErrCodeNotQuarantined ||
			(r.Status != persistence.StatusPending && r.Status != persistence.StatusDone) {
			return res
		}
		return &RequeueResult{SessionId: r.SessionId, MessageId: r.MessageId, QueueDepth: r.QueueDepth,
			Disposition: platforms.Queued}
	}
	d, ok := msg.(*Deliver)
	r, isResult := res.(*DeliverResult)
	if !ok || !isResult || r.ErrorCode != "" || r.Disposition != platforms.Duplicate {
		return res
	}
	r = proto.Clone(r).(*DeliverResult)
	r.Disposition = platforms.Queued
	if _, cmd := parseCommand(d.Text); cmd {
		r.Disposition = platforms.Command
	}
	return r
}
