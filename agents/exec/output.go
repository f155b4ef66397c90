package exec

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"unicode"
	"unicode/utf8"
)

// Output limits.
const (
	// MaxReply is the most bytes of stdout kept as the reply. Output beyond it is read and
	// discarded (so the command never blocks on a full pipe) and the reply ends with
	// TruncatedSuffix.
	MaxReply = 1 << 20
	// MaxOutput is the most bytes of stdout read: a command that writes more is stopped as it
	// is on a timeout, and its reply is the first MaxReply bytes. Read and discarded to the
	// end, a command printing in a loop took the daemon's CPU until its timeout (10 minutes
	// by default), and its reply was then thrown away as none.
	MaxOutput = 16 * MaxReply
	// MaxStderr is how many trailing bytes of stderr are kept: all of them are logged at
	// Debug, and the end of them (MaxStderrLogged) in errors and lines above Debug.
	MaxStderr = 4 << 10
	// MaxStderrLogged is how many trailing bytes of stderr a failed command's error (the err
	// of its turn's WRN line) and the WRN line of one that timed out show, after a note of the
	// bytes before them: the last lines, which most often say why it failed. The whole of
	// MaxStderr in one attribute made a line of 4 KiB, for each failed turn.
	MaxStderrLogged = 1 << 10
	// MaxStderrRead is the most bytes of stderr read: a command that writes more is stopped as
	// it is on a timeout, and its turn fails. Read and discarded to the end, as stdout was
	// before MaxOutput, a command printing to stderr in a loop took most of a core of the
	// daemon until its timeout. It is larger than MaxOutput: stderr is a log, and a verbose
	// one (an HTTP client's debug lines) must not fail a turn that would succeed.
	MaxStderrRead = 4 * MaxOutput
	// MaxStdoutLogged is how many trailing bytes of stdout a failed command's error keeps
	// (ExitError.Stdout), and the log of one that timed out: what it printed last, most
	// often why it failed.
	MaxStdoutLogged = 2 << 10
	// TruncatedSuffix ends a reply whose stdout was longer than MaxReply.
	TruncatedSuffix = "\n[reply truncated]"
)

// headBuffer keeps the first max bytes written to it and counts the rest. It is written by one
// os/exec goroutine and read only after Wait returns.
type headBuffer struct {
	max       int
	buf       []byte
	truncated bool
	// Past limit bytes written, runaway is called once (a nil runaway: no limit).
	limit   int64
	written int64
	runaway func()
}

func (w *headBuffer) Write(p []byte) (int, error) {
	w.written += int64(len(p))
	if w.runaway != nil && w.written > w.limit {
		w.runaway()
		w.runaway = nil
	}
	room := w.max - len(w.buf)
	if len(p) > room {
		w.truncated = true
		w.buf = append(w.buf, p[:room]...)
		return len(p), nil
	}
	w.buf = append(w.buf, p...)
	return len(p), nil
}

// reply returns the reply text: the kept bytes without trailing white space, marked when the
// output was cut. Bytes that are not UTF-8 (a command printing Latin-1, or binary) become
// U+FFFD: the reply is stored as text (PostgreSQL refuses invalid UTF-8) and shown in chats.
// U+FFFD takes three bytes where a stray byte took one, so the replaced text is cut to max
// again: the reply never exceeds max bytes and the suffix.
func (w *headBuffer) reply() string {
	b := w.buf
	truncated := w.truncated
	if truncated {
		b = trimPartialRune(b)
	}
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	if len(s) > w.max {
		s, truncated = string(trimPartialRune([]byte(s[:w.max]))), true
	}
	s = strings.TrimRightFunc(s, unicode.IsSpace)
	if truncated {
		s += TruncatedSuffix
	}
	return s
}

// tailBuffer keeps the last max bytes written to it. It is written by one os/exec goroutine and
// read only after Wait returns.
type tailBuffer struct {
	max int
	buf []byte
	cut bool // bytes before the kept ones were dropped
	// atLine is set when the kept bytes begin at a line's start (last): the cut split no token
	// or URL, only, maybe, a withheld value of several lines.
	atLine bool
	// Past limit bytes written, runaway is called once (a nil runaway: no limit).
	limit   int64
	written int64
	runaway func()
}

func (w *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	w.written += int64(n)
	if w.runaway != nil && w.written > w.limit {
		w.runaway()
		w.runaway = nil
	}
	if len(p) >= w.max {
		w.cut = w.cut || len(p) > w.max || len(w.buf) > 0
		w.buf = append(w.buf[:0], p[len(p)-w.max:]...)
		return n, nil
	}
	if over := len(w.buf) + len(p) - w.max; over > 0 {
		w.cut = true
		w.buf = append(w.buf[:0], w.buf[over:]...)
	}
	w.buf = append(w.buf, p...)
	return n, nil
}

// last returns the last n bytes w kept, as a tailBuffer of their own that begins at a line's
// start when one begins in the first quarter of them; w itself when it kept no more than n.
func (w *tailBuffer) last(n int) *tailBuffer {
	if len(w.buf) <= n {
		return w
	}
	b := w.buf[len(w.buf)-n:]
	i := bytes.IndexByte(b[:n/4], '\n')
	if i >= 0 {
		b = b[i+1:]
	}
	return &tailBuffer{max: n, buf: b, cut: true, atLine: i >= 0, written: w.written}
}

// String returns the kept tail as valid UTF-8 (the cut may have split a rune).
func (w *tailBuffer) String() string {
	return strings.ToValidUTF8(string(w.buf), "\uFFFD")
}

// trimPartialRune drops an incomplete UTF-8 sequence at the end of b, left by cutting b at a
// byte limit.
func trimPartialRune(b []byte) []byte {
	for i := 1; i < utf8.UTFMax && i <= len(b); i++ {
		if utf8.RuneStart(b[len(b)-i]) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			return b
		}
	}
	return b
}

// pipeEnd is the writer os/exec copies one of the command's output pipes into. It notes
// whether that copy ended on a pipe closed under it rather than at its end: the pipe was held
// open after the command exited, by a process it started, until cmd.WaitDelay ran out. Wait
// says so (osexec.ErrWaitDelay) only of a command that succeeded; of a failed one it reports
// the exit status alone, and the turn's wait of kill_grace went unsaid.
type pipeEnd struct {
	w   io.Writer
	cut atomic.Bool
}

func (p *pipeEnd) Write(b []byte) (int, error) { return p.w.Write(b) }

// ReadFrom is what os/exec's copy calls (io.Copy into a writer that has it), so it sees how
// the pipe's reads ended, which Write does not.
func (p *pipeEnd) ReadFrom(r io.Reader) (int64, error) {
	n, err := io.Copy(p.w, struct{ io.Reader }{r}) // (not through ReadFrom again)
	if errors.Is(err, os.ErrClosed) {
		p.cut.Store(true)
	}
	return n, err
}
