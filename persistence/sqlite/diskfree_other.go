//go:build !linux

package sqlite

// freeBytes is Linux's only: elsewhere an open on a full disk says what SQLite says, and
// CheckSpace says nothing.
func freeBytes(string) (uint64, bool) { return 0, false }

// device is Linux's only (CheckSpace).
func device(string) (uint64, bool) { return 0, false }
