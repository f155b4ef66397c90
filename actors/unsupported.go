package actors

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/agentgate/agentgate/internal/buildinfo"
	"github.com/agentgate/agentgate/platforms"
)

// unsupportedLine is the line of a forwarded request of a kind this member does not know
// (answerUnsupported).
const unsupportedLine = "another cluster member forwarded a request of a kind this agentgate does not know (it runs a newer version: a rolling upgrade is under way); it is answered unsupported and nothing is done: upgrade this member (finish the rolling upgrade)"

// answerUnsupported answers f, a Forward whose msg this member does not know (a field a later
// version added: it reads as unset), with Unsupported at once, and logs it (once a minute at
// most). Before, it was dropped unanswered, and its requester waited out its timeout and said
// its answer was lost, "it may have requeued", though nothing was done
// (TestForwardOfAnUnknownKindIsAnsweredUnsupported). A Forward without a sender (a Tell) is
// only logged.
func (m *SessionManager) answerUnsupported(c actor.Context, f *Forward) {
	what := unknownFields("Forward", f.ProtoReflect().GetUnknown())
	args := []any{"session", f.Key, "request", what, "version", buildinfo.Version()}
	if s := c.Sender(); s != nil {
		args = append(args, "requester", s.Address)
		c.Respond(&Unsupported{Version: buildinfo.Version(), Address: c.ActorSystem().Address(), Node: m.d.Node, Request: what,
			ToHolder: f.ToHolder})
	}
	m.unsupported.Log(m.log, slog.LevelWarn, unsupportedLine, args...)
}

// unknownFields names the fields of msg's unknown bytes (proto's unknown fields: those a later
// version added), "Forward field 11"; "Forward with no message" when there are none.
func unknownFields(msg string, unknown []byte) string {
	var nums []string
	for len(unknown) > 0 {
		num, _, n := protowire.ConsumeField(unknown)
		if n < 0 {
			break
		}
		nums = append(nums, fmt.Sprint(num))
		unknown = unknown[n:]
	}
	if len(nums) == 0 {
		return msg + " with no message"
	}
	if len(nums) == 1 {
		return msg + " field " + nums[0]
	}
	return msg + " fields " + strings.Join(nums, ", ")
}

// answerOf is res, the answer of a session request, as a router returns it: an Unsupported
// answer (the member that holds the key runs an older version, which does not know the
// request) is a *platforms.OutdatedMemberError, so that no caller takes it for the answer it
// waits for, and the HTTP API answers 503 member_outdated.
func answerOf(res any) (any, error) {
	if u, ok := res.(*Unsupported); ok {
		return nil, &platforms.OutdatedMemberError{Address: u.Address, Node: u.Node, Version: u.Version, Request: u.Request}
	}
	return res, nil
}
