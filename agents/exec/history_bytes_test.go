package exec_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/exec"
	"github.com/agentgate/agentgate/internal/testutil"
)

// historyJSON returns how many bytes ms take as the history array on stdin, brackets and commas
// included.
func historyJSON(t *testing.T, ms []agents.Message) int {
	t.Helper()
	b, err := json.Marshal(ms) // the texts hold no HTML characters, which stdin leaves unescaped
	if err != nil {
		t.Fatal(err)
	}
	return len(b)
}

// TestHistoryBytesBoundsTheHistory: the history on stdin is at most HistoryBytes of JSON: the
// oldest entries are left out first, whole (never one cut in half, nor an older one that would
// fit sent after a newer one left out), and the newest is sent even when it alone is larger.
// Before, the command got the last History entries whatever their size: a chat of 1 MiB replies
// sent it over 10 MiB a turn (a soak).
func TestHistoryBytesBoundsTheHistory(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	msg := func(i int, text string) agents.Message {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		return agents.Message{Role: role, Text: text, MessageID: fmt.Sprintf("h%d", i), At: at.Add(time.Duration(i) * time.Minute)}
	}
	var even []agents.Message // 8 entries of 1000 bytes of text
	for i := range 8 {
		even = append(even, msg(i, fmt.Sprintf("%d%s", i, strings.Repeat("x", 999))))
	}
	// A big reply behind the newest two: the oldest entry would fit beside them, but is older.
	big := []agents.Message{msg(0, "small"), msg(1, strings.Repeat("y", 64<<10)), msg(2, "small"), msg(3, "small")}
	last3 := historyJSON(t, even[5:])
	tests := []struct {
		name         string
		history      []agents.Message
		count, bytes int
		want         []agents.Message
		wantLeftOut  int // by the byte bound
	}{
		{"no bound", even, 8, 0, even, 0},
		{"the last three fit exactly", even, 8, last3, even[5:], 5},
		{"a byte short of the last three", even, 8, last3 - 1, even[6:], 6},
		{"the count cuts first", even, 2, last3, even[6:], 0},
		{"the newest alone is larger", even, 8, 10, even[7:], 7},
		{"an older entry that fits is not sent past a larger one", big, 4, historyJSON(t, big[2:]) + 100, big[2:], 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs testutil.Buffer
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			cmd, _ := MustScript(t, `exec cat`)
			a := MustNew(t, exec.Config{Command: cmd, History: tc.count, HistoryBytes: tc.bytes, Logger: log})
			req := &agents.Request{Identity: turn(7), Messages: []agents.Message{{Role: "user", Text: "now", MessageID: "m1", At: at.Add(time.Hour)}}, History: tc.history}
			resp, err := a.Run(t.Context(), req)
			if err != nil {
				t.Fatalf("Run() error = %v, want nil", err)
			}
			var got stdinDoc
			if err := json.Unmarshal([]byte(resp.Text), &got); err != nil {
				t.Fatalf("stdin %q is not one JSON object: %v", abbrev(resp.Text), err)
			}
			if diff := cmp.Diff(tc.want, got.History); diff != "" {
				t.Errorf("stdin's history mismatch (-want +got):\n%s", diff)
			}
			if tc.bytes > 0 && len(got.History) > 1 {
				if n := historyJSON(t, got.History); n > tc.bytes {
					t.Errorf("stdin's history is %d bytes of JSON, want at most HistoryBytes, %d", n, tc.bytes)
				}
			}
			trimmed := strings.Contains(logs.String(), `msg="exec agent history trimmed"`)
			if want := fmt.Sprintf("left_out=%d sent=%d", tc.wantLeftOut, len(tc.want)); tc.wantLeftOut > 0 && !strings.Contains(logs.String(), want) {
				t.Errorf("logs = %s\nwant the debug line of the cut, with %s", logs.String(), want)
			} else if tc.wantLeftOut == 0 && trimmed {
				t.Errorf("logs = %s\nwant no line of a cut by history_bytes", logs.String())
			}
		})
	}
}

// TestHistoryBytesCutIsLoggedAtInfoOnce: the first turn whose history the byte bound cuts says
// so at Info, once per agent (the command no longer sees the start of long conversations); each
// turn's cut is at Debug.
func TestHistoryBytesCutIsLoggedAtInfoOnce(t *testing.T) {
	t.Parallel()
	var logs testutil.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cmd, _ := MustScript(t, `cat >/dev/null; echo ok`)
	a := MustNew(t, exec.Config{Command: cmd, History: 20, HistoryBytes: 1000, Logger: log})
	history := []agents.Message{{Role: "user", Text: strings.Repeat("a", 900)}, {Role: "assistant", Text: strings.Repeat("b", 900)}}
	for i := range 3 {
		if _, err := a.Run(t.Context(), &agents.Request{Identity: turn(i + 1), Messages: []agents.Message{{Role: "user", Text: "hi"}}, History: history}); err != nil {
			t.Fatalf("Run() error = %v, want nil", err)
		}
	}
	const info = `level=INFO msg="a turn's history left out older entries to fit agent.exec.history_bytes; each turn's cut is logged at debug from now on"`
	if n := strings.Count(logs.String(), info); n != 1 {
		t.Errorf("%d INFO lines of the cut for 3 turns, want 1:\n%s", n, logs.String())
	}
	if n := strings.Count(logs.String(), `level=DEBUG msg="exec agent history trimmed"`); n != 3 {
		t.Errorf("%d DEBUG lines of the cut for 3 turns, want 3:\n%s", n, logs.String())
	}
}
