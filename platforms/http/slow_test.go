package http

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// rawRequest writes head and then part of a body on a raw connection, and returns the
// response the server sends, or an error when the connection ends without one.
func rawRequest(t *testing.T, h *harness, head, partialBody string) (*http.Response, error) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.SetDeadline(time.Now().Add(testTimeout)); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(conn, "%s\r\n%s", head, partialBody); err != nil {
		t.Fatal(err)
	}
	return http.ReadResponse(bufio.NewReader(conn), nil)
}

// TestStalledBodyIsCutOff: a client that announces a body and stalls in the middle of it does
// not hold its connection: after Config.BodyTimeout the server gives up on it, whether the
// route reads the body or refuses the request first (a missing token).
func TestStalledBodyIsCutOff(t *testing.T) {
	for _, tc := range []struct {
		name, token string
		want        int // 0: the connection just ends
	}{
		{"body read", "", 0},
		{"refused before the body", "secret", http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := mustStart(t, Config{Token: tc.token, BodyTimeout: 200 * time.Millisecond}, &fakeRuntime{})
			start := time.Now()
			resp, err := rawRequest(t, h, "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n", "{")
			switch {
			case tc.want == 0 && err == nil && resp.StatusCode < 400:
				t.Errorf("a stalled body got %s", resp.Status)
			case tc.want != 0 && (err != nil || resp.StatusCode != tc.want):
				t.Errorf("a stalled body without a token: %v %v, want %d", resp, err, tc.want)
			}
			if took := time.Since(start); took > testTimeout/2 {
				t.Errorf("the server held the stalled request %v", took)
			}
		})
	}
}

// TestOversizedBodyRefusedBeforeContinue: a body announced larger than MaxBodyBytes is refused
// with 413 before the client sends it (no "100 Continue").
func TestOversizedBodyRefusedBeforeContinue(t *testing.T) {
	h := mustStart(t, Config{}, &fakeRuntime{})
	resp, err := rawRequest(t, h, fmt.Sprintf("POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n", 99_999_999), "")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("status %s, want 413 before the body", resp.Status)
	}
}

// TestEscapedTextAtTheLimitIsAccepted: a 64 KiB text written entirely as \u escapes (six bytes
// a character) fits the body limit.
func TestEscapedTextAtTheLimitIsAccepted(t *testing.T) {
	h := mustStart(t, Config{}, &fakeRuntime{})
	body := `{"chat_id":"c","user_id":"u","text":"` + strings.Repeat(`\u0041`, MaxTextBytes) + `"}`
	r := h.do("POST", "/v1/messages", map[string]string{"Content-Type": "application/json"}, body)
	if r.status != http.StatusAccepted {
		t.Errorf("status %d %s, want 202", r.status, r.body)
	}
}

// TestMalformedQueryIsRefused: a query string that does not parse is a 400, not ignored (a
// ?wait lost in it would turn a waiting request into a 202).
func TestMalformedQueryIsRefused(t *testing.T) {
	h := mustStart(t, Config{}, &fakeRuntime{})
	r := h.do("POST", "/v1/messages?wait=%ZZ", map[string]string{"Content-Type": "application/json"}, `{"chat_id":"c","user_id":"u","text":"hi"}`)
	if r.status != http.StatusBadRequest || r.errCode() != CodeInvalidQuery {
		t.Errorf("status %d %s, want 400 %s", r.status, r.body, CodeInvalidQuery)
	}
}
