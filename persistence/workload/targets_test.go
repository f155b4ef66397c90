package workload

import "testing"

func TestTargetVerdict(t *testing.T) {
	ratio := Target{Name: "G1 at 100 sessions", Bound: 0.75}
	latency := Target{Name: "G2 added p50", Bound: 50, AtMost: true, Unit: "µs"}
	for _, tc := range []struct {
		t    Target
		got  float64
		met  bool
		want string
	}{
		{ratio, 0.8, true, "target G1 at 100 sessions: 0.800 (≥ 0.750): met"},
		{ratio, 0.75, true, "target G1 at 100 sessions: 0.750 (≥ 0.750): met"},
		{ratio, 0.479, false, "target G1 at 100 sessions: 0.479 (≥ 0.750): MISSED by 0.271"},
		{latency, 27, true, "target G2 added p50: 27 µs (≤ 50 µs): met"},
		{latency, 65, false, "target G2 added p50: 65 µs (≤ 50 µs): MISSED by 15 µs"},
	} {
		if got := tc.t.Met(tc.got); got != tc.met {
			t.Errorf("%s.Met(%v) = %v, want %v", tc.t.Name, tc.got, got, tc.met)
		}
		if got := tc.t.Verdict(tc.got); got != tc.want {
			t.Errorf("%s.Verdict(%v) = %q, want %q", tc.t.Name, tc.got, got, tc.want)
		}
	}
}
