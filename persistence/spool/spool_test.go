package spool

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/agentgate/agentgate/persistence"
)

// ignoreCreatedAt compares batches by name and content; CreatedAt is checked on its own.
var ignoreCreatedAt = cmpopts.IgnoreFields(Batch{}, "CreatedAt")

func MustOpen(t *testing.T, dir string) *Spool {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatalf("Open(%q) error: %v", dir, err)
	}
	return s
}

func MustAppend(t *testing.T, s *Spool, groups [][]persistence.Op) string {
	t.Helper()
	name, err := s.Append(groups)
	if err != nil {
		t.Fatalf("Append error: %v", err)
	}
	return name
}

// MustNext returns the next batch and fails the test on an error.
func MustNext(t *testing.T, s *Spool) *Batch {
	t.Helper()
	b, err := s.Next()
	if err != nil {
		t.Fatalf("Next error: %v", err)
	}
	return b
}

func MustRemove(t *testing.T, s *Spool, name string) {
	t.Helper()
	if err := s.Remove(name); err != nil {
		t.Fatalf("Remove(%q) error: %v", name, err)
	}
}

// MustWriteFile writes a file as if by hand (or by a crash), behind the spool's back.
func MustWriteFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// MustEncode encodes groups as a batch file.
func MustEncode(t *testing.T, groups [][]persistence.Op) []byte {
	t.Helper()
	data, err := EncodeOps(groups)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// MustDirNames returns the names in dir, sorted.
func MustDirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// batchOf returns a distinct batch for number i: i+1 groups of one or two ops.
func batchOf(i int) [][]persistence.Op {
	groups := make([][]persistence.Op, i%3+1)
	for g := range groups {
		groups[g] = []persistence.Op{&persistence.TouchSession{
			SessionID: fmt.Sprintf("s-%d-%d", i, g),
			At:        t0.Add(time.Duration(i*1000 + g)),
		}}
		if g%2 == 1 {
			groups[g] = append(groups[g], &persistence.SetTitle{SessionID: fmt.Sprintf("s-%d", i), Title: "t"})
		}
	}
	return groups
}

func batchName(seq uint64) string { return fmt.Sprintf("%020d.json", seq) }

func TestAppendNextRemoveInOrder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	s := MustOpen(t, dir)
	if b := MustNext(t, s); b != nil {
		t.Fatalf("Next on a new spool = %+v, want nil", b)
	}
	const n = 60
	before := time.Now()
	for i := range n {
		name := MustAppend(t, s, batchOf(i))
		if want := batchName(uint64(i + 1)); name != want {
			t.Fatalf("Append #%d = %q, want %q", i, name, want)
		}
		if got := s.Len(); got != i+1 {
			t.Fatalf("Len after %d appends = %d, want %d", i+1, got, i+1)
		}
	}
	after := time.Now()
	for i := range n {
		b := MustNext(t, s)
		want := &Batch{Name: batchName(uint64(i + 1)), Groups: batchOf(i)}
		if diff := cmp.Diff(want, b, ignoreCreatedAt); diff != "" {
			t.Fatalf("Next #%d mismatch (-want +got):\n%s", i, diff)
		}
		if b.CreatedAt.Before(before) || b.CreatedAt.After(after) {
			t.Errorf("Next #%d CreatedAt = %v, want between %v and %v", i, b.CreatedAt, before, after)
		}
		if again := MustNext(t, s); again.Name != b.Name {
			t.Fatalf("Next again = %q, want the same batch %q until it is removed", again.Name, b.Name)
		}
		MustRemove(t, s, b.Name)
		if got, want := s.Len(), n-i-1; got != want {
			t.Fatalf("Len after %d removes = %d, want %d", i+1, got, want)
		}
	}
	if b := MustNext(t, s); b != nil {
		t.Errorf("Next on a drained spool = %q, want nil", b.Name)
	}
	if got := MustDirNames(t, dir); len(got) != 0 {
		t.Errorf("spool directory after draining holds %q, want nothing", got)
	}
}

func TestOpenPermissions(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data", "spool")
	s := MustOpen(t, dir)
	name := MustAppend(t, s, batchOf(0))
	for _, c := range []struct {
		path string
		want fs.FileMode
	}{
		{dir, fs.ModeDir | 0o700},
		{filepath.Join(dir, name), 0o600},
	} {
		fi, err := os.Stat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode(); got != c.want {
			t.Errorf("mode of %s = %v, want %v", c.path, got, c.want)
		}
	}
}

func TestReopenContinues(t *testing.T) {
	dir := t.TempDir()
	s := MustOpen(t, dir)
	for i := range 12 {
		MustAppend(t, s, batchOf(i))
	}
	MustRemove(t, s, MustNext(t, s).Name) // batch 1 replayed

	s = MustOpen(t, dir)
	if got, want := s.Len(), 11; got != want {
		t.Fatalf("Len after reopen = %d, want %d", got, want)
	}
	if got, want := MustAppend(t, s, batchOf(12)), batchName(13); got != want {
		t.Errorf("Append after reopen = %q, want %q", got, want)
	}
	for i := 1; i <= 12; i++ {
		b := MustNext(t, s)
		want := &Batch{Name: batchName(uint64(i + 1)), Groups: batchOf(i)}
		if diff := cmp.Diff(want, b, ignoreCreatedAt); diff != "" {
			t.Fatalf("Next #%d after reopen mismatch (-want +got):\n%s", i, diff)
		}
		MustRemove(t, s, b.Name)
	}

	// An empty spool that once held batches starts again at 1: no file is left to collide with.
	s = MustOpen(t, dir)
	if got, want := MustAppend(t, s, batchOf(0)), batchName(1); got != want {
		t.Errorf("Append after draining and reopening = %q, want %q", got, want)
	}
}

func TestOpenOrdersBySequence(t *testing.T) {
	dir := t.TempDir()
	// Written out of order, with a gap, and with numbers whose decimal length differs.
	for _, seq := range []uint64{100, 9, 10, 1 << 40} {
		MustWriteFile(t, filepath.Join(dir, batchName(seq)), MustEncode(t, batchOf(int(seq%7))))
	}
	s := MustOpen(t, dir)
	var got []string
	for b := MustNext(t, s); b != nil; b = MustNext(t, s) {
		got = append(got, b.Name)
		MustRemove(t, s, b.Name)
	}
	want := []string{batchName(9), batchName(10), batchName(100), batchName(1 << 40)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("replay order mismatch (-want +got):\n%s", diff)
	}
}

func TestOpenRemovesTempFiles(t *testing.T) {
	dir := t.TempDir()
	MustWriteFile(t, filepath.Join(dir, batchName(1)), MustEncode(t, batchOf(1)))
	// A complete-looking temporary file is still an interrupted write: it never became visible,
	// so its Append reported an error and its senders still hold the writes.
	MustWriteFile(t, filepath.Join(dir, batchName(5)+".tmp"), MustEncode(t, batchOf(5)))
	MustWriteFile(t, filepath.Join(dir, batchName(2)+".tmp"), []byte(`{"version":1,"gro`))
	if err := os.MkdirAll(filepath.Join(dir, "failed"), 0o700); err != nil {
		t.Fatal(err)
	}
	MustWriteFile(t, filepath.Join(dir, "failed", batchName(1)+".reason.txt.tmp"), []byte("half"))

	s := MustOpen(t, dir)
	if got, want := MustDirNames(t, dir), []string{batchName(1), "failed"}; !slices.Equal(got, want) {
		t.Errorf("spool directory after Open = %q, want %q", got, want)
	}
	if got := MustDirNames(t, filepath.Join(dir, "failed")); len(got) != 0 {
		t.Errorf("failed directory after Open = %q, want nothing", got)
	}
	if got, want := s.Len(), 1; got != want {
		t.Errorf("Len = %d, want %d", got, want)
	}
	if got, want := MustNext(t, s).Name, batchName(1); got != want {
		t.Errorf("Next = %q, want %q", got, want)
	}
	if got, want := MustAppend(t, s, batchOf(2)), batchName(2); got != want {
		t.Errorf("Append = %q, want %q (temporary files do not count)", got, want)
	}
}

func TestTempFilesNeverVisible(t *testing.T) {
	dir := t.TempDir()
	s := MustOpen(t, dir)
	first := MustAppend(t, s, batchOf(0))

	// A half-written temporary file appears while the spool is open (as a write in progress
	// would look); it is never a batch, and the next Append of that number replaces it whole.
	MustWriteFile(t, filepath.Join(dir, batchName(2)+".tmp"), []byte(`{"version":1,"groups":[[`))
	MustWriteFile(t, filepath.Join(dir, batchName(7)+".tmp"), MustEncode(t, batchOf(7)))
	if got, want := s.Len(), 1; got != want {
		t.Errorf("Len = %d, want %d", got, want)
	}
	second := MustAppend(t, s, batchOf(1))

	var got []*Batch
	for b := MustNext(t, s); b != nil; b = MustNext(t, s) {
		got = append(got, b)
		MustRemove(t, s, b.Name)
	}
	want := []*Batch{{Name: first, Groups: batchOf(0)}, {Name: second, Groups: batchOf(1)}}
	if diff := cmp.Diff(want, got, ignoreCreatedAt); diff != "" {
		t.Errorf("batches mismatch (-want +got):\n%s", diff)
	}
	if s = MustOpen(t, dir); s.Len() != 0 {
		t.Errorf("Len after reopen = %d, want 0", s.Len())
	}
	if names := MustDirNames(t, dir); len(names) != 0 {
		t.Errorf("spool directory after reopen = %q, want nothing", names)
	}
}

func TestAppendFailureLeavesNothingVisible(t *testing.T) {
	tests := []struct {
		name string
		// block makes writing batch 2 fail.
		block func(t *testing.T, dir string)
	}{
		{"temporary file cannot be created", func(t *testing.T, dir string) {
			if err := os.Mkdir(filepath.Join(dir, batchName(2)+".tmp"), 0o700); err != nil {
				t.Fatal(err)
			}
		}},
		{"name taken behind the spool's back", func(t *testing.T, dir string) {
			MustWriteFile(t, filepath.Join(dir, batchName(2)), []byte("not ours"))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s := MustOpen(t, dir)
			first := MustAppend(t, s, batchOf(0))
			tt.block(t, dir)

			name, err := s.Append(batchOf(1))
			if err == nil {
				t.Fatalf("Append = %q, want an error", name)
			}
			if !strings.HasPrefix(err.Error(), "spool append "+batchName(2)+": ") {
				t.Errorf("Append error = %q, want it to name the operation and the batch", err)
			}
			if got, want := s.Len(), 1; got != want {
				t.Errorf("Len after a failed Append = %d, want %d", got, want)
			}
			if got, want := MustNext(t, s).Name, first; got != want {
				t.Errorf("Next = %q, want %q", got, want)
			}
			MustRemove(t, s, first)
			if b := MustNext(t, s); b != nil {
				t.Errorf("Next after a failed Append = %q, want nil", b.Name)
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if e.Type().IsRegular() && strings.HasSuffix(e.Name(), ".tmp") {
					t.Errorf("a failed Append left its temporary file %s", e.Name())
				}
			}
			if data, err := os.ReadFile(filepath.Join(dir, batchName(2))); err == nil && string(data) != "not ours" {
				t.Errorf("%s after a failed Append = %q, want it absent or untouched", batchName(2), data)
			}

			// The spool carries on with the next number; nothing was overwritten.
			if got, want := MustAppend(t, s, batchOf(2)), batchName(3); got != want {
				t.Errorf("Append after a failure = %q, want %q", got, want)
			}
		})
	}
}

func TestAppendErrors(t *testing.T) {
	t.Run("spool directory replaced by a file", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "spool")
		s := MustOpen(t, dir)
		if err := os.Remove(dir); err != nil {
			t.Fatal(err)
		}
		MustWriteFile(t, dir, nil)
		name, err := s.Append(batchOf(0))
		if err == nil {
			t.Fatalf("Append = %q, want an error", name)
		}
		var pe *fs.PathError
		if !errors.As(err, &pe) {
			t.Errorf("Append error = %#v, want it to wrap the *fs.PathError", err)
		}
		if got := s.Len(); got != 0 {
			t.Errorf("Len after a failed Append = %d, want 0", got)
		}
	})
	t.Run("no groups", func(t *testing.T) {
		s := MustOpen(t, t.TempDir())
		if name, err := s.Append(nil); err == nil {
			t.Errorf("Append(nil) = %q, want an error", name)
		}
		if got := MustDirNames(t, s.Dir()); len(got) != 0 {
			t.Errorf("spool directory = %q, want nothing", got)
		}
	})
	t.Run("op without codec", func(t *testing.T) {
		s := MustOpen(t, t.TempDir())
		name, err := s.Append([][]persistence.Op{{&persistence.SetTitle{}}, {nil}})
		if err == nil || !strings.HasPrefix(err.Error(), "spool append: encode ops: ") {
			t.Errorf("Append(nil op) = %q, %v, want a spool append: encode ops error", name, err)
		}
		if got := MustDirNames(t, s.Dir()); len(got) != 0 {
			t.Errorf("spool directory = %q, want nothing", got)
		}
	})
}

func TestOpenErrors(t *testing.T) {
	tests := []struct {
		name string
		dir  func(t *testing.T) string
	}{
		{"parent is a regular file", func(t *testing.T) string {
			parent := filepath.Join(t.TempDir(), "data")
			MustWriteFile(t, parent, nil)
			return filepath.Join(parent, "spool")
		}},
		{"directory is a regular file", func(t *testing.T) string {
			dir := filepath.Join(t.TempDir(), "spool")
			MustWriteFile(t, dir, nil)
			return dir
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.dir(t)
			s, err := Open(dir)
			if err == nil {
				t.Fatalf("Open(%q) = %v, want an error", dir, s)
			}
			var pe *fs.PathError
			if !errors.As(err, &pe) || !strings.HasPrefix(err.Error(), "spool open: ") {
				t.Errorf("Open(%q) error = %q, want a spool open error wrapping *fs.PathError", dir, err)
			}
		})
	}
}

func TestCorruptBatchIsQuarantined(t *testing.T) {
	tests := []struct {
		name string
		data string
	}{
		{"empty", ""},
		{"truncated", `{"version":1,"created_at":"2025-06-01T12:30:45Z","groups":[[{"type":"SetTitle","op":{`},
		{"unknown op type", `{"version":1,"created_at":"2025-06-01T12:30:45Z","groups":[[{"type":"Nope","op":{}}]]}`},
		{"future version", `{"version":2,"created_at":"2025-06-01T12:30:45Z","groups":[]}`},
		{"binary", "\x00\xff\xfe"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s := MustOpen(t, dir)
			first := MustAppend(t, s, batchOf(0))
			bad := MustAppend(t, s, batchOf(1))
			last := MustAppend(t, s, batchOf(2))
			MustWriteFile(t, filepath.Join(dir, bad), []byte(tt.data))

			if got := MustNext(t, s).Name; got != first {
				t.Fatalf("Next = %q, want %q", got, first)
			}
			MustRemove(t, s, first)
			b, err := s.Next()
			if err == nil {
				t.Fatalf("Next on a corrupt batch = %+v, want an error", b)
			}
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Name != bad {
				t.Fatalf("Next error = %#v, want a *CorruptError for %q", err, bad)
			}
			if !strings.Contains(err.Error(), bad) {
				t.Errorf("Next error = %q, want it to name %q", err, bad)
			}
			if _, err2 := s.Next(); err2 == nil {
				t.Errorf("Next again returned no error, want the corrupt batch to stay until quarantined")
			}

			reason := "replay: " + err.Error()
			if err := s.Quarantine(bad, reason); err != nil {
				t.Fatalf("Quarantine(%q) error: %v", bad, err)
			}
			if got, want := s.Len(), 1; got != want {
				t.Errorf("Len after Quarantine = %d, want %d", got, want)
			}
			failed := filepath.Join(dir, "failed")
			kept, err := os.ReadFile(filepath.Join(failed, bad))
			if err != nil {
				t.Fatalf("quarantined batch: %v", err)
			}
			if string(kept) != tt.data {
				t.Errorf("quarantined batch = %q, want the original bytes %q", kept, tt.data)
			}
			note, err := os.ReadFile(filepath.Join(failed, bad+".reason.txt"))
			if err != nil {
				t.Fatalf("reason file: %v", err)
			}
			if !strings.Contains(string(note), reason) || !strings.Contains(string(note), bad) {
				t.Errorf("reason file = %q, want it to hold %q and the batch name", note, reason)
			}
			if _, err := os.Stat(filepath.Join(dir, bad)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("Stat of the quarantined batch in the spool = %v, want it gone", err)
			}
			if got := MustNext(t, s); got.Name != last {
				t.Errorf("Next after Quarantine = %q, want %q", got.Name, last)
			}

			// Reopened with nothing left to replay, the spool neither replays the quarantined
			// batch nor reuses its number: numbering continues after failed/ too.
			MustRemove(t, s, last)
			s = MustOpen(t, dir)
			if b := MustNext(t, s); b != nil {
				t.Errorf("Next after reopen = %q, want nil", b.Name)
			}
			if got, want := MustAppend(t, s, batchOf(3)), batchName(3); got != want {
				t.Errorf("Append after reopen = %q, want %q", got, want)
			}
		})
	}
}

func TestQuarantineNeverOverwrites(t *testing.T) {
	dir := t.TempDir()
	failed := filepath.Join(dir, "failed")
	if err := os.Mkdir(failed, 0o700); err != nil {
		t.Fatal(err)
	}
	// An earlier quarantined batch of the same name, from a spool directory restored by hand.
	MustWriteFile(t, filepath.Join(failed, batchName(1)), []byte("older"))
	MustWriteFile(t, filepath.Join(dir, batchName(1)), MustEncode(t, batchOf(1)))
	s := MustOpen(t, dir)
	if err := s.Quarantine(batchName(1), "rejected by the database"); err != nil {
		t.Fatalf("Quarantine error: %v", err)
	}
	want := []string{batchName(1), batchName(1) + ".1", batchName(1) + ".1.reason.txt"}
	if diff := cmp.Diff(want, MustDirNames(t, failed)); diff != "" {
		t.Errorf("failed directory mismatch (-want +got):\n%s", diff)
	}
	if older, _ := os.ReadFile(filepath.Join(failed, batchName(1))); string(older) != "older" {
		t.Errorf("earlier quarantined batch = %q, want it untouched", older)
	}
	if groups, _, err := DecodeOps(mustRead(t, filepath.Join(failed, batchName(1)+".1"))); err != nil {
		t.Errorf("quarantined batch does not decode: %v", err)
	} else if diff := cmp.Diff(batchOf(1), groups); diff != "" {
		t.Errorf("quarantined batch mismatch (-want +got):\n%s", diff)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestUnknownBatch(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	s := MustOpen(t, dir)
	name := MustAppend(t, s, batchOf(0))
	outside := filepath.Join(filepath.Dir(dir), "precious")
	MustWriteFile(t, outside, []byte("x"))
	for _, bad := range []string{"", "../precious", batchName(2), name + ".tmp", "failed"} {
		t.Run("name="+bad, func(t *testing.T) {
			if err := s.Remove(bad); !errors.Is(err, ErrUnknownBatch) {
				t.Errorf("Remove(%q) = %v, want ErrUnknownBatch", bad, err)
			}
			if err := s.Quarantine(bad, "x"); !errors.Is(err, ErrUnknownBatch) {
				t.Errorf("Quarantine(%q) = %v, want ErrUnknownBatch", bad, err)
			}
		})
	}
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("file outside the spool: %v, want it untouched", err)
	}
	if got := s.Len(); got != 1 {
		t.Errorf("Len = %d, want 1", got)
	}
}

func TestOpenIgnoresStrayEntries(t *testing.T) {
	dir := t.TempDir()
	MustWriteFile(t, filepath.Join(dir, "README"), []byte("operator notes"))
	MustWriteFile(t, filepath.Join(dir, "1.json"), []byte("{}"))
	if err := os.Mkdir(filepath.Join(dir, batchName(8)), 0o700); err != nil {
		t.Fatal(err)
	}
	MustWriteFile(t, filepath.Join(dir, batchName(3)), MustEncode(t, batchOf(3)))
	s := MustOpen(t, dir)
	if got, want := s.Len(), 1; got != want {
		t.Errorf("Len = %d, want %d", got, want)
	}
	if got, want := MustNext(t, s).Name, batchName(3); got != want {
		t.Errorf("Next = %q, want %q", got, want)
	}
	for _, name := range []string{"README", "1.json", batchName(8)} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("stray entry %s: %v, want it left alone", name, err)
		}
	}
}

func TestNextSkipsBatchDeletedByHand(t *testing.T) {
	dir := t.TempDir()
	s := MustOpen(t, dir)
	gone := MustAppend(t, s, batchOf(0))
	kept := MustAppend(t, s, batchOf(1))
	if err := os.Remove(filepath.Join(dir, gone)); err != nil {
		t.Fatal(err)
	}
	if got := MustNext(t, s).Name; got != kept {
		t.Errorf("Next = %q, want %q", got, kept)
	}
	if got, want := s.Len(), 1; got != want {
		t.Errorf("Len = %d, want %d", got, want)
	}
}

// TestWaiting counts the batches Open would queue, without creating or changing the spool.
func TestWaiting(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	if n, err := Waiting(dir); n != 0 || err != nil {
		t.Errorf("Waiting(missing dir) = %d, %v; want 0, nil", n, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Waiting created %s (stat: %v)", dir, err)
	}
	s := MustOpen(t, dir)
	for i := range 3 {
		MustAppend(t, s, batchOf(i))
	}
	name := MustAppend(t, s, batchOf(3))
	if err := s.Quarantine(name, "test"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "x.tmp"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := Waiting(dir); n != 3 || err != nil {
		t.Errorf("Waiting = %d, %v; want the 3 batches Open queues (not the quarantined one or a temp file)", n, err)
	}
	if got := MustOpen(t, dir).Len(); got != 3 {
		t.Errorf("Open queues %d batches, want 3", got)
	}
}
