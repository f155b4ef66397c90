package exec

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/agentgate/agentgate/internal/ansi"
	"github.com/agentgate/agentgate/internal/redact"
)

// minSecret is the shortest value of a withheld variable that is redacted: a shorter one would
// blot out common words, and no token is that short.
const minSecret = 4

// redactor makes a command's output fit for a log line: its colour codes taken out, the
// values of the variables withheld from it (the daemon's own secrets, Config.Withhold), the
// passwords of URLs and key-like strings (redact.String's rules) replaced by [redacted]. It is
// a pointer in Agent, so that %v of an Agent never prints the values.
type redactor struct {
	values []string
}

// newRedactor returns the redactor of the values getenv gives the names in withhold.
func newRedactor(withhold []string, getenv func(string) string) *redactor {
	r := &redactor{}
	for _, name := range withhold {
		if v := strings.TrimSpace(getenv(name)); len(v) >= minSecret {
			r.values = append(r.values, v)
		}
	}
	return r
}

// maxFragment is the longest run of token characters at the start of a cut tail that tail
// drops: the end of a secret cut in two, which nothing can recognise. A longer run is data (a
// blob of base64, a row of dashes), and a line of it may be what the operator needs.
const maxFragment = 256

// tail returns what w kept, redacted. When w dropped the output's start, a short run of token
// characters at the start of what it kept is dropped too (or, when its first word has an @ at
// most maxFragment bytes in, all of the word before its last @), with "…" in its place (so the
// result may be 3 bytes longer than w.max), unless what it kept begins at a line's start
// (atLine); the end of a withheld value it begins with is dropped in any case.
func (r *redactor) tail(w *tailBuffer) string {
	s := w.String()
	if w.cut {
		s = strings.TrimLeft(s, "\uFFFD") // a character cut in two
		if n := r.cutSecret(s); n > 0 {
			// The end of a withheld value, whatever characters it holds (a password's "!@#"
			// stopped the token run below short of it: a review's finding).
			return r.redact("…" + s[n:])
		}
		if w.atLine {
			return r.redact(s) // its first word is whole
		}
		// The end of a URL cut before its password was (…res://agent:s3cret@db): redact.String
		// needs the scheme to see a URL's password, which it runs to the last @ of the word
		// (a password may hold / ? #). What follows the @ may be long (a query): only what is
		// dropped is bounded.
		word := s
		if i := strings.IndexFunc(s, func(c rune) bool { return unicode.IsSpace(c) || strings.ContainsRune(`"'<>`, c) }); i >= 0 {
			word = s[:i]
		}
		if at := strings.LastIndexByte(word, '@'); at > 0 && at <= maxFragment {
			return r.redact("…" + s[at:])
		}
		i := strings.IndexFunc(s, func(c rune) bool { return !tokenChar(c) })
		if i < 0 {
			i = len(s)
		}
		if i > 0 && i <= maxFragment {
			s = "…" + s[i:]
		}
	}
	return r.redact(s)
}

// stderrEnd returns the end of what the stderr buffer w kept, redacted, as errors and lines
// above Debug show it: its last MaxStderrLogged bytes (tailBuffer.last), after a note of how
// many bytes the command wrote before them when there were any.
func (r *redactor) stderrEnd(w *tailBuffer) string {
	end := w.last(MaxStderrLogged)
	if before := end.written - int64(len(end.buf)); before > 0 {
		return fmt.Sprintf("[first %d bytes cut] %s", before, r.tail(end))
	}
	return r.tail(end)
}

// cutSecret returns the length of the longest end of a withheld value, minSecret bytes or
// more, that s begins with: what a cut at the start of a tail left of the value; 0 for none.
func (r *redactor) cutSecret(s string) int {
	longest := 0
	for _, v := range r.values {
		for n := len(v) - 1; n >= minSecret && n > longest; n-- {
			if strings.HasPrefix(s, v[len(v)-n:]) {
				longest = n
				break
			}
		}
	}
	return longest
}

// tokenChar reports whether c can be part of a key or a token (base64, base64url, hex, JWT).
func tokenChar(c rune) bool {
	return c < unicode.MaxASCII && (unicode.IsLetter(c) || unicode.IsDigit(c) || strings.ContainsRune("_-.+/=~", c))
}

// redact returns s without ANSI escape sequences and the remains of colour codes (ansi.Strip:
// a command that colours its log lines, as a logger does when FORCE_COLOR or its own setting
// asks, or a tool that always does), and with the withheld values, the passwords of URLs and
// key-like strings replaced by [redacted]. The withheld values are found before the codes
// are taken out, so that one that holds what reads as a code ("pa[1mss[0m") is found whole,
// and again after, with redact's other rules, which read the text as its reader does (a code
// between "Bearer" and its token hid the token from them). Before, the codes stayed, and a
// failed command's error read "␛[31mERROR␛[0m: …" on a coloured log line ("\x1b[31m" on
// another). The keys redact knows by their prefix that the text held before the codes were
// taken out (redact.Keys) are replaced last: a code taken out from between a word and a key
// ("link␛]8;;…␛\sk-…", "x␛[2~ghp_…") joined them, and the rules, which want a key's prefix
// to start a word, left the key whole; the rules go first, so that a key a code cut in two
// ("sk-abcdefgh␛[0mijkl") is replaced whole, not its end left after its start
// (TestStderrKeyAfterAnEscapeSequenceIsRedacted).
func (r *redactor) redact(s string) string {
	s = redact.Values(s, r.values...)
	keys := redact.Keys(s)
	return redact.Values(redact.String(ansi.Strip(s), r.values...), keys...)
}
