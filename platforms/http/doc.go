// Package http is the HTTP platform of agentgate (DESIGN §5): it implements platforms.Platform
// under the name "http" and serves, on one listener, the message API (POST /v1/messages, with
// an optional ?wait for the turn's replies), the session admin API (/v1/sessions/...), the
// Server-Sent Events stream of a session's replies with Last-Event-ID resume from the durable
// outbox, /metrics, /healthz and /readyz.
//
// Importers alias it (httpplatform) because it shadows net/http.
//
// Concurrency: Run owns the http.Server and its Serve goroutine; every request runs on its own
// net/http goroutine. Send may be called from any goroutine and never blocks on a client: each
// SSE subscriber and each ?wait waiter has its own buffer, and a subscriber that falls behind is
// dropped (its stream closed, logged at WARN at most once a minute) so it resumes from the
// outbox with Last-Event-ID. No client holds a request's goroutine for ever: a body must arrive
// within Config.BodyTimeout, and an answer (an event stream: each event; a transcript: each
// page) be read within Config.WriteTimeout, else the connection is closed (a cut answer is
// logged at WARN, "answer cut off", at most once a minute). A transcript is read from Sessions
// and written a page at a time (at most 100 messages and about a MiB of their texts), never
// held whole.
//
// This package must not import actors or supervisor; the runtime reaches it only through
// platforms.Deliver and the Sessions interface.
package http
