package openai

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"golang.org/x/net/html"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/logging"
)

// Limits of what is read from the endpoint.
const (
	// MaxReply bounds the reply text of one call, in bytes; a longer reply is cut there (a
	// stream is read no further).
	MaxReply = 1 << 20
	// MaxBody bounds what is read of one answer: a non-streamed response body, one line of a
	// stream, and the data lines of one event together. It is generous, so that a reply cut at
	// MaxReply fits however its JSON escapes it (a \u sequence takes 6 bytes), with what else
	// the answer holds beside it (a reasoning model's reasoning_content, which is read and not
	// kept). An answer past it fails the turn with ErrTooLarge; past 8 MiB, such answers failed
	// the turn, and a stream's event past 4 MiB broke off.
	MaxBody = 32 << 20
	// maxErrorBody bounds what is read of an error response.
	maxErrorBody = 16 << 10
	// maxRefusal bounds the refusal kept of one call, in bytes: the user is told it in a notice.
	maxRefusal = 1 << 10
	// maxLine bounds one line of a stream, and the data lines of one event together.
	maxLine = MaxBody
	// largeAnswer is how much of one answer (a body, or a stream's event with the line being
	// read) a call holds before it needs one of its Agent's maxLargeAnswers to read on. A
	// chat completion, or a stream's event, is far shorter unless the reply nears MaxReply.
	largeAnswer = 1 << 20
	// maxLargeAnswers bounds the answers past largeAnswer that the calls of an Agent (the
	// daemon has one) read at once; a call that needs one more waits for one of them to end,
	// or for its turn to end. An answer near MaxBody takes about three times that while it
	// is read and decoded (encoding/json decodes a value from all of its bytes, and a string
	// whole): agent.max_concurrent calls (32 by default) that each read one held some 3 GiB.
	maxLargeAnswers = 2
)

// streamBuffer is the read buffer of a response body.
const streamBuffer = 64 << 10

// retryBase is the first backoff; each retry doubles it, up to Config.MaxBackoff.
const retryBase = time.Second

// result is what one model call returned.
type result struct {
	text   string
	usage  agents.Usage
	finish string // finish_reason, when the endpoint said
	cut    bool   // the text was longer than MaxReply, and cut there
	// refusal is what the model said in its refusal field (its words when it declines, in
	// place of content), at most maxRefusal bytes; never part of text.
	refusal string
	// toolCalls is set when the model asked to call a tool (tool_calls, or the older
	// function_call), which no request offers.
	toolCalls bool
}

// call makes one model call for msgs, retrying what can be retried (see the package comment).
// Each attempt encodes its request when it is sent, after any wait, in the Agent's form then:
// a refusal that switched the form while the call waited out a pause or its backoff (adapt,
// another turn's request) is honoured at once, not met again. partial, when not nil, streams. log is the agent's logger with the turn's session and id.
// retried is how many times the call was already retried, in the form a refusal made Run send
// again (adapt): the count goes on, so that a call is retried max_retries times in all, not as
// often again for each form; call returns it with what it added.
func (a *Agent) call(ctx context.Context, msgs []chatMessage, partial func(string), retried int, log *slog.Logger) (*result, int, error) {
	var wait time.Duration // before the attempt: the last failed one's backoff
	for attempt := retried + 1; ; attempt++ {
		// A request that failed waits its own spread backoff, lengthened only to a wait the
		// endpoint asked for: to another turn's computed one, turns that failed together would
		// retry together again.
		pause := &a.paused
		if wait > 0 {
			pause = &a.asked
		}
		// The pause is looked at again after each sleep: a request that slept its own backoff
		// would otherwise send into a wait another request was asked for meanwhile.
		for {
			if left := a.pausedUntil(pause).Sub(a.now()); left > wait {
				// Another request was told to wait: so is this one, which would only add to
				// the storm (unless the turn ends first: then the endpoint may say so itself).
				if dl, has := ctx.Deadline(); !has || time.Until(dl) > left {
					if wait == 0 {
						// Held by another turn's limit, which its own log lines name: this
						// chat's reply is late for no reason of its own (found by a walkthrough:
						// one chat's Retry-After held another for 25 s without a word).
						a.pauseLines.LogQuiet(log, slog.LevelWarn, "model call waits out a rate limit the endpoint gave another request; every turn's calls wait", "wait", left.Round(time.Millisecond))
					}
					wait = left
				}
			}
			if wait <= 0 {
				break
			}
			if err := a.sleep(ctx, wait); err != nil {
				return nil, attempt - 1, a.ctxErr(ctx)
			}
			wait = 0
		}
		f := a.form()
		body, err := a.body(msgs, partial != nil, f)
		if err != nil {
			return nil, attempt - 1, err
		}
		start := time.Now()
		res, err := a.attempt(ctx, body, partial, log)
		result := requestResult(ctx, res, err)
		a.requests(result)
		if result == ResultOK {
			a.answered()
		}
		if se, ok := errors.AsType[*StatusError](err); ok {
			se.sent = f
		}
		if err == nil {
			log.Debug("model call", "attempt", attempt, "took", time.Since(start),
				"input_tokens", res.usage.InputTokens, "output_tokens", res.usage.OutputTokens)
			return res, attempt - 1, nil
		}
		if ctx.Err() != nil {
			return nil, attempt - 1, a.ctxErr(ctx)
		}
		var retry bool
		wait, retry = a.retryWait(err, attempt)
		// The others wait too, even when this turn gives up: the endpoint's limit holds for
		// them as much as for this request.
		a.pauseOthers(err, wait, attempt)
		// A wait the endpoint asked for that this turn will not wait out (longer than
		// max_backoff, or than the turn has left) fails it at once, saying how long: "please try
		// again" would send the message into the wait (found by a walkthrough).
		if se, ok := errors.AsType[*StatusError](err); ok && se.RetryAfter > 0 && (se.RetryAfter > a.maxBackoff || outlasts(ctx, se.RetryAfter)) {
			return nil, attempt - 1, askedToWait(err, se)
		}
		if !retry || outlasts(ctx, wait) {
			return nil, attempt - 1, err // no retry, or the turn would end before it: fail now
		}
		// Once a minute, repeats counted: in an outage of the endpoint every turn
		// retries, and each logged each of its retries (found by an audit).
		a.retryLines.LogQuiet(log, slog.LevelWarn, "model call failed; retrying", "attempt", attempt, "wait", wait, logging.Err(err))
	}
}

// outlasts reports whether a wait of d is longer than what ctx's turn has left.
func outlasts(ctx context.Context, d time.Duration) bool {
	dl, has := ctx.Deadline()
	return has && time.Until(dl) < d
}

// askedToWait is the error of a call that does not wait out the wait the endpoint asked for
// (err, whose StatusError is se): an agents.Refusal whose notice says that the endpoint
// rate-limited the agent (a 429) and how long to wait (waitText).
func askedToWait(err error, se *StatusError) error {
	what := "its model endpoint asked for a wait of %s before its next request: send it again after that"
	if se.Code == http.StatusTooManyRequests {
		what = "its model endpoint rate-limited it (429) and asked for a wait of %s before its next request: send it again after that"
	}
	return &agents.Refusal{Err: err, Notice: fmt.Sprintf(what, waitText(se.RetryAfter))}
}

// waitText is a wait the endpoint asked for as a notice tells it: rounded up to the second, so
// that a message sent again after it does not meet the limit again (rounded to the nearest, a
// wait of 90.2 s was told as 1m30s), and past a day as "more than a day" (a Retry-After of
// years, read as maxRetryAfter, is no time to tell anybody).
func waitText(d time.Duration) string {
	if d > 24*time.Hour {
		return "more than a day"
	}
	return (d + time.Second - 1).Truncate(time.Second).String()
}

// pauseOthers makes every other request to the endpoint wait when err tells them to, not just
// the one that got it: a rate limit (429), or any answer that says how long to wait
// (Retry-After). The pause lasts the wait asked for, up to max_backoff (no request waits
// longer than that for the endpoint), else this request's own wait before its retry (wait),
// else, when it will not retry, the backoff its attempt would have had.
func (a *Agent) pauseOthers(err error, wait time.Duration, attempt int) {
	se, ok := errors.AsType[*StatusError](err)
	if !ok || (se.Code != http.StatusTooManyRequests && se.RetryAfter <= 0) {
		return
	}
	switch {
	case se.RetryAfter > 0:
		wait = min(se.RetryAfter, a.maxBackoff)
	case wait <= 0:
		wait = a.backoff(attempt)
	}
	until := a.now().Add(wait)
	a.pauseUntil(&a.paused, until)
	if se.RetryAfter > 0 {
		a.pauseUntil(&a.asked, until)
	}
}

// pausedUntil is when the pause p (Agent.paused or Agent.asked) ends; zero when none was met.
func (a *Agent) pausedUntil(p *atomic.Int64) time.Time {
	if n := p.Load(); n != 0 {
		return a.epoch.Add(time.Duration(n))
	}
	return time.Time{}
}

// pauseUntil makes the pause p (Agent.paused or Agent.asked) last until t, or later when it
// already does. A pause is kept as its distance from Agent.epoch, so that it is measured on
// the monotonic clock: a wall clock stepped back would otherwise end it early (or stepped on,
// make it last longer than asked).
func (a *Agent) pauseUntil(p *atomic.Int64, t time.Time) {
	n := int64(max(t.Sub(a.epoch), 1))
	for {
		old := p.Load()
		if old >= n || p.CompareAndSwap(old, n) {
			return
		}
	}
}

// Results of one request to the model endpoint, as Config.Requests is told them.
const (
	ResultOK          = "ok"           // a reply with text was read
	ResultRateLimited = "rate_limited" // 429
	ResultServerError = "server_error" // 5xx
	ResultRefused     = "refused"      // another error status, a redirect, or an error in a 200
	ResultUnreachable = "unreachable"  // no answer: connection refused or reset, DNS, TLS
	ResultBrokeOff    = "broke_off"    // the answer ended before the reply did
	ResultBadReply    = "bad_reply"    // an answer that is no chat completion, too long, or without text
	ResultTimeout     = "timeout"      // agent.openai.timeout ended the turn during the request
	ResultCancelled   = "cancelled"    // the turn was stopped or interrupted during the request
)

// RequestResults are every result Config.Requests may be told.
var RequestResults = []string{ResultOK, ResultRateLimited, ResultServerError, ResultRefused,
	ResultUnreachable, ResultBrokeOff, ResultBadReply, ResultTimeout, ResultCancelled}

// requestResult is the result (RequestResults) of a request that ended with res or err under
// ctx. A completion without text (no choices, only tool calls, a content filter's empty
// answer) is a bad reply: the turn has nothing to answer with, and counted ok, it hid the
// failures from the metric.
func requestResult(ctx context.Context, res *result, err error) string {
	if err == nil {
		if strings.TrimSpace(res.text) == "" {
			return ResultBadReply
		}
		return ResultOK
	}
	if ctx.Err() != nil {
		if errors.Is(context.Cause(ctx), ErrTimeout) {
			return ResultTimeout
		}
		return ResultCancelled
	}
	if se, ok := errors.AsType[*StatusError](err); ok {
		switch {
		case se.Code == http.StatusTooManyRequests:
			return ResultRateLimited
		case se.Code >= 500:
			return ResultServerError
		}
		return ResultRefused
	}
	if te, ok := errors.AsType[*transportError](err); ok {
		if te.what == whatUnreachable {
			return ResultUnreachable
		}
		return ResultBrokeOff
	}
	return ResultBadReply
}

// retryWait says whether err after attempt is retried, and after how long.
func (a *Agent) retryWait(err error, attempt int) (time.Duration, bool) {
	if attempt > a.maxRetries {
		return 0, false
	}
	backoff := a.backoff(attempt)
	var se *StatusError
	var te *transportError
	switch {
	case errors.As(err, &se):
		if !se.retryable() {
			return 0, false
		}
		if se.RetryAfter > 0 {
			if se.RetryAfter > a.maxBackoff {
				return 0, false // honouring it would take longer than we may wait
			}
			return se.RetryAfter, true
		}
		return a.jitter(backoff), true
	case errors.As(err, &te):
		return a.jitter(backoff), !te.shown
	}
	return 0, false
}

// backoff is the computed wait after the given attempt failed, before its jitter.
func (a *Agent) backoff(attempt int) time.Duration {
	return min(retryBase<<min(attempt-1, 20), a.maxBackoff)
}

// ctxErr is the error of a turn whose context ended: ErrTimeout for our own deadline, with the
// timeout it outlived (the log line then says which setting to look at).
func (a *Agent) ctxErr(ctx context.Context) error {
	if cause := context.Cause(ctx); errors.Is(cause, ErrTimeout) {
		return agents.TimedOut(a.timeout, fmt.Errorf("%w: no reply within %v (agent.openai.timeout)", ErrTimeout, a.timeout))
	}
	return fmt.Errorf("openai agent: run: %w", ctx.Err())
}

// attempt is one HTTP request.
func (a *Agent) attempt(ctx context.Context, body []byte, partial func(string), log *slog.Logger) (*result, error) {
	ctx, cancel := context.WithCancel(ctx) // ends drain's wait for the body's end
	defer cancel()
	h := &holder{ctx: ctx, large: a.large, log: log}
	defer h.release()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("openai agent: build request: %w", stripURL(err))
	}
	req.Header.Set("Content-Type", "application/json")
	if partial != nil {
		req.Header.Set("Accept", "text/event-stream")
	} else {
		req.Header.Set("Accept", "application/json")
	}
	if a.key != nil && a.key.v != "" {
		req.Header.Set("Authorization", "Bearer "+a.key.v)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, &transportError{what: whatUnreachable, err: a.safeErr(err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode <= 399 {
		return nil, a.redirectError(resp)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, a.statusError(resp, body)
	}
	// Some servers and proxies stream whatever was asked, or label a stream application/json
	// (or a JSON document text/event-stream): what the body is decides how it is read, and
	// the label only when the body's start says nothing.
	rb := bufio.NewReaderSize(resp.Body, streamBuffer)
	if b, _ := rb.Peek(len(byteOrderMark)); string(b) == byteOrderMark {
		_, _ = rb.Discard(len(b)) // an event stream may start with one; JSON may not
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if stream, known := looksLikeEventStream(rb); stream || (!known && mt == "text/event-stream") {
		res, err := a.readStream(rb, partial, h)
		if err == nil && !res.cut {
			drain(rb, cancel)
		}
		return res, err
	}
	res, err := a.readJSON(rb, resp.Header.Get("Content-Type"), h)
	if err == nil && partial != nil && res.text != "" {
		partial(res.text) // an endpoint that ignored stream: true
	}
	return res, err
}

// What drain waits for and reads of a stream's body after its reply is whole.
const (
	drainWait = 100 * time.Millisecond
	drainMax  = 4 << 10
)

// drain reads what follows a stream's "data: [DONE]" (the end of the chunked body, which a
// server sends once its handler returns), waiting at most drainWait for it (then cancel ends
// the request) and reading at most drainMax bytes. net/http closes the connection of a body
// closed before its end: without this, about 4 turns in 10 opened a new connection to the
// endpoint (over TLS, with a handshake) in a soak, and left one more socket in TIME_WAIT.
func drain(body io.Reader, cancel context.CancelFunc) {
	t := time.AfterFunc(drainWait, cancel)
	defer t.Stop()
	_, _ = io.Copy(io.Discard, io.LimitReader(body, drainMax))
}

// looksLikeEventStream reports whether body starts as a server-sent event stream (a comment or a
// field line), and whether its start tells at all: a JSON document starts with '{'. It peeks
// no further than the first field name.
func looksLikeEventStream(body *bufio.Reader) (stream, known bool) {
	for i := 1; i <= 512; i++ {
		b, _ := body.Peek(i)
		if len(b) < i {
			return false, false
		}
		switch b[i-1] {
		case ' ', '\t', '\r', '\n':
			continue
		case '{':
			return false, true
		case ':':
			return true, true // a comment, such as a keep-alive
		case 'd', 'e', 'i', 'r':
			for _, f := range []string{"data:", "event:", "id:", "retry:"} {
				if p, _ := body.Peek(i - 1 + len(f)); strings.HasPrefix(string(p[i-1:]), f) {
					return true, true
				}
			}
			return false, false
		default:
			return false, false
		}
	}
	return false, false
}

// redirectError is the error of a redirect, which is not followed: a client that follows one
// turns a POST into a GET (301, 302, 303) and sends the API key along to the same host over
// any scheme, or to any of its subdomains. The operator points base_url at the new address.
func (a *Agent) redirectError(resp *http.Response) *StatusError {
	msg := "redirected elsewhere, which is not followed: check agent.openai.base_url"
	if u, err := resp.Location(); err == nil {
		where := (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
		msg = "redirected to " + where + ", which is not followed: point agent.openai.base_url at the new address"
	}
	return &StatusError{Code: resp.StatusCode, Message: sanitize(msg, a.keyString())}
}

// safeErr strips the URL from a transport error and redacts the key.
func (a *Agent) safeErr(err error) error {
	return errors.New(sanitize(stripURL(err).Error(), a.keyString()))
}

// stripURL returns the error inside a *url.Error, whose message carries the URL.
func stripURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// statusError reads an error response to the request body into a safe StatusError.
func (a *Agent) statusError(resp *http.Response, body []byte) *StatusError {
	// A byte more than bodyText reads tells it that it cuts the text.
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody+1))
	// A byte order mark before the body, as attempt drops one before a 200's: with it, a
	// JSON error was read as text that is no JSON, quoted whole, and its param unread.
	raw = bytes.TrimPrefix(raw, []byte(byteOrderMark))
	msg, plain, page := errorMessage(raw), false, false
	if text, isPage, ok := bodyText(raw); ok {
		msg, plain, page = text, true, isPage
	}
	c := contextRefusalOf(msg, raw, body, a.maxTokens)
	se := &StatusError{
		Code:       resp.StatusCode,
		Message:    sanitize(msg, a.keyString()),
		plain:      plain,
		page:       page,
		context:    &c,
		RetryAfter: retryAfter(resp.Header, a.now()),
		refused:    refusedParams(raw, body),
	}
	if resp.StatusCode == http.StatusNotFound {
		se.hint = a.notFoundHint()
	}
	return se
}

// notFoundHint says where a request that got a 404 went, and what to check: an endpoint
// answers 404 for a model it does not serve, and as often for a path it has no route for (a
// base_url without its /v1), whose message ("404 page not found") names neither. The URL is
// given without its query and user info, which may hold credentials.
func (a *Agent) notFoundHint() string {
	where := "the configured base_url"
	if u, err := url.Parse(a.url); err == nil {
		where = (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
	}
	return "posted to " + sanitize(where, a.keyString()) + ": check that agent.openai.base_url is the API's root, " +
		"which usually ends in /v1, and that agent.openai.model names a model the endpoint serves"
}

// bodyText is the text of an error body, raw, that is no JSON document (an object, or null):
// a server's or proxy's plain text ("CUDA out of memory", nginx's "upstream request timeout"),
// a JSON string's (stringHead: `"model overloaded"`, an error event's data as a JSON encoder
// writes a message), or the text a web page (HTML, XML: a proxy's 502, 503 or 504 page) shows
// a reader (pageText), when page is set: of its first maxErrorBody bytes (head: a stream's
// error event may be 32 MiB). ok is false for a JSON document, or a body of spaces alone.
// Before, a page's markup filled the 200 runes a message keeps, and Cloudflare's page said no
// more than its conditional comments for old Internet Explorers; a JSON string's quotes were
// read as its text, which the error quoted again ("\"model overloaded\"").
func bodyText(raw []byte) (text string, page, ok bool) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 {
		return "", false, false
	}
	err := json.Unmarshal(t, new(struct{}))
	if err == nil {
		return "", false, false
	}
	if _, valid := errors.AsType[*json.UnmarshalTypeError](err); valid && t[0] == '"' {
		t = bytes.TrimSpace(stringHead(t, maxErrorBody))
		if len(t) == 0 {
			return "", false, false
		}
	}
	t = head(t, maxErrorBody)
	if t[0] == '<' {
		if text := pageText(t); strings.TrimSpace(text) != "" {
			return text, true, true
		}
	}
	return string(t), false, true
}

// stringHead decodes the JSON string s (a whole one, valid: its quotes and escapes) as far as
// its first n bytes reach, without cutting an escape or a character: a stream's error event
// may be a string of 32 MiB, which bodyText reads only the start of. A surrogate pair cut in two decodes to
// U+FFFD. A text it cuts ends at its last white space when that is no more than wordCut bytes
// (and a quarter of the text) before the cut: a word cut off, then shown in the error, read as
// another word (TestStringHeadCutsAtAWordEnd).
func stringHead(s []byte, n int) []byte {
	end := len(s) - 1 // the closing quote
	cut := end > n
	if cut {
		i := 1
		for i < n {
			_, step := utf8.DecodeRune(s[i:])
			if s[i] == '\\' {
				step = 2
				if s[i+1] == 'u' {
					step = 6
				}
			}
			if i+step > n {
				break
			}
			i += step
		}
		end = i
	}
	var text string
	if json.Unmarshal(append(s[:end:end], '"'), &text) != nil {
		return nil // not reached for a valid string
	}
	if cut {
		if i := strings.LastIndexAny(text, " \t\n\r"); i >= 0 && len(text)-i <= min(wordCut, len(text)/4) {
			text = text[:i]
		}
	}
	return []byte(text)
}

// wordCut is how far before the end of a text stringHead cut it looks for the end of a word.
const wordCut = 64

// pageText is what a web page, raw, shows a reader: the text of its elements (its title's
// first), without its tags, comments, scripts and styles, with its entities decoded; the
// space between them is left for sanitize to collapse.
func pageText(raw []byte) string {
	z := html.NewTokenizer(bytes.NewReader(raw))
	var b strings.Builder
	hidden := 0 // within a script or style element
	for {
		switch z.Next() {
		case html.ErrorToken:
			return b.String()
		case html.StartTagToken, html.EndTagToken:
			if name, _ := z.TagName(); string(name) == "script" || string(name) == "style" {
				if z.Token().Type == html.StartTagToken {
					hidden++
				} else {
					hidden = max(hidden-1, 0)
				}
			}
		case html.TextToken:
			if hidden == 0 {
				b.Write(z.Text())
				b.WriteByte(' ')
			}
		}
	}
}

// errorMessage finds the message in an error body: {"error":{"message"}}, {"error":"…"},
// {"message"}, pydantic's validation errors ({"detail":[{"loc","msg"}]}, FastAPI's 422, also
// under "message" as Mistral sends them) as "body.stream_options: Extra inputs are not
// permitted", FastAPI's {"detail":"…"}, or the body itself when it is not JSON.
func errorMessage(raw []byte) string {
	var doc struct {
		Error   json.RawMessage `json:"error"`
		Message json.RawMessage `json:"message"`
		Detail  json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(raw, &doc) != nil {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s // a JSON string's text, "" too (bodyText reads its start)
		}
		return string(raw) // no JSON object: its text (bodyText)
	}
	var inner struct {
		Message string `json:"message"`
	}
	var s string
	switch {
	case json.Unmarshal(doc.Error, &inner) == nil && inner.Message != "":
		return inner.Message
	case json.Unmarshal(doc.Error, &s) == nil && s != "":
		return s
	case json.Unmarshal(doc.Message, &s) == nil && s != "":
		return s
	}
	for _, v := range []json.RawMessage{doc.Detail, doc.Message} {
		if m := validationErrors(v); m != "" {
			return m
		}
	}
	if len(doc.Message) > 0 && string(doc.Message) != "null" {
		return string(raw) // a message of another shape
	}
	return ""
}

// validationErrors renders pydantic's validation errors, raw: a detail list, an object that
// holds one as "detail", or FastAPI's detail string; "" for anything else.
func validationErrors(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var wrapped struct {
		Detail json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(raw, &wrapped) == nil && len(wrapped.Detail) > 0 {
		raw = wrapped.Detail
	}
	var list []struct {
		Loc []any  `json:"loc"`
		Msg string `json:"msg"`
	}
	if json.Unmarshal(raw, &list) != nil {
		return ""
	}
	var parts []string
	for _, e := range list {
		where := make([]string, len(e.Loc))
		for i, l := range e.Loc {
			where[i] = fmt.Sprint(l)
		}
		parts = append(parts, strings.Join(where, ".")+": "+e.Msg)
	}
	return strings.Join(parts, "; ")
}

// retryAfter reads how long the endpoint asks to wait: retry-after-ms (OpenAI's) or
// x-ms-retry-after-ms (Azure OpenAI's), else Retry-After in seconds or as an HTTP date. Seconds
// may have a fraction ("0.5"): RFC 9110 allows none, but rate limiters and proxies send their
// exact remainder, and read as no wait at all it was ignored for the computed backoff. A wait
// past maxRetryAfter is read as that. Zero when it says nothing usable.
func retryAfter(h http.Header, now time.Time) time.Duration {
	for _, name := range []string{"Retry-After-Ms", "X-Ms-Retry-After-Ms"} {
		if ms, ok := decimal(h.Get(name)); ok && ms > 0 {
			return time.Duration(min(ms, maxRetryAfter.Seconds()*1e3) * float64(time.Millisecond))
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, ok := decimal(v); ok {
		if s <= 0 {
			return 0
		}
		return time.Duration(min(s, maxRetryAfter.Seconds()) * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), maxRetryAfter)
	}
	return 0
}

// maxRetryAfter is the longest wait retryAfter reads, some 31 years: a longer one ("never", or
// a number past what a time.Duration holds) is read as this, a wait no turn takes, so that the
// call fails at once and says so. Before, a Retry-After over 10^9 seconds (or a retry-after-ms
// over 10^12) was read as none, and the call retried after 1s, 2s, 4s… into the wait.
const maxRetryAfter = 1e9 * time.Second

// decimal reads a header's number of the form digits[.digits], spaces around it allowed; not
// what strconv.ParseFloat takes besides (an exponent, "Inf", hexadecimal), which no server
// means as a wait. A sign makes it unusable too: no wait is negative. One past float64's range
// is +Inf.
func decimal(v string) (float64, bool) {
	v = strings.TrimSpace(v)
	if v == "" || strings.Trim(v, "0123456789.") != "" || strings.Count(v, ".") > 1 || v[0] == '.' {
		return 0, false
	}
	f, err := strconv.ParseFloat(v, 64)
	return f, err == nil || errors.Is(err, strconv.ErrRange)
}

// completion is the part of a chat completion (or of one stream chunk) that is read.
type completion struct {
	Choices []struct {
		Message      *choiceText `json:"message"`
		Delta        *choiceText `json:"delta"`
		FinishReason *string     `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// choiceText is a message or a delta. Content is a string, or a list of parts on some servers.
// Refusal is the model's words when it declines to answer (OpenAI sends it in place of
// content); ToolCalls and FunctionCall are a request to call a tool, read only for whether
// there is one.
type choiceText struct {
	Content      json.RawMessage `json:"content"`
	Refusal      *string         `json:"refusal"`
	ToolCalls    json.RawMessage `json:"tool_calls"`
	FunctionCall json.RawMessage `json:"function_call"`
}

// callsTools reports whether c asks to call a tool.
func (c *choiceText) callsTools() bool {
	given := func(raw json.RawMessage) bool {
		v := string(bytes.TrimSpace(raw))
		return v != "" && v != "null" && v != "[]" && v != "{}"
	}
	return c != nil && (given(c.ToolCalls) || given(c.FunctionCall))
}

func (c *choiceText) text() string {
	if c == nil {
		return ""
	}
	var s string
	if json.Unmarshal(c.Content, &s) == nil && s != "" {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(c.Content, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			if p.Type == "text" || p.Type == "" {
				b.WriteString(p.Text)
			}
		}
		if b.Len() > 0 {
			return b.String()
		}
	}
	return ""
}

// apply adds one completion (or chunk) to res; it returns an error for an error document.
func (a *Agent) apply(res *result, c *completion, b *strings.Builder) error {
	if len(c.Error) > 0 && string(c.Error) != "null" {
		raw := []byte(`{"error":` + string(c.Error) + `}`)
		msg := errorMessage(raw)
		ctx := contextRefusalOf(msg, raw, nil, a.maxTokens)
		return &StatusError{Code: inBandStatus(c.Error), Message: sanitize(msg, a.keyString()), inBand: true, context: &ctx}
	}
	for i, ch := range c.Choices {
		if i > 0 {
			break // n is never asked for: only the first choice counts
		}
		t := ch.Delta
		if ch.Message != nil {
			t = ch.Message
		}
		if s := t.text(); s != "" {
			if room := MaxReply - b.Len(); len(s) > room {
				s, res.cut = cutAt(s, room), true
			}
			b.WriteString(s)
		}
		if t != nil && t.Refusal != nil {
			// Kept apart from the text: a refusal is no answer (Run tells the user it was
			// declined), and a stream does not show it as one growing.
			res.refusal += cutAt(*t.Refusal, maxRefusal-len(res.refusal))
		}
		res.toolCalls = res.toolCalls || t.callsTools()
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			res.finish = *ch.FinishReason
			res.toolCalls = res.toolCalls || res.finish == "tool_calls" || res.finish == "function_call"
		}
	}
	if c.Usage != nil {
		res.usage = agents.Usage{InputTokens: c.Usage.PromptTokens, OutputTokens: c.Usage.CompletionTokens}
	}
	return nil
}

// inBandStatus is the status an error sent in a 200's body names (an error event of a stream,
// which an endpoint sends when the model fails after the headers went out): its code, as a
// number or a string (vLLM, LiteLLM), else what its type says (OpenAI's server_error,
// Anthropic's overloaded_error, a rate limit), else 200: an error that names nothing.
func inBandStatus(raw json.RawMessage) int {
	var e struct {
		Code json.RawMessage `json:"code"`
		Type string          `json:"type"`
	}
	if json.Unmarshal(raw, &e) != nil {
		return http.StatusOK
	}
	if code, err := strconv.Atoi(strings.Trim(string(e.Code), `"`)); err == nil && code >= 400 && code <= 599 {
		return code
	}
	// OpenAI names a rate limit in code ("rate_limit_exceeded", with type "requests" or
	// "tokens"), others in type: both are read.
	t, c := strings.ToLower(e.Type), strings.ToLower(strings.Trim(string(e.Code), `"`))
	switch {
	case strings.Contains(c, "rate_limit") || strings.Contains(t, "rate_limit"):
		return http.StatusTooManyRequests
	case strings.Contains(t, "overloaded"):
		return http.StatusServiceUnavailable
	case strings.Contains(t, "server_error") || t == "api_error":
		return http.StatusInternalServerError
	}
	return http.StatusOK
}

// cutAt returns the longest prefix of s of at most n bytes that does not split a character.
func cutAt(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// readJSON reads a non-streamed completion, labelled contentType; h bounds what it holds.
func (a *Agent) readJSON(body io.Reader, contentType string, h *holder) (*result, error) {
	raw, err := io.ReadAll(io.LimitReader(body, largeAnswer+1))
	if err == nil && len(raw) > largeAnswer {
		if err := h.need(len(raw)); err != nil {
			return nil, err
		}
		raw, err = io.ReadAll(io.LimitReader(io.MultiReader(bytes.NewReader(raw), body), MaxBody+1))
	}
	if err != nil {
		return nil, &transportError{what: whatBrokeOff, err: a.safeErr(err)}
	}
	if len(raw) > MaxBody {
		return nil, tooLarge("a response body")
	}
	var c completion
	if err := json.Unmarshal(raw, &c); err != nil {
		// Nothing, or a document that ends before it is whole: what a proxy sends when it lost
		// the endpoint's answer, which was never read. A chat completion changes nothing on
		// the endpoint, so it is asked for again, as for a body that broke off (before, the
		// turn failed at once).
		if len(bytes.TrimSpace(raw)) == 0 {
			return nil, &transportError{what: whatBrokeOff, err: errors.New("the answer's body is empty (status 200)")}
		}
		if se, ok := errors.AsType[*json.SyntaxError](err); ok && se.Offset >= int64(len(raw)) && bytes.TrimSpace(raw)[0] == '{' {
			return nil, &transportError{what: whatBrokeOff, err: fmt.Errorf("the answer's body ends before its JSON does, after %d bytes (status 200)", len(raw))}
		}
		// What it is, and how it starts: "invalid character '<'" alone tells the operator
		// nothing of the login page, the web app or the proxy that answered. A page is
		// quoted as its reader sees it (bodyText), as an error status's page is.
		if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) > 0 && t[0] == '<' {
			if text, page, _ := bodyText(t); page {
				return nil, &webPageError{contentType: sanitize(contentType, a.keyString()), text: sanitize(text, a.keyString())}
			}
			return nil, &webPageError{contentType: sanitize(contentType, a.keyString()), text: sanitize(raw, a.keyString()), markup: true}
		}
		return nil, fmt.Errorf("openai agent: response is not a chat completion (Content-Type %q, starting %q): %v",
			sanitize(contentType, a.keyString()), sanitize(raw, a.keyString()), err)
	}
	res := &result{}
	var b strings.Builder
	if err := a.apply(res, &c, &b); err != nil {
		return nil, err
	}
	res.text = b.String()
	return res, nil
}

// readStream reads a server-sent event stream of completion chunks, calling partial with the
// whole text each time it grows (partial is nil when nobody watches the reply grow). The stream
// ends with "data: [DONE]" (or, on some servers, at a clean end of the body after a chunk with
// a finish reason). h bounds what it holds: the data of one event, and the line being read; a
// large answer it takes is given back once the event is decoded, and a later large event takes
// one again. An event that is an error, whose data need not be JSON (streamError), fails the
// read with it.
func (a *Agent) readStream(body io.Reader, partial func(string), h *holder) (*result, error) {
	res := &result{}
	var b strings.Builder
	var data []string
	size := 0       // of data
	eventType := "" // the event's "event:" field, which a stream need not send
	lines := lineReader{r: bufio.NewReaderSize(body, streamBuffer), need: func(n int) error { return h.need(size + n) }}
	dispatch := func() (bool, error) {
		// Once an event is decoded, nothing of it is held but the reply (at most MaxReply): a
		// long stream that once had a large event would otherwise keep one of the large
		// answers to its end, and two such streams every other large answer waiting.
		defer h.release()
		typ := eventType
		eventType = ""
		if len(data) == 0 {
			return false, nil
		}
		payload := strings.Join(data, "\n")
		clear(data) // the array is reused: what it held must not outlive the event
		data, size = data[:0], 0
		if strings.TrimSpace(payload) == "[DONE]" {
			return true, nil
		}
		if value, ok := streamError(typ, payload); ok {
			return false, a.errorField(value, partial != nil && b.Len() > 0)
		}
		var c completion
		if err := json.Unmarshal([]byte(payload), &c); err != nil {
			// How it starts, as readJSON says of a body: "invalid character 'p'" alone tells
			// the operator nothing of what the server or a proxy sent (found by a review).
			return false, fmt.Errorf("openai agent: stream chunk is not a chat completion (starting %q): %v",
				sanitize(payload, a.keyString()), err)
		}
		before := b.Len()
		if err := a.apply(res, &c, &b); err != nil {
			if se, ok := errors.AsType[*StatusError](err); ok && partial != nil && b.Len() > 0 {
				se.shown = true
			}
			return false, err
		}
		if partial != nil && b.Len() > before {
			partial(b.String())
		}
		return false, nil
	}
	for {
		line, err := lines.next()
		if errors.Is(err, ErrTooLarge) {
			return nil, err // no break in the answer: sent again, it would be as long
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				done, derr := dispatch()
				if derr != nil {
					return nil, derr
				}
				if done || res.finish != "" {
					break // [DONE] without its blank line, or a finished reply without [DONE]
				}
				// Neither [DONE] nor a finish reason: a proxy cut the stream off (at its
				// timeout, say) between two events, and the reply is not whole.
				err = io.ErrUnexpectedEOF
			}
			return nil, &transportError{what: whatBrokeOff, err: a.safeErr(err), shown: partial != nil && b.Len() > 0}
		}
		switch {
		case line == "":
			done, err := dispatch()
			if err != nil {
				return nil, err
			}
			// A model that runs on and on (repeating itself, with no max_tokens) is not read
			// to the turn's timeout: the reply is cut, and closing the body stops it.
			if done || res.cut {
				res.text = b.String()
				return res, nil
			}
		case strings.HasPrefix(line, ":"): // a comment (keep-alive)
		default:
			field, value, _ := strings.Cut(line, ":")
			if field == "error" {
				// llama.cpp's server before its late-2025 rework sent an error in a stream as
				// a field of its own, "error: {…}", then "data: [DONE]": the error it is, not
				// an empty reply (errorField).
				return nil, a.errorField(strings.TrimPrefix(value, " "), partial != nil && b.Len() > 0)
			}
			if field == "event" {
				eventType = strings.TrimPrefix(value, " ")
			}
			if field == "data" {
				value = strings.TrimPrefix(value, " ")
				// Lines are bounded one by one; an event that never ends (no blank line)
				// would otherwise grow until the turn's timeout.
				if size += len(value) + 1; size > maxLine {
					return nil, tooLarge("a stream event")
				}
				data = append(data, value)
			}
		}
	}
	res.text = b.String()
	return res, nil
}

// streamError reports whether an event of type typ (its "event:" field, "" without one) whose
// data is payload is an error that is no chat completion chunk, and returns the error's value
// for errorField: the data of an "error" event (Anthropic's and some gateways' "event: error",
// its data JSON or plain text), or the text after "error:" of data that starts so, which is no
// JSON (crane-serve's "data: error: <message>", lucasjinreal/Crane#121). Any other data is read
// as a chunk, an error object in it as apply reads one. Before, such data failed the read as a
// chunk that is no chat completion (a bad reply), the server's message unsaid, and an "error"
// event's JSON without an "error" member was read as a chunk without text.
func streamError(typ, payload string) (string, bool) {
	if typ == "error" {
		return payload, true
	}
	p := strings.TrimSpace(payload)
	if len(p) >= len("error:") && strings.EqualFold(p[:len("error:")], "error:") {
		return strings.TrimSpace(p[len("error:"):]), true
	}
	return "", false
}

// errorField is the error of a stream's "error:" line, value, which llama.cpp's server sent
// until its late-2025 rework (server_sent_event(sink, "error", error_data), then "data:
// [DONE]"): its error object, as a 200's body would hold it under "error" ({"code":400,
// "message":"the request exceeds the available context size…","type":"…"}, with n_prompt_tokens
// and n_ctx for exceed_context_size_error), read as apply reads one (its code is its status);
// an object that holds "error" is read for that, and a value that is no JSON object is a fault
// of the server, taken for a 500 as OpenAI's server_error is (retried unless text was shown),
// its text the message (bodyText; sanitize bounds it and takes out its control characters);
// null is such an error without a message, which apply would read as no error, and the turn
// went on as if none had come. It is also the error of an event that is one (streamError).
// shown is set when text was streamed to the user before it. Before, the line was skipped, and
// the turn ended as a reply without text (or a stream that broke off), the server's reason
// unsaid; and until text that is no JSON was a fault of the server, it was an error that names
// no status, as an error object that names none is: counted refused and not retried, though
// it is what an engine that failed mid-request (crane-serve's "error: CUDA out of memory") or
// a proxy sends.
func (a *Agent) errorField(value string, shown bool) error {
	raw := json.RawMessage(strings.TrimSpace(value))
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil || obj == nil {
		// No JSON error: the engine's or a proxy's own words, a fault of the server that took
		// the request (a refusal of what it holds comes before the stream, as an error
		// status), retried as one unless text was shown.
		se := &StatusError{Code: http.StatusInternalServerError, Message: "an error without a message", inBand: true, shown: shown}
		if text, page, ok := bodyText(raw); ok {
			se.Message, se.plain, se.page = sanitize(text, a.keyString()), true, page
		}
		return se
	}
	if inner, ok := obj["error"]; ok && len(inner) > 0 && string(inner) != "null" {
		raw = inner
	}
	err := a.apply(&result{}, &completion{Error: raw}, &strings.Builder{})
	if se, ok := errors.AsType[*StatusError](err); ok {
		se.shown = shown
	}
	return err
}

// byteOrderMark is UTF-8's, which a server may put before a body.
const byteOrderMark = "\uFEFF"

// lineReader reads the lines of an event stream, which end with CRLF, LF or a lone CR (the
// WHATWG event stream format). A line is returned at its end, without waiting for what
// follows it: after a CR, an LF is skipped at the next line's start.
type lineReader struct {
	r       *bufio.Reader
	afterCR bool // the last line ended with a CR
	// need, when not nil, is told the length of the line being read as it grows, and ends the
	// read with its error.
	need func(n int) error
}

// next returns the next line without its end, at most maxLine bytes; a last line without an
// end is returned at io.EOF.
func (l *lineReader) next() (string, error) {
	if l.afterCR {
		l.afterCR = false
		if b, err := l.r.Peek(1); err == nil && b[0] == '\n' {
			_, _ = l.r.Discard(1)
		}
	}
	var line []byte
	for {
		if _, err := l.r.Peek(1); err != nil {
			if len(line) > 0 && errors.Is(err, io.EOF) {
				return string(line), nil // a last line without its end
			}
			return "", err
		}
		buf, _ := l.r.Peek(l.r.Buffered())
		end := bytes.IndexAny(buf, "\r\n")
		if end < 0 {
			end = len(buf)
		}
		if len(line)+end > maxLine {
			return "", tooLarge("a stream line")
		}
		if l.need != nil {
			if err := l.need(len(line) + end); err != nil {
				return "", err
			}
		}
		line = append(line, buf[:end]...)
		if end < len(buf) {
			l.afterCR = buf[end] == '\r'
			_, _ = l.r.Discard(end + 1)
			return string(line), nil
		}
		_, _ = l.r.Discard(end)
	}
}

// holder is what one attempt holds of an answer: past largeAnswer, one of its Agent's
// maxLargeAnswers. Its methods are called by the attempt's goroutine only. A nil holder bounds
// nothing (for tests of the readers alone).
type holder struct {
	ctx context.Context // the attempt's: a wait ends with it
	// large is Agent.large, never nil (a nil one would make need wait for ever): only New
	// makes an Agent whose calls read an answer. The zero Agent, with no logger or client,
	// panics in Run before any is read; making it usable would take far more than this.
	large chan struct{}
	log   *slog.Logger
	taken bool
}

// need makes room for n bytes of the answer: past largeAnswer it takes one of the large
// answers, waiting while all of them are read, and returns ctx's error if ctx ends first. An
// attempt holds at most one, and never waits holding one, so waits cannot deadlock.
func (h *holder) need(n int) error {
	if h == nil || h.taken || n <= largeAnswer {
		return nil
	}
	select {
	case h.large <- struct{}{}:
	default:
		h.log.Debug("model answer waits: other large answers are being read", "large_answers", cap(h.large))
		select {
		case h.large <- struct{}{}:
		case <-h.ctx.Done():
			return h.ctx.Err()
		}
	}
	h.taken = true
	return nil
}

// release gives back the large answer need took, if any.
func (h *holder) release() {
	if h != nil && h.taken {
		<-h.large
		h.taken = false
	}
}
