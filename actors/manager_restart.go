package actors

import (
	"context"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/asynkron/protoactor-go/actor"
)

// A session manager its supervisor restarts after a panic while its member leaves (Leave) goes
// on leaving (managerKept), but its restart stopped its sessions: a running turn was cancelled,
// and what a session held queued, a stopping session's rerun and an activation's Recover went
// with the incarnation. Their work is pending in the store. Left there, it waited for the
// member's withdrawal, after the drain, and the recovery of the key's owner then (a renewal,
// up to cluster.member_ttl later), while the new incarnation, with nothing running, answered
// the drain at once. So the new incarnation hands those keys on as a session that hands its key
// on does: a Recover to the key's successor, for each key held here at the restart whose work
// the store lists as pending (TestManagerRestartedWhileItsMemberLeavesHandsOnItsStoppedKeys).
//
// It does so only once the agent calls in flight have returned, or cancelWait has passed, as a
// session waits for the call of a turn it cancelled before it runs the message again
// (cancelAwaited): the restart cancelled the turns, and their agents need a moment to end what
// they started (the exec agent signals its command and kills it after its grace). Sent at once,
// the Recover had the successor run the message again beside the call still ending here. The
// agent calls are counted for the whole member (AgentCalls): a turn of a key no member takes
// over, which runs here, holds the hand-on up to cancelWait too. Meanwhile the drain waits
// (leftToHandOn), and ListActive names the keys among those handing on. What comes for such a
// key meanwhile is held, as for a session that stops (stopping), and goes on with the key: sent
// on at once, a message had the successor load the key's pending work and run it beside the
// call still ending here, as the Recover did
// (TestManagerRestartedWhileItsMemberLeavesHoldsItsStoppedKeysMessages), and a member that asked
// for the key (Release) was told this one held nothing of it.

// restartStopped tells a manager restarted while its member leaves that the agent calls its
// restart cancelled have returned (or cancelWait has passed), with the store's keys with work
// pending, or the error of their listing (handOnStopped). n is the hand-on's number
// (managerKept.stoppedN): one of an earlier incarnation is dropped.
type restartStopped struct {
	n           uint64
	recoverable []string
	err         error
}

// keepStopped records, as the manager restarts while its member leaves, the keys held here
// (holdsKey) for the next incarnation to hand on (handOnStopped). A stop forgets them.
func (m *SessionManager) keepStopped(restarting bool) {
	if !restarting {
		m.kept.stopped = nil
		return
	}
	if m.kept.successor == nil {
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

// handOnStopped begins, as a manager restarted while its member leaves starts, the hand-on of
// the keys its restart stopped: beside the manager, it waits for the agent calls in flight to
// return (at most cancelWait) and lists the keys with work pending (at most
// recoverListTimeout), and tells the manager (restartStopped).
func (m *SessionManager) handOnStopped(c actor.Context) {
	if len(m.kept.stopped) == 0 {
		return
	}
	for k := range m.kept.stopped {
		m.stopping[k] = nil // what comes for the key is held until it goes on (onRestartStopped)
	}
	m.kept.stoppedN++
	n, self, root, d := m.kept.stoppedN, c.Self(), c.ActorSystem().Root, m.d
	wait := d.Config.cancelWait()
	go func() {
		ctx, cancel := context.WithTimeout(d.Ctx, wait)
		_ = d.AgentCalls.Wait(ctx) // past it, they are handed on all the same, as a session's next turn starts
		cancel()
		ctx, cancel = context.WithTimeout(d.Ctx, recoverListTimeout)
		keys, err := d.Store.Recoverable(ctx)
		cancel()
		root.Send(self, &restartStopped{n: n, recoverable: keys, err: err})
	}()
}

// onRestartStopped hands on the keys the manager's restart stopped, with what was held for each
// meanwhile (startSuccessor, as a stopped session's key goes on), and a Recover to the key's
// successor for those whose work is pending. A key no member takes over starts here with what
// was held, if anything was. When the store could not list them, their pending work waits as
// before for the member's withdrawal and the owner's recovery then, and a line says so.
func (m *SessionManager) onRestartStopped(c actor.Context, r *restartStopped) {
	if r.n != m.kept.stoppedN || m.kept.stopped == nil {
		return // (an earlier incarnation's)
	}
	stopped := m.kept.stopped
	m.kept.stopped = nil
	defer m.answerDrains(c)
	if r.err != nil {
		m.log.Warn("list the sessions with unfinished work, to hand on those the manager's restart stopped; the member that takes each over recovers its work once this one has withdrawn",
			"sessions", len(stopped), logging.Err(r.err))
	}
	pending := make(map[string]bool, len(r.recoverable))
	for _, key := range r.recoverable {
		pending[key] = true
	}
	handed := 0
	for key := range stopped {
		held, ok := m.stopping[key]
		if !ok {
			continue
		}
		if m.elsewhere(key) != nil {
			if pending[key] {
				m.rerun[key] = true
			}
			if m.rerun[key] || len(held) > 0 {
				handed++
			}
		}
		m.startSuccessor(c, key)
	}
	if handed > 0 {
		m.log.Info("the restarted manager hands on the keys of the sessions its restart stopped with work pending", "sessions", handed)
	}
}
