package exec_test

import (
	"bytes"
	"os"
	osexec "os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/agentgate/agentgate/agents/exec"
)

// inheritedFDEnv names the descriptor the stand-in daemon of TestCommandGetsNoInheritedFD
// inherited: the test binary run again, with it set, is that daemon.
const inheritedFDEnv = "AGENTGATE_TEST_EXEC_INHERITED_FD"

// inheritedFD is the descriptor the stand-in daemon inherits, fd 10 as a shell's `exec 10<file`
// leaves it.
const inheritedFD = 10

// TestCommandGetsNoInheritedFD: a descriptor the daemon inherited without close-on-exec (from
// the shell or job runner that started it) does not reach an agent's command. Before, every
// command had it open, and whatever the command started too: fd 10 and a job runner's pipe on
// fd 251 were found in an operator's agent.
func TestCommandGetsNoInheritedFD(t *testing.T) {
	if os.Getenv(inheritedFDEnv) != "" {
		runWithInheritedFD(t)
		return
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	daemon := osexec.Command(os.Args[0], "-test.run=^TestCommandGetsNoInheritedFD$", "-test.count=1")
	daemon.Env = append(os.Environ(), inheritedFDEnv+"="+strconv.Itoa(inheritedFD))
	daemon.ExtraFiles = make([]*os.File, inheritedFD-2) // child fd 3+i: closed, up to the last
	daemon.ExtraFiles[inheritedFD-3] = f
	var out bytes.Buffer
	daemon.Stdout, daemon.Stderr = &out, &out
	if err := daemon.Run(); err != nil {
		t.Fatalf("the stand-in daemon failed: %v\n%s", err, out.String())
	}
}

// runWithInheritedFD is the stand-in daemon: it checks that it did inherit the descriptor open
// across exec, then runs a command that lists its own open descriptors.
func runWithInheritedFD(t *testing.T) {
	flags, _, errno := syscall.Syscall(syscall.SYS_FCNTL, inheritedFD, syscall.F_GETFD, 0)
	if errno != 0 || flags&syscall.FD_CLOEXEC != 0 {
		t.Fatalf("fd %d in the stand-in daemon: flags %#x, errno %v; want it open without close-on-exec", inheritedFD, flags, errno)
	}
	a := MustNew(t, exec.Config{Command: []string{"/bin/sh", "-c", "ls /proc/$$/fd"}})
	resp, err := a.Run(t.Context(), request(turn(1), "hi"))
	if err != nil {
		t.Fatal(err)
	}
	fds := strings.Fields(resp.Text)
	if slices.Contains(fds, strconv.Itoa(inheritedFD)) {
		t.Errorf("the command's open descriptors = %v, want no %d (inherited by the daemon)", fds, inheritedFD)
	}
}
