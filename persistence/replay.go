package persistence

import (
	"context"
	"errors"
)

// Replayed is what ReplaySpool did with the batches that waited in the spool.
type Replayed struct {
	Batches  int // taken by the database, and removed from the spool
	SetAside int // set aside for a human (Spooler.Quarantine): they do not decode, or the database refused what they hold
	Gone     int // removed from the spool by hand while the replay ran (before it read them or set them aside): nothing to replay
	Left     int // still waiting in the spool
}

// ReplaySpool replays the batches waiting in o.Spool into store, as the persistence actor
// replays the spool a stopped daemon left when it starts: the same transactions of several
// batches, the same batches set aside, the same lines on o.Log (Actor.replaySpool). It is for
// a tool that writes the store while the daemon is stopped, so that the store holds every
// write the daemon acknowledged before the tool changes it. The caller must keep the daemon
// off the spool and the store while it runs (the data directory's lock and the store's); it
// adds nothing of its own to the store, no record of a run.
//
// It returns an error, the database's or the spool's, when it stopped with batches left
// (Replayed.Left): they wait for the next replay, the daemon's or this one's again. As with
// the daemon's, a process that dies between a commit and the removal of its batches applies
// those batches again at the next replay.
func ReplaySpool(ctx context.Context, store Store, o ActorOptions) (Replayed, error) {
	if o.Spool == nil {
		return Replayed{}, nil
	}
	sp := &countingSpool{Spooler: o.Spool}
	o.Spool = sp
	a := &Actor{store: store, ctx: ctx, o: o.withDefaults(), outage: &outage{}}
	before := sp.Len()
	err := a.replaySpool()
	r := Replayed{SetAside: sp.setAside, Gone: sp.gone, Left: sp.Len()}
	r.Batches = before - r.SetAside - r.Gone - r.Left
	return r, err
}

// countingSpool counts the batches a replay sets aside, and those it finds gone.
type countingSpool struct {
	Spooler
	setAside, gone int
}

// Peek implements Spooler. The batches it skips, for their files are gone, leave the queue.
func (s *countingSpool) Peek(after string) (string, [][]Op, error) {
	n := s.Len()
	name, groups, err := s.Spooler.Peek(after)
	s.gone += n - s.Len()
	return name, groups, err
}

// Quarantine implements Spooler.
func (s *countingSpool) Quarantine(name, reason string) error {
	n := s.Len()
	err := s.Spooler.Quarantine(name, reason)
	if s.Len() < n { // it left the queue (moved, even when its reason could not be written; or gone)
		if errors.Is(err, ErrBatchGone) {
			s.gone++
		} else {
			s.setAside++
		}
	}
	return err
}
