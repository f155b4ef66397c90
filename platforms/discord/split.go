package discord

import (
	"strings"
	"unicode/utf8"
)

// MaxMessageLen is Discord's limit on the content of one message, in characters.
const MaxMessageLen = 2000

const (
	fence      = "```"
	closeFence = "\n" + fence
	maxLangLen = 16  // a longer info string is not carried over a split
	minLimit   = 100 // below this a split could not make progress with fences reopened
)

// Split cuts text into messages of at most limit characters (runes), preferring a paragraph
// break, then a line break, then a space (outside an inline code span, when the line has one) in
// the second half of each message, and cutting hard only when a message has none. A split
// inside a code block closes the fence at the end of the message and reopens it, with its
// language, at the start of the next, so every message renders on its own. Text that fits is
// returned as is; a longer text never yields a message of only whitespace (Discord refuses one).
func Split(text string, limit int) []string {
	limit = max(limit, minLimit)
	if utf8.RuneCountInString(text) <= limit {
		return []string{text}
	}
	var out []string
	rest := []rune(text)
	var reopen []rune
	for {
		// Only the next limit runes matter: build the candidate message from them.
		window := append(append([]rune(nil), reopen...), rest[:min(len(rest), limit)]...)
		if len(reopen)+len(rest) <= limit {
			if last := string(window); strings.TrimSpace(last) != "" {
				out = append(out, last)
			}
			return out
		}
		from := len(reopen)
		cut := cutAt(window, from, limit)
		open, lang := fenceState(string(window[:cut]))
		if open {
			cut = cutAt(window, from, limit-len(closeFence))
			open, lang = fenceState(string(window[:cut]))
		}
		piece := strings.TrimRight(string(window[:cut]), " \n")
		rest = rest[cut-from:]
		if open {
			piece += closeFence
			reopen = []rune(fence + lang + "\n")
			rest = trimRunes(rest, "\n", 1)
		} else {
			reopen = nil
			rest = trimRunes(rest, "\n", -1)
			rest = trimRunes(rest, " ", 1)
		}
		if strings.TrimSpace(piece) != "" {
			out = append(out, piece)
		}
	}
}

// trimRunes drops up to n (all when n < 0) leading runes of r that are c.
func trimRunes(r []rune, c string, n int) []rune {
	cr, _ := utf8.DecodeRuneInString(c)
	for len(r) > 0 && r[0] == cr && n != 0 {
		r = r[1:]
		n--
	}
	return r
}

// cutAt returns where to end a message of r that may be at most budget runes long, never
// before from (a reopened fence) so every message carries some of the text. A space inside an
// inline code span is taken only when there is no other: cut there, each message holds one
// backtick of the span, and both render wrong.
func cutAt(r []rune, from, budget int) int {
	budget = min(budget, len(r))
	lo := max(from+1, budget/2)
	for _, sep := range []string{"\n\n", "\n"} {
		s := []rune(sep)
		for i := budget - len(s); i >= lo; i-- {
			if matchAt(r, i, s) {
				return i + len(s)
			}
		}
	}
	inSpan := codeSpans(r)
	for _, anySpace := range []bool{false, true} {
		for i := budget - 1; i >= lo; i-- {
			if r[i] == ' ' && (anySpace || !inSpan[i+1]) {
				return i + 1
			}
		}
	}
	return budget
}

// codeSpans returns, for each i up to len(r), whether a cut before r[i] falls inside an inline
// code span of its line (a run of backticks, `x`, closed by a run as long): after the start of
// the run that opens it and before the end of the run that closes it, or of its line when no
// run within r closes it (its closing one may be past r, which holds only the next message's
// worth of the text).
func codeSpans(r []rune) []bool {
	in := make([]bool, len(r)+1)
	mark := func(from, to int) { // cuts before r[from+1] … r[to-1]
		for i := from + 1; i < to; i++ {
			in[i] = true
		}
	}
	opened, open := 0, 0 // where the span being read opened, and its run's length; open 0 outside one
	for j := 0; j < len(r); {
		if r[j] == '\n' && open != 0 {
			mark(opened, j+1)
			open = 0
		}
		if r[j] != '`' {
			j++
			continue
		}
		k := j
		for k < len(r) && r[k] == '`' {
			k++
		}
		switch run := k - j; {
		case open == 0:
			opened, open = j, run
		case run == open:
			mark(opened, k)
			open = 0
		}
		j = k
	}
	if open != 0 {
		mark(opened, len(r)+1)
	}
	return in
}

func matchAt(r []rune, i int, s []rune) bool {
	if i < 0 || i+len(s) > len(r) {
		return false
	}
	for j := range s {
		if r[i+j] != s[j] {
			return false
		}
	}
	return true
}

// fenceState reports whether text ends inside a ``` code block, and that block's language. A
// line that opens a block and closes it again ("```go test ./...```") leaves none open.
func fenceState(text string) (open bool, lang string) {
	for line := range strings.Lines(text) {
		t := strings.TrimSpace(line)
		if !strings.HasPrefix(t, fence) || !open && strings.Contains(strings.TrimLeft(t, "`"), fence) {
			continue
		}
		if open {
			open, lang = false, ""
			continue
		}
		open = true
		lang = strings.TrimSpace(strings.TrimLeft(t, "`"))
		if f := strings.Fields(lang); len(f) > 0 {
			lang = f[0]
		}
		if len(lang) > maxLangLen || strings.Contains(lang, "`") {
			lang = ""
		}
	}
	return open, lang
}
