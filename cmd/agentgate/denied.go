package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// denied is the error of the admin command cmd ("sessions list") for err, a failure in place
// ("the data directory DIR", or "the database FILE" elsewhere) that is permission denied (nil
// for any other): this user may not read it, or, to write (a reset, a pardon), write it. It
// says which path stops this user, whose that path is and its mode, and what to do: run the
// command as the daemon's user, or, for a file in the data directory that is not the
// directory's owner's (a database a restore as root left root's), give it to that user, or,
// for a path that is this user's own (a directory of mode 000), chmod it.
// Before, the command printed the raw error of what failed first, "open …/agentgate.db: stat
// …/agentgate.db: permission denied" or "data directory …: lock: open
// …/agentgate-dir.flock: permission denied", which named neither (a CLI review).
func denied(cmd, place, dir string, err error, write bool) error {
	return deniedWith(place, dir, err, write, func(owner string) string {
		if owner == "" {
			return "run the command as the daemon's user, or give this user access"
		}
		return fmt.Sprintf("run the command as the daemon's user (sudo -u %s agentgate %s …), or give this user access", owner, cmd)
	})
}

// deniedWith is denied with what to do said by todo, given the owner of the path that stops
// this user as sudo -u takes it ("" when it is not known).
func deniedWith(place, dir string, err error, write bool, todo func(owner string) string) error {
	if !errors.Is(err, fs.ErrPermission) {
		return nil
	}
	verb := "readable"
	if write {
		verb = "writable"
	}
	var at string
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		at = pe.Path
	}
	if abs, aerr := filepath.Abs(dir); aerr == nil {
		// In full, as deniedAt names the blocker: a file in a data directory named relative to
		// the working directory (the default ./data) is then known to be in it (filepath.Rel
		// of an absolute path to a relative directory fails).
		dir = abs
	}
	blocker := deniedAt(at, write)
	if blocker == "" {
		blocker = deniedAt(dir, write)
	}
	head := fmt.Sprintf("%s is not %s by this user, %s", place, verb, whoAmI())
	if blocker == "" {
		return fmt.Errorf("%s (%v); %s", head, err, todo(""))
	}
	fi, serr := os.Stat(blocker)
	if serr != nil {
		return fmt.Errorf("%s: %s cannot be looked at (%v); %s", head, blocker, err, todo(""))
	}
	name := blocker
	if abs, aerr := filepath.Abs(dir); aerr == nil {
		dir = abs // (blocker is absolute: Rel of a relative --data-dir fails)
	}
	if rel, rerr := filepath.Rel(dir, blocker); rerr == nil && !strings.HasPrefix(rel, "..") && rel != "." {
		name = rel // a file in the data directory, named as SQLite's errors name them
	}
	uid, known := fileOwner(fi)
	if !known {
		return fmt.Errorf("%s: %s is of mode %s (%v); %s", head, name, fi.Mode(), err, todo(""))
	}
	what := fmt.Sprintf("%s: %s is %s, mode %s (%v)", head, name, ownerOf(uid), fi.Mode(), err)
	if uid == os.Getuid() {
		// This user's own, shut by its mode: running the command as its owner (sudo -u this
		// user) changes nothing (before, it said so to nobody of nobody's directory).
		return fmt.Errorf("%s; give this user access to it: chmod %s %s", what, ownerMode(fi.IsDir(), write), blocker)
	}
	if name != blocker {
		// A file in a directory this user may use: a restore as root leaves the database
		// root's in the daemon's directory, where the daemon cannot use it either.
		if di, derr := os.Stat(dir); derr == nil {
			if duid, ok := fileOwner(di); ok && duid != uid {
				if fi.IsDir() { // the spool, a run as root left root's
					return fmt.Errorf("%s; the data directory is %s: give the directory to the daemon's user (chown -R %s %s)",
						what, ownerOf(duid), chownUser(duid), blocker)
				}
				return fmt.Errorf("%s; the data directory is %s: give the file to the daemon's user (chown %s %s)",
					what, ownerOf(duid), chownUser(duid), blocker)
			}
		}
	}
	return fmt.Errorf("%s; %s", what, todo(sudoUser(uid)))
}

// deniedAt returns the path that keeps this user from path: the first directory on the way
// this user may not enter, else path itself when this user may not read it (or, write, write
// it); "" when it finds none.
func deniedAt(path string, write bool) string {
	if path == "" {
		return ""
	}
	path, err := filepath.Abs(path)
	if err != nil {
		return ""
	}
	var dirs []string
	for d := filepath.Dir(path); ; d = filepath.Dir(d) {
		dirs = append([]string{d}, dirs...)
		if d == filepath.Dir(d) {
			break
		}
	}
	const xOK, rOK, wOK = 0x1, 0x4, 0x2
	for _, d := range dirs {
		if syscall.Access(d, xOK) == syscall.EACCES {
			return d
		}
	}
	mode := uint32(rOK)
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		mode |= xOK
	}
	if write {
		mode |= wOK
	}
	if syscall.Access(path, mode) == syscall.EACCES {
		return path
	}
	return ""
}

// ownerMode is the chmod mode that gives a file's owner what a command needs of it: to read it
// (a directory: to list and enter it), and, write, to write it.
func ownerMode(dir, write bool) string {
	mode := "u+r"
	if write {
		mode += "w"
	}
	if dir {
		mode += "x"
	}
	return mode
}

// ownerOf names the owner of a file: "this user's", "root's (uid 0)", "uid 1001's".
func ownerOf(uid int) string {
	switch name := userName(uid); {
	case uid == os.Getuid():
		return "this user's"
	case name != "":
		return fmt.Sprintf("%s's (uid %d)", name, uid)
	}
	return fmt.Sprintf("uid %d's", uid)
}

// sudoUser is the user uid as sudo -u and chown take it: its name, or '#UID' (sudo) when it has
// none this host knows.
func sudoUser(uid int) string {
	if name := userName(uid); name != "" {
		return name
	}
	return "'#" + strconv.Itoa(uid) + "'"
}

// chownUser is the user uid as chown takes it: its name, or its number.
func chownUser(uid int) string {
	if name := userName(uid); name != "" {
		return name
	}
	return strconv.Itoa(uid)
}

// whoAmI names this process's user as the errors that it may not use a file do: "uid 1000
// (alice)".
func whoAmI() string {
	uid := os.Getuid()
	if name := userName(uid); name != "" {
		return fmt.Sprintf("uid %d (%s)", uid, name)
	}
	return fmt.Sprintf("uid %d", uid)
}

// userName is the name of the user uid, or "" when it has none this host knows.
func userName(uid int) string {
	u, err := user.LookupId(strconv.Itoa(uid))
	if err != nil {
		return ""
	}
	return u.Username
}
