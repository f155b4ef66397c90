package http

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// TestMaxConnections: connections past Config.MaxConnections wait in the kernel's backlog, not
// in a goroutine with a file descriptor of their own: a request on one is answered only once
// another connection closes, and the platform goes on serving. Before, every socket a client
// opened took a goroutine and a descriptor before the token was looked at, and 20,000 of them
// left the daemon none for its database (found by a security walkthrough).
func TestMaxConnections(t *testing.T) {
	const limit = 3
	h := mustStart(t, Config{MaxConnections: limit}, &fakeRuntime{})
	addr := h.base[len("http://"):]

	// Up to the cap, each connection is served and then kept idle (keep-alive).
	idle := make([]net.Conn, limit)
	for i := range idle {
		idle[i] = mustDial(t, addr)
		if got := mustGet(t, idle[i], bufio.NewReader(idle[i])); got != http.StatusOK {
			t.Fatalf("GET /healthz on connection %d = %d, want 200", i, got)
		}
	}

	// One more: its request waits. The window only bounds a negative observation: served, the
	// answer would come within microseconds.
	extra := mustDial(t, addr)
	writeGet(t, extra)
	rd := bufio.NewReader(extra)
	if err := extra.SetReadDeadline(time.Now().Add(250 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := rd.Peek(1); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a request on connection %d of a cap of %d: read error %v, want it not answered (deadline exceeded)", limit+1, limit, err)
	}

	// Once one of them closes, it is answered.
	if err := idle[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := extra.SetReadDeadline(time.Now().Add(testTimeout)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		t.Fatalf("the waiting request, once a connection closed: %v, want its answer", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the waiting request, once a connection closed = %d, want 200", resp.StatusCode)
	}

	// The platform goes on: with another connection closed, a new client is served at once.
	if err := idle[1].Close(); err != nil {
		t.Fatal(err)
	}
	if got := h.do("GET", "/healthz", nil, ""); got.status != http.StatusOK {
		t.Errorf("GET /healthz after the cap was reached = %d, want 200", got.status)
	}
	select {
	case err := <-h.done:
		t.Fatalf("Run() = %v while serving at its connection cap, want it running", err)
	default:
	}
}

// mustDial opens a TCP connection to addr that the test closes at its end.
func mustDial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, testTimeout)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// writeGet writes a keep-alive GET /healthz on c.
func writeGet(t *testing.T, c net.Conn) {
	t.Helper()
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		t.Fatalf("write request: %v", err)
	}
}

// mustGet sends GET /healthz on c and returns the status of its answer, leaving c open.
func mustGet(t *testing.T, c net.Conn, rd *bufio.Reader) int {
	t.Helper()
	writeGet(t, c)
	if err := c.SetReadDeadline(time.Now().Add(testTimeout)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
