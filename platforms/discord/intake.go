package discord

import (
	"context"
	"slices"
	"sync/atomic"

	"github.com/bwmarrin/discordgo"
)

// The intake. discordgo runs the handlers on the gateway's reader (SyncEvents), one event after
// another, so that a channel's messages are taken in the order Discord sent them. The handling
// of a message can take long: its delivery waits up to deliverTimeout for a session that does
// not answer (a store that refuses writes, a manager that backs off), its REST calls (a channel
// lookup, a thread opened, a notice) up to restTimeout each, a withdrawal up to withdrawTimeout;
// and at RESUMED up to maxReplayHeld held messages are handed on at once. Run there, the reader
// read nothing meanwhile: heartbeat ACKs went unread until discordgo gave the connection up
// (five intervals), whose disconnect handler then handed held messages on from the heartbeat
// goroutine while the reader was still delivering (two deliveries at once, out of order), and
// the deletions and edits of queued messages came too late to drop or rewrite them.
//
// So the reader only queues: each message (live, or held by a backfill or a replay and released)
// and each deletion of a message the runtime may hold goes to the back of one queue per
// Platform, and one goroutine, the intake, takes them off in order and handles them. A deletion
// or an edit of a message still queued drops or rewrites it there (dropDeleted, editHeld), as
// they do a held one; a deletion queued behind the handling of its message (in flight) withdraws
// it once it is delivered. The queue is bounded only by Discord's rate: past intakeWarnAt it
// warns, once until it is empty again, and drops nothing. The intake goroutine runs while the
// queue holds something and ends once it is empty; a backfill waits for it before it reads
// (waitIntake), so that what was queued before the backfill is taken before what it reads back,
// and no two goroutines deliver at once. When the daemon stops, Run (or WaitInbound, when the
// stop finds Run not running) waits for it and for the backfills (settle), and each message
// still queued meets the stop as handle has it meet it (readBackAfterStop, or a notice). A
// cluster member that lets the gateway connection go (platforms.ErrLetGo: lost, or its lease
// lost) is not stopping: its intake goes on delivering, as after a lost connection, for the
// member may take the connection again and RESUME it, which reads nothing back.

// intakeWarnAt is the length of the intake queue past which the platform warns, unless its
// intakeWarnAt field (a test's, set under p.mu) says another. A package variable that tests
// lowered raced with the intake of an earlier test's platform still stopping.
const intakeWarnAt = 1000

// intakeItem is an entry of the intake queue: a message to handle, or a deletion to run.
type intakeItem struct {
	m   *discordgo.Message
	run func()
}

// enqueueLocked puts ms at the back of the intake queue, in order, and starts the intake
// goroutine unless it runs. p.mu is held.
func (p *Platform) enqueueLocked(ms ...*discordgo.Message) {
	for _, m := range ms {
		p.intake = append(p.intake, intakeItem{m: m})
	}
	p.startIntakeLocked()
}

// startIntakeLocked warns of a long queue and starts the intake goroutine unless it runs. p.mu
// is held.
func (p *Platform) startIntakeLocked() {
	warnAt := intakeWarnAt
	if p.intakeWarnAt > 0 {
		warnAt = p.intakeWarnAt
	}
	if len(p.intake) > warnAt && !p.intakeWarned {
		p.intakeWarned = true
		p.log.Warn("discord messages queue up behind a delivery the runtime does not answer (is the store refusing writes?); none is dropped",
			"queued", len(p.intake))
	}
	if p.intaking == nil && len(p.intake) > 0 {
		done := make(chan struct{})
		p.intaking = done
		go p.runIntake(done)
	}
}

// runIntake handles the intake queue, in order, until it is empty, then closes done.
func (p *Platform) runIntake(done chan struct{}) {
	defer close(done)
	for {
		p.mu.Lock()
		if len(p.intake) == 0 {
			p.intake, p.intaking, p.intakeWarned = nil, nil, false
			p.mu.Unlock()
			return
		}
		it := p.intake[0]
		p.intake[0] = intakeItem{}
		p.intake = p.intake[1:]
		p.mu.Unlock()
		p.take(it)
	}
}

// take handles one item of the intake queue. handle contains a message's panic itself; a
// deletion's is contained here, as survived does on the reader.
func (p *Platform) take(it intakeItem) {
	if it.m != nil {
		_ = p.handle(it.m, false)
		return
	}
	defer p.survive("message deletion")
	it.run()
}

// stopWait, when set, is called as a stop starts to wait for a running intake or backfill
// (tests).
var stopWait atomic.Pointer[func()]

// waitIntake waits until the intake goroutine running now, if any, has handled what was
// queued (a backfill, before it reads).
func (p *Platform) waitIntake() {
	p.mu.Lock()
	done := p.intaking
	p.mu.Unlock()
	if done != nil {
		<-done
	}
}

// settle is the platform's part of a stop, once Run's ctx has ended (Run, WaitInbound): what
// a resume's replay still holds is handed on (endReplay), and it waits until no backfill runs
// and the intake is idle, however often either starts again, or until ctx ends. Each message
// meets the stop in handle, as a live one does: left for the next start's read-back, or
// delivered (the runtime answers it or says it was not taken).
//
// Run's stop settles without a bound of its own (context.Background). Run promises that
// nothing is delivered once it returns, which the runtime's stop relies on: a bound here would
// return with the intake still delivering, the very thing the wait is for, and hide it from the
// caller. A caller that needs a bound keeps it on its side: the platform actor waits 10 s for
// Run and gives WaitInbound the same bound, and warns when a Run outlasts it. What the wait
// waits for ends: at a stop a queued message is left for the read-back at once, or its lookups
// and its notice share the stop's one bound (noticeCtx) and a draining runtime turns it away
// at once (a runtime that does not drain takes it, up to deliverTimeout each); a withdrawal
// waits withdrawTimeout at most; a backfill reads nothing more on the ended run ctx, and the
// gateway, closed, queues nothing new.
func (p *Platform) settle(ctx context.Context) {
	// The refusals held back are reported as the daemon stops, not up to a minute later: the
	// process may have exited by then (logging.KeyedLimiter.Flush).
	defer p.notTakenLines.Flush()
	p.endReplay()
	for {
		p.mu.Lock()
		done := p.intaking
		if done == nil {
			done = p.backfilling // a backfill's end hands what it held to the intake
		}
		p.mu.Unlock()
		if done == nil {
			return
		}
		if f := stopWait.Load(); f != nil {
			(*f)()
		}
		select {
		case <-done:
		case <-ctx.Done():
			return
		}
	}
}

// WaitInbound implements platforms.InboundWaiter: when the daemon stops while Run is not
// running (the platform actor waits to run it again after a lost connection, a cluster member
// waits for the gateway lease), what the intake and a backfill still hold meets the stop, as
// it does when the stop finds Run running, before the platform's actor stops. Left to itself,
// the intake went on delivering after the runtime was gone, or never (the process exited): a
// new DM's message, which the next start does not read back, was lost without a word. The
// run's ctx ends here if Run's did not end it: a cluster member that let the gateway
// connection go (platforms.ErrLetGo) goes on delivering until its daemon stops.
func (p *Platform) WaitInbound(ctx context.Context) {
	p.mu.Lock()
	end := p.endRun
	p.mu.Unlock()
	if end != nil {
		end(context.Canceled)
	}
	p.settle(ctx)
}

// addBackfillLocked counts one more backfill running or waiting. p.mu is held.
func (p *Platform) addBackfillLocked() {
	if p.backfills++; p.backfilling == nil {
		p.backfilling = make(chan struct{})
	}
}

// doneBackfillLocked counts a backfill done, and tells settle when none is left. p.mu is held.
func (p *Platform) doneBackfillLocked() {
	if p.backfills--; p.backfills == 0 && p.backfilling != nil {
		close(p.backfilling)
		p.backfilling = nil
	}
}

// dropDeleted drops the messages among ids, deleted in channel, that wait in held, in the
// intake queue or in a backfill's backlog, and reports whether the runtime may hold one of the
// others: delivered, in the hands of the intake or of a backfill, or posted before delivered
// holds all the runtime took (unrecordedLocked). p.mu is held.
func (p *Platform) dropDeleted(channel string, ids []string) (maybeTaken bool) {
	p.held = slices.DeleteFunc(p.held, deletedIn(channel, ids))
	p.intake = slices.DeleteFunc(p.intake, func(it intakeItem) bool { return it.m != nil && deletedIn(channel, ids)(it.m) })
	p.backlog = slices.DeleteFunc(p.backlog, deletedIn(channel, ids))
	if p.intaking != nil || p.inHand != nil && deletedIn(channel, ids)(p.inHand) {
		return true
	}
	return slices.ContainsFunc(ids, func(id string) bool { _, ok := p.delivered[id]; return ok || p.unrecordedLocked(id) })
}

// deletedIn reports whether a message is one of ids, deleted in channel.
func deletedIn(channel string, ids []string) func(*discordgo.Message) bool {
	return func(m *discordgo.Message) bool { return m.ChannelID == channel && slices.Contains(ids, m.ID) }
}

// queueDeletion queues run, the withdrawal of messages among ids deleted in channel that the
// runtime may hold, behind the messages queued before it: behind its own message's delivery
// when that is in flight on the intake, and after it when a backfill hands it on (putDownLocked).
// p.mu is held.
func (p *Platform) queueDeletion(channel string, ids []string, run func()) {
	if p.inHand != nil && deletedIn(channel, ids)(p.inHand) {
		p.afterHand = append(p.afterHand, run)
		return
	}
	p.intake = append(p.intake, intakeItem{run: run})
	p.startIntakeLocked()
}
