package sqlite

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// LowSpace is the free space under which CheckSpace warns of the disk that holds the database
// or the spool: 128 MiB. The write-ahead log may hold up to 64 MiB between two checkpoints
// before the checkpointer truncates it (truncateAbove, and journal_size_limit after a
// checkpoint: docs/RUNBOOK.md says so of the -wal file), and a checkpoint copies its pages
// into the database file, which grows by as many of them as are new: a burst of writes (a
// spool's replay, a backlog's turns) may take twice 64 MiB before any of it comes back. A
// turn itself takes kilobytes (its messages, their search index entries, the reply in the
// outbox), so the bound is the log's, not the turns'; and once the disk is full, the writes
// go to the spool, on the same disk by default, and are refused when it is full too.
const LowSpace = 128 << 20

// NoSpace is the free space under which nothing can be written at all: SQLite cannot open a
// database stopped cleanly without making its 32 KiB shared-memory file (-shm), nor make a new
// one, so serve cannot start.
const NoSpace = 32 << 10

// SpaceError is CheckSpace's error: the file system that holds Dir has only Free bytes free
// to this user.
type SpaceError struct {
	Dir  string
	Free uint64
	// Full: less than NoSpace is free, and nothing can be written.
	Full bool
	// Database: the file system holds the SQLite database (its -wal and -shm files): full, the
	// database cannot be opened, and serve does not start. One that holds only the data
	// directory (the database elsewhere, or PostgreSQL) keeps only the spool and the HTTP
	// address's files: serve starts on it full, and the writes the database refuses are refused.
	Database bool
	at       string // Dir, or the nearest of its parents that exists, for df
}

func (e *SpaceError) Error() string {
	// Of a disk without the database (on another disk, or PostgreSQL): the spool's words only.
	spool := "the writes the database refuses cannot wait in the spool, and are refused (HTTP 503)"
	switch {
	case e.Full && e.Database:
		return fmt.Sprintf("the disk holding %s is full (%s free to this user, uid %d): nothing can be written, "+
			"not even the database's 32 KiB shared-memory file: free space on it (df -h %s)",
			e.Dir, size(e.Free), os.Getuid(), e.at)
	case e.Full:
		return fmt.Sprintf("the disk holding %s is full (%s free to this user, uid %d): nothing can be written there: "+
			"%s: free space on it (df -h %s)", e.Dir, size(e.Free), os.Getuid(), spool, e.at)
	case !e.Database:
		return fmt.Sprintf("the disk holding %s has only %s free to this user, uid %d, under %s: once it is full, "+
			"%s: free space on it (df -h %s)", e.Dir, size(e.Free), os.Getuid(), size(LowSpace), spool, e.at)
	}
	return fmt.Sprintf("the disk holding %s has only %s free to this user, uid %d, under %s: the database's "+
		"write-ahead log alone may take 64 MiB, and the database as much again as it is checkpointed; once the disk "+
		"is full, writes wait in the spool, or are refused (HTTP 503) when it is on the same disk: free space on it (df -h %s)",
		e.Dir, size(e.Free), os.Getuid(), size(LowSpace), e.at)
}

// size writes n bytes in KiB below a MiB, else in MiB.
func size(n uint64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}

// CheckSpace returns a *SpaceError for each file system among those that hold dataDir (the
// spool's; "" for none) and database, the path of a SQLite database ("" for none: a PostgreSQL
// store), that has less than LowSpace free to this user, once per file system, dataDir's first;
// none where the free space cannot be told (off Linux). A directory not made yet counts as the nearest of
// its parents that exists (serve makes the rest). The database's directory is that of the
// file a symbolic link at its path names (DatabaseDir): SQLite writes the database, its -wal
// and its -shm there. For check-config and serve's start: before, a disk nearly full was found
// only when the writes failed on it.
func CheckSpace(dataDir, database string) []error {
	var dirs []string
	if dataDir != "" {
		dirs = append(dirs, dataDir)
	}
	if database != "" {
		dirs = append(dirs, DatabaseDir(database))
	}
	var out []error
	seen := map[uint64]*SpaceError{} // nil: room enough, or the free space cannot be told
	for i, dir := range dirs {
		isDB := database != "" && i == len(dirs)-1
		at := existing(dir)
		dev, ok := device(at)
		if !ok {
			continue
		}
		if e, ok := seen[dev]; ok {
			if e != nil && isDB {
				e.Database = true // the data directory's disk holds the database too
			}
			continue
		}
		var e *SpaceError
		if free, ok := freeBytes(at); ok && free < LowSpace {
			e = &SpaceError{Dir: dir, Free: free, Full: free < NoSpace, Database: isDB, at: at}
			out = append(out, e)
		}
		seen[dev] = e
	}
	return out
}

// maxLinks bounds the links DatabaseDir follows, as the kernel bounds those of a path (40).
const maxLinks = 40

// DatabaseDir returns the directory that holds the SQLite database at path, and its -wal and
// -shm files: that of the file a symbolic link at path names, through as many links as there
// are, also when that file is not made yet (the store's Open makes it there, and SQLite opens
// it there), else path's own. Before, check-config and serve's start looked at the disk of the
// link (data_dir's agentgate.db linked to a file on another disk, which TestOpenThroughASymlink
// keeps working), not at the disk that the database fills.
func DatabaseDir(path string) string {
	for range maxLinks {
		target, err := os.Readlink(path)
		if err != nil {
			break // not a link (or not there): the file is at path
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(path), target)
		}
		path = target
	}
	return filepath.Dir(path)
}

// existing returns dir, or the nearest of its parents that exists.
func existing(dir string) string {
	d := filepath.Clean(dir)
	for {
		if _, err := os.Stat(d); err == nil || !errors.Is(err, fs.ErrNotExist) || d == filepath.Dir(d) {
			return d
		}
		d = filepath.Dir(d)
	}
}
