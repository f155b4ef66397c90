package sqlite

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/google/go-cmp/cmp"
)

// Never is an indexing policy under which Commit never indexes: only Search, Close and Open do.
var never = Options{IndexRows: 1 << 30, IndexDelay: 1000 * time.Hour, CheckpointInterval: time.Hour}

// MustIndex indexes every message waiting for the search index, as Search does first.
func MustIndex(t testing.TB, s *Store) {
	t.Helper()
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	if _, err := s.indexAll(context.Background()); err != nil {
		t.Fatalf("index: %v", err)
	}
}

// indexState returns the watermark, the number of indexed messages and the highest message id,
// read behind the Store's back.
func indexState(t testing.TB, path string) (watermark, indexed, maxID int64) {
	t.Helper()
	err := MustRawDB(t, path).QueryRow(`SELECT (SELECT last_id FROM fts_watermark),
		(SELECT COUNT(*) FROM messages_fts_docsize), (SELECT COALESCE(MAX(id), 0) FROM messages)`).
		Scan(&watermark, &indexed, &maxID)
	if err != nil {
		t.Fatalf("read index state: %v", err)
	}
	return watermark, indexed, maxID
}

func msgs(sid string, from, to int64, text string) []persistence.Op {
	var ops []persistence.Op
	for seq := from; seq <= to; seq++ {
		ops = append(ops, &persistence.AppendMessage{Message: userMsg(sid, seq, fmt.Sprintf("%s %d", text, seq))})
	}
	return ops
}

func seqs(ms []persistence.Message) []int64 {
	var out []int64
	for _, m := range ms {
		out = append(out, m.Seq)
	}
	return out
}

// TestSearchFindsUnindexedMessages: a message committed a moment ago, not yet indexed in bulk,
// is found by Search, which indexes it first.
func TestSearchFindsUnindexedMessages(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, never)
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
	storetest.MustCommit(t, s, &persistence.AppendMessage{Message: userMsg("s1", 1, "okapi one")})
	storetest.MustCommit(t, s, &persistence.AppendMessage{Message: userMsg("s1", 2, "okapi two")})
	if w, n, _ := indexState(t, s.Path()); w != 0 || n != 0 {
		t.Fatalf("after two commits: watermark %d, %d rows indexed; want 0, 0 (Commit must not index under this policy)", w, n)
	}
	ms, err := s.Search(ctx, "okapi", 10)
	if err != nil {
		t.Fatalf("Search: %v", err)
	}
	if got, want := seqs(ms), []int64{1, 2}; !cmp.Equal(got, want) {
		t.Errorf("Search(okapi) seqs = %v, want %v", got, want)
	}
	if w, n, maxID := indexState(t, s.Path()); w != maxID || n != 2 {
		t.Errorf("after Search: watermark %d (max id %d), %d rows indexed; want the max id, 2", w, maxID, n)
	}
	// The next message is found too, although nothing but Search indexes.
	storetest.MustCommit(t, s, &persistence.AppendMessage{Message: userMsg("s1", 3, "okapi three")})
	if ms, err := s.Search(ctx, "three", 10); err != nil || !cmp.Equal(seqs(ms), []int64{3}) {
		t.Errorf("Search(three) = %v, %v, want seq 3", seqs(ms), err)
	}
}

// TestIndexPolicy: Commit indexes in bulk once IndexRows rows wait or the oldest has waited
// IndexDelay, at most a pass limit per Commit.
func TestIndexPolicy(t *testing.T) {
	type step struct {
		advance     time.Duration
		ops         []persistence.Op
		wantIndexed int64
	}
	tests := []struct {
		name  string
		opts  Options
		limit int // overrides the pass limit when > 0
		steps []step
	}{
		{"by count", Options{IndexRows: 10, IndexDelay: time.Hour}, 0, []step{
			{0, msgs("s1", 1, 4, "w"), 0},
			{0, msgs("s1", 5, 9, "w"), 0},
			{0, msgs("s1", 10, 10, "w"), 10},
			{0, msgs("s1", 11, 15, "w"), 10},
			{0, msgs("s1", 16, 27, "w"), 27},
		}},
		{"bounded pass", Options{IndexRows: 2, IndexDelay: time.Hour}, 3, []step{
			{0, msgs("s1", 1, 8, "w"), 3},
			{0, []persistence.Op{&persistence.SetTitle{SessionID: "s1", Title: "x"}}, 6},
			{0, []persistence.Op{&persistence.SetTitle{SessionID: "s1", Title: "y"}}, 8},
			{0, []persistence.Op{&persistence.SetTitle{SessionID: "s1", Title: "z"}}, 8},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			opts.CheckpointInterval = time.Hour
			s := MustOpen(t, opts)
			clock := testutil.NewClock(t0)
			s.now = clock.Now
			if tc.limit > 0 {
				s.idx.limit = tc.limit
			}
			storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
			for i, st := range tc.steps {
				clock.Advance(st.advance)
				storetest.MustCommit(t, s, st.ops...)
				if _, n, _ := indexState(t, s.Path()); n != st.wantIndexed {
					t.Errorf("step %d: %d rows indexed, want %d", i, n, st.wantIndexed)
				}
			}
		})
	}
}

// TestIndexTimer: the rows a quiet store holds are indexed IndexDelay after the oldest of them
// was committed, without another commit, so a read-only Search (agentgate sessions search beside
// a running daemon) finds them.
func TestIndexTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := MustOpen(t, Options{IndexRows: 1000, IndexDelay: time.Second, CheckpointInterval: time.Hour})
		storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
		indexed := func(when string, want int64) {
			t.Helper()
			synctest.Wait()
			if _, n, _ := indexState(t, s.Path()); n != want {
				t.Errorf("%s: %d rows indexed, want %d", when, n, want)
			}
		}
		storetest.MustCommit(t, s, msgs("s1", 1, 1, "w")...)
		time.Sleep(900 * time.Millisecond)
		storetest.MustCommit(t, s, msgs("s1", 2, 2, "w")...)
		indexed("0.9 s after the first row", 0)
		time.Sleep(150 * time.Millisecond)
		indexed("1.05 s after the first row", 2)

		storetest.MustCommit(t, s, msgs("s1", 3, 4, "w")...)
		time.Sleep(999 * time.Millisecond)
		indexed("0.999 s after the next rows", 2)
		time.Sleep(2 * time.Millisecond)
		indexed("1.001 s after the next rows", 4)

		ro, err := OpenReadOnly(t.Context(), s.Path())
		if err != nil {
			t.Fatalf("OpenReadOnly: %v", err)
		}
		defer ro.Close()
		if ms, err := ro.Search(t.Context(), "w", 10); err != nil || len(ms) != 4 {
			t.Errorf("read-only Search(w) = %d rows, %v; want all 4", len(ms), err)
		}
	})
}

// abandon releases a store's files as a killed process would: without Close, so nothing that
// Close does (indexing what waits) happens.
func abandon(t testing.TB, s *Store) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if err := s.closeAll(); err != nil {
		t.Fatalf("release the store's files: %v", err)
	}
}

// copyCrashImage copies the database and its WAL, as they are on disk now, into a new directory:
// what a machine that lost power at this moment would find (the -shm is rebuilt on open).
func copyCrashImage(t testing.TB, s *Store) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "agentgate.db")
	for _, suffix := range []string{"", "-wal"} {
		in, err := os.Open(s.Path() + suffix)
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.Create(dst + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, in); err != nil {
			t.Fatal(err)
		}
		in.Close()
		if err := out.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// TestCrashBeforeIndexing: messages committed but not yet indexed when the process dies are
// indexed by the next Open, and every one of them is searchable.
func TestCrashBeforeIndexing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		crash func(t *testing.T, s *Store) string // returns the path to reopen
	}{
		{"process dies", func(t *testing.T, s *Store) string { abandon(t, s); return s.Path() }},
		{"power lost", func(t *testing.T, s *Store) string { return copyCrashImage(t, s) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := MustOpen(t, never)
			storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
			storetest.MustCommit(t, s, msgs("s1", 1, 3, "indexed before the crash")...)
			MustIndex(t, s)
			for seq := int64(4); seq <= 40; seq += 4 {
				storetest.MustCommit(t, s, msgs("s1", seq, seq+3, "committed, never indexed")...)
			}
			path := tc.crash(t, s)
			if w, n, _ := indexState(t, path); w != 3 || n != 3 {
				t.Fatalf("crash image: watermark %d, %d rows indexed, want 3, 3", w, n)
			}

			var logs testutil.Buffer
			s2, err := Open(ctx, path, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatalf("reopen after the crash: %v", err)
			}
			defer s2.Close()
			// Open itself indexed the backlog: read before any Search.
			if w, n, maxID := indexState(t, path); w != maxID || n != 43 {
				t.Errorf("after reopening: watermark %d (max id %d), %d rows indexed, want the max id, 43", w, maxID, n)
			}
			if !strings.Contains(logs.String(), "search index caught up") || !strings.Contains(logs.String(), "rows=40") {
				t.Errorf("Open did not log the 40 rows it indexed; logs:\n%s", logs.String())
			}
			ms, err := s2.Search(ctx, "committed", 100)
			if err != nil {
				t.Fatal(err)
			}
			if len(ms) != 40 {
				t.Errorf("Search(committed) after the crash = %d messages, want 40", len(ms))
			}
			if err := ftsIntegrity(t, s2, 1); err != nil {
				t.Errorf("integrity check against the content after the crash: %v", err)
			}
		})
	}
}

// TestCloseIndexesPending: Close indexes what waits, so the file is fully indexed without the
// next Open's help.
func TestCloseIndexesPending(t *testing.T) {
	s := MustOpen(t, never)
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
	storetest.MustCommit(t, s, msgs("s1", 1, 5, "waiting")...)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if w, n, maxID := indexState(t, s.Path()); w != maxID || n != 5 {
		t.Errorf("after Close: watermark %d (max id %d), %d rows indexed, want the max id, 5", w, maxID, n)
	}
}

// TestWatermarkWithFailedGroups: groups that fail and roll back free rowids that the next rows
// take, also at the top of the table; the watermark never skips a committed row and never
// indexes a rolled-back one, whether indexing runs at every commit or only before Search.
func TestWatermarkWithFailedGroups(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"index every commit", Options{IndexRows: 1, CheckpointInterval: time.Hour}},
		{"index before search", never},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := MustOpen(t, tc.opts)
			storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
			batches := [][][]persistence.Op{
				{ // a failed group between good ones
					{&persistence.AppendMessage{Message: userMsg("s1", 1, "kept alpha")}},
					{&persistence.AppendMessage{Message: userMsg("s1", 2, "lost unicorn")}, unknownOp{}},
					{&persistence.AppendMessage{Message: userMsg("s1", 3, "kept beta")}},
				},
				{ // the last group fails: its rowids are the highest, and taken again next
					{&persistence.AppendMessage{Message: userMsg("s1", 4, "kept gamma")}},
					{&persistence.AppendMessage{Message: userMsg("s1", 5, "lost unicorn")},
						&persistence.AppendMessage{Message: userMsg("s1", 6, "lost unicorn")}, unknownOp{}},
				},
				{ // every group fails
					{&persistence.AppendMessage{Message: userMsg("s1", 5, "lost unicorn")}, unknownOp{}},
				},
				{
					{&persistence.AppendMessage{Message: userMsg("s1", 5, "kept delta")}},
					{&persistence.AppendMessage{Message: userMsg("s1", 6, "kept epsilon")}},
				},
			}
			for i, b := range batches {
				errs := s.Commit(ctx, b)
				for g, err := range errs {
					failing := len(b[g]) > 0 && b[g][len(b[g])-1] == (unknownOp{})
					if (err != nil) != failing {
						t.Fatalf("batch %d group %d: Commit = %v, want an error: %v", i, g, err, failing)
					}
				}
				if tc.opts.IndexRows == 1 {
					if w, n, maxID := indexState(t, s.Path()); w != maxID || n != maxID {
						t.Errorf("batch %d: watermark %d, %d rows indexed, max id %d, want all equal", i, w, n, maxID)
					}
				}
			}
			ms, err := s.Search(ctx, "kept", 10)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := seqs(ms), []int64{1, 3, 4, 5, 6}; !cmp.Equal(got, want) {
				t.Errorf("Search(kept) seqs = %v, want %v", got, want)
			}
			if ms, err := s.Search(ctx, "unicorn", 10); err != nil || len(ms) != 0 {
				t.Errorf("Search(unicorn) = %v, %v, want nothing: a rolled-back row was indexed", seqs(ms), err)
			}
			if err := ftsIntegrity(t, s, 1); err != nil {
				t.Errorf("integrity check against the content: %v", err)
			}
		})
	}
}

// TestPruneLowersWatermark: when pruning deletes the highest rows, SQLite hands their rowids
// out again; those new rows must be indexed, and rows pruned before they were indexed must not
// be deleted from the index.
func TestPruneLowersWatermark(t *testing.T) {
	for _, tc := range []struct {
		name         string
		indexedFirst bool
	}{
		{"indexed rows pruned", true},
		{"waiting rows pruned", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := MustOpen(t, never)
			storetest.MustCommit(t, s,
				&persistence.CreateSession{Session: newSession("cur", "k")},
				&persistence.PutRoute{Route: persistence.Route{Key: "k", SessionID: "cur", Generation: 2}},
				&persistence.AppendMessage{Message: userMsg("cur", 1, "narwhal one")})
			storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("old", "k")})
			ops := msgs("old", 1, 5, "walrus")
			ops = append(ops, &persistence.SetMessageStatus{SessionID: "old", Seqs: []int64{1, 2, 3, 4, 5}, Status: persistence.StatusDone},
				&persistence.EndSession{SessionID: "old", Reason: persistence.EndNewCommand, At: t0})
			storetest.MustCommit(t, s, ops...)
			if tc.indexedFirst {
				MustIndex(t, s)
			}
			if n, err := s.PruneSessions(ctx, t0.Add(time.Second), 0); err != nil || n != 1 {
				t.Fatalf("PruneSessions = %d, %v, want 1, nil", n, err)
			}
			w, _, maxID := indexState(t, s.Path())
			if maxID != 1 || w > maxID {
				t.Fatalf("after pruning the top rows: watermark %d, max id %d, want max id 1 and the watermark at most that", w, maxID)
			}
			// The next rows take the pruned rowids.
			storetest.MustCommit(t, s, msgs("cur", 2, 4, "narwhal")...)
			ms, err := s.Search(ctx, "narwhal", 10)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := seqs(ms), []int64{1, 2, 3, 4}; !cmp.Equal(got, want) {
				t.Errorf("Search(narwhal) seqs = %v, want %v", got, want)
			}
			if ms, err := s.Search(ctx, "walrus", 10); err != nil || len(ms) != 0 {
				t.Errorf("Search(walrus) = %v, %v, want nothing", seqs(ms), err)
			}
			if err := ftsIntegrity(t, s, 1); err != nil {
				t.Errorf("integrity check against the content: %v", err)
			}
		})
	}
}

// TestMigrationStartsWatermarkAtTheTop: a store from before migration 0006 had every message
// indexed by its commit; the migration must not index them again (duplicate entries corrupt an
// external-content index).
func TestMigrationStartsWatermarkAtTheTop(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{CheckpointInterval: time.Hour})
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
	storetest.MustCommit(t, s, msgs("s1", 1, 6, "ibex")...)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	raw := MustRawDB(t, s.Path())
	mustExec(t, raw, `DROP TABLE fts_watermark`)
	undoAddedColumns(t, raw)
	mustExec(t, raw, `DELETE FROM schema_migrations WHERE version >= 6`) // as before 0006
	s2, err := Open(ctx, s.Path(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if w, n, maxID := indexState(t, s.Path()); w != maxID || n != 6 {
		t.Errorf("after migrating: watermark %d (max id %d), %d rows indexed, want the max id, 6", w, maxID, n)
	}
	if ms, err := s2.Search(ctx, "ibex", 10); err != nil || len(ms) != 6 {
		t.Errorf("Search(ibex) = %d messages, %v, want 6", len(ms), err)
	}
	if err := ftsIntegrity(t, s2, 1); err != nil {
		t.Errorf("integrity check against the content: %v", err)
	}
}

// TestBrokenWatermarkDoesNotBlockWrites: without its watermark the indexer cannot run; commits
// and Search over what is indexed still work, and the failure is logged, rate-limited.
func TestBrokenWatermarkDoesNotBlockWrites(t *testing.T) {
	ctx := context.Background()
	var logs testutil.Buffer
	s := MustOpen(t, Options{IndexRows: 1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	storetest.MustCommit(t, s,
		&persistence.CreateSession{Session: newSession("s1", "k1")},
		&persistence.AppendMessage{Message: userMsg("s1", 1, "indexed before the damage")})
	mustExec(t, MustRawDB(t, s.Path()), `DROP TABLE fts_watermark`)
	for seq := int64(2); seq <= 4; seq++ {
		storetest.MustCommit(t, s, &persistence.AppendMessage{Message: userMsg("s1", seq, "after the damage")})
	}
	if ms, err := s.Search(ctx, "damage", 10); err != nil || !cmp.Equal(seqs(ms), []int64{1}) {
		t.Errorf("Search(damage) = %v, %v, want seq 1 (what was indexed)", seqs(ms), err)
	}
	if n := strings.Count(logs.String(), "fts index pass failed"); n != 1 {
		t.Errorf("logged %d index pass warnings, want 1 (rate-limited); logs:\n%s", n, logs.String())
	}
	if ms, err := s.Transcript(ctx, "s1"); err != nil || len(ms) != 4 {
		t.Errorf("Transcript = %d rows, %v, want 4", len(ms), err)
	}
	if n, err := s.PruneSessions(ctx, t0, 0); err != nil || n != 0 {
		t.Errorf("PruneSessions without the watermark = %d, %v, want 0, nil", n, err)
	}
}

// TestSearchWhileCommitting runs Search next to Commit for the race detector: every message is
// found by a Search that starts after its commit returned.
func TestSearchWhileCommitting(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{IndexRows: 7})
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, err := s.Search(ctx, "common", 5); err != nil {
				t.Errorf("Search(common): %v", err)
				return
			}
		}
	})
	for seq := int64(1); seq <= 40; seq++ {
		word := fmt.Sprintf("word%d", seq)
		storetest.MustCommit(t, s, &persistence.AppendMessage{Message: userMsg("s1", seq, "common "+word)})
		if ms, err := s.Search(ctx, word, 10); err != nil || !cmp.Equal(seqs(ms), []int64{seq}) {
			t.Errorf("Search(%s) right after its commit = %v, %v, want seq %d", word, seqs(ms), err, seq)
		}
	}
	close(done)
	wg.Wait()
}
