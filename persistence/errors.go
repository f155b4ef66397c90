package persistence

import (
	"errors"
	"fmt"
)

// Sentinel errors of the persistence layer.
var (
	ErrNotFound  = errors.New("persistence: not found")
	ErrDuplicate = errors.New("persistence: duplicate inbound message")
	ErrClosed    = errors.New("persistence: store closed")
	// ErrUnavailable wraps a write error that means the database cannot be written right now
	// (locked, read-only, disk full, I/O error); such writes go to the spool.
	ErrUnavailable = errors.New("persistence: database unavailable")
	// ErrFenced fails a write group whose Fence is older than its key's current claim: another
	// activation of the session owns the key now, and this one must stop (Store.Claim).
	ErrFenced = errors.New("persistence: session key claimed by a newer activation")
	// ErrClaimChanged refuses a claim made on a condition (Store.Claim's seen) that no longer
	// holds: another claim of the key came after the one the claimer looked up.
	ErrClaimChanged = errors.New("persistence: session key claimed again since the claimer looked it up")
	// ErrResend refuses a Write sent, behind unacknowledged writes of its sender, to an earlier
	// incarnation of the persistence actor: a restart may have lost those, and this one must not
	// commit ahead of them. The sender sends them all again, in order (see Write).
	ErrResend = errors.New("persistence: write sent before a restart of the persistence actor; send the unacknowledged writes again in order")
	// ErrCorruptSpool marks a spooled batch that cannot be decoded; it is quarantined.
	ErrCorruptSpool = errors.New("persistence: corrupt spool batch")
	// ErrBatchGone is wrapped by Spooler.Quarantine when the batch's file is no longer there to
	// set aside (removed by hand while a replay ran): it has left the queue, with nothing of it
	// to replay or keep.
	ErrBatchGone = errors.New("persistence: spool batch gone")
	// ErrDefaultDataDir is returned when code under test tries to open the default (production)
	// data directory.
	ErrDefaultDataDir = errors.New("persistence: refusing to open the default data directory under go test")
	// ErrLocked is returned when another process holds the store: the SQLite data directory,
	// or the PostgreSQL database a daemon runs on.
	ErrLocked = errors.New("persistence: store in use by another agentgate process")
	// ErrCorrupt is wrapped by the Ping of a store that found its database damaged while open
	// (SQLite's "database disk image is malformed"). Unlike an outage it does not pass by
	// itself: the daemon must be stopped and the database restored.
	ErrCorrupt = errors.New("persistence: database corrupt")
	// ErrFileGone is wrapped by the writes and the Ping of a SQLite store whose database file
	// was deleted, or replaced by another file, while open: its commits went to a file that no
	// one can open again. Like ErrCorrupt it does not pass by itself: the daemon must be
	// stopped and the database put back. The writes it refuses also wrap ErrUnavailable, so
	// that they wait in the spool.
	ErrFileGone = errors.New("persistence: database file deleted or replaced")
)

// ClaimChangedError is the error of a claim refused on its condition (Store.Claim's seen): it is
// ErrClaimChanged (errors.Is), and says which claim came since, so that the refused session's
// line says who claimed the key: another member, an operator's reset (ResetClaimOwner), or the
// claimer's own member (its earlier claim, whose answer was lost). Before, the line always said
// another member had.
type ClaimChangedError struct {
	Key string
	// Seen is the claim the claimer looked up: the condition that no longer holds.
	Seen ClaimSeen
	// Latest is the key's latest claim, the one that came since; nil when the store could not
	// read it (PostgreSQL reads it after the refusal, in a round trip of its own).
	Latest *ClaimSeen
	// PromisedBy is the node of the member that made Latest and promised it to its owner
	// (postgres.Store.Promise: the owner changes, the epoch stays); empty when Latest's owner
	// made it. A claim promised to the claimer's own member is no claim of its own whose answer
	// was lost.
	PromisedBy string
}

func (e *ClaimChangedError) Error() string {
	if e.Latest == nil {
		return fmt.Sprintf("claim %s: %v: not epoch %d of %q", e.Key, ErrClaimChanged, e.Seen.Epoch, e.Seen.Owner)
	}
	promised := ""
	if e.PromisedBy != "" {
		promised = fmt.Sprintf(" (promised by %q)", e.PromisedBy)
	}
	return fmt.Sprintf("claim %s: %v: epoch %d of %q%s, not epoch %d of %q", e.Key, ErrClaimChanged,
		e.Latest.Epoch, e.Latest.Owner, promised, e.Seen.Epoch, e.Seen.Owner)
}

// Unwrap makes the error ErrClaimChanged.
func (e *ClaimChangedError) Unwrap() error { return ErrClaimChanged }
