package sqlite

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/internal/flock"
	"github.com/agentgate/agentgate/persistence"
)

// ProductionDataDirEnv names an environment variable holding a directory that code under go test
// must never open, in addition to the default data directory (<cwd>/data).
const ProductionDataDirEnv = "AGENTGATE_PRODUCTION_DATA_DIR"

// checkTestGuard refuses, under go test, a database inside the default data directory of the
// working directory or inside $AGENTGATE_PRODUCTION_DATA_DIR. It creates nothing.
func checkTestGuard(abs string) error {
	if !testing.Testing() {
		return nil
	}
	return guardPath(abs)
}

// CheckTestGuard is Open's refusal, under go test, of a path inside the default data directory
// or $AGENTGATE_PRODUCTION_DATA_DIR (persistence.ErrDefaultDataDir), for a caller that makes
// files there before it opens the database (the daemon takes its data directory's lock first).
func CheckTestGuard(path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	return checkTestGuard(abs)
}

// guardPath is checkTestGuard without the testing.Testing condition.
func guardPath(abs string) error {
	db := resolvePath(abs, 0)
	var forbidden []string
	if cwd, err := os.Getwd(); err == nil {
		forbidden = append(forbidden, filepath.Join(cwd, "data"))
	}
	if dir := os.Getenv(ProductionDataDirEnv); dir != "" {
		if d, err := filepath.Abs(dir); err == nil {
			forbidden = append(forbidden, d)
		}
	}
	for _, dir := range forbidden {
		if within(resolvePath(dir, 0), db) {
			return fmt.Errorf("open %s: %w", abs, persistence.ErrDefaultDataDir)
		}
	}
	return nil
}

// resolvePath returns p with every symbolic link resolved, as far as p exists: the missing tail
// is joined unresolved, and a dangling link is followed to its target.
func resolvePath(p string, depth int) string {
	p = filepath.Clean(p)
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	const maxLinks = 40
	if depth > maxLinks {
		return p
	}
	if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if target, err := os.Readlink(p); err == nil {
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(p), target)
			}
			return resolvePath(target, depth+1)
		}
	}
	parent := filepath.Dir(p)
	if parent == p {
		return p
	}
	return filepath.Join(resolvePath(parent, depth+1), filepath.Base(p))
}

// within reports whether p is dir or lies below it.
func within(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	if err != nil {
		return false
	}
	return rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// lockFile takes an exclusive, non-blocking flock on path (created 0600 if missing). The lock
// lives as long as the returned file is open.
func lockFile(path, db string) (*os.File, error) {
	f, err := flock.Open(path)
	switch {
	case errors.Is(err, flock.ErrHeld):
		return nil, fmt.Errorf("open %s: data directory in use by another process (lock %s held): %w", db, path, persistence.ErrLocked)
	case err != nil:
		return nil, fmt.Errorf("open %s: lock: %w", db, err)
	}
	return f, nil
}
