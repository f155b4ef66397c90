package supervisor

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestMessageNotStoredSaysWhy: a message the HTTP API could not store (the database and the
// spool both refusing it: a full disk) is logged with the cause in its err, said once. Before,
// err was "platforms: message could not be stored: message could not be stored", and only the
// line before it said why (found by a RUNBOOK walkthrough).
func TestMessageNotStoredSaysWhy(t *testing.T) {
	o := &storetest.Outage{}
	var logs testutil.Buffer
	r := MustStartDaemon(t, echo.New(), daemonOpts{logs: &logs, wrap: func(s persistence.Store) persistence.Store {
		o.Store = s
		return o
	}})
	defer r.stop(t)
	post := func(id, query string) (int, string) {
		t.Helper()
		resp, err := http.Post("http://"+r.d.Addr().String()+"/v1/messages"+query, "application/json",
			strings.NewReader(`{"chat_id":"c","user_id":"u","message_id":"`+id+`","text":"hello"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// m1's turn is stored before the disk fills: a turn result refused would hold m2 behind it,
	// refused for that reason instead ("sent behind a write of its sender that was refused").
	if code, body := post("m1", "?wait=30s"); code != http.StatusOK || !strings.Contains(body, `"replies":[{"text":"hello"`) {
		t.Fatalf("POST before the outage = %d %s, want 200 with the reply", code, body)
	}
	fillDisk(t, r, o)
	if code, body := post("m2", ""); code != http.StatusServiceUnavailable {
		t.Fatalf("POST with the database and the spool failing = %d %s, want 503", code, body)
	}
	line := regexp.MustCompile(`(?m)^.*msg="message not stored; the client is told to send it again".*message_id=m2.*$`).FindString(logs.String())
	if line == "" {
		t.Fatalf("log:\n%s\nwant a line of m2 not stored", logs.String())
	}
	// The store's words: the spool's failure, and the database's (storetest.Outage's).
	const cause = `err="platforms: message could not be stored: persistence: database unavailable: spool failed too: `
	if !strings.Contains(line, cause) || !strings.Contains(line, "disk full (test)") ||
		strings.Count(line, "could not be stored") != 1 || strings.Count(line, "database unavailable") != 1 {
		t.Errorf("line of m2 not stored:\n%s\nwant its err to start %s…, name the database's disk full (test), and say \"could not be stored\" and \"database unavailable\" once", line, cause)
	}
}
