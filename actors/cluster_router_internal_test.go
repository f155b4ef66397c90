package actors

import (
	"testing"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"google.golang.org/protobuf/proto"
)

// TestTakenRequeue: a requeue the cluster router sends again after an attempt that may have
// done it (no answer: its member was slow or died) and that finds its message pending or done
// is the operator's requeue, answered as done. Before, the operator was told "pending, not
// quarantined" for the requeue they had asked for. Other refusals stand.
func TestTakenRequeue(t *testing.T) {
	msg := &RequeueMessage{MessageId: "m1"}
	refused := func(code, status string) *RequeueResult {
		return &RequeueResult{SessionId: "s1", MessageId: "m1", ErrorCode: code, Status: status, Error: "refused"}
	}
	for _, tc := range []struct {
		res  *RequeueResult
		want *RequeueResult
	}{
		{refused(ErrCodeNotQuarantined, persistence.StatusPending), &RequeueResult{SessionId: "s1", MessageId: "m1", Disposition: platforms.Queued}},
		{refused(ErrCodeNotQuarantined, persistence.StatusDone), &RequeueResult{SessionId: "s1", MessageId: "m1", Disposition: platforms.Queued}},
		{refused(ErrCodeNotQuarantined, persistence.StatusFailed), refused(ErrCodeNotQuarantined, persistence.StatusFailed)},
		{refused(ErrCodeNotFound, ""), refused(ErrCodeNotFound, "")},
		{&RequeueResult{SessionId: "s1", MessageId: "m1", Disposition: platforms.Started}, &RequeueResult{SessionId: "s1", MessageId: "m1", Disposition: platforms.Started}},
	} {
		got, ok := taken(msg, tc.res).(*RequeueResult)
		if !ok || !proto.Equal(got, tc.want) {
			t.Errorf("taken(requeue, %v) = %v, want %v", tc.res, got, tc.want)
		}
	}
}
