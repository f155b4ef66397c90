package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/persistence/sqlite"
)

// TestSearchSaysHowFarTheIndexIsBehind: `agentgate sessions search` on a data directory whose
// search index is behind its messages (rows above the index's watermark, as a crash or a stop
// that cut the start's catch-up leaves them; here written by hand, as no store indexes them)
// finds none of them, as it opens the database read-only and indexes nothing, and says on
// stderr how many it did not look at and when they are indexed, with --json too. Once a store
// has opened the file for writing (a daemon's start), it finds them and says nothing more.
// Before, it missed them without a word, "no message matches" saying only that messages of
// the last second may not be indexed yet.
func TestSearchSaysHowFarTheIndexIsBehind(t *testing.T) {
	dir := MustSeedSessions(t)
	path := filepath.Join(dir, "agentgate.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	res, err := db.Exec(`INSERT INTO messages (session_id, seq, role, content, platform, chat_id, message_id, turn_id,
			status, active, archived, attempts, created_at, user_id, user_name)
		SELECT session_id, seq + 100, role, 'unicorn ' || seq, platform, chat_id, '', turn_id,
			status, active, archived, attempts, created_at, user_id, user_name FROM messages WHERE session_id = 'sa1'`)
	if err != nil {
		t.Fatal(err)
	}
	backlog, err := res.RowsAffected()
	if err != nil || backlog == 0 {
		t.Fatalf("the backlog's rows = %d, %v; want some", backlog, err)
	}
	db.Close()

	wantNote := "note: the search index is " + strconv.FormatInt(backlog, 10) + " message(s) behind, which this search did not look at: " +
		"a running daemon indexes them within a second, a stopped one when it starts (agentgate serve)\n"
	for _, asJSON := range []bool{false, true} {
		args := []string{"search", "--data-dir", dir, "unicorn"}
		if asJSON {
			args = append(args, "--json")
		}
		out, errOut := MustRunSessions(t, args...)
		if want := wantNote + "no message matches\n"; errOut != want {
			t.Errorf("sessions %s on an index behind by %d: stderr %q, want %q", strings.Join(args, " "), backlog, errOut, want)
		}
		if want := map[bool]string{false: "", true: "[]\n"}[asJSON]; out != want {
			t.Errorf("sessions %s on an index behind: stdout %q, want %q", strings.Join(args, " "), out, want)
		}
	}

	st, err := sqlite.Open(context.Background(), path, sqlite.Options{}) // a daemon's start: its catch-up
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	out, errOut := MustRunSessions(t, "search", "--data-dir", dir, "--json", "unicorn")
	var hits []searchJSON
	if err := json.Unmarshal([]byte(out), &hits); err != nil || int64(len(hits)) != backlog || errOut != "" {
		t.Errorf("sessions search once a store caught the index up: %d hits (%v), stderr %q; want %d, and nothing on stderr",
			len(hits), err, errOut, backlog)
	}
}
