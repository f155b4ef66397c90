package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/agentgate/agentgate/persistence"
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
		fmt.Fprintf(stderr, "agentgate sessions pardon: give --all or a KEY, not both (agentgate sessions pardon -h says what they are)\n")
		return errUsage
	case !*all && arg == "":
		fmt.Fprintf(stderr, "agentgate sessions pardon: missing --all or KEY (agentgate sessions pardon -h says what they are)\n")
		return errUsage
	case arg != "":
		if key, err = parseKey(fset.Name(), arg); err != nil {
			return err
		}
	}
	// The data directory's lock too, first, as a daemon takes it (openStoreWith): a daemon that
	// is starting holds it before it opens the store, and before, a pardon with an empty spool
	// took only the store's lock, pardoned under the starting daemon, and could fail its start.
	st, cfg, dirLock, err := openStoreWith(ctx, &cf, storeAlone, 0)
	if errors.Is(err, persistence.ErrLocked) {
		return fmt.Errorf("sessions pardon: agentgate is running on this %s: stop the daemon first (its sessions keep the counts they loaded; "+
			"in a cluster, stop every member), then pardon, then start it again", lockedPlace(cfg, err))
	}
	if err != nil {
		return err
	}
	if dirLock != nil {
		defer dirLock.Close() // (after the store's: deferred calls run last in, first out)
	}
	defer st.Close()
	act := offlineAct{prefix: "sessions pardon", name: "pardon", done: "pardoned"}
	if err := replaySpoolFirst(ctx, st, cfg, act, stderr); err != nil {
		return err
	}
	if key != "" {
		// (After the replay: a session the spool holds is one.) A key no session has is a
		// typo, not a session with nothing to pardon, as show and reset say.
		if _, err := st.Route(ctx, key); errors.Is(err, persistence.ErrNotFound) {
			return noSession("sessions pardon", key, "pardoned")
		} else if err != nil {
			return err
		}
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
