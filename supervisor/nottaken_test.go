package supervisor

import (
	"errors"
	"fmt"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/agentgate/agentgate/actors"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
)

// TestNotTakenMarksDeadLettersOnly: a reset or requeue that met a dead letter (the stopping
// session manager answers so what it is sent) reached no session, and is marked
// httpplatform.ErrNotTaken, which a draining daemon answers 503 draining ("nothing was
// changed"); a timeout, which may follow a request the session took, is not.
func TestNotTakenMarksDeadLettersOnly(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("request *actors.ResetSession to k: %w", actor.ErrDeadLetter), true},
		{fmt.Errorf("request *actors.ResetSession to k: %w", actors.ErrTimeout), false},
		{fmt.Errorf("request *actors.ResetSession to k: %w (last: %v)", actors.ErrTimeout, actor.ErrDeadLetter), false}, // the cluster router's
		{errors.New("something else"), false},
	} {
		got := notTaken(c.err)
		if errors.Is(got, httpplatform.ErrNotTaken) != c.want {
			t.Errorf("notTaken(%v) = %v, want ErrNotTaken %v", c.err, got, c.want)
		}
		if !errors.Is(got, c.err) && got != c.err {
			t.Errorf("notTaken(%v) = %v, which lost the error", c.err, got)
		}
	}
}
