package testutil

import (
	"os"
	"strconv"
	"strings"
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

// PlanInt reads the number right after tag in text (a hunt's message text carries its plan:
// "m4 d=3 panic-m4.1"); 0 if there is none.
func PlanInt(text, tag string) int {
	_, after, ok := strings.Cut(text, tag)
	if !ok {
		return 0
	}
	end := strings.IndexFunc(after, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(after)
	}
	n, _ := strconv.Atoi(after[:end])
	return n
}
