package supervisor

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/persistence"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
)

// TestHTTPTextLimitIsOfTheStoredText: the 64 KiB limit of a message's text is of the text as
// the store keeps it, where each NUL is U+FFFD (3 bytes). 64 KiB of NULs is answered 413
// text_too_large, saying its stored size, and nothing is stored; a text of NULs that fits as
// stored is taken, and its row holds no more than 64 KiB. Before, 64 KiB of NULs passed the
// check and was stored as 192 KiB.
func TestHTTPTextLimitIsOfTheStoredText(t *testing.T) {
	r := MustStartDaemon(t, echo.New(), daemonOpts{})
	t.Cleanup(func() { r.stop(t) })
	post := func(id, text string) (int, []byte) {
		t.Helper()
		return r.postMessage(t, map[string]string{"chat_id": "nul", "user_id": "ann", "text": text, "message_id": id})
	}

	status, b := post("big", strings.Repeat("\x00", httpplatform.MaxTextBytes))
	var e httpplatform.ErrorResponse
	wantMsg := "text is 196608 bytes as stored (each NUL is stored as U+FFFD, 3 bytes), the limit is 65536"
	if status != http.StatusRequestEntityTooLarge || json.Unmarshal(b, &e) != nil || e.Error.Code != httpplatform.CodeTextTooLarge || e.Error.Message != wantMsg {
		t.Errorf("64 KiB of NULs = %d %s, want 413 %s %q", status, b, httpplatform.CodeTextTooLarge, wantMsg)
	}
	fits := strings.Repeat("\x00", httpplatform.MaxTextBytes/3) + "a" // 65,536 bytes as stored
	status, b = post("fits", fits)
	if status != http.StatusAccepted {
		t.Fatalf("a text of NULs that fits as stored = %d %s, want 202", status, b)
	}

	msgs := r.onlyTranscript(t, "agent:main:http:dm:nul")
	var rows []persistence.Message
	var ids []string
	for _, m := range msgs {
		if m.Role == persistence.RoleUser {
			rows, ids = append(rows, m), append(ids, m.MessageID)
		}
	}
	if len(rows) != 1 || rows[0].MessageID != "fits" {
		t.Fatalf("user rows %q, want only the one that fits", ids)
	}
	if got, want := rows[0].Content, strings.ReplaceAll(fits, "\x00", "\uFFFD"); got != want || len(got) > httpplatform.MaxTextBytes {
		t.Errorf("the stored text is %d bytes, want %d (at most %d), its NULs as U+FFFD", len(got), len(want), httpplatform.MaxTextBytes)
	}
}
