package actors

import (
	"fmt"
	"testing"
)

// TestIdSetKeepsTheMostRecent: the set answers for the idSetMax most recent ids, whatever
// it held before, and never holds more.
func TestIdSetKeepsTheMostRecent(t *testing.T) {
	var s idSet
	const n = 5*idSetMax + 7
	for i := range n {
		s.add(fmt.Sprint(i))
		if i < idSetSmall && s.big != nil {
			t.Fatalf("after %d ids the set is a map, want a slice up to %d", i+1, idSetSmall)
		}
	}
	if len(s.big.ids) != idSetMax || len(s.big.order) != idSetMax {
		t.Errorf("after %d ids: %d in the map, %d in the ring, want %d each", n, len(s.big.ids), len(s.big.order), idSetMax)
	}
	for i := range n {
		want := i >= n-idSetMax
		if got := s.has(fmt.Sprint(i)); got != want {
			t.Errorf("has(%d) = %v after %d ids, want %v", i, got, n, want)
		}
	}
	// Re-adding a held id changes nothing; a removed one is gone until added again.
	s.add(fmt.Sprint(n - 1))
	s.remove(fmt.Sprint(n - 2))
	if s.has(fmt.Sprint(n-2)) || !s.has(fmt.Sprint(n-1)) || len(s.big.ids) != idSetMax-1 {
		t.Errorf("after a re-add and a remove: has(n-2)=%v has(n-1)=%v size %d, want false, true, %d",
			s.has(fmt.Sprint(n-2)), s.has(fmt.Sprint(n-1)), len(s.big.ids), idSetMax-1)
	}
}

func TestIdSetSmall(t *testing.T) {
	var s idSet
	for _, id := range []string{"a", "b", "a"} {
		s.add(id)
	}
	s.remove("a")
	if s.has("a") || !s.has("b") || len(s.small) != 1 || s.big != nil {
		t.Errorf("small set after add a, b, a, remove a: %+v, want only b, as a slice", s)
	}
}
