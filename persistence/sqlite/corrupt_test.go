package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// mustDatabaseOfPages writes a database of some 100 pages at path (sessions with messages of
// 1 KB) and closes it, its writes checkpointed into the file. It returns the page count.
func mustDatabaseOfPages(t *testing.T, path string) int64 {
	t.Helper()
	s, err := Open(context.Background(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		sid := fmt.Sprint("s", i)
		ops := []persistence.Op{&persistence.CreateSession{Session: newSession(sid, "k"+sid)}}
		for seq := int64(1); seq <= 80; seq++ {
			ops = append(ops, &persistence.AppendMessage{Message: userMsg(sid, seq, strings.Repeat("word ", 200))})
		}
		storetest.MustCommit(t, s, ops...)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size() / pageBytes
}

const pageBytes = 4096 // SQLite's default page size, which the store keeps

// mustOverwritePages writes count pages of random bytes over the file at path from page first
// (numbered from 1), as `dd if=/dev/urandom of=agentgate.db bs=4096 seek=first-1 conv=notrunc`
// does.
func mustOverwritePages(t *testing.T, path string, first, count int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	junk := make([]byte, count*pageBytes)
	r := rand.NewChaCha8([32]byte{42})
	_, _ = r.Read(junk)
	if _, err := f.WriteAt(junk, (first-1)*pageBytes); err != nil {
		t.Fatal(err)
	}
}

// TestOpenRefusesACorruptDatabase: a database whose pages were damaged (a failing disk, a
// copy gone wrong) is refused by Open with an error that calls it corrupt and says what to do;
// so is a file that is no database, or whose first page is damaged. Before, a database damaged
// past its schema opened, and the daemon ran on it, reported ready and answered every message
// 503 for ever, logging an outage that would pass (found by an operations walkthrough).
func TestOpenRefusesACorruptDatabase(t *testing.T) {
	for _, tt := range []struct {
		name   string
		damage func(t *testing.T, path string, pages int64)
		want   string
	}{
		{"pages in the middle overwritten", func(t *testing.T, path string, pages int64) {
			mustOverwritePages(t, path, pages/3, 10)
		}, "the database is corrupt ("},
		{"cut in half", func(t *testing.T, path string, pages int64) {
			if err := os.Truncate(path, pages/2*pageBytes); err != nil {
				t.Fatal(err)
			}
		}, "the database is corrupt ("},
		{"search index damaged", func(t *testing.T, path string, _ int64) {
			// As a write-ahead log replayed into another copy of the file left it (found by an
			// upgrade walkthrough): FTS5's own check fails the quick_check with SQLITE_ERROR.
			db, err := sql.Open("sqlite", path)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if _, err := db.Exec(`UPDATE messages_fts_config SET v = 0 WHERE k = 'version'`); err != nil {
				t.Fatal(err)
			}
		}, "the database's search index cannot be read (check the database: "},
		{"first page overwritten", func(t *testing.T, path string, pages int64) {
			mustOverwritePages(t, path, 1, 1)
		}, "the file is not a SQLite database, or its first page is damaged (check the database: file is not a database (26)): " +
			"check data_dir and store.dsn; if it is agentgate's database, "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agentgate.db")
			tt.damage(t, path, mustDatabaseOfPages(t, path))
			s, err := Open(context.Background(), path, Options{})
			if err == nil {
				s.Close()
				t.Fatal("Open of a damaged database succeeded, want it refused")
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.HasSuffix(err.Error(), corruptFix) {
				t.Errorf("Open = %v\nwant it to say %q and end %q", err, tt.want, corruptFix)
			}
		})
	}
}

// TestCorruptionFoundWhileRunningIsLoggedAsSuch: a database damaged while the store is open
// fails the reads that meet the damage as unavailable (the writes such an error refuses wait
// in the spool), and the store logs at Error, once a minute at most, that the database is
// corrupt, naming the file. Before, only its callers' lines told of it, as of an outage that
// passes (found by an operations walkthrough). From then on its Ping fails, saying the
// database is corrupt (persistence.ErrCorrupt), and Options.Corrupt has been called once: before,
// the daemon's /readyz said the store was ready and no metric moved.
func TestCorruptionFoundWhileRunningIsLoggedAsSuch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agentgate.db")
	pages := mustDatabaseOfPages(t, path)
	var logs testutil.Buffer
	var reported atomic.Int32
	s, err := Open(context.Background(), path, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Corrupt: func() { reported.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("Ping before the damage = %v", err)
	}
	// The reader connections have read none of these pages yet.
	mustOverwritePages(t, path, 3, pages-2)
	for range 3 {
		_, err = s.Transcript(context.Background(), "s2")
		if !errors.Is(err, persistence.ErrUnavailable) || !isCorrupt(err) {
			t.Fatalf("Transcript of a damaged database = %v, want a corrupt database's error, unavailable", err)
		}
	}
	want := fmt.Sprintf("level=ERROR msg=%q path=%s err=", msgCorrupt, path)
	if got := logs.String(); strings.Count(got, want) != 1 {
		t.Errorf("log after 3 reads of a damaged database:\n%s\nwant %q once", got, want)
	}
	err = s.Ping(context.Background())
	if !errors.Is(err, persistence.ErrCorrupt) || !strings.HasPrefix(err.Error(), "ping: the database is corrupt (") ||
		!strings.HasSuffix(err.Error(), "): stop the daemon, then "+corruptFix) {
		t.Errorf("Ping after the damage was met = %v, want persistence.ErrCorrupt saying so and what to do", err)
	}
	if n := reported.Load(); n != 1 {
		t.Errorf("Options.Corrupt called %d times, want once", n)
	}
}

// TestLargeDatabaseCheckIsLogged: the start's check of every page of a large database is
// logged before and after, so that its seconds are no silence (found by a scale walkthrough:
// 8 to 13 s per GB from a cold disk before any line); a small database's is not.
func TestLargeDatabaseCheckIsLogged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agentgate.db")
	s, err := Open(context.Background(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	open := func() string {
		var logs testutil.Buffer
		s, err := Open(context.Background(), path, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		return logs.String()
	}
	const before, after = "msg=\"checking every page of the database", "msg=\"database checked\" took="
	if got := open(); strings.Contains(got, before) || strings.Contains(got, after) {
		t.Errorf("a small database's open logged its check:\n%s", got)
	}
	defer func(was int64) { largeDatabase = was }(largeDatabase)
	largeDatabase = 1
	got := open()
	if i, j := strings.Index(got, before), strings.Index(got, after); i < 0 || j < i || !strings.Contains(got, "path="+path) {
		t.Errorf("a large database's open logged:\n%s\nwant %q, then %q", got, before, after)
	}
}
