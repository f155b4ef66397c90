package sqlite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/google/go-cmp/cmp"
)

// The conformance suite covers IdleSessions and PruneSessions through the Store; these tests
// damage the file to check what the suite cannot write: unreadable times and a broken index.

func TestIdleSessionsUnreadableActivity(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	// Each session is routed and open; its last_activity_at is then overwritten with value.
	tests := []struct {
		id    string
		value string // SQL literal
		idle  bool   // before the cutoff t0+100s
	}{
		{"null", `NULL`, true},
		{"zero", `0`, true},
		{"negative", `-5`, true},
		{"garbage text", `'garbage'`, true},
		{"blob", `X'00ff'`, true},
		{"huge real", `1e300`, true},
		{"past the int64 range", `9223372036854775808.0`, true},
		{"tiny real", `1.5`, true},
		{"old rfc3339 text", `'2001-01-01T00:00:00Z'`, true},
		{"future rfc3339 text", `'2999-01-01T00:00:00Z'`, false},
		{"recent", fmt.Sprint(t0.Add(200 * time.Second).UnixNano()), false},
		{"just before", fmt.Sprint(t0.Add(100*time.Second).UnixNano() - 1), true},
		{"at the cutoff", fmt.Sprint(t0.Add(100 * time.Second).UnixNano()), false},
	}
	var ops []persistence.Op
	for i, tc := range tests {
		key := "k-" + tc.id
		ops = append(ops, &persistence.CreateSession{Session: newSession(tc.id, key)},
			&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: tc.id, Generation: int64(i + 1)}})
	}
	storetest.MustCommit(t, s, ops...)
	raw := MustRawDB(t, s.Path())
	for _, tc := range tests {
		mustExec(t, raw, `UPDATE sessions SET last_activity_at = `+tc.value+` WHERE id = ?`, tc.id)
	}
	// Unreadable times read as the zero time and sort first, by id; then by time.
	want := []string{"blob", "garbage text", "huge real", "negative", "null", "past the int64 range", "zero",
		"tiny real", "old rfc3339 text", "just before"}

	got, err := s.IdleSessions(ctx, t0.Add(100*time.Second), 0)
	if err != nil {
		t.Fatalf("IdleSessions: %v", err)
	}
	var ids []string
	for _, ss := range got {
		ids = append(ids, ss.ID)
	}
	if d := cmp.Diff(want, ids); d != "" {
		t.Errorf("IdleSessions ids mismatch (-want +got):\n%s", d)
	}
	for _, tc := range tests {
		if tc.idle != contains(ids, tc.id) {
			t.Errorf("IdleSessions: session %q (last activity %s) returned = %v, want %v", tc.id, tc.value, !tc.idle, tc.idle)
		}
	}

	t.Run("limit keeps the oldest", func(t *testing.T) {
		got, err := s.IdleSessions(ctx, t0.Add(100*time.Second), 8)
		if err != nil {
			t.Fatalf("IdleSessions: %v", err)
		}
		var ids []string
		for _, ss := range got {
			ids = append(ids, ss.ID)
		}
		if d := cmp.Diff(want[:8], ids); d != "" {
			t.Errorf("IdleSessions(limit 8) ids mismatch (-want +got):\n%s", d)
		}
	})

	t.Run("an unreadable end is not open", func(t *testing.T) {
		mustExec(t, raw, `UPDATE sessions SET ended_at = 'garbage' WHERE id = 'null'`)
		got, err := s.IdleSessions(ctx, t0.Add(100*time.Second), 0)
		if err != nil {
			t.Fatalf("IdleSessions: %v", err)
		}
		for _, ss := range got {
			if ss.ID == "null" {
				t.Errorf("IdleSessions returned a session whose ended_at is set (unreadable)")
			}
		}
	})
}

func contains(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func TestPruneKeepsUnreadableEnds(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	tests := []struct {
		id    string
		value string // SQL literal for ended_at
		prune bool
	}{
		{"valid", fmt.Sprint(t0.UnixNano()), true},
		{"zero", `0`, false},
		{"negative", `-1`, false},
		{"real", `1.5`, false},
		{"huge real", `1e300`, false},
		{"garbage text", `'garbage'`, false},
		{"rfc3339 text", `'2001-01-01T00:00:00Z'`, false},
		{"blob", `X'00'`, false},
		{"after the cutoff", fmt.Sprint(t0.Add(time.Hour).UnixNano()), false},
	}
	var ops []persistence.Op
	for _, tc := range tests {
		ops = append(ops, &persistence.CreateSession{Session: newSession(tc.id, "k")},
			&persistence.EndSession{SessionID: tc.id, Reason: persistence.EndIdle, At: t0})
	}
	// An answered message whose status is unknown to this binary counts as pending.
	ops = append(ops, &persistence.CreateSession{Session: newSession("odd status", "k")},
		&persistence.EndSession{SessionID: "odd status", Reason: persistence.EndIdle, At: t0},
		&persistence.AppendMessage{Message: userMsg("odd status", 1, "odd")})
	storetest.MustCommit(t, s, ops...)
	raw := MustRawDB(t, s.Path())
	for _, tc := range tests {
		mustExec(t, raw, `UPDATE sessions SET ended_at = `+tc.value+` WHERE id = ?`, tc.id)
	}
	mustExec(t, raw, `UPDATE messages SET status = 'answered-by-v9' WHERE session_id = 'odd status'`)

	n, err := s.PruneSessions(ctx, t0.Add(time.Minute), 0)
	if err != nil {
		t.Fatalf("PruneSessions: %v", err)
	}
	if n != 1 {
		t.Errorf("PruneSessions = %d, want 1", n)
	}
	for _, tc := range append(tests, struct {
		id    string
		value string
		prune bool
	}{"odd status", "", false}) {
		_, err := s.Session(ctx, tc.id)
		if gone := errors.Is(err, persistence.ErrNotFound); gone != tc.prune {
			t.Errorf("session %q (ended_at %s): pruned = %v (err %v), want %v", tc.id, tc.value, gone, err, tc.prune)
		}
	}
}

// ftsIntegrity runs FTS5's integrity check; with rank 1 it also checks that the index matches
// the content table (the messages) exactly.
func ftsIntegrity(t *testing.T, s *Store, rank int) error {
	t.Helper()
	_, err := MustRawDB(t, s.Path()).Exec(`INSERT INTO messages_fts (messages_fts, rank) VALUES ('integrity-check', ?)`, rank)
	return err
}

func TestPruneSearchIndex(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	storetest.MustCommit(t, s,
		&persistence.CreateSession{Session: newSession("old", "k")},
		&persistence.AppendMessage{Message: userMsg("old", 1, "aardvark and badger")},
		&persistence.AppendMessage{Message: userMsg("old", 2, "badger again")},
		&persistence.SetMessageStatus{SessionID: "old", Seqs: []int64{1, 2}, Status: persistence.StatusDone},
		&persistence.EndSession{SessionID: "old", Reason: persistence.EndNewCommand, At: t0},
		&persistence.CreateSession{Session: newSession("cur", "k")},
		&persistence.PutRoute{Route: persistence.Route{Key: "k", SessionID: "cur", Generation: 2}},
		&persistence.AppendMessage{Message: userMsg("cur", 1, "badger in the current session")})
	MustIndex(t, s)
	// A row whose indexing failed: stored, below the watermark, but not in the index.
	raw := MustRawDB(t, s.Path())
	mustExec(t, raw, `INSERT INTO messages (session_id, seq, role, content, status) VALUES ('old', 3, 'assistant', 'unindexed capybara', 'done')`)
	mustExec(t, raw, `UPDATE fts_watermark SET last_id = (SELECT MAX(id) FROM messages)`)
	if err := ftsIntegrity(t, s, 0); err != nil {
		t.Fatalf("integrity check before pruning: %v", err)
	}
	if err := ftsIntegrity(t, s, 1); err == nil {
		t.Fatalf("integrity check against the content before pruning = nil, want an error for the unindexed row")
	}

	n, err := s.PruneSessions(ctx, t0.Add(time.Second), 0)
	if err != nil || n != 1 {
		t.Fatalf("PruneSessions = %d, %v, want 1, nil", n, err)
	}
	// The unindexed row is gone too, so the index now matches the content exactly; deleting
	// that row from the index as well would have corrupted it.
	if err := ftsIntegrity(t, s, 1); err != nil {
		t.Errorf("integrity check after pruning: %v", err)
	}
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"aardvark", nil},
		{"capybara", nil},
		{"badger", []string{"cur"}},
	} {
		ms, err := s.Search(ctx, tc.query, 10)
		if err != nil {
			t.Fatalf("Search(%s): %v", tc.query, err)
		}
		var got []string
		for _, m := range ms {
			got = append(got, m.SessionID)
		}
		if !cmp.Equal(got, tc.want) {
			t.Errorf("Search(%s) sessions = %v, want %v", tc.query, got, tc.want)
		}
	}
	// New rows (which may reuse the pruned rowids) are indexed afresh.
	storetest.MustCommit(t, s, &persistence.AppendMessage{Message: userMsg("cur", 2, "aardvark is back")})
	if ms, err := s.Search(ctx, "aardvark", 10); err != nil || len(ms) != 1 || ms[0].Seq != 2 {
		t.Errorf("Search(aardvark) after a new message = %+v, %v, want cur/2", ms, err)
	}
	if err := ftsIntegrity(t, s, 1); err != nil { // Search has indexed the new row
		t.Errorf("integrity check after a new message: %v", err)
	}
}

func TestPruneWithoutSearchIndex(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	storetest.MustCommit(t, s,
		&persistence.CreateSession{Session: newSession("old", "k")},
		&persistence.AppendMessage{Message: userMsg("old", 1, "hello")},
		&persistence.SetMessageStatus{SessionID: "old", Seqs: []int64{1}, Status: persistence.StatusDone},
		&persistence.EndSession{SessionID: "old", Reason: persistence.EndNewCommand, At: t0})
	mustExec(t, MustRawDB(t, s.Path()), `DROP TABLE messages_fts`)
	if n, err := s.PruneSessions(ctx, t0.Add(time.Second), 0); err != nil || n != 1 {
		t.Errorf("PruneSessions with the search index dropped = %d, %v, want 1, nil", n, err)
	}
}

func TestPruneReadOnlyAndClosed(t *testing.T) {
	ctx := context.Background()
	w := MustOpen(t, Options{})
	ro, err := OpenReadOnly(ctx, w.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if _, err := ro.PruneSessions(ctx, t0, 0); !errors.Is(err, ErrReadOnly) {
		t.Errorf("read-only PruneSessions error = %v, want ErrReadOnly", err)
	}
	if _, err := ro.IdleSessions(ctx, t0, 0); err != nil {
		t.Errorf("read-only IdleSessions: %v", err)
	}
	if _, err := ro.SessionsOfKey(ctx, "k", 0); err != nil {
		t.Errorf("read-only SessionsOfKey: %v", err)
	}
}

// TestPruneLeavesNoReplyText: after pruning, no outbox row holds a pruned session's text or the
// ids it answered; the key's last entry stays, emptied, as KindPruned; a later reply to the key
// continues its seq.
func TestPruneLeavesNoReplyText(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	reply := func(key, sid string, seq int64, text string) []persistence.Op {
		return []persistence.Op{
			&persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: key, Seq: seq, SessionID: sid, Kind: "reply",
				Text: text, InReplyTo: []string{fmt.Sprintf("m-%s-%d", sid, seq)}, Platform: "http", ChatType: "dm",
				ChatID: "c", State: persistence.DeliveryPending, CreatedAt: t0}},
			&persistence.MarkDelivery{SessionKey: key, Seq: seq, State: persistence.DeliveryDelivered, At: t0},
		}
	}
	var ops []persistence.Op
	ops = append(ops, &persistence.CreateSession{Session: newSession("old", "k")})
	ops = append(ops, reply("k", "old", 1, "secret one")...)
	ops = append(ops, reply("k", "old", 2, "secret two")...)
	ops = append(ops, &persistence.EndSession{SessionID: "old", Reason: persistence.EndNewCommand, At: t0},
		&persistence.CreateSession{Session: newSession("cur", "k")},
		&persistence.PutRoute{Route: persistence.Route{Key: "k", SessionID: "cur", Generation: 2}})
	storetest.MustCommit(t, s, ops...)

	if n, err := s.PruneSessions(ctx, t0.Add(time.Second), 0); err != nil || n != 1 {
		t.Fatalf("PruneSessions = %d, %v, want 1, nil", n, err)
	}
	raw := MustRawDB(t, s.Path())
	got := mustQueryStrings(t, raw, `SELECT session_key || '/' || seq || ' ' || session_id || ' ' || kind || ' ' || state || ' [' || text || '] ' || in_reply_to FROM outbox ORDER BY id`)
	if d := cmp.Diff([]string{"k/2 old pruned delivered [] []"}, got); d != "" {
		t.Errorf("outbox rows after pruning (-want +got):\n%s", d)
	}
	storetest.MustCommit(t, s, reply("k", "cur", 3, "new")...)
	if es, err := s.OutboxAfter(ctx, "k", 0, 0); err != nil || len(es) != 1 || es[0].Seq != 3 || es[0].Text != "new" {
		t.Errorf("OutboxAfter(k, 0) after a new reply = %+v, %v, want only seq 3", es, err)
	}
}

// TestMigrationPrunesLeftOverOutbox: migration 0009 removes the outbox entries that sessions
// pruned before 0009 left behind, the way pruning does now, and nothing else.
func TestMigrationPrunesLeftOverOutbox(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("alive", "k2")})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	raw := MustRawDB(t, s.Path())
	for _, row := range []string{
		`'k1', 1, 'gone', 'reply', 'old text 1', '["a"]', 'delivered'`,  // a pruned session's: deleted
		`'k1', 2, 'gone', 'notice', 'old text 2', '["b"]', 'delivered'`, // k1's last: emptied
		`'k2', 1, 'gone', 'reply', 'old text 3', '["c"]', 'delivered'`,  // deleted: k2 has a later entry
		`'k2', 2, 'alive', 'reply', 'kept text', '["d"]', 'delivered'`,  // its session exists
		`'k3', 1, 'ghost', 'reply', 'unsent', '["e"]', 'pending'`,       // undelivered: never touched
		`'k4', 1, '', 'notice', 'no session', '[]', 'delivered'`,        // no session id: never touched
	} {
		mustExec(t, raw, `INSERT INTO outbox (session_key, seq, session_id, kind, text, in_reply_to, state) VALUES (`+row+`)`)
	}
	undoAddedColumns(t, raw)
	mustExec(t, raw, `DELETE FROM schema_migrations WHERE version >= 9`)
	s2, err := Open(ctx, s.Path(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	got := mustQueryStrings(t, raw, `SELECT session_key || '/' || seq || ' ' || session_id || ' ' || kind || ' [' || text || '] ' || in_reply_to FROM outbox ORDER BY id`)
	want := []string{
		"k1/2 gone pruned [] []",
		"k2/2 alive reply [kept text] [\"d\"]",
		"k3/1 ghost reply [unsent] [\"e\"]",
		"k4/1  notice [no session] []",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("outbox after migration 0009 (-want +got):\n%s", d)
	}
}

// TestPruneZeroesWhatItDeletes: a pruned conversation's rows are overwritten in the database
// file (secure_delete during the prune), not left in free pages or cells. Copies SQLite left in
// unused page space when it moved rows between pages earlier, with secure_delete off, can
// remain (until VACUUM); so the test counts the copies before and after.
func TestPruneZeroesWhatItDeletes(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	const secret, sessions = "Quokka-Secret-7781", 40
	var ops []persistence.Op
	for i := range sessions { // enough rows to fill and free whole pages
		sid := fmt.Sprint("old-", i)
		m := userMsg(sid, 1, fmt.Sprintf("%s %d %s", secret, i, strings.Repeat("padding ", 40)))
		m.Status = persistence.StatusDone
		ops = append(ops, &persistence.CreateSession{Session: newSession(sid, "k-"+sid)},
			&persistence.AppendMessage{Message: m},
			&persistence.EndSession{SessionID: sid, Reason: persistence.EndNewCommand, At: t0})
	}
	storetest.MustCommit(t, s, ops...)
	MustIndex(t, s)
	copies := func() int {
		t.Helper()
		if _, err := checkpoint(ctx, s.writer, s.dropWriter, "TRUNCATE"); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(s.Path())
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Count(b, []byte(secret))
	}
	before := copies()
	if n, err := s.PruneSessions(ctx, t0.Add(time.Second), 0); err != nil || n != sessions {
		t.Fatalf("PruneSessions = %d, %v, want %d, nil", n, err, sessions)
	}
	if after := copies(); after > before-sessions {
		t.Errorf("the file holds %d copies of the pruned text after pruning, %d before: want the %d rows' own copies gone", after, before, sessions)
	}
	// Commits after a prune run without secure_delete again.
	var on int
	if err := s.writer.QueryRowContext(ctx, `PRAGMA secure_delete`).Scan(&on); err != nil || on != 0 {
		t.Errorf("secure_delete after pruning = %d, %v, want 0 (off)", on, err)
	}
}

// TestPruneOnADamagedSearchIndex: a search index that cannot let go of a pruned session's
// entries because it is damaged (the likely cause) stops the prune step whole: the session is
// kept, rows and all, nothing is left half-pruned, and the store says it is corrupt (ERR once,
// and agentgate_store_corrupt), which the operator sees. Other failures of the index keep the
// messages with a rate-limited WRN (RUNBOOK). A review in the forty-second session feared such
// sessions stayed with nothing to show for it ("FTS failures leave stuck sessions").
func TestPruneOnADamagedSearchIndex(t *testing.T) {
	ctx := context.Background()
	var logs testutil.Buffer
	var corrupt atomic.Int32 // Options.Corrupt: what sets agentgate_store_corrupt
	s := MustOpen(t, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Corrupt: func() { corrupt.Add(1) }})
	storetest.MustCommit(t, s,
		&persistence.CreateSession{Session: newSession("old", "k")},
		&persistence.AppendMessage{Message: userMsg("old", 1, "aardvark and badger")},
		&persistence.SetMessageStatus{SessionID: "old", Seqs: []int64{1}, Status: persistence.StatusDone},
		&persistence.EndSession{SessionID: "old", Reason: persistence.EndNewCommand, At: t0})
	MustIndex(t, s)
	raw := MustRawDB(t, s.Path())
	mustExec(t, raw, `DROP TABLE messages_fts_data`) // the index's own blocks
	for range 2 {
		if c, err := s.PruneStep(ctx, t0.Add(time.Second), 0); !errors.Is(err, persistence.ErrUnavailable) || c != (persistence.PruneCount{}) {
			t.Errorf("PruneStep on a damaged index = %+v, %v; want nothing done and ErrUnavailable", c, err)
		}
	}
	if _, err := s.Session(ctx, "old"); err != nil {
		t.Errorf("the session after the steps: %v, want it kept", err)
	}
	if got := countRows(t, raw); got.sessions != 1 || got.messages != 1 {
		t.Errorf("rows after the steps = %+v, want the session and its message", got)
	}
	if n := strings.Count(logs.String(), `level=ERROR msg="the database is corrupt; stop the daemon and restore a backup"`); n != 1 {
		t.Errorf("%d corruption lines, want 1:\n%s", n, logs.String())
	}
	if n := corrupt.Load(); n != 1 {
		t.Errorf("Options.Corrupt called %d times, want once", n)
	}
}
