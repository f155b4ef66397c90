//go:build !linux

package exec

import "syscall"

// procAttr puts the command in a process group of its own, so that one signal reaches every
// process it started. (On Linux the kernel also kills it when the daemon dies.)
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
