// Package flock takes exclusive advisory locks (flock(2)) on open files: the guards that keep
// a second daemon off a data directory and off a SQLite database.
package flock

import (
	"errors"
	"os"
	"syscall"
)

// ErrHeld says that another open file, of this process or another, holds the lock.
var ErrHeld = errors.New("lock held by another process")

// Exclusive takes an exclusive lock on f without waiting for it (ErrHeld when another holds
// it), trying again when a signal interrupts the call. The lock lives as long as f is open.
func Exclusive(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EWOULDBLOCK):
			return ErrHeld
		}
		return err
	}
}

// Open opens the lock file path (created 0600 if missing) and takes its exclusive lock
// (Exclusive: ErrHeld when another holds it), which lives as long as the returned file is
// open. The file is opened for writing: on NFS flock is a byte-range lock, which an exclusive
// one takes only on a file open for writing.
func Open(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := Exclusive(f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
