package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/internal/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Column lists, in the order the scan functions and the INSERTs use them.
const (
	sessionCols = sqlstore.SessionCols
	messageCols = sqlstore.MessageCols
	outboxCols  = sqlstore.OutboxCols
)

// The write statements. pgx prepares each once per connection (its statement cache).
const (
	createSessionSQL = `INSERT INTO sessions (` + sessionCols + `)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22)
		ON CONFLICT (id) DO NOTHING`
	endSessionSQL = `UPDATE sessions SET ended_at = $1, end_reason = $2, reset_due_at = NULL, reset_due_reason = ''
		WHERE id = $3 AND ended_at IS NULL`
	reopenSessionSQL = `UPDATE sessions SET ended_at = NULL, end_reason = '' WHERE id = $1`
	markResetDueSQL  = `UPDATE sessions SET reset_due_at = $1, reset_due_reason = $2
		WHERE id = $3 AND ended_at IS NULL AND reset_due_reason = ''`
	touchSessionSQL = `UPDATE sessions SET last_activity_at = GREATEST(COALESCE(last_activity_at, 0), $1)
		WHERE id = $2`
	setTitleSQL     = `UPDATE sessions SET title = $1 WHERE id = $2`
	setQueueModeSQL = `UPDATE sessions SET queue_mode = $1 WHERE id = $2`
	// No conflict target: a row at the same (session_id, seq) and a user row with the same
	// platform identity (messages_inbound) both make it a no-op, told apart by verifyMessage.
	insertMessageSQL = `INSERT INTO messages (` + messageCols + `)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
		ON CONFLICT DO NOTHING`
	messageAtSQL = `SELECT content, message_id FROM messages WHERE session_id = $1 AND seq = $2`
	inboundAtSQL = `SELECT session_id, seq FROM messages
		WHERE platform = $1 AND chat_id = $2 AND message_id = $3 AND role = 'user' AND message_id <> ''`
	setStatusSQL = `UPDATE messages SET status = $1, turn_id = CASE WHEN $2::text <> '' THEN $2::text ELSE turn_id END
		WHERE session_id = $3 AND seq = $4`
	incAttemptsSQL   = `UPDATE messages SET attempts = attempts + 1 WHERE session_id = $1 AND seq = $2`
	setAttemptsSQL   = `UPDATE messages SET attempts = GREATEST(attempts, $1) WHERE session_id = $2 AND seq = $3`
	archiveSQL       = `UPDATE messages SET active = FALSE, archived = TRUE WHERE session_id = $1 AND seq = $2`
	markProbationSQL = `UPDATE messages SET probation_run = $1 WHERE session_id = $2 AND seq = $3`
	requeueSQL       = `UPDATE messages SET seq = $1, status = 'pending', attempts = 0, probation_run = ''
		WHERE session_id = $2 AND seq = $3 AND role = 'user' AND status = 'quarantined'`
	putRouteSQL = `INSERT INTO routing (key, session_id, generation, updated_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT (key) DO UPDATE SET session_id = excluded.session_id,
			generation = excluded.generation, updated_at = excluded.updated_at
		WHERE excluded.generation > routing.generation`
	addOutboxSQL = `INSERT INTO outbox (` + outboxCols + `)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
		ON CONFLICT (session_key, seq) DO NOTHING`
	// Delivered is final: a late failure report or a re-sent mark does not undo it. The
	// attempts keep the larger count, so a mark applied again counts its attempt once; a mark
	// without a number (0: spooled by an older binary) counts one more, as it always did. A
	// pending mark only counts (a stop's, of a reply it leaves to send): a failed entry stays so.
	markDeliverySQL = `UPDATE outbox SET state = CASE WHEN $1::text = 'pending' THEN state ELSE $1::text END,
			delivered_at = CASE WHEN $1::text = 'delivered' THEN $2::bigint ELSE delivered_at END,
			attempts = CASE WHEN $5::integer > 0 THEN GREATEST(attempts, $5::integer) ELSE attempts + 1 END
		WHERE session_key = $3 AND seq = $4 AND state <> 'delivered'`
	// A turn's usage is recorded once; only a first recording adds to its session.
	addUsageSQL = `WITH recorded AS (
			INSERT INTO turn_usage (session_id, turn_id, input_tokens, output_tokens)
			VALUES ($1, $2, $3, $4) ON CONFLICT (session_id, turn_id) DO NOTHING RETURNING 1)
		UPDATE sessions SET input_tokens = input_tokens + $3, output_tokens = output_tokens + $4
		WHERE id = $1 AND EXISTS (SELECT 1 FROM recorded)`
)

// Draft records.
const (
	openDraftSQL = `INSERT INTO drafts (` + sqlstore.DraftCols + `) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (platform, id) DO NOTHING`
	closeDraftSQL = `DELETE FROM drafts WHERE platform = $1 AND id = $2`
)

// Unread places.
const (
	markUnreadSQL = `INSERT INTO unread (` + sqlstore.UnreadCols + `) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (platform, chat_id) DO UPDATE SET scope_id = excluded.scope_id, after_id = excluded.after_id,
			created_at = excluded.created_at`
	clearUnreadSQL = `DELETE FROM unread WHERE platform = $1 AND chat_id = $2 AND ($3 = '' OR after_id = $3)`
	// clearUnreadHeldSQL is clearUnreadSQL of a store that took the platform's gateway lease
	// ($4, with epoch $5): it deletes nothing once another process has taken the lease since.
	clearUnreadHeldSQL = clearUnreadSQL + ` AND agentgate_lease_held($4, $5)`
)

// stmt is one statement of a group. msg is set for a message INSERT: when it inserts nothing,
// verifyMessage tells a re-sent row (fine) from a duplicate or a conflict (the group fails).
type stmt struct {
	sql  string
	args []any
	msg  *persistence.Message
	// raised, of the daemon lock's fence (Store.lockHeld), is the raise of its store's last
	// (Store.raised), which tells a refusal of its own retake from another daemon's (describe).
	raised *atomic.Pointer[ownRaise]
}

// Commit applies groups of writes in one transaction. Each group is atomic: a failing group is
// rolled back and reported in errs[i] while the others go on. If the transaction itself fails
// (BEGIN, COMMIT, a lost connection, a group the server cannot take), every group gets that
// error but one the savepoint pass had already refused, which keeps its own.
//
// The batch first runs as one pipelined pgx.Batch with no savepoints. An op that is invalid on
// its face fails its group before anything is sent. A group that fails in the database rolls
// the transaction back, and the batch runs again with each group inside its own SAVEPOINT.
func (s *Store) Commit(ctx context.Context, groups [][]persistence.Op) (errs []error) {
	errs = make([]error, len(groups))
	defer sqlstore.MarkUnavailable(errs, IsUnavailable)
	outer := ctx
	ctx, done, err := s.enter(ctx)
	if err != nil {
		return sqlstore.Fill(errs, fmt.Errorf("commit: %w", err))
	}
	defer done()
	if len(groups) == 0 {
		return errs
	}
	fence, err := s.lockHeld()
	if err != nil {
		return sqlstore.Fill(errs, fmt.Errorf("commit: %w", err))
	}
	s.commits <- struct{}{}
	defer func() { <-s.commits }()

	stmts := make([][]stmt, len(groups))
	for i, g := range groups {
		st, err := groupStmts(g, s.leaseEpoch)
		if err != nil {
			errs[i] = fmt.Errorf("commit: group %d: %w", i, err)
			continue
		}
		stmts[i] = st
	}
	valid := make([]int, 0, len(groups))
	for i := range groups {
		if errs[i] == nil && len(stmts[i]) > 0 {
			valid = append(valid, i)
		}
	}
	if len(valid) == 0 {
		return errs
	}
	// A commit settled on the server's record once the call's bound ran out (unansweredCommit)
	// is explained as one answered in time: the errors left are its groups' own (refused for
	// what they hold, or invalid on their face), not the bound's. Before, each was told that
	// the database did not answer, wrapping ErrUnavailable, and the persistence actor spooled
	// it and told its sender it was stored (TestUnansweredCommitKeepsItsGroupsRefusals).
	if s.commitTxs(ctx, outer, fence, stmts, valid, errs) {
		ctx = outer
	}
	for i, err := range errs {
		errs[i] = s.explain(ctx, err)
	}
	return errs
}

// commitTxs runs the valid groups in a transaction without savepoints and, when one of them
// failed for what it holds, again in one with a savepoint per group (commitTx). A transaction
// whose connection was dead before its COMMIT was sent (the server ended the session while the
// connection was idle in the pool, or it broke) committed nothing, and runs once more, on a
// connection the pool pings first (attempt); once per Commit. A connection that breaks once
// COMMIT is sent leaves the transaction's fate unknown, and the server's record of it tells it
// (xactFate, xact.go): committed, its groups succeed as if the answer had come
// (TestLostCommitAnswerOfACommittedTransactionIsTaken), as they do, unasked, when the
// transaction had no id (it wrote nothing: TestLostCommitAnswerOfATransactionThatWroteNothingIsTaken);
// aborted, nothing was written, and it runs once more as one dead before its COMMIT does,
// within the same once per Commit (TestLostCommitAnswerOfAnAbortedTransactionRunsAgain). Otherwise (an older server, no record,
// the server unreachable, or still running it: TestLostCommitAnswerOfATransactionInProgress) it
// is not run again here: its groups fail with ErrUnavailable, and the persistence actor spools
// them and replays them, which every op bears (each is idempotent but the counters:
// docs/ARCHITECTURE.md).
//
// ctx is the call's (enter), outer its caller's. A COMMIT whose answer does not come within the
// call's bound (ctx ends with s.noAnswer while outer runs on: the server slow to make it
// durable, a network that holds the answer) leaves the same unknown, and is settled on the same
// record, asked within a bound of its own (unansweredCommit): committed, or with no id, its
// groups succeed; otherwise they fail with ErrUnavailable, and it is not run again, the call's
// time being spent. Before, they failed at once, and the persistence actor spooled a batch
// that had committed and replayed it, its counters counting twice
// (TestUnansweredCommitOfABatchIsSettled). settled reports that it was so settled as
// committed, or with no id.
func (s *Store) commitTxs(ctx, outer context.Context, fence *stmt, stmts [][]stmt, valid []int, errs []error) (settled bool) {
	savepoints, retried := false, false
	for {
		try := slices.Clone(errs) // a transaction run again starts from errs as they were
		var out txOutcome
		dead, err := s.attempt(ctx, retried, func(c *pgxpool.Conn) error {
			out = s.commitTx(ctx, c, fence, stmts, valid, try, savepoints)
			return nil
		})
		if err != nil { // the pool gave no connection
			sqlstore.FillUndecided(errs, fmt.Errorf("commit: begin: %w", err))
			return false
		}
		if dead && !out.sent && !retried {
			retried = true
			continue
		}
		if out.lost != nil && out.xact.read && errors.Is(context.Cause(ctx), s.noAnswer) && outer.Err() == nil {
			if f := s.unansweredCommit(outer, out); f == fateCommitted || f == fateEmpty {
				out.lost, settled = nil, true
			}
		} else if out.lost != nil && dead && out.xact.read {
			if s.lost != nil {
				s.lost(ctx)
			}
			switch s.lostCommit(outer, out, !retried) {
			case fateCommitted, fateEmpty:
				out.lost = nil
			case fateAborted:
				if !retried { // nothing was written: run it once more
					retried = true
					continue
				}
			}
		}
		if out.lost != nil {
			sqlstore.FillUndecided(try, out.lost)
		}
		copy(errs, try)
		if !out.retry || savepoints {
			return settled
		}
		savepoints = true
	}
}

// lostCommit asks for the fate of the transaction of out, whose connection broke once its
// COMMIT was sent (xactFate), within a bound of its own (fateBound), logs it and returns it;
// again says that an aborted one runs again. Committed, the groups out.lost would fail
// succeed; aborted and not run again, or unknown, they fail with it. One that wrote nothing
// (fateEmpty) is not asked for, and succeeds.
func (s *Store) lostCommit(outer context.Context, out txOutcome, again bool) fate {
	ctx, cancel := s.fateBound(outer)
	defer cancel()
	f, why := s.lostFate(ctx, out.xact, false)
	id := out.xact.id.String
	switch {
	case f == fateEmpty:
		s.log.Info("a commit's connection was lost after its COMMIT was sent; its transaction wrote nothing, "+
			"so the COMMIT had nothing to apply and it succeeds", logging.Err(out.lost))
	case f == fateCommitted:
		s.log.Info("a commit's connection was lost after its COMMIT was sent; the server committed it, so its writes are stored",
			"xid", id, logging.Err(out.lost))
	case f == fateAborted && again:
		s.log.Warn("a commit's connection was lost after its COMMIT was sent; the server aborted it, so nothing was written and it runs again",
			"xid", id, logging.Err(out.lost))
	case f == fateAborted:
		s.log.Warn("a commit's connection was lost after its COMMIT was sent, on its second run too; the server aborted it, "+
			"so nothing was written, and its writes fail as unavailable (a daemon spools them)", "xid", id, logging.Err(out.lost))
	default:
		s.log.Warn("a commit's connection was lost after its COMMIT was sent, and whether the server committed it is not known; "+
			"its writes fail as unavailable (a daemon spools and replays them: a crash or delivery attempt they count may count twice)",
			"xid", id, "why", why, logging.Err(out.lost))
	}
	return f
}

// unansweredCommit asks for the fate of the transaction of out, whose COMMIT was sent and whose
// call's bound ran out before its answer came (lostFate), on a fresh connection within a bound
// of its own (Options.Timeout again, within outer: the call's is spent), awaiting one the
// server still runs until that bound ends (xactFate), logs it and returns it.
// Committed, or with no id, the groups out.lost would fail succeed; otherwise they fail with it
// (aborted: nothing was written, and a replay of them counts nothing twice).
func (s *Store) unansweredCommit(outer context.Context, out txOutcome) fate {
	ctx, cancel := context.WithTimeoutCause(outer, s.timeout, s.noAnswer)
	defer cancel()
	f, why := s.lostFate(ctx, out.xact, true)
	switch f {
	case fateCommitted, fateEmpty:
		s.log.Info("a commit's COMMIT was not answered within the call's time; the server committed it, or it wrote nothing, so its writes are stored",
			"xid", out.xact.id.String, logging.Err(out.lost))
		return f
	case fateAborted:
		why = "the server aborted it: nothing was written"
	}
	s.log.Warn("a commit's COMMIT was not answered within the call's time; its writes fail as unavailable (a daemon spools and replays them)",
		"xid", out.xact.id.String, "why", why, logging.Err(out.lost))
	return f
}

// txOutcome is what commitTx tells of its transaction.
type txOutcome struct {
	retry bool  // a group failed for what it holds: run again with a savepoint per group
	sent  bool  // COMMIT was sent
	lost  error // COMMIT's error, which has failed no group yet (commitTxs decides)
	xact  xact  // the transaction, as its last batch read it (its id NULL when not read)
}

// commitTx runs the valid groups in one transaction on c and fills their errs. Without
// savepoints, a group that fails rolls the whole transaction back and commitTx asks for a retry
// with them. A fence, when not nil, runs first: when it fails, so does every group. An error of
// the COMMIT itself fills no errs: it is returned in lost, with the transaction's id, which the
// batches read at their end when the server keeps transactions' fates (knowsXacts).
func (s *Store) commitTx(ctx context.Context, c *pgxpool.Conn, fence *stmt, stmts [][]stmt, valid []int, errs []error, savepoints bool) (out txOutcome) {
	// failAll fails the groups not yet decided: a group the savepoint pass refused for what it
	// holds keeps its own error, as does one invalid on its face (sqlstore.FillUndecided).
	failAll := func(err error) txOutcome {
		sqlstore.FillUndecided(errs, err)
		return out
	}
	var x *xact
	if knowsXacts(c.Conn().PgConn().ParameterStatus("server_version")) {
		x = &out.xact
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		return failAll(fmt.Errorf("commit: begin: %w", err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	if !savepoints {
		failed, err := run(ctx, tx, fence, stmts, valid, x)
		switch {
		case err == nil:
		case failed < 0 || IsUnavailable(err) || ctx.Err() != nil:
			return failAll(fmt.Errorf("commit: %w", err))
		default:
			out.retry = true
			return out
		}
	} else {
		if fence != nil {
			if _, err := tx.Exec(ctx, fence.sql, fence.args...); err != nil {
				return failAll(fmt.Errorf("commit: %w", describe(*fence, err)))
			}
		}
		for _, i := range valid {
			if _, err := tx.Exec(ctx, `SAVEPOINT grp`); err != nil {
				return failAll(fmt.Errorf("commit: group %d: savepoint: %w", i, err))
			}
			// The id read last is the transaction's: a group rolled back reads none, and one
			// that succeeds reads NULL only when nothing before it wrote (an id, once
			// assigned, stays the transaction's, also once its savepoint is rolled back).
			var gx *xact
			if x != nil {
				gx = &xact{}
			}
			_, err := run(ctx, tx, nil, stmts, []int{i}, gx)
			if err == nil {
				if gx != nil {
					*x = *gx
				}
				if _, err := tx.Exec(ctx, `RELEASE SAVEPOINT grp`); err != nil {
					return failAll(fmt.Errorf("commit: group %d: release savepoint: %w", i, err))
				}
				continue
			}
			if IsUnavailable(err) || ctx.Err() != nil {
				return failAll(fmt.Errorf("commit: group %d: %w", i, err))
			}
			if _, rerr := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT grp`); rerr != nil {
				return failAll(fmt.Errorf("commit: group %d: %w (rollback to savepoint: %v)", i, err, rerr))
			}
			errs[i] = fmt.Errorf("commit: group %d: %w", i, err)
		}
	}
	out.sent = true
	if err := tx.Commit(ctx); err != nil {
		out.lost = fmt.Errorf("commit: %w", err)
	}
	return out
}

// run sends the statements of the groups idx as one batch, after fence when it is not nil and
// followed by xactSQL, read into x, when x is not nil, and then verifies the message INSERTs
// that inserted nothing. On error it returns the index of the group that failed, or -1 when
// the error is not one group's (the batch could not be sent, or the fence failed).
func run(ctx context.Context, tx pgx.Tx, fence *stmt, stmts [][]stmt, idx []int, x *xact) (failed int, err error) {
	b := &pgx.Batch{}
	if fence != nil {
		b.Queue(fence.sql, fence.args...)
	}
	for _, i := range idx {
		for _, st := range stmts[i] {
			b.Queue(st.sql, st.args...)
		}
	}
	if x != nil {
		queueXact(b)
	}
	type check struct {
		group int
		msg   *persistence.Message
	}
	var checks []check
	br := tx.SendBatch(ctx, b)
	if fence != nil {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return -1, describe(*fence, err)
		}
	}
	for _, i := range idx {
		for _, st := range stmts[i] {
			tag, err := br.Exec()
			if err != nil {
				_ = br.Close()
				return i, describe(st, err)
			}
			if st.msg != nil && tag.RowsAffected() == 0 {
				checks = append(checks, check{i, st.msg})
			}
		}
	}
	if x != nil {
		if err := readXact(br.QueryRow(), x); err != nil {
			_ = br.Close()
			return -1, err
		}
	}
	if err := br.Close(); err != nil {
		return -1, err
	}
	for _, c := range checks {
		if err := verifyMessage(ctx, tx, c.msg); err != nil {
			return c.group, err
		}
	}
	return 0, nil
}

// describe names the op behind a failed statement.
func describe(st stmt, err error) error {
	if st.msg != nil {
		return fmt.Errorf("append message %s/%d: %w", st.msg.SessionID, st.msg.Seq, err)
	}
	var pe *pgconn.PgError
	switch {
	case !errors.As(err, &pe):
	case pe.Code == "23503": // foreign key violation
		return fmt.Errorf("%s: %w", pe.ConstraintName, err)
	case pe.Code == fencedCode:
		return fmt.Errorf("fence: %s: %w", pe.Message, persistence.ErrFenced)
	case pe.Code == daemonFencedCode:
		// Another daemon took the lock: the writes wait in the spool (this daemon's next check
		// of its lock finds it lost, and /readyz fails). Or this one took it again, and raised
		// the epoch, since the write read it: the lock was lost without its noticing, and the
		// row no longer held this store's raise (another daemon's or member's raise came
		// between, a restore, or this store's raise whose COMMIT lost its answer: raiseEpoch).
		var cur, took int64
		_, perr := fmt.Sscanf(pe.Message, "the daemon lock is held with epoch %d, this daemon took epoch %d", &cur, &took)
		var own *ownRaise
		if st.raised != nil {
			own = st.raised.Load()
		}
		if perr == nil && cur != 0 && own != nil && cur == own.epoch {
			// Before, it said another daemon had taken the lock, and an operator with one
			// daemon looked for another (TestOwnRetakeFencesACommitInFlight). An epoch between
			// the write's and this store's raises is another daemon's, which held the lock in
			// between, and may have written meanwhile: before, it went unmentioned
			// (TestRetakeAfterAnotherDaemonFencesACommitInFlight).
			between := ""
			if took < own.from-1 {
				between = ", and another daemon held it in between"
			}
			return fmt.Errorf("%w: this daemon lost its lock on the database and took it again since the write began%s "+
				"(the lock's epoch is %d now, the write's %d)", persistence.ErrUnavailable, between, cur, took)
		}
		return fmt.Errorf("%w: another agentgate daemon took the database's daemon lock: %s",
			persistence.ErrUnavailable, pe.Message)
	}
	return err
}

// verifyMessage is called for a message INSERT that inserted nothing: either m is re-sent (the
// row at its (session id, seq) is m), or its platform identity is stored elsewhere
// (persistence.ErrDuplicate), or its seq holds a different row (ErrConflict).
func verifyMessage(ctx context.Context, tx pgx.Tx, m *persistence.Message) error {
	if m.Role == persistence.RoleUser && m.MessageID != "" {
		var sid string
		var seq int64
		err := tx.QueryRow(ctx, inboundAtSQL, m.Platform, m.ChatID, m.MessageID).Scan(&sid, &seq)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return fmt.Errorf("append message %s/%d: %w", m.SessionID, m.Seq, err)
		case sid != m.SessionID || seq != m.Seq:
			return fmt.Errorf("append message %s/%d: inbound %s/%s/%s already stored as %s/%d: %w",
				m.SessionID, m.Seq, m.Platform, m.ChatID, m.MessageID, sid, seq, persistence.ErrDuplicate)
		}
	}
	var content, messageID string
	if err := tx.QueryRow(ctx, messageAtSQL, m.SessionID, m.Seq).Scan(&content, &messageID); err != nil {
		return fmt.Errorf("append message %s/%d: %w", m.SessionID, m.Seq, err)
	}
	if content != m.Content || messageID != m.MessageID {
		return fmt.Errorf("append message %s/%d: %w", m.SessionID, m.Seq, ErrConflict)
	}
	return nil
}

// groupStmts returns the statements of one group, or the error of its first op that is invalid
// on its face. Every op is idempotent but those of older binaries' spools that count each
// application (IncrementAttempts, and a MarkDelivery without its Attempt, of a non-delivered
// entry); AddUsage adds once per turn. lease
// gives the epoch of a lease the store took (Store.leaseEpoch).
func groupStmts(ops []persistence.Op, lease func(name string) (int64, bool)) ([]stmt, error) {
	var out []stmt
	add := func(sql string, args ...any) { out = append(out, stmt{sql: sql, args: args}) }
	eachSeq := func(sql, sessionID string, seqs []int64, args ...any) {
		for _, seq := range seqs {
			add(sql, append(append([]any(nil), args...), sessionID, seq)...)
		}
	}
	for _, op := range ops {
		switch o := op.(type) {
		case *persistence.CreateSession:
			if o == nil || o.Session.ID == "" || o.Session.Key == "" {
				return nil, errors.New("create session: id and key required")
			}
			ss := &o.Session
			add(createSessionSQL, ss.ID, ss.Key, ss.Platform, ss.ChatType, ss.ChatID, ss.ThreadID,
				ss.UserID, ss.UserName, ss.ScopeID, ss.Profile, timeArg(ss.StartedAt),
				timeArg(ss.LastActivityAt), timeArg(ss.EndedAt), ss.EndReason, ss.PrevSessionID,
				ss.Title, ss.Epoch, ss.QueueMode, ss.InputTokens, ss.OutputTokens,
				timeArg(ss.ResetDueAt), ss.ResetDueReason)
		case *persistence.EndSession:
			if o == nil || o.At.IsZero() {
				// A NULL ended_at would leave the session open forever.
				return nil, errors.New("end session: time required")
			}
			add(endSessionSQL, timeArg(o.At), o.Reason, o.SessionID)
		case *persistence.ReopenSession:
			if o == nil {
				return nil, errors.New("reopen session: nil op")
			}
			add(reopenSessionSQL, o.SessionID)
		case *persistence.MarkResetDue:
			if o == nil || o.Reason == "" {
				return nil, errors.New("mark reset due: reason required")
			}
			add(markResetDueSQL, timeArg(o.At), o.Reason, o.SessionID)
		case *persistence.TouchSession:
			if o == nil {
				return nil, errors.New("touch session: nil op")
			}
			if !o.At.IsZero() {
				add(touchSessionSQL, timeArg(o.At), o.SessionID)
			}
		case *persistence.SetTitle:
			if o == nil {
				return nil, errors.New("set title: nil op")
			}
			add(setTitleSQL, o.Title, o.SessionID)
		case *persistence.SetQueueMode:
			if o == nil {
				return nil, errors.New("set queue mode: nil op")
			}
			add(setQueueModeSQL, o.Mode, o.SessionID)
		case *persistence.AppendMessage:
			if o == nil {
				return nil, errors.New("append message: nil op")
			}
			m := &o.Message
			if m.SessionID == "" || m.Role == "" {
				return nil, errors.New("append message: session id and role required")
			}
			status := m.Status
			if status == "" && m.Role == persistence.RoleUser {
				status = persistence.StatusPending // an unanswered user message must be recoverable
			}
			out = append(out, stmt{sql: insertMessageSQL, msg: m, args: []any{m.SessionID, m.Seq,
				m.Role, m.Content, m.Platform, m.ChatID, m.MessageID, m.TurnID, status, m.Active,
				m.Archived, m.Attempts, timeArg(m.CreatedAt), m.UserID, m.UserName}})
		case *persistence.SetMessageStatus:
			if o == nil {
				return nil, errors.New("set message status: nil op")
			}
			eachSeq(setStatusSQL, o.SessionID, o.Seqs, o.Status, o.TurnID)
		case *persistence.IncrementAttempts:
			if o == nil {
				return nil, errors.New("increment attempts: nil op")
			}
			eachSeq(incAttemptsSQL, o.SessionID, o.Seqs)
		case *persistence.SetAttempts:
			if o == nil {
				return nil, errors.New("set attempts: nil op")
			}
			add(setAttemptsSQL, o.Attempts, o.SessionID, o.Seq)
		case *persistence.MarkProbation:
			if o == nil || o.Run == "" {
				return nil, errors.New("mark probation: run required")
			}
			add(markProbationSQL, o.Run, o.SessionID, o.Seq)
		case *persistence.ArchiveMessages:
			if o == nil {
				return nil, errors.New("archive messages: nil op")
			}
			eachSeq(archiveSQL, o.SessionID, o.Seqs)
		case *persistence.RequeueMessage:
			if o == nil || o.NewSeq <= o.Seq {
				return nil, errors.New("requeue message: the new seq must follow the old one")
			}
			add(requeueSQL, o.NewSeq, o.SessionID, o.Seq)
		case *persistence.PutRoute:
			if o == nil || o.Route.Key == "" || o.Route.SessionID == "" {
				return nil, errors.New("put route: key and session id required")
			}
			r := &o.Route
			add(putRouteSQL, r.Key, r.SessionID, r.Generation, timeArg(r.UpdatedAt))
		case *persistence.AddOutbox:
			if o == nil || o.Entry.SessionKey == "" {
				return nil, errors.New("add outbox: session key required")
			}
			e := &o.Entry
			state := e.State
			if state == "" {
				state = persistence.DeliveryPending // an entry without a state must still be sent
			}
			add(addOutboxSQL, e.SessionKey, e.Seq, e.SessionID, e.Kind, e.Text, e.TurnID,
				ids(e.InReplyTo), e.Platform, e.ChatType, e.ChatID, e.ThreadID, e.UserID, state,
				e.Attempts, timeArg(e.CreatedAt), timeArg(e.DeliveredAt), e.Continued)
		case *persistence.MarkDelivery:
			if o == nil || o.State == "" {
				return nil, errors.New("mark delivery: state required")
			}
			if o.Attempt < 0 {
				return nil, fmt.Errorf("mark delivery %s/%d: negative attempt %d", o.SessionKey, o.Seq, o.Attempt)
			}
			add(markDeliverySQL, o.State, timeArg(o.At), o.SessionKey, o.Seq, o.Attempt)
		case *persistence.AddUsage:
			if o == nil || o.SessionID == "" || o.TurnID == "" {
				return nil, errors.New("add usage: session id and turn id required")
			}
			if o.InputTokens < 0 || o.OutputTokens < 0 {
				return nil, fmt.Errorf("add usage %s/%s: negative token count", o.SessionID, o.TurnID)
			}
			add(addUsageSQL, o.SessionID, o.TurnID, o.InputTokens, o.OutputTokens)
		case *persistence.OpenDraft:
			if o == nil || o.Draft.Platform == "" || o.Draft.ID == "" {
				return nil, errors.New("open draft: platform and id required")
			}
			d := &o.Draft
			add(openDraftSQL, d.Platform, d.ID, d.SessionKey, d.TurnID, d.ChatType, d.ChatID,
				d.ThreadID, d.Run, timeArg(d.CreatedAt))
		case *persistence.CloseDraft:
			if o == nil || o.Platform == "" || o.ID == "" {
				return nil, errors.New("close draft: platform and id required")
			}
			add(closeDraftSQL, o.Platform, o.ID)
		case *persistence.MarkUnread:
			if o == nil || o.Unread.Platform == "" || o.Unread.ChatID == "" {
				return nil, errors.New("mark unread: platform and chat id required")
			}
			u := &o.Unread
			add(markUnreadSQL, u.Platform, u.ChatID, u.ScopeID, u.After, timeArg(u.At))
		case *persistence.ClearUnread:
			if o == nil || o.Platform == "" || o.ChatID == "" {
				return nil, errors.New("clear unread: platform and chat id required")
			}
			// A clear is the gateway holder's: from a store that held the lease and lost it
			// to another process, it deletes nothing (GatewayLease). A recorded place is not
			// fenced so: recording one where another holder read already costs a read again,
			// whose messages are duplicates, while dropping it could lose what it marks.
			name := GatewayLease(o.Platform)
			if epoch, ok := lease(name); ok {
				add(clearUnreadHeldSQL, o.Platform, o.ChatID, o.After, name, epoch)
			} else {
				add(clearUnreadSQL, o.Platform, o.ChatID, o.After)
			}
		case *persistence.Fence:
			if err := sqlstore.CheckFence(o); err != nil {
				return nil, err
			}
			add(fenceSQL, o.Key, o.Epoch)
		default:
			return nil, fmt.Errorf("apply: unknown op type %T", op)
		}
	}
	return out, nil
}

// ids is a message id list as a text[] argument (never NULL).
func ids(v []string) []string {
	if v == nil {
		return []string{}
	}
	return v
}
