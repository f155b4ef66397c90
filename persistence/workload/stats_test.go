package workload

import (
	"testing"
	"time"
)

func TestMedianAndQuantile(t *testing.T) {
	if got := Median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("Median(odd) = %v, want 2", got)
	}
	if got := Median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("Median(even) = %v, want 2.5", got)
	}
	if got := Median(nil); got != 0 {
		t.Errorf("Median(nil) = %v, want 0", got)
	}
	ds := []time.Duration{5 * time.Microsecond, time.Microsecond, 3 * time.Microsecond, 2 * time.Microsecond, 4 * time.Microsecond}
	if got := QuantileUS(ds, 0.5); got != 3 {
		t.Errorf("QuantileUS(p50) = %v, want 3", got)
	}
	if got := QuantileUS(ds, 0.99); got != 5 {
		t.Errorf("QuantileUS(p99) = %v, want 5", got)
	}
	if ds[0] != 5*time.Microsecond {
		t.Error("QuantileUS sorted its argument in place")
	}
}
