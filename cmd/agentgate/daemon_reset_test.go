package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence/postgres"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
	"github.com/agentgate/agentgate/supervisor"
)

// takenResets are daemons that took a reset request but whose answer never comes back: the
// reset may have been made (or may still be made) all the same. timeout, when set, is the
// command's resetTimeout (the daemon that times out keeps the request until the command gives
// up).
var takenResets = []struct {
	name    string
	timeout time.Duration
	handler http.HandlerFunc
}{
	{"timed out", time.Second, func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // a slow reset: it goes on after the command gave up
	}},
	{"connection lost", 0, func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}},
	{"gave up (503)", 0, func(w http.ResponseWriter, r *http.Request) {
		// What the daemon answers when its own request to the session timed out: the
		// session may have taken the reset since.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":{"code":"unavailable","message":"request cancelled or timed out"}}`))
	}},
	{"stopping (503 unavailable)", 0, func(w http.ResponseWriter, r *http.Request) {
		// What a stopping daemon answers when its request to the session timed out or the
		// session stopped before it confirmed the reset: it may have been done.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":{"code":"unavailable","message":"agentgate is stopping; retry later"}}`))
	}},
	{"failed (500)", 0, func(w http.ResponseWriter, r *http.Request) {
		// What the daemon answers when the session did not answer in time (the reset may
		// be made yet), or the session's state could not be read after the reset.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		w.Write([]byte(`{"error":{"code":"internal","message":"internal error"}}`))
	}},
}

// setResetTimeout sets resetTimeout to d (when d is not 0) for the rest of the test.
func setResetTimeout(t *testing.T, d time.Duration) {
	t.Helper()
	if d == 0 {
		return
	}
	old := resetTimeout
	resetTimeout = d
	t.Cleanup(func() { resetTimeout = old })
}

// testRun is the run of the daemons the tests stand in for.
const testRun = "r_0123456789abcdef"

// daemonServer stands in for a daemon of run run, at the process edge: its answers name the
// run, it answers GET /healthz, and it hands every other request to h.
func daemonServer(t *testing.T, run string, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(httpplatform.RunHeader, run)
		if r.URL.Path == "/healthz" {
			w.Write([]byte(`{"status":"ok"}`))
			return
		}
		h(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// MustRecordDaemon records s as the address of the daemon of run in dir, as the daemon does.
func MustRecordDaemon(t *testing.T, dir string, s *httptest.Server, run string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, supervisor.RunFile), []byte(run+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, supervisor.AddrFile), []byte(s.Listener.Addr().String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// countingServer stands in for a daemon of run run that answers every reset 200 with a
// session, and counts the resets.
func countingServer(t *testing.T, run string) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	s := daemonServer(t, run, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"session_key":"` + keyA + `","session_id":"new","prev_session_id":"sa2"}`))
	})
	return s, &n
}

// TestSessionsResetThroughAMemberWhoseAnswerIsLost: a member that took the reset request but
// whose answer is lost (it timed out, its connection broke, it answered 503) may have reset
// the session: the command says so and asks no other member, nor resets in the store, which
// would end the session that reset began.
func TestSessionsResetThroughAMemberWhoseAnswerIsLost(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	register := clusterOfMembers(t)
	for _, c := range takenResets {
		t.Run(c.name, func(t *testing.T) {
			other, asked := countingServer(t, testRun)
			taken := daemonServer(t, testRun, c.handler)
			t.Cleanup(taken.Close)
			register(t, taken, other) // taken is asked first
			setResetTimeout(t, c.timeout)
			out, _, err := runSessions(t, "reset", "--data-dir", t.TempDir(), keyA)
			if n := asked.Load(); n != 0 {
				t.Errorf("the other member was asked to reset too (%d requests; stdout %q)", n, out)
			}
			want := "may have reset the session: see agentgate sessions show " + keyA + " before you try again"
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("reset: %v, want an error that says %q", err, want)
			}
		})
	}
}

// TestSessionsResetThroughTheDaemonWhoseAnswerIsLost: a daemon that took the reset request but
// whose answer is lost may have reset the session: the command does not ask the operator to
// reset again through it.
func TestSessionsResetThroughTheDaemonWhoseAnswerIsLost(t *testing.T) {
	for _, c := range takenResets {
		t.Run(c.name, func(t *testing.T) {
			dir, _ := MustSeedLockedSessions(t) // the daemon holds the database
			taken := daemonServer(t, testRun, c.handler)
			defer taken.Close()
			MustRecordDaemon(t, dir, taken, testRun)
			setResetTimeout(t, c.timeout)
			_, _, err := runSessions(t, "reset", "--data-dir", dir, keyA)
			want := "may have reset the session: see agentgate sessions show " + keyA + " before you try again"
			if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "curl") {
				t.Errorf("reset: %v, want an error that says %q, and no curl to reset again", err, want)
			}
		})
	}
}

// TestResetAndRequeueThroughAStoppingDaemon: a stopping daemon's 503 draining (the request
// reached no session) is a refusal that changed nothing, and reset and requeue say so, and when
// to run them again. Before, it read as a lost answer: "the daemon … took the request, but the
// answer was lost (503 Service Unavailable: agentgate is stopping; retry later): it may have
// reset the session" (a walkthrough).
func TestResetAndRequeueThroughAStoppingDaemon(t *testing.T) {
	dir, _ := MustSeedLockedSessions(t) // the daemon holds the database
	stopping := daemonServer(t, testRun, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":{"code":"draining","message":"agentgate is stopping and took no new work: nothing was changed; retry at its next start"}}`))
	})
	MustRecordDaemon(t, dir, stopping, testRun)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"reset", "--data-dir", dir, keyA}, "reset " + keyA + ": the daemon at " + stopping.Listener.Addr().String() +
			" is stopping and did not take the request: nothing was changed; run it again once the daemon has restarted, or with it stopped"},
		{[]string{"requeue", "--data-dir", dir, keyA, "m1"}, "requeue m1 of " + keyA + ": the daemon at " + stopping.Listener.Addr().String() +
			" is stopping and did not take the request: nothing was changed; run it again once the daemon has restarted"},
	} {
		_, _, err := runSessions(t, c.args...)
		if err == nil || err.Error() != c.want || strings.Contains(err.Error(), "may have") {
			t.Errorf("sessions %s through a stopping daemon: %v\nwant %q", c.args[0], err, c.want)
		}
	}
}

// TestResetAndRequeueThroughAStartingDaemon: a daemon that is starting answers before it serves
// (/healthz 200, every other route 503 starting: supervisor.Start, ServeStarting), and took
// nothing: reset and requeue say it is starting and to run them again once it answers, never
// that it may have reset the session (a 503 other than draining reads as a lost answer).
func TestResetAndRequeueThroughAStartingDaemon(t *testing.T) {
	dir, _ := MustSeedLockedSessions(t) // the daemon holds the database
	starting := daemonServer(t, testRun, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":{"code":"starting","message":"agentgate is starting (opening the store); send the request again once it serves: GET /readyz says ready"}}`))
	})
	MustRecordDaemon(t, dir, starting, testRun)
	addr := starting.Listener.Addr().String()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"reset", "--data-dir", dir, keyA}, "reset through it when it answers"},
		{[]string{"requeue", "--data-dir", dir, keyA, "m1"}, "requeue through it when it answers"},
	} {
		_, _, err := runSessions(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), "at "+addr+": the daemon is starting and took nothing") ||
			!strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "may have") {
			t.Errorf("sessions %s through a starting daemon: %v\nwant it to say the daemon is starting and took nothing, and %q", c.args[0], err, c.want)
		}
	}
}

// TestSessionsResetFollowsNoRedirect: the command posts the reset, with the bearer token, to
// the daemon's own address only. A redirect (from whatever listens there now) is not followed:
// neither to another port of the host (which would get the token: Go's client keeps the
// Authorization header for the same host name), nor as a GET (301, 302) that another server
// answers 200 with a session, which the command took for a reset made.
func TestSessionsResetFollowsNoRedirect(t *testing.T) {
	for _, code := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			dir, _ := MustSeedLockedSessions(t) // the daemon holds the database
			var tokens atomic.Int32
			elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Authorization") != "" {
					tokens.Add(1)
				}
				w.Header().Set("Content-Type", "application/json")
				w.Write([]byte(`{"session_key":"` + keyA + `","session_id":"sa2"}`))
			}))
			defer elsewhere.Close()
			redirector := daemonServer(t, testRun, func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, elsewhere.URL+r.URL.Path, code)
			})
			defer redirector.Close()
			MustRecordDaemon(t, dir, redirector, testRun)
			t.Setenv("AGENTGATE_HTTP_TOKEN_ENV", "ADMIN_TOKEN")
			t.Setenv("ADMIN_TOKEN", "s3cret")
			out, _, err := runSessions(t, "reset", "--data-dir", dir, keyA)
			if n := tokens.Load(); n != 0 {
				t.Errorf("the token went to the redirect's target (%d requests)", n)
			}
			if want := "answered " + strconv.Itoa(code) + " " + http.StatusText(code) + " (a redirect to "; err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("reset: %v (stdout %q), want an error that says %q", err, out, want)
			}
		})
	}
}

// TestSessionsResetAsksNoAddressTheDaemonDidNotRecord: while the database is locked but the
// data directory records no daemon address (the lock holder runs on another host, as a
// single daemon on PostgreSQL may, or it is starting, or it is another admin command), the
// configured address names no process known to hold the database (perhaps another
// deployment's daemon on this host): the command does not post the reset, with the token,
// there; it prints the curl to use, as before.
func TestSessionsResetAsksNoAddressTheDaemonDidNotRecord(t *testing.T) {
	dir, _ := MustSeedLockedSessions(t)        // the daemon holds the database
	other, asked := countingServer(t, testRun) // another deployment's daemon at the configured address
	addr := other.Listener.Addr().String()
	_, _, err := runSessions(t, "reset", "--data-dir", dir, "--http-addr", addr, keyA)
	if n := asked.Load(); n != 0 {
		t.Errorf("the daemon at the configured address %s was asked to reset (%d requests)", addr, n)
	}
	want := "the daemon is running on this data directory, but it records no address in " + dir +
		" (it starts, or it runs on another host); reset through it: curl -X POST http://" + addr + "/v1/sessions/" + keyA + "/reset"
	if err == nil || err.Error() != want {
		t.Errorf("reset: %v, want %q", err, want)
	}
}

// TestSessionsResetNotFound: only the daemon's own "no such session" is one; a 404 of whatever
// else listens at the address (no such route) is named as it is.
func TestSessionsResetNotFound(t *testing.T) {
	dir, _ := MustSeedLockedSessions(t) // the daemon holds the database
	other := daemonServer(t, testRun, http.NotFound)
	defer other.Close()
	MustRecordDaemon(t, dir, other, testRun)
	_, _, err := runSessions(t, "reset", "--data-dir", dir, keyA)
	want := "reset " + keyA + ": the daemon at " + other.Listener.Addr().String() + " does not know the reset route (it answered 404 Not Found: 404 page not found): " +
		"it is likely an agentgate older than this command; upgrade it, then run the command again (nothing was changed)"
	if err == nil || err.Error() != want {
		t.Errorf("reset: %v, want %q", err, want)
	}
}

// TestResetAndRequeueThroughADaemonWithoutTheRoute: a daemon's 404 that is no refusal of the
// key or the message, but its answer to a route it does not have (one older than the command,
// during a rolling upgrade), is said so, with what to do: net/http's plain "404 page not
// found", any body that is not agentgate's JSON error, and agentgate's own 404 not_found "no
// such route". Before, a requeue read "no such route" as a message the key does not have
// ("sessions requeue: no such route, so nothing was requeued; agentgate sessions show KEY lists
// the key's last messages with their ids, …"), and the plain 404 was printed raw.
func TestResetAndRequeueThroughADaemonWithoutTheRoute(t *testing.T) {
	for _, tc := range []struct {
		name     string
		handler  http.HandlerFunc
		answered string
	}{
		{"net/http's 404", http.NotFound, "404 Not Found: 404 page not found"},
		{"no body", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNotFound) }, "404 Not Found with no body"},
		{"JSON of another shape", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"message":"not here"}`))
		}, `404 Not Found: {"message":"not here"}`},
		{"agentgate's no such route", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"error":{"code":"not_found","message":"no such route"}}`))
		}, "404 Not Found: no such route"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, _ := MustSeedLockedSessions(t) // the daemon holds the database
			d := daemonServer(t, testRun, tc.handler)
			MustRecordDaemon(t, dir, d, testRun)
			addr := d.Listener.Addr().String()
			say := func(route string) string {
				return "the daemon at " + addr + " does not know the " + route + " route (it answered " + tc.answered + "): " +
					"it is likely an agentgate older than this command; upgrade it, then run the command again (nothing was changed)"
			}
			if _, _, err := runSessions(t, "reset", "--data-dir", dir, keyA); err == nil || err.Error() != "reset "+keyA+": "+say("reset") {
				t.Errorf("reset: %v, want %q", err, "reset "+keyA+": "+say("reset"))
			}
			for _, args := range [][]string{{"requeue", keyA, "m1"}, {"requeue", "--json", keyA, "m1"}} {
				out, _, err := runSessions(t, append(args, "--data-dir", dir)...)
				if want := "requeue m1 of " + keyA + ": " + say("requeue"); err == nil || err.Error() != want || out != "" {
					t.Errorf("sessions %q: %v (stdout %q), want %q and nothing on stdout", args, err, out, want)
				}
			}
		})
	}
}

// TestResetAndRequeueReadNoSessionByItsCode: a daemon's 404 no_session is a key no session has,
// whatever its message; an older daemon's (one still running during a rolling upgrade) 404
// not_found "no such session" is one too, by its text as before, and for a requeue its
// not_found "…: it holds no stored session"; any other 404 not_found is not (for a requeue, a
// message the key does not have). Before, only the
// text told it, and a daemon that worded it otherwise had its key's refusal printed raw.
func TestResetAndRequeueReadNoSessionByItsCode(t *testing.T) {
	longNoStored := "key " + keyA + " has no message m1" + strings.Repeat("1", 300) + ": it holds no stored session"
	const (
		noSessionReset   = "sessions reset: the key " + keyA + " has no session, so nothing was reset; agentgate sessions list prints the keys that have one"
		noSessionRequeue = "sessions requeue: the key " + keyA + " has no session, so nothing was requeued; agentgate sessions list prints the keys that have one"
	)
	for _, tc := range []struct {
		name, code, msg        string
		wantReset, wantRequeue string
	}{
		{"no_session", "no_session", "no such session", noSessionReset, noSessionRequeue},
		{"no_session worded otherwise", "no_session", "the key has none", noSessionReset, noSessionRequeue},
		{"an older daemon's not_found", "not_found", "no such session", noSessionReset, noSessionRequeue},
		// An older daemon's requeue of a key that routes to no stored session (it was pruned):
		// the key has no session, as its GET says (before, a message the key lacks).
		{"an older daemon's no stored session", "not_found", "key " + keyA + " has no message m1: it holds no stored session",
			"reset " + keyA + ": the daemon at ADDR answered 404 Not Found: key " + keyA + " has no message m1: it holds no stored session",
			noSessionRequeue},
		// Read whole, though printed cut short: a long key and message id put its end past
		// the 300 bytes an answer is printed with (before, read as a message the key lacks).
		{"an older daemon's long no stored session", "not_found", longNoStored,
			"reset " + keyA + ": the daemon at ADDR answered 404 Not Found: " + printable(longNoStored),
			noSessionRequeue},
		{"another not_found", "not_found", "key " + keyA + " has no message m1: not in its current session sa2, nor in an ended one still stored",
			"reset " + keyA + ": the daemon at ADDR answered 404 Not Found: key " + keyA + " has no message m1: not in its current session sa2, nor in an ended one still stored",
			"sessions requeue: key " + keyA + " has no message m1: not in its current session sa2, nor in an ended one still stored, so nothing was requeued; " +
				"agentgate sessions show " + keyA + " lists the key's last messages with their ids, agentgate sessions quarantined the quarantined ones, which a requeue runs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, _ := MustSeedLockedSessions(t) // the daemon holds the database
			d := daemonServer(t, testRun, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
				fmt.Fprintf(w, `{"error":{"code":%q,"message":%q}}`, tc.code, tc.msg)
			})
			MustRecordDaemon(t, dir, d, testRun)
			addr := d.Listener.Addr().String()
			if _, _, err := runSessions(t, "reset", "--data-dir", dir, keyA); err == nil ||
				err.Error() != strings.ReplaceAll(tc.wantReset, "ADDR", addr) {
				t.Errorf("reset: %v, want %q", err, tc.wantReset)
			}
			if _, _, err := runSessions(t, "requeue", "--data-dir", dir, keyA, "m1"); err == nil || err.Error() != tc.wantRequeue {
				t.Errorf("requeue: %v, want %q", err, tc.wantRequeue)
			}
		})
	}
}

// TestSessionsResetSkipsALoopbackMemberOfAnotherHost: a member of a cluster on one host
// registers its loopback address; the command run on another host (with the database's DSN)
// does not ask its own loopback there, where another process listens (perhaps a daemon of
// another deployment, which would reset its own session of the key with the token), and says
// why it reset in the store.
func TestSessionsResetSkipsALoopbackMemberOfAnotherHost(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	st, err := postgres.Open(ctx, dsn, postgres.Options{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	local, asked := countingServer(t, testRun) // this host's process at the member's loopback address
	m := postgres.Member{ID: "m1", Host: "127.0.0.1", Port: 6340, Node: "another-host/r_0123456789abcdef",
		HTTP: local.Listener.Addr().String()}
	if _, err := st.Heartbeat(ctx, "agentgate", m, time.Hour); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AGENTGATE_STORE_DRIVER", "postgres")
	t.Setenv("AGENTGATE_STORE_DSN", dsn)
	t.Setenv("AGENTGATE_CLUSTER_ENABLED", "true")
	_, errOut, _ := runSessions(t, "reset", "--data-dir", t.TempDir(), keyA)
	if n := asked.Load(); n != 0 {
		t.Errorf("this host's process at %s was asked to reset (%d requests)", m.HTTP, n)
	}
	if want := m.HTTP + " is another-host's loopback"; !strings.Contains(errOut, want) {
		t.Errorf("reset stderr %q, want it to say %q", errOut, want)
	}
}

// TestSessionsResetTakesOnlyASessionOfTheKey: a 200 that carries no session of the key (from
// whatever listens at the address) is no reset made.
func TestSessionsResetTakesOnlyASessionOfTheKey(t *testing.T) {
	for name, body := range map[string]string{
		"empty object":   `{}`,
		"another key":    `{"session_key":"agent:main:http:dm:bob","session_id":"sb1","prev_session_id":"sb0"}`,
		"no session id":  `{"session_key":"` + keyA + `"}`,
		"a JSON array":   `[]`,
		"a JSON literal": `null`,
	} {
		t.Run(name, func(t *testing.T) {
			dir, _ := MustSeedLockedSessions(t) // the daemon holds the database
			other := daemonServer(t, testRun, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Write([]byte(body))
			})
			defer other.Close()
			MustRecordDaemon(t, dir, other, testRun)
			out, _, err := runSessions(t, "reset", "--data-dir", dir, keyA)
			if want := "answered 200 OK without a session of " + keyA; err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("reset: %v (stdout %q), want an error that says %q", err, out, want)
			}
		})
	}
}

// TestSessionsResetTokenOfAFile: a token read from a file with Windows line ends ($(cat file)
// keeps the \r) is sent without its surrounding white space, as the daemon reads a bearer
// token; one with a control character inside is named as the variable's fault, not as a
// daemon that does not answer.
func TestSessionsResetTokenOfAFile(t *testing.T) {
	dir, _ := MustSeedLockedSessions(t) // the daemon holds the database
	d := daemonServer(t, testRun, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":{"code":"unauthorized","message":"missing or invalid bearer token"}}`))
			return
		}
		w.Write([]byte(`{"session_key":"` + keyA + `","session_id":"new","prev_session_id":"sa2"}`))
	})
	defer d.Close()
	MustRecordDaemon(t, dir, d, testRun)
	t.Setenv("AGENTGATE_HTTP_TOKEN_ENV", "ADMIN_TOKEN")
	t.Setenv("ADMIN_TOKEN", "s3cret\r")
	if _, _, err := runSessions(t, "reset", "--data-dir", dir, keyA); err != nil {
		t.Errorf("reset with a token that ends in \\r: %v", err)
	}
	t.Setenv("ADMIN_TOKEN", "s3\x01cret")
	_, _, err := runSessions(t, "reset", "--data-dir", dir, keyA)
	if want := "reset " + keyA + ": ADMIN_TOKEN (http.token_env) holds a control character, which a bearer token cannot carry"; err == nil || err.Error() != want {
		t.Errorf("reset with a control character in the token: %v, want %q", err, want)
	}
}

// TestSessionsResetQuotesAHostileAnswer: the body of an error answer that is not the daemon's
// JSON is quoted in the command's error, short, and without the terminal control sequences
// it may carry.
func TestSessionsResetQuotesAHostileAnswer(t *testing.T) {
	dir, _ := MustSeedLockedSessions(t) // the daemon holds the database
	other := daemonServer(t, testRun, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
		w.Write([]byte("\x1b[2J\x1b]0;pwned\x07" + strings.Repeat("A", 512<<10)))
	})
	defer other.Close()
	MustRecordDaemon(t, dir, other, testRun)
	_, _, err := runSessions(t, "reset", "--data-dir", dir, keyA)
	if err == nil || len(err.Error()) > 500 || strings.ContainsRune(err.Error(), '\x1b') || !strings.Contains(err.Error(), "answered 418 I'm a teapot") {
		t.Errorf("reset: an error of %d bytes: %.300q…, want one under 500 bytes, that names the 418 and carries no escape", len(fmt.Sprint(err)), fmt.Sprint(err))
	}
}

// strangerAt stands in for a process that took a daemon's address since it recorded it: a
// daemon of another run (run), or no agentgate (run ""). It counts the requests that carry a
// token and the resets it is asked.
func strangerAt(t *testing.T, run string) (s *httptest.Server, tokens, resets *atomic.Int32) {
	t.Helper()
	tokens, resets = new(atomic.Int32), new(atomic.Int32)
	s = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if run != "" {
			w.Header().Set(httpplatform.RunHeader, run)
		}
		if r.Header.Get("Authorization") != "" {
			tokens.Add(1)
		}
		if strings.HasSuffix(r.URL.Path, "/reset") {
			resets.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"session_key":"` + keyA + `","session_id":"new","prev_session_id":"sa2","status":"ok"}`))
	}))
	t.Cleanup(s.Close)
	return s, tokens, resets
}

// TestSessionsResetAsksOnlyTheRunThatRecordedTheAddress: the daemon's record names its run;
// the process at the recorded address is asked which run it is, without the token, and one of
// another run (the record of a daemon killed with -9 names an address another deployment's
// daemon may have taken since), or no agentgate, is neither sent the token nor asked to reset.
func TestSessionsResetAsksOnlyTheRunThatRecordedTheAddress(t *testing.T) {
	for _, c := range []struct{ name, run, want string }{
		{"another run", "r_fedcba9876543210", "is agentgate run r_fedcba9876543210, not run " + testRun + ", which recorded that address, so it is not asked"},
		{"no agentgate", "", "does not say which agentgate run it is (it answered 200 OK), so it is not run " + testRun + ", which recorded that address, and is not asked"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, _ := MustSeedLockedSessions(t) // the daemon holds the database
			s, tokens, resets := strangerAt(t, c.run)
			MustRecordDaemon(t, dir, s, testRun)
			t.Setenv("AGENTGATE_HTTP_TOKEN_ENV", "ADMIN_TOKEN")
			t.Setenv("ADMIN_TOKEN", "s3cret")
			_, _, err := runSessions(t, "reset", "--data-dir", dir, keyA)
			if n, m := tokens.Load(), resets.Load(); n != 0 || m != 0 {
				t.Errorf("the process at the address got the token %d times and %d resets, want none", n, m)
			}
			// The curl names no address: the recorded one is another process's.
			wantCurl := "reset through it where it listens (its log says: listening on ADDRESS): " +
				`curl -X POST -H "Authorization: Bearer $ADMIN_TOKEN" http://ADDRESS/v1/sessions/` + keyA + "/reset"
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasSuffix(err.Error(), wantCurl) {
				t.Errorf("reset: %v, want an error that says %q, and ends %q", err, c.want, wantCurl)
			}
		})
	}
}

// TestSessionsResetAsksOnlyTheRunOfAMember: a member's registration names its run (its node);
// a process of another run at its address (it took the port after the member died, within its
// ttl) is not asked, and the command says why it reset in the store.
func TestSessionsResetAsksOnlyTheRunOfAMember(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	st, err := postgres.Open(ctx, dsn, postgres.Options{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s, tokens, resets := strangerAt(t, "r_fedcba9876543210")
	here, _ := os.Hostname()
	m := postgres.Member{ID: "m1", Host: "127.0.0.1", Port: 6340, Node: here + "/" + testRun, HTTP: s.Listener.Addr().String()}
	if _, err := st.Heartbeat(ctx, "agentgate", m, time.Hour); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AGENTGATE_STORE_DRIVER", "postgres")
	t.Setenv("AGENTGATE_STORE_DSN", dsn)
	t.Setenv("AGENTGATE_CLUSTER_ENABLED", "true")
	t.Setenv("AGENTGATE_HTTP_TOKEN_ENV", "ADMIN_TOKEN")
	t.Setenv("ADMIN_TOKEN", "s3cret")
	_, errOut, _ := runSessions(t, "reset", "--data-dir", t.TempDir(), keyA)
	if n, r := tokens.Load(), resets.Load(); n != 0 || r != 0 {
		t.Errorf("the process at %s got the token %d times and %d resets, want none", m.HTTP, n, r)
	}
	if want := "is agentgate run r_fedcba9876543210, not run " + testRun; !strings.Contains(errOut, want) {
		t.Errorf("reset stderr %q, want it to say %q", errOut, want)
	}
}

// TestSessionsResetThroughTheDaemonOfAnEndedSession: a daemon that answers the reset with the
// key's session already ended (an idle or daily reset, and no message since: the daemon leaves
// it as it is) is reported as the offline reset reports it, "already ended", not as a reset.
func TestSessionsResetThroughTheDaemonOfAnEndedSession(t *testing.T) {
	dir, _ := MustSeedLockedSessions(t) // the daemon holds the database
	d := daemonServer(t, testRun, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"session_key":"` + keyA + `","session_id":"sa1","ended_at":"2026-11-30T10:00:00Z","end_reason":"idle"}`))
	})
	defer d.Close()
	MustRecordDaemon(t, dir, d, testRun)
	out, _, err := runSessions(t, "reset", "--data-dir", dir, keyA)
	if want := "session sa1 of " + keyA + " already ended (idle)\n"; err != nil || out != want {
		t.Errorf("reset = %q, %v; want %q", out, err, want)
	}
}

// TestSessionsResetThroughTheDaemonOfAnEndedSessionWithAPredecessor: the ended session the
// daemon answers with may itself follow an earlier one (it began with /new, or after an
// earlier idle reset: its prev_session_id is set). That is still "already ended"; before, the
// command reported that the reset ended the predecessor and that the ended session follows it.
func TestSessionsResetThroughTheDaemonOfAnEndedSessionWithAPredecessor(t *testing.T) {
	dir, _ := MustSeedLockedSessions(t) // the daemon holds the database
	d := daemonServer(t, testRun, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"session_key":"` + keyA + `","session_id":"sa2","prev_session_id":"sa1","ended_at":"2026-11-30T10:00:00Z","end_reason":"idle"}`))
	})
	defer d.Close()
	MustRecordDaemon(t, dir, d, testRun)
	out, _, err := runSessions(t, "reset", "--data-dir", dir, keyA)
	if want := "session sa2 of " + keyA + " already ended (idle)\n"; err != nil || out != want {
		t.Errorf("reset = %q, %v; want %q", out, err, want)
	}
}

// TestSessionsResetThroughAMemberNamesTheMember: in cluster mode the command asks a member of
// the cluster, not a daemon on its data directory, and says so, in what it reports and in its
// errors, and a requeue's --json in its member field. Before, both said "the daemon at …".
func TestSessionsResetThroughAMemberNamesTheMember(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	members := clusterOfMembers(t)
	register := func(t *testing.T, s *httptest.Server) string {
		t.Helper()
		members(t, s)
		return s.Listener.Addr().String()
	}

	t.Run("reset", func(t *testing.T) {
		s, _ := countingServer(t, testRun)
		addr := register(t, s)
		out, errOut, err := runSessions(t, "reset", "--data-dir", t.TempDir(), keyA)
		if want := "ended session sa2 of " + keyA + " (reset_command) through the member at " + addr + "; session new follows it\n"; err != nil || out != want {
			t.Errorf("reset = %q, %v (stderr %q); want %q", out, err, errOut, want)
		}
	})
	t.Run("refused", func(t *testing.T) {
		s := daemonServer(t, testRun, http.NotFound)
		addr := register(t, s)
		_, _, err := runSessions(t, "reset", "--data-dir", t.TempDir(), keyA)
		if want := "reset " + keyA + ": the member at " + addr + " does not know the reset route (it answered 404 Not Found: 404 page not found): " +
			"it is likely an agentgate older than this command; upgrade it, then run the command again (nothing was changed)"; err == nil || err.Error() != want {
			t.Errorf("reset: %v, want %q", err, want)
		}
	})
	t.Run("requeue --json", func(t *testing.T) {
		// A requeue through a member says so in its JSON too.
		s := daemonServer(t, testRun, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprintf(w, `{"message_id":"m1","session_key":%q,"session_id":"sa2","disposition":"queued","queue_depth":1}`, keyA)
		})
		addr := register(t, s)
		out, errOut, err := runSessions(t, "requeue", "--json", "--data-dir", t.TempDir(), keyA, "m1")
		want := fmt.Sprintf("{\n  \"session_key\": %q,\n  \"message_id\": \"m1\",\n  \"session_id\": \"sa2\",\n  \"disposition\": \"queued\",\n"+
			"  \"queue_depth\": 1,\n  \"address\": %q,\n  \"member\": true\n}\n", keyA, addr)
		if err != nil || out != want {
			t.Errorf("requeue --json = %q, %v (stderr %q); want %q", out, err, errOut, want)
		}
	})
}

// clusterOfMembers opens a new PostgreSQL database, points the command at it in cluster mode,
// and returns a register that registers the servers given as live members of this host, the
// first asked first (the member renewed last is asked first), each leaving at the end of the
// test that registered it.
func clusterOfMembers(t *testing.T) (register func(t *testing.T, servers ...*httptest.Server)) {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	st, err := postgres.Open(ctx, dsn, postgres.Options{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	t.Setenv("AGENTGATE_STORE_DRIVER", "postgres")
	t.Setenv("AGENTGATE_STORE_DSN", dsn)
	t.Setenv("AGENTGATE_CLUSTER_ENABLED", "true")
	here, _ := os.Hostname() // the members run on this host
	return func(t *testing.T, servers ...*httptest.Server) {
		t.Helper()
		for i := len(servers) - 1; i >= 0; i-- {
			m := postgres.Member{ID: t.Name() + "/" + strconv.Itoa(i), Host: "127.0.0.1", Port: 6340 + i,
				Node: here + "/" + testRun, HTTP: servers[i].Listener.Addr().String()}
			if _, err := st.Heartbeat(ctx, "agentgate", m, time.Hour); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Leave(ctx, "agentgate", m.ID) })
		}
	}
}

// olderMember stands in for a member older than the command (one still running during a
// rolling upgrade): it answers the admin routes with h, a 404 of a route it does not have, and
// counts the requests.
func olderMember(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	return daemonServer(t, testRun, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		h(w, r)
	}), &n
}

// noSuchRoute is agentgate's own answer to a route it does not have.
func noSuchRoute(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusNotFound)
	w.Write([]byte(`{"error":{"code":"not_found","message":"no such route"}}`))
}

// outdatedMessage is a member's message of a 503 member_outdated (platforms.OutdatedMemberError).
const outdatedMessage = "the cluster member that holds the session (10.0.0.7:6340, node b/r_1) runs an older agentgate (v1.8.0 go1.26.8), " +
	"which does not know this request (Forward field 11): nothing was done; upgrade it (finish the rolling upgrade) and try again"

// upgradedMember stands in for a member that knows the admin routes: it resets the session
// (200) and queues a requeued message (202), and counts the requests.
func upgradedMember(t *testing.T) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	return daemonServer(t, testRun, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/requeue") {
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprintf(w, `{"message_id":"m1","session_key":%q,"session_id":"sa2","disposition":"queued","queue_depth":1}`, keyA)
			return
		}
		fmt.Fprintf(w, `{"session_key":%q,"session_id":"new","prev_session_id":"sa2"}`, keyA)
	}), &n
}

// TestResetAndRequeueThroughAMemberPastOneWithoutTheRoute: in cluster mode, a member that
// answers that it does not know the route (agentgate's 404 "no such route", or net/http's
// plain 404: a member older than the command, during a rolling upgrade) changed nothing, and
// the next member is asked: one already upgraded takes the request, and the command reports
// it as any reset or requeue through a member. Before, the first member's refusal ended the
// command with "it is likely an agentgate older than this command; upgrade it".
func TestResetAndRequeueThroughAMemberPastOneWithoutTheRoute(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	register := clusterOfMembers(t)
	for name, h := range map[string]http.HandlerFunc{"no such route": noSuchRoute, "net/http's 404": http.NotFound} {
		t.Run(name, func(t *testing.T) {
			older, refused := olderMember(t, h)
			upgraded, took := upgradedMember(t)
			register(t, older, upgraded)
			addr := upgraded.Listener.Addr().String()
			out, errOut, err := runSessions(t, "reset", "--data-dir", t.TempDir(), keyA)
			if want := "ended session sa2 of " + keyA + " (reset_command) through the member at " + addr + "; session new follows it\n"; err != nil || out != want || errOut != "" {
				t.Errorf("reset = %q, %v (stderr %q); want %q and nothing on stderr", out, err, errOut, want)
			}
			out, errOut, err = runSessions(t, "requeue", "--data-dir", t.TempDir(), keyA, "m1")
			if want := "requeued message m1 of " + keyA + " through the member at " + addr + ": queued (1 waiting), in session sa2; it runs as its sender's message\n"; err != nil || out != want || errOut != "" {
				t.Errorf("requeue = %q, %v (stderr %q); want %q and nothing on stderr", out, err, errOut, want)
			}
			out, errOut, err = runSessions(t, "requeue", "--json", "--data-dir", t.TempDir(), keyA, "m1")
			want := fmt.Sprintf("{\n  \"session_key\": %q,\n  \"message_id\": \"m1\",\n  \"session_id\": \"sa2\",\n  \"disposition\": \"queued\",\n"+
				"  \"queue_depth\": 1,\n  \"address\": %q,\n  \"member\": true\n}\n", keyA, addr)
			if err != nil || out != want {
				t.Errorf("requeue --json = %q, %v (stderr %q); want %q", out, err, errOut, want)
			}
			// The older member was asked first each time: its refusal was passed over.
			if n, m := refused.Load(), took.Load(); n != 3 || m != 3 {
				t.Errorf("the older member was asked %d times, the upgraded one %d; want 3 and 3", n, m)
			}
		})
	}
}

// TestResetAndRequeueThroughMembersThatAllLackTheRoute: when every member that answers does not
// know the route (and the others do not answer), the command ends as before, with what to do,
// now naming each member that refused so, and why the others did not take the request; nothing
// is reset in the store. Before, it named only the first member asked.
func TestResetAndRequeueThroughMembersThatAllLackTheRoute(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	register := clusterOfMembers(t)
	t.Run("two older members", func(t *testing.T) {
		first, asked1 := olderMember(t, noSuchRoute)
		second, asked2 := olderMember(t, http.NotFound)
		register(t, first, second)
		a1, a2 := first.Listener.Addr().String(), second.Listener.Addr().String()
		say := func(route string) string {
			return "the members at " + a1 + " (it answered 404 Not Found: no such route) and " + a2 + " (it answered 404 Not Found: 404 page not found) " +
				"do not know the " + route + " route: they are likely agentgates older than this command; upgrade them, then run the command again (nothing was changed)"
		}
		out, _, err := runSessions(t, "reset", "--data-dir", t.TempDir(), keyA)
		if want := "reset " + keyA + ": " + say("reset"); err == nil || err.Error() != want || out != "" {
			t.Errorf("reset: %v (stdout %q), want %q and nothing on stdout", err, out, want)
		}
		for _, args := range [][]string{{"requeue", keyA, "m1"}, {"requeue", "--json", keyA, "m1"}} {
			out, _, err := runSessions(t, append(args, "--data-dir", t.TempDir())...)
			if want := "requeue m1 of " + keyA + ": " + say("requeue"); err == nil || err.Error() != want || out != "" {
				t.Errorf("sessions %q: %v (stdout %q), want %q and nothing on stdout", args, err, out, want)
			}
		}
		if n, m := asked1.Load(), asked2.Load(); n != 3 || m != 3 {
			t.Errorf("the members were asked %d and %d times, want 3 each", n, m)
		}
	})
	t.Run("one older, one silent", func(t *testing.T) {
		older, _ := olderMember(t, noSuchRoute)
		silent := daemonServer(t, testRun, http.NotFound)
		register(t, silent, older)
		silent.Close() // it does not answer: no connection is made
		a1, a2 := silent.Listener.Addr().String(), older.Listener.Addr().String()
		out, errOut, err := runSessions(t, "reset", "--data-dir", t.TempDir(), keyA)
		wantStart := "reset " + keyA + ": the member at " + a2 + " does not know the reset route (it answered 404 Not Found: no such route): " +
			"it is likely an agentgate older than this command; upgrade it, then run the command again (nothing was changed; no other member took the request: no answer at " + a1 + " ("
		if err == nil || !strings.HasPrefix(err.Error(), wantStart) || !strings.HasSuffix(err.Error(), "))") || out != "" || errOut != "" {
			t.Errorf("reset: %v (stdout %q, stderr %q), want an error that begins %q, and nothing else printed (no reset in the store)", err, out, errOut, wantStart)
		}
		_, _, err = runSessions(t, "requeue", "--data-dir", t.TempDir(), keyA, "m1")
		wantStart = "requeue m1 of " + keyA + ": the member at " + a2 + " does not know the requeue route (it answered 404 Not Found: no such route): " +
			"it is likely an agentgate older than this command; upgrade it, then run the command again (nothing was changed; no other member took the request: no answer at " + a1 + " ("
		if err == nil || !strings.HasPrefix(err.Error(), wantStart) {
			t.Errorf("requeue: %v, want an error that begins %q", err, wantStart)
		}
	})
}

// TestResetAndRequeueThroughAMemberThatRefuses: a member that knows the route but refuses the
// request (a key no session has, a message that is not quarantined, 503 member_outdated: the
// member holding the session runs an older agentgate) answered for the cluster: the command
// ends with its refusal and asks no other member, as before; only a route it does not know
// sends the command on. A member_outdated is said as such, nothing changed; before, that member
// gave no answer, and the command said the answer was lost ("it may have reset the session").
func TestResetAndRequeueThroughAMemberThatRefuses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	register := clusterOfMembers(t)
	for _, tc := range []struct {
		name, args string
		status     int
		code, msg  string
		want       string
	}{
		{"reset no_session", "reset", 404, "no_session", "no such session",
			"sessions reset: the key " + keyA + " has no session, so nothing was reset; agentgate sessions list prints the keys that have one"},
		{"requeue no_session", "requeue", 404, "no_session", "no such session",
			"sessions requeue: the key " + keyA + " has no session, so nothing was requeued; agentgate sessions list prints the keys that have one"},
		{"requeue not_found", "requeue", 404, "not_found", "key " + keyA + " has no message m1",
			"sessions requeue: key " + keyA + " has no message m1, so nothing was requeued; agentgate sessions show " + keyA +
				" lists the key's last messages with their ids, agentgate sessions quarantined the quarantined ones, which a requeue runs"},
		{"requeue not_quarantined", "requeue", 409, "not_quarantined", "message m1 is not quarantined",
			"sessions requeue: message m1 is not quarantined, so nothing was requeued; agentgate sessions show " + keyA +
				" lists the key's last messages with their status, agentgate sessions quarantined the quarantined ones, which a requeue runs"},
		// The member holding the session runs an older agentgate, which did not know the
		// request: every member hands it there, and nothing was changed (not "it may have …").
		{"reset member_outdated", "reset", 503, "member_outdated", outdatedMessage,
			"reset " + keyA + ": the member holding the session runs an older agentgate; upgrade it (nothing was changed): the member at ADDR said: " + outdatedMessage},
		{"requeue member_outdated", "requeue", 503, "member_outdated", outdatedMessage,
			"requeue m1 of " + keyA + ": the member holding the session runs an older agentgate; upgrade it (nothing was changed): the member at ADDR said: " + outdatedMessage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refusing := daemonServer(t, testRun, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				fmt.Fprintf(w, `{"error":{"code":%q,"message":%q}}`, tc.code, tc.msg)
			})
			other, asked := upgradedMember(t)
			register(t, refusing, other)
			args := []string{tc.args, "--data-dir", t.TempDir(), keyA}
			if tc.args == "requeue" {
				args = append(args, "m1")
			}
			out, _, err := runSessions(t, args...)
			want := strings.ReplaceAll(tc.want, "ADDR", refusing.Listener.Addr().String())
			if err == nil || err.Error() != want || out != "" {
				t.Errorf("sessions %s: %v (stdout %q), want %q", tc.args, err, out, want)
			}
			if n := asked.Load(); n != 0 {
				t.Errorf("the other member was asked too (%d requests)", n)
			}
		})
	}
}

// TestResetAndRequeueThroughMembersOfMixedAnswers: a member that does not know the route, then
// one that is stopping, are passed over, and the next member's answer is the command's: an
// answer lost ("it may have …", not the upgrade, and the reset not made in the store: that
// member may have made it) or a refusal; no member after it is asked, and stdout holds nothing,
// with --json too. Passing over the older member must not let a later member's answer be
// passed over as well, nor be said as the older member's.
func TestResetAndRequeueThroughMembersOfMixedAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	register := clusterOfMembers(t)
	for _, tc := range []struct {
		name        string
		status      int
		body        string
		reset, requ string // what the error says after the member's address
	}{
		{"answer lost", 500, `{"error":{"code":"internal","message":"the session did not answer in time"}}`,
			" took the request, but the answer was lost (500 Internal Server Error: the session did not answer in time): it may have reset the session: see agentgate sessions show " + keyA + " before you try again",
			" took the request, but the answer was lost (500 Internal Server Error: the session did not answer in time): it may have requeued the message: see agentgate sessions show " + keyA},
		{"refused", 409, `{"error":{"code":"not_quarantined","message":"message m1 is not quarantined"}}`, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			older, _ := olderMember(t, noSuchRoute)
			stopping := daemonServer(t, testRun, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusServiceUnavailable)
				w.Write([]byte(`{"error":{"code":"draining","message":"agentgate is stopping and took no new work: nothing was changed; retry at its next start"}}`))
			})
			var answered atomic.Int32
			answering := daemonServer(t, testRun, func(w http.ResponseWriter, r *http.Request) {
				answered.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				w.Write([]byte(tc.body))
			})
			last, asked := upgradedMember(t)
			register(t, older, stopping, answering, last)
			addr := answering.Listener.Addr().String()
			wantReset := "reset " + keyA + ": the member at " + addr + " answered 409 Conflict: message m1 is not quarantined"
			wantRequeue := "sessions requeue: message m1 is not quarantined, so nothing was requeued; agentgate sessions show " + keyA +
				" lists the key's last messages with their status, agentgate sessions quarantined the quarantined ones, which a requeue runs"
			if tc.reset != "" {
				wantReset, wantRequeue = "reset "+keyA+": the member at "+addr+tc.reset, "requeue m1 of "+keyA+": the member at "+addr+tc.requ
			}
			out, errOut, err := runSessions(t, "reset", "--data-dir", t.TempDir(), keyA)
			if err == nil || err.Error() != wantReset || out != "" || errOut != "" {
				t.Errorf("reset: %v (stdout %q, stderr %q), want %q and nothing printed (no reset in the store)", err, out, errOut, wantReset)
			}
			for _, args := range [][]string{{"requeue", keyA, "m1"}, {"requeue", "--json", keyA, "m1"}} {
				out, _, err := runSessions(t, append(args, "--data-dir", t.TempDir())...)
				if err == nil || err.Error() != wantRequeue || out != "" {
					t.Errorf("sessions %q: %v (stdout %q), want %q and nothing on stdout", args, err, out, wantRequeue)
				}
			}
			if n, m := answered.Load(), asked.Load(); n != 3 || m != 0 {
				t.Errorf("the member that answered was asked %d times, the one after it %d; want 3 and 0", n, m)
			}
		})
	}
}

// TestResetAndRequeueRefusedWithTheirAnswerCut: a 4xx is a refusal that changed nothing, also
// when its body is cut short: the daemon's server answers a request line over its 64 KiB of
// headers (a KEY pasted with a whole log line) 431 and closes the connection, which can reset
// it before the body is read. Before, the command read the lost body as a lost answer: "the
// daemon … took the request, but the answer was lost (431 Request Header Fields Too Large,
// then read: connection reset by peer): it may have reset the session" (found running the
// commands against a live daemon).
func TestResetAndRequeueRefusedWithTheirAnswerCut(t *testing.T) {
	dir, _ := MustSeedLockedSessions(t) // the daemon holds the database
	refusing := daemonServer(t, testRun, func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		buf.WriteString("HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n431 Request")
		buf.Flush()
		conn.Close()
	})
	MustRecordDaemon(t, dir, refusing, testRun)
	addr := refusing.Listener.Addr().String()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"reset", "--data-dir", dir, keyA}, "reset " + keyA + ": the daemon at " + addr +
			" answered 431 Request Header Fields Too Large (its message was cut short: unexpected EOF): nothing was changed"},
		{[]string{"requeue", "--data-dir", dir, keyA, "m1"}, "requeue m1 of " + keyA + ": the daemon at " + addr +
			" answered 431 Request Header Fields Too Large (its message was cut short: unexpected EOF): nothing was changed"},
	} {
		_, _, err := runSessions(t, c.args...)
		if err == nil || err.Error() != c.want {
			t.Errorf("sessions %s refused with its answer cut: %v\nwant %q", c.args[0], err, c.want)
		}
	}
}
