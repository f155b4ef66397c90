package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/internal/sqlstore"
)

// stmtID names a write statement, prepared once on the writer's connection (writeStmts).
type stmtID int

const (
	stSavepoint stmtID = iota
	stRelease
	stRollbackTo
	stCreateSession
	stEndSession
	stReopenSession
	stTouchSession
	stMarkResetDue
	stSetTitle
	stSetQueueMode
	stInsertMessage
	stMessageAt
	stInboundAt
	stSetStatus
	stIncAttempts
	stSetAttempts
	stMarkProbation
	stRequeue
	stArchive
	stPutRoute
	stAddOutbox
	stMarkDelivery
	stInsertTurnUsage
	stAddSessionUsage
	stOpenDraft
	stCloseDraft
	stMarkUnread
	stClearUnread
	stFence
	numStmts
)

var writeSQL = [numStmts]string{
	stSavepoint:  `SAVEPOINT grp`,
	stRelease:    `RELEASE grp`,
	stRollbackTo: `ROLLBACK TO grp`,
	stCreateSession: `INSERT INTO sessions (` + sessionCols + `)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO NOTHING`,
	stEndSession: `UPDATE sessions SET ended_at = ?, end_reason = ?, reset_due_at = NULL, reset_due_reason = ''
		WHERE id = ? AND ended_at IS NULL`,
	stReopenSession: `UPDATE sessions SET ended_at = NULL, end_reason = '' WHERE id = ?`,
	stMarkResetDue: `UPDATE sessions SET reset_due_at = ?, reset_due_reason = ?
		WHERE id = ? AND ended_at IS NULL AND reset_due_reason = ''`,
	stTouchSession: `UPDATE sessions SET last_activity_at = MAX(COALESCE(last_activity_at, 0), ?)
		WHERE id = ?`,
	stSetTitle:     `UPDATE sessions SET title = ? WHERE id = ?`,
	stSetQueueMode: `UPDATE sessions SET queue_mode = ? WHERE id = ?`,
	stInsertMessage: `INSERT INTO messages (` + messageCols + `)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (session_id, seq) DO NOTHING`,
	stMessageAt: `SELECT content, message_id FROM messages WHERE session_id = ? AND seq = ?`,
	stInboundAt: `SELECT session_id, seq FROM messages
		WHERE platform = ? AND chat_id = ? AND message_id = ? AND role = 'user' AND message_id <> ''`,
	stSetStatus: `UPDATE messages SET status = ?, turn_id = CASE WHEN ? <> '' THEN ? ELSE turn_id END
		WHERE session_id = ? AND seq = ?`,
	stIncAttempts:   `UPDATE messages SET attempts = attempts + 1 WHERE session_id = ? AND seq = ?`,
	stSetAttempts:   `UPDATE messages SET attempts = MAX(attempts, ?) WHERE session_id = ? AND seq = ?`,
	stArchive:       `UPDATE messages SET active = 0, archived = 1 WHERE session_id = ? AND seq = ?`,
	stMarkProbation: `UPDATE messages SET probation_run = ? WHERE session_id = ? AND seq = ?`,
	stRequeue: `UPDATE messages SET seq = ?, status = 'pending', attempts = 0, probation_run = ''
		WHERE session_id = ? AND seq = ? AND role = 'user' AND status = 'quarantined'`,
	stPutRoute: `INSERT INTO routing (key, session_id, generation, updated_at) VALUES (?, ?, ?, ?)
		ON CONFLICT (key) DO UPDATE SET session_id = excluded.session_id,
			generation = excluded.generation, updated_at = excluded.updated_at
		WHERE excluded.generation > routing.generation`,
	stAddOutbox: `INSERT INTO outbox (` + outboxCols + `)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (session_key, seq) DO NOTHING`,
	// Delivered is final: a late failure report or a re-sent mark does not undo it. The
	// attempts keep the larger count, so a mark applied again counts its attempt once; a mark
	// without a number (0: spooled by an older binary) counts one more, as it always did. A
	// pending mark only counts (a stop's, of a reply it leaves to send): a failed entry stays so.
	stMarkDelivery: `UPDATE outbox SET state = CASE WHEN ?1 = 'pending' THEN state ELSE ?1 END,
			delivered_at = CASE WHEN ?1 = 'delivered' THEN ?2 ELSE delivered_at END,
			attempts = CASE WHEN ?5 > 0 THEN MAX(attempts, ?5) ELSE attempts + 1 END
		WHERE session_key = ?3 AND seq = ?4 AND state <> 'delivered'`,
	// A turn's usage is recorded once; only a first recording adds to its session.
	stInsertTurnUsage: `INSERT INTO turn_usage (session_id, turn_id, input_tokens, output_tokens)
		VALUES (?, ?, ?, ?) ON CONFLICT (session_id, turn_id) DO NOTHING`,
	stAddSessionUsage: `UPDATE sessions SET input_tokens = input_tokens + ?,
		output_tokens = output_tokens + ? WHERE id = ?`,
	stOpenDraft: `INSERT INTO drafts (` + sqlstore.DraftCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (platform, id) DO NOTHING`,
	stCloseDraft: `DELETE FROM drafts WHERE platform = ? AND id = ?`,
	stMarkUnread: `INSERT INTO unread (` + sqlstore.UnreadCols + `) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (platform, chat_id) DO UPDATE SET scope_id = excluded.scope_id, after_id = excluded.after_id,
			created_at = excluded.created_at`,
	stClearUnread: `DELETE FROM unread WHERE platform = ?1 AND chat_id = ?2 AND (?3 = '' OR after_id = ?3)`,
	// Commits are serialised (BEGIN IMMEDIATE), so a plain read fences: a claim is a write
	// transaction of its own, never concurrent with this one.
	stFence: `SELECT epoch FROM owners WHERE key = ?`,
}

// errTxAborted marks an error after which the transaction no longer exists (SQLite rolled it
// back on its own, or the context ended): no group of the batch can be reported committed.
var errTxAborted = errors.New("transaction aborted")

// Commit applies groups of writes in one BEGIN IMMEDIATE transaction. Each group is atomic: a
// failing group is rolled back and reported in errs[i] while the others go on. If the
// transaction itself fails (BEGIN, COMMIT, or an error after which SQLite has rolled it back,
// such as a full disk), every group gets that error, and so does a group that fails because
// the database is unavailable (IsUnavailable): the whole batch is rolled back, so that no
// later group commits ahead of a write that must wait in the spool. A group that had already
// failed on its own in the savepoint pass keeps its own error (sqlstore.FillUndecided). A
// transaction that committed to a database file deleted or replaced meanwhile fails as a whole
// too, and so does every Commit after it, at once (checkFile). New messages are indexed for
// Search after the commit (see indexCommitted); an indexing failure never fails a group.
// Commit is safe for concurrent use; calls are serialised.
//
// Groups rarely fail, so the batch first runs without a savepoint per group: a savepoint costs
// two statements and a copy of every page the group touches into the statement journal. The
// first group that fails rolls that transaction back, and the batch runs again with each group
// inside its own SAVEPOINT.
func (s *Store) Commit(ctx context.Context, groups [][]persistence.Op) (errs []error) {
	errs = make([]error, len(groups))
	defer func() { // (after MarkUnavailable: deferred calls run last in, first out)
		for i := range errs {
			errs[i] = s.explainLocked(errs[i])
		}
	}()
	defer sqlstore.MarkUnavailable(errs, IsUnavailable)
	defer func() {
		if i := slices.IndexFunc(errs, isCorrupt); i >= 0 {
			s.reportCorrupt(errs[i]) // once a batch, whose groups all fail alike
		}
		if i := slices.IndexFunc(errs, isGone); i >= 0 {
			s.reportGone(errs[i])
		}
	}()
	if err := s.enter(); err != nil {
		return sqlstore.Fill(errs, fmt.Errorf("commit: %w", err))
	}
	defer s.leave()
	if s.readOnly {
		return sqlstore.Fill(errs, fmt.Errorf("commit: %w", ErrReadOnly))
	}
	if len(groups) == 0 {
		return errs
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	if g := s.gone.Load(); g != nil {
		return sqlstore.Fill(errs, fmt.Errorf("commit: %w", g)) // nothing more goes to the old file
	}

	added, retry := s.commitTx(ctx, groups, errs, false)
	if retry {
		clear(errs)
		added, _ = s.commitTx(ctx, groups, errs, true)
	}
	if slices.ContainsFunc(errs, IsUnavailable) {
		// A writer's connection opened again after the file went cannot open it (noCreate):
		// the commit fails unavailable, and the file says why.
		if g := s.checkFile(); g != nil {
			for i, err := range errs {
				if IsUnavailable(err) && !isGone(err) {
					errs[i] = fmt.Errorf("commit: %w (%v)", g, err)
				}
			}
		}
	}
	s.indexCommitted(ctx, added)
	return errs
}

// commitTx runs groups in one transaction and fills errs. Without savepoints, a failing group
// rolls the whole transaction back and commitTx asks for a retry with them. It returns the
// number of message rows the committed transaction inserted.
//
// The transaction runs on the writer's driver connection itself (sql.Conn.Raw), with statements
// prepared on it once (writeStmts), not through a *sql.Tx: database/sql starts a goroutine per
// transaction to watch its context, and the driver one per call whose context can be cancelled.
// Waking and stopping them, and handing the connection's lock back and forth, made the committer
// wait for a CPU behind the sessions' work under load (docs/BENCHMARKS.md, "The tenth session").
// The driver calls get a context that is never cancelled; cancelling ctx still ends the batch:
// it is checked before every group and before the commit, and the transaction rolls back.
func (s *Store) commitTx(ctx context.Context, groups [][]persistence.Op, errs []error, savepoints bool) (added int, retry bool) {
	ran := false
	err := s.onWriter(ctx, func(dc any) error { // the one writer connection, waited for like a BeginTx
		ran = true
		added, retry = s.commitOn(ctx, dc, groups, errs, savepoints)
		s.ckpt.wrote(dc)
		return nil
	})
	if err != nil && !ran {
		sqlstore.Fill(errs, fmt.Errorf("commit: begin: %w", err))
		return 0, false
	}
	// Once commitOn ran, errs hold the outcome: an error handing the connection back to the pool
	// afterwards cannot undo a commit.
	return added, retry
}

// commitOn is commitTx on the driver connection dc.
func (s *Store) commitOn(ctx context.Context, dc any, groups [][]persistence.Op, errs []error, savepoints bool) (added int, retry bool) {
	stmts, err := s.writeStmts(dc)
	if err != nil {
		sqlstore.Fill(errs, fmt.Errorf("commit: %w", err))
		return 0, false
	}
	begin, ok := dc.(driver.ConnBeginTx)
	if !ok {
		sqlstore.Fill(errs, fmt.Errorf("commit: driver connection %T cannot begin a transaction", dc))
		return 0, false
	}
	bg := context.WithoutCancel(ctx)
	tx, err := begin.BeginTx(bg, driver.TxOptions{}) // _txlock=immediate: BEGIN IMMEDIATE
	if err != nil {
		sqlstore.Fill(errs, fmt.Errorf("commit: begin: %w", err))
		return 0, false
	}
	t := &txn{ctx: bg, stmts: stmts, fault: s.fault}
	for i, g := range groups {
		if err := ctx.Err(); err != nil {
			_ = tx.Rollback()
			sqlstore.FillUndecided(errs, fmt.Errorf("commit: group %d: %w: %w", i, errTxAborted, err))
			return 0, false
		}
		mark := t.added
		err := t.group(g, savepoints)
		switch {
		case err == nil:
		case errors.Is(err, errTxAborted):
			_ = tx.Rollback() // the transaction is already gone
			sqlstore.FillUndecided(errs, fmt.Errorf("commit: group %d: %w", i, err))
			return 0, false
		case IsUnavailable(err):
			// The group goes to the spool; the groups after it may hold later writes of its
			// session, which must not commit ahead of it. The batch fails as a whole and is
			// spooled in order (as the PostgreSQL store's does).
			_ = tx.Rollback()
			sqlstore.FillUndecided(errs, fmt.Errorf("commit: group %d: %w", i, err))
			return 0, false
		case !savepoints:
			if rerr := tx.Rollback(); rerr != nil {
				sqlstore.FillUndecided(errs, fmt.Errorf("commit: group %d: %w (rollback: %v)", i, err, rerr))
				return 0, false
			}
			return 0, true
		default:
			t.added = mark // the group's rows are rolled back
			errs[i] = fmt.Errorf("commit: group %d: %w", i, err)
		}
	}
	if err := ctx.Err(); err != nil {
		_ = tx.Rollback()
		sqlstore.FillUndecided(errs, fmt.Errorf("commit: %w: %w", errTxAborted, err))
		return 0, false
	}
	if err := s.commitChecked(tx); err != nil {
		// Not committed, or committed to a file deleted or replaced meanwhile: as good as lost.
		// The groups that committed wait in the spool; one that failed for what it holds keeps
		// its error.
		sqlstore.FillUndecided(errs, fmt.Errorf("commit: %w", err))
		return 0, false
	}
	return t.added, false
}

// writeStmts returns the write statements prepared on the writer's driver connection dc,
// preparing them the first time, and again should database/sql ever replace the connection.
// It does so only after the old one was closed (the driver reports a connection unusable only
// then), and a closed connection's statements cannot be finalized any more: they are dropped.
// The caller holds commitMu, or is open or closeAll.
func (s *Store) writeStmts(dc any) (*[numStmts]driver.Stmt, error) {
	if s.wstmts.conn == dc {
		return &s.wstmts.st, nil
	}
	prep, ok := dc.(driver.ConnPrepareContext)
	if !ok {
		return nil, fmt.Errorf("driver connection %T cannot prepare statements", dc)
	}
	var st [numStmts]driver.Stmt
	for id, q := range writeSQL {
		p, err := prep.PrepareContext(context.Background(), q)
		if err != nil {
			closeStmts(st[:id])
			return nil, fmt.Errorf("prepare %q: %w", q, err)
		}
		st[id] = p
	}
	s.wstmts.conn, s.wstmts.st = dc, st
	return &s.wstmts.st, nil
}

// closeStmts closes the non-nil statements of sts and returns the first error.
func closeStmts(sts []driver.Stmt) error {
	var first error
	for _, st := range sts {
		if st == nil {
			continue
		}
		if err := st.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// txn is one Commit transaction on the writer's driver connection.
type txn struct {
	ctx   context.Context // never cancelled (see commitTx)
	stmts *[numStmts]driver.Stmt
	args  []driver.NamedValue        // the arguments of the statement running, reused by the next
	added int                        // message rows inserted by the groups that succeeded so far
	fault func(persistence.Op) error // Store.fault
}

// bind converts args as database/sql would (driver.DefaultParameterConverter: the driver has no
// converter of its own) into t.args.
func (t *txn) bind(args []any) ([]driver.NamedValue, error) {
	t.args = t.args[:0]
	for i, a := range args {
		v, err := driver.DefaultParameterConverter.ConvertValue(a)
		if err != nil {
			return nil, fmt.Errorf("argument %d: %w", i+1, err)
		}
		t.args = append(t.args, driver.NamedValue{Ordinal: i + 1, Value: v})
	}
	return t.args, nil
}

func (t *txn) exec(id stmtID, args ...any) (driver.Result, error) {
	named, err := t.bind(args)
	if err != nil {
		return nil, err
	}
	return t.stmts[id].(driver.StmtExecContext).ExecContext(t.ctx, named)
}

// queryRow runs query id and reads its first row into dest (one value per column); no row is
// sql.ErrNoRows.
func (t *txn) queryRow(id stmtID, dest []driver.Value, args ...any) error {
	named, err := t.bind(args)
	if err != nil {
		return err
	}
	rows, err := t.stmts[id].(driver.StmtQueryContext).QueryContext(t.ctx, named)
	if err != nil {
		return err
	}
	err = rows.Next(dest)
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, io.EOF) {
		return sql.ErrNoRows
	}
	return err
}

// group applies one group. With savepoints it is atomic on its own: on an op's error it rolls
// back to the group's savepoint and returns that error. Without, the caller must roll back the
// transaction when it fails. If the transaction is gone, the error wraps errTxAborted.
func (t *txn) group(ops []persistence.Op, savepoints bool) error {
	if len(ops) == 0 {
		return nil
	}
	if !savepoints {
		for _, op := range ops {
			if err := t.apply(op); err != nil {
				return err
			}
		}
		return nil
	}
	if _, err := t.exec(stSavepoint); err != nil {
		return fmt.Errorf("savepoint: %w: %w", errTxAborted, err)
	}
	for _, op := range ops {
		if err := t.apply(op); err != nil {
			if _, rerr := t.exec(stRollbackTo); rerr != nil {
				return fmt.Errorf("%w: %w (rollback to savepoint: %v)", errTxAborted, err, rerr)
			}
			if _, rerr := t.exec(stRelease); rerr != nil {
				return fmt.Errorf("%w: %w (release savepoint: %v)", errTxAborted, err, rerr)
			}
			return err
		}
	}
	if _, err := t.exec(stRelease); err != nil {
		return fmt.Errorf("%w: release savepoint: %w", errTxAborted, err)
	}
	return nil
}

// apply runs one op. Every op is idempotent but those of older binaries' spools that count
// each application (IncrementAttempts, and a MarkDelivery without its Attempt, of a
// non-delivered entry); AddUsage adds once per turn.
func (t *txn) apply(op persistence.Op) error {
	if t.fault != nil {
		if err := t.fault(op); err != nil {
			return err
		}
	}
	switch o := op.(type) {
	case *persistence.CreateSession:
		if o == nil || o.Session.ID == "" || o.Session.Key == "" {
			return errors.New("create session: id and key required")
		}
		ss := &o.Session
		_, err := t.exec(stCreateSession, ss.ID, ss.Key, ss.Platform, ss.ChatType, ss.ChatID,
			ss.ThreadID, ss.UserID, ss.UserName, ss.ScopeID, ss.Profile, timeArg(ss.StartedAt),
			timeArg(ss.LastActivityAt), timeArg(ss.EndedAt), ss.EndReason, ss.PrevSessionID,
			ss.Title, ss.Epoch, ss.QueueMode, ss.InputTokens, ss.OutputTokens,
			timeArg(ss.ResetDueAt), ss.ResetDueReason)
		return wrap(err, "create session %s", ss.ID)
	case *persistence.EndSession:
		if o == nil || o.At.IsZero() {
			// A NULL ended_at would leave the session open forever.
			return errors.New("end session: time required")
		}
		_, err := t.exec(stEndSession, timeArg(o.At), o.Reason, o.SessionID)
		return wrap(err, "end session %s", o.SessionID)
	case *persistence.ReopenSession:
		if o == nil {
			return errors.New("reopen session: nil op")
		}
		_, err := t.exec(stReopenSession, o.SessionID)
		return wrap(err, "reopen session %s", o.SessionID)
	case *persistence.MarkResetDue:
		if o == nil || o.Reason == "" {
			return errors.New("mark reset due: reason required")
		}
		_, err := t.exec(stMarkResetDue, timeArg(o.At), o.Reason, o.SessionID)
		return wrap(err, "mark reset due %s", o.SessionID)
	case *persistence.TouchSession:
		if o == nil {
			return errors.New("touch session: nil op")
		}
		if o.At.IsZero() {
			return nil
		}
		_, err := t.exec(stTouchSession, timeArg(o.At), o.SessionID)
		return wrap(err, "touch session %s", o.SessionID)
	case *persistence.SetTitle:
		if o == nil {
			return errors.New("set title: nil op")
		}
		_, err := t.exec(stSetTitle, o.Title, o.SessionID)
		return wrap(err, "set title %s", o.SessionID)
	case *persistence.SetQueueMode:
		if o == nil {
			return errors.New("set queue mode: nil op")
		}
		_, err := t.exec(stSetQueueMode, o.Mode, o.SessionID)
		return wrap(err, "set queue mode %s", o.SessionID)
	case *persistence.AppendMessage:
		if o == nil {
			return errors.New("append message: nil op")
		}
		return t.appendMessage(&o.Message)
	case *persistence.SetMessageStatus:
		if o == nil {
			return errors.New("set message status: nil op")
		}
		return t.eachSeq(o.SessionID, o.Seqs, "set message status", stSetStatus, o.Status, o.TurnID, o.TurnID)
	case *persistence.IncrementAttempts:
		if o == nil {
			return errors.New("increment attempts: nil op")
		}
		return t.eachSeq(o.SessionID, o.Seqs, "increment attempts", stIncAttempts)
	case *persistence.SetAttempts:
		if o == nil {
			return errors.New("set attempts: nil op")
		}
		_, err := t.exec(stSetAttempts, o.Attempts, o.SessionID, o.Seq)
		return wrap(err, "set attempts %s/%d", o.SessionID, o.Seq)
	case *persistence.MarkProbation:
		if o == nil || o.Run == "" {
			return errors.New("mark probation: run required")
		}
		_, err := t.exec(stMarkProbation, o.Run, o.SessionID, o.Seq)
		return wrap(err, "mark probation %s/%d", o.SessionID, o.Seq)
	case *persistence.ArchiveMessages:
		if o == nil {
			return errors.New("archive messages: nil op")
		}
		return t.eachSeq(o.SessionID, o.Seqs, "archive messages", stArchive)
	case *persistence.RequeueMessage:
		if o == nil || o.NewSeq <= o.Seq {
			return errors.New("requeue message: the new seq must follow the old one")
		}
		_, err := t.exec(stRequeue, o.NewSeq, o.SessionID, o.Seq)
		return wrap(err, "requeue message %s/%d", o.SessionID, o.Seq)
	case *persistence.PutRoute:
		if o == nil || o.Route.Key == "" || o.Route.SessionID == "" {
			return errors.New("put route: key and session id required")
		}
		r := &o.Route
		_, err := t.exec(stPutRoute, r.Key, r.SessionID, r.Generation, timeArg(r.UpdatedAt))
		return wrap(err, "put route %s", r.Key)
	case *persistence.AddOutbox:
		if o == nil || o.Entry.SessionKey == "" {
			return errors.New("add outbox: session key required")
		}
		e := &o.Entry
		state := e.State
		if state == "" {
			state = persistence.DeliveryPending // an entry without a state must still be sent
		}
		_, err := t.exec(stAddOutbox, e.SessionKey, e.Seq, e.SessionID, e.Kind, e.Text, e.TurnID,
			encodeIDs(e.InReplyTo), e.Platform, e.ChatType, e.ChatID, e.ThreadID, e.UserID, state,
			e.Attempts, timeArg(e.CreatedAt), timeArg(e.DeliveredAt), e.Continued)
		return wrap(err, "add outbox %s/%d", e.SessionKey, e.Seq)
	case *persistence.MarkDelivery:
		if o == nil || o.State == "" {
			return errors.New("mark delivery: state required")
		}
		if o.Attempt < 0 {
			return fmt.Errorf("mark delivery %s/%d: negative attempt %d", o.SessionKey, o.Seq, o.Attempt)
		}
		_, err := t.exec(stMarkDelivery, o.State, timeArg(o.At), o.SessionKey, o.Seq, o.Attempt)
		return wrap(err, "mark delivery %s/%d", o.SessionKey, o.Seq)
	case *persistence.AddUsage:
		if o == nil || o.SessionID == "" || o.TurnID == "" {
			return errors.New("add usage: session id and turn id required")
		}
		return t.addUsage(o)
	case *persistence.OpenDraft:
		if o == nil || o.Draft.Platform == "" || o.Draft.ID == "" {
			return errors.New("open draft: platform and id required")
		}
		d := &o.Draft
		_, err := t.exec(stOpenDraft, d.Platform, d.ID, d.SessionKey, d.TurnID, d.ChatType, d.ChatID,
			d.ThreadID, d.Run, timeArg(d.CreatedAt))
		return wrap(err, "open draft %s/%s", d.Platform, d.ID)
	case *persistence.CloseDraft:
		if o == nil || o.Platform == "" || o.ID == "" {
			return errors.New("close draft: platform and id required")
		}
		_, err := t.exec(stCloseDraft, o.Platform, o.ID)
		return wrap(err, "close draft %s/%s", o.Platform, o.ID)
	case *persistence.MarkUnread:
		if o == nil || o.Unread.Platform == "" || o.Unread.ChatID == "" {
			return errors.New("mark unread: platform and chat id required")
		}
		u := &o.Unread
		_, err := t.exec(stMarkUnread, u.Platform, u.ChatID, u.ScopeID, u.After, timeArg(u.At))
		return wrap(err, "mark unread %s/%s", u.Platform, u.ChatID)
	case *persistence.ClearUnread:
		if o == nil || o.Platform == "" || o.ChatID == "" {
			return errors.New("clear unread: platform and chat id required")
		}
		_, err := t.exec(stClearUnread, o.Platform, o.ChatID, o.After)
		return wrap(err, "clear unread %s/%s", o.Platform, o.ChatID)
	case *persistence.Fence:
		if err := sqlstore.CheckFence(o); err != nil {
			return err
		}
		row := make([]driver.Value, 1)
		err := t.queryRow(stFence, row, o.Key)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("fence %s: %w", o.Key, err)
		}
		cur, ok := row[0].(int64)
		if !ok {
			return fmt.Errorf("fence %s: epoch is %T, not an integer", o.Key, row[0])
		}
		return sqlstore.Fenced(o, cur)
	default:
		return fmt.Errorf("apply: unknown op type %T", op)
	}
}

// addUsage records a turn's usage and, the first time only, adds it to its session.
func (t *txn) addUsage(o *persistence.AddUsage) error {
	if o.InputTokens < 0 || o.OutputTokens < 0 {
		return fmt.Errorf("add usage %s/%s: negative token count", o.SessionID, o.TurnID)
	}
	res, err := t.exec(stInsertTurnUsage, o.SessionID, o.TurnID, o.InputTokens, o.OutputTokens)
	if err != nil {
		return fmt.Errorf("add usage %s/%s: %w", o.SessionID, o.TurnID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("add usage %s/%s: %w", o.SessionID, o.TurnID, err)
	}
	if n == 0 {
		return nil // recorded before: a re-sent write
	}
	_, err = t.exec(stAddSessionUsage, o.InputTokens, o.OutputTokens, o.SessionID)
	return wrap(err, "add usage %s/%s", o.SessionID, o.TurnID)
}

// eachSeq runs a per-row statement whose last two arguments are (session id, seq).
func (t *txn) eachSeq(sessionID string, seqs []int64, what string, id stmtID, args ...any) error {
	for _, seq := range seqs {
		if _, err := t.exec(id, append(args, sessionID, seq)...); err != nil {
			return fmt.Errorf("%s %s/%d: %w", what, sessionID, seq, err)
		}
	}
	return nil
}

// appendMessage inserts a transcript row (indexed for search later). An identical row already at
// (session id, seq) is a no-op; a user row whose platform identity is stored elsewhere fails
// with persistence.ErrDuplicate.
func (t *txn) appendMessage(m *persistence.Message) error {
	if m.SessionID == "" || m.Role == "" {
		return errors.New("append message: session id and role required")
	}
	status := m.Status
	if status == "" && m.Role == persistence.RoleUser {
		status = persistence.StatusPending // an unanswered user message must be recoverable
	}
	res, err := t.exec(stInsertMessage, m.SessionID, m.Seq, m.Role, m.Content, m.Platform,
		m.ChatID, m.MessageID, m.TurnID, status, boolInt(m.Active), boolInt(m.Archived),
		m.Attempts, timeArg(m.CreatedAt), m.UserID, m.UserName)
	if err != nil {
		// The inbound index refused the row: either m is re-sent (its own row holds the platform
		// identity) or the platform message is already stored elsewhere.
		if sid, seq, ok := t.inboundAt(m); ok {
			if sid == m.SessionID && seq == m.Seq {
				return t.sameMessage(m)
			}
			return fmt.Errorf("append message %s/%d: inbound %s/%s/%s already stored as %s/%d: %w",
				m.SessionID, m.Seq, m.Platform, m.ChatID, m.MessageID, sid, seq, persistence.ErrDuplicate)
		}
		return fmt.Errorf("append message %s/%d: %w", m.SessionID, m.Seq, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("append message %s/%d: %w", m.SessionID, m.Seq, err)
	}
	if n == 0 {
		return t.sameMessage(m)
	}
	t.added++
	return nil
}

// inboundAt returns where the user row with m's platform identity is stored, if m is a user
// message with a message id and such a row exists.
func (t *txn) inboundAt(m *persistence.Message) (sid string, seq int64, ok bool) {
	if m.Role != persistence.RoleUser || m.MessageID == "" {
		return "", 0, false
	}
	row := make([]driver.Value, 2)
	if err := t.queryRow(stInboundAt, row, m.Platform, m.ChatID, m.MessageID); err != nil {
		return "", 0, false
	}
	sid, ok1 := text(row[0])
	seq, ok2 := row[1].(int64)
	return sid, seq, ok1 && ok2
}

// sameMessage checks that the row already at m's (session id, seq) is m re-sent.
func (t *txn) sameMessage(m *persistence.Message) error {
	row := make([]driver.Value, 2)
	if err := t.queryRow(stMessageAt, row, m.SessionID, m.Seq); err != nil {
		return fmt.Errorf("append message %s/%d: %w", m.SessionID, m.Seq, err)
	}
	content, ok1 := text(row[0])
	messageID, ok2 := text(row[1])
	if !ok1 || !ok2 || content != m.Content || messageID != m.MessageID {
		return fmt.Errorf("append message %s/%d: %w", m.SessionID, m.Seq, ErrConflict)
	}
	return nil
}

func wrap(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}

// text reads a TEXT column's driver value.
func text(v driver.Value) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	}
	return "", false
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
