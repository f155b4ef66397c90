package supervisor

import (
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
)

// TestManyChatsAddNoMetricSeriesOrGoroutines: a thousand distinct chats over HTTP, each
// answered and passivated, leave the daemon with the metric series, goroutines and fds it had
// after the first two hundred: no label follows a chat, a session or a message, and nothing a
// chat started outlives its session.
func TestManyChatsAddNoMetricSeriesOrGoroutines(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a thousand chats")
	}
	const first, rounds, chats = 200, 2, 400
	r := MustStartDaemon(t, echo.New(), daemonOpts{tweak: func(c *config.Config) { c.Sessions.PassivateAfter = 100 * time.Millisecond }})
	defer r.stop(t)
	// A connection per request: one the client's pool keeps open would count as the daemon's.
	c := &leakClient{t: t, base: "http://" + r.d.Addr().String(), http: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}
	ignore := []string{"actors.(*Dispatcher).worker"} // kept for the busiest moment, by design
	n := 0
	round := func(chats int) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for range chats {
			n++
			i := n
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				c.post(fmt.Sprint("chat-", i), "m1", "hi", "?wait=30s", http.StatusOK)
			})
		}
		wg.Wait()
		waitUntil(t, func() bool {
			return len(r.activeKeys(t)) == 0 && promtestutil.ToFloat64(r.d.metrics.SessionsActive) == 0
		})
	}
	series := func() []string {
		var out []string
		for name, f := range r.scrape(t) {
			out = append(out, fmt.Sprintf("%s=%d", name, len(f.GetMetric())))
		}
		sort.Strings(out)
		http.DefaultClient.CloseIdleConnections() // scrape's
		return out
	}
	round(first)
	series() // the first scrape's own answer is counted in agentgate_http_requests_total after it
	baseSeries := series()
	base := testutil.TakeResources(ignore...)
	for i := range rounds {
		round(chats)
		if got := series(); fmt.Sprint(got) != fmt.Sprint(baseSeries) {
			t.Errorf("after %d chats the metric series per family are %v; after %d they were %v", n, got, first, baseSeries)
		}
		testutil.MustSettle(t, fmt.Sprintf("after round %d (%d chats)", i+1, n), base,
			testutil.Slack{Goroutines: 2, FDs: 12, Ignore: ignore}, 10*time.Second)
	}
}
