package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
)

// Letting go of a key before another member claims it (cluster mode, Deps.Placement).
//
// A change of membership moves keys between members, and the members learn of it at different
// moments. A key may move while its session runs a turn on the member that held it: a member
// that joins takes over a share of every other member's keys. Claiming such a key at once
// fences the running turn: its result is refused, and the new owner runs the message again, for
// a moment beside the old one (the agent runs twice; its tools act twice). So before a manager
// activates a key it asks every other member's manager to let go of it (Release). One that holds
// the key (a session of it in memory, stopping, or about to start) says so; its session, when
// the key is no longer its member's, finishes its running turn, stores what reaches it meanwhile
// behind that turn, and hands the key on (Session.leave); its manager then says it let go.
// Until every other member has let go, the asking manager forwards the key's requests to the
// holder, which stores them behind its turn (queued), and starts the session only then; its
// claim then fences nothing that still runs. A member that cannot answer (it died, stopped, or
// cannot be reached) is waited for only while the store names it as the key's holder
// (stillHolds). Two members may activate the key at once (their views differ for a
// moment, or one was handed the key by a leaving member): each asks the other, and the
// activation that ranks first holds the key for the other, which waits for it (ranksFirst).

// A member's view of the cluster is as of its last renewal: one that joined since is not among
// its peers, and may already run the key (it asked this member, which held nothing then). So an
// activation also looks up the key's holder in the store (Placement.Holders: the live member
// whose node made the key's latest claim), off the actor and in one batch with the manager's
// other lookups (holders.go), and asks it too when it is neither this member nor a peer already
// asked. The session starts only once the lookup has answered (or its batch failed or took
// longer than holderLookupTimeout: the activation goes on, as with a silent member) and every
// member asked has let go. A member that claims the key after the lookup is not found so; one
// that knows this member asks it first (onRelease asks it back). One that does not (two views
// stale at once) has its claim or this one's refused: the session claims the key only while the
// claim the lookup read is still the key's latest (Holder.Seen, Store.Claim's seen), and one
// refused activates the key again, whose lookup names the member that claimed it
// (Session.claimedMeanwhile).

// A member that cannot answer (its Release comes back as a dead letter, or goes unanswered
// releaseTries times in a row) may still be running the key's turn: a dead letter is also what
// protoactor's remote answers a request to an address it cannot reach (its endpoint writer has
// no connection), and answers are lost while the members' connections recover. Taken to hold
// nothing, such a member's turn ran again here, beside it (the agent's tools acted twice). So
// the store decides (stillHolds). A member it names as the key's holder (its registration is
// live and it made the key's latest claim) is waited for, and asked again every
// releaseAnswerTimeout, until it answers or the store names it no longer: a clean stop removes
// the registration just after the member's manager stopped (once its platforms have sent what
// they were handed; a dead letter in between is asked again), and a member that died is waited
// for until its registration expires, at most member_ttl. A member the store does not name is
// taken to hold nothing at once, as before.
//
// The wait has no bound of its own. A partition between two members that both reach the store
// ends by itself: after gossipExpiry protoactor's gossip blocks the member it does not hear, the
// younger side stops, and its registration goes. One that does not end so (a member cut off from
// one other only: gossip merges every member's heartbeat from any member, so neither blocks the
// other) leaves only the operator to tell whether the member's turn still runs; a bound would
// run it twice exactly there. The line that says the session waits names the member.

// releaseAnswerTimeout is how long a manager waits for another member's answer to Release. A
// holder is asked again each time it passes, so a holder that dies is waited for no longer. A
// member that leaves releaseTries Releases in a row unanswered is looked up in the store
// (stillHolds): an answer can be lost while the members' connections recover (a member killed
// and back at once asked the others while their connections to its address were still
// failing, and took a live member's silence for an empty hand after one try).
const (
	releaseAnswerTimeout = 5 * time.Second
	releaseTries         = 2
	// holderLookupTimeout bounds the activation's lookup of the key's holder in the store.
	holderLookupTimeout = releaseAnswerTimeout
)

// activation is a key whose session waits for the other members to let go of it.
type activation struct {
	id      uint64                // numbers this manager's activations (Release.activation)
	asked   map[string]*actor.PID // managers not yet known to have let go, by PID
	holder  *actor.PID            // a manager that holds the key: requests go there meanwhile
	held    []routed              // requests for the session once it starts
	recover bool                  // a Recover came meanwhile (the session loads the work anyway)
	// recovered: the activation recovers the key's work at a start (activate's recovered), which
	// its session answers with notices under sessions.recovery: notice (NewSession).
	recovered bool
	// recoverHops is how many members forwarded that Recover here, the most of those that
	// came while the member leaves (recovers): handed on (cancelActivation), it keeps its count
	// (mayHandOn).
	recoverHops int32
	// chains numbers, by PID, the latest chain of asks of each member (ask).
	chains map[string]uint64
	// silent counts, by PID, the Releases in a row a member left unanswered (releaseTries).
	silent map[string]int
	// unreachable notes, by PID, since when a member that cannot answer is waited for because
	// the store names it as the key's holder (stillHolds).
	unreachable map[string]time.Time
	peers       []*actor.PID // the members asked first: this member's view of the others
	lookup      bool         // the key's holder in the store is still being looked up (lookUpHolder)
	// seen is the key's latest claim as the lookup found it (nil when the lookup failed, or read
	// none): the session claims the key only while that claim is still the latest
	// (Store.Claim's seen, Session.load).
	seen *persistence.ClaimSeen
	// askedBack names, by PID, the activation of another member's manager this one asked back
	// (onRelease): once per activation of the asker, or two that hold the key for neither
	// would ask each other back and forth while they wait.
	askedBack map[string]uint64
	// owner: this member's view placed the key on it when the activation began (Release.owner);
	// false when it activates a key it was handed. Fixed for the activation, so that another
	// member compares the same rank as this one (ranksFirst).
	owner bool
	// promisedTo is the member this one promised its claim of the key to through the store
	// (promise.go), while the promise may stand: its word that it holds nothing does not let
	// this activation claim the key, only the store does (it names another member, or none),
	// and this activation never holds the key for it (onRelease).
	promisedTo *actor.PID
}

// defersTo reports whether p is the member this activation's member promised the key's claim to
// (activation.promisedTo).
func (a *activation) defersTo(p *actor.PID) bool {
	return a.promisedTo != nil && p != nil && a.promisedTo.Equal(p)
}

// askAgain asks a holder of key again whether it still holds it (releaseAnswerTimeout after it
// said so).
type askAgain struct {
	key    string
	a      *activation
	holder *actor.PID
	chain  uint64 // the chain of asks it goes on with (ask)
}

// activate starts the session of key and hands it rs, once no other member holds the key; in a
// single daemon at once. recovered marks the activation that recovers the key's work at daemon
// start (NewSession), which the activation carries to its session once the others let go
// (activated; before, it was dropped there). No cluster member's activation is one today: a
// cluster's Recover follows any change of membership, a member that left cleanly too, and its
// work runs whatever sessions.recovery says (recover; TestCutShortLineSaysWhatBecomesOfTheMessages).
// A cluster member alone in its view asks the key's holder in the store all the same: it is the
// member most likely not to know yet of one that joined.
func (m *SessionManager) activate(c actor.Context, key string, recovered bool, rs ...routed) {
	if m.d.Placement == nil {
		pid := m.spawnWith(c, key, recovered, nil)
		for _, r := range rs {
			m.forward(c, pid, r)
		}
		return
	}
	peers := m.d.Placement.Peers()
	m.activations++
	a := &activation{id: m.activations, asked: make(map[string]*actor.PID, len(peers)), peers: peers, lookup: true,
		owner: m.elsewhere(key) == nil, recovered: recovered}
	for _, p := range peers {
		a.asked[p.String()] = p
	}
	// Members this one's view does not list yet that asked for the key before this activation
	// began (rememberStranger): asked once, here, and then forgotten.
	var strangers []*actor.PID
	for _, w := range m.strangersOf(key) {
		if k := w.pid.String(); a.asked[k] == nil && !w.pid.Equal(m.d.Placement.Self()) {
			a.asked[k] = w.pid
			strangers = append(strangers, w.pid)
		}
	}
	delete(m.strangers, key)
	// A member this one promised the key's claim to (promise.go): asked too, whether its view
	// lists it or not.
	var taker *actor.PID
	if a.promisedTo = m.kept.promised[key]; a.promisedTo != nil && a.asked[a.promisedTo.String()] == nil {
		taker = a.promisedTo
		a.asked[taker.String()] = taker
	}
	m.activating[key] = a
	for _, r := range rs {
		m.whileActivating(c, key, a, r)
	}
	m.lookUpHolder(c, key, a)
	for _, p := range peers {
		m.ask(c, key, a, p)
	}
	if taker != nil {
		m.ask(c, key, a, taker)
	}
	for _, p := range strangers {
		m.log.Info("a member this one does not know yet asked for the session before; asking it to let go too",
			"session", key, "member", p.Address)
		m.ask(c, key, a, p)
	}
}

// strangerFor is how long a manager remembers a member its view does not list that asked it to
// let go of a key (rememberStranger). A member's view lists one that joined from its next
// renewal (member_ttl/3) on; one still missing after this long has gone, or this member has
// stopped renewing and leaves.
const strangerFor = waiterGone

// rememberStranger notes that asker, the manager of a member this member's view does not list,
// asked to let go of key while this member held nothing of it. The asker activates the key, and
// may wait for a third member that runs it (a member leaving, or one the key moved from). If
// this member activates the key before its view lists the asker, it must ask the asker too:
// otherwise the third member's "let go" reaches both, and both claim the key (the agent ran
// twice, the first run's result fenced: TestActivationAsksAMemberThatAskedItBefore). The store
// names no holder then: the asker has not claimed the key yet. An asker this member's view
// lists is asked as a peer anyway.
func (m *SessionManager) rememberStranger(key string, asker *actor.PID, activation uint64) {
	if asker.Equal(m.d.Placement.Self()) || slices.ContainsFunc(m.d.Placement.Peers(), asker.Equal) {
		return
	}
	now := time.Now()
	if now.Sub(m.prunedStrangers) >= strangerFor {
		m.prunedStrangers = now
		for k := range m.strangers {
			m.strangersOf(k)
		}
	}
	ws := m.strangers[key]
	if i := slices.IndexFunc(ws, func(w waiter) bool { return w.pid.Equal(asker) }); i >= 0 {
		ws[i].activation, ws[i].asked = activation, now
		return
	}
	m.strangers[key] = append(ws, waiter{pid: asker, activation: activation, asked: now})
}

// strangersOf returns the members remembered for key (rememberStranger) within strangerFor,
// and forgets those older.
func (m *SessionManager) strangersOf(key string) []waiter {
	ws := slices.DeleteFunc(m.strangers[key], func(w waiter) bool { return time.Since(w.asked) >= strangerFor })
	if len(ws) == 0 {
		delete(m.strangers, key)
		return nil
	}
	m.strangers[key] = ws
	return ws
}

// lookUpHolder looks up the holder of key in the store, off the actor, and asks it to let go
// of the key too when it is a member the activation has not asked (one this member's view does
// not list yet). The activation waits for the answer, at most holderLookupTimeout.
func (m *SessionManager) lookUpHolder(c actor.Context, key string, a *activation) {
	m.holderOf(c, key, false, func(h Holder, err error) {
		if m.activating[key] != a {
			return // given up meanwhile
		}
		a.lookup = false
		holder := h.Manager
		if err == nil {
			a.seen = h.Seen
		}
		switch {
		case err != nil:
			// Limited, for all keys: in an outage every activation's lookup fails, and the line
			// of each crowded out the others (a leaving member logged 100,000 of them).
			m.holderFails.LogQuiet(m.log, slog.LevelWarn, "could not look up which member holds the session; activating without asking it", "session", key, logging.Err(err))
		case holder != nil && !holder.Equal(m.d.Placement.Self()) && a.asked[holder.String()] == nil &&
			!slices.ContainsFunc(a.peers, holder.Equal):
			m.log.Info("the session's holder is a member this one does not know yet; asking it to let go too",
				"session", key, "member", holder.Address)
			a.asked[holder.String()] = holder
			m.ask(c, key, a, holder)
		}
		if len(a.asked) == 0 {
			m.activated(c, key)
		}
	})
}

// whileActivating takes a request for a key whose session waits for the others to let go: it
// goes to the holder, if one said it holds the key, or waits for the session.
func (m *SessionManager) whileActivating(c actor.Context, key string, a *activation, r routed) {
	if _, ok := r.msg.(*Recover); ok {
		m.recovers(a, r.hops) // the session loads the work when it starts
		return
	}
	// Past maxForwardHops too: the holder runs the key's session (or starts it), so the message
	// does not travel on from there, and it must not wait here until the holder lets go.
	if a.holder != nil && m.forwardTo(c, a.holder, key, r, true) {
		return
	}
	if holdsFiledReset(a.held, r) {
		return
	}
	if i := heldAgain(a.held, r); i >= 0 {
		// The same message sent again (a router tries again every clusterAttemptTimeout while
		// the wait lasts): it takes the place of the copy held, whose sender is answered at
		// once. Before, every try was held, and a wait of an hour held hundreds of each message.
		d := a.held[i].msg.(*Deliver)
		if s := a.held[i].sender; s != nil {
			c.Send(s, &DeliverResult{SessionKey: d.SessionKey, MessageId: d.MessageId, ErrorCode: ErrCodeUnavailable,
				Error: "the message was sent again while its session waited to start; the later send is answered"})
		}
		a.held[i] = r
		return
	}
	a.held = append(a.held, r)
}

// heldAgain returns the index in held of a Deliver of r's message (r a Deliver with a message
// id): its id in the same chat of the same platform, as the store tells duplicates apart; or -1.
func heldAgain(held []routed, r routed) int {
	d, ok := r.msg.(*Deliver)
	if !ok || d.MessageId == "" {
		return -1
	}
	return slices.IndexFunc(held, func(h routed) bool {
		hd, ok := h.msg.(*Deliver)
		return ok && hd.MessageId == d.MessageId && hd.SessionKey == d.SessionKey &&
			hd.Source.GetPlatform() == d.Source.GetPlatform() && hd.Source.GetChatId() == d.Source.GetChatId()
	})
}

// holdsFiledReset reports whether held, the requests held for a key, holds a ResetDue that hands
// a filed reset on (SessionManager.handOnFiledReset) when r is one too: r then takes its place,
// unless the one held is newer (overdue.supersedes), and is not held beside it. The member that
// handed it on sends it again each time it goes unanswered for resetHandOnTimeout, and a key
// that waits (for a member it cannot reach, or out a pause after refused writes) answers
// nothing: before, every copy was held, one more each minute of the wait. The copy replaced
// gets no answer: its sender gave it up (it sent this one), or, another member, sends it again.
// (What a stopping session hands back goes through handBackFiledReset, which keeps the order.)
func holdsFiledReset(held []routed, r routed) bool {
	o := filedResetIn(r.msg)
	if o == nil {
		return false
	}
	for i, h := range held {
		if had := filedResetIn(h.msg); had != nil {
			if o.supersedes(had) {
				held[i] = r
			}
			return true
		}
	}
	return false
}

// handBackFiledReset places r, a request the stopping session of a key handed back, when it hands
// a filed reset on and held, the requests held for the key, holds one too (holdsFiledReset); i
// is the place of r, after those handed back before it (SessionManager.handed). It returns the
// list, the count of those handed back in it, and whether it did. A copy held among those handed
// back before r reached the session before r: it keeps its place, and r takes it unless the
// copy is newer (overdue.supersedes). A copy held after them came to the manager after the
// session asked to stop, and was sent after r (again, when r went unanswered): the one kept,
// that copy unless r is newer, goes to r's place. The reset then comes before what reached the
// session after r, as it did when every copy was held. Before, r took the place of the copy held
// after what came before it, and what the session handed back after r went in front of it, the
// count of those handed back not moved on: a message of the chat ran first, the session was
// active since, and the reset ended nothing (TestFiledResetHandedBackKeepsItsPlace); and the
// answer went to r's sender, which had given r up, not to the later copy's, which waited.
func handBackFiledReset(held []routed, i int, r routed) ([]routed, int, bool) {
	o := filedResetIn(r.msg)
	if o == nil {
		return held, i, false
	}
	j := slices.IndexFunc(held, func(h routed) bool { return filedResetIn(h.msg) != nil })
	if j < 0 {
		return held, i, false
	}
	had := filedResetIn(held[j].msg)
	if j < i {
		if o.supersedes(had) {
			held[j] = r
		}
		return held, i, true
	}
	kept := held[j]
	if o.supersedes(had) && !had.supersedes(o) {
		kept = r
	}
	held = slices.Insert(slices.Delete(held, j, j+1), i, kept)
	return held, i + 1, true
}

// filedResetIn is the filed reset msg hands on, if it is a ResetDue that carries one.
func filedResetIn(msg any) *overdue {
	if m, ok := msg.(*ResetDue); ok {
		return filedResetOf(m)
	}
	return nil
}

// recovers notes a Recover for the activation's key, forwarded here by hops members. Its hops
// count only while the member leaves: a leaving member that gives the activation up hands the
// Recover on with them, so that members leaving together cannot pass it back and forth. One
// that came before the member began to leave goes on as new, as it would have been handed on
// had the member been leaving when it came; with its hops, it could reach a successor that may
// not hand it on and is stopping, and be dropped (found by a review).
func (m *SessionManager) recovers(a *activation, hops int32) {
	a.recover = true
	if m.kept.successor != nil {
		a.recoverHops = max(a.recoverHops, hops)
	}
}

// ask begins the activation's chain of asks of the manager p whether it holds key
// (askRelease): it asks again while p holds the key or cannot answer, until p lets go. Only the
// latest chain of asks of a member goes on: a member that let go and then asked this one to let
// go (which asked it back: onRelease) while the old chain's next ask was pending (askAgain, a
// lookup, an answer) was asked by both chains, twice as often, for as long as the activation
// waited (TestMemberAskedBackIsAskedByOneChain).
func (m *SessionManager) ask(c actor.Context, key string, a *activation, p *actor.PID) {
	if a.chains == nil {
		a.chains = map[string]uint64{}
	}
	a.chains[p.String()]++
	m.askRelease(c, key, a, p, a.chains[p.String()])
}

// askRelease asks the manager p whether it holds key, in the chain of asks chain (ask). Its
// answer, or the dead letter or timeout a member that cannot answer leaves, comes back to the
// activation; an answer takes effect in any chain, but only the latest chain asks again.
func (m *SessionManager) askRelease(c actor.Context, key string, a *activation, p *actor.PID, chain uint64) {
	me := m.d.Placement.Self()
	f := c.RequestFuture(p, &Release{Key: key, Address: me.Address, Id: me.Id, Activation: a.id, Owner: proto.Bool(a.owner)},
		releaseAnswerTimeout)
	c.ReenterAfter(f, func(res any, err error) {
		if m.activating[key] != a {
			return // started or given up meanwhile
		}
		r, ok := res.(*Released)
		if err == nil && !ok {
			err = fmt.Errorf("unexpected answer %T", res)
		}
		latest := a.chains[p.String()] == chain
		if err != nil && !latest {
			return // the latest chain asks p itself
		}
		switch {
		case err == nil && !r.Holding && a.defersTo(p):
			// The member this one promised the key's claim to holds nothing of it, or this
			// activation ranks first: either way it may claim the key on the promise, and it
			// cannot be told that this one claims it (it may not reach this member). So only
			// the store lets this activation go on (stillHolds): the key's claim promised back,
			// taken by another member since, or that member gone.
			delete(a.silent, p.String())
			if latest {
				m.stillHolds(c, key, a, p, errPromisedAway, chain)
			}
			return
		case err == nil:
			delete(a.silent, p.String())
			if since, waited := a.unreachable[p.String()]; waited {
				delete(a.unreachable, p.String())
				m.log.Info("a member this one could not reach answers again", "session", key, "member", p.Address,
					"holding", r.Holding, "waited", time.Since(since))
			}
		case errors.Is(err, actor.ErrDeadLetter):
			// Its manager is gone (the member stopped), or this member cannot reach it.
			m.stillHolds(c, key, a, p, err, chain)
			return
		default:
			if a.silent == nil {
				a.silent = map[string]int{}
			}
			if a.silent[p.String()]++; a.silent[p.String()] < releaseTries {
				m.log.Debug("a member did not answer whether it still runs the session; asking again",
					"session", key, "member", p.Address, logging.Err(err))
				m.askRelease(c, key, a, p, chain)
				return
			}
			m.stillHolds(c, key, a, p, err, chain)
			return
		}
		m.onReleased(c, r)
		if r.Holding && latest {
			// Every member that holds the key is asked again, not only the one the requests go
			// to: one that dies holding it while another is the holder would be waited for
			// for ever once the other lets go.
			m.timers.SendOnce(releaseAnswerTimeout, c.Self(), &askAgain{key: key, a: a, holder: p, chain: chain})
		}
	})
}

// stillHolds takes the member p that cannot answer whether it holds key (its Release came back
// as a dead letter, cause, or went unanswered releaseTries times): it asks the store whether p
// is the key's holder (a live registration, and the key's latest claim). One that is still may
// be running the key's turn where this member cannot reach it: the activation waits for it,
// and asks it again (at once after a silence, which took releaseAnswerTimeout; after
// releaseAnswerTimeout after a dead letter or any other answer that comes at once: asked again
// at once, a member that answers amiss was asked dozens of times an instant). So it does when
// the store cannot say. While it waits, the key's requests wait here, not for the member: sent
// to it, they would come back as dead letters for as long as it cannot be reached. One that is
// not the holder holds nothing of the key: the member stopped, or died and its registration
// expired; the activation goes on without it. When the store names another member that this
// activation has not asked (it claimed the key meanwhile: a member whose view did not list
// this one asked the unreachable member, which let go to it), that member is asked too: taken
// for no holder, its running turn was fenced and its message ran again here.
func (m *SessionManager) stillHolds(c actor.Context, key string, a *activation, p *actor.PID, cause error, chain uint64) {
	_, again := a.unreachable[p.String()] // a wait that goes on: its lookup may wait for room (holderOf)
	m.holderOf(c, key, again, func(h Holder, err error) {
		holder, k := h.Manager, p.String()
		if _, ok := a.asked[k]; m.activating[key] != a || !ok || a.chains[k] != chain {
			return // started, given up or let go meanwhile, or asked anew (ask)
		}
		if err == nil && h.Seen != nil {
			// The claim read now is the condition of the session's claim: its member is p, which
			// the activation waits for, or it is asked below (or gone, or this member). The claim
			// the first lookup read is older when another member claimed the key since (the store
			// names it here), and a claim on it would be refused once that member let go
			// (TestHolderTheStoreNamesWhileWaitingIsClaimedAfter). When the first lookup failed (or took too
			// long), this read is the activation's first condition: no condition let a third member,
			// which took an unreachable asker to hold nothing on this read, claim the key beside that
			// asker once the holder promised it the claim (TestPromiseToAMemberBesideAThirdWhoseLookupFailed).
			a.seen = h.Seen
		}
		deadLetter := errors.Is(cause, actor.ErrDeadLetter)
		// While this member's promise of the key's claim to p is being written, the store's
		// answer is not settled: it may name p a moment later (promise.go).
		settled := !a.defersTo(p) || m.kept.promising[key] == 0
		if err == nil && !p.Equal(holder) && settled {
			promisedTo := a.defersTo(p)
			if promisedTo {
				// The claim this member promised it is another's now, or that member is gone.
				a.promisedTo = nil
				m.forgetPromise(key, p)
			}
			if holder != nil && holder.Equal(m.d.Placement.Self()) && h.Seen != nil {
				// p promised this member its claim (promise.go): the session claims on the
				// promised claim. A promise hands over only p's own claim, while it is the key's
				// latest and p holds nothing of the key, so no claim of another came between; a
				// third member that looked up p's claim is refused (TestPromiseToAMemberCutOff…).
				// On the claim it looked up first, the session's claim was refused (the owner
				// changed), and the key activated again, asking p anew (a silent p: 10 s more).
				a.seen = h.Seen
			}
			switch since, waited := a.unreachable[k]; {
			case promisedTo:
				m.log.Info("the member this one promised the session's claim to no longer holds it in the database (it promised it back, another member claimed it, or it is gone); this member takes the key over",
					"session", key, "member", p.Address, "holder", holderAddress(holder))
			case waited:
				m.log.Info("a member this one could not reach no longer holds the session; this member takes the key over",
					"session", key, "member", p.Address, "waited", time.Since(since))
			case deadLetter:
				// Its manager is gone: the member stopped (a graceful restart ends so, after its
				// sessions handed their keys on), and holds no session any more.
				m.log.Debug("a member's session manager has stopped; this member takes the key over",
					"session", key, "member", p.Address)
			default:
				m.log.Warn("a member did not say whether it still runs the session; this member takes the key over",
					"session", key, "member", p.Address, logging.Err(cause))
			}
			delete(a.unreachable, k)
			if q := holder; q != nil && !q.Equal(m.d.Placement.Self()) && a.asked[q.String()] == nil {
				m.log.Info("the session's holder is a member this activation has not asked; asking it to let go too",
					"session", key, "member", q.Address)
				a.asked[q.String()] = q
				m.ask(c, key, a, q)
			}
			m.onReleased(c, &Released{Key: key, Address: p.Address, Id: p.Id, Activation: a.id})
			return
		}
		if a.holder != nil && a.holder.Equal(p) {
			a.holder = nil // (set again when it answers that it holds the key)
		}
		if a.unreachable == nil {
			a.unreachable = map[string]time.Time{}
		}
		since, waited := a.unreachable[k]
		if !waited {
			since = time.Now()
			a.unreachable[k] = since
		}
		// Limited, for each member: a member cut off holds many keys, and each of their
		// activations tries again at every ask, so a wait that lasts is logged again, once a
		// minute; each member that cannot be reached is named (one limiter for all let one
		// member's keys crowd another's out).
		if err == nil {
			err = cause
		}
		// Limited for each member (k), its lines apart from those of the others.
		if errors.Is(cause, errPromisedAway) {
			m.unreachableHolders.LogQuiet(m.log, slog.LevelInfo, "this member promised the session's claim to another member, which may claim it; the session waits until that member promises it back through the database, claims it, or its registration is gone", k, "session", key, "member", p.Address, "waiting", time.Since(since))
		} else {
			m.unreachableHolders.LogQuiet(m.log, slog.LevelWarn, "a member that may still run the session cannot be reached; the session waits until it answers or its registration in the database is gone", k, "session", key, "member", p.Address, "waiting", time.Since(since),
				logging.Err(err))
		}
		if !errors.Is(cause, actor.ErrTimeout) {
			m.timers.SendOnce(releaseAnswerTimeout, c.Self(), &askAgain{key: key, a: a, holder: p, chain: chain})
			return
		}
		m.askRelease(c, key, a, p, chain)
	})
}

// onAskAgain asks a holder again, while the activation still waits for it: a holder that has
// died since it answered is then waited for no longer.
func (m *SessionManager) onAskAgain(c actor.Context, t *askAgain) {
	if m.activating[t.key] != t.a {
		return
	}
	if _, ok := t.a.asked[t.holder.String()]; ok && t.a.chains[t.holder.String()] == t.chain {
		m.askRelease(c, t.key, t.a, t.holder, t.chain)
	}
}

// onReleased takes another member's answer to Release: at once (holding or not), or later,
// once it let go of the key.
func (m *SessionManager) onReleased(c actor.Context, r *Released) {
	a := m.activating[r.Key]
	if a == nil || r.Activation != a.id {
		return // an answer to an earlier activation of the key
	}
	p := actor.NewPID(r.Address, r.Id)
	k := p.String()
	if _, ok := a.asked[k]; !ok {
		return
	}
	if !r.Holding && a.defersTo(p) {
		// Only the store says it let go (askRelease); its chain of asks goes on. The key's
		// requests stay here meanwhile: sent to it, they came back, and one it had handed
		// here as it let go went to it again and waited there (TestPromiserDefersToTheMemberItPromised).
		if a.holder != nil && a.holder.Equal(p) {
			a.holder = nil
		}
		return
	}
	if r.Holding {
		if a.holder == nil {
			m.log.Info("another member still holds the session; its requests go there until it lets go",
				"session", r.Key, "member", r.Address)
			a.holder = p
			held := a.held
			a.held = nil
			for _, h := range held {
				m.whileActivating(c, r.Key, a, h)
			}
		}
		return
	}
	delete(a.asked, k)
	if a.holder != nil && a.holder.Equal(p) {
		a.holder = nil
	}
	if len(a.asked) == 0 && !a.lookup {
		m.activated(c, r.Key)
	}
}

// activated starts the session of a key the other members let go of. When this member began
// to leave meanwhile, what waited for it goes to the key's successor instead
// (cancelActivation), and the session starts here only for what was forwarded often enough
// already. A member that does not leave starts it even if its view places the key elsewhere:
// the activation may be for what a leaving member handed it, while its view is older than the
// leaving member's; handing that back started a loop that ended only at its next renewal
// (TestClusterLeavingMemberHandsOnBeforeTheOthersRenew). If the key is another member's, that
// member's activation asks this one to let go of it.
func (m *SessionManager) activated(c actor.Context, key string) {
	if m.kept.successor != nil && m.elsewhere(key) != nil {
		if m.cancelActivation(c, key); m.activating[key] == nil {
			return
		}
	}
	a := m.activating[key]
	delete(m.activating, key)
	if a.promisedTo != nil {
		m.forgetPromise(key, a.promisedTo) // this session's claim takes the key back
	}
	pid := m.spawnWith(c, key, a.recovered, a.seen)
	for _, r := range a.held {
		m.forward(c, pid, r)
	}
}

// cancelActivation gives up the activation of a key that moved to another member meanwhile: what
// waited for it goes to the key's owner. The members waiting for this one to let go of the key
// are told first: the owner may be one of them, and while it waits for this member it would
// forward what it is handed back here.
func (m *SessionManager) cancelActivation(c actor.Context, key string) {
	a := m.activating[key]
	var local, away []routed
	for _, r := range a.held {
		switch {
		case m.mayHandOn(r) && crossesMembers(r.msg):
			away = append(away, r)
		case m.bouncedBack(c, key, r):
			answerStopped(c, []routed{r}) // forwarded as often as it may be, to a member that leaves
		default:
			local = append(local, r) // forwarded here on purpose: it runs here, once the others let go
		}
	}
	a.held = local
	// A Recover goes on with its count of hops, and one forwarded here often enough already
	// stays, as a message does (it runs here), unless this member leaves and knows a successor
	// (bouncedBack: it is dropped). Handed on as new, it came back from a member
	// that leaves too (both leaving in a database outage, each the other's successor in its
	// last view) and began an activation here again, in a loop as fast as the store refused
	// the lookup of the key's holder, for the whole drain
	// (TestLeavingMembersInAnOutageDoNotPassARecoverBackAndForth).
	recovery := routed{msg: &Recover{}, hops: a.recoverHops}
	onward := a.recover && m.mayHandOn(recovery)
	if a.recover && !onward && m.bouncedBack(c, key, recovery) {
		// Nor does it start the key on a member that leaves and knows a successor: the work
		// waits in the store for a member that stays (bouncedBack).
		a.recover = false
		m.leaveBouncedRecover(key)
	}
	if len(local) == 0 && (!a.recover || onward) {
		delete(m.activating, key)
		defer m.answerDrains(c) // a leaving member's drain waits for activations (starting)
		m.letGo(c, key)
		// The reset filed for the key goes on too, after letGo and ahead of what was held, as
		// with a session's hand-on (startSuccessor). Before, it stayed here: the key's next owner
		// found the session's activity past the due time, and the session went on until its next
		// reset (TestFiledResetOfAnActivationGivenUpGoesOnWithTheKey).
		m.handOnFiledReset(c, m.elsewhere(key), key)
	}
	for _, r := range away {
		m.handOn(c, key, r) // it takes them: the key is elsewhere's, and they may cross members
	}
	if onward {
		a.recover = false
		m.handOn(c, key, recovery)
	}
}

// onRelease answers another member's manager that is about to activate key: whether this one
// holds the key, and later, if it did, that it let go of it (letGo). A session whose key this
// member no longer owns is told so (moved). Two members that each activate the key (their views
// of the membership differ for a moment, or one was handed the key) would each wait for the
// other, or each claim it: the activation that ranks first holds it (ranksFirst).
func (m *SessionManager) onRelease(c actor.Context, r *Release) {
	if m.d.Placement == nil {
		return
	}
	asker := actor.NewPID(r.Address, r.Id)
	me := m.d.Placement.Self()
	_, stopping := m.stopping[r.Key]
	a := m.activating[r.Key]
	holds := m.sessions[r.Key] != nil || stopping || a != nil && !a.defersTo(asker) && a.ranksFirst(me, asker, r)
	c.Respond(&Released{Key: r.Key, Address: me.Address, Id: me.Id, Holding: holds, Activation: r.Activation})
	if !holds {
		k := asker.String()
		if a == nil {
			m.rememberStranger(r.Key, asker, r.Activation)
			return
		}
		if a.asked[k] == nil && a.askedBack[k] != r.Activation && !asker.Equal(me) {
			// The asker activates the key too, and this activation is not waiting for it (it
			// is no peer, or it let go before it began): it may claim the key first, and this
			// claim would fence its session. So it is asked too; it holds the key when it got
			// there first, or ranks first. Once for each of its activations: its answer, that
			// it does not hold the key, comes back before its next Release, and two
			// activations that hold it for neither (each asked the other back: a member of an
			// earlier version, which ranks by PID alone) would ask each other again for as
			// long as they wait (TestActivationsAskEachOtherBackOnce).
			if a.askedBack == nil {
				a.askedBack = map[string]uint64{}
			}
			a.askedBack[k] = r.Activation
			a.asked[k] = asker
			m.ask(c, r.Key, a, asker)
		}
		return
	}
	ws := m.waiters[r.Key]
	if i := slices.IndexFunc(ws, func(w waiter) bool { return w.pid.Equal(asker) }); i >= 0 {
		ws[i].activation = r.Activation // the asker's latest activation of the key
		ws[i].asked = time.Now()
	} else {
		m.waiters[r.Key] = append(ws, waiter{pid: asker, activation: r.Activation, asked: time.Now()})
	}
	if pid := m.sessions[r.Key]; pid != nil && m.elsewhere(r.Key) != nil {
		c.Send(pid, &moved{})
	}
}

// ranksFirst reports whether activation a, of this member's manager me, holds its key for the
// activation of asker that asks this one to let go of it (r). The activation whose member's view
// placed the key on that member ranks first (the other was handed the key, which its view
// places elsewhere); between two alike, the one whose manager's PID sorts first. Both members
// compare the same ranks, each fixed when its activation began, so exactly one of the two holds
// the key for the other: with the PID alone, two activations of which the one handed the key
// sorted first held it for neither, and both claimed it (TestConcurrentActivationsClaimTheKeyOnce).
// A member of an earlier version says nothing of its view (r.Owner unset) and holds the key when
// its own view places the key on it and its PID sorts first; this one then holds it only in the
// opposite case, so that they never both hold it (each would forward the key's messages to the
// other).
func (a *activation) ranksFirst(me, asker *actor.PID, r *Release) bool {
	first := me.String() < asker.String()
	if r.Owner == nil {
		return a.owner && first
	}
	if a.owner != *r.Owner {
		return a.owner
	}
	return first
}

// letGo tells the managers waiting for key (onRelease) that this member let go of it, once it
// holds it no longer.
func (m *SessionManager) letGo(c actor.Context, key string) {
	ws := m.waiters[key]
	if len(ws) == 0 {
		return
	}
	if _, stopping := m.stopping[key]; stopping || m.sessions[key] != nil || m.activating[key] != nil {
		return
	}
	delete(m.waiters, key)
	me := m.d.Placement.Self()
	for _, w := range ws {
		c.Send(w.pid, &Released{Key: key, Address: me.Address, Id: me.Id, Activation: w.activation})
	}
}

// elsewhere is the manager of the member that takes key over, when that is not this one: the
// key's successor while this member leaves (Leave), else the key's owner in this member's view
// of the cluster. nil when the key is this member's.
func (m *SessionManager) elsewhere(key string) *actor.PID {
	if m.kept.successor != nil {
		return m.kept.successor(key)
	}
	if p := m.d.Placement; p != nil {
		if owner := p.Owner(key); owner != nil && !owner.Equal(p.Self()) {
			return owner
		}
	}
	return nil
}

// waiter is another member's manager waiting for this one to let go of a key.
type waiter struct {
	pid        *actor.PID
	activation uint64    // its activation of the key (Release.activation)
	asked      time.Time // when it last asked (Release); a live waiter asks again every releaseAnswerTimeout
}

// waiterGone is how long after its last Release a waiter is taken to have died or given up its
// activation: one that waits asks again releaseAnswerTimeout after each answer, and again at
// once when an ask goes unanswered.
const waiterGone = 3 * releaseAnswerTimeout

// takingOver is the manager of the member that asked for key (Release) and still waits for it,
// the first one if several do; nil when none does (startSuccessor).
func (m *SessionManager) takingOver(key string) *actor.PID {
	for _, w := range m.waiters[key] {
		if time.Since(w.asked) < waiterGone {
			return w.pid
		}
	}
	return nil
}
