package http

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/net/netutil"
)

// retryStarting is the Retry-After of an answer during the start: a start that is not over at
// once replays a spool or waits for a lock, for seconds or minutes, which /readyz says.
const retryStarting = 5 * time.Second

// ComponentStart is the component /readyz names while the daemon starts (ServeStarting), with
// what the start waits for.
const ComponentStart = "start"

// startServer is the server of the daemon's start (ServeStarting), until Run takes its
// listener over.
type startServer struct {
	srv *http.Server
	ln  *startListener
	// limit is what srv serves: ln within Config.MaxConnections, counted as Run's server counts
	// its own (countingListener). Before, the start's server took every connection a client
	// opened, past the limit, each with a goroutine and a descriptor (TestStartingMaxConnections).
	limit  net.Listener
	served chan error    // Serve's end
	closed chan struct{} // its connections closed, once EndStarting ended it
	// conns are the connections it accepted and has not closed (ConnState): each is added
	// in Serve's goroutine before Serve returns, and EndStarting waits for them after that.
	conns sync.WaitGroup
}

// startListener is the bound listener as the start's server sees it: Run takes it over by
// closing handed and setting a deadline in the past, which ends the start server's Accept
// without closing the listener.
type startListener struct {
	net.Listener
	handed chan struct{}
}

// Accept is the listener's, except that once Run took it over its error ends the start's
// server (net.ErrClosed: the deadline's timeout would have it try again).
func (l *startListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		select {
		case <-l.handed:
			return nil, net.ErrClosed
		default:
		}
	}
	return c, err
}

// Close closes the listener unless Run has taken it over.
func (l *startListener) Close() error {
	select {
	case <-l.handed:
		return nil
	default:
		return l.Listener.Close()
	}
}

// deadliner is a listener whose Accept a deadline can end (net.TCPListener, net.UnixListener).
type deadliner interface {
	SetDeadline(t time.Time) error
}

// ServeStarting serves the listener Listen bound while the daemon starts, until EndStarting
// (or Run, or Close) ends it: GET /healthz answers 200, the process being up and its start going
// on; GET /readyz 503, its component "start" saying what the start waits for (status, which
// is called at each probe); GET /metrics as ever; every other request 503 starting, with
// Retry-After. The token and the other checks every request passes apply as they do later.
// Before, the bound listener took connections and answered none until Run: a start that
// replays a long spool (minutes) answered no liveness probe, and an orchestrator killed a
// daemon that was making progress, to start it again on the same replay.
func (p *Platform) ServeStarting(status func() string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.ln == nil:
		return errors.New("serve http during the start: not listening")
	case p.starting != nil || p.running:
		return errors.New("serve http during the start: already serving")
	}
	if _, ok := p.ln.(deadliner); !ok {
		return errors.New("serve http during the start: the listener cannot be handed over")
	}
	s := &startServer{ln: &startListener{Listener: p.ln, handed: make(chan struct{})}, served: make(chan error, 1), closed: make(chan struct{})}
	s.limit = netutil.LimitListener(countingListener{Listener: s.ln, p: p}, p.cfg.MaxConnections)
	s.srv = &http.Server{
		Handler:                      p.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.routeStarting(w, r, status) })),
		ReadHeaderTimeout:            readHeaderTimeout,
		IdleTimeout:                  idleTimeout,
		MaxHeaderBytes:               64 << 10,
		DisableGeneralOptionsHandler: true,
		ErrorLog:                     p.serverLog(),
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				s.conns.Add(1)
			case http.StateClosed, http.StateHijacked:
				s.conns.Done()
			}
		},
	}
	// Each answer closes its connection (Connection: close): the hand-over (EndStarting)
	// closes the start server's idle connections, and a keep-alive client that sent its next
	// request on one in that instant lost it (EOF, a reset), a POST too, which Go's client does
	// not send again (TestHandOverAnswersEveryRequest). A new connection an answer is cheap at
	// the pace of probes and of clients that wait out Retry-After.
	s.srv.SetKeepAlivesEnabled(false)
	p.starting = s
	go func() { // ends when Run takes the listener over, or Close closes it
		s.served <- s.srv.Serve(s.limit)
	}()
	return nil
}

// routeStarting answers a request during the start (ServeStarting).
func (p *Platform) routeStarting(w http.ResponseWriter, r *http.Request, status func() string) {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		switch r.URL.Path {
		case "/healthz":
			p.handleHealthz(w, r)
			return
		case "/readyz":
			// What the start waits for names nothing an outsider should not read (no path,
			// no database): it is told without the token too.
			writeJSON(w, http.StatusServiceUnavailable, ReadyResponse{Status: "not_ready", Starting: true,
				Components: map[string]string{ComponentStart: status()}})
			return
		case "/metrics":
			p.handleMetrics(w, r)
			return
		}
	}
	setRetryAfter(w, retryStarting)
	writeError(w, http.StatusServiceUnavailable, CodeStarting,
		"agentgate is starting ("+status()+"); send the request again once it serves: GET /readyz says ready")
}

// EndStarting ends the start's server (ServeStarting), if one serves, without closing the
// listener: the connections that come from then on wait in the listen backlog for Run, as they
// did before the start served at all. The daemon calls it once its start is over, before the
// platform runs: an answer after the start's end comes from Run's server, never "starting". Its
// connections close once idle; Run (or Close) waits for that. Run calls it too.
func (p *Platform) EndStarting() {
	p.mu.Lock()
	s := p.starting
	p.starting = nil
	p.mu.Unlock()
	if s == nil {
		return
	}
	close(s.ln.handed)
	dl := s.ln.Listener.(deadliner) // ServeStarting checked
	_ = dl.SetDeadline(time.Unix(1, 0))
	// An Accept that waits for a place under the limit is no Accept of the listener's, which
	// the deadline ends: the limit's Close ends it (and, once handed, closes no listener).
	_ = s.limit.Close()
	<-s.served
	_ = dl.SetDeadline(time.Time{})
	go func() { // ends within shutdownTimeout; Run or Close waits for it
		defer close(s.closed)
		endConns(s)
	}()
	p.mu.Lock()
	p.startClosed = s.closed
	p.mu.Unlock()
}

// waitStartClosed waits for the start server's connections to close (EndStarting).
func (p *Platform) waitStartClosed() {
	p.mu.Lock()
	closed := p.startClosed
	p.mu.Unlock()
	if closed != nil {
		<-closed
	}
}

// Close ends what Listen and ServeStarting began when Run never took them over (a start that
// failed, or was stopped): the start's server and the listener. It does nothing once Run has
// the listener.
func (p *Platform) Close() {
	p.mu.Lock()
	s, ln := p.starting, p.ln
	p.starting, p.ln = nil, nil
	p.mu.Unlock()
	if s != nil {
		shutdownStart(s.srv) // closes the listener too
		<-s.served
	}
	if ln != nil {
		_ = ln.Close()
	}
	p.waitStartClosed()
}

// endConns waits for the connections the start's server accepted before EndStarting ended its
// Serve: each carries one request, which it answers (keep-alives are off), and closes. Not
// Shutdown: Go's server drops a request it reads once Shutdown has begun, closing the
// connection without an answer, and a client that connected an instant before the hand-over
// lost its request (EOF) (TestHandOverAnswersEveryRequest). A connection still open after
// shutdownTimeout (a client that sends nothing) is closed, as Shutdown's deadline did.
func endConns(s *startServer) {
	done := make(chan struct{})
	go func() { // ends once the connections have closed; Close below closes the last ones
		s.conns.Wait()
		close(done)
	}()
	t := time.NewTimer(shutdownTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		_ = s.srv.Close()
		<-done
	}
}

// shutdownStart shuts the start's server down: its answers are at once, so its connections
// are idle, or close within shutdownTimeout.
func shutdownStart(srv *http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if srv.Shutdown(ctx) != nil {
		_ = srv.Close()
	}
}
