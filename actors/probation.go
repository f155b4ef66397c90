package actors

import (
	"log/slog"
	"slices"

	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
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
}

// ProbationAfter is the attempts (unclean stops of the daemon counted against a message) from
// which a session's next message is a suspect and runs on probation: one below QuarantineAfter.
const ProbationAfter = persistence.ProbationAfter

// NewProbation returns the props of the probation actor (top level, "probation").
func NewProbation(d *Deps) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &Probation{d: d} }, dispatchedBy(d.Dispatcher)...)
}

// Receive grants the token in request order.
func (p *Probation) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		p.log = p.d.Log.With("actor", "probation")
	case *askProbation:
		c.Watch(m.session)
		p.waiting = append(p.waiting, m)
		p.next(c)
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
	}
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
