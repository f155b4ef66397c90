package sqlite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestBackupWhileWriting: a backup taken while a writer commits holds exactly the commits made
// before some moment, whole (here every commit writes a message and its reply: the backup never
// holds a message without its reply), and the store goes on. The backup opens as a store.
func TestBackupWhileWriting(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
	reply := func(seq int64) persistence.Message {
		m := userMsg("s1", seq, "reply")
		m.Role, m.MessageID, m.Status = persistence.RoleAssistant, "", persistence.StatusDone
		return m
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	committed := make(chan int64, 1) // the writer's last seq
	wg.Go(func() {
		seq := int64(0)
		defer func() { committed <- seq }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			errs := s.Commit(ctx, [][]persistence.Op{{
				&persistence.AppendMessage{Message: userMsg("s1", seq+1, "hello")},
				&persistence.AppendMessage{Message: reply(seq + 2)},
			}})
			if errs[0] != nil {
				t.Error(errs[0])
				return
			}
			seq += 2
		}
	})
	for { // back up once the writer has committed a few times
		if ms, err := s.Transcript(ctx, "s1"); err != nil {
			t.Fatal(err)
		} else if len(ms) >= 20 {
			break
		}
	}
	out := filepath.Join(t.TempDir(), "backup.db")
	size, err := Backup(ctx, s.Path(), out)
	close(stop)
	wg.Wait()
	last := <-committed
	if err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(out); err != nil || info.Size() != size {
		t.Errorf("backup file: %v (size %d), want %d bytes", err, info.Size(), size)
	}
	b, err := OpenReadOnly(ctx, out)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ms, err := b.Transcript(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if n := int64(len(ms)); n < 20 || n%2 != 0 || n > last {
		t.Fatalf("backup holds %d messages of the %d committed, want an even number from 20 on (whole commits)", n, last)
	}
	for i, m := range ms {
		if m.Seq != int64(i+1) {
			t.Fatalf("backup message %d has seq %d: a gap", i, m.Seq)
		}
	}
	if matches, _ := filepath.Glob(filepath.Join(filepath.Dir(out), ".*partial")); len(matches) != 0 {
		t.Errorf("temporary files left: %v", matches)
	}
}

// TestBackupRefuses: a backup never overwrites a file, and a failed one leaves nothing behind.
func TestBackupRefuses(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	dir := t.TempDir()
	existing := filepath.Join(dir, "existing.db")
	if err := os.WriteFile(existing, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Backup(ctx, s.Path(), existing); err == nil {
		t.Error("backup onto an existing file: nil error")
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep me" {
		t.Errorf("the existing file now holds %q", b)
	}
	notDB := filepath.Join(dir, "not.db")
	if err := os.WriteFile(notDB, []byte("plain text, not SQLite"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{filepath.Join(dir, "missing.db"), notDB} {
		out := filepath.Join(dir, fmt.Sprint(filepath.Base(src), ".backup"))
		if _, err := Backup(ctx, src, out); err == nil {
			t.Errorf("backup of %s: nil error", src)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("failed backup of %s left %s (%v)", src, out, err)
		}
	}
	if matches, _ := filepath.Glob(filepath.Join(dir, ".*partial")); len(matches) != 0 {
		t.Errorf("temporary files left: %v", matches)
	}
	// An operator's FILE that is no file name: each refused with what to do, nothing written.
	for _, tc := range []struct{ out, want string }{
		{filepath.Join(dir, "backups") + "/", "names a directory: give the backup's file name"},
		{dir, "is a directory: give the backup's file name"},
		{filepath.Join(dir, "missing", "b.db"), "missing does not exist: create it first"},
		{filepath.Join(existing, "b.db"), "existing.db is not a directory"},
	} {
		if _, err := Backup(ctx, s.Path(), tc.out); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Backup(%q) = %v, want an error containing %q", tc.out, err, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "backups")); !os.IsNotExist(err) {
		t.Errorf("backup to backups/ left a file backups (%v)", err)
	}
}

// TestBackupsAtOnceNeverOverwrite: of backups to one file taken at once (two cron jobs, an
// operator who runs the command twice), one writes it and the others fail; none replaces the
// file another wrote and reported. The check that the file does not exist comes long before the
// copy takes its name, so the name must be taken without replacing what holds it.
func TestBackupsAtOnceNeverOverwrite(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")})
	var ops []persistence.Op
	for i := range 2000 { // a copy that takes a while, so the backups overlap
		ops = append(ops, &persistence.AppendMessage{Message: userMsg("s1", int64(i+1), strings.Repeat("x", 500))})
	}
	storetest.MustCommit(t, s, ops...)
	dir := t.TempDir()
	out := filepath.Join(dir, "backup.db")
	var wg sync.WaitGroup
	var written atomic.Int32
	for range 4 {
		wg.Go(func() {
			if _, err := Backup(ctx, s.Path(), out); err == nil {
				written.Add(1)
			}
		})
	}
	wg.Wait()
	if n := written.Load(); n != 1 {
		t.Errorf("%d backups to one file reported success, want 1 (the others overwrote it)", n)
	}
	if matches, _ := filepath.Glob(filepath.Join(dir, ".*partial")); len(matches) != 0 {
		t.Errorf("temporary files left: %v", matches)
	}
}

// TestBackupOfARunningDaemonIsNoUncleanStop: a backup taken while the daemon runs holds its
// run as not ended (daemon_run), so the daemon started on the restored copy counts an unclean
// stop that never happened against every session's head pending message (a strike of 3).
func TestBackupOfARunningDaemonIsNoUncleanStop(t *testing.T) {
	ctx := context.Background()
	s := MustOpen(t, Options{})
	if _, err := s.BeginRun(ctx, "running", t0); err != nil {
		t.Fatal(err)
	}
	storetest.MustCommit(t, s, &persistence.CreateSession{Session: newSession("s1", "k1")},
		&persistence.PutRoute{Route: persistence.Route{Key: "k1", SessionID: "s1", Generation: 1, UpdatedAt: t0}},
		&persistence.AppendMessage{Message: userMsg("s1", 1, "hello")})
	out := filepath.Join(t.TempDir(), "backup.db")
	if _, err := Backup(ctx, s.Path(), out); err != nil {
		t.Fatal(err)
	}
	restored, err := Open(ctx, out, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer restored.Close()
	u, err := restored.BeginRun(ctx, "after-restore", t0)
	if err != nil {
		t.Fatal(err)
	}
	if u != nil {
		t.Errorf("the daemon started on a restored backup counted an unclean stop of run %q against %+v", u.Run, u.Counted)
	}
}
