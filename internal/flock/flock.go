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
