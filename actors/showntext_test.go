package actors

import "testing"

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
