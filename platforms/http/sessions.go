package http

import (
	"context"
	"net/http"
	"strconv"

	"github.com/agentgate/agentgate/persistence"
)

// sessions returns the configured Sessions, or answers 503 when there is none.
func (p *Platform) sessions(w http.ResponseWriter) (Sessions, bool) {
	if p.cfg.Sessions == nil {
		writeError(w, http.StatusServiceUnavailable, CodeUnavailable, "session queries are not available")
		return nil, false
	}
	return p.cfg.Sessions, true
}

// handleList is GET /v1/sessions?platform=&state=&after=&limit=.
func (p *Platform) handleList(w http.ResponseWriter, r *http.Request) {
	s, ok := p.sessions(w)
	if !ok {
		return
	}
	q, aerr := query(r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	f := ListRequest{
		Platform: q.Get("platform"),
		State:    q.Get("state"),
		After:    q.Get("after"),
		Limit:    DefaultListLimit,
	}
	switch f.State {
	case "", StateActive, StatePassivated:
	default:
		writeError(w, http.StatusBadRequest, CodeInvalidQuery, "state must be active or passivated")
		return
	}
	if aerr := checkID("platform", f.Platform, MaxIDBytes); aerr != nil {
		aerr.code = CodeInvalidQuery
		aerr.write(w)
		return
	}
	if aerr := checkID("after", f.After, maxKeyBytes); aerr != nil {
		aerr.code = CodeInvalidQuery
		aerr.write(w)
		return
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, CodeInvalidQuery, "limit must be a positive integer")
			return
		}
		f.Limit = min(n, MaxListLimit)
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
		if err == nil && info != nil {
			// An operator's action that ends a conversation: the log says who asked and what ended.
			p.log.Info("session reset through the API", "session", key, "ended", info.PrevSessionID,
				"new", info.SessionID, "remote", r.RemoteAddr)
		}
		return info, err
	})
}

func (p *Platform) sessionInfo(w http.ResponseWriter, r *http.Request, op string,
	call func(Sessions, context.Context, string) (*SessionInfo, error)) {
	s, ok := p.sessions(w)
	if !ok {
		return
	}
	key, aerr := pathKey(r)
	if aerr != nil {
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

// handleReadyz is GET /readyz: every component is ready and intake is open.
func (p *Platform) handleReadyz(w http.ResponseWriter, r *http.Request) {
	resp := ReadyResponse{Status: "ready", Components: map[string]string{}}
	ready := true
	if p.cfg.Ready != nil {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		for name, err := range p.cfg.Ready(ctx) {
			if err != nil {
				ready = false
				resp.Components[name] = err.Error()
				continue
			}
			resp.Components[name] = "ok"
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
