package actors

import (
	"context"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/asynkron/protoactor-go/actor"
)

// A session manager its supervisor restarts after a panic stops its sessions with the
// incarnation before: a running turn was cancelled, and what a session held queued, a stopping
// session's rerun and an activation's Recover went with it. Their work is pending in the store.
// The agents of the cancelled turns need a moment to end what they started (the exec agent
// signals its command and kills it after its grace), and the key's next activation would load
// the work and run the message again beside the call still ending: the agent's tools acting
// twice at once for one message. So the new incarnation holds the keys its restart stopped
// (keepStopped), as a session waits for the call of a turn it cancelled before it runs the
// message again (cancelAwaited), until the agent calls in flight have returned or cancelWait
// has passed (holdStopped), and only then lets them go on (onRestartStopped). It waits for the
// calls in flight as it starts, those of the sessions its restart stopped, and for those alone
// (AgentCalls.inFlight): another key's turn, begun since, held them, and a single daemon's
// recovery, until it returned or cancelWait had passed
// (TestRestartedManagerWaitsOnlyForTheCallsItsRestartCancelled). What comes for such a key
// meanwhile is held, in order, as for a session that stops (stopping), and goes on with the key.
//
// A single daemon then recovers, as its first start does at once (recoverAll), and the held
// messages join their keys' sessions; before, its start recovered at once
// (TestRestartedManagerWaitsForTheCancelledCallsBeforeItRecovers). A cluster member's keys go on
// as a stopped session's key does (startSuccessor): here with what was held, if anything was,
// or to the member that takes the key over. Those whose work the store lists as pending go on
// with it: a key this member owns is activated here, as the cluster's recovery sweep would
// (asking the other members to let go of it first, as every activation does), and one another
// member owns now gets a Recover there, once this member has let go of it.
// Before, a key this member owns with nothing held for it was let go, and its pending message
// waited, unanswered, for the member's next recovery sweep, up to cluster.member_ttl later
// (TestRestartedMemberRecoversTheStoppedKeysItOwns). A key neither listed nor held for is let go
// (an idle session's: activated again, it would load for nothing).
//
// While its member leaves (Leave), the manager goes on leaving (managerKept), and hands those
// keys on: a Recover to the key's successor for each whose work the store lists as pending (a
// key no member takes over is recovered here, as by a member that stays).
// Left in the store, that work waited for the member's withdrawal, after the drain, and the
// recovery of the key's owner then (a renewal, up to cluster.member_ttl later), while the new
// incarnation, with nothing running, answered the drain at once
// (TestManagerRestartedWhileItsMemberLeavesHandsOnItsStoppedKeys). Meanwhile the drain waits
// (leftToHandOn), and ListActive names the keys among those handing on. Sent on at once, a
// message had the successor load the key's pending work and run it beside the call still ending
// here, as the Recover did (TestManagerRestartedWhileItsMemberLeavesHoldsItsStoppedKeysMessages),
// and a member that asked for the key (Release) was told this one held nothing of it.

// restartStopped tells a restarted manager that the agent calls its restart cancelled have
// returned (or cancelWait has passed), with, in a cluster, the store's keys with work pending,
// or the error of their listing (holdStopped). n is the hold's number (managerKept.stoppedN):
// one of an earlier incarnation is dropped.
type restartStopped struct {
	n           uint64
	recoverable []string
	err         error
}

// keepStopped records, as the manager restarts, the keys held here (holdsKey) for the next
// incarnation to hold until the calls its restart cancelled have returned (holdStopped). A stop
// forgets them.
func (m *SessionManager) keepStopped(restarting bool) {
	if !restarting {
		m.kept.stopped = nil
		return
	}
	if m.kept.stopped == nil {
		m.kept.stopped = map[string]bool{}
	}
	for k := range m.sessions {
		m.kept.stopped[k] = true
	}
	for k := range m.stopping {
		m.kept.stopped[k] = true
	}
	for k := range m.activating {
		m.kept.stopped[k] = true
	}
}

// holdStopped begins, as a restarted manager starts, the hold of the keys its restart stopped,
// and reports whether there are any: beside the manager, it waits for the agent calls in flight
// now to return (at most cancelWait) and, in a cluster, lists the keys with work pending (at most
// recoverListTimeout: a leaving member hands those on), and tells the manager (restartStopped).
// A single daemon lists them as it recovers (recoverAll).
func (m *SessionManager) holdStopped(c actor.Context) bool {
	if len(m.kept.stopped) == 0 {
		return false
	}
	for k := range m.kept.stopped {
		m.stopping[k] = nil // what comes for the key is held until it goes on (onRestartStopped)
	}
	m.kept.stoppedN++
	n, self, root, d := m.kept.stoppedN, c.Self(), c.ActorSystem().Root, m.d
	wait := d.Config.cancelWait()
	// The calls in flight now, as the new incarnation starts, are those of the sessions its
	// restart stopped (the old incarnation's children have all stopped, and the new one has
	// started none): a turn another key begins from here on does not hold these keys.
	cancelled := d.AgentCalls.inFlight()
	go func() {
		ctx, cancel := context.WithTimeout(d.Ctx, wait)
		_ = cancelled.wait(ctx) // past it, the keys go on all the same, as a session's next turn starts
		cancel()
		r := &restartStopped{n: n}
		if d.Clustered {
			ctx, cancel = context.WithTimeout(d.Ctx, recoverListTimeout)
			r.recoverable, r.err = d.Store.Recoverable(ctx)
			cancel()
		}
		root.Send(self, r)
	}()
	return true
}

// onRestartStopped lets the keys the manager's restart stopped go on, once the calls it
// cancelled have returned (holdStopped). A single daemon recovers, as at its first start, and
// the messages held for those keys go on in order, behind their keys' recovered work. In a
// cluster each key goes on as a stopped session's key does (startSuccessor), with what was held
// for it, and, for a key whose work is pending, with a Recover to the member that takes it over
// or, for one this member keeps, an activation here. When the store could not list them, a line
// says so, and their pending work waits as before: for the member's withdrawal and the owner's
// recovery then while the member leaves, else for the cluster's recovery sweep.
func (m *SessionManager) onRestartStopped(c actor.Context, r *restartStopped) {
	if r.n != m.kept.stoppedN || m.kept.stopped == nil {
		return // (an earlier incarnation's)
	}
	stopped := m.kept.stopped
	m.kept.stopped = nil
	defer m.answerDrains(c)
	if !m.d.Clustered {
		held := make(map[string][]routed, len(stopped))
		for key := range stopped {
			held[key] = m.stopping[key]
			delete(m.stopping, key)
			delete(m.handed, key)
		}
		m.recoverAll(c)
		for key, rs := range held {
			for _, r := range rs {
				m.route(c, key, r)
			}
		}
		return
	}
	switch {
	case r.err != nil && m.kept.successor != nil:
		// A key no member takes over (the other members leave too) with nothing held for it is
		// let go, and its work stays pending in the store: no member takes it over to recover
		// it (no_successor). One that a message or a Recover (the member's recovery sweep) came
		// for while its session stopped starts here, and runs its work before the drain ends
		// (run_here). Before, the line said another member recovers the work of both; then
		// that the second's stays pending (TestLeavingManagerRestartedWithNoListingSaysWhereTheWorkGoes).
		nobody, here := 0, 0
		for key := range stopped {
			if _, ok := m.stopping[key]; !ok || m.elsewhere(key) != nil {
				continue
			}
			if m.stoppingWithWork(key) {
				here++
			} else {
				nobody++
			}
		}
		if nobody+here == 0 {
			m.log.Warn("list the sessions with unfinished work, to hand on those the manager's restart stopped; the member that takes each over recovers its work once this one has withdrawn",
				"sessions", len(stopped), logging.Err(r.err))
			break
		}
		m.log.Warn("list the sessions with unfinished work, to hand on those the manager's restart stopped; "+
			"a key another member takes over has its work recovered there once this one has withdrawn, "+
			"and one no member takes over keeps it in the store, pending, for the member that owns the key next (no_successor: at its start or recovery sweep), "+
			"or runs it here before the drain ends when a message or a recovery came for it meanwhile (run_here)",
			"sessions", len(stopped), "no_successor", nobody, "run_here", here, logging.Err(r.err))
	case r.err != nil:
		m.log.Warn("list the sessions with unfinished work, to recover those the manager's restart stopped; the cluster's recovery sweep recovers their work",
			"sessions", len(stopped), logging.Err(r.err))
	}
	pending := make(map[string]bool, len(r.recoverable))
	for _, key := range r.recoverable {
		pending[key] = true
	}
	handed, recovered := 0, 0
	for key := range stopped {
		held, ok := m.stopping[key]
		if !ok {
			continue
		}
		if pending[key] {
			// A Recover to the member that takes the key over, or, for a key this member owns,
			// its activation here (which asks the other members to let go of it first, as
			// every activation does).
			m.rerun[key] = true
		}
		switch {
		case m.elsewhere(key) != nil:
			if m.rerun[key] || len(held) > 0 {
				handed++
			}
		case pending[key]:
			recovered++
		}
		m.startSuccessor(c, key)
	}
	if handed > 0 {
		m.log.Info("the restarted manager hands on the keys of the sessions its restart stopped with work pending", "sessions", handed)
	}
	if recovered > 0 {
		m.log.Info("the restarted manager recovers the sessions its restart stopped with work pending", "sessions", recovered)
	}
}
