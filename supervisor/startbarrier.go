package supervisor

import (
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
)

// replayCheckEvery is how often the start's barrier looks whether the persistence actor's
// replay of the spool still takes batches out of it.
const replayCheckEvery = time.Minute

// replayChecks, when set, replaces the barrier's ticker (tests fire it): it returns the ticks and
// a func that stops them.
var replayChecks atomic.Pointer[func() (<-chan time.Time, func())]

// awaitReplay is the start's barrier: it returns once the persistence actor (pid) has answered a
// Flush, which it does once it has replayed the spool the last run left (into the database, or
// up to a batch the database refuses, which waits for the next replay), so that nothing reads
// the database before the writes it acknowledged are in it: the sessions that load, the HTTP
// API's reads, the platforms' (Discord's backfill reads where it stopped reading), the record of
// the run. It waits as long as the replay takes batches out of the spool, saying every
// replayCheckEvery how many are left. Before, it waited a minute and went on: a longer replay
// (a spool of a long outage, a slow disk) raced the sessions that loaded, and one could read
// the database without the spooled writes (a reset undone, a message run twice).
//
// A replay that took no batch out of the spool for replayCheckEvery (a commit that does not
// return) is not waited for further, as before: the daemon then serves, /readyz failing while
// writes wait in the spool. The persistence actor set actors.Deps.Spooling before it began, so
// a session that must load waits for the spool to drain, as at a start whose database refuses
// the spool.
//
// It returns false when stop is closed first (a stop signal during the start, Options.Stop): the
// start stops then, whatever the replay has left in the spool waiting for the next start.
// Before, only the replay's end ended the wait, and a daemon replaying a long spool ignored
// SIGTERM (and every Ctrl-C) until it was done.
func (d *Daemon) awaitReplay(pid *actor.PID, stop <-chan struct{}) bool {
	f := d.system.Root.RequestFuture(pid, &persistence.Flush{}, -1) // no timeout: resolved below
	answered := make(chan error, 1)
	go func() { // ends when f resolves: the actor's answer, or the barrier's own (below)
		_, err := f.Result()
		answered <- err
	}()
	ticks, stopTicks := replayTicker()
	defer stopTicks()
	start, left := time.Now(), d.spoolLeft.Load()
	for {
		select {
		case err := <-answered:
			if err != nil {
				d.log.Warn("the persistence actor did not answer its start barrier; the start goes on without waiting for its replay of the spool", logging.Err(err))
			}
			return true
		case <-stop:
			d.log.Info("asked to stop during the start; the replay of the spool left by the last run stops after its current batches, the rest waits for the next start",
				"batches", d.spoolLeft.Load())
			d.system.Root.Send(f.PID(), &persistence.Flushed{}) // resolves f, as below
			<-answered
			return false
		case <-ticks:
		}
		now := d.spoolLeft.Load()
		if now < left {
			left = now
			d.log.Info("the start waits for the replay of the spool left by the last run", "batches", now,
				"waited", time.Since(start).Round(time.Second))
			continue
		}
		d.log.Warn("the replay of the spool left by the last run took no batch out of it for a minute; the start goes on without waiting for it",
			"batches", now, "waited", time.Since(start).Round(time.Second))
		d.system.Root.Send(f.PID(), &persistence.Flushed{}) // resolves f (a dead letter if the actor just answered)
		<-answered
		return true
	}
}

// replayTicker returns the barrier's ticks, every replayCheckEvery, and a func that stops them.
func replayTicker() (<-chan time.Time, func()) {
	if f := replayChecks.Load(); f != nil {
		return (*f)()
	}
	t := time.NewTicker(replayCheckEvery)
	return t.C, t.Stop
}
