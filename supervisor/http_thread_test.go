package supervisor

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents/echo"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
)

// TestThreadIDKeysOverHTTP pins what docs/HTTP-API.md says thread_id does (DESIGN §3's key,
// agent:<profile>:<platform>:<chat_type>:<chat_id>[:<thread_id>][:<user_id>]): in a dm it keys a
// session of its own beside the DM's, shared like the DM; in a group it keys the thread's
// session, shared by its users (thread_sessions_per_user: false), where the group's own are
// per user.
func TestThreadIDKeysOverHTTP(t *testing.T) {
	r := MustStart(t, echo.New(), nil)
	for _, tc := range []struct{ body, key string }{
		{`{"chat_id":"o","user_id":"ann","text":"hi"}`, "agent:main:http:dm:o"},
		{`{"chat_id":"o","user_id":"ann","text":"hi","thread_id":"t1"}`, "agent:main:http:dm:o:t1"},
		{`{"chat_type":"dm","chat_id":"o","user_id":"bob","text":"hi","thread_id":"t1"}`, "agent:main:http:dm:o:t1"},
		{`{"chat_type":"group","chat_id":"g","user_id":"ann","text":"hi"}`, "agent:main:http:group:g:ann"},
		{`{"chat_type":"group","chat_id":"g","user_id":"ann","text":"hi","thread_id":"t1"}`, "agent:main:http:thread:g:t1"},
		{`{"chat_type":"group","chat_id":"g","user_id":"bob","text":"hi","thread_id":"t1"}`, "agent:main:http:thread:g:t1"},
	} {
		resp, err := http.Post("http://"+r.d.Addr().String()+"/v1/messages", "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		var m httpplatform.MessageResponse
		err = json.NewDecoder(resp.Body).Decode(&m)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusAccepted || m.SessionKey != tc.key {
			t.Errorf("POST %s = %d, session_key %q (%v), want 202 with %q", tc.body, resp.StatusCode, m.SessionKey, err, tc.key)
		}
	}
}
