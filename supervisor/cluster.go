package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentgate/agentgate/actors"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence/postgres"
	"github.com/agentgate/agentgate/platforms"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
	"google.golang.org/protobuf/types/known/emptypb"
)

// Cluster mode (DESIGN §6, docs/ARCHITECTURE.md). Each member runs the whole daemon: platforms,
// intake, a SessionManager and a persistence actor on the shared PostgreSQL store. Intake routes
// every message through the cluster to the grain of its key (actors.SessionGrain) on the member
// that owns the key, whose manager runs the session. Sessions claim their keys and fence their
// writes (Options.SharedStore), so the brief dual activation of a membership change never
// interleaves writes.

// gossipExpiry is how long protoactor's gossip waits for a silent member before it blocks it:
// its default, 20 s, or twice member_ttl when that is longer. The store must drop a dead member
// first (all members see it gone within 5/3 of member_ttl): a member that gossip blocks while
// the store lists it alive is taken for the other side of a split (storeMembership.split), and
// every member younger than a dead one would stop.
func gossipExpiry(ttl time.Duration) time.Duration { return max(20*time.Second, 2*ttl) }

// clusterRequestTimeout bounds one cluster request when the caller gives no deadline.
const clusterRequestTimeout = 30 * time.Second

// startCluster makes the daemon a member of its cluster and routes sessions through it. It
// runs once the session manager is spawned and before intake starts.
func (d *Daemon) startCluster(stop <-chan struct{}) (err error) {
	cc := d.cfg.Cluster
	host, portText, err := net.SplitHostPort(cc.Bind)
	if err != nil {
		return fmt.Errorf("cluster.bind: %w", err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return fmt.Errorf("cluster.bind: port %q: %w", portText, err)
	}
	ropts, err := clusterTLS(cc.TLS)
	if err != nil {
		return err
	}
	if cc.Advertise != "" {
		if err := checkAdvertise(cc.Bind, cc.Advertise); err != nil {
			return err
		}
		ropts = append(ropts, remote.WithAdvertisedHost(cc.Advertise))
	}
	d.peers = newPeers()
	ropts = append(ropts, func(c *remote.Config) {
		c.ServerOptions = append(c.ServerOptions, grpc.StatsHandler(d.peers), recoverStreams(d.log.With("component", "cluster"), &d.unreadable))
	})
	if d.members == nil {
		return errors.New("cluster: the store keeps no cluster membership (store.driver must be postgres)")
	}
	provider := newStoreMembership(d.members, cc.Name, d.deps.Node, d.addr.String(), cc.MemberTTL, d.log.With("component", "cluster"), d.membershipLost)
	provider.notes = d.cfg.DataDir
	provider.join = stop
	d.membership = provider
	kind := actors.NewSessionKind(func() *actor.PID { return d.manager })
	cfg := cluster.Configure(cc.Name, provider, disthash.New(), remote.Configure(host, port, ropts...),
		cluster.WithKinds(kind), cluster.WithRequestTimeout(clusterRequestTimeout),
		cluster.WithHeartbeatExpiration(gossipExpiry(cc.MemberTTL)))
	d.cluster = cluster.New(d.system, cfg)
	defer func() {
		// protoactor panics when it cannot listen or register; that is a start error here.
		if p := recover(); p != nil {
			if perr, ok := p.(error); ok { // the provider's, which a stop's cut wraps (Start)
				err = fmt.Errorf("cluster: join %s as %s: %w", cc.Name, cc.Bind, perr)
			} else {
				err = fmt.Errorf("cluster: join %s as %s: %v", cc.Name, cc.Bind, p)
			}
			d.abandonJoin()
		}
	}()
	// The router is the cluster's before the first change of membership, whose recovery uses it.
	d.router = actors.NewClusterRouter(d.cluster, d.log.With("component", "cluster"))
	var crowdWarned atomic.Bool // the line of crowdedAddresses, once per process
	d.topology = d.system.EventStream.Subscribe(func(ev any) {
		if t, ok := ev.(*cluster.ClusterTopology); ok {
			d.metrics.ClusterMembers.Set(float64(len(t.Members)))
			if crowded := crowdedAddresses(d.system.Address(), t.Members); crowded != nil && crowdWarned.CompareAndSwap(false, true) {
				d.log.Warn("cluster members' addresses differ only in their last character; the cluster places their sessions unevenly (of three, half on one): give each member its own host address",
					"addresses", crowded)
			}
			go func() {
				keys := d.recoverOwned(t.Members)
				d.log.Info("cluster membership changed", "members", len(t.Members), "joined", addresses(t.Joined),
					"left", addresses(t.Left), "recovering", d.takenOver(t, keys))
			}()
		}
	})
	d.cluster.StartMember()
	go d.sweepRecoverable(cc.MemberTTL)
	d.log.Info("joined the cluster", "cluster", cc.Name, "node", d.deps.Node, "address", d.system.Address(), "http", d.addr.String())
	return nil
}

// recoverOwned activates the sessions with unfinished work in the store (unanswered messages,
// unconfirmed replies) whose keys this member owns among members, and returns the keys it
// asked. An active session is told, and starts again if its claim is stale (actors.Recover).
func (d *Daemon) recoverOwned(members []*cluster.Member) []string {
	ctx, cancel := context.WithTimeout(d.ctx, time.Minute)
	defer cancel()
	keys, err := d.store.Recoverable(ctx)
	if err != nil {
		if d.ctx.Err() == nil {
			d.log.Warn("list the sessions with unfinished work; the next sweep or change of membership tries again", logging.Err(err))
		}
		return nil
	}
	owner := ownerOf(members)
	me := d.system.Address()
	var asked []string
	for _, key := range keys {
		if owner(key) == me {
			d.router.Tell(key, &actors.Recover{})
			asked = append(asked, key)
		}
	}
	return asked
}

// takenOver counts the keys (of those recoverOwned asked) that came to this member with the
// change of membership t: another member owned them among the members before it (one that
// left), or none did (this member's first topology). The rest were this member's already. A
// log line that counted them all said a member that left, or one that joined, handed over
// every chat with unfinished work (TestClusterLogCountsTheKeysTakenOver).
func (d *Daemon) takenOver(t *cluster.ClusterTopology, keys []string) int {
	joined := func(m *cluster.Member) bool {
		return slices.ContainsFunc(t.Joined, func(j *cluster.Member) bool { return j.Id == m.Id })
	}
	owner := ownerOf(append(slices.DeleteFunc(slices.Clone(t.Members), joined), t.Left...))
	me := d.system.Address()
	n := 0
	for _, key := range keys {
		if owner(key) != me {
			n++
		}
	}
	return n
}

// sweepRecoverable runs recoverOwned every interval until the daemon stops. A change of
// membership recovers the keys that moved, but not work stored after it: a reply a member
// recorded and could no longer send (its session was stopped while the reply's write was in
// flight) would wait for the chat's next message, and so would the notice of a `sessions
// reset` run beside the members. The sweep finds such work within an interval. Its first pass
// is at once, as the member has joined: the first change of membership comes while it joins,
// and its Recovers may find no member to take them then (the cluster router's "no member took
// the session"), which left a restarted member's pending messages for the sweep a member_ttl
// later (a CI run of TestClusterPoisonMessageStopsTheCrashLoop). A Recover twice is harmless.
func (d *Daemon) sweepRecoverable(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for first := true; ; first = false {
		if !first {
			select {
			case <-d.ctx.Done():
				return
			case <-t.C:
			}
		}
		if keys := d.recoverOwned(d.cluster.MemberList.Members().Members()); len(keys) > 0 {
			d.log.Debug("recovery sweep", "recovering", len(keys))
		}
	}
}

// leave begins the member's leaving of the cluster, at the start of a stop and before the
// drain. Its registration says it is leaving (storeMembership.leave), but it stays a member:
// the others route its keys to it and recover none of them until it withdraws, after its drain,
// so a key whose turn it is still finishing is never activated on another member (the agent
// would run twice at once). Its manager forwards what it no longer runs to each key's
// successor (actors.Leave), so the drain is not fed: it runs no new turn, and a session with no
// turn running hands its key on at once. Without another member to take its keys, it runs them
// itself to the end, as a single daemon does.
func (d *Daemon) leave() {
	if d.membership == nil {
		return
	}
	ctx, cancel := context.WithTimeout(d.ctx, d.cfg.Cluster.MemberTTL)
	err := d.membership.leave(ctx)
	cancel()
	if err != nil {
		d.log.Warn("say in the cluster's membership that this member leaves", logging.Err(err))
	}
	if len(d.membership.successors()) == 0 {
		return
	}
	d.system.Root.Send(d.manager, &actors.Leave{Successor: d.successorOf})
}

// successorOf is the SessionManager of the member that takes key over from this leaving one:
// its owner among the live members that do not leave. nil when there is none.
func (d *Daemon) successorOf(key string) *actor.PID {
	return d.managerAmong(d.membership.successors(), key)
}

// managerAmong is the SessionManager of the member that owns key among members; nil when no
// member hosts sessions.
func (d *Daemon) managerAmong(members []*cluster.Member, key string) *actor.PID {
	owner := ownerOf(members)(key)
	if owner == "" {
		return nil
	}
	return actor.NewPID(owner, d.manager.Id)
}

// withdraw takes the member out of the cluster's membership, once its drain has ended and its
// sessions have stopped (no turn of it runs any more) and its platforms have sent (and
// confirmed) the replies handed to them: the others see it gone at their next renewal, route
// its keys to themselves and recover their unfinished work, which no longer includes a reply
// this member was still sending. A request that reaches it meanwhile meets a dead letter, and
// its router tries again.
func (d *Daemon) withdraw() {
	if d.membership == nil {
		return
	}
	if err := d.membership.Shutdown(true); err != nil {
		d.log.Warn("leave the cluster's membership", logging.Err(err))
	}
}

// abandonJoin takes down what protoactor's StartMember started when the join failed or a stop
// cut it (the registration in the members table: storeMembership.StartMember), in the order of
// leaveCluster: the placement actor, the gossip's loop and actor, then the remote's endpoint
// actors and its listener. Start's failure shuts the actor system down after. The member never
// registered (or left at once), so there is no membership to leave and no other member to wait
// for. StartMember panics where it fails: a remote that could not listen started nothing (the
// identity lookup is set up only once it listens), and its Shutdown would fail on what it never
// made. Before, a failed join left them all running: serve exits right after, but an
// in-process caller (a test, an embedder) kept the cluster port bound and protoactor's
// goroutines for the life of the process (TestClusterJoinThatEndsLeavesNothingRunning).
func (d *Daemon) abandonJoin() {
	c := d.cluster
	d.cluster = nil // nothing of it runs: no stop leaves it
	d.system.EventStream.Unsubscribe(d.topology)
	if c.IdentityLookup == nil {
		return
	}
	c.IdentityLookup.Shutdown()
	c.Gossip.Shutdown()
	d.endpoints.shutdown(c.Remote, d.log)
}

// leaveCluster leaves protoactor's cluster and stops the actor system. It runs after the
// daemon's own actors have stopped and the member has withdrawn from the membership.
//
// It takes the steps of protoactor's graceful cluster.Shutdown, in its order, but for the
// fixed 2 s sleep that Shutdown takes after stopping the placement actor ("to wait ownership
// transferring complete"), which ended every stop of a member. No ownership is transferred
// there: the placement actor (disthash) stops its grains, which are shells; agentgate hands
// its keys on itself (actors.Leave), and everything the stop must finish (the drain, the
// replies and their delivery marks, the persistence actor's last flush, the withdrawal) is
// done by then. What the sleep did give is time for the other members to drop this one: until
// their next renewal they still route its keys to it, and while its cluster port is open such
// a request meets a dead letter at once and is looked up again (ClusterRouter); once the port
// is closed it waits out protoactor's 5 s activation timeout and reconnection attempts, logged
// as errors on the member that stays. So the port stays open until the other members have
// dropped this one (each closes its connection to it then: peers.dropped), and no longer: a
// member with no other member leaves at once (TestClusterLoneMemberStopsAtOnce,
// TestClusterLeavingMemberWaitsForTheOthersToDropIt). It waits at most dropWithin.
func (d *Daemon) leaveCluster(ctx context.Context) {
	if d.cluster == nil {
		return
	}
	d.system.EventStream.Unsubscribe(d.topology)
	c := d.cluster
	c.Gossip.SetState(cluster.GracefullyLeftKey, &emptypb.Empty{})
	d.system.Shutdown()
	// protoactor's Shutdown would now shut the membership provider down: Stop has withdrawn.
	c.IdentityLookup.Shutdown()
	if len(d.membership.successors()) > 0 {
		d.awaitDropped(ctx)
	}
	c.Gossip.Shutdown()
	d.endpoints.shutdown(c.Remote, d.log)
}

// awaitDropped waits until no other member holds a connection to this one, for at most
// dropWithin, or until no other member stays. Only members that stay route to this one; when
// all the others leave too (a whole cluster stopped at once) their connections last until they
// close their own ports, and waiting for them would only make each wait out dropWithin. The
// view this member began its stop with may not know that yet (members told to stop at one
// moment renewed as leaving after it read them): the store says, read at once and then every
// renewRetry.
func (d *Daemon) awaitDropped(ctx context.Context) {
	bound := time.NewTimer(dropWithin(d.cfg.Cluster.MemberTTL))
	defer bound.Stop()
	read := time.NewTimer(0) // at once, then every renewRetry
	defer read.Stop()
	for {
		select {
		case <-d.peers.dropped():
			return
		case <-bound.C:
			d.log.Debug("leaving the cluster while other members still hold a connection to this one")
			return
		case <-ctx.Done():
			return
		case <-read.C:
			rctx, cancel := context.WithTimeout(ctx, renewRetry)
			stay, err := d.membership.othersStay(rctx)
			cancel()
			if err == nil && !stay {
				return
			}
			read.Reset(renewRetry)
		}
	}
}

// shutdownRemote shuts protoactor's remote down gracefully. Its endpoint manager can panic
// there with "send on closed channel": it signals each endpoint reader's channel, which a
// reader whose peer has just disconnected closes before it is removed from the manager's map,
// and a leaving member shuts down right when the others drop it (leaveCluster), so that is
// the moment it meets. Such a panic is recovered and the server stopped at once: the peers the
// graceful stop would have told have disconnected already. A member calls it through its
// endpoint guard (endpointGuard.shutdown), which keeps the stop's other race from panicking.
//
// The graceful stop waits for every endpoint writer, and a writer that cannot connect retries
// in its start, five times 2 s apart, deaf to the stop meanwhile. A leaving member's gossip
// dials each member of its topology until the gossip stops, so a member that closed its port a
// moment before (every member of a cluster stopped at once) held the others' stops for 10 s.
// The stop waits at most remoteStopWithin, then stops the server at once; the graceful stop
// ends in the background when that writer gives up (its event reaches no manager: the manager
// unsubscribed first).
func shutdownRemote(r *remote.Remote, log *slog.Logger) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if p := recover(); p != nil {
				log.Debug("protoactor's remote failed its graceful stop as a peer disconnected; stopping it at once", "panic", p)
				r.Shutdown(false)
			}
		}()
		r.Shutdown(true)
	}()
	t := time.NewTimer(remoteStopWithin)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		log.Debug("protoactor's remote did not stop in time (an endpoint writer still dials a member that is gone); stopping its server at once",
			"within", remoteStopWithin)
		r.Shutdown(false)
	}
}

// remoteStopWithin bounds the remote's graceful stop (shutdownRemote), which takes
// milliseconds unless an endpoint writer still dials a member that is gone.
const remoteStopWithin = 2 * time.Second

// dropWithin bounds how long a leaving member waits for the others to drop it: a member that
// renews in time does so within a renewal period (ttl/3) after the withdrawal, and its renewal
// takes at most another (storeMembership.renew). A member that holds its connection past that
// (one that stops at the same time, and no longer renews) is not waited for: when members
// stop at once while another stays, each leaving one waits this long.
func dropWithin(ttl time.Duration) time.Duration { return 2 * ttl / 3 }

// peers counts the connections that other members hold open to this member's cluster port,
// as a gRPC stats handler of its server. A member dials each member of its topology (its
// gossip reaches every member several times a second) and closes that connection when its
// topology drops the member (protoactor's MemberList.TerminateMember).
type peers struct {
	mu   sync.Mutex
	open int
	none chan struct{} // closed while open is 0
}

func newPeers() *peers {
	p := &peers{none: make(chan struct{})}
	close(p.none)
	return p
}

// dropped is closed while no other member holds a connection to this one.
func (p *peers) dropped() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.none
}

// HandleConn counts the connections as they begin and end.
func (p *peers) HandleConn(_ context.Context, s stats.ConnStats) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch s.(type) {
	case *stats.ConnBegin:
		if p.open == 0 {
			p.none = make(chan struct{})
		}
		p.open++
	case *stats.ConnEnd:
		if p.open--; p.open == 0 {
			close(p.none)
		}
	}
}

// TagConn, TagRPC and HandleRPC complete stats.Handler; RPCs are not counted.
func (p *peers) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (p *peers) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (p *peers) HandleRPC(context.Context, stats.RPCStats)                         {}

// topologySubscription is the daemon's subscription to membership changes.
type topologySubscription = *eventstream.Subscription

// relay hands a reply sent on a watched platform (HTTP) to the same platform actor on every
// other member, whose clients may wait for it (actors.RelayedOutbound). A member it cannot
// reach misses it: its clients' waits time out with 202, and their event streams resume from
// the durable outbox.
func (d *Daemon) relay(platform string, out *platforms.Outbound) {
	if d.cluster == nil {
		return // not joined yet: nothing runs sessions before that
	}
	me := d.system.Address()
	var msg *actors.RelayedOutbound
	for _, m := range d.cluster.MemberList.Members().Members() {
		if addr := m.Address(); addr != me {
			if msg == nil {
				msg = actors.RelayOf(out)
			}
			d.system.Root.Send(actor.NewPID(addr, "platform-"+platform), msg)
		}
	}
}

// managerOf is the SessionManager that runs key's session: in cluster mode the one of the
// member that owns the key.
func (d *Daemon) managerOf(key string) *actor.PID {
	if d.cluster == nil {
		return d.manager
	}
	owner := d.managerAmong(d.cluster.MemberList.Members().Members(), key)
	if owner == nil || owner.Address == d.system.Address() {
		return d.manager
	}
	return owner
}

// placement is the cluster's placement of session keys as this member sees it
// (actors.Placement): the managers of the key's owner and of the other members, reached by
// their member's address. The owner it names is the one among the members that do not leave: a
// leaving member still owns its keys in the cluster's routing until it withdraws (so that no
// other member claims a key whose turn it is finishing), but what it hands on must stay with
// the member it handed it to. Before, that member sent a handed-on key back to the leaving one,
// which, unable to forward it again, started the key's session itself and ran its turns until
// its drain deadline (TestClusterLeavingMemberHandsOnEveryBusyKey).
type placement struct{ d *Daemon }

func (p placement) Owner(key string) *actor.PID {
	if p.d.cluster == nil {
		return nil
	}
	return p.d.managerAmong(p.d.membership.staying(p.d.cluster.MemberList.Members().Members()), key)
}

func (p placement) Peers() []*actor.PID {
	if p.d.cluster == nil {
		return nil
	}
	me := p.d.system.Address()
	var out []*actor.PID
	for _, m := range p.d.cluster.MemberList.Members().Members() {
		if addr := m.Address(); addr != me {
			out = append(out, actor.NewPID(addr, p.d.manager.Id))
		}
	}
	return out
}

func (p placement) Self() *actor.PID { return actor.NewPID(p.d.system.Address(), p.d.manager.Id) }

// Holders asks the store's membership registry, not this member's view: a member that joined
// since this one's last renewal may hold a key.
// Every key looked up is in the answer, with the claim read (the zero one for a key never
// claimed): the condition of the activation's claim of it.
func (p placement) Holders(ctx context.Context, keys []string) (map[string]actors.Holder, error) {
	if p.d.members == nil {
		return nil, nil
	}
	hs, err := p.d.members.Holders(ctx, p.d.cfg.Cluster.Name, keys, p.d.cfg.Cluster.MemberTTL)
	if err != nil {
		return nil, err
	}
	out := make(map[string]actors.Holder, len(keys))
	for _, key := range keys {
		h := hs[key]
		var manager *actor.PID
		if m := h.Member; m != nil {
			manager = actor.NewPID((&cluster.Member{Host: m.Host, Port: int32(m.Port)}).Address(), p.d.manager.Id)
		}
		out[key] = actors.Holder{Manager: manager, Seen: &h.ClaimSeen}
	}
	return out, nil
}

// askStore is the part of the membership registry that carries asks and promises of keys
// claims between members that cannot reach each other (postgres.Store; actors.Asks).
type askStore interface {
	ExchangeAsks(ctx context.Context, cluster, node string, keys []string, within, ttl time.Duration) ([]postgres.Ask, error)
	Promise(ctx context.Context, key string, epoch int64, from, to string, ttl time.Duration) (bool, error)
}

// ExchangeAsks implements actors.Asks through the store's registry; a registry that carries no
// asks (none in tests of the membership alone) asks and answers nothing.
func (p placement) ExchangeAsks(ctx context.Context, keys []string, within time.Duration) ([]actors.Ask, error) {
	s, ok := p.d.members.(askStore)
	if !ok {
		return nil, nil
	}
	asks, err := s.ExchangeAsks(ctx, p.d.cfg.Cluster.Name, p.d.deps.Node, keys, within, p.d.cfg.Cluster.MemberTTL)
	if err != nil {
		return nil, err
	}
	out := make([]actors.Ask, 0, len(asks))
	for _, a := range asks {
		out = append(out, actors.Ask{Key: a.Key, Epoch: a.Epoch, Node: a.Asker.Node,
			Asker: actor.NewPID((&cluster.Member{Host: a.Asker.Host, Port: int32(a.Asker.Port)}).Address(), p.d.manager.Id)})
	}
	return out, nil
}

var _ actors.Asks = placement{}

// Promise implements actors.Asks: the store promises nothing while a live member of an older
// version, whose claims carry no condition, is registered (postgres.ClaimsOnCondition).
func (p placement) Promise(ctx context.Context, a actors.Ask) (bool, error) {
	s, ok := p.d.members.(askStore)
	if !ok {
		return false, errors.New("promise: the membership registry carries no promises")
	}
	return s.Promise(ctx, a.Key, a.Epoch, p.d.deps.Node, a.Node, p.d.cfg.Cluster.MemberTTL)
}

// clusterReady reports whether this member is in the cluster's topology, as it sees it, and
// whether its renewals succeed.
func (d *Daemon) clusterReady() error {
	switch {
	case d.cluster == nil:
		return errors.New("not joined")
	case !d.cluster.MemberList.ContainsMemberID(d.system.ID):
		return errors.New("not a member of the cluster's topology")
	}
	return d.membership.renewalsFailing(time.Now())
}

// crowdedAddresses returns the addresses of members, this member's (me) among them, that differ
// from me only in their last character, when there are three or more; nil otherwise. The
// cluster's placement (protoactor's rendezvous hashing: FNV-1a over the key and then the
// address, the highest score wins) ranks such addresses by two low bits of the hash before
// their last character: three of them split the keys 50/25/25 whatever the characters, five
// consecutive ports 25/12.5/12.5/25/25 (two split evenly). Addresses that differ earlier mix
// more bytes after the difference: 127.0.0.2, .3 and .4 on one port split them about 35/32/33,
// as hosts do (docs/ARCHITECTURE.md, "Placement").
func crowdedAddresses(me string, members []*cluster.Member) []string {
	if me == "" {
		return nil
	}
	var out []string
	for _, m := range members {
		if a := m.Address(); len(a) == len(me) && a[:len(a)-1] == me[:len(me)-1] {
			out = append(out, a)
		}
	}
	if len(out) < 3 {
		return nil
	}
	slices.Sort(out)
	return out
}

// ownerOf returns the function that names the address of the member owning a session key
// among members, as the cluster's placement (disthash: rendezvous hashing) decides; "" when
// no member hosts sessions.
func ownerOf(members []*cluster.Member) func(key string) string {
	rdv := cluster.NewRendezvous()
	rdv.UpdateMembers(members)
	return func(key string) string {
		return rdv.GetByClusterIdentity(cluster.NewClusterIdentity(key, actors.SessionKind))
	}
}

// advertiseWithin bounds each step of checkAdvertise.
const advertiseWithin = 2 * time.Second

// checkAdvertise refuses an advertised address of this host that does not reach bind: the
// other members would send nothing to a member they cannot dial, while it dials them and
// stays a member, ready, taking keys over from members it cannot hear (found by an audit: a
// mistyped advertise made about one chat in three unreachable through the other members, and
// said so nowhere). It listens on bind and dials advertise; an advertised address that is not
// this host's (behind NAT, a load balancer) is not checked: it may not route back from here.
func checkAdvertise(bind, advertise string) error {
	// Not checked: an address that does not parse (validation says so), a bind port picked at
	// random (it cannot be advertised ahead), another host's address.
	host, _, err := net.SplitHostPort(advertise)
	if _, port, _ := net.SplitHostPort(bind); err != nil || port == "0" || !localHost(host) {
		return nil
	}
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil // cluster.bind is taken, or cannot be had: joining says so
	}
	defer ln.Close()
	accepted := make(chan struct{})
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
			close(accepted)
		}
	}()
	c, err := net.DialTimeout("tcp", advertise, advertiseWithin)
	if err != nil {
		return fmt.Errorf("cluster.advertise %s does not reach this member's cluster.bind %s (%v): the other members could not send it anything; set it to the host:port they dial to reach cluster.bind", advertise, bind, err)
	}
	c.Close()
	select {
	case <-accepted:
		return nil
	case <-time.After(advertiseWithin):
		return fmt.Errorf("cluster.advertise %s reaches another process than this member's cluster.bind %s: the other members would send that one what is meant for this member; set it to the host:port they dial to reach cluster.bind", advertise, bind)
	}
}

// localHost reports whether host (a name or an IP) is one of this host's addresses.
func localHost(host string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), advertiseWithin)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return false
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, ip := range ips {
		if ip.IP.IsLoopback() {
			return true
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip.IP) {
				return true
			}
		}
	}
	return false
}
