//go:build !linux

package exec

import (
	"errors"
	"os"
	"syscall"
)

// procAttr puts the command in a process group of its own, so that one signal reaches every
// process it started. (On Linux the kernel also kills it when the daemon dies.)
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// unreadBytes reports that it cannot tell how many bytes written to the pipe f are unread.
func unreadBytes(f *os.File) (int64, error) { return 0, errors.ErrUnsupported }

// closeInherited does nothing here: the system's list of a process's open descriptors differs
// from Linux's /proc/self/fd, so descriptors the daemon inherited without close-on-exec reach its
// commands.
func closeInherited() {}
