// Package sqlstore holds what the SQLite and the PostgreSQL store share beyond the
// persistence contract: the column lists of their rows, the loader of their embedded
// migrations, the bound that compares stored unix-nanosecond times, and the error helpers of
// Commit and of the other calls. It imports persistence only.
package sqlstore

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/agentgate/agentgate/persistence"
)

// Column lists of the row types, in the order both stores' scan functions read them and
// their INSERTs write them.
const (
	SessionCols = `id, key, platform, chat_type, chat_id, thread_id, user_id, user_name, scope_id,
		profile, started_at, last_activity_at, ended_at, end_reason, prev_session_id, title, epoch,
		queue_mode, input_tokens, output_tokens, reset_due_at, reset_due_reason`
	MessageCols = `session_id, seq, role, content, platform, chat_id, message_id, turn_id, status,
		active, archived, attempts, created_at, user_id, user_name`
	// MessageRefCols are MessageCols with an empty content: a message's row without its text.
	MessageRefCols = `session_id, seq, role, '' AS content, platform, chat_id, message_id, turn_id, status,
		active, archived, attempts, created_at, user_id, user_name`
	OutboxCols = `session_key, seq, session_id, kind, text, turn_id, in_reply_to, platform,
		chat_type, chat_id, thread_id, user_id, state, attempts, created_at, delivered_at, continued`
	DraftCols  = `platform, id, session_key, turn_id, chat_type, chat_id, thread_id, run, created_at`
	UnreadCols = `platform, chat_id, scope_id, after_id, created_at`
)

// Scanner is a row: *sql.Row, *sql.Rows, pgx.Row, pgx.Rows.
type Scanner interface{ Scan(dest ...any) error }

// WithMore is a row whose columns go on after what its caller scans: they go to More (a query
// that selects a message's columns and then its session's key, for the message's scan function).
type WithMore struct {
	Scanner
	More []any
}

// Scan scans the caller's columns, then More.
func (w WithMore) Scan(dest ...any) error { return w.Scanner.Scan(append(dest, w.More...)...) }

// Prefixed qualifies every column of a column list with a table alias ("m." + "seq").
func Prefixed(alias, cols string) string {
	parts := strings.Split(cols, ",")
	for i, p := range parts {
		parts[i] = alias + strings.TrimSpace(p)
	}
	return strings.Join(parts, ", ")
}

// NanoBound converts t into a bound on stored unix-nanosecond values: a stored positive
// value v reads as a time before t exactly when v < NanoBound(t). A t at or before the epoch
// gives 1 (no positive value is before it), a t past the int64 range math.MaxInt64.
func NanoBound(t time.Time) int64 {
	switch {
	case !t.After(time.Unix(0, 0)):
		return 1
	case t.After(time.Unix(0, math.MaxInt64)):
		return math.MaxInt64
	}
	return t.UnixNano()
}

// Migration is one embedded schema change, a file named NNNN_description.sql.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations returns the migrations in fsys matching pattern (such as "migrations/*.sql"), in
// version order. A name without a positive version number, or two files with one version,
// is an error.
func Migrations(fsys fs.FS, pattern string) ([]Migration, error) {
	names, err := fs.Glob(fsys, pattern)
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, n := range names {
		base := path.Base(n)
		num, _, _ := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must start with a positive version number", base)
		}
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: base, SQL: string(b)})
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("no migrations match %s", pattern)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i := 1; i < len(ms); i++ {
		if ms[i].Version == ms[i-1].Version {
			return nil, fmt.Errorf("migration %s: duplicate version %d", ms[i].Name, ms[i].Version)
		}
	}
	return ms, nil
}

// Fill sets every error of errs to err and returns errs.
func Fill(errs []error, err error) []error {
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// FillUndecided sets to err the errors of errs that are still nil: the groups of a batch whose
// transaction failed as a whole (the database unavailable, the transaction gone, the commit
// failed), not those that had already failed for what they hold. Those were rolled back to their
// savepoint and keep their own error: it must reach their sender, whereas the batch's error
// (ErrUnavailable) would have them spooled and acknowledged as durable, and a replay could only
// refuse them again.
func FillUndecided(errs []error, err error) {
	for i := range errs {
		if errs[i] == nil {
			errs[i] = err
		}
	}
}

// MarkUnavailable wraps the errors that unavailable says mean "the database cannot be written
// right now" with persistence.ErrUnavailable, so the persistence actor spools those writes.
func MarkUnavailable(errs []error, unavailable func(error) bool) {
	for i, err := range errs {
		if err != nil {
			errs[i] = WrapUnavailable(err, unavailable)
		}
	}
}

// WrapUnavailable returns err, wrapped with persistence.ErrUnavailable when unavailable says it
// means "the database cannot be used right now" and it does not wrap it already, so that a
// caller can tell "retry later" from a fault.
func WrapUnavailable(err error, unavailable func(error) bool) error {
	if unavailable(err) && !errors.Is(err, persistence.ErrUnavailable) {
		return fmt.Errorf("%w: %w", persistence.ErrUnavailable, err)
	}
	return err
}

// CheckFence returns the error of a Fence that is invalid on its face: it must name a key and
// carry an epoch a claim returned (at least 1).
func CheckFence(f *persistence.Fence) error {
	if f == nil || f.Key == "" || f.Epoch < 1 {
		return errors.New("fence: key and an epoch of at least 1 required")
	}
	return nil
}

// Fenced is the error of a Fence given the key's current epoch: nil unless a newer claim
// exists.
func Fenced(f *persistence.Fence, current int64) error {
	if current > f.Epoch {
		return fmt.Errorf("fence %s: claimed with epoch %d, this write has epoch %d: %w",
			f.Key, current, f.Epoch, persistence.ErrFenced)
	}
	return nil
}

// SortCounted orders the messages an unclean stop was counted against by session id
// (persistence.UncleanStop.Counted); nil when there are none.
func SortCounted(c []persistence.CountedMessage) []persistence.CountedMessage {
	if len(c) == 0 {
		return nil
	}
	slices.SortFunc(c, func(a, b persistence.CountedMessage) int { return strings.Compare(a.SessionID, b.SessionID) })
	return c
}

// PruneSessions is persistence.Store.PruneSessions over a store's prune step, which deletes at
// most most sessions (none: only the rows earlier steps left behind): it runs steps until they
// have deleted limit sessions (persistence.DefaultPruneLimit when limit <= 0) and every row of
// theirs, or nothing more is due, and returns how many sessions they deleted.
func PruneSessions(limit int, step func(most int) (persistence.PruneCount, error)) (int, error) {
	if limit <= 0 {
		limit = persistence.DefaultPruneLimit
	}
	pruned := 0
	for {
		c, err := step(limit - pruned)
		pruned += c.Sessions
		if err != nil || !c.More {
			return pruned, err
		}
	}
}

// SweepRow is an outbox row a prune step's sweep read (each store's sweepOutbox): its id, and whether
// the sweep takes it (a finished reply of a session that is gone, or a pruned marker that is no
// longer its key's last).
type SweepRow struct {
	ID    int64
	Taken bool
}

// SweepWindow returns the most outbox rows the sweep of a prune step with a budget of rows
// rows reads: its budget, but at least MinSweepWindow. The budget bounds the rows a step
// deletes, whose cost (index entries, WAL, the search index on SQLite) is what holds up the
// commits; reading a row for the sweep costs a look-up of its session, a fraction of that. A
// window of a small budget's few rows made a pass of that many more steps.
func SweepWindow(rows int) int { return max(rows, MinSweepWindow) }

// MinSweepWindow is the least window of a sweep (SweepWindow).
const MinSweepWindow = 1000

// SweepPick returns the ids of the rows of a sweep's window that the sweep takes, at most
// room of them, the id the next window begins after (from when it took nothing and got no
// further), and whether this window reached the end of the outbox: it was read after from, in
// id order, up to window rows, held fewer, and the sweep took each one it wanted.
func SweepPick(rows []SweepRow, from int64, room, window int) (ids []int64, after int64, end bool) {
	after = from
	for _, r := range rows {
		if r.Taken {
			if len(ids) >= room {
				return ids, after, false
			}
			ids = append(ids, r.ID)
		}
		after = r.ID
	}
	return ids, after, len(rows) < window
}
