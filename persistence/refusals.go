package persistence

import (
	"fmt"
	"sync"
	"time"
)

// RefusalMemory is how long Refusals reports the last refusal when no write was taken since:
// with no traffic nothing tries the disk again, and a readiness check that stayed failed would
// keep away the traffic that shows the disk has room again.
const RefusalMemory = time.Minute

// Refusals records the writes the persistence actor refused because neither the database nor
// the spool could take them (a full or read-only disk), for /readyz: a store that answers its
// ping (a read-only disk, a full one, still take a lock) may refuse every write. It is safe
// for concurrent use.
type Refusals struct {
	mu  sync.Mutex
	err error
	at  time.Time
	// takenAt is when a write was last taken after a refusal (zero before the first refusal):
	// the sessions that wait out a pause after a refusal start early once it is after theirs.
	takenAt time.Time
}

// Refuse records a refusal at now: the persistence actor's, or the daemon's own write at its
// start (Store.BeginRun), which finds a database that refuses writes before any message does.
func (r *Refusals) Refuse(err error, now time.Time) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.err, r.at = err, now
	r.mu.Unlock()
}

// taken records that writes are taken again (by the database or the spool).
func (r *Refusals) taken() {
	if r == nil {
		return
	}
	r.mu.Lock()
	if r.err != nil || !r.takenAt.IsZero() {
		r.takenAt = time.Now()
	}
	r.err = nil
	r.mu.Unlock()
}

// TakenSince reports whether a write was taken at or after t, and none refused since: the
// store, which refused writes before t, takes them again.
func (r *Refusals) TakenSince(t time.Time) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err == nil && !r.takenAt.IsZero() && !r.takenAt.Before(t)
}

// Err returns an error describing the last refusal when it happened within RefusalMemory
// before now and no write was taken since; otherwise nil.
func (r *Refusals) Err(now time.Time) error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil || now.Sub(r.at) >= RefusalMemory {
		return nil
	}
	return fmt.Errorf("writes refused %s ago: %v", now.Sub(r.at).Round(time.Second), r.err)
}
