package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/postgres"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
	"github.com/agentgate/agentgate/supervisor"
)

// `agentgate sessions reset` while the daemon runs asks the daemon to reset the session (POST
// /v1/sessions/{key}/reset): its own reset cancels a turn it runs for the session and tells the
// senders of the session's unanswered messages at once. A single daemon is found at the
// address it records in its data directory; a cluster's members at the addresses they register
// in the store.

// errNoAnswer is the error of a daemon address where nothing took the request: no connection
// was made, so the request was never sent, or the daemon there is still starting and refused it
// (503 starting) (another member, or the store, may reset instead).
var errNoAnswer = errors.New("no answer")

// notTheDaemon is the error of an address where the process that answers is not the daemon
// meant (another run, or no agentgate): it was not asked to reset, or refused (421).
type notTheDaemon struct{ why string }

func (e *notTheDaemon) Error() string { return e.why }

// isNotTheDaemon reports whether err is, or wraps, a notTheDaemon.
func isNotTheDaemon(err error) bool {
	var e *notTheDaemon
	return errors.As(err, &e)
}

// probeTimeout bounds the request that asks the process at an address which run it is.
const probeTimeout = 10 * time.Second

// errAnswerLost is the error of a reset request the daemon took, but whose answer did not come
// back: it timed out, the connection broke, or the daemon gave up waiting for the session
// (503). The daemon may have reset the session, or may still: resetting again (through another
// member, or in the store) would end the session that reset began.
var errAnswerLost = errors.New("the answer was lost")

// errStopping is the error of an admin request the daemon refused because it is stopping (503
// draining): it reached no session, and nothing was changed. Before, it read as errAnswerLost,
// "it may have reset the session" (a walkthrough).
var errStopping = errors.New("is stopping and did not take the request: nothing was changed")

// errMemberOutdated is the error of an admin request that the cluster member holding the
// session did not know (503 member_outdated): that member runs an older agentgate, during a
// rolling upgrade, and did nothing. Any member hands the request to the same one, so no other is
// asked. Before, that member dropped it, and the command said the answer was lost ("it may
// have reset the session") after the daemon's whole wait.
var errMemberOutdated = errors.New("the member holding the session runs an older agentgate; upgrade it (nothing was changed)")

// resetTimeout bounds one reset request: the daemon cancels a running turn and stores the reset.
// (A variable for tests.)
var resetTimeout = 30 * time.Second

// adminClient talks to the daemon directly, never through an HTTP_PROXY of the environment,
// and follows no redirect: the reset and its bearer token go to the daemon's address only (Go's
// client would send the token on to another port of the same host, and turn the POST of a 301
// or 302 into a GET, whose 200 would look like a reset made).
var adminClient = &http.Client{Transport: &http.Transport{Proxy: nil},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// daemonAddr is where the daemon on cfg's data directory listens, and its run: the address and
// run it records there (recorded), else the configured address; a wildcard address is reached
// on loopback. Only a recorded address is asked to reset: the configured one names no process
// known to hold the database (the holder may run on another host, as a single daemon on
// PostgreSQL may, and another deployment's daemon may listen there).
func daemonAddr(cfg *config.Config) (addr, run string, recorded bool) {
	addr = cfg.HTTP.Addr
	// The running daemon says where it listens (its own flags may differ from ours), and
	// which run it is (its answers say so too).
	if b, err := os.ReadFile(filepath.Join(cfg.DataDir, supervisor.AddrFile)); err == nil && strings.TrimSpace(string(b)) != "" {
		addr, recorded = strings.TrimSpace(string(b)), true
		if b, err := os.ReadFile(filepath.Join(cfg.DataDir, supervisor.RunFile)); err == nil {
			run = strings.TrimSpace(string(b))
		}
	}
	if _, port, err := net.SplitHostPort(addr); err == nil && config.EveryInterface(addr) {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	return addr, run, recorded
}

// heldBy names where the daemon that holds the data directory answers, for the error err of a
// start it refused (a new user's walkthrough found the error silent on it): the address the
// directory records, once the process there answers as the run it records (daemonRun), so an
// address a dead daemon left is never named. Only for the locks of the data directory itself,
// its own and the default SQLite database's: the holder of a database elsewhere (a PostgreSQL
// one, maybe on another host) is not the daemon this directory names. "" otherwise.
func heldBy(ctx context.Context, cfg *config.Config, err error) string {
	if !errors.Is(err, supervisor.ErrDataDirInUse) &&
		!(cfg.Store.Driver == "sqlite" && cfg.Store.DSN == "" && errors.Is(err, persistence.ErrLocked)) {
		return ""
	}
	addr, run, recorded := daemonAddr(cfg)
	if !recorded || daemonRun(ctx, addr, run) != nil {
		return ""
	}
	return fmt.Sprintf(" (the daemon there answers at %s)", addr)
}

// daemonRun asks the process at addr which daemon run it is (its answer to GET /healthz names
// it), sending no token: one that names none, or another, is not asked to reset (notTheDaemon).
func daemonRun(ctx context.Context, addr, run string) error {
	if run == "" {
		return &notTheDaemon{"the daemon's record names no run (an agentgate older than this command?), so it is not asked"}
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := adminClient.Do(req)
	if err != nil {
		err = withoutURL(err)
		return fmt.Errorf("%w at %s (%v)", errNoAnswer, addr, err)
	}
	resp.Body.Close()
	switch got := resp.Header.Get(httpplatform.RunHeader); got {
	case run:
		return nil
	case "":
		return &notTheDaemon{fmt.Sprintf("the process at %s does not say which agentgate run it is (it answered %s), so it is not run %s, which recorded that address, and is not asked",
			addr, resp.Status, run)}
	default:
		return &notTheDaemon{fmt.Sprintf("the process at %s is agentgate run %s, not run %s, which recorded that address, so it is not asked",
			addr, printable(got), run)}
	}
}

// daemonReset asks the daemon listening at addr, run run, to reset key, with the bearer token of
// cfg's http.token_env when it is set, and returns the key's session after the reset. It first
// asks the process there which run it is, without the token (daemonRun). The error wraps
// errNoAnswer when nothing took the request at addr, is a notTheDaemon when the process there is
// not run run, and errAnswerLost when the daemon took the request but its answer did not come
// back (it may have reset the session).
func daemonReset(ctx context.Context, cfg *config.Config, addr, run, key string) (*httpplatform.SessionInfo, error) {
	a, err := daemonPost(ctx, cfg, addr, run, "/v1/sessions/"+url.PathEscape(key)+"/reset", "reset")
	if err != nil {
		return nil, err
	}
	switch {
	case a.status == http.StatusOK:
		// Only the key's session, as the daemon answers a reset, tells of a reset made.
		var info httpplatform.SessionInfo
		if err := json.Unmarshal(a.body, &info); err != nil || info.SessionKey != key || info.SessionID == "" {
			return nil, fmt.Errorf("the %[1]s at %[2]s answered %[3]s without a session of %[4]s: is this the %[1]s's address?", daemonNoun(cfg), addr, a.statusText, shortKey(key))
		}
		return &info, nil
	case a.noSession():
		return nil, errNoSession
	}
	return nil, fmt.Errorf("the %s at %s answered %s: %s", daemonNoun(cfg), addr, a.statusText, a.msg)
}

// noSession reports whether a is the daemon's refusal of a key no session has: 404 no_session.
// A daemon older than that code (one still running during a rolling upgrade) answers it 404
// not_found "no such session", which only its message tells from the 404 of a message or a
// route that is not there: that answer is read by its text, as before, and only that one.
func (a *daemonAnswer) noSession() bool {
	if a.status != http.StatusNotFound {
		return false
	}
	return a.code == httpplatform.CodeNoSession || a.code == httpplatform.CodeNotFound && a.msg == "no such session"
}

// unknownRoute reports whether a 404 with the error code and message of daemonPost's reading
// is the daemon's answer to a route it does not have, not its refusal of the key or message the
// request names: agentgate's own "no such route" (not_found), or a body that is not agentgate's
// JSON error at all (no code), such as net/http's "404 page not found". A daemon older than the
// command (one still running during a rolling upgrade) answers so a route added since.
func unknownRoute(code, msg string) bool {
	return code == "" || code == httpplatform.CodeNotFound && strings.HasPrefix(msg, "no such route")
}

// routeUnknown is the error of an admin request refused by the daemon, or by each cluster member
// that answered, as a route it does not have (unknownRoute): likely an agentgate older than the
// command. Nothing was changed, so throughMember asks the next member (one already upgraded, in
// a rolling upgrade, takes the request), and ends with this error, naming every member that
// refused so, only when no member took the request. silent says why of the members that did not
// answer.
type routeUnknown struct {
	noun, what string // "member" or "daemon"; the request ("reset")
	at         []routeRefusal
	silent     []string
}

// routeRefusal is the answer of the process at addr that did not know the route.
type routeRefusal struct{ addr, answered string }

func (e *routeUnknown) Error() string {
	var b strings.Builder
	if len(e.at) == 1 {
		fmt.Fprintf(&b, "the %s at %s does not know the %s route (it answered %s): it is likely an agentgate older than this command; upgrade it",
			e.noun, e.at[0].addr, e.what, e.at[0].answered)
	} else {
		fmt.Fprintf(&b, "the %ss at ", e.noun)
		for i, r := range e.at {
			switch {
			case i == len(e.at)-1:
				b.WriteString(" and ")
			case i > 0:
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s (it answered %s)", r.addr, r.answered)
		}
		fmt.Fprintf(&b, " do not know the %s route: they are likely agentgates older than this command; upgrade them", e.what)
	}
	b.WriteString(", then run the command again (nothing was changed")
	if len(e.silent) > 0 {
		fmt.Fprintf(&b, "; no other %s took the request: %s", e.noun, strings.Join(e.silent, "; "))
	}
	b.WriteString(")")
	return b.String()
}

// isRouteUnknown reports whether err is, or wraps, a routeUnknown.
func isRouteUnknown(err error) bool {
	_, ok := errors.AsType[*routeUnknown](err)
	return ok
}

// daemonNoun names the process an admin command asks in its messages: "member" in cluster mode,
// where each member registers its address in the store and any of them is asked, else "daemon".
func daemonNoun(cfg *config.Config) string {
	if cfg.Cluster.Enabled {
		return "member"
	}
	return "daemon"
}

// daemonAnswer is an answer of the daemon to an admin request that daemonPost leaves to its
// caller: a 2xx, 404 or 409.
type daemonAnswer struct {
	status     int
	statusText string
	body       []byte
	code, msg  string // of an error body (msg printable); msg is the body itself when it is none
	raw        string // msg as the daemon sent it, for reading (msg is cut short and quoted to print)
}

// daemonPost sends an admin POST of path (escaped) to the daemon listening at addr, run run,
// with the bearer token of cfg's http.token_env when it is set. It first asks the process there
// which run it is, without the token (daemonRun). It returns the answers its caller reads (a
// 2xx, 404 or 409); any other is an error, what naming the request in it ("reset"). The error
// wraps errNoAnswer when nothing took the request at addr, is a notTheDaemon when the process
// there is not run run, is a routeUnknown when the daemon does not know the route (it changed
// nothing), and wraps errAnswerLost when the daemon took the request but its answer did not
// come back (it may have acted on it).
func daemonPost(ctx context.Context, cfg *config.Config, addr, run, path, what string) (*daemonAnswer, error) {
	if err := daemonRun(ctx, addr, run); err != nil {
		return nil, err
	}
	noun := daemonNoun(cfg)
	ctx, cancel := context.WithTimeout(ctx, resetTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, nil)
	if err != nil {
		return nil, err
	}
	// A daemon of another run (the address changed hands since the probe) refuses it: 421.
	req.Header.Set(httpplatform.RunHeader, run)
	token := ""
	if cfg.HTTP.TokenEnv != "" {
		// Without the white space around it, as the daemon reads a bearer token ($(cat file)
		// keeps the \r of a Windows line end). A control character inside is the variable's
		// fault, not a daemon that does not answer (Go's client refuses to send it).
		token = strings.TrimSpace(os.Getenv(cfg.HTTP.TokenEnv))
		if strings.ContainsFunc(token, unicode.IsControl) {
			return nil, fmt.Errorf("%s (http.token_env) holds a control character, which a bearer token cannot carry", cfg.HTTP.TokenEnv)
		}
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	// Once connected, the request may have reached the daemon, which may act on it even after
	// this command gave up (a daemon that starts serves the connections waiting for it).
	var connected atomic.Bool
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { connected.Store(true) },
	}))
	resp, err := adminClient.Do(req)
	if err != nil {
		err = withoutURL(err)
		if connected.Load() {
			return nil, fmt.Errorf("the %s at %s took the request, but %w (%v)", noun, addr, errAnswerLost, err)
		}
		return nil, fmt.Errorf("%w at %s (%v)", errNoAnswer, addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil && resp.StatusCode >= 400 && resp.StatusCode < 500 {
		// A refusal all the same, whose message is lost: Go's server answers a request line
		// past the daemon's header limit (a KEY pasted with a log line) 431 and closes the
		// connection, which can reset it before its body is read.
		return nil, fmt.Errorf("the %s at %s answered %s (its message was cut short: %v): nothing was changed", noun, addr, resp.Status, err)
	}
	if err != nil {
		return nil, fmt.Errorf("the %s at %s took the request, but %w (%s, then %v)", noun, addr, errAnswerLost, resp.Status, err)
	}
	a := &daemonAnswer{status: resp.StatusCode, statusText: resp.Status, body: body}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return a, nil
	}
	var e httpplatform.ErrorResponse
	msg := strings.TrimSpace(string(body))
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		msg = e.Error.Message
	}
	a.code, a.msg, a.raw = e.Error.Code, printable(msg), msg
	switch {
	case resp.StatusCode == http.StatusServiceUnavailable && e.Error.Code == httpplatform.CodeStarting:
		// A daemon that starts answers before it serves (its /healthz too), and takes nothing:
		// as a daemon that does not answer yet. Before, nothing answered until it served.
		return nil, fmt.Errorf("%w at %s: the %s is starting and took nothing (%s)", errNoAnswer, addr, noun, a.msg)
	case resp.StatusCode == http.StatusServiceUnavailable && e.Error.Code == httpplatform.CodeDraining:
		// The daemon answers draining only for a request that reached no session (its other
		// failures while it stops are 503 unavailable: they may have been done).
		return nil, fmt.Errorf("the %s at %s %w", noun, addr, errStopping)
	case resp.StatusCode == http.StatusServiceUnavailable && e.Error.Code == httpplatform.CodeMemberOutdated:
		// An answer, not one lost: the member holding the session did not know the request.
		return nil, fmt.Errorf("%w: the %s at %s said: %s", errMemberOutdated, noun, addr, a.msg)
	case resp.StatusCode >= 500:
		// The daemon answers 503 when its own request to the session was cancelled or timed
		// out, and 500 when the session did not answer in time or its state could not be read
		// after a reset: the session may take, or have taken, the request all the same.
		return nil, fmt.Errorf("the %s at %s took the request, but %w (%s: %s)", noun, addr, errAnswerLost, resp.Status, a.msg)
	case resp.StatusCode == http.StatusMisdirectedRequest && e.Error.Code == httpplatform.CodeMisdirected:
		return nil, &notTheDaemon{fmt.Sprintf("the process at %s refused the %s: %s", addr, what, a.msg)}
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return nil, fmt.Errorf("the %[1]s at %[2]s answered %[3]s (a redirect to %[4]q, not followed): is this the %[1]s's address?", noun, addr, resp.Status, resp.Header.Get("Location"))
	case resp.StatusCode == http.StatusNotFound && unknownRoute(e.Error.Code, a.msg):
		// Not the key's or the message's 404: the daemon has no route for the request. Before,
		// a requeue read agentgate's "no such route" as a message the key does not have, and
		// net/http's plain "404 page not found" was printed as the daemon's answer.
		answered := resp.Status + ": " + a.msg
		if a.msg == "" {
			answered = resp.Status + " with no body"
		}
		return nil, &routeUnknown{noun: noun, what: what, at: []routeRefusal{{addr, answered}}}
	case resp.StatusCode == http.StatusNotFound, resp.StatusCode == http.StatusConflict:
		return a, nil
	case resp.StatusCode == http.StatusUnauthorized && cfg.HTTP.TokenEnv == "":
		return nil, fmt.Errorf("the %[1]s at %[2]s asks for a bearer token: name the variable that holds it in http.token_env, as the %[1]s's config does", noun, addr)
	case resp.StatusCode == http.StatusUnauthorized && token == "":
		return nil, fmt.Errorf("the %s at %s asks for a bearer token: set %s (http.token_env) to it", noun, addr, cfg.HTTP.TokenEnv)
	case resp.StatusCode == http.StatusUnauthorized:
		return nil, fmt.Errorf("the %s at %s refused the token in %s (http.token_env): %s", noun, addr, cfg.HTTP.TokenEnv, a.msg)
	}
	return nil, fmt.Errorf("the %s at %s answered %s: %s", noun, addr, resp.Status, a.msg)
}

// withoutURL is a client error without the method and URL it names (the messages name the
// address themselves).
func withoutURL(err error) error {
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// printable is an answer's message as the command prints it: at most 300 bytes, and quoted
// when it carries a control character (whatever listens at the address may answer anything,
// terminal control sequences included).
func printable(msg string) string {
	const limit = 300
	long := len(msg) > limit
	if long {
		msg = strings.ToValidUTF8(msg[:limit], "")
	}
	if strings.ContainsFunc(msg, unicode.IsControl) {
		msg = strconv.Quote(msg)
	}
	if long {
		msg += "…"
	}
	return msg
}

// memberLister lists a cluster's live members with their HTTP addresses (postgres.Store).
type memberLister interface {
	MemberHTTP(ctx context.Context, cluster string) ([]postgres.Member, error)
}

// resetThroughMember resets key through a live member of cfg's cluster, trying each the store
// lists until one answers. done is false when none answers (or none is live): the caller then
// resets in the store.
func resetThroughMember(ctx context.Context, st persistence.Store, cfg *config.Config, key string, stdout, stderr io.Writer) (done bool, err error) {
	done, silent, err := throughMember(ctx, st, cfg, func(addr, run string) error {
		info, err := daemonReset(ctx, cfg, addr, run, key)
		switch {
		case errors.Is(err, errNoAnswer) || isNotTheDaemon(err) || errors.Is(err, errStopping) || isRouteUnknown(err):
			return err // the next member is asked (a stopping one, or one without the route, changed nothing)
		case errors.Is(err, errAnswerLost):
			return answerLost(key, err)
		case errors.Is(err, errNoSession):
			return noSession("sessions reset", key, "reset")
		case err != nil:
			return fmt.Errorf("reset %s: %w", shortKey(key), err)
		}
		printReset(stdout, key, "the member at "+addr, info)
		return nil
	})
	if isRouteUnknown(err) {
		return true, fmt.Errorf("reset %s: %w", shortKey(key), err)
	}
	if !done && err == nil && len(silent) > 0 {
		fmt.Fprintf(stderr, "note: no cluster member answered (%s); the reset is made in the store, and a turn a member runs for the session is not cancelled\n",
			strings.Join(silent, "; "))
	}
	return done, err
}

// throughMember asks the live members of cfg's cluster that the store lists, one after the
// other, with ask, until one takes the request: ask's error is a member's answer unless it
// wraps errNoAnswer or errStopping, or is a notTheDaemon or a routeUnknown (then the next is
// asked). done is false when none took it (or none is live); silent says why of each member
// that did not. When none took it and some did not know the route (members older than the
// command, during a rolling upgrade), err is a routeUnknown that names them all, with silent in
// it: an upgraded member would have taken the request. Before, the first such member ended the
// command, though the next might have taken it.
func throughMember(ctx context.Context, st persistence.Store, cfg *config.Config, ask func(addr, run string) error) (done bool, silent []string, err error) {
	ml, ok := st.(memberLister)
	if !ok {
		return false, nil, nil
	}
	members, err := ml.MemberHTTP(ctx, cfg.Cluster.Name)
	if err != nil {
		return false, nil, err
	}
	here, _ := os.Hostname()
	var unknown *routeUnknown // the members that did not know the route
	for _, m := range members {
		addr := m.HTTP
		// A loopback address (a cluster on one host registers it) names the process of the
		// member's host: from another host it names another process, perhaps another
		// deployment's daemon, which would act on its own session of the key.
		host, run, _ := strings.Cut(m.Node, "/") // the member's host name and run
		if h, _, err := net.SplitHostPort(addr); err == nil && config.LoopbackHost(h) {
			if host == "" || host != here {
				silent = append(silent, fmt.Sprintf("%s is %s's loopback, not this host's (%s)", addr, cmp.Or(host, "another host"), here))
				continue
			}
		}
		err := ask(addr, run)
		if ru, ok := errors.AsType[*routeUnknown](err); ok {
			if unknown == nil {
				unknown = &routeUnknown{noun: ru.noun, what: ru.what}
			}
			unknown.at = append(unknown.at, ru.at...)
			continue
		}
		if errors.Is(err, errNoAnswer) || isNotTheDaemon(err) || errors.Is(err, errStopping) {
			silent = append(silent, err.Error())
			continue
		}
		return true, silent, err
	}
	if unknown != nil {
		unknown.silent = silent
		return false, silent, unknown
	}
	return false, silent, nil
}

// answerLost is the error of a reset whose answer err (errAnswerLost) did not come back: the
// operator looks before resetting again, which would end the session that reset began.
func answerLost(key string, err error) error {
	shown := pasteableKey(key)
	return fmt.Errorf("reset %s: %v: it may have reset the session: see agentgate sessions show %s before you try again", shown, err, shown)
}

// printDaemonReset reports a reset the daemon at addr made.
func printDaemonReset(w io.Writer, key, addr string, info *httpplatform.SessionInfo) {
	printReset(w, key, "the daemon at "+addr, info)
}

// printReset reports a reset that at made: the daemon, or a cluster's member, at its address.
// Before, a member's was reported as the daemon's.
func printReset(w io.Writer, key, at string, info *httpplatform.SessionInfo) {
	key = pasteableKey(key) // (as the messages name a key: its characters reach no terminal raw)
	// An ended session is the answer of a reset that found nothing to end; its own
	// predecessor (prev_session_id) is none of this reset's doing.
	if info.EndedAt != nil {
		fmt.Fprintf(w, "session %s of %s already ended (%s)\n", info.SessionID, key, info.EndReason)
		return
	}
	if info.Kept {
		fmt.Fprintf(w, "session %s of %s holds no conversation yet (commands and notices do not count): %s left it as it is\n", info.SessionID, key, at)
		return
	}
	if info.PrevSessionID != "" {
		fmt.Fprintf(w, "ended session %s of %s (%s) through %s; session %s follows it\n",
			info.PrevSessionID, key, persistence.EndResetCommand, at, info.SessionID)
		return
	}
	fmt.Fprintf(w, "reset %s through %s; its session is %s\n", key, at, info.SessionID)
}
