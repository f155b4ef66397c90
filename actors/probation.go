package actors

import (
	"log/slog"
	"slices"
	"time"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"
)

// Probation lets suspect messages run one at a time in the process. A suspect is a session's
// next message whose attempts reached ProbationAfter: the daemon stopped uncleanly twice while
// it was running or next to run. In a crash loop every message in flight is counted so (a turn
// that takes seconds runs again at each start, and is still running when the poison message
// kills the process again); run alone among suspects, marked in the store with the run first
// (persistence.MarkProbation), only the suspect running when the process dies is counted
// again (Store.BeginRun), so the poison message reaches QuarantineAfter and the others do not.
// Messages that are no suspects run as ever, concurrently.
//
// A session asks for the token (askProbation) before its suspect's turn; Probation grants it in
// request order (probationGranted) and the session gives it back (endProbation) once that turn
// is over, or when it restarts or stops. Probation watches the sessions it knows, so one that
// is gone without a word gives its token back too. Single daemon only (Deps.Probation nil in
// cluster mode, where deaths are counted at claim time).
type Probation struct {
	d       *Deps
	log     *slog.Logger
	holder  *askProbation
	waiting []*askProbation // in request order

	// The waiting line held back (logWaiting): firstHeld is the first request held back since
	// the last line, which the line that counts them names; stopDue cancels the armed
	// waitsDue, nil when none is armed.
	firstHeld *askProbation
	stopDue   scheduler.CancelFunc
}

// waitsDue is the timer of the waiting line held back: it is logged once due.
type waitsDue struct{}

// ProbationAfter is the attempts (unclean stops of the daemon counted against a message) from
// which a session's next message is a suspect and runs on probation: one below QuarantineAfter.
const ProbationAfter = persistence.ProbationAfter

// NewProbation returns the props of the probation actor (top level, "probation").
func NewProbation(d *Deps) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &Probation{d: d} }, dispatchedBy(d.Dispatcher)...)
}

// Receive grants the token in request order, and logs the sessions that begin to wait for it.
func (p *Probation) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		p.log = p.d.Log.With("actor", "probation")
		p.armWaitsDue(c) // (after a restart, none held back: its predecessor logged them)
	case *askProbation:
		c.Watch(m.session)
		p.waiting = append(p.waiting, m)
		p.logWaiting(c, m)
		p.next(c)
	case *waitsDue:
		p.stopDue = nil
		p.logHeldWaits(c)
	case *endProbation:
		if p.holder != nil && p.holder.id == m.id {
			p.holder = nil
			p.next(c)
			return
		}
		p.drop(func(a *askProbation) bool { return a.id == m.id })
	case *actor.Terminated:
		if p.holder != nil && p.holder.session.Equal(m.Who) {
			p.log.Warn("a session stopped while its suspect message ran on probation; the next suspect runs",
				"session", p.holder.key, "message_id", p.holder.message)
			p.holder = nil
			p.next(c)
		}
		p.drop(func(a *askProbation) bool { return a.session.Equal(m.Who) })
	case *actor.Restarting:
		// Its successor knows nobody: every session that holds or waits for the token asks
		// again (probationLost).
		for _, a := range append(p.waiting, p.holder) {
			if a != nil {
				c.Send(a.session, &probationLost{id: a.id})
			}
		}
		p.d.Metrics.ProbationWaiting.Set(0)
		cancelTimer(p.stopDue)
		p.flushWaits() // while it knows the first held back, whom its successor cannot name
	case *actor.Stopping:
		cancelTimer(p.stopDue)
		p.flushWaits() // before, counted only by the next start's line
	}
}

// waitingLine is what Probation logs as a session's suspect begins to wait for the token.
const waitingLine = "the next message was running during 2 unclean stops of agentgate: it waits to run alone among such messages (probation), so that only the one that takes agentgate down is quarantined"

// logWaiting says that m's suspect begins to wait: at Warn for the first session, then once a
// LimitEvery for all sessions, with how many began to wait since the last line ("sessions",
// this one included); each other at Debug. After an unclean stop during a backlog, every
// routed session's head can be a suspect: a restart logged thousands of these lines at once (a
// scale walkthrough: 3,560 of them). The sessions held back are logged when the line is due
// (waitsDue, logHeldWaits), not with the next one: a start's suspects all begin waiting at
// once, and its line said sessions=1, the others counted only when one more began to wait,
// which may never come.
func (p *Probation) logWaiting(c actor.Context, m *askProbation) {
	args := []any{"session", m.key, logging.KeyMessage, m.message, "strikes", m.strikes}
	if n, ok := p.d.probationWaits.Allow(); ok {
		p.log.Warn(waitingLine, append(args, "sessions", n)...)
		p.firstHeld = nil
		return
	}
	if p.firstHeld == nil {
		p.firstHeld = m
	}
	if p.log.Enabled(p.d.Ctx, slog.LevelDebug) {
		p.log.Debug(waitingLine, args...)
	}
	p.armWaitsDue(c)
}

// armWaitsDue arms the timer of the waiting line held back, for when it is due.
func (p *Probation) armWaitsDue(c actor.Context) {
	if p.stopDue != nil {
		return
	}
	if n, due := p.d.probationWaits.Held(); n > 0 {
		p.stopDue = scheduler.NewTimerScheduler(c).SendOnce(max(time.Until(due), 0), c.Self(), &waitsDue{})
	}
}

// logHeldWaits logs the waiting line that stands for the sessions held back since the last
// one, once it is due, named after the first of them.
func (p *Probation) logHeldWaits(c actor.Context) {
	if n, due := p.d.probationWaits.Held(); n == 0 {
		return
	} else if time.Now().Before(due) { // a line logged since the timer was armed
		p.armWaitsDue(c)
		return
	}
	p.flushWaits()
}

// flushWaits logs the waiting line that stands for the sessions held back since the last one,
// due or not: when due (logHeldWaits), and as Probation stops or restarts. Before, those held
// back at a stop were logged by no line, and the line due after a restart named no session:
// the successor does not know the first held back.
func (p *Probation) flushWaits() {
	n, ok := p.d.probationWaits.Flush()
	if !ok {
		return
	}
	var args []any
	if f := p.firstHeld; f != nil {
		args = []any{"session", f.key, logging.KeyMessage, f.message, "strikes", f.strikes}
	}
	p.firstHeld = nil
	p.log.Warn(waitingLine, append(args, "sessions", n)...)
}

// next grants the token to the first session waiting for it, when nobody holds it.
func (p *Probation) next(c actor.Context) {
	if p.holder == nil && len(p.waiting) > 0 {
		p.holder = p.waiting[0]
		p.waiting = slices.Delete(p.waiting, 0, 1)
		c.Send(p.holder.session, &probationGranted{id: p.holder.id})
	}
	p.d.Metrics.ProbationWaiting.Set(float64(len(p.waiting)))
}

func (p *Probation) drop(match func(*askProbation) bool) {
	p.waiting = slices.DeleteFunc(p.waiting, match)
	p.d.Metrics.ProbationWaiting.Set(float64(len(p.waiting)))
}
