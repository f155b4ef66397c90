package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
)

// offlineAct names, in its command's words, what an admin command does to the store with the
// daemon stopped, once it has replayed the spool first (replaySpoolFirst).
type offlineAct struct {
	prefix string // what its errors begin with: "sessions pardon", "reset KEY"
	name   string // the act: "pardon", "reset"
	done   string // the act done, for "nothing was …": "pardoned", "reset"
}

// replaySpoolFirst replays into st the writes waiting in the spool of cfg's data_dir, which the
// database does not have yet (the daemon acknowledged them while the database refused writes,
// and stopped, or was killed, before it could store them), and says so on stderr. An admin
// command that writes the store with the daemon stopped (sessions pardon, sessions reset) calls
// it after it opened the store alone and before it reads what it changes: its act comes after
// them, as it would come after the next start's replay. Among them may be the quarantine of a
// message a pardon would clear, or the answer to it; a message a reset would leave unsettled
// in the session it ends, or the outbox entry whose seq its notice would take. Before, these
// commands refused then, and said to start the daemon to replay them: a start that counts the
// last run's unclean stop, and can quarantine a message at its 3rd strike.
//
// The replay is the daemon's own (persistence.ReplaySpool: the same transactions, batches set
// aside the same way, the same log lines), under the same locks, which the caller holds: the
// data directory's (supervisor.LockDataDir), which a daemon takes before it opens the spool,
// and the store's, taken alone; openStoreWith takes both, in that order, for a writing command
// on a single daemon's configuration. It does not take the data directory's lock again: flock
// is per open file, and a second one of this process would find it held. It records no run:
// the next start counts the last run's unclean stop as it would have, and finds the spool
// empty. All of the spool is replayed, not only the writes of the command's session: they name
// sessions by id, and the key's route may be among them. A spool it cannot read, or a database
// that refuses the writes, refuses the act; the batches not replayed wait in the spool for the
// next start. A cluster keeps no spool.
func replaySpoolFirst(ctx context.Context, st persistence.Store, cfg *config.Config, act offlineAct, stderr io.Writer) error {
	if cfg.Cluster.Enabled {
		return nil
	}
	dir := filepath.Join(cfg.DataDir, "spool")
	n, err := spool.Waiting(dir)
	switch {
	case err != nil:
		return fmt.Errorf("%s: cannot tell whether writes wait in the spool: %w (nothing was changed)", act.prefix, err)
	case n == 0:
		return nil
	}
	sp, err := spool.Open(dir)
	if err != nil {
		return fmt.Errorf("%s: %w (nothing was changed)", act.prefix, err)
	}
	log := logging.New(stderr, slog.LevelWarn, cfg.Log.Format).With(logging.KeyComponent, "persistence")
	r, err := persistence.ReplaySpool(ctx, st, persistence.ActorOptions{MaxBatch: cfg.Persist.MaxBatch, Log: log, Spool: sp})
	setAside := ""
	if r.SetAside > 0 {
		setAside = fmt.Sprintf(", %d set aside in %s (the lines above say why)", r.SetAside, filepath.Join(dir, "failed"))
	}
	if r.Gone > 0 {
		// Deleted by hand while the replay ran: not replayed, and not in failed/ either.
		setAside += fmt.Sprintf(", %d gone from it before the replay could read or set it aside (removed by hand: nothing to replay)", r.Gone)
	}
	if err != nil {
		return fmt.Errorf("%s: replayed %d of the %d batch(es) of writes waiting in %s into the database%s, then: %w; "+
			"the %d left wait there for the next start, or the next %s (nothing was %s)",
			act.prefix, r.Batches, r.Batches+r.SetAside+r.Gone+r.Left, dir, setAside, err, r.Left, act.name, act.done)
	}
	fmt.Fprintf(stderr, "note: replayed %d batch(es) of writes waiting in %s into the database first, as the next start would have%s\n",
		r.Batches, dir, setAside)
	return nil
}
