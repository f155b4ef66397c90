package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/sqlite"
)

const backupUsage = `usage: agentgate backup [--config FILE] [--data-dir DIR] FILE

Writes a consistent copy of the SQLite database to FILE, which must not exist, also while the
daemon runs (copying agentgate.db by hand is not a backup: recent writes live in its -wal
file). The copy is checked before it takes its name. To restore it, stop the daemon, move
agentgate.db, its -wal and -shm files and the spool directory aside, copy FILE to
agentgate.db as the daemon's user (or chown it to that user) and start it.

A PostgreSQL store is backed up with pg_dump.
`

// backup runs `agentgate backup FILE`.
func backup(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fset := flag.NewFlagSet("backup", flag.ContinueOnError)
	var cf configFlags
	cf.registerAdmin(fset, false)
	fset.Usage = func() {
		fmt.Fprint(fset.Output(), backupUsage, "\nflags:\n")
		cf.printDefaults()
	}
	out, err := parseArgs(fset, args, "FILE", stdout, stderr)
	if err != nil {
		return helpIsDone(err)
	}
	if out == "" {
		// backup "$FILE" with FILE unset: before, "to :  is a directory".
		return usagef("backup: FILE is empty: name the file to write, such as backups/agentgate.db")
	}
	cfg, err := cf.load()
	if err != nil {
		return err
	}
	if cfg.Store.Driver == "postgres" {
		return errors.New("backup: the store is PostgreSQL: back it up with pg_dump " +
			"(pg_dump --format=custom --schema=SCHEMA --file=agentgate.dump \"$DSN\"; restore with pg_restore); " +
			"pg_dump refuses a DSN URL with search_path=: write it as options=-csearch_path%3DSCHEMA, which agentgate takes too")
	}
	if _, err := os.Stat(cfg.DSN()); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("backup: no database at %s (%s)", cfg.DSN(), noDatabaseHint)
	} else if d := denied("backup", databasePlace(cfg), cfg.DataDir, err, false); d != nil {
		return d
	}
	if err := mayOpen("backup", cfg, cfg.DSN(), false); err != nil {
		return err
	}
	size, err := sqlite.Backup(ctx, cfg.DSN(), out)
	if d := backupDenied(out, err); d != nil {
		return fmt.Errorf("back up %s to %s: %w", cfg.DSN(), out, d)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "backed up %s to %s (%d bytes)\n", cfg.DSN(), out, size)
	dir := filepath.Join(cfg.DataDir, "spool")
	if n, err := spool.Waiting(dir); err != nil {
		fmt.Fprintf(stderr, "warning: %s\n", spoolUnread("backup", cfg, err, "the backup"))
	} else if n > 0 {
		fmt.Fprintf(stderr, "warning: %s holds %d batch(es) of writes the database does not have yet, so the backup "+
			"lacks them too; the daemon writes them once the database takes writes again: back up again after that\n", dir, n)
	}
	return nil
}

// backupDenied is the error of a backup to out when err says this user may not write out's
// directory (or enter a directory on the way to it); nil for any other err. It says which path
// stops this user, whose it is, and what to do, as denied says of a data directory. Before, the
// backup printed the raw error of the temporary file it could not make, "open
// DIR/.FILE.NNN.partial: permission denied", which named neither (a CLI review).
func backupDenied(out string, err error) error {
	var pe *fs.PathError
	if !errors.Is(err, fs.ErrPermission) || !errors.As(err, &pe) {
		return nil
	}
	abs, aerr := filepath.Abs(out)
	at, perr := filepath.Abs(pe.Path)
	if aerr != nil || perr != nil || filepath.Dir(at) != filepath.Dir(abs) {
		return nil // not the backup's file (the database's: mayOpen said so before)
	}
	dir := filepath.Dir(abs)
	return deniedWith("the backup's directory "+dir, dir, pe, true, func(string) string {
		return "back up into a directory this user may write (one of its own), or give this user access"
	})
}
