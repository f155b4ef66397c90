// Package logging builds agentgate's one slog handler (tint text, or JSON) and holds the
// attribute keys every package logs with, so that log lines stay greppable across packages.
// It imports nothing from agentgate.
package logging

import (
	"encoding"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/lmittmann/tint"
)

// Attribute keys. Log with these rather than string literals.
const (
	KeyComponent = "component"  // subsystem: actors, persistence, http, discord…
	KeyActor     = "actor"      // actor name inside the actor system
	KeySession   = "session"    // session key
	KeyPlatform  = "platform"   // platform name
	KeyChat      = "chat"       // platform chat id
	KeyErr       = "err"        // an error, always through Err
	KeyTurn      = "turn"       // turn id
	KeyMessage   = "message_id" // a chat message's id on its platform (the id of a Deliver)
	KeyKind      = "kind"       // message or actor kind
)

// TimeFormat is the text handler's timestamp: wall-clock time to the millisecond, enough to
// order lines of one run without the date noise.
const TimeFormat = "15:04:05.000"

// New returns a logger writing to w at level. Format "json" selects slog's JSON handler; any
// other format selects tint's text handler, coloured only when w is a terminal and NO_COLOR
// is unset or empty. Pass a *slog.LevelVar as level to change it at run time.
func New(w io.Writer, level slog.Leveler, format string) *slog.Logger {
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: durationText}))
	}
	return newText(w, level, IsTerminal(w) && os.Getenv("NO_COLOR") == "")
}

// newText is New's text handler, coloured or not.
func newText(w io.Writer, level slog.Leveler, color bool) *slog.Logger {
	opts := &tint.Options{Level: level, TimeFormat: TimeFormat, NoColor: !color}
	if color {
		opts.ReplaceAttr = defuseEscapes
	}
	return slog.New(tint.NewTextHandler(w, opts))
}

// durationText writes a duration as the text log does ("1m30s"): slog's JSON handler writes
// it as a count of nanoseconds, which an operator reads as a timestamp or not at all, and which
// names no unit beside keys such as "in" or "after" (found by an audit).
func durationText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// defuseEscapes keeps a logged value from writing escape sequences to the terminal. Coloured,
// tint quotes a value that needs it and then turns every \x1b of the quoted text back into
// a raw ESC, so that its own colours survive: an ESC in a value (an agent's stderr, a model
// endpoint's error), and even the four characters \x1b in one (a chat id an HTTP client
// chose), reached the terminal as a real escape sequence that could clear the screen, move the
// cursor over earlier lines or retitle the window. So a value's ESC is shown as U+241B (␛), and
// its text \x1b as \x1B, which tint leaves alone. Uncoloured, tint strips escapes itself.
func defuseEscapes(_ []string, a slog.Attr) slog.Attr {
	var s string
	switch a.Value.Kind() {
	case slog.KindString:
		s = a.Value.String()
	case slog.KindAny:
		switch v := a.Value.Any().(type) {
		case encoding.TextMarshaler:
			b, err := v.MarshalText()
			if err != nil {
				return a
			}
			s = string(b)
		case []byte:
			s = string(v)
		default:
			s = fmt.Sprintf("%+v", v) // as tint prints it
		}
	default:
		return a // numbers, times, durations: nothing to defuse
	}
	if !strings.Contains(s, `\x1b`) && !strings.Contains(s, "\x1b") {
		return a
	}
	s = strings.ReplaceAll(s, `\x1b`, `\x1B`)
	s = strings.ReplaceAll(s, "\x1b", "\u241b")
	return slog.String(a.Key, s)
}

// Err returns the attribute for logging err under KeyErr, shown in red by the text handler.
func Err(err error) slog.Attr {
	return tint.Err(err)
}

// IsTerminal reports whether w is a character device, such as a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
