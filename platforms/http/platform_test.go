package http

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/platforms"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestNewAddressPolicy(t *testing.T) {
	cases := []struct {
		addr    string
		token   string
		wantErr string
	}{
		{"127.0.0.1:0", "", ""},
		{"localhost:0", "", ""},
		{"[::1]:0", "", ""},
		{"127.0.0.2:8080", "", ""},
		{"", "", ""}, // DefaultAddr, loopback
		{"0.0.0.0:0", "", "refusing to listen on public address 0.0.0.0:0 without a bearer token (set http.token_env)"},
		{":8080", "", "refusing to listen on public address :8080 without a bearer token"},
		{"[::]:0", "", "refusing to listen on public address [::]:0"},
		{"192.0.2.1:80", "", "refusing to listen on public address 192.0.2.1:80"},
		{"example.com:80", "", "refusing to listen on public address example.com:80"},
		{"0.0.0.0:0", "tok", ""},
		{"no-port", "", "parse address"},
	}
	for _, tc := range cases {
		t.Run(tc.addr, func(t *testing.T) {
			_, err := New(Config{Addr: tc.addr, Token: tc.token})
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("New(%q, token %q) error = %v, want nil", tc.addr, tc.token, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("New(%q, token %q) error = %v, want one containing %q", tc.addr, tc.token, err, tc.wantErr)
			}
		})
	}
}

// TestIPv4AddressListensOnIPv4Only: 0.0.0.0 is IPv4's addresses, as configured, and the
// address the daemon says it listens on says so. Before (found by an audit), Go's "tcp"
// listened on IPv6's too and the daemon said `listening on [::]:port`.
func TestIPv4AddressListensOnIPv4Only(t *testing.T) {
	p, err := New(Config{Addr: "0.0.0.0:0", Token: "a-token-long-enough"})
	if err != nil {
		t.Fatal(err)
	}
	addr, err := p.Listen()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.ln.Close() })
	if got := addr.String(); !strings.HasPrefix(got, "0.0.0.0:") {
		t.Errorf("listening on %s, want 0.0.0.0:port", got)
	}
	for addr, want := range map[string]string{"127.0.0.1:8080": "tcp4", "0.0.0.0:80": "tcp4",
		"[::]:80": "tcp", "[::1]:80": "tcp", ":80": "tcp", "localhost:80": "tcp", "[::ffff:127.0.0.1]:80": "tcp"} {
		if got := listenNetwork(addr); got != want {
			t.Errorf("listenNetwork(%q) = %q, want %q", addr, got, want)
		}
	}
}

func TestAuth(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "agentgate_up 1\n") })
	h := mustStart(t, Config{Token: "s3cret", Metrics: metrics}, &fakeRuntime{})
	msg := `{"chat_id":"c","user_id":"u","text":"t"}`
	cases := []struct {
		name       string
		method     string
		path       string
		auth       string
		wantStatus int
	}{
		{"message without token", "POST", "/v1/messages", "", 401},
		{"message with wrong token", "POST", "/v1/messages", "Bearer nope", 401},
		{"message with token prefix", "POST", "/v1/messages", "Bearer s3cre", 401},
		{"message with basic auth", "POST", "/v1/messages", "Basic czNjcmV0", 401},
		{"message with token", "POST", "/v1/messages", "Bearer s3cret", 202},
		{"scheme is case-insensitive", "POST", "/v1/messages", "bearer s3cret", 202},
		{"metrics without token", "GET", "/metrics", "", 401},
		{"metrics with token", "GET", "/metrics", "Bearer s3cret", 200},
		{"sessions without token", "GET", "/v1/sessions", "", 401},
		{"unknown route without token", "GET", "/nope", "", 401},
		{"healthz is open", "GET", "/healthz", "", 200},
		{"readyz is open", "GET", "/readyz", "", 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{}
			if tc.auth != "" {
				hdr["Authorization"] = tc.auth
			}
			body := ""
			if tc.method == "POST" {
				body = msg
			}
			got := h.do(tc.method, tc.path, hdr, body)
			if got.status != tc.wantStatus {
				t.Errorf("%s %s with %q = %d %s, want %d", tc.method, tc.path, tc.auth, got.status, got.body, tc.wantStatus)
			}
			if tc.wantStatus == 401 && got.errCode() != CodeUnauthorized {
				t.Errorf("401 code = %q, want %q", got.errCode(), CodeUnauthorized)
			}
			// A client without the token keeps no connection open: before, each 401 left it
			// idle for the server's idle timeout (2 minutes).
			if got.close != (tc.wantStatus == 401) {
				t.Errorf("%d answer closes its connection: %v, want %v", got.status, got.close, tc.wantStatus == 401)
			}
		})
	}

	// A refusal is logged (at most once a minute, repeats counted), never with the token sent.
	logs := &testutil.Buffer{}
	logged := mustStart(t, Config{Token: "s3cret", Logger: slog.New(slog.NewTextHandler(logs, nil))}, &fakeRuntime{})
	logged.do("GET", "/metrics", map[string]string{"Authorization": "Bearer stale-token"}, "")
	logged.do("GET", "/metrics", map[string]string{"Authorization": "Bearer stale-token"}, "")
	if n := strings.Count(logs.String(), "request refused: missing or invalid bearer token"); n != 1 {
		t.Errorf("%d lines for two refused requests within a minute, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "path=/metrics") || !strings.Contains(logs.String(), "authorization=true") || strings.Contains(logs.String(), "stale-token") {
		t.Errorf("the refusal's line names the path and whether a token came, never the token:\n%s", logs.String())
	}

	// A token read with its line end (a file with Windows line ends, an EnvironmentFile) is the
	// token without it, as a client's header is read: before, every request was refused.
	crlf := mustStart(t, Config{Token: "s3cret\r\n"}, &fakeRuntime{})
	if got := crlf.do("GET", "/v1/sessions", map[string]string{"Authorization": "Bearer s3cret"}, ""); got.status == 401 {
		t.Errorf("a token configured with its line end refuses the token: %d %s", got.status, got.body)
	}
}

// TestReadyzShowsErrorsOnlyWithTheToken: /readyz needs no token (load balancers call it), but a
// request without the daemon's token is told only which components fail ("failing"), with the
// status code; the token shows each one's error. A daemon without a token is open anyway, and
// shows them to all. Before, anyone who reached /readyz read the store's error, which on
// PostgreSQL names its user, database and socket path (found by a security walkthrough).
func TestReadyzShowsErrorsOnlyWithTheToken(t *testing.T) {
	const secret = `ping: connect to postgres user=agentgate database=agentgate host=/run/postgresql: password authentication failed`
	ready := func(context.Context) map[string]error {
		return map[string]error{"store": errors.New(secret), "platform.http": nil}
	}
	withToken := mustStart(t, Config{Token: "s3cret", Ready: ready}, &fakeRuntime{})
	open := mustStart(t, Config{Ready: ready}, &fakeRuntime{})
	const hidden = "each failing component's error is shown to a request with the bearer token (Authorization: Bearer …)"
	cases := []struct {
		name       string
		h          *harness
		auth       string
		wantStore  string
		wantDetail string
	}{
		{"no token sent", withToken, "", ComponentFailing, hidden},
		{"a wrong token", withToken, "Bearer nope", ComponentFailing, hidden},
		{"the token", withToken, "Bearer s3cret", secret, ""},
		{"a daemon without a token", open, "", secret, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{}
			if tc.auth != "" {
				hdr["Authorization"] = tc.auth
			}
			got := tc.h.do("GET", "/readyz", hdr, "")
			want := ReadyResponse{Status: "not_ready", Detail: tc.wantDetail,
				Components: map[string]string{"store": tc.wantStore, "platform.http": ComponentOK}}
			if diff := cmp.Diff(want, mustDecode[ReadyResponse](t, got)); got.status != http.StatusServiceUnavailable || diff != "" {
				t.Errorf("GET /readyz with %q = %d, want 503; body (-want +got):\n%s", tc.auth, got.status, diff)
			}
			if tc.wantStore != secret && strings.Contains(string(got.body), "postgres") {
				t.Errorf("GET /readyz with %q = %s, want nothing of the store's error", tc.auth, got.body)
			}
		})
	}

	// Ready, it says so to all alike, and nothing of how to see errors.
	fine := mustStart(t, Config{Token: "s3cret", Ready: func(context.Context) map[string]error {
		return map[string]error{"store": nil}
	}}, &fakeRuntime{})
	got := fine.do("GET", "/readyz", nil, "")
	want := ReadyResponse{Status: "ready", Components: map[string]string{"store": ComponentOK}}
	if diff := cmp.Diff(want, mustDecode[ReadyResponse](t, got)); got.status != http.StatusOK || diff != "" {
		t.Errorf("GET /readyz of a ready daemon without the token = %d, want 200; body (-want +got):\n%s", got.status, diff)
	}
}

// TestRunHeader: every answer names the daemon's run; a request meant for another run (an admin
// command that found this address in another run's record) is answered 421 before the token
// is looked at, and never reaches a route; one that names this run, or none, goes on.
func TestRunHeader(t *testing.T) {
	h := mustStart(t, Config{Token: "s3cret", Run: "r_1"}, &fakeRuntime{})
	cases := []struct {
		name, method, path, run, auth string
		wantStatus                    int
	}{
		{"healthz", "GET", "/healthz", "", "", 200},
		{"healthz of this run", "GET", "/healthz", "r_1", "", 200},
		{"healthz of another run", "GET", "/healthz", "r_2", "", 421},
		{"reset of another run, with the token", "POST", "/v1/sessions/agent:main:http:dm:u/reset", "r_2", "Bearer s3cret", 421},
		{"reset of another run, without the token", "POST", "/v1/sessions/agent:main:http:dm:u/reset", "r_2", "", 421},
		{"reset of this run, without the token", "POST", "/v1/sessions/agent:main:http:dm:u/reset", "r_1", "", 401},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{}
			if tc.auth != "" {
				hdr["Authorization"] = tc.auth
			}
			if tc.run != "" {
				hdr[RunHeader] = tc.run
			}
			got := h.do(tc.method, tc.path, hdr, "")
			if got.status != tc.wantStatus || got.header.Get(RunHeader) != "r_1" {
				t.Errorf("%s %s (run %q) = %d %s, run %q; want %d, run r_1", tc.method, tc.path, tc.run, got.status, got.body, got.header.Get(RunHeader), tc.wantStatus)
			}
			if tc.wantStatus == 421 && got.errCode() != CodeMisdirected {
				t.Errorf("421 code = %q, want %q", got.errCode(), CodeMisdirected)
			}
		})
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	storeErr := errors.New("database is locked")
	ready := make(chan error, 1)
	ready <- storeErr
	h := mustStart(t, Config{Ready: func(context.Context) map[string]error {
		err := <-ready
		ready <- nil // later probes see a healthy store
		return map[string]error{"store": err, "platform/http": nil}
	}}, &fakeRuntime{})

	got := h.do("GET", "/healthz", nil, "")
	if got.status != 200 || strings.TrimSpace(string(got.body)) != `{"status":"ok"}` {
		t.Errorf("GET /healthz = %d %s, want 200 {\"status\":\"ok\"}", got.status, got.body)
	}

	got = h.do("GET", "/readyz", nil, "")
	r := mustDecode[ReadyResponse](t, got)
	if got.status != 503 || r.Status != "not_ready" || r.Components["store"] != "database is locked" || r.Components["platform/http"] != "ok" {
		t.Errorf("GET /readyz with a failing store = %d %s, want 503 not_ready with the store's error", got.status, got.body)
	}
	got = h.do("GET", "/readyz", nil, "")
	r = mustDecode[ReadyResponse](t, got)
	if got.status != 200 || r.Status != "ready" || r.Components["store"] != "ok" {
		t.Errorf("GET /readyz = %d %s, want 200 ready", got.status, got.body)
	}

	if got := h.do("GET", "/metrics", nil, ""); got.status != 404 || got.errCode() != CodeNotFound {
		t.Errorf("GET /metrics without a handler = %d %q, want 404 %q", got.status, got.errCode(), CodeNotFound)
	}
	if got := h.do("POST", "/healthz", nil, ""); got.status != 405 || got.errCode() != CodeMethodNotAllowed {
		t.Errorf("POST /healthz = %d %q, want 405 %q", got.status, got.errCode(), CodeMethodNotAllowed)
	}
}

func TestPanicInHandlerIsRecovered(t *testing.T) {
	sessions := newFakeSessions()
	sessions.panicGet = true
	h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})
	got := h.do("GET", "/v1/sessions/agent:main:http:dm:k", nil, "")
	if got.status != 500 || got.errCode() != CodeInternal {
		t.Errorf("GET with a panicking handler = %d %q, want 500 %q", got.status, got.errCode(), CodeInternal)
	}
	if got := h.do("GET", "/healthz", nil, ""); got.status != 200 {
		t.Errorf("GET /healthz after a panic = %d, want 200", got.status)
	}
}

// TestRunStopsStreamsAndWaits: a stop ends the SSE streams and answers the ?wait callers
// itself, so that the server's graceful shutdown finds no handler left and does not wait out
// its bound (shutdownTimeout) to close their connections: the log says which way it went.
func TestRunStopsStreamsAndWaits(t *testing.T) {
	sessions := newFakeSessions()
	rt := &fakeRuntime{}
	logs := &testutil.Buffer{}
	h := mustStart(t, Config{Sessions: sessions, Logger: slog.New(slog.NewTextHandler(logs, nil))}, rt)

	stream := h.openSSE(streamKey, "", "")
	if stream.status != 200 {
		t.Fatalf("GET events = %d, want 200", stream.status)
	}
	waited := make(chan response, 1)
	go func() {
		waited <- h.post("/v1/messages?wait=1m", map[string]string{"chat_id": "c", "user_id": "u", "text": "t", "message_id": "m1"})
	}()
	waitFor(t, "the SSE subscriber and the waiter", func() bool {
		return h.p.subscriberCount(streamKey) == 1 && h.p.waiterCount() == 1
	})

	h.stop()
	if line := grepLine(logs.String(), "http shutdown timed out"); line != "" {
		t.Errorf("the stop waited out its bound for a stream or a waiter: %s", line)
	}
	if _, err := stream.next(); !errors.Is(err, io.EOF) {
		t.Errorf("SSE read after stop = %v, want EOF", err)
	}
	got := <-waited
	if got.status != http.StatusAccepted {
		t.Errorf("waiting POST after stop = %d %s, want 202", got.status, got.body)
	}
}

func TestRunRestartsAfterStop(t *testing.T) {
	h := mustNew(t, Config{})
	for i := range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		addr, err := h.p.Listen()
		if err != nil {
			t.Fatalf("Listen() #%d error = %v", i, err)
		}
		done := make(chan error, 1)
		go func() { done <- h.p.Run(ctx, (&fakeRuntime{}).deliver) }()
		resp, err := http.Get("http://" + addr.String() + "/healthz")
		if err != nil {
			t.Fatalf("GET /healthz #%d error = %v", i, err)
		}
		resp.Body.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() #%d = %v, want nil", i, err)
		}
	}
	if err := h.p.Run(context.Background(), nil); err == nil {
		t.Errorf("Run(nil deliver) = nil, want error")
	}
}

func TestSendNeverBlocks(t *testing.T) {
	h := mustNew(t, Config{})
	h.p.subBuffer = 2
	slow := h.p.subscribe(streamKey)
	w := h.p.addWaiter("c", "m1")
	ctx := context.Background()
	for i := range 100 {
		out := &platforms.Outbound{SessionKey: streamKey, Seq: int64(i + 1), InReplyTo: []string{"m1", "m1"}}
		if err := h.p.Send(ctx, out); err != nil {
			t.Fatalf("Send(%d) = %v, want nil", i, err)
		}
	}
	select {
	case <-slow.gone:
	default:
		t.Errorf("slow subscriber not dropped after overflowing its buffer")
	}
	if n := h.p.subscriberCount(streamKey); n != 0 {
		t.Errorf("subscribers of k after drop = %d, want 0", n)
	}
	if got := len(slow.ch); got != 2 {
		t.Errorf("dropped subscriber buffer holds %d events, want 2", got)
	}
	w.mu.Lock()
	n := len(w.got)
	w.mu.Unlock()
	if n != 100 {
		t.Errorf("waiter got %d outbounds (one per Send even with a repeated id), want 100", n)
	}
	if err := h.p.Send(ctx, nil); err == nil {
		t.Errorf("Send(nil) = nil, want error")
	}
}

// TestPprof: with Config.Pprof, Go's runtime profiles are served at /debug/pprof/ (a stuck
// daemon's goroutines, read without stopping it), behind the token like every other route;
// without it, those routes do not exist.
func TestPprof(t *testing.T) {
	token := map[string]string{"Authorization": "Bearer s3cret"}
	on := mustStart(t, Config{Token: "s3cret", Pprof: true}, &fakeRuntime{})
	if got := on.do("GET", "/debug/pprof/goroutine?debug=1", token, ""); got.status != 200 || !strings.Contains(string(got.body), "goroutine profile:") {
		t.Errorf("GET /debug/pprof/goroutine?debug=1 = %d %.200s, want 200 with the goroutine profile", got.status, got.body)
	}
	if got := on.do("GET", "/debug/pprof/", token, ""); got.status != 200 || !strings.Contains(string(got.body), "heap") {
		t.Errorf("GET /debug/pprof/ = %d %.200s, want 200 with the index of profiles", got.status, got.body)
	}
	if got := on.do("GET", "/debug/pprof/goroutine?debug=1", nil, ""); got.status != 401 {
		t.Errorf("GET /debug/pprof/goroutine without the token = %d, want 401", got.status)
	}
	off := mustStart(t, Config{Token: "s3cret"}, &fakeRuntime{})
	if got := off.do("GET", "/debug/pprof/goroutine?debug=1", token, ""); got.status != 404 || got.errCode() != CodeNotFound {
		t.Errorf("GET /debug/pprof/goroutine with pprof off = %d %.200s, want 404 %s", got.status, got.body, CodeNotFound)
	}
}

// TestBrowsersAreRefused: a web page cannot drive the API through the browser of someone on
// the daemon's host. Before, a page on any site could POST a message to a daemon without a
// token on 127.0.0.1 (a missing Content-Type is read as JSON) and have its agent run it, and a
// page that rebinds its own name to 127.0.0.1 could read every transcript.
func TestBrowsersAreRefused(t *testing.T) {
	tokenless := mustStart(t, Config{Sessions: newFakeSessions()}, &fakeRuntime{})
	withToken := mustStart(t, Config{Token: "s3cret", Sessions: newFakeSessions()}, &fakeRuntime{})
	msg := `{"chat_id":"c","user_id":"u","text":"t"}`
	cases := []struct {
		name       string
		h          *harness
		method     string
		path       string
		host       string // "" is the listener's address
		header     map[string]string
		wantStatus int
		wantCode   string
	}{
		{"curl", tokenless, "POST", "/v1/messages", "", nil, 202, ""},
		{"curl to localhost", tokenless, "POST", "/v1/messages", "localhost:8080", nil, 202, ""},
		{"curl to ::1", tokenless, "POST", "/v1/messages", "[::1]:8080", nil, 202, ""},
		{"page of another site", tokenless, "POST", "/v1/messages", "",
			map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}, 403, CodeCrossOrigin},
		{"older browser: Origin only", tokenless, "POST", "/v1/sessions/agent:main:http:dm:c/reset", "",
			map[string]string{"Origin": "https://evil.example"}, 403, CodeCrossOrigin},
		{"page of another site, with the token", withToken, "POST", "/v1/messages", "",
			map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example", "Authorization": "Bearer s3cret"}, 403, CodeCrossOrigin},
		{"address typed in the browser", tokenless, "GET", "/v1/sessions", "",
			map[string]string{"Sec-Fetch-Site": "none"}, 200, ""},
		{"rebound name, same origin", tokenless, "GET", "/v1/sessions", "evil.example:8080",
			map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://evil.example:8080"}, 403, CodeForeignHost},
		{"rebound name posts", tokenless, "POST", "/v1/messages", "evil.example:8080",
			map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://evil.example:8080"}, 403, CodeForeignHost},
		{"rebound name reads a transcript", tokenless, "GET", "/v1/sessions/agent:main:http:dm:c/transcript", "evil.example",
			nil, 403, CodeForeignHost},
		{"with a token, any name", withToken, "GET", "/v1/sessions", "gateway.example:443",
			map[string]string{"Authorization": "Bearer s3cret"}, 200, ""},
		// A proxy in front may add the token itself: a page's request is still refused.
		{"backend that passes on a page's Origin, with the token", withToken, "POST", "/v1/messages", "",
			map[string]string{"Origin": "https://chat.example.com", "Authorization": "Bearer s3cret"}, 403, CodeCrossOrigin},
		{"proxy that keeps the page's Host, with the token", withToken, "POST", "/v1/messages", "chat.example.com",
			map[string]string{"Origin": "https://chat.example.com", "Authorization": "Bearer s3cret"}, 202, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := io.Reader(nil)
			if tc.method == "POST" && tc.path == "/v1/messages" {
				body = strings.NewReader(msg)
			}
			req, err := http.NewRequest(tc.method, tc.h.base+tc.path, body)
			if err != nil {
				t.Fatalf("NewRequest: %v", err)
			}
			if tc.host != "" {
				req.Host = tc.host
			}
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			resp, err := tc.h.client.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", tc.method, tc.path, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got := response{status: resp.StatusCode, header: resp.Header, body: b}
			if got.status != tc.wantStatus || got.errCode() != tc.wantCode {
				t.Errorf("%s %s (Host %q, %v) = %d %s, want %d %q", tc.method, tc.path, tc.host, tc.header, got.status, got.body, tc.wantStatus, tc.wantCode)
			}
		})
	}
}

// TestCrossOriginSaysWhatToDrop: a web chat's backend that passes on its browser's Origin,
// with the token, is refused (a proxy in front may add the token to any page's request), and
// told how to get through. Before, the answer said only to send it from another client, which
// left its integrator to read the code to learn which header refused it.
func TestCrossOriginSaysWhatToDrop(t *testing.T) {
	h := mustStart(t, Config{Token: "s3cret"}, &fakeRuntime{})
	got := h.do("POST", "/v1/messages", map[string]string{
		"Origin": "https://chat.example.com", "Authorization": "Bearer s3cret", "Content-Type": "application/json",
	}, `{"chat_id":"c","user_id":"u","text":"t"}`)
	var e ErrorResponse
	_ = json.Unmarshal(got.body, &e)
	if got.status != http.StatusForbidden || e.Error.Code != CodeCrossOrigin ||
		!strings.Contains(e.Error.Message, "passes on a browser's Origin and Sec-Fetch-Site headers drop them") {
		t.Errorf("POST /v1/messages with the token and Origin https://chat.example.com = %d %s, want 403 %s saying to drop Origin and Sec-Fetch-Site",
			got.status, got.body, CodeCrossOrigin)
	}
}

// TestNonCanonicalPathsAreNotRedirected: a path that is not in canonical form (a doubled or
// trailing slash, a dot segment) is a JSON 404 that names the canonical path, never the
// mux's 307: a client that follows it sends a POST's body twice or not at all, and a proxy
// in front that allows or refuses routes by path saw another path than the one served.
// Before, each was a 307 (and this test's client, following it, had the message delivered).
func TestNonCanonicalPathsAreNotRedirected(t *testing.T) {
	rt := &fakeRuntime{}
	sessions := newFakeSessions()
	h := mustStart(t, Config{Sessions: sessions, Pprof: true}, rt)
	// A client that follows redirects shows it: a redirect is a test failure below either way.
	h.client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	msg := `{"chat_id":"c","user_id":"u","text":"t"}`
	cases := []struct {
		method, path string
		canonical    string // in the message; "" for nothing to check
	}{
		{"POST", "//v1/messages", "/v1/messages"},
		{"POST", "/v1/./messages", "/v1/messages"},
		{"POST", "/v1/x/../messages", "/v1/messages"},
		{"POST", "/v1//messages?wait=1s", "/v1/messages"},
		{"POST", "/v1/messages/", "the route is /v1/messages, without the trailing slash"},
		{"GET", "//v1/sessions", "/v1/sessions"},
		{"GET", "/v1/./sessions?limit=5", "/v1/sessions"},
		{"GET", "/v1/sessions/", "the route is /v1/sessions, without the trailing slash"},
		{"GET", "//v1/messages", "which is /v1/messages"}, // a route of POST only
		{"GET", "/v1/sessions/agent:main:http:dm:c/./transcript", "/v1/sessions/agent:main:http:dm:c/transcript"},
		{"GET", "/./healthz", "/healthz"},
		{"GET", "/debug/pprof", "/debug/pprof/"}, // the mux's own trailing-slash redirect
		{"HEAD", "/debug/pprof", ""},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			body := ""
			if tc.method == "POST" {
				body = msg
			}
			got := h.do(tc.method, tc.path, jsonHeader, body)
			if got.status != http.StatusNotFound || got.header.Get("Location") != "" {
				t.Fatalf("%s %s = %d (Location %q) %s, want 404 and no Location", tc.method, tc.path, got.status,
					got.header.Get("Location"), got.body)
			}
			if tc.method == "HEAD" {
				return
			}
			e := mustDecode[ErrorResponse](t, got)
			if e.Error.Code != CodeNotFound || !strings.Contains(e.Error.Message, tc.canonical) {
				t.Errorf("%s %s = %s, want code %s and a message naming %q", tc.method, tc.path, got.body, CodeNotFound, tc.canonical)
			}
		})
	}
	if n := len(rt.delivered()); n != 0 {
		t.Errorf("deliver called %d times, want 0", n)
	}
	// The canonical paths are served, and so is a key whose escaped slashes and dots are no
	// path segments (the path is compared escaped, as the mux does).
	sessions.infos["agent:main:http:dm:a%2F..%2Fb"] = &SessionInfo{SessionKey: "agent:main:http:dm:a%2F..%2Fb"}
	for _, path := range []string{"/v1/sessions", "/v1/sessions/agent:main:http:dm:a%252F..%252Fb", "/debug/pprof/"} {
		if got := h.do("GET", path, nil, ""); got.status != http.StatusOK {
			t.Errorf("GET %s = %d %.200s, want 200", path, got.status, got.body)
		}
	}
	if got := h.do("POST", "/v1/messages", jsonHeader, msg); got.status != http.StatusAccepted {
		t.Errorf("POST /v1/messages = %d %s, want 202", got.status, got.body)
	}
}

// TestRequestsAreCounted: every answer is counted by the route that served it and its status,
// refusals before the route and unknown paths included, and no path (which holds a session
// key) becomes a label. Before, nothing counted the 503s a client was told to send again with
// (found by an operations walkthrough: a corrupt database answered 503 with no metric moving).
func TestRequestsAreCounted(t *testing.T) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "requests_total"}, []string{"route", "code"})
	rt := &fakeRuntime{}
	h := mustStart(t, Config{Token: "s3cret", Requests: requests}, rt)
	auth := map[string]string{"Authorization": "Bearer s3cret", "Content-Type": "application/json"}
	msg := `{"chat_id":"c1","user_id":"u1","text":"hi","message_id":"m1"}`
	h.do("POST", "/v1/messages", auth, msg)
	rt.setRespond(func(context.Context, *platforms.Inbound) (*platforms.Ack, error) {
		return nil, platforms.ErrUnavailable
	})
	h.do("POST", "/v1/messages", auth, msg)
	h.do("POST", "/v1/messages", auth, msg)
	h.do("POST", "/v1/messages", map[string]string{"Content-Type": "application/json"}, msg) // no token
	h.do("POST", "/v1/messages", auth, `{"chat_id":`)
	h.do("GET", "/v1/sessions/agent:main:http:dm:secret-chat", auth, "")
	h.do("GET", "/v1/nothing-here", auth, "")

	want := map[[2]string]float64{
		{"POST /v1/messages", "202"}:      1,
		{"POST /v1/messages", "503"}:      2,
		{"POST /v1/messages", "401"}:      1,
		{"POST /v1/messages", "400"}:      1,
		{"GET /v1/sessions/{key}", "503"}: 1, // (no Sessions: 503)
		{"other", "404"}:                  1,
	}
	ch := make(chan prometheus.Metric, 64)
	requests.Collect(ch)
	close(ch)
	got := map[[2]string]float64{}
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		var route, code string
		for _, l := range pb.GetLabel() {
			switch l.GetName() {
			case "route":
				route = l.GetValue()
			case "code":
				code = l.GetValue()
			}
		}
		got[[2]string{route, code}] = pb.GetCounter().GetValue()
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests counted (-want +got):\n%s", diff)
	}
}

// TestLinesHeldBackAreReportedBeforeTheStop: the refusals a limited line holds back (a request
// without the token, refused again within the minute) are reported as the platform stops,
// before the line that says it stopped. Before, they were reported after it, as if the stopped
// platform still refused requests.
func TestLinesHeldBackAreReportedBeforeTheStop(t *testing.T) {
	logs := &testutil.Buffer{}
	h := mustStart(t, Config{Token: "s3cret", Logger: slog.New(slog.NewTextHandler(logs, nil))}, &fakeRuntime{})
	for range 3 {
		h.do("GET", "/metrics", map[string]string{"Authorization": "Bearer stale-token"}, "")
	}
	h.stop()
	var lines []string
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, "request refused: missing or invalid bearer token") || strings.Contains(l, "http platform stopped") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 3 || strings.Contains(lines[0], "repeats=") || !strings.Contains(lines[1], "repeats=2 ") ||
		!strings.Contains(lines[2], "http platform stopped") {
		t.Errorf("lines = %q, want the first refusal, then the two held back (repeats=2), then the stop's line:\n%s", lines, logs.String())
	}
}
