// Command agentgate is the agentgate daemon and its admin tool. See README.md for the commands;
// main only parses flags, environment and file into a Config, builds the logger and runs.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentgate/agentgate/internal/buildinfo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/supervisor"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		os.Exit(exitStatus(err, os.Stderr))
	}
}

// exitStatus prints what err says, unless the command printed it already (errUsage), and
// returns the exit status it ends with: 2 for a wrong command line, as Go's flag package and
// most commands exit, and 1 for a command that failed.
func exitStatus(err error, stderr io.Writer) int {
	var ue *usageError
	switch {
	case errors.As(err, &ue):
		printError(stderr, err)
		return 2
	case errors.Is(err, errUsage):
		return 2
	}
	printError(stderr, err)
	return 1
}

// printError prints the error a command ended with on one line after "agentgate: " (see
// errorLine). The problems of a configuration go one a line before it, each after
// "agentgate: " too, as check-config prints them: before, serve printed all of them on one
// line, hard to read in a journal (found by a new user's walkthrough).
func printError(w io.Writer, err error) {
	var cp *configProblems
	if errors.As(err, &cp) {
		for _, p := range cp.errs {
			fmt.Fprintln(w, "agentgate:", errorLine(p.Error()))
		}
	}
	fmt.Fprintln(w, "agentgate:", errorLine(err.Error()))
}

// errorLine is msg on one line: a library's error may span several (pgx lists each address it
// tried, one a line), and a command that fails ends with one line, as RUNBOOK says, which a
// log collector takes whole.
func errorLine(msg string) string {
	var b strings.Builder
	for line := range strings.Lines(msg) {
		line = strings.TrimSpace(line)
		switch {
		case line == "":
			continue
		case b.Len() == 0:
		case strings.HasSuffix(b.String(), ":"):
			b.WriteByte(' ')
		default:
			b.WriteString("; ")
		}
		b.WriteString(line)
	}
	return b.String()
}

// errUsage means the usage text was already printed: the command line was wrong.
var errUsage = errors.New("usage")

// usageError is a wrong command line that its flags' parse let through: a value out of range
// (--limit -1), an argument that cannot be what the command takes (a KEY that is no session
// key, an empty QUERY). main prints it as it prints a failure, and exits 2, as after errUsage,
// which it is (errors.Is). Before, such a line exited 1, as a command that failed, while an
// unparsable value (--limit abc) exited 2 (found by a CLI review).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func (e *usageError) Is(target error) bool { return target == errUsage }

// usagef returns a *usageError of the message format makes.
func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errHelp means -h was asked for and answered: the command stops with success.
var errHelp = errors.New("help")

const usage = `usage: agentgate <command> [flags]

commands:
  serve          run the daemon (the default command)
  check-config   validate the configuration and print every problem
  sessions       list, show, export, search or reset the stored sessions; list and requeue
                 quarantined messages; pardon messages struck by unclean stops
  backup         write a consistent copy of the SQLite database, also while the daemon runs
  bench          load an in-process daemon and measure turns/s, latency and the SQLite ceiling
  version        print the version (also --version)

Run 'agentgate <command> -h' or 'agentgate help <command>' for the flags of a command.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "serve"
	named := len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-'
	if named {
		cmd, args = args[0], args[1:]
	} else if len(args) > 0 && isHelpFlag(args[0]) {
		// agentgate -h asks about agentgate, not about its default command: the list of
		// commands says where serve's flags are.
		cmd, args = "help", args[1:]
	} else if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") {
		cmd, args = "version", args[1:] // what most daemons answer; serve has no such flag
	}
	err := dispatch(ctx, cmd, args, stdout, stderr)
	if errors.Is(err, errHelp) {
		return nil
	}
	if !named && cmd == "serve" && errors.Is(err, errUsage) {
		// agentgate -v: the flag went to serve, which the user never named.
		fmt.Fprint(stderr, "\nNo command was given, so the flags went to serve, the default command. 'agentgate -h' lists the commands.\n")
	}
	return err
}

func dispatch(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) error {
	switch cmd {
	case "serve":
		return serve(ctx, args, stdout, stderr)
	case "check-config":
		return checkConfig(args, stdout, stderr)
	case "sessions":
		return sessions(ctx, args, stdout, stderr)
	case "backup":
		return backup(ctx, args, stdout, stderr)
	case "bench":
		return bench(ctx, args, stdout, stderr)
	case "version":
		fs := flag.NewFlagSet("version", flag.ContinueOnError)
		fs.Usage = func() {
			fmt.Fprint(fs.Output(), "usage: agentgate version\n\nPrints agentgate's version (also agentgate --version). It takes no flags.\n")
		}
		if err := parse(fs, args, stdout, stderr); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "agentgate", buildinfo.Version())
		return nil
	case "help":
		if len(args) > 0 && args[0] != "help" && !isHelpFlag(args[0]) {
			// agentgate help serve; agentgate help sessions show (before, the sessions
			// commands' list: the command after it was dropped).
			return dispatch(ctx, args[0], append(slices.Clip(args[1:]), "-h"), stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "agentgate: unknown command %q\n\n%s", cmd, usage)
	return errUsage
}

// isHelpFlag reports whether arg is one of the spellings of the flag package's help flag.
func isHelpFlag(arg string) bool {
	switch arg {
	case "-h", "--h", "-help", "--help":
		return true
	}
	return false
}

// configFlags are the flags every command that reads the configuration accepts, so that one
// set of them can be passed to any command.
type configFlags struct {
	file, dataDir, httpAddr, logFormat, logLevel string

	fs     *flag.FlagSet
	hidden map[string]bool // accepted, but doing nothing for this command: its help omits them
}

func (f *configFlags) register(fs *flag.FlagSet) {
	f.fs = fs
	fs.StringVar(&f.file, "config", "", "YAML config `file` (default: built-in defaults)")
	fs.StringVar(&f.dataDir, "data-dir", "", "data `directory` (overrides data_dir)")
	fs.StringVar(&f.httpAddr, "http-addr", "", "HTTP listen `address` (overrides http.addr)")
	fs.StringVar(&f.logFormat, "log-format", "", "log `format`: text or json (overrides log.format)")
	fs.StringVar(&f.logLevel, "log-level", "", "log `level`: debug, info, warn or error (overrides log.level)")
}

// registerAdmin registers the flags for a command that reads the store rather than serve:
// --log-format and --log-level do nothing for it, nor does --http-addr unless the command
// talks to the daemon (usesDaemon), and its help leaves out what does nothing.
func (f *configFlags) registerAdmin(fs *flag.FlagSet, usesDaemon bool) {
	f.register(fs)
	f.hidden = map[string]bool{"log-format": true, "log-level": true, "http-addr": !usesDaemon}
	if usesDaemon {
		fs.Lookup("http-addr").Usage = "the daemon's HTTP `address` for the curl command printed when its data directory records none; the command itself asks only a recorded address (overrides http.addr)"
	}
	fs.Usage = func() {
		usage, ok := sessionsCommandUsage[fs.Name()]
		if !ok {
			usage = "usage: agentgate " + fs.Name() + " [flags]\n"
		}
		fmt.Fprint(fs.Output(), usage, "\nflags:\n")
		f.printDefaults()
	}
}

// printDefaults prints the command's flags as flag.PrintDefaults does, but for the hidden ones.
func (f *configFlags) printDefaults() {
	shown := flag.NewFlagSet(f.fs.Name(), flag.ContinueOnError)
	shown.SetOutput(f.fs.Output())
	f.fs.VisitAll(func(fl *flag.Flag) {
		if !f.hidden[fl.Name] {
			shown.Var(fl.Value, fl.Name, fl.Usage)
			shown.Lookup(fl.Name).DefValue = fl.DefValue
		}
	})
	shown.PrintDefaults()
}

// load is check for an admin command that opens no store (backup): the configuration, or the
// error that says what is wrong with it (configError), or that data_dir is no directory.
func (f *configFlags) load() (*config.Config, error) {
	cfg, problems, refused := f.check(func(c *config.Config) []error { return nonNil(notADirectory(c.DataDir)) })
	if problems != nil {
		return nil, configError(problems)
	}
	if refused != nil {
		return nil, refused
	}
	return cfg, nil
}

// configFlagKeys names the flag that sets each key configFlags sets, for the problems of its
// value: "(set by --log-level)", as a variable's say "(set by AGENTGATE_LOG_LEVEL)".
var configFlagKeys = map[string]string{
	"data_dir": "--data-dir", "http.addr": "--http-addr", "log.format": "--log-format", "log.level": "--log-level",
}

// check is load for check-config and serve: the configuration is returned with its problems,
// and apart what here refuses of it on this machine (config.Check); nil when it cannot be read
// at all.
func (f *configFlags) check(here func(*config.Config) []error) (cfg *config.Config, problems, refused error) {
	// A flag given overrides, even when empty (--data-dir '' is a mistake to report, not a
	// wish for the default).
	set := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if set["config"] && f.file == "" {
		// --config "$CFG" with CFG unset ran on the built-in defaults, as if no file had been
		// named: another data_dir, another port (found by an audit).
		return nil, errors.New("--config names no file (it is empty): name the file, or leave the flag out for the built-in defaults"), nil
	}
	return config.Check(f.file, os.Environ(), func(c *config.Config) {
		if set["data-dir"] {
			c.DataDir = f.dataDir
		}
		if set["http-addr"] {
			c.HTTP.Addr = f.httpAddr
		}
		if set["log-format"] {
			c.Log.Format = f.logFormat
		}
		if set["log-level"] {
			c.Log.Level = f.logLevel
		}
	}, configFlagKeys, here)
}

// parse parses args, fs's flags and no argument. It returns errHelp after -h and errUsage
// after a usage error (parseFlags).
func parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelp
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		unexpectedArg(stderr, fs)
		return errUsage
	}
	return nil
}

// unexpectedArg says on stderr that fs's first argument left is one too many, and where the
// command's arguments are explained, as a missing argument's message does (before, it named
// the argument alone, and README said it pointed to -h).
func unexpectedArg(stderr io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(stderr, "agentgate %s: unexpected argument %s (agentgate %[1]s -h says what it takes)\n", fs.Name(), shortQuote(fs.Arg(0)))
}

// parseFlags is fs.Parse(args) with the usage that -h asks for on stdout, as the command's
// output (agentgate help prints it there too), and a usage error with the usage after it on
// stderr. Before, -h printed on stderr, the flag package's default: `agentgate sessions show -h
// | less` showed nothing.
func parseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	var out bytes.Buffer
	fs.SetOutput(&out)
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	if errors.Is(err, flag.ErrHelp) {
		_, _ = out.WriteTo(stdout)
	} else {
		_, _ = out.WriteTo(stderr)
	}
	return err
}

// serveUsage and checkConfigUsage are what serve's and check-config's -h print before their
// flags, as every other command's does (before, Go's bare "Usage of serve:").
const serveUsage = `usage: agentgate serve [flags]

Runs the daemon (the default command): the HTTP API on http.addr, and the platforms and the
agent the configuration enables, with its data in data_dir. It prints "listening on ADDR" once
bound, and logs to stderr. The first SIGINT, SIGTERM (Ctrl-C) or SIGHUP drains: no new
messages, the running turns finish (up to shutdown.drain_timeout); a second SIGINT or SIGTERM
exits at once (a SIGHUP never does). Nothing reloads the configuration: restart to apply it. The
configuration is read from the built-in defaults, --config's file, AGENTGATE_* variables, then
these flags.
`

const checkConfigUsage = `usage: agentgate check-config [flags]

Validates the configuration as serve reads it (the built-in defaults, --config's file,
AGENTGATE_* variables, then these flags), and what serve would refuse in this environment (an
unset secret variable, an exec command that is not here), without opening the store or the
network. It prints every problem on stderr and exits 1, or prints "config ok".
`

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var cf configFlags
	cf.register(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), serveUsage, "\nflags:\n")
		cf.printDefaults()
	}
	if err := parse(fs, args, stdout, stderr); err != nil {
		return err
	}
	// Refused here, at the key's line, rather than once the store is open (and a PostgreSQL one
	// migrated): a data directory serve cannot make or write, which would fail at its lock, or
	// whose spool directory it cannot write; a SQLite store.dsn in a directory that is not
	// there, where the store would make a new, empty database; and what pgx refuses on this
	// machine, with the file or the PG* variable named, of which the store's Open says only that
	// the DSN cannot be parsed.
	// So is what supervisor.Preflight finds (a secret variable unset, an exec agent's command
	// not there), as check-config says it: before, Start refused it without the key's line.
	cfg, problems, refused := cf.check(func(c *config.Config) []error {
		return append(preflightRefusals(c), nonNil(dirProblem(c), c.CheckSQLite(), c.CheckPostgres())...)
	})
	if problems != nil {
		return configError(problems)
	}
	if refused != nil {
		if errs := unwrapAll(refused); len(errs) > 1 {
			return &configProblems{errs: errs, refused: true}
		}
		return refused
	}
	var level slog.LevelVar
	level.Set(cfg.SlogLevel())
	log := logging.New(stderr, &level, cfg.Log.Format)
	for _, name := range cfg.UnknownEnv(os.Environ()) {
		attrs := []any{"var", name}
		if known := config.ClosestEnv(name); known != "" {
			attrs = append(attrs, "did_you_mean", known)
		}
		log.Warn("environment variable names no configuration key (a misspelt one?); it is ignored", attrs...)
	}
	for _, err := range cfg.PostgresAdvice() {
		// check-config's warnings, said where a deploy that skipped it looks (a walkthrough).
		log.Warn("store.dsn goes against README's advice; serving all the same", logging.Err(err))
	}
	for _, err := range cfg.ExecAdvice() {
		log.Warn("agent.exec.kill_grace is longer than a stop gives; serving all the same", logging.Err(err))
	}
	for _, err := range cfg.HistoryAdvice() {
		log.Warn("the agent's history is more than sessions.history_limit keeps; serving all the same", logging.Err(err))
	}
	if err := hideFromSameUser(); err != nil {
		log.Warn("cannot keep the exec agent from reading the daemon's environment and memory (prctl PR_SET_DUMPABLE)", logging.Err(err))
	}

	// The first SIGINT/SIGTERM drains; a second one exits at once. SIGHUP stops as SIGTERM does:
	// left to its default it killed the daemon with no drain, no log line and an unclean stop
	// counted at the next start (a dropped SSH session, or a `kill -HUP` meant as a reload; a
	// walkthrough). It is left ignored when it was ignored at start (nohup).
	// Room for a terminal's two hangups and a SIGTERM during a slow start (a review).
	sigs := make(chan os.Signal, 3)
	stopSignals := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		stopSignals = append(stopSignals, syscall.SIGHUP)
	}
	signal.Notify(sigs, stopSignals...)
	defer signal.Stop(sigs)
	// A log written to a pipe whose reader is gone (`serve 2>&1 | tee log` in an SSH session
	// that drops: tee dies of the same hangup) fails with EPIPE instead of killing the daemon
	// with SIGPIPE mid-drain, which Go does for a write to fd 1 or 2 unless SIGPIPE is notified
	// (TestHangupWithItsLogReaderGone; a review). Notified, not ignored: an ignored signal
	// stays ignored in the agents' commands, and a shell pipeline there would change.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)

	// The signals are heard during the start too: it waits for the replay of the spool the
	// last run left for as long as the replay takes batches out of it, and that may be long.
	// A second signal exits through one path whenever it comes (ab.exit): during the start,
	// in the instant between Start's return and the end of the start's reader, and in the stop.
	stop, started := make(chan struct{}), make(chan struct{})
	var ab aborter
	heard := make(chan bool, 1)
	go func() { heard <- awaitStartSignal(sigs, stop, started, &ab, log) }() // ends with the start
	d, err := supervisor.Start(ctx, cfg, log, supervisor.Options{Stop: stop, Abortable: ab.set})
	if testHookStartReturned != nil {
		testHookStartReturned()
	}
	close(started)
	signalled := <-heard
	if errors.Is(err, supervisor.ErrStopped) {
		return nil // stopped as asked; the spool keeps what the replay did not take
	}
	if err != nil {
		return startError(ctx, cfg, err)
	}
	fmt.Fprintf(stdout, "listening on %s\n", d.Addr())
	var fatal error
	if !signalled {
		fatal, signalled = awaitStop(ctx, sigs, d.Fatal(), cfg.Shutdown.DrainTimeout, log)
	}
	var exit exitGate
	go func() {
		if awaitSecondSignal(sigs, signalled, &exit, log) {
			ab.exit()
		}
	}()
	stopCtx, cancel := context.WithTimeout(context.Background(), cfg.Shutdown.DrainTimeout+config.StopMargin)
	defer cancel()
	err = d.Stop(stopCtx)
	exit.end()
	return stopResult(err, fatal, d.Fatal())
}

// stopResult is what serve returns once the stop ended: the stop's own error, else the fatal
// error that began the stop, else one the daemon reported during the drain a signal began (a
// cluster member that lost its membership in a database outage, a top-level actor stopped),
// logged then as `the daemon cannot go on`. Before, nothing read the last: the stop exited 0,
// and a service manager took a daemon that had failed for one that stopped cleanly
// (TestStopResult). The drain goes on all the same: a stop signal asked for it, and its
// deadline bounds it. The stop has ended, so nothing reports a fatal error after this read
// (the membership's renewals have stopped, and a top-level actor's stop no longer counts).
func stopResult(stopErr, fatal error, fatals <-chan error) error {
	if stopErr != nil {
		return stopErr
	}
	if fatal == nil {
		select {
		case fatal = <-fatals:
		default:
		}
	}
	return fatal
}

// exitProcess is os.Exit; a test of a second signal's exit replaces it.
var exitProcess = os.Exit

// testHookStartReturned, when set, runs in serve between Start's return and the end of the
// start's signal reader, for a test to send its signals in that instant.
var testHookStartReturned func()

// aborter is what a second stop signal does before the process exits: Daemon.Abort, once the
// start has given it (supervisor.Options.Abortable: from the record of the run on), which
// kills the exec agent's commands with what they started and records the clean stop. Both
// signal readers exit through it. Before, the start's reader exited without Abort, also when
// it took the second signal in the instant after Start returned, before serve's own reader
// began: the commands ran on, and the next start counted an unclean stop (a strike against
// each session's running message) (TestSecondSignalAsTheStartReturns).
type aborter struct {
	mu    sync.Mutex
	abort func()
}

// set is supervisor.Options.Abortable.
func (a *aborter) set(abort func()) {
	a.mu.Lock()
	a.abort = abort
	a.mu.Unlock()
}

// exit aborts the daemon, if the start got as far as that matters, and exits with status 2.
func (a *aborter) exit() {
	a.mu.Lock()
	abort := a.abort
	a.mu.Unlock()
	if abort != nil {
		abort()
	}
	exitProcess(2)
}

// exitGate lets the first of a stop's end and its second signal set the exit status. Before,
// a second signal in the instant between the stop's end and signal.Stop (or one still in the
// channel's buffer) exited 2 after a stop that had ended cleanly (TestSignalAfterTheStopEnded).
type exitGate struct {
	mu    sync.Mutex
	ended bool
}

// end says that the stop ended: a signal after it changes the exit status no more. A second
// signal that came first holds the gate until the process exits (exit), and end waits for it.
func (g *exitGate) end() {
	g.mu.Lock()
	g.ended = true
	g.mu.Unlock()
}

// exit reports whether a second signal may exit the process now: false once the stop ended.
// When true, it keeps the gate locked for good, so that the stop's end cannot return first.
func (g *exitGate) exit() bool {
	g.mu.Lock()
	if g.ended {
		g.mu.Unlock()
		return false
	}
	return true
}

// awaitStop waits for what begins the stop: a stop signal (signalled), the daemon's fatal error,
// or ctx's end. A fatal error that is there with the signal wins (TestAwaitStopFatalWins): a
// select picks either of two ready cases, and when it took the signal the daemon that had failed
// exited 0, which a service manager's Restart=on-failure does not restart.
func awaitStop(ctx context.Context, sigs <-chan os.Signal, fatals <-chan error, drain time.Duration, log *slog.Logger) (fatal error, signalled bool) {
	select {
	case sig := <-sigs:
		signalled = true
		if sig == syscall.SIGHUP {
			const hangup = "hangup received (SIGHUP); stopping as for SIGTERM: agentgate does not reload its configuration (restart it to apply a change)"
			log.Info(hangup, "signal", sig.String())
		}
		// What a new user at a terminal waits for, and how not to (the stop's own line said only
		// "draining deadline=30s"); a service manager's SIGTERM reads the same.
		log.Info("signal received; draining: waiting up to the deadline for the running turns and the messages queued behind them; "+
			"a second SIGINT or SIGTERM (Ctrl-C again) exits at once", "signal", sig.String(), "deadline", drain)
	case fatal = <-fatals:
	case <-ctx.Done():
	}
	if fatal == nil {
		select {
		case fatal = <-fatals:
		default:
		}
	}
	if fatal != nil {
		log.Info("stopping", "reason", fatal)
	}
	return fatal, signalled
}

// awaitStartSignal hears the stop signals while the daemon starts, until started is closed, and
// reports whether one came. The first closes stop (supervisor.Options.Stop): the start ends
// without waiting for the rest of the replay of the spool, and the daemon stops (a start that
// was past it stops as after a signal once it serves). A second SIGINT or SIGTERM exits at once,
// as in the drain (awaitSecondSignal), through ab as there. Before, no signal was read until
// the start returned: a long replay of the spool ignored SIGTERM and Ctrl-C until it ended, and
// a service manager killed the daemon at its stop timeout.
func awaitStartSignal(sigs <-chan os.Signal, stop chan<- struct{}, started <-chan struct{}, ab *aborter, log *slog.Logger) bool {
	signalled := false
	for {
		select {
		case <-started:
			return signalled
		case sig := <-sigs:
			switch {
			case !signalled:
				signalled = true
				// Logged before stop closes: the start's own line about the stop it made
				// must come after it (logged first, from the start's goroutine, it came
				// before it now and then under load).
				log.Info("signal received during the start; stopping: a wait ends at once (the data directory's or the database's lock, the connect, the cluster's join), "+
					"a migration of the schema finishes first, the replay of the spool stops after its current batches and the rest waits for the next start; "+
					"a second SIGINT or SIGTERM (Ctrl-C again) exits at once", "signal", sig.String())
				close(stop)
			case sig == syscall.SIGHUP:
				log.Info("hangup received (SIGHUP) during the start's stop; it goes on: a second SIGINT or SIGTERM exits at once", "signal", sig.String())
			default:
				log.Warn("second signal; exiting now", "signal", sig.String())
				ab.exit()
			}
		}
	}
}

// awaitSecondSignal returns true once a stop signal comes that is a second one: the drain is
// cut short then (the caller exits 2). It returns false at such a signal that comes once the
// stop ended (exit's end): the stop's own exit status stands. A hangup comes twice when a
// terminal drops (from the kernel to the foreground job and from the shell to each of its
// jobs): counted as a second signal, it would cut short the drain it started. Only SIGINT and SIGTERM exit at once. When the daemon began the stop itself
// (signalled false: a cluster member that lost its membership, a top-level actor stopped), the
// first stop signal is the first the operator sent: a SIGINT or SIGTERM lets the drain go on,
// and the next one exits (after a SIGHUP, the first one does). Before, it was taken for the second: a service manager's stop or restart of a member
// stopping in a database outage cut its drain at once (exit 2), and the turn results it held
// for the database were lost and their messages run again (a black-box cluster soak;
// TestClusterSignalDuringAStopTheMemberBeganDrains).
func awaitSecondSignal(sigs <-chan os.Signal, signalled bool, exit *exitGate, log *slog.Logger) bool {
	for {
		sig := <-sigs
		switch {
		case sig == syscall.SIGHUP:
			// A stop signal all the same, as it is when it begins the stop: in a stop the
			// daemon began on its own, the SIGINT or SIGTERM after it exits, as this line
			// says. Before, that one was taken for the first, and only said the drain goes on
			// (TestAwaitSecondSignal).
			signalled = true
			log.Info("hangup received (SIGHUP) during the drain; the drain goes on: a second SIGINT or SIGTERM exits at once",
				"signal", sig.String())
		case !signalled:
			signalled = true
			log.Info("signal received while the daemon stops on its own; the drain goes on: a second SIGINT or SIGTERM exits at once",
				"signal", sig.String())
		default:
			if !exit.exit() {
				return false
			}
			log.Warn("second signal; exiting now", "signal", sig.String())
			return true
		}
	}
}

func checkConfig(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check-config", flag.ContinueOnError)
	var cf configFlags
	cf.register(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), checkConfigUsage, "\nflags:\n")
		cf.printDefaults()
	}
	printDefaults := fs.Bool("print-defaults", false, "print the default configuration with every key and exit")
	configOnly := fs.Bool("config-only", false, "check the configuration alone: what serve refuses only in this environment "+
		"(an unset secret variable, an exec command or a cluster TLS file not on this machine) is a warning, not a problem; "+
		"for a file checked elsewhere than where it runs")
	if err := parse(fs, args, stdout, stderr); err != nil {
		return err
	}
	if *printDefaults {
		fmt.Fprint(stdout, config.Example())
		return nil
	}
	// What serve refuses at start beyond the configuration's validation, short of opening the
	// store or the network: before, check-config only warned of it and said "config ok", and a
	// deploy checked with it failed at start (found by an audit). It is listed with the
	// configuration's own problems, so that one run names them all (a new user's walkthrough
	// found the unset secret named only once the file was fixed).
	// The notices come back with the refusals, so that they too are pinned on their key's line.
	cfg, err, refusals := cf.check(func(c *config.Config) []error { return append(startRefusals(c), startNotices(c)...) })
	var problems int
	if err != nil {
		for _, e := range unwrapAll(err) {
			fmt.Fprintln(stderr, e)
			problems++
		}
	}
	var refused, notes []error
	if cfg != nil {
		for _, name := range cfg.UnknownEnv(os.Environ()) {
			hint := "a misspelt one?"
			if known := config.ClosestEnv(name); known != "" {
				hint = "did you mean " + known + "?" // as the file's unknown keys are told
			}
			fmt.Fprintf(stderr, "warning: %s names no configuration key (%s); it is ignored\n", name, hint)
		}
		if refusals != nil {
			for _, r := range unwrapAll(refusals) {
				var n *notice
				switch {
				case !errors.As(r, &n):
					refused = append(refused, r)
				case n.kind == "warning":
					fmt.Fprintln(stderr, "warning:", r)
				default:
					notes = append(notes, r)
				}
			}
		}
		for _, r := range refused {
			if *configOnly {
				fmt.Fprint(stderr, "warning: ")
			}
			fmt.Fprintln(stderr, r)
		}
		if problems == 0 && len(refused) == 0 {
			// Only of a start that would go ahead: "serve will create" is not so otherwise.
			for _, n := range notes {
				fmt.Fprintln(stderr, "note:", n)
			}
		}
		if *configOnly {
			refused = nil
		}
	}
	const alone = "(--config-only checks the configuration alone)"
	switch {
	case problems > 0 && len(refused) > 0:
		return fmt.Errorf("config has %d problem(s), and serve would refuse to start here for %d more %s", problems, len(refused), alone)
	case problems > 0:
		return fmt.Errorf("config has %d problem(s)", problems)
	case len(refused) > 0:
		return fmt.Errorf("serve would refuse to start here: %d problem(s) %s", len(refused), alone)
	}
	fmt.Fprintln(stdout, "config ok")
	return nil
}

// startError is the error of a refused start, with what to do about another daemon that holds
// the data directory or the store (before, it named the holder but not the fix). Start binds
// the HTTP port before it opens anything on disk, so a second start of the same configuration
// is refused for its port: when the daemon that recorded its address in this data directory
// answers on that port, the error says so, as it says of a held data directory. An admin
// command that holds the data directory (sessions pardon, reset, requeue) is not stopped: it
// ends in seconds, and the start is tried again then.
func startError(ctx context.Context, cfg *config.Config, err error) error {
	const stopIt = ": stop it, or give this one another "
	var inUse *supervisor.DataDirInUse
	switch {
	case errors.As(err, &inUse) && inUse.ByCommand():
		return fmt.Errorf("%w: start agentgate again once it is done", err)
	case errors.Is(err, supervisor.ErrDataDirInUse) ||
		cfg.Store.Driver == "sqlite" && cfg.Store.DSN == "" && errors.Is(err, persistence.ErrLocked):
		return fmt.Errorf("%w%s%s--data-dir", err, heldBy(ctx, cfg, err), stopIt)
	case errors.Is(err, persistence.ErrLocked):
		// The lock is the schema's: another schema of the same database is another store.
		return fmt.Errorf("%w%sdatabase or schema (store.dsn, its search_path)", err, stopIt)
	case errors.Is(err, syscall.EADDRINUSE):
		addr, run, recorded := daemonAddr(cfg)
		_, port, _ := net.SplitHostPort(addr)
		_, ours, _ := net.SplitHostPort(cfg.HTTP.Addr)
		if recorded && port == ours && daemonRun(ctx, addr, run) == nil {
			return fmt.Errorf("start: http.addr %s is taken by the agentgate daemon of data directory %s%s--data-dir and --http-addr: %w",
				cfg.HTTP.Addr, cfg.DataDir, stopIt, errors.Unwrap(err))
		}
	}
	return err
}

// startRefusals returns what serve would refuse at start, in this environment, of a
// configuration that validates: supervisor.Preflight's (a secret variable unset, an exec
// agent's command not there), a data_dir it cannot make or write, or whose spool it cannot
// write, what pgx refuses here (a file store.dsn names, a PG* variable), and the files that the
// cluster's TLS names. It opens no database and no connection, so it leaves out what only those
// tell: the store, the data directory's lock, a port that is taken, a cluster.advertise that
// does not reach cluster.bind. Each names its key, as a *config.FieldError, so that
// check-config names the file's line of it.
func startRefusals(cfg *config.Config) []error {
	out := preflightRefusals(cfg)
	for _, err := range nonNil(dirProblem(cfg), cfg.CheckSQLite(), cfg.CheckPostgres(), clusterTLSFiles(cfg.Cluster)) {
		out = append(out, &refusal{err})
	}
	for _, err := range diskSpace(cfg, true) {
		out = append(out, &refusal{err})
	}
	return out
}

// preflightRefusals returns supervisor.Preflight's refusals of cfg in this environment, each a
// *config.FieldError of its key, which config.Check pins on the file's line of the key.
func preflightRefusals(cfg *config.Config) []error {
	var out []error
	for _, r := range supervisor.Preflight(cfg, os.Getenv) {
		// Each is "key: reason; serve refuses to start …".
		if field, reason, ok := strings.Cut(r, ": "); ok {
			out = append(out, &config.FieldError{Field: field, Err: errors.New(reason)})
		} else {
			out = append(out, errors.New(r))
		}
	}
	return out
}

// diskSpace returns, as *config.FieldErrors of data_dir or store.dsn, sqlite.CheckSpace's
// errors of the disks that hold the data directory (its spool, and the database by default)
// and a SQLite database elsewhere (store.dsn, or a link at data_dir's agentgate.db): with
// refused, the full disk of the SQLite database, where serve cannot open it; else those with
// little room, and a full one without the database, which serve takes (it starts with a full
// data_dir, its spool refusing what the database refuses: before, check-config refused it,
// saying serve would). A data_dir that cannot be used (dataDirProblem: in /proc, whose file
// system has no free blocks) is not looked at, nor the default database in it.
func diskSpace(cfg *config.Config, refused bool) []error {
	if cfg.Cluster.Enabled {
		return nil // a member keeps no spool, and its store is PostgreSQL: serve looks at no disk
	}
	dataDir, db := "", ""
	if dataDirProblem(cfg.DataDir) == nil {
		dataDir = cfg.DataDir
	}
	if cfg.Store.Driver == "sqlite" && cfg.CheckSQLite() == nil && (cfg.Store.DSN != "" || dataDir != "") {
		db = cfg.DSN()
	}
	var out []error
	for _, err := range sqlite.CheckSpace(dataDir, db) {
		var se *sqlite.SpaceError
		if !errors.As(err, &se) || (se.Full && se.Database) != refused {
			continue
		}
		field := "data_dir" // the key that puts the database there too, by default
		if se.Dir != dataDir && cfg.Store.DSN != "" {
			field = "store.dsn"
		}
		out = append(out, &config.FieldError{Field: field, Err: err})
	}
	return out
}

// refusal is a problem of startRefusals: err, which serve refuses to start with. Its text is
// made when it is printed, after config.Check has told err which AGENTGATE_* variables set its
// keys. Before, it was made at once (fmt.Errorf), and check-config never named them: serve said
// "(data_dir set by AGENTGATE_DATA_DIR)" of a store.dsn outside data_dir, check-config not.
type refusal struct{ err error }

func (r *refusal) Error() string { return r.err.Error() + "; serve refuses to start with it" }

func (r *refusal) Unwrap() error { return r.err }

// notice is what check-config tells of a configuration that serve takes: a note (kind "note")
// or a warning, not a problem. It wraps a *config.FieldError, so that config.Check pins it on
// its key's line as it pins the refusals.
type notice struct {
	kind string
	err  error
}

func (n *notice) Error() string { return n.err.Error() }

func (n *notice) Unwrap() error { return n.err }

// startNotices returns check-config's notices of cfg: that serve will create a new, empty
// SQLite database (before, "config ok" of a mistyped path, on which serve started as on no
// conversations at all), what README advises against in the PostgreSQL store's settings
// and the openai backend's, a bearer token short enough to guess, and a Discord bot token of
// a shape no bot token has.
func startNotices(cfg *config.Config) []error {
	var out []error
	if err := cfg.NewSQLiteDatabase(); err != nil {
		out = append(out, &notice{kind: "note", err: err})
	}
	if err := emptySQLiteDatabase(cfg); err != nil {
		out = append(out, &notice{kind: "note", err: err})
	}
	for _, err := range slices.Concat(diskSpace(cfg, false), cfg.PostgresAdvice(), cfg.OpenAIAdvice(), cfg.ExecAdvice(), cfg.HistoryAdvice(), cfg.TokenAdvice(os.Getenv), cfg.DiscordTokenAdvice(os.Getenv)) {
		out = append(out, &notice{kind: "warning", err: err})
	}
	return out
}

// emptySQLiteDatabase returns, when the store is SQLite and its database is an empty file, a
// *config.FieldError of the key that puts the database there (store.dsn, else data_dir) that
// says serve will make a new, empty database in it: SQLite takes an empty file for a new
// database, and a restore's copy that stopped at once (a full disk) leaves one where the
// conversations were expected. Before, check-config said "config ok" alone of it (found by an
// operations walkthrough).
func emptySQLiteDatabase(cfg *config.Config) error {
	if cfg.Store.Driver != "sqlite" || cfg.CheckSQLite() != nil {
		return nil
	}
	path, err := filepath.Abs(cfg.DSN())
	if err != nil {
		return nil
	}
	if fi, err := os.Stat(path); err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
		return nil
	}
	field := "store.dsn"
	if cfg.Store.DSN == "" {
		field = "data_dir"
	}
	return &config.FieldError{Field: field, Err: fmt.Errorf("the database %s is an empty file (0 bytes): serve will make a new, "+
		"empty database in it (if a copy or a restore wrote the file, it did not finish)", path)}
}

// nonNil returns the errors of errs that are not nil.
func nonNil(errs ...error) []error {
	var out []error
	for _, err := range errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// wxOK asks access(2) whether this user may make entries in a directory: W_OK|X_OK.
const wxOK = 0x2 | 0x1

// dataDirProblem returns why serve could not use dir as its data directory on this machine,
// short of making anything: it exists but is not a directory, or is a directory this user may
// not write; or it cannot be made (serve makes each missing directory in the nearest one that
// exists, which must be a directory this user may write, and none of the missing ones may be a
// symbolic link to a directory that is not there: os.MkdirAll does not make a link's target).
// Before, check-config said "config ok" of these, and serve failed only where it made the
// database or took the directory's lock; of a dangling link, until it was checked here too:
// "mkdir data: file exists" (found by a review). Nor may it be in the kernel's /proc or /sys
// (kernelFS), which root passes access(2)'s test of, nor on a path whose symbolic links loop,
// which before was said to be one this user "cannot reach".
func dataDirProblem(dir string) error {
	if dir == "" {
		return nil // (required, which validation says)
	}
	problem := func(format string, args ...any) error {
		return &config.FieldError{Field: "data_dir", Value: dir, Err: fmt.Errorf(format, args...)}
	}
	fix := func(err error) string {
		if errors.Is(err, syscall.EROFS) { // a read-only mount: no owner can write it
			return "mount it writable, or set another data_dir"
		}
		return "give it to the daemon's user, or set another data_dir"
	}
	const elsewhere = ", which holds no files: set another data_dir"
	if err := notADirectory(dir); err != nil {
		return err
	}
	_, err := os.Stat(dir) // (a directory, if it exists: notADirectory)
	switch {
	case err == nil:
		if name, ok := kernelFS(dir); ok {
			return problem("is in the kernel's %s file system%s", name, elsewhere)
		}
		if err := syscall.Access(dir, wxOK); err != nil {
			return problem("is not writable by this user, uid %d (%v): %s", os.Getuid(), err, fix(err))
		}
		return nil
	case errors.Is(err, syscall.ELOOP):
		return problem("cannot be reached: %s", linkLoop(dir))
	case !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR):
		return problem("cannot be reached by this user, uid %d: %v", os.Getuid(), err)
	}
	if target, ok := danglingLink(dir); ok {
		return problem("cannot be made: it is a symbolic link to %s, which is not there: make that directory, or set another data_dir", target)
	}
	for d := filepath.Dir(filepath.Clean(dir)); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		switch {
		case err == nil && !fi.IsDir():
			return problem("cannot be made: %s is not a directory", d)
		case err == nil:
			if name, ok := kernelFS(d); ok {
				return problem("cannot be made: %s is in the kernel's %s file system%s", d, name, elsewhere)
			}
			if err := syscall.Access(d, wxOK); err != nil {
				return problem("cannot be made: %s is not writable by this user, uid %d (%v): %s", d, os.Getuid(), err, fix(err))
			}
			return nil
		case errors.Is(err, syscall.ELOOP):
			return problem("cannot be made: %s", linkLoop(d))
		case !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR):
			return problem("cannot be made by this user, uid %d: %v", os.Getuid(), err)
		}
		if target, ok := danglingLink(d); ok {
			return problem("cannot be made: %s is a symbolic link to %s, which is not there: make that directory, or set another data_dir", d, target)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// notADirectory returns why dir cannot be a data directory when it, or the nearest of its
// parents that exists, is not a directory: a *config.FieldError of data_dir, which says so once
// for every command. A database file (--data-dir data/agentgate.db) is named as one, with the
// directory that holds it: before, the admin commands said what failed in their own words,
// "stat data/agentgate.db/agentgate.db: not a directory" or "mkdir data/agentgate.db: not a
// directory", and serve that it "exists but is not a directory" (found by a CLI review). A path
// that cannot be looked at otherwise is left to the caller (nil).
func notADirectory(dir string) error {
	if dir == "" {
		return nil
	}
	problem := func(format string, args ...any) error {
		return &config.FieldError{Field: "data_dir", Value: dir, Err: fmt.Errorf(format, args...)}
	}
	clean := filepath.Clean(dir)
	for d := clean; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		switch {
		case err == nil && fi.IsDir():
			return nil
		case err == nil && d == clean && isDatabaseFile(d, fi):
			if filepath.Base(d) == databaseFile {
				return problem("is a database file, not a directory: name the directory that holds it (%s), not the file", filepath.Dir(d))
			}
			return problem("is a database file, not a directory: name the directory that holds %s, not a database file", databaseFile)
		case err == nil && d == clean:
			return problem("exists but is not a directory")
		case err == nil && isDatabaseFile(d, fi):
			return problem("cannot be made: %s is a database file, not a directory: name the directory that holds %s, not a path under it",
				d, databaseFile)
		case err == nil:
			return problem("cannot be made: %s is not a directory", d)
		case !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR):
			return nil
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// databaseFile is the name of the SQLite database in data_dir (config.Config.DSN's default).
const databaseFile = "agentgate.db"

// isDatabaseFile reports whether path, whose os.Stat is fi, is named as agentgate's database is,
// or is a regular file that begins as a SQLite database does (one that is not regular, a FIFO,
// is not opened: its open could block).
func isDatabaseFile(path string, fi os.FileInfo) bool {
	if filepath.Base(path) == databaseFile {
		return true
	}
	if !fi.Mode().IsRegular() {
		return false
	}
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	head := make([]byte, 16)
	_, err = io.ReadFull(f, head)
	return err == nil && string(head) == "SQLite format 3\x00"
}

// linkLoop says which symbolic link on path, whose os.Stat fails with ELOOP, loops: the first
// one from the root whose own os.Stat does.
func linkLoop(path string) string {
	path = filepath.Clean(path)
	at := path
	for d := path; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); errors.Is(err, syscall.ELOOP) {
			at = d
		}
		if d == filepath.Dir(d) {
			break
		}
	}
	which := at + " is a symbolic link"
	if at == path {
		which = "it is a symbolic link"
	}
	return which + " that leads back to itself (too many levels of symbolic links): point it at a directory, or set another data_dir"
}

// danglingLink reports whether path, which os.Stat does not find, is a symbolic link (whose
// target is then not there), and returns that target as a path (a relative one is joined to the
// link's directory).
func danglingLink(path string) (target string, ok bool) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		return "", false
	}
	target, err = os.Readlink(path)
	if err != nil {
		return "", false
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(filepath.Dir(path), target)
	}
	return target, true
}

// dirProblem is dataDirProblem of cfg's data_dir, or when there is none, spoolDirProblem: the
// spool is in data_dir, and a data_dir serve cannot use said so twice (of a loop of symbolic
// links: "cannot be reached", then "its spool directory cannot be reached").
func dirProblem(cfg *config.Config) error {
	if err := dataDirProblem(cfg.DataDir); err != nil {
		return err
	}
	return spoolDirProblem(cfg)
}

// spoolDirProblem returns why serve could not use the spool directory of cfg's data_dir, which
// a daemon that is not a cluster member opens at start: it exists but is not a directory, or is
// a directory this user may not write (left by a run as root, or a read-only bind mount). A
// missing one is made in data_dir, which dataDirProblem checks. Before, check-config said
// "config ok" of it, and serve was refused only once it had opened, and written, the database.
func spoolDirProblem(cfg *config.Config) error {
	if cfg.DataDir == "" || cfg.Cluster.Enabled {
		return nil // (a cluster member keeps no spool)
	}
	dir := filepath.Join(cfg.DataDir, "spool")
	problem := func(format string, args ...any) error {
		return &config.FieldError{Field: "data_dir", Value: cfg.DataDir, Err: fmt.Errorf(format, args...)}
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return nil
	case err != nil:
		return problem("its spool directory cannot be reached by this user, uid %d: %v", os.Getuid(), err)
	case !fi.IsDir():
		return problem("its spool directory %s exists but is not a directory", dir)
	}
	if err := syscall.Access(dir, wxOK); err != nil {
		fix := "give it to the daemon's user (chown -R), or set another data_dir"
		if errors.Is(err, syscall.EROFS) { // a read-only mount: no owner can write it
			fix = "mount it writable, or set another data_dir"
		}
		return problem("its spool directory %s is not writable by this user, uid %d (%v): %s", dir, os.Getuid(), err, fix)
	}
	return nil
}

// clusterTLSFiles reads the cluster's TLS files as a member reads them when it joins the
// cluster (supervisor's clusterTLS, with its words), which a start does only after it opened
// the store.
func clusterTLSFiles(cl config.Cluster) error {
	t := cl.TLS
	if !cl.Enabled || t.CertFile == "" || t.KeyFile == "" || t.CAFile == "" {
		// No TLS, or some of its files unset, which validation says: read, the files that are
		// set made a second problem of the same mistake ("load cert.pem and : open : no such
		// file or directory").
		return nil
	}
	if _, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
		return (&config.FieldError{Field: "cluster.tls", Err: fmt.Errorf("load %s and %s: %w", t.CertFile, t.KeyFile, err)}).
			Between("cluster.tls.cert_file", "cluster.tls.key_file")
	}
	caPEM, err := os.ReadFile(t.CAFile)
	if err != nil {
		return &config.FieldError{Field: "cluster.tls.ca_file", Err: err}
	}
	if !x509.NewCertPool().AppendCertsFromPEM(caPEM) {
		return &config.FieldError{Field: "cluster.tls.ca_file", Err: fmt.Errorf("%s holds no PEM certificate", t.CAFile)}
	}
	return nil
}

// configError is the error of a command that cannot load its configuration: one line, which
// main prints after "agentgate: ", naming the problem; or, of several, a *configProblems,
// whose problems main prints one a line before it.
func configError(err error) error {
	errs := unwrapAll(err)
	if len(errs) == 1 {
		return fmt.Errorf("config: %w", err)
	}
	return &configProblems{errs: errs}
}

// configProblems is the error of a configuration with several problems: it counts them, as
// check-config's last line does, and printError prints each. With refused, they are what serve
// refuses to start with in this environment, of a configuration that has no problem.
type configProblems struct {
	errs    []error
	refused bool
}

func (e *configProblems) Error() string {
	if e.refused {
		return fmt.Sprintf("serve refuses to start here: %d problem(s)", len(e.errs))
	}
	return fmt.Sprintf("config has %d problem(s)", len(e.errs))
}

func unwrapAll(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, unwrapAll(e)...)
		}
		return out
	}
	return []error{err}
}
