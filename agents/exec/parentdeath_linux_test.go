package exec_test

import (
	"bytes"
	"context"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents/exec"
)

// parentDirEnv names the directory of TestCommandDiesWithTheDaemon's stand-in daemon: the test
// binary run again, with it set, is the process that runs the agent and is then killed.
const parentDirEnv = "AGENTGATE_TEST_EXEC_PARENT_DIR"

// TestCommandDiesWithTheDaemon: a daemon killed with SIGKILL (or by the out-of-memory killer)
// cannot stop its agents' commands; the kernel kills them. Otherwise a command would run on,
// and whoever takes the session over (the next start, another cluster member) would run the
// same message beside it.
func TestCommandDiesWithTheDaemon(t *testing.T) {
	if dir := os.Getenv(parentDirEnv); dir != "" {
		runAsDaemon(t, dir) // the stand-in daemon: it runs the agent until it is killed
		return
	}
	dir := t.TempDir()
	daemon := osexec.Command(os.Args[0], "-test.run=^TestCommandDiesWithTheDaemon$", "-test.count=1")
	daemon.Env = append(os.Environ(), parentDirEnv+"="+dir)
	var out bytes.Buffer
	daemon.Stdout, daemon.Stderr = &out, &out
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(dir, "pid")
	waitFor(t, "the agent's command to start", func() bool {
		_, err := os.Stat(pidFile)
		return err == nil
	})
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := daemon.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = daemon.Wait()
	waitFor(t, "the command to die with its daemon", func() bool { return !alive(pid) })
	if t.Failed() {
		t.Logf("the stand-in daemon's output:\n%s", out.String())
		_ = osexec.Command("kill", "-9", strconv.Itoa(pid)).Run()
	}
}

// runAsDaemon runs an agent whose command records its pid and sleeps, and waits for ever.
func runAsDaemon(t *testing.T, dir string) {
	cmd := []string{"/bin/sh", "-c", `echo $$ > "$0/pid.tmp"; mv "$0/pid.tmp" "$0/pid"; exec sleep 100`, dir}
	a, err := exec.New(exec.Config{Command: cmd})
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Run(context.Background(), request(turn(1), "hi"))
	t.Fatalf("the agent's command ended before its daemon was killed: %v", err)
}

// alive reports whether process pid exists and is not a zombie (a killed orphan stays one until
// whoever adopted it reaps it).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses, which may itself hold spaces.
	rest := string(b[bytes.LastIndexByte(b, ')')+1:])
	return !strings.HasPrefix(strings.TrimSpace(rest), "Z")
}
