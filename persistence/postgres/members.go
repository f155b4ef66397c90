package postgres

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ClaimsOnCondition is the mark a member of this version registers among its kinds
// (Heartbeat adds it; the Kinds read back leave it out): every claim it makes carries a
// condition (persistence.Store.Claim's seen). A promise (Store.Promise) is made only while
// every live member carries it. No grain kind: nothing is placed on it (protoactor's member
// lists of a kind nobody asks for stay unused; this version does not hand it to protoactor).
const ClaimsOnCondition = "agentgate.claims-on-condition"

// registeredKinds is kinds as Heartbeat registers them: with ClaimsOnCondition.
func registeredKinds(kinds []string) []string {
	out := make([]string, 0, len(kinds)+1)
	for _, k := range kinds {
		if k != ClaimsOnCondition {
			out = append(out, k)
		}
	}
	return append(out, ClaimsOnCondition)
}

// readKinds is kinds as read from a registration: without ClaimsOnCondition, which is no
// grain kind. It changes kinds in place.
func readKinds(kinds []string) []string {
	return slices.DeleteFunc(kinds, func(k string) bool { return k == ClaimsOnCondition })
}

// Member is one member of a cluster, as it registers itself (Store.Heartbeat).
type Member struct {
	// Cluster is the name of the member's cluster; only Strangers sets it.
	Cluster string
	ID      string
	Host    string
	Port    int
	Kinds   []string
	// Leaving marks a member that stops: it drains its running turns and hands the rest of its
	// keys on, and it is still the member that owns its keys until its row is gone.
	Leaving bool
	// Node is the owner name the member claims session keys with (Store.Claim): a claim that
	// takes a key from a member that died counts that death against the key's head message.
	Node string
	// HTTP is the address of the member's HTTP API, as another host reaches it (MemberHTTP).
	HTTP string
	// Expired marks a member that Heartbeat lists only because the caller asked to keep
	// hearing of it (keep): its registration is older than its ttl by the database's clock.
	Expired bool
}

// gone is a condition true of a member row m whose member is gone without leaving: its
// registration is older than its ttl (mTTL, an SQL expression of seconds), or a newer member
// n, live by its ttl (nTTL), registered its address: a process restarted on its port is back
// before its old registration expires, and the old process is gone for certain.
func gone(mTTL, nTTL string) string {
	return `(` + expired(mTTL) + ` OR ` + superseded(nTTL) + `)`
}

// expired is a condition true of a member row m whose registration is older than its ttl (mTTL),
// by the database's clock.
func expired(mTTL string) string {
	return `m.heartbeat_at <= clock_timestamp() - make_interval(secs => ` + mTTL + `)`
}

// superseded is a condition true of a member row m whose address a newer member n, live by its
// ttl (nTTL), registered.
func superseded(nTTL string) string {
	return `EXISTS (SELECT 1 FROM members n WHERE n.cluster = m.cluster AND n.host = m.host
			AND n.port = m.port AND n.joined_at > m.joined_at
			AND n.heartbeat_at > clock_timestamp() - make_interval(secs => ` + nTTL + `))`
}

const (
	heartbeatSQL = `INSERT INTO members (cluster, id, host, port, kinds, leaving, node, ttl_secs, http_addr)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (cluster, id) DO UPDATE SET host = excluded.host, port = excluded.port,
			kinds = excluded.kinds, leaving = excluded.leaving, node = excluded.node,
			ttl_secs = excluded.ttl_secs, http_addr = excluded.http_addr, heartbeat_at = clock_timestamp()`
	// Rows expired for a day are removed by whichever member renews next: until then a claim
	// of a key the member held counts its death (migration 0009). A member that comes back
	// after its row expired renews it (protoactor never readmits a member id it saw leave).
	expireMembersSQL = `DELETE FROM members
		WHERE cluster = $1 AND heartbeat_at < clock_timestamp() - make_interval(secs => $2)`
	leaveSQL = `DELETE FROM members WHERE cluster = $1 AND id = $2`
	// selfStoppedSQL marks the members of cluster $1 that claimed keys as nodes $2 as stopped of
	// their own accord (RecordSelfStops).
	selfStoppedSQL = `UPDATE members SET self_stopped = true WHERE cluster = $1 AND node = ANY($2) AND node <> ''`
	// keepGone is how long a gone member's row is kept: a claim that takes one of its keys
	// within it counts its death.
	keepGone = 24 * time.Hour
)

// ownTTL is the ttl a member row (alias) is judged by: the member_ttl it registered with, which
// is also the one by which it counts itself gone and the one a claim judges it by (claimSQL),
// or the caller's (def, an SQL expression of seconds) for a row that registered none. Judged
// by the caller's, members configured with different member_ttl (a rolling restart that
// changes it) dropped each other between renewals: a member renewing every 10 s (member_ttl
// 30 s) was gone for the others 6 s after each renewal (theirs 6 s), and so blocked by their
// gossip for ever, while it stayed (TestMembersAreJudgedByTheirOwnTTL).
func ownTTL(alias, def string) string {
	return `COALESCE(NULLIF(` + alias + `.ttl_secs, 0), ` + def + `)`
}

// liveMembersSQL lists the members that are not gone, each by its own ttl (the caller's, $2,
// for a row that registered none).
var liveMembersSQL = `SELECT id, host, port, kinds, leaving, node, http_addr FROM members m
	WHERE cluster = $1 AND NOT ` + gone(ownTTL("m", "$2"), ownTTL("n", "$2")) + `
	ORDER BY joined_at, id`

// renewedMembersSQL is liveMembersSQL for a renewal (Heartbeat): it lists besides the live
// members those of ids $3 whose registration expired by time (not by a newer member on their
// address), each with whether it expired.
var renewedMembersSQL = `SELECT id, host, port, kinds, leaving, node, http_addr, ` + expired(ownTTL("m", "$2")) + ` FROM members m
	WHERE cluster = $1 AND NOT ` + superseded(ownTTL("n", "$2")) + `
		AND (NOT ` + expired(ownTTL("m", "$2")) + ` OR id = ANY($3))
	ORDER BY joined_at, id`

// holdersSQL reads, for each key of $1 that was ever claimed, its latest claim (epoch and owner)
// and the live member of cluster $2 (by its own ttl, or the caller's, $3, as liveMembersSQL)
// whose node made it: NULLs for a claim whose member is gone, of another cluster, or no
// member's (an admin command's). (Two live rows may share a node: a member restarted on its
// data directory before its old registration expired. The newer one holds the key.)
var holdersSQL = `SELECT o.key, o.epoch, o.owner, m.id, m.host, m.port, m.kinds, m.leaving, m.node
	FROM owners o LEFT JOIN LATERAL (
		SELECT m.id, m.host, m.port, m.kinds, m.leaving, m.node FROM members m
		WHERE m.node = o.owner AND m.node <> '' AND m.cluster = $2 AND NOT ` + gone(ownTTL("m", "$3"), ownTTL("n", "$3")) + `
		ORDER BY m.joined_at DESC LIMIT 1) m ON true
	WHERE o.key = ANY($1)`

// holdersPerQuery bounds the keys of one holdersSQL: a manager's batch of lookups (thousands of
// keys after a rebalance or in a partition) is read in queries of this many keys, sent
// together, so that no one query's parameter and plan grow with the batch.
const holdersPerQuery = 1000

// strangersSQL lists the live members of clusters other than $1 (each judged by its own ttl,
// or by $2), leaving ones included, that registered before member $3 of $1 (ties broken by cluster
// and id, so that of two members exactly one is the older), oldest first.
var strangersSQL = `SELECT cluster, id, host, port, kinds, leaving, node, http_addr FROM members m
	WHERE cluster <> $1 AND NOT ` + gone(ownTTL("m", "$2"), ownTTL("n", "$2")) + `
		AND (joined_at, cluster, id) < (SELECT joined_at, cluster, id FROM members WHERE cluster = $1 AND id = $3)
	ORDER BY joined_at, id`

// Strangers returns the live members of clusters other than cluster on this database and
// schema that registered before member id of cluster, oldest first, each with its Cluster; a
// leaving one too, as its drain still runs turns. Two clusters on one schema share its sessions but not their members: each
// would place, claim and run the same session keys, fencing the other's writes, and its agent
// would run every message the other runs. A member that finds such an older stranger leaves.
func (s *Store) Strangers(ctx context.Context, cluster, id string, ttl time.Duration) ([]Member, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("list other clusters' members: %w", err)
	}
	defer done()
	var ms []Member
	err = s.again(ctx, func(c *pgxpool.Conn) error {
		rows, err := c.Query(ctx, strangersSQL, cluster, ttl.Seconds(), id)
		if err == nil {
			ms, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Member, error) {
				var m Member
				err := r.Scan(&m.Cluster, &m.ID, &m.Host, &m.Port, &m.Kinds, &m.Leaving, &m.Node, &m.HTTP)
				m.Kinds = readKinds(m.Kinds)
				return m, err
			})
		}
		return err
	})
	if err == nil {
		return ms, nil
	}
	return nil, fmt.Errorf("list other clusters' members: %w", s.explain(ctx, err))
}

// Heartbeat registers m as a live member of cluster with ttl as its member_ttl (or renews its
// registration) and returns the members whose last heartbeat is younger than their own ttl, by
// the database's clock, m included, oldest member first; a member whose address a newer live
// member registered is gone. It is cluster mode's membership: every member calls it every
// fraction of its ttl, and the list it returns is the cluster's topology. A leaving member (Member.Leaving)
// is listed, as leaving, for as long as it renews. The members of keep whose registration
// expired by time are listed too, marked Expired: a member that has seen the database's clock
// step ahead (every other registration then looks expired until it renews) can tell such a
// member from one that is not there at all.
func (s *Store) Heartbeat(ctx context.Context, cluster string, m Member, ttl time.Duration, keep ...string) ([]Member, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("heartbeat: %w", err)
	}
	defer done()
	secs := ttl.Seconds()
	var live []Member
	// Run again once if its connection was dead before its COMMIT (inTx): a renewal that fails
	// is retried only at the next heartbeat, a fraction of member_ttl later.
	err = s.inTx(ctx, pgx.TxOptions{}, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(heartbeatSQL, cluster, m.ID, m.Host, m.Port, registeredKinds(m.Kinds), m.Leaving, m.Node, secs, m.HTTP)
		b.Queue(expireMembersSQL, cluster, max(10*secs, keepGone.Seconds()))
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if keep == nil {
			keep = []string{} // ANY of NULL is NULL
		}
		rows, err := tx.Query(ctx, renewedMembersSQL, cluster, secs, keep)
		if err != nil {
			return err
		}
		live, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Member, error) {
			var m Member
			err := r.Scan(&m.ID, &m.Host, &m.Port, &m.Kinds, &m.Leaving, &m.Node, &m.HTTP, &m.Expired)
			m.Kinds = readKinds(m.Kinds)
			return m, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("heartbeat of %s in %s: %w", m.ID, cluster, s.explain(ctx, err))
	}
	return live, nil
}

// Members returns the live members of cluster, as Heartbeat does (ttl judges only a row that
// registered no ttl of its own), without renewing any: what a member that has withdrawn reads of the others.
func (s *Store) Members(ctx context.Context, cluster string, ttl time.Duration) ([]Member, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("list members: %w", err)
	}
	defer done()
	var live []Member
	err = s.again(ctx, func(c *pgxpool.Conn) error {
		rows, err := c.Query(ctx, liveMembersSQL, cluster, ttl.Seconds())
		if err == nil {
			live, err = pgx.CollectRows(rows, scanMember)
		}
		return err
	})
	if err == nil {
		return live, nil
	}
	return nil, fmt.Errorf("list members of %s: %w", cluster, s.explain(ctx, err))
}

// scanMember reads a row of liveMembersSQL.
func scanMember(r pgx.CollectableRow) (Member, error) {
	var m Member
	err := r.Scan(&m.ID, &m.Host, &m.Port, &m.Kinds, &m.Leaving, &m.Node, &m.HTTP)
	m.Kinds = readKinds(m.Kinds)
	return m, err
}

// Leave removes a member's registration: the others see it gone at their next heartbeat.
func (s *Store) Leave(ctx context.Context, cluster, id string) error {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return fmt.Errorf("leave: %w", err)
	}
	defer done()
	if err := s.again(ctx, func(c *pgxpool.Conn) error { // a DELETE: twice is once
		_, err := c.Exec(ctx, leaveSQL, cluster, id)
		return err
	}); err != nil {
		return fmt.Errorf("leave %s: %w", cluster, s.explain(ctx, err))
	}
	return nil
}

// RecordSelfStops records that the members of cluster that claimed keys as nodes stopped
// themselves (their membership lost: renewals that failed for member_ttl, a stall, a split):
// a claim of a key one of them held counts no death against its message, nor of a member that
// last renewed within member_ttl of one (claimSQL). A member starting on the data directory
// where its predecessor left a note of its stop calls it before it registers, and so before
// any of its claims. A node without a row (it left cleanly, or its row expired) is no error.
// It returns how many members it marked.
func (s *Store) RecordSelfStops(ctx context.Context, cluster string, nodes []string) (int, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return 0, fmt.Errorf("record members that stopped themselves: %w", err)
	}
	defer done()
	var marked int64
	err = s.again(ctx, func(c *pgxpool.Conn) error { // sets a flag: twice marks the same rows
		tag, err := c.Exec(ctx, selfStoppedSQL, cluster, nodes)
		marked = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("record members that stopped themselves: %w", s.explain(ctx, err))
	}
	return int(marked), nil
}

// memberHTTPSQL lists the members that are live by their own ttl, not leaving, and registered
// an HTTP address, the most recently renewed first.
var memberHTTPSQL = `SELECT id, node, http_addr FROM members m
	WHERE cluster = $1 AND http_addr <> '' AND NOT leaving AND NOT ` + gone("m.ttl_secs", "n.ttl_secs") + `
	ORDER BY heartbeat_at DESC, id`

// MemberHTTP returns cluster's live members that do not leave and registered the address of
// their HTTP API, the most recently renewed first, each with its ID, Node and HTTP: where an
// admin command that is no member (`agentgate sessions reset`) asks the cluster to act for it.
// (A loopback HTTP names the member's host's process: Node says which host.)
func (s *Store) MemberHTTP(ctx context.Context, cluster string) ([]Member, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("list members: %w", err)
	}
	defer done()
	var ms []Member
	err = s.again(ctx, func(c *pgxpool.Conn) error {
		rows, err := c.Query(ctx, memberHTTPSQL, cluster)
		if err == nil {
			ms, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Member, error) {
				var m Member
				return m, r.Scan(&m.ID, &m.Node, &m.HTTP)
			})
		}
		return err
	})
	if err == nil {
		return ms, nil
	}
	return nil, fmt.Errorf("list members of %s: %w", cluster, s.explain(ctx, err))
}

// Holding is a key's latest claim as Holders reads it.
type Holding struct {
	// ClaimSeen is the claim's epoch and owner: the condition of a claim of the key by a
	// member that asks the others to let go of it (persistence.Store.Claim).
	persistence.ClaimSeen
	// Member is the live member of the cluster whose node made the claim; nil when it is gone
	// (as Heartbeat judges it), of another cluster, or the claim was no member's.
	Member *Member
}

// Holders returns, for each of keys ever claimed, its latest claim and the live member of
// cluster (not gone, as Heartbeat judges it) that made it (Store.Claim names the member by its
// Member.Node); a key never claimed is not in the map. A member about to claim a key asks that
// member to let go first even when its own view of the cluster, as of its last renewal, does
// not list it yet, and claims the key only while the claim is still the one read here. One
// call reads any number of keys, in one round trip of queries of at most holdersPerQuery keys
// each: a member's session manager gathers the lookups of its activations into one (thousands
// of keys wait at once while a member cannot be reached).
func (s *Store) Holders(ctx context.Context, cluster string, keys []string, ttl time.Duration) (map[string]Holding, error) {
	out := make(map[string]Holding, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("holders of %d keys: %w", len(keys), err)
	}
	defer done()
	err = s.again(ctx, func(c *pgxpool.Conn) (err error) {
		clear(out)
		// A batch of its own for each connection: pgx keeps in a sent batch's queries the
		// statements it prepared on the connection it was sent on.
		b := &pgx.Batch{}
		for chunk := range slices.Chunk(keys, holdersPerQuery) {
			b.Queue(holdersSQL, chunk, cluster, ttl.Seconds())
		}
		br := c.SendBatch(ctx, b)
		for range b.Len() {
			var rows pgx.Rows
			if rows, err = br.Query(); err != nil {
				break
			}
			var key string
			var h Holding
			var id, host, node *string
			var port *int
			var leaving *bool
			var kinds []string
			if _, err = pgx.ForEachRow(rows, []any{&key, &h.Epoch, &h.Owner, &id, &host, &port, &kinds, &leaving, &node}, func() error {
				if id != nil {
					h.Member = &Member{ID: *id, Host: *host, Port: *port, Kinds: readKinds(kinds), Leaving: *leaving, Node: *node}
				}
				out[key] = h
				h, kinds = Holding{}, nil
				return nil
			}); err != nil {
				break
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("holders of %d keys: %w", len(keys), s.explain(ctx, err))
	}
	return out, nil
}

// Clock returns the database server's clock (clock_timestamp()): the one clock every member of
// a cluster reads the same, which judges their registrations. A member compares its own with it
// (supervisor's clock watch).
func (s *Store) Clock(ctx context.Context) (time.Time, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("read the database's clock: %w", err)
	}
	defer done()
	var t time.Time
	if err := s.again(ctx, func(c *pgxpool.Conn) error {
		return c.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t)
	}); err != nil {
		return time.Time{}, fmt.Errorf("read the database's clock: %w", s.explain(ctx, err))
	}
	return t, nil
}
