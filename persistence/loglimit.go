package persistence

import (
	"context"
	"log/slog"

	"github.com/agentgate/agentgate/internal/logging"
)

// lineLimits holds back the lines a lasting failure repeats (a full disk or an unreadable
// spool would log them at every commit, or at every replay tick, each second): each message
// is logged at most once per logging.LimitEvery, and the lines held back meanwhile are counted
// in the next one (repeats). The persistence actor owns it; it is not safe for concurrent use.
type lineLimits map[string]*logging.Limiter

// log logs msg at level unless it was logged within logging.LimitEvery, adding how many times
// it was held back since it was last logged.
func (ls *lineLimits) log(log *slog.Logger, level slog.Level, msg string, args ...any) {
	if *ls == nil {
		*ls = lineLimits{}
	}
	l := (*ls)[msg]
	if l == nil {
		l = &logging.Limiter{}
		(*ls)[msg] = l
	}
	if args, ok := l.Allowed(args...); ok {
		log.Log(context.Background(), level, msg, args...)
	}
}

// ok says that what msg reports has stopped failing: its next failure is logged at once.
func (ls lineLimits) ok(msg string) {
	if l := ls[msg]; l != nil {
		l.Reset()
	}
}
