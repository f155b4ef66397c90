package openai_test

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
)

// streamErrorRun is what a turn whose model streamed body ended with: its error, the results
// the agent counted for its requests, how many requests the model got, and how often the user
// was shown text.
type streamErrorRun struct {
	err      error
	results  []string
	requests int
	partials int
}

// runStream runs a turn against a model that streams body to every request.
func runStream(t *testing.T, body string) streamErrorRun {
	t.Helper()
	m := newFakeModel(t, openaitest.Raw("text/event-stream", body))
	var got streamErrorRun
	a := MustAgent(t, m, nil, nil, func(c *openai.Config) { c.Requests = func(r string) { got.results = append(got.results, r) } })
	resp, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}, Partial: func(string) { got.partials++ }})
	if err == nil {
		t.Fatalf("Run = %+v, want an error", resp)
	}
	got.err, got.requests = err, m.Count()
	return got
}

// TestStreamErrorThatIsNoJSON: an event of a stream that is an error whose text is no JSON,
// crane-serve's "data: error: <message>" (lucasjinreal/Crane#121) or an "event: error" whose
// data is plain text (or null), is the server's error: its text is the StatusError's message,
// which the turn's error (the line the operator reads) holds, quoted, and it is a fault of the
// server, counted, retried and told the user as an error object of type server_error in a
// "data:" event is (taken for a 500; not retried after text was shown). An "event: error" of
// JSON that is no error object is read as an error object that names no code or type (an
// error that names no status, not retried). Its text is cut to the message's bound, without
// control characters or the key. Before 3ce2e12, it failed the turn as a chunk that is no chat
// completion: a bad reply, the server's message unsaid; before this, as an error that names no
// status, counted refused and not retried, though what sends it so is an engine that failed
// mid-request or a proxy.
func TestStreamErrorThatIsNoJSON(t *testing.T) {
	const text = `data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}` + "\n\n"
	for _, tc := range []struct {
		name, body string
		asJSON     string // the same error as an error object in a "data:" event
		want       string // the StatusError's message
		quoted     bool   // want is the server's text, quoted in the error
	}{
		{"crane-serve's error data",
			"data: error: engine failed: CUDA out of memory\n\n",
			`data: {"error":{"message":"engine failed: CUDA out of memory","type":"server_error"}}` + "\n\n",
			"engine failed: CUDA out of memory", true},
		{"an error event of plain text",
			"event: error\ndata: upstream timed out\n\ndata: [DONE]\n\n",
			`data: {"error":{"message":"upstream timed out","type":"server_error"}}` + "\n\ndata: [DONE]\n\n",
			"upstream timed out", true},
		{"an error event of JSON without an error member",
			"event: error\ndata: {\"message\":\"Compute error.\"}\n\ndata: [DONE]\n\n",
			`data: {"error":{"message":"Compute error."}}` + "\n\ndata: [DONE]\n\n",
			"Compute error.", false},
		{"an error event of null",
			"event: error\ndata: null\n\ndata: [DONE]\n\n",
			`data: {"error":{"message":"an error without a message","type":"server_error"}}` + "\n\ndata: [DONE]\n\n",
			"an error without a message", false},
		{"after text",
			text + "event: error\r\ndata: Error: the model stopped\r\n\r\n",
			text + `data: {"error":{"message":"Error: the model stopped","type":"server_error"}}` + "\n\n",
			"Error: the model stopped", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, want := runStream(t, tc.body), runStream(t, tc.asJSON)
			se, ok := errors.AsType[*openai.StatusError](got.err)
			shows := tc.want
			if tc.quoted {
				shows = strconv.Quote(tc.want) // the server's own text: where it starts and ends
			}
			if !ok || se.Message != tc.want || !strings.Contains(got.err.Error(), shows) {
				t.Fatalf("Run error = %v (%T), want a StatusError with the server's message %s", got.err, got.err, shows)
			}
			wantSE, _ := errors.AsType[*openai.StatusError](want.err)
			_, isRef := errors.AsType[*agents.Refusal](got.err)
			_, wantRef := errors.AsType[*agents.Refusal](want.err)
			if se.Code != wantSE.Code || isRef != wantRef || got.requests != want.requests || got.partials != want.partials || !slices.Equal(got.results, want.results) {
				t.Errorf("Run: status %d, Refusal %v, %d requests, %d partials, results %q; want as the JSON error: status %d, Refusal %v, %d requests, %d partials, results %q",
					se.Code, isRef, got.requests, got.partials, got.results, wantSE.Code, wantRef, want.requests, want.partials, want.results)
			}
		})
	}
	t.Run("bad text", func(t *testing.T) {
		long := "\x1b[31mkey " + testKey + "\x00\x07 " + strings.Repeat("é", 5000)
		for _, body := range []string{"data: error: " + long + "\n\n", "event: error\ndata: " + long + "\n\n"} {
			got := runStream(t, body)
			se, ok := errors.AsType[*openai.StatusError](got.err)
			if !ok || !strings.Contains(se.Message, "key ") || !strings.HasSuffix(se.Message, "é…") || utf8.RuneCountInString(se.Message) > 201 {
				t.Fatalf("Run error = %v, want a StatusError whose message is the text cut to 200 characters", got.err)
			}
			if strings.ContainsAny(se.Message, "\x1b\x00\x07") || strings.Contains(got.err.Error(), testKey) {
				t.Errorf("Run error = %q, want it without control characters or the key", got.err)
			}
		}
	})
}

// TestStreamChunkThatIsNoJSON: a stream's data that is no chat completion, and no error
// (streamError), fails the turn as a bad reply, not retried, with the start of the data in its
// error, quoted, bounded, and without the key or control characters: an operator reads what the
// server or a proxy sent. Before, the error said only what encoding/json met ("invalid
// character 'p' looking for beginning of value").
func TestStreamChunkThatIsNoJSON(t *testing.T) {
	for _, tc := range []struct{ name, data, want string }{
		{"Python's repr of a chunk", `{'choices': [{'delta': {'content': 'Hel'}}]}`, `starting "{'choices': [{'delta': {'content': 'Hel'}}]}"`},
		{"a proxy's keep-alive", "ping", `starting "ping"`},
		{"long, with the key", "token " + testKey + "\x07 " + strings.Repeat("ab ", 5000), `starting "token [redacted] ` + strings.Repeat("ab ", 61) + `…"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := runStream(t, "data: "+tc.data+"\n\ndata: [DONE]\n\n")
			if !strings.Contains(got.err.Error(), "stream chunk is not a chat completion") || !strings.Contains(got.err.Error(), tc.want) {
				t.Fatalf("Run error = %v, want one holding %s", got.err, tc.want)
			}
			if got.requests != 1 || !slices.Equal(got.results, []string{openai.ResultBadReply}) {
				t.Errorf("the model got %d requests, counted %q; want 1, a bad reply", got.requests, got.results)
			}
		})
	}
}

// TestErrorTextInAJSONStringIsQuotedOnce: an error whose text is a JSON string, an "event:
// error" whose data is one (`data: "model overloaded"`, as a JSON encoder writes a message),
// crane-serve's "data: error: " before one, or an error status's body that is one, is the
// string's text: the StatusError's message, quoted once in the error, its escapes decoded (a
// newline made a space, as sanitize makes one). A JSON string of an error event's MiB is read
// from its start alone (stringHead), as plain text is. Before, its quotes were read as its text, and
// the error quoted them again: `"\"model overloaded\""`.
func TestErrorTextInAJSONStringIsQuotedOnce(t *testing.T) {
	long := `"` + strings.Repeat(`model overloaded\n`, (1<<20)/len(`model overloaded\n`)) + `"`
	for _, tc := range []struct {
		name   string
		answer http.HandlerFunc
		stream bool
		want   string // the StatusError's message, quoted in the error unless it is agentgate's
	}{
		{"an error event", openaitest.Raw("text/event-stream", "event: error\ndata: \"model overloaded\"\n\n"), true, "model overloaded"},
		{"crane-serve's error data", openaitest.Raw("text/event-stream", "data: error: \"engine failed: CUDA out of memory\"\n\n"), true, "engine failed: CUDA out of memory"},
		{"with escapes", openaitest.Raw("text/event-stream", "event: error\ndata: \"worker \\\"gpu-0\\\" died:\\nsee caf\\u00e9 \\ud83d\\ude00\"\n\n"), true, `worker "gpu-0" died: see café 😀`},
		{"an error status's body", openaitest.Status(http.StatusServiceUnavailable, `"model overloaded"`), false, "model overloaded"},
		{"an empty one", openaitest.Raw("text/event-stream", "event: error\ndata: \"\"\n\n"), true, "an error without a message"},
		{"of a MiB", openaitest.Raw("text/event-stream", "event: error\ndata: "+long+"\n\n"), true, strings.Repeat("model overloaded ", 12)[:200] + "…"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(t, tc.answer)
			a := MustAgent(t, m, nil, nil, func(c *openai.Config) { c.MaxRetries = 0 })
			req := &agents.Request{Messages: []agents.Message{msg("user", "hi")}}
			if tc.stream {
				req.Partial = func(string) {}
			}
			_, err := a.Run(t.Context(), req)
			se, ok := errors.AsType[*openai.StatusError](err)
			if !ok || se.Message != tc.want {
				t.Fatalf("Run error = %v, want a StatusError whose message is %q", err, tc.want)
			}
			shows := ": " + strconv.Quote(tc.want)
			if tc.want == "an error without a message" {
				shows = ": " + tc.want
			}
			if !strings.HasSuffix(err.Error(), shows) {
				t.Errorf("Run error = %v, want it to end %s", err, shows)
			}
		})
	}
}
