package ansi

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestStrip: escape sequences and the remains of colour codes are taken out, and text that
// reads as a code is kept. A code without the ESC's mark whose bracket a "]" closes before
// another "[" opens or the line ends ("[5m0s]", "[1m, 5m]") is text, also beside a code that
// resets, printed or not ("[33mWARN[0m … retry in [5m0s]"; a literal "[0m" in the text). Before,
// such a code beside a reset was taken out with it: "WARN retry in 0s]", and "retry in [5m0s];
// reset with [0m" lost both codes.
func TestStrip(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"escapes", "\x1b[1;31mERROR\x1b[0m: worker \x1b]8;;https://x.example\x07gpu-0\x1b]8;;\x1b\\ died\x1b[2K", "ERROR: worker gpu-0 died"},
		{"printed codes", "[31mERROR[0m: upstream ^[[1;31mllama^[[0m gone, ␛[33mslot[0m", "ERROR: upstream llama gone, slot"},
		{"an index", "slot [5m] of [10m]", "slot [5m] of [10m]"},
		{"text that reads as codes without their reset", "rate window [1m, 5m] exceeded: retry in [5m0s]", "rate window [1m, 5m] exceeded: retry in [5m0s]"},
		{"such text beside printed codes", "[33mWARN[0m rate window [1m, 5m] exceeded: retry in [5m0s]", "WARN rate window [1m, 5m] exceeded: retry in [5m0s]"},
		{"such text beside a literal reset", "retry in [5m0s]; the terminal was reset with [0m", "retry in [5m0s]; the terminal was reset with [0m"},
		{"a coloured word in brackets", "[[31mERROR[0m] boom", "[[31mERROR[0m] boom"},
		{"a coloured word before a bracket on another line", "[31mERROR[0m boom\nsee [docs] and 1]", "ERROR boom\nsee [docs] and 1]"},
		{"a printed code before a closing bracket", "^[[1mbold] ^[[0m", "bold] "},
		{"prose that writes codes as words (a known cost: closed)", "use [5m to blink, [0m to reset", "use  to blink,  to reset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Strip(tc.in); got != tc.want {
				t.Errorf("Strip(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

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
		"[33mWARN[0m retry in [5m0s]", "retry in [5m0s]; reset with [0m", "[1m, 5m] [0m", "[31mx[0m]\n]",
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
