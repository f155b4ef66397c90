package workload

import (
	"slices"
	"time"
)

// Median returns the median of xs (the mean of the middle two for an even count), 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// QuantileUS returns the q-quantile (0..1, nearest rank) of ds in microseconds, 0 for none.
func QuantileUS(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[min(int(q*float64(len(s))), len(s)-1)].Nanoseconds()) / 1e3
}
