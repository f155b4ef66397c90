package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence/postgres"
	"github.com/asynkron/protoactor-go/cluster"
)

// memberStore is the membership registry of cluster mode: the shared PostgreSQL store.
type memberStore interface {
	Heartbeat(ctx context.Context, cluster string, m postgres.Member, ttl time.Duration, keep ...string) ([]postgres.Member, error)
	Leave(ctx context.Context, cluster, id string) error
	Members(ctx context.Context, cluster string, ttl time.Duration) ([]postgres.Member, error)
	Holders(ctx context.Context, cluster string, keys []string, ttl time.Duration) (map[string]postgres.Holding, error)
	Strangers(ctx context.Context, cluster, id string, ttl time.Duration) ([]postgres.Member, error)
	RecordSelfStops(ctx context.Context, cluster string, nodes []string) (int, error)
	Clock(ctx context.Context) (time.Time, error)
}

// storeMembership is cluster mode's protoactor ClusterProvider. Every member registers in the
// shared store and renews its registration every ttl/3; the members whose registration is
// younger than ttl, by the database's clock, are the cluster. It needs no static peer list, no
// port of its own and nothing beyond the store every member must reach anyway (DESIGN §6 names
// protoactor's automanaged provider instead: see docs/ARCHITECTURE.md for why not).
//
// protoactor never readmits a member id it saw leave. A member whose renewals fail for a whole
// ttl has been dropped by the others, so it reports itself lost (the daemon then stops, and a
// process supervisor starts it again, with a new id). The same goes for a split: protoactor's
// gossip drops (blocks, for ever) a member it has not heard from for 20 s, as after a network
// partition between members that both still reach the store. The store then lists a member
// that protoactor has blocked, and the two would route each key by different views for ever
// (safely, for the fencing, but each key's session would move at every message). So when the
// store lists a live member this one has blocked, the younger of the two (registered later)
// reports itself lost; the older one stays.
type storeMembership struct {
	store memberStore
	name  string
	node  string // the owner name this member's sessions claim keys with (Deps.Node)
	http  string // the address the daemon's HTTP API listens on
	ttl   time.Duration
	log   *slog.Logger
	lost  func(error)
	// notes is the data directory where the member leaves a note of its stop when its
	// membership is lost, and where it finds its predecessors' (selfstop.go); "" for none.
	notes string
	// join, once closed, ends StartMember's registration (the start's Options.Stop), which
	// then fails with context.Canceled; nil for none.
	join <-chan struct{}

	me   postgres.Member
	stop chan struct{}
	done chan struct{}
	once sync.Once

	// beat holds a token while a renewal runs: one at a time, so that a renewal begun before
	// leaving cannot undo it. (A channel, not a mutex: a wait on it is one testing/synctest's
	// clock can pass.)
	beat    chan struct{}
	mu      sync.Mutex
	leaving bool              // the member stops: it renews its registration as leaving
	live    []postgres.Member // the live members as of the last renewal, oldest first (none Expired)
	// failing is when the renewals that fail now began to, renewing when the renewal in flight
	// began, and renewed when the last one that succeeded began (the member stops member_ttl
	// after it); failing is zero while they succeed, renewing between renewals. /readyz reports
	// them (renewalsFailing).
	failing, renewing, renewed time.Time
	// elapsed reads a clock that counts the time the host spent suspended (elapsedClock): renew
	// judges by it whether member_ttl passed between renewals. A test sets it to simulate a
	// suspend.
	elapsed func() time.Duration
	// wall reads the wall clock, which protoactor's gossip times the other members by: renew
	// compares it with elapsed to see it stepped ahead (clockStepLimit). A test sets it to
	// simulate a step.
	wall func() time.Time
	// watchers are the goroutines besides renew that end when the member stops (watchClock).
	watchers sync.WaitGroup
}

// elapsedClock returns a reading of the time passed since it was made, suspends of the host
// included: Go's monotonic clock (CLOCK_MONOTONIC on Linux) stops while the host is suspended,
// so a member suspended past member_ttl (a laptop or VM suspended and resumed), whom the others
// counted as gone and blocked, saw only a short gap and renewed as a member that stays; the
// oldest one made the younger members leave as the losing side of a split. The reading is the
// monotonic clock's plus what the host spent suspended meanwhile (suspended: CLOCK_BOOTTIME
// less CLOCK_MONOTONIC), rather than CLOCK_BOOTTIME itself, so that testing/synctest's clock
// moves it as it moves timers. A growth of that suspended time under suspendNoise is no
// suspend but the noise of reading two clocks: it is left out, so that the reading is exactly
// the monotonic clock's unless the host was suspended (a renewal exactly member_ttl after the
// last one is then judged the same at every run).
func elapsedClock() func() time.Duration {
	origin, asleep := time.Now(), suspended()
	return func() time.Duration {
		if d := suspended() - asleep; d >= suspendNoise {
			return time.Since(origin) + d
		}
		return time.Since(origin)
	}
}

// suspendNoise is the least growth of the host's suspended time that elapsedClock counts. A
// suspend that matters lasts about member_ttl (a second at least).
const suspendNoise = 100 * time.Millisecond

func newStoreMembership(store memberStore, name, node, http string, ttl time.Duration, log *slog.Logger, lost func(error)) *storeMembership {
	return &storeMembership{store: store, name: name, node: node, http: http, ttl: ttl, log: log, lost: lost,
		stop: make(chan struct{}), done: make(chan struct{}), beat: make(chan struct{}, 1), elapsed: elapsedClock(), wall: time.Now}
}

// StartMember registers the member and starts renewing it.
func (p *storeMembership) StartMember(c *cluster.Cluster) error {
	host, port, err := c.ActorSystem.GetHostPort()
	if err != nil {
		return fmt.Errorf("membership: %w", err)
	}
	p.me = postgres.Member{ID: c.ActorSystem.ID, Host: host, Port: port, Kinds: c.GetClusterKinds(), Node: p.node,
		HTTP: httpForCluster(p.http, host)}
	// A stop during the start (join) ends the registration's waits at once: a database that
	// does not answer, or a members table another transaction holds, kept the start for up to
	// member_ttl before (TestClusterStopWhileTheStartJoins).
	ctx, cancel := stopContext(context.Background(), p.join)
	defer cancel()
	ctx, cancelTTL := context.WithTimeout(ctx, p.ttl)
	defer cancelTTL()
	if err := p.recordSelfStops(ctx); err != nil {
		return fmt.Errorf("membership: %w", err)
	}
	began := time.Now()
	// A registration the stop cut was rolled back, or (its answer lost) expires after
	// member_ttl, as a member's killed right after it registered does: no leave is waited for.
	live, err := p.heartbeat(ctx)
	if err != nil {
		return fmt.Errorf("membership: register: %w", err)
	}
	if err := p.strangers(ctx); err != nil {
		// Not with ctx, which the stop may have ended: the registration committed.
		lctx, lcancel := context.WithTimeout(context.Background(), p.ttl)
		defer lcancel()
		_ = p.store.Leave(lctx, p.name, p.me.ID)
		return fmt.Errorf("membership: %w", err)
	}
	live = p.registeredMeanwhile(ctx, live)
	v := viewOf(c)
	v.publish(live)
	go p.renew(v, began)
	p.watchers.Add(1)
	go p.watchClock()
	return nil
}

// registeredMeanwhile returns the live members as the store lists them once this member's
// registration has committed, or live when that read fails or does not list this member. Members
// that register at the same moment (a service manager starting the whole cluster again) may each
// miss the other's row in their registration's transaction: each member's first topology then
// held itself alone, its first recovery activated every key with unfinished work without asking
// the other, and every pending message's agent ran on both, the later claim fencing the earlier
// run (TestClusterMembersStartedTogetherRunEachPendingMessageOnce). Read after the commit, the
// list of at least one of two such members holds the other, which its activations then ask to
// let go of each key (actors.Release). A lone member pays one read of the table.
func (p *storeMembership) registeredMeanwhile(ctx context.Context, live []postgres.Member) []postgres.Member {
	again, err := p.store.Members(ctx, p.name, p.ttl)
	if err != nil || !slices.ContainsFunc(again, func(m postgres.Member) bool { return m.ID == p.me.ID }) {
		return live
	}
	p.mu.Lock()
	p.live = again
	p.mu.Unlock()
	return again
}

// recordSelfStops records in the store the members that stopped themselves on this data
// directory before this one started (selfStopDir), then removes their notes. A note that cannot
// be read is logged: it is lost, and only a claim of those members' keys counts their deaths.
func (p *storeMembership) recordSelfStops(ctx context.Context) error {
	if p.notes == "" {
		return nil
	}
	nodes, files, err := selfStops(p.notes)
	if err != nil {
		p.log.Warn("the stops of earlier members on this data directory are not recorded; a claim of their keys counts their deaths", logging.Err(err))
		return nil
	}
	if len(nodes) > 0 {
		n, err := p.store.RecordSelfStops(ctx, p.name, nodes)
		if err != nil {
			return err
		}
		// A note whose member has no row (it left cleanly after all, its row expired, or the
		// cluster was renamed since) marks nothing: there is no death of it to count either.
		p.log.Info("recorded the stops of earlier members on this data directory: a claim of their keys counts no death",
			"members", nodes, "recorded", n)
	}
	for _, f := range files {
		_ = os.Remove(f)
	}
	return nil
}

// lose reports the membership lost to renewals that failed (or failed until one that succeeded
// past member_ttl), after leaving a note of the stop for the next member started on the data
// directory (selfStopDir). Renewals that woke or returned late (the process stalled, or starved:
// their deadlines passed while the process could not run) report the loss without a note (gone): a
// stall may be a message's doing (memory it makes the process swap for), and the member's death
// then counts, as a crash's does (a review's finding: starved renewals fail by their deadlines,
// as those of a database that does not answer do). A split, a stranger or a displaced member
// needs none: the database answers, and the stop removes the member's row.
func (p *storeMembership) lose(err error) {
	if p.notes != "" {
		if nerr := noteSelfStop(p.notes, p.node); nerr != nil {
			p.log.Warn("could not note this member's stop in the data directory; a claim of its keys will count its death", logging.Err(nerr))
		}
	}
	p.lost(err)
}

// gone reports the membership lost past member_ttl: with a note of the stop (lose) when the
// database was away, without one when the renewals ran late by lagged past slack (starved).
func (p *storeMembership) gone(err error, lagged, slack time.Duration) {
	if lagged <= 0 {
		p.lose(err)
		return
	}
	p.log.Warn("this member's renewals ran late: the process was starved or paused, perhaps by a message it ran, so its stop counts as a death of that message",
		"late", (lagged + slack).Round(time.Millisecond))
	p.lost(err)
}

// renewalsFailing reports, as of now, that this member's renewals fail, or that the one in
// flight is overdue, and when it stops for them; nil while they succeed. Before, /readyz said
// the cluster was ok until the member stopped: a load balancer kept sending it requests it was
// about to refuse.
func (p *storeMembership) renewalsFailing(now time.Time) error {
	p.mu.Lock()
	failing, renewing, renewed := p.failing, p.renewing, p.renewed
	p.mu.Unlock()
	stops := fmt.Sprintf("this member stops at member_ttl (%v after its last renewal), in %v",
		p.ttl, max(renewed.Add(p.ttl).Sub(now), 0).Round(100*time.Millisecond))
	switch {
	case !failing.IsZero():
		return fmt.Errorf("renewals failing for %v; %s", now.Sub(failing).Round(100*time.Millisecond), stops)
	case !renewing.IsZero() && now.Sub(renewing) > renewalOverdue(p.ttl):
		return fmt.Errorf("renewal in flight for %v; %s", now.Sub(renewing).Round(100*time.Millisecond), stops)
	}
	return nil
}

// renewalOverdue is how long a renewal may be in flight before /readyz reports it
// (renewalsFailing): half its deadline of ttl/3. A renewal takes milliseconds; one that has not
// answered by then most likely waits for a database that does not answer (a hung connection,
// not a refused one), and fails only at its deadline. Before, /readyz changed only then, ttl/3
// before the member stopped (when the database hung after a renewal); now ttl/2 before
// (TestReadyzReportsAHungRenewal). A database that takes longer than this to commit a renewal
// fails readiness for as long, as one that takes ttl/3 did before.
func renewalOverdue(ttl time.Duration) time.Duration { return ttl / 6 }

// memberView is what renewing needs of protoactor's cluster: whether its gossip blocked a
// member, and where the live members go.
type memberView struct {
	blocked func(id string) bool
	update  func(members cluster.Members)
}

func viewOf(c *cluster.Cluster) memberView {
	return memberView{
		blocked: func(id string) bool { return c.GetBlockedMembers().Contains(id) },
		update:  c.MemberList.UpdateClusterTopology,
	}
}

// publish hands the live members to protoactor's member list.
func (v memberView) publish(live []postgres.Member) {
	members := make([]*cluster.Member, 0, len(live))
	for _, m := range live {
		members = append(members, &cluster.Member{Id: m.ID, Host: m.Host, Port: int32(m.Port), Kinds: m.Kinds})
	}
	v.update(members)
}

// addresses returns the cluster addresses of members, for a log line: they tell the members
// apart as a count did not.
func addresses(members []*cluster.Member) []string {
	out := make([]string, 0, len(members))
	for _, m := range members {
		out = append(out, m.Address())
	}
	return out
}

// httpForCluster is the address of a member's HTTP API (listening on addr) as it registers it
// for admin commands on other hosts (postgres.Store.MemberHTTP), given the host the other
// members reach it at: that host when the API listens on every interface, none when it listens
// on loopback only and the cluster spans hosts (127.0.0.1 would name another host's process
// there, perhaps another deployment's), else addr.
func httpForCluster(addr, host string) string {
	h, port, err := net.SplitHostPort(addr)
	switch {
	case err != nil:
		return ""
	case config.EveryInterface(addr):
		return net.JoinHostPort(host, port)
	case config.LoopbackHost(h) && !config.LoopbackHost(host):
		return ""
	}
	return addr
}

// StartClient is not used: every agentgate process is a member.
func (p *storeMembership) StartClient(*cluster.Cluster) error {
	return errors.New("membership: agentgate runs members only")
}

// Shutdown stops renewing and removes the registration, so the others see this member gone at
// their next renewal rather than after a ttl. A second call removes it again (harmless). A
// stopping daemon calls it once it has drained and stopped its sessions (leave marks the
// registration before that).
func (p *storeMembership) Shutdown(bool) error {
	p.once.Do(func() { close(p.stop) })
	<-p.done
	p.watchers.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), p.ttl)
	defer cancel()
	return p.store.Leave(ctx, p.name, p.me.ID)
}

// renewRetry is how soon a renewal that failed is tried again (at most; ttl/3 when shorter).
// A failure waited for the next ttl/3 tick: with the default member_ttl of 6 s, a database
// restart of 3.5 s, whose first query on each pooled connection fails too, took a renewal
// past the ttl, and every member of the cluster stopped (a cluster soak of the twenty-fourth
// session). Retried this soon, only an outage of about a ttl does.
const renewRetry = 250 * time.Millisecond

// renew renews the registration every ttl/3 until the member stops or its membership is lost.
// last is when the registration (StartMember's renewal) began.
//
// A renewal counts from when it began, not from when its answer came: the database stamps
// the row as the renewal's statement runs, at most as late as its answer, and the others judge
// the member by that stamp. Counted from the answer, a renewal whose commit was slow (a
// database under load, a synchronous standby that lags, a failover) moved the member's own
// deadline past the one the others held it to: a renewal that succeeded just inside it came
// after the others had counted the member gone and blocked it, and the member stayed
// (TestRenewalCountsFromItsStart).
//
// Whether member_ttl passed is judged by p.elapsed, which counts a suspend of the host; the
// timers wait on the monotonic clock, which does not (TestSuspendedMemberLeaves).
func (p *storeMembership) renew(v memberView, last time.Time) {
	defer close(p.done)
	every := p.ttl / 3
	// A renewal that wakes, or returns, later than its schedule by more than slack shows this
	// process starved (or paused) rather than the database away; lagged keeps that for the
	// failing renewals that follow (see lose).
	slack := max(every/2, time.Second)
	wait := max(every-time.Since(last), 0)
	t := time.NewTimer(wait)
	defer t.Stop()
	due := time.Now().Add(wait)
	reset := func(d time.Duration) { t.Reset(d); due = time.Now().Add(d) }
	// tried is the end of the last attempt; lastAt and triedAt are last and tried as read by
	// p.elapsed, which judges whether member_ttl passed.
	var tried time.Time
	lastAt := p.elapsed() - time.Since(last)
	triedAt := p.elapsed()
	// wallAt is the wall clock at the last wake, read with p.elapsed as wallElapsed.
	wallAt, wallElapsed := p.wall().Round(0), p.elapsed()
	failing := false // the last attempt failed (and was logged)
	lagged := time.Duration(0)
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		lagged = max(lagged, time.Since(due)-slack)
		if p.elapsed()-triedAt >= p.ttl {
			// The process stalled (paused, suspended, or starved) for longer than member_ttl
			// before this renewal: the others counted this member as gone and blocked it. It
			// does not renew as a member that stays, even for a moment: a renewal of the others
			// that found it so, older than them and blocked, would make them leave as the losing
			// side of a split. Its stop renews it as leaving (Daemon.leave), which they do not
			// count so.
			p.lost(fmt.Errorf("cluster membership lost: %v between renewals, past member_ttl %v (the other members counted this one as gone)",
				(p.elapsed() - lastAt).Round(time.Millisecond), p.ttl))
			return
		}
		wallNow, elapsedNow := p.wall().Round(0), p.elapsed()
		if ahead := wallNow.Sub(wallAt) - (elapsedNow - wallElapsed); ahead >= clockStepLimit(p.ttl) {
			// protoactor's gossip may have blocked the others, for ever: this member leaves,
			// as after a stall, before they block it in turn (clockStepLimit).
			p.lost(fmt.Errorf("cluster membership lost: this host's clock moved ahead by %v more than the time that passed, "+
				"and protoactor's gossip, which times the other members by it, may have cut them off: this member leaves and must start again",
				ahead.Round(time.Millisecond)))
			return
		}
		wallAt, wallElapsed = wallNow, elapsedNow
		began, beganAt := time.Now(), p.elapsed()
		p.mu.Lock()
		p.renewing, p.renewed = began, last
		p.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), every)
		live, locked, err := p.heartbeatAt(ctx)
		cancel()
		tried, triedAt = time.Now(), p.elapsed()
		p.mu.Lock()
		p.renewing = time.Time{}
		p.mu.Unlock()
		if err == nil {
			reset(max(every-time.Since(began), 0)) // the next renewal ttl/3 after this one began
			if since := triedAt - lastAt; since >= p.ttl {
				// A pause longer than member_ttl (a stalled process, host or connection, or
				// renewals that failed until this one): the others counted this member as gone
				// and blocked it, and its staying would make them, the younger ones, leave as
				// the losing side of a split. Judged as a failed renewal is (gone): one that
				// began just inside member_ttl after an outage left no note before.
				p.gone(fmt.Errorf("cluster membership lost: %v between renewals, past member_ttl %v (the other members counted this one as gone)",
					since.Round(time.Millisecond), p.ttl), max(lagged, tried.Sub(locked)-every-slack), slack)
				return
			}
			failing, lagged = false, 0
			last, lastAt = began, beganAt
			p.mu.Lock()
			p.failing = time.Time{}
			p.mu.Unlock()
			if err := p.displaced(live); err != nil {
				p.lost(err)
				return
			}
			if err := p.split(v, live); err != nil {
				p.lost(err)
				return
			}
			sctx, cancel := context.WithTimeout(context.Background(), every)
			err := p.strangers(sctx)
			cancel()
			if err != nil {
				p.lost(err)
				return
			}
			v.publish(live)
			continue
		}
		// Its deadline was every, counted from began; the wait for a leave's renewal to end
		// (which a stop during an outage makes as long as member_ttl) is no lag of this process.
		lagged = max(lagged, tried.Sub(locked)-every-slack)
		if since := triedAt - lastAt; since >= p.ttl {
			err := fmt.Errorf("cluster membership lost: no renewal for %v, past member_ttl %v (the other members count this one as gone): %w",
				since.Round(time.Millisecond), p.ttl, err)
			p.gone(err, lagged, slack)
			return
		}
		if !failing {
			p.log.Warn("cluster membership not renewed; retrying", "in", min(renewRetry, every), logging.Err(err))
			p.mu.Lock()
			p.failing = began
			p.mu.Unlock()
		}
		failing = true
		reset(min(renewRetry, every))
	}
}

// clockStepLimit is how far the wall clock may step ahead between two renewals before the
// member leaves. protoactor's gossip stamps what it hears from each member with the wall clock
// and blocks, for ever, a member whose stamp is older than gossipExpiry: a step of S makes it
// block every member it has not heard from for gossipExpiry less S. A live member is heard
// several times a second, and one silent for member_ttl has stalled and leaves itself, so a step
// under gossipExpiry less member_ttl (14 s at the default member_ttl of 6 s) blocks no live
// member, and a longer one may block them all. Before, the member stayed: unless it was the
// oldest, it left at its next renewal as the younger side of a split; the oldest ran on cut off
// from the others (TestWallClockStepAheadLeaves). A step back only delays gossip's block of a
// dead member, which the store drops first.
func clockStepLimit(ttl time.Duration) time.Duration { return gossipExpiry(ttl) - ttl }

// heartbeat renews the member's registration, as leaving once it leaves, and keeps the live
// members it returns.
func (p *storeMembership) heartbeat(ctx context.Context) ([]postgres.Member, error) {
	live, _, err := p.heartbeatAt(ctx)
	return live, err
}

// heartbeatAt is heartbeat, and says when the renewal began, once any other renewal (a leave's)
// had ended.
//
// The members it returns include, marked Expired, those live at the last renewal whose
// registration has expired since, by the database's clock: the topology keeps them one renewal
// more, and drops them only when they are still expired at the next (or gone from the table).
// A step ahead of the database server's clock by member_ttl or more makes every registration
// but the one just renewed look expired, until its member renews (within member_ttl/3). Before,
// each member's next renewal dropped the others, and protoactor blocked them for ever: all but
// the oldest then left as the younger side of a split (TestClusterDatabaseClockStepKeepsMembers).
// A member that really stopped renewing is dropped one renewal later than before: within 5/3
// of member_ttl rather than 4/3.
func (p *storeMembership) heartbeatAt(ctx context.Context) ([]postgres.Member, time.Time, error) {
	p.beat <- struct{}{}
	defer func() { <-p.beat }()
	locked := time.Now()
	p.mu.Lock()
	me := p.me
	me.Leaving = p.leaving
	var keep []string
	for _, m := range p.live {
		if m.ID != me.ID {
			keep = append(keep, m.ID)
		}
	}
	p.mu.Unlock()
	live, err := p.store.Heartbeat(ctx, p.name, me, p.ttl, keep...)
	if err == nil {
		p.mu.Lock()
		p.live = slices.DeleteFunc(slices.Clone(live), func(m postgres.Member) bool { return m.Expired })
		p.mu.Unlock()
	}
	return live, locked, err
}

// leave marks the registration leaving, at once and at every renewal from then on. The member
// stays one, and keeps its keys, until Shutdown removes its registration (or it expires): the
// others never take over a key whose turn it is still finishing.
func (p *storeMembership) leave(ctx context.Context) error {
	p.mu.Lock()
	p.leaving = true
	p.mu.Unlock()
	_, err := p.heartbeat(ctx)
	return err
}

// successors are the members that take this one's keys over when it leaves: the other live
// members, as of the last renewal, that do not leave themselves.
func (p *storeMembership) successors() []*cluster.Member {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*cluster.Member
	for _, m := range p.live {
		if m.ID != p.me.ID && !m.Leaving {
			out = append(out, &cluster.Member{Id: m.ID, Host: m.Host, Port: int32(m.Port), Kinds: m.Kinds})
		}
	}
	return out
}

// othersStay reads from the store whether another live member does not leave: one that takes
// keys over, rather than stopping itself. A leaving member's own view (successors) is as old as
// its last renewal, which may predate the others' leaving when they were told to stop at the
// same moment.
func (p *storeMembership) othersStay(ctx context.Context) (bool, error) {
	live, err := p.store.Members(ctx, p.name, p.ttl)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(live, func(m postgres.Member) bool { return m.ID != p.me.ID && !m.Leaving }), nil
}

// staying returns members without those that leave, as of the last renewal; members itself
// when none of them leaves, or all do.
func (p *storeMembership) staying(members []*cluster.Member) []*cluster.Member {
	p.mu.Lock()
	defer p.mu.Unlock()
	leaves := func(m *cluster.Member) bool {
		return slices.ContainsFunc(p.live, func(l postgres.Member) bool { return l.ID == m.Id && l.Leaving })
	}
	if !slices.ContainsFunc(members, leaves) {
		return members
	}
	if out := slices.DeleteFunc(slices.Clone(members), leaves); len(out) > 0 {
		return out
	}
	return members
}

// displaced returns an error when this member is not among the live members its own renewal
// returned: a newer live member registered its host and port, which the store takes for this
// member restarted on its port (persistence/postgres gone), so every member, this one too,
// leaves it out of the topology. Two live members on one address are a misconfiguration (the
// default bind 127.0.0.1:6340 on two hosts, one advertise on two members); this one must not
// run on unseen.
func (p *storeMembership) displaced(live []postgres.Member) error {
	if slices.ContainsFunc(live, func(m postgres.Member) bool { return m.ID == p.me.ID }) {
		return nil
	}
	return fmt.Errorf("cluster membership lost: another live member registered this member's address %s:%d, "+
		"so the cluster takes this one for gone; each member needs an address of its own (cluster.bind, cluster.advertise)",
		p.me.Host, p.me.Port)
}

// strangers returns an error when a live member of another cluster (another cluster.name),
// leaving or not (a leaving one still runs turns), registered on this database and schema
// before this member. The two clusters would share the sessions but not their members: each
// would place every key on one of its own members, which claims the key without asking the
// other cluster's holder, and every message would run on both, each side fencing the other's
// writes. The younger side stops, at start
// or at its next renewal (two members starting at once both register before either checks),
// and the older one runs on (TestMemberOfASecondClusterLeaves). A failed check is no verdict:
// it is made again at the next renewal.
func (p *storeMembership) strangers(ctx context.Context) error {
	others, err := p.store.Strangers(ctx, p.name, p.me.ID, p.ttl)
	if err != nil || len(others) == 0 {
		return nil
	}
	o := others[0]
	return fmt.Errorf("another cluster, %q, runs on this database and schema (its member %s at %s:%d is older than this one): "+
		"two clusters would each run the same sessions; give each cluster a database or schema of its own, "+
		"or all members the same cluster.name (to rename a cluster, stop every member of the old name first)",
		o.Cluster, o.ID, o.Host, o.Port)
}

// split returns an error when this member must leave a split cluster: an older live member
// (live is oldest first) that does not leave is one protoactor has blocked. A blocked member
// that leaves is no split: it withdraws once it has stopped (or its registration expires), nor
// is one whose registration has expired (Expired): the next renewal drops it, or finds it
// renewed (a step of the database's clock) and judges it then. A
// member back from a stall longer than member_ttl is one: the others counted it gone and
// blocked it, and it leaves; before, the older it was, the more of the others found it alive
// in the store during its stop and left too, and a 10 s pause of one member of three stopped
// the whole cluster (TestClusterStalledMemberLeavesAlone).
func (p *storeMembership) split(v memberView, live []postgres.Member) error {
	for _, m := range live {
		if m.ID == p.me.ID {
			return nil // the blocked ones after this one are younger: they leave
		}
		if !m.Leaving && !m.Expired && v.blocked(m.ID) {
			return fmt.Errorf("cluster split: member %s (%s:%d) is alive in the store but this member "+
				"stopped hearing from it, and it is the older one: this member leaves and must start again", m.ID, m.Host, m.Port)
		}
	}
	return nil
}
