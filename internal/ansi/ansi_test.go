package ansi

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzStrip takes colour codes out of any text as Strip does: never a panic, never a longer
// text, valid UTF-8 kept valid, and a text without an ESC or a code's reset kept (moved from
// the openai agent's FuzzStripColours, with its seeds).
//
// Run it with make fuzz FUZZ=FuzzStrip PKG=./internal/ansi.
func FuzzStrip(f *testing.F) {
	for _, s := range []string{
		"\x1b[31mERROR\x1b[0m: boom", "[31mERROR[0m", "^[[1;31mx^[[0m", "␛[33mslot[0m [5m]",
		"\x1b]8;;https://example.com\x07link\x1b]8;;\x1b\\", "\x1b(B\x1b[m", "\u009b31mx", "\x1b]unterminated",
		"retry in [5m0s]", "a[31m", "[1;2;3;4;5;6;7;8;9;0m", "[999m[0m", "\x1b[\x1b[31m31m",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := Strip(s)
		if len(got) > len(s) {
			t.Fatalf("Strip(%q) = %q, longer", s, got)
		}
		if utf8.ValidString(s) && !utf8.ValidString(got) {
			t.Fatalf("Strip(%q) = %q, not UTF-8", s, got)
		}
		// No ESC, nor its mark, nor a reset's digits (0, 22 to 29, 39, 49: sgrReset).
		if !strings.ContainsAny(s, "\x1b\u009b\u241b^029") && got != s {
			t.Fatalf("Strip(%q) = %q, want it kept: no escape, no reset", s, got)
		}
	})
}
