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

// TestOpen: Open creates the lock file, holds its lock on a file open for writing (what an
// exclusive flock needs on NFS), and a second Open is refused with ErrHeld until the first
// file is closed.
func TestOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agentgate-dir.flock")
	first, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Write(nil); err != nil {
		t.Errorf("the lock file is not open for writing: %v", err)
	}
	if _, err := Open(path); !errors.Is(err, ErrHeld) {
		t.Fatalf("second Open while the first holds the lock = %v, want ErrHeld", err)
	}
	first.Close()
	second, err := Open(path)
	if err != nil {
		t.Fatalf("Open once the first file is closed: %v", err)
	}
	second.Close()
}
