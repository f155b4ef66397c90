package metrics

import (
	"context"
	"log/slog"
	"testing"

	protometrics "github.com/asynkron/protoactor-go/metrics"
	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
)

// upperBounds returns the bucket bounds of the first histogram of family name in fams, and
// the cumulative count of each.
func upperBounds(t *testing.T, fams []*dto.MetricFamily, name string) (bounds []float64, counts []uint64) {
	t.Helper()
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		if len(f.GetMetric()) == 0 || f.GetMetric()[0].GetHistogram() == nil {
			t.Fatalf("%s has no histogram series", name)
		}
		for _, b := range f.GetMetric()[0].GetHistogram().GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
			counts = append(counts, b.GetCumulativeCount())
		}
		return bounds, counts
	}
	t.Fatalf("%s not in the scrape", name)
	return nil, nil
}

// TestHistogramBuckets: agentgate's duration histograms have bucket bounds that resolve what
// they measure, written as decimals. Before, turn_duration_seconds and agent_slot_wait_seconds
// stepped ×4 from 0.001 to 262 s (a model's turn of 1 to 16 s fell in 2 buckets, the 600 s
// exec timeout in none) and persist_flush_seconds stepped ×3 to 1.97 s, with bounds such as
// 0.00030000000000000003.
func TestHistogramBuckets(t *testing.T) {
	m := New()
	m.TurnDuration.Observe(3)
	m.AgentSlotWait.Observe(0)
	m.PersistFlushSeconds.Observe(0.002)
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		want []float64
	}{
		{"agentgate_turn_duration_seconds", []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600}},
		{"agentgate_agent_slot_wait_seconds", []float64{0, 0.01, 0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600}},
		{"agentgate_persist_flush_seconds", []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := upperBounds(t, fams, tc.name)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("%s bucket bounds (-want +got):\n%s", tc.name, diff)
			}
		})
	}
}

// TestProtoactorReceiveDurationBuckets: protoactor's message handling histogram, recorded in
// seconds, gets second-scale buckets, so a 2 ms message lands in le="0.003". Before, it had
// OpenTelemetry's default buckets (0, 5, 10 … 10000, meant for milliseconds), and every
// observation landed in le="5".
func TestProtoactorReceiveDurationBuckets(t *testing.T) {
	m := New()
	mp, err := m.ActorMeterProvider()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := mp.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	// The instruments protoactor creates from the global provider, as an actor system with
	// metrics on does.
	inst := protometrics.NewActorMetrics(slog.New(slog.DiscardHandler))
	inst.ActorMessageReceiveHistogram.Record(context.Background(), 0.002)
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	bounds, counts := upperBounds(t, fams, "protoactor_actor_message_receive_duration_seconds")
	want := []float64{0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10}
	if diff := cmp.Diff(want, bounds); diff != "" {
		t.Errorf("%s bucket bounds (-want +got):\n%s", "protoactor_actor_message_receive_duration_seconds", diff)
	}
	first := -1.0 // the lowest bound whose bucket holds the observation
	for i, b := range bounds {
		if counts[i] > 0 {
			first = b
			break
		}
	}
	if first != 0.003 {
		t.Errorf("a 0.002 s observation first counted in le=%v, want le=0.003 (below 5)", first)
	}
}
