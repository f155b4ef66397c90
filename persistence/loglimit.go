package persistence

import (
	"log/slog"

	"github.com/agentgate/agentgate/internal/logging"
)

// lineLimits holds back the lines a lasting failure repeats (a full disk or an unreadable
// spool would log them at every commit, or at every replay tick, each second): each message
// is logged at most once per logging.LimitEvery, and the lines held back meanwhile are counted
// (not logged at Debug: LogQuiet) and reported once its window has passed (repeats,
// repeats_from, repeats_to: logging.Limiter), or as the persistence actor stops. The
// persistence actor owns it; it is not safe for concurrent use.
type lineLimits map[string]*logging.Limiter

// log logs msg at level unless it was logged within logging.LimitEvery; the lines held back are
// reported, with how many they were, once its window has passed.
func (ls *lineLimits) log(log *slog.Logger, level slog.Level, msg string, args ...any) {
	if *ls == nil {
		*ls = lineLimits{}
	}
	l := (*ls)[msg]
	if l == nil {
		l = &logging.Limiter{}
		(*ls)[msg] = l
	}
	l.LogQuiet(log, level, msg, args...)
}

// flush reports the lines held back (logging.Limiter.Flush): the persistence actor calls it as
// it stops.
func (ls lineLimits) flush() {
	for _, l := range ls {
		l.Flush()
	}
}

// ok says that what msg reports has stopped failing: its next failure is logged at once.
func (ls lineLimits) ok(msg string) {
	if l := ls[msg]; l != nil {
		l.Reset()
	}
}
