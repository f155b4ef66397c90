package http

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
)

// Error codes of the HTTP API, the "code" of every error body.
const (
	CodeInvalidJSON       = "invalid_json"
	CodeInvalidUTF8       = "invalid_utf8"
	CodeUnknownField      = "unknown_field"
	CodeMissingField      = "missing_field"
	CodeInvalidField      = "invalid_field"
	CodeInvalidChatType   = "invalid_chat_type"
	CodeInvalidWait       = "invalid_wait"
	CodeInvalidQuery      = "invalid_query"
	CodeInvalidKey        = "invalid_key"
	CodeInvalidEventID    = "invalid_last_event_id"
	CodeInvalidTarget     = "invalid_target"
	CodeBodyTooLarge      = "body_too_large"
	CodeTextTooLarge      = "text_too_large"
	CodeUnsupportedMedia  = "unsupported_media_type"
	CodeUnsupportedCoding = "unsupported_content_encoding"
	CodeUnauthorized      = "unauthorized"
	CodeCrossOrigin       = "cross_origin"
	CodeForeignHost       = "foreign_host"
	CodeNotFound          = "not_found"
	CodeNoSession         = "no_session" // a 404 of a key no session has (a refinement of not_found: see docs/HTTP-API.md)
	CodeMethodNotAllowed  = "method_not_allowed"
	CodeQueueFull         = "queue_full"
	CodeMessageIDConflict = "message_id_conflict"
	CodeMessageIDReused   = "message_id_reused"
	CodeDraining          = "draining"
	CodeStarting          = "starting" // the daemon starts (ServeStarting): it took nothing
	CodeUnavailable       = "unavailable"
	CodeTooManyHeld       = "too_many_held"
	CodeMisdirected       = "misdirected"
	CodeNotQuarantined    = "not_quarantined"
	CodeSessionEnded      = "session_ended"
	CodeMemberOutdated    = "member_outdated" // the cluster member holding the session runs an older agentgate (platforms.OutdatedMemberError)
	CodeInternal          = "internal"
)

// How long the client of a 429 or 503 that it may send again is told to wait (Retry-After).
// A store that cannot take a message is tried again by the daemon each second (a session's
// load, the spool's replay, a paused session's start), and a full queue frees a place as soon
// as the session's running turn ends, which nobody can foresee: for both, 1 s is the soonest the
// answer can change, not a promise that it will, and a client backs off from it (such a refusal
// stores nothing and costs the daemon little). The requests held open end as their clients
// leave or their waits end, which nobody can foresee either, and sending one again at once
// meets the same full set: 5 s. A draining daemon takes nothing more in this run: it says how
// long its drain can still last (drainLeft). A member that runs an older agentgate answers so
// until it is upgraded, one restart of a rolling upgrade away, which takes its drain and its
// start, a minute or so: 60 s (as Discord's notice says "in a few minutes"); sent again at
// once, the request meets the same member.
const (
	retrySoon    = 1 * time.Second
	retryHeld    = 5 * time.Second
	retryUpgrade = 60 * time.Second
)

// setRetryAfter sets the Retry-After of an answer to d, in whole seconds rounded up, at least 1.
func setRetryAfter(w http.ResponseWriter, d time.Duration) {
	w.Header().Set("Retry-After", strconv.FormatInt(max(1, int64((d+time.Second-1)/time.Second)), 10))
}

// drainLeft is how long the drain can still last: Config.DrainTimeout from Drain on (all of it
// when the runtime drains before the platform is told to), and never more: the start is a wall
// clock reading, and a clock set back since the drain began made it longer than the drain
// (Retry-After 3690 for a drain of 90 s, the clock set back an hour).
func (p *Platform) drainLeft() time.Duration {
	left := p.cfg.DrainTimeout
	if at := p.drainedAt.Load(); at != 0 {
		left = min(left-time.Since(time.Unix(0, at)), left)
	}
	return left
}

// writeDraining answers 503 draining, with how long the drain can still last in Retry-After;
// a cluster member's client is told 1 s: the other members take the message now (a load
// balancer sends it to one of them). The message is msg, or the drain's reason when it has
// one (DrainBecause); messageID, when not empty, is the id of the message POSTed (ErrorResponse).
func (p *Platform) writeDraining(w http.ResponseWriter, msg, messageID string) {
	if p.cfg.Clustered {
		setRetryAfter(w, retrySoon)
	} else {
		setRetryAfter(w, p.drainLeft())
	}
	if reason := p.drainReason.Load(); reason != nil {
		msg = *reason
	}
	writeJSON(w, http.StatusServiceUnavailable, ErrorResponse{Error: APIError{Code: CodeDraining, Message: msg}, MessageID: messageID})
}

// apiError is an error answer a handler decided on.
type apiError struct {
	status  int
	code    string
	message string
}

func badRequest(code, msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, code: code, message: msg}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	jsonHeaders(w)
	w.WriteHeader(status)
	// An encoding error here means the client went away; there is nobody left to tell.
	_ = json.NewEncoder(w).Encode(v)
}

// jsonHeaders sets the headers of a JSON answer.
func jsonHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, ErrorResponse{Error: APIError{Code: code, Message: msg}})
}

func (e *apiError) write(w http.ResponseWriter) {
	writeError(w, e.status, e.code, e.message)
}

// writeSessionsError answers an error from Sessions.
func (p *Platform) writeSessionsError(w http.ResponseWriter, r *http.Request, op string, err error) {
	if re, ok := errors.AsType[*RefusedError](err); ok {
		status := http.StatusConflict
		switch re.Code {
		case CodeNotFound, CodeNoSession:
			status = http.StatusNotFound
		case CodeUnavailable:
			status = http.StatusServiceUnavailable
			setRetryAfter(w, retrySoon)
		}
		writeError(w, status, re.Code, re.Message)
		return
	}
	if oe, ok := errors.AsType[*platforms.OutdatedMemberError](err); ok {
		writeOutdated(w, oe, "")
		return
	}
	switch {
	case errors.Is(err, persistence.ErrNotFound):
		// The key has no session (a transcript's ?session_id= that names none of the key's is
		// answered not_found by its handler). It has a code of its own, so that a client need
		// not match the message to tell it from the 404 of a message or a route that is not
		// there, as agentgate sessions reset and requeue did; the message is the one it was.
		writeError(w, http.StatusNotFound, CodeNoSession, "no such session")
	case errors.Is(err, identity.ErrBadKey):
		writeError(w, http.StatusBadRequest, CodeInvalidKey, "not a session key")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		setRetryAfter(w, retrySoon)
		writeError(w, http.StatusServiceUnavailable, CodeUnavailable, "request cancelled or timed out")
	case errors.Is(err, persistence.ErrUnavailable):
		p.log.Warn("session query failed: the store is unavailable", "op", op, "session", r.PathValue("key"), logging.Err(err))
		setRetryAfter(w, retrySoon)
		writeError(w, http.StatusServiceUnavailable, CodeUnavailable, "the store is unavailable right now; retry later")
	case p.draining.Load() && errors.Is(err, ErrNotTaken):
		// The daemon is stopping: its session actors had stopped, and the request reached none
		// of them (a dead letter). Nothing was done: a refusal to retry, at the next daemon or
		// another member, as POST /v1/messages says, which the CLI reports as such.
		p.log.Warn("session query failed while draining", "op", op, "session", r.PathValue("key"), logging.Err(err))
		p.writeDraining(w, "agentgate is stopping and took no new work: nothing was changed; retry at its next start", "")
	case p.draining.Load():
		// Its session actors stop under the query (a timeout, a session that stopped before it
		// answered). That is no internal error, but no refusal either: the request may have
		// been done (a reset), so it is not answered draining, which says nothing was. Before,
		// it was, and the CLI could not tell the two apart (a walkthrough).
		p.log.Warn("session query failed while draining", "op", op, "session", r.PathValue("key"), logging.Err(err))
		setRetryAfter(w, retrySoon)
		writeError(w, http.StatusServiceUnavailable, CodeUnavailable, "agentgate is stopping; retry later")
	default:
		p.log.Error("session query failed", "op", op, "session", r.PathValue("key"), logging.Err(err))
		writeError(w, http.StatusInternalServerError, CodeInternal, "internal error")
	}
}

// writeOutdated answers 503 member_outdated: the cluster member that holds the request's
// session runs an older agentgate, which does not know the request, and nothing was done. The
// message names the member and its version and says to upgrade it. Retry-After says 60
// (retryUpgrade): it is answered so until that member is upgraded, which a rolling upgrade
// does within minutes; before, it said nothing, and a client that backs off by Retry-After
// sent it again at once, or not at all. messageID, when not empty, is the id of the message
// POSTed (ErrorResponse). Before, the request got no answer from that member, and was
// answered as one that timed out, which may have been done
// (TestOutdatedMemberIsAnswered503MemberOutdated).
func writeOutdated(w http.ResponseWriter, oe *platforms.OutdatedMemberError, messageID string) {
	setRetryAfter(w, retryUpgrade)
	writeJSON(w, http.StatusServiceUnavailable, ErrorResponse{Error: APIError{Code: CodeMemberOutdated, Message: oe.Error()}, MessageID: messageID})
}
