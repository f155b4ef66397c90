package supervisor

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/persistence"
)

// refusesRuns is a store that refuses the record of the daemon's run while refusing is set, as
// a database does that is locked by another process, or on a disk that was full, at the start.
type refusesRuns struct {
	persistence.Store
	refusing atomic.Bool
}

func (s *refusesRuns) BeginRun(ctx context.Context, run string, at time.Time) (*persistence.UncleanStop, error) {
	if s.refusing.Load() {
		return nil, errors.New("database or disk is full (13) (test)")
	}
	return s.Store.BeginRun(ctx, run, at)
}

// TestReadyzRecoversOnceTheStoreTakesTheRunRecord: a daemon whose store refused the record of
// its run at start is not ready, and is ready again within seconds of the store taking writes,
// with no message sent meanwhile. Before, the refusal was remembered as a refused message is,
// for a minute that only a write taken could cut short, and none came while /readyz kept the
// traffic away.
func TestReadyzRecoversOnceTheStoreTakesTheRunRecord(t *testing.T) {
	st := &refusesRuns{}
	st.refusing.Store(true)
	r := MustStartDaemon(t, echo.New(), daemonOpts{wrap: func(s persistence.Store) persistence.Store { st.Store = s; return st }})
	defer r.stop(t)
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + r.d.Addr().String() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := readyz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "disk is full") {
		t.Fatalf("/readyz while the store refuses the run's record = %d %s, want 503 naming the refusal", code, body)
	}
	st.refusing.Store(false)
	const within = 10 * time.Second // a refusal is remembered for persistence.RefusalMemory (a minute)
	deadline := time.Now().Add(within)
	for {
		code, body := readyz()
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz %v after the store takes writes again = %d %s, want 200", within, code, body)
		}
		time.Sleep(50 * time.Millisecond) // a poll interval under a deadline
	}
}
