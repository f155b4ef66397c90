// Package openai is the agent backend that answers a turn with a chat completion from any
// OpenAI-compatible endpoint (agent.backend: openai): POST {base_url}/chat/completions (a query
// of base_url is kept after the path), built on net/http and encoding/json alone.
//
// The request of a turn is, in this order: the system prompt (when set); agentgate's notes for
// the turn, such as the continuity note after a reset (lines joined); the turn's history; its
// new messages. Messages of one role in a row are then joined into one, a blank line apart (the
// prompt and the notes are one system message; a message whose turn failed and the next one,
// one user message), because many chat templates refuse roles that do not alternate. History
// and new messages keep their roles user and assistant; notices (what agentgate itself told
// the user) are left out, because the model said none of them. Sender prefixes of shared sessions ("[Ann] hi") are
// already in the texts the session hands over. The history is trimmed, oldest first, to at
// most Config.MaxHistory messages and then until the whole request fits Config.TokenBudget
// (estimated at one token per 4 ASCII characters, one per other character, plus 4 per message;
// see EstimateTokens); a history that would then start with an assistant message loses that
// message too. The system prompt, the notes and the turn's own messages are never trimmed. A
// turn whose request leaves history out logs it at Debug; the first that the token budget cuts
// is logged at Info too, once for the Agent (logCut).
//
// When the platform can edit a message (Request.Partial is set) the call streams
// (stream: true, stream_options.include_usage) and Partial gets the whole text so far as it
// grows; otherwise one reply is read. An endpoint may refuse a parameter the agent can name
// otherwise or do without (adapt): max_tokens, refused as a parameter it does not take, not
// for its value (OpenAI's reasoning models, which ask for max_completion_tokens), or stream_options (Azure OpenAI before API version 2024-10-21, servers
// that refuse what they do not know; the usage of a stream is then counted only when the
// endpoint sends it unasked), named as what the refusal refuses (refusedParams), not merely
// held in an echo of the request or of the chat's own text. The request is sent again at once in the form the refusal asks
// for, as is every request of the Agent from then on; the first refusal of each is logged. A
// request is encoded when it is sent, after any wait (a pause, a backoff), so one that waited
// while another turn's refusal switched the Agent goes in the new form; one sent before the
// switch that met the same refusal is sent again too. A request sent again is the same call: its retries count on from those made
// before the refusal, Config.MaxRetries in all, and its backoff goes on from there. After a stream's "data: [DONE]" the end of its body is
// read too (waited for at most 100 ms), so that the connection serves the next request:
// net/http closes the connection of a body closed before its end. An answer is read as what its
// body is, whatever was asked and whatever its Content-Type says: servers and proxies that
// always stream, or label a stream application/json, are answered too; a stream's lines may end with CRLF, LF or a lone CR, as
// the event stream format allows, and a body, an error status's too, may start with a byte order mark. A reply the
// model stopped before its end (finish_reason length or content_filter, or a request to call a
// tool after some text), or cut at MaxReply (a stream is then read no further, so that a model
// that runs on does not keep the turn to its timeout), ends with a note that says so (cutNote),
// and a warning is logged: a user would take the start of an answer for all of it.
// The note is the user's: later turns' history gives the model the reply without it. An answer
// without text fails the turn with ErrEmptyReply; when the model declined the message (its
// refusal field, which OpenAI sends in place of content for what it will not answer, or
// finish_reason content_filter) or asked to call a tool instead (tool_calls: agentgate offers
// its models none), as an agents.Refusal that says so and is Declined: the message is left out
// of later turns, where the model would decline it, or ask for the tool, again (noText). A
// refusal's words end the notice; they are never streamed as a reply. Token usage is returned in
// Response.Usage, summed over every call of the turn, also together with an error when tokens
// were spent. An answer is read up to MaxBody (a body, a stream's line or event): room for a
// reply of MaxReply however escaped, and what comes beside it; a larger one fails the turn with
// ErrTooLarge, as an agents.Refusal. So does a 200 whose body is a web page (a proxy's login
// page, a web app at a base_url without the API's path), and a reply that reached its length
// limit before any text (a reasoning model that spent max_tokens thinking): the same message
// would fail the same way. An answer near MaxBody takes about three times that while it is
// read and decoded, so the calls of an Agent read at most maxLargeAnswers answers past
// largeAnswer (1 MiB) at once; a call that reaches it while they are read waits for one of
// them to end (or for its turn to end). A stream holds one only while it reads and decodes
// such an event, not to its end: two long streams would otherwise keep every other large
// answer waiting.
//
// Refusals of what a request holds: a 400 or 422 that names neither the context, nor a content
// policy, nor only settings (refusesWhatItHolds) may be a message's fault, the configuration's
// or the endpoint's (a proxy's bare 400). A message is left out only when a request without it
// is answered: a refused request of the turn's first call that carried earlier messages that
// got no answer (the last user messages of Request.History) is sent once more without them;
// answered, its reply answers the turn, ends with a note that says so (ridersNote; later turns
// give the model the reply without it), and Response.RidersLeftOut has the session archive them.
// Refused the same way (per-request ids aside: refusalKey), or met the same way by another
// session's request, with no request
// answered in between, the endpoint refuses every request (refusesEvery): nothing is left out,
// the notice says so, and one ERR tells the operator. Refused while the endpoint answers other
// requests, nothing is left out either, and the notice names /new: the rest of the
// conversation may be at fault. The request without them is the same call in another form: its
// retries count on from the refused request's. A refusal that max_tokens does not fit in
// the model's context next to the input (vLLM's wordings: contextOverflowOf; llama.cpp's
// exceed_context_size_error of a prompt shorter than its n_ctx, also as LiteLLM passes it on:
// wrappedExceedOf; of a prompt whose size is not known, a context exceeded unless max_tokens
// is n_ctx or more: tokenCount), read
// from the whole error
// (contextRefusalOf), says it is the max_tokens setting when that is the context or more, or
// the input alone fits, with an ERR.
//
// Retries: 429, 5xx and transport failures are retried up to Config.MaxRetries times, waiting
// 1s, 2s, 4s… capped at Config.MaxBackoff (each spread from half of it to all of it,
// Config.Jitter, so that turns that failed together do not retry together), or exactly what
// the endpoint asks for in retry-after-ms (or Azure OpenAI's x-ms-retry-after-ms), else in
// Retry-After (seconds, a fraction of one too, or an HTTP date). While a
// request waits out a 429 or a Retry-After, every request of the Agent waits until then too
// (unless its turn would end first), instead of adding to the storm; a request that failed
// itself keeps its own spread backoff, lengthened only to a wait the endpoint asked for (also
// one asked for while it sleeps: the pause is looked at again when its backoff ends). An answer
// that asks for more than MaxBackoff, or for more than the turn has left, is not retried: the
// turn fails at once with an agents.Refusal whose notice says that the endpoint rate-limited it
// (a 429) and how long to wait, rounded up to the second (askedToWait). A wait past
// maxRetryAfter (some 31 years) is read as that, not as none. An
// error sent inside a 200 (an error event mid-stream, llama.cpp's older "error: {…}" stream
// line: errorField, an error body) counts as the status its
// code or type names (inBandStatus); one whose text is no JSON (an "event: error" of plain
// text, crane-serve's "data: error: …": streamError) is a fault of the server, taken for a
// 500, its text the message, quoted (TestStreamErrorThatIsNoJSON). It is retried as that
// status would be unless text was already shown; after text, a 400 (vLLM's streamed error
// for any exception) is a reply broken off, not a refusal: not sent again without the
// riders, and the user asked to try again
// (TestErrorAfterTextIsNoRefusal). A 200 whose body is empty, or whose JSON ends before it is whole (a proxy that lost the
// endpoint's answer), is retried as a body that broke off: a chat completion changes nothing
// on the endpoint. A stream breaks off when its
// body ends before "data: [DONE]" and before a chunk with a finish reason (a proxy that cuts it
// off at its own timeout may end it cleanly); one that breaks off after text was shown is not
// retried (the user would see the text start over). Config.Timeout bounds the whole turn,
// retries and waits included. A redirect is not followed (by the client New makes): following
// one turns a POST into a GET, and net/http sends the Authorization header along to the same
// host over plain http and to its subdomains. It fails the call, not retried, with a
// StatusError that says where it points, without its query.
//
// Steering (queue mode steer; CanSteer is true): while a model call runs, the agent takes the
// steered messages from Request.Steer. When the call ends and messages were steered in, the
// answer so far and the steered messages are appended to the conversation and the model is
// called again, at most MaxSteerRounds more times per turn; in the last allowed call the agent
// stops taking messages, so that every message it took is answered, and messages it did not
// take go back to the head of the session's queue and run next, one turn each (as queue mode
// followup runs queued messages), as do those it took during a call that failed, or during the
// turn's own call when it was answered with no text (Response.Unseen): they never reached the
// model, or would be declined with the message it declined. The reply of such a turn is the answers of
// its calls joined with a blank line (what a streaming user has seen grow). When a call for
// steered messages fails, the turn does not: its reply is the answers before that call, and the
// steered messages no answer followed run next, one turn each (Response.Unseen), with a
// warning. So do they when that call is answered with no text (the model declined them, or
// asked for a tool), with any steered in during it: in turns of their own they get an answer,
// or the notice that says why not. A call
// refused for a parameter (see above) while messages were steered in is sent again all the
// same, and those messages join the call after it.
//
// Secrets: the API key is read once, by New, from the environment variable Config.APIKeyEnv,
// and is only ever written into the Authorization header. Errors and log lines never carry it,
// nor the request URL (which may hold credentials), nor a response body: an endpoint's error
// message is cut to 200 characters with the key, what internal/redact takes for a credential (a
// bearer token, Basic credentials, a URL's password, the value of a name such as api_key, a key
// by its known prefix) and any run of 40 or more token characters replaced by [redacted].
//
// Concurrency: an Agent is immutable after New and Run is safe for concurrent use. Each Run owns
// one goroutine for the call in flight, which ends before Run returns; cancelling ctx aborts the
// HTTP request at once.
//
// This package must not import actors, supervisor or platforms.
package openai
