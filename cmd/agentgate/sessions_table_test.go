package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"text/tabwriter"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/google/go-cmp/cmp"
	"github.com/rivo/uniseg"
)

// TestTableWideCells: a column after a CJK name, an emoji (a joined sequence) or a format
// character shown as U+FFFD starts at the same terminal column on every line. Before, the
// tables were laid out by text/tabwriter, which counts runes: 张伟 (2 runes, 4 columns) pushed
// the next column 2 columns right, 👩‍💻 (3 runes, 2 columns) pulled it 1 left.
//
// The expected table is derived by hand: each ideograph of 张伟 is East Asian Wide, 2 columns;
// 👩‍💻 (woman, zero-width joiner, laptop) is one emoji grapheme, 2 columns; the zero-width space
// in the last name is shown as U+FFFD, 1 column (measured before it was replaced, it would
// count none, and the column after it would start 1 column late). The widest first cell,
// zw�space, is 8 columns, so every first cell is padded to 8 + 2.
func TestTableWideCells(t *testing.T) {
	var out strings.Builder
	tb := newTable(&out)
	fmt.Fprintln(tb, "NAME\tNEXT")
	for _, name := range []string{"张伟", "👩\u200d💻", "bob", "zw\u200bspace"} {
		fmt.Fprintf(tb, "%s\tx\n", cell(name))
	}
	if err := tb.Flush(); err != nil {
		t.Fatal(err)
	}
	// The first cells are 4, 4, 2, 3 and 8 columns wide: padded with 6, 6, 8, 7 and 2 spaces.
	want := "NAME      NEXT\n" +
		"张伟      x\n" +
		"👩\u200d💻        x\n" +
		"bob       x\n" +
		"zw\uFFFDspace  x\n"
	if got := out.String(); got != want {
		t.Errorf("table =\n%s\nwant\n%s", got, want)
	}
}

// TestTableASCIIAsTabwriter: an ASCII table is laid out byte for byte as text/tabwriter lays it
// out, with the settings the sessions commands used: column blocks broken by a line with fewer
// cells, empty cells, a trailing tab, and a last line without a newline.
func TestTableASCIIAsTabwriter(t *testing.T) {
	tests := []struct{ name, in string }{
		{"empty", ""},
		{"uniform", "KEY\tSESSION ID\tN\nagent:main:http:dm:alice\tsa2\t4\nb\tsb1\t12\n"},
		{"key value", "key:\tagent:main:http:dm:a\nprevious session:\t-\nended:\topen\n"},
		{"blocks", "rounds\t3\t(medians)\nwall time\t1.00 s\nturns/s\t100\nlatency\t1 ms\t(deliver)\nmean batch\t1.5\t(groups)\nno tab\nx\ty\tz\n"},
		{"empty cells", "a\t\tc\n\tbb\t\n\t\t\n"},
		{"no final newline", "a\tb\nlonger\tc"},
		{"blank lines", "a\tb\n\nccc\td\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var want, got strings.Builder
			tw := tabwriter.NewWriter(&want, 0, 0, tablePadding, ' ', 0)
			fmt.Fprint(tw, tc.in)
			if err := tw.Flush(); err != nil {
				t.Fatal(err)
			}
			tb := newTable(&got)
			fmt.Fprint(tb, tc.in)
			if err := tb.Flush(); err != nil {
				t.Fatal(err)
			}
			if got.String() != want.String() {
				t.Errorf("table of %q = %q, want tabwriter's %q", tc.in, got.String(), want.String())
			}
		})
	}
}

// TestSessionsWideCharacters: in the text tables of list, show, search and quarantined, the
// columns after a CJK key or user id, an emoji key or message id, and a key holding a
// zero-width space (shown as U+FFFD) start at the same terminal column on every line, as the
// terminal shows them (measured here with uniseg, by grapheme cluster). Before, a column after
// a wide character started further right, and after an emoji sequence further left.
func TestSessionsWideCharacters(t *testing.T) {
	const (
		keyCJK   = "agent:main:http:dm:张伟"
		keyEmoji = "agent:main:http:dm:👩\u200d💻team"
		keyZW    = "agent:main:http:dm:zero\u200bwidth"
		keyASCII = "agent:main:http:dm:alice"
	)
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	var ops []persistence.Op
	for i, s := range []struct{ key, user, msgID, text string }{
		{keyCJK, "张伟", "🍕-1", "pizza 🍕 tonight?"},
		{keyEmoji, "dev👩\u200d💻", "m-2", "pizza for the 👩\u200d💻 team"},
		{keyZW, "zw", "m\u200b3", "pizza, zero width"},
		{keyASCII, "alice", "m4", "pizza please"},
	} {
		id := fmt.Sprintf("s%d", i)
		ops = append(ops,
			&persistence.CreateSession{Session: persistence.Session{ID: id, Key: s.key, Platform: "http", ChatType: "dm",
				ChatID: "c", UserID: s.user, StartedAt: sessAt(i), LastActivityAt: sessAt(i), Epoch: 1}},
			&persistence.AppendMessage{Message: persistence.Message{SessionID: id, Seq: 1, Role: persistence.RoleUser, Content: s.text,
				Platform: "http", ChatID: "c", MessageID: s.msgID, UserID: s.user, Status: persistence.StatusQuarantined,
				Active: true, CreatedAt: sessAt(i)}},
			&persistence.PutRoute{Route: persistence.Route{Key: s.key, SessionID: id, Generation: 1, UpdatedAt: sessAt(i)}},
		)
		if s.key == keyCJK { // a second message: show's MESSAGE ID column holds the emoji and an ASCII id
			ops = append(ops, &persistence.AppendMessage{Message: persistence.Message{SessionID: id, Seq: 2,
				Role: persistence.RoleAssistant, Content: "好的 🍕", Platform: "http", ChatID: "c", MessageID: "m-ok",
				Status: persistence.StatusDone, Active: true, CreatedAt: sessAt(i)}})
		}
	}
	storetest.MustCommit(t, st, ops...)
	st.Close()

	gap := regexp.MustCompile(`  +`)
	for _, args := range [][]string{{"list"}, {"search", "pizza"}, {"quarantined"}, {"show", keyCJK}} {
		t.Run(args[0], func(t *testing.T) {
			out, _ := MustRunSessions(t, append(args, "--data-dir", dir)...)
			if args[0] == "show" {
				_, out, _ = strings.Cut(out, "messages:\n") // the message table
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if len(lines) < 3 {
				t.Fatalf("sessions %s printed %d lines, want a header and rows:\n%s", args[0], len(lines), out)
			}
			// The terminal column at which each cell starts (cells are apart by 2 spaces or
			// more; none of these holds two spaces in a row).
			starts := func(line string) []int {
				cols := []int{0}
				for _, m := range gap.FindAllStringIndex(line, -1) {
					cols = append(cols, uniseg.StringWidth(line[:m[1]]))
				}
				return cols
			}
			want := starts(lines[0])
			for _, l := range lines[1:] {
				if got := starts(l); !cmp.Equal(got, want) {
					t.Errorf("sessions %s: line %q starts its cells at columns %v, want the header's %v:\n%s", args[0], l, got, want, out)
				}
			}
		})
	}
}

// TestSessionsListAfterQuoted: the paging hint of list prints a key holding a format
// character (a right-to-left override, which reorders what the terminal shows), a quote and a
// space Go-quoted inside single quotes, so that nothing reaches the terminal raw and the shell
// hands it back to --after as printed, which reads the quoted form: the next page follows. A
// plain key is printed raw (TestSessionsList). Before, the key raw: the override reached the
// terminal, and the space split the pasted argument.
func TestSessionsListAfterQuoted(t *testing.T) {
	const (
		tricky = "agent:main:http:dm:a\u202eo'brien room"
		next   = "agent:main:http:dm:b"
	)
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatalf("sqlite.Open: %v", err)
	}
	for i, key := range []string{tricky, next} {
		id := fmt.Sprintf("s%d", i)
		storetest.MustCommit(t, st,
			&persistence.CreateSession{Session: persistence.Session{ID: id, Key: key, Platform: "http", ChatType: "dm",
				ChatID: "c", UserID: "u", StartedAt: sessAt(i), LastActivityAt: sessAt(i), Epoch: 1}},
			&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: id, Generation: 1, UpdatedAt: sessAt(i)}},
		)
	}
	st.Close()

	_, errOut := MustRunSessions(t, "list", "--data-dir", dir, "--limit", "1")
	const wantHint = `more: --after '"agent:main:http:dm:a\u202eo\x27brien room"'` + "\n"
	if errOut != wantHint {
		t.Fatalf("list --limit 1 stderr = %q, want %q", errOut, wantHint)
	}
	// The argument as a shell reads the hint pasted on its command line.
	word, err := exec.Command("sh", "-c", `printf %s `+strings.TrimPrefix(strings.TrimSuffix(errOut, "\n"), "more: --after ")).Output()
	if err != nil {
		t.Fatalf("sh: %v", err)
	}
	out, errOut := MustRunSessions(t, "list", "--data-dir", dir, "--limit", "1", "--after", string(word))
	var keys []string
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n")[1:] {
		keys = append(keys, strings.Fields(l)[0])
	}
	if !cmp.Equal(keys, []string{next}) || errOut != "" {
		t.Errorf("list --after %s = keys %q, stderr %q; want the next page, [%s], and no hint", word, keys, errOut, next)
	}

	if _, _, err := runSessions(t, "list", "--data-dir", dir, "--after", `"agent:main:http:dm:\q"`); err == nil || !strings.Contains(err.Error(), "--after") {
		t.Errorf("list --after with a bad quoted key: error %v, want one naming --after", err)
	}
}
