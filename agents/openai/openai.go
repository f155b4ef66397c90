package openai

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/logging"
)

// Defaults for the zero values of Config.
const (
	DefaultTimeout    = 2 * time.Minute
	DefaultMaxBackoff = 30 * time.Second
)

// MaxSteerRounds is how many more model calls one turn may make for messages steered into it.
const MaxSteerRounds = 3

// Config configures an Agent.
type Config struct {
	// BaseURL is the API root, such as https://api.openai.com/v1; requests go to its path +
	// "/chat/completions", with its query (such as Azure's ?api-version=…) kept.
	BaseURL string
	// Model is the model name sent with every request.
	Model string
	// APIKeyEnv names the environment variable New reads the API key from. Empty sends no
	// Authorization header (a local endpoint); a named variable that is unset or empty is an
	// error.
	APIKeyEnv    string
	SystemPrompt string
	// Temperature is sent when not nil (0 to 2).
	Temperature *float64
	// MaxTokens bounds the reply (max_tokens); zero leaves it to the endpoint.
	MaxTokens int
	// Timeout bounds one turn, retries and waits included; zero means DefaultTimeout.
	Timeout time.Duration
	// MaxHistory is how many history messages a request carries at most; zero sends none.
	MaxHistory int
	// TokenBudget bounds a request's estimated tokens (EstimateTokens) by dropping the oldest
	// history messages; zero means no budget.
	TokenBudget int
	// MaxRetries is how many times a failed call is tried again; zero never retries.
	MaxRetries int
	// MaxBackoff caps the wait before a retry, and the Retry-After an endpoint may ask for;
	// zero means DefaultMaxBackoff.
	MaxBackoff time.Duration
	// HTTPClient sends the requests; nil uses a client of its own, which follows no redirect.
	// Its Timeout should be zero: a stream lasts as long as the reply.
	HTTPClient *http.Client
	// Logger receives debug lines per call and warnings per retry; nil discards them.
	Logger *slog.Logger
	// Sleep waits d or until ctx ends, returning ctx's error then; nil uses a timer. Tests
	// inject one that records the waits.
	Sleep func(ctx context.Context, d time.Duration) error
	// Now is the clock an HTTP-date Retry-After is read against; nil is time.Now.
	Now func() time.Time
	// Jitter spreads a computed backoff (not a wait the endpoint asked for), so that turns
	// that failed together do not retry together; nil waits from half the backoff to all of it
	// at random. Tests inject the identity.
	Jitter func(backoff time.Duration) time.Duration
	// Requests, when not nil, is told the result (one of RequestResults) of every request to
	// the endpoint, each retry its own: the daemon counts them in agentgate_model_requests_total.
	Requests func(result string)
}

// Agent answers turns with chat completions. Create it with New (the zero value is not
// usable); it is safe for concurrent use.
type Agent struct {
	url          string
	model        string
	key          *apiKey // a pointer, so that %v of an Agent never prints it
	systemPrompt string
	temperature  *float64
	maxTokens    int
	timeout      time.Duration
	maxHistory   int
	budget       int
	maxRetries   int
	maxBackoff   time.Duration
	client       *http.Client
	log          *slog.Logger
	sleepFn      func(ctx context.Context, d time.Duration) error
	nowFn        func() time.Time
	requests     func(result string)
	jitter       func(time.Duration) time.Duration
	// paused is when the endpoint's last rate limit ends (nanoseconds after epoch; zero: none
	// met): every request waits for it, so that one 429 does not meet a storm of requests
	// behind it.
	paused atomic.Int64
	// asked is when the last wait the endpoint asked for (Retry-After) ends, as paused: a
	// request that failed itself keeps its own spread backoff unless this is later (paused
	// holds the others).
	asked atomic.Int64
	// epoch is the agent's start on nowFn's clock, which the pauses are measured from.
	epoch time.Time
	// retryLines limits the line of a retried call to one a minute.
	retryLines logging.Limiter
	// pauseLines limits the line of a call held by another's rate limit to one a minute.
	pauseLines logging.Limiter
	// large holds a value for each answer past largeAnswer being read (maxLargeAnswers at
	// most): what the calls of the Agent hold of their answers together is bounded.
	large chan struct{}
	// refusals is the endpoint's last refusal of what a request held, and whether it refuses
	// every request so (refusesEvery).
	refusals refusalLog
	// overflowLines limits the line of a max_tokens that leaves the conversation no room to
	// one a minute (overflowed).
	overflowLines logging.Limiter
	// budgetCut is set once the token budget left history out of a request (logCut).
	budgetCut atomic.Bool
	// completionTokens is set once the endpoint refused max_tokens, asking for
	// max_completion_tokens (OpenAI's reasoning models): the bound goes by that name from then on.
	completionTokens atomic.Bool
	// noStreamOptions is set once the endpoint refused stream_options (Azure OpenAI before API
	// version 2024-10-21, servers that refuse what they do not know): streamed requests go
	// without it from then on.
	noStreamOptions atomic.Bool
}

type apiKey struct{ v string }

var _ agents.Steerer = (*Agent)(nil)

// New returns an Agent for c, reading the API key from the environment variable c.APIKeyEnv.
// Every problem of c is reported at once; none of the errors carries the key or the URL.
func New(c Config) (*Agent, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("openai agent: "+format, args...)) }
	u, err := url.Parse(c.BaseURL)
	if c.BaseURL == "" {
		bad("base URL is empty (agent.openai.base_url)")
	} else if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("base URL must be an absolute http or https URL (agent.openai.base_url)")
	}
	if strings.TrimSpace(c.Model) == "" {
		bad("model is empty (agent.openai.model)")
	}
	key := ""
	if c.APIKeyEnv != "" {
		v, ok := os.LookupEnv(c.APIKeyEnv)
		if !ok || strings.TrimSpace(v) == "" {
			bad("environment variable %s (agent.openai.api_key_env) is not set or empty: set it to the endpoint's API key, or set agent.openai.api_key_env: \"\" for a server that takes none", c.APIKeyEnv)
		}
		key = strings.TrimSpace(v)
	}
	if t := c.Temperature; t != nil && (*t < 0 || *t > 2) {
		bad("temperature %v is not from 0 to 2", *t)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"max tokens", int64(c.MaxTokens)}, {"max history", int64(c.MaxHistory)},
		{"token budget", int64(c.TokenBudget)}, {"max retries", int64(c.MaxRetries)},
		{"timeout", int64(c.Timeout)}, {"max backoff", int64(c.MaxBackoff)},
	} {
		if f.v < 0 {
			bad("negative %s", f.name)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	// The path goes after base_url's path, not after its query (Azure's api-version, a proxy's
	// key): a query stays where it was.
	endpoint := u.JoinPath("chat", "completions")
	endpoint.Fragment, endpoint.RawFragment = "", ""
	a := &Agent{
		url:          endpoint.String(),
		model:        c.Model,
		key:          &apiKey{key},
		systemPrompt: c.SystemPrompt,
		temperature:  c.Temperature,
		maxTokens:    c.MaxTokens,
		timeout:      c.Timeout,
		maxHistory:   c.MaxHistory,
		budget:       c.TokenBudget,
		maxRetries:   c.MaxRetries,
		maxBackoff:   c.MaxBackoff,
		client:       c.HTTPClient,
		log:          c.Logger,
		sleepFn:      c.Sleep,
		nowFn:        c.Now,
		requests:     c.Requests,
		jitter:       c.Jitter,
		large:        make(chan struct{}, maxLargeAnswers),
	}
	if c.Temperature != nil {
		t := *c.Temperature
		a.temperature = &t
	}
	if a.timeout == 0 {
		a.timeout = DefaultTimeout
	}
	if a.maxBackoff == 0 {
		a.maxBackoff = DefaultMaxBackoff
	}
	if a.client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		// Every request goes to one host, up to agent.max_concurrent at once (32 by default):
		// with net/http's 2 idle connections a host, the others' closed as they ended, and the
		// next calls opened new ones (a TLS handshake each, a socket left in TIME_WAIT). Idle
		// ones close after IdleConnTimeout.
		tr.MaxIdleConnsPerHost = tr.MaxIdleConns
		a.client = &http.Client{
			Transport: tr,
			// A redirect is answered as an error (redirectError), not followed.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if a.requests == nil {
		a.requests = func(string) {}
	}
	if a.jitter == nil {
		a.jitter = func(d time.Duration) time.Duration { return d/2 + rand.N(d/2+1) }
	}
	a.epoch = a.now()
	if key != "" && u.Scheme == "http" && !config.LoopbackHost(u.Hostname()) {
		a.log.Warn("openai agent sends its API key over plain http", "host", u.Hostname())
	}
	return a, nil
}

// CanSteer reports true: Run takes steered messages between its model calls.
func (a *Agent) CanSteer() bool { return true }

// FlushLines reports the events the agent's limited lines hold back (logging.Limiter.Flush):
// the daemon calls it as it stops, once the agent's calls have ended. Else their limiter's
// timer reported them up to a minute later, when the daemon had exited: the retries of the
// last minute of an endpoint's outage were counted nowhere (TestRetryLineNamesTheTurn).
func (a *Agent) FlushLines() {
	logging.FlushAll(&a.retryLines, &a.pauseLines, &a.overflowLines)
}

func (a *Agent) keyString() string {
	if a.key == nil {
		return ""
	}
	return a.key.v
}

func (a *Agent) now() time.Time {
	if a.nowFn != nil {
		return a.nowFn()
	}
	return time.Now()
}

func (a *Agent) sleep(ctx context.Context, d time.Duration) error {
	if a.sleepFn != nil {
		return a.sleepFn(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run answers req with one model call, or more when messages are steered into the turn (see
// the package comment). It returns ErrTimeout when the turn outlived Config.Timeout, an error
// wrapping ctx's when ctx ended, a *StatusError when the endpoint refused, ErrEmptyReply
// when the model said nothing, and ErrTooLarge when its answer was larger than MaxBody. With an error, the Response (when not nil) still carries the
// tokens the turn spent, and counts Unseen the messages steered in during the call that failed.
func (a *Agent) Run(ctx context.Context, req *agents.Request) (*agents.Response, error) {
	if req == nil {
		return nil, errors.New("openai agent: run: nil request")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("openai agent: run: %w", err)
	}
	parent := ctx
	ctx, cancel := context.WithTimeoutCause(ctx, a.timeout, ErrTimeout)
	defer cancel()

	conv := a.newConversation(req)
	log := a.log.With("session", req.Identity.SessionKey, "turn", req.Identity.TurnID)
	steer := req.Steer
	var answers []string
	var usage agents.Usage
	cut := 0     // the most history messages a request of the turn left out (logged)
	carried := 0 // the steered messages the call of this round carries that no answer followed
	// ridersLeftOut is how many earlier messages that got no answer the request that answered
	// the turn's own left out, once the endpoint refused the request with them.
	ridersLeftOut := 0
	stream := req.Partial != nil
	for round := 0; ; round++ {
		msgs := conv.messages(a.maxHistory, a.budget)
		if conv.cut > cut {
			cut = conv.cut
			a.logCut(conv, log)
		}
		partial := req.Partial
		if partial != nil && len(answers) > 0 {
			before := strings.Join(answers, "\n\n") + "\n\n"
			partial = func(s string) { req.Partial(before + s) }
		}
		takeSteer := steer
		if round >= MaxSteerRounds {
			takeSteer = nil // the last call: every message taken must be answered
		}
		res, steered, open, retried, err := a.send(ctx, msgs, partial, takeSteer, stream, 0, log)
		every, probed := false, false
		if se, ok := a.refusesWhatItHolds(err); ok && round == 0 {
			// Refused for what it holds, without a word of what: the earlier messages that got
			// no answer, sent along merged into the turn's own, may be at fault, or the
			// configuration, or the endpoint. Sent again without them, an answer shows they
			// were, and answers the turn; the same refusal shows they were not, and nothing is
			// left out (refusesEvery).
			without, riders := withoutRiders(req.History)
			probe := *conv
			probe.history = chatMessages(without)
			pm := probe.messages(a.maxHistory, a.budget)
			if riders == 0 || ctx.Err() != nil || slices.Equal(pm, msgs) {
				// Nothing to leave out (none, or none the request carried): another session's
				// refusal may still show it is the endpoint's.
				every = a.refusesEvery(se, req.Identity.SessionKey, false, log)
			} else {
				log.Debug("model endpoint refused the request; sent again without the earlier messages that got no answer",
					"left_out", riders, logging.Err(err))
				if !open {
					takeSteer = nil
				}
				// Its retries count on from the refused request's: the call is retried
				// max_retries times in all, as in the form a refusal asks for (send), not as
				// often again without the riders.
				pres, more, stillOpen, _, perr := a.send(ctx, pm, partial, takeSteer, stream, retried, log)
				steered, open = append(steered, more...), open && stillOpen
				switch pse, refused := a.refusesWhatItHolds(perr); {
				case perr == nil:
					res, err, ridersLeftOut = pres, nil, riders
					*conv = probe
				case refused && sameRefusal(pse, se) && resends(req.Messages, req.History[len(without):]):
					// The turn sends again a message it carries as a rider: the request without
					// the riders still holds it, and its refusal shows nothing of the endpoint.
					// Taken as one with nothing to leave out, another session's may still show
					// it; before, one user who sent again the one message the endpoint cannot
					// take read as an endpoint that refuses every request, with an ERR.
					every = a.refusesEvery(se, req.Identity.SessionKey, false, log)
				case refused && sameRefusal(pse, se):
					every = a.refusesEvery(se, req.Identity.SessionKey, true, log)
					probed = true
				default:
					err = perr // what the endpoint says of the request it would take
					probed = refused
				}
			}
		}
		if !open {
			steer = nil
		}
		if res != nil {
			usage.InputTokens += res.usage.InputTokens
			usage.OutputTokens += res.usage.OutputTokens
		}
		if err != nil {
			if len(answers) > 0 && parent.Err() == nil {
				// A call for steered messages failed: the answers before it stand (a streaming
				// user has seen them), and the steered messages run next, one turn each.
				log.Warn("model call for messages steered into the turn failed; the turn answers with the replies before it, and those messages run next, one turn each",
					"messages", carried+len(steered), logging.Err(err))
				return &agents.Response{Text: strings.Join(answers, "\n\n"), Usage: usage, Unseen: carried + len(steered), RidersLeftOut: ridersLeftOut > 0}, nil
			}
			// The messages taken during the failed call never reached the model: they run
			// next, one turn each, not fail (or, declined, be left out) with this one's.
			return unseen(spent(usage), len(steered)), a.refusal(a.overflowed(err, log), every, probed)
		}
		text := strings.TrimSpace(res.text)
		if text == "" && len(answers) == 0 {
			// The turn's own messages got no answer: the turn fails as noText says, and the
			// messages steered in meanwhile run next, one turn each. Sent again together with a
			// message the model had just declined (or asked a tool for), they were declined
			// with it, left out of the conversation unanswered.
			return unseen(spent(usage), len(steered)), a.noText(res)
		}
		if text == "" {
			// The call for steered messages got no answer (the model declined them, asked for
			// a tool, said nothing): the answers before it stand, and the steered messages run
			// next, one turn each, where they get an answer, or the notice that says why not,
			// as do those steered in during this call. Counted answered, their senders got
			// nothing; and those steered in meanwhile were sent again joined to the messages
			// the model had just declined.
			log.Warn("model answered the messages steered into the turn with no text; they run next, one turn each",
				"messages", carried+len(steered), "finish_reason", res.finish, "refused", strings.TrimSpace(res.refusal) != "", "tool_call", res.toolCalls)
			return &agents.Response{Text: strings.Join(answers, "\n\n"), Usage: usage, Unseen: carried + len(steered), RidersLeftOut: ridersLeftOut > 0}, nil
		}
		if text != "" {
			conv.tail = append(conv.tail, chatMessage{Role: roleAssistant, Content: text})
			note := ""
			if n := cutNote(res); n != "" {
				// Said, or the user takes the start of an answer for all of it.
				log.Warn("model reply cut off", "finish_reason", res.finish, "longer_than_max_reply", res.cut)
				note = "\n\n" + n
			}
			if ridersLeftOut > 0 && len(answers) == 0 {
				note += "\n\n" + ridersNote(ridersLeftOut)
			}
			if note != "" {
				text = cutAt(text, MaxReply-len(note)) + note
				if partial != nil {
					partial(text)
				}
			}
			answers = append(answers, text)
			carried = 0
		}
		if len(steered) == 0 {
			break
		}
		a.log.Debug("steered messages join the turn", "messages", len(steered), "turn", req.Identity.TurnID)
		conv.tail = append(conv.tail, chatMessages(steered)...)
		carried += len(steered)
	}
	return &agents.Response{Text: strings.Join(answers, "\n\n"), Usage: usage, RidersLeftOut: ridersLeftOut > 0}, nil
}

// logCut logs that the turn's request left out conv.cut history messages: at Debug once a
// turn (again only when a later call of the turn leaves out more), and at Info the first time
// the token budget does so, which tells an operator that the model no longer sees the start
// of long conversations without a line for every turn of each.
func (a *Agent) logCut(conv *conversation, log *slog.Logger) {
	by := "max_history"
	if conv.byBudget {
		by = "token_budget"
	}
	log.Debug("request history trimmed", "left_out", conv.cut, "sent", len(conv.history)-conv.cut, "by", by)
	if conv.byBudget && a.budgetCut.CompareAndSwap(false, true) {
		log.Info("a request left out older history to fit agent.openai.token_budget; each turn's cut is logged at debug from now on",
			"token_budget", a.budget, "left_out", conv.cut, "sent", len(conv.history)-conv.cut)
	}
}

// noText is the error of a model call whose answer has no text, res. The model declined the
// message (its refusal field, its content filter), or asked to call a tool, which no request
// offers: each is an agents.Refusal that tells the user why, and is Declined, so that later
// turns leave the message out. Kept, it would be sent again joined to the next message (a
// failed turn gets no reply between them) and make that turn fail the same way: a model asks
// again for the tool the message needs, and declines again what it declined. A model that
// reached its length limit first is noRoomToAnswer's.
func (a *Agent) noText(res *result) error {
	err := fmt.Errorf("%w (finish reason %q)", ErrEmptyReply, res.finish)
	switch {
	case strings.TrimSpace(res.refusal) != "":
		return &agents.Refusal{Notice: "the model refused to answer it, saying: " + refusalWords(res.refusal), Declined: true,
			Err: fmt.Errorf("%w: the model refused to answer (its refusal field)", err)}
	case res.finish == "content_filter":
		return &agents.Refusal{Notice: "the model declined to answer it (its content filter)", Declined: true, Err: err}
	case res.toolCalls:
		return &agents.Refusal{Notice: "the model asked to call a tool instead of answering, and agentgate offers its models none", Declined: true,
			Err: fmt.Errorf("%w: the model asked to call a tool, which agentgate does not offer", err)}
	case res.finish == "length":
		return a.noRoomToAnswer(err)
	}
	return err
}

// refusalWords is a model's refusal as a notice quotes it, at its end: trimmed, its final
// period left to the notice's own.
func refusalWords(refusal string) string {
	return strings.TrimSuffix(strings.TrimSpace(refusal), ".")
}

// noRoomToAnswer is the error of a model that reached its length limit before it said anything
// (err): its max_tokens, which a reasoning model may spend thinking before it answers, or, with
// none set, the end of its context. Either way the same message would fail the same way.
func (a *Agent) noRoomToAnswer(err error) error {
	if a.maxTokens > 0 {
		return &agents.Refusal{
			Notice: "the model used up its token limit before it answered, which the operator has to fix",
			Err:    fmt.Errorf("%w: it reached max_tokens (%d) before it answered (a reasoning model spends them thinking first): raise agent.openai.max_tokens, or set it to 0", err, a.maxTokens),
		}
	}
	return &agents.Refusal{
		Notice: "the conversation is too long for the model: send /new to start a fresh session, or a shorter message",
		Err:    fmt.Errorf("%w: it reached the end of its context before it answered", err),
	}
}

// cutNote is what a reply gets appended when it was stopped before its end, by the model or at
// MaxReply; "" for a reply that ended by itself. A model that stopped to call a tool ("let me
// look that up") ends there too: no answer follows.
func cutNote(res *result) string {
	if res.cut {
		return noteTooLong
	}
	if res.toolCalls {
		return noteToolCall
	}
	switch res.finish {
	case "length":
		return noteLengthLimit
	case "content_filter":
		return noteContentFilter
	}
	return ""
}

// The notes cutNote appends to a reply, after a blank line.
const (
	noteTooLong       = "[…cut off: the reply is longer than agentgate takes]"
	noteLengthLimit   = "[…cut off: the model reached its length limit]"
	noteContentFilter = "[…cut off by the model's content filter]"
	noteToolCall      = "[…cut off: the model asked to call a tool, which agentgate does not offer]"
)

// withoutCutNote returns an assistant message of the history without the notes cutNote and
// ridersNote appended to it: a note is for the user, and a model shown it in its own words may
// take to writing it. A note ends the answer it was appended to, which the answers to messages
// steered into the turn follow, a blank line apart (Run joins them): it is taken out there too.
// Before, only a note that ended the reply was, and the rider note of a turn that answered a
// steered message after it was shown to the model at every later turn.
func withoutCutNote(text string) string {
	if !strings.Contains(text, "\n\n[") {
		return text // no note: the common case costs no copy
	}
	for _, note := range []string{noteRiderLeftOut, noteRidersLeftOut, noteTooLong, noteLengthLimit, noteContentFilter, noteToolCall} {
		text = strings.ReplaceAll(text, "\n\n"+note+"\n\n", "\n\n")
		text, _ = strings.CutSuffix(text, "\n\n"+note)
	}
	return text
}

// unseen returns resp with n messages taken from Request.Steer counted unseen; resp itself
// (nil when it is) for none.
func unseen(resp *agents.Response, n int) *agents.Response {
	if n == 0 {
		return resp
	}
	if resp == nil {
		resp = &agents.Response{}
	}
	resp.Unseen = n
	return resp
}

func spent(u agents.Usage) *agents.Response {
	if u == (agents.Usage{}) {
		return nil
	}
	return &agents.Response{Usage: u}
}

// send makes one model call (round) and, refused for a parameter the agent can name otherwise
// or do without, sends it again at once in the form the refusal asks for (adapt), also when
// messages were steered in meanwhile (they join the call after it, as if taken during this one),
// and also when another turn's request met the refusal first: this one was sent before the
// switch. Each form changes one parameter for good, so a call is sent again at most twice; its
// retries count on from retried, those of the call before it of which it is another form. It
// returns what round does.
func (a *Agent) send(ctx context.Context, msgs []chatMessage, partial func(string), steer <-chan agents.Message, stream bool, retried int, log *slog.Logger) (*result, []agents.Message, bool, int, error) {
	res, steered, open, retried, err := a.round(ctx, msgs, partial, steer, retried, log)
	for err != nil && a.adapt(err, stream, log) {
		if !open {
			steer = nil
		}
		var more []agents.Message
		var stillOpen bool
		res, more, stillOpen, retried, err = a.round(ctx, msgs, partial, steer, retried, log)
		steered, open = append(steered, more...), open && stillOpen
	}
	return res, steered, open, retried, err
}

// round makes one model call (with its retries, counted on from retried: see call) and, while
// it runs, takes the messages steered into the turn from steer (when not nil). It reports
// whether steer is still open, and how many times the call was retried in all.
func (a *Agent) round(ctx context.Context, msgs []chatMessage, partial func(string), steer <-chan agents.Message, retried int, log *slog.Logger) (*result, []agents.Message, bool, int, error) {
	type outcome struct {
		res     *result
		retried int
		err     error
		// panicked is a panic of the call (its response's handling, or partial), with its
		// stack: raised again on Run's goroutine, where the runtime recovers an agent's panic
		// (it crashes the turn's session, which quarantines a message that does so 3 times).
		// Left on this goroutine, it would end the process.
		panicked any
	}
	done := make(chan outcome, 1)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				done <- outcome{panicked: fmt.Sprintf("%v\n\nthe model call's goroutine:\n%s", v, debug.Stack())}
			}
		}()
		res, retried, err := a.call(ctx, msgs, partial, retried, log)
		done <- outcome{res: res, retried: retried, err: err}
	}()
	var steered []agents.Message
	open := true
	for {
		select {
		case o := <-done:
			if o.panicked != nil {
				panic(o.panicked)
			}
			// Take what is already waiting: it joins the next call rather than the next turn.
			for steer != nil {
				select {
				case m, ok := <-steer:
					if !ok {
						steer, open = nil, false
						continue
					}
					steered = append(steered, m)
					continue
				default:
				}
				break
			}
			return o.res, steered, open, o.retried, o.err
		case m, ok := <-steer:
			if !ok {
				steer, open = nil, false
				continue
			}
			a.log.Debug("steered message taken", "message_id", m.MessageID)
			steered = append(steered, m)
		}
	}
}
