package openai

import (
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/logging"
)

// refusalLog is the endpoint's last refusal of what a request held (refusesWhatItHolds), and
// whether it was found to refuse every request so (Agent.refusesEvery). An answer clears it,
// and sets answered.
type refusalLog struct {
	mu      sync.Mutex
	code    int
	message string
	session string // the session whose request it refused
	every   bool
	// answered is set when the endpoint answered a request after the last refusal noted (or
	// since the start, when none is): it takes other requests, whatever this one's refusals.
	answered bool
}

// answered notes that the endpoint answered a request: a refusal after it is a message's again
// until shown otherwise.
func (a *Agent) answered() {
	r := &a.refusals
	r.mu.Lock()
	r.code, r.message, r.session, r.every, r.answered = 0, "", "", false, true
	r.mu.Unlock()
}

// refusesEvery notes se, the endpoint's refusal of what a request of session held, and reports
// whether the endpoint refuses every request so, whatever it holds: the same request without
// the earlier unanswered messages was refused the same way (probed: the status and the message
// alike) with no request answered since the last refusal noted, or another session's request
// was, with no request answered in between, or it was already found to. The configuration (a
// model some servers refuse with a bare 400, a proxy that refuses what it does not know) or the
// endpoint is then at fault, not a message: nothing is left out, and the operator is told once
// with an ERR, again only for another refusal or after an answer. A probe refused while the
// endpoint answers other requests shows only that the rest of this conversation is refused (an
// answered message the endpoint now refuses, or a conversation too long in words tooLong does
// not know): not every request, and the notice names /new (before, such a chat was told the
// endpoint refuses every request at each turn, never /new, and logged the ERR at each). A
// message the endpoint cannot take, sent again by its sender, is one of the riders too, and
// the probe still holds it: Run notes that refusal as one with nothing to leave out (resends);
// the next message other than it gets past (its probe is answered), and leaves it out then.
func (a *Agent) refusesEvery(se *StatusError, session string, probed bool, log *slog.Logger) bool {
	r := &a.refusals
	key := refusalKey(se.Message)
	r.mu.Lock()
	same := r.code == se.Code && r.message == key
	every := probed && !r.answered || same && (r.every || r.session != session)
	r.answered = false
	told := same && r.every
	r.code, r.message, r.session, r.every = se.Code, key, session, every
	r.mu.Unlock()
	if every && !told {
		seen := "the same request without the earlier messages that got no answer"
		if !probed {
			seen = "the requests of two sessions"
		}
		log.Error("the model endpoint refuses every request the same way, whatever the conversation holds; check agent.openai (model, max_tokens, temperature, base_url) and the server or proxy that answers at base_url",
			"status", se.Code, "seen", seen, logging.Err(se))
	}
	return every
}

// requestIDs matches what an error page or message may hold that differs from one request to
// the next while the refusal is the same: a UUID, a run of 16 or more hex digits (Cloudflare's
// Ray ID, with the data centre after it, "8a1b2c3d4e5f6789-FRA"; OpenAI's req_…; a trace id).
var requestIDs = regexp.MustCompile(`(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b|[0-9a-f]{16,}(?:-[a-z]{3}\b)?`)

// namedIDs matches an id a message names as one, whatever its alphabet or length (cut short
// with the message, it may be a few characters): one-api's and new-api's "(request id:
// 20251207123456789012345aB3xYz9Q)" (the time to the nanosecond, then random digits or
// letters), "request_id": "req_…" (Anthropic's, as a proxy passes its error on), x-request-id,
// trace and correlation ids. Group 1 is the name, group 2 the id; only an id with a digit is
// one (refusalKey), not a word that follows such a name.
var namedIDs = regexp.MustCompile(`(?i)(\b(?:x-)?(?:request|req|trace|correlation)[ _-]?id\b['"]?\s*[:=]?\s*['"]?)([A-Za-z0-9][\w-]*)`)

// idTokens matches a run of 16 or more characters of an id's alphabet (letters, digits, '_'
// and '-'): refusalKey takes one with a digit for an id, such as Anthropic's
// "req_011CZACayYzvBK2dtytcvDpD" (base58) or new-api's, named or not.
var idTokens = regexp.MustCompile(`[A-Za-z0-9_-]{16,}`)

// refusalKey is what of a refusal's message two refusals must share to be the same refusal
// (refusesEvery, and the probe's in Run): the message with its per-request ids taken out. Those
// are what namedIDs names as an id, runs of 16 or more id characters with a digit among them
// (idTokens), and UUIDs and hex runs (requestIDs). Words, parameter names and counts of fewer
// than 16 digits are kept (a message index, a context size, n_ctx): two refusals that differ in
// them differ. Before, a proxy's error page that names each request's own id (Cloudflare's "Ray
// ID: …") was never the same refusal twice, nor, until the named and alphanumeric ids were
// taken out, one-api's or new-api's "(request id: …)" and Anthropic's req_… behind a proxy: an
// endpoint behind them that refuses every request read as a conversation at fault.
func refusalKey(message string) string {
	message = namedIDs.ReplaceAllStringFunc(message, func(m string) string {
		sub := namedIDs.FindStringSubmatch(m)
		if !strings.ContainsAny(sub[2], "0123456789") {
			return m
		}
		return sub[1] + "…"
	})
	message = idTokens.ReplaceAllStringFunc(message, func(t string) string {
		if !strings.ContainsAny(t, "0123456789") {
			return t
		}
		return "…"
	})
	return requestIDs.ReplaceAllString(message, "…")
}

// sameRefusal reports whether a and b are the same refusal: the status, and the message but for
// its per-request ids (refusalKey).
func sameRefusal(a, b *StatusError) bool {
	return a.Code == b.Code && refusalKey(a.Message) == refusalKey(b.Message)
}

// resends reports whether a message of own (the turn's) has the text of one of riders (the
// earlier messages that got no answer, which the request carries), but for the space around it:
// its sender sent it again.
func resends(own, riders []agents.Message) bool {
	return slices.ContainsFunc(own, func(m agents.Message) bool {
		text := strings.TrimSpace(m.Text)
		return slices.ContainsFunc(riders, func(r agents.Message) bool { return strings.TrimSpace(r.Text) == text })
	})
}

// withoutRiders returns history without its last user messages, those that got no answer
// (their turns failed, or an interrupt cut them short), which a request carries merged into the
// turn's own message (joinRuns), and how many they are: the session's leaveOut counts the same.
func withoutRiders(history []agents.Message) ([]agents.Message, int) {
	n := len(history)
	for n > 0 && history[n-1].Role == roleUser {
		n--
	}
	return history[:n], len(history) - n
}

// The notes a reply ends with when the request that answered it left out the earlier messages
// that got no answer (Response.RidersLeftOut), after a blank line: one rider, or more.
const (
	noteRiderLeftOut  = "[the earlier message that got no answer is left out of the conversation: the model endpoint refused it, and this answers without it]"
	noteRidersLeftOut = "[the earlier messages that got no answer are left out of the conversation: the model endpoint refused them, and this answers without them]"
)

// ridersNote is the note of a reply whose request left out n riders.
func ridersNote(n int) string {
	if n == 1 {
		return noteRiderLeftOut
	}
	return noteRidersLeftOut
}

// overflowed logs, at most once a minute, an endpoint's refusal (err) that says the request's
// max_tokens leaves its input no room in the model's context (contextRefusalOf) when the
// setting is at fault: it is the model's context or more, which no conversation fits next to,
// or the input alone fits. The operator lowers agent.openai.max_tokens, or sets
// agent.openai.token_budget, which trims the history, below the context less max_tokens;
// /new helps a user only in the second case, until the conversation grows again. It returns
// err.
func (a *Agent) overflowed(err error, log *slog.Logger) error {
	se, ok := errors.AsType[*StatusError](err)
	if !ok || se.Code != http.StatusBadRequest || a.maxTokens <= 0 {
		return err
	}
	c := se.contextOf()
	o := c.overflow
	if !c.counted || (o.output < o.context && o.input >= o.context) {
		return err
	}
	a.overflowLines.LogQuiet(log, slog.LevelError, "agent.openai.max_tokens leaves the conversation no room in the model's context; lower it, or set agent.openai.token_budget below the context less max_tokens", "context", o.context, "max_tokens", o.output, "input_tokens", o.input, "token_budget", a.budget)
	return err
}
