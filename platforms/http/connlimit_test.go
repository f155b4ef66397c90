package http

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMaxConnections: connections past Config.MaxConnections wait in the kernel's backlog, not
// in a goroutine with a file descriptor of their own: a request on one is answered only once
// another connection closes, and the platform goes on serving. Before, every socket a client
// opened took a goroutine and a descriptor before the token was looked at, and 20,000 of them
// left the daemon none for its database (found by a security walkthrough). The metrics show the
// limit reached, also to a scrape over a kept-alive connection at the limit; before, nothing
// did. The wait is seen in the listen backlog (Linux's /proc/net/tcp), not assumed from an
// answer that did not come within a while.
func TestMaxConnections(t *testing.T) {
	const limit = 3
	m := metrics.New(Name)
	h := mustStart(t, Config{MaxConnections: limit, Metrics: m.Handler(), ConnectionsOpen: m.HTTPConnectionsOpen,
		ConnectionsLimit: m.HTTPConnectionsLimit, ConnectionsLimitReached: m.HTTPConnectionsLimitReached}, &fakeRuntime{})
	addr := h.base[len("http://"):]
	port := mustPort(t, addr)
	if n := listenBacklog(t, port); n != 0 {
		t.Fatalf("listen backlog before any connection = %d, want 0", n)
	}

	// Up to the cap, each connection is served and then kept idle (keep-alive).
	idle := make([]net.Conn, limit)
	readers := make([]*bufio.Reader, limit)
	for i := range idle {
		idle[i] = mustDial(t, addr)
		readers[i] = bufio.NewReader(idle[i])
		if got, _ := mustGet(t, idle[i], readers[i], "/healthz"); got != http.StatusOK {
			t.Fatalf("GET /healthz on connection %d = %d, want 200", i, got)
		}
	}
	// A scrape over one of them is served at the cap, and shows it reached.
	scrape := func() map[string]string {
		t.Helper()
		return mustScrape(t, idle[limit-1], readers[limit-1])
	}
	want := map[string]string{"agentgate_http_connections_open": "3", "agentgate_http_connections_limit": "3",
		"agentgate_http_connections_limit_reached_total": "1"}
	mustHaveMetrics(t, "at the cap", scrape(), want)

	// One more: the kernel holds it in the listen backlog, and the daemon does not take it.
	extra := mustDial(t, addr)
	writeGet(t, extra, "/healthz")
	if err := extra.SetReadDeadline(time.Now().Add(testTimeout)); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		status int
		err    error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(extra), nil)
		if err != nil {
			answered <- answer{err: err}
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answered <- answer{status: resp.StatusCode}
	}()
	notAnswered := func(when string) {
		t.Helper()
		select {
		case a := <-answered:
			t.Fatalf("a request on connection %d of a cap of %d %s: answered %d (%v), want it waiting", limit+1, limit, when, a.status, a.err)
		default:
		}
	}
	waitFor(t, "the connection past the cap in the listen backlog", func() bool {
		notAnswered("before it was in the listen backlog")
		return listenBacklog(t, port) == 1
	})
	// It stays there while the daemon serves the others: after a scrape's round trip, which
	// would see it counted had it been accepted meanwhile.
	mustHaveMetrics(t, "with a connection waiting", scrape(), want)
	notAnswered("while the cap was reached")
	if n := listenBacklog(t, port); n != 1 {
		t.Errorf("listen backlog while the cap is reached = %d, want 1", n)
	}

	// Once one of them closes, it is answered, taking the place freed: the cap is reached again.
	if err := idle[0].Close(); err != nil {
		t.Fatal(err)
	}
	if a := <-answered; a.err != nil || a.status != http.StatusOK {
		t.Fatalf("the waiting request, once a connection closed = %d (%v), want 200", a.status, a.err)
	}
	want["agentgate_http_connections_limit_reached_total"] = "2"
	mustHaveMetrics(t, "once the waiting connection took the place freed", scrape(), want)

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

// writeGet writes a keep-alive GET of path on c.
func writeGet(t *testing.T, c net.Conn, path string) {
	t.Helper()
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		t.Fatalf("write request: %v", err)
	}
}

// mustGet sends GET path on c and returns the status and body of its answer, leaving c open.
func mustGet(t *testing.T, c net.Conn, rd *bufio.Reader, path string) (int, string) {
	t.Helper()
	writeGet(t, c, path)
	if err := c.SetReadDeadline(time.Now().Add(testTimeout)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read answer's body: %v", err)
	}
	return resp.StatusCode, string(body)
}

// mustScrape scrapes GET /metrics over c and returns each sample's value by its name and labels,
// as the exposition writes them.
func mustScrape(t *testing.T, c net.Conn, rd *bufio.Reader) map[string]string {
	t.Helper()
	status, body := mustGet(t, c, rd, "/metrics")
	if status != http.StatusOK {
		t.Fatalf("GET /metrics = %d %s, want 200", status, body)
	}
	samples := map[string]string{}
	for _, line := range strings.Split(body, "\n") {
		if name, value, ok := strings.Cut(line, " "); ok && !strings.HasPrefix(line, "#") {
			samples[name] = value
		}
	}
	return samples
}

// mustHaveMetrics checks that the samples of a scrape include want.
func mustHaveMetrics(t *testing.T, when string, got, want map[string]string) {
	t.Helper()
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s: %s = %q, want %q", when, name, got[name], v)
		}
	}
}

// mustPort returns the port of addr (host:port).
func mustPort(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// listenBacklog returns how many connections wait in the listen backlog of the IPv4 listener on
// port: taken by the kernel, not yet accepted by the daemon. Linux's /proc/net/tcp gives a
// listening socket's (state 0A) accept queue as its rx_queue. It skips the test where the file
// is missing (another system).
func listenBacklog(t *testing.T, port int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Skipf("the listen backlog cannot be seen here: %v", err)
	}
	local := fmt.Sprintf(":%04X", port)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line) // sl local_address rem_address st tx_queue:rx_queue …
		if len(f) < 5 || !strings.HasSuffix(f[1], local) || f[3] != "0A" {
			continue
		}
		_, rx, _ := strings.Cut(f[4], ":")
		n, err := strconv.ParseInt(rx, 16, 64)
		if err != nil {
			t.Fatalf("/proc/net/tcp: %q: %v", line, err)
		}
		return int(n)
	}
	t.Fatalf("/proc/net/tcp lists no listener on port %d", port)
	return 0
}

// TestStartingMaxConnections: the start's server (ServeStarting) keeps to Config.MaxConnections
// as Run's does: a connection past the limit waits in the listen backlog until another closes,
// then is answered, and the metrics count the start's connections. Before, the start's server
// took every connection a client opened (a start that replays a long spool serves for minutes),
// each with a goroutine and a descriptor, and the metrics counted none of them.
func TestStartingMaxConnections(t *testing.T) {
	m := metrics.New(Name)
	h := mustNew(t, Config{MaxConnections: 1, Metrics: m.Handler(), ConnectionsOpen: m.HTTPConnectionsOpen,
		ConnectionsLimit: m.HTTPConnectionsLimit, ConnectionsLimitReached: m.HTTPConnectionsLimitReached})
	addr, err := h.p.Listen()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.p.ServeStarting(startingStatus); err != nil {
		t.Fatal(err)
	}
	defer h.p.Close()
	port := mustPort(t, addr.String())
	// The one place: a connection that sends nothing yet, taken once the server counts it.
	held := mustDial(t, addr.String())
	waitFor(t, "the first connection counted open", func() bool { return testutil.ToFloat64(m.HTTPConnectionsOpen) == 1 })
	extra := mustDial(t, addr.String())
	writeGet(t, extra, "/healthz")
	if err := extra.SetReadDeadline(time.Now().Add(testTimeout)); err != nil {
		t.Fatal(err)
	}
	answered := make(chan int, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(extra), nil)
		if err != nil {
			answered <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	waitFor(t, "the connection past the limit in the listen backlog", func() bool {
		select {
		case status := <-answered:
			t.Fatalf("a request past the start's limit of 1 was answered (%d) while the first connection was open", status)
		default:
		}
		return listenBacklog(t, port) == 1
	})
	if err := held.Close(); err != nil {
		t.Fatal(err)
	}
	if status := <-answered; status != http.StatusOK {
		t.Fatalf("the waiting request, once the first connection closed = %d, want 200", status)
	}
	if got := testutil.ToFloat64(m.HTTPConnectionsLimitReached); got != 2 {
		t.Errorf("connections that took the last place during the start = %v, want 2", got)
	}
	// The hand-over ends the start's server also while it waits for a place.
	held = mustDial(t, addr.String())
	waitFor(t, "a connection counted open again", func() bool { return testutil.ToFloat64(m.HTTPConnectionsOpen) == 1 })
	h.p.EndStarting()
	_ = held.Close()
}

// TestHandOverServesTheConnectionWaitingForAPlace: a connection that waits in the listen
// backlog for a place under the start's limit when Run takes the listener over is served by
// Run's server, not answered "starting", nor reset by the start's limit as it closes (its
// Close, once the listener is handed over, takes no connection of it).
func TestHandOverServesTheConnectionWaitingForAPlace(t *testing.T) {
	m := metrics.New(Name)
	h := mustNew(t, Config{MaxConnections: 1, ConnectionsOpen: m.HTTPConnectionsOpen})
	addr, err := h.p.Listen()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.p.ServeStarting(startingStatus); err != nil {
		t.Fatal(err)
	}
	port := mustPort(t, addr.String())
	held := mustDial(t, addr.String())
	waitFor(t, "the first connection counted open", func() bool { return testutil.ToFloat64(m.HTTPConnectionsOpen) == 1 })
	waiting := mustDial(t, addr.String())
	writeGet(t, waiting, "/v1/nothing-here")
	waitFor(t, "the second connection in the listen backlog", func() bool { return listenBacklog(t, port) == 1 })
	rt := &fakeRuntime{p: h.p}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.p.Run(ctx, rt.deliver) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
	}()
	if err := waiting.SetReadDeadline(time.Now().Add(testTimeout)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(waiting), nil)
	if err != nil {
		t.Fatalf("the connection that waited for a place at the hand-over got no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || strings.Contains(string(body), CodeStarting) {
		t.Fatalf("the connection that waited for a place at the hand-over = %d %s, want Run's 404", resp.StatusCode, body)
	}
	_ = held.Close()
}
