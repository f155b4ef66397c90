package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/agentgate/agentgate/internal/logging"
)

// form is how a request is built, as far as the endpoint's refusals decide it: each field is
// set once the endpoint refused a parameter (adapt), for every request from then on.
type form struct {
	// completionTokens sends the bound as max_completion_tokens, not max_tokens.
	completionTokens bool
	// noStreamOptions leaves stream_options out of a streamed request.
	noStreamOptions bool
}

// form is the form of the agent's next request.
func (a *Agent) form() form {
	return form{completionTokens: a.completionTokens.Load(), noStreamOptions: a.noStreamOptions.Load()}
}

// adapt reports whether err is the endpoint's refusal of a parameter that a request in form f
// carried and can name otherwise or do without, and returns the form to send it again in; the
// agent switches to that form for good, and the first request to meet the refusal logs it.
//
//   - max_tokens, refused in favour of max_completion_tokens: OpenAI's reasoning models answer
//     400 "Unsupported parameter: 'max_tokens' is not supported with this model. Use
//     'max_completion_tokens' instead."
//   - stream_options (include_usage, so that a stream ends with its token usage): Azure OpenAI
//     before API version 2024-10-21 answers 400 "Unrecognized request argument supplied:
//     stream_options", proxies in front of older servers "Unknown parameter: 'stream_options'".
//     Left out, the usage of a stream is counted when the endpoint sends it unasked (some
//     servers always do), and is unknown otherwise: every streamed turn failed as "its model
//     endpoint refused the request" before.
//
// Only a refusal that names the parameter switches: any other 400 is the request's own fault,
// and sent again would be refused again.
func (a *Agent) adapt(err error, f form, stream bool, log *slog.Logger) (form, bool) {
	se, ok := errors.AsType[*StatusError](err)
	if !ok || se.inBand || (se.Code != http.StatusBadRequest && se.Code != http.StatusUnprocessableEntity) {
		return f, false
	}
	switch {
	case !f.completionTokens && a.maxTokens > 0 && strings.Contains(se.Message, "max_completion_tokens"):
		f.completionTokens = true
		if a.completionTokens.CompareAndSwap(false, true) {
			log.Info("the model endpoint refused max_tokens and asks for max_completion_tokens; agent.openai.max_tokens goes by that name from now on")
		}
	case stream && !f.noStreamOptions && strings.Contains(se.Message, "stream_options"):
		f.noStreamOptions = true
		if a.noStreamOptions.CompareAndSwap(false, true) {
			log.Warn("the model endpoint refused stream_options; streamed requests go without it from now on, and their token usage is counted only where the endpoint sends it unasked",
				logging.Err(err))
		}
	default:
		return f, false
	}
	return f, true
}

// body encodes the request of conv in form f.
func (a *Agent) body(conv *conversation, stream bool, f form) ([]byte, error) {
	r := chatRequest{
		Model:       a.model,
		Messages:    conv.messages(a.maxHistory, a.budget),
		Temperature: a.temperature,
		MaxTokens:   a.maxTokens,
	}
	if f.completionTokens {
		r.MaxTokens, r.MaxCompletionTokens = 0, a.maxTokens
	}
	if stream {
		r.Stream = true
		if !f.noStreamOptions {
			r.StreamOptions = &streamOptions{IncludeUsage: true}
		}
	}
	b, err := json.Marshal(&r)
	if err != nil {
		return nil, fmt.Errorf("openai agent: encode request: %w", err)
	}
	return b, nil
}
