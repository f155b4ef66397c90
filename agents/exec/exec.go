package exec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
)

// DefaultKillGrace is the time between SIGTERM and SIGKILL when Config.KillGrace is zero.
const DefaultKillGrace = 5 * time.Second

// Config configures an exec Agent.
type Config struct {
	// Command is the program and its arguments, run once per turn. It is not run through a
	// shell.
	Command []string
	// Timeout bounds one turn; zero means no limit beyond the caller's ctx.
	Timeout time.Duration
	// KillGrace is how long the process group gets between SIGTERM and SIGKILL after a cancel
	// or timeout, and how long Run waits for stdout and stderr to close after the command
	// exits. Zero means DefaultKillGrace.
	KillGrace time.Duration
	// History is how many of the most recent history entries go to the command; zero sends
	// none.
	History int
	// HistoryBytes bounds the history sent, in bytes of its JSON on stdin: the oldest of those
	// History entries are left out first, whole, until the rest fits, and the newest is sent
	// even when it alone takes more. Zero: no bound. A chat of long replies otherwise sent the
	// command History of them every turn (20 of 1 MiB: over 20 MiB to hold and write).
	HistoryBytes int
	// Dir is the command's working directory; empty means the daemon's.
	Dir string
	// Steer declares that the command reads steered messages as JSON lines on stdin while it
	// runs (see EncodeInput). When it is set, Run forwards Request.Steer to the command and
	// CanSteer reports true.
	Steer bool
	// Withhold names environment variables the command must not see: the daemon's own
	// secrets (its bot token, its HTTP bearer token). A command is driven by chat input, and
	// the tools it runs with it inherit its environment. Their values (as New finds them) are
	// also redacted from the output of a failed command that is logged.
	Withhold []string
	// Logger receives debug and warning lines about runs; nil discards them.
	Logger *slog.Logger
}

// inherited marks the file descriptors the process inherited close-on-exec (closeInherited)
// before the first command starts.
var inherited sync.Once

// Agent runs a command per turn. Create it with New; it is safe for concurrent use.
type Agent struct {
	command []string
	timeout time.Duration
	grace   time.Duration
	history int
	// historyBytes: see Config.HistoryBytes
	historyBytes int
	dir          string
	steer        bool
	// withhold: see Config.Withhold
	withhold []string
	redact   *redactor // of what a failed command printed, before it is logged
	log      *slog.Logger
	// heldOpen, graceKill and replyCut limit the WRN lines of what a command does at every turn
	// once it does it at all (leaves a process holding its output, ignores SIGTERM, answers at
	// length) to one a minute (logging.Limiter, with repeats), the others at Debug: a soak's
	// command that always left a background process wrote a WRN a turn. One of each per agent:
	// a daemon runs one.
	heldOpen, graceKill, replyCut logging.Limiter
	// timeoutStderr and runaway limit, likewise, the lines of a command that times out (the end
	// of its stderr, beside the turn's failure, itself limited) or prints in a loop at every turn.
	timeoutStderr, runaway logging.Limiter
	// historyCut is set once HistoryBytes left history out of a turn (logged at Info once).
	historyCut atomic.Bool

	mu      sync.Mutex
	running map[int]struct{} // the process groups of the commands started and not yet reaped
	// unstartable is since when the command cannot be started, as a turn or Ready found it;
	// nil while it can.
	unstartable atomic.Pointer[time.Time]
}

var _ agents.Steerer = (*Agent)(nil)

// New returns an Agent for c. It fails when c has no command or a negative limit.
func New(c Config) (*Agent, error) {
	var errs []error
	if len(c.Command) == 0 || c.Command[0] == "" {
		errs = append(errs, errors.New("exec agent: command is empty"))
	} else if err := FindCommand(c.Command[0], c.Dir); err != nil {
		errs = append(errs, err)
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("exec agent: negative timeout %v", c.Timeout))
	}
	if c.KillGrace < 0 {
		errs = append(errs, fmt.Errorf("exec agent: negative kill grace %v", c.KillGrace))
	}
	if c.History < 0 {
		errs = append(errs, fmt.Errorf("exec agent: negative history %d", c.History))
	}
	if c.HistoryBytes < 0 {
		errs = append(errs, fmt.Errorf("exec agent: negative history bytes %d", c.HistoryBytes))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	a := &Agent{
		command: slices.Clone(c.Command),
		timeout: c.Timeout,
		grace:   c.KillGrace,
		history: c.History,

		historyBytes: c.HistoryBytes,
		dir:          c.Dir,
		steer:        c.Steer,
		log:          c.Logger,

		withhold: slices.DeleteFunc(slices.Clone(c.Withhold), func(s string) bool { return s == "" }),
		running:  map[int]struct{}{},
	}
	a.redact = newRedactor(a.withhold, os.Getenv)
	if a.grace == 0 {
		a.grace = DefaultKillGrace
	}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	return a, nil
}

// FindCommand checks that program, a command's first word, names an executable file: a
// name without a slash is looked up in PATH, a relative path is taken from dir (the daemon's
// working directory when dir is empty). Otherwise every turn would fail, each with one
// warning, and the operator would learn of a typo only from the users.
func FindCommand(program, dir string) error {
	path := program
	if dir != "" && strings.ContainsRune(program, os.PathSeparator) && !filepath.IsAbs(program) {
		path = filepath.Join(dir, program)
	}
	found, err := osexec.LookPath(path)
	switch {
	case err == nil:
		return checkFormat(found)
	case errors.Is(err, osexec.ErrNotFound) && !strings.ContainsRune(program, os.PathSeparator):
		return fmt.Errorf("exec agent: command %q is not found in PATH (give its full path)", program)
	case errors.Is(err, fs.ErrNotExist):
		if !filepath.IsAbs(path) {
			// ./bin/agent from the daemon's working directory, which under a service manager
			// is not the shell's the operator tried it in.
			wd, _ := os.Getwd()
			return fmt.Errorf("exec agent: command %q does not exist (a relative path, taken from the working directory %s)", path, wd)
		}
		return fmt.Errorf("exec agent: command %q does not exist", path)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("exec agent: command %q is not executable (chmod +x it, or run it through its interpreter: [sh, %s])", path, program)
	}
	return fmt.Errorf("exec agent: command %q cannot be run: %v", path, err)
}

// KillAll sends SIGKILL to the process group of every command the agent runs, which holds
// what each command started, and returns how many groups it signalled. It is for a daemon that
// exits without stopping its turns (a second stop signal): the kernel kills each command when
// the daemon dies, but not what the command started, which would run on beside the next
// start's run of the same message. The Runs of those commands then return their failures.
func (a *Agent) KillAll() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for pid := range a.running {
		if syscall.Kill(-pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// FlushLines reports the events the agent's limited lines hold back (logging.Limiter.Flush):
// the daemon calls it as it stops, once the agent's calls have ended. Else their limiter's
// timer reported them up to a minute later, when the daemon had exited.
func (a *Agent) FlushLines() {
	logging.FlushAll(&a.heldOpen, &a.graceKill, &a.replyCut, &a.timeoutStderr, &a.runaway)
}

// Ready reports whether the command can be started now, as New checked it (FindCommand): nil
// when it can, otherwise why not and since when (the first turn or check that found it so). A
// program removed, or no longer executable, while the daemon runs fails every turn, and the
// daemon's /readyz says so. It checks the file afresh each time, so that readiness comes back
// once the program is put right, also when no turn comes to find it (a load balancer that
// follows /readyz sends none meanwhile).
func (a *Agent) Ready() error {
	err := FindCommand(a.command[0], a.dir)
	if err == nil {
		a.unstartable.Store(nil)
		return nil
	}
	now := time.Now()
	a.unstartable.CompareAndSwap(nil, &now)
	since := now
	if t := a.unstartable.Load(); t != nil {
		since = *t
	}
	return fmt.Errorf("%v; every turn fails (since %s)", err, since.Format(time.RFC3339))
}

// CanSteer reports whether Run forwards Request.Steer to the command, as set by Config.Steer.
func (a *Agent) CanSteer() bool { return a.steer }

// Run runs the command once for req and returns its trimmed stdout as the reply. It returns an
// error wrapping *ExitError when the command exits unsuccessfully, ErrTimeout when it outlives
// Config.Timeout, and ctx.Err() when ctx ends first. On a timeout or cancel the command's
// process group gets SIGTERM, then SIGKILL after Config.KillGrace; Run returns at most about
// KillGrace after that even if a grandchild still holds stdout open.
//
// With Config.Steer set and a non-nil req.Steer, stdin stays open after the input object and
// every message received from req.Steer is written to it as one line (see EncodeInput) until
// req.Steer is closed, which closes stdin. Run stops receiving from req.Steer when the command
// exits or ctx ends, and does not wait for req.Steer to be closed: a sender must not block on
// it once the turn is over. A message whose line cannot be encoded ends the turn's messages, as
// a closed req.Steer does, and the later ones are not received. The messages it received that
// the command never saw (their line could not be encoded or written, or lay wholly unread in
// stdin when the command exited or, on a timeout or cancel, when it was stopped) are counted in
// Response.Unseen, which comes next to an error too. Without steering, stdin closes after the input object and req.Steer is never read.
func (a *Agent) Run(ctx context.Context, req *agents.Request) (*agents.Response, error) {
	name := a.command[0]
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("exec agent: run %s: %w", name, err)
	}
	in, sent, leftOut, err := encodeInput(req, a.history, a.historyBytes)
	if err != nil {
		return nil, err
	}
	if leftOut > 0 {
		a.logHistoryCut(req.Identity, sent, leftOut)
	}

	runCtx, cancel := ctx, context.CancelFunc(func() {})
	if a.timeout > 0 {
		runCtx, cancel = context.WithTimeoutCause(ctx, a.timeout, ErrTimeout)
	}
	defer cancel()

	runCtx, stopRunaway := context.WithCancelCause(runCtx)
	defer stopRunaway(nil)
	stdout := &headBuffer{max: MaxReply, limit: MaxOutput, runaway: func() { stopRunaway(errRunaway) }}
	stderr := &tailBuffer{max: MaxStderr, limit: MaxStderrRead, runaway: func() { stopRunaway(errStderrRunaway) }}
	stdoutTail := &tailBuffer{max: MaxStdoutLogged} // for the Debug line of a failure
	cmd := osexec.CommandContext(runCtx, name, a.command[1:]...)
	cmd.Dir = a.dir
	cmd.Env = childEnv(os.Environ(), a.withhold, req.Identity)
	steer := a.steer && req.Steer != nil
	// A steering command's stdin is a pipe of this call's own, not os/exec's: once the command
	// has exited, what it left unread in the pipe says which steered messages it never saw.
	var stdin, stdinRead *os.File
	if steer {
		if stdinRead, stdin, err = os.Pipe(); err != nil {
			return nil, fmt.Errorf("exec agent: run %s: %w", name, err)
		}
		defer stdin.Close()
		cmd.Stdin = stdinRead
	} else {
		cmd.Stdin = bytes.NewReader(in)
	}
	outEnd, errEnd := &pipeEnd{w: io.MultiWriter(stdout, stdoutTail)}, &pipeEnd{w: stderr}
	cmd.Stdout, cmd.Stderr = outEnd, errEnd
	cmd.SysProcAttr = procAttr()
	// killer is set by Cancel, which os/exec calls from its own goroutine; Wait returns only
	// after Cancel has returned, so a nil killer after Wait means the command was never
	// signalled.
	var killer atomic.Pointer[time.Timer]
	cmd.Cancel = func() error {
		pid := cmd.Process.Pid
		if err := syscall.Kill(-pid, syscall.SIGTERM); err != nil {
			if errors.Is(err, syscall.ESRCH) {
				return os.ErrProcessDone
			}
			return err
		}
		killer.Store(time.AfterFunc(a.grace, func() {
			if syscall.Kill(-pid, syscall.SIGKILL) == nil {
				a.graceKill.Log(a.log, slog.LevelWarn, "exec agent killed process group after grace period",
					"command", name, "session", req.Identity.SessionKey, "pid", pid, "grace", a.grace)
			}
		}))
		return nil
	}
	// WaitDelay bounds the wait for pipes a grandchild may hold open, both after a cancel (where
	// it matches the killer above) and after the command exits by itself.
	cmd.WaitDelay = a.grace

	inherited.Do(closeInherited)
	start := time.Now()
	err = cmd.Start()
	if stdinRead != nil {
		stdinRead.Close() // the command's now: a write fails once it and what it started are gone
	}
	if err != nil {
		a.unstartable.CompareAndSwap(nil, &start)
		return nil, fmt.Errorf("exec agent: start %s: %w", name, err)
	}
	a.unstartable.Store(nil)
	pid := cmd.Process.Pid
	a.mu.Lock()
	a.running[pid] = struct{}{}
	a.mu.Unlock()
	var exited chan struct{}
	var forwarded chan steerLog
	if steer {
		// The forwarder belongs to this call: it ends when the command exits (exited), at the
		// latest, and Run waits for it below.
		exited, forwarded = make(chan struct{}), make(chan steerLog, 1)
		flog := a.log.With("command", name, "session", req.Identity.SessionKey, "turn", req.Identity.TurnID)
		go func() {
			forwarded <- forwardSteer(runCtx, stdin, in, req.Steer, exited, flog)
		}()
	}
	waitErr := cmd.Wait()
	unseen := 0
	if steer {
		// The deadline ends a write blocked on a full pipe that a leftover process holds and does
		// not read; exited ends a forwarder waiting on a steer channel that is never closed.
		_ = stdin.SetWriteDeadline(time.Now())
		close(exited)
		sl := <-forwarded
		unread, known := sl.unread, sl.measured
		if !sl.closed {
			n, err := unreadBytes(stdin)
			unread, known = n, err == nil
		}
		unseen = sl.unseen(unread, known)
		if unseen > 0 {
			a.log.Debug("exec agent command left steered messages unread", "command", name,
				"session", req.Identity.SessionKey, "unseen", unseen)
		}
	}
	if t := killer.Load(); t != nil {
		t.Stop()
	}
	// Nothing started for this turn may outlive it. The kernel does not reuse a group id while
	// the group has a member, so this reaches the command's own leftovers, or no one (ESRCH)
	// unless the pid space wrapped around in the last few microseconds.
	if syscall.Kill(-pid, syscall.SIGKILL) == nil {
		a.log.Debug("exec agent killed leftover processes", "command", name, "pid", pid)
	}
	a.mu.Lock()
	delete(a.running, pid)
	a.mu.Unlock()
	log := a.log.With("command", name, "session", req.Identity.SessionKey, "turn", req.Identity.TurnID,
		"duration", time.Since(start))
	if stderr.written > 0 {
		// Whole, as kept, whatever the outcome: the lines above Debug show its end only
		// (stderrEnd). Its start may be cut.
		log.Debug("exec agent stderr", "stderr", a.redact.tail(stderr))
	}

	if errors.Is(context.Cause(runCtx), errRunaway) && ctx.Err() == nil {
		// It was stopped for its output, not for a cancel or the timeout: the reply is the
		// output's head, cut as a long one is.
		a.runaway.Log(log, slog.LevelWarn, "exec agent wrote more than agentgate reads; it was stopped, and the first part of its output is the reply",
			"read", MaxOutput, "reply_bytes", MaxReply)
		return &agents.Response{Text: stdout.reply(), Unseen: unseen}, nil
	}
	if errors.Is(context.Cause(runCtx), errStderrRunaway) && ctx.Err() == nil {
		// Its reply is not whole: the turn fails, with what it wrote last.
		if out := a.redact.tail(stdoutTail); out != "" {
			log.Debug("exec agent stdout of a failed command", "stdout", out)
		}
		return unseenOnly(unseen), fmt.Errorf("exec agent: run %s: stopped after more than %d MiB on stderr, which agentgate reads no further; its end: %s",
			name, MaxStderrRead>>20, strings.TrimSpace(a.redact.stderrEnd(stderr)))
	}
	// A signalled command's result is an artefact of the signal; so, most likely, is a failure
	// that coincides with the end of ctx.
	if killer.Load() != nil || (waitErr != nil && runCtx.Err() != nil) {
		if errors.Is(context.Cause(runCtx), ErrTimeout) {
			// What it was stuck on, which the error of a timeout does not say. Stdout, which
			// may be the reply (a message body), only at Debug.
			if errOut := a.redact.stderrEnd(stderr); errOut != "" {
				a.timeoutStderr.Log(log, slog.LevelWarn, "exec agent stderr before its timeout", "stderr", errOut)
			}
			if out := a.redact.tail(stdoutTail); out != "" {
				log.Debug("exec agent stdout before its timeout", "stdout", out)
			}
			return unseenOnly(unseen), agents.TimedOut(a.timeout, fmt.Errorf("%w: run %s: no reply within %v (agent.exec.timeout)", ErrTimeout, name, a.timeout))
		}
		return unseenOnly(unseen), fmt.Errorf("exec agent: run %s: %w", name, runCtx.Err())
	}
	var ee *osexec.ExitError
	switch {
	case waitErr == nil:
	case errors.Is(waitErr, osexec.ErrWaitDelay):
		// The command succeeded but left a process holding stdout or stderr open; the reply
		// is what it wrote before the pipes were closed.
		a.heldOpen.Log(log, slog.LevelWarn, "exec agent closed output held open after exit", "grace", a.grace)
	case errors.As(waitErr, &ee):
		if outEnd.cut.Load() || errEnd.cut.Load() {
			// As after a success: the turn waited kill_grace for it, which its error (the exit
			// status) does not say.
			a.heldOpen.Log(log, slog.LevelWarn, "exec agent closed output held open after exit", "grace", a.grace)
		}
		code, sig := ee.ExitCode(), syscall.Signal(0)
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			sig = ws.Signal()
			code = 128 + int(sig)
		}
		if out := a.redact.tail(stdoutTail); out != "" {
			// Not in the error, which is logged at Warn: it may be the reply (a message body).
			log.Debug("exec agent stdout of a failed command", "stdout", out)
		}
		return unseenOnly(unseen), fmt.Errorf("exec agent: run %s: %w", name, &ExitError{Code: code, Signal: sig, Stderr: a.redact.stderrEnd(stderr)})
	default:
		return unseenOnly(unseen), fmt.Errorf("exec agent: run %s: %w", name, waitErr)
	}
	resp := &agents.Response{Text: stdout.reply(), Unseen: unseen}
	if stdout.truncated {
		// The user sees the cut; the operator hears of it as of a model's (openai agent).
		a.replyCut.Log(log, slog.LevelWarn, "exec agent reply cut off: it is longer than agentgate takes", "reply_bytes", MaxReply, "written", stdout.written)
	}
	log.Debug("exec agent turn done", "reply_bytes", len(resp.Text), "truncated", stdout.truncated)
	return resp, nil
}

// logHistoryCut logs that HistoryBytes left out the oldest leftOut of the history entries the
// turn's command would have got, and sent the sent after them: at Debug each turn, and at Info
// the first time, which tells an operator that the command no longer sees the start of long
// conversations without a line for every turn of each (as the openai agent's token budget).
func (a *Agent) logHistoryCut(id identity.Turn, sent, leftOut int) {
	log := a.log.With("command", a.command[0], "session", id.SessionKey, "turn", id.TurnID)
	log.Debug("exec agent history trimmed", "left_out", leftOut, "sent", sent, "history_bytes", a.historyBytes)
	if a.historyCut.CompareAndSwap(false, true) {
		log.Info("a turn's history left out older entries to fit agent.exec.history_bytes; each turn's cut is logged at debug from now on",
			"history_bytes", a.historyBytes, "left_out", leftOut, "sent", sent)
	}
}

// steerLog is what forwardSteer wrote to a steering command's stdin.
type steerLog struct {
	received int     // messages taken from Request.Steer
	starts   []int64 // where each steer line written whole begins in stdin, in order
	written  int64   // bytes written to stdin, a cut line's included
	closed   bool    // stdin was closed: Request.Steer or ctx ended
	// unread is how many bytes lay unread in stdin as ctx ended, when measured: stdin is closed
	// then, and Run can no longer look.
	unread   int64
	measured bool
}

// unseen returns how many of the messages received, the last ones, the command never saw: those
// whose line could not be written whole, and, when known (the bytes left unread in stdin after
// the command exited), those of which it read nothing. A line it began to read counts as seen.
func (l steerLog) unseen(unread int64, known bool) int {
	seen := len(l.starts)
	if known {
		read := l.written - unread
		seen = sort.Search(len(l.starts), func(i int) bool { return l.starts[i] >= read })
	}
	return l.received - seen
}

// unseenOnly returns the response that carries only unseen, which an error return needs; nil
// when there is none.
func unseenOnly(unseen int) *agents.Response {
	if unseen == 0 {
		return nil
	}
	return &agents.Response{Unseen: unseen}
}

// forwardSteer writes the input object to stdin, then every message received from steer as one
// steer line, until steer is closed or ctx ends (when it closes stdin), or the command has
// exited (exited is closed). A failed write means the command no longer reads stdin, so it stops
// there. It returns what it wrote, for Run to tell which messages the command never saw.
func forwardSteer(ctx context.Context, stdin *os.File, in []byte, steer <-chan agents.Message, exited <-chan struct{}, log *slog.Logger) (l steerLog) {
	n, err := stdin.Write(in)
	l.written += int64(n)
	if err != nil {
		log.Debug("exec agent command did not read its input", logging.Err(err))
		return l
	}
	for {
		select {
		case m, ok := <-steer:
			if !ok {
				stdin.Close() // the end of the turn's messages, which the command reads as EOF
				l.closed = true
				return l
			}
			l.received++
			line, err := EncodeSteer(m)
			if err != nil {
				// Its time is outside years 0-9999, which only a caller's clock makes (the
				// stores' and time.Now's are within). Unseen counts the last messages received,
				// so none may be written after it: the turn's messages end here (EOF), it counts
				// unseen, and it and those not taken run next, each as a turn of its own.
				// Before, it was skipped: it counted seen, and the next one written unseen.
				log.Warn("exec agent could not encode steered message", "message_id", m.MessageID, logging.Err(err))
				stdin.Close()
				l.closed = true
				return l
			}
			start := l.written
			n, err := stdin.Write(line)
			l.written += int64(n)
			if err != nil {
				// Not lost: Run counts it unseen, and it runs next, as a turn of its own.
				log.Debug("exec agent could not deliver steered message", "message_id", m.MessageID, logging.Err(err))
				return l
			}
			l.starts = append(l.starts, start)
			log.Debug("exec agent steered message", "message_id", m.MessageID)
		case <-exited:
			return l
		case <-ctx.Done():
			// The lines still unread now the command never saw: its turn is over (a timeout, a
			// cancel, a runaway), and it cannot answer what it reads after its SIGTERM. Measured
			// before the close, which leaves Run nothing to look at; else those messages counted
			// as seen and failed with the turn instead of running next.
			if n, err := unreadBytes(stdin); err == nil {
				l.unread, l.measured = n, true
			}
			stdin.Close() // EOF for a command that reads on after its SIGTERM; its turn is over
			l.closed = true
			return l
		}
	}
}

// childEnv returns a new environment for one turn's command: parent without any AGENTGATE_*
// variable and without those named in withhold, then exactly the turn's identity variables.
// Nothing in it is shared with another call.
func childEnv(parent, withhold []string, t identity.Turn) []string {
	turn := t.Env()
	env := make([]string, 0, len(parent)+len(turn))
	for _, kv := range parent {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, identity.EnvPrefix) && !slices.Contains(withhold, name) {
			env = append(env, kv)
		}
	}
	return append(env, turn...)
}
