//go:build !race

// Two remotes in one process race in grpclog.SetLoggerV2 (protoactor's Remote.Start) under
// -race: a multi-member test, run without it as the TestCluster tests are.

package supervisor

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/internal/testutil"
)

// fromTheFuture is a protobuf message of a type this binary's registry does not hold, as a
// member of a newer agentgate would send one: its descriptor is built here and never registered.
func fromTheFuture(t *testing.T) proto.Message {
	t.Helper()
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name:    proto.String("agentgate_future_test.proto"),
		Package: proto.String("agentgate.future"),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("FromTheFuture"),
			Field: []*descriptorpb.FieldDescriptorProto{{
				Name: proto.String("text"), JsonName: proto.String("text"), Number: proto.Int32(1),
				Type: descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(), Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
			}},
		}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	md := fd.Messages().Get(0)
	m := dynamicpb.NewMessage(md)
	m.Set(md.Fields().Get(0), protoreflect.ValueOfString("a request of a later version"))
	return m
}

// TestClusterUnreadableMessageFromAPeerEndsNotTheProcess: a message of a type this member does not
// know, sent by a peer (a member of a newer agentgate during a rolling upgrade), ends the
// peer's connection with an ERR that says to finish the upgrade, and the peer's next request,
// on a new connection, is answered. Before, protoactor's serializer dereferenced the nil its
// registry gave for the unknown type on the stream's goroutine, and the process ended with a
// panic (here, the test binary).
func TestClusterUnreadableMessageFromAPeerEndsNotTheProcess(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	var logged testutil.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	var lim logging.Limiter
	a := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
	ga := guardEndpoints(a)
	ra := remote.NewRemote(a, remote.Configure("127.0.0.1", 0, func(c *remote.Config) {
		c.ServerOptions = append(c.ServerOptions, recoverStreams(log, &lim))
	}))
	ra.Start()
	defer ga.shutdown(ra, quiet)
	if _, err := a.Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*actor.Touch); ok {
			c.Respond(&actor.Touched{Who: c.Self()})
		}
	}), "echo"); err != nil {
		t.Fatal(err)
	}
	b := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
	gb := guardEndpoints(b)
	rb := remote.NewRemote(b, remote.Configure("127.0.0.1", 0))
	rb.Start()
	defer gb.shutdown(rb, quiet)
	echo := actor.NewPID(a.Address(), "echo")
	if _, err := b.Root.RequestFuture(echo, &actor.Touch{}, 10*time.Second).Result(); err != nil {
		t.Fatalf("b's request to a before the unreadable message: %v", err)
	}
	b.Root.Send(echo, fromTheFuture(t))
	// The connection the message ended is b's to a; b makes a new one for its next messages
	// once it has seen that one lost, and a request sent meanwhile is lost with it: b asks again
	// until it is answered, each request bounded, as a cluster's request is.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := b.Root.RequestFuture(echo, &actor.Touch{}, 2*time.Second).Result()
		if err == nil { // on a new connection, made once a had ended the one the message came on
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b's request to a after the unreadable message: %v; a's log: %s", err, logged.String())
		}
	}
	if got := logged.String(); !strings.Contains(got, "level=ERROR") || !strings.Contains(got, "finish the upgrade of every member") {
		t.Errorf("a's log = %q, want an ERR that says to finish the upgrade", got)
	}
}
