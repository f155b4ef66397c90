//go:build !race

// A multi-member cluster test: without -race, as cluster_test.go says why.

package supervisor

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/agentgate/agentgate/actors"
	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/buildinfo"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
)

// TestClusterRequestAnOlderMemberDoesNotKnowIsAnswered503MemberOutdated: the whole path of a
// request that the member holding its session does not know, through the HTTP API of a real
// cluster of three members on one database. a owns the chat's key and leaves (it stops while a
// turn of another of its chats runs, so its drain lasts); b, the key's successor, stands in for
// a member of an older version, which reads the Forward of a message (Forward.deliver) as one
// of a kind it does not know (managerMiddleware: what an older member reads of a case a later
// version added). A message POSTed to c goes to a (the key is still a's until it has
// withdrawn), which hands it on to b; b answers Unsupported, and c's client gets 503
// member_outdated at once, naming b's cluster address and version and saying to upgrade it,
// with the message's id and Retry-After 60. Nothing was done: the store holds no such
// message, and b says so at WRN. The units are tested one by one elsewhere
// (TestForwardOfAnUnknownKindIsAnsweredUnsupported, TestClusterRouterUnsupportedAnswers,
// TestOutdatedMemberIsAnswered503MemberOutdated); no test ran them together through the
// cluster's remote before.
func TestClusterRequestAnOlderMemberDoesNotKnowIsAnswered503MemberOutdated(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	release := make(chan struct{})
	started := make(chan string, 1)
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		if req.Messages[0].Text == "slow" {
			started <- req.Identity.SessionKey
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return &agents.Response{Text: "ok"}, nil
	})
	var aLog, bLog testutil.Buffer
	// a's drain outlasts the test's POST: until it ends, a holds its keys.
	a := MustStartDaemon(t, agent, daemonOpts{tweak: clusterOn(dsn), logs: &aLog, drain: 30 * time.Second})
	b := MustStartDaemon(t, agent, daemonOpts{tweak: clusterOn(dsn), logs: &bLog,
		managerMiddleware: []actor.ReceiverMiddleware{readsAsOlder(3)}}) // Forward.deliver
	c := MustStartDaemon(t, agent, daemonOpts{tweak: clusterOn(dsn)})
	rs := []*runtime{a, b, c}
	releaseOnce := sync.OnceFunc(func() { close(release) })
	var stopped chan struct{} // closed once a has stopped; nil before its stop began
	defer func() {
		releaseOnce() // a failed test must not hold a's drain
		if stopped == nil {
			a.stop(t)
		} else {
			<-stopped
		}
		c.stop(t)
		b.stop(t)
	}()
	waitForMembers(t, rs)

	// The slow chat's key is a's; the other chat's too, and b's among the members that stay.
	members := c.d.cluster.MemberList.Members().Members()
	owner := ownerOf(members)
	successor := ownerOf(slices.DeleteFunc(slices.Clone(members), func(m *cluster.Member) bool { return m.Address() == a.d.system.Address() }))
	httpChat := func(i int) identity.Source {
		return identity.Source{Platform: httpplatform.Name, ChatType: identity.ChatDM, ChatID: chat(i).ChatID, UserID: "u"}
	}
	slow, other := -1, -1
	for i := 0; slow < 0 || other < 0; i++ {
		if slow < 0 && owner(c.d.intake.Key(chat(i))) == a.d.system.Address() {
			slow = i
		}
		if key := c.d.intake.Key(httpChat(i)); other < 0 && owner(key) == a.d.system.Address() && successor(key) == b.d.system.Address() {
			other = i
		}
	}
	a.inject(t, chat(slow), "slow-1", "slow")
	<-started

	stopped = make(chan struct{})
	go func() {
		defer close(stopped)
		a.stop(t)
	}()
	waitUntil(t, func() bool {
		return strings.Contains(aLog.String(), "the member leaves the cluster; its sessions hand their keys on")
	})

	sent := time.Now()
	status, retry, body := postMessageTo(t, c.d, httpChat(other).ChatID, "m-outdated")
	if took := time.Since(sent); took > 5*time.Second {
		t.Errorf("POST /v1/messages answered after %v, want at once (no attempt waited out)", took)
	}
	if status != http.StatusServiceUnavailable || body.Error.Code != httpplatform.CodeMemberOutdated {
		t.Fatalf("POST /v1/messages = %d %+v, want 503 %s", status, body.Error, httpplatform.CodeMemberOutdated)
	}
	for _, want := range []string{b.d.system.Address(), buildinfo.Version(), "runs an older agentgate", "Forward field 3", "nothing was done", "upgrade it"} {
		if !strings.Contains(body.Error.Message, want) {
			t.Errorf("member_outdated message %q, want it to say %q", body.Error.Message, want)
		}
	}
	if body.MessageID != "m-outdated" || retry != "60" {
		t.Errorf("member_outdated message_id %q, Retry-After %q; want m-outdated and 60", body.MessageID, retry)
	}
	if _, err := c.d.store.FindInbound(t.Context(), httpplatform.Name, httpChat(other).ChatID, "m-outdated"); !errors.Is(err, persistence.ErrNotFound) {
		t.Errorf("FindInbound(m-outdated) = %v, want not found: nothing was done", err)
	}
	if !strings.Contains(bLog.String(), "level=WARN msg=\"another cluster member forwarded a request of a kind this agentgate does not know") {
		t.Errorf("b did not say it did not know the request; its log:\n%s", bLog.String())
	}

	releaseOnce()
	<-stopped // within its stop's 30 s
	if n := repliesTo(rs, "slow-1"); n != 1 {
		t.Errorf("the slow message answered %d times, want once", n)
	}
}

// readsAsOlder is a session manager's receive middleware that reads a Forward whose msg is
// field num as a member of a version before that field reads it: the field among its unknown
// ones, msg unset.
func readsAsOlder(num protoreflect.FieldNumber) actor.ReceiverMiddleware {
	return func(next actor.ReceiverFunc) actor.ReceiverFunc {
		return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
			f, ok := env.Message.(*actors.Forward)
			fd := (&actors.Forward{}).ProtoReflect().Descriptor().Fields().ByNumber(num)
			if !ok || !f.ProtoReflect().Has(fd) {
				next(c, env)
				return
			}
			inner, err := proto.Marshal(f.ProtoReflect().Get(fd).Message().Interface())
			if err != nil {
				panic(err)
			}
			old := proto.Clone(f).(*actors.Forward)
			m := old.ProtoReflect()
			m.Clear(fd)
			m.SetUnknown(protowire.AppendBytes(protowire.AppendTag(m.GetUnknown(), num, protowire.BytesType), inner))
			next(c, &actor.MessageEnvelope{Header: env.Header, Message: old, Sender: env.Sender})
		}
	}
}
