package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/supervisor"
	"github.com/google/go-cmp/cmp"
)

// The seeded data directory: keyA has an ended predecessor (sa1) and a current session (sa2);
// keyB (another platform) has one session. Keys sort keyB before keyA.
const (
	keyA = "agent:main:http:dm:alice"
	keyB = "agent:main:discord:group:g1:bob"
)

// Fixed times: the seeded rows never read the clock.
var sessT0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func sessAt(min int) time.Time { return sessT0.Add(time.Duration(min) * time.Minute) }

var longText = strings.Repeat("x", 200)

// MustSeedSessions creates a data directory holding both keys and returns it.
func MustSeedSessions(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	defer st.Close()

	sess := func(id, key, platform, chatType, chatID, user, prev string, start, last int) *persistence.CreateSession {
		return &persistence.CreateSession{Session: persistence.Session{
			ID: id, Key: key, Platform: platform, ChatType: chatType, ChatID: chatID, UserID: user,
			UserName: strings.ToUpper(user[:1]) + user[1:], ScopeID: "scope-" + chatID,
			StartedAt: sessAt(start), LastActivityAt: sessAt(last), PrevSessionID: prev, Epoch: 1,
		}}
	}
	msg := func(sid string, seq int64, role, msgID, text, status string) *persistence.AppendMessage {
		return &persistence.AppendMessage{Message: persistence.Message{
			SessionID: sid, Seq: seq, Role: role, Content: text, Platform: "http", ChatID: "alice",
			MessageID: msgID, UserID: "alice", Status: status, Active: true, CreatedAt: sessAt(int(seq)),
		}}
	}
	route := func(key, id string, gen int64, at int) *persistence.PutRoute {
		return &persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: id, Generation: gen, UpdatedAt: sessAt(at)}}
	}
	out := func(seq int64, sid, kind, text, state string, inReplyTo ...string) *persistence.AddOutbox {
		return &persistence.AddOutbox{Entry: persistence.OutboxEntry{
			SessionKey: keyA, Seq: seq, SessionID: sid, Kind: kind, Text: text, InReplyTo: inReplyTo,
			Platform: "http", ChatType: "dm", ChatID: "alice", UserID: "alice", State: state,
			CreatedAt: sessAt(int(seq)),
		}}
	}
	const user, asst, done, pending = persistence.RoleUser, persistence.RoleAssistant, persistence.StatusDone, persistence.StatusPending

	storetest.MustCommit(t, st,
		sess("sa1", keyA, "http", "dm", "alice", "alice", "", 0, 5),
		msg("sa1", 1, user, "m1", "hello", done),
		msg("sa1", 2, asst, "", "hi there", done),
		msg("sa1", 3, user, "m2", "scrap this", done),
		&persistence.ArchiveMessages{SessionID: "sa1", Seqs: []int64{3}},
		route(keyA, "sa1", 1, 0),
		out(1, "sa1", "reply", "hi there", persistence.DeliveryDelivered, "m1"),
		&persistence.EndSession{SessionID: "sa1", Reason: persistence.EndNewCommand, At: sessAt(6)},
	)
	storetest.MustCommit(t, st,
		sess("sa2", keyA, "http", "dm", "alice", "alice", "sa1", 10, 20),
		msg("sa2", 1, user, "m3", "line one\nline two", done),
		msg("sa2", 2, asst, "", longText, done),
		msg("sa2", 3, user, "m4", "still there?", pending),
		msg("sa2", 4, user, "m5", "never mind", done),
		&persistence.ArchiveMessages{SessionID: "sa2", Seqs: []int64{4}},
		&persistence.AddUsage{SessionID: "sa2", TurnID: "t-1", InputTokens: 1234, OutputTokens: 56},
		route(keyA, "sa2", 2, 10),
		out(2, "sa2", "notice", "new session started", persistence.DeliveryPending),
	)
	storetest.MustCommit(t, st,
		sess("sb1", keyB, "discord", "group", "g1", "bob", "", 30, 31),
		&persistence.AppendMessage{Message: persistence.Message{
			SessionID: "sb1", Seq: 1, Role: user, Content: "hey", Platform: "discord", ChatID: "g1",
			MessageID: "d1", UserID: "bob", Status: pending, Active: true, CreatedAt: sessAt(31),
		}},
		route(keyB, "sb1", 1, 30),
	)
	return dir
}

// MustSeedLockedSessions is MustSeedSessions whose database a daemon holds (its write lock, as a
// running daemon does) until the test ends: what the admin commands find while the daemon runs.
func MustSeedLockedSessions(t *testing.T) (dir string, daemon *sqlite.Store) {
	t.Helper()
	dir = MustSeedSessions(t)
	daemon, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	t.Cleanup(func() { daemon.Close() })
	return dir, daemon
}

// runSessions runs `agentgate sessions args...` and returns its stdout, stderr and error.
func runSessions(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	return runSessionsIn(context.Background(), args...)
}

// runSessionsIn is runSessions with the command's context ctx. A context that can end makes
// modernc.org/sqlite wait for a lock with its own busy handler, in Go timers on SQLite's
// schedule, which a synctest bubble's clock runs; SQLite's C handler, which it uses under a
// context that cannot end (main's), sleeps in a system call, in real time.
func runSessionsIn(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	var o, e bytes.Buffer
	err = run(ctx, append([]string{"sessions"}, args...), &o, &e)
	return o.String(), e.String(), err
}

// MustRunSessions is runSessions that fails the test on an error.
func MustRunSessions(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	o, e, err := runSessions(t, args...)
	if err != nil {
		t.Fatalf("sessions %s: %v (stderr %q)", strings.Join(args, " "), err, e)
	}
	return o, e
}

// fieldOf returns the value of the first "label:  value" line of show's text output.
func fieldOf(out, label string) string {
	for line := range strings.Lines(out) {
		if rest, ok := strings.CutPrefix(line, label+":"); ok {
			return strings.TrimSpace(rest)
		}
	}
	return "(no " + label + " line)"
}

func TestSessionsList(t *testing.T) {
	dir := MustSeedSessions(t)
	rowA := []string{keyA, "sa2", "http", "4", "1", "2025-03-01T12:20:00Z", "open"}
	rowB := []string{keyB, "sb1", "discord", "1", "1", "2025-03-01T12:31:00Z", "open"}
	tests := []struct {
		name     string
		args     []string
		wantRows [][]string
		wantMore string // the paging hint on stderr, or the note of none; "" for neither
	}{
		{"all", nil, [][]string{rowB, rowA}, ""},
		{"platform filter", []string{"--platform", "http"}, [][]string{rowA}, ""},
		// The note alone, as search and quarantined print theirs: before, a header over no rows.
		{"unknown platform", []string{"--platform", "slack"}, nil, "no session key matches\n"},
		{"full page", []string{"--limit", "1"}, [][]string{rowB}, "more: --after " + keyB + "\n"},
		{"last page", []string{"--limit", "1", "--after", keyB}, [][]string{rowA}, ""}, // no more follow: no hint
		{"after the last", []string{"--limit", "1", "--after", keyA}, nil, "no session key matches\n"},
		{"page of all", []string{"--limit", "2"}, [][]string{rowB, rowA}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut := MustRunSessions(t, append([]string{"list", "--data-dir", dir}, tc.args...)...)
			if errOut != tc.wantMore {
				t.Errorf("stderr = %q, want %q", errOut, tc.wantMore)
			}
			if tc.wantRows == nil {
				if out != "" {
					t.Errorf("stdout = %q, want nothing", out)
				}
				return
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if got, want := strings.Fields(lines[0]), []string{"KEY", "SESSION", "ID", "PLATFORM", "MESSAGES", "PENDING", "LAST", "ACTIVITY", "ENDED"}; !cmp.Equal(got, want) {
				t.Errorf("header = %q, want %q", got, want)
			}
			var rows [][]string
			for _, l := range lines[1:] {
				rows = append(rows, strings.Fields(l))
			}
			if d := cmp.Diff(tc.wantRows, rows); d != "" {
				t.Errorf("rows mismatch (-want +got):\n%s", d)
			}
		})
	}

	t.Run("empty database", func(t *testing.T) {
		empty := t.TempDir()
		st, err := sqlite.Open(context.Background(), filepath.Join(empty, "agentgate.db"), sqlite.Options{})
		if err != nil {
			t.Fatalf("sqlite.Open: %v", err)
		}
		st.Close()
		if out, errOut := MustRunSessions(t, "list", "--data-dir", empty); out != "" || errOut != "no session is stored yet\n" {
			t.Errorf("list of an empty database: stdout %q, stderr %q; want nothing and %q", out, errOut, "no session is stored yet\n")
		}
	})

	t.Run("json", func(t *testing.T) {
		out, _ := MustRunSessions(t, "list", "--data-dir", dir, "--json")
		var got []struct {
			Session struct {
				ID         string `json:"id"`
				SessionKey string `json:"session_key"`
				Platform   string `json:"platform"`
				UserName   string `json:"user_name"`
				EndedAt    string `json:"ended_at"`
			} `json:"session"`
			Messages int `json:"messages"`
			Pending  int `json:"pending"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("decode %q: %v", out, err)
		}
		if len(got) != 2 {
			t.Fatalf("got %d sessions, want 2: %s", len(got), out)
		}
		g := got[1]
		if g.Session.ID != "sa2" || g.Session.SessionKey != keyA || g.Session.Platform != "http" ||
			g.Session.UserName != "Alice" || g.Session.EndedAt != "" || g.Messages != 4 || g.Pending != 1 {
			t.Errorf("list[1] = %+v, want sa2 of %s (http, Alice, open) with 4 messages, 1 pending", g, keyA)
		}
	})

	t.Run("json empty", func(t *testing.T) {
		out, _ := MustRunSessions(t, "list", "--data-dir", dir, "--json", "--platform", "slack")
		if got := strings.TrimSpace(out); got != "[]" {
			t.Errorf("list --json of nothing = %q, want []", got)
		}
	})

	t.Run("bad limit", func(t *testing.T) {
		if _, _, err := runSessions(t, "list", "--data-dir", dir, "--limit", "0"); err == nil || !strings.Contains(err.Error(), "--limit") {
			t.Errorf("list --limit 0 error = %v, want one naming --limit", err)
		}
	})

	t.Run("no database", func(t *testing.T) {
		_, _, err := runSessions(t, "list", "--data-dir", t.TempDir())
		if err == nil || !strings.Contains(err.Error(), "no database at") {
			t.Errorf("list of an empty directory error = %v, want \"no database at ...\"", err)
		}
		// A daemon on PostgreSQL configured by its environment: the command needs the same.
		if err == nil || !strings.Contains(err.Error(), "AGENTGATE_STORE_DRIVER=postgres") {
			t.Errorf("list of an empty directory error = %v, want it to name the store settings a daemon on PostgreSQL needs", err)
		}
	})
}

// withTranscriptPage makes show and export read n messages at a time for the rest of the test,
// so that the seeded transcripts (3 and 4 messages) span pages. Not for parallel tests.
func withTranscriptPage(t *testing.T, n int) {
	old := transcriptPage
	transcriptPage = n
	t.Cleanup(func() { transcriptPage = old })
}

func TestSessionsShow(t *testing.T) {
	dir := MustSeedSessions(t)
	withTranscriptPage(t, 3)

	t.Run("text", func(t *testing.T) {
		out, _ := MustRunSessions(t, "show", keyA, "--data-dir", dir)
		for _, f := range []struct{ label, want string }{
			{"key", keyA},
			{"route", "session sa2, generation 2, updated 2025-03-01T12:10:00Z"},
			{"current session", "sa2"},
			{"platform", "http"},
			{"chat type", "dm"},
			{"chat id", "alice"},
			{"thread id", "-"},
			{"user id", "alice"},
			{"user name", "Alice"},
			{"scope id", "scope-alice"},
			{"started", "2025-03-01T12:10:00Z"},
			{"last activity", "2025-03-01T12:20:00Z"},
			{"previous session", "sa1"},
			{"ended", "open"},
			{"messages", "4 (pending 1, failed 0, archived 1)"},
			{"tokens", "input 1234, output 56"},
			{"outbox", "last seq 2, undelivered 1"},
		} {
			if got := fieldOf(out, f.label); got != f.want {
				t.Errorf("%s = %q, want %q\n%s", f.label, got, f.want, out)
			}
		}
		_, msgs, ok := strings.Cut(out, "last 4 messages:\n")
		if !ok {
			t.Fatalf("show prints no message list:\n%s", out)
		}
		var got [][]string
		for line := range strings.Lines(msgs) {
			got = append(got, strings.Fields(line))
		}
		want := [][]string{
			{"SEQ", "ROLE", "STATUS", "MESSAGE", "ID", "TEXT"},
			{"1", "user", "done", "m3", "line", "one⏎line", "two"},
			{"2", "assistant", "done", "-", strings.Repeat("x", 80) + "…"},
			{"3", "user", "pending", "m4", "still", "there?"},
			{"4", "user", "done,archived", "m5", "never", "mind"},
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("message lines mismatch (-want +got):\n%s", d)
		}
	})

	t.Run("long", func(t *testing.T) {
		// 25 messages read 3 at a time: every one counted, the last 10 shown.
		const key, n = "agent:main:http:dm:carol", 25
		st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
		if err != nil {
			t.Fatalf("sqlite.Open: %v", err)
		}
		ops := []persistence.Op{
			&persistence.CreateSession{Session: persistence.Session{ID: "sc1", Key: key, Platform: "http",
				ChatType: "dm", ChatID: "carol", UserID: "carol", StartedAt: sessAt(40), Epoch: 1}},
			&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: "sc1", Generation: 1, UpdatedAt: sessAt(40)}},
		}
		for i := range int64(n) {
			status := persistence.StatusDone
			if i == 0 {
				status = persistence.StatusPending
			}
			ops = append(ops, &persistence.AppendMessage{Message: persistence.Message{
				SessionID: "sc1", Seq: i + 1, Role: persistence.RoleUser, Content: fmt.Sprint("message ", i+1),
				Platform: "http", ChatID: "carol", MessageID: fmt.Sprint("c", i+1), UserID: "carol",
				Status: status, Active: true, CreatedAt: sessAt(41),
			}})
		}
		storetest.MustCommit(t, st, ops...)
		st.Close()

		out, _ := MustRunSessions(t, "show", "--json", "--data-dir", dir, key)
		var got showJSON
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("decode %q: %v", out, err)
		}
		if got.Counts.Messages != n || got.Counts.Pending != 1 {
			t.Errorf("counts = %+v, want %d messages, 1 pending", got.Counts, n)
		}
		var seqs []int64
		for _, m := range got.Last {
			seqs = append(seqs, m.Seq)
		}
		if want := []int64{16, 17, 18, 19, 20, 21, 22, 23, 24, 25}; !slices.Equal(seqs, want) {
			t.Errorf("last_messages seqs = %v, want %v", seqs, want)
		}
	})

	t.Run("reset due", func(t *testing.T) {
		// A reset that fell due while the session worked is shown until the daemon does it.
		const key = "agent:main:http:dm:dora"
		st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
		if err != nil {
			t.Fatalf("sqlite.Open: %v", err)
		}
		storetest.MustCommit(t, st,
			&persistence.CreateSession{Session: persistence.Session{ID: "sd1", Key: key, Platform: "http",
				ChatType: "dm", ChatID: "dora", UserID: "dora", StartedAt: sessAt(40), Epoch: 1}},
			&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: "sd1", Generation: 1, UpdatedAt: sessAt(40)}},
			&persistence.MarkResetDue{SessionID: "sd1", Reason: persistence.EndDaily, At: sessAt(45)})
		st.Close()

		out, _ := MustRunSessions(t, "show", "--data-dir", dir, key)
		if got, want := fieldOf(out, "reset due"), "daily at "+sessAt(45).UTC().Format(time.RFC3339)+", once its work is done"; got != want {
			t.Errorf("reset due = %q, want %q\n%s", got, want, out)
		}
		out, _ = MustRunSessions(t, "show", "--json", "--data-dir", dir, key)
		var got struct {
			Session sessionJSON `json:"session"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("decode %q: %v", out, err)
		}
		if got.Session.ResetDueReason != persistence.EndDaily || !got.Session.ResetDueAt.Equal(sessAt(45)) {
			t.Errorf("session reset due %q at %v, want daily at %v\n%s", got.Session.ResetDueReason, got.Session.ResetDueAt, sessAt(45), out)
		}
		if out, _ := MustRunSessions(t, "show", "--data-dir", dir, keyA); strings.Contains(out, "reset due") {
			t.Errorf("show of a session with no due reset says one is due:\n%s", out)
		}
	})

	t.Run("reset due with no time", func(t *testing.T) {
		// A session with no valid activity time is due for its idle reset at once: its mark
		// has no time (ResetPolicy.Due). Before, it showed "idle at -".
		const key = "agent:main:http:dm:eve"
		st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
		if err != nil {
			t.Fatalf("sqlite.Open: %v", err)
		}
		storetest.MustCommit(t, st,
			&persistence.CreateSession{Session: persistence.Session{ID: "se1", Key: key, Platform: "http",
				ChatType: "dm", ChatID: "eve", UserID: "eve", Epoch: 1}},
			&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: "se1", Generation: 1, UpdatedAt: sessAt(40)}},
			&persistence.MarkResetDue{SessionID: "se1", Reason: persistence.EndIdle})
		st.Close()

		out, _ := MustRunSessions(t, "show", "--data-dir", dir, key)
		if got, want := fieldOf(out, "reset due"), "idle (its last activity has no valid time), once its work is done"; got != want {
			t.Errorf("reset due = %q, want %q\n%s", got, want, out)
		}
	})

	t.Run("json", func(t *testing.T) {
		out, _ := MustRunSessions(t, "show", "--json", "--data-dir", dir, keyA)
		var got struct {
			SessionKey string `json:"session_key"`
			Route      struct {
				SessionID  string `json:"session_id"`
				Generation int64  `json:"generation"`
			} `json:"route"`
			Session struct {
				ID            string    `json:"id"`
				ChatType      string    `json:"chat_type"`
				ScopeID       string    `json:"scope_id"`
				PrevSessionID string    `json:"prev_session_id"`
				StartedAt     time.Time `json:"started_at"`
				InputTokens   int64     `json:"input_tokens"`
				OutputTokens  int64     `json:"output_tokens"`
			} `json:"session"`
			Counts struct {
				Messages, Pending, Archived int
			} `json:"counts"`
			Last []struct {
				Seq  int64  `json:"seq"`
				Text string `json:"text"`
			} `json:"last_messages"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("decode %q: %v", out, err)
		}
		if got.SessionKey != keyA || got.Route.SessionID != "sa2" || got.Route.Generation != 2 {
			t.Errorf("key, route = %q, %+v, want %q, {sa2 2}", got.SessionKey, got.Route, keyA)
		}
		if got.Session.ID != "sa2" || got.Session.ChatType != "dm" || got.Session.ScopeID != "scope-alice" ||
			got.Session.PrevSessionID != "sa1" || !got.Session.StartedAt.Equal(sessAt(10)) {
			t.Errorf("session = %+v, want sa2 (dm, scope-alice, prev sa1, started %v)", got.Session, sessAt(10))
		}
		if got.Session.InputTokens != 1234 || got.Session.OutputTokens != 56 {
			t.Errorf("session tokens = %d/%d, want 1234/56", got.Session.InputTokens, got.Session.OutputTokens)
		}
		if got.Counts.Messages != 4 || got.Counts.Pending != 1 || got.Counts.Archived != 1 {
			t.Errorf("counts = %+v, want 4 messages, 1 pending, 1 archived", got.Counts)
		}
		if len(got.Last) != 4 || got.Last[1].Text != longText {
			t.Errorf("last_messages = %+v, want 4 with the full text of seq 2", got.Last)
		}
	})

	errTests := []struct {
		name, key, want string
	}{
		{"unknown key", "agent:main:http:dm:nobody", "sessions show: the key agent:main:http:dm:nobody has no session; agentgate sessions list prints the keys that have one"},
		{"not a key", "alice", "not a session key"},
	}
	for _, tc := range errTests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := runSessions(t, "show", "--data-dir", dir, tc.key)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("show %q error = %v, want one containing %q", tc.key, err, tc.want)
			}
		})
	}

	t.Run("missing key", func(t *testing.T) {
		if _, _, err := runSessions(t, "show", "--data-dir", dir); !errors.Is(err, errUsage) {
			t.Errorf("show without KEY error = %v, want errUsage", err)
		}
	})
}

func TestSessionsExport(t *testing.T) {
	dir := MustSeedSessions(t)
	withTranscriptPage(t, 2)
	out, _ := MustRunSessions(t, "export", "--data-dir", dir, keyA)

	// Written a page at a time, the export reads exactly as the whole object encoded at once.
	var whole exportJSON
	if err := json.Unmarshal([]byte(out), &whole); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	var again bytes.Buffer
	if err := writeJSON(&again, whole); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(again.String(), out); d != "" {
		t.Errorf("export differs from its object encoded whole (-whole +streamed):\n%s", d)
	}
	// keyB's export has an empty outbox.
	outB, _ := MustRunSessions(t, "export", "--data-dir", dir, keyB)
	whole = exportJSON{}
	again.Reset()
	if err := json.Unmarshal([]byte(outB), &whole); err != nil {
		t.Fatalf("decode %q: %v", outB, err)
	}
	if err := writeJSON(&again, whole); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(again.String(), outB); d != "" || len(whole.Sessions) != 1 || len(whole.Sessions[0].Messages) != 1 {
		t.Errorf("export of %s = %s, want 1 session with 1 message, as encoded whole (-whole +streamed):\n%s", keyB, outB, d)
	}

	type msg struct {
		Seq       int64  `json:"seq"`
		Role      string `json:"role"`
		Text      string `json:"text"`
		MessageID string `json:"message_id"`
		Status    string `json:"status"`
		Active    bool   `json:"active"`
		Archived  bool   `json:"archived"`
	}
	type sess struct {
		Session struct {
			ID            string `json:"id"`
			SessionKey    string `json:"session_key"`
			EndReason     string `json:"end_reason"`
			PrevSessionID string `json:"prev_session_id"`
		} `json:"session"`
		Messages []msg `json:"messages"`
	}
	type entry struct {
		Seq       int64    `json:"seq"`
		SessionID string   `json:"session_id"`
		Kind      string   `json:"kind"`
		InReplyTo []string `json:"in_reply_to"`
		State     string   `json:"state"`
	}
	var got struct {
		SessionKey string    `json:"session_key"`
		ExportedAt time.Time `json:"exported_at"`
		Sessions   []sess    `json:"sessions"`
		Outbox     []entry   `json:"outbox"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	if got.SessionKey != keyA || got.ExportedAt.IsZero() {
		t.Errorf("session_key, exported_at = %q, %v, want %q and a time", got.SessionKey, got.ExportedAt, keyA)
	}

	var want struct{ Sessions []sess }
	want.Sessions = make([]sess, 2)
	want.Sessions[0].Session.ID, want.Sessions[0].Session.SessionKey, want.Sessions[0].Session.PrevSessionID = "sa2", keyA, "sa1"
	want.Sessions[0].Messages = []msg{
		{1, "user", "line one\nline two", "m3", "done", true, false},
		{2, "assistant", longText, "", "done", true, false},
		{3, "user", "still there?", "m4", "pending", true, false},
		{4, "user", "never mind", "m5", "done", false, true},
	}
	want.Sessions[1].Session.ID, want.Sessions[1].Session.SessionKey, want.Sessions[1].Session.EndReason = "sa1", keyA, "new_command"
	want.Sessions[1].Messages = []msg{
		{1, "user", "hello", "m1", "done", true, false},
		{2, "assistant", "hi there", "", "done", true, false},
		{3, "user", "scrap this", "m2", "done", false, true},
	}
	if d := cmp.Diff(want.Sessions, got.Sessions); d != "" {
		t.Errorf("sessions mismatch (-want +got):\n%s", d)
	}
	wantOutbox := []entry{
		{1, "sa1", "reply", []string{"m1"}, "delivered"},
		{2, "sa2", "notice", []string{}, "pending"},
	}
	if d := cmp.Diff(wantOutbox, got.Outbox); d != "" {
		t.Errorf("outbox mismatch (-want +got):\n%s", d)
	}

	t.Run("unknown key", func(t *testing.T) {
		_, _, err := runSessions(t, "export", "--data-dir", dir, "agent:main:http:dm:nobody")
		if err == nil || !strings.Contains(err.Error(), "has no session") {
			t.Errorf("export of an unknown key error = %v, want has no session", err)
		}
	})
}

func TestSessionsReset(t *testing.T) {
	t.Run("ends the current session", func(t *testing.T) {
		dir := MustSeedSessions(t)
		out, errOut := MustRunSessions(t, "reset", "--data-dir", dir, keyA)
		if want := "ended session sa2 of " + keyA + " (reset_command)\n"; out != want {
			t.Errorf("reset stdout = %q, want %q", out, want)
		}
		if want := "note: the ended session's 1 pending message(s) are marked failed and will not be answered; their senders are told so (at the daemon's next start, or a cluster's next recovery)\n"; errOut != want {
			t.Errorf("reset stderr = %q, want %q", errOut, want)
		}
		// The pending message is settled as the daemon's own reset settles it: failed, and a
		// notice to its sender waits in the outbox.
		st, err := sqlite.OpenReadOnly(context.Background(), filepath.Join(dir, "agentgate.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		ms, err := st.Transcript(context.Background(), "sa2")
		if err != nil {
			t.Fatal(err)
		}
		// Archived too: never answered, it is no part of the conversation a /resume gives the
		// agent (as the daemon's reset leaves it).
		if m := ms[2]; m.MessageID != "m4" || m.Status != persistence.StatusFailed || m.Active {
			t.Errorf("after reset, message 3 of sa2 = %s %s active=%v, want m4 failed and archived", m.MessageID, m.Status, m.Active)
		}
		out3, err := st.OutboxAfter(context.Background(), keyA, 2, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(out3) != 1 || out3[0].Kind != "notice" || fmt.Sprint(out3[0].InReplyTo) != "[m4]" ||
			out3[0].State != persistence.DeliveryPending || out3[0].SessionID != "sa2" {
			t.Errorf("after reset, outbox after seq 2 = %+v, want one pending notice answering m4", out3)
		}
		show, _ := MustRunSessions(t, "show", "--data-dir", dir, keyA)
		if got := fieldOf(show, "ended"); !strings.Contains(got, " (reset_command)") {
			t.Errorf("after reset, ended = %q, want it to say (reset_command)", got)
		}
		// show counts the message the note spoke of where the note put it: failed, not pending
		// (before, the note said pending and show counted it nowhere).
		if got, want := fieldOf(show, "messages"), "4 (pending 0, failed 1, archived 2)"; got != want {
			t.Errorf("after reset, messages = %q, want %q", got, want)
		}
		list, _ := MustRunSessions(t, "list", "--data-dir", dir, "--platform", "http")
		if !strings.Contains(list, "reset_command") {
			t.Errorf("after reset, list = %q, want reset_command in the ENDED column", list)
		}

		out, _ = MustRunSessions(t, "reset", "--data-dir", dir, keyA)
		if want := "session sa2 of " + keyA + " already ended (reset_command)\n"; out != want {
			t.Errorf("second reset stdout = %q, want %q", out, want)
		}
	})

	t.Run("one that an automatic reset began is ended, though nothing was said in it", func(t *testing.T) {
		// Its first turn would be told to continue the session the idle reset ended: a reset
		// asks for a start afresh (a review's finding), as the daemon's does.
		dir := seedSA3(t, persistence.EndIdle, 40)
		out, errOut := MustRunSessions(t, "reset", "--data-dir", dir, keyA)
		if want := "ended session sa3 of " + keyA + " (reset_command)\n"; out != want || errOut != "" {
			t.Errorf("reset of a session an idle reset began: stdout = %q, stderr = %q, want %q", out, errOut, want)
		}
	})
	t.Run("a session nothing was said in yet is left as it is", func(t *testing.T) {
		// As the daemon's reset leaves it: a session a reset began, holding only a notice and
		// an exchange /undo took back, is no conversation yet. Ending it would have a second
		// reset of the key claim nothing was left to end ("already ended").
		at := func(seq int64, role, status string) *persistence.AppendMessage {
			return &persistence.AppendMessage{Message: persistence.Message{
				SessionID: "sa3", Seq: seq, Role: role, Content: "x", Platform: "http", ChatID: "alice",
				UserID: "alice", Status: status, Active: true, CreatedAt: sessAt(40 + int(seq)),
			}}
		}
		dir := seedSA3(t, persistence.EndResetCommand, 43,
			at(1, persistence.RoleNotice, persistence.StatusDone),
			at(2, persistence.RoleUser, persistence.StatusDone),
			at(3, persistence.RoleAssistant, persistence.StatusDone),
			&persistence.ArchiveMessages{SessionID: "sa3", Seqs: []int64{2, 3}},
		)
		for range 2 {
			out, errOut := MustRunSessions(t, "reset", "--data-dir", dir, keyA)
			if want := "session sa3 of " + keyA + " holds no conversation yet (commands and notices do not count): left as it is\n"; out != want || errOut != "" {
				t.Errorf("reset of a session nothing was said in: stdout = %q, stderr = %q, want %q and nothing", out, errOut, want)
			}
			show, _ := MustRunSessions(t, "show", "--data-dir", dir, keyA)
			// What reset says is true of what show counts: it holds messages, none a
			// conversation's (before, "holds nothing yet" beside "messages: 3").
			if got := fieldOf(show, "messages"); !strings.HasPrefix(got, "3 ") {
				t.Errorf("show of the session: messages %q, want its 3", got)
			}
			if got := fieldOf(show, "ended"); got != "open" {
				t.Errorf("after the reset of a session nothing was said in, ended = %q, want open", got)
			}
		}
	})

	t.Run("a session nothing was said in yet but with settings of its own is ended", func(t *testing.T) {
		// As the daemon's reset ends it: the session a reset begins has the default queue
		// mode and no title. Before, one left in steer mode by /queue steer was kept.
		for _, set := range []persistence.Op{
			&persistence.SetQueueMode{SessionID: "sa3", Mode: "steer"},
			&persistence.SetTitle{SessionID: "sa3", Title: "plans"},
		} {
			dir := seedSA3(t, persistence.EndResetCommand, 41, set)
			out, errOut := MustRunSessions(t, "reset", "--data-dir", dir, keyA)
			if want := "ended session sa3 of " + keyA + " (reset_command)\n"; out != want || errOut != "" {
				t.Errorf("reset of a session with %T: stdout = %q, stderr = %q, want %q and nothing", set, out, errOut, want)
			}
		}
	})

	t.Run("the daemon tells the senders", func(t *testing.T) {
		dir := MustSeedSessions(t)
		MustRunSessions(t, "reset", "--data-dir", dir, keyA)
		d := MustServe(t, dir)
		defer func() {
			if err := d.stop(t, 30*time.Second); err != nil {
				t.Error(err)
			}
		}()
		waitFor(t, 30*time.Second, func() bool { // the start's recovery sends the notice
			st, err := sqlite.OpenReadOnly(context.Background(), filepath.Join(dir, "agentgate.db"))
			if err != nil {
				return false
			}
			defer st.Close()
			out, err := st.OutboxAfter(context.Background(), keyA, 2, 0)
			return err == nil && len(out) == 1 && out[0].State == persistence.DeliveryDelivered
		})
	})

	t.Run("an older schema is the daemon's to upgrade", func(t *testing.T) {
		// A newer binary's reset, run before its daemon has started on the database, does not
		// upgrade it on the side, unlogged, as only the daemon does (it is one way): it says how.
		dir := MustSeedSessions(t)
		raw, err := sql.Open("sqlite", filepath.Join(dir, "agentgate.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		var latest int
		if err := raw.QueryRow(`SELECT MAX(version) FROM schema_migrations`).Scan(&latest); err != nil {
			t.Fatal(err)
		}
		if _, err := raw.Exec(`DELETE FROM schema_migrations WHERE version = ?`, latest); err != nil {
			t.Fatal(err)
		}
		_, _, err = runSessions(t, "reset", "--data-dir", dir, keyA)
		if err == nil || !strings.Contains(err.Error(), "start this version's daemon on it once to migrate it") {
			t.Errorf("reset on an older schema: error = %v, want a refusal that says how to migrate", err)
		}
		var v int
		if err := raw.QueryRow(`SELECT MAX(version) FROM schema_migrations`).Scan(&v); err != nil || v != latest-1 {
			t.Errorf("schema version after the reset = %d, %v, want %d (left as it was)", v, err, latest-1)
		}
		var ended sql.NullInt64
		if err := raw.QueryRow(`SELECT ended_at FROM sessions WHERE id = 'sa2'`).Scan(&ended); err != nil || ended.Valid {
			t.Errorf("sa2 ended_at after a refused reset = %v, %v, want open", ended, err)
		}
	})

	t.Run("unknown key", func(t *testing.T) {
		dir := MustSeedSessions(t)
		_, _, err := runSessions(t, "reset", "--data-dir", dir, "agent:main:http:dm:nobody")
		if err == nil || !strings.Contains(err.Error(), "has no session") {
			t.Errorf("reset of an unknown key error = %v, want has no session", err)
		}
	})

	t.Run("pruned", func(t *testing.T) {
		// The key routes to a session pruning deleted: there is nothing to end, and that is no error.
		dir := t.TempDir()
		st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
		if err != nil {
			t.Fatalf("sqlite.Open: %v", err)
		}
		storetest.MustCommit(t, st, &persistence.PutRoute{Route: persistence.Route{Key: keyA, SessionID: "sa-gone", Generation: 3, UpdatedAt: sessAt(1)}})
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		out, _ := MustRunSessions(t, "reset", "--data-dir", dir, keyA)
		if want := "session sa-gone of " + keyA + " ended and was pruned; the key's next message starts a new one\n"; out != want {
			t.Errorf("reset of a key whose session was pruned: stdout = %q, want %q", out, want)
		}
		if show, _ := MustRunSessions(t, "show", "--data-dir", dir, keyA); fieldOf(show, "current session") != "sa-gone (gone: pruned after it ended)" {
			t.Errorf("show of a key whose session was pruned: session = %q", fieldOf(show, "current session"))
		}
	})

	t.Run("daemon running", func(t *testing.T) {
		dir, daemon := MustSeedLockedSessions(t) // the daemon holds the database

		list, _ := MustRunSessions(t, "list", "--data-dir", dir)
		if !strings.Contains(list, keyA) || !strings.Contains(list, keyB) {
			t.Errorf("list while the daemon runs = %q, want both keys", list)
		}
		MustRunSessions(t, "show", "--data-dir", dir, keyA)
		MustRunSessions(t, "export", "--data-dir", dir, keyA)

		// A daemon that records no address (it starts, or it runs on another host) is not
		// reset behind its back: the curl names the configured address (a daemon on every
		// interface is reached on loopback).
		addr := closedAddr(t)
		_, port, _ := net.SplitHostPort(addr)
		t.Setenv("AGENTGATE_HTTP_TOKEN_ENV", "ADMIN_TOKEN")
		_, _, err := runSessions(t, "reset", "--data-dir", dir, "--http-addr", "0.0.0.0:"+port, keyA)
		want := "the daemon is running on this data directory, but it records no address in " + dir +
			` (it starts, or it runs on another host); reset through it: curl -X POST -H "Authorization: Bearer $ADMIN_TOKEN" http://` +
			addr + "/v1/sessions/" + keyA + "/reset"
		if err == nil || err.Error() != want {
			t.Errorf("reset while the daemon runs but records no address: error = %v, want %q", err, want)
		}
		s, err := daemon.Session(context.Background(), "sa2")
		if err != nil {
			t.Fatalf("Session(sa2): %v", err)
		}
		if !s.EndedAt.IsZero() {
			t.Errorf("after a refused reset, sa2 ended at %v (%s), want open", s.EndedAt, s.EndReason)
		}

		// A daemon started with other flags says where it listens; that address wins.
		t.Setenv("AGENTGATE_HTTP_TOKEN_ENV", "")
		recorded := closedAddr(t)
		if err := os.WriteFile(filepath.Join(dir, supervisor.AddrFile), []byte(recorded+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, supervisor.RunFile), []byte(testRun+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		// One that does not answer there (it is stuck) is not reset behind its back either.
		_, _, err = runSessions(t, "reset", "--data-dir", dir, keyA)
		wantStart := "the daemon is running on this data directory, but no answer at " + recorded + " ("
		wantEnd := "); reset through it when it answers: curl -X POST http://" + recorded + "/v1/sessions/" + keyA + "/reset"
		if err == nil || !strings.HasPrefix(err.Error(), wantStart) || !strings.HasSuffix(err.Error(), wantEnd) {
			t.Errorf("reset while a daemon on %s runs but does not answer: error = %v, want %q…%q", recorded, err, wantStart, wantEnd)
		}
	})
}

func TestSessionsSearch(t *testing.T) {
	dir := MustSeedSessions(t)

	t.Run("text", func(t *testing.T) {
		out, _ := MustRunSessions(t, "search", "there", "--data-dir", dir)
		var got [][]string
		for line := range strings.Lines(out) {
			got = append(got, strings.Fields(line))
		}
		// Best match first: bm25 ranks the shorter text higher.
		want := [][]string{
			{"KEY", "SESSION", "ID", "SEQ", "ROLE", "CREATED", "TEXT"},
			{keyA, "sa1", "2", "assistant", "2025-03-01T12:02:00Z", "hi", "there"},
			{keyA, "sa2", "3", "user", "2025-03-01T12:03:00Z", "still", "there?"},
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("search there (-want +got):\n%s", d)
		}
	})
	t.Run("limit and archived", func(t *testing.T) {
		out, _ := MustRunSessions(t, "search", "--data-dir", dir, "--json", "--limit", "1", "scrap")
		var hits []struct {
			SessionKey string `json:"session_key"`
			SessionID  string `json:"session_id"`
			Seq        int64  `json:"seq"`
			Text       string `json:"text"`
			Archived   bool   `json:"archived"`
		}
		if err := json.Unmarshal([]byte(out), &hits); err != nil {
			t.Fatalf("search --json: %v\n%s", err, out)
		}
		if len(hits) != 1 || hits[0].SessionKey != keyA || hits[0].SessionID != "sa1" || hits[0].Seq != 3 || !hits[0].Archived {
			t.Errorf("search scrap = %+v, want the archived message 3 of sa1 under %s", hits, keyA)
		}
		out, _ = MustRunSessions(t, "search", "--data-dir", dir, "--json", "--limit", "1", "hey OR hello")
		if err := json.Unmarshal([]byte(out), &hits); err != nil || len(hits) != 1 {
			t.Errorf("search --limit 1 = %s (%v), want one hit", out, err)
		}
	})
	t.Run("no match", func(t *testing.T) {
		// The note alone: before, a table header over no rows too (found by a new user's
		// walkthrough).
		out, errOut := MustRunSessions(t, "search", "--data-dir", dir, "unicorn")
		if out != "" || !strings.Contains(errOut, "no message matches") {
			t.Errorf("search unicorn = %q, stderr %q; want nothing, and a note", out, errOut)
		}
	})
	t.Run("bad query", func(t *testing.T) {
		_, _, err := runSessions(t, "search", "--data-dir", dir, `"unbalanced`)
		if err == nil || !strings.Contains(err.Error(), "not a query the index understands") {
			t.Errorf("search of a malformed query error = %v, want one naming the query syntax", err)
		}
		if _, _, err := runSessions(t, "search", "--data-dir", dir); !errors.Is(err, errUsage) {
			t.Errorf("search without QUERY error = %v, want errUsage", err)
		}
		if _, _, err := runSessions(t, "search", "--data-dir", dir, "a", "b"); !errors.Is(err, errUsage) {
			t.Errorf("search with two arguments error = %v, want errUsage", err)
		}
		if _, _, err := runSessions(t, "search", "--data-dir", dir, " "); err == nil {
			t.Errorf("search of an empty query = nil error")
		}
	})
}

func TestSessionsOneLine(t *testing.T) {
	tests := []struct {
		name, in string
		limit    int
		want     string
	}{
		{"plain", "hello", 80, "hello"},
		{"newlines", "a\nb\r\nc", 80, "a⏎b⏎c"},
		{"controls", "a\tb\x1b[31mc", 0, "a b\uFFFD[31mc"},
		{"format characters", "a\u202eb\u2067c\u200bd\ufeffe\u00adf", 0, "a\uFFFDb\uFFFDc\uFFFDd\uFFFDe\uFFFDf"},
		{"the emoji joiner and variation selectors", "👩\u200d💻 ❤\ufe0f", 0, "👩\u200d💻 ❤\ufe0f"},
		{"cut", "héllo wörld", 5, "héllo…"},
		{"exact", "hello", 5, "hello"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := oneLine(tc.in, tc.limit); got != tc.want {
				t.Errorf("oneLine(%q, %d) = %q, want %q", tc.in, tc.limit, got, tc.want)
			}
		})
	}
}

// closedAddr is a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestSessionsQuarantinedNone: with nothing quarantined, the note alone; before, a table
// header over no rows too (found by a new user's walkthrough). --json prints an empty array.
func TestSessionsQuarantinedNone(t *testing.T) {
	dir := MustSeedSessions(t)
	out, errOut := MustRunSessions(t, "quarantined", "--data-dir", dir)
	if out != "" || errOut != "no message is quarantined\n" {
		t.Errorf("quarantined = %q, stderr %q; want nothing, and the note", out, errOut)
	}
	if out, _ := MustRunSessions(t, "quarantined", "--data-dir", dir, "--json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("quarantined --json = %q, want []", out)
	}
}

// TestSessionsReadersNoteSpooledWrites: list, show, export, search and quarantined, run while
// writes wait in the spool (a daemon killed with -9 before it replayed them, or one running while
// the database is locked), say on stderr that what they show lacks them, and still show it.
// Before, they showed the stale state without a word (a walkthrough).
func TestSessionsReadersNoteSpooledWrites(t *testing.T) {
	dir := MustSeedSessions(t)
	for _, args := range [][]string{{"list"}, {"show", keyA}, {"export", keyA}, {"search", "there"}, {"quarantined"}} {
		if _, errOut := MustRunSessions(t, append(args, "--data-dir", dir)...); strings.Contains(errOut, "spool") {
			t.Errorf("sessions %s with an empty spool: stderr %q, want no note of it", args[0], errOut)
		}
	}
	sp, err := spool.Open(filepath.Join(dir, "spool"))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := sp.Append([][]persistence.Op{{&persistence.SetTitle{SessionID: "sa2", Title: "spooled"}}}); err != nil {
			t.Fatal(err)
		}
	}
	note := "note: " + filepath.Join(dir, "spool") + " holds 2 batch(es) of writes the database does not have yet, so this lacks them; " +
		"the daemon writes them once the database takes writes again (a stopped daemon, when it starts)\n"
	for _, args := range [][]string{{"list"}, {"show", keyA}, {"export", keyA}, {"search", "there"}, {"quarantined"}} {
		out, errOut := MustRunSessions(t, append(args, "--data-dir", dir)...)
		if !strings.Contains(errOut, note) {
			t.Errorf("sessions %s while the spool holds writes: stderr %q, want the note %q", args[0], errOut, note)
		}
		if args[0] != "quarantined" && out == "" {
			t.Errorf("sessions %s while the spool holds writes printed nothing, want what the database holds", args[0])
		}
	}
}

// TestSessionsFormatCharacters: the text output of list, show and search shows invisible
// format characters (a right-to-left override, isolates, a zero-width space, a byte order
// mark) as U+FFFD, as it shows control characters, so that none reorders or hides what an
// operator reads, and a key that holds one Go-quoted, escaped; the emoji joiner is kept, and
// --json keeps the text as stored. Before, all of them raw (found by a new user's walkthrough).
func TestSessionsFormatCharacters(t *testing.T) {
	const (
		key    = "agent:main:http:dm:eve\u202egpj.exe"
		text   = "pay \u2066bob\u2069 now\u200b\ufeff 👩\u200d💻"
		shown  = "pay \uFFFDbob\uFFFD now\uFFFD\uFFFD 👩\u200d💻"
		userID = "eve\u202e"
	)
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	storetest.MustCommit(t, st,
		&persistence.CreateSession{Session: persistence.Session{ID: "se1", Key: key, Platform: "http", ChatType: "dm", ChatID: "eve",
			UserID: userID, StartedAt: sessAt(0), LastActivityAt: sessAt(1), Epoch: 1}},
		&persistence.AppendMessage{Message: persistence.Message{SessionID: "se1", Seq: 1, Role: persistence.RoleUser, Content: text,
			Platform: "http", ChatID: "eve", MessageID: "m1", UserID: userID, Status: persistence.StatusDone, Active: true, CreatedAt: sessAt(1)}},
		&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: "se1", Generation: 1, UpdatedAt: sessAt(0)}},
	)
	st.Close()

	invisible := func(s string) []string {
		var found []string
		for _, r := range s {
			if unicode.Is(unicode.Cf, r) && r != '\u200d' {
				found = append(found, fmt.Sprintf("%U", r))
			}
		}
		return found
	}
	for _, args := range [][]string{{"list"}, {"show", key}, {"search", "pay"}} {
		out, _ := MustRunSessions(t, append(args, "--data-dir", dir)...)
		if found := invisible(out); len(found) > 0 {
			t.Errorf("sessions %s prints %v raw:\n%s", args[0], found, out)
		}
		if want := `'"agent:main:http:dm:eve\u202egpj.exe"'`; !strings.Contains(out, want) { // (pasteable: TestSessionsKeyPastedAsListed)
			t.Errorf("sessions %s = %q, want the key shown as %q", args[0], out, want)
		}
		if args[0] != "list" && !strings.Contains(out, shown) {
			t.Errorf("sessions %s = %q, want the text shown as %q", args[0], out, shown)
		}
		js, _ := MustRunSessions(t, append(args, "--data-dir", dir, "--json")...)
		if !strings.Contains(js, `\u202e`) && !strings.Contains(js, "\u202e") {
			t.Errorf("sessions %s --json = %q, want the key as stored", args[0], js)
		}
	}
}

// writesRecorder is a writer that keeps each Write apart.
type writesRecorder struct{ writes []string }

func (w *writesRecorder) Write(p []byte) (int, error) {
	w.writes = append(w.writes, string(p))
	return len(p), nil
}

// TestSessionsListPrintsAPageAtATime: sessions list reads and prints its keys a page at a time,
// as a table and as JSON, and the pages join into what one page would print. Before, it read
// every key it printed in one list and printed it at the end: a list of 100,000 keys took 207
// MB as a table and 451 MB as JSON.
func TestSessionsListPrintsAPageAtATime(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	var keys []string
	for i := range 7 {
		key := fmt.Sprintf("agent:main:http:dm:c%d", i)
		id := fmt.Sprintf("s%d", i)
		keys = append(keys, key)
		storetest.MustCommit(t, st,
			&persistence.CreateSession{Session: persistence.Session{ID: id, Key: key, Platform: "http", ChatType: "dm",
				ChatID: fmt.Sprint("c", i), UserID: "u", StartedAt: sessAt(i), LastActivityAt: sessAt(i), Epoch: 1}},
			&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: id, Generation: 1, UpdatedAt: sessAt(i)}})
	}
	st.Close()
	list := func(page int, args ...string) (writes []string, stderr string) {
		t.Helper()
		old := listPage
		listPage = page
		defer func() { listPage = old }()
		var w writesRecorder
		var e bytes.Buffer
		if err := run(context.Background(), append([]string{"sessions", "list", "--data-dir", dir}, args...), &w, &e); err != nil {
			t.Fatalf("sessions list %v: %v (stderr %q)", args, err, e.String())
		}
		return w.writes, e.String()
	}
	for _, tc := range []struct {
		name     string
		args     []string
		wantMore string
	}{
		{"table", []string{"--limit", "1000"}, ""},
		{"json", []string{"--limit", "1000", "--json"}, ""},
		{"table, a partial page", []string{"--limit", "5"}, "more: --after " + keys[4] + "\n"},
		{"json, a partial page", []string{"--limit", "5", "--json"}, "more: --after " + keys[4] + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			whole, wholeErr := list(1000, tc.args...)
			paged, pagedErr := list(2, tc.args...)
			if got, want := strings.Join(paged, ""), strings.Join(whole, ""); got != want {
				t.Errorf("printed in pages of 2:\n%s\nwant, as in one page:\n%s", got, want)
			}
			if pagedErr != tc.wantMore || wholeErr != tc.wantMore {
				t.Errorf("stderr = %q in pages of 2, %q in one; want %q", pagedErr, wholeErr, tc.wantMore)
			}
			if len(paged) == 0 || strings.Contains(paged[0], keys[2]) || !strings.Contains(paged[0], keys[1]) {
				t.Errorf("first write = %q; want the first page of 2 keys alone (%s, %s)", paged, keys[0], keys[1])
			}
		})
	}
}

// seedSA3 seeds the sessions (MustSeedSessions), then ends keyA's session sa2 for reason and
// routes keyA to a session sa3 it began, last active at sessAt(lastActive), with ops after; it
// returns the data directory.
func seedSA3(t *testing.T, reason string, lastActive int, ops ...persistence.Op) string {
	t.Helper()
	dir := MustSeedSessions(t)
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	storetest.MustCommit(t, st, append([]persistence.Op{
		&persistence.EndSession{SessionID: "sa2", Reason: reason, At: sessAt(39)},
		&persistence.CreateSession{Session: persistence.Session{
			ID: "sa3", Key: keyA, Platform: "http", ChatType: "dm", ChatID: "alice", UserID: "alice",
			StartedAt: sessAt(40), LastActivityAt: sessAt(lastActive), PrevSessionID: "sa2", Epoch: 1,
		}},
		&persistence.PutRoute{Route: persistence.Route{Key: keyA, SessionID: "sa3", Generation: 3, UpdatedAt: sessAt(40)}},
	}, ops...)...)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}
