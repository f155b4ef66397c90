package sqlite

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestOpenThroughASymlink: a database path that is a symbolic link (data_dir's agentgate.db
// linked to a file on another disk, or data_dir itself a link) opens, commits and pings
// without the store taking its file for deleted or replaced, also on reader connections
// opened afterwards; and a link to a file not made yet (made before the first start) opens as
// a new database made at the link's target. Before, since the store's connections never create
// the file (noCreate), such a link failed the start with "check the database: unable to
// open database file (14)".
func TestOpenThroughASymlink(t *testing.T) {
	for _, tt := range []struct {
		name string
		path func(t *testing.T) (link, target string)
	}{
		{"to a database", func(t *testing.T) (string, string) {
			d := t.TempDir()
			target := filepath.Join(d, "elsewhere.db")
			s, err := Open(context.Background(), target, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(d, "agentgate.db"), target
		}},
		{"to a file not made yet", func(t *testing.T) (string, string) {
			d := t.TempDir()
			return filepath.Join(d, "agentgate.db"), filepath.Join(d, "elsewhere.db")
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			link, target := tt.path(t)
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			s, err := Open(context.Background(), link, Options{})
			if err != nil {
				t.Fatalf("Open through a link to %s: %v", filepath.Base(target), err)
			}
			defer s.Close()
			storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
			var conns []interface{ Close() error }
			for range defaultReaders {
				c, err := s.reader.Conn(context.Background()) // connections opened now too
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
			}
			for _, c := range conns {
				_ = c.Close()
			}
			storetest.MustCommit(t, s, &persistence.AppendMessage{Message: userMsg("s1", 1, "x")})
			if err := s.Ping(context.Background()); err != nil {
				t.Errorf("Ping = %v, want nil", err)
			}
			if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Errorf("the link after Open: %v, %v; want it a link still", fi, err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if got, err := countMessagesAt(t, target); err != nil || got != 1 {
				t.Errorf("the link's target holds %d messages (%v), want 1", got, err)
			}
		})
	}
}
