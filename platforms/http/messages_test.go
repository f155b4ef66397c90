package http

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
)

func TestPostMessageBadInput(t *testing.T) {
	rt := &fakeRuntime{}
	h := mustStart(t, Config{}, rt)

	long := strings.Repeat("x", MaxIDBytes+1)
	cases := []struct {
		name       string
		method     string
		path       string
		header     map[string]string
		body       string
		wantStatus int
		wantCode   string
	}{
		{"invalid json", "POST", "/v1/messages", jsonHeader, `{"chat_id":`, 400, CodeInvalidJSON},
		{"empty body", "POST", "/v1/messages", jsonHeader, ``, 400, CodeInvalidJSON},
		{"array body", "POST", "/v1/messages", jsonHeader, `[1,2]`, 400, CodeInvalidJSON},
		// It decodes into the empty request: it was told its three fields were missing.
		{"null body", "POST", "/v1/messages", jsonHeader, ` null `, 400, CodeInvalidJSON},
		{"trailing object", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t"}{}`, 400, CodeInvalidJSON},
		{"trailing garbage", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t"} x`, 400, CodeInvalidJSON},
		{"unknown field", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t","admin":true}`, 400, CodeUnknownField},
		{"invalid utf8", "POST", "/v1/messages", jsonHeader, "{\"chat_id\":\"c\",\"user_id\":\"u\",\"text\":\"\xff\xfe\"}", 400, CodeInvalidUTF8},
		// encoding/json would read each as U+FFFD: m\ud800 and m\udbff one message id.
		{"lone high surrogate in message_id", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t","message_id":"m\ud800"}`, 400, CodeInvalidUTF8},
		{"lone low surrogate in chat_id", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c\udc00","user_id":"u","text":"t"}`, 400, CodeInvalidUTF8},
		{"high surrogate before a non-surrogate", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"\ud83d\u0041"}`, 400, CodeInvalidUTF8},
		{"reversed surrogate pair", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"\ude00\ud83d"}`, 400, CodeInvalidUTF8},
		// encoding/json takes any case for a field and keeps the last of two: the chat would
		// be b, a value a proxy that read chat_id never saw.
		{"field in another case", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","Text":"t"}`, 400, CodeUnknownField},
		{"field twice in two cases", "POST", "/v1/messages", jsonHeader, `{"chat_id":"a","CHAT_ID":"b","user_id":"u","text":"t"}`, 400, CodeUnknownField},
		{"field twice", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t","text":"u"}`, 400, CodeInvalidJSON},
		{"field twice, once escaped", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t","t\u0065xt":"u"}`, 400, CodeInvalidJSON},
		{"missing chat_id", "POST", "/v1/messages", jsonHeader, `{"user_id":"u","text":"t"}`, 400, CodeMissingField},
		{"missing user_id", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","text":"t"}`, 400, CodeMissingField},
		{"empty text", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":""}`, 400, CodeMissingField},
		{"null text", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":null}`, 400, CodeMissingField},
		{"number chat_id", "POST", "/v1/messages", jsonHeader, `{"chat_id":7,"user_id":"u","text":"t"}`, 400, CodeInvalidField},
		{"unknown chat_type", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t","chat_type":"forum"}`, 400, CodeInvalidChatType},
		{"thread without thread_id", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t","chat_type":"thread"}`, 400, CodeMissingField},
		{"chat_id too long", "POST", "/v1/messages", jsonHeader, `{"chat_id":"` + long + `","user_id":"u","text":"t"}`, 400, CodeInvalidField},
		{"message_id too long", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t","message_id":"` + long + `"}`, 400, CodeInvalidField},
		{"control char in user_id", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u\u0000x","text":"t"}`, 400, CodeInvalidField},
		{"newline in chat_id", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c\nx","user_id":"u","text":"t"}`, 400, CodeInvalidField},
		{"C1 control in thread_id", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t","chat_type":"thread","thread_id":"a\u0085b"}`, 400, CodeInvalidField},
		{"blank text", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":" \n\t "}`, 400, CodeMissingField},
		{"blank chat_id", "POST", "/v1/messages", jsonHeader, `{"chat_id":"  ","user_id":"u","text":"t"}`, 400, CodeInvalidField},
		{"user_id ending in a space", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u ","text":"t"}`, 400, CodeInvalidField},
		{"message_id beginning with a no-break space", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t","message_id":"\u00a0m1"}`, 400, CodeInvalidField},
		{"blank profile", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t","profile":" "}`, 400, CodeInvalidField},
		// Each id would name another chat or user than the one it looks like.
		{"zero-width space in chat_id", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c\u200b","user_id":"u","text":"t"}`, 400, CodeInvalidField},
		{"byte order mark before user_id", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"\ufeffu","text":"t"}`, 400, CodeInvalidField},
		{"bidirectional override in message_id", "POST", "/v1/messages", jsonHeader, "{\"chat_id\":\"c\",\"user_id\":\"u\",\"text\":\"t\",\"message_id\":\"m\u202e1\"}", 400, CodeInvalidField},
		{"tag character in thread_id", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t","chat_type":"thread","thread_id":"t\udb40\udc41"}`, 400, CodeInvalidField},
		{"tag character after a flag's cancel tag", "POST", "/v1/messages", jsonHeader, `{"chat_id":"\ud83c\udff4\udb40\udc67\udb40\udc7f\udb40\udc41","user_id":"u","text":"t"}`, 400, CodeInvalidField},
		{"soft hyphen in profile", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t","profile":"o\u00adps"}`, 400, CodeInvalidField},
		{"user_name too long", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t","user_name":"` + strings.Repeat("n", MaxNameBytes+1) + `"}`, 400, CodeInvalidField},
		{"text too large", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"` + strings.Repeat("a", MaxTextBytes+1) + `"}`, 413, CodeTextTooLarge},
		{"multibyte text too large", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"` + strings.Repeat("é", MaxTextBytes/2+1) + `"}`, 413, CodeTextTooLarge},
		{"body too large", "POST", "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"` + strings.Repeat("a", MaxBodyBytes) + `"}`, 413, CodeBodyTooLarge},
		{"text/plain", "POST", "/v1/messages", map[string]string{"Content-Type": "text/plain"}, `{"chat_id":"c","user_id":"u","text":"t"}`, 415, CodeUnsupportedMedia},
		{"form", "POST", "/v1/messages", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, `chat_id=c`, 415, CodeUnsupportedMedia},
		// Latin-1 "Ã©" is the UTF-8 of "é": the text would not be the one sent.
		{"charset other than utf-8", "POST", "/v1/messages", map[string]string{"Content-Type": "application/json; charset=iso-8859-1"}, `{"chat_id":"c","user_id":"u","text":"Ã©"}`, 415, CodeUnsupportedMedia},
		{"malformed content type", "POST", "/v1/messages", map[string]string{"Content-Type": "application/json; ="}, `{"chat_id":"c","user_id":"u","text":"t"}`, 415, CodeUnsupportedMedia},
		{"bad wait", "POST", "/v1/messages?wait=soon", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t"}`, 400, CodeInvalidWait},
		{"negative wait", "POST", "/v1/messages?wait=-1s", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t"}`, 400, CodeInvalidWait},
		{"empty wait", "POST", "/v1/messages?wait=", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t"}`, 400, CodeInvalidQuery},
		{"wait given twice", "POST", "/v1/messages?wait=1s&wait=5m", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t"}`, 400, CodeInvalidQuery},
		{"GET messages", "GET", "/v1/messages", nil, ``, 405, CodeMethodNotAllowed},
		{"unknown route", "GET", "/v1/nope", nil, ``, 404, CodeNotFound},
		{"root", "GET", "/", nil, ``, 404, CodeNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := h.do(tc.method, tc.path, tc.header, tc.body)
			if got.status != tc.wantStatus || got.errCode() != tc.wantCode {
				t.Errorf("%s %s = %d %q (%.200s), want %d %q", tc.method, tc.path, got.status, got.errCode(), got.body, tc.wantStatus, tc.wantCode)
			}
			if ct := got.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q, want application/json", ct)
			}
			var e ErrorResponse
			if err := json.Unmarshal(got.body, &e); err != nil || e.Error.Message == "" {
				t.Errorf("error body %q: decode err %v, message %q; want a message", got.body, err, e.Error.Message)
			}
		})
	}
	if n := len(rt.delivered()); n != 0 {
		t.Errorf("deliver called %d times for bad input, want 0", n)
	}
	// A form post (curl -d without -H) is told what to send instead.
	form := h.do("POST", "/v1/messages", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, `{"chat_id":"c","user_id":"u","text":"t"}`)
	var formErr ErrorResponse
	_ = json.Unmarshal(form.body, &formErr)
	if want := `not "application/x-www-form-urlencoded"; with curl, add -H 'Content-Type: application/json'`; !strings.Contains(formErr.Error.Message, want) {
		t.Errorf("a form post's error: %s, want it to say %q", form.body, want)
	}

	// The daemon keeps serving good requests after all of that.
	good := []struct {
		name   string
		header map[string]string
		body   string
	}{
		{"json", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t"}`},
		{"no content type", nil, `{"chat_id":"c","user_id":"u","text":"t"}`},
		{"charset parameter", map[string]string{"Content-Type": "application/json; charset=utf-8"}, `{"chat_id":"c","user_id":"u","text":"t"}`},
		{"charset parameter in upper case", map[string]string{"Content-Type": "application/json; charset=UTF-8"}, `{"chat_id":"c","user_id":"u","text":"t"}`},
		{"charset utf8, as some clients spell it", map[string]string{"Content-Type": "application/json; charset=utf8"}, `{"chat_id":"c","user_id":"u","text":"t"}`},
		{"text at the limit", jsonHeader, `{"chat_id":"c","user_id":"u","text":"` + strings.Repeat("a", MaxTextBytes) + `"}`},
		{"text at the limit as stored, with NULs", jsonHeader, `{"chat_id":"c","user_id":"u","text":"` + strings.Repeat(`\u0000`, MaxTextBytes/3) + `a"}`},
		{"id at the limit", jsonHeader, `{"chat_id":"` + long[1:] + `","user_id":"u","text":"t"}`},
		{"thread with thread_id", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t","chat_type":"thread","thread_id":"th"}`},
		{"every field", jsonHeader, `{"chat_id":"c","chat_type":"thread","thread_id":"th","user_id":"u","user_name":"n","message_id":"every","profile":"p","text":"t"}`},
		{"surrogate pair", jsonHeader, `{"chat_id":"c\ud83d\ude00","user_id":"u","text":"\\ud800 \ud83d\ude00\u00e9"}`},
		// An emoji sequence needs its zero-width joiner; a text may hold any format character.
		{"zero-width joiner in chat_id", jsonHeader, `{"chat_id":"\ud83d\udc69\u200d\ud83d\udcbb","user_id":"u","text":"a\u200bb\u202e"}`},
		// A right-to-left name's direction marks and a subdivision flag's tags are format
		// characters too, and taken.
		{"direction marks in user_id", jsonHeader, `{"chat_id":"c","user_id":"\u05d0\u200f\u061c\u200e","text":"t"}`},
		{"subdivision flag in chat_id", jsonHeader, `{"chat_id":"x\ud83c\udff4\udb40\udc67\udb40\udc62\udb40\udc65\udb40\udc6e\udb40\udc67\udb40\udc7fy","user_id":"u","text":"t"}`},
	}
	for _, tc := range good {
		t.Run("good/"+tc.name, func(t *testing.T) {
			got := h.do("POST", "/v1/messages", tc.header, tc.body)
			if got.status != http.StatusAccepted {
				t.Errorf("POST /v1/messages = %d %.200s, want 202", got.status, got.body)
			}
		})
	}
}

// TestPostMessageReportsEveryProblem: a body with several missing or bad fields is answered
// with all of them in one message, not the first alone (a client sending {} learned of
// user_id and text only on its next tries); the status and code are the first problem's. The
// messages are checked whole: they are what a client is told to mend.
func TestPostMessageReportsEveryProblem(t *testing.T) {
	rt := &fakeRuntime{}
	h := mustStart(t, Config{}, rt)
	cases := []struct {
		name       string
		body       string
		wantStatus int
		wantCode   string
		wantMsg    string
	}{
		{"empty object", `{}`, 400, CodeMissingField, "chat_id, user_id and text are required"},
		{"two missing", `{"user_id":"u"}`, 400, CodeMissingField, "chat_id and text are required"},
		{"one missing", `{"user_id":"u","text":"t"}`, 400, CodeMissingField, "chat_id is required"},
		{"missing and bad", `{"chat_id":" c","text":" ","chat_type":"forum","user_name":"` + strings.Repeat("n", MaxNameBytes+1) + `"}`,
			400, CodeMissingField,
			"user_id is required; text is blank; chat_type must be dm, group, channel or thread; " +
				"chat_id begins or ends with white space; user_name is longer than 1024 bytes"},
		{"thread without its id, bad user_id", `{"chat_id":"c","user_id":"u\u0001","text":"t","chat_type":"thread"}`,
			400, CodeMissingField, "thread_id is required when chat_type is thread; user_id contains control characters"},
		{"bad ids only", `{"chat_id":"c ","user_id":" u","text":"t"}`,
			400, CodeInvalidField, "chat_id begins or ends with white space; user_id begins or ends with white space"},
		{"invisible characters", `{"chat_id":"c\u200b","user_id":"u","text":"t","message_id":"\u202em1"}`,
			400, CodeInvalidField, "chat_id contains the invisible format character U+200B; message_id contains the invisible format character U+202E"},
		// Invalid JSON says what and where: before, every syntax error was "the body is not
		// valid JSON", and a client could not find its stray comma or shell-quoted quote.
		{"trailing comma", `{"chat_id":"c","user_id":"u","text":"t",}`,
			400, CodeInvalidJSON, "the body is not valid JSON: invalid character '}' looking for beginning of object key string (byte 41)"},
		{"single quotes from a shell", `'{"chat_id":"c"}'`,
			400, CodeInvalidJSON, `the body is not valid JSON: invalid character '\'' looking for beginning of value (byte 1)`},
		{"cut short", `{"chat_id":"c","user_id":"u","text":"t"`,
			400, CodeInvalidJSON, "the body is not valid JSON: it ends before its JSON object does"},
		{"a byte order mark", "\ufeff" + `{"chat_id":"c","user_id":"u","text":"t"}`,
			400, CodeInvalidJSON, "the body begins with a byte order mark (U+FEFF), which JSON does not take (RFC 8259); send it without"},
		// A text over the limit is a 413 that says its size and the limit, and nothing else,
		// as a body over the limit is: before, a missing field made it a 400, and a bad one
		// went into the 413's message.
		{"text too large, a field missing", `{"user_id":"u","text":"` + strings.Repeat("a", MaxTextBytes+1) + `"}`,
			413, CodeTextTooLarge, "text is 65537 bytes, the limit is 65536"},
		{"text too large, a bad chat_type", `{"chat_id":"c","user_id":"u","chat_type":"forum","text":"` + strings.Repeat("a", MaxTextBytes+1) + `"}`,
			413, CodeTextTooLarge, "text is 65537 bytes, the limit is 65536"},
		// The limit is of the text as stored, where each NUL is U+FFFD: 64 KiB of NULs passed
		// the check and were stored as 192 KiB.
		{"text of NULs too large as stored", `{"chat_id":"c","user_id":"u","text":"` + strings.Repeat(`\u0000`, MaxTextBytes) + `"}`,
			413, CodeTextTooLarge, "text is 196608 bytes as stored (each NUL is stored as U+FFFD, 3 bytes), the limit is 65536"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := h.do("POST", "/v1/messages", jsonHeader, tc.body)
			var e ErrorResponse
			if err := json.Unmarshal(got.body, &e); err != nil {
				t.Fatalf("POST /v1/messages body %q: %v", got.body, err)
			}
			if got.status != tc.wantStatus || e.Error.Code != tc.wantCode || e.Error.Message != tc.wantMsg {
				t.Errorf("POST /v1/messages = %d %q %q, want %d %q %q",
					got.status, e.Error.Code, e.Error.Message, tc.wantStatus, tc.wantCode, tc.wantMsg)
			}
		})
	}
	if n := len(rt.delivered()); n != 0 {
		t.Errorf("deliver called %d times for bad input, want 0", n)
	}
}

func TestPostMessageAccepted(t *testing.T) {
	rt := &fakeRuntime{}
	rt.setRespond(func(_ context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
		a := ackFor(in, platforms.Queued)
		a.QueueDepth = 3
		return a, nil
	})
	h := mustStart(t, Config{}, rt)

	before := time.Now()
	got := h.post("/v1/messages", map[string]string{
		"chat_id": "c1", "user_id": "u1", "user_name": "Ann", "text": "hello", "chat_type": "group", "profile": "ops",
	})
	if got.status != http.StatusAccepted {
		t.Fatalf("POST /v1/messages = %d %s, want 202", got.status, got.body)
	}
	var raw map[string]any
	if err := json.Unmarshal(got.body, &raw); err != nil {
		t.Fatalf("decode %s: %v", got.body, err)
	}
	for _, f := range []string{"message_id", "session_key", "session_id", "disposition", "queue_depth"} {
		if _, ok := raw[f]; !ok {
			t.Errorf("202 body %s has no %q", got.body, f)
		}
	}
	if _, ok := raw["replies"]; ok {
		t.Errorf("202 body %s has replies, want none without ?wait", got.body)
	}

	ins := rt.delivered()
	if len(ins) != 1 {
		t.Fatalf("delivered %d messages, want 1", len(ins))
	}
	in := ins[0]
	wantSrc := identity.Source{Platform: "http", ChatType: "group", ChatID: "c1", UserID: "u1", UserName: "Ann", Profile: "ops"}
	if diff := cmp.Diff(wantSrc, in.Source); diff != "" {
		t.Errorf("Inbound.Source mismatch (-want +got):\n%s", diff)
	}
	if in.Text != "hello" || in.ReceivedAt.Before(before) {
		t.Errorf("Inbound = %q at %v, want hello at or after %v", in.Text, in.ReceivedAt, before)
	}
	if !strings.HasPrefix(in.MessageID, "http-") || len(in.MessageID) != len("http-")+16 {
		t.Errorf("generated MessageID = %q, want http- and 16 hex digits", in.MessageID)
	}

	resp := mustDecode[MessageResponse](t, got)
	want := MessageResponse{
		MessageID: in.MessageID, SessionKey: keyFor(wantSrc), SessionID: "s1",
		Disposition: platforms.Queued, QueueDepth: 3,
	}
	if diff := cmp.Diff(want, resp); diff != "" {
		t.Errorf("202 body mismatch (-want +got):\n%s", diff)
	}

	// A second message without message_id gets a different id; a given one is kept.
	h.post("/v1/messages", map[string]string{"chat_id": "c1", "user_id": "u1", "text": "again"})
	h.post("/v1/messages", map[string]string{"chat_id": "c1", "user_id": "u1", "text": "mine", "message_id": "m-42"})
	ins = rt.delivered()
	if ins[1].MessageID == ins[0].MessageID || ins[2].MessageID != "m-42" || ins[1].Source.ChatType != identity.ChatDM {
		t.Errorf("message ids = %q, %q (chat type %q); want distinct generated ids, then m-42, default dm",
			ins[0].MessageID, ins[1].MessageID, ins[1].Source.ChatType)
	}

	// The default profile named "default" is the default profile, "": one key, one identity.
	h.post("/v1/messages", map[string]string{"chat_id": "c1", "user_id": "u1", "text": "default", "profile": "default"})
	if ins = rt.delivered(); len(ins) != 4 || ins[3].Source.Profile != "" {
		t.Errorf("a message of profile \"default\": delivered %+v, want its source's profile \"\"", ins[len(ins)-1].Source)
	}
}

// TestPostMessageAsksForTheCheckOfReusedIDs: an HTTP client chooses its message ids, so every
// message it sends asks the runtime to refuse an id reused for another message
// (platforms.ErrReused) rather than take it as a duplicate: one with its own id, and one
// without, whose id agentgate makes.
func TestPostMessageAsksForTheCheckOfReusedIDs(t *testing.T) {
	rt := &fakeRuntime{}
	h := mustStart(t, Config{}, rt)
	h.post("/v1/messages", map[string]string{"chat_id": "c", "user_id": "u", "text": "t", "message_id": "m1"})
	h.post("/v1/messages", map[string]string{"chat_id": "c", "user_id": "u", "text": "t"})
	var strict []bool
	for _, in := range rt.delivered() {
		strict = append(strict, in.StrictID)
	}
	if !slices.Equal(strict, []bool{true, true}) {
		t.Errorf("delivered messages with StrictID %v, want two, both set", strict)
	}
}

func TestPostMessageDeliverErrors(t *testing.T) {
	cases := []struct {
		name       string
		ack        bool
		disp       string
		err        error
		wantStatus int
		wantCode   string
	}{
		{"draining", false, "", fmt.Errorf("deliver: %w", platforms.ErrDraining), 503, CodeDraining},
		{"rejected", true, platforms.Rejected, platforms.ErrRejected, 429, CodeQueueFull},
		{"rejected without ack", false, "", platforms.ErrRejected, 429, CodeQueueFull},
		{"id of another conversation", false, "", fmt.Errorf("deliver: %w", platforms.ErrConflict), 409, CodeMessageIDConflict},
		{"id of another message", false, "", fmt.Errorf("deliver: %w", platforms.ErrReused), 409, CodeMessageIDReused},
		{"rejected disposition only", true, platforms.Rejected, nil, 429, CodeQueueFull},
		{"unavailable", false, "", platforms.ErrUnavailable, 503, CodeUnavailable},
		{"deadline", false, "", context.DeadlineExceeded, 503, CodeUnavailable},
		{"other", false, "", errors.New("boom"), 500, CodeInternal},
		{"nil ack and nil error", false, "", nil, 500, CodeInternal},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rt := &fakeRuntime{}
			rt.setRespond(func(_ context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
				if !tc.ack {
					return nil, tc.err
				}
				return ackFor(in, tc.disp), tc.err
			})
			h := mustStart(t, Config{}, rt)
			got := h.post("/v1/messages", map[string]string{"chat_id": "c", "user_id": "u", "text": "t", "message_id": "m1"})
			if got.status != tc.wantStatus || got.errCode() != tc.wantCode {
				t.Errorf("POST = %d %q (%s), want %d %q", got.status, got.errCode(), got.body, tc.wantStatus, tc.wantCode)
			}
			if tc.wantStatus != http.StatusTooManyRequests {
				return
			}
			rej := mustDecode[RejectedResponse](t, got)
			if rej.Disposition != platforms.Rejected || rej.Error.Message == "" {
				t.Errorf("429 body = %s, want disposition rejected and an error message", got.body)
			}
			if tc.ack && (rej.MessageID != "m1" || rej.SessionKey == "") {
				t.Errorf("429 body = %s, want message_id m1 and the session key", got.body)
			}
		})
	}
}

func TestDrain(t *testing.T) {
	rt := &fakeRuntime{}
	h := mustStart(t, Config{Ready: func(context.Context) map[string]error {
		return map[string]error{"store": nil}
	}}, rt)

	body := map[string]string{"chat_id": "c", "user_id": "u", "text": "t"}
	if got := h.post("/v1/messages", body); got.status != http.StatusAccepted {
		t.Fatalf("POST before Drain = %d %s, want 202", got.status, got.body)
	}
	h.p.Drain()
	if got := h.post("/v1/messages", body); got.status != 503 || got.errCode() != CodeDraining {
		t.Errorf("POST after Drain = %d %q, want 503 %q", got.status, got.errCode(), CodeDraining)
	}
	if n := len(rt.delivered()); n != 1 {
		t.Errorf("deliver called %d times, want 1 (none after Drain)", n)
	}
	got := h.do("GET", "/readyz", nil, "")
	ready := mustDecode[ReadyResponse](t, got)
	if got.status != 503 || ready.Status != "not_ready" || !ready.Draining || ready.Components["store"] != "ok" {
		t.Errorf("GET /readyz after Drain = %d %s, want 503 not_ready draining with store ok", got.status, got.body)
	}
	if got := h.do("GET", "/healthz", nil, ""); got.status != http.StatusOK {
		t.Errorf("GET /healthz after Drain = %d, want 200", got.status)
	}
}

func TestWaitReturnsReplies(t *testing.T) {
	rt := &fakeRuntime{}
	h := mustStart(t, Config{}, rt)
	rt.setRespond(func(ctx context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
		other := *in
		other.MessageID = "unrelated"
		otherChat := *in
		otherChat.Source.ChatID = "other-chat"
		switch in.Text {
		case "sync":
			// Replies sent before the ack returns must still reach the waiter.
			rt.p.Send(ctx, reply(&other, 1, "not yours", true))
			rt.p.Send(ctx, reply(in, 2, "sync answer", true))
		case "async":
			go func() {
				rt.p.Send(context.Background(), reply(&other, 3, "not yours", true))
				rt.p.Send(context.Background(), reply(&otherChat, 1, "other chat, same id", true))
				rt.p.Send(context.Background(), reply(in, 4, "part 1", false))
				last := reply(in, 5, "part 2", true)
				last.SessionID = "s2"
				last.Kind = platforms.KindNotice
				rt.p.Send(context.Background(), last)
				rt.p.Send(context.Background(), reply(in, 6, "next turn", true))
			}()
		}
		return ackFor(in, platforms.Started), nil
	})

	cases := []struct {
		name        string
		text        string
		wantReplies []Reply
		wantSession string
	}{
		{"reply before ack", "sync", []Reply{{Text: "sync answer", TurnID: "t1", Kind: "reply", Seq: 2}}, "s1"},
		{"several outbounds, turn end last", "async", []Reply{
			{Text: "part 1", TurnID: "t1", Kind: "reply", Seq: 4},
			{Text: "part 2", TurnID: "t1", Kind: "notice", Seq: 5},
		}, "s2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := h.post("/v1/messages?wait=5s", map[string]string{
				"chat_id": "c1", "user_id": "u", "text": tc.text, "message_id": "m-" + tc.text,
			})
			if got.status != http.StatusOK {
				t.Fatalf("POST ?wait = %d %s, want 200", got.status, got.body)
			}
			resp := mustDecode[MessageResponse](t, got)
			if diff := cmp.Diff(tc.wantReplies, resp.Replies); diff != "" {
				t.Errorf("replies mismatch (-want +got):\n%s", diff)
			}
			if resp.SessionID != tc.wantSession || resp.MessageID != "m-"+tc.text || resp.Disposition != platforms.Started {
				t.Errorf("body = %s, want session_id %q, message_id m-%s, disposition started", got.body, tc.wantSession, tc.text)
			}
		})
	}
	waitFor(t, "waiters to be removed", func() bool { return h.p.waiterCount() == 0 })
}

func TestWaitConcurrentWaitersDoNotLeak(t *testing.T) {
	rt := &fakeRuntime{}
	h := mustStart(t, Config{}, rt)
	const n = 8
	var seq sync.Mutex
	next := int64(0)
	rt.setRespond(func(_ context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
		go func() {
			seq.Lock()
			next++
			s := next
			seq.Unlock()
			rt.p.Send(context.Background(), reply(in, s, "answer to "+in.MessageID, true))
		}()
		return ackFor(in, platforms.Started), nil
	})

	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("m%d", i)
			got := h.post("/v1/messages?wait=5s", map[string]string{"chat_id": "shared", "user_id": "u", "text": "t", "message_id": id})
			if got.status != http.StatusOK {
				t.Errorf("POST %s ?wait = %d %s, want 200", id, got.status, got.body)
				return
			}
			resp := mustDecode[MessageResponse](t, got)
			if len(resp.Replies) != 1 || resp.Replies[0].Text != "answer to "+id {
				t.Errorf("POST %s replies = %+v, want only \"answer to %s\"", id, resp.Replies, id)
			}
		})
	}
	wg.Wait()
}

func TestWaitTimeout(t *testing.T) {
	cases := []struct {
		name    string
		maxWait time.Duration
		query   string
	}{
		{"wait expires", 0, "?wait=50ms"},
		{"capped by MaxWait", 50 * time.Millisecond, "?wait=1h"},
		{"zero wait", 0, "?wait=0s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rt := &fakeRuntime{}
			h := mustStart(t, Config{MaxWait: tc.maxWait}, rt)
			got := h.post("/v1/messages"+tc.query, map[string]string{"chat_id": "c", "user_id": "u", "text": "t", "message_id": "m1"})
			if got.status != http.StatusAccepted {
				t.Fatalf("POST %s = %d %s, want 202", tc.query, got.status, got.body)
			}
			resp := mustDecode[MessageResponse](t, got)
			if resp.MessageID != "m1" || resp.Disposition != platforms.Started || resp.Replies != nil {
				t.Errorf("POST %s body = %s, want the plain ack", tc.query, got.body)
			}
			waitFor(t, "waiter to be removed", func() bool { return h.p.waiterCount() == 0 })
		})
	}
}

func TestWaitDuplicate(t *testing.T) {
	sessions := newFakeSessions()
	rt := &fakeRuntime{}
	h := mustStart(t, Config{Sessions: sessions}, rt)
	rt.setRespond(func(_ context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
		switch in.MessageID {
		case "live":
			go rt.p.Send(context.Background(), reply(in, 9, "still running, now done", true))
		case "reset":
			go rt.p.Send(context.Background(), reply(in, 12, "the answer", true))
		}
		return ackFor(in, platforms.Duplicate), nil
	})
	src := identity.Source{Platform: "http", ChatType: "dm", ChatID: "c", UserID: "u"}
	key := keyFor(src)
	notice := func(id string, seq int64) *platforms.Outbound {
		o := reply(&platforms.Inbound{Source: src, MessageID: id}, seq, "reset notice", false) // Continued
		o.Kind, o.TurnID = platforms.KindNotice, ""
		return o
	}
	orig := &platforms.Inbound{Source: src, MessageID: "done"}
	sessions.replies[key+"\x00done"] = []*platforms.Outbound{reply(orig, 8, "second", true), notice("done", 7)}
	// A duplicate of a message whose turn still runs after an automatic reset: its notice is
	// durable, its reply is not. Before, the notice alone was taken for the whole answer.
	sessions.replies[key+"\x00reset"] = []*platforms.Outbound{notice("reset", 11)}
	// A message quarantined (its notice ends that answer), then requeued and run: both.
	requeued := &platforms.Inbound{Source: src, MessageID: "requeued"}
	quarantine := notice("requeued", 4)
	quarantine.TurnEnd = true
	sessions.replies[key+"\x00requeued"] = []*platforms.Outbound{quarantine, reply(requeued, 6, "run again", true)}

	cases := []struct {
		name string
		id   string
		want []Reply
	}{
		{"durable replies", "done", []Reply{
			{Text: "reset notice", Kind: "notice", Seq: 7},
			{Text: "second", TurnID: "t1", Kind: "reply", Seq: 8},
		}},
		{"no durable replies yet, waits live", "live", []Reply{
			{Text: "still running, now done", TurnID: "t1", Kind: "reply", Seq: 9},
		}},
		{"answered twice: quarantined, then requeued", "requeued", []Reply{
			{Text: "reset notice", Kind: "notice", Seq: 4},
			{Text: "run again", TurnID: "t1", Kind: "reply", Seq: 6},
		}},
		{"a durable notice, the reply live", "reset", []Reply{
			{Text: "reset notice", Kind: "notice", Seq: 11},
			{Text: "the answer", TurnID: "t1", Kind: "reply", Seq: 12},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := h.post("/v1/messages?wait=5s", map[string]string{"chat_id": "c", "user_id": "u", "text": "t", "message_id": tc.id})
			if got.status != http.StatusOK {
				t.Fatalf("POST duplicate ?wait = %d %s, want 200", got.status, got.body)
			}
			resp := mustDecode[MessageResponse](t, got)
			if resp.Disposition != platforms.Duplicate {
				t.Errorf("disposition = %q, want %q", resp.Disposition, platforms.Duplicate)
			}
			if diff := cmp.Diff(tc.want, resp.Replies); diff != "" {
				t.Errorf("replies mismatch (-want +got):\n%s", diff)
			}
		})
	}
	if calls := sessions.callLog(); !cmp.Equal(calls, []string{"replies " + key + " done", "replies " + key + " live", "replies " + key + " requeued", "replies " + key + " reset"}) {
		t.Errorf("Sessions calls = %q, want RepliesTo(%s, done) then (…, live), (…, requeued), (…, reset)", calls, key)
	}
}

// TestWaitOnAClusterMemberFindsAnAnswerTheRelayMissed: on a cluster member, a ?wait whose
// message's turn ran on another member, and whose reply's relay missed this one, finds the
// answer in the outbox. Before, it waited to its deadline and answered 202 with the answer
// long durable. A single daemon sends every reply itself and never reads the outbox for it.
func TestWaitOnAClusterMemberFindsAnAnswerTheRelayMissed(t *testing.T) {
	src := identity.Source{Platform: "http", ChatType: "dm", ChatID: "c", UserID: "u"}
	key := keyFor(src)
	for _, clustered := range []bool{true, false} {
		t.Run(fmt.Sprint("clustered=", clustered), func(t *testing.T) {
			sessions := newFakeSessions()
			rt := &fakeRuntime{}
			h := mustStart(t, Config{Sessions: sessions, Clustered: clustered, ReplyCheck: 10 * time.Millisecond}, rt)
			in := &platforms.Inbound{Source: src, MessageID: "m1"}
			rt.setRespond(func(_ context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
				// The owner runs the turn; its reply is durable, and no relay comes.
				sessions.mu.Lock()
				sessions.replies[key+"\x00m1"] = []*platforms.Outbound{reply(in, 3, "answered elsewhere", true)}
				sessions.mu.Unlock()
				return ackFor(in, platforms.Started), nil
			})
			wait := "5s"
			if !clustered {
				wait = "200ms" // no relay to miss: it waits for the turn's live reply
			}
			got := h.post("/v1/messages?wait="+wait, map[string]string{"chat_id": "c", "user_id": "u", "text": "t", "message_id": in.MessageID})
			if !clustered {
				if got.status != http.StatusAccepted {
					t.Errorf("POST ?wait on a single daemon = %d %s, want 202", got.status, got.body)
				}
				if calls := sessions.callLog(); len(calls) != 0 {
					t.Errorf("a single daemon read the store for its wait: %q", calls)
				}
				return
			}
			if got.status != http.StatusOK {
				t.Fatalf("POST ?wait = %d %s, want 200 with the durable answer", got.status, got.body)
			}
			want := []Reply{{Text: "answered elsewhere", TurnID: "t1", Kind: "reply", Seq: 3}}
			if diff := cmp.Diff(want, mustDecode[MessageResponse](t, got).Replies); diff != "" {
				t.Errorf("replies mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestWaitDuplicateReadsTheOutboxAgain: a single daemon's ?wait of a duplicate whose turn has
// ended reads the outbox again when its first read failed (the database unavailable, writes
// waiting in the spool), and answers with the replies once the read passes. Before, it waited
// for a live reply that would never come, and answered 202 without them at its deadline, also
// when the database answered again meanwhile (found by a crash soak on PostgreSQL).
func TestWaitDuplicateReadsTheOutboxAgain(t *testing.T) {
	src := identity.Source{Platform: "http", ChatType: "dm", ChatID: "c", UserID: "u"}
	key := keyFor(src)
	sessions := newFakeSessions()
	rt := &fakeRuntime{}
	h := mustStart(t, Config{Sessions: sessions, ReplyCheck: 10 * time.Millisecond}, rt)
	in := &platforms.Inbound{Source: src, MessageID: "m1"}
	sessions.replies[key+"\x00m1"] = []*platforms.Outbound{reply(in, 3, "answered before", true)}
	sessions.repliesErr, sessions.failReplies = errors.New("persistence: database unavailable"), 2
	rt.setRespond(func(_ context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
		return ackFor(in, platforms.Duplicate), nil
	})
	got := h.post("/v1/messages?wait=5s", map[string]string{"chat_id": "c", "user_id": "u", "text": "t", "message_id": in.MessageID})
	if got.status != http.StatusOK {
		t.Fatalf("POST duplicate ?wait = %d %s, want 200 with the durable answer", got.status, got.body)
	}
	want := []Reply{{Text: "answered before", TurnID: "t1", Kind: "reply", Seq: 3}}
	if diff := cmp.Diff(want, mustDecode[MessageResponse](t, got).Replies); diff != "" {
		t.Errorf("replies mismatch (-want +got):\n%s", diff)
	}
	if calls := sessions.callLog(); len(calls) != 3 {
		t.Errorf("Sessions calls = %q, want RepliesTo 3 times (2 failed)", calls)
	}
}

// TestWaitDuplicateReadBoundedByTheWait: a duplicate's ?wait whose read of the outbox gets no
// answer (a database that hangs, which the store gives up on only after its own bound, 15 s on
// PostgreSQL) is answered at the wait's deadline, 202 without replies. Before, the read ran
// under the request's context alone: the answer came when the store gave up, however short
// the wait asked for, and a platform's stop waited for it too.
func TestWaitDuplicateReadBoundedByTheWait(t *testing.T) {
	sessions := newFakeSessions()
	hang := make(chan struct{})
	sessions.repliesHang = hang
	rt := &fakeRuntime{}
	h := mustStart(t, Config{Sessions: sessions, ReplyCheck: 10 * time.Millisecond}, rt)
	rt.setRespond(func(_ context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
		return ackFor(in, platforms.Duplicate), nil
	})
	done := make(chan response, 1)
	go func() {
		done <- h.post("/v1/messages?wait=200ms", map[string]string{"chat_id": "c", "user_id": "u", "text": "t", "message_id": "m1"})
	}()
	select {
	case got := <-done:
		if got.status != http.StatusAccepted {
			t.Errorf("POST duplicate ?wait = %d %s, want 202 at the wait's deadline", got.status, got.body)
		}
	case <-time.After(10 * time.Second):
		close(hang) // the store gives up
		<-done
		t.Fatal("POST duplicate ?wait=200ms was not answered within 10s while the outbox read hung; want 202 at its deadline")
	}
}

func TestWaitRejected(t *testing.T) {
	rt := &fakeRuntime{}
	rt.setRespond(func(_ context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
		return ackFor(in, platforms.Rejected), platforms.ErrRejected
	})
	h := mustStart(t, Config{}, rt)
	got := h.post("/v1/messages?wait=10s", map[string]string{"chat_id": "c", "user_id": "u", "text": "t"})
	if got.status != http.StatusTooManyRequests || got.errCode() != CodeQueueFull {
		t.Errorf("POST ?wait rejected = %d %q, want 429 %q", got.status, got.errCode(), CodeQueueFull)
	}
	if n := h.p.waiterCount(); n != 0 {
		t.Errorf("waiters after a rejected wait = %d, want 0", n)
	}
}

// TestUnstoredMessagesAreNotLoggedEachTime: on a full disk every message is refused, and its
// client sends it again and again; the line that says so is logged once a minute, counting the
// others (repeats), not once per request. Before, a 10-chat load on a full disk logged two WRN
// lines per refused request (this one and the session's), 200 kB in 4 minutes.
func TestUnstoredMessagesAreNotLoggedEachTime(t *testing.T) {
	logs := &testutil.Buffer{}
	rt := &fakeRuntime{}
	rt.setRespond(func(context.Context, *platforms.Inbound) (*platforms.Ack, error) {
		return nil, fmt.Errorf("deliver: %w", platforms.ErrUnavailable)
	})
	h := mustStart(t, Config{Logger: slog.New(slog.NewTextHandler(logs, nil))}, rt)
	for i := range 10 {
		got := h.post("/v1/messages", map[string]string{"chat_id": "c", "user_id": "u", "text": "t", "message_id": fmt.Sprint("m", i)})
		if got.status != http.StatusServiceUnavailable || got.errCode() != CodeUnavailable {
			t.Fatalf("POST while messages cannot be stored = %d %s, want 503 unavailable", got.status, got.body)
		}
	}
	if n := strings.Count(logs.String(), "message not stored"); n != 1 {
		t.Errorf("10 unstored messages within a minute logged %d lines, want 1:\n%s", n, logs.String())
	}
}

// TestWaitTooLongForADurationIsTheMaximum: a wait too long for a time.Duration (292 years) is
// a longer wait than 5m like any other, read as 5m, as docs/HTTP-API.md says: the answer waits for the
// turn's end. One that is negative, or no duration, is still a 400 invalid_wait that says
// which. Before, time.ParseDuration's overflow made ?wait=100000000000000h a 400 saying it
// "must be a non-negative Go duration".
func TestWaitTooLongForADurationIsTheMaximum(t *testing.T) {
	rt := &fakeRuntime{}
	rt.setRespond(func(ctx context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
		rt.p.Send(ctx, reply(in, 1, "answer", true))
		return ackFor(in, platforms.Started), nil
	})
	h := mustStart(t, Config{}, rt)
	for _, wait := range []string{"100000000000000h", "9223372036854775808ns", "+2562048h", "1h99999999999999999999s"} {
		t.Run(wait, func(t *testing.T) {
			got := h.post("/v1/messages?wait="+url.QueryEscape(wait), map[string]string{"chat_id": "c", "user_id": "u", "text": "t", "message_id": "m-" + wait})
			if got.status != http.StatusOK {
				t.Fatalf("POST ?wait=%s = %d %s, want 200", wait, got.status, got.body)
			}
			want := []Reply{{Text: "answer", TurnID: "t1", Kind: "reply", Seq: 1}}
			if diff := cmp.Diff(want, mustDecode[MessageResponse](t, got).Replies); diff != "" {
				t.Errorf("replies mismatch (-want +got):\n%s", diff)
			}
		})
	}
	for _, tc := range []struct{ wait, says string }{
		{"-100000000000000h", "must not be negative"},
		{"-1s", "must not be negative"},
		{"100000000000000", "must be a Go duration"},
		{"100000000000000y", "must be a Go duration"},
		{"1h1", "must be a Go duration"},
		{".h", "must be a Go duration"},
	} {
		t.Run(tc.wait, func(t *testing.T) {
			got := h.post("/v1/messages?wait="+url.QueryEscape(tc.wait), map[string]string{"chat_id": "c", "user_id": "u", "text": "t"})
			if e := mustDecodeError(t, got); got.status != http.StatusBadRequest || e.Code != CodeInvalidWait || !strings.Contains(e.Message, tc.says) {
				t.Errorf("POST ?wait=%s = %d %s, want 400 %s saying it %s", tc.wait, got.status, got.body, CodeInvalidWait, tc.says)
			}
		})
	}
}

// TestCompressedBodyIsRefused: a body in a content coding agentgate does not decode (gzip, br)
// is a 415 unsupported_content_encoding with Accept-Encoding: identity (RFC 9110), whatever
// the bytes are, and is not delivered; identity is taken. Before, a gzipped body was read as
// text (a misleading 400 invalid_utf8), and a plain one labelled gzip was taken.
func TestCompressedBodyIsRefused(t *testing.T) {
	rt := &fakeRuntime{}
	h := mustStart(t, Config{}, rt)
	msg := `{"chat_id":"c","user_id":"u","text":"t"}`
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, encoding, body string
	}{
		{"gzipped", "gzip", gz.String()},
		{"plain, labelled gzip", "gzip", msg},
		{"br", "br", msg},
		{"identity, then gzip", "identity, gzip", gz.String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := h.do(http.MethodPost, "/v1/messages", map[string]string{"Content-Type": "application/json", "Content-Encoding": tc.encoding}, tc.body)
			e := mustDecodeError(t, got)
			if got.status != http.StatusUnsupportedMediaType || e.Code != CodeUnsupportedCoding || !strings.Contains(e.Message, "not supported") {
				t.Errorf("POST with Content-Encoding %s = %d %s, want 415 %s", tc.encoding, got.status, got.body, CodeUnsupportedCoding)
			}
			if ae := got.header.Get("Accept-Encoding"); ae != "identity" {
				t.Errorf("Accept-Encoding = %q, want identity", ae)
			}
		})
	}
	if n := len(rt.delivered()); n != 0 {
		t.Errorf("compressed bodies delivered %d times, want 0", n)
	}
	if got := h.do(http.MethodPost, "/v1/messages", map[string]string{"Content-Encoding": "Identity"}, msg); got.status != http.StatusAccepted {
		t.Errorf("POST with Content-Encoding identity = %d %s, want 202", got.status, got.body)
	}
}

// TestUnknownFieldNameIsCutShort: an unknown field's name is quoted in the error cut at 100
// characters, as a field named in another case is. Before, it was echoed whole: a name of
// 300,000 characters gave an error body of 300 KB.
func TestUnknownFieldNameIsCutShort(t *testing.T) {
	h := mustStart(t, Config{}, &fakeRuntime{})
	for _, tc := range []struct{ name, field, want string }{
		{"long", strings.Repeat("a", 300000), `unknown field "` + strings.Repeat("a", 100) + `"`},
		{"short", "admin", `unknown field "admin"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := h.do(http.MethodPost, "/v1/messages", jsonHeader, `{"chat_id":"c","user_id":"u","text":"t","`+tc.field+`":1}`)
			if e := mustDecodeError(t, got); got.status != http.StatusBadRequest || e.Code != CodeUnknownField || e.Message != tc.want || len(got.body) > 1024 {
				t.Errorf("POST with field %.20q… = %d with a body of %d bytes (%.300s), want 400 %s %q", tc.field, got.status, len(got.body), got.body, CodeUnknownField, tc.want)
			}
		})
	}
}

// TestRetryAfter: every 429 and 503 that a client may send again says in Retry-After when: a
// draining daemon how long its drain can still last (it takes nothing more in this run), an
// unavailable store or a full queue 1 s (the daemon tries the store again each second; a
// queue's place frees when its running turn ends, which nobody can foresee). An answer that
// sending again cannot change (409, 500) has none. Before, only the 429 (1 s) and
// too_many_held (5 s) had one: a client of a draining daemon, or of one whose store was down,
// was told nothing of when to come back.
func TestRetryAfter(t *testing.T) {
	const drain = 90 * time.Second
	// drained checks a draining daemon's Retry-After: what is left of drain, within the
	// test's own run time.
	drained := func(t *testing.T, what string, got response) {
		t.Helper()
		n, err := strconv.Atoi(got.header.Get("Retry-After"))
		if got.status != http.StatusServiceUnavailable || got.errCode() != CodeDraining || err != nil ||
			n > int(drain/time.Second) || n < int((drain-testTimeout)/time.Second) {
			t.Errorf("%s = %d %q Retry-After %q, want 503 %s with Retry-After %v or a little less",
				what, got.status, got.errCode(), got.header.Get("Retry-After"), CodeDraining, drain)
		}
	}
	msg := map[string]string{"chat_id": "c", "user_id": "u", "text": "t", "message_id": "m1"}

	for _, tc := range []struct {
		name       string
		err        error
		wantStatus int
		wantRetry  string // "" for none; "drain" for what is left of the drain
	}{
		{"queue full", platforms.ErrRejected, 429, "1"},
		{"store unavailable", fmt.Errorf("deliver: %w", platforms.ErrUnavailable), 503, "1"},
		{"not acknowledged in time", context.DeadlineExceeded, 503, "1"},
		{"runtime draining", fmt.Errorf("deliver: %w", platforms.ErrDraining), 503, "drain"},
		{"id of another conversation", platforms.ErrConflict, 409, ""},
		{"other", errors.New("boom"), 500, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := &fakeRuntime{}
			rt.setRespond(func(context.Context, *platforms.Inbound) (*platforms.Ack, error) { return nil, tc.err })
			h := mustStart(t, Config{DrainTimeout: drain}, rt)
			got := h.post("/v1/messages", msg)
			// A 503's message may have been stored: its answer names the id to send it again with.
			var e ErrorResponse
			if err := json.Unmarshal(got.body, &e); err != nil || (e.MessageID == "m1") != (got.status == http.StatusServiceUnavailable) {
				t.Errorf("POST = %d %s, want the message_id m1 named in a 503 and in nothing else", got.status, got.body)
			}
			if tc.wantRetry == "drain" {
				drained(t, "POST while the runtime drains", got)
				return
			}
			if got.status != tc.wantStatus || got.header.Get("Retry-After") != tc.wantRetry {
				t.Errorf("POST = %d %s Retry-After %q, want %d with Retry-After %q", got.status, got.body,
					got.header.Get("Retry-After"), tc.wantStatus, tc.wantRetry)
			}
		})
	}

	t.Run("drained", func(t *testing.T) {
		sessions := newFakeSessions()
		key := "agent:main:http:dm:c"
		sessions.infos[key] = &SessionInfo{SessionKey: key, SessionID: "s1"}
		sessions.resetErr = fmt.Errorf("reset session: %w: future: dead letter", ErrNotTaken) // as the daemon marks it
		h := mustStart(t, Config{Sessions: sessions, DrainTimeout: drain}, &fakeRuntime{})
		h.p.Drain()
		drained(t, "POST /v1/messages after Drain", h.post("/v1/messages", msg))
		drained(t, "POST reset after Drain", h.do(http.MethodPost, "/v1/sessions/"+key+"/reset", nil, ""))
		drained(t, "POST requeue after Drain", h.do(http.MethodPost, "/v1/sessions/"+key+"/messages/m1/requeue", nil, ""))
	})

	t.Run("a cluster member", func(t *testing.T) {
		// The other members take the message now: its client must not wait out this drain.
		h := mustStart(t, Config{DrainTimeout: drain, Clustered: true}, &fakeRuntime{})
		h.p.Drain()
		if got := h.post("/v1/messages", msg); got.status != http.StatusServiceUnavailable || got.header.Get("Retry-After") != "1" {
			t.Errorf("POST to a draining cluster member = %d %s Retry-After %q, want 503 with Retry-After 1", got.status, got.body, got.header.Get("Retry-After"))
		}
	})

	t.Run("default drain", func(t *testing.T) {
		h := mustStart(t, Config{}, &fakeRuntime{})
		h.p.Drain()
		got := h.post("/v1/messages", msg)
		if n, err := strconv.Atoi(got.header.Get("Retry-After")); err != nil || n > int(DefaultDrainTimeout/time.Second) || n < 1 {
			t.Errorf("POST after Drain without DrainTimeout: Retry-After %q, want at most %v", got.header.Get("Retry-After"), DefaultDrainTimeout)
		}
	})

	t.Run("the clock set back during the drain", func(t *testing.T) {
		// The drain began when the wall clock read an hour later than it does now (NTP set
		// it back since). Before, Retry-After said 3690: a client waited an hour for a
		// drain of 90 s.
		h := mustStart(t, Config{DrainTimeout: drain}, &fakeRuntime{})
		h.p.Drain()
		h.p.drainedAt.Store(time.Now().Add(time.Hour).UnixNano())
		drained(t, "POST after Drain, the clock set back an hour since", h.post("/v1/messages", msg))
	})

	t.Run("session queries", func(t *testing.T) {
		sessions := newFakeSessions()
		sessions.resetErr = fmt.Errorf("reset: %w", persistence.ErrUnavailable)
		sessions.requeueErr = &RefusedError{Code: CodeUnavailable, Message: "writes wait in the spool"}
		h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})
		for _, path := range []string{"/v1/sessions/agent:main:http:dm:c/reset", "/v1/sessions/agent:main:http:dm:c/messages/m1/requeue"} {
			got := h.do(http.MethodPost, path, nil, "")
			if got.status != http.StatusServiceUnavailable || got.header.Get("Retry-After") != "1" {
				t.Errorf("POST %s = %d %s Retry-After %q, want 503 with Retry-After 1", path, got.status, got.body, got.header.Get("Retry-After"))
			}
		}
		if got := h.do(http.MethodGet, "/v1/sessions/agent:main:http:dm:nope", nil, ""); got.header.Get("Retry-After") != "" {
			t.Errorf("GET an unknown session = %d, Retry-After %q; want none", got.status, got.header.Get("Retry-After"))
		}
	})
}

// TestDrainBecauseSaysWhy: a daemon that drains for a reason of its own (a cluster member that
// lost its membership) gives that reason as the message of every draining 503, in place of the
// plain stop's ("retry at its next start" is wrong when another member takes the chat now); a
// later plain Drain keeps it, and a plain Drain alone says what it said before.
func TestDrainBecauseSaysWhy(t *testing.T) {
	const reason = "this member is leaving: another member takes the chat; send the message again"
	key := "agent:main:http:dm:c"
	msg := map[string]string{"chat_id": "c", "user_id": "u", "text": "t", "message_id": "m1"}
	message := func(r response) string {
		var e ErrorResponse
		_ = json.Unmarshal(r.body, &e)
		return e.Error.Message
	}
	start := func(t *testing.T) *harness {
		sessions := newFakeSessions()
		sessions.infos[key] = &SessionInfo{SessionKey: key, SessionID: "s1"}
		sessions.resetErr = fmt.Errorf("reset session: %w: future: dead letter", ErrNotTaken) // as the daemon marks it
		return mustStart(t, Config{Sessions: sessions, Clustered: true}, &fakeRuntime{})
	}
	t.Run("with a reason", func(t *testing.T) {
		h := start(t)
		h.p.DrainBecause(reason)
		h.p.Drain() // the stop's own drain comes after
		for _, req := range []struct {
			what string
			send func() response
		}{
			{"POST /v1/messages", func() response { return h.post("/v1/messages", msg) }},
			{"POST reset", func() response { return h.do(http.MethodPost, "/v1/sessions/"+key+"/reset", nil, "") }},
			{"POST requeue", func() response { return h.do(http.MethodPost, "/v1/sessions/"+key+"/messages/m1/requeue", nil, "") }},
		} {
			got := req.send()
			if got.status != http.StatusServiceUnavailable || got.errCode() != CodeDraining || message(got) != reason ||
				got.header.Get("Retry-After") != "1" {
				t.Errorf("%s = %d %s Retry-After %q, want 503 %s saying %q with Retry-After 1", req.what, got.status, got.body,
					got.header.Get("Retry-After"), CodeDraining, reason)
			}
		}
	})
	t.Run("plain", func(t *testing.T) {
		h := start(t)
		h.p.Drain()
		if got := h.post("/v1/messages", msg); got.errCode() != CodeDraining || message(got) != "agentgate is draining and accepts no new messages" {
			t.Errorf("POST /v1/messages after Drain = %d %s, want the plain stop's message", got.status, got.body)
		}
	})
}

// TestMessageInFlightAtTheStopIsAnsweredDraining: a message whose delivery is still unanswered
// when the platform stops (a cluster member's router sending it again and again to a session on
// the member itself, whose session manager the daemon's stop has stopped) is answered 503
// draining as the platform stops, and the stop does not wait for it. Before, the delivery ran
// under the request's context alone: the stop waited out its 5 s for the request and then closed
// the connection, and the client got no answer at all.
//
// The stop not waiting shows in its log: the server's graceful shutdown found no handler left
// and did not time out ("http shutdown timed out"), as it did for the unanswered delivery.
func TestMessageInFlightAtTheStopIsAnsweredDraining(t *testing.T) {
	rt := &fakeRuntime{}
	logs := &testutil.Buffer{}
	h := mustStart(t, Config{Logger: slog.New(slog.NewTextHandler(logs, nil))}, rt)
	delivering := make(chan string, 1)
	rt.setRespond(func(ctx context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
		delivering <- in.MessageID
		<-ctx.Done() // as the cluster router, which sends it again until its context ends
		return nil, fmt.Errorf("deliver to %s: %w", in.Source.ChatID, ctx.Err())
	})
	type answer struct {
		status int
		body   []byte
		err    error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := h.client.Post(h.base+"/v1/messages", "application/json",
			strings.NewReader(`{"chat_id":"c","user_id":"u","text":"t"}`)) // agentgate makes its id
		if err != nil {
			answered <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		answered <- answer{status: resp.StatusCode, body: b, err: err}
	}()
	id := <-delivering
	h.stop()
	if line := grepLine(logs.String(), "http shutdown timed out"); line != "" {
		t.Errorf("the stop waited out its bound for the delivery: %s", line)
	}
	got := <-answered
	if got.err != nil {
		t.Fatalf("POST in flight at the stop: %v, want a 503 draining", got.err)
	}
	if r := (response{status: got.status, body: got.body}); r.status != http.StatusServiceUnavailable || r.errCode() != CodeDraining {
		t.Errorf("POST in flight at the stop = %d %s, want 503 %s", r.status, r.body, CodeDraining)
	}
	// It may have been stored: the answer names the id agentgate made, to send it again with.
	var e ErrorResponse
	if err := json.Unmarshal(got.body, &e); err != nil || e.MessageID != id || !strings.HasPrefix(id, "http-") {
		t.Errorf("POST in flight at the stop answered %s, want it to name its message_id %q", got.body, id)
	}
}

// TestAnswerCrossingTheStopIsTheClients: a delivery whose session answered with a refusal of
// the client's own (a full queue) just as the platform stopped is told that refusal, not 503
// draining: only a delivery the stop cut is answered so.
func TestAnswerCrossingTheStopIsTheClients(t *testing.T) {
	rt := &fakeRuntime{}
	h := mustStart(t, Config{}, rt)
	delivering := make(chan struct{})
	rt.setRespond(func(ctx context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
		close(delivering)
		<-ctx.Done() // the stop; the session's answer crosses it
		return nil, platforms.ErrRejected
	})
	answered := make(chan response, 1)
	go func() {
		answered <- h.post("/v1/messages", map[string]string{"chat_id": "c", "user_id": "u", "text": "t", "message_id": "m1"})
	}()
	<-delivering
	h.stop()
	if got := <-answered; got.status != http.StatusTooManyRequests || got.errCode() != CodeQueueFull {
		t.Errorf("POST whose queue-full answer crossed the stop = %d %s, want 429 %s", got.status, got.body, CodeQueueFull)
	}
}
