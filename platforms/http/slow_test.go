package http

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/platforms"
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
			resp, err := rawRequest(t, h, "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n", "{")
			switch {
			case tc.want == 0 && err == nil && resp.StatusCode < 400:
				t.Errorf("a stalled body got %s", resp.Status)
			case tc.want != 0 && (err != nil || resp.StatusCode != tc.want):
				t.Errorf("a stalled body without a token: %v %v, want %d", resp, err, tc.want)
			}
			// The connection's own deadline (rawRequest's, testTimeout) ends the wait of a
			// server that held the request: the body timeout is real time on a real socket,
			// and 200 ms against 10 s leaves a loaded machine fifty times its due.
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("a stalled body was held until the client gave up (%v): %v, want the server to cut it off", testTimeout, err)
			}
		})
	}
}

// TestUnreadAnswerIsCutOff: a client that asks for a large answer and never reads it does not
// hold its handler: Config.WriteTimeout after the answer starts the server gives up on it,
// says so in its log (naming the route and the session), and closes the connection. Both a
// JSON answer and an event stream.
func TestUnreadAnswerIsCutOff(t *testing.T) {
	const size = 8 << 20 // well past what the socket buffers of both ends hold
	for _, tc := range []struct {
		name, path string
		setup      func(*fakeSessions)
	}{
		{"transcript", "/v1/sessions/" + streamKey + "/transcript", func(s *fakeSessions) {
			s.bigText = strings.Repeat("x", size/2)
		}},
		{"event stream", "/v1/sessions/" + streamKey + "/events", func(s *fakeSessions) {
			for seq := range int64(8) {
				s.addOutbox(&platforms.Outbound{SessionKey: streamKey, Seq: seq + 1, Text: strings.Repeat("x", size/8)})
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sessions := newFakeSessions()
			sessions.infos[streamKey] = &SessionInfo{SessionKey: streamKey, SessionID: "s1"}
			tc.setup(sessions)
			logs, conn := getNeverRead(t, sessions, tc.path)
			waitFor(t, "the answer cut off in the log", func() bool {
				return strings.Contains(logs.String(), "answer cut off")
			})
			if !strings.Contains(logs.String(), "route=\"GET "+strings.SplitN(tc.path, streamKey, 2)[0]) {
				t.Errorf("the log names no route: %s", logs)
			}
			if !strings.Contains(logs.String(), "session="+streamKey) {
				t.Errorf("the log names no session: %s", logs)
			}
			// The connection ends: what the server had sent is there to read and then EOF, or
			// (the server's close found it unread) a reset.
			if err := conn.SetReadDeadline(time.Now().Add(testTimeout)); err != nil {
				t.Fatal(err)
			}
			n, err := io.Copy(io.Discard, conn)
			if err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("reading after the cut: %v, want the connection closed", err)
			}
			if n >= size {
				t.Errorf("read %d bytes, the whole answer: it was not cut off", n)
			}
		})
	}
}

// TestUnreadAnswersAreLoggedOnce: clients that never read their answers are each cut off, but
// the line says so once, not once a client (later ones at most once a minute, with "repeats"):
// a soak's 60 clients that asked for a long transcript and read nothing logged 60 warnings,
// and a client opening such requests in a loop would fill the log with them, as the lines of
// refused tokens and held requests, which are limited so, would.
func TestUnreadAnswersAreLoggedOnce(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		setup      func(*fakeSessions)
	}{
		{"transcript", "/v1/sessions/" + streamKey + "/transcript", func(s *fakeSessions) {
			s.bigText = strings.Repeat("x", 4<<20)
		}},
		{"event stream", "/v1/sessions/" + streamKey + "/events", func(s *fakeSessions) {
			for seq := range int64(8) {
				s.addOutbox(&platforms.Outbound{SessionKey: streamKey, Seq: seq + 1, Text: strings.Repeat("x", 1<<20)})
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sessions := newFakeSessions()
			sessions.infos[streamKey] = &SessionInfo{SessionKey: streamKey, SessionID: "s1"}
			tc.setup(sessions)
			logs := &testutil.Buffer{}
			requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "requests_total"}, []string{"route", "code"})
			h := mustStart(t, Config{Sessions: sessions, WriteTimeout: 200 * time.Millisecond, Requests: requests,
				Logger: slog.New(slog.NewTextHandler(logs, nil))}, &fakeRuntime{})
			for range 3 {
				h.dialNeverRead(tc.path)
			}
			// Each is cut off: its handler returns, and its answer is counted.
			waitFor(t, "the three answers ended", func() bool {
				return promtest.ToFloat64(requests.WithLabelValues("GET /v1/sessions/{key}/"+path.Base(tc.path), "200")) == 3
			})
			if n := strings.Count(logs.String(), "answer cut off"); n != 1 {
				t.Errorf("%d lines \"answer cut off\" for 3 clients, want 1:\n%s", n, logs)
			}
		})
	}
}

// TestStreamEndsAreLoggedOnce: event streams dropped for falling behind, or whose outbox read
// failed, are each closed, but each line says so once, not once a stream (later ones at most
// once a minute, with "repeats"), as "answer cut off" does: clients that never read their
// streams, or a database outage under many streams, logged a warning a stream.
func TestStreamEndsAreLoggedOnce(t *testing.T) {
	const streams = 3
	t.Run("too slow", func(t *testing.T) {
		logs := &testutil.Buffer{}
		h := mustNew(t, Config{Logger: slog.New(slog.NewTextHandler(logs, nil))})
		h.p.subBuffer = 1
		var subs []*subscriber
		for range streams {
			subs = append(subs, h.p.subscribe(streamKey))
		}
		for seq := range int64(2) { // the second overflows every buffer
			if err := h.p.Send(context.Background(), &platforms.Outbound{SessionKey: streamKey, Seq: seq + 1}); err != nil {
				t.Fatalf("Send(%d) = %v", seq+1, err)
			}
		}
		for i, s := range subs {
			select {
			case <-s.gone:
			default:
				t.Errorf("subscriber %d not dropped after overflowing its buffer", i)
			}
		}
		if n := strings.Count(logs.String(), "sse subscriber dropped, too slow"); n != 1 {
			t.Errorf("%d lines \"sse subscriber dropped, too slow\" for %d streams, want 1:\n%s", n, streams, logs)
		}
	})
	t.Run("replay failed", func(t *testing.T) {
		sessions := newFakeSessions()
		sessions.addOutbox(outbound(streamKey, 1, platforms.KindReply))
		sessions.outboxFailFrom = 1 // the page after the first
		logs := &testutil.Buffer{}
		h := mustStart(t, Config{Sessions: sessions, Logger: slog.New(slog.NewTextHandler(logs, nil))}, &fakeRuntime{})
		for i := range streams {
			s := h.openSSE(streamKey, "", "")
			if ev := s.mustNextEvent(); ev.id != 1 {
				t.Fatalf("stream %d: event %d, want 1", i, ev.id)
			}
			// The stream ends once its replay fails, after it logged it.
			for {
				if _, err := s.next(); err != nil {
					break
				}
			}
			s.close()
		}
		if n := strings.Count(logs.String(), "sse replay failed"); n != 1 {
			t.Errorf("%d lines \"sse replay failed\" for %d streams, want 1:\n%s", n, streams, logs)
		}
	})
}

// TestOversizedBodyRefusedBeforeContinue: a body announced larger than MaxBodyBytes is refused
// with 413 before the client sends it (no "100 Continue").
func TestOversizedBodyRefusedBeforeContinue(t *testing.T) {
	h := mustStart(t, Config{}, &fakeRuntime{})
	resp, err := rawRequest(t, h, fmt.Sprintf("POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n", 99_999_999), "")
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

// getNeverRead starts the platform on sessions with a write timeout of 200 ms, and sends it a
// GET of path from a client that never reads the answer (a small read buffer, so that the
// answer fills it soon). It returns the platform's log and the client's connection.
func getNeverRead(t *testing.T, sessions Sessions, path string) (*testutil.Buffer, net.Conn) {
	t.Helper()
	logs := &testutil.Buffer{}
	h := mustStart(t, Config{Sessions: sessions, WriteTimeout: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))}, &fakeRuntime{})
	return logs, h.dialNeverRead(path)
}

// dialNeverRead sends a GET of path on a connection with a small receive buffer, which the
// test then never reads.
func (h *harness) dialNeverRead(path string) net.Conn {
	t := h.t
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.(*net.TCPConn).SetReadBuffer(128 << 10); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path); err != nil {
		t.Fatal(err)
	}
	return conn
}
