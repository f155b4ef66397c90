package flock

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestExclusive: a second open file of the same path cannot take the lock while the first
// holds it, and can once the first is closed.
func TestExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	open := func() *os.File {
		t.Helper()
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	first, second := open(), open()
	if err := Exclusive(first); err != nil {
		t.Fatalf("first lock: %v", err)
	}
	if err := Exclusive(second); !errors.Is(err, ErrHeld) {
		t.Fatalf("second lock while the first is held = %v, want ErrHeld", err)
	}
	first.Close()
	if err := Exclusive(second); err != nil {
		t.Errorf("second lock once the first file is closed = %v, want it taken", err)
	}
}
