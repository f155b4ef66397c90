package main

import "syscall"

// hideFromSameUser makes the daemon's process undumpable, as ssh-agent does. The exec agent
// runs as the daemon's user, and withholding the daemon's secrets from its environment does
// not keep them from it while it can read /proc/<daemon>/environ, the environment the daemon
// started with, bot and bearer tokens included (a chat user need only ask an agent with a
// shell tool for it); nor while it can attach a debugger to the daemon. Undumpable, those
// files belong to root, and only root may attach; no core file is written. The agent's own
// processes are dumpable again (execve resets it).
func hideFromSameUser() error {
	const prSetDumpable = 4 // PR_SET_DUMPABLE, <linux/prctl.h>
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpable, 0, 0); errno != 0 {
		return errno
	}
	return nil
}
