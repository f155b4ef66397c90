package openai

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestReadStreamShapes(t *testing.T) {
	a := &Agent{key: &apiKey{"sk-internal-0123456789"}}
	tests := []struct {
		name, body string
		want       string
		partials   int
	}{
		{"CRLF, comments and DONE", ": hi\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\r\n\r\ndata: [DONE]\r\n\r\n", "ab", 2},
		{"no DONE, no final blank line", "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"y\"},\"finish_reason\":\"stop\"}]}", "xy", 2},
		// A refusal is kept apart (result.refusal): it is no part of the reply.
		{"content parts and refusal", "data: {\"choices\":[{\"delta\":{\"content\":[{\"type\":\"text\",\"text\":\"p1\"}]}}]}\n\ndata: {\"choices\":[{\"delta\":{\"refusal\":\"no\"}}]}\n\ndata: [DONE]\n\n", "p1", 1},
		{"lone CRs end lines", ": hi\rdata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\rdata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\r\rdata: [DONE]\r\r", "ab", 2},
		{"every line end in one stream", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\rdata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"c\"}}]}\r\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"d\"}}]}\n\ndata: [DONE]\r", "abcd", 4},
		{"DONE without its blank line", "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]", "x", 1},
		{"event and id fields are ignored", "event: message\nid: 3\ndata: {\"choices\":[{\"delta\":{\"content\":\"z\"}}]}\n\ndata: [DONE]\n\n", "z", 1},
		// An event's type is its own: it ends at the blank line that ends the event, also one
		// without data (an "error" event's type would otherwise make the next chunk an error).
		{"an event's type ends with it", "event: error\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"z\"}}]}\n\ndata: [DONE]\n\n", "z", 1},
		{"events of other types are chunks", "event: ping\ndata: {\"type\":\"ping\"}\n\nevent: content_block_delta\ndata: {\"choices\":[{\"delta\":{\"content\":\"z\"}}]}\n\ndata: [DONE]\n\n", "z", 1},
		// Only data that is no JSON is read for "error:" (streamError): a reply that says it is text.
		{"a reply that begins with error:", "data: {\"choices\":[{\"delta\":{\"content\":\"error: none\"}}]}\n\ndata: [DONE]\n\n", "error: none", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := 0
			res, err := a.readStream(strings.NewReader(tt.body), func(string) { n++ }, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.text != tt.want || n != tt.partials {
				t.Errorf("readStream = %q with %d partials, want %q with %d", res.text, n, tt.want, tt.partials)
			}
		})
	}
	if _, err := a.readStream(strings.NewReader(""), func(string) {}, nil); err == nil {
		t.Error("readStream of an empty body: no error")
	}
}

// endlessData is a stream body of data lines that never ends its event with a blank line. It
// counts what is read of it and ends (EOF) after limit bytes.
type endlessData struct {
	read, limit int
}

func (e *endlessData) Read(p []byte) (int, error) {
	if e.read >= e.limit {
		return 0, io.EOF
	}
	line := "data: " + strings.Repeat("x", 1000) + "\n"
	n := 0
	for n < len(p) && e.read < e.limit {
		c := copy(p[n:], line[e.read%len(line):])
		n += c
		e.read += c
	}
	return n, nil
}

// TestReadStreamBoundsAnEvent: an event's data lines are bounded as a whole, not only one by
// one: an endpoint (or a proxy) that sends data lines without the blank line that ends an event
// must not make the agent hold all of them until the turn's timeout.
func TestReadStreamBoundsAnEvent(t *testing.T) {
	a := &Agent{key: &apiKey{"sk-internal-0123456789"}}
	body := &endlessData{limit: 16 * maxLine}
	_, err := a.readStream(body, func(string) {}, nil)
	if err == nil {
		t.Fatal("readStream of an event without end: no error")
	}
	// What is read past maxLine: the "data: " before each 1000 bytes, and a buffer.
	if body.read > maxLine+maxLine/100+128<<10 {
		t.Errorf("readStream read %d bytes of one event before it failed (%v), want at most about %d", body.read, err, maxLine)
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		header, ms, azureMs string
		want                time.Duration
	}{
		{"7", "", "", 7 * time.Second},
		{"0", "", "", 0},
		{"-3", "", "", 0},
		{"soon", "", "", 0},
		{now.Add(90 * time.Second).Format(http.TimeFormat), "", "", 90 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), "", "", 0},
		{"2", "250", "", 250 * time.Millisecond},
		// Fractional seconds, which RFC 9110 does not allow but servers and proxies send (a
		// rate limiter's exact remainder): before, the wait they asked for was ignored.
		{"0.5", "", "", 500 * time.Millisecond},
		{" 1.25 ", "", "", 1250 * time.Millisecond},
		{"2.", "", "", 2 * time.Second},
		{"0.0", "", "", 0},
		{"-0.5", "", "", 0},
		{"1e3", "", "", 0},
		{"NaN", "", "", 0},
		{"Inf", "", "", 0},
		{"1.2.3", "", "", 0},
		// A wait past maxRetryAfter is read as that: before, one over 10^9 s was read as none.
		{"999999999", "", "", 999999999 * time.Second},
		{"99999999999", "", "", maxRetryAfter},
		{"1" + strings.Repeat("0", 400), "", "", maxRetryAfter},
		{"Fri, 31 Dec 9999 23:59:59 GMT", "", "", maxRetryAfter},
		{"2", "100000000000000000000", "", maxRetryAfter},
		// Azure OpenAI's own name for retry-after-ms.
		{"2", "", "800", 800 * time.Millisecond},
		{"", "", "1500.5", 1500*time.Millisecond + 500*time.Microsecond},
		{"2", "300", "800", 300 * time.Millisecond},
	} {
		h := http.Header{}
		if tt.header != "" {
			h.Set("Retry-After", tt.header)
		}
		if tt.ms != "" {
			h.Set("Retry-After-Ms", tt.ms)
		}
		if tt.azureMs != "" {
			h.Set("X-Ms-Retry-After-Ms", tt.azureMs)
		}
		if got := retryAfter(h, now); got != tt.want {
			t.Errorf("retryAfter(%q, ms %q, x-ms %q) = %v, want %v", tt.header, tt.ms, tt.azureMs, got, tt.want)
		}
	}
}

func TestSanitize(t *testing.T) {
	key := "k3y-value-that-is-secret"
	for _, tt := range []struct{ in, want string }{
		{"bad key " + key, "bad key [redacted]"},
		{"Authorization: Bearer abc.def", "Authorization: Bearer [redacted]"},
		{"got sk-proj-ABCDEFGHIJ12 here", "got [redacted] here"},
		// internal/redact's rules, which this package missed before it used them.
		{"proxy said Authorization: Basic dXNlcjpzM2NyZXQ=", "proxy said Authorization: Basic [redacted]"},
		{"dial postgres://agent:s3cret@db/x: refused", "dial postgres://agent:[redacted]@db/x: refused"},
		{`bad config {"api_key": "k1"} password=p2 here`, `bad config {"api_key": "[redacted]"} password=[redacted] here`},
		{"ghp_0123456789abcdefghij0123 xoxb-1234567890-abc", "[redacted] [redacted]"},
		// The package's own rule: an opaque token of 40 or more characters.
		{"session " + strings.Repeat("aZ-9x", 8) + " expired", "session [redacted] expired"},
		{"session " + strings.Repeat("aZ-9x", 7) + " kept", "session " + strings.Repeat("aZ-9x", 7) + " kept"},
		{"line one\n\tline two\x00", "line one line two"},
		{strings.Repeat("é", 300), strings.Repeat("é", maxErrorMessage) + "…"},
	} {
		if got := sanitize(tt.in, key); got != tt.want {
			t.Errorf("sanitize(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestCutAt(t *testing.T) {
	for _, tt := range []struct {
		s    string
		n    int
		want string
	}{{"héllo", 10, "héllo"}, {"héllo", 2, "h"}, {"héllo", 3, "hé"}, {"é", 1, ""}} {
		if got := cutAt(tt.s, tt.n); got != tt.want {
			t.Errorf("cutAt(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
		}
	}
}

// TestErrorMessage: the message of an error body is found in the shapes endpoints send; before,
// a 422 of pydantic's validation errors (FastAPI's, Mistral's) logged no message at all, or the
// whole body, with the input it echoes.
func TestErrorMessage(t *testing.T) {
	for _, tt := range []struct{ body, want string }{
		{`{"error":{"message":"Unknown parameter: 'seed'."}}`, "Unknown parameter: 'seed'."},
		{`{"error":"bad gateway"}`, "bad gateway"},
		{`{"object":"error","message":"context too long"}`, "context too long"},
		{`{"detail":[{"type":"extra_forbidden","loc":["body","stream_options"],"msg":"Extra inputs are not permitted","input":{"include_usage":true}}]}`,
			"body.stream_options: Extra inputs are not permitted"},
		{`{"object":"error","message":{"detail":[{"loc":["body","messages",0,"user","name"],"msg":"Extra inputs are not permitted","input":"Ann"},{"loc":["body","n"],"msg":"Extra inputs are not permitted","input":2}]},"type":"invalid_request_error"}`,
			"body.messages.0.user.name: Extra inputs are not permitted; body.n: Extra inputs are not permitted"},
		{`{"detail":"Not Found"}`, "Not Found"},
		{`{"message":{"text":"odd"}}`, `{"message":{"text":"odd"}}`},
		{`{"id":"x"}`, ""},
		{`upstream timed out`, "upstream timed out"},
	} {
		if got := errorMessage([]byte(tt.body)); got != tt.want {
			t.Errorf("errorMessage(%s) = %q, want %q", tt.body, got, tt.want)
		}
	}
}
