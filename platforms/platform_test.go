package platforms_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/agentgate/agentgate/platforms"
)

// TestOutdatedMemberErrorIsUnavailable: a request the cluster member holding its session does
// not know (it runs an older agentgate, during a rolling upgrade) is ErrUnavailable too, as
// the routers return it, wrapped: it can be sent again once the upgrade is over, and a caller
// that tells its sender to try again later on ErrUnavailable does so for it. It is still an
// OutdatedMemberError, which the HTTP API answers 503 member_outdated. Before, it was no
// ErrUnavailable, and a caller that knew only that took it for a failure of its own.
func TestOutdatedMemberErrorIsUnavailable(t *testing.T) {
	outdated := &platforms.OutdatedMemberError{Address: "10.0.0.7:6340", Node: "b", Version: "v1.8.0", Request: "Forward field 11"}
	err := fmt.Errorf("deliver to agent:main:http:dm:c: request *actors.Deliver to agent:main:http:dm:c: %w", outdated)
	if !errors.Is(err, platforms.ErrUnavailable) {
		t.Errorf("errors.Is(%v, ErrUnavailable) = false, want true", err)
	}
	if oe, ok := errors.AsType[*platforms.OutdatedMemberError](err); !ok || oe != outdated {
		t.Errorf("errors.AsType(%v) = %v, %v; want the OutdatedMemberError", err, oe, ok)
	}
	for _, other := range []error{platforms.ErrDraining, platforms.ErrRejected, platforms.ErrConflict, platforms.ErrReused} {
		if errors.Is(err, other) {
			t.Errorf("errors.Is(%v, %v) = true, want false", err, other)
		}
	}
}
