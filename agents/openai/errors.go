package openai

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// ErrTimeout is wrapped by the error Run returns when the turn outlived Config.Timeout.
var ErrTimeout = errors.New("openai agent: timed out")

// ErrEmptyReply is wrapped by the error Run returns when the model answered without any text.
var ErrEmptyReply = errors.New("openai agent: the model returned no text")

// StatusError reports that the endpoint answered with an error status (or a 200 whose body was
// an error). Its message is safe to log: cut short, with secrets redacted.
type StatusError struct {
	Code int
	// Message is the endpoint's own error message, redacted and at most maxErrorMessage runes.
	Message string
	// RetryAfter is what the endpoint asked to wait before trying again (0 when it did not say).
	RetryAfter time.Duration
}

// Error says which status the endpoint answered, its message, and the wait it asked for.
func (e *StatusError) Error() string {
	s := fmt.Sprintf("openai agent: model endpoint answered %d %s", e.Code, http.StatusText(e.Code))
	if e.Code == http.StatusOK {
		s = "openai agent: model endpoint answered with an error"
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.RetryAfter > 0 {
		// Said, so that a 429 that was not retried (it asked for longer than max_backoff, or
		// than the turn had left) explains itself.
		s += fmt.Sprintf(" (asked to retry after %v)", e.RetryAfter)
	}
	return s
}

// retryable reports whether the status is worth another attempt: rate limits and server errors.
func (e *StatusError) retryable() bool {
	return e.Code == http.StatusTooManyRequests || e.Code >= 500
}

// transportError is a request that got no answer (connection refused, reset, TLS, a body that
// broke off). It never carries the URL, which may hold credentials.
type transportError struct {
	what string // "unreachable", "response broke off"
	err  error
	// shown is set when the failure came after text had been streamed to the user.
	shown bool
}

func (e *transportError) Error() string {
	return "openai agent: model endpoint " + e.what + ": " + e.err.Error()
}

func (e *transportError) Unwrap() error { return e.err }

// maxErrorMessage bounds the endpoint's error message kept in a StatusError, in runes.
const maxErrorMessage = 200

const redacted = "[redacted]"

// secretLike matches what looks like an API key or a bearer token in an endpoint's message.
var secretLike = regexp.MustCompile(`(?i)(bearer\s+)[^\s"',;]+|\b(sk|pk|rk)-[A-Za-z0-9_\-]{8,}|\b[A-Za-z0-9_\-]{40,}\b`)

// sanitize makes an endpoint's text fit for an error message: the key and key-like strings
// redacted, control characters and newlines turned into spaces, runs of space collapsed, at most
// maxErrorMessage runes.
func sanitize(s, key string) string {
	if key != "" {
		s = strings.ReplaceAll(s, key, redacted)
	}
	s = secretLike.ReplaceAllString(s, "${1}"+redacted)
	var b strings.Builder
	space := false
	n := 0
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) || unicode.IsSpace(r) {
			space = b.Len() > 0
			continue
		}
		if space {
			b.WriteByte(' ')
			space = false
			n++
		}
		if n >= maxErrorMessage {
			b.WriteString("…")
			break
		}
		b.WriteRune(r)
		n++
	}
	return b.String()
}
