package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
)

// Keys whose characters do not display: a zero-width space, and a C1 control (NEL), which
// list's text output could only show as U+FFFD.
const (
	keyZWSP = "agent:main:http:dm:a\u200bb"
	keyC1   = "agent:main:http:dm:c\u0085d"
)

// MustSeedHiddenKeys creates a data directory holding a session of keyZWSP and of keyC1, each
// with a pending message and a quarantined one (q1), and returns it.
func MustSeedHiddenKeys(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	defer st.Close()
	for i, key := range []string{keyZWSP, keyC1} {
		id, chat := fmt.Sprintf("s%d", i), fmt.Sprintf("c%d", i)
		msg := func(seq int64, msgID, status string) *persistence.AppendMessage {
			return &persistence.AppendMessage{Message: persistence.Message{SessionID: id, Seq: seq, Role: persistence.RoleUser,
				Content: "hello", Platform: "http", ChatID: chat, MessageID: msgID, UserID: "u", Status: status, Active: true,
				CreatedAt: sessAt(int(seq))}}
		}
		storetest.MustCommit(t, st,
			&persistence.CreateSession{Session: persistence.Session{ID: id, Key: key, Platform: "http", ChatType: "dm",
				ChatID: chat, UserID: "u", StartedAt: sessAt(i), LastActivityAt: sessAt(i), Epoch: 1}},
			msg(1, "q1", persistence.StatusQuarantined),
			msg(2, "m2", persistence.StatusPending),
			&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: id, Generation: 1, UpdatedAt: sessAt(i)}},
		)
	}
	return dir
}

// shellWord is the argument a shell hands on for word pasted on its command line.
func shellWord(t *testing.T, word string) string {
	t.Helper()
	out, err := exec.Command("sh", "-c", "printf %s "+word).Output()
	if err != nil {
		t.Fatalf("sh: printf %%s %s: %v", word, err)
	}
	return string(out)
}

// listedKeys returns the KEY column of list's text output, as printed.
func listedKeys(t *testing.T, dir string) []string {
	t.Helper()
	out, _ := MustRunSessions(t, "list", "--data-dir", dir)
	var keys []string
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n")[1:] {
		keys = append(keys, strings.Fields(l)[0])
	}
	return keys
}

// TestSessionsKeyPastedAsListed: a key holding a character that does not display (a zero-width
// space, a C1 control) is printed by list, show, search and quarantined in the form the paging
// hint gives it, Go-quoted inside single quotes, and that form pasted on a shell's command line
// names the key to show, export, reset and requeue. Before, the tables showed U+FFFD, which
// names no key, and those commands took the key raw only.
func TestSessionsKeyPastedAsListed(t *testing.T) {
	dir := MustSeedHiddenKeys(t)
	printed := map[string]string{ // raw key -> as printed
		keyZWSP: `'"agent:main:http:dm:a\u200bb"'`,
		keyC1:   `'"agent:main:http:dm:c\u0085d"'`,
	}
	if got, want := listedKeys(t, dir), []string{printed[keyZWSP], printed[keyC1]}; !slices.Equal(got, want) {
		t.Fatalf("list KEY column = %q, want %q", got, want)
	}
	for _, args := range [][]string{{"search", "hello"}, {"quarantined"}} {
		out, _ := MustRunSessions(t, append(args, "--data-dir", dir)...)
		for key, p := range printed {
			if !strings.Contains(out, p) {
				t.Errorf("sessions %s = %q, want the key %q printed %s", args[0], out, key, p)
			}
		}
	}

	for i, key := range []string{keyZWSP, keyC1} {
		id := fmt.Sprintf("s%d", i)
		arg := shellWord(t, printed[key])
		t.Run(fmt.Sprintf("%+q", key), func(t *testing.T) {
			out, _ := MustRunSessions(t, "show", "--data-dir", dir, arg)
			if got := fieldOf(out, "key"); got != printed[key] {
				t.Errorf("show %s: key line %q, want %q", arg, got, printed[key])
			}
			if got := fieldOf(out, "current session"); got != id {
				t.Errorf("show %s: session %q, want %q", arg, got, id)
			}

			out, _ = MustRunSessions(t, "export", "--data-dir", dir, arg)
			var exp struct {
				SessionKey string `json:"session_key"`
				Sessions   []struct {
					Session struct {
						ID string `json:"id"`
					} `json:"session"`
				} `json:"sessions"`
			}
			if err := json.Unmarshal([]byte(out), &exp); err != nil {
				t.Fatalf("export %s: %v\n%s", arg, err, out)
			}
			if exp.SessionKey != key || len(exp.Sessions) != 1 || exp.Sessions[0].Session.ID != id {
				t.Errorf("export %s = key %q, %d session(s), want %q and session %s", arg, exp.SessionKey, len(exp.Sessions), key, id)
			}

			out, _ = MustRunSessions(t, "reset", "--data-dir", dir, arg)
			if want := "ended session " + id + " of " + printed[key] + " (reset_command)\n"; out != want {
				t.Errorf("reset %s printed %q, want %q", arg, out, want)
			}
			out, _ = MustRunSessions(t, "show", "--data-dir", dir, arg)
			if got := fieldOf(out, "ended"); !strings.Contains(got, " (reset_command)") {
				t.Errorf("show %s after its reset: ended %q, want the reset's", arg, got)
			}
		})
	}
}

// TestSessionsRequeueKeyPastedAsListed: sessions requeue takes the key as quarantined prints
// it, and asks the daemon to requeue the message of the key itself.
func TestSessionsRequeueKeyPastedAsListed(t *testing.T) {
	dir := MustSeedHiddenKeys(t)
	daemon, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil { // (the daemon holds the database)
		t.Fatalf("sqlite.Open: %v", err)
	}
	defer daemon.Close()
	asked := make(chan string, 1)
	s := daemonServer(t, testRun, func(w http.ResponseWriter, r *http.Request) {
		mux := http.NewServeMux()
		mux.HandleFunc("POST /v1/sessions/{key}/messages/{id}/requeue", func(w http.ResponseWriter, r *http.Request) {
			asked <- r.PathValue("key")
			json.NewEncoder(w).Encode(httpplatform.MessageResponse{MessageID: r.PathValue("id"), SessionKey: r.PathValue("key"),
				SessionID: "s0", Disposition: "queued", QueueDepth: 1})
		})
		mux.ServeHTTP(w, r)
	})
	MustRecordDaemon(t, dir, s, testRun)

	const printed = `'"agent:main:http:dm:a\u200bb"'`
	out, _ := MustRunSessions(t, "requeue", "--data-dir", dir, shellWord(t, printed), "q1")
	if got := <-asked; got != keyZWSP {
		t.Errorf("requeue asked the daemon for key %+q, want %+q", got, keyZWSP)
	}
	if want := "requeued message q1 of " + printed + " through the daemon"; !strings.HasPrefix(out, want) {
		t.Errorf("requeue printed %q, want it to begin %q", out, want)
	}
}

// TestSessionsKeyArgument: how a KEY argument is read. One that begins with a quote and is one
// whole Go-quoted string is the key it quotes; any other is the key as it is, which must be
// one: a broken quoted form is refused with why, not taken for another key.
func TestSessionsKeyArgument(t *testing.T) {
	dir := MustSeedSessions(t)
	tests := []struct {
		name    string
		arg     string
		wantErr string // "" for show to find keyA's session
	}{
		{"raw", keyA, ""},
		{"quoted", `"` + keyA + `"`, ""},
		{"quoted with escapes", `"agent:main:http:dm:\x61lice"`, ""},
		{"raw with a quote inside", `agent:main:http:dm:o"x`, `sessions show: the key '"agent:main:http:dm:o\"x"' has no session; `},
		{"bad escape", `"agent:main:http:dm:\q"`, `sessions show: "\"agent:main:http:dm:\\q\"" begins with a quote but is not Go-quoted as sessions list prints a key (invalid syntax)`},
		{"unterminated", `"` + keyA, "begins with a quote but is not Go-quoted"},
		{"quoted, but no key", `"agent:main"`, `sessions show: identity: not a session key: "agent:main" (want agent:`},
		{"backquoted", "`" + keyA + "`", "not a session key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := runSessions(t, "show", "--data-dir", dir, tc.arg)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("show %s: %v, want keyA's session", tc.arg, err)
			case tc.wantErr == "" && fieldOf(out, "current session") != "sa2":
				t.Errorf("show %s printed %q, want keyA's session sa2", tc.arg, out)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("show %s: error %v, want one with %q", tc.arg, err, tc.wantErr)
			}
		})
	}
	if _, _, err := runSessions(t, "requeue", "--data-dir", dir, `"agent:main:http:dm:\q"`, "q1"); err == nil ||
		!strings.Contains(err.Error(), "sessions requeue: ") || !strings.Contains(err.Error(), "begins with a quote") {
		t.Errorf("requeue of a broken quoted key: error %v, want why it names no key", err)
	}
}

// TestErrorsCutALongArgument: an error that refuses a KEY no session has, one that is no key,
// or another argument of any length repeats its first 200 bytes and says how long it is: before,
// "session … not found" (now "the key … has no session") echoed a 100 KB KEY (pasted with a log line) whole. A key a session has
// is named whole (sessions reset's line of what it ended).
func TestErrorsCutALongArgument(t *testing.T) {
	dir := MustSeedSessions(t)
	tail := strings.Repeat("x", 100_000)
	long := "agent:main:http:dm:" + tail
	cut := func(s string) string { return s[:200] + fmt.Sprintf("… (%d bytes)", len(s)) }
	quoted := func(s string) string { return strconv.Quote(s[:200]) + fmt.Sprintf("… (%d bytes)", len(s)) }
	for _, tc := range []struct {
		args []string
		want string // the whole error, or stderr when the error is errUsage alone
	}{
		{[]string{"show", long}, "sessions show: the key " + cut(long) + " has no session; agentgate sessions list prints the keys that have one"},
		{[]string{"export", long}, "sessions export: the key " + cut(long) + " has no session; agentgate sessions list prints the keys that have one"},
		{[]string{"reset", long}, "sessions reset: the key " + cut(long) + " has no session, so nothing was reset; agentgate sessions list prints the keys that have one"},
		{[]string{"pardon", long}, "sessions pardon: the key " + cut(long) + " has no session, so nothing was pardoned; agentgate sessions list prints the keys that have one"},
		{[]string{"requeue", long, "m1"}, "requeue m1 of " + cut(long) + ": no daemon runs on " + dir +
			"; a requeue runs the message, which only the daemon does: start it (agentgate serve) and try again (nothing was changed)"},
		{[]string{"requeue", keyA, tail}, "requeue " + cut(tail) + " of " + keyA + ": no daemon runs on " + dir +
			"; a requeue runs the message, which only the daemon does: start it (agentgate serve) and try again (nothing was changed)"},
		{[]string{"show", "x" + long}, "sessions show: identity: not a session key: " + quoted("x"+long) + " (want agent:<profile>:<platform>:<chat type>:<chat id>[:...], as printed by sessions list)"},
		{[]string{"show", `"` + long}, "sessions show: " + quoted(`"`+long) + " begins with a quote but is not Go-quoted as sessions list prints a key (invalid syntax), and no key begins with one"},
		{[]string{"list", "--after", `"` + long}, "sessions list: --after " + quoted(`"`+long) + ": begins with a quote but is not Go-quoted as the more: hint prints a key (invalid syntax)"},
		{[]string{"list", long}, "agentgate sessions list: unexpected argument " + quoted(long) + " (agentgate sessions list -h says what it takes)\n"},
	} {
		t.Run(strings.Join(tc.args, " ")[:min(40, len(strings.Join(tc.args, " ")))], func(t *testing.T) {
			_, stderr, err := runSessions(t, append(tc.args, "--data-dir", dir)...)
			got := stderr
			if err != nil && err != errUsage {
				got = err.Error()
			}
			if got != tc.want {
				t.Errorf("sessions %.60q = %v, stderr %.300q; want %.300q", tc.args, err, stderr, tc.want)
			}
		})
	}
	// A key a session has is named whole.
	out, _ := MustRunSessions(t, "reset", "--data-dir", dir, keyA)
	if !strings.Contains(out, " of "+keyA+" ") {
		t.Errorf("reset %s printed %q, want the key whole", keyA, out)
	}
}
