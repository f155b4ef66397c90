// Package spool is the on-disk queue of writes that the persistence actor keeps when the
// database cannot be written (locked, read-only, disk full, I/O error). Each spooled batch is one
// JSON file in <data_dir>/spool/, made visible atomically (write <name>.tmp, fsync, rename, fsync
// the directory), and replayed in order once the database is healthy again. Nothing is ever
// dropped: a batch leaves the spool only by Remove after a successful replay, or by Quarantine,
// which moves a batch that can never be applied to <data_dir>/spool/failed/ with the reason next
// to it.
//
// File format (version 1):
//
//	{"version":1,"created_at":"2025-01-02T03:04:05.123456789Z",
//	 "groups":[[{"type":"AppendMessage","op":{...}}, ...], ...]}
//
// Each op is tagged with the name of its concrete persistence type and carries that struct's
// fields under their Go names; times are RFC 3339 with nanoseconds, so they round-trip exactly.
// Decoding is strict: an unknown version, op type or field is an error, never a silently
// incomplete write. A field added to an op later is absent from what older binaries spooled and
// decodes as its zero value, which the op reads as the older meaning (MarkDelivery.Attempt: zero
// counts one attempt more, as marks without it always did; TestMarkDeliveryOfAnOlderBinaryDecodes).
// The other way round does not hold: an older binary quarantines a batch that holds a field it
// does not know, so a downgrade should find the spool empty.
//
// Concurrency: nothing in this package runs in the background. A Spool belongs to one goroutine,
// the persistence actor, which calls it from Receive; it is not safe for concurrent use, and one
// spool directory must be used by one process at a time (the data directory lock ensures that).
// EncodeOps and DecodeOps are pure and safe for concurrent use.
//
// Replay is at least once: a crash between a successful replay and Remove replays the batches
// that transaction took again after restart, in order, exactly like re-sent persistence.Writes
// (every Op the runtime writes is idempotent; see persistence.Op for the older binaries' ops
// that count each application).
//
// It imports only persistence and the standard library; it must not import actors, supervisor,
// platforms or a database driver.
package spool
