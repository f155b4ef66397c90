package spool

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestNextAfterReadsAheadAndRemoveTakesSeveral: a replay reads the batches behind the oldest
// with NextAfter, in order, skipping one removed by hand, and removes those it committed with
// one Remove; a Remove that names a batch not waiting removes none.
func TestNextAfterReadsAheadAndRemoveTakesSeveral(t *testing.T) {
	dir := t.TempDir()
	s := MustOpen(t, dir)
	var names []string
	for i := range 5 {
		names = append(names, MustAppend(t, s, batchOf(i)))
	}
	if err := os.Remove(filepath.Join(dir, names[2])); err != nil { // by hand
		t.Fatal(err)
	}

	var got []string
	for after := ""; ; {
		b, err := s.NextAfter(after)
		if err != nil {
			t.Fatalf("NextAfter(%q) error: %v", after, err)
		}
		if b == nil {
			break
		}
		if i := slices.Index(names, b.Name); !cmp.Equal(b.Groups, batchOf(i)) {
			t.Errorf("NextAfter(%q) = %s %v, want %v", after, b.Name, b.Groups, batchOf(i))
		}
		got = append(got, b.Name)
		after = b.Name
	}
	if want := []string{names[0], names[1], names[3], names[4]}; !cmp.Equal(got, want) {
		t.Fatalf("batches read ahead = %v, want %v", got, want)
	}

	if err := s.Remove(names[0], names[1], "nope.json"); !errors.Is(err, ErrUnknownBatch) {
		t.Fatalf("Remove with an unknown name = %v, want ErrUnknownBatch", err)
	}
	if s.Len() != 4 {
		t.Fatalf("Len after a refused Remove = %d, want 4", s.Len())
	}
	if err := s.Remove(names[0], names[1], names[3]); err != nil {
		t.Fatalf("Remove error: %v", err)
	}
	if got, want := MustDirNames(t, dir), []string{names[4]}; !cmp.Equal(got, want) {
		t.Errorf("spool directory after Remove = %v, want %v", got, want)
	}
	if b := MustNext(t, s); b == nil || b.Name != names[4] || s.Len() != 1 {
		t.Errorf("Next after Remove = %v (Len %d), want %s alone", b, s.Len(), names[4])
	}
}
