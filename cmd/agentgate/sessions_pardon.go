package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/supervisor"
)

const pardonUsage = `usage: agentgate sessions pardon [flags] (--all | KEY)

Clears the unclean stops of agentgate counted against the pending messages of KEY's session,
or of every session with --all: each message runs as any other again, instead of one at a
time among the suspects (probation), and none is quarantined for these stops. For stops that
no message caused (the OOM killer killing agentgate for a backlog's memory, a kill -9, a power
loss): after two of them during a backlog, every chat waiting for an agent slot waits on
probation. A message that does take agentgate down needs 3 unclean stops again to be
quarantined. Quarantined messages are left as they are (sessions requeue runs one again).

The daemon must be stopped (a running session keeps the counts it loaded); in a cluster, every
member. Writes waiting in data_dir/spool (the database refused them, and the daemon stopped
before it could store them) are replayed into the database first, as the next start would
replay them, so that the pardon sees them; no unclean stop is counted for it.
` + keyHelp

// sessionsPardon runs `agentgate sessions pardon (--all | KEY)`: it clears the count of unclean
// stops (persistence.Store.Pardon) while no daemon holds the store.
func sessionsPardon(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fset := flag.NewFlagSet("sessions pardon", flag.ContinueOnError)
	var cf configFlags
	cf.registerAdmin(fset, false)
	all := fset.Bool("all", false, "pardon the messages of every session")
	arg, err := parseOptionalArg(fset, args, stdout, stderr)
	if err != nil {
		return helpIsDone(err)
	}
	var key string
	switch {
	case *all && arg != "":
		fmt.Fprintf(stderr, "agentgate sessions pardon: give --all or a KEY, not both\n")
		return errUsage
	case !*all && arg == "":
		fmt.Fprintf(stderr, "agentgate sessions pardon: missing --all or KEY (agentgate sessions pardon -h says what they are)\n")
		return errUsage
	case arg != "":
		if key, err = parseKey(fset.Name(), arg); err != nil {
			return err
		}
	}
	st, cfg, err := openStoreWith(ctx, &cf, storeAlone, 0)
	if errors.Is(err, persistence.ErrLocked) {
		return fmt.Errorf("sessions pardon: agentgate is running on this %s: stop the daemon first (its sessions keep the counts they loaded; "+
			"in a cluster, stop every member), then pardon, then start it again", lockedPlace(cfg))
	}
	if err != nil {
		return err
	}
	defer st.Close()
	if err := replayForPardon(ctx, st, cfg, stderr); err != nil {
		return err
	}
	p, err := st.Pardon(ctx, key)
	if err != nil {
		return err
	}
	of := ""
	if key != "" {
		of = " of " + pasteableKey(key)
	}
	fmt.Fprintf(stdout, "pardoned %d message(s) in %d session(s)%s\n", p.Messages, p.Sessions, of)
	if p.Messages > 0 {
		fmt.Fprintln(stderr, "note: they run as any other at the next start; one that takes agentgate down again is quarantined after 3 more unclean stops")
		if key != "" {
			fmt.Fprintln(stderr, "note: if agentgate did not stop cleanly last time, its next start still counts that stop (sessions pardon --all forgets it)")
		}
	}
	return nil
}

// replayForPardon replays into st the writes waiting in the spool of cfg's data_dir, which the
// database does not have yet (the daemon acknowledged them while the database refused writes,
// and stopped, or was killed, before it could store them), and says so on stderr. The pardon
// comes after them, as it would come after the next start's replay: among them may be the
// quarantine of a message the pardon would clear (a session sets one aside at its 3rd strike as
// it loads, and tells its sender so), or its answer. Before, the pardon refused then, and said to
// start the daemon once to replay them: that start counted the last run's unclean stop, and
// could quarantine a message at its 3rd strike, the very thing the pardon was for.
//
// The replay is the daemon's own (persistence.ReplaySpool: the same transactions, batches set
// aside the same way, the same log lines), under the same locks: the store's, taken alone by
// the caller, and the data directory's (supervisor.LockDataDir), which a daemon takes before it
// opens the spool. It records no run: the next start counts the last run's unclean stop as it
// would have, and finds the spool empty. All of the spool is replayed, not only the writes of
// KEY's session: they name sessions by id, and the key's route may be among them. A spool it
// cannot read, or a database that refuses the writes, refuses the pardon; the batches not
// replayed wait in the spool for the next start. A cluster keeps no spool.
func replayForPardon(ctx context.Context, st persistence.Store, cfg *config.Config, stderr io.Writer) error {
	if cfg.Cluster.Enabled {
		return nil
	}
	dir := filepath.Join(cfg.DataDir, "spool")
	n, err := spool.Waiting(dir)
	switch {
	case err != nil:
		return fmt.Errorf("sessions pardon: cannot tell whether writes wait in the spool: %w (nothing was changed)", err)
	case n == 0:
		return nil
	}
	lock, err := supervisor.LockDataDir(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("sessions pardon: %s holds %d batch(es) of writes the database does not have yet, which the pardon replays first, "+
			"but cannot take the data directory's lock: %w (nothing was changed)", dir, n, err)
	}
	defer lock.Close()
	sp, err := spool.Open(dir)
	if err != nil {
		return fmt.Errorf("sessions pardon: %w (nothing was changed)", err)
	}
	log := logging.New(stderr, slog.LevelWarn, cfg.Log.Format).With(logging.KeyComponent, "persistence")
	r, err := persistence.ReplaySpool(ctx, st, persistence.ActorOptions{MaxBatch: cfg.Persist.MaxBatch, Log: log, Spool: sp})
	setAside := ""
	if r.SetAside > 0 {
		setAside = fmt.Sprintf(", %d set aside in %s (the lines above say why)", r.SetAside, filepath.Join(dir, "failed"))
	}
	if err != nil {
		return fmt.Errorf("sessions pardon: replayed %d of the %d batch(es) of writes waiting in %s into the database%s, then: %w; "+
			"the %d left wait there for the next start, or the next pardon (nothing was pardoned)", r.Batches, r.Batches+r.SetAside+r.Left, dir, setAside, err, r.Left)
	}
	fmt.Fprintf(stderr, "note: replayed %d batch(es) of writes waiting in %s into the database first, as the next start would have%s\n",
		r.Batches, dir, setAside)
	return nil
}
