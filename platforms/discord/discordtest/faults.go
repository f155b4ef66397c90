package discordtest

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// FailNext answers the next n REST requests whose method is method (any method if empty)
// and whose URL path ends in pathSuffix with status, without acting on them. A 429 carries
// Discord's rate-limit body (retry_after 0.05s) and headers; other statuses carry a JSON
// error body. Rules apply in the order they were added.
func (s *Server) FailNext(method, pathSuffix string, status, n int) {
	s.addFault(method, pathSuffix, status, n, false)
}

// RateLimitNext answers the next n REST requests matching method and pathSuffix (as FailNext)
// with Discord's 429 asking to retry after retryAfter (a slowmode or a long ban asks for
// hours), without acting on them.
func (s *Server) RateLimitNext(method, pathSuffix string, retryAfter time.Duration, n int) {
	s.addRateLimit(method, pathSuffix, retryAfter, n, false)
}

// GlobalRateLimitNext is RateLimitNext with Discord's global rate limit, which holds every
// route of the bot: the 429's body says "global": true, and its headers are Retry-After,
// X-RateLimit-Global and X-RateLimit-Scope: global, without the route's X-RateLimit-* headers
// (as Discord answers it). The Server itself refuses nothing else meanwhile.
func (s *Server) GlobalRateLimitNext(method, pathSuffix string, retryAfter time.Duration, n int) {
	s.addRateLimit(method, pathSuffix, retryAfter, n, true)
}

// BlockNext answers the next n REST requests matching method and pathSuffix (as FailNext) as
// Discord's edge (Cloudflare) answers a host it blocks for making too many invalid requests:
// 429 with an HTML page (error 1015) for a body, no X-RateLimit-* headers, and a Retry-After
// header of retryAfter in whole seconds (rounded up), or none when retryAfter is 0.
func (s *Server) BlockNext(method, pathSuffix string, retryAfter time.Duration, n int) {
	s.add429(method, pathSuffix, retryAfter, n, func(f *fault) { f.block = true })
}

func (s *Server) addRateLimit(method, suffix string, retryAfter time.Duration, n int, global bool) {
	s.add429(method, suffix, retryAfter, n, func(f *fault) { f.global = global })
}

// add429 adds a fault that answers the next n matching requests 429, set as kind sets it.
func (s *Server) add429(method, suffix string, retryAfter time.Duration, n int, kind func(*fault)) {
	if n <= 0 {
		return
	}
	f := &fault{method: strings.ToUpper(method), suffix: suffix, status: http.StatusTooManyRequests,
		left: n, retryAfter: retryAfter.Seconds()}
	kind(f)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, f)
}

// FailNextAfter is FailNext for a lost response: the next n matching requests take effect
// (a message is posted and dispatched) but are answered with status. With enforce_nonce, a
// retry of such a POST returns the message posted the first time.
func (s *Server) FailNextAfter(method, pathSuffix string, status, n int) {
	s.addFault(method, pathSuffix, status, n, true)
}

// HoldNext makes the next n REST requests matching method and pathSuffix (as FailNext) wait
// until release is closed, then answers them as usual: a slow Discord, without sleeps.
func (s *Server) HoldNext(method, pathSuffix string, release <-chan struct{}, n int) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &fault{method: strings.ToUpper(method), suffix: pathSuffix, left: n, hold: release})
}

func (s *Server) addFault(method, suffix string, status, n int, after bool) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &fault{method: strings.ToUpper(method), suffix: suffix, status: status, left: n, after: after})
}

// fault is a FailNext, FailNextAfter or HoldNext rule.
type fault struct {
	method, suffix string
	status, left   int
	after          bool            // act on the request, then fail the response
	hold           <-chan struct{} // wait for it to close, then act as usual (HoldNext)
	retryAfter     float64         // of a 429, in seconds; 0 is the default retryAfter
	global         bool            // a 429 of the global rate limit (GlobalRateLimitNext)
	block          bool            // a 429 of the edge's block (BlockNext): an HTML page
}

// PendingFaults is how many answers the FailNext, FailNextAfter and RateLimitNext rules of
// method (any method if empty) still have to give.
func (s *Server) PendingFaults(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, f := range s.faults {
		if f.hold == nil && (method == "" || f.method == "" || f.method == strings.ToUpper(method)) {
			n += f.left
		}
	}
	return n
}

// takeFault returns the first rule matching r and uses up one of its requests.
func (s *Server) takeFault(r *http.Request) *fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, f := range s.faults {
		if (f.method == "" || f.method == r.Method) && strings.HasSuffix(r.URL.Path, f.suffix) {
			f.left--
			if f.left == 0 {
				s.faults = slices.Delete(s.faults, i, i+1)
			}
			return f
		}
	}
	return nil
}

// retryAfter is the retry_after, in seconds, of the 429s FailNext makes.
const retryAfter = 0.05

func faultResponse(f *fault) (int, any) {
	status := f.status
	if f.block {
		return status, edgeBlock{retryAfter: f.retryAfter}
	}
	if status == http.StatusTooManyRequests {
		return status, map[string]any{"message": "You are being rate limited.", "retry_after": cmp.Or(f.retryAfter, retryAfter), "global": f.global}
	}
	return status, apiError(fmt.Sprintf("%d: %s", status, http.StatusText(status)), 0)
}

// edgeBlock is the body of the edge's 429 (BlockNext): not JSON, and written as such by api.
type edgeBlock struct {
	retryAfter float64 // seconds; 0 sends no Retry-After header
}

// edgeBlockPage is (the gist of) the page Cloudflare answers a blocked host with.
const edgeBlockPage = `<!DOCTYPE html>
<html><head><title>Access denied | discord.com used Cloudflare to restrict access</title></head>
<body><div id="cf-error-details"><h1>Error 1015</h1><h2>You are being rate limited</h2>
<p>The owner of this website (discord.com) has banned you temporarily from accessing this website.</p>
</div></body></html>
`

func (b edgeBlock) write(w http.ResponseWriter) {
	hdr := w.Header()
	if b.retryAfter > 0 {
		hdr.Set("Retry-After", strconv.Itoa(int(math.Ceil(b.retryAfter))))
	}
	hdr.Set("Content-Type", "text/html; charset=UTF-8")
	hdr.Set("Server", "cloudflare")
	w.WriteHeader(http.StatusTooManyRequests)
	io.WriteString(w, edgeBlockPage)
}

// RefuseNext closes the next n gateway connections that IDENTIFY or RESUME with gateway close
// code (and Discord's reason for it), whatever they send, as Discord closes a connection it will
// not take: 4004 a token (Discord has been seen to refuse a good one for a while), 4011 a bot in
// too many guilds for one connection, 4014 an intent the bot may not ask for…
func (s *Server) RefuseNext(code, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuseCode, s.refuseLeft = code, max(n, 0)
}

// refuseLocked uses up one connection of RefuseNext, and returns its close code and reason;
// ok is false when RefuseNext has none left.
func (s *Server) refuseLocked() (code int, reason string, ok bool) {
	if s.refuseLeft == 0 {
		return 0, "", false
	}
	s.refuseLeft--
	return s.refuseCode, closeReason(s.refuseCode), true
}

// closeReason is the reason Discord gives with a close code of RefuseNext or CloseLive.
func closeReason(code int) string {
	reason := map[int]string{
		closeAuthFailed:       "Authentication failed.",
		closeInvalidShard:     "Invalid shard.",
		closeShardingRequired: "Sharding required.",
		closeInvalidVersion:   "Invalid API version.",
		closeInvalidIntents:   "Invalid intent(s).",
		closeDisallowed:       "Disallowed intent(s).",
	}[code]
	return cmp.Or(reason, "Refused.")
}

// CloseLive closes every gateway connection now with gateway close code (and Discord's reason
// for it), after what is queued on it, as Discord ends a live session it will no longer serve:
// 4004 once the bot's token has been reset in the Developer Portal. The session stays resumable;
// combine with RefuseNext to refuse the tries after it too. Call WaitReady first (see Ready).
func (s *Server) CloseLive(code int) {
	s.mu.Lock()
	conns := s.connsLocked()
	s.mu.Unlock()
	for _, c := range conns {
		s.closeConn(c, code, closeReason(code))
	}
}

// MissHeartbeatACKs leaves the next n heartbeats unacknowledged (they still count in
// Heartbeats), as a gateway connection that went stale without closing does: discordgo closes a
// connection whose last ACK is more than five heartbeat intervals old.
func (s *Server) MissHeartbeatACKs(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.missACKs = max(n, 0)
}
