package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Asks and promises between members that cannot reach each other (migration 0022).
//
// A member that activates a key asks the key's holder to let go of it over the cluster's
// connections (actors' Release). A holder it cannot reach, which the store names (Holders: a live
// registration, and the key's latest claim), is waited for: it may be running the key's turn.
// When the two are cut off from each other only, both still reach this database. So the waiting
// member records its ask here (ExchangeAsks), the holder finds the asks addressed to it in its
// own exchange, and, while it holds nothing of the key, promises its claim to the asker
// (Promise): the claim's owner becomes the asker's node, at the claim's epoch, and Holders,
// which names the owner of the key's latest claim, names the asker from then on. The asker's
// wait ends there, and so does its own activation's; the promiser's later activations find the
// asker named as the key's holder and wait for it to let go.

// askBack bounds how long the rows of asks nobody renewed are kept (an asker that died): they
// are no longer read after ExchangeAsks' within, and removed by any member's exchange after this.
const askBack = 24 * time.Hour

// Ask is another member's ask, recorded in the store, that this member let go of a key the store
// names it the holder of (ExchangeAsks).
type Ask struct {
	Key string
	// Epoch is the epoch of the key's claim the store names this member the holder of: the one
	// to promise (Promise).
	Epoch int64
	// Asker is the asking member's registration (its node is the name to promise the claim to).
	Asker Member
}

const (
	// dropAsksSQL removes the asks of member $2 of cluster $1 for keys not in $3.
	dropAsksSQL = `DELETE FROM release_asks WHERE cluster = $1 AND asker = $2 AND NOT (key = ANY($3))`
	// renewAsksSQL records (or renews) the asks of member $2 of cluster $1 for the keys of $3.
	renewAsksSQL = `INSERT INTO release_asks (cluster, key, asker) SELECT $1, k, $2 FROM unnest($3::text[]) AS k
		ON CONFLICT (cluster, key, asker) DO UPDATE SET asked_at = clock_timestamp()`
	// pruneAsksSQL removes the asks of cluster $1 nobody renewed for askBack ($2, seconds).
	pruneAsksSQL = `DELETE FROM release_asks WHERE cluster = $1 AND asked_at < clock_timestamp() - make_interval(secs => $2)`
)

// promiseSQL hands the claim of key $1 at epoch $2 over from node $4, its owner, to node $3;
// promised_by keeps the node that made the claim (a claim promised on again still names it).
// A claim already promised to $3 at that epoch counts as promised (the statement run again).
// It promises nothing while a live registration on the schema (of any cluster, each judged by
// its own ttl, or the caller's, $5, as liveMembersSQL) lacks ClaimsOnCondition: a member of a
// version whose claims carry no condition (before the conditional claim, or before every
// claim carried one) claims the key beside the asker when, as a third member, it took the
// promiser's word over the link that it holds nothing. In the statement itself, so that no
// such member's registration comes between a check and the promise. (A promise written
// already still counts as promised when such a member registered since: it stands.)
var promiseSQL = `UPDATE owners SET owner = $3,
		promised_by = CASE WHEN promised_by <> '' AND promised_epoch = epoch THEN promised_by ELSE $4 END,
		promised_epoch = epoch
	WHERE key = $1 AND epoch = $2
		AND (owner = $4 AND NOT EXISTS (SELECT 1 FROM members m WHERE NOT ('` + ClaimsOnCondition + `' = ANY(m.kinds))
				AND NOT ` + gone(ownTTL("m", "$5"), ownTTL("n", "$5")) + `)
			OR owner = $3 AND promised_by <> '' AND promised_epoch = epoch)`

// asksToSQL lists the asks of cluster $1 renewed within $3 seconds, by live members other than
// $2 (each judged by its own ttl, or the caller's, $4, as liveMembersSQL), for keys whose latest
// claim is node $2's, with the claim's epoch and the asker's registration (of two live ones of
// its node, the newer).
var asksToSQL = `SELECT DISTINCT ON (a.key, a.asker) a.key, o.epoch, m.id, m.host, m.port, m.kinds, m.leaving, m.node
	FROM release_asks a JOIN owners o ON o.key = a.key
		JOIN members m ON m.cluster = a.cluster AND m.node = a.asker
	WHERE a.cluster = $1 AND o.owner = $2 AND a.asker <> $2
		AND a.asked_at > clock_timestamp() - make_interval(secs => $3)
		AND NOT ` + gone(ownTTL("m", "$4"), ownTTL("n", "$4")) + `
	ORDER BY a.key, a.asker, m.joined_at DESC`

// ExchangeAsks records that node, a member of cluster, asks the holders of keys to let go of them
// (it waits for each, and cannot reach it), in place of the asks it recorded before, and returns
// the asks of the other live members of cluster (judged by their own ttl, or by ttl) for keys
// whose latest claim is node's, that their askers renewed within within. One round trip: a
// member calls it every few seconds, whether it asks anything or not, since only the store can
// tell it that another asks it.
func (s *Store) ExchangeAsks(ctx context.Context, cluster, node string, keys []string, within, ttl time.Duration) ([]Ask, error) {
	if node == "" {
		return nil, errors.New("exchange asks: node required")
	}
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("exchange asks: %w", err)
	}
	defer done()
	if keys == nil {
		keys = []string{}
	}
	var out []Ask
	// Every statement is idempotent: run again on a dead connection, it does the same.
	err = s.again(ctx, func(c *pgxpool.Conn) error {
		out = out[:0]
		b := &pgx.Batch{}
		b.Queue(dropAsksSQL, cluster, node, keys)
		b.Queue(renewAsksSQL, cluster, node, keys)
		b.Queue(pruneAsksSQL, cluster, askBack.Seconds())
		b.Queue(asksToSQL, cluster, node, within.Seconds(), ttl.Seconds())
		br := c.SendBatch(ctx, b)
		var err error
		for range 3 {
			if _, err = br.Exec(); err != nil {
				break
			}
		}
		if err == nil {
			var rows pgx.Rows
			if rows, err = br.Query(); err == nil {
				var a Ask
				_, err = pgx.ForEachRow(rows, []any{&a.Key, &a.Epoch, &a.Asker.ID, &a.Asker.Host, &a.Asker.Port,
					&a.Asker.Kinds, &a.Asker.Leaving, &a.Asker.Node}, func() error {
					a.Asker.Kinds = readKinds(a.Asker.Kinds)
					out = append(out, a)
					a = Ask{}
					return nil
				})
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("exchange asks: %w", s.explain(ctx, err))
	}
	return out, nil
}

// Promise hands the claim of key at epoch, node from's, over to node to (another member that
// asked for the key: ExchangeAsks), and reports whether it did: false when the key's latest
// claim is no longer from's at that epoch (another claim came since, or from promised it
// already), or while a live member registered on the store (of any cluster, judged by its own
// ttl, or by ttl) lacks ClaimsOnCondition: one of an older version, whose claims carry no
// condition, which may claim the key beside to (promiseSQL); the caller then waits, as it
// did before the promise. Holders names to from then on, until the key's next claim. The caller holds nothing
// of the key, and activates it next only after this returned (its lookup of the key's holder
// then names to, which it must ask). It runs after the daemon lock's fence, as Claim does.
// Idempotent: a promise run twice (again after a connection died, or by the caller once more
// after an error) changes nothing the first did not.
func (s *Store) Promise(ctx context.Context, key string, epoch int64, from, to string, ttl time.Duration) (bool, error) {
	switch {
	case key == "":
		return false, errors.New("promise: key required")
	case from == "" || to == "":
		return false, fmt.Errorf("promise %s: nodes required (from %q, to %q)", key, from, to)
	case from == to:
		return false, fmt.Errorf("promise %s: from and to are one node (%s)", key, from)
	}
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return false, fmt.Errorf("promise %s: %w", key, err)
	}
	defer done()
	fence, err := s.lockHeld()
	if err != nil {
		return false, fmt.Errorf("promise %s: %w", key, err)
	}
	var promised bool
	err = s.again(ctx, func(c *pgxpool.Conn) error {
		b := &pgx.Batch{}
		if fence != nil {
			b.Queue(fence.sql, fence.args...)
		}
		b.Queue(promiseSQL, key, epoch, to, from, ttl.Seconds()).Exec(func(ct pgconn.CommandTag) error {
			promised = ct.RowsAffected() == 1
			return nil
		})
		err := c.SendBatch(ctx, b).Close()
		if err != nil && fence != nil {
			err = describe(*fence, err)
		}
		return err
	})
	if err != nil {
		return false, markUnavailable(fmt.Errorf("promise %s: %w", key, s.explain(ctx, err)))
	}
	return promised, nil
}
