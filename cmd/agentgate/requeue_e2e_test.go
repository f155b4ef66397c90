package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/postgres"
	"github.com/agentgate/agentgate/persistence/sqlite"
)

// TestRequeueRunsAQuarantinedMessageAsItsSender: a message quarantined after three unclean
// stops (the crash loop of poisonCrashLoop) is requeued over HTTP once its cause is gone: the
// exec agent runs it with its original sender's identity (the admin request carries none), its
// reply comes back (?wait) and it ends done. A second requeue, and the requeue of a message
// that is not quarantined or not there, are refused with their codes; the command line's
// requeue of it too.
func TestRequeueRunsAQuarantinedMessageAsItsSender(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the daemon binary")
	}
	dataDir := t.TempDir()
	cure := filepath.Join(t.TempDir(), "cured")
	agent := `AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c, 'case "$AGENTGATE_MESSAGE_ID" in poison*) [ -e "$REQUEUE_CURE" ] || sleep 60; ` +
		`echo "answered $AGENTGATE_MESSAGE_ID as $AGENTGATE_USER_ID in $AGENTGATE_CHAT_TYPE $AGENTGATE_CHAT_ID";; *) echo "answered $AGENTGATE_MESSAGE_ID";; esac']`
	d := poisonCrashLoop(t, "agentgate restarted 3 times", func() *daemon {
		return MustServe(t, dataDir, "AGENTGATE_AGENT_BACKEND=exec", "AGENTGATE_SHUTDOWN_DRAIN_TIMEOUT=100ms", "REQUEUE_CURE="+cure, agent)
	})
	const key = "agent:main:http:dm:c1"
	requeue := func(key, id, query string) (int, map[string]any) {
		t.Helper()
		return post(t, d.base+"/v1/sessions/"+url.PathEscape(key)+"/messages/"+url.PathEscape(id)+"/requeue"+query, "", "")
	}
	refusals := []struct {
		key, id string
		status  int
		code    string
	}{
		{key, "m2", http.StatusConflict, "not_quarantined"}, // answered
		{key, "nope", http.StatusNotFound, "not_found"},
		{"agent:main:http:dm:nobody", "poison-1", http.StatusNotFound, "no_session"},
	}
	for _, tc := range refusals {
		status, body := requeue(tc.key, tc.id, "")
		e, _ := body["error"].(map[string]any)
		if status != tc.status || e["code"] != tc.code || e["message"] == "" {
			t.Errorf("requeue %s %s = %d %v, want %d %s with a message", tc.key, tc.id, status, body, tc.status, tc.code)
		}
	}

	if err := os.WriteFile(cure, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	status, res := requeue(key, "poison-1", "?wait=30s")
	replies, _ := res["replies"].([]any)
	if status != http.StatusOK || res["session_key"] != key || res["message_id"] != "poison-1" || res["disposition"] != "started" || len(replies) != 1 {
		t.Fatalf("requeue ?wait = %d %v, want 200, started, with its reply", status, res)
	}
	if got := replies[0].(map[string]any)["text"]; got != "answered poison-1 as u1 in dm c1" {
		t.Errorf("the requeued message's reply = %q, want its turn under its sender u1 of chat c1", got)
	}
	_, body := get(t, d.base+"/v1/sessions/"+key+"/transcript")
	if !strings.Contains(body, `"message_id":"poison-1","turn_id":"t_`) || strings.Count(body, `"status":"quarantined"`) != 0 {
		t.Errorf("transcript after the requeue does not show poison-1 done:\n%s", body)
	}
	status, res = requeue(key, "poison-1", "")
	if e, _ := res["error"].(map[string]any); status != http.StatusConflict || e["code"] != "not_quarantined" || !strings.Contains(e["message"].(string), "done") {
		t.Errorf("second requeue = %d %v, want 409 not_quarantined saying it is done", status, res)
	}
	if _, body := get(t, d.base+"/metrics"); !strings.Contains(body, "agentgate_messages_requeued_total 1") {
		t.Errorf("/metrics does not count the requeue:\n%s", grep(body, "agentgate_messages_requeued_total"))
	}
	if !logged(d, "INF", "quarantined message requeued by an operator", "message_id=poison-1") {
		t.Errorf("no INF line for the requeue:\n%s", d.stderr.String())
	}
	_, _, err := runSessions(t, "requeue", "--data-dir", dataDir, key, "poison-1")
	if want := "sessions requeue: message poison-1 is done, not quarantined: only a quarantined message is requeued, so nothing was requeued; "; err == nil ||
		!strings.HasPrefix(err.Error(), want) {
		t.Errorf("sessions requeue of a message done = %v, want the daemon's not_quarantined refusal, beginning %q", err, want)
	}
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0", err)
	}
}

// TestSessionsRequeueThroughTheDaemon: `agentgate sessions requeue KEY MESSAGE_ID` asks the
// running daemon, which runs the quarantined message of a shared thread as its own sender's
// (its user id and name, stored with it: the session itself belongs to no single user). With
// no daemon running the command refuses and changes nothing.
func TestSessionsRequeueThroughTheDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the daemon binary")
	}
	dataDir := t.TempDir()
	src := identity.Source{Platform: "http", ChatType: identity.ChatThread, ChatID: "g1", ThreadID: "t1", UserID: "alice", UserName: "Alice"}
	key := identity.Key(src, identity.DefaultKeyOptions)
	func() {
		st, err := sqlite.Open(t.Context(), filepath.Join(dataDir, "agentgate.db"), sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		now := time.Now().UTC()
		errs := st.Commit(t.Context(), [][]persistence.Op{{
			&persistence.CreateSession{Session: persistence.Session{ID: "s1", Key: key, Platform: "http", ChatType: identity.ChatThread,
				ChatID: "g1", ThreadID: "t1", StartedAt: now, LastActivityAt: now}}, // shared: no user
			&persistence.PutRoute{Route: persistence.Route{Key: key, SessionID: "s1", Generation: 1, UpdatedAt: now}},
			&persistence.AppendMessage{Message: persistence.Message{SessionID: "s1", Seq: 1, Role: persistence.RoleUser, Content: "again",
				Platform: "http", ChatID: "g1", MessageID: "q1", UserID: "alice", UserName: "Alice",
				Status: persistence.StatusQuarantined, Active: true, CreatedAt: now}},
			// Another chat's, whose session ended since: listed, not requeued.
			&persistence.CreateSession{Session: persistence.Session{ID: "s2", Key: "agent:main:http:dm:d2", Platform: "http",
				ChatType: identity.ChatDM, ChatID: "d2", UserID: "bob", StartedAt: now, LastActivityAt: now}},
			&persistence.AppendMessage{Message: persistence.Message{SessionID: "s2", Seq: 1, Role: persistence.RoleUser, Content: "older",
				Platform: "http", ChatID: "d2", MessageID: "q2", UserID: "bob", Status: persistence.StatusQuarantined,
				Active: true, CreatedAt: now.Add(-time.Minute)}},
			&persistence.EndSession{SessionID: "s2", Reason: persistence.EndResetCommand, At: now},
		}})
		if errs[0] != nil {
			t.Fatal(errs[0])
		}
	}()
	// What an operator reads before a requeue: every session's quarantined messages, newest
	// first, and which can be requeued.
	type listed struct {
		SessionKey   string `json:"session_key"`
		SessionEnded bool   `json:"session_ended"`
		MessageID    string `json:"message_id"`
		UserID       string `json:"user_id"`
	}
	quarantined := func() []listed {
		t.Helper()
		out, _ := MustRunSessions(t, "quarantined", "--data-dir", dataDir, "--json")
		var got []listed
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("sessions quarantined --json: %v\n%s", err, out)
		}
		return got
	}
	if got, want := quarantined(), []listed{{key, false, "q1", "alice"}, {"agent:main:http:dm:d2", true, "q2", "bob"}}; !slices.Equal(got, want) {
		t.Errorf("sessions quarantined = %+v, want %+v", got, want)
	}
	if out, errOut := MustRunSessions(t, "quarantined", "--data-dir", dataDir, "--limit", "1"); !strings.Contains(out, "q1") ||
		strings.Contains(out, "q2") || !strings.Contains(errOut, "sessions requeue KEY MESSAGE_ID") || !strings.Contains(errOut, "--limit 2") {
		t.Errorf("sessions quarantined --limit 1 printed %q (stderr %q), want q1 alone, how to requeue it and how to see more", out, errOut)
	}
	if _, _, err := runSessions(t, "requeue", "--data-dir", dataDir, key, "q1"); err == nil || !strings.Contains(err.Error(), "no daemon runs") {
		t.Errorf("sessions requeue without a daemon = %v, want a refusal that says no daemon runs", err)
	}
	d := MustServe(t, dataDir, "AGENTGATE_AGENT_BACKEND=exec",
		`AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c, 'echo "ran $AGENTGATE_MESSAGE_ID for $AGENTGATE_USER_ID ($AGENTGATE_USER_NAME) in $AGENTGATE_CHAT_TYPE $AGENTGATE_CHAT_ID/$AGENTGATE_THREAD_ID"']`)
	_, body := get(t, d.base+"/v1/sessions/"+url.PathEscape(key)+"/transcript")
	if !strings.Contains(body, `"status":"quarantined"`) {
		t.Fatalf("the refused requeue changed the message:\n%s", body)
	}
	// The same list through the HTTP API.
	overHTTP := func() []listed {
		t.Helper()
		status, body := get(t, d.base+"/v1/quarantined")
		var got struct{ Messages []listed }
		if err := json.Unmarshal([]byte(body), &got); status != http.StatusOK || err != nil {
			t.Fatalf("GET /v1/quarantined = %d %s (%v)", status, body, err)
		}
		return got.Messages
	}
	if got, want := overHTTP(), []listed{{key, false, "q1", "alice"}, {"agent:main:http:dm:d2", true, "q2", "bob"}}; !slices.Equal(got, want) {
		t.Errorf("GET /v1/quarantined = %+v, want %+v", got, want)
	}
	// A message the key does not have, and a key no session has, are said for an operator: the
	// key as a key, the session the daemon looked in, and the command that lists what there is.
	// Before: "no message nope in session KEY (not_found)" and "no such session (not_found)".
	for _, tc := range []struct{ key, id, want string }{
		{key, "nope", "sessions requeue: key " + key + " has no message nope: not in its current session s1, nor in an ended one still stored, " +
			"so nothing was requeued; agentgate sessions show " + key + " lists the key's last messages with their ids, " +
			"agentgate sessions quarantined the quarantined ones, which a requeue runs"},
		{"agent:main:http:dm:nobody", "q1", "sessions requeue: the key agent:main:http:dm:nobody has no session, so nothing was requeued; " +
			"agentgate sessions list prints the keys that have one"},
	} {
		if _, _, err := runSessions(t, "requeue", "--data-dir", dataDir, tc.key, tc.id); err == nil || err.Error() != tc.want {
			t.Errorf("sessions requeue %s %s = %v, want %q", tc.key, tc.id, err, tc.want)
		}
	}
	out, _ := MustRunSessions(t, "requeue", "--data-dir", dataDir, key, "q1")
	if !strings.Contains(out, "requeued message q1 of "+key) {
		t.Errorf("sessions requeue printed %q, want the requeue it made", out)
	}
	events := readSSE(t, d.base+"/v1/sessions/"+url.PathEscape(key)+"/events", "", 1)
	if text, _ := events[0].data["text"].(string); text != "ran q1 for alice (Alice) in thread g1/t1" {
		t.Errorf("the requeued message's reply = %q, want its turn under its sender alice (Alice)", text)
	}
	waitFor(t, 30*time.Second, func() bool {
		_, body := get(t, d.base+"/v1/sessions/"+url.PathEscape(key)+"/transcript")
		return strings.Contains(body, `"message_id":"q1","turn_id":"t_`) && strings.Contains(body, `"status":"done"`)
	})
	if got, want := quarantined(), []listed{{"agent:main:http:dm:d2", true, "q2", "bob"}}; !slices.Equal(got, want) {
		t.Errorf("sessions quarantined after q1's requeue = %+v, want %+v", got, want)
	}
	if got, want := overHTTP(), []listed{{"agent:main:http:dm:d2", true, "q2", "bob"}}; !slices.Equal(got, want) {
		t.Errorf("GET /v1/quarantined after q1's requeue = %+v, want %+v", got, want)
	}
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0", err)
	}
}

// TestSessionsRequeueInAClusterWithNoMemberRunning: in a cluster with no member registered,
// `sessions requeue` refuses, says that no member runs and that nothing was changed (it once
// said "no cluster member answered ([])").
func TestSessionsRequeueInAClusterWithNoMemberRunning(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	dsn := pgtest.NewDatabase(t)
	st, err := postgres.Open(context.Background(), dsn, postgres.Options{Shared: true}) // migrates it
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	t.Setenv("AGENTGATE_STORE_DRIVER", "postgres")
	t.Setenv("AGENTGATE_STORE_DSN", dsn)
	t.Setenv("AGENTGATE_CLUSTER_ENABLED", "true")
	_, _, err = runSessions(t, "requeue", "--data-dir", t.TempDir(), "agent:main:http:dm:c1", "q1")
	if err == nil || !strings.Contains(err.Error(), "no cluster member runs") ||
		!strings.Contains(err.Error(), "nothing was changed") || strings.Contains(err.Error(), "[]") {
		t.Errorf("sessions requeue with no member running = %v, want a refusal that says no member runs and nothing was changed", err)
	}
}

// TestRequeuePathKeepsDotIDs: a message id "." or ".." reaches the requeue route as that id,
// over real HTTP to a mux with the daemon's pattern, which takes a raw dot segment for a
// path to clean (before, the id went as it is and the daemon answered 404).
func TestRequeuePathKeepsDotIDs(t *testing.T) {
	mux := http.NewServeMux()
	got := make(chan [2]string, 1)
	mux.HandleFunc("POST /v1/sessions/{key}/messages/{id}/requeue", func(w http.ResponseWriter, r *http.Request) {
		got <- [2]string{r.PathValue("key"), r.PathValue("id")}
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	const key = "agent:main:http:dm:c/1"
	for _, id := range []string{".", "..", "m.1", "a/b", "%2E"} {
		res, err := client.Post(srv.URL+requeuePath(key, id), "", nil)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("requeue of %q: %s, want 200 from the requeue route", id, res.Status)
			continue
		}
		if g := <-got; g != [2]string{key, id} {
			t.Errorf("requeue of %q reached the route as key %q, id %q", id, g[0], g[1])
		}
	}
}

// TestRequeueRefusalsSayWhatToDo: the daemon answers a key no session has 404 no_session (its
// message still "no such session"), on every route that takes a key, a key whose route names a
// pruned session included, and a requeue it refuses 409 not_quarantined or session_ended;
// `sessions requeue` says each as a sentence that says what was not done and what shows more,
// without the code, and exits 1, with --json too (nothing on stdout); a requeue made prints one
// JSON object with --json. Before, the no-session 404 was not_found, told from a message's 404
// by its text alone (a requeue of the key of a pruned session was not_found until later), and
// the 409s were printed as the daemon's message with the code after it: "… (not_quarantined)",
// "… (session_ended)".
func TestRequeueRefusalsSayWhatToDo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the daemon binary")
	}
	dataDir := t.TempDir()
	const (
		keyDone  = "agent:main:http:dm:r1" // its message m-done ran
		keyEnded = "agent:main:http:dm:r2" // its message q-old is quarantined in a session since ended
		keyGone  = "agent:main:http:dm:r3" // its route names a session whose row is gone (pruned)
		nobody   = "agent:main:http:dm:nobody"
	)
	func() {
		st, err := sqlite.Open(t.Context(), filepath.Join(dataDir, "agentgate.db"), sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		now := time.Now().UTC()
		session := func(id, key, chat string, at time.Time) *persistence.CreateSession {
			return &persistence.CreateSession{Session: persistence.Session{ID: id, Key: key, Platform: "http", ChatType: identity.ChatDM,
				ChatID: chat, UserID: "u1", StartedAt: at, LastActivityAt: at}}
		}
		message := func(session, chat, id, status string, at time.Time) *persistence.AppendMessage {
			return &persistence.AppendMessage{Message: persistence.Message{SessionID: session, Seq: 1, Role: persistence.RoleUser,
				Content: "hello", Platform: "http", ChatID: chat, MessageID: id, UserID: "u1", Status: status, Active: true, CreatedAt: at}}
		}
		errs := st.Commit(t.Context(), [][]persistence.Op{{
			session("s1", keyDone, "r1", now),
			&persistence.PutRoute{Route: persistence.Route{Key: keyDone, SessionID: "s1", Generation: 1, UpdatedAt: now}},
			message("s1", "r1", "m-done", persistence.StatusDone, now),
			&persistence.AppendMessage{Message: persistence.Message{SessionID: "s1", Seq: 2, Role: persistence.RoleUser,
				Content: "again", Platform: "http", ChatID: "r1", MessageID: "m-q", UserID: "u1", Status: persistence.StatusQuarantined,
				Active: true, CreatedAt: now}},
			session("sb1", keyEnded, "r2", now.Add(-time.Hour)),
			message("sb1", "r2", "q-old", persistence.StatusQuarantined, now.Add(-time.Hour)),
			&persistence.EndSession{SessionID: "sb1", Reason: persistence.EndResetCommand, At: now.Add(-time.Minute)},
			session("sb2", keyEnded, "r2", now),
			&persistence.PutRoute{Route: persistence.Route{Key: keyEnded, SessionID: "sb2", Generation: 2, UpdatedAt: now}},
			&persistence.PutRoute{Route: persistence.Route{Key: keyGone, SessionID: "sc-pruned", Generation: 1, UpdatedAt: now}},
		}})
		if errs[0] != nil {
			t.Fatal(errs[0])
		}
	}()
	d := MustServe(t, dataDir)

	// Over HTTP: the status, the code and the message.
	requeuePath := func(key, id string) string {
		return "/v1/sessions/" + url.PathEscape(key) + "/messages/" + url.PathEscape(id) + "/requeue"
	}
	for _, tc := range []struct {
		method, path string
		status       int
		code, msg    string
	}{
		{http.MethodPost, requeuePath(nobody, "q1"), http.StatusNotFound, "no_session", "no such session"},
		{http.MethodPost, "/v1/sessions/" + nobody + "/reset", http.StatusNotFound, "no_session", "no such session"},
		{http.MethodGet, "/v1/sessions/" + nobody, http.StatusNotFound, "no_session", "no such session"},
		{http.MethodGet, "/v1/sessions/" + nobody + "/transcript", http.StatusNotFound, "no_session", "no such session"},
		// A key whose route names a pruned session has none either, on the requeue too (before,
		// its 404 was not_found "key KEY has no message q1: it holds no stored session").
		{http.MethodGet, "/v1/sessions/" + keyGone, http.StatusNotFound, "no_session", "no such session"},
		{http.MethodPost, requeuePath(keyGone, "q1"), http.StatusNotFound, "no_session", "no such session"},
		// A session the request names that is not the key's is no answer about the key.
		{http.MethodGet, "/v1/sessions/" + keyDone + "/transcript?session_id=sb1", http.StatusNotFound, "not_found", "no such session"},
		// A message the key does not have stays not_found.
		{http.MethodPost, requeuePath(keyDone, "nope"), http.StatusNotFound, "not_found",
			"key " + keyDone + " has no message nope: not in its current session s1, nor in an ended one still stored"},
		{http.MethodPost, requeuePath(keyDone, "m-done"), http.StatusConflict, "not_quarantined",
			"message m-done is done, not quarantined: only a quarantined message is requeued"},
		{http.MethodPost, requeuePath(keyEnded, "q-old"), http.StatusConflict, "session_ended",
			"message q-old belongs to session sb1, which has ended (reset, /new or switched away from): " +
				"its conversation is gone, so it is not run in the current one; its sender may send it again"},
	} {
		req, err := http.NewRequestWithContext(t.Context(), tc.method, d.base+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error struct{ Code, Message string }
		}
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if err != nil || resp.StatusCode != tc.status || e.Error.Code != tc.code || e.Error.Message != tc.msg {
			t.Errorf("%s %s = %d %+v (%v), want %d %s %q", tc.method, tc.path, resp.StatusCode, e, err, tc.status, tc.code, tc.msg)
		}
	}

	// On the command line: the line it ends with on stderr, and exit 1; with --json too, which
	// prints nothing on stdout then.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"requeue", nobody, "q1"}, "sessions requeue: the key " + nobody + " has no session, so nothing was requeued; " +
			"agentgate sessions list prints the keys that have one"},
		{[]string{"requeue", "--json", nobody, "q1"}, "sessions requeue: the key " + nobody + " has no session, so nothing was requeued; " +
			"agentgate sessions list prints the keys that have one"},
		{[]string{"requeue", keyGone, "q1"}, "sessions requeue: the key " + keyGone + " has no session, so nothing was requeued; " +
			"agentgate sessions list prints the keys that have one"},
		{[]string{"reset", nobody}, "sessions reset: the key " + nobody + " has no session, so nothing was reset; " +
			"agentgate sessions list prints the keys that have one"},
		{[]string{"requeue", keyDone, "m-done"}, "sessions requeue: message m-done is done, not quarantined: only a quarantined message is requeued, " +
			"so nothing was requeued; agentgate sessions show " + keyDone + " lists the key's last messages with their status, " +
			"agentgate sessions quarantined the quarantined ones, which a requeue runs"},
		{[]string{"requeue", keyEnded, "q-old"}, "sessions requeue: message q-old belongs to session sb1, which has ended (reset, /new or switched away from): " +
			"its conversation is gone, so it is not run in the current one; its sender may send it again; " +
			"agentgate sessions show " + keyEnded + " lists the key's last messages with their status"},
		{[]string{"requeue", keyEnded, "q-old", "--json"}, "sessions requeue: message q-old belongs to session sb1, which has ended (reset, /new or switched away from): " +
			"its conversation is gone, so it is not run in the current one; its sender may send it again; " +
			"agentgate sessions show " + keyEnded + " lists the key's last messages with their status"},
	} {
		out, _, err := runSessions(t, append(tc.args, "--data-dir", dataDir)...)
		if err == nil {
			t.Errorf("sessions %q succeeded (%q), want a refusal", tc.args, out)
			continue
		}
		var stderr strings.Builder
		if status := exitStatus(err, &stderr); status != 1 || stderr.String() != "agentgate: "+tc.want+"\n" || out != "" {
			t.Errorf("sessions %q printed %q (stdout %q), exit %d; want exit 1, nothing on stdout and\n%s", tc.args, stderr.String(), out, status, "agentgate: "+tc.want)
		}
	}

	// A requeue made, with --json: one object on stdout, the requeue as the daemon answered it.
	out, errOut := MustRunSessions(t, "requeue", "--json", "--data-dir", dataDir, keyDone, "m-q")
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	var got requeueJSON
	if err := dec.Decode(&got); err != nil || dec.More() || !strings.HasSuffix(out, "}\n") {
		t.Errorf("sessions requeue --json printed %q (%v), want one JSON object", out, err)
	}
	want := requeueJSON{SessionKey: keyDone, MessageID: "m-q", SessionID: "s1", Disposition: got.Disposition, QueueDepth: got.QueueDepth,
		Address: strings.TrimPrefix(d.base, "http://")}
	if got != want || (got.Disposition != "queued" && got.Disposition != "started") || errOut != "" {
		t.Errorf("sessions requeue --json = %+v (stderr %q), want %+v, queued or started", got, errOut, want)
	}
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0", err)
	}
}
