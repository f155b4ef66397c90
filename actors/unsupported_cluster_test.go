//go:build !race

// A cluster test: protoactor's cluster code is not race-clean, so it runs without -race (see
// supervisor/cluster_test.go).

package actors

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	testprovider "github.com/asynkron/protoactor-go/cluster/clusterproviders/test"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/agentgate/agentgate/platforms"
)

// scriptedMember is a one-member cluster on 127.0.0.1 whose session grains hand their requests
// to a manager that answers each with the next of the answers script last set (the last one
// again when they run out), as the key's member would; asked counts the requests since:
// its router is a real ClusterRouter.
func scriptedMember(t *testing.T) (*ClusterRouter, func(answers ...any), func() int) {
	t.Helper()
	var answers []any
	quiet := slog.New(slog.DiscardHandler)
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
	var mu sync.Mutex
	asked := 0
	manager := system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*Routed); !ok {
			return
		}
		mu.Lock()
		a := answers[min(asked, len(answers)-1)]
		asked++
		mu.Unlock()
		c.Respond(a)
	}))
	kind := NewSessionKind(func() *actor.PID { return manager })
	cfg := cluster.Configure("unsupported-test", testprovider.NewTestProvider(testprovider.NewInMemAgent()), disthash.New(),
		remote.Configure("127.0.0.1", 0), cluster.WithKinds(kind))
	c := cluster.New(system, cfg)
	c.StartMember()
	t.Cleanup(func() { c.Shutdown(true) })
	script := func(a ...any) {
		mu.Lock()
		defer mu.Unlock()
		answers, asked = a, 0
	}
	return NewClusterRouter(c, slog.New(slog.NewTextHandler(t.Output(), nil))), script, func() int {
		mu.Lock()
		defer mu.Unlock()
		return asked
	}
}

// TestClusterRouterUnsupportedAnswers: how the cluster router takes an Unsupported answer (the
// member the request reached runs an older version, which does not know it).
//
// From the key's member itself, it ends the request at once with an OutdatedMemberError:
// nothing was done.
//
// From the key's holder (to_holder: the key's owner, which knows the request, forwarded it
// there while it waits for the holder to let go of the key), it is sent again, as after an
// answer stopped: once the holder has let go, the owner does it. Before, the router gave up at
// once, and the client was told to upgrade the member, a moment before the owner would have
// done the request. If the holder still answers so at the deadline, it ends with the
// OutdatedMemberError.
//
// After an attempt that may have done the request (no answer, or answered stopped), it is not
// an OutdatedMemberError, which says nothing was done: the request ends as such an attempt
// ends (the stopped answer). Before, the router said nothing was done.
func TestClusterRouterUnsupportedAnswers(t *testing.T) {
	const key = "agent:main:http:dm:c"
	old := &Unsupported{Version: "v1.9.0", Address: "10.0.0.7:6340", Node: "b", Request: "Forward field 11"}
	oldHolder := &Unsupported{Version: "v1.9.0", Address: "10.0.0.7:6340", Node: "b", Request: "Forward field 11", ToHolder: true}
	r, script, asked := scriptedMember(t)
	ok := &DeliverResult{SessionKey: key, MessageId: "m1", Disposition: platforms.Queued}
	stopped := &DeliverResult{SessionKey: key, MessageId: "m1", ErrorCode: ErrCodeStopped, Error: "the session stopped"}

	for _, c := range []struct {
		name     string
		answers  []any
		outdated bool // an OutdatedMemberError
		want     any  // else this answer
		asked    int  // 0: any number
	}{
		{"the member", []any{old, ok}, true, nil, 1},
		{"the holder, then the owner", []any{oldHolder, oldHolder, ok}, false, ok, 3},
		{"the holder until the deadline", []any{oldHolder}, true, nil, 0},
		{"after an answer stopped", []any{stopped, old, ok}, false, stopped, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			script(c.answers...)
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			res, err := r.Request(ctx, key, &Deliver{SessionKey: key, MessageId: "m1", Text: "hi"})
			oe, isOutdated := errors.AsType[*platforms.OutdatedMemberError](err)
			switch {
			case c.outdated && (!isOutdated || oe.Address != old.Address || oe.Version != old.Version):
				t.Errorf("Request = %v, %v; want an OutdatedMemberError naming %s, %s", res, err, old.Address, old.Version)
			case !c.outdated && (err != nil || res != c.want):
				t.Errorf("Request = %v, %v; want %v", res, err, c.want)
			}
			if n := asked(); c.asked != 0 && n != c.asked {
				t.Errorf("the member was asked %d times, want %d", n, c.asked)
			}
		})
	}
}
