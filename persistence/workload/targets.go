package workload

import (
	"fmt"
	"strconv"
)

// Target is a performance target of issue #9 (shared/reference/perf-anchors.md §8): a bound on
// one figure a benchmark reports. The benchmarks log the Verdict of their medians, so `make
// bench` says which targets hold and by how much the others miss, from the run it just did.
type Target struct {
	Name   string  // what is measured, e.g. "G1 persistence actor ÷ raw at 1,000 sessions"
	Bound  float64 // the bound
	AtMost bool    // the figure must be ≤ Bound; otherwise ≥ Bound
	Unit   string  // of the figure and the bound, e.g. "µs" or "B"; empty for a ratio
}

// Met reports whether got satisfies the target.
func (t Target) Met(got float64) bool {
	if t.AtMost {
		return got <= t.Bound
	}
	return got >= t.Bound
}

// Shortfall is by how much got misses the target (0 when it is met).
func (t Target) Shortfall(got float64) float64 {
	switch {
	case t.Met(got):
		return 0
	case t.AtMost:
		return got - t.Bound
	default:
		return t.Bound - got
	}
}

// Verdict is one line for a benchmark log: "target G1 …: 0.927 (≥ 0.85): met", or "… missed
// by 0.023".
func (t Target) Verdict(got float64) string {
	op := "≥"
	if t.AtMost {
		op = "≤"
	}
	v := "met"
	if !t.Met(got) {
		v = "MISSED by " + t.format(t.Shortfall(got))
	}
	return fmt.Sprintf("target %s: %s (%s %s): %s", t.Name, t.format(got), op, t.format(t.Bound), v)
}

// format prints a figure with three significant decimals for ratios and whole units otherwise.
func (t Target) format(x float64) string {
	if t.Unit == "" {
		return strconv.FormatFloat(x, 'f', 3, 64)
	}
	return strconv.FormatFloat(x, 'f', 0, 64) + " " + t.Unit
}
