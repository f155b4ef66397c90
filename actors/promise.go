package actors

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/agentgate/agentgate/internal/logging"
)

// Asks and promises through the store (cluster mode, a Placement that implements Asks).
//
// An activation waits for a member it cannot reach while the store names it as the key's holder
// (stillHolds): it may be running the key's turn. Most often it is not: its session was told
// `moved`, finished its turn and stopped long ago, but its claim is still the key's latest and
// its registration is live. A cut between these two members only (both reach the database)
// otherwise held the key for as long as it lasted. So the store carries the ask and the answer:
//
//   - A manager exchanges asks with the store every askEvery (exchangeAsks): it records the keys
//     whose activation waits for a member it cannot reach (in place of those it recorded
//     before), and reads the asks of other members for keys whose latest claim is its own.
//   - For each, while it holds nothing of the key (no session in memory, stopping, activating,
//     or held by a restart), it promises its claim at its epoch to the asker (Asks.Promise): the
//     store names the asker as the key's holder from then on, and the asker's wait ends at its
//     next lookup. One that holds the key tells its session `moved` when the key is elsewhere,
//     as a Release would, and promises at a later exchange, once it let go.
//   - Its own activations of the key defer to the asker from the moment the promise is begun
//     (activation.promisedTo): they ask it, never hold the key for it, and do not take its word
//     that it holds nothing, since it may claim the key on the promise later without reaching
//     this member. Only the store lets such an activation go on: it names another member (the
//     asker promised the claim back through its own exchange, or another member claimed the
//     key since), or none (the asker is gone); and only once the promise's write has answered
//     (promising; a failed write is written again, every promiseRetry, until the store
//     answers): before, the store's answer may still change to name the asker. So such an
//     activation never claims the key beside the asker, whatever its lookups found before.
//
// So of the promiser and the asker, whichever way the cut goes, only one claims the key: the
// asker on the promise, or the promiser once the store no longer names the asker. So too of a
// third member that the asker cannot reach and that the promiser told, over the link and just
// before it promised, that it holds nothing: the promise turns the promiser's one "let go" into
// two, which the store settles. Each claims the key only on the claim its activation looked up
// (Holder.Seen, Store.Claim's seen): the third member's, on the promiser's claim, is refused
// once the promise changed its owner, and a promise after the third member's claim promises
// nothing (TestPromiseToAMemberCutOffFromAThirdThatActivates). The asker claims on the promised
// claim, which the lookup that ends its wait reads (stillHolds sets activation.seen). A third
// member of an older version claims on no condition, and would claim beside the asker: the
// store promises nothing while one is live (its registration lacks the mark every member of
// this version's carries, postgres.ClaimsOnCondition), and the promise then counts as one of a
// claim no longer this member's; the asker waits, as before the promise, and this member
// promises at a later exchange once no such member is left
// (TestPromiseToAMemberBesideAThirdOfAnOlderVersion).

const (
	// askEvery is how often a manager exchanges asks with the store; askStands, how long an ask
	// its asker stopped renewing is still read (three exchanges: one or two can fail).
	askEvery  = releaseAnswerTimeout
	askStands = 3 * askEvery
	// promiseRetry is how long after a failed write of a promise it is written again.
	promiseRetry = releaseAnswerTimeout
	// askTimeout bounds one exchange of asks and one write of a promise.
	askTimeout = holderLookupTimeout
)

// errPromisedAway is why an activation waits for a member that said it holds nothing of the
// key: this member promised that member the key's claim (stillHolds).
var errPromisedAway = errors.New("this member promised the session's claim to that member through the database")

// exchangeAsks is the manager's tick for its exchange of asks with the store.
type exchangeAsks struct{}

// asksExchanged is the answer of an exchange of asks.
type asksExchanged struct {
	asks []Ask
	err  error
}

// promiseWritten is the answer of a write of a promise (numbered n): promised, or err when the
// write failed (it is written again).
type promiseWritten struct {
	key      string
	n        uint64
	promised bool
	err      error
}

// askStore is the manager's Placement as Asks, or nil when it carries no asks.
func (m *SessionManager) askStore() Asks {
	s, _ := m.d.Placement.(Asks)
	return s
}

// armAsks arms the manager's next tick for its exchange of asks in a cluster (a tick does
// nothing when its placement carries no asks): one timer at a time, armed again at each tick,
// for the reason armPauseCheck gives (protoactor's SendRepeatedly, used here before, raced with
// its cancel at the manager's stop: TestActivationAsksASilentMemberAgain, once under -race).
func (m *SessionManager) armAsks(c actor.Context) {
	if m.d.Clustered && !m.closing {
		m.stopAsks = m.timers.SendOnce(askEvery, c.Self(), &exchangeAsks{})
	}
}

// onExchangeAsks exchanges asks with the store, off the actor: the keys whose activation waits
// for a member it cannot reach, which the store names as their holder, go out; the asks of
// other members for keys whose latest claim is this member's come back (asksExchanged). One at
// a time: a tick while one is in flight is skipped.
func (m *SessionManager) onExchangeAsks(c actor.Context) {
	s := m.askStore()
	if s == nil || m.closing || m.asksBusy {
		return
	}
	var keys []string
	for key, a := range m.activating {
		if len(a.unreachable) > 0 {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys)
	m.asksBusy = true
	system, self, ctx := c.ActorSystem(), c.Self(), m.d.Ctx
	go func() { // owned by the exchange: it ends with the store call, bounded by askTimeout
		ctx, cancel := context.WithTimeout(ctx, askTimeout)
		defer cancel()
		asks, err := s.ExchangeAsks(ctx, keys, askStands)
		system.Root.Send(self, &asksExchanged{asks: asks, err: err})
	}()
}

// onAsksExchanged takes the asks of other members for keys the store names this member the
// holder of: it promises each key's claim it holds nothing of (promise).
func (m *SessionManager) onAsksExchanged(c actor.Context, r *asksExchanged) {
	m.asksBusy = false
	if r.err != nil {
		m.askFails.LogQuiet(m.log, slog.LevelWarn, "could not exchange asks with the database; members that cannot reach this one wait for the sessions it last held", logging.Err(r.err))
		return
	}
	if m.closing {
		return
	}
	self := m.d.Placement.Self()
	for _, ask := range r.asks {
		switch {
		case ask.Asker == nil || ask.Asker.Equal(self) || m.kept.promising[ask.Key] != 0:
		case m.holdsKey(ask.Key) || m.kept.stopped[ask.Key]:
			// It promises once it let go (a later exchange). Its session moves on, as on a
			// Release: nothing else may tell it, when the cluster's connections to it fail.
			if pid := m.sessions[ask.Key]; pid != nil && m.elsewhere(ask.Key) != nil {
				c.Send(pid, &moved{})
			}
		default:
			m.promise(c, ask)
		}
	}
}

// promise writes, off the actor, this member's promise of its claim of ask.Key to the asker,
// again every promiseRetry until the store answers (or the daemon stops). This member's
// activations of the key defer to the asker from now on (managerKept.promised), and take no
// answer of the store's for the asker's let-go until the write has answered (promising).
func (m *SessionManager) promise(c actor.Context, ask Ask) {
	m.kept.promises++
	n := m.kept.promises
	if m.kept.promising == nil {
		m.kept.promising, m.kept.promised = map[string]uint64{}, map[string]*actor.PID{}
	}
	m.kept.promising[ask.Key] = n
	m.kept.promised[ask.Key] = ask.Asker
	s, system, self, ctx := m.askStore(), c.ActorSystem(), c.Self(), m.d.Ctx
	go func() { // owned by the promise: it ends once the store answered, or with the daemon
		for {
			wctx, cancel := context.WithTimeout(ctx, askTimeout)
			promised, err := s.Promise(wctx, ask)
			cancel()
			system.Root.Send(self, &promiseWritten{key: ask.Key, n: n, promised: promised, err: err})
			if err == nil {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(promiseRetry):
			}
		}
	}()
}

// onPromiseWritten takes the answer of a write of a promise: until it is in, an activation of
// its key here does not take the store's word that the asker let go (stillHolds).
func (m *SessionManager) onPromiseWritten(r *promiseWritten) {
	if m.kept.promising[r.key] != r.n {
		return
	}
	to := m.kept.promised[r.key]
	if r.err != nil {
		// Whether it was written is not known: it is written again, and waited for.
		m.promiseFails.LogQuiet(m.log, slog.LevelWarn, "could not promise a session's claim through the database; this member's own activation of the session waits until the promise is written", "session", r.key, logging.Err(r.err))
		return
	}
	delete(m.kept.promising, r.key)
	if r.promised {
		m.log.Info("a member that cannot reach this one asked for the session through the database; this member holds nothing of it and promised it its claim",
			"session", r.key, "member", to.Address)
	} else {
		// The key's claim is no longer this member's (another member claimed it since), or a
		// member of an older version is live (the asker waits; a later exchange asks again).
		m.log.Debug("a session's claim asked for through the database was not promised: it is no longer this member's, or a member of an older version is live",
			"session", r.key, "member", to.Address)
		m.forgetPromise(r.key, to)
		if a := m.activating[r.key]; a != nil && a.defersTo(to) {
			a.promisedTo = nil
		}
	}
}

// forgetPromise forgets this member's promise of key's claim to the member to, once it no longer
// stands (the store names another member, or this one claims the key).
func (m *SessionManager) forgetPromise(key string, to *actor.PID) {
	if p := m.kept.promised[key]; p != nil && p.Equal(to) && m.kept.promising[key] == 0 {
		delete(m.kept.promised, key)
	}
}

// holderAddress is the address of the member holder, or "" for none.
func holderAddress(holder *actor.PID) string {
	if holder == nil {
		return ""
	}
	return holder.Address
}
