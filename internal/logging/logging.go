// Package logging builds agentgate's one slog handler (tint text, or JSON) and holds the
// attribute keys every package logs with, so that log lines stay greppable across packages.
// It imports nothing from agentgate.
package logging

import (
	"io"
	"log/slog"
	"os"

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
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
	}
	return slog.New(tint.NewTextHandler(w, &tint.Options{
		Level:      level,
		TimeFormat: TimeFormat,
		NoColor:    !IsTerminal(w) || os.Getenv("NO_COLOR") != "",
	}))
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
