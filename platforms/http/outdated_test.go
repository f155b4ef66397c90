package http

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/platforms"
)

// TestOutdatedMemberIsAnswered503MemberOutdated: a request that the cluster member holding its
// session did not know (it runs an older agentgate, during a rolling upgrade: its manager
// answered actors.Unsupported, which the router returns as a platforms.OutdatedMemberError) is
// answered 503 member_outdated, with a message that names the member and its version and says
// to upgrade it, and Retry-After 60 (it is answered so until that member is upgraded, within
// minutes in a rolling upgrade; before, it had none): a
// message POSTed (its answer names its message_id, as every 503 of a message does), a reset, a
// requeue. Before, it was an internal error (500), and the daemon's own wait for the answer,
// which never came, read as an answer lost ("it may have requeued"), though nothing was done.
func TestOutdatedMemberIsAnswered503MemberOutdated(t *testing.T) {
	outdated := &platforms.OutdatedMemberError{Address: "10.0.0.7:6340", Node: "b/run1", Version: "v1.8.0 0123456789ab go1.26.8",
		Request: "Forward field 11"}
	sessions := newFakeSessions()
	rt := &fakeRuntime{}
	rt.setRespond(func(context.Context, *platforms.Inbound) (*platforms.Ack, error) {
		return nil, fmt.Errorf("deliver to agent:main:http:dm:c: request *actors.Deliver to agent:main:http:dm:c: %w", outdated)
	})
	h := mustStart(t, Config{Sessions: sessions, Clustered: true}, rt)
	sessions.resetErr = fmt.Errorf("reset session: request *actors.ResetSession to agent:main:http:dm:c: %w", outdated)
	sessions.requeueErr = fmt.Errorf("requeue: request *actors.RequeueMessage to agent:main:http:dm:c: %w", outdated)

	for _, c := range []struct {
		name string
		do   func() response
		id   string
	}{
		{"POST /v1/messages", func() response {
			return h.post("/v1/messages", map[string]string{"chat_id": "c", "user_id": "u", "text": "t", "message_id": "m1"})
		}, "m1"},
		{"POST reset", func() response { return h.do(http.MethodPost, "/v1/sessions/agent:main:http:dm:c/reset", nil, "") }, ""},
		{"POST requeue", func() response {
			return h.do(http.MethodPost, "/v1/sessions/agent:main:http:dm:c/messages/m1/requeue", nil, "")
		}, ""},
	} {
		got := c.do()
		if got.status != http.StatusServiceUnavailable || got.errCode() != CodeMemberOutdated {
			t.Errorf("%s = %d %s, want 503 %s", c.name, got.status, got.body, CodeMemberOutdated)
			continue
		}
		body := mustDecode[ErrorResponse](t, got)
		for _, want := range []string{"10.0.0.7:6340", "v1.8.0 0123456789ab", "runs an older agentgate", "nothing was done", "upgrade it"} {
			if !strings.Contains(body.Error.Message, want) {
				t.Errorf("%s: message %q, want it to say %q", c.name, body.Error.Message, want)
			}
		}
		if body.MessageID != c.id {
			t.Errorf("%s: message_id %q, want %q", c.name, body.MessageID, c.id)
		}
		if ra := got.header.Get("Retry-After"); ra != "60" {
			t.Errorf("%s: Retry-After %q, want 60", c.name, ra)
		}
	}
}
