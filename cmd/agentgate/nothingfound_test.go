package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// keyQuiet is a key whose only session holds no message, and keyGone one whose current
// session was pruned (MustSeedQuietKeys).
const (
	keyQuiet = "agent:main:http:dm:quiet"
	keyGone  = "agent:main:http:dm:gone"
)

// MustSeedQuietKeys adds keyQuiet and keyGone to the data directory dir: a session and its
// route, no message, as a reset with no message since leaves one; and a route alone, to a
// session pruning deleted.
func MustSeedQuietKeys(t *testing.T, dir string) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	defer st.Close()
	storetest.MustCommit(t, st,
		&persistence.CreateSession{Session: persistence.Session{
			ID: "sq1", Key: keyQuiet, Platform: "http", ChatType: "dm", ChatID: "quiet", UserID: "quiet",
			StartedAt: sessAt(40), LastActivityAt: sessAt(40),
		}},
		&persistence.PutRoute{Route: persistence.Route{Key: keyQuiet, SessionID: "sq1", Generation: 1, UpdatedAt: sessAt(40)}},
		&persistence.PutRoute{Route: persistence.Route{Key: keyGone, SessionID: "sg-gone", Generation: 2, UpdatedAt: sessAt(41)}},
	)
}

// TestNothingFoundIsSaidOnStderr: every reading command that finds nothing says so on stderr, in
// plain words and on one line, with --json as without it, and its stdout holds only what a
// script reads: nothing for a table, [] (or the export's object) for --json. Before, list and
// search said nothing with --json, where quarantined did, and an export of a key whose
// sessions hold no message printed its empty arrays without a word (a CLI review).
func TestNothingFoundIsSaidOnStderr(t *testing.T) {
	dir := MustSeedSessions(t)
	MustSeedQuietKeys(t, dir)
	empty := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(empty, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	st.Close()
	for _, tc := range []struct {
		name     string
		args     []string
		wantNote string // stderr, whole
		sessions int    // of an export: the sessions it holds
	}{
		{"list of an empty database", []string{"list", "--data-dir", empty}, "no session is stored yet\n", 0},
		{"list that matches no key", []string{"list", "--data-dir", dir, "--platform", "slack"}, "no session key matches\n", 0},
		{"search with no hit", []string{"search", "--data-dir", dir, "unicorn"},
			"no message matches (messages of the last second may not be indexed yet)\n", 0},
		{"quarantined of none", []string{"quarantined", "--data-dir", dir}, "no message is quarantined\n", 0},
		{"export of a key whose sessions hold no message", []string{"export", "--data-dir", dir, keyQuiet},
			"no message is stored in the 1 session of " + keyQuiet + ": the export holds its session and outbox only\n", 1},
		{"export of a key whose session was pruned", []string{"export", "--data-dir", dir, keyGone},
			"the current session sg-gone of " + keyGone + " was pruned after it ended: the export holds its outbox only\n", 0},
	} {
		for _, asJSON := range []bool{false, true} {
			args := tc.args
			name := tc.name
			if asJSON && args[0] != "export" { // (export prints JSON only)
				args = append(args[:len(args):len(args)], "--json")
				name += " --json"
			} else if asJSON {
				continue
			}
			t.Run(name, func(t *testing.T) {
				out, errOut := MustRunSessions(t, args...)
				if errOut != tc.wantNote {
					t.Errorf("sessions %s: stderr %q, want %q", strings.Join(args, " "), errOut, tc.wantNote)
				}
				switch {
				case args[0] == "export":
					var got exportJSON
					err := json.Unmarshal([]byte(out), &got)
					if err != nil || len(got.Sessions) != tc.sessions || tc.sessions > 0 && len(got.Sessions[0].Messages) != 0 {
						t.Errorf("sessions %s: stdout %q (%v), want the export of %d session(s) and no message", strings.Join(args, " "), out, err, tc.sessions)
					}
				case asJSON && out != "[]\n":
					t.Errorf("sessions %s: stdout %q, want []", strings.Join(args, " "), out)
				case !asJSON && out != "":
					t.Errorf("sessions %s: stdout %q, want nothing (no table header over no rows)", strings.Join(args, " "), out)
				}
			})
		}
	}

	// An export that holds messages says nothing: the current session of keyA holds four.
	if _, errOut := MustRunSessions(t, "export", "--data-dir", dir, keyA); errOut != "" {
		t.Errorf("sessions export %s: stderr %q, want nothing", keyA, errOut)
	}
}
