//go:build linux

package pgtest

import "syscall"

// sysProcAttr returns the process attributes to run initdb or postgres as cred (nil: as the
// current user). With server set, the process is also killed if the test binary dies, so a
// killed test run leaves no server behind. (Switching user clears a death signal; the os/exec
// child sets it after switching, so it holds.)
func sysProcAttr(cred *credential, server bool) (*syscall.SysProcAttr, error) {
	attr := &syscall.SysProcAttr{}
	if cred != nil {
		attr.Credential = &syscall.Credential{Uid: uint32(cred.uid), Gid: uint32(cred.gid)}
	}
	if server {
		attr.Pdeathsig = syscall.SIGKILL
	}
	return attr, nil
}
