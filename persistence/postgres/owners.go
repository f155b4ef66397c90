package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// claimSQL claims key $1 for owner $2 at $3 and counts the death of the owner it replaces
// (migration 0009). The claim's row lock waits for the transactions that passed a fence of the
// key (their FOR SHARE lock, see agentgate_fence in migration 0003) and makes the fences that
// follow wait for it; owners.owner in DO UPDATE is the row as locked, so of two claims at once
// the second replaces the first's owner, which is alive: a death is counted once. The count
// adds 1 to attempts of the routed session's head pending message, as BeginRun does (the
// session that loads next quarantines it at QuarantineAfter). A death whose owner last renewed
// before the server started (sinceServerStart), or that an outage explains (noSelfStopNear),
// is not counted. Nor is that of a claim's owner that the member that made it promised it to
// (Promise, migration 0022): no member ran the key under the promised claim, and its maker let
// go of the key before it promised; previous is then empty. A claim on a condition ($4, $5: the
// epoch and owner the claimer saw, $4 NULL for none; epoch 0 for a key never claimed) inserts
// or updates no row when the key's latest claim is another (the update's WHERE reads the row as
// locked, after any claim or promise that went before it: a promise changes the owner at the
// claim's epoch), and the statement returns no row. (Its insert is tried when the key has a
// row, to reach the update; a key without one, seen claimed, gets none: claims are never
// deleted.)
var claimSQL = `WITH claimed AS (
		INSERT INTO owners (key, epoch, owner, claimed_at) SELECT $1, 1, $2, $3
			WHERE $4::bigint IS NULL OR $4 = 0 OR EXISTS (SELECT 1 FROM owners WHERE key = $1)
		ON CONFLICT (key) DO UPDATE SET epoch = owners.epoch + 1,
			previous = CASE WHEN owners.promised_by <> '' AND owners.promised_epoch = owners.epoch
				THEN '' ELSE owners.owner END,
			owner = excluded.owner, claimed_at = excluded.claimed_at
			WHERE $4::bigint IS NULL OR (owners.epoch = $4 AND owners.owner = $5::text)
		RETURNING epoch, previous
	), counted AS (
		UPDATE messages h SET attempts = h.attempts + 1
		FROM claimed c, routing r
		WHERE c.previous <> '' AND c.previous <> $2
			AND EXISTS (SELECT 1 FROM members m WHERE m.node = c.previous
				AND ` + gone("NULLIF(m.ttl_secs, 0)", "NULLIF(n.ttl_secs, 0)") + `
				AND ` + sinceServerStart + ` AND ` + noSelfStopNear + `)
			AND r.key = $1 AND h.session_id = r.session_id
			AND h.role = 'user' AND h.status = 'pending' AND h.active
			AND h.seq = (SELECT MIN(p.seq) FROM messages p WHERE p.session_id = r.session_id
				AND p.role = 'user' AND p.status = 'pending' AND p.active)
		RETURNING h.session_id, h.message_id, h.attempts
	)
	SELECT c.epoch, c.previous, k.session_id, k.message_id, k.attempts
	FROM claimed c LEFT JOIN counted k ON true`

// sinceServerStart is true of a member row m that renewed since the database server last
// started. A member that did not may have died of the outage the restart was (every member
// stops itself after member_ttl without a renewal, and a process supervisor starts it again
// once the database is back), not of the message it ran: such a death is not counted.
// Otherwise an outage longer than member_ttl counted a death against the head of every key
// claimed after it, and three of them quarantined a message that had killed nothing (an
// audit's finding).
//
// It does not under-count a poison message's deaths in any common case. A member that a
// message kills renewed within member_ttl/3 of its death, and the key's next claim follows the
// death within about member_ttl (its registration expires, the others' next renewal sees it,
// and their recovery claims the keys with pending work; sooner when it is restarted on its
// port): the death goes uncounted only when the server restarts within that window, by
// coincidence, or when it restarts before the key's next claim because no member is left
// to make one (an operator who restarts the database while the whole cluster is down). A
// member that lives through a restart renews after it, and its later deaths count as ever.
// What it does not see is an outage that is no restart of this server: a failover to a standby
// started before the members' last renewals, a network cut between the members and the
// database, a server too slow to answer, or a crash of one of its backends (the postmaster
// reinitializes without starting again). noSelfStopNear sees those. Both times are the
// server's clock (heartbeat_at is its clock_timestamp()).
const sinceServerStart = `m.heartbeat_at > pg_postmaster_start_time()`

// noSelfStopNear is true of a member row m unless m, or a member of its cluster that last
// renewed within half m's member_ttl of m's last renewal, stopped itself (members.self_stopped,
// migration 0016: its renewals failed for member_ttl, and the next member started on its data
// directory recorded so). An outage of the database longer than member_ttl, of whatever kind,
// stops every member that cannot renew: each renews every member_ttl/3, so their last
// renewals fall within that of each other, before its start, and the first of them to start
// again records its predecessor before it claims any key; a claim of the others' keys sees
// the outage even before their own successors record them. A member killed by a message (or
// by anything else: kill -9, the OOM killer) leaves no such note, and its death counts.
//
// It sees an outage only through a member restarted on the data directory of one that
// stopped itself (a systemd unit, a pod's container restarted with its volume): members whose
// restarts get a fresh data directory each time record nothing, and their deaths of such an
// outage count, as before. It under-counts a poison message's death when another member
// stopped itself within half a member_ttl of it: by coincidence, or because the message
// starved it too (two members on one host, one made to swap by the other's message) without
// its renewals running late enough to show it (see storeMembership.lose in supervisor).
const noSelfStopNear = `NOT EXISTS (SELECT 1 FROM members o WHERE o.cluster = m.cluster AND o.self_stopped
				AND (o.id = m.id OR o.heartbeat_at BETWEEN m.heartbeat_at - make_interval(secs => m.ttl_secs / 2)
					AND m.heartbeat_at + make_interval(secs => m.ttl_secs / 2)))`

const (
	ownershipSQL = `SELECT key, epoch, owner, claimed_at FROM owners WHERE key = $1`
	// refusedSQL reads key $1's latest claim for a refused claim's error: its epoch, owner, and
	// the node that promised it to its owner (Promise; empty for a claim its owner made).
	refusedSQL = `SELECT epoch, owner, CASE WHEN promised_by <> '' AND promised_epoch = epoch THEN promised_by ELSE '' END
		FROM owners WHERE key = $1`
	fenceSQL = `SELECT agentgate_fence($1, $2)`
	// fencedCode is the SQLSTATE agentgate_fence raises.
	fencedCode = "AG001"
	// daemonFenceSQL fails a commit of an exclusive store whose daemon lock another process has
	// taken since (migration 0006), with daemonFencedCode: of the epoch ($1) and, for a store
	// that raised it, of its raise's id ($2; NULL for a cluster member), which a restore of the
	// database may leave with the same epoch under another daemon's raise (migration 0021).
	daemonFenceSQL   = `SELECT agentgate_daemon_fence($1, $2)`
	daemonFencedCode = "AG002"
)

// Claim implements persistence.Store. It is one statement in a transaction of its own, after
// the daemon lock's fence (agentgate_daemon_fence) as a commit has it: a member whose hold of
// the lock is gone, and the epoch raised since (by a single daemon that took the lock, or by
// the first member after one), claims nothing, even before it has noticed. Before, its claim
// went through: it fenced the activation of the key's live owner (a member that took the lock
// after the raise), and it counted the death of the key's previous owner against the head
// pending message of a session that another process ran, a strike toward quarantine for a
// message that had killed nothing (TestStaleLockHolderClaimsNothing). Its condition (seen) is
// part of the one statement: no round trip more.
func (s *Store) Claim(ctx context.Context, key, owner string, at time.Time, seen *persistence.ClaimSeen) (persistence.Claimed, error) {
	var c persistence.Claimed
	if key == "" {
		return c, errors.New("claim: key required")
	}
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return c, fmt.Errorf("claim %s: %w", key, err)
	}
	defer done()
	fence, err := s.lockHeld()
	if err != nil {
		return c, fmt.Errorf("claim %s: %w", key, err)
	}
	var sessionID, messageID *string
	var attempts *int
	// One batch is one implicit transaction: the fence's share lock of the epoch holds until
	// the claim ends, so a raise of the epoch waits for it, and a claim after a raise fails.
	b := &pgx.Batch{}
	if fence != nil {
		b.Queue(fence.sql, fence.args...)
	}
	var seenEpoch *int64
	var seenOwner string
	if seen != nil {
		seenEpoch, seenOwner = &seen.Epoch, seen.Owner
	}
	changed := false
	b.Queue(claimSQL, key, owner, timeArg(at), seenEpoch, seenOwner).QueryRow(func(r pgx.Row) error {
		err := r.Scan(&c.Epoch, &c.Previous, &sessionID, &messageID, &attempts)
		if errors.Is(err, pgx.ErrNoRows) && seen != nil {
			changed = true // (the batch's other statements ran: its error is the fence's, if any)
			return nil
		}
		return err
	})
	// Not run again on a dead connection: the claim raises the key's epoch, and one whose
	// connection broke may have been committed. The pool pings the connection it hands out
	// for it instead (a round trip; a session ended after the ping still fails the claim).
	if err := s.pool.SendBatch(pinged(ctx), b).Close(); err != nil {
		if fence != nil {
			err = describe(*fence, err)
		}
		return persistence.Claimed{}, markUnavailable(fmt.Errorf("claim %s: %w", key, s.explain(ctx, err)))
	}
	if changed {
		// The claim that came since, for the line that says the claim was refused (a round
		// trip on a refusal only; the SQLite store names it too): without it, the line said
		// only what this member saw, not who claimed the key (TestConformance/ConditionalClaim).
		// It names whether the claim was promised to its owner (Promise): a claim promised to
		// this member is not its own claim whose answer was lost
		// (TestConditionalClaimRefusalNamesAPromise). Read after the refusal, it is the key's
		// latest claim by then: one that came since the claim seen (epochs only rise, and a
		// promise changes the owner at its claim's epoch), if not always the one that refused.
		refused := &persistence.ClaimChangedError{Key: key, Seen: *seen}
		var latest persistence.ClaimSeen
		var promisedBy string
		// (No row: the key was never claimed, the zero ClaimSeen, as SQLite's says.)
		if err := s.pool.QueryRow(ctx, refusedSQL, key).Scan(&latest.Epoch, &latest.Owner, &promisedBy); err == nil || errors.Is(err, pgx.ErrNoRows) {
			refused.Latest, refused.PromisedBy = &latest, promisedBy
		}
		return persistence.Claimed{}, refused
	}
	if sessionID != nil {
		c.Counted = &persistence.CountedMessage{Key: key, SessionID: *sessionID, MessageID: *messageID, Attempts: *attempts}
	}
	return c, nil
}

// Ownership implements persistence.Store.
func (s *Store) Ownership(ctx context.Context, key string) (*persistence.Ownership, error) {
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return nil, fmt.Errorf("ownership of %s: %w", key, err)
	}
	defer done()
	var o persistence.Ownership
	err = s.again(ctx, func(c *pgxpool.Conn) error {
		return c.QueryRow(ctx, ownershipSQL, key).Scan(&o.Key, &o.Epoch, &o.Owner, nanoTime{&o.ClaimedAt})
	})
	if errors.Is(err, pgx.ErrNoRows) {
		err = persistence.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("ownership of %s: %w", key, s.explain(ctx, err))
	}
	return &o, nil
}
