package http

import (
	"io"
	"net/http"
	"testing"
)

// doOptionsAsterisk sends OPTIONS * (a request for the server as a whole, not a route), with
// header.
func (h *harness) doOptionsAsterisk(header map[string]string) response {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodOptions, h.base, nil)
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
		h.t.Fatalf("OPTIONS * error = %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("OPTIONS *: read body: %v", err)
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
