package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/ansi"
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
// login page of a proxy that guards the endpoint, a captive portal's, a web app's own page at
// a base_url that misses the API's path. Every request gets it until the operator acts.
type webPageError struct {
	// contentType is the answer's Content-Type, and text what the page shows a reader (its
	// title and text: bodyText), both sanitized; text is the page's start, markup and all,
	// when markup is set: a page that shows no text.
	contentType, text string
	markup            bool
}

// Error quotes the page's text as an error status's page is quoted (StatusError.Error).
// Before, it quoted the page's first characters, its markup (a login page's doctype, head
// and styles), and the JSON parser's complaint of its '<'.
func (e *webPageError) Error() string {
	reads := "that reads"
	if e.markup {
		reads = "with no text, starting"
	}
	return fmt.Sprintf("openai agent: response is not a chat completion but a web page (Content-Type %q) %s %q: check agent.openai.base_url, and what answers at that address",
		e.contentType, reads, e.text)
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
	// plain is set when Message is the endpoint's text that is no JSON (a proxy's or a
	// server's plain-text or HTML answer: bodyText), which Error quotes; page when that text
	// is a web page's (HTML, XML), its markup left out.
	plain, page bool
	// hint is what the operator should check, for a status whose cause the endpoint's message
	// may not say (a 404: see notFoundHint); "" for none.
	hint string
	// refused are the request parameters the answer names as what it refuses (refusedParams),
	// which adapt may do without or name otherwise.
	refused refusedNames
	// sent is the form of the request the answer refused, which refused says what of.
	sent form
	// context is what the answer says of a request too long for the model's context, read
	// from the whole of it (contextRefusalOf); nil for a StatusError made without reading an
	// answer, whose Message is read instead (contextOf).
	context *contextRefusal
}

// contextOf returns what e says of a request too long for the model's context.
func (e *StatusError) contextOf() contextRefusal {
	if e.context != nil {
		return *e.context
	}
	return contextRefusalOf(e.Message, nil, nil, 0)
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
	switch {
	case e.Message == "":
	case e.page:
		// Quoted: where the endpoint's text starts and ends is plain to see, and a page's
		// words are not taken for agentgate's.
		s += ", a web page that reads " + strconv.Quote(e.Message)
	case e.plain:
		s += ": " + strconv.Quote(e.Message)
	default:
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
// again, which could only fail the same way. every is set when the endpoint refuses every
// request the same way, whatever it holds (refusesEvery): the notice then says the fault is
// the configuration's or the endpoint's. probed is set when err refused the request sent again
// without the earlier messages that got no answer: the rest of the conversation may be at
// fault, and the notice names /new.
func (a *Agent) refusal(err error, every, probed bool) error {
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
	declined := false
	c := se.contextOf()
	switch o, overflow := c.overflow, c.counted; {
	case se.Code == http.StatusUnauthorized || se.Code == http.StatusForbidden:
		notice = "its model endpoint refused its credentials, which the operator has to fix"
	case se.Code == http.StatusNotFound:
		// Said of both causes: an unknown model, or a base_url without the API's path (its
		// /v1), where the endpoint has no route to answer (notFoundHint).
		notice = "its model endpoint has no such model or address (404), which the operator has to fix"
	case se.Code == http.StatusBadRequest && overflow && a.maxTokens > 0 && o.output >= o.context:
		// No conversation fits: /new would not help.
		notice = fmt.Sprintf("its max_tokens setting (%d tokens) leaves no room in the model's context (%d tokens) for any conversation, which the operator has to fix", o.output, o.context)
	case se.Code == http.StatusBadRequest && overflow && a.maxTokens > 0 && o.input < o.context:
		notice = fmt.Sprintf("the conversation (%d tokens) fits in the model's context (%d tokens) only without the room its max_tokens setting keeps for the reply (%d tokens), which the operator has to lower; until then, send /new to start a fresh session", o.input, o.context, o.output)
	case se.Code == http.StatusRequestEntityTooLarge || (se.Code == http.StatusBadRequest && c.tooLong):
		notice = "the conversation is too long for the model: send /new to start a fresh session, or a shorter message"
	case se.Code == http.StatusBadRequest && contentPolicy(se.Message):
		notice, declined = "its model endpoint declined this message (its content policy)", true
	case every:
		notice = "its model endpoint refuses every request the same way, whatever the conversation holds, so the agent's configuration or the endpoint is at fault, which the operator has to fix; nothing is left out, and this message is sent again with your next one"
	case se.refused.settingsOnly() && (se.Code == http.StatusBadRequest || se.Code == http.StatusUnprocessableEntity):
		// OpenAI's "max_tokens is too large" or a temperature the model does not take, with
		// their param: no message is at fault.
		notice = "its model endpoint refused the request for a setting of the agent, which the operator has to fix; this message is sent again with your next one"
	case probed:
		// Refused also without the earlier unanswered messages, while the endpoint answers
		// other requests (not every): this message, or an older one of the conversation,
		// which only a fresh session leaves behind.
		notice = "its model endpoint refused the request, also without the earlier messages that got no answer; this message is sent again with your next one, and if that is refused too, send /new to start a fresh session"
	case !se.shown && (se.Code == http.StatusBadRequest || se.Code == http.StatusUnprocessableEntity):
		// For what the request holds: a message the endpoint cannot take, or the agent's
		// configuration. It carried no earlier unanswered messages to send it again without
		// (refusesWhatItHolds), or it was a call for steered messages. Not an error after text
		// was shown: a reply broken off, which another try may finish (as after a 500).
		notice = "its model endpoint refused the request; this message is sent again with your next one, and left out only if the endpoint then takes that one without it"
	default:
		return err
	}
	return &agents.Refusal{Notice: notice, Declined: declined, Err: err}
}

// refusesWhatItHolds returns the StatusError of err when it is a refusal of the request for what
// it holds that says nothing of what (a 400 or 422 that names neither the context, nor a
// content policy, nor only settings: see refusal): a message the endpoint cannot take, or the
// agent's configuration, or the endpoint (a proxy's bare 400). Run tells them apart by sending
// the request again without the earlier unanswered messages (the riders). An error a stream
// sent after text was shown (shown) is none: the endpoint took the request and broke off its
// reply (vLLM's streamed errors say 400 for any exception), and sent again the reply would
// start over before the user's eyes.
func (a *Agent) refusesWhatItHolds(err error) (*StatusError, bool) {
	se, ok := errors.AsType[*StatusError](err)
	if !ok || se.shown || (se.Code != http.StatusBadRequest && se.Code != http.StatusUnprocessableEntity) || se.refused.settingsOnly() {
		return nil, false
	}
	if se.Code == http.StatusBadRequest &&
		(se.contextOf().tooLong || contentPolicy(se.Message)) {
		return nil, false
	}
	return se, true
}

// contextOverflow is what an endpoint's refusal of a request too long for the model says of it:
// the model's context, the request's input, and the output it asked room for (max_tokens), in
// tokens.
type contextOverflow struct{ context, input, output int }

// overflowWordings are the refusals that give the three numbers of a contextOverflow, with the
// submatch of each: vLLM's ("'max_tokens' is too large: 9000. This model's maximum context
// length is 8192 tokens and your request has 12 input tokens (9000 > 8192 - 12)", with "or
// 'max_completion_tokens'" since 0.6; since 0.20 "This model's maximum context length is 8192
// tokens. However, you requested 9000 output tokens and your prompt contains at least 12 input
// tokens, for a total of at least 9012 tokens"; its renderer's "You passed 12 input tokens and
// requested 9000 output tokens. However, the model's context length is only 8192 tokens"), and
// OpenAI's older one, which vLLM kept ("This model's maximum context length is 8192 tokens.
// However, you requested 9000 tokens (7000 in the messages, 2000 in the completion)").
var overflowWordings = []struct {
	re                     *regexp.Regexp
	context, input, output int
}{
	{regexp.MustCompile(`(?i)is too large: (\d+)\. this model's maximum context length is (\d+) tokens and your request has (\d+) input tokens`), 2, 3, 1},
	{regexp.MustCompile(`(?i)maximum context length is (\d+) tokens\. however, you requested (\d+) output tokens and your prompt contains at least (\d+) input tokens`), 1, 3, 2},
	{regexp.MustCompile(`(?i)you passed (\d+) input tokens and requested (\d+) output tokens\. however, the model's context length is only (\d+) tokens`), 3, 1, 2},
	{regexp.MustCompile(`(?i)maximum context length is (\d+) tokens\. however, you requested \d+ tokens \((\d+) in the messages, (\d+) in the completion\)`), 1, 2, 3},
}

// contextOverflowOf reads a refusal's message for what it says of a request too long for the
// model's context, in the wordings of overflowWordings; false for any other, and for one whose
// numbers say nothing: a count past an int, or a context no model has (usableContext), which
// its words still make a context exceeded (contextWordsOf), its size not known.
func contextOverflowOf(message string) (contextOverflow, bool) {
	for _, w := range overflowWordings {
		if m := w.re.FindStringSubmatch(message); m != nil {
			ok := true
			n := func(i int) int {
				v, err := strconv.Atoi(m[i])
				ok = ok && err == nil
				return v
			}
			o := contextOverflow{context: n(w.context), input: n(w.input), output: n(w.output)}
			if !ok || !usableContext(o.context) {
				break
			}
			return o, true
		}
	}
	return contextOverflow{}, false
}

// maxContext is the largest model context, in tokens, that an endpoint's refusal is taken at
// its word for: ten times the longest a served model has (Llama 4 Scout's 10M tokens).
const maxContext = 100_000_000

// usableContext reports whether n, a model's context as an endpoint's refusal gives it (vLLM's
// "maximum context length is N tokens", llama.cpp's n_ctx), can be weighed against a request:
// 1 to maxContext tokens. Any other (0, negative, 10^12) is a count not known, as a prompt's
// size that is no count is (tokenCount): the refusal is a context exceeded, a conversation too
// long. Before, a prompt of 12 tokens "fit" a context of 0 (the max_tokens setting was said to
// leave no room in it) or of 10^12 (the conversation fit only without max_tokens' room), and
// the operator got an ERR to lower max_tokens, which could not help.
func usableContext(n int) bool { return n > 0 && n <= maxContext }

// tooLong reports whether an endpoint's 400 message says the prompt exceeds the model's context,
// in the words OpenAI, vLLM, llama.cpp (its exceed_context_size_error's, whose wording has
// changed from release to release), Ollama and LiteLLM (its ContextWindowExceededError) use.
func tooLong(message string) bool {
	return saysAny(message, "context length", "context_length", "context window", "maximum context", "too many tokens",
		"prompt is too long", "exceeds the context", "exceeds the available context size", "exceeds context size",
		"larger than the max context size", "contextwindowexceeded")
}

// contextRefusal is what an endpoint's refusal says of a request too long for the model's
// context (contextRefusalOf).
type contextRefusal struct {
	// tooLong is set when it says the request does not fit in the model's context.
	tooLong bool
	// counted is set when overflow holds its numbers: the model's context, the request's input,
	// and the max_tokens that does not fit next to it.
	counted  bool
	overflow contextOverflow
}

// maxContextScan bounds what contextRefusalOf reads of a message: an error in a stream event may
// be as long as the event.
const maxContextScan = maxErrorBody

// contextRefusalOf reads an endpoint's refusal for what it says of a request too long for the
// model's context: its message, whole (message; StatusError.Message is cut at maxErrorMessage
// runes, and the numbers of a wording behind a proxy's prefix, LiteLLM's, fell past the cut, so
// that a max_tokens at fault read as a conversation too long), and its error body (raw, when
// not nil), whose type llama.cpp's server sets to exceed_context_size_error for a prompt that
// does not fit in its context (400), with n_prompt_tokens and n_ctx, also when a proxy passes
// that error on in its message (wrappedExceedOf: LiteLLM's). That server refuses for the
// prompt alone (a reply is cut at the context's end, never refused), so a prompt as long as the
// context or longer is the conversation's, whatever the request's max_tokens; one shorter than
// the context (a server that counts max_tokens in, or a proxy's) can be refused only for the
// request's max_tokens (maxTokens, zero for none), which it counts as overflow's output. A
// prompt whose size is not known (n_prompt_tokens missing, or no count: tokenCount) is read as
// what the error's name says, a context exceeded, as a prompt too long is. Before, it read as
// 0 tokens, a prompt that fits: the max_tokens setting was blamed, with an ERR, and the
// conversation that had outgrown the context was never said to be too long. Only a max_tokens
// of n_ctx or more is still the setting's next to such a prompt: no conversation fits beside
// it on a server that counts it in (llama.cpp's own always gives the prompt's count), and /new
// would not help. An n_ctx no model has (0, or 10^12: usableContext) is a context of a size not
// known, which nothing is weighed against: the error is a context exceeded too.
//
// A refusal may echo the request it refused (vLLM's validation error holds it whole as its
// input, a proxy's message may): the chat's words, which may speak of the model's context or
// paste such a refusal, are not the endpoint's. So when the whole message says more than its
// first maxErrorMessage runes (what StatusError.Message keeps, all that was read before) and
// the chat's messages in sent (the request's body, nil for none) say the same of their own,
// only those first runes count. Before, a chat that asked about the model's context window,
// echoed, read as a conversation too long, and its rider was never left out.
func contextRefusalOf(message string, raw, sent []byte, maxTokens int) contextRefusal {
	if len(message) > maxContextScan {
		message = message[:maxContextScan]
	}
	c := contextWordsOf(message)
	if c != (contextRefusal{}) && len(message) > maxErrorMessage {
		if cut := contextWordsOf(sanitize(message, "")); cut != c && chatSpeaksOfContext(sent) {
			c = cut
		}
	}
	if c.counted {
		return c
	}
	prompt, ctx, ok := exceedOf(raw)
	if !ok {
		prompt, ctx, ok = wrappedExceedOf(message, sent)
	}
	if !ok {
		return c
	}
	c.tooLong = true
	switch {
	case maxTokens <= 0 || !usableContext(ctx):
	case prompt > 0 && prompt < ctx:
		c.counted, c.overflow = true, contextOverflow{context: ctx, input: prompt, output: maxTokens}
	case prompt == 0 && maxTokens >= ctx:
		// A prompt of a size not known next to a max_tokens no conversation fits beside: the
		// setting's, whatever the prompt (its input 0, not known).
		c.counted, c.overflow = true, contextOverflow{context: ctx, output: maxTokens}
	}
	return c
}

// exceedOf reads an error body, raw, for llama.cpp's exceed_context_size_error: its
// n_prompt_tokens and n_ctx (0 for one it lacks or that is no count: tokenCount), and whether
// it is one. Before, a count that was no int (a fraction, or past an int) made the body no
// such error.
func exceedOf(raw []byte) (prompt, ctx int, ok bool) {
	var doc struct {
		Error struct {
			Type   string          `json:"type"`
			Prompt json.RawMessage `json:"n_prompt_tokens"`
			Ctx    json.RawMessage `json:"n_ctx"`
		} `json:"error"`
	}
	if len(raw) == 0 || json.Unmarshal(raw, &doc) != nil || doc.Error.Type != "exceed_context_size_error" {
		return 0, 0, false
	}
	return tokenCount(string(doc.Error.Prompt)), tokenCount(string(doc.Error.Ctx)), true
}

// tokenCount reads a count of tokens of llama.cpp's exceed_context_size_error, the text of a
// JSON number (or of Python's repr of one, behind LiteLLM): a whole number of 1 to 9 digits,
// past any model's context (llama.cpp's n_ctx is an int32 of its own). It returns 0 for
// anything else, a count not known: none, zero, a negative number, a fraction, one of 10
// digits or more (which may overflow an int), a string.
func tokenCount(s string) int {
	if len(s) == 0 || len(s) > 9 || strings.Trim(s, "0123456789") != "" {
		return 0
	}
	n, _ := strconv.Atoi(s)
	return n
}

// The fields of llama.cpp's exceed_context_size_error in a message that holds the error, as a
// proxy passes it on: LiteLLM's "litellm.BadRequestError: OpenAIException - Error code: 400 -
// {'error': {'code': 400, 'message': '…', 'type': 'exceed_context_size_error',
// 'n_prompt_tokens': 7000, 'n_ctx': 8192}}" (the OpenAI client's error, whose body is
// Python's repr), or its JSON in another proxy's message.
var (
	wrappedExceedType   = regexp.MustCompile(`['"]type['"]\s*:\s*['"]exceed_context_size_error['"]`)
	wrappedExceedPrompt = regexp.MustCompile(`['"]n_prompt_tokens['"]\s*:\s*([^,}\s]*)`)
	wrappedExceedCtx    = regexp.MustCompile(`['"]n_ctx['"]\s*:\s*([^,}\s]*)`)
)

// wrappedExceedOf reads a refusal's message for llama.cpp's exceed_context_size_error passed on
// by a proxy (wrappedExceedType): its n_prompt_tokens and n_ctx (0 for one it lacks or that is
// no count, as exceedOf reads them: tokenCount), and whether it holds one. A message of the chat the request sent that names the type too may be
// echoed in it: then it is not read. Before, behind LiteLLM, a prompt shorter than n_ctx (the
// max_tokens setting at fault) read as a conversation too long, by its words alone.
func wrappedExceedOf(message string, sent []byte) (prompt, ctx int, ok bool) {
	if !wrappedExceedType.MatchString(message) ||
		slices.ContainsFunc(chatTexts(sent), func(text string) bool { return strings.Contains(text, "exceed_context_size_error") }) {
		return 0, 0, false
	}
	n := func(re *regexp.Regexp) int {
		if m := re.FindStringSubmatch(message); m != nil {
			return tokenCount(m[1])
		}
		return 0
	}
	return n(wrappedExceedPrompt), n(wrappedExceedCtx), true
}

// contextWordsOf is what message says in words of a request too long for the model's context.
func contextWordsOf(message string) contextRefusal {
	var c contextRefusal
	c.overflow, c.counted = contextOverflowOf(message)
	c.tooLong = c.counted || tooLong(message)
	return c
}

// chatSpeaksOfContext reports whether a message of the request sent (its body) holds the words
// of a refusal of a request too long for the model's context (contextWordsOf).
func chatSpeaksOfContext(sent []byte) bool {
	return slices.ContainsFunc(chatTexts(sent), func(text string) bool { return contextWordsOf(text) != contextRefusal{} })
}

// contentPolicy reports whether an endpoint's 400 message says a content policy refused what
// the request holds: OpenAI's content_policy_violation ("…rejected as a result of our safety
// system"), Azure OpenAI's content management policy, and OpenAI's invalid_prompt ("Invalid
// prompt: your prompt was flagged as potentially violating our usage policy", with a null
// param; as Python's repr behind LiteLLM, with its code). Before, invalid_prompt named
// nothing: taken for a refusal of the riders or of every request, never declined.
func contentPolicy(message string) bool {
	return saysAny(message, "content_policy", "content policy", "content management policy", "safety system",
		"flagged as potentially violating", "invalid_prompt")
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

// maxSanitized bounds what sanitize reads of a text, in bytes: room for the maxErrorMessage
// runes it keeps, in any script, and for much it takes out before them (space, colour codes, a
// long key redacted).
const maxSanitized = 4 << 10

// maxWordCut bounds what head takes off the end of a text it cuts: longer than an API key
// (OpenAI's sk-proj- keys run to 164 characters).
const maxWordCut = 256

// head returns the start of s of at most n bytes. A cut s ends at a
// word's end: the word the cut went through (the characters after the last space, control
// character, quote, comma, semicolon or angle bracket, which redact's rules and opaqueToken take
// a secret to run to), or its last maxWordCut bytes, are left out, so that the start of a
// secret cut there, which no rule would know for one (the key's first characters), is not
// shown either.
func head[T string | []byte](s T, n int) T {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	if wordEnd(s[n]) {
		return s[:n] // between two words
	}
	end := n
	for end > 0 && n-end < maxWordCut && !wordEnd(s[end-1]) {
		end--
	}
	if n-end >= maxWordCut {
		for end > 0 && !utf8.RuneStart(s[end]) {
			end--
		}
	}
	return s[:end]
}

// wordEnd reports whether b ends a word for head.
func wordEnd(b byte) bool {
	return b <= ' ' || b == 0x7f || strings.IndexByte(`"',;<>`, b) >= 0
}

// sanitize makes an endpoint's text fit for an error message: its first maxSanitized bytes
// (head), ANSI escape sequences and the remains of colour codes taken out (ansi.Strip), the
// key, the passwords of URLs, key-like strings (redact.String's rules) and opaque tokens
// redacted, control characters and newlines turned into spaces, runs of space collapsed, at
// most maxErrorMessage runes. Before it read a bounded start, an error event of a stream's 32
// MiB took over a minute of a CPU to redact, retried as often as the endpoint sent it, and a
// caller that cut the text first (a stream's chunk that is no JSON, at 512 bytes) could cut a
// key in two and show its first characters. The keys redact knows by their prefix in the text
// before its codes are taken out (redact.Keys) are replaced after the rules: a sequence taken
// out from between a word and a key ("link␛]8;;…␛\sk-…") joined them, and the rules, which
// want a key's prefix to start a word, showed it (TestColourCodesAreTakenOut, "a key after a
// hyperlink").
func sanitize[T string | []byte](text T, key string) string {
	h := string(head(text, maxSanitized))
	s := redact.Values(redact.String(ansi.Strip(h), key), redact.Keys(h)...)
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
