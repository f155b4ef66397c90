package actors

import (
	"testing"
	"unicode/utf8"
)

// TestShownText: an agent's text is stored and sent valid UTF-8, without control characters
// but tab, line feed, carriage return and ESC, its NULs as U+FFFD; text without any of them
// is returned as it is.
func TestShownText(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "héllo, wörld 👋", "héllo, wörld 👋"},
		{"kept controls", "a\tb\r\nc\x1b[31md\x1b[0m", "a\tb\r\nc\x1b[31md\x1b[0m"},
		{"C0, DEL and C1", "a\x07b\x08c\x7fd\u0085e\u009bf", "abcdef"},
		{"NUL", "a\x00b", "a\uFFFDb"},
		{"not UTF-8", "a\xffb\xc3", "a\uFFFDb\uFFFD"},
		{"a surrogate's bytes", "a\xed\xa0\x80b", "a\uFFFDb"},
		{"only controls", "\x07\x01\x02", ""},
		{"noncharacters and format characters stay", "a\uFFFEb\u200dc\u202ed", "a\uFFFEb\u200dc\u202ed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := shownText(tc.in); got != tc.want {
				t.Errorf("shownText(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// TestShownGrowth: a streaming reply's text cleaned as it grows, a byte at a time or all at
// once, shows what shownText shows of it whole, less an unfinished end (half a character, bad
// bytes), which is shown once the text goes on; a text that does not go on from the last one
// is cleaned anew.
func TestShownGrowth(t *testing.T) {
	for _, text := range []string{
		"héllo 👋 wörld",
		"a\x07b\x00c\x1b[1md\u0085e",
		"a\xff\xfeb\xf0\x9f\x98\x80c\xed\xa0\x80",
		"\xf0\x9f\x98\x80\xc3",
		"\uFFFD\x07",
	} {
		var g shownGrowth
		for i := 0; i <= len(text); i++ {
			if got, want := g.of(text[:i]), shownText(finished(text[:i])); got != want {
				t.Errorf("of(%q) after its prefixes = %q, want %q", text[:i], got, want)
			}
		}
		var whole shownGrowth
		if got, want := whole.of(text), shownText(finished(text)); got != want {
			t.Errorf("of(%q) = %q, want %q", text, got, want)
		}
		if got, want := g.of("x"+text), shownText(finished("x"+text)); got != want {
			t.Errorf("of(%q) after %q = %q, want %q", "x"+text, text, got, want)
		}
	}
}

// finished is s without the bytes at its end that are no whole rune.
func finished(s string) string {
	for s != "" {
		if r, size := utf8.DecodeLastRuneInString(s); r != utf8.RuneError || size > 1 {
			break
		}
		s = s[:len(s)-1]
	}
	return s
}
