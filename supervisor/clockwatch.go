package supervisor

import (
	"context"
	"fmt"
	"time"

	"github.com/agentgate/agentgate/internal/logging"
)

// The members of a cluster each judge time by their own clock: a session's idle and daily
// resets, its retention, and whether a time another member stored lies after now (a scan sets
// such times to now: actors.Timers, Store.PullBack). Members whose clocks disagree by more than
// a minute set each other's sessions back, and those reset early; a smaller disagreement moves
// resets by as much. Nothing else shows it: protoactor's gossip stamps what it hears with the
// hearer's clock, and the store judges registrations by the database server's. So each member
// compares its clock with the database server's, the one clock they share, and says when they
// differ by clockOffsetLimit or more: two members each within it of the server are within twice
// it of each other.
const (
	// clockOffsetLimit is how far this host's clock may be from the database server's before the
	// member warns. Clocks kept by NTP agree to milliseconds; 10 s is a clock no one keeps.
	clockOffsetLimit = 10 * time.Second
	// clockCheckEvery is how often the member compares the clocks, the first time as it joins.
	clockCheckEvery = time.Minute
	// clockReadLimit is the longest round trip of a reading that counts: the server read its
	// clock somewhere within it, so a reading's error is at most half of it.
	clockReadLimit = time.Second
)

// watchClock compares this host's clock with the database server's every clockCheckEvery until
// the member stops (Shutdown waits for it). It logs at Warn when they come to differ by
// clockOffsetLimit or more, at Info when they agree again; a reading that fails, or whose round
// trip was too long to tell, changes nothing (the renewals report an outage).
func (p *storeMembership) watchClock() {
	defer p.watchers.Done()
	off := false // the last reading that counted found the clocks apart
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		t.Reset(clockCheckEvery)
		d, err := p.clockOffset()
		switch {
		case err != nil:
			p.log.Debug("could not compare this host's clock with the database server's", logging.Err(err))
		case d.Abs() >= clockOffsetLimit && !off:
			off = true
			way := "ahead"
			if d > 0 {
				way = "behind"
			}
			p.log.Warn("this host's clock differs from the database server's: keep every member's clock and the database server's in step (NTP)",
				way, d.Abs().Round(time.Millisecond), "limit", clockOffsetLimit)
		case d.Abs() < clockOffsetLimit && off:
			off = false
			p.log.Info("this host's clock agrees with the database server's again", "off_by", d.Abs().Round(time.Millisecond))
		}
	}
}

// clockOffset reads the database server's clock and returns how far it is ahead of this host's
// (negative: behind) at the middle of the read. A read whose round trip took clockReadLimit or
// longer tells too little, and is an error.
func (p *storeMembership) clockOffset() (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), clockReadLimit)
	defer cancel()
	wall, start := p.wall().Round(0), time.Now()
	server, err := p.store.Clock(ctx)
	rtt := time.Since(start)
	if err != nil {
		return 0, err
	}
	if rtt >= clockReadLimit {
		return 0, fmt.Errorf("the read took %v, too long to tell", rtt.Round(time.Millisecond))
	}
	return server.Sub(wall.Add(rtt / 2)), nil
}
