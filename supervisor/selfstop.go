package supervisor

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// selfStopDir is the folder of the data directory where a cluster member that stops itself
// leaves a note of its stop: one file per member, named after its node (Deps.Node) and holding
// it. A member stops itself when its membership is lost (its renewals failed for member_ttl:
// the database unreachable, failing over or too slow; a stall; a split), never because of a
// message it ran, but the others, finding it gone, would count its death against the message
// each of its keys was running (a claim in postgres.Store), and three outages of the
// database while a message was pending quarantined it. It cannot tell the database so as it
// stops: the database is what it lost. The next member started on the data directory (its
// process supervisor restarts it) records the notes there (postgres.Store.RecordSelfStops)
// before it registers, and so before it claims any key; a claim counts no death of those
// members, nor of any member whose last renewal was within member_ttl of theirs.
const selfStopDir = "stopped-members"

// noteSelfStop leaves the note of node's stop in dataDir.
func noteSelfStop(dataDir, node string) error {
	dir := filepath.Join(dataDir, selfStopDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("note the stop of %s: %w", node, err)
	}
	// Written whole or not at all: cluster mode takes no lock of the data directory, and a
	// member started on it meanwhile would read, and remove, a note cut short.
	f, err := os.CreateTemp(dir, ".note-*")
	if err != nil {
		return fmt.Errorf("note the stop of %s: %w", node, err)
	}
	_, werr := f.WriteString(node)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(f.Name(), filepath.Join(dir, url.PathEscape(node)))
	}
	if werr != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("note the stop of %s: %w", node, werr)
	}
	return nil
}

// selfStops returns the nodes whose notes are in dataDir, and the files that hold them.
func selfStops(dataDir string) (nodes, files []string, err error) {
	dir := filepath.Join(dataDir, selfStopDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read the notes of stopped members: %w", err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") {
			continue // a note being written
		}
		f := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, fmt.Errorf("read the notes of stopped members: %w", err)
		}
		if len(b) > 0 {
			nodes = append(nodes, string(b))
		}
		files = append(files, f)
	}
	return nodes, files, nil
}
