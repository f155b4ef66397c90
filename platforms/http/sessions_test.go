package http

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
)

func TestSessionRoutes(t *testing.T) {
	sessions := newFakeSessions()
	started := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	key := "agent:main:http:dm:a%2Fb"
	sessions.infos[key] = &SessionInfo{
		SessionKey: key, SessionID: "s1", Platform: "http", ChatType: "dm", ChatID: "a/b", UserID: "u",
		StartedAt: started, LastActivityAt: started, Messages: 2,
		Live: &LiveState{Active: true, QueueDepth: 1, QueueMode: "followup", Restarts: 1},
	}
	logs := &testutil.Buffer{}
	h := mustStart(t, Config{Sessions: sessions, Logger: slog.New(slog.NewTextHandler(logs, nil))}, &fakeRuntime{})
	path := "/v1/sessions/" + url.PathEscape(key)

	t.Run("get", func(t *testing.T) {
		got := h.do("GET", path, nil, "")
		if got.status != 200 {
			t.Fatalf("GET %s = %d %s, want 200", path, got.status, got.body)
		}
		info := mustDecode[SessionInfo](t, got)
		if diff := cmp.Diff(sessions.infos[key], &info); diff != "" {
			t.Errorf("SessionInfo mismatch (-want +got):\n%s", diff)
		}
		raw := mustDecode[map[string]any](t, got)
		for _, f := range []string{"session_key", "session_id", "platform", "chat_type", "chat_id", "thread_id", "user_id",
			"started_at", "last_activity_at", "ended_at", "end_reason", "title", "messages", "pending", "live"} {
			if _, ok := raw[f]; !ok {
				t.Errorf("SessionInfo JSON %s has no %q", got.body, f)
			}
		}
	})
	t.Run("get unknown", func(t *testing.T) {
		// A key no session has is 404 no_session, with the message it always had; a session a
		// transcript names that is none of the key's stays 404 not_found (before, both were
		// not_found, told apart by their message).
		for _, req := range []struct{ method, path, code string }{
			{"GET", "/v1/sessions/agent:main:http:dm:nope", CodeNoSession},
			{"POST", "/v1/sessions/agent:main:http:dm:nope/reset", CodeNoSession},
			{"GET", "/v1/sessions/agent:main:http:dm:nope/transcript", CodeNoSession},
			{"GET", "/v1/sessions/agent:main:http:dm:nope/transcript?session_id=s9", CodeNotFound},
		} {
			got := h.do(req.method, req.path, nil, "")
			e := mustDecode[ErrorResponse](t, got)
			if got.status != 404 || e.Error.Code != req.code || e.Error.Message != "no such session" {
				t.Errorf("%s %s = %d %s, want 404 %q \"no such session\"", req.method, req.path, got.status, got.body, req.code)
			}
		}
	})
	t.Run("not a session key", func(t *testing.T) {
		// As the event stream: a string that is no session key is bad input, not a session
		// that happens not to exist.
		for _, req := range []struct{ method, path string }{
			{"GET", "/v1/sessions/nope"}, {"GET", "/v1/sessions/nope/transcript"}, {"POST", "/v1/sessions/nope/reset"},
			{"GET", "/v1/sessions/" + url.PathEscape("agent:main:http:dm:a:b:c")},
		} {
			if got := h.do(req.method, req.path, nil, ""); got.status != 400 || got.errCode() != CodeInvalidKey {
				t.Errorf("%s %s = %d %q, want 400 %q", req.method, req.path, got.status, got.errCode(), CodeInvalidKey)
			}
		}
	})
	t.Run("reset", func(t *testing.T) {
		got := h.do("POST", path+"/reset", nil, "")
		info := mustDecode[SessionInfo](t, got)
		if got.status != 200 || info.SessionID != "s1-next" || info.PrevSessionID != "s1" {
			t.Errorf("POST reset = %d %s, want 200 with a new session", got.status, got.body)
		}
		if want := `level=INFO msg="session reset through the API" platform=http session=` + key + ` ended=s1 new=s1-next`; !strings.Contains(logs.String(), want) {
			t.Errorf("the log has no line %q:\n%s", want, logs)
		}
		got = h.do("POST", path+"/reset", nil, "") // the new session holds nothing yet
		if info := mustDecode[SessionInfo](t, got); got.status != 200 || !info.Kept || info.SessionID != "s1-next" {
			t.Errorf("POST reset of a fresh session = %d %s, want 200, kept", got.status, got.body)
		}
		if want := `level=INFO msg="session reset through the API found it holding no conversation yet (commands and notices do not count); it is kept" platform=http session=` + key + ` id=s1-next`; !strings.Contains(logs.String(), want) || strings.Count(logs.String(), "ended=") != 1 {
			t.Errorf("the log has no line %q (nor only it):\n%s", want, logs)
		}
		if got := h.do("GET", path+"/reset", nil, ""); got.status != 405 || got.errCode() != CodeMethodNotAllowed || got.header.Get("Allow") == "" {
			t.Errorf("GET reset = %d %q Allow %q, want 405 %q with Allow", got.status, got.errCode(), got.header.Get("Allow"), CodeMethodNotAllowed)
		}
	})
	t.Run("transcript", func(t *testing.T) {
		got := h.do("GET", path+"/transcript?session_id=s0", nil, "")
		tr := mustDecode[Transcript](t, got)
		if got.status != 200 || tr.SessionKey != key || tr.SessionID != "s0" || len(tr.Messages) != 2 {
			t.Errorf("GET transcript = %d %s, want 200 with session s0 and 2 messages", got.status, got.body)
		}
		raw := mustDecode[struct{ Messages []map[string]any }](t, got)
		for _, f := range []string{"seq", "role", "text", "message_id", "turn_id", "status", "created_at"} {
			if _, ok := raw.Messages[0][f]; !ok {
				t.Errorf("transcript message JSON has no %q: %s", f, got.body)
			}
		}
	})

	// Every key reached Sessions exactly as built: decoded once by the mux, never again.
	for _, c := range sessions.callLog() {
		if strings.Contains(c, " agent:main:http:dm:nope") {
			continue // the unknown key's
		}
		if want := []string{"get " + key, "reset " + key, "transcript " + key + " s0"}; !contains(want, c) {
			t.Errorf("Sessions call %q, want one of %q", c, want)
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func TestListSessions(t *testing.T) {
	sessions := newFakeSessions()
	h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})
	cases := []struct {
		name     string
		query    string
		want     ListRequest
		wantCode string
	}{
		{"defaults", "", ListRequest{Limit: DefaultListLimit}, ""},
		{"filters", "?platform=http&state=active&after=agent:main:http:dm:c&limit=5", ListRequest{Platform: "http", State: StateActive, After: "agent:main:http:dm:c", Limit: 5}, ""},
		{"passivated", "?state=passivated", ListRequest{State: StatePassivated, Limit: DefaultListLimit}, ""},
		{"limit capped", "?limit=5000", ListRequest{Limit: MaxListLimit}, ""},
		{"bad state", "?state=sleeping", ListRequest{}, CodeInvalidQuery},
		{"zero limit", "?limit=0", ListRequest{}, CodeInvalidQuery},
		{"bad limit", "?limit=many", ListRequest{}, CodeInvalidQuery},
		{"malformed pair", "?state=active&platform=%zz", ListRequest{}, CodeInvalidQuery},
		{"limit given twice", "?limit=5&limit=500", ListRequest{}, CodeInvalidQuery},
		{"discord", "?platform=discord", ListRequest{Platform: "discord", Limit: DefaultListLimit}, ""},
		{"unknown platform", "?platform=bogus", ListRequest{}, CodeInvalidQuery},
		{"platform in another case", "?platform=HTTP", ListRequest{}, CodeInvalidQuery},
		{"after not a key", "?after=100", ListRequest{}, CodeInvalidQuery},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := h.do("GET", "/v1/sessions"+tc.query, nil, "")
			if tc.wantCode != "" {
				if got.status != 400 || got.errCode() != tc.wantCode {
					t.Errorf("GET /v1/sessions%s = %d %q, want 400 %q", tc.query, got.status, got.errCode(), tc.wantCode)
				}
				return
			}
			if got.status != 200 {
				t.Fatalf("GET /v1/sessions%s = %d %s, want 200", tc.query, got.status, got.body)
			}
			if string(got.body) != "{\"sessions\":[]}\n" {
				t.Errorf("empty list body = %q, want {\"sessions\":[]}", got.body)
			}
			sessions.mu.Lock()
			req := sessions.lastList
			sessions.mu.Unlock()
			if diff := cmp.Diff(tc.want, req); diff != "" {
				t.Errorf("ListRequest mismatch (-want +got):\n%s", diff)
			}
		})
	}

	noSessions := mustStart(t, Config{}, &fakeRuntime{})
	for _, path := range []string{"/v1/sessions", "/v1/sessions/k", "/v1/sessions/k/transcript"} {
		if got := noSessions.do(http.MethodGet, path, nil, ""); got.status != 503 || got.errCode() != CodeUnavailable {
			t.Errorf("GET %s without Sessions = %d %q, want 503 %q", path, got.status, got.errCode(), CodeUnavailable)
		}
	}
}

// TestSessionQueryWhileDrainingIs503: while the daemon stops, its session actors stop under a
// query. A request that reached none of them (the reset's request met a dead letter:
// ErrNotTaken) is a refusal to retry, 503 draining, as POST /v1/messages answers then, which
// says that nothing was changed; any other failure then (a timeout, a session that stopped
// before it confirmed the reset) may have been done, and is 503 unavailable. Before, both were
// 503 draining, and the CLI could not tell a reset that was not done from one that may have
// been (a walkthrough); and before that, a 500 internal error logged at Error (found by
// TestHuntHTTP in ./supervisor).
func TestSessionQueryWhileDrainingIs503(t *testing.T) {
	sessions := newFakeSessions()
	key := "agent:main:http:dm:c"
	sessions.infos[key] = &SessionInfo{SessionKey: key, SessionID: "s1"}
	deadLetter := fmt.Errorf("reset session: %w: request *actors.ResetSession: future: dead letter", ErrNotTaken)
	sessions.resetErr = deadLetter
	h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})
	path := "/v1/sessions/" + url.PathEscape(key) + "/reset"
	if got := h.do(http.MethodPost, path, nil, ""); got.status != 500 || got.errCode() != CodeInternal {
		t.Errorf("POST reset failing while running = %d %q, want 500 %q", got.status, got.errCode(), CodeInternal)
	}
	h.p.Drain()
	if got := h.do(http.MethodPost, path, nil, ""); got.status != 503 || got.errCode() != CodeDraining {
		t.Errorf("POST reset that reached no session while draining = %d %q, want 503 %q", got.status, got.errCode(), CodeDraining)
	}
	sessions.resetErr = errors.New("reset session: request *actors.ResetSession to " + key + ": actors: request timed out")
	if got := h.do(http.MethodPost, path, nil, ""); got.status != 503 || got.errCode() != CodeUnavailable {
		t.Errorf("POST reset that timed out while draining = %d %q, want 503 %q (it may have been done)", got.status, got.errCode(), CodeUnavailable)
	}
}

// TestRequeueRoute: POST /v1/sessions/{key}/messages/{message_id}/requeue hands the key,
// decoded once, and the message id to Sessions.Requeue, answers 202 with its result, and maps
// each refusal to its status and code.
func TestRequeueRoute(t *testing.T) {
	sessions := newFakeSessions()
	h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})
	key := "agent:main:http:dm:a%2Fb" // a chat id with a slash, escaped in the key
	path := func(id string) string {
		return "/v1/sessions/" + url.PathEscape(key) + "/messages/" + url.PathEscape(id) + "/requeue"
	}
	got := h.do(http.MethodPost, path("m/1"), nil, "")
	if got.status != http.StatusAccepted {
		t.Fatalf("POST requeue = %d %s, want 202", got.status, got.body)
	}
	res := mustDecode[MessageResponse](t, got)
	if res.SessionKey != key || res.MessageID != "m/1" || res.Disposition != "queued" {
		t.Errorf("requeue answer %+v, want key %s, message m/1, queued", res, key)
	}
	if calls := sessions.callLog(); len(calls) != 1 || calls[0] != "requeue "+key+" m/1" {
		t.Errorf("Sessions calls %q, want one requeue of %s m/1", calls, key)
	}
	// A Discord chat's reply goes to Discord, never to a waiter here: answered at once, not
	// after a wait that cannot end (before: 202 after the whole 5 minutes, past the test
	// client's timeout).
	discord := "/v1/sessions/" + url.PathEscape("agent:main:discord:dm:123") + "/messages/m2/requeue?wait=5m"
	if got := h.do(http.MethodPost, discord, nil, ""); got.status != http.StatusAccepted {
		t.Errorf("POST requeue of a Discord chat's message ?wait = %d %s, want 202", got.status, got.body)
	}

	refusals := []struct {
		err    error
		status int
		code   string
	}{
		{&RefusedError{Code: CodeNotFound, Message: "no message"}, 404, CodeNotFound},
		{&RefusedError{Code: CodeNoSession, Message: "no such session"}, 404, CodeNoSession},
		{&RefusedError{Code: CodeNotQuarantined, Status: "done", Message: "message m is done, not quarantined"}, 409, CodeNotQuarantined},
		{&RefusedError{Code: CodeSessionEnded, Message: "ended"}, 409, CodeSessionEnded},
		{&RefusedError{Code: CodeUnavailable, Message: "later"}, 503, CodeUnavailable},
		{fmt.Errorf("requeue: %w", persistence.ErrUnavailable), 503, CodeUnavailable},
		{fmt.Errorf("requeue: %w", persistence.ErrNotFound), 404, CodeNoSession},
	}
	for _, tc := range refusals {
		sessions.mu.Lock()
		sessions.requeueErr = tc.err
		sessions.mu.Unlock()
		if got := h.do(http.MethodPost, path("m"), nil, ""); got.status != tc.status || got.errCode() != tc.code {
			t.Errorf("requeue refused with %v = %d %q, want %d %q", tc.err, got.status, got.errCode(), tc.status, tc.code)
		}
	}
	for _, bad := range []string{path("m\n1"), path(strings.Repeat("m", MaxIDBytes+1)), path("m") + "?wait=soon"} {
		if got := h.do(http.MethodPost, bad, nil, ""); got.status != http.StatusBadRequest {
			t.Errorf("POST %s = %d %s, want 400", bad, got.status, got.body)
		}
	}
	if got := h.do(http.MethodGet, path("m"), nil, ""); got.status != http.StatusMethodNotAllowed {
		t.Errorf("GET requeue = %d, want 405", got.status)
	}
	h.p.Drain()
	if got := h.do(http.MethodPost, path("m"), nil, ""); got.status != 503 || got.errCode() != CodeDraining {
		t.Errorf("POST requeue while draining = %d %q, want 503 %q", got.status, got.errCode(), CodeDraining)
	}
}

// TestQuarantinedRoute: GET /v1/quarantined lists what Sessions.Quarantined returns, newest
// first as it returns them, at most ?limit= (100 by default, at most 1000), an empty list as
// [], and refuses a bad limit.
func TestQuarantinedRoute(t *testing.T) {
	sessions := newFakeSessions()
	h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})
	got := h.do(http.MethodGet, "/v1/quarantined", nil, "")
	if got.status != http.StatusOK || !strings.Contains(string(got.body), `"messages":[]`) {
		t.Errorf("GET /v1/quarantined with none = %d %s, want 200 with an empty list", got.status, got.body)
	}
	at := time.Date(2026, 12, 3, 4, 0, 0, 0, time.UTC)
	sessions.quarantined = []QuarantinedMessage{
		{SessionKey: "agent:main:http:dm:c2", SessionID: "s2", MessageID: "m2", Seq: 4, UserID: "bob", Text: "later", CreatedAt: at},
		{SessionKey: "agent:main:http:dm:c1", SessionID: "s1", SessionEnded: true, MessageID: "m1", Seq: 1, UserID: "ann", Text: "earlier", CreatedAt: at.Add(-time.Hour)},
	}
	got = h.do(http.MethodGet, "/v1/quarantined?limit=1", nil, "")
	if got.status != http.StatusOK {
		t.Fatalf("GET /v1/quarantined?limit=1 = %d %s", got.status, got.body)
	}
	if list := mustDecode[QuarantinedList](t, got); len(list.Messages) != 1 || list.Messages[0] != sessions.quarantined[0] {
		t.Errorf("GET /v1/quarantined?limit=1 = %+v, want the newest, %+v", list, sessions.quarantined[0])
	}
	got = h.do(http.MethodGet, "/v1/quarantined", nil, "")
	if list := mustDecode[QuarantinedList](t, got); len(list.Messages) != 2 || !list.Messages[1].SessionEnded {
		t.Errorf("GET /v1/quarantined = %+v, want both, the second of an ended session", list)
	}
	h.do(http.MethodGet, "/v1/quarantined?limit=5000", nil, "")
	if calls := sessions.callLog(); !slices.Equal(calls, []string{"quarantined 100", "quarantined 1", "quarantined 100", "quarantined 1000"}) {
		t.Errorf("Sessions calls %q, want the limits 100 (default), 1, 100 and 1000 (the most)", calls)
	}
	for _, q := range []string{"?limit=0", "?limit=x", "?limit=1&limit=2"} {
		if got := h.do(http.MethodGet, "/v1/quarantined"+q, nil, ""); got.status != 400 || got.errCode() != CodeInvalidQuery {
			t.Errorf("GET /v1/quarantined%s = %d %s, want 400 %s", q, got.status, got.body, CodeInvalidQuery)
		}
	}
	sessions.quarantinedErr = fmt.Errorf("quarantined: %w", persistence.ErrUnavailable)
	if got := h.do(http.MethodGet, "/v1/quarantined", nil, ""); got.status != 503 || got.errCode() != CodeUnavailable {
		t.Errorf("GET /v1/quarantined with the store unavailable = %d %s, want 503 %s", got.status, got.body, CodeUnavailable)
	}
}

// TestRequeueWaitOnAClusterMemberFindsAnAnswerTheRelayMissed: on a cluster member a requeue's
// ?wait also reads the outbox, past the key's outbox seq before the requeue, as a message's
// does: the run's answer, sent on the member that owns the key and whose relay missed this
// one, is found there; the quarantine notice, which answered the message before, is not taken
// for it. A member that does not report that seq (an older one) leaves the wait to the relay.
//
// Before, a requeue's wait never read the outbox: the client got 202 at the end of its wait,
// the answer long durable.
func TestRequeueWaitOnAClusterMemberFindsAnAnswerTheRelayMissed(t *testing.T) {
	src := identity.Source{Platform: "http", ChatType: "dm", ChatID: "c", UserID: "u"}
	key := keyFor(src)
	in := &platforms.Inbound{Source: src, MessageID: "m1"}
	notice := reply(in, 2, "quarantined", true)
	notice.Kind = platforms.KindNotice
	path := "/v1/sessions/" + url.PathEscape(key) + "/messages/m1/requeue?wait="
	for _, tc := range []struct {
		after  int64
		wait   string
		status int
	}{
		{3, "5s", http.StatusOK},
		{0, "200ms", http.StatusAccepted},
	} {
		t.Run(fmt.Sprint("after=", tc.after), func(t *testing.T) {
			sessions := newFakeSessions()
			sessions.requeueAfter = tc.after
			sessions.replies[key+"\x00m1"] = []*platforms.Outbound{notice, reply(in, 5, "answered elsewhere", true)}
			h := mustStart(t, Config{Sessions: sessions, Clustered: true, ReplyCheck: 10 * time.Millisecond}, &fakeRuntime{})
			got := h.do(http.MethodPost, path+tc.wait, nil, "")
			if got.status != tc.status {
				t.Fatalf("POST requeue ?wait = %d %s, want %d", got.status, got.body, tc.status)
			}
			if tc.status != http.StatusOK {
				if calls := sessions.callLog(); slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, "replies") }) {
					t.Errorf("a requeue with no outbox seq read the outbox for its wait: %q", calls)
				}
				return
			}
			want := []Reply{{Text: "answered elsewhere", TurnID: "t1", Kind: "reply", Seq: 5}}
			if diff := cmp.Diff(want, mustDecode[MessageResponse](t, got).Replies); diff != "" {
				t.Errorf("replies mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestUnknownQueryParameterIsRefused: a query parameter a route does not take, a misspelt one
// above all, is a 400 invalid_query that names it and what the route takes, on every /v1
// route, as a body field the route does not take is refused: before, ?wiat=30s was ignored and
// the message acknowledged without waiting, and a misspelt ?limt= listed 100.
func TestUnknownQueryParameterIsRefused(t *testing.T) {
	sessions := newFakeSessions()
	key := "agent:main:http:dm:c"
	sessions.infos[key] = &SessionInfo{SessionKey: key, SessionID: "s1", Platform: "http", ChatType: "dm", ChatID: "c", UserID: "u"}
	rt := &fakeRuntime{}
	h := mustStart(t, Config{Sessions: sessions}, rt)
	msg := `{"chat_id":"c","user_id":"u","text":"t"}`
	for _, tc := range []struct {
		method, path, body, takes string
	}{
		{"POST", "/v1/messages?wiat=30s", msg, "wait"},
		{"GET", "/v1/sessions?limt=5", "", "platform, state, after, limit"},
		{"GET", "/v1/sessions/" + url.PathEscape(key) + "?verbose=1", "", "none"},
		{"POST", "/v1/sessions/" + url.PathEscape(key) + "/reset?wait=1s", "", "none"},
		{"GET", "/v1/sessions/" + url.PathEscape(key) + "/transcript?session=s1", "", "session_id, after, limit"},
		{"GET", "/v1/sessions/" + url.PathEscape(key) + "/events?since=3", "", "after"},
		{"POST", "/v1/sessions/" + url.PathEscape(key) + "/messages/m1/requeue?wiat=1s", "", "wait"},
		{"GET", "/v1/quarantined?limt=5", "", "limit"},
	} {
		hdr := map[string]string{}
		if tc.body != "" {
			hdr["Content-Type"] = "application/json"
		}
		got := h.do(tc.method, tc.path, hdr, tc.body)
		if got.status != http.StatusBadRequest || got.errCode() != CodeInvalidQuery || !strings.Contains(string(got.body), "it takes "+tc.takes) {
			t.Errorf("%s %s = %d %s, want 400 %s saying it takes %s", tc.method, tc.path, got.status, got.body, CodeInvalidQuery, tc.takes)
		}
	}
	checkNothingReached(t, sessions, rt)
}

// checkNothingReached fails t when requests refused for their query reached the sessions, or
// a message refused so was delivered.
func checkNothingReached(t *testing.T, sessions *fakeSessions, rt *fakeRuntime) {
	t.Helper()
	if calls := sessions.callLog(); len(calls) != 0 {
		t.Errorf("requests refused for their query still reached the sessions: %q", calls)
	}
	if n := len(rt.delivered()); n != 0 {
		t.Errorf("a message refused for its query was delivered %d times", n)
	}
}

// TestLimitTooLargeForAnIntIsTheMaximum: a limit too large for an int is a larger limit like
// any other, read as the most (1000), on every route that takes one, as docs/HTTP-API.md says; a
// negative one or one that is no integer is still refused. Before, strconv.Atoi's overflow
// made ?limit=99999999999999999999 a 400 "limit must be a positive integer".
func TestLimitTooLargeForAnIntIsTheMaximum(t *testing.T) {
	const huge = "99999999999999999999"
	sessions := newFakeSessions()
	sessions.infos[streamKey] = &SessionInfo{SessionKey: streamKey, SessionID: "s1"}
	sessions.transcript = longTranscript(MaxTranscriptLimit + 1)
	for i := range MaxQuarantinedLimit + 1 {
		sessions.quarantined = append(sessions.quarantined, QuarantinedMessage{SessionKey: streamKey, MessageID: fmt.Sprint("m", i)})
	}
	h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})

	got := h.do(http.MethodGet, "/v1/sessions?limit="+huge, nil, "")
	if list := mustDecode[SessionList](t, got); got.status != http.StatusOK || len(list.Sessions) != 1 {
		t.Errorf("GET /v1/sessions?limit=%s = %d %s, want 200 with the session", huge, got.status, got.body)
	}
	sessions.mu.Lock()
	limit := sessions.lastList.Limit
	sessions.mu.Unlock()
	if limit != MaxListLimit {
		t.Errorf("GET /v1/sessions?limit=%s listed %d sessions at most, want %d", huge, limit, MaxListLimit)
	}

	got = h.do(http.MethodGet, "/v1/quarantined?limit="+huge, nil, "")
	if list := mustDecode[QuarantinedList](t, got); got.status != http.StatusOK || len(list.Messages) != MaxQuarantinedLimit {
		t.Errorf("GET /v1/quarantined?limit=%s = %d with %d messages, want 200 with %d", huge, got.status, len(list.Messages), MaxQuarantinedLimit)
	}

	got = h.do(http.MethodGet, "/v1/sessions/"+streamKey+"/transcript?limit="+huge, nil, "")
	if tr := mustDecode[Transcript](t, got); got.status != http.StatusOK || len(tr.Messages) != MaxTranscriptLimit || tr.Next != MaxTranscriptLimit {
		t.Errorf("GET transcript?limit=%s = %d with %d messages and next %d, want 200 with %d and next %d",
			huge, got.status, len(tr.Messages), tr.Next, MaxTranscriptLimit, MaxTranscriptLimit)
	}

	for _, path := range []string{"/v1/sessions?limit=-" + huge, "/v1/quarantined?limit=-" + huge,
		"/v1/sessions/" + streamKey + "/transcript?limit=-" + huge, "/v1/sessions?limit=1e99", "/v1/quarantined?limit=0x10"} {
		if got := h.do(http.MethodGet, path, nil, ""); got.status != http.StatusBadRequest || got.errCode() != CodeInvalidQuery {
			t.Errorf("GET %s = %d %s, want 400 %s", path, got.status, got.body, CodeInvalidQuery)
		}
	}
}

// TestEmptyQueryValueIsRefused: a query parameter given with no value (?limit=, or ?wait with
// no =) is a 400 invalid_query that names it, on every route and for every parameter it takes,
// never read as if the parameter were absent. Before, ?limit=, ?after=, ?state=, ?platform=
// and ?session_id= were answered 200 with the defaults, while ?wait= was a 400.
func TestEmptyQueryValueIsRefused(t *testing.T) {
	sessions := newFakeSessions()
	sessions.infos[streamKey] = &SessionInfo{SessionKey: streamKey, SessionID: "s1"}
	rt := &fakeRuntime{}
	h := mustStart(t, Config{Sessions: sessions}, rt)
	msg := `{"chat_id":"c","user_id":"u","text":"t"}`
	key := url.PathEscape(streamKey)
	for _, tc := range []struct {
		method, path, body, param string
	}{
		{"POST", "/v1/messages?wait=", msg, "wait"},
		{"POST", "/v1/messages?wait", msg, "wait"},
		{"GET", "/v1/sessions?limit=", "", "limit"},
		{"GET", "/v1/sessions?after=", "", "after"},
		{"GET", "/v1/sessions?state=", "", "state"},
		{"GET", "/v1/sessions?platform=&limit=5", "", "platform"},
		{"GET", "/v1/sessions/" + key + "/transcript?session_id=", "", "session_id"},
		{"GET", "/v1/sessions/" + key + "/transcript?after=", "", "after"},
		{"GET", "/v1/sessions/" + key + "/transcript?limit=", "", "limit"},
		{"GET", "/v1/sessions/" + key + "/events?after=", "", "after"},
		{"GET", "/v1/sessions/" + key + "/events?lastEventId=", "", "lastEventId"},
		{"POST", "/v1/sessions/" + key + "/messages/m1/requeue?wait=", "", "wait"},
		{"GET", "/v1/quarantined?limit=", "", "limit"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			var got response
			if _, q, ok := strings.Cut(tc.path, "/events?"); ok {
				// A stream that is not refused is held open: read its status only.
				s := h.openSSE(streamKey, "", "?"+q)
				got.status = s.status
				if s.status != http.StatusOK {
					got.body, _ = io.ReadAll(s.body)
				}
			} else {
				hdr := map[string]string{}
				if tc.body != "" {
					hdr["Content-Type"] = "application/json"
				}
				got = h.do(tc.method, tc.path, hdr, tc.body)
			}
			e := mustDecodeError(t, got)
			if got.status != http.StatusBadRequest || e.Code != CodeInvalidQuery || !strings.Contains(e.Message, fmt.Sprintf("%q has no value", tc.param)) {
				t.Errorf("%s %s = %d %s, want 400 %s saying %q has no value", tc.method, tc.path, got.status, got.body, CodeInvalidQuery, tc.param)
			}
		})
	}
	checkNothingReached(t, sessions, rt)
}

// TestUnknownQueryParametersAreNamedInOrder: of several parameters a route does not take, the
// error names the first in sorted order, the same one every time the request is sent. Before,
// it named one picked in a map's order: ?c=3&a=1&b=2 named a different one from run to run.
// A name is cut short in the message, as a body field's is: the request line may run to 64 KiB.
func TestUnknownQueryParametersAreNamedInOrder(t *testing.T) {
	h := mustStart(t, Config{Sessions: newFakeSessions()}, &fakeRuntime{})
	for i := range 20 {
		got := h.do(http.MethodGet, "/v1/sessions?c=3&limit=5&a=1&b=2", nil, "")
		e := mustDecodeError(t, got)
		if got.status != http.StatusBadRequest || e.Code != CodeInvalidQuery || !strings.HasPrefix(e.Message, `the query parameter "a" is not one`) {
			t.Fatalf("request %d: GET /v1/sessions?c=3&limit=5&a=1&b=2 = %d %s, want 400 %s naming \"a\"", i, got.status, got.body, CodeInvalidQuery)
		}
	}
	long := strings.Repeat("x", 20000)
	got := h.do(http.MethodGet, "/v1/sessions?"+long+"=1", nil, "")
	if e := mustDecodeError(t, got); got.status != http.StatusBadRequest || e.Code != CodeInvalidQuery || len(got.body) > 1024 || !strings.Contains(e.Message, `"xxxxxxxxxx`) {
		t.Errorf("GET /v1/sessions?<%d x>=1 = %d with a body of %d bytes (%.200s), want 400 %s naming it in under 1 KiB", len(long), got.status, len(got.body), got.body, CodeInvalidQuery)
	}
}

// mustDecodeError decodes an error body.
func mustDecodeError(t *testing.T, r response) APIError {
	t.Helper()
	return mustDecode[ErrorResponse](t, r).Error
}

// TestListFiltersAreChecked: a ?platform= that names no platform agentgate knows, and an
// ?after= that is no session key, are a 400 invalid_query naming the parameter (and the
// platforms known), before Sessions is asked. Before, ?platform=bogus (or HTTP) listed nothing
// with a 200, as if no session were there, and ?after=100 (a transcript's kind of after)
// listed the first page again, every time: a client paging with it never ended.
func TestListFiltersAreChecked(t *testing.T) {
	sessions := newFakeSessions()
	rt := &fakeRuntime{}
	h := mustStart(t, Config{Sessions: sessions}, rt)
	for _, tc := range []struct {
		query string
		want  []string // in the message
	}{
		{"?platform=bogus", []string{`platform "bogus"`, "discord, http"}},
		{"?platform=Discord&limit=5", []string{`platform "Discord"`, "discord, http"}},
		{"?platform=fake", []string{`platform "fake"`, "discord, http"}},
		{"?after=100", []string{`after "100"`, "session key", "next"}},
		{"?after=agent:main:http:dm", []string{"after", "session key"}},
		{"?state=active&after=agent:main:http:sms:c", []string{"after", "session key"}},
	} {
		got := h.do(http.MethodGet, "/v1/sessions"+tc.query, nil, "")
		e := mustDecodeError(t, got)
		if got.status != http.StatusBadRequest || e.Code != CodeInvalidQuery {
			t.Errorf("GET /v1/sessions%s = %d %s, want 400 %s", tc.query, got.status, got.body, CodeInvalidQuery)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(e.Message, w) {
				t.Errorf("GET /v1/sessions%s: message %q, want it to name %q", tc.query, e.Message, w)
			}
		}
	}
	checkNothingReached(t, sessions, rt)

	// An embedder's own platform is known when it is named in Config.Platforms; agentgate's
	// own stay known beside it.
	embedded := mustStart(t, Config{Sessions: sessions, Platforms: []string{"fake"}}, rt)
	for _, name := range []string{"fake", "http", "discord"} {
		if got := embedded.do(http.MethodGet, "/v1/sessions?platform="+name, nil, ""); got.status != http.StatusOK {
			t.Errorf("GET /v1/sessions?platform=%s with Platforms [fake] = %d %s, want 200", name, got.status, got.body)
		}
	}
	got := embedded.do(http.MethodGet, "/v1/sessions?platform=bogus", nil, "")
	if e := mustDecodeError(t, got); got.status != http.StatusBadRequest || !strings.Contains(e.Message, "discord, fake, http") {
		t.Errorf("GET /v1/sessions?platform=bogus with Platforms [fake] = %d %s, want 400 naming discord, fake, http", got.status, got.body)
	}
}
