package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/google/go-cmp/cmp"
)

// MustOpen opens a fresh store in a temporary directory, closed when the test ends.
func MustOpen(t testing.TB, opts Options) *Store {
	t.Helper()
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "agentgate.db"), opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// MustRawDB opens a plain connection pool on a store's file, bypassing the Store, to inspect or
// damage the database.
func MustRawDB(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", dsn(path, "_pragma=busy_timeout(5000)"))
	if err != nil {
		t.Fatalf("open raw db: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func mustExec(t testing.TB, db *sql.DB, query string, args ...any) {
	t.Helper()
	if _, err := db.Exec(query, args...); err != nil {
		t.Fatalf("exec %q: %v", query, err)
	}
}

func TestConformance(t *testing.T) {
	for _, sync := range []string{"full", "normal"} {
		t.Run("synchronous="+sync, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) persistence.Store {
				return MustOpen(t, Options{Synchronous: sync})
			})
		})
	}
}

var t0 = time.Unix(1_700_000_000, 0)

func newSession(id, key string) persistence.Session {
	return persistence.Session{ID: id, Key: key, Platform: "http", ChatType: "dm", ChatID: "c-" + key,
		UserID: "u", Profile: "main", StartedAt: t0, LastActivityAt: t0}
}

func userMsg(sid string, seq int64, text string) persistence.Message {
	return persistence.Message{SessionID: sid, Seq: seq, Role: persistence.RoleUser, Content: text,
		Platform: "http", ChatID: "c", MessageID: fmt.Sprintf("%s-%d", sid, seq),
		Status: persistence.StatusPending, Active: true, CreatedAt: t0}
}

func TestLockFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agentgate.db")
	s1, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	_, err = Open(ctx, path, Options{})
	if !errors.Is(err, persistence.ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("second Open error %q does not name %s", err, path)
	}
	if err := s1.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s2, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	if err := s2.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func TestTestGuard(t *testing.T) {
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	defaultDir := filepath.Join(cwd, "data")
	_, statErr := os.Stat(defaultDir)
	existedBefore := statErr == nil

	prod := t.TempDir()
	t.Setenv(ProductionDataDirEnv, prod)
	link := filepath.Join(t.TempDir(), "link")
	// A dangling link to the default data directory (which need not exist).
	if err := os.Symlink(defaultDir, link); err != nil {
		t.Fatal(err)
	}

	refused := []struct{ name, path string }{
		{"relative default path", "data/agentgate.db"},
		{"absolute default path", filepath.Join(defaultDir, "agentgate.db")},
		{"nested under the default dir", filepath.Join("data", "sub", "agentgate.db")},
		{"dot segments", "./data/../data/agentgate.db"},
		{"through a symlink", filepath.Join(link, "agentgate.db")},
		{"production dir from env", filepath.Join(prod, "agentgate.db")},
		{"below the production dir", filepath.Join(prod, "a", "b.db")},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(context.Background(), tc.path, Options{})
			if err == nil {
				s.Close()
			}
			if !errors.Is(err, persistence.ErrDefaultDataDir) {
				t.Errorf("Open(%s) = %v, want ErrDefaultDataDir", tc.path, err)
			} else if !strings.Contains(err.Error(), filepath.Base(tc.path)) {
				t.Errorf("Open(%s) error %q does not name the path", tc.path, err)
			}
			if s, err := OpenReadOnly(context.Background(), tc.path); !errors.Is(err, persistence.ErrDefaultDataDir) {
				if err == nil {
					s.Close()
				}
				t.Errorf("OpenReadOnly(%s) = %v, want ErrDefaultDataDir", tc.path, err)
			}
		})
	}

	// Neighbours of the forbidden directories are allowed (checked without opening anything).
	allowed := []string{
		filepath.Join(cwd, "data2", "agentgate.db"),
		filepath.Join(cwd, "agentgate.db"),
		filepath.Join(cwd, "testdata", "data", "agentgate.db"),
		prod + "-other/agentgate.db",
	}
	for _, p := range allowed {
		if err := guardPath(p); err != nil {
			t.Errorf("guardPath(%s) = %v, want nil", p, err)
		}
	}

	if _, err := os.Stat(defaultDir); !existedBefore && err == nil {
		t.Errorf("the refused opens created %s", defaultDir)
	}
	if entries, _ := os.ReadDir(prod); len(entries) != 0 {
		t.Errorf("the refused opens created %d entries in %s", len(entries), prod)
	}
}

func TestSearch(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	storetest.MustCommit(t, s,
		&persistence.CreateSession{Session: newSession("s1", "k1")},
		&persistence.AppendMessage{Message: userMsg("s1", 1, "the quick brown fox")},
		&persistence.AppendMessage{Message: userMsg("s1", 2, "a lazy dog sleeps")},
		&persistence.AppendMessage{Message: userMsg("s1", 3, "quick thinking, quick fox")},
		&persistence.ArchiveMessages{SessionID: "s1", Seqs: []int64{3}})
	tests := []struct {
		query string
		limit int
		want  []int64
	}{
		{"quick", 0, []int64{3, 1}}, // bm25: more occurrences rank first
		{"quick", 1, []int64{3}},
		{"fox", 0, []int64{1, 3}}, // equal rank: in insertion order
		{"dog", 10, []int64{2}},
		{"cat", 10, nil},
		{`"brown fox"`, 10, []int64{1}},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s limit %d", tc.query, tc.limit), func(t *testing.T) {
			ms, err := s.Search(ctx, tc.query, tc.limit)
			if err != nil {
				t.Fatalf("Search(%q): %v", tc.query, err)
			}
			var got []int64
			for _, m := range ms {
				got = append(got, m.Seq)
			}
			if !cmp.Equal(got, tc.want) {
				t.Errorf("Search(%q) seqs = %v, want %v", tc.query, got, tc.want)
			}
		})
	}
	// A failed group's rows are not indexed, even though the next group reuses their rowids.
	errs := s.Commit(ctx, [][]persistence.Op{
		{&persistence.AppendMessage{Message: userMsg("s1", 4, "unicorn")}, unknownOp{}},
		{&persistence.AppendMessage{Message: userMsg("s1", 5, "zebra")}},
	})
	if errs[0] == nil || errs[1] != nil {
		t.Fatalf("Commit(failing group, good group) = %v, want [error nil]", errs)
	}
	if ms, err := s.Search(ctx, "unicorn", 10); err != nil || len(ms) != 0 {
		t.Errorf("Search(unicorn) = %d rows, %v, want none: the failed group was indexed", len(ms), err)
	}
	if ms, err := s.Search(ctx, "zebra", 10); err != nil || len(ms) != 1 || ms[0].Seq != 5 {
		t.Errorf("Search(zebra) = %+v, %v, want seq 5", ms, err)
	}
	for _, q := range []string{`"unbalanced`, `nosuchcolumn:zebra`, `AND`} {
		if _, err := s.Search(ctx, q, 10); !errors.Is(err, ErrBadQuery) {
			t.Errorf("Search(%q) error = %v, want ErrBadQuery", q, err)
		}
	}
}

// unknownOp is an Op type no store knows.
type unknownOp struct{ persistence.Op }

// TestBrokenFTSDoesNotBlockWrites: with the search index dropped, every write succeeds and the
// failure is logged once (rate-limited), whether the indexing pass that meets the damage runs in
// Commit or in Search.
func TestBrokenFTSDoesNotBlockWrites(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"indexed by search", Options{}},
		{"indexed by every commit", Options{IndexRows: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			var logs testutil.Buffer
			opts := tc.opts
			opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			s := MustOpen(t, opts)
			storetest.MustCommit(t, s,
				&persistence.CreateSession{Session: newSession("s1", "k1")},
				&persistence.AppendMessage{Message: userMsg("s1", 1, "indexed before the damage")})
			MustIndex(t, s)

			mustExec(t, MustRawDB(t, s.Path()), `DROP TABLE messages_fts`)

			errs := s.Commit(ctx, [][]persistence.Op{
				{&persistence.AppendMessage{Message: userMsg("s1", 2, "written while the index is broken")}},
				{&persistence.AppendMessage{Message: userMsg("s1", 3, "and another one")}},
			})
			for i, err := range errs {
				if err != nil {
					t.Errorf("Commit group %d with a broken FTS index: %v", i, err)
				}
			}
			ms, err := s.Transcript(ctx, "s1")
			if err != nil {
				t.Fatal(err)
			}
			if len(ms) != 3 {
				t.Errorf("Transcript has %d rows, want 3", len(ms))
			}
			if _, err := s.Search(ctx, "broken", 10); err == nil {
				t.Errorf("Search with the FTS table dropped = nil error, want an error")
			}
			if n := strings.Count(logs.String(), "fts index write failed"); n != 1 {
				t.Errorf("logged %d fts warnings for 2 failures, want 1 (rate-limited); logs:\n%s", n, logs.String())
			}

			// A store opened on the damaged file works too.
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s2, err := Open(ctx, s.Path(), opts)
			if err != nil {
				t.Fatalf("reopen with a broken FTS index: %v", err)
			}
			defer s2.Close()
			storetest.MustCommit(t, s2, &persistence.AppendMessage{Message: userMsg("s1", 4, "after reopening")})
		})
	}
}

func TestInvalidTimestampsReadAsZero(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	e := persistence.OutboxEntry{SessionKey: "k1", Seq: 1, SessionID: "s1", State: persistence.DeliveryDelivered,
		CreatedAt: t0, DeliveredAt: t0}
	storetest.MustCommit(t, s,
		&persistence.CreateSession{Session: newSession("s1", "k1")},
		&persistence.EndSession{SessionID: "s1", Reason: persistence.EndIdle, At: t0},
		&persistence.PutRoute{Route: persistence.Route{Key: "k1", SessionID: "s1", Generation: 1, UpdatedAt: t0}},
		&persistence.AppendMessage{Message: userMsg("s1", 1, "hi")},
		&persistence.AddOutbox{Entry: e})

	raw := MustRawDB(t, s.Path())
	mustExec(t, raw, `UPDATE sessions SET started_at = 'garbage', last_activity_at = -5, ended_at = 0`)
	mustExec(t, raw, `UPDATE messages SET created_at = 'yesterday'`)
	mustExec(t, raw, `UPDATE routing SET updated_at = X'00ff'`)
	mustExec(t, raw, `UPDATE outbox SET created_at = 1e300, delivered_at = -1.5`)

	ss, err := s.Session(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Route(ctx, "k1")
	if err != nil {
		t.Fatal(err)
	}
	snap, err := s.LoadSession(ctx, "k1", 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	es, err := s.OutboxAfter(ctx, "k1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for name, got := range map[string]time.Time{
		"sessions.started_at":       ss.StartedAt,
		"sessions.last_activity_at": ss.LastActivityAt,
		"sessions.ended_at":         ss.EndedAt,
		"routing.updated_at":        r.UpdatedAt,
		"messages.created_at":       snap.History[0].CreatedAt,
		"outbox.created_at":         es[0].CreatedAt,
		"outbox.delivered_at":       es[0].DeliveredAt,
	} {
		if !got.IsZero() {
			t.Errorf("%s with an invalid value reads as %v, want the zero time", name, got)
		}
	}
}

func TestDecodeTime(t *testing.T) {
	tests := []struct {
		name string
		src  any
		want time.Time
	}{
		{"nanoseconds", int64(1_700_000_000_123_456_789), time.Unix(1_700_000_000, 123_456_789)},
		{"null", nil, time.Time{}},
		{"zero", int64(0), time.Time{}},
		{"negative", int64(-1), time.Time{}},
		{"float", float64(1.7e18), time.Unix(1_700_000_000, 0)},
		{"huge float", 1e300, time.Time{}},
		{"rfc3339 text", "2023-11-14T22:13:20Z", time.Unix(1_700_000_000, 0)},
		{"garbage text", "not a time", time.Time{}},
		{"garbage blob", []byte{0, 1}, time.Time{}},
		{"bool", true, time.Time{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := decodeTime(tc.src); !got.Equal(tc.want) {
				t.Errorf("decodeTime(%v) = %v, want %v", tc.src, got, tc.want)
			}
		})
	}
}

func TestOpenReadOnly(t *testing.T) {
	ctx := context.Background()
	w := MustOpen(t, Options{})
	storetest.MustCommit(t, w,
		&persistence.CreateSession{Session: newSession("s1", "k1")},
		&persistence.PutRoute{Route: persistence.Route{Key: "k1", SessionID: "s1", Generation: 1}},
		&persistence.AppendMessage{Message: userMsg("s1", 1, "hello")})

	ro, err := OpenReadOnly(ctx, w.Path())
	if err != nil {
		t.Fatalf("OpenReadOnly while the writer is open: %v", err)
	}
	defer ro.Close()
	snap, err := ro.LoadSession(ctx, "k1", 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Session == nil || snap.LastSeq != 1 {
		t.Fatalf("read-only LoadSession(k1) = %+v, want session s1 with LastSeq 1", snap)
	}
	errs := ro.Commit(ctx, [][]persistence.Op{{&persistence.SetTitle{SessionID: "s1", Title: "x"}}})
	if !errors.Is(errs[0], ErrReadOnly) {
		t.Errorf("read-only Commit = %v, want ErrReadOnly", errs[0])
	}
	if err := ro.Ping(ctx); !errors.Is(err, ErrReadOnly) {
		t.Errorf("read-only Ping = %v, want ErrReadOnly", err)
	}

	// The reader sees the writer's later commits.
	storetest.MustCommit(t, w, &persistence.AppendMessage{Message: userMsg("s1", 2, "again")})
	if snap, err = ro.LoadSession(ctx, "k1", 10, 0); err != nil || snap.LastSeq != 2 {
		t.Errorf("read-only LoadSession after a write: LastSeq %d, err %v, want 2, nil", snap.LastSeq, err)
	}

	// And it works once the writer has gone (its WAL checkpointed away).
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	ro2, err := OpenReadOnly(ctx, w.Path())
	if err != nil {
		t.Fatalf("OpenReadOnly after the writer closed: %v", err)
	}
	defer ro2.Close()
	if ms, err := ro2.Transcript(ctx, "s1"); err != nil || len(ms) != 2 {
		t.Errorf("Transcript(s1) = %d rows, %v, want 2, nil", len(ms), err)
	}

	if _, err := OpenReadOnly(ctx, filepath.Join(t.TempDir(), "missing.db")); err == nil {
		t.Errorf("OpenReadOnly(missing file) = nil error, want an error")
	}
}

func TestIdentityImmutable(t *testing.T) {
	s := MustOpen(t, Options{})
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
	raw := MustRawDB(t, s.Path())
	for _, col := range []string{"key", "platform", "chat_id", "user_id", "user_name", "profile"} {
		if _, err := raw.Exec(`UPDATE sessions SET ` + col + ` = 'other' WHERE id = 's1'`); err == nil {
			t.Errorf("UPDATE sessions SET %s succeeded, want the identity trigger to refuse it", col)
		}
	}
}

func TestMigrations(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agentgate.db")
	for i := range 2 { // the second Open applies nothing
		s, err := Open(ctx, path, Options{})
		if err != nil {
			t.Fatalf("Open #%d: %v", i+1, err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	raw := MustRawDB(t, path)
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := raw.QueryRow(`SELECT COUNT(*) FROM schema_migrations`).Scan(&n); err != nil || n != len(ms) {
		t.Errorf("schema_migrations rows = %d, %v, want %d", n, err, len(ms))
	}
	mustExec(t, raw, `INSERT INTO schema_migrations (version, applied_at) VALUES (9999, 0)`)
	if s, err := Open(ctx, path, Options{}); err == nil {
		s.Close()
		t.Errorf("Open of a database from a newer binary = nil error, want an error")
	}
}

func TestOpenOptions(t *testing.T) {
	ctx := context.Background()
	if _, err := Open(ctx, filepath.Join(t.TempDir(), "a.db"), Options{Synchronous: "sometimes"}); err == nil {
		t.Errorf("Open(synchronous=sometimes) = nil error, want an error")
	}
	tests := []struct {
		sync string
		want int // PRAGMA synchronous: 1 NORMAL, 2 FULL
	}{{"", 2}, {"full", 2}, {"FULL", 2}, {"normal", 1}}
	for _, tc := range tests {
		t.Run("synchronous="+tc.sync, func(t *testing.T) {
			s := MustOpen(t, Options{Synchronous: tc.sync})
			var got int
			if err := s.writer.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("PRAGMA synchronous = %d, want %d", got, tc.want)
			}
		})
	}

	// Odd characters in the path reach the file system literally; missing parents are created 0700.
	dir := filepath.Join(t.TempDir(), "new dir")
	path := filepath.Join(dir, "a?b#c%d.db")
	s, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	defer s.Close()
	if _, err := os.Stat(path); err != nil {
		t.Errorf("database file: %v", err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("created parent directory mode = %v, %v, want 0700", fi.Mode().Perm(), err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping: %v", err)
	}
}

// TestMigrationOneUndeliveredIndex: 0007 replaces the two partial indexes of undelivered outbox
// entries by one; a store from before it keeps finding exactly the entries not delivered.
func TestMigrationOneUndeliveredIndex(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
	for seq, state := range []string{"pending", "failed", "delivered", "pending"} {
		storetest.MustCommit(t, s, &persistence.AddOutbox{Entry: persistence.OutboxEntry{
			SessionKey: "k1", Seq: int64(seq + 1), SessionID: "s1", Kind: "reply", Text: state,
			Platform: "http", ChatType: "dm", ChatID: "c", State: state, CreatedAt: t0}})
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	raw := MustRawDB(t, s.Path())
	// As a store before 0007 had them; seq 4 in a state no version writes.
	mustExec(t, raw, `DROP INDEX outbox_undelivered`)
	mustExec(t, raw, `CREATE INDEX outbox_undelivered ON outbox (session_key, seq) WHERE state IN ('pending', 'failed')`)
	mustExec(t, raw, `CREATE INDEX outbox_session_undelivered ON outbox (session_id) WHERE state <> 'delivered'`)
	undoAddedColumns(t, raw)
	mustExec(t, raw, `DELETE FROM schema_migrations WHERE version >= 7`)
	mustExec(t, raw, `UPDATE outbox SET state = 'sending' WHERE seq = 4`)

	s2, err := Open(ctx, s.Path(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	indexes := mustQueryStrings(t, raw, `SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'outbox' AND sql IS NOT NULL ORDER BY name`)
	want := []string{`CREATE INDEX outbox_undelivered ON outbox (session_key, seq) WHERE state = 'pending'`} // since 0012
	if !slices.Equal(indexes, want) {
		t.Errorf("outbox indexes after migrating = %q, want %q", indexes, want)
	}
	snap, err := s2.LoadSession(ctx, "k1", 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, e := range snap.Unconfirmed {
		got = append(got, e.Seq)
	}
	if want := []int64{1, 2, 4}; !slices.Equal(got, want) {
		t.Errorf("unconfirmed outbox seqs = %v, want %v (everything not delivered: 0012 makes them pending)", got, want)
	}
	keys, err := s2.Recoverable(ctx)
	if err != nil || !slices.Equal(keys, []string{"k1"}) {
		t.Errorf("Recoverable = %v, %v, want [k1]", keys, err)
	}
}

// TestUndeliveredLookupsUseTheirIndex: activation and retention find a key's undelivered outbox
// entries through the partial index, not by walking every reply the key ever had.
func TestUndeliveredLookupsUseTheirIndex(t *testing.T) {
	s := MustOpen(t, Options{})
	for name, q := range map[string]struct {
		sql  string
		args []any
	}{"unconfirmed": {unconfirmedSQL, []any{"k"}}, "prune": {pruneCandidatesSQL, []any{1, 1}}} {
		plan := queryPlan(t, s.writer, q.sql, q.args...)
		var outbox string
		for _, step := range plan {
			if strings.Contains(step, "outbox") || strings.Contains(step, " o ") {
				outbox = step
			}
		}
		if !strings.Contains(outbox, "USING INDEX outbox_undelivered (session_key=?)") {
			t.Errorf("%s: query plan %q, want the outbox searched through outbox_undelivered by key", name, plan)
		}
	}
}

// TestLoadSessionConcurrently activates more sessions at once than the store has reader
// connections, as a daemon restarting with many busy sessions does: each LoadSession holds a
// connection for its read transaction, and the prepared statements it runs must never need a
// second one.
func TestLoadSessionConcurrently(t *testing.T) {
	const readers, sessions, loads = 2, 8, 16
	s := MustOpen(t, Options{Readers: readers})
	var ops []persistence.Op
	for i := range sessions {
		sess := newSession(fmt.Sprintf("s%d", i), fmt.Sprintf("k%d", i))
		ops = append(ops, &persistence.CreateSession{Session: sess},
			&persistence.PutRoute{Route: persistence.Route{Key: sess.Key, SessionID: sess.ID, Generation: 1, UpdatedAt: t0}},
			&persistence.AppendMessage{Message: persistence.Message{SessionID: sess.ID, Seq: 1, Role: persistence.RoleUser,
				Content: "hello", Status: persistence.StatusPending, Active: true, CreatedAt: t0}})
	}
	storetest.MustCommit(t, s, ops...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, 4*sessions)
	var wg sync.WaitGroup
	for g := range 4 * sessions {
		wg.Go(func() {
			key := fmt.Sprintf("k%d", g%sessions)
			for range loads {
				snap, err := s.LoadSession(ctx, key, 10, 0)
				if err == nil && (snap.Session == nil || len(snap.Pending) != 1 || snap.LastSeq != 1) {
					err = fmt.Errorf("snapshot of %s: session %v, %d pending, last seq %d", key, snap.Session != nil, len(snap.Pending), snap.LastSeq)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestMigrationOutboxRowidTable migrates a store whose outbox is still the WITHOUT ROWID table
// of 0001–0007: every entry keeps every column, the key stays unique (a re-sent AddOutbox is
// still a no-op), new entries follow the old ones, and lookups by key use the key's index.
func TestMigrationOutboxRowidTable(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")},
		&persistence.CreateSession{Session: newSession("s2", "k2")})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	raw := MustRawDB(t, s.Path())
	// The outbox as 0001 created it and 0007 left it.
	mustExec(t, raw, `DROP TABLE outbox`)
	mustExec(t, raw, `CREATE TABLE outbox (
		session_key TEXT NOT NULL, seq INTEGER NOT NULL, session_id TEXT NOT NULL DEFAULT '',
		kind TEXT NOT NULL DEFAULT '', text TEXT NOT NULL DEFAULT '', turn_id TEXT NOT NULL DEFAULT '',
		in_reply_to TEXT NOT NULL DEFAULT '[]', platform TEXT NOT NULL DEFAULT '',
		chat_type TEXT NOT NULL DEFAULT '', chat_id TEXT NOT NULL DEFAULT '',
		thread_id TEXT NOT NULL DEFAULT '', user_id TEXT NOT NULL DEFAULT '',
		state TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0,
		created_at INTEGER, delivered_at INTEGER,
		PRIMARY KEY (session_key, seq)) WITHOUT ROWID`)
	mustExec(t, raw, `CREATE INDEX outbox_undelivered ON outbox (session_key, seq) WHERE state <> 'delivered'`)
	old := []persistence.OutboxEntry{
		{SessionKey: "k1", Seq: 1, SessionID: "s1", Kind: "reply", Text: "one", TurnID: "t1", InReplyTo: []string{"m1"},
			Platform: "http", ChatType: "dm", ChatID: "c-k1", UserID: "u", State: persistence.DeliveryDelivered,
			Attempts: 1, CreatedAt: t0, DeliveredAt: t0.Add(time.Second)},
		{SessionKey: "k2", Seq: 1, SessionID: "s2", Kind: "notice", Text: "two", ThreadID: "th",
			Platform: "discord", ChatType: "thread", ChatID: "c-k2", State: persistence.DeliveryFailed,
			Attempts: 3, CreatedAt: t0.Add(2 * time.Second)},
		{SessionKey: "k1", Seq: 2, SessionID: "s1", Kind: "reply", Text: "three", InReplyTo: []string{"m2", "m3"},
			Platform: "http", ChatType: "dm", ChatID: "c-k1", State: persistence.DeliveryPending,
			CreatedAt: t0.Add(3 * time.Second)},
	}
	for _, e := range old {
		inReplyTo, err := json.Marshal(e.InReplyTo)
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, raw, `INSERT INTO outbox (`+strings.TrimSuffix(outboxCols, ", continued")+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			e.SessionKey, e.Seq, e.SessionID, e.Kind, e.Text, e.TurnID, string(inReplyTo),
			e.Platform, e.ChatType, e.ChatID, e.ThreadID, e.UserID, e.State, e.Attempts, e.CreatedAt.UnixNano(),
			nullTime(e.DeliveredAt))
	}
	undoAddedColumns(t, raw)
	mustExec(t, raw, `DELETE FROM schema_migrations WHERE version >= 8`)

	var logs testutil.Buffer
	s2, err := Open(ctx, s.Path(), Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	for _, want := range []string{"msg=\"migrating the schema\" migration=0008_outbox_rowid_table.sql", "msg=\"schema migrated\" from=7 to=" + latestMigration(t)} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	var withoutRowid int
	if err := raw.QueryRow(`SELECT wr FROM pragma_table_list WHERE name = 'outbox'`).Scan(&withoutRowid); err != nil {
		t.Fatal(err)
	}
	if withoutRowid != 0 {
		t.Error("the outbox is still a WITHOUT ROWID table")
	}
	// Every column of every entry survives.
	got, err := queryOutbox(ctx, raw, `SELECT `+outboxCols+` FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(old)
	want[1].State = persistence.DeliveryPending // 0012: a failed entry is sent once more
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("outbox after migrating, in id order (-before +after):\n%s", diff)
	}
	// The key is still unique: a re-sent entry changes nothing, a new one goes after the old.
	again := old[2]
	again.Text = "changed"
	storetest.MustCommit(t, s2, &persistence.AddOutbox{Entry: again},
		&persistence.AddOutbox{Entry: persistence.OutboxEntry{SessionKey: "k1", Seq: 3, SessionID: "s1",
			Kind: "reply", Text: "four", State: persistence.DeliveryPending, CreatedAt: t0.Add(4 * time.Second)}})
	texts := mustQueryStrings(t, raw, `SELECT text FROM outbox ORDER BY id`)
	if want := []string{"one", "two", "three", "four"}; !slices.Equal(texts, want) {
		t.Errorf("outbox texts in id order = %q, want %q", texts, want)
	}
	snap, err := s2.LoadSession(ctx, "k1", 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if snap.LastOutboxSeq != 3 || len(snap.Unconfirmed) != 2 || snap.Unconfirmed[0].Seq != 2 || snap.Unconfirmed[1].Seq != 3 {
		t.Errorf("k1 after migrating: last outbox seq %d, unconfirmed %+v; want 3 and seqs 2, 3", snap.LastOutboxSeq, snap.Unconfirmed)
	}
	// Lookups by key go through the key's index, never through the whole table.
	for _, q := range []string{lastOutboxSeqSQL, unconfirmedSQL} {
		plan := queryPlan(t, s2.writer, q, "k1")
		if slices.ContainsFunc(plan, func(step string) bool { return strings.Contains(step, "SCAN outbox") }) {
			t.Errorf("plan of %q scans the outbox: %q", q, plan)
		}
	}
}

// mustQueryStrings returns the first column of every row of q.
func mustQueryStrings(t *testing.T, db *sql.DB, q string, args ...any) []string {
	t.Helper()
	rows, err := db.Query(q, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var x string
		if err := rows.Scan(&x); err != nil {
			t.Fatal(err)
		}
		out = append(out, x)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// queryPlan returns the details of EXPLAIN QUERY PLAN q, one per step.
func queryPlan(t *testing.T, db *sql.DB, q string, args ...any) []string {
	t.Helper()
	rows, err := db.Query(`EXPLAIN QUERY PLAN `+q, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return plan
}

// nullTime is t in Unix nanoseconds, or NULL for the zero time, as the store writes times.
func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixNano()
}

// undoAddedColumns drops the columns migrations 0014, 0018 and 0019 add (SQLite has no ADD
// COLUMN IF NOT EXISTS), for a test that migrates again from a version before them; an outbox
// that the test made again in an older shape has none to drop.
func undoAddedColumns(t *testing.T, raw *sql.DB) {
	t.Helper()
	mustExec(t, raw, `ALTER TABLE messages DROP COLUMN probation_run`)
	mustExec(t, raw, `ALTER TABLE sessions DROP COLUMN reset_due_at`)
	mustExec(t, raw, `ALTER TABLE sessions DROP COLUMN reset_due_reason`)
	var n int
	if err := raw.QueryRow(`SELECT count(*) FROM pragma_table_info('outbox') WHERE name = 'continued'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n > 0 {
		mustExec(t, raw, `ALTER TABLE outbox DROP COLUMN continued`)
	}
}

// latestMigration returns the version the schema migrates to, as the log prints it.
func latestMigration(t *testing.T) string {
	t.Helper()
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(ms[len(ms)-1].Version)
}

// TestNewDatabaseIsPrivate: a database created in a data directory others may read (0755, as
// an operator or a package makes it) is readable by its owner only, and so are its WAL and
// shared memory, which hold the latest messages. Before, all three were 0644 under the usual
// umask: every conversation was world-readable.
func TestNewDatabaseIsPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "agentgate.db")
	s, err := Open(context.Background(), path, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	mustExec(t, MustRawDB(t, path), "SELECT count(*) FROM sessions") // the WAL and -shm exist while it is open
	for _, f := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if mode := fi.Mode().Perm(); mode&0o077 != 0 {
			t.Errorf("%s has mode %v, want none for group and others", filepath.Base(f), mode)
		}
	}
}

// TestOpenSaysWhenTheDatabaseIsNew: the start that makes a database says so, and a start on an
// existing one does not, so that an operator whose data_dir or store.dsn was mistyped sees at
// once that the conversations are elsewhere, not gone. An empty file (a restore's copy onto a
// full disk leaves one) becomes a new database too, which a warning says as it is: before, the
// line said there had been no database at that path (found by an operations walkthrough).
func TestOpenSaysWhenTheDatabaseIsNew(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "agentgate.db")
	const newLine = "store opened: a new, empty database"
	open := func() string {
		t.Helper()
		logs := &testutil.Buffer{}
		s, err := Open(ctx, path, Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		return logs.String()
	}
	if got := open(); !strings.Contains(got, newLine) {
		t.Errorf("the first open logged\n%s\nwant %q", got, newLine)
	}
	if got := open(); strings.Contains(got, newLine) || !strings.Contains(got, `msg="store opened"`) {
		t.Errorf("the second open logged\n%s\nwant a plain \"store opened\"", got)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	const emptyLine = `level=WARN msg="store opened: the database file was empty (0 bytes), so a new, empty database was made in it; ` +
		`if a copy or a restore wrote the file, it did not finish"`
	if got := open(); !strings.Contains(got, emptyLine) || strings.Contains(got, newLine) {
		t.Errorf("the open of an empty file logged\n%s\nwant %q, and not %q", got, emptyLine, newLine)
	}
	if got := open(); !strings.Contains(got, `msg="store opened"`) {
		t.Errorf("the open after it logged\n%s\nwant a plain \"store opened\"", got)
	}
}
