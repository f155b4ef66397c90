package http

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"path"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/platforms"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"
)

// Name is the platform name of the HTTP platform in session keys and metrics.
const Name = "http"

// Defaults and limits of the HTTP platform.
const (
	DefaultAddr      = "127.0.0.1:8080"
	DefaultMaxWait   = 5 * time.Minute
	DefaultKeepAlive = 15 * time.Second
	// DefaultReplyCheck is how often a ?wait on a cluster member, or of a duplicate whose
	// answer the outbox could not give, looks for its answer in the outbox (Config.ReplyCheck).
	DefaultReplyCheck = 2 * time.Second
	// DefaultBodyTimeout bounds how long a client may take to send a request's body.
	DefaultBodyTimeout = 30 * time.Second
	// DefaultWriteTimeout bounds how long a client may take to read an answer (an event
	// stream: each event).
	DefaultWriteTimeout = 30 * time.Second
	// DefaultDrainTimeout is shutdown.drain_timeout's default (Config.DrainTimeout).
	DefaultDrainTimeout = 30 * time.Second
	// DefaultMaxHeld bounds the requests held open at once (Config.MaxHeld).
	DefaultMaxHeld = 1024
	// DefaultMaxConnections bounds the connections open at once (Config.MaxConnections),
	// unless MaxHeld leaves fewer than HeldRoom of them.
	DefaultMaxConnections = 4096
	// HeldRoom is how many connections the default of Config.MaxConnections keeps beyond
	// MaxHeld, for the requests that are not held: health checks, scrapes, messages without
	// ?wait. Else held requests could take every connection and those would wait behind them.
	HeldRoom = 64
	// MaxTextBytes is the longest accepted message text (DESIGN §5: 64 KiB), as stored: each
	// NUL counts as the U+FFFD it is stored as.
	MaxTextBytes = 64 << 10
	// MaxBodyBytes bounds a POST body: the text plus room for JSON escaping (a client may write
	// every character as a six-byte \u escape) and the other fields.
	MaxBodyBytes = 6*MaxTextBytes + 64<<10
	// MaxIDBytes bounds every id field of a message (chat, thread, user, message, profile).
	MaxIDBytes = 256
	// MaxNameBytes bounds a user name; names are neutralised later, not rejected for content.
	MaxNameBytes = 1024
)

const (
	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 2 * time.Minute
	shutdownTimeout   = 5 * time.Second
	readyTimeout      = 5 * time.Second
	subscriberBuffer  = 256
	replayPageSize    = 500
	maxKeyBytes       = 8 << 10
)

// Config configures a Platform.
type Config struct {
	// Addr is the listen address, e.g. 127.0.0.1:8080 or 127.0.0.1:0; "" means DefaultAddr.
	Addr string
	// Token is the bearer token every route except /healthz and /readyz requires; "" means
	// none, which New accepts only on a loopback address.
	Token string
	// Metrics is served at GET /metrics; nil answers 404.
	Metrics http.Handler
	// Requests counts every answer by route (the pattern that serves the request, such as
	// "POST /v1/messages", or "other" for none) and status code (its labels route and code);
	// nil counts nothing.
	Requests *prometheus.CounterVec
	// ConnectionsOpen is kept at the number of connections open, at most MaxConnections;
	// nil tracks none.
	ConnectionsOpen prometheus.Gauge
	// ConnectionsLimit is set to MaxConnections (its default resolved), so that an alert can
	// compare ConnectionsOpen with it; nil sets nothing.
	ConnectionsLimit prometheus.Gauge
	// ConnectionsLimitReached counts the times a connection took the last of MaxConnections:
	// until one closed, new connections waited in the listen backlog. It shows a limit reached
	// between two scrapes, or while no scrape got through. nil counts nothing.
	ConnectionsLimitReached prometheus.Counter
	// Ready reports each component's readiness (nil error = ok) for /readyz; nil means none.
	// A request without the bearer token (when Token is set) is told only which components
	// fail, not their errors.
	Ready func(ctx context.Context) map[string]error
	// Sessions answers the session routes and SSE replay; nil answers 503 on those routes.
	Sessions Sessions
	// Platforms names the platforms, besides agentgate's own (discord and http), whose sessions
	// the store may hold: those an embedder runs. GET /v1/sessions?platform= takes these names
	// only; another is answered 400, not an empty list.
	Platforms []string
	// Logger receives the platform's logs; nil discards them.
	Logger *slog.Logger
	// MaxWait caps ?wait on POST /v1/messages; 0 means DefaultMaxWait.
	MaxWait time.Duration
	// KeepAlive is the interval of SSE keepalive comments; 0 means DefaultKeepAlive.
	KeepAlive time.Duration
	// ReplyCheck is how often a ?wait of POST /v1/messages that has no answer yet looks for it
	// in the outbox, on a member whose replies may come by relays (Clustered), and on any
	// daemon for a duplicate whose first read of the outbox failed; 0 means DefaultReplyCheck.
	ReplyCheck time.Duration
	// BodyTimeout is how long a request may take to send its body; 0 means DefaultBodyTimeout.
	BodyTimeout time.Duration
	// WriteTimeout is how long a client may take to read an answer once it starts (an event
	// stream: each event); 0 means DefaultWriteTimeout.
	WriteTimeout time.Duration
	// Run names this run of the daemon: every answer carries it in the RunHeader, and a request
	// that names another run in it is answered 421 before anything else (an admin command that
	// found this address in a record of another run, or another deployment's). "" means none.
	Run string
	// Clustered says that the daemon is a cluster member: replies sent on other members reach
	// this one by relays (Show), which can miss it, so event streams also look in the outbox
	// at each keepalive, and a ?wait every ReplyCheck.
	Clustered bool
	// Pprof serves Go's runtime profiles (net/http/pprof) at GET /debug/pprof/; off, those
	// routes answer 404.
	Pprof bool
	// DrainTimeout is how long the daemon's drain lasts at most (shutdown.drain_timeout): a
	// draining daemon's 503 tells its client, in Retry-After, to send again once it is over
	// (at least 1 s later, so a drain that does not wait is given as a second). 0 means
	// DefaultDrainTimeout.
	DrainTimeout time.Duration
	// MaxHeld bounds the requests held open at once, event streams and requests with ?wait:
	// each holds a connection, a goroutine and buffers for as long as it lasts (3,000 streams
	// took a daemon from 27 to 150 MB and 3,000 open files). Beyond it they are answered 503
	// at once, before anything is done for them. 0 means DefaultMaxHeld.
	MaxHeld int
	// MaxConnections bounds the connections open at once, before a request is read or its
	// token looked at: more wait in the kernel's listen backlog until one closes. Before,
	// clients that opened sockets and sent nothing took a goroutine and a file descriptor each
	// until the daemon had none left for its database and spool (20,000 sockets of two
	// clients, found by a security walkthrough). 0 means DefaultMaxConnections, or MaxHeld +
	// HeldRoom when that is more.
	MaxConnections int
}

// ownPlatforms are agentgate's own platforms: the store may hold sessions of each whether or
// not it runs now (Discord's, after it was turned off). Discord's name is written out: importing
// platforms/discord here would bring discordgo into the HTTP platform.
var ownPlatforms = []string{"discord", Name}

// RunHeader is the header that names a daemon's run (Config.Run), in its answers and in the
// requests meant for that run only.
const RunHeader = "Agentgate-Run"

// Platform is the HTTP platform. Create it with New, bind it with Listen, serve it with Run.
type Platform struct {
	cfg      Config
	log      *slog.Logger
	mux      *http.ServeMux
	handler  http.Handler
	draining atomic.Bool
	// drainedAt is when Drain was first called (Unix nanoseconds), set before draining.
	drainedAt atomic.Int64
	// drainReason is what the draining 503s say when the daemon drains for a reason of its own
	// (DrainBecause); nil for a plain stop. Set before draining.
	drainReason atomic.Pointer[string]
	// unstored limits the line of messages that could not be stored: in an outage (a full
	// disk) every message, and each client's retry of it, would log one.
	unstored logging.Limiter
	// relayed is set when this member is in a cluster (Config.Clustered), or once a reply sent
	// on another member was shown here (Show): relays can miss it, so event streams also look
	// in the outbox.
	relayed atomic.Bool
	// subBuffer is the event buffer of each SSE subscriber; a field so tests can shrink it.
	subBuffer int
	// held counts the requests held open (event streams, ?wait): at most Config.MaxHeld.
	held atomic.Int64
	// overHeld limits the line of requests refused for MaxHeld.
	overHeld logging.Limiter
	// unauthorized limits the line of requests refused for their token.
	unauthorized logging.Limiter
	// cutOff limits the line of answers cut off because their client stopped reading: clients
	// that ask for long answers and read none would log one each.
	cutOff logging.Limiter
	// slowSubs limits the line of event streams dropped for falling behind, and replayFails
	// that of event streams whose outbox read failed: clients that never read their streams, or
	// a database outage under many streams, would log one a stream.
	slowSubs, replayFails logging.Limiter
	// pageFails limits the line of transcripts cut short by a page that could not be read: in a
	// database outage every reader's would log one.
	pageFails logging.Limiter
	// conns counts the connections open (countingListener), to tell when the last of
	// Config.MaxConnections is taken.
	conns atomic.Int64
	// platforms are the names GET /v1/sessions?platform= takes, sorted: agentgate's own and
	// Config.Platforms.
	platforms []string

	mu      sync.Mutex
	ln      net.Listener // bound by Listen, consumed by Run
	running bool
	// starting serves ln during the daemon's start (ServeStarting), until EndStarting.
	starting *startServer
	// startClosed is closed once the connections of the start's server are (EndStarting).
	startClosed chan struct{}
	deliver     platforms.Deliver
	// stop is closed when the current Run stops serving; it ends SSE streams and ?wait waits
	// so that Shutdown is not held up by long-lived requests.
	stop    chan struct{}
	subs    map[string]map[*subscriber]struct{} // by session key
	waiters map[string]map[*waiter]struct{}     // by message id
}

var _ platforms.Platform = (*Platform)(nil)

// New validates c and returns a Platform that is not yet listening. It refuses a non-loopback
// address without a bearer token.
func New(c Config) (*Platform, error) {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	loopback, err := IsLoopback(c.Addr)
	if err != nil {
		return nil, fmt.Errorf("new http platform: %w", err)
	}
	// A token read with its line end ($(cat file) keeps a Windows \r; an EnvironmentFile may
	// too) is the token without it, as a client's header is read.
	c.Token = strings.TrimSpace(c.Token)
	if !loopback && c.Token == "" {
		return nil, fmt.Errorf("new http platform: refusing to listen on public address %s without a bearer token (set http.token_env)", c.Addr)
	}
	if c.MaxWait <= 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.KeepAlive <= 0 {
		c.KeepAlive = DefaultKeepAlive
	}
	if c.ReplyCheck <= 0 {
		c.ReplyCheck = DefaultReplyCheck
	}
	if c.BodyTimeout <= 0 {
		c.BodyTimeout = DefaultBodyTimeout
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.MaxHeld <= 0 {
		c.MaxHeld = DefaultMaxHeld
	}
	if c.MaxConnections <= 0 {
		c.MaxConnections = max(DefaultMaxConnections, c.MaxHeld+HeldRoom)
	}
	if c.ConnectionsLimit != nil {
		c.ConnectionsLimit.Set(float64(c.MaxConnections))
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Platform{
		cfg:       c,
		log:       log.With("platform", Name),
		mux:       http.NewServeMux(),
		subBuffer: subscriberBuffer,
		stop:      make(chan struct{}),
		subs:      make(map[string]map[*subscriber]struct{}),
		waiters:   make(map[string]map[*waiter]struct{}),
	}
	p.platforms = slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(ownPlatforms), c.Platforms...))))
	p.relayed.Store(c.Clustered) // relays miss a member most when it has just started
	p.routes()
	p.handler = p.wrap(http.HandlerFunc(p.route))
	return p, nil
}

// wrap puts around h what every request passes, during the start (ServeStarting) as once Run
// serves: counted, panics answered, the run and the body checked, browsers and the token too.
func (p *Platform) wrap(h http.Handler) http.Handler {
	return p.count(p.recoverPanics(p.identify(p.limitBody(p.refuseBrowsers(p.authenticate(h))))))
}

// serverLog is the http.Server's ErrorLog: its lines at Warn, on the platform's log.
func (p *Platform) serverLog() *log.Logger {
	return slog.NewLogLogger(p.log.Handler(), slog.LevelWarn)
}

// IsLoopback reports whether addr's host is "localhost" or a loopback IP: only there may the
// platform listen without a bearer token.
func IsLoopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("parse address %q: %w", addr, err)
	}
	return config.LoopbackHost(host), nil
}

func (p *Platform) routes() {
	m := p.mux
	m.HandleFunc("POST /v1/messages", p.handleMessages)
	m.HandleFunc("GET /v1/sessions", p.handleList)
	m.HandleFunc("GET /v1/sessions/{key}", p.handleGet)
	m.HandleFunc("POST /v1/sessions/{key}/reset", p.handleReset)
	m.HandleFunc("POST /v1/sessions/{key}/messages/{message_id}/requeue", p.handleRequeue)
	m.HandleFunc("GET /v1/quarantined", p.handleQuarantined)
	m.HandleFunc("GET /v1/sessions/{key}/transcript", p.handleTranscript)
	m.HandleFunc("GET /v1/sessions/{key}/events", p.handleEvents)
	m.HandleFunc("GET /metrics", p.handleMetrics)
	m.HandleFunc("GET /healthz", p.handleHealthz)
	m.HandleFunc("GET /readyz", p.handleReadyz)
	if p.cfg.Pprof {
		m.HandleFunc("GET /debug/pprof/", pprof.Index) // the index, and every named profile (goroutine, heap, …)
		m.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		m.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		m.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		m.HandleFunc("POST /debug/pprof/symbol", pprof.Symbol)
		m.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
}

// Name returns "http".
func (p *Platform) Name() string { return Name }

// Listen binds the listener, so the daemon can report the address before Run serves it.
// Calling it again before Run returns the same address.
func (p *Platform) Listen() (net.Addr, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		return p.ln.Addr(), nil
	}
	if p.running {
		return nil, errors.New("listen http: already serving")
	}
	ln, err := net.Listen(listenNetwork(p.cfg.Addr), p.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen http: %w", err)
	}
	p.ln = ln
	return ln.Addr(), nil
}

// listenNetwork is the network to listen on at addr: "tcp4" for an IPv4 address, so that
// 0.0.0.0 means IPv4's addresses, as configured (Go listens on IPv6's too for "tcp" and any
// unspecified address, found by an audit: 0.0.0.0:8080 said `listening on [::]:8080` and
// answered on [::1]); "tcp" for everything else ([::] takes both: Go clears IPV6_V6ONLY; a
// name, its first address).
func listenNetwork(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if ip, perr := netip.ParseAddr(host); err == nil && perr == nil && ip.Is4() {
		return "tcp4"
	}
	return "tcp"
}

// Run serves the bound listener (calling Listen first if needed) and hands inbound messages to
// deliver until ctx ends. Then it ends SSE streams and waits, shuts the server down gracefully
// within a few seconds, and returns nil. It returns an error if serving failed.
func (p *Platform) Run(ctx context.Context, deliver platforms.Deliver) error {
	if deliver == nil {
		return errors.New("run http platform: nil deliver")
	}
	if _, err := p.Listen(); err != nil {
		return fmt.Errorf("run http platform: %w", err)
	}
	p.mu.Lock()
	if p.running {
		p.mu.Unlock()
		return errors.New("run http platform: already running")
	}
	ln := p.ln
	p.ln = nil // a restarted Run binds afresh
	p.running = true
	p.deliver = deliver
	stop := make(chan struct{})
	p.stop = stop
	p.mu.Unlock()

	srv := &http.Server{
		Handler:           p.handler,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    64 << 10,
		// OPTIONS * goes to the handler, past its checks, to be answered as OPTIONS of a
		// route is (route): Go's server answered it itself, a bare 200.
		DisableGeneralOptionsHandler: true,
		ErrorLog:                     p.serverLog(),
	}
	// The start's server, if one still serves ln, answers no more; its connections close once
	// idle.
	p.EndStarting()
	defer p.waitStartClosed()
	p.log.Info("http platform serving", "addr", ln.Addr().String())

	// The Serve goroutine is owned by Run: Run does not return before Serve has.
	served := make(chan error, 1)
	go func() {
		served <- srv.Serve(netutil.LimitListener(countingListener{Listener: ln, p: p}, p.cfg.MaxConnections))
	}()

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}

	close(stop)
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	err := srv.Shutdown(sctx)
	cancel()
	if err != nil {
		p.log.Warn("http shutdown timed out, closing connections", logging.Err(err))
		_ = srv.Close() // the only error it reports is the listener's, already closed
	}
	if serveErr == nil {
		serveErr = <-served
	}

	// The lines held back (logging.Limiter) are reported as the platform stops, once no
	// handler logs (the start's server's, too), and before the line that says it stopped:
	// after it, a refusal reported read as one of a platform still serving
	// (TestLinesHeldBackAreReportedBeforeTheStop).
	p.waitStartClosed()
	logging.FlushAll(&p.unstored, &p.overHeld, &p.unauthorized, &p.cutOff, &p.slowSubs, &p.replayFails, &p.pageFails)
	p.mu.Lock()
	p.running = false
	p.mu.Unlock()
	p.log.Info("http platform stopped")

	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("serve http: %w", serveErr)
	}
	return nil
}

// Drain stops intake: POST /v1/messages answers 503 draining (Retry-After: what is left of
// Config.DrainTimeout) and /readyz fails. Session queries, SSE streams and waits for already
// accepted messages keep working.
func (p *Platform) Drain() {
	p.drainedAt.CompareAndSwap(0, time.Now().UnixNano())
	if !p.draining.Swap(true) {
		p.log.Info("http platform draining")
	}
}

// DrainBecause is Drain for a daemon that stops for a reason its clients act on: every
// draining 503 gives reason as its message instead of the plain stop's (a cluster member
// that lost its membership says that another member takes the chat, rather than "retry at its
// next start"). The first reason given stays; a later Drain keeps it.
func (p *Platform) DrainBecause(reason string) {
	p.drainReason.CompareAndSwap(nil, &reason)
	p.Drain()
}

// Send publishes out to the live SSE subscribers of out.SessionKey and to the ?wait callers of
// the messages it answers. It never blocks on a client: a subscriber whose buffer is full is
// dropped and its stream closed, and it resumes from the durable outbox with Last-Event-ID.
// Send reports success whether or not anybody is listening, because the reply is already in
// the outbox that SSE replays.
func (p *Platform) Send(ctx context.Context, out *platforms.Outbound) error {
	if out == nil {
		return errors.New("send http: nil outbound")
	}
	p.show(out)
	return nil
}

// Show implements platforms.Watched: it hands a reply sent on another cluster member to this
// member's SSE subscribers and ?wait callers, as Send does (both skip a reply they have had).
func (p *Platform) Show(out *platforms.Outbound) {
	p.relayed.Store(true)
	p.show(out)
}

// show hands out to the live SSE subscribers of its key and the ?wait callers of the messages
// it answers.
func (p *Platform) show(out *platforms.Outbound) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.subs[out.SessionKey] {
		if !s.offer(out) {
			p.removeSubLocked(out.SessionKey, s)
			p.slowSubs.LogQuiet(p.log, slog.LevelWarn, "sse subscriber dropped, too slow", "session", out.SessionKey)
		}
	}
	var seen map[*waiter]bool
	for _, id := range out.InReplyTo {
		for w := range p.waiters[id] {
			if seen[w] {
				continue
			}
			if seen == nil {
				seen = make(map[*waiter]bool)
			}
			seen[w] = true
			w.offer(out)
		}
	}
}

func (p *Platform) currentDeliver() (platforms.Deliver, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deliver, p.stop
}

func (p *Platform) stopped() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stop
}

// route dispatches to the mux, answering unknown routes and wrong methods with JSON bodies
// instead of the mux's plain text, and a path that is not in canonical form with a 404 rather
// than the mux's redirect (redirectedTo).
func (p *Platform) route(w http.ResponseWriter, r *http.Request) {
	if r.RequestURI == "*" {
		if r.Method == http.MethodOptions {
			// OPTIONS * asks what the server as a whole takes. The API takes no OPTIONS on
			// any route (405, with the route's Allow): so neither here, where Allow names
			// every method one route or another takes.
			w.Header().Set("Allow", allMethods)
			writeError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed, "method OPTIONS not allowed")
			return
		}
		// The target * is only for OPTIONS (RFC 9112, section 3.2.4): GET * names nothing.
		// The mux read it as the path /*, and it was answered 404 as a path not in canonical
		// form, "which is /*", a route no client meant.
		advice := fmt.Sprintf("send %.20s to a route's path, such as /v1/sessions", r.Method)
		if r.Method == http.MethodConnect {
			advice = "no route takes CONNECT either (agentgate is no proxy)"
		}
		writeError(w, http.StatusBadRequest, CodeInvalidTarget,
			"only OPTIONS takes the request target * (a question about the server as a whole): "+advice)
		return
	}
	h, pattern := p.mux.Handler(r)
	if canonical, ok := redirectedTo(r, pattern); ok {
		msg := "no such route: the path is not in canonical form"
		if pattern != "" {
			msg += fmt.Sprintf("; the route is %s", clipped(canonical))
		} else {
			msg += fmt.Sprintf(", which is %s", clipped(canonical)) // a route of another method, or none
		}
		writeError(w, http.StatusNotFound, CodeNotFound, msg)
		return
	}
	if pattern != "" {
		p.mux.ServeHTTP(w, r)
		return
	}
	cw := &captureWriter{header: make(http.Header)}
	h.ServeHTTP(cw, r)
	switch cw.code {
	case http.StatusMethodNotAllowed:
		if allow := cw.header.Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		writeError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed, "method "+r.Method+" not allowed")
	default: // 404, or a redirect that redirectedTo did not foresee: never sent either way
		msg := "no such route"
		if route, ok := p.withoutSlash(r); ok {
			msg += fmt.Sprintf("; the route is %s, without the trailing slash", clipped(route))
		}
		writeError(w, http.StatusNotFound, CodeNotFound, msg)
	}
}

// allMethods are the methods the routes take (routes), as the mux's Allow names them (HEAD
// with GET).
const allMethods = "GET, HEAD, POST"

// withoutSlash returns r's path without its trailing slash when that is a route of r's method
// (/v1/sessions/ for /v1/sessions): a new user's walkthrough met a bare "no such route".
func (p *Platform) withoutSlash(r *http.Request) (string, bool) {
	path := r.URL.EscapedPath()
	if len(path) < 2 || !strings.HasSuffix(path, "/") {
		return "", false
	}
	trimmed := r.Clone(r.Context())
	trimmed.URL.Path, trimmed.URL.RawPath = strings.TrimSuffix(r.URL.Path, "/"), strings.TrimSuffix(r.URL.RawPath, "/")
	if _, pattern := p.mux.Handler(trimmed); pattern == "" {
		return "", false
	}
	return trimmed.URL.EscapedPath(), true
}

// redirectedTo reports whether the mux would answer r with a redirect, and to which path: r's
// path is not in canonical form (a doubled slash, a dot segment), or it is a subtree pattern's
// path without its trailing slash (/debug/pprof). Such a request is answered 404 instead: a
// client that follows a 307 sends a POST's body again, or drops it, or does not follow it at
// all, and a proxy in front that allows or refuses routes by their path would have judged
// another path than the one served. Paths are compared escaped, as the mux matches them: an
// escaped slash or dot in a session key (%2F, %2E) is no separator or dot segment.
func redirectedTo(r *http.Request, pattern string) (string, bool) {
	if r.Method == http.MethodConnect {
		return "", false // the mux cleans no CONNECT path
	}
	escaped := r.URL.EscapedPath()
	if clean := cleanPath(escaped); clean != escaped {
		return clean, true
	}
	_, route, ok := strings.Cut(pattern, " ") // "GET /debug/pprof/"
	if !ok {
		route = pattern
	}
	if !strings.HasSuffix(escaped, "/") && route == escaped+"/" {
		return route, true
	}
	return "", false
}

// cleanPath is the canonical form of an escaped path as net/http's ServeMux makes it: rooted,
// without empty or dot segments, keeping a trailing slash.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if strings.HasSuffix(p, "/") && np != "/" {
		np += "/"
	}
	return np
}

// captureWriter records what the mux's own 404/405/redirect handler would answer.
type captureWriter struct {
	header http.Header
	code   int
}

func (c *captureWriter) Header() http.Header { return c.header }

func (c *captureWriter) Write(b []byte) (int, error) {
	if c.code == 0 {
		c.code = http.StatusOK
	}
	return len(b), nil
}

func (c *captureWriter) WriteHeader(code int) {
	if c.code == 0 {
		c.code = code
	}
}

// count counts each answer in Config.Requests by the route that serves it, refusals before the
// route (401, 413, 421) and a handler's panic (500) included, so that what clients were told
// (a 503 to send a message again) can be graphed and alerted on. The route is the mux's
// pattern, a fixed set, never the path: a path holds session keys.
func (p *Platform) count(next http.Handler) http.Handler {
	if p.cfg.Requests == nil {
		return next
	}
	var counted sync.Map // route → next, counted under it (a fixed set: the mux's patterns)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		route := "other"
		if _, pattern := p.mux.Handler(r); pattern != "" {
			if _, redirected := redirectedTo(r, pattern); !redirected {
				route = pattern
			}
		}
		h, ok := counted.Load(route)
		if !ok {
			h, _ = counted.LoadOrStore(route, promhttp.InstrumentHandlerCounter(
				p.cfg.Requests.MustCurryWith(prometheus.Labels{"route": route}), next))
		}
		h.(http.Handler).ServeHTTP(w, r)
	})
}

// limitBody refuses a body announced larger than MaxBodyBytes before reading any of it (so a
// client that waits for "100 Continue" is told 413 at once), and gives a request with a body
// Config.BodyTimeout to send it: a client that stalls mid-body must not hold a connection and its
// goroutine forever (the server reads what is left of a body a handler did not read, a 401's
// included). A handler that reads the whole body lifts the deadline (readBody): a reply it
// waits for (?wait) or a stream it writes is not bounded by it.
func (p *Platform) limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > MaxBodyBytes {
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
				fmt.Sprintf("the body is %d bytes; the limit is %d", r.ContentLength, MaxBodyBytes))
			return
		}
		if r.ContentLength != 0 { // -1: chunked, length unknown
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(p.cfg.BodyTimeout))
		}
		next.ServeHTTP(w, r)
	})
}

// identify names the daemon's run in every answer, and answers 421 a request meant for another
// run, before the token is looked at.
func (p *Platform) identify(next http.Handler) http.Handler {
	if p.cfg.Run == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(RunHeader, p.cfg.Run)
		if want := r.Header.Get(RunHeader); want != "" && want != p.cfg.Run {
			writeError(w, http.StatusMisdirectedRequest, CodeMisdirected,
				fmt.Sprintf("this is agentgate run %s, not %s", p.cfg.Run, want))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// refuseBrowsers keeps web pages from using the API through a browser that runs on a host
// where the daemon listens. Without a token nothing else stops them: a page on any site can
// POST a message (with no Content-Type, which is read as JSON) to 127.0.0.1, and an exec agent
// runs it; a page whose name its owner points at 127.0.0.1 (DNS rebinding) is even the same
// origin, and reads every transcript. So a request a browser marks as cross-origin (its
// Sec-Fetch-Site or Origin header) that could change something (any method but GET, HEAD,
// OPTIONS) is refused, and a daemon without a token answers only requests sent to a loopback
// name (their Host header), as its own clients and curl send them; a page reached by another
// name is refused. Clients other than browsers send neither header, and are not affected.
//
// The cross-origin check stays on with a token. A page cannot set the token itself (a
// cross-site Authorization header takes a CORS preflight, which agentgate does not answer),
// but a proxy in front may add it to every request it passes on (behind a login of its own,
// whose cookie a browser sends along), and then a page on any site could send messages through
// it. A client that passes on a browser's Origin or Sec-Fetch-Site (a web chat's backend
// behind a proxy) is refused for them; the answer says to drop them.
func (p *Platform) refuseBrowsers(next http.Handler) http.Handler {
	crossOrigin := http.NewCrossOriginProtection()
	tokenless := p.cfg.Token == ""
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := crossOrigin.Check(r); err != nil {
			writeError(w, http.StatusForbidden, CodeCrossOrigin,
				"a browser's cross-origin request is refused (its Origin or Sec-Fetch-Site header says so); send it from the daemon's own origin or from a client other than a browser, and have a server or proxy that passes on a browser's Origin and Sec-Fetch-Site headers drop them")
			return
		}
		if tokenless && !loopbackName(r.Host) && !connectAsterisk(r) {
			writeError(w, http.StatusForbidden, CodeForeignHost,
				fmt.Sprintf("this daemon has no bearer token, so it answers requests to a loopback name (127.0.0.1, localhost) only, not to %q; set http.token_env to serve it by another name", clipped(r.Host)))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// connectAsterisk reports whether r is CONNECT *, whose Host is its target * (Go reads a
// CONNECT's target as its host, and drops the Host header): it names no host, and is answered
// 400 invalid_target as GET * is (route). It was refused 403 foreign_host, "not to \"*\"".
func connectAsterisk(r *http.Request) bool {
	return r.Method == http.MethodConnect && r.RequestURI == "*"
}

// loopbackName reports whether a request's Host header names a loopback host. An empty one (an
// HTTP/1.0 request: no browser sends one) names none, and is taken.
func loopbackName(host string) bool {
	if host == "" {
		return true
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	return config.LoopbackHost(host)
}

// clipped is a client's value (a Host header, a path) fit to quote in an answer or a log line:
// at most 100 bytes (a header may run to the server's header limit).
func clipped(v string) string {
	if len(v) > 100 {
		return v[:100] + "…"
	}
	return v
}

// authenticate requires the bearer token on every route except the health probes (/readyz
// tells a request without it less: handleReadyz).
func (p *Platform) authenticate(next http.Handler) http.Handler {
	if p.cfg.Token == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			next.ServeHTTP(w, r)
			return
		}
		if !p.authorized(r) {
			// Else a scraper or client with a stale token was refused without a word in the
			// log (found by an audit). Never the token it sent.
			p.unauthorized.LogQuiet(p.log, slog.LevelWarn, "request refused: missing or invalid bearer token", "remote", r.RemoteAddr, "path", clipped(r.URL.Path),
				"authorization", r.Header.Get("Authorization") != "")
			w.Header().Set("WWW-Authenticate", `Bearer realm="agentgate"`)
			// A client without the token keeps no connection idle here for the idle timeout.
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusUnauthorized, CodeUnauthorized, "missing or invalid bearer token")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// authorized reports whether r carries the bearer token, or the daemon has none (it is open
// to whoever reaches it). It compares the tokens' SHA-256 digests: ConstantTimeCompare returns
// at once for inputs of different lengths, which told a caller timing its refusals the token's
// length; the digests are of one length whatever was sent.
func (p *Platform) authorized(r *http.Request) bool {
	if p.cfg.Token == "" {
		return true
	}
	got, ok := bearer(r.Header.Get("Authorization"))
	if !ok {
		return false
	}
	sent, want := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(p.cfg.Token))
	return subtle.ConstantTimeCompare(sent[:], want[:]) == 1
}

// bearer extracts the token of an "Authorization: Bearer <token>" header; the scheme is
// case-insensitive (RFC 9110).
func bearer(h string) (string, bool) {
	const scheme = "bearer "
	if len(h) <= len(scheme) || !strings.EqualFold(h[:len(scheme)], scheme) {
		return "", false
	}
	return strings.TrimSpace(h[len(scheme):]), true
}

// recoverPanics turns a handler panic into a logged 500 JSON answer, so one bad request never
// takes the process down and the client gets a well-formed error. It also bounds the writing
// of every answer (trackingWriter), and logs an answer cut off because its client stopped
// reading.
func (p *Platform) recoverPanics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tw := &trackingWriter{ResponseWriter: w, writeTimeout: p.cfg.WriteTimeout}
		// A deadline the connection's previous answer left must not cut this one (the server
		// sets none of its own); this one's starts with its first byte.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
		defer func() {
			v := recover()
			if v == nil {
				if tw.timedOut {
					args := []any{"route", r.Pattern, "method", r.Method, "remote", r.RemoteAddr,
						"write_timeout", p.cfg.WriteTimeout}
					if key := r.PathValue("key"); key != "" {
						// Which session's stream or transcript it was: the route names none.
						args = append(args, "session", key)
					}
					p.cutOff.LogQuiet(p.log, slog.LevelWarn, "answer cut off: the client stopped reading it", args...)
				}
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			p.log.Error("http handler panic", "route", r.Pattern, "method", r.Method,
				"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			if !tw.wrote {
				writeError(tw, http.StatusInternalServerError, CodeInternal, "internal error")
			}
		}()
		next.ServeHTTP(tw, r)
	})
}

// trackingWriter remembers whether the response has started, and bounds writing it: when the
// answer starts, the connection gets a write deadline writeTimeout away, so a client that stops
// reading cannot hold its handler, and the answer's buffers, for ever. (An event stream sets a
// new deadline for each event.) Unwrap lets http.ResponseController reach the connection's
// Flush and write deadlines.
type trackingWriter struct {
	http.ResponseWriter
	writeTimeout time.Duration
	wrote        bool
	timedOut     bool // a write failed on the deadline
}

func (t *trackingWriter) start() {
	if t.wrote {
		return
	}
	t.wrote = true
	// Unsupported only off a real connection (an httptest.ResponseRecorder).
	_ = http.NewResponseController(t.ResponseWriter).SetWriteDeadline(time.Now().Add(t.writeTimeout))
}

func (t *trackingWriter) WriteHeader(code int) {
	t.start()
	t.ResponseWriter.WriteHeader(code)
}

func (t *trackingWriter) Write(b []byte) (int, error) {
	t.start()
	n, err := t.ResponseWriter.Write(b)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.timedOut = true
	}
	return n, err
}

func (t *trackingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// hold counts a request that is held open (an event stream, a ?wait) and returns the function
// that ends it; or, when Config.MaxHeld requests are held already, answers 503 and returns
// false: nothing is done for the request, and its client may send it again.
func (p *Platform) hold(w http.ResponseWriter, what string) (release func(), ok bool) {
	if n := p.held.Add(1); n > int64(p.cfg.MaxHeld) {
		p.held.Add(-1)
		p.overHeld.LogQuiet(p.log, slog.LevelWarn, "too many event streams and ?wait requests held open; refusing more", "max", p.cfg.MaxHeld, "refused", what)
		setRetryAfter(w, retryHeld)
		writeError(w, http.StatusServiceUnavailable, CodeTooManyHeld,
			fmt.Sprintf("%d event streams and ?wait requests are held open already (http.max_held); nothing was done for this one: send it again later, or without ?wait", p.cfg.MaxHeld))
		return nil, false
	}
	return func() { p.held.Add(-1) }, true
}
