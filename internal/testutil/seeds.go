package testutil

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// HuntSeeds returns the seeds and the steps per seed of a seeded hunt whose environment
// variables begin with prefix (AGENTGATE_MODEL, say): prefix_SEEDS=N runs N new seeds (from the
// clock), prefix_SEED=S replays seed S, prefix_STEPS=N sets the steps; without them, seeds and
// steps are the suite's own.
func HuntSeeds(t testing.TB, prefix string, seeds []uint64, steps int) ([]uint64, int) {
	t.Helper()
	if v := os.Getenv(prefix + "_SEEDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("%s_SEEDS=%q: %v", prefix, v, err)
		}
		seeds = nil
		base := uint64(time.Now().UnixNano())
		for i := range n {
			seeds = append(seeds, base+uint64(i))
		}
	}
	if v := os.Getenv(prefix + "_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s_SEED=%q: %v", prefix, v, err)
		}
		seeds = []uint64{s}
	}
	if v := os.Getenv(prefix + "_STEPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("%s_STEPS=%q: %v", prefix, v, err)
		}
		steps = n
	}
	return seeds, steps
}
