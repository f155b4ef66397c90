package testutil

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Resources is what a long-running process holds that must return to its baseline once the
// work that needed it has ended: goroutines, open file descriptors and child processes (its
// zombies among them, which only it can reap).
type Resources struct {
	Goroutines int
	FDs        int // entries of /proc/self/fd; -1 where there is no /proc
	Children   int // processes whose parent is this one, zombies included; -1 without /proc
	Zombies    int // children that exited and were not reaped
	// Marked counts the live processes other than this one that carry the environment mark of
	// MarkProcesses: what the test started and what those started in turn, wherever they were
	// reparented. -1 without a mark.
	Marked int
}

func (r Resources) String() string {
	return fmt.Sprintf("%d goroutines, %d fds, %d child processes (%d zombies), %d marked processes",
		r.Goroutines, r.FDs, r.Children, r.Zombies, r.Marked)
}

// TakeResources counts the process's resources now. Goroutines whose stack holds one of
// ignore (a function name) are not counted: a pool that keeps its workers by design grows with
// the load it once had, not with the work done.
func TakeResources(ignore ...string) Resources {
	r := Resources{Goroutines: countGoroutines(ignore), FDs: -1, Children: -1, Marked: -1}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		r.FDs = len(fds) - 1 // the directory being read is one
	}
	r.Children, r.Zombies, r.Marked = processes(os.Getpid(), os.Getenv(markEnv), nil)
	return r
}

// countGoroutines counts the goroutines whose stack holds none of ignore.
func countGoroutines(ignore []string) int {
	if len(ignore) == 0 {
		return runtime.NumGoroutine()
	}
	n := 0
	for g := range strings.SplitSeq(Goroutines(), "\n\n") {
		if !slices.ContainsFunc(ignore, func(s string) bool { return strings.Contains(g, s) }) {
			n++
		}
	}
	return n
}

// markEnv is the environment variable of MarkProcesses. It must not start with AGENTGATE_:
// the exec agent withholds those from its commands.
const markEnv = "LEAKCHECK_MARK"

// MarkProcesses sets an environment variable unique to t for the rest of the test, so that
// TakeResources can count the processes it passes to (Resources.Marked): every process the
// test starts from now on inherits it, and so do theirs, unless one clears its environment.
// Like t.Setenv, it cannot be used in a parallel test.
func MarkProcesses(t *testing.T) {
	t.Helper()
	t.Setenv(markEnv, fmt.Sprintf("%d-%d-%s", os.Getpid(), time.Now().UnixNano(), t.Name()))
}

// processes counts the processes whose parent is pid and the zombies among them, and the live
// processes other than pid whose environment holds markEnv=mark (-1 when mark is empty). When
// list is not nil, it gets a line for each of those processes.
func processes(pid int, mark string, list *strings.Builder) (children, zombies, marked int) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return -1, 0, -1
	}
	want := []byte("\x00" + markEnv + "=" + mark + "\x00")
	if mark == "" {
		marked = -1
	}
	self := strconv.Itoa(pid)
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil || p.Name() == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + p.Name() + "/stat")
		if err != nil {
			continue // it exited meanwhile
		}
		// "pid (comm) S ppid ...": comm may hold spaces and parentheses, so parse after the last ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		child := len(f) >= 2 && f[1] == self
		if child {
			children++
			if f[0] == "Z" {
				zombies++
			}
		}
		// A zombie's environment reads empty: it counts as its parent's child, not as marked.
		isMarked := false
		if mark != "" {
			env, err := os.ReadFile("/proc/" + p.Name() + "/environ")
			if isMarked = err == nil && bytes.Contains(append([]byte{0}, env...), want); isMarked {
				marked++
			}
		}
		if list != nil && (child || isMarked) {
			cmd, _ := os.ReadFile("/proc/" + p.Name() + "/cmdline")
			fmt.Fprintf(list, "  pid %s %s child=%v marked=%v: %s\n", p.Name(), strings.TrimSpace(s[:i+1]),
				child, isMarked, strings.ReplaceAll(strings.TrimRight(string(cmd), "\x00"), "\x00", " "))
		}
	}
	return children, zombies, marked
}

// Slack is how far above a baseline the resources may settle: a small constant (a pooled
// worker, a keep-alive connection, a timer of the runtime), never growth with the work done.
type Slack struct {
	Goroutines, FDs, Children int
	// Ignore is passed to TakeResources; the baseline must have been taken with it too.
	Ignore []string
}

// within reports whether r is at most base plus slack.
func (r Resources) within(base Resources, s Slack) bool {
	return r.Goroutines <= base.Goroutines+s.Goroutines &&
		(r.FDs < 0 || r.FDs <= base.FDs+s.FDs) &&
		(r.Children < 0 || r.Children <= base.Children+s.Children) &&
		r.Zombies <= base.Zombies && r.Marked <= base.Marked
}

// MustSettle waits, up to timeout, for the process's resources to come back to within slack of
// base: goroutines end, connections close and processes are reaped asynchronously, so it polls
// the condition rather than sleep once. On failure it reports the counts with every
// goroutine's stack, so that what leaked can be read off the failure.
func MustSettle(t testing.TB, what string, base Resources, slack Slack, timeout time.Duration) Resources {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		now := TakeResources(slack.Ignore...)
		if now.within(base, slack) {
			return now
		}
		if time.Now().After(deadline) {
			var procs strings.Builder
			processes(os.Getpid(), os.Getenv(markEnv), &procs)
			lines := strings.SplitAfter(procs.String(), "\n")
			if len(lines) > 20 {
				lines = append(lines[:20], fmt.Sprintf("  … and %d more\n", len(lines)-20))
			}
			t.Fatalf("%s: resources did not return to their baseline within %v:\n got  %v\n want at most %v plus %+v\nprocesses:\n%s\n%s",
				what, timeout, now, base, slack, strings.Join(lines, ""), Goroutines())
			return now
		}
		runtime.Gosched()
		time.Sleep(20 * time.Millisecond) // a poll interval under a deadline
	}
}

// Goroutines returns the stacks of every goroutine.
func Goroutines() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}
