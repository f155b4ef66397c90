package sqlite

import (
	"context"
	"database/sql"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestLastingCheckpointFailureIsLoggedOnceAMinute: the checkpointer runs every second, so a
// checkpoint that keeps failing logged a WRN line every second for as long as it lasted. It
// is logged once a minute now, with the failures it stands for.
func TestLastingCheckpointFailureIsLoggedOnceAMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		db, err := sql.Open("sqlite", dsn(path))
		if err != nil {
			t.Fatal(err)
		}
		db.Close() // every checkpoint fails: sql: database is closed
		var logs testutil.Buffer
		c := startCheckpointer(db, func(*sql.Conn) {}, path, time.Second, slog.New(slog.NewTextHandler(&logs, nil)))
		time.Sleep(150 * time.Second)
		c.stop()
		if n := strings.Count(logs.String(), "wal checkpoint failed"); n != 3 {
			t.Errorf("150 failed checkpoints logged %d lines, want 3 (one a minute):\n%s", n, logs.String())
		}
		if !strings.Contains(logs.String(), "failures=60") {
			t.Errorf("no line counts the minute's failures:\n%s", logs.String())
		}
	})
}

// TestBurstOfCommitsIsCheckpointedAsItGoes: a burst of small commits (a spool replay, one
// transaction a batch) wakes the checkpointer every burstPages pages, so the WAL file, which
// keeps the size of the most frames written between two checkpoints, stays about the size of
// SQLite's own auto-checkpoint. Before, only the one-second tick checkpointed, and a replay wrote
// 25 MB of WAL a second for 0.7 MB of data (found by an operations walkthrough). The bubble's
// clock stands still: no tick comes during the burst.
func TestBurstOfCommitsIsCheckpointedAsItGoes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := MustOpen(t, Options{Synchronous: "normal"})
		storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
		text := strings.Repeat("word ", 200)
		for seq := int64(1); seq <= 2000; seq++ {
			storetest.MustCommit(t, s, &persistence.AppendMessage{Message: userMsg("s1", seq, text)})
			synctest.Wait() // a checkpointer woken by the commit checkpoints now
		}
		fi, err := os.Stat(s.Path() + "-wal")
		if err != nil {
			t.Fatal(err)
		}
		const frame = 24 + 4096
		if limit := int64(burstPages+100) * frame; fi.Size() > limit {
			t.Errorf("WAL after 2,000 commits of 1 KB: %d bytes, want at most %d (about %d pages)", fi.Size(), limit, burstPages)
		}
	})
}

// TestCheckpointStoppedMidwayLeavesNoWAL: a checkpoint whose context ends while it runs (the
// checkpointer's stop, as the store closes) finishes; it is not interrupted, and the store then
// closes leaving no WAL: the database file alone holds every commit, as an operator who copies
// it after a clean stop expects. Before, the interrupt made database/sql drop the writer's
// connection with the write statements still prepared on it, which SQLite then keeps open,
// holding its lock: the last close could not fold the WAL back and left it with the last
// commits in it, and a test that overwrote a closed database's first page found the page read
// back whole from the WAL now and then (CI). A reader's snapshot keeps the store's own
// checkpoints from copying the commits, so that the one here has 15 MB to copy when its context
// ends 2 ms in.
func TestCheckpointStoppedMidwayLeavesNoWAL(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agentgate.db")
	s, err := Open(context.Background(), path, Options{CheckpointInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	reader := MustRawDB(t, path)
	rtx, err := reader.Begin()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := rtx.QueryRow("SELECT count(*) FROM sessions").Scan(&n); err != nil { // its snapshot
		t.Fatal(err)
	}
	const messages = 500
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
	text := strings.Repeat("word ", 4000)
	for seq := int64(1); seq <= messages; seq += 100 {
		var ops []persistence.Op
		for i := range int64(100) {
			ops = append(ops, &persistence.AppendMessage{Message: userMsg("s1", seq+i, text)})
		}
		storetest.MustCommit(t, s, ops...)
	}
	if err := rtx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := reader.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
	defer cancel()
	_, _ = checkpoint(ctx, s.writer, s.dropWriter, "PASSIVE")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	mustLeaveNoWAL(t, path, messages)
}

// TestWriteCutShortByItsContextLeavesNoWAL: a write on the writer's connection whose context
// ends while it waits for another process's lock (BeginRun's retry, with half a second; an
// operator's Ctrl-C of a CLI command) fails, and the store still closes leaving no WAL. Before,
// the interrupted connection went back to database/sql unusable and was dropped with the write
// statements prepared on it, which SQLite keeps open, holding its lock (found by a review).
func TestWriteCutShortByItsContextLeavesNoWAL(t *testing.T) {
	for _, tt := range []struct {
		name  string
		write func(ctx context.Context, s *Store) error
	}{
		{"EndRun", func(ctx context.Context, s *Store) error { return s.EndRun(ctx, "run-1") }},
		{"BeginRun", func(ctx context.Context, s *Store) error {
			_, err := s.BeginRun(ctx, "run-2", time.Now())
			return err
		}},
		{"Pardon", func(ctx context.Context, s *Store) error {
			_, err := s.Pardon(ctx, "")
			return err
		}},
		{"Claim", func(ctx context.Context, s *Store) error {
			_, err := s.Claim(ctx, "k1", "member-1", time.Now(), nil)
			return err
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agentgate.db")
			s, err := Open(context.Background(), path, Options{CheckpointInterval: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")},
				&persistence.AppendMessage{Message: userMsg("s1", 1, "hello")})
			other := MustRawDB(t, path)
			lock, err := other.Begin()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := lock.Exec("DELETE FROM sessions WHERE id = 'none'"); err != nil { // takes the write lock
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if err := tt.write(ctx, s); err == nil {
				t.Fatal("the write succeeded while another connection held the write lock")
			}
			if err := lock.Rollback(); err != nil {
				t.Fatal(err)
			}
			if err := other.Close(); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(path + "-wal"); err == nil {
				t.Errorf("a clean close left the WAL (%d bytes)", fi.Size())
			}
		})
	}
}

// TestDroppedWriterLeavesNoWAL: when the store drops the writer's connection on purpose (a
// setting it changed for a ping, a checkpoint or a prune step could not be set back:
// dropWriter), commits go on on a fresh connection, and the store still closes leaving no WAL,
// the database file alone holding every commit. Before, the connection was dropped with the
// write statements still prepared on it, which SQLite then keeps open, holding its lock, so
// that the last close could not fold the WAL back.
func TestDroppedWriterLeavesNoWAL(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agentgate.db")
	s, err := Open(context.Background(), path, Options{CheckpointInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")},
		&persistence.AppendMessage{Message: userMsg("s1", 1, "before")})
	conn, err := s.writer.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.dropWriter(conn)
	_ = conn.Close() // sql.ErrConnDone: dropWriter closed it
	storetest.MustCommit(t, s, &persistence.AppendMessage{Message: userMsg("s1", 2, "after")})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	mustLeaveNoWAL(t, path, 2)
}

// mustLeaveNoWAL checks that the store closed at path left no WAL, and that the database file
// alone, copied as an operator's simplest backup would, holds the messages it committed.
func mustLeaveNoWAL(t *testing.T, path string, messages int) {
	t.Helper()
	if fi, err := os.Stat(path + "-wal"); err == nil {
		t.Errorf("a clean close left the WAL (%d bytes)", fi.Size())
	}
	alone := filepath.Join(t.TempDir(), "copy.db")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(alone, b, 0o600); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := MustRawDB(t, alone).QueryRow("SELECT count(*) FROM messages").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != messages {
		t.Errorf("the database file alone holds %d messages, want %d", n, messages)
	}
}
