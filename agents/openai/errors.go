package openai

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/redact"
)

// ErrTimeout is wrapped by the error Run returns when the turn outlived Config.Timeout.
var ErrTimeout = errors.New("openai agent: timed out")

// ErrTooLarge is wrapped by the error Run returns when an answer of the endpoint was larger
// than MaxBody.
var ErrTooLarge = errors.New("openai agent: the model endpoint's answer is larger than agentgate reads")

// tooLarge is the error of an answer whose part what (a response body, a stream event) was
// larger than MaxBody.
func tooLarge(what string) error {
	return fmt.Errorf("%w: %s past %d MiB (a model that ran on with no max_tokens, or an endpoint that adds much beside the reply)",
		ErrTooLarge, what, MaxBody>>20)
}

// webPageError is a 200 whose body is a web page (HTML, XML), not a chat completion: the
// login page of a proxy that guards the endpoint, a web app's own page at a base_url that
// misses the API's path. Every request gets it until the operator acts.
type webPageError struct{ err error }

func (e *webPageError) Error() string {
	return e.err.Error() + " (a web page: check agent.openai.base_url, and what answers at that address)"
}

// ErrEmptyReply is wrapped by the error Run returns when the model answered without any text.
var ErrEmptyReply = errors.New("openai agent: the model returned no text")

// StatusError reports that the endpoint answered with an error status (or a 200 whose body was
// an error). Its message is safe to log: cut short, with secrets redacted.
type StatusError struct {
	// Code is the status: of the answer, or, for an error in a 200's body, the one the error
	// names (200 when it names none; see inBandStatus).
	Code int
	// Message is the endpoint's own error message, redacted and at most maxErrorMessage runes.
	Message string
	// RetryAfter is what the endpoint asked to wait before trying again (0 when it did not say).
	RetryAfter time.Duration
	// inBand is set for an error in a 200's body, and shown when it came after text had been
	// streamed to the user (not retried: the user would see the text start over).
	inBand, shown bool
	// hint is what the operator should check, for a status whose cause the endpoint's message
	// may not say (a 404: see notFoundHint); "" for none.
	hint string
	// refused are the request parameters the answer names as what it refuses (refusedParams),
	// which adapt may do without or name otherwise.
	refused refusedNames
	// sent is the form of the request the answer refused, which refused says what of.
	sent form
}

// Error says which status the endpoint answered, its message, what to check (hint), and the
// wait it asked for.
func (e *StatusError) Error() string {
	s := fmt.Sprintf("openai agent: model endpoint answered %d %s", e.Code, http.StatusText(e.Code))
	if e.inBand {
		s = "openai agent: model endpoint answered with an error"
		if e.Code != http.StatusOK {
			s += fmt.Sprintf(" (taken for %d %s)", e.Code, http.StatusText(e.Code))
		}
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.hint != "" {
		s += " (" + e.hint + ")"
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
	return !e.shown && (e.Code == http.StatusTooManyRequests || e.Code >= 500)
}

// refusal wraps an error the endpoint answered that the same request would get again in an
// agents.Refusal that tells the user why (otherwise it returns err): they were told to try
// again, which could only fail the same way.
func refusal(err error) error {
	if errors.Is(err, ErrTooLarge) {
		return &agents.Refusal{Notice: fmt.Sprintf("its model endpoint sent an answer larger than agentgate reads (%d MiB), which the operator has to look into", MaxBody>>20), Err: err}
	}
	if _, ok := errors.AsType[*webPageError](err); ok {
		return &agents.Refusal{Notice: "its model endpoint answered with a web page, not with a chat completion, which the operator has to fix", Err: err}
	}
	se, ok := errors.AsType[*StatusError](err)
	if !ok {
		return err
	}
	var notice string
	declined, rejected := false, false
	switch {
	case se.Code == http.StatusUnauthorized || se.Code == http.StatusForbidden:
		notice = "its model endpoint refused its credentials, which the operator has to fix"
	case se.Code == http.StatusNotFound:
		// Said of both causes: an unknown model, or a base_url without the API's path (its
		// /v1), where the endpoint has no route to answer (notFoundHint).
		notice = "its model endpoint has no such model or address (404), which the operator has to fix"
	case se.Code == http.StatusRequestEntityTooLarge || (se.Code == http.StatusBadRequest && tooLong(se.Message)):
		notice = "the conversation is too long for the model: send /new to start a fresh session, or a shorter message"
	case se.Code == http.StatusBadRequest && saysAny(se.Message, "content_policy", "content policy", "content management policy", "safety system"):
		notice, declined = "its model endpoint declined this message (its content policy)", true
	case se.Code == http.StatusBadRequest || se.Code == http.StatusUnprocessableEntity:
		// For what the request holds: a message the endpoint cannot take, or the agent's
		// configuration. Rejected (the session leaves out the earlier unanswered messages
		// sent along) unless the refusal names only parameters of the configuration
		// (OpenAI's "max_tokens is too large" or a temperature the model does not take, with
		// their param): no message is at fault, and every message is refused until the
		// operator puts it right, each leaving out the one before it.
		notice, rejected = "its model endpoint refused the request", !se.refused.settingsOnly()
	default:
		return err
	}
	return &agents.Refusal{Notice: notice, Declined: declined, Rejected: rejected, Err: err}
}

// tooLong reports whether an endpoint's 400 message says the prompt exceeds the model's context,
// in the words OpenAI, vLLM, llama.cpp and Ollama use.
func tooLong(message string) bool {
	return saysAny(message, "context length", "context_length", "context window", "maximum context", "too many tokens",
		"prompt is too long", "exceeds the context")
}

// saysAny reports whether message holds any of phrases (lower case), in any case.
func saysAny(message string, phrases ...string) bool {
	m := strings.ToLower(message)
	return slices.ContainsFunc(phrases, func(p string) bool { return strings.Contains(m, p) })
}

// transportError is a request that got no answer (connection refused, reset, TLS, a body that
// broke off). It never carries the URL, which may hold credentials.
type transportError struct {
	what string // whatUnreachable or whatBrokeOff
	err  error
	// shown is set when the failure came after text had been streamed to the user.
	shown bool
}

// What a transportError says happened.
const (
	whatUnreachable = "unreachable"
	whatBrokeOff    = "response broke off"
)

func (e *transportError) Error() string {
	return "openai agent: model endpoint " + e.what + ": " + e.err.Error()
}

func (e *transportError) Unwrap() error { return e.err }

// maxErrorMessage bounds the endpoint's error message kept in a StatusError, in runes.
const maxErrorMessage = 200

// opaqueToken matches a run of 40 or more token characters: a key of a provider whose prefix
// internal/redact does not know, or a session token, echoed in an endpoint's error. It is this
// package's own rule, not redact's: an endpoint's message is prose written for a developer,
// where such a run is far more likely a credential than data, while a command's stderr holds git
// commit ids, checksums and base64 the operator needs to read.
var opaqueToken = regexp.MustCompile(`\b[A-Za-z0-9_\-]{40,}\b`)

// sanitize makes an endpoint's text fit for an error message: the key, the passwords of URLs,
// key-like strings (redact.String's rules) and opaque tokens redacted, control characters and
// newlines turned into spaces, runs of space collapsed, at most maxErrorMessage runes.
func sanitize(s, key string) string {
	s = redact.String(s, key)
	s = opaqueToken.ReplaceAllString(s, redact.Placeholder)
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
