package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// FieldError is one problem with one configuration value. Load and Validate return every
// FieldError they find at once, joined with errors.Join; callers find them with errors.As.
type FieldError struct {
	// Field is the dotted YAML key path (sessions.queue.mode; a map entry's key is part of it,
	// as in sessions.reset_by_type.dm.mode, and a list entry's index, as in
	// sessions.reset.quiet_platforms[0]), or the name of the environment variable
	// (AGENTGATE_SESSIONS_QUEUE_CAP) when the value came from one and didn't parse, or that
	// pgx reads and refuses (PGSSLMODE; "PGHOST and PGPORT" when the problem is of both).
	Field string
	// Value is the offending value, or nil when the problem is a missing value or an unknown key.
	Value any
	// Err says what is wrong with the value.
	Err error
	// cause is, for a missing key that another one's value requires, that key (agent.backend
	// for agent.exec.command): the file's line of the problem when the file does not write
	// the missing key nor its section.
	cause string
	// others are the keys besides Field and cause whose values the problem is of (store.driver
	// for a PostgreSQL store.dsn on SQLite; the three files of cluster.tls): the problem names
	// the variables that set them too.
	others []string
	// env names the AGENTGATE_* variables and the flags the values of the problem came from,
	// when they did (Check sets it): "set by AGENTGATE_…" (or "set by --log-level") for
	// Field's own, "KEY set by AGENTGATE_…" for cause's and others'. The problem names them, where the operator set the values. Before,
	// it named only the key (a walkthrough: "sessions.queue.cap: 0: must be at least 1" for
	// AGENTGATE_SESSIONS_QUEUE_CAP=0), and of a problem between keys, only Field's own
	// variable: AGENTGATE_AGENT_BACKEND=exec alone read "agent.exec.command: required when
	// agent.backend is exec", to an operator who had written no agent.backend anywhere.
	env []string
}

// Between makes e a problem between its Field and keys, and returns it: like validation's
// problems between keys, it names the AGENTGATE_* variables that set them (Check). For the
// checks of this machine made outside this package (check-config's of the cluster's TLS files).
func (e *FieldError) Between(keys ...string) *FieldError {
	e.others = append(e.others, keys...)
	return e
}

// Error formats the problem as `field: value: reason`, omitting a nil Value, and names the
// variables the values came from at the end: `field: value: reason (set by AGENTGATE_…)`, or
// `(set by AGENTGATE_…, other.key set by AGENTGATE_…)` for a problem between keys.
func (e *FieldError) Error() string {
	from := ""
	if len(e.env) > 0 {
		from = " (" + strings.Join(e.env, ", ") + ")"
	}
	if e.Value == nil {
		return e.Field + ": " + e.Err.Error() + from
	}
	return e.Field + ": " + formatValue(e.Value) + ": " + e.Err.Error() + from
}

// involved returns the keys besides Field whose values the problem is of: cause, then others.
func (e *FieldError) involved() []string {
	if e.cause == "" {
		return e.others
	}
	return append([]string{e.cause}, e.others...)
}

// Unwrap returns the reason, so errors.Is works on it.
func (e *FieldError) Unwrap() error { return e.Err }

func formatValue(v any) string {
	switch v := v.(type) {
	case string:
		return strconv.Quote(v)
	case []string:
		q := make([]string, len(v))
		for i, s := range v {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	case time.Duration:
		return ShortDuration(v)
	default:
		return fmt.Sprint(v)
	}
}

// ShortDuration writes d as a config file would: 24h, 1m, 90s rather than 24h0m0s.
func ShortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
