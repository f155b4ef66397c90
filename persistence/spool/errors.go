package spool

import (
	"errors"
	"fmt"
)

// CorruptError is returned by Next for a batch file that exists but cannot be decoded. Such a
// file will never decode on a retry: the caller moves it aside with Quarantine(Name, ...), which
// keeps its bytes for an operator, and carries on with the next batch.
type CorruptError struct {
	Name string // the batch file, relative to the spool directory
	Err  error  // the decode error
}

// Error implements error.
func (e *CorruptError) Error() string {
	return fmt.Sprintf("spool next: corrupt batch %s: %v", e.Name, e.Err)
}

// Unwrap returns the decode error.
func (e *CorruptError) Unwrap() error { return e.Err }

// ErrUnknownBatch is returned by Remove and Quarantine for a name that is not a batch waiting in
// the spool.
var ErrUnknownBatch = errors.New("spool: unknown batch")
