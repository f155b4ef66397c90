package postgres

import "errors"

// ErrConflict is returned when an AppendMessage names a (session id, seq) that already holds a
// different row: a re-sent write is harmless, a different write to the same seq is a bug.
var ErrConflict = errors.New("postgres: message seq already holds a different row")
