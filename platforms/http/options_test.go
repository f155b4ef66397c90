package http

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// doOptionsAsterisk sends OPTIONS * (a request for the server as a whole, not a route), with
// header.
func (h *harness) doOptionsAsterisk(header map[string]string) response {
	h.t.Helper()
	return h.doAsterisk(http.MethodOptions, header, "")
}

// doAsterisk sends method with the request target * (as curl --request-target '*' does), with
// header and body.
func (h *harness) doAsterisk(method string, header map[string]string, body string) response {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, h.base, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	req.URL.Opaque = "*" // the request target, as sent
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if v := header["Host"]; v != "" {
		req.Host = v
	}
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatalf("%s * error = %v", method, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("%s *: read body: %v", method, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b, close: resp.Close}
}

// TestOptionsAsteriskIsAnsweredAsOptionsOfARoute: the API takes no OPTIONS request, and
// OPTIONS * is answered as OPTIONS of any route is: 405 method_not_allowed, in JSON, its Allow
// naming the methods the API takes (GET, HEAD and POST, on one route or another), after the
// checks every request passes (the bearer token, the loopback Host of a daemon without one).
// Before, Go's server answered it itself, a bare 200 that no check saw.
func TestOptionsAsteriskIsAnsweredAsOptionsOfARoute(t *testing.T) {
	open := mustStart(t, Config{}, &fakeRuntime{})
	if got := open.do(http.MethodOptions, "/v1/messages", nil, ""); got.status != 405 || got.errCode() != CodeMethodNotAllowed || got.header.Get("Allow") != "POST" {
		t.Errorf("OPTIONS /v1/messages = %d %q Allow %q, want 405 %q Allow POST", got.status, got.errCode(), got.header.Get("Allow"), CodeMethodNotAllowed)
	}
	got := open.doOptionsAsterisk(nil)
	if got.status != 405 || got.errCode() != CodeMethodNotAllowed || got.header.Get("Allow") != "GET, HEAD, POST" || got.header.Get("Content-Type") != "application/json" {
		t.Errorf("OPTIONS * = %d %q Allow %q Content-Type %q (%s), want 405 %q in JSON with Allow GET, HEAD, POST",
			got.status, got.errCode(), got.header.Get("Allow"), got.header.Get("Content-Type"), got.body, CodeMethodNotAllowed)
	}
	if got := open.doOptionsAsterisk(map[string]string{"Host": "rebound.example"}); got.status != 403 || got.errCode() != CodeForeignHost {
		t.Errorf("OPTIONS * to a foreign Host = %d %q, want 403 %q", got.status, got.errCode(), CodeForeignHost)
	}

	locked := mustStart(t, Config{Token: "s3cret"}, &fakeRuntime{})
	if got := locked.doOptionsAsterisk(nil); got.status != 401 || got.errCode() != CodeUnauthorized {
		t.Errorf("OPTIONS * without the token = %d %q, want 401 %q", got.status, got.errCode(), CodeUnauthorized)
	}
	if got := locked.doOptionsAsterisk(map[string]string{"Authorization": "Bearer s3cret"}); got.status != 405 || got.errCode() != CodeMethodNotAllowed {
		t.Errorf("OPTIONS * with the token = %d %q, want 405 %q", got.status, got.errCode(), CodeMethodNotAllowed)
	}
}

// TestAsteriskOfAnotherMethodIsInvalidTarget: the request target * asks about the server as a
// whole, which only OPTIONS does (RFC 9112, section 3.2.4): GET *, HEAD *, POST * and the like
// are answered 400 invalid_target in JSON, after the checks every request passes (the bearer
// token, the loopback Host of a daemon without one, a browser's cross-site request), as OPTIONS *
// is answered 405 after them. Before, they were answered 404 "the path is not in canonical
// form, which is /*", a route no client meant.
func TestAsteriskOfAnotherMethodIsInvalidTarget(t *testing.T) {
	open := mustStart(t, Config{}, &fakeRuntime{})
	for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodDelete, http.MethodHead} {
		body := ""
		if method == http.MethodPost {
			body = `{"chat_id":"c","user_id":"u","text":"hi"}`
		}
		got := open.doAsterisk(method, map[string]string{"Content-Type": "application/json"}, body)
		if got.status != http.StatusBadRequest || got.header.Get("Content-Type") != "application/json" {
			t.Errorf("%s * = %d Content-Type %q (%s), want 400 in JSON", method, got.status, got.header.Get("Content-Type"), got.body)
		}
		if method == http.MethodHead {
			continue // no body
		}
		if code := got.errCode(); code != CodeInvalidTarget || !strings.Contains(string(got.body), "only OPTIONS") {
			t.Errorf("%s * = %d %s, want %q saying that * is only for OPTIONS", method, got.status, got.body, CodeInvalidTarget)
		}
	}
	if got := open.doAsterisk(http.MethodGet, map[string]string{"Host": "rebound.example"}, ""); got.status != 403 || got.errCode() != CodeForeignHost {
		t.Errorf("GET * to a foreign Host = %d %q, want 403 %q", got.status, got.errCode(), CodeForeignHost)
	}
	if got := open.doAsterisk(http.MethodPost, map[string]string{"Sec-Fetch-Site": "cross-site"}, ""); got.status != 403 || got.errCode() != CodeCrossOrigin {
		t.Errorf("a browser's cross-site POST * = %d %q, want 403 %q", got.status, got.errCode(), CodeCrossOrigin)
	}

	locked := mustStart(t, Config{Token: "s3cret"}, &fakeRuntime{})
	if got := locked.doAsterisk(http.MethodGet, nil, ""); got.status != 401 || got.errCode() != CodeUnauthorized {
		t.Errorf("GET * without the token = %d %q, want 401 %q", got.status, got.errCode(), CodeUnauthorized)
	}
	if got := locked.doAsterisk(http.MethodGet, map[string]string{"Authorization": "Bearer s3cret"}, ""); got.status != 400 || got.errCode() != CodeInvalidTarget {
		t.Errorf("GET * with the token = %d %q, want 400 %q", got.status, got.errCode(), CodeInvalidTarget)
	}
}

// connectAsterisk sends CONNECT * (curl --request-target '*' -X CONNECT) with header lines, on a
// raw connection: Go's client sends CONNECT only to an authority.
func (h *harness) connectAsterisk(headers string) response {
	h.t.Helper()
	resp, err := rawRequest(h.t, h, "CONNECT * HTTP/1.1\r\nHost: 127.0.0.1\r\n"+headers, "")
	if err != nil {
		h.t.Fatalf("CONNECT * error = %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("CONNECT *: read body: %v", err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b, close: resp.Close}
}

// TestConnectAsteriskIsInvalidTarget: CONNECT * is answered as GET * and the others are, 400
// invalid_target after the token check, with no advice to send CONNECT to a route (no route
// takes it). Before, a daemon without a token answered it 403 foreign_host, "not to \"*\"": Go
// reads a CONNECT's target as the request's host, and the Host header the client sent is gone,
// so the check took * for a host name. A CONNECT to another host (a proxy's request) is still
// refused as foreign.
func TestConnectAsteriskIsInvalidTarget(t *testing.T) {
	open := mustStart(t, Config{}, &fakeRuntime{})
	got := open.connectAsterisk("")
	if got.status != http.StatusBadRequest || got.errCode() != CodeInvalidTarget || !strings.Contains(string(got.body), "only OPTIONS") ||
		strings.Contains(string(got.body), "route's path") {
		t.Errorf("CONNECT * = %d %s, want 400 %q saying that * is only for OPTIONS, and no route takes CONNECT", got.status, got.body, CodeInvalidTarget)
	}
	resp, err := rawRequest(t, open, "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n", "")
	if err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("CONNECT example.com:443 = %v, %v; want 403 %s", resp, err, CodeForeignHost)
	}

	locked := mustStart(t, Config{Token: "s3cret"}, &fakeRuntime{})
	if got := locked.connectAsterisk(""); got.status != 401 || got.errCode() != CodeUnauthorized {
		t.Errorf("CONNECT * without the token = %d %q, want 401 %q", got.status, got.errCode(), CodeUnauthorized)
	}
	if got := locked.connectAsterisk("Authorization: Bearer s3cret\r\n"); got.status != 400 || got.errCode() != CodeInvalidTarget ||
		strings.Contains(string(got.body), "route's path") {
		t.Errorf("CONNECT * with the token = %d %s, want 400 %q", got.status, got.body, CodeInvalidTarget)
	}
}
