package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Member is one member of a cluster, as it registers itself (Store.Heartbeat).
type Member struct {
	ID    string
	Host  string
	Port  int
	Kinds []string
	// Leaving marks a member that stops: it drains its running turns and hands the rest of its
	// keys on, and it is still the member that owns its keys until its row is gone.
	Leaving bool
}

const (
	heartbeatSQL = `INSERT INTO members (cluster, id, host, port, kinds, leaving) VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (cluster, id) DO UPDATE SET host = excluded.host, port = excluded.port,
			kinds = excluded.kinds, leaving = excluded.leaving, heartbeat_at = clock_timestamp()`
	liveMembersSQL = `SELECT id, host, port, kinds, leaving FROM members
		WHERE cluster = $1 AND heartbeat_at > clock_timestamp() - make_interval(secs => $2)
		ORDER BY joined_at, id`
	// Rows long expired are removed by whichever member renews next; a member that comes back
	// after that registers anew (protoactor never readmits a member id it saw leave anyway).
	expireMembersSQL = `DELETE FROM members
		WHERE cluster = $1 AND heartbeat_at < clock_timestamp() - make_interval(secs => $2)`
	leaveSQL = `DELETE FROM members WHERE cluster = $1 AND id = $2`
)

// Heartbeat registers m as a live member of cluster (or renews its registration) and returns
// the members whose last heartbeat is younger than ttl, by the database's clock, m included,
// oldest member first. It is cluster mode's membership: every member calls it every fraction
// of ttl, and the list it returns is the cluster's topology. A leaving member (Member.Leaving)
// is listed, as leaving, for as long as it renews.
func (s *Store) Heartbeat(ctx context.Context, cluster string, m Member, ttl time.Duration) ([]Member, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("heartbeat: %w", err)
	}
	defer done()
	secs := ttl.Seconds()
	var live []Member
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		kinds := m.Kinds
		if kinds == nil {
			kinds = []string{} // the column is NOT NULL
		}
		b.Queue(heartbeatSQL, cluster, m.ID, m.Host, m.Port, kinds, m.Leaving)
		b.Queue(expireMembersSQL, cluster, 10*secs)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, liveMembersSQL, cluster, secs)
		if err != nil {
			return err
		}
		live, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Member, error) {
			var m Member
			return m, r.Scan(&m.ID, &m.Host, &m.Port, &m.Kinds, &m.Leaving)
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("heartbeat of %s in %s: %w", m.ID, cluster, s.explain(ctx, err))
	}
	return live, nil
}

// Leave removes a member's registration: the others see it gone at their next heartbeat.
func (s *Store) Leave(ctx context.Context, cluster, id string) error {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return fmt.Errorf("leave: %w", err)
	}
	defer done()
	if _, err := s.pool.Exec(ctx, leaveSQL, cluster, id); err != nil {
		return fmt.Errorf("leave %s: %w", cluster, s.explain(ctx, err))
	}
	return nil
}
