package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/platformtest"
	"github.com/google/go-cmp/cmp"
)

// openaiKey is the API key of the runtime tests; no log line, metric, API answer or database
// byte may ever contain it.
const openaiKey = "sk-agentgate-test-7d1e0c9b5a3f28e64c1d9b7a5e3f1c0d"

// newModel starts a fake model that answers the n-th request (from 1) with answer, once it
// carries the test key (a request without it gets 401).
func newModel(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) *openaitest.Model {
	t.Helper()
	return openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+openaiKey {
			http.Error(w, "wrong key", http.StatusUnauthorized)
			return
		}
		answer(n, w, r)
	})
}

// useOpenAI configures the openai backend against m with the test key.
func useOpenAI(t *testing.T, m *openaitest.Model, more func(*config.OpenAI)) func(*config.Config) {
	t.Setenv("AGENTGATE_TEST_OPENAI_KEY", openaiKey)
	return func(c *config.Config) {
		c.Agent.Backend = "openai"
		o := &c.Agent.OpenAI
		o.BaseURL, o.Model, o.APIKeyEnv = m.URL(), "test-model", "AGENTGATE_TEST_OPENAI_KEY"
		if more != nil {
			more(o)
		}
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestOpenAIRequestsThroughTheRuntime runs the configured openai agent in a shared thread and
// checks the exact body of each request: the system prompt, the senders' prefixes in history
// and new messages (also after a restart reloaded the history from the store), the history
// trimmed to max_history 3 and then to token_budget 41 (estimates: system prompt 8, "[Ann] hi"
// 6, "Hello Ann." 7, "[bob] me too" 7, "Hi Bob." 6, "[Ann] third" 7, "Third reply." 7), and the
// continuity note after an idle reset. Each turn's tokens add up on its session row, in
// GET /v1/sessions/{key} and in agentgate_agent_tokens_total.
func TestOpenAIRequestsThroughTheRuntime(t *testing.T) {
	replies := []string{"Hello Ann.", "Hi Bob.", "Third reply.", "Long answer.", "Fresh start."}
	m := newModel(t, func(n int, w http.ResponseWriter, r *http.Request) {
		openaitest.WriteReply(w, replies[n-1], int64(100*n), int64(10*n))
	})
	clk := testutil.NewClock(t0)
	dir := t.TempDir()
	tweak := useOpenAI(t, m, func(o *config.OpenAI) { o.SystemPrompt, o.MaxHistory, o.TokenBudget = "You are a test.", 3, 41 })
	withReset := func(c *config.Config) { tweak(c); idleHour(c) }
	r := startClocked(t, dir, clk, nil, withReset)
	thread := func(user, name string) identity.Source {
		return identity.Source{Platform: "fake", ChatType: identity.ChatThread, ChatID: "chan", ThreadID: "th", UserID: user, UserName: name}
	}
	ann, bob := thread("ann", "Ann"), thread("bob", "") // bob has no name: his id stands for it
	sys := `{"role":"system","content":"You are a test."}`
	check := func(n int, want string) {
		t.Helper()
		if got := m.Body(t, n); got != compactJSON(t, want) {
			t.Errorf("request %d\n got %s\nwant %s", n, got, compactJSON(t, want))
		}
	}

	first := r.inject(t, ann, "t1", "hi")
	r.waitReplyTo(t, "t1")
	r.inject(t, bob, "t2", "me too")
	r.waitReplyTo(t, "t2")
	check(1, `{"model":"test-model","messages":[`+sys+`,{"role":"user","content":"[Ann] hi"}]}`)
	check(2, `{"model":"test-model","messages":[`+sys+`,{"role":"user","content":"[Ann] hi"},{"role":"assistant","content":"Hello Ann."},
		{"role":"user","content":"[bob] me too"}]}`)
	if s := r.session(t, first.SessionID); s.InputTokens != 300 || s.OutputTokens != 30 {
		t.Errorf("session tokens = %d/%d, want 300/30", s.InputTokens, s.OutputTokens)
	}
	fams := r.scrape(t)
	if in, out := value(fams, "agentgate_agent_tokens_total", "direction", "input"), value(fams, "agentgate_agent_tokens_total", "direction", "output"); in != 300 || out != 30 {
		t.Errorf("agentgate_agent_tokens_total = %v in, %v out; want 300, 30", in, out)
	}

	// A restart reloads the history from the store, prefixes included. max_history 3 keeps
	// [Hello Ann., [bob] me too, Hi Bob.] (35 tokens with the rest, within the budget), less the
	// assistant message it would start with.
	r.stop(t)
	r = startClocked(t, dir, clk, nil, withReset)
	defer r.stop(t)
	r.inject(t, ann, "t3", "third")
	r.waitReplyTo(t, "t3")
	check(3, `{"model":"test-model","messages":[`+sys+`,{"role":"user","content":"[bob] me too"},{"role":"assistant","content":"Hi Bob."},
		{"role":"user","content":"[Ann] third"}]}`)

	// A long message: max_history keeps [Hi Bob., [Ann] third, Third reply.], but with the 20
	// tokens of the new message only Third reply. fits the budget, and it would start the history.
	long := "again: " + strings.Repeat("x", 51)
	r.inject(t, ann, "t4", long)
	r.waitReplyTo(t, "t4")
	check(4, `{"model":"test-model","messages":[`+sys+`,{"role":"user","content":`+jsonString("[Ann] "+long)+`}]}`)
	info := r.getSession(t, first.SessionKey)
	if info.InputTokens != 1000 || info.OutputTokens != 100 {
		t.Errorf("GET /v1/sessions/{key} tokens = %d/%d, want 1000/100", info.InputTokens, info.OutputTokens)
	}

	// After an idle reset the new session's first turn gets the continuity note (in the one
	// system message, after the prompt), and no history.
	clk.Advance(2 * time.Hour)
	fresh := r.inject(t, ann, "t5", "back")
	r.waitReplyTo(t, "t5")
	var why string
	for _, o := range r.fake.Sent() {
		if o.Kind == platforms.KindNotice && strings.Contains(o.Text, "reset automatically (") {
			why = o.Text[strings.Index(o.Text, "(")+1 : strings.Index(o.Text, ")")]
		}
	}
	note := fmt.Sprintf("This conversation continues an earlier session %s, which was reset automatically (%s); search that session before assuming an unrelated one is the right context.", first.SessionID, why)
	check(5, `{"model":"test-model","messages":[{"role":"system","content":`+jsonString("You are a test.\n\n"+note)+`},{"role":"user","content":"[Ann] back"}]}`)
	if s := r.session(t, fresh.SessionID); s.InputTokens != 500 || s.OutputTokens != 50 {
		t.Errorf("new session tokens = %d/%d, want 500/50 (its own turn only)", s.InputTokens, s.OutputTokens)
	}
}

// getSession reads GET /v1/sessions/{key}.
func (r *runtime) getSession(t *testing.T, key string) struct{ InputTokens, OutputTokens int64 } {
	t.Helper()
	resp, err := http.Get("http://" + r.d.Addr().String() + "/v1/sessions/" + url.PathEscape(key))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET session %s: %d %v", key, resp.StatusCode, err)
	}
	return struct{ InputTokens, OutputTokens int64 }{info.InputTokens, info.OutputTokens}
}

func compactJSON(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatalf("compact %s: %v", s, err)
	}
	return b.String()
}

// waitDrafts waits until cond holds for the editor's drafts.
func (r *runtime) waitDrafts(t *testing.T, what string, cond func([]platformtest.Draft) bool) []platformtest.Draft {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ds, err := r.editor.WaitDrafts(ctx, cond)
	if err != nil {
		t.Fatalf("%s: %v; drafts %+v", what, err, ds)
	}
	return ds
}

func draftShows(n int, text string) func([]platformtest.Draft) bool {
	return func(ds []platformtest.Draft) bool { return len(ds) >= n && ds[n-1].Text() == text }
}

// TestOpenAIStreamsIntoADraft: on a platform that can edit, the reply streams into a draft that
// grows in place, and the final reply finishes that draft (DraftID); on the HTTP platform the
// same agent asks for one reply. With a long draft interval the edits in between are dropped.
func TestOpenAIStreamsIntoADraft(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
	}{{"every edit", time.Nanosecond}, {"throttled", time.Hour}} {
		t.Run(tc.name, func(t *testing.T) {
			gate := make(chan struct{})
			m := newModel(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					openaitest.WriteStream(w, r, gate, 11, 3, "Hel", "lo", " world")
					return
				}
				openaitest.WriteReply(w, "plain reply", 5, 2)
			})
			r := MustStartDaemon(t, nil, daemonOpts{editor: true, draftInterval: tc.interval, tweak: useOpenAI(t, m, nil)})
			defer r.stop(t)
			ack := r.inject(t, dm, "m1", "hi")
			r.waitDrafts(t, "first draft", draftShows(1, "Hel"))
			gate <- struct{}{}
			if tc.interval == time.Nanosecond {
				r.waitDrafts(t, "an edit", draftShows(1, "Hello"))
			}
			gate <- struct{}{}
			r.waitReplyTo(t, "m1")
			ds := r.editor.Drafts()
			wantTexts := []string{"Hel", "Hello world"}
			if tc.interval == time.Nanosecond {
				// The edit to the last partial may or may not beat the final reply.
				wantTexts = []string{"Hel", "Hello", "Hello world"}
				if len(ds) == 1 && len(ds[0].Texts) == 4 {
					wantTexts = []string{"Hel", "Hello", "Hello world", "Hello world"}
				}
			}
			want := []platformtest.Draft{{ID: "draft-1", Target: identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1", UserID: "u1"},
				InReplyTo: []string{"m1"}, Texts: wantTexts, Final: true}}
			if d := cmp.Diff(want, ds); d != "" {
				t.Errorf("drafts mismatch (-want +got):\n%s", d)
			}
			sent := r.fake.Sent()
			if len(sent) != 1 || sent[0].DraftID != "draft-1" || sent[0].Text != "Hello world" || sent[0].Kind != platforms.KindReply {
				t.Errorf("sent %+v, want one reply \"Hello world\" finishing draft-1", sent)
			}
			if !strings.Contains(m.Body(t, 1), `"stream":true,"stream_options":{"include_usage":true}`) {
				t.Errorf("request 1 does not stream: %s", m.Body(t, 1))
			}
			if s := r.session(t, ack.SessionID); s.InputTokens != 11 || s.OutputTokens != 3 {
				t.Errorf("session tokens = %d/%d, want 11/3 from the stream", s.InputTokens, s.OutputTokens)
			}

			// The HTTP platform cannot edit: one reply, no stream.
			resp, err := http.Post("http://"+r.d.Addr().String()+"/v1/messages?wait=30s", "application/json",
				strings.NewReader(`{"chat_id":"h1","user_id":"u","text":"plain"}`))
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), `"plain reply"`) {
				t.Errorf("HTTP answer %d %s, want the reply", resp.StatusCode, raw)
			}
			if b := m.Body(t, 2); strings.Contains(b, "stream") {
				t.Errorf("request from the HTTP platform streams: %s", b)
			}
		})
	}
}

// TestOpenAIInterruptCancelsTheRequest: in queue mode interrupt, a new message cancels the
// running turn: the model's server sees the request's context end, the draft is marked
// interrupted and never finished, and only the new message is answered (in a draft of its own).
func TestOpenAIInterruptCancelsTheRequest(t *testing.T) {
	cancelled := make(chan struct{})
	// The second answer ends once its draft shows: a turn that ended before its draft was
	// posted (the post queued behind draft-1's interrupted mark, on a loaded host) sends its
	// reply without one.
	shown := make(chan struct{})
	m := newModel(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"partial answer\"}}]}\n\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			close(cancelled)
			return
		}
		openaitest.WriteStream(w, r, shown, 7, 2, "second", "")
	})
	r := MustStartDaemon(t, nil, daemonOpts{editor: true, draftInterval: time.Nanosecond,
		tweak: func(c *config.Config) { useOpenAI(t, m, nil)(c); c.Sessions.Queue.Mode = "interrupt" }})
	defer r.stop(t)
	r.inject(t, dm, "m1", "long question")
	r.waitDrafts(t, "draft of m1", draftShows(1, "partial answer"))
	if ack := r.inject(t, dm, "m2", "never mind, this"); ack.Disposition != platforms.Interrupted {
		t.Errorf("m2 disposition %s, want interrupted", ack.Disposition)
	}
	select {
	case <-cancelled:
	case <-time.After(30 * time.Second):
		t.Fatal("the model never saw the interrupted request cancelled")
	}
	r.waitDrafts(t, "draft of m2", draftShows(2, "second"))
	close(shown)
	r.waitReplyTo(t, "m2")
	ds := r.waitDrafts(t, "interrupted mark", draftShows(1, "partial answer"+"\n\n⏹ (interrupted)"))
	if ds[0].Final || len(ds) != 2 || !ds[1].Final || ds[1].Text() != "second" {
		t.Errorf("drafts %+v, want draft-1 interrupted and never finished, draft-2 finished with the reply", ds)
	}
	for _, o := range r.fake.Sent() {
		if fmt.Sprint(o.InReplyTo) != "[m1 m2]" || o.DraftID != "draft-2" { // it answers the interrupted m1 too
			t.Errorf("sent %+v; only m2's reply, finishing draft-2, may be sent", o)
		}
	}
}

// logSignal is a log sink that closes a channel once a line contains a string.
type logSignal struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	want  string
	ready chan struct{}
}

func (s *logSignal) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Write(p)
	if s.ready != nil && strings.Contains(s.buf.String(), s.want) {
		close(s.ready)
		s.ready = nil
	}
	return len(p), nil
}

func (s *logSignal) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// contentFiltered is a completion its content filter left with no text.
const contentFiltered = `{"choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"content_filter"}],"usage":{"prompt_tokens":20,"completion_tokens":0}}`

// mustSteerIntoFirstCall starts a daemon in queue mode steer on a model that answers the n-th
// request with answer(n), and steers a message into the turn of the first: s1 "question" starts
// a turn whose first call waits, s2 "and also this" is steered into it, and once the agent has
// taken s2 the first call is answered. It returns s1's ack; the daemon stops when the test ends.
func mustSteerIntoFirstCall(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) (*runtime, *openaitest.Model, *platforms.Ack) {
	t.Helper()
	release := make(chan struct{})
	m := newModel(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			select {
			case <-release:
			case <-r.Context().Done(): // the test failed before the release, and the daemon stopped
				return
			}
		}
		answer(n, w, r)
	})
	logs := &logSignal{want: "steered message taken", ready: make(chan struct{})}
	taken := logs.ready
	r := MustStartDaemon(t, nil, daemonOpts{logs: logs,
		tweak: func(c *config.Config) { useOpenAI(t, m, nil)(c); c.Sessions.Queue.Mode = "steer" }})
	t.Cleanup(func() { r.stop(t) })
	first := r.inject(t, dm, "s1", "question")
	m.WaitRequests(t, 1)
	if ack := r.inject(t, dm, "s2", "and also this"); ack.Disposition != platforms.Steered {
		t.Fatalf("s2 disposition %s, want steered", ack.Disposition)
	}
	select {
	case <-taken:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent never took the steered message")
	}
	close(release)
	return r, m, first
}

// sentTo lists the replies sent so far, each as its InReplyTo and its text ("[s1] First.").
func (r *runtime) sentTo() []string {
	var got []string
	for _, o := range r.fake.Sent() {
		got = append(got, fmt.Sprint(o.InReplyTo, " ", o.Text))
	}
	return got
}

// TestOpenAISteering: in queue mode steer, a message from the turn's sender that arrives while
// the model works joins the next model call of the same turn, after the answer so far; the one
// reply answers both messages, and the session counts both calls' tokens.
func TestOpenAISteering(t *testing.T) {
	r, m, first := mustSteerIntoFirstCall(t, openaitest.Steps(openaitest.Reply("First.", 10, 1), openaitest.Reply("Second.", 20, 2)))
	r.waitReplyTo(t, "s1")
	want := `{"model":"test-model","messages":[{"role":"user","content":"question"},{"role":"assistant","content":"First."},
		{"role":"user","content":"and also this"}]}`
	if got := m.Body(t, 2); got != compactJSON(t, want) {
		t.Errorf("second call\n got %s\nwant %s", got, compactJSON(t, want))
	}
	sent := r.fake.Sent()
	if len(sent) != 1 || sent[0].Text != "First.\n\nSecond." || fmt.Sprint(sent[0].InReplyTo) != "[s1 s2]" {
		t.Errorf("sent %+v, want one reply to s1 and s2 with both answers", sent)
	}
	if s := r.session(t, first.SessionID); s.InputTokens != 30 || s.OutputTokens != 3 {
		t.Errorf("session tokens = %d/%d, want 30/3", s.InputTokens, s.OutputTokens)
	}
}

// TestOpenAISteeredCallThatFailsRunsNext: when the model call a turn makes for a message
// steered into it fails, the turn's reply is the answer before it, and the steered message runs
// as the next turn, with an answer of its own. Before, the turn failed: the first message, which
// had its answer, and the steered one were both answered "please try again".
func TestOpenAISteeredCallThatFailsRunsNext(t *testing.T) {
	r, m, _ := mustSteerIntoFirstCall(t, openaitest.Steps(
		openaitest.Reply("First.", 10, 1),
		openaitest.Status(http.StatusBadRequest, `{"error":{"message":"bad request"}}`),
		openaitest.Reply("Second.", 20, 2)))
	r.waitReplyTo(t, "s2")
	want := `{"model":"test-model","messages":[{"role":"user","content":"question"},{"role":"assistant","content":"First."},
		{"role":"user","content":"and also this"}]}`
	if got := m.Body(t, 3); got != compactJSON(t, want) {
		t.Errorf("third call\n got %s\nwant %s", got, compactJSON(t, want))
	}
	if got := r.sentTo(); fmt.Sprint(got) != "[[s1] First. [s2] Second.]" {
		t.Errorf("sent %q, want First. to s1, then Second. to s2", got)
	}
}

// TestOpenAISteeredMessageAnsweredWithNoTextRunsNext: when the model answers the call a turn
// makes for a message steered into it with no text (its content filter here), the turn's reply
// is the answer before it, and the steered message runs as the next turn, which tells its
// sender why it got no answer. Before, it counted as answered, and its sender heard nothing.
func TestOpenAISteeredMessageAnsweredWithNoTextRunsNext(t *testing.T) {
	r, m, _ := mustSteerIntoFirstCall(t, openaitest.Steps(openaitest.Reply("First.", 10, 1), openaitest.Raw("application/json", contentFiltered)))
	r.waitReplyTo(t, "s2")
	want := `{"model":"test-model","messages":[{"role":"user","content":"question"},{"role":"assistant","content":"First."},
		{"role":"user","content":"and also this"}]}`
	if got := m.Body(t, 3); got != compactJSON(t, want) {
		t.Errorf("third call\n got %s\nwant %s", got, compactJSON(t, want))
	}
	if got := r.sentTo(); len(got) != 2 || got[0] != "[s1] First." || !strings.HasPrefix(got[1], "[s2] ") || !strings.Contains(got[1], "content filter") {
		t.Errorf("sent %q, want First. to s1, then to s2 the notice that the content filter declined it", got)
	}
}

// TestOpenAISteeredIntoACallAnsweredWithNoTextRunsNext: when the model answers a turn's own
// message with no text (its content filter here) while another message was steered in, the
// first message gets the notice that says why, and the steered one runs as the next turn,
// without it. Before, it was sent again joined to the declined message, and the one answer
// went to both (or, declined again, both were left out).
func TestOpenAISteeredIntoACallAnsweredWithNoTextRunsNext(t *testing.T) {
	r, m, _ := mustSteerIntoFirstCall(t, openaitest.Steps(openaitest.Raw("application/json", contentFiltered), openaitest.Reply("Second.", 20, 2)))
	r.waitReplyTo(t, "s2")
	want := `{"model":"test-model","messages":[{"role":"user","content":"and also this"}]}`
	if got := m.Body(t, 2); got != compactJSON(t, want) {
		t.Errorf("second call\n got %s\nwant %s", got, compactJSON(t, want))
	}
	if got := r.sentTo(); len(got) != 2 || !strings.HasPrefix(got[0], "[s1] ") || !strings.Contains(got[0], "content filter") || got[1] != "[s2] Second." {
		t.Errorf("sent %q, want to s1 the notice that the content filter declined it, then Second. to s2", got)
	}
}

// TestOpenAIKeyNeverLeaks runs turns that fail in every way an endpoint can echo the key (a
// retried 429, a 401, an error inside a stream, plain text) and one that succeeds, capturing
// every log line at debug level: the key is in no log line, no reply, no metric, no API answer
// and no byte of the data directory. The retry honours Retry-After through the injected sleep.
func TestOpenAIKeyNeverLeaks(t *testing.T) {
	echo := fmt.Sprintf(`{"error":{"message":"Incorrect API key provided: %s (Authorization: Bearer %s)"}}`, openaiKey, openaiKey)
	m := newModel(t, func(n int, w http.ResponseWriter, r *http.Request) {
		switch n {
		case 1:
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, echo)
		case 2:
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, echo)
		case 3:
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: %s\n\n", echo)
		case 4:
			http.Error(w, "no such key "+openaiKey, http.StatusForbidden)
		default:
			openaitest.WriteStream(w, r, nil, 3, 1, "fine")
		}
	})
	logs := &testutil.Buffer{}
	var waits []time.Duration
	var mu sync.Mutex
	clock := time.Now() // the agent's, moved on by its waits, which take no time
	t.Setenv("AGENTGATE_TEST_OPENAI_KEY", openaiKey)
	agent, err := openai.New(openai.Config{BaseURL: m.URL(), Model: "test-model", APIKeyEnv: "AGENTGATE_TEST_OPENAI_KEY",
		MaxRetries: 1, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Sleep: func(ctx context.Context, d time.Duration) error {
			mu.Lock()
			waits = append(waits, d)
			clock = clock.Add(d)
			mu.Unlock()
			return nil
		},
		Now: func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			return clock
		}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	r := MustStartDaemon(t, agent, daemonOpts{dir: dir, editor: true, draftInterval: time.Nanosecond, logs: logs})
	for i, id := range []string{"k1", "k2", "k3", "k4"} {
		r.inject(t, dm, id, "try "+id)
		r.waitReplyTo(t, id)
		if i == 0 && m.Count() != 2 {
			t.Errorf("first turn made %d requests, want 2 (429 retried once)", m.Count())
		}
	}
	mu.Lock()
	if d := cmp.Diff([]time.Duration{2 * time.Second}, waits); d != "" {
		t.Errorf("waits mismatch (-want +got):\n%s", d)
	}
	mu.Unlock()
	sent := r.fake.Sent()
	var texts []string
	for _, o := range sent {
		texts = append(texts, o.Kind+": "+o.Text)
	}
	if len(sent) != 4 || sent[0].Kind != platforms.KindNotice || sent[2].Kind != platforms.KindNotice || sent[3].Text != "fine" {
		t.Errorf("sent %q, want notices for the three failed turns and then \"fine\"", texts)
	}
	var api bytes.Buffer
	for _, path := range []string{"/metrics", "/v1/sessions", "/v1/sessions/" + url.PathEscape(sent[0].SessionKey),
		"/v1/sessions/" + url.PathEscape(sent[0].SessionKey) + "/transcript"} {
		resp, err := http.Get("http://" + r.d.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(&api, resp.Body)
		resp.Body.Close()
	}
	r.stop(t)
	if !strings.Contains(logs.String(), "model call failed; retrying") || !strings.Contains(logs.String(), "turn failed") {
		t.Errorf("the logs lack the retry and the failed turns:\n%s", logs.String())
	}
	leaks := map[string]string{"logs": logs.String(), "replies": strings.Join(texts, "\n"), "HTTP API": api.String()}
	err = filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		leaks["file "+path] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for where, s := range leaks {
		if strings.Contains(s, openaiKey) || strings.Contains(s, openaiKey[8:28]) {
			t.Errorf("the key is in the %s", where)
		}
	}
}

// TestOpenAISteeredTooLateRunsNext: a message steered into a turn whose agent no longer takes
// messages (its last allowed model call) is not lost with that turn: the agent never received
// it, so it runs as the next turn and gets its own reply.
func TestOpenAISteeredTooLateRunsNext(t *testing.T) {
	release := make(chan struct{})
	m := newModel(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n <= openai.MaxSteerRounds+1 {
			<-release
		}
		openaitest.WriteReply(w, fmt.Sprint("answer ", n), 1, 1)
	})
	logs := &testutil.Buffer{}
	r := MustStartDaemon(t, nil, daemonOpts{logs: logs,
		tweak: func(c *config.Config) { useOpenAI(t, m, nil)(c); c.Sessions.Queue.Mode = "steer" }})
	defer r.stop(t)
	r.inject(t, dm, "s0", "go")
	for i := 1; i <= openai.MaxSteerRounds; i++ {
		m.WaitRequests(t, i)
		if ack := r.inject(t, dm, fmt.Sprint("s", i), fmt.Sprint("more ", i)); ack.Disposition != platforms.Steered {
			t.Fatalf("s%d disposition %s, want steered", i, ack.Disposition)
		}
		waitUntil(t, func() bool { return strings.Count(logs.String(), "steered message taken") == i })
		release <- struct{}{}
	}
	m.WaitRequests(t, openai.MaxSteerRounds+1) // the last call of the turn: nothing is taken now
	late := r.inject(t, dm, "late", "one more")
	if late.Disposition != platforms.Steered {
		t.Fatalf("late disposition %s, want steered (the session does not know the agent's limit)", late.Disposition)
	}
	release <- struct{}{}
	r.waitReplyTo(t, "s0")
	r.waitReplyTo(t, "late")
	sent := r.fake.Sent()
	if len(sent) != 2 || fmt.Sprint(sent[0].InReplyTo) != "[s0 s1 s2 s3]" || fmt.Sprint(sent[1].InReplyTo) != "[late]" {
		var got [][]string
		for _, o := range sent {
			got = append(got, o.InReplyTo)
		}
		t.Errorf("replies answer %v, want [[s0 s1 s2 s3] [late]]", got)
	}
	if last := m.Body(t, openai.MaxSteerRounds+2); !strings.Contains(last, `"content":"one more"}]}`) {
		t.Errorf("the late message's own turn sent %s", last)
	}
}
