package supervisor

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
)

// BenchmarkMetricsOverhead measures what protoactor's own actor metrics (opt-in, metrics.actors)
// cost per message on top of agentgate's: the same load (50 sessions × 40 messages through the
// whole runtime, echo agent, real SQLite) with metrics.actors on and off, alternating in every
// round. It reports both rates, their ratio and the added time per message.
func BenchmarkMetricsOverhead(b *testing.B) {
	const sessions, each = 50, 40
	var on, off []float64
	run := func(actors bool) float64 {
		r := MustStartDaemon(b, echo.New(), daemonOpts{dir: b.TempDir(), tweak: func(c *config.Config) { c.Metrics.Actors = actors }})
		defer r.stop(b)
		start := time.Now()
		var wg sync.WaitGroup
		for s := range sessions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: fmt.Sprint("c", s), UserID: "u"}
				for i := range each {
					r.inject(b, src, fmt.Sprintf("m%d-%d", s, i), "hello")
				}
			}()
		}
		wg.Wait()
		r.waitSent(b, sessions*each)
		return float64(sessions*each) / time.Since(start).Seconds()
	}
	round := 0
	for b.Loop() {
		if round%2 == 0 {
			on, off = append(on, run(true)), append(off, run(false))
		} else {
			off, on = append(off, run(false)), append(on, run(true))
		}
		round++
	}
	med := func(xs []float64) float64 { s := slices.Clone(xs); slices.Sort(s); return s[len(s)/2] }
	b.ReportMetric(med(on), "on_msgs/s")
	b.ReportMetric(med(off), "off_msgs/s")
	b.ReportMetric(med(on)/med(off), "ratio")
	b.ReportMetric((1/med(on)-1/med(off))*1e6, "added_us/msg")
}
