package http

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
)

// sessions returns the configured Sessions, or answers 503 when there is none.
func (p *Platform) sessions(w http.ResponseWriter) (Sessions, bool) {
	if p.cfg.Sessions == nil {
		writeError(w, http.StatusServiceUnavailable, CodeUnavailable, "session queries are not available")
		return nil, false
	}
	return p.cfg.Sessions, true
}

// sessionsAndKey returns the configured Sessions and the request's session key, or answers 503
// (no Sessions) or 400 (not a session key) and reports false.
func (p *Platform) sessionsAndKey(w http.ResponseWriter, r *http.Request) (Sessions, string, bool) {
	s, ok := p.sessions(w)
	if !ok {
		return nil, "", false
	}
	key, aerr := pathKey(r)
	if aerr != nil {
		aerr.write(w)
		return nil, "", false
	}
	return s, key, true
}

// checkQueryID is checkID for a query parameter: a bad value is an invalid_query.
func checkQueryID(name, v string, maxLen int) *apiError {
	aerr := checkID(name, v, maxLen)
	if aerr != nil {
		aerr.code = CodeInvalidQuery
	}
	return aerr
}

// queryLimit is the limit query parameter capped at maxLimit, or def when there is none.
func queryLimit(q url.Values, def, maxLimit int) (int, *apiError) {
	v := q.Get("limit")
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if errors.Is(err, strconv.ErrRange) && !strings.HasPrefix(v, "-") {
		// A positive integer too large for an int is a larger limit like any other, read
		// as the maximum, as docs/HTTP-API.md promises: it is no less a number for its length.
		n, err = maxLimit, nil
	}
	if err != nil || n < 1 {
		return 0, badRequest(CodeInvalidQuery, "limit must be a positive integer")
	}
	return min(n, maxLimit), nil
}

// handleList is GET /v1/sessions?platform=&state=&after=&limit=.
func (p *Platform) handleList(w http.ResponseWriter, r *http.Request) {
	s, ok := p.sessions(w)
	if !ok {
		return
	}
	q, aerr := query(r, "platform", "state", "after", "limit")
	if aerr != nil {
		aerr.write(w)
		return
	}
	f := ListRequest{
		Platform: q.Get("platform"),
		State:    q.Get("state"),
		After:    q.Get("after"),
	}
	switch f.State {
	case "", StateActive, StatePassivated:
	default:
		writeError(w, http.StatusBadRequest, CodeInvalidQuery, "state must be active or passivated")
		return
	}
	if f.Platform != "" && !slices.Contains(p.platforms, f.Platform) {
		// A misspelt one (or Discord for discord) would list nothing, as if no session were there.
		writeError(w, http.StatusBadRequest, CodeInvalidQuery, fmt.Sprintf("platform %.100q is not one agentgate knows: %s",
			f.Platform, strings.Join(p.platforms, ", ")))
		return
	}
	if aerr := checkQueryID("after", f.After, maxKeyBytes); aerr != nil {
		aerr.write(w)
		return
	}
	if _, err := identity.ParseKey(f.After); f.After != "" && err != nil {
		// Any string sorts somewhere among the keys, but one that is no key is no page's end: a
		// seq (as a transcript's after) sorts before them all, and a client paging with it
		// would get the first page again, for ever.
		writeError(w, http.StatusBadRequest, CodeInvalidQuery, fmt.Sprintf(
			"after %.100q is not a session key: give the \"next\" of the previous page, escaped as a query value", f.After))
		return
	}
	if f.Limit, aerr = queryLimit(q, DefaultListLimit, MaxListLimit); aerr != nil {
		aerr.write(w)
		return
	}
	list, err := s.List(r.Context(), f)
	if err != nil {
		p.writeSessionsError(w, r, "list", err)
		return
	}
	if list == nil {
		list = &SessionList{}
	}
	if list.Sessions == nil {
		list.Sessions = []*SessionInfo{}
	}
	writeJSON(w, http.StatusOK, list)
}

// handleGet is GET /v1/sessions/{key}.
func (p *Platform) handleGet(w http.ResponseWriter, r *http.Request) {
	p.sessionInfo(w, r, "get", Sessions.Get)
}

// handleReset is POST /v1/sessions/{key}/reset; it answers the new session.
func (p *Platform) handleReset(w http.ResponseWriter, r *http.Request) {
	p.sessionInfo(w, r, "reset", func(s Sessions, ctx context.Context, key string) (*SessionInfo, error) {
		info, err := s.Reset(ctx, key)
		switch {
		case err != nil || info == nil:
		case info.Kept:
			// Nothing ended: the log must not read as if a conversation had. Worded as
			// agentgate sessions reset says it: "holding nothing yet" read as false beside
			// sessions show's count of its commands and notices.
			p.log.Info("session reset through the API found it holding no conversation yet (commands and notices do not count); it is kept", "session", key,
				"id", info.SessionID, "remote", r.RemoteAddr)
		default:
			// An operator's action that ends a conversation: the log says who asked and what ended.
			p.log.Info("session reset through the API", "session", key, "ended", info.PrevSessionID,
				"new", info.SessionID, "remote", r.RemoteAddr)
		}
		return info, err
	})
}

// handleQuarantined is GET /v1/quarantined?limit=: the quarantined messages of every session,
// newest first, with what a requeue of each names.
func (p *Platform) handleQuarantined(w http.ResponseWriter, r *http.Request) {
	s, ok := p.sessions(w)
	if !ok {
		return
	}
	q, aerr := query(r, "limit")
	if aerr != nil {
		aerr.write(w)
		return
	}
	limit, aerr := queryLimit(q, DefaultQuarantinedLimit, MaxQuarantinedLimit)
	if aerr != nil {
		aerr.write(w)
		return
	}
	ms, err := s.Quarantined(r.Context(), limit)
	if err != nil {
		p.writeSessionsError(w, r, "quarantined", err)
		return
	}
	if ms == nil {
		ms = []QuarantinedMessage{}
	}
	writeJSON(w, http.StatusOK, QuarantinedList{Messages: ms})
}

// handleRequeue is POST /v1/sessions/{key}/messages/{message_id}/requeue: the key's session runs
// its quarantined message again, at the end of its queue, as its original sender's turn. It
// answers 202 once that is durable, or with ?wait like POST /v1/messages, 200 with the replies
// of the message's turn once it ends.
func (p *Platform) handleRequeue(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	s, key, ok := p.sessionsAndKey(w, r)
	if !ok {
		return
	}
	id := r.PathValue("message_id")
	if aerr := checkID("message_id", id, MaxIDBytes); aerr != nil {
		aerr.write(w)
		return
	}
	wait, aerr := p.parseWait(r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	if p.draining.Load() {
		p.writeDraining(w, "agentgate is draining and runs no new work; retry at its next start", "")
		return
	}
	// The waiter exists before the requeue: its turn may end before Requeue returns. The
	// replies of another platform's chat (Discord) go there, never to this platform's waiters:
	// its requeue is answered 202 at once rather than at the end of a wait that cannot end.
	var wt *waiter
	if wait > 0 {
		parts, err := identity.ParseKey(key)
		if err != nil {
			p.writeSessionsError(w, r, "requeue", err)
			return
		}
		if parts.Platform == Name {
			release, ok := p.hold(w, "?wait")
			if !ok {
				return
			}
			defer release()
			wt = p.addWaiter(parts.ChatID, id)
			defer p.removeWaiter(wt)
		}
	}
	res, err := s.Requeue(r.Context(), key, id)
	if err != nil {
		p.writeSessionsError(w, r, "requeue", err)
		return
	}
	if wt == nil {
		writeJSON(w, http.StatusAccepted, res)
		return
	}
	ack := &platforms.Ack{SessionKey: res.SessionKey, SessionID: res.SessionID, MessageID: res.MessageID,
		Disposition: res.Disposition, OutboxAfter: res.OutboxAfter}
	// On a cluster member the outbox is read too, past the key's outbox seq before the requeue
	// (its quarantine notice answers the message already); a member that does not say it (an
	// older one, during a rolling upgrade) is left to the relay.
	replies, done := p.awaitReplies(r.Context(), p.stopped(), wt, ack, start.Add(wait), res.OutboxAfter > 0)
	if !done {
		writeJSON(w, http.StatusAccepted, res) // it runs; the event stream carries its replies
		return
	}
	res.Replies = make([]Reply, len(replies))
	for i, o := range replies {
		res.Replies[i] = Reply{Text: o.Text, TurnID: o.TurnID, Kind: eventKind(o.Kind), Seq: o.Seq}
	}
	writeJSON(w, http.StatusOK, res)
}

func (p *Platform) sessionInfo(w http.ResponseWriter, r *http.Request, op string,
	call func(Sessions, context.Context, string) (*SessionInfo, error)) {
	s, key, ok := p.sessionsAndKey(w, r)
	if !ok {
		return
	}
	if _, aerr := query(r); aerr != nil { // it takes none
		aerr.write(w)
		return
	}
	info, err := call(s, r.Context(), key)
	if err == nil && info == nil {
		err = persistence.ErrNotFound
	}
	if err != nil {
		p.writeSessionsError(w, r, op, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// handleMetrics is GET /metrics.
func (p *Platform) handleMetrics(w http.ResponseWriter, r *http.Request) {
	if p.cfg.Metrics == nil {
		writeError(w, http.StatusNotFound, CodeNotFound, "metrics are not enabled")
		return
	}
	p.cfg.Metrics.ServeHTTP(w, r)
}

// handleHealthz is GET /healthz: the process is up and serving.
func (p *Platform) handleHealthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// handleReadyz is GET /readyz: every component is ready and intake is open. It needs no token
// (load balancers call it), so without the token, when one is set, a failing component is only
// said to be failing: its error can name what an outsider should not read (PostgreSQL's user,
// database and socket path; found by a security walkthrough).
func (p *Platform) handleReadyz(w http.ResponseWriter, r *http.Request) {
	resp := ReadyResponse{Status: "ready", Components: map[string]string{}}
	ready := true
	if p.cfg.Ready != nil {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		detailed := p.authorized(r)
		for name, err := range p.cfg.Ready(ctx) {
			if err == nil {
				resp.Components[name] = ComponentOK
				continue
			}
			ready = false
			if detailed {
				resp.Components[name] = err.Error()
				continue
			}
			resp.Components[name] = ComponentFailing
			resp.Detail = "each failing component's error is shown to a request with the bearer token (Authorization: Bearer …)"
		}
	}
	if p.draining.Load() {
		ready = false
		resp.Draining = true
	}
	status := http.StatusOK
	if !ready {
		resp.Status = "not_ready"
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, resp)
}
