package spool

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentgate/agentgate/persistence"
)

const (
	batchSuffix  = ".json"
	tmpSuffix    = ".tmp"
	reasonSuffix = ".reason.txt"
	seqDigits    = 20 // enough for any uint64, so names sort like their sequence numbers
	failedDir    = "failed"
)

// Batch is one spooled batch: the groups of writes of one Append, in their original order.
type Batch struct {
	// Name is the batch file, relative to the spool directory; pass it to Remove or Quarantine.
	Name      string
	Groups    [][]persistence.Op
	CreatedAt time.Time
}

// Spool is a directory of batches waiting to be replayed into the database, oldest first.
//
// A Spool is not safe for concurrent use: it belongs to one goroutine, the persistence actor.
// It remembers the waiting batches in memory, so the directory must not be written by anyone
// else while it is open.
type Spool struct {
	dir   string
	next  uint64   // sequence number of the next Append
	queue []string // names of the waiting batches, oldest first
}

// Open opens the spool in dir, creating it (mode 0700) if needed. It removes leftover *.tmp files,
// which are writes interrupted before they became visible (their Append reported an error), and
// numbers new batches after the highest one found, including quarantined ones, so a name is
// never reused.
func Open(dir string) (*Spool, error) {
	if err := mkdirDurable(dir); err != nil {
		return nil, fmt.Errorf("spool open: %w", err)
	}
	if err := probeWrite(dir); err != nil {
		return nil, err
	}
	s := &Spool{dir: dir}
	var highest uint64
	for _, d := range []string{dir, filepath.Join(dir, failedDir)} {
		entries, err := os.ReadDir(d)
		if err != nil {
			if d != dir && errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("spool open: %w", err)
		}
		removed, err := removeTemps(d, entries)
		if err != nil {
			return nil, fmt.Errorf("spool open: %w", err)
		}
		if removed {
			if err := syncDir(d); err != nil {
				return nil, fmt.Errorf("spool open: %w", err)
			}
		}
		for _, e := range entries {
			if !e.Type().IsRegular() || strings.HasSuffix(e.Name(), tmpSuffix) {
				continue
			}
			name := e.Name()
			if d != dir && len(name) > seqDigits+len(batchSuffix) {
				// A quarantined batch renamed to avoid a collision, or a reason file.
				name = name[:seqDigits+len(batchSuffix)]
			}
			seq, ok := parseName(name)
			if !ok {
				continue
			}
			highest = max(highest, seq)
			if d == dir {
				s.queue = append(s.queue, name)
			}
		}
	}
	slices.Sort(s.queue) // fixed-width numbers: name order is sequence order
	s.next = highest + 1
	return s, nil
}

// mkdirDurable is os.MkdirAll(dir, 0o700) that also fsyncs the parent of every directory it
// creates: otherwise a crash could take the new spool directory, and every batch in it, away.
func mkdirDurable(dir string) error {
	var created []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil || !errors.Is(err, fs.ErrNotExist) {
			break
		}
		created = append(created, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, d := range created {
		if err := syncDir(filepath.Dir(d)); err != nil {
			return err
		}
	}
	return nil
}

// probeWrite creates and removes a file in dir. A spool this process may read but not write (a
// directory left by a run as another user, a read-only mount) opened as well as any, and went
// unnoticed until the database first refused a write and nothing could wait here: the writes
// were refused instead of kept (found by an audit).
func probeWrite(dir string) error {
	f, err := os.CreateTemp(dir, "probe-*"+tmpSuffix) // a leftover is removed at the next Open
	if err != nil {
		return fmt.Errorf("spool open: %s is not writable by this user, uid %d (the writes the database refuses wait there): %w", dir, os.Getuid(), err)
	}
	f.Close()
	if err := os.Remove(f.Name()); err != nil {
		return fmt.Errorf("spool open: remove the probe file: %w", err)
	}
	return nil
}

// removeTemps removes the regular *.tmp files among entries of dir.
func removeTemps(dir string, entries []os.DirEntry) (removed bool, err error) {
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), tmpSuffix) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, err
		}
		removed = true
	}
	return removed, nil
}

// parseName returns the sequence number of a batch file name ("%020d.json").
func parseName(name string) (uint64, bool) {
	digits, ok := strings.CutSuffix(name, batchSuffix)
	if !ok || len(digits) != seqDigits {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	seq, err := strconv.ParseUint(digits, 10, 64)
	return seq, err == nil
}

// Waiting counts the batches waiting in the spool in dir, as Open would find them, without
// creating or changing anything: a tool that writes the store while the daemon is stopped asks
// it first, since the waiting batches hold writes the store does not have yet. A missing dir
// holds none.
func Waiting(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("spool: %w", err)
	}
	n := 0
	for _, e := range entries {
		if _, ok := parseName(e.Name()); ok && e.Type().IsRegular() {
			n++
		}
	}
	return n, nil
}

// Dir returns the spool directory.
func (s *Spool) Dir() string { return s.dir }

// Len returns the number of batches waiting.
func (s *Spool) Len() int { return len(s.queue) }

// Append writes groups as one new batch and returns its name. The batch is durable when Append
// returns nil: its file was written under a temporary name, fsynced, renamed and the directory
// fsynced, so a crash never leaves a partial batch visible. On any error (it wraps the OS error)
// the caller must answer its senders with an error; they keep their writes. Only if the final
// directory fsync fails and the file cannot be taken back does the batch stay queued as well,
// which is the same as a write that is re-sent.
func (s *Spool) Append(groups [][]persistence.Op) (name string, err error) {
	if len(groups) == 0 {
		return "", errors.New("spool append: no groups")
	}
	data, err := encode(groups, time.Now())
	if err != nil {
		return "", fmt.Errorf("spool append: %w", err)
	}
	name = fmt.Sprintf("%0*d%s", seqDigits, s.next, batchSuffix)
	s.next++ // never reuse a number, even after a failed attempt
	path := filepath.Join(s.dir, name)
	if _, err := os.Lstat(path); err == nil {
		// Renaming over it would destroy a batch written behind the spool's back.
		return "", fmt.Errorf("spool append %s: %w", name, fs.ErrExist)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("spool append %s: %w", name, err)
	}
	visible, err := writeAtomic(s.dir, name, data)
	if err != nil && visible {
		// The file is in place but its directory entry may not be durable. Take it back so the
		// error we return stays true; if even that fails, it is there and will be replayed.
		if rmErr := os.Remove(path); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) {
			s.queue = append(s.queue, name)
		}
	}
	if err != nil {
		return "", fmt.Errorf("spool append %s: %w", name, err)
	}
	s.queue = append(s.queue, name)
	return name, nil
}

// Next returns the oldest waiting batch without removing it, or nil if the spool is empty. A
// batch that cannot be decoded yields a *CorruptError naming it (move it aside with Quarantine);
// any other error is an I/O error worth retrying later.
func (s *Spool) Next() (*Batch, error) { return s.NextAfter("") }

// NextAfter is Next for the batches behind the one named after ("": all of them): it returns
// the oldest waiting batch whose name sorts after it, which is the order of the batches. A
// replay reads a few batches ahead with it, to commit them in one transaction.
func (s *Spool) NextAfter(after string) (*Batch, error) {
	i, found := slices.BinarySearch(s.queue, after) // names sort like their sequence numbers
	if found {
		i++
	}
	for i < len(s.queue) {
		name := s.queue[i]
		data, err := os.ReadFile(filepath.Join(s.dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			// Removed by hand behind the spool's back: there is nothing left to replay.
			s.queue = slices.Delete(s.queue, i, i+1)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("spool next %s: %w", name, err)
		}
		groups, createdAt, err := DecodeOps(data)
		if err != nil {
			return nil, &CorruptError{Name: name, Err: err}
		}
		return &Batch{Name: name, Groups: groups, CreatedAt: createdAt}, nil
	}
	return nil, nil
}

// Remove deletes waiting batches after they have been replayed, in the order given, and then
// fsyncs the directory once, so that they are not replayed again after a crash. Give them
// oldest first: a process that dies part way then leaves the newest of them, which a replay
// applies again in order, as it does a batch whose removal never began. (A power loss leaves
// them so too where the removals of one directory reach the disk in order, as on a journaling
// filesystem.) No batch is removed when a name is not waiting.
func (s *Spool) Remove(names ...string) error {
	if len(names) == 0 {
		return nil
	}
	for _, name := range names {
		if _, found := slices.BinarySearch(s.queue, name); !found {
			return fmt.Errorf("spool remove %q: %w", name, ErrUnknownBatch)
		}
	}
	for _, name := range names {
		if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("spool remove %s: %w", name, err)
		}
		if i, found := slices.BinarySearch(s.queue, name); found {
			s.queue = slices.Delete(s.queue, i, i+1)
		}
	}
	if err := syncDir(s.dir); err != nil {
		what := names[0]
		if len(names) > 1 {
			what += " to " + names[len(names)-1]
		}
		return fmt.Errorf("spool remove %s: %w", what, err)
	}
	return nil
}

// Quarantine moves a waiting batch that can never be applied (it does not decode, or the
// database rejects it for good) to the failed/ subdirectory, next to a <name>.reason.txt file
// that records reason. Nothing is deleted: if failed/ already holds a file of that name, the
// batch gets a numbered suffix. The batch leaves the queue once it is moved, even if writing the
// reason then fails, and when its file is gone (removed by hand): the error then wraps
// persistence.ErrBatchGone.
func (s *Spool) Quarantine(name string, reason string) error {
	i := slices.Index(s.queue, name)
	if i < 0 {
		return fmt.Errorf("spool quarantine %q: %w", name, ErrUnknownBatch)
	}
	failed := filepath.Join(s.dir, failedDir)
	if err := os.MkdirAll(failed, 0o700); err != nil {
		return fmt.Errorf("spool quarantine %s: %w", name, err)
	}
	target, err := freeName(failed, name)
	if err != nil {
		return fmt.Errorf("spool quarantine %s: %w", name, err)
	}
	if err := os.Rename(filepath.Join(s.dir, name), filepath.Join(failed, target)); err != nil {
		if _, serr := os.Lstat(filepath.Join(s.dir, name)); errors.Is(serr, fs.ErrNotExist) {
			// Removed by hand behind the spool's back: there is nothing left to set aside.
			s.queue = slices.Delete(s.queue, i, i+1)
			return fmt.Errorf("spool quarantine %s: %w: %w", name, persistence.ErrBatchGone, err)
		}
		return fmt.Errorf("spool quarantine %s: %w", name, err)
	}
	s.queue = slices.Delete(s.queue, i, i+1)
	if err := syncDir(failed); err != nil {
		return fmt.Errorf("spool quarantine %s: %w", name, err)
	}
	if err := syncDir(s.dir); err != nil {
		return fmt.Errorf("spool quarantine %s: %w", name, err)
	}
	note := fmt.Sprintf("batch: %s\nquarantined_at: %s\nreason: %s\n",
		name, time.Now().UTC().Format(time.RFC3339Nano), reason)
	if _, err := writeAtomic(failed, target+reasonSuffix, []byte(note)); err != nil {
		return fmt.Errorf("spool quarantine %s: write reason: %w", name, err)
	}
	return nil
}

// freeName returns name, or name with the first free ".N" suffix, whichever does not exist in dir.
func freeName(dir, name string) (string, error) {
	for n := 0; ; n++ {
		candidate := name
		if n > 0 {
			candidate = fmt.Sprintf("%s.%d", name, n)
		}
		_, err := os.Lstat(filepath.Join(dir, candidate))
		if errors.Is(err, fs.ErrNotExist) {
			return candidate, nil
		}
		if err != nil {
			return "", err
		}
	}
}

// writeAtomic writes data to dir/name through dir/name.tmp: write, fsync, rename, fsync dir. It
// reports whether the file became visible under name, which it can be even with an error (when
// the final directory fsync fails). A failed write leaves no temporary file behind if it can help
// it; Open removes any that a crash left.
func writeAtomic(dir, name string, data []byte) (visible bool, err error) {
	path := filepath.Join(dir, name)
	tmp := path + tmpSuffix
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return false, err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return false, err
	}
	return true, syncDir(dir)
}

// syncDir fsyncs a directory, making the creation, rename or removal of its entries durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}

// Peek returns the oldest batch behind the one named after ("": the oldest of all), its name
// "" when there is none. It is NextAfter in the shape of persistence.Spooler.
func (s *Spool) Peek(after string) (string, [][]persistence.Op, error) {
	b, err := s.NextAfter(after)
	if err != nil {
		var ce *CorruptError
		if errors.As(err, &ce) {
			return ce.Name, nil, fmt.Errorf("%w: %w", persistence.ErrCorruptSpool, err)
		}
		return "", nil, err
	}
	if b == nil {
		return "", nil, nil
	}
	return b.Name, b.Groups, nil
}

var _ persistence.Spooler = (*Spool)(nil)
