package supervisor

import (
	"fmt"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/agentgate/agentgate/internal/logging"
)

// recoverStreams is the gRPC option that keeps a peer's message this member cannot read from
// ending the process (asynkron/protoactor-go at the pinned version).
//
// protoactor's remote reads a peer's messages on the goroutine of its gRPC stream, and its
// protobuf serializer looks a message's type up by name and calls New on what it finds: a type
// this binary does not know (a message a member of a newer agentgate sends during a rolling
// upgrade) is a nil-pointer panic there, which neither protoactor nor gRPC recovers, and the
// process exited. The interceptor recovers it: the stream ends with an error, the peer's
// endpoint sees its connection lost and connects again for its next messages, and what the
// stream carried past the unreadable message is lost to it (a request among them times out at
// its sender, which asks again). It logs an ERR, at most once a minute (lim), that says why and
// what to do (TestClusterUnreadableMessageFromAPeerEndsNotTheProcess).
func recoverStreams(log *slog.Logger, lim *logging.Limiter) grpc.ServerOption {
	return grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if p := recover(); p != nil {
				lim.Log(log, slog.LevelError, "a cluster peer sent a message this member cannot read, most likely a member of a newer agentgate during a rolling upgrade; its connection is closed and the messages it carried after it are lost to it: finish the upgrade of every member",
					"stream", info.FullMethod, "panic", fmt.Sprint(p))
				err = status.Errorf(codes.Internal, "agentgate: a message could not be read: %v", p)
			}
		}()
		return handler(srv, ss)
	})
}
