package persistence_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/sqlite"
)

// handRemoval is a spool whose batch file `remove` an operator deletes by hand during the
// replay: before the replay first reads the spool (beforeRead), or once the replay has read it
// and sets it aside.
type handRemoval struct {
	*spool.Spool
	remove     string
	beforeRead bool
	t          *testing.T
}

func (s *handRemoval) rm() {
	if s.remove == "" {
		return
	}
	if err := os.Remove(filepath.Join(s.Dir(), s.remove)); err != nil {
		s.t.Fatal(err)
	}
	s.remove = ""
}

// Peek implements persistence.Spooler.
func (s *handRemoval) Peek(after string) (string, [][]persistence.Op, error) {
	if s.beforeRead {
		s.rm()
	}
	return s.Spool.Peek(after)
}

// Quarantine implements persistence.Spooler.
func (s *handRemoval) Quarantine(name, reason string) error {
	if name == s.remove {
		s.rm()
	}
	return s.Spool.Quarantine(name, reason)
}

// TestReplaySpoolCountsABatchRemovedByHandAsGone: a batch file deleted by hand while
// ReplaySpool runs (after the spool listed it, before the replay read it or set it aside) is
// counted as gone, not as replayed or set aside, and the replay goes on without an error: there
// is nothing of it to replay, and nothing in spool/failed. Before, one gone before it was read
// counted as replayed, and one gone before it was set aside counted as set aside and failed the
// replay ("spool quarantine …: no such file or directory").
func TestReplaySpoolCountsABatchRemovedByHandAsGone(t *testing.T) {
	for _, tc := range []struct {
		name       string
		beforeRead bool
	}{
		{"before it was read", true},
		{"before it was set aside", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			spoolDir := filepath.Join(dir, "spool")
			sp, err := spool.Open(spoolDir)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, ops := range append([][]persistence.Op{{session("s1", "k1", t0)}}, userBatches(1, 2)...) {
				name, err := sp.Append([][]persistence.Op{ops})
				if err != nil {
					t.Fatal(err)
				}
				names = append(names, name)
			}
			gone := names[1] // m1
			if !tc.beforeRead {
				// It does not decode: the replay reads it, then sets it aside.
				if err := os.WriteFile(filepath.Join(spoolDir, gone), []byte("not a batch"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if sp, err = spool.Open(spoolDir); err != nil { // lists the three
				t.Fatal(err)
			}
			var logs testutil.Buffer
			r, err := persistence.ReplaySpool(context.Background(), st, persistence.ActorOptions{
				MaxBatch: 64, Log: slog.New(slog.NewTextHandler(&logs, nil)),
				Spool: &handRemoval{Spool: sp, remove: gone, beforeRead: tc.beforeRead, t: t},
			})
			if want := (persistence.Replayed{Batches: 2, Gone: 1}); err != nil || r != want {
				t.Errorf("ReplaySpool = %+v, %v; want %+v, no error; log:\n%s", r, err, want, logs.String())
			}
			mustTranscriptRows(t, st, 1) // m2
			if entries, _ := os.ReadDir(filepath.Join(spoolDir, "failed")); len(entries) != 0 {
				t.Errorf("spool/failed holds %d file(s), want none: nothing was set aside", len(entries))
			}
			if !tc.beforeRead && (!strings.Contains(logs.String(), "spool batch gone before it could be set aside") ||
				strings.Contains(logs.String(), "quarantined")) {
				t.Errorf("log:\n%s\nwant the batch said gone, not quarantined", logs.String())
			}
		})
	}
}
