package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A commit whose connection is lost once its COMMIT was sent does not know its outcome: the
// server may have committed it and the answer was lost on its way, or ended the session before
// it committed (an administrator's pg_terminate_backend, a crash), or never got the COMMIT.
// The server keeps each transaction's fate by its id (pg_xact_status, PostgreSQL 13), which
// the commit's pipelined batch reads at its end, before COMMIT is sent (xactSQL: no round trip
// more). Commit then asks the server for it on another connection (xactFate): committed, the
// call succeeds as if the answer had come; aborted, nothing was written and it runs once more
// (commitTxs); anything else leaves it unknown, and it fails with ErrUnavailable as before (a
// daemon spools and replays its writes, whose counters may then count twice). A transaction
// that has no id when its batch ends wrote nothing (no row, no row lock): the server answered
// every statement before the id, so the call knows all it would know, and its COMMIT had
// nothing to apply: it succeeds without asking (lostFate). Before, it failed with
// ErrUnavailable (TestLostCommitAnswerOfATransactionThatWroteNothingIsTaken). A commit of a
// store that holds the daemon lock always has an id: the lock's fence reads its row FOR SHARE.
//
// A transaction id is the server's own: one the server assigned but lost with its WAL (a
// crash before the transaction's WAL reached the disk) or that a promoted standby never saw (a
// failover) may be given to another transaction since, whose fate pg_xact_status would report.
// Neither happens to a transaction that committed on the server that is asked, so "aborted"
// always means not written there; "committed" is taken only from the server that ran the
// transaction in the same run (serverRun, read with the id). A crash of one of the server's
// processes (the OOM killer's, a segfault) ends every session and recovers from the WAL
// without a restart of the postmaster, whose pg_postmaster_start_time stays: the run is told by
// the reset time of the server's shared statistics too, which such a recovery resets
// (pg_stat_get_bgwriter_stat_reset_time; a reset by an administrator, pg_stat_reset_shared,
// leaves a fate unknown, which is safe). Before, the start time alone told it, and a commit that
// a crash lost was taken as applied when the recovered server had given its id to another
// transaction that committed (TestLostCommitAnswerOfATransactionACrashLost). The statistics
// are in shared memory from PostgreSQL 15, and cheap to read; before, reading them reads the
// statistics collector's file, which a commit does not afford.

const (
	// xactSQL ends a commit's batch: the id of its transaction, NULL when it has none (it
	// wrote nothing yet: its COMMIT has nothing to apply, and a replay no counter to count
	// twice), and the run of the server that runs it (serverRun).
	xactSQL = `SELECT pg_current_xact_id_if_assigned()::text, ` + serverRunSQL
	// xactStatusSQL asks for a transaction's fate: 'committed', 'aborted', 'in progress', or
	// NULL when the server no longer keeps it; the server's run; and whether it has synchronous
	// standbys, whose commits confirmSQL confirms.
	xactStatusSQL = `SELECT pg_xact_status($1::text::xid8), ` + serverRunSQL +
		`, current_setting('synchronous_standby_names') <> ''`
	// confirmSQL is the one statement of a transaction that confirms a committed one on the
	// synchronous standbys (xactFate): it writes WAL, a transactional logical message that no
	// table holds, so its COMMIT waits for them as any commit that writes does (one that only
	// takes an id, pg_current_xact_id(), writes no WAL, and its COMMIT does not wait).
	confirmSQL = `SELECT pg_logical_emit_message(true, 'agentgate', '')`
	// serverRunSQL reads a serverRun.
	serverRunSQL = `pg_postmaster_start_time(), pg_stat_get_bgwriter_stat_reset_time()`
)

// xactAsks bounds how many times xactFate asks for a transaction the server still runs whose
// connection was lost: a session that died while committing, whose end the server has not
// finished yet. xactWait is the wait before the second ask, doubled before each next one (0.31
// s in all), up to xactWaitMax. A transaction whose COMMIT went unanswered in time is asked for
// until the call's time ends (awaited): its session lives, and may be committing yet.
const (
	xactAsks    = 6
	xactWait    = 10 * time.Millisecond
	xactWaitMax = 250 * time.Millisecond
)

// xact is a transaction of a commit, as its batch read it (xactSQL).
type xact struct {
	read   bool        // xactSQL was read (a server that keeps transactions' fates: knowsXacts)
	id     pgtype.Text // NULL when the transaction has no id (it wrote nothing)
	server serverRun   // of the server that ran it
}

// serverRun tells a run of a server, whose transaction ids are its own: the start of its
// postmaster, and the reset time of its shared statistics, which a recovery from a crash of
// one of its processes resets while the postmaster runs on.
type serverRun struct {
	start, statsReset pgtype.Timestamptz
}

// same reports whether r and o are known and the same run.
func (r serverRun) same(o serverRun) bool {
	return r.start.Valid && r.statsReset.Valid && o.start.Valid && o.statsReset.Valid &&
		r.start.Time.Equal(o.start.Time) && r.statsReset.Time.Equal(o.statsReset.Time)
}

// fate is what the server's record tells of a transaction whose COMMIT's answer was lost.
type fate int

const (
	fateUnknown fate = iota
	fateCommitted
	fateAborted
	fateEmpty // it wrote nothing: committed or not, nothing of it is stored
)

// knowsXacts reports whether a server of version (its server_version, which it reports at a
// connection's start: no round trip) has pg_current_xact_id_if_assigned and pg_xact_status
// (PostgreSQL 13 or later), and its shared statistics in shared memory (15 or later), which
// tell its run (serverRun). On an older server a commit whose answer is lost stays unknown.
func knowsXacts(version string) bool {
	n := 0 // "15.5 (Debian 15.5-1.pgdg120+1)", "16beta1", "9.6.24"
	for n < len(version) && version[n] >= '0' && version[n] <= '9' {
		n++
	}
	major, err := strconv.Atoi(version[:n])
	return err == nil && major >= 15
}

// queueXact queues xactSQL on b, for readXact.
func queueXact(b *pgx.Batch) { b.Queue(xactSQL) }

// readXact reads the answer of an xactSQL (a batch's QueryRow, or a transaction's) into x.
func readXact(row pgx.Row, x *xact) error {
	if err := row.Scan(&x.id, &x.server.start, &x.server.statsReset); err != nil {
		return fmt.Errorf("read the transaction's id: %w", err)
	}
	x.read = true
	return nil
}

// lostFate tells the fate of x, read (readXact), whose COMMIT's answer was lost: fateEmpty when
// it has no id, which nothing need ask; else the server's record of it (xactFate, which awaits
// it when await is set).
func (s *Store) lostFate(ctx context.Context, x xact, await bool) (f fate, why string) {
	if !x.id.Valid {
		return fateEmpty, ""
	}
	return s.xactFate(ctx, x, await)
}

// xactFate asks the server, on another connection of the pool (one it pings first: the server
// may have ended them all), for the fate of x, whose COMMIT's answer was lost. It asks again
// while the server still runs x, within ctx: xactAsks times at most, or, when await is set,
// until ctx ends. why says what left the fate unknown. On a server with synchronous standbys,
// x found committed is confirmed on them first (confirm), within ctx; unconfirmed, its fate
// is unknown.
//
// await is for a COMMIT that went unanswered in time (unansweredCommit, timedOut): its
// connection was still open, and the server may still be committing it, for as long as its
// WAL takes to reach a slow disk, or its synchronous standby (pgx's cancel request, as it
// closes the connection, ends the latter wait, not the former). The transaction holds its
// row locks meanwhile: a replay of its writes waits for them, and applies them a second time
// once it commits. Before, it was given up after xactAsks asks (0.31 s), and its writes were
// spooled and replayed, their counters counting twice
// (TestUnansweredCommitStillInProgressIsAwaited).
func (s *Store) xactFate(ctx context.Context, x xact, await bool) (f fate, why string) {
	wait := xactWait
	for ask := 1; ; ask++ {
		var status pgtype.Text
		var server serverRun
		var standbys bool
		var unconfirmed error // the confirmation's error, of a committed x (confirm)
		_, err := s.attempt(ctx, true, func(c *pgxpool.Conn) error {
			unconfirmed = nil
			if err := c.QueryRow(ctx, xactStatusSQL, x.id.String).Scan(&status, &server.start, &server.statsReset, &standbys); err != nil {
				return err
			}
			if standbys && status.String == "committed" && server.same(x.server) {
				unconfirmed = confirm(ctx, c)
			}
			return nil
		})
		if s.asked != nil { // a test's: the answer, or why there is none
			switch {
			case err != nil:
				s.asked("error: " + err.Error())
			case !status.Valid:
				s.asked("null")
			case unconfirmed != nil:
				s.asked(status.String + ", unconfirmed: " + unconfirmed.Error())
			default:
				s.asked(status.String)
			}
		}
		switch {
		case err != nil:
			return fateUnknown, fmt.Sprintf("the server could not be asked: %v", err)
		case !status.Valid:
			return fateUnknown, "the server keeps no record of it"
		case status.String == "aborted":
			return fateAborted, ""
		case status.String == "committed" && server.same(x.server) && unconfirmed != nil:
			return fateUnknown, fmt.Sprintf("the server committed it, but it was not confirmed on the synchronous standbys "+
				"(synchronous_standby_names): %v", unconfirmed)
		case status.String == "committed" && server.same(x.server):
			return fateCommitted, ""
		case status.String == "committed":
			return fateUnknown, "the server restarted, recovered from a crash or changed since (a failover): " +
				"its record of the transaction's id may be another transaction's"
		case status.String != "in progress":
			return fateUnknown, fmt.Sprintf("the server answered %q", status.String)
		case ask == xactAsks && !await:
			return fateUnknown, fmt.Sprintf("the server still ran it at each of %d asks", ask)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fateUnknown, "the call's time ran out while the server still ran it"
		case <-t.C:
		}
		wait = min(2*wait, xactWaitMax)
	}
}

// confirm runs confirmSQL's transaction on c, the connection that found a transaction
// committed, so on the same server, and returns its error (nil: confirmed). Its commit record
// follows the other's in the WAL, and its COMMIT is answered only once the synchronous
// standbys have it, as synchronous_commit asks: so they have the other's too. No answer
// within ctx leaves the other unconfirmed. A commit found so may never have reached them: the
// cancel request pgx sends as it closes a connection whose context ended (a COMMIT unanswered
// in time) ends a COMMIT's wait for them, and the server then commits it on its own
// (PostgreSQL's "canceling wait for synchronous replication"), as a session ended while it
// waits does; and the server marks a transaction committed before that wait, so
// pg_xact_status says "committed" during it. Before, such a commit was taken as stored, and a
// failover before the standby had it lost writes acknowledged as stored
// (TestSettledCommitIsConfirmedOnTheSynchronousStandbys).
func confirm(ctx context.Context, c *pgxpool.Conn) error {
	return pgx.BeginTxFunc(ctx, c, pgx.TxOptions{}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, confirmSQL)
		return err
	})
}

// fateBound returns the bound within which the fate of a transaction whose connection broke
// once its COMMIT was sent is asked (lostCommit, inTxSettled): Options.Timeout of its own,
// within outer, the caller's context, as for one whose COMMIT went unanswered in time
// (unansweredCommit, timedOut). The call's own bound may be all but spent when the connection
// breaks: the server ends a session idle in its transaction after Options.Timeout
// (endSilentTransactions), so a COMMIT lost on its way is cut by the server just as the call's
// bound runs out, and on a loaded host the server's end can come first. The ask then ran on
// the call's context, which ended before it could be sent ("context deadline exceeded"): the
// fate stayed unknown and the writes failed as unavailable, to be spooled and replayed, when
// the server, asked, would have told that it aborted (or committed) them
// (TestLostCommitAnswerAsTheCallsBoundRunsOutIsAsked; TestUnansweredCommitOfABatchIsSettled/
// never_reached_the_server failed so beside CPU load).
func (s *Store) fateBound(outer context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(outer, s.timeout, s.noAnswer)
}

// inTxSettled is inTx for a transaction of the store's own whose caller must not be told it
// failed when it committed: BeginRun, whose record of the run its caller writes again until it
// is taken (a second record counted an unclean stop of the run itself: a strike against each
// head pending message it had begun, or had not counted yet), and Pardon, whose CLI said it
// failed. After f the transaction reads its id (xactSQL: one round trip more, on a server that
// keeps transactions' fates), and a connection lost once its COMMIT was sent is settled as a
// commit's is (lostFate): committed, or with no id (it wrote nothing), it succeeds; aborted,
// it runs once more, within inTx's one run more per call; unknown, it fails with the COMMIT's
// error, as before. call names it in the logs. The store's other transactions (PullBack, a
// prune step, a heartbeat) keep inTx: run again, each changes nothing more, and their callers
// try again anyway (docs/ARCHITECTURE.md).
//
// ctx is the call's (enter), outer its caller's. A COMMIT whose answer does not come within
// the call's bound (the server slow to make it durable, a network that holds the answer: ctx
// ends with s.noAnswer while outer runs on) leaves the same unknown, and is settled on the
// same record (timedOut). Before, it failed at once with ErrUnavailable, and BeginRun's
// caller wrote its record again, counting an unclean stop of its own run when the first had
// committed (TestUnansweredCommitOfTheStoresOwnTransactionIsSettled).
func (s *Store) inTxSettled(ctx, outer context.Context, call string, f func(tx pgx.Tx) error) error {
	var (
		sent bool
		x    xact
	)
	run := func(c *pgxpool.Conn) error {
		sent, x = false, xact{}
		knows := knowsXacts(c.Conn().PgConn().ParameterStatus("server_version"))
		return pgx.BeginTxFunc(ctx, c, pgx.TxOptions{}, func(tx pgx.Tx) error {
			if err := f(tx); err != nil {
				return err
			}
			if knows {
				if err := readXact(tx.QueryRow(ctx, xactSQL), &x); err != nil {
					return err
				}
			}
			sent = true // BeginTxFunc commits next
			return nil
		})
	}
	for retried := false; ; retried = true {
		dead, err := s.attempt(ctx, retried, run)
		if err != nil && sent && x.read && errors.Is(context.Cause(ctx), s.noAnswer) && outer.Err() == nil {
			return s.timedOut(outer, call, x, err)
		}
		switch {
		case !dead || err == nil:
			return err
		case !sent: // the server commits nothing without a COMMIT
			if retried {
				return err
			}
			continue
		case !x.read:
			return err
		}
		if s.lost != nil {
			s.lost(ctx)
		}
		fctx, cancel := s.fateBound(outer)
		fate, why := s.lostFate(fctx, x, false)
		cancel()
		switch {
		case fate == fateCommitted || fate == fateEmpty:
			s.log.Info("a transaction's connection was lost after its COMMIT was sent; the server committed it, or it wrote nothing, so it succeeds",
				"call", call, "xid", x.id.String, logging.Err(err))
			return nil
		case fate == fateAborted && !retried:
			s.log.Warn("a transaction's connection was lost after its COMMIT was sent; the server aborted it, so nothing was written and it runs again",
				"call", call, "xid", x.id.String, logging.Err(err))
			continue
		case fate == fateAborted:
			why = "the server aborted it on its second run too"
		}
		s.log.Warn("a transaction's connection was lost after its COMMIT was sent; it fails as unavailable",
			"call", call, "xid", x.id.String, "why", why, logging.Err(err))
		return err
	}
}

// timedOut settles x, a transaction of inTxSettled whose COMMIT was sent and whose call's bound
// ran out before its answer came (err), by the server's record of it (lostFate), asked on a
// fresh connection within a bound of its own (Options.Timeout again, within outer: the call's
// is spent), awaiting one the server still runs until that bound ends (xactFate). Committed,
// or with no id, the call succeeds. Aborted, nothing was written, but
// the call is not run again, its time being spent: it fails with err, and its caller's next
// try counts nothing twice. Unknown, it fails with err, as before.
func (s *Store) timedOut(outer context.Context, call string, x xact, err error) error {
	ctx, cancel := context.WithTimeoutCause(outer, s.timeout, s.noAnswer)
	defer cancel()
	fate, why := s.lostFate(ctx, x, true)
	switch fate {
	case fateCommitted, fateEmpty:
		s.log.Info("a transaction's COMMIT was not answered within the call's time; the server committed it, or it wrote nothing, so it succeeds",
			"call", call, "xid", x.id.String, logging.Err(err))
		return nil
	case fateAborted:
		why = "the server aborted it: nothing was written, and the call's time is spent"
	}
	s.log.Warn("a transaction's COMMIT was not answered within the call's time; it fails as unavailable",
		"call", call, "xid", x.id.String, "why", why, logging.Err(err))
	return err
}
