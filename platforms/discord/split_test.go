package discord

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestSplitKeepsShortTextWhole(t *testing.T) {
	for _, text := range []string{"", "hello", strings.Repeat("é", MaxMessageLen)} {
		got := Split(text, MaxMessageLen)
		if len(got) != 1 || got[0] != text {
			t.Errorf("Split(%d runes) = %d messages, want the text itself", utf8.RuneCountInString(text), len(got))
		}
	}
}

func TestSplitPrefersParagraphsThenLinesThenWords(t *testing.T) {
	para := strings.Repeat("word ", 150) // 750 runes
	cases := []struct {
		name, text string
		first      string // the first message must end with this
	}{
		{"paragraph", para + "\n\n" + para + "\n\n" + para, strings.TrimSpace(para)},
		{"line", strings.Repeat(strings.Repeat("x", 99)+"\n", 30), strings.Repeat("x", 99)},
		{"word", strings.Repeat("abcdefghi ", 300), "abcdefghi"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Split(c.text, MaxMessageLen)
			if len(got) < 2 {
				t.Fatalf("got %d messages, want a split", len(got))
			}
			if !strings.HasSuffix(got[0], c.first) {
				t.Errorf("first message ends %q, want a cut after %q", tail(got[0]), tail(c.first))
			}
			checkSplit(t, c.text, got, MaxMessageLen)
		})
	}
}

func TestSplitHardCutsAWordLongerThanAMessage(t *testing.T) {
	text := strings.Repeat("x", 4500)
	got := Split(text, MaxMessageLen)
	if len(got) != 3 || strings.Join(got, "") != text {
		t.Fatalf("got %d messages joining to %d runes, want 3 joining to the text", len(got), len(strings.Join(got, "")))
	}
}

// TestSplitReopensCodeFences is the 5,000-character reply with a code block of issue #7.
func TestSplitReopensCodeFences(t *testing.T) {
	var b strings.Builder
	b.WriteString("Here is the program you asked for.\n\n```go\n")
	for i := 0; b.Len() < 4200; i++ {
		b.WriteString("\tfmt.Println(\"line of a rather long program\", i)\n")
	}
	b.WriteString("```\n\nAnd that is all: it prints a lot of lines, some of them more than once.")
	text := b.String()
	for len(text) < 5000 {
		text += " More words after the code."
	}
	got := Split(text, MaxMessageLen)
	if len(got) < 3 {
		t.Fatalf("got %d messages, want at least 3", len(got))
	}
	for i, m := range got[1 : len(got)-1] {
		if !strings.HasPrefix(m, "```go\n") {
			t.Errorf("message %d starts %q, want the fence reopened with its language", i+1, m[:min(len(m), 12)])
		}
	}
	checkSplit(t, text, got, MaxMessageLen)
}

// checkSplit asserts every message fits, renders on its own (balanced fences), and that the
// messages carry the whole text: with the added fences removed and whitespace at the cuts
// ignored, they join back to it.
func checkSplit(t *testing.T, text string, msgs []string, limit int) {
	t.Helper()
	for i, m := range msgs {
		if n := utf8.RuneCountInString(m); n > limit {
			t.Errorf("message %d is %d runes, limit %d", i, n, limit)
		}
		if open, _ := fenceState(m); open {
			t.Errorf("message %d leaves a code block open: ...%q", i, tail(m))
		}
	}
	var joined strings.Builder
	reopened := ""
	for i, m := range msgs {
		m = strings.TrimPrefix(m, reopened)
		reopened = ""
		if open, lang := fenceState(strings.TrimSuffix(msgs[i], closeFence)); open && i < len(msgs)-1 {
			m = strings.TrimSuffix(m, closeFence)
			reopened = fence + lang + "\n"
		}
		joined.WriteString(m)
	}
	if squash(joined.String()) != squash(text) {
		t.Errorf("messages do not carry the text:\n got %q\nwant %q", tail(squash(joined.String())), tail(squash(text)))
	}
}

// strip drops whitespace and backticks.
func strip(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '`' || unicode.IsSpace(r) {
			return -1
		}
		return r
	}, s)
}

// subsequence reports whether every rune of a appears in b, in order.
func subsequence(a, b string) bool {
	for _, r := range a {
		i := strings.IndexRune(b, r)
		if i < 0 {
			return false
		}
		b = b[i+utf8.RuneLen(r):]
	}
	return true
}

func squash(s string) string { return strings.Join(strings.Fields(s), "") }

func tail(s string) string {
	if len(s) > 40 {
		return s[len(s)-40:]
	}
	return s
}

func FuzzSplit(f *testing.F) {
	f.Add("hello world", 100)
	f.Add("```py\n"+strings.Repeat("print(1)\n", 40)+"```\ntext", 120)
	f.Add(strings.Repeat("ü ", 300), 150)
	f.Fuzz(func(t *testing.T, text string, limit int) {
		if !utf8.ValidString(text) || limit < minLimit || limit > 4000 {
			t.Skip()
		}
		got := Split(text, limit)
		for i, m := range got {
			if n := utf8.RuneCountInString(m); n > limit {
				t.Fatalf("message %d is %d runes, limit %d", i, n, limit)
			}
		}
		// Splitting only adds fences (and their language): every other character of the text
		// is still there, in order.
		if !subsequence(strip(text), strip(strings.Join(got, ""))) {
			t.Fatalf("messages lost part of the text:\n got %q\nfrom %q", got, text)
		}
	})
}

// TestSplitNeverYieldsWhitespaceMessages: Discord refuses a message of only whitespace (50006),
// so a reply with a long run of blanks must not become one.
func TestSplitNeverYieldsWhitespaceMessages(t *testing.T) {
	for _, text := range []string{
		"start" + strings.Repeat(" ", 4500) + "end",
		"start" + strings.Repeat("\n", 4500) + "end",
		strings.Repeat("word ", 500) + strings.Repeat(" ", 3000),
	} {
		got := Split(text, MaxMessageLen)
		for i, m := range got {
			if strings.TrimSpace(m) == "" {
				t.Errorf("message %d of %d is only whitespace (%d runes)", i, len(got), utf8.RuneCountInString(m))
			}
		}
		if squash(strings.Join(got, "")) != squash(text) {
			t.Errorf("messages do not carry the text")
		}
	}
}

// TestSplitOneLineFence: a block opened and closed on one line ("```go test ./...```") is
// closed in Discord's markdown, so a later cut adds no fences around prose.
func TestSplitOneLineFence(t *testing.T) {
	text := "Run it like this:\n```go test ./...```\n\n" + strings.Repeat("Plain prose sentence here. ", 120)
	got := Split(text, MaxMessageLen)
	if len(got) < 2 {
		t.Fatalf("got %d messages, want a split", len(got))
	}
	for i, m := range got {
		if strings.HasSuffix(m, closeFence) || i > 0 && strings.HasPrefix(m, fence) {
			t.Errorf("message %d got a fence added although no block spans the cut: starts %q, ends %q", i, m[:min(20, len(m))], tail(m))
		}
	}
	checkSplit(t, text, got, MaxMessageLen)
}

// TestCapParts: a reply longer than MaxReplyParts messages keeps its first MaxReplyParts and a
// last one that says how much was cut; a shorter one is untouched.
func TestCapParts(t *testing.T) {
	long := Split(strings.Repeat("word ", 6000), MaxMessageLen) // ~30,000 runes: 16 messages
	if len(long) <= MaxReplyParts {
		t.Fatalf("test text splits into %d messages, want more than %d", len(long), MaxReplyParts)
	}
	got := capParts(long)
	if len(got) != MaxReplyParts+1 || !strings.Contains(got[MaxReplyParts], "the reply goes on for about") {
		t.Errorf("capped to %d messages ending %q, want %d and a note", len(got), tail(got[len(got)-1]), MaxReplyParts+1)
	}
	for i := range MaxReplyParts {
		if got[i] != long[i] {
			t.Errorf("message %d changed", i)
		}
	}
	if short := Split("hello", MaxMessageLen); len(capParts(short)) != 1 {
		t.Error("a short reply was changed")
	}
}

// TestSplitKeepsInlineCodeWhole: a long line is cut at a space outside its inline code spans
// when it has one within the limit, so that each message has its backticks paired; before, the
// last space before the limit was taken, inside `a span` when one ran over the limit, and both
// messages rendered wrong. A line with no space outside a span is still cut at one in it.
func TestSplitKeepsInlineCodeWhole(t *testing.T) {
	words := strings.Repeat("word ", 396) // 1,980 runes: the spans below run over the limit
	cases := []struct {
		name, text string
		first      string // the first message must end with this
	}{
		{"single backticks", words + "run `go test -race -count=1 ./platforms/discord` to check " + words,
			strings.TrimSpace(words) + " run"},
		{"double backticks", words + "type ``a ` b c d e f`` here " + words,
			strings.TrimSpace(words) + " type"},
		{"after a span closed", strings.Repeat("word ", 395) + "a `b c` d e `f g h i j k l m n o p q r s t`",
			"a `b c` d e"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Split(c.text, MaxMessageLen)
			if len(got) < 2 {
				t.Fatalf("got %d messages, want a split", len(got))
			}
			if !strings.HasSuffix(got[0], c.first) {
				t.Errorf("first message ends %q, want a cut after %q", tail(got[0]), tail(c.first))
			}
			checkSplit(t, c.text, got, MaxMessageLen)
		})
	}
	t.Run("no space outside the span", func(t *testing.T) {
		text := "`" + strings.Repeat("code ", 500) + "`"
		got := Split(text, MaxMessageLen)
		if len(got) != 2 || !strings.HasSuffix(got[0], "code") {
			t.Errorf("got %d messages, the first ending %q, want 2, cut at a space in the span", len(got), tail(got[0]))
		}
		checkSplit(t, text, got, MaxMessageLen)
	})
}
