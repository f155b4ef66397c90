package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
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

// adapt reports whether err is the endpoint's refusal of a parameter that the request it
// refused carried (in its form, StatusError.sent) and can name otherwise or do without: the
// agent switches to the form that does for good (the first request to meet the refusal logs
// it), and the request is sent again, in that form.
//
//   - max_tokens, refused in favour of max_completion_tokens: OpenAI's reasoning models answer
//     400 "Unsupported parameter: 'max_tokens' is not supported with this model. Use
//     'max_completion_tokens' instead." The refusal must name it as a parameter the endpoint
//     does not take (refusedNames.unknown): one of its value (OpenAI's "max_tokens is too
//     large", vLLM's "'max_tokens' or 'max_completion_tokens' is too large" when the context
//     is full) asks for a smaller bound, which the other name would not be either, and one
//     that merely holds "max_completion_tokens" (an echo of the chat) asks for nothing.
//   - stream_options (include_usage, so that a stream ends with its token usage): Azure OpenAI
//     before API version 2024-10-21 answers 400 "Unrecognized request argument supplied:
//     stream_options", proxies in front of older servers "Unknown parameter: 'stream_options'".
//     Left out, the usage of a stream is counted when the endpoint sends it unasked (some
//     servers always do), and is unknown otherwise: every streamed turn failed as "its model
//     endpoint refused the request" before. The refusal must name it as what it refuses
//     (refusedParams), not merely hold it: a proxy or a server that echoes the request in its
//     error, refused for another reason, would otherwise switch it off for good, as would
//     one that echoes a chat whose user pasted such a refusal.
//
// Only a refusal that names the parameter switches: any other 400 is the request's own fault,
// and sent again would be refused again.
func (a *Agent) adapt(err error, stream bool, log *slog.Logger) bool {
	se, ok := errors.AsType[*StatusError](err)
	if !ok || se.inBand || (se.Code != http.StatusBadRequest && se.Code != http.StatusUnprocessableEntity) {
		return false
	}
	f := se.sent
	switch {
	case !f.completionTokens && a.maxTokens > 0 && slices.Contains(se.refused.unknown, "max_tokens"):
		if a.completionTokens.CompareAndSwap(false, true) {
			log.Info("the model endpoint refused max_tokens and asks for max_completion_tokens; agent.openai.max_tokens goes by that name from now on")
		}
	case stream && !f.noStreamOptions && slices.Contains(se.refused.named, "stream_options"):
		if a.noStreamOptions.CompareAndSwap(false, true) {
			log.Warn("the model endpoint refused stream_options; streamed requests go without it from now on, and their token usage is counted only where the endpoint sends it unasked",
				logging.Err(err))
		}
	default:
		return false
	}
	return true
}

// refusedNames is what an endpoint's error names as what it refuses (refusedParams), each
// parameter by its top-level name ("stream_options" for "stream_options.include_usage").
type refusedNames struct {
	// named are the parameters it refuses for any reason: one it does not take, and one whose
	// value it does not take (OpenAI's "max_tokens is too large", with its param).
	named []string
	// unknown are those of named it refuses as parameters it does not take (OpenAI's
	// "Unsupported parameter", whose code says so, pydantic's extra_forbidden): the request
	// must leave them out or name them otherwise, where a value refused asks for another value.
	unknown []string
}

// settingsOnly reports whether r names parameters the endpoint refuses and none of them is the
// conversation's (messages): the refusal is of the agent's configuration (max_tokens, the
// temperature, the model), not of anything a chat sent.
func (r refusedNames) settingsOnly() bool {
	return len(r.named) > 0 && !slices.Contains(r.named, "messages")
}

// add notes the parameter that name starts with (refusedName), as refused; unknown says for
// not being taken.
func (r *refusedNames) add(name string, unknown bool) {
	name = refusedName(name)
	if name == "" {
		return
	}
	if !slices.Contains(r.named, name) {
		r.named = append(r.named, name)
	}
	if unknown && !slices.Contains(r.unknown, name) {
		r.unknown = append(r.unknown, name)
	}
}

// refusedParams returns the request parameters that an endpoint's error body, raw, names as
// what it refuses, in its answer to the request sent. It reads the shapes endpoints send, and
// nothing else of the body: a proxy that echoes the request in its error, or vLLM's validation
// error, whose input is the whole request, holds every parameter sent. Read are the param of
// the body and of its error (OpenAI's, vLLM's; unknown when its code says
// unsupported_parameter or unknown_parameter), the loc of pydantic's validation errors in a
// detail list (FastAPI's 422, Mistral's, also as a JSON string in a message; unknown for
// extra_forbidden), and the phrasings of refusedPhrases in the messages (the body itself when
// it is not JSON).
//
// A phrasing may be the chat's own text, echoed: a user who pasted "Unsupported parameter:
// 'stream_options'" into the chat, sent back in the request that vLLM's validation error or a
// proxy's echoes. So a name that the chat's messages (those of sent) name in a phrasing too
// counts only by a phrasing that starts its message, after the exception names that LiteLLM
// puts first ("litellm.BadRequestError: OpenAIException - "), or by a param or loc, which no
// echo holds; the phrasings of OpenAI, Azure OpenAI and Groq start theirs.
func refusedParams(raw, sent []byte) refusedNames {
	var r refusedNames
	type phrased struct {
		name           string
		unknown, leads bool // leads: the phrasing starts its message
	}
	var phrasings []phrased
	inMessage := func(s string) {
		start := len(messageStart.FindString(s))
		eachPhrased(s, func(name string, unknown bool, at int) {
			phrasings = append(phrasings, phrased{name, unknown, at == start})
		})
	}
	var doc any
	if json.Unmarshal(raw, &doc) != nil {
		inMessage(string(raw))
	} else {
		r.walk(doc, inMessage)
	}
	var chat *refusedNames // read only for a phrasing inside its message, which may be an echo
	for _, p := range phrasings {
		if !p.leads && chat == nil {
			chat = chatRefusals(sent)
		}
		if p.leads || !slices.Contains(chat.named, refusedName(p.name)) {
			r.add(p.name, p.unknown)
		}
	}
	return r
}

// eachPhrased calls f with each name that a phrasing of refusedPhrases names in s, whether as
// unknown, and the index in s where the phrasing starts.
func eachPhrased(s string, f func(name string, unknown bool, at int)) {
	for _, p := range refusedPhrases {
		for _, m := range p.re.FindAllStringSubmatchIndex(s, -1) {
			for name := range strings.SplitSeq(s[m[2]:m[3]], ",") {
				f(name, p.unknown, m[0])
			}
		}
	}
}

// walk notes the params and locs of the error body doc, and hands its messages to inMessage.
func (r *refusedNames) walk(doc any, inMessage func(string)) {
	// Only through the keys error, message and detail: never into a validation error's input,
	// nor into anything else the body holds.
	var walk func(v any, depth int)
	walk = func(v any, depth int) {
		if depth > 4 {
			return
		}
		switch v := v.(type) {
		case string:
			inMessage(v)
			if t := strings.TrimSpace(v); strings.HasPrefix(t, "{") || strings.HasPrefix(t, "[") {
				var inner any
				if json.Unmarshal([]byte(t), &inner) == nil {
					walk(inner, depth+1)
				}
			}
		case map[string]any:
			if p, ok := v["param"].(string); ok {
				code, _ := v["code"].(string)
				r.add(p, code == "unsupported_parameter" || code == "unknown_parameter")
			}
			for _, k := range []string{"error", "message", "detail"} {
				walk(v[k], depth+1)
			}
		case []any:
			for _, e := range v {
				if ve, ok := e.(map[string]any); ok {
					if loc, ok := ve["loc"].([]any); ok {
						r.add(locName(loc), extraForbidden(ve))
						continue
					}
				}
				walk(e, depth+1)
			}
		}
	}
	walk(doc, 0)
}

// refusedName is the parameter that name, as a refusal writes it, starts with: its leading
// word, "stream_options" of "'stream_options'", of "stream_options.include_usage", of
// "'stream_options': {…", and of "include_usage" alone (nestedParams).
func refusedName(name string) string {
	name = strings.TrimLeft(name, " '\"{[")
	if i := strings.IndexFunc(name, func(r rune) bool { return !isWordRune(r) }); i >= 0 {
		name = name[:i]
	}
	if p, ok := nestedParams[name]; ok {
		return p
	}
	return name
}

// nestedParams are the fields inside a parameter of the agent's request that a refusal may name
// alone (Go's encoding/json names only the field it does not know), with the parameter that
// holds them: stream_options.include_usage.
var nestedParams = map[string]string{"include_usage": "stream_options"}

// messageStart matches what may come before the words of an error message: space, and the
// exception names that LiteLLM puts first ("litellm.BadRequestError: OpenAIException - ").
var messageStart = regexp.MustCompile(`^\s*(?:[\w.]*(?:Error|Exception)\s*[:-]?\s*)*`)

// chatRefusals returns the parameters that the messages of the request sent name in a
// refusal's phrasing (refusedPhrases): their text is the chat's, which an error may echo.
func chatRefusals(sent []byte) *refusedNames {
	r := &refusedNames{}
	for _, text := range chatTexts(sent) {
		eachPhrased(text, func(name string, unknown bool, _ int) { r.add(name, unknown) })
	}
	return r
}

// chatTexts returns the texts of the messages of the request sent (its body), which an
// endpoint's error may echo.
func chatTexts(sent []byte) []string {
	var req struct {
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(sent, &req) // a request that does not decode holds no text to echo
	texts := make([]string, len(req.Messages))
	for i, m := range req.Messages {
		texts[i] = m.Content
	}
	return texts
}

// extraForbidden reports whether the pydantic validation error ve refuses its loc as a field
// the model does not have: pydantic 2's extra_forbidden, pydantic 1's value_error.extra.
func extraForbidden(ve map[string]any) bool {
	typ, _ := ve["type"].(string)
	msg, _ := ve["msg"].(string)
	return typ == "extra_forbidden" || typ == "value_error.extra" ||
		strings.Contains(msg, "Extra inputs are not permitted") || strings.Contains(msg, "extra fields not permitted")
}

// locName is the request parameter a pydantic validation error's loc names: its first element
// after "body" (FastAPI's), "" for one of the whole body.
func locName(loc []any) string {
	if len(loc) > 0 && loc[0] == "body" {
		loc = loc[1:]
	}
	if len(loc) == 0 {
		return ""
	}
	name, _ := loc[0].(string)
	return name
}

// refusedPhrases are the ways an endpoint's message names a parameter it refuses; the first
// group holds the name, or names apart by commas. unknown: as one it does not take.
var refusedPhrases = []struct {
	re      *regexp.Regexp
	unknown bool
}{
	// OpenAI and Azure OpenAI ("Unrecognized request argument supplied: stream_options",
	// "Unrecognized request arguments supplied: a, b", "Unknown parameter: 'stream_options'.",
	// "Unsupported parameter: 'max_tokens' is not supported with this model."), and the
	// proxies and backends that word theirs alike ("Unsupported parameter: stream_options").
	{regexp.MustCompile(`(?i)(?:unknown|unsupported|unrecognized)(?: request)? (?:parameter|argument|field)s?(?: supplied)?: ('?[\w.]+'?(?:, *'?[\w.]+'?)*)`), true},
	// Groq: "property 'stream_options' is unsupported, did you mean 'stream'?"
	{regexp.MustCompile(`(?i)property '([\w.]+)' is unsupported`), true},
	// Azure AI model inference: "Validation error at #/stream_options: Extra inputs are not
	// permitted"; a value refused, "Validation error at #/max_tokens: Input should be …".
	{regexp.MustCompile(`(?i)validation error at #/([\w.]+)`), false},
	{regexp.MustCompile(`(?i)validation error at #/([\w.]+): extra inputs are not permitted`), true},
	// vLLM before it knew stream_options: FastAPI's validation errors as Python's repr,
	// "[{'type': 'extra_forbidden', 'loc': ('body', 'stream_options'), …".
	{regexp.MustCompile(`'loc': \('body', '([\w.]+)'`), false},
	{regexp.MustCompile(`'type': 'extra_forbidden', 'loc': \('body', '([\w.]+)'`), true},
	// vLLM's own validation errors: "… (parameter=stream_options)", or with the value refused:
	// "'max_tokens' or 'max_completion_tokens' is too large: … (parameter=max_tokens, value=…)".
	{regexp.MustCompile(`\(parameter=([\w.]+)[,)]`), false},
	// pydantic's text: "stream_options\n  Extra inputs are not permitted [type=extra_forbidden…".
	{regexp.MustCompile(`([\w.]+)\s+Extra inputs are not permitted`), true},
	// LiteLLM: "litellm.UnsupportedParamsError: openrouter does not support parameters:
	// {'stream_options': {'include_usage': True}}, for model=…" (or a list of names).
	{regexp.MustCompile(`(?i)does not support parameters: [\[{]([^\]}]*)`), true},
	// LiteLLM passing a provider's error on as Python's repr: "litellm.BadRequestError:
	// OpenAIException - Error code: 400 - {'error': {'message': 'max_tokens is too large: …',
	// 'type': 'invalid_request_error', 'param': 'max_tokens', 'code': None}}", the param that
	// the error's JSON would give; unknown when its code says so.
	{regexp.MustCompile(`'param': '([\w.]+)'`), false},
	{regexp.MustCompile(`'param': '([\w.]+)', 'code': '(?:unsupported|unknown)_parameter'`), true},
	// serde's, which axum-based servers answer (a 422 in plain text): "Failed to deserialize
	// the JSON body into the target type: unknown field `stream_options`, expected one of
	// `model`, …", or for a field inside a parameter, after its path: "…target type:
	// stream_options: unknown field `include_usage`, expected …". The names it expects are not
	// what it refuses.
	{regexp.MustCompile(`target type: ([\w]+)[\w.\[\]]*: unknown field ` + "`"), true},
	{regexp.MustCompile(`unknown field ` + "`([\\w.]+)`"), true},
	// Go's encoding/json, which servers that decode the request with DisallowUnknownFields
	// answer (http.Error's plain text, or in an error's message): `json: unknown field
	// "stream_options"`, in double quotes (decode.go's fmt.Errorf("json: unknown field %q",
	// key)), of a field inside a parameter by its own name alone ("include_usage"; see
	// refusedName). Before, it named nothing. Its quotes may be escaped: a proxy that passes
	// the server's JSON body on as text in its message (as LiteLLM passes Anthropic's on,
	// "AnthropicException - {\"type\":\"error\",…}", BerriAI/litellm#16525) holds `json:
	// unknown field \"stream_options\"` once its own JSON is read. encoding/json/v2's
	// RejectUnknownMembers (GOEXPERIMENT=jsonv2 since Go 1.25) words it `unknown object member
	// name "include_usage" within "/stream_options"`. Before, neither named anything.
	{regexp.MustCompile(`json: unknown field \\?"([\w.]+)\\?"`), true},
	{regexp.MustCompile(`unknown object member name \\?"([\w.]+)\\?"`), true},
}

// isWordRune reports whether r may be part of a parameter's name.
func isWordRune(r rune) bool {
	return r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
}

// body encodes the request of msgs (a conversation's messages) in form f.
func (a *Agent) body(msgs []chatMessage, stream bool, f form) ([]byte, error) {
	r := chatRequest{
		Model:       a.model,
		Messages:    msgs,
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
