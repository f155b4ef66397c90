package actors

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/buildinfo"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/platforms"
)

// forwardFromANewerMember is a Forward of key as this version reads one that a newer member
// sent with a kind of message added after this version: its msg is field 11 (an unknown field
// here), so it reads as unset.
func forwardFromANewerMember(t *testing.T, key string) *Forward {
	t.Helper()
	b, err := proto.Marshal(&Forward{Key: key, Hops: 1, ToHolder: true})
	if err != nil {
		t.Fatal(err)
	}
	// The newer kind's message: a field of its own (1: a message id).
	inner := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "m-42")
	b = protowire.AppendBytes(protowire.AppendTag(b, 11, protowire.BytesType), inner)
	var f Forward
	if err := proto.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if f.Msg != nil || f.Key != key {
		t.Fatalf("read %v, want key %s and no msg", &f, key)
	}
	return &f
}

// TestForwardOfAnUnknownKindIsAnsweredUnsupported: a member that takes a request whose key
// another, older member holds (or owns, or takes over) forwards it to that member's manager in
// a Forward; a request of a kind added since is a field of Forward's msg that the older member
// does not know. Its manager answers Unsupported at once, naming its version, address and node
// and what it did not know, does nothing (no session starts), and says so at WRN once a minute
// at most, with what to do. Before, it dropped the Forward unanswered, and the requester waited
// out its timeout and said its answer was lost, "it may have requeued", though nothing was done.
// The router turns the answer into a platforms.OutdatedMemberError (answerOf), which the HTTP
// API answers 503 member_outdated (platforms/http's TestOutdatedMemberIsAnswered503MemberOutdated).
func TestForwardOfAnUnknownKindIsAnsweredUnsupported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testutil.Buffer
		ran := agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
			t.Error("a turn ran")
			return &agents.Response{Text: "ok"}, nil
		})
		w := newManagerWorld(t, ran, func(d *Deps) {
			d.Node, d.Clustered = "member-b", true
			d.Log = slog.New(slog.NewTextHandler(&logs, nil))
		})

		for i := range 2 {
			res, err := w.system.Root.RequestFuture(w.manager, forwardFromANewerMember(t, w.key), time.Minute).Result()
			if err != nil {
				t.Fatalf("request %d: %v, want an answer at once", i+1, err)
			}
			u, ok := res.(*Unsupported)
			if !ok {
				t.Fatalf("request %d answered %T %v, want Unsupported", i+1, res, res)
			}
			want := &Unsupported{Version: buildinfo.Version(), Address: w.system.Address(), Node: "member-b", Request: "Forward field 11", ToHolder: true}
			if !proto.Equal(u, want) {
				t.Errorf("request %d answered %v, want %v", i+1, u, want)
			}
			_, err = answerOf(res)
			oe, ok := errors.AsType[*platforms.OutdatedMemberError](err)
			if !ok {
				t.Fatalf("answerOf(%v) = %v, want an OutdatedMemberError", res, err)
			}
			if oe.Address != want.Address || oe.Version != want.Version || oe.Node != "member-b" ||
				!strings.Contains(err.Error(), "upgrade it") {
				t.Errorf("answerOf(%v) = %+v (%q), want the member's address, version and node, and to upgrade it", res, oe, err)
			}
		}
		// One without a sender is only logged (held back: the first's line is a minute old at most).
		w.system.Root.Send(w.manager, forwardFromANewerMember(t, w.key))
		synctest.Wait()

		if keys := w.active(t); len(keys) != 0 {
			t.Errorf("sessions %v started, want none: nothing is done", keys)
		}
		lines := strings.Count(logs.String(), "level=WARN msg=\"another cluster member forwarded a request of a kind this agentgate does not know")
		if lines != 1 || !strings.Contains(logs.String(), "upgrade this member (finish the rolling upgrade)") ||
			!strings.Contains(logs.String(), "request=\"Forward field 11\"") {
			t.Errorf("%d WRN lines, want 1 that names the request and says to upgrade this member; log:\n%s", lines, logs.String())
		}
	})
}

// TestUnknownFieldsNamesThem: unknownFields names each unknown field's number.
func TestUnknownFieldsNamesThem(t *testing.T) {
	two := protowire.AppendVarint(protowire.AppendTag(nil, 11, protowire.VarintType), 1)
	two = protowire.AppendVarint(protowire.AppendTag(two, 12, protowire.VarintType), 1)
	for _, c := range []struct {
		unknown []byte
		want    string
	}{
		{nil, "Forward with no message"},
		{two[:2], "Forward field 11"},
		{two, "Forward fields 11, 12"},
		{[]byte{0xff}, "Forward with no message"}, // not a field: nothing to name
	} {
		if got := unknownFields("Forward", c.unknown); got != c.want {
			t.Errorf("unknownFields(%x) = %q, want %q", c.unknown, got, c.want)
		}
	}
}

// TestLeavingManagerAnswersAForwardOfAnUnknownKindUnsupported: a manager whose member leaves
// the cluster (Leave: it hands every key it does not run on to the key's successor) answers a
// Forward of a kind it does not know Unsupported, as one that does not leave, whether a turn of
// the key runs here (the drain waits for it) or the key has no session here: it does not hand
// it on to the successor. It cannot: the request reads as no message at all, which nothing can
// forward; a successor of the same version would not know it either, and the requester is
// answered at once (the key's owner: ClusterRouter ends the request with an
// OutdatedMemberError, or sends it again while it waits for this member to let go of the key).
func TestLeavingManagerAnswersAForwardOfAnUnknownKindUnsupported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		releaseOnce := sync.OnceFunc(func() { close(release) })
		defer releaseOnce() // a failed test must not leave the turn waiting
		ran := make(chan string, 8)
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			ran <- req.Messages[0].Text
			<-release
			return &agents.Response{Text: "ok"}, nil
		})
		w := newManagerWorld(t, agent, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "member-b", true, true })
		slow := w.request("m1", "slow")
		<-ran
		sink, forwarded := w.forwardSink()
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return sink }})
		drained := w.drain()

		for _, key := range []string{w.key, "agent:main:fake:dm:c2"} {
			res, err := w.system.Root.RequestFuture(w.manager, forwardFromANewerMember(t, key), time.Minute).Result()
			if err != nil {
				t.Errorf("%s: %v, want an answer at once", key, err)
				continue
			}
			want := &Unsupported{Version: buildinfo.Version(), Address: w.system.Address(), Node: "member-b", Request: "Forward field 11", ToHolder: true}
			if u, ok := res.(*Unsupported); !ok || !proto.Equal(u, want) {
				t.Errorf("%s: answered %T %v, want %v", key, res, res, want)
			}
		}
		synctest.Wait()
		if len(forwarded) != 0 {
			t.Errorf("the leaving manager handed on %v, want nothing while its turn runs", <-forwarded)
		}
		releaseOnce()
		if _, err := slow.Result(); err != nil {
			t.Fatal(err)
		}
		<-drained
		synctest.Wait()
		for len(forwarded) > 0 {
			if f := <-forwarded; f.GetRecover() == nil || f.Key != w.key {
				t.Errorf("the leaving manager handed on %v, want only the Recover of %s", f, w.key)
			}
		}
		ranNone(t, ran)
	})
}

// asAnOlderMemberReads is f as a member of an earlier version reads it, one that does not know
// the kind of its message: f's Deliver comes as field 11, unknown there, and its msg reads as
// unset. (Every member of a test runs this build, which knows every kind it forwards.)
func asAnOlderMemberReads(t *testing.T, f *Forward) *Forward {
	t.Helper()
	inner, err := proto.Marshal(f.GetDeliver())
	if err != nil {
		t.Fatal(err)
	}
	bare := proto.CloneOf(f)
	bare.Msg = nil
	b, err := proto.Marshal(bare)
	if err != nil {
		t.Fatal(err)
	}
	b = protowire.AppendBytes(protowire.AppendTag(b, 11, protowire.BytesType), inner)
	var old Forward
	if err := proto.Unmarshal(b, &old); err != nil {
		t.Fatal(err)
	}
	return &old
}

// TestHandedOnRequestForTheHolderIsSentAgainPastAnOlderSuccessor: the key's owner, waiting to
// activate the key, forwards a request to member a, which held the key (Forward.to_holder). a
// leaves meanwhile, and hands the request on to the key's successor b, which runs an older
// version that does not know the request's kind (a rolling upgrade). b answers Unsupported
// with to_holder, so the requester's router sends the request again until the owner, once a
// has let go of the key, does it (TestClusterRouterUnsupportedAnswers, "the holder, then the
// owner"). Before, a's hand-on dropped to_holder, and the router ended the request at once
// with an OutdatedMemberError naming b (HTTP 503 member_outdated; on Discord, "send it again in
// a few minutes"), a moment before the owner would have done it.
func TestHandedOnRequestForTheHolderIsSentAgainPastAnOlderSuccessor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		none := agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
			t.Error("a turn ran")
			return &agents.Response{Text: "ok"}, nil
		})
		w := newManagerWorld(t, none, func(d *Deps) { d.Node, d.Fencing, d.Clustered = "a", true, true })
		var owner atomic.Pointer[actor.PID]
		owner.Store(w.manager)
		bPID := actor.NewPID(w.system.Address(), "member-b-manager")
		db := &Deps{Ctx: w.ctx, Store: w.store, Agent: none, Platforms: w.d.Platforms, Log: w.d.Log,
			Metrics: metrics.New("fake"), Node: "b", Config: w.d.Config, Persist: w.d.Persist, Fencing: true, Clustered: true,
			Placement: peersPlacement{self: bPID, peers: []*actor.PID{w.manager}, owner: &owner}}
		b, err := w.system.Root.SpawnNamed(NewSessionManager(db), bPID.Id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.system.Root.StopFuture(b).Wait() })
		// What a hands on reaches b as b's version reads it.
		var handedOn atomic.Pointer[Forward]
		older := w.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			if f, ok := c.Message().(*Forward); ok {
				handedOn.Store(f)
				c.RequestWithCustomSender(b, asAnOlderMemberReads(t, f), c.Sender())
			}
		}))
		w.system.Root.Send(w.manager, &Leave{Successor: func(string) *actor.PID { return older }})

		res, err := w.system.Root.RequestFuture(w.manager, &Forward{Key: w.key, Hops: 1, ToHolder: true,
			Msg: &Forward_Deliver{Deliver: w.message("m1", "hi")}}, time.Minute).Result()
		if err != nil {
			t.Fatalf("request: %v, want b's answer", err)
		}
		if f := handedOn.Load(); f == nil || f.GetDeliver().GetMessageId() != "m1" {
			t.Fatalf("a handed on %v, want m1", f)
		}
		want := &Unsupported{Version: buildinfo.Version(), Address: w.system.Address(), Node: "b", Request: "Forward field 11", ToHolder: true}
		if u, ok := res.(*Unsupported); !ok || !proto.Equal(u, want) {
			t.Errorf("answered %T %v, want %v: the router sends it again to the key's owner", res, res, want)
		}
		synctest.Wait()
		if keys := w.active(t); len(keys) != 0 {
			t.Errorf("sessions %v started on the leaving member, want none", keys)
		}
	})
}
