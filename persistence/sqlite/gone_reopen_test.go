package sqlite

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestReplacedFileNotWrittenByANewConnection: a connection the writer's pool opens after another
// file was renamed over the database (the old one dropped, as a setting that could not be
// restored has it) opens the file now at the path, paired with the old file's write-ahead log,
// which is still there. Neither the commit that finds the file replaced, nor the checkpointer,
// nor the store's close may write to that file: the operator's file (a backup restored while
// the daemon ran) must stay intact, holding its own rows only.
func TestReplacedFileNotWrittenByANewConnection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agentgate.db")
	s, err := Open(context.Background(), path, Options{CheckpointInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")},
		&persistence.AppendMessage{Message: userMsg("s1", 1, "before")},
		&persistence.AppendMessage{Message: userMsg("s1", 2, "before too")})

	old, err := os.Open(path) // the old file, to count what it holds once the store is closed
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()

	renameAnotherOver(t, path, &persistence.CreateSession{Session: newSession("o1", "ko1")},
		&persistence.AppendMessage{Message: userMsg("o1", 1, "other")})

	conn, err := s.writer.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.dropWriter(conn)
	_ = conn.Close()
	errs := s.Commit(context.Background(), [][]persistence.Op{{&persistence.AppendMessage{Message: userMsg("s1", 3, "after")}}})
	if !errors.Is(errs[0], persistence.ErrFileGone) {
		t.Errorf("Commit after the file was replaced = %v, want persistence.ErrFileGone", errs[0])
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close = %v, want nil", err)
	}
	if got, err := countMessagesAt(t, path); err != nil || got != 1 {
		t.Errorf("the file renamed over the database holds %d messages (%v), want its own 1", got, err)
	}
	if got, err := countMessages(t, old); err != nil || got != 2 {
		t.Errorf("the old file, once the store is closed, holds %d messages (%v), want its 2", got, err)
	}
}

// TestReplacedFileFoundByARead: a read that needs a new reader's connection after another file
// was renamed over the database finds it (fileConnector): the read fails as the file gone, the
// store logs it at once, as a commit or Ping that finds it does, and Options.Corrupt is called;
// the file renamed over the database is left as it was.
func TestReplacedFileFoundByARead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agentgate.db")
	var logs testutil.Buffer
	var reported atomic.Int32
	s, err := Open(context.Background(), path, Options{CheckpointInterval: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), Corrupt: func() { reported.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")},
		&persistence.AppendMessage{Message: userMsg("s1", 1, "before")})
	held, err := s.reader.Conn(context.Background()) // the pool's connection on the old file
	if err != nil {
		t.Fatal(err)
	}
	renameAnotherOver(t, path)

	if msgs, err := s.Transcript(context.Background(), "s1"); !errors.Is(err, persistence.ErrFileGone) ||
		!errors.Is(err, persistence.ErrUnavailable) {
		t.Errorf("Transcript on a new connection after the file was replaced = %d messages, %v; want persistence.ErrFileGone",
			len(msgs), err)
	}
	want := fmt.Sprintf("level=ERROR msg=%q path=%s err=", msgGone, path)
	if got := logs.String(); strings.Count(got, want) != 1 {
		t.Errorf("log after a read found the file replaced:\n%s\nwant %q once", got, want)
	}
	if n := reported.Load(); n != 1 {
		t.Errorf("Options.Corrupt called %d times, want once", n)
	}
	if err := s.Ping(context.Background()); !errors.Is(err, persistence.ErrFileGone) {
		t.Errorf("Ping after a read found the file replaced = %v, want persistence.ErrFileGone", err)
	}
	_ = held.Close()
	if err := s.Close(); err != nil {
		t.Errorf("Close = %v, want nil", err)
	}
	if got, err := countMessagesAt(t, path); err != nil || got != 0 {
		t.Errorf("the file renamed over the database holds %d messages (%v), want its own 0", got, err)
	}
}
