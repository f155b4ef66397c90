package openai

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestSanitizeReadsABoundedStart: sanitize reads the first maxSanitized bytes of a text, and
// bodyText the first maxErrorBody of a body, whatever their length (a stream's error event may
// be 32 MiB): what they allocate does not grow with it, and the message is the one the text's
// start makes. Before, an error event of 32 MiB in colour was read whole by ansi.Strip,
// redact's rules and opaqueToken, over a minute of a CPU for each attempt of a turn, which
// retried it as a fault of the server.
func TestSanitizeReadsABoundedStart(t *testing.T) {
	const key = "sk-test-4f9c2d7e1b8a6035c9e7d2f1a4b6c8e0"
	line := "\x1b[31mERROR\x1b[0m worker died, key " + key + " "
	long := strings.Repeat(line, (32<<20)/len(line))
	want := sanitize(strings.Repeat(line, 10), key)
	if !strings.HasPrefix(want, "ERROR worker died, key [redacted] ERROR") {
		t.Fatalf("sanitize = %q", want)
	}
	page := []byte("<p>" + long)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	got := sanitize(long, key)
	text, _, _ := bodyText(page)
	runtime.ReadMemStats(&after)
	if got != want {
		t.Errorf("sanitize of 32 MiB = %q, want %q", got, want)
	}
	if len(text) > maxErrorBody {
		t.Errorf("bodyText of a page of 32 MiB is %d bytes, want at most %d", len(text), maxErrorBody)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 4<<20 {
		t.Errorf("sanitize and bodyText of 32 MiB allocated %d MiB, want at most 4 (what their bounded starts take; the race detector adds)", n>>20)
	}
}

// FuzzStringHead decodes the start of any JSON string as encoding/json writes it: never a
// panic, never past n bytes of the string's JSON, and always a start of the text, cut before an
// escape the cut would split, never inside one.
//
// Run it with make fuzz FUZZ=FuzzStringHead PKG=./agents/openai.
func FuzzStringHead(f *testing.F) {
	for _, s := range []string{"model overloaded", "line one\nline two", `a "quoted" word`, "café 😀", "<b>&</b>", "\u2028\x00\x1b[31m", ""} {
		f.Add(s, 8)
	}
	f.Fuzz(func(t *testing.T, s string, n int) {
		if !utf8.ValidString(s) || n < 1 {
			return // encoding/json writes U+FFFD for a bad byte; bodyText reads at least 1 byte
		}
		enc, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		got := string(stringHead(enc, n))
		if !strings.HasPrefix(s, got) {
			t.Fatalf("stringHead(%s, %d) = %q, not a start of %q", enc, n, got, s)
		}
		if whole, _ := json.Marshal(got); len(whole) > max(n+1, 2) && len(enc) > n+1 {
			t.Fatalf("stringHead(%s, %d) = %q, past %d bytes of its JSON", enc, n, got, n)
		}
		if len(enc) <= n+1 && got != s {
			t.Fatalf("stringHead(%s, %d) = %q, want all of %q", enc, n, got, s)
		}
	})
}

// TestStringHeadCutsAtAWordEnd: a JSON string longer than the bound is cut at its last white
// space before the bound when that is close (within wordCut bytes and a quarter of the text),
// else where the bound falls; one within the bound is whole.
func TestStringHeadCutsAtAWordEnd(t *testing.T) {
	long := strings.Repeat("x", 200)
	for _, tc := range []struct {
		name, s string
		n       int
		want    string
	}{
		{"words", "model overloaded, try again later", 26, "model overloaded, try"},
		{"a line", "model overloaded\ntry again later", 22, "model overloaded"},
		{"whole", "model overloaded", 40, "model overloaded"},
		{"a word too long", "error: " + long, 100, "error: " + long[:92]},
		{"a space too early", "a bcdefghijklmnop", 12, "a bcdefghij"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			enc, err := json.Marshal(tc.s)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(stringHead(enc, tc.n)); got != tc.want {
				t.Errorf("stringHead(%s, %d) = %q, want %q", enc, tc.n, got, tc.want)
			}
		})
	}
}
