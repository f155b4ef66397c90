package supervisor

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
)

// skewedServer is a member registry whose database server's clock is skew ahead of this
// host's (behind when negative), and whose reads of it take delay.
type skewedServer struct {
	stalledHeartbeat
	skew, delay atomic.Int64
}

func (s *skewedServer) Clock(context.Context) (time.Time, error) {
	time.Sleep(time.Duration(s.delay.Load()))
	return time.Now().Add(time.Duration(s.skew.Load())), nil
}

// TestClockApartFromTheDatabaseIsReported: a member compares its clock with the database
// server's as it joins and every minute, warns once when they come to differ by the limit or
// more (saying which way), says so again when they agree, and takes no reading whose round trip
// was too long to tell by. Before, nothing showed members whose clocks disagreed: they set each
// other's sessions' times back, and those reset early.
func TestClockApartFromTheDatabaseIsReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &skewedServer{}
		logs := &testutil.Buffer{}
		p := newStoreMembership(store, "agentgate", "h1/r_1", "127.0.0.1:8080", 6*time.Second,
			slog.New(slog.NewTextHandler(logs, nil)), func(error) {})
		close(p.done) // no renewals here: only the clock's watch runs
		p.watchers.Add(1)
		go p.watchClock()
		check := func(name string, want ...string) {
			t.Helper()
			time.Sleep(clockCheckEvery)
			synctest.Wait()
			got := logs.String()
			for _, w := range want {
				if !strings.Contains(got, w) {
					t.Errorf("%s: the log holds no %q:\n%s", name, w, got)
				}
			}
			if len(want) == 0 && got != "" {
				t.Errorf("%s: logged\n%s\nwant nothing", name, got)
			}
			*logs = testutil.Buffer{}
		}
		synctest.Wait()
		check("in step")
		store.skew.Store(int64(-clockOffsetLimit)) // the server behind: this host's clock ahead
		check("ahead by the limit", "level=WARN", "differs from the database server's", "ahead=10s")
		check("still ahead") // said once
		store.skew.Store(int64(clockOffsetLimit - time.Second))
		check("within the limit again", "level=INFO", "agrees with the database server's again", "off_by=9s")
		store.skew.Store(int64(time.Minute))
		store.delay.Store(int64(clockReadLimit))
		check("a read too slow to tell by")
		store.delay.Store(0)
		check("behind by a minute", "level=WARN", "behind=1m0s")
		if err := p.Shutdown(false); err != nil {
			t.Fatal(err)
		}
	})
}
