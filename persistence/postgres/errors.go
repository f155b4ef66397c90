package postgres

import "errors"

// ErrConflict is returned when an AppendMessage names a (session id, seq) that already holds a
// different row: a re-sent write is harmless, a different write to the same seq is a bug.
var ErrConflict = errors.New("postgres: message seq already holds a different row")

// ErrMigratedThenEnded is Open's error when its ctx ended once it had applied migrations to the
// schema, while it migrated (the migration, once begun, went on to its end: a cut would roll it
// back, to be done again) or after, and Open went no further. The error wraps ctx's too. An Open
// that ctx ended with nothing to migrate returns ctx's error alone: it wrote nothing. A step
// after the migration that failed for real as ctx ended returns its own failure instead
// (endedByCtx).
var ErrMigratedThenEnded = errors.New("postgres: the schema's migrations were applied, and the open went no further: asked to stop meanwhile")
