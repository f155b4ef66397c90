package exec

import (
	"os"
	"strconv"
	"syscall"
	"unsafe"
)

// procAttr puts the command in a process group of its own, so that one signal reaches every
// process it started, and has the kernel kill it if the daemon dies (kill -9, out of memory)
// without stopping it: otherwise it would run on, and the daemon's next start, or the cluster
// member that takes its session over, would run the same message beside it. The kernel sends
// that signal when the thread that started the command exits; the Go runtime does not end its
// threads (nothing in the daemon locks a goroutine to one), so only the daemon's death does.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// unreadBytes returns how many bytes written to the pipe f are still unread.
func unreadBytes(f *os.File) (int64, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int32
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
	}); err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, errno
	}
	return int64(n), nil
}

// closeInherited marks close-on-exec every file descriptor above stderr that the process has
// open. The Go runtime opens its own so, but one the daemon inherited without the flag (from the
// shell or job runner that started it: a redirection's file, a runner's status pipe) stays open
// across exec, in every command and in what it starts: os/exec passes a child stdin, stdout and
// stderr, and closes nothing else. Marking a descriptor that has the flag already changes
// nothing, so one opened or reused meanwhile by another goroutine is unharmed.
func closeInherited() {
	dir, err := os.Open("/proc/self/fd")
	if err != nil {
		return
	}
	defer dir.Close()
	self := int(dir.Fd())
	names, _ := dir.Readdirnames(-1)
	for _, name := range names {
		if fd, err := strconv.Atoi(name); err == nil && fd > 2 && fd != self {
			syscall.CloseOnExec(fd)
		}
	}
}
