package actors

import (
	"fmt"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
)

// Probation of a session (see Probation). The head of the queue is a suspect when the daemon's
// unclean stops were counted against it ProbationAfter times (item.restarts). Before its turn
// starts, the session asks Probation for the token, then marks the message in the store with
// this run (persistence.MarkProbation), and starts the turn once that write is acknowledged: a
// process that dies from then on counts against it at the next start, and against no suspect
// that waited. The session gives the token back as soon as the suspect no longer runs nor is
// next to run (settleProbation), and when it restarts or stops. Only suspects pay for this: the
// check on any other turn is one comparison.
//
// A head struck once (item.restarts 1) is marked too, but later: once its turn has its agent
// slot (marksAtSlot, slotTaken), and its agent starts once that write is acknowledged. An
// unclean stop counts a struck head only by a mark of the run that died (Store.BeginRun), so
// the heads that only waited for a slot during a backlog keep their one strike, and a message
// whose agent started when the process died is counted again. A head with no strike pays
// nothing: every unclean stop counts it.

// probationRun is a session's request for the token, for the suspect seq.
type probationRun struct {
	id      string
	seq     int64
	message string
	strikes int
	asked   time.Time
	granted bool
	marking bool // the mark's write is in flight
	marked  bool // the mark is durable: the turn may start
}

// holdForProbation reports whether the head of the queue must wait before its turn starts: it
// is a suspect and the session does not hold the token, or its mark is not durable yet.
func (s *Session) holdForProbation(c actor.Context) bool {
	head := s.queue[0]
	if s.d.Probation == nil || s.d.Run == "" || head.restarts < ProbationAfter {
		return false
	}
	p := s.probation()
	if p != nil && p.seq != head.seq {
		s.endProbation(c)
		p = nil
	}
	switch {
	case p == nil:
		p = &probationRun{id: newID("p_"), seq: head.seq, message: head.messageID, strikes: head.restarts, asked: time.Now()}
		s.rare().probation = p
		c.Send(s.d.Probation, &askProbation{id: p.id, session: c.Self(), key: s.key, message: p.message, strikes: s.strikes(p)})
	case !p.granted:
	case !p.marking && !p.marked:
		p.marking = true
		s.write(c, []persistence.Op{&persistence.MarkProbation{SessionID: head.sessionID, Seq: head.seq, Run: s.d.Run}},
			func(c actor.Context, err error) { s.onProbationMarked(c, p, err) })
	case p.marked:
		s.logger().Info("running a suspect message on probation: alone among such messages; if agentgate stops uncleanly now, it counts against this one",
			"message_id", p.message, "strikes", s.strikes(p), "waited", time.Since(p.asked).Round(time.Millisecond))
		return false
	}
	return true
}

// strikes is how p's message stands against QuarantineAfter.
func (s *Session) strikes(p *probationRun) string {
	return fmt.Sprintf("%d/%d", p.strikes, QuarantineAfter)
}

// onProbationGranted starts the suspect's turn (after its mark), or gives back a token the
// session no longer wants (its request was ended while the grant was on its way).
func (s *Session) onProbationGranted(c actor.Context, m *probationGranted) {
	if p := s.probation(); p != nil && p.id == m.id {
		p.granted = true
		s.tryStart(c)
		return
	}
	c.Send(s.d.Probation, &endProbation{id: m.id})
}

// onProbationLost asks again for a token Probation forgot when it restarted.
func (s *Session) onProbationLost(c actor.Context, m *probationLost) {
	if p := s.probation(); p != nil && p.id == m.id && !p.marked {
		s.unusual.probation = nil
		s.tryStart(c)
	}
}

// onProbationMarked starts the suspect's turn once its mark is durable. A mark that was not
// stored lets nothing run: the session starts again from the store and asks again, unless it
// hands over already (fenced, or a mark held behind a turn's result given up with it:
// errHandedOver), which the hand-over's own cause decides.
func (s *Session) onProbationMarked(c actor.Context, p *probationRun, err error) {
	if s.probation() != p {
		return
	}
	p.marking = false
	if err != nil {
		s.logRefusedWrite("store the probation mark of a suspect message", err, "message_id", p.message)
		if !s.fencedOut {
			s.restartFromStore(c, "the probation mark of a suspect message was not stored", err)
		}
		return
	}
	p.marked = true
	s.tryStart(c)
}

// settleProbation gives the token back once the suspect it is for neither runs nor is next
// to run (answered, failed, interrupted, set aside, or the session halted). Receive calls it
// after every message of a session that has a probation request.
func (s *Session) settleProbation(c actor.Context) {
	p := s.probation()
	if r := s.running; r != nil && r.items[0].seq == p.seq {
		return
	}
	if s.running == nil && !s.halted && len(s.queue) > 0 && s.queue[0].seq == p.seq {
		return
	}
	s.endProbation(c)
}

// endProbation gives the token back, or withdraws the request.
func (s *Session) endProbation(c actor.Context) {
	if p := s.probation(); p != nil {
		c.Send(s.d.Probation, &endProbation{id: p.id})
		s.unusual.probation = nil
	}
}

// probationState is what GetState says of the session's probation: "running" while its
// suspect's turn runs, "waiting" while the suspect waits for the token or its mark, "" when the
// session has no suspect.
func (s *Session) probationState() string {
	p := s.probation()
	switch {
	case p == nil:
		return ""
	case s.running != nil && s.running.items[0].seq == p.seq:
		return "running"
	}
	return "waiting"
}

// marksAtSlot reports whether the turn of head marks it with this run once the turn has its
// agent slot: it was struck once (a suspect's mark is written before its turn starts, by
// holdForProbation), and this daemon counts its unclean stops (probation on, as for suspects:
// not in cluster mode, where a claim counts a member's death).
func (s *Session) marksAtSlot(head *item) bool {
	return head.restarts > 0 && head.restarts < ProbationAfter && s.d.Probation != nil && s.d.Run != ""
}

// onSlotTaken marks the head of the running turn with this run: its call has an agent slot and
// waits for the mark (runTurn.mark).
func (s *Session) onSlotTaken(c actor.Context, m *slotTaken) {
	r := s.running
	if r == nil || r.id != m.TurnID || !r.marks {
		return // cancelled since: its call ends without starting the agent
	}
	head := r.items[0]
	s.write(c, []persistence.Op{&persistence.MarkProbation{SessionID: head.sessionID, Seq: head.seq, Run: s.d.Run}},
		func(c actor.Context, err error) { s.onStruckMarked(c, r, err) })
}

// onStruckMarked starts the agent of turn r once the mark of its head is durable. A mark that
// was not stored runs nothing, as for a suspect: the session starts again from the store (its
// turn cancelled), unless it hands over already.
func (s *Session) onStruckMarked(c actor.Context, r *turnRun, err error) {
	if s.running != r {
		return
	}
	if err != nil {
		s.logRefusedWrite("store the mark of a struck message whose turn starts", err, "message_id", r.items[0].messageID)
		if !s.fencedOut {
			s.restartFromStore(c, "the mark of a struck message whose turn starts was not stored", err)
		}
		return
	}
	c.Send(r.pid, &startAgent{})
}
