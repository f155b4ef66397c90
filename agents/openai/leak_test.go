package openai_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
	"github.com/agentgate/agentgate/internal/testutil"
)

// TestManyCutTurnsLeaveNothingBehind ends many turns midway, as interrupts, timeouts and a
// model that breaks off do, against a fake model on loopback, and checks that the process is
// left with what it had: each cut request's connection, its goroutines (the client's and the
// fake server's) and the turn's own goroutines end. A daemon that runs for months interrupts
// thousands of streams.
func TestManyCutTurnsLeaveNothingBehind(t *testing.T) {
	const turns = 200
	for _, tc := range []struct {
		name string
		// answer is the model's; cut ends the turn from outside once the model has streamed
		// (it is nil when the turn ends by itself).
		answer  http.HandlerFunc
		cut     func(cancel context.CancelFunc)
		timeout time.Duration
		stream  bool
		steer   bool
	}{
		{name: "interrupted mid-stream", stream: true, answer: streamUntilCancelled, cut: func(c context.CancelFunc) { c() }},
		{name: "interrupted mid-stream while steering", stream: true, steer: true, answer: streamUntilCancelled,
			cut: func(c context.CancelFunc) { c() }},
		{name: "interrupted before the reply", answer: func(w http.ResponseWriter, r *http.Request) {
			w.(http.Flusher).Flush() // headers go out; the body never comes
			<-r.Context().Done()
		}, cut: func(c context.CancelFunc) { c() }},
		{name: "times out mid-stream", stream: true, answer: streamUntilCancelled, timeout: 20 * time.Millisecond},
		{name: "stream broken off by the model", stream: true, answer: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"half\"}}]}\n\n")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the connection breaks without [DONE]
		}},
		{name: "answers", answer: openaitest.Reply("whole", 3, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := openaitest.New(t, func(_ int, w http.ResponseWriter, r *http.Request) { tc.answer(w, r) })
			// The client keeps a few idle connections for the next turns: they are closed
			// before each count, so that only what a turn left counts.
			client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
			a := MustAgent(t, m, nil, nil, func(c *openai.Config) {
				c.HTTPClient = client
				c.MaxRetries = 0
				if tc.timeout > 0 {
					c.Timeout = tc.timeout
				}
			})
			run := func(n int) {
				var wg sync.WaitGroup
				for range n {
					wg.Go(func() { runCut(t, a, tc.stream, tc.steer, tc.cut) })
				}
				wg.Wait()
			}
			run(8)
			client.CloseIdleConnections()
			base := testutil.TakeResources()
			for range turns / 8 {
				run(8)
			}
			client.CloseIdleConnections()
			testutil.MustSettle(t, tc.name, base, testutil.Slack{Goroutines: 2, FDs: 2}, 10*time.Second)
		})
	}
}

// streamUntilCancelled streams one delta, then waits for the request to end.
func streamUntilCancelled(w http.ResponseWriter, r *http.Request) {
	openaitest.WriteStream(w, r, r.Context().Done(), 1, 1, "first", "never")
}

// runCut runs one turn; when cut is set, it calls it with the turn's cancel once the first
// partial text arrived (or, without streaming, once the model has the request).
func runCut(t *testing.T, a *openai.Agent, stream, steer bool, cut func(context.CancelFunc)) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req := &agents.Request{Messages: []agents.Message{{Role: "user", Text: "hi"}}}
	first := make(chan struct{})
	var once sync.Once
	if stream {
		req.Partial = func(string) { once.Do(func() { close(first) }) }
	}
	if steer {
		req.Steer = make(chan agents.Message) // open for the whole turn, as a Turn's is
	}
	done := make(chan error, 1)
	go func() {
		_, err := a.Run(ctx, req)
		done <- err
	}()
	if cut != nil {
		if stream {
			select {
			case <-first:
			case err := <-done:
				t.Errorf("Run() = %v before its first partial text", err)
				return
			}
		} else {
			time.Sleep(5 * time.Millisecond) // a moment for the request to reach the model
		}
		cut(cancel)
	}
	if err := <-done; cut != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Run() after a cut = %v, want context.Canceled", err)
	}
}

// TestStreamedTurnsShareAConnection: turns whose replies stream one after another use one
// connection to the endpoint. A server sends the end of a chunked body when its handler
// returns, after the "data: [DONE]" it flushed; the agent stopped reading at [DONE] and
// closed the body, and net/http closes the connection of a body closed before its end. A soak
// saw about 4 streamed turns in 10 open a connection of their own (over TLS, a handshake
// each). Here the server holds the body's end until the client has read [DONE], as a server
// whose end comes in a later packet does.
func TestStreamedTurnsShareAConnection(t *testing.T) {
	sawDone := make(chan struct{}, 1) // the client read [DONE]; one per turn
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		openaitest.WriteStream(w, r, nil, 2, 1, "hello")
		w.(http.Flusher).Flush()
		select { // the body's end goes out once the client has read up to [DONE]
		case <-sawDone:
		case <-r.Context().Done():
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &doneConn{Conn: c, saw: sawDone}, nil
	}
	client := &http.Client{Transport: tr}
	t.Cleanup(client.CloseIdleConnections)
	a, err := openai.New(openai.Config{BaseURL: srv.URL + "/v1", Model: "gpt-test", MaxRetries: 0, HTTPClient: client})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	for i := range 3 {
		res, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{{Role: "user", Text: "hi"}},
			Partial: func(string) {}})
		if err != nil || res.Text != "hello" {
			t.Fatalf("turn %d: Run() = %+v, %v; want hello", i+1, res, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("3 streamed turns opened %d connections to the endpoint, want 1", n)
	}
}

// doneConn is a client's connection that tells saw when what it read holds "data: [DONE]".
type doneConn struct {
	net.Conn
	saw  chan<- struct{}
	tail []byte // the end of what was read, for a marker split between two reads
}

func (c *doneConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.tail = append(c.tail, p[:n]...)
	if i := bytes.Index(c.tail, []byte("data: [DONE]")); i >= 0 {
		c.tail = c.tail[i+len("data: [DONE]"):]
		select {
		case c.saw <- struct{}{}:
		default:
		}
	}
	if len(c.tail) > 64 {
		c.tail = c.tail[len(c.tail)-64:]
	}
	return n, err
}

// TestStreamThatStaysOpenAfterDone: a server that keeps the body open after "data: [DONE]"
// does not hold the turn: its reply is returned (the wait for the body's end is bounded).
func TestStreamThatStaysOpenAfterDone(t *testing.T) {
	m := openaitest.New(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		openaitest.WriteStream(w, r, nil, 2, 1, "hello")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	a := MustAgent(t, m, nil, nil, nil)
	res, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{{Role: "user", Text: "hi"}}})
	if err != nil || res.Text != "hello" {
		t.Fatalf("Run() = %+v, %v; want hello", res, err)
	}
}

// TestConcurrentTurnsReuseTheirConnections: turns that call the endpoint at once, as a busy
// daemon's do (agent.max_concurrent, 32 by default), find the connections of the turns before
// them open. The agent's own client kept net/http's default of 2 idle connections a host: of 8
// calls at once, 6 closed their connections as they ended, and the next 8 opened 6 new ones
// (over TLS, a handshake each, and a socket left in TIME_WAIT).
func TestConcurrentTurnsReuseTheirConnections(t *testing.T) {
	const calls = 8
	arrived := make(chan struct{}, calls)
	all := make(chan struct{}) // closed once a wave's calls have all arrived
	var mu sync.Mutex
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		wave := all
		mu.Unlock()
		arrived <- struct{}{}
		select { // every call of the wave holds its connection until all of them have one
		case <-wave:
		case <-r.Context().Done():
			return
		}
		openaitest.WriteReply(w, "hello", 2, 1)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	a, err := openai.New(openai.Config{BaseURL: srv.URL + "/v1", Model: "gpt-test", APIKeyEnv: ""})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	for wave := range 2 {
		var wg sync.WaitGroup
		errs := make(chan error, calls)
		for range calls {
			wg.Go(func() {
				res, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{{Role: "user", Text: "hi"}}})
				if err == nil && res.Text != "hello" {
					err = errors.New("reply " + res.Text + ", want hello")
				}
				errs <- err
			})
		}
		for range calls {
			<-arrived
		}
		mu.Lock()
		close(all)
		all = make(chan struct{})
		mu.Unlock()
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("wave %d: Run() = %v", wave+1, err)
			}
		}
	}
	if n := conns.Load(); n != calls {
		t.Errorf("2 waves of %d calls at once opened %d connections to the endpoint, want %d", calls, n, calls)
	}
}
