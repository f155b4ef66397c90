package sqlite

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// fileTakings are the ways a test takes the database file at path from under the open store:
// deleted, or another database renamed over it (mv other.db agentgate.db).
var fileTakings = []struct {
	name string
	what string // how the goneError says it, after "the database file PATH "
	// take makes path name no database, or another one, and returns the number of
	// messages of the database then at path (-1: none is).
	take func(t *testing.T, path string) int
}{
	{"deleted", "was deleted", func(t *testing.T, path string) int {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		return -1
	}},
	{"replaced by a rename", "was replaced by another file", func(t *testing.T, path string) int {
		renameAnotherOver(t, path, &persistence.CreateSession{Session: newSession("o1", "ko1")},
			&persistence.AppendMessage{Message: userMsg("o1", 1, "other")})
		return 1
	}},
}

// renameAnotherOver renames another database, which holds what ops write, over the one at path
// (mv other.db agentgate.db).
func renameAnotherOver(t *testing.T, path string, ops ...persistence.Op) {
	t.Helper()
	other := filepath.Join(filepath.Dir(path), "other.db")
	o, err := Open(context.Background(), other, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) > 0 {
		storetest.MustCommit(t, o, ops...)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other, path); err != nil {
		t.Fatal(err)
	}
}

// TestCommitToADeletedOrReplacedFileFails: once the database file is deleted, or another file is
// renamed over it, while the store is open, the next commit, which SQLite takes into the old
// file (no one can open it again, and it goes when the store closes), fails every group of its
// batch as unavailable (so the persistence actor spools them, not acknowledging them as
// stored) with words that say what happened and what to do. From then on Ping fails with
// those words, every Commit fails at once without writing anything, every read fails alike
// (the old file holds the commit reported failed), the store logs it at
// Error once (at most once a minute), and Options.Corrupt has been called once. Before, the
// store went on committing into the old file, and the daemon acknowledged every message
// while all of it was lost at the next start (found by black-box soaks).
func TestCommitToADeletedOrReplacedFileFails(t *testing.T) {
	for _, tt := range fileTakings {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agentgate.db")
			var logs testutil.Buffer
			var reported atomic.Int32
			s, err := Open(context.Background(), path, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)),
				Corrupt: func() { reported.Add(1) }})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")},
				&persistence.AppendMessage{Message: userMsg("s1", 1, "before")})
			old, err := os.Open(path) // the old file, to count what it holds once the store is closed
			if err != nil {
				t.Fatal(err)
			}
			defer old.Close()
			atPath := tt.take(t, path)

			msg := func(seq int64) []persistence.Op {
				return []persistence.Op{&persistence.AppendMessage{Message: userMsg("s1", seq, fmt.Sprint("after ", seq))}}
			}
			check := func(what string, errs []error, n int) {
				t.Helper()
				if len(errs) != n {
					t.Fatalf("%s returned %d errors, want %d", what, len(errs), n)
				}
				for i, err := range errs {
					if !errors.Is(err, persistence.ErrUnavailable) || !errors.Is(err, persistence.ErrFileGone) ||
						!strings.Contains(err.Error(), "the database file "+path+" "+tt.what) ||
						!strings.Contains(err.Error(), "wait in the spool") ||
						!strings.Contains(err.Error(), "stop the daemon, put the database back at that path, and start") {
						t.Errorf("%s group %d = %v\nwant it unavailable, saying the file %s and what to do", what, i, err, tt.what)
					}
				}
			}
			// The commit that finds it: into the old file, but reported failed.
			check("Commit after the file went", s.Commit(context.Background(), [][]persistence.Op{msg(2), msg(3)}), 2)
			err = s.Ping(context.Background())
			if !errors.Is(err, persistence.ErrFileGone) || !strings.HasPrefix(err.Error(), "ping: the database file "+path+" "+tt.what) {
				t.Errorf("Ping after the file went = %v, want persistence.ErrFileGone saying it %s", err, tt.what)
			}
			check("a later Commit", s.Commit(context.Background(), [][]persistence.Op{msg(4)}), 1)
			check("a later Commit", s.Commit(context.Background(), [][]persistence.Op{msg(5)}), 1)

			want := fmt.Sprintf("level=ERROR msg=%q path=%s err=", msgGone, path)
			if got := logs.String(); strings.Count(got, want) != 1 {
				t.Errorf("log after 3 commits refused:\n%s\nwant %q once", got, want)
			}
			if n := reported.Load(); n != 1 {
				t.Errorf("Options.Corrupt called %d times, want once", n)
			}
			// Nor is anything read from the old file, which holds the commit reported failed:
			// a session that looks for its refused message (was it stored after all?) must not
			// find it there and take it.
			if m, err := s.FindInbound(context.Background(), "http", "c", "s1-2"); m != nil ||
				!errors.Is(err, persistence.ErrUnavailable) || !errors.Is(err, persistence.ErrFileGone) {
				t.Errorf("FindInbound of a message of the commit that found the file gone = %v, %v; want it unavailable, "+
					"the file gone", m, err)
			}
			if msgs, err := s.Transcript(context.Background(), "s1"); msgs != nil || !errors.Is(err, persistence.ErrFileGone) {
				t.Errorf("Transcript after the file went = %d messages, %v; want persistence.ErrFileGone", len(msgs), err)
			}

			// The store's close leaves no write-ahead log of the old file at the path, which the
			// next open would replay into the file there (SQLite does not checkpoint a moved file
			// at its close): the file renamed over it is intact, and the old file holds every
			// commit.
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if atPath >= 0 {
				if got, err := countMessagesAt(t, path); err != nil || got != atPath {
					t.Errorf("the file renamed over the database holds %d messages (%v), want its own %d", got, err, atPath)
				}
			}
			if got, err := countMessages(t, old); err != nil || got != 3 {
				t.Errorf("the old file, once the store is closed, holds %d messages (%v), want 3", got, err)
			}
		})
	}
}

// countMessages counts the messages of the database file f, deleted or not: it copies it out
// and opens the copy.
func countMessages(t *testing.T, f *os.File) (int, error) {
	t.Helper()
	cp := filepath.Join(t.TempDir(), "copy.db")
	out, err := os.Create(cp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, io.NewSectionReader(f, 0, 1<<40)); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return countMessagesAt(t, cp)
}

// countMessagesAt checks the database at path (PRAGMA quick_check) and counts its messages.
func countMessagesAt(t *testing.T, path string) (int, error) {
	t.Helper()
	db := MustRawDB(t, path)
	var check string
	if err := db.QueryRow("PRAGMA quick_check").Scan(&check); err != nil {
		return 0, err
	}
	if check != "ok" {
		return 0, fmt.Errorf("quick_check: %s", check)
	}
	var n int
	err := db.QueryRow("SELECT count(*) FROM messages").Scan(&n)
	return n, err
}

// TestDeletedFileFoundWithoutACommit: the store finds its database file deleted without a
// commit to find it: Ping looks (an idle daemon's /readyz says so at once), and a connection
// a pool opens after the file went fails as unavailable rather than make a new, empty file at
// the path (a reader's read then failed with "no such table", a writer's commit was refused
// for good instead of spooled, and the next start took the empty file for a new database), and
// the commit that fails so says that the file was deleted. Nothing is written after that.
func TestDeletedFileFoundWithoutACommit(t *testing.T) {
	for _, tt := range []struct {
		name string
		find func(t *testing.T, s *Store) error // the first failure after the file went
	}{
		{"by Ping", func(t *testing.T, s *Store) error { return s.Ping(context.Background()) }},
		{"by a commit on a new writer's connection", func(t *testing.T, s *Store) error {
			conn, err := s.writer.Conn(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			s.dropWriter(conn) // as a setting that could not be restored has it dropped
			_ = conn.Close()
			errs := s.Commit(context.Background(), [][]persistence.Op{{&persistence.AppendMessage{Message: userMsg("s1", 2, "after")}}})
			return errs[0]
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := MustOpen(t, Options{CheckpointInterval: time.Hour})
			storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")},
				&persistence.AppendMessage{Message: userMsg("s1", 1, "before")})
			held, err := s.reader.Conn(context.Background()) // the pool's connection on the old file
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			if err := os.Remove(s.path); err != nil {
				t.Fatal(err)
			}

			// A reader's connection opened now.
			fresh, err := s.reader.Conn(context.Background())
			if err == nil {
				var n int
				err = fresh.QueryRowContext(context.Background(), "SELECT count(*) FROM messages").Scan(&n)
				fresh.Close()
			}
			if !IsUnavailable(err) {
				t.Errorf("a read on a reader's connection opened after the file was deleted = %v, want it unavailable", err)
			}

			err = tt.find(t, s)
			if !errors.Is(err, persistence.ErrFileGone) || !errors.Is(err, persistence.ErrUnavailable) ||
				!strings.Contains(err.Error(), "the database file "+s.path+" was deleted: ") {
				t.Errorf("first failure after the file was deleted = %v, want it to say so", err)
			}
			if _, err := os.Stat(s.path); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("stat of the deleted database's path = %v, want it still absent", err)
			}
			errs := s.Commit(context.Background(), [][]persistence.Op{{&persistence.AppendMessage{Message: userMsg("s1", 3, "later")}}})
			if !errors.Is(errs[0], persistence.ErrFileGone) {
				t.Errorf("a later Commit = %v, want persistence.ErrFileGone", errs[0])
			}
			var n int
			if err := held.QueryRowContext(context.Background(), "SELECT count(*) FROM messages").Scan(&n); err != nil || n != 1 {
				t.Errorf("the old file holds %d messages (%v), want the 1 before", n, err)
			}
			held.Close()
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(s.path + "-wal"); err == nil && fi.Size() > 0 {
				t.Errorf("the store's close left %d bytes of the old file's write-ahead log at the path, want none", fi.Size())
			}
		})
	}
}

// TestEveryWriteFindsTheFileGone: each write transaction of the store besides Commit's batches
// (the record of a run and of its clean stop, a claim, a pull back, a pardon, a prune step, a
// pass of the search index), run once the database file is deleted or replaced under the open
// store, fails with persistence.ErrFileGone, unavailable, in words that say so, and returns
// nothing of what it did; the store logs it once, calls Options.Corrupt once, and refuses the
// next Commit at once. So does an admin command's store (sessions pardon with the daemon
// stopped), in the command's words: nothing waits in a spool, and no daemon is to be stopped.
// Before, only Commit looked after its commit: these went into the old file, which goes when
// the store closes, and said they were done (a run recorded, a key claimed, a session pruned,
// messages pardoned), and nothing found the file gone until the next Commit or Ping.
func TestEveryWriteFindsTheFileGone(t *testing.T) {
	ctx := context.Background()
	command := Options{NoMigrate: true, MustWrite: true} // as the admin commands open it
	for _, w := range []struct {
		name    string
		opts    Options
		prepare func(t *testing.T, s *Store) // before the file goes
		// write is the write; got is what it returned besides its error, which must be zero.
		write func(s *Store) (got any, err error)
	}{
		{name: "BeginRun", write: func(s *Store) (any, error) { return s.BeginRun(ctx, "r1", t0) }},
		{name: "EndRun", write: func(s *Store) (any, error) { return nil, s.EndRun(ctx, "r0") }},
		{name: "Claim", write: func(s *Store) (any, error) { return s.Claim(ctx, "k1", "member", t0, nil) }},
		{name: "PullBack", write: func(s *Store) (any, error) { return s.PullBack(ctx, t0.Add(-time.Hour), t0.Add(-2*time.Hour)) }},
		{name: "Pardon", write: func(s *Store) (any, error) { return s.Pardon(ctx, "") }},
		{name: "PruneStep", write: func(s *Store) (any, error) { return s.PruneStep(ctx, t0.Add(time.Hour), 0) }},
		{name: "search index pass", prepare: func(t *testing.T, s *Store) {
			storetest.MustCommit(t, s, &persistence.AppendMessage{Message: userMsg("s1", 2, "to index")})
		}, write: func(s *Store) (any, error) {
			s.commitMu.Lock()
			defer s.commitMu.Unlock()
			n, _, err := s.indexPass(ctx)
			return n, err
		}},
		{name: "sessions pardon with the daemon stopped", opts: command,
			write: func(s *Store) (any, error) { return s.Pardon(ctx, "") }},
	} {
		for _, tt := range fileTakings {
			t.Run(w.name+"/"+tt.name, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "agentgate.db")
				// What each write changes: an open session with a message (pulled back, indexed), an
				// ended one (pruned), a run begun (ended, or counted by the next).
				f, err := Open(ctx, path, never)
				if err != nil {
					t.Fatal(err)
				}
				storetest.MustCommit(t, f, &persistence.CreateSession{Session: newSession("s1", "k1")},
					&persistence.AppendMessage{Message: userMsg("s1", 1, "hello")},
					&persistence.CreateSession{Session: newSession("p1", "kp")},
					&persistence.EndSession{SessionID: "p1", Reason: "test", At: t0})
				if _, err := f.BeginRun(ctx, "r0", t0); err != nil {
					t.Fatal(err)
				}
				if err := f.Close(); err != nil {
					t.Fatal(err)
				}

				var logs testutil.Buffer
				var reported atomic.Int32
				opts := w.opts
				opts.IndexRows, opts.IndexDelay, opts.CheckpointInterval = never.IndexRows, never.IndexDelay, never.CheckpointInterval
				opts.Logger, opts.Corrupt = slog.New(slog.NewTextHandler(&logs, nil)), func() { reported.Add(1) }
				s, err := Open(ctx, path, opts)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				if w.prepare != nil {
					w.prepare(t, s)
				}
				tt.take(t, path)

				got, err := w.write(s)
				said := "the database file " + path + " " + tt.what
				if opts.MustWrite {
					said += " while this command ran: "
				}
				if !errors.Is(err, persistence.ErrFileGone) || !errors.Is(err, persistence.ErrUnavailable) ||
					!strings.Contains(err.Error(), said) {
					t.Errorf("%s once the file went = %v, want persistence.ErrFileGone, unavailable, saying %q", w.name, err, said)
				}
				if opts.MustWrite && strings.Contains(fmt.Sprint(err), "spool") {
					t.Errorf("%s of an admin command's store = %v, want no word of a spool it does not have", w.name, err)
				}
				if got != nil && !reflect.ValueOf(got).IsZero() {
					t.Errorf("%s once the file went returned %+v, want nothing of what it did", w.name, got)
				}
				if n := strings.Count(logs.String(), fmt.Sprintf("level=ERROR msg=%q", msgGone)); n != 1 {
					t.Errorf("log after %s:\n%s\nwant %q once, not %d times", w.name, logs.String(), msgGone, n)
				}
				if n := reported.Load(); n != 1 {
					t.Errorf("Options.Corrupt called %d times, want once", n)
				}
				errs := s.Commit(ctx, [][]persistence.Op{{&persistence.AppendMessage{Message: userMsg("s1", 3, "later")}}})
				if !errors.Is(errs[0], persistence.ErrFileGone) {
					t.Errorf("a Commit after %s = %v, want persistence.ErrFileGone", w.name, errs[0])
				}
			})
		}
	}
}

// TestEveryWriteCommitsThroughCommitChecked: no code of the store commits a transaction but
// commitChecked, which looks for the database file gone after each commit, so that a write
// added later cannot forget to (BeginRun, EndRun, Claim, PullBack, Pardon, the prune steps and
// the search index's passes did: TestEveryWriteFindsTheFileGone). migrate is the one
// exception: it runs inside Open, before Open records the file (Store.file) that checkFile
// compares the path with.
func TestEveryWriteCommitsThroughCommitChecked(t *testing.T) {
	allowed := map[string]bool{"commitChecked": true, "migrate": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	found := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Commit" && len(call.Args) == 0 {
					found++
					if !allowed[fn.Name.Name] {
						t.Errorf("%s: %s commits a transaction itself; commit it with s.commitChecked(tx), which looks for the database file gone",
							fset.Position(call.Pos()), fn.Name.Name)
					}
				}
				return true
			})
		}
	}
	if found < 2 {
		t.Fatalf("found %d calls of Commit(); the test no longer finds them", found)
	}
}
