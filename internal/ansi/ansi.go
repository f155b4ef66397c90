// Package ansi takes ANSI escape sequences (colours, cursor moves, links) and what a proxy or a
// logger left of a colour code whose ESC it dropped or printed ("[31m", "^[[0m") out of text
// that agentgate quotes in an error or a log line but did not write: the error a model endpoint
// answered, the stderr of a failed exec command. Both agents use this one function, so that
// what one takes out the other does too. It takes nothing out that reads as text: a code that
// "]" follows ("[5m]"), or one without the ESC's mark whose bracket a "]" closes ("retry in
// [5m0s]") or that no other such resets.
//
// The package is pure (no I/O, no goroutines; safe for concurrent use) and imports nothing from
// agentgate.
package ansi

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ansiEscape matches an ANSI escape sequence (ECMA-48), which a server that logs in colour
// puts in its error messages too (a Python engine's traceback, a Rust server's tracing
// output), and a command in what it writes to stderr: a CSI ("\x1b[31m", "\x1b[2K", also as the one-byte C1 CSI), an
// OSC ended by BEL or ST ("\x1b]8;;https://…\x07", a link), a character set's ("\x1b(B",
// which tput sgr0 puts before "\x1b[m"), or another escape of two bytes.
var ansiEscape = regexp.MustCompile(`\x1b\[[0-?]*[ -/]*[@-~]|\x{9b}[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[ -/]+[0-~]|\x1b[@-Z\\-_]`)

// printedColour matches what is left of a colour code (SGR) whose ESC a proxy or logger dropped
// or printed ("[31m", "[1;31m", "[0m", after "␛" or "^["), which Strip takes out when no "]"
// follows it (an index such as "[5m]" is text), and, for one that is no more than "[31m",
// when a "]" does not close its bracket before another "[" opens or the line ends (closed:
// "retry in [5m0s]", "windows [1m, 5m]" are text, a coloured word's code is followed by the
// word and the "[" of the code that ends it), and when the text holds two such, one of which
// resets (sgrReset): a logger that colours a word writes its code and the one that ends it,
// while such a code without its reset is more likely text (found by a review: "retry in
// [5m0s]" read "retry in 0s]"; and beside a reset, printed or literal, it still did until
// closed). Its groups are the ESC's mark and the code's parameters.
var printedColour = regexp.MustCompile(`(\x{241b}|\^\[)?\[(\d{1,3}(?:;\d{1,3})*)m`)

// sgrReset reports whether the parameters of a colour code, params ("0", "1;31"), end a colour
// or a style: all of them (0), bold or dim (22), italic, underline, blink, inverse, hidden,
// crossed out (23 to 29), the foreground's (39) or the background's colour (49).
func sgrReset(params string) bool {
	for p := range strings.SplitSeq(params, ";") {
		if n, _ := strconv.Atoi(p); n == 0 || (n >= 22 && n <= 29) || n == 39 || n == 49 {
			return true
		}
	}
	return false
}

// closed reports whether a "]" closes the bracket of the code without the ESC's mark that
// ends at end in s before another "[" opens or the line ends: "[5m0s]", "[1m, 5m]", text that
// reads as a code. A coloured word's code is followed by the word, then the "[" of the code
// that ends it ("[31mERROR[0m"). The cost is a coloured word whose text closes a bracket
// before the code that ends it ("[31mlist]" … "[0m"): its codes are shown, not its text eaten.
// Prose that writes codes as words ("[5m to blink, [0m to reset") still loses them: what
// follows such a code, a space, follows a real one too (Rust's tracing pads its level,
// "[32m INFO[0m"), and codes shown in each such line would cost more than the rare words lost.
func closed(s string, end int) bool {
	i := strings.IndexAny(s[end:], "[]\n")
	return i >= 0 && s[end+i] == ']'
}

// Strip returns s without its ANSI escape sequences (ansiEscape) and the remains of colour
// codes (printedColour). Before, the openai agent made an ESC a space and kept the rest, so
// "\x1b[31mERROR\x1b[0m" reached the user's log line as "[31mERROR [0m".
func Strip(s string) string {
	if !strings.ContainsAny(s, "\x1b\u009b[") {
		return s
	}
	s = ansiEscape.ReplaceAllString(s, "")
	codes := printedColour.FindAllStringSubmatchIndex(s, -1)
	codes = slices.DeleteFunc(codes, func(m []int) bool {
		return (m[1] < len(s) && s[m[1]] == ']') || (m[2] < 0 && closed(s, m[1]))
	})
	bare, reset := 0, false // codes without the ESC's mark, and whether one of them resets
	for _, m := range codes {
		if m[2] < 0 {
			bare++
			reset = reset || sgrReset(s[m[4]:m[5]])
		}
	}
	var b strings.Builder
	last := 0
	for _, m := range codes {
		if m[2] < 0 && (bare < 2 || !reset) {
			continue
		}
		b.WriteString(s[last:m[0]])
		last = m[1]
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}
