package actors

import (
	"slices"

	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
)

// Crashes of the platform actor. A panic in Receive restarts the actor (OneForOne, 10 a
// minute), and protoactor calls the producer again for the new incarnation: NewPlatform's
// producer hands back the same state, and the actor context (its PID, the sender of its timers)
// is the same, so the restarted actor carries on with everything the crashed one held: the
// queued replies, the sends in flight (their results come back to the same PID), the retries
// waiting for their timers, the drafts, the unwritten delivery marks and the Run loop.
//
// What a panic mid-handler can leave half done is kept small by the order of the code: a key is
// marked in flight only once its send runs (pump), and the handlers of a send's result release
// the key first thing, so a key in flight that holds no retry always has a result on its way.
// restarted repairs the rest: it counts the sends that run, starts the next send of every key
// that has none, releases drafts left queued with no job and writes the waiting marks. A retry
// held by a timer is left to the timer: the retrySendHeld of a key that holds no retry any more
// is ignored, so no key ever runs two sends at once.
//
// A job (a reply, or a turn's draft) whose handling panics every time would crash the
// restarted actor again, until its supervisor gives up. So each message names the job it handles
// (jobOf, and pump for the send it starts), a crash counts a strike against that job, and a job
// struck crashStrikes times is dropped: a reply is recorded as failed in the outbox, a draft is
// left as it is (the turn's final reply is then posted anew). A session quarantines a message
// the same way, after 3 crashes; here 2 are enough, since a crash may cost the sends of every
// chat of the platform a pause. The strikes live in memory only: a job that crashed the actor
// once before the process stopped starts with none.

// crashStrikes is how many crashes of the platform actor a job may be handled during before it
// is dropped.
const crashStrikes = 2

// jobRef names a job of a key's queue: the seq of its reply, or the turn of its draft.
type jobRef struct {
	key  string
	seq  int64
	turn string
}

func (j *job) ref(key string) jobRef {
	if j.draftTurn != "" {
		return jobRef{key: key, turn: j.draftTurn}
	}
	return jobRef{key: key, seq: j.out.Seq}
}

// jobOf returns the job a message to the platform actor is about, if any.
func (a *Platform) jobOf(msg any) (jobRef, bool) {
	switch m := msg.(type) {
	case *SendOutbound:
		if m.Out != nil {
			return jobRef{key: m.Out.SessionKey, seq: m.Out.Seq}, true
		}
	case *sendDone:
		return jobRef{key: m.out.SessionKey, seq: m.out.Seq}, true
	case *retrySendHeld:
		if q := a.queues[m.key]; len(q) > 0 {
			return q[0].ref(m.key), true
		}
	case *DraftText:
		return jobRef{key: m.SessionKey, turn: m.TurnID}, true
	case *DropDraft:
		return jobRef{key: m.SessionKey, turn: m.TurnID}, true
	case *draftDone:
		return jobRef{key: m.key, turn: m.turn}, true
	case *finishOverdue:
		if d := a.drafts[m.turn]; d != nil {
			return jobRef{key: d.key, turn: d.turn}, true
		}
	case *draftTick:
		if d := a.drafts[m.turn]; d != nil {
			return jobRef{key: d.key, turn: d.turn}, true
		}
	}
	return jobRef{}, false
}

// crashed counts a strike against the job that was being handled when the actor panicked.
func (a *Platform) crashed() {
	j := a.handling
	a.handling = jobRef{}
	if j.key == "" {
		return
	}
	if a.strikes == nil {
		a.strikes = map[jobRef]int{}
	}
	a.strikes[j]++
	a.log.Warn("platform actor crashed; restarting with its queues", "session", j.key, "seq", j.seq, "turn", j.turn,
		"crashes", a.strikes[j])
}

// restarted carries the crashed incarnation's state on (see the comment at the top).
func (a *Platform) restarted(c actor.Context) {
	for j, n := range a.strikes {
		if n >= crashStrikes {
			a.dropJob(c, j)
		}
	}
	a.sending = 0
	for key, busy := range a.inflight {
		if busy && !a.held[key] {
			a.sending++
		}
	}
	for _, d := range a.drafts {
		if d.queued && !slices.ContainsFunc(a.queues[d.key], func(j *job) bool { return j.draftTurn == d.turn }) {
			d.queued = false
		}
	}
	for key := range a.queues {
		a.pump(c, key)
	}
	for _, d := range a.drafts {
		a.scheduleDraft(c, d)
	}
	a.flushMarks(c)
	a.answerQuiesce(c)
}

// dropJob removes a job that was being handled during crashStrikes crashes from its key's
// queue, unless its send runs now (its result comes back, and a later crash may drop it).
func (a *Platform) dropJob(c actor.Context, j jobRef) {
	q := a.queues[j.key]
	i := slices.IndexFunc(q, func(x *job) bool { return x.ref(j.key) == j })
	if i < 0 {
		delete(a.strikes, j) // done since
		return
	}
	if i == 0 && a.inflight[j.key] {
		if !a.held[j.key] {
			return
		}
		delete(a.held, j.key) // its retry timer finds nothing to release
		a.inflight[j.key] = false
		delete(a.attempts, j.key)
	}
	delete(a.strikes, j)
	jb := q[i]
	q = slices.Delete(q, i, i+1)
	if len(q) == 0 {
		delete(a.queues, j.key)
		delete(a.inflight, j.key)
	} else {
		a.queues[j.key] = q
	}
	if jb.draftTurn != "" {
		a.log.Error("a draft was being handled during 2 crashes of the platform actor; it is left as it is",
			"session", j.key, "turn", j.turn)
		if d := a.drafts[j.turn]; d != nil {
			d.queued, d.failed, d.broken = false, true, true // the final reply is posted anew
			if d.dropped {
				a.endDraft(c, d)
			}
		}
		return
	}
	a.log.Error("a reply was being handled during 2 crashes of the platform actor; recorded as failed",
		"session", j.key, "seq", j.seq, "kind", jb.out.Kind)
	a.d.Metrics.OutboundTotal.WithLabelValues(a.p.Name(), "error").Inc()
	a.mark(c, &persistence.MarkDelivery{SessionKey: j.key, Seq: j.seq, State: persistence.DeliveryFailed, At: a.d.now(),
		Attempt: max(jb.tries, 1)})
}
