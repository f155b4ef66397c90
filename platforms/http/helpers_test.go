package http

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
)

// testTimeout bounds every wait of a test; nothing waits on a sleep.
const testTimeout = 10 * time.Second

// streamTimeout bounds an event stream a test opens (openSSE).
const streamTimeout = 60 * time.Second

// streamKey is a well-formed session key for the event stream tests: the stream refuses a
// string that is not a session key.
const streamKey = "agent:main:http:dm:chat-1"

// harness is one Platform serving on 127.0.0.1:0 through a real listener.
type harness struct {
	t      *testing.T
	p      *Platform
	base   string
	client *http.Client
	cancel context.CancelFunc
	done   chan error
}

// mustNew builds a Platform on 127.0.0.1:0 without starting it.
func mustNew(t *testing.T, cfg Config) *harness {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v) error = %v, want nil", cfg, err)
	}
	return &harness{t: t, p: p}
}

// start binds the listener and runs the Platform until the test ends.
func (h *harness) start(deliver platforms.Deliver) *harness {
	h.t.Helper()
	addr, err := h.p.Listen()
	if err != nil {
		h.t.Fatalf("Listen() error = %v, want nil", err)
	}
	h.base = "http://" + addr.String()
	h.client = &http.Client{Timeout: testTimeout, Transport: &http.Transport{}}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- h.p.Run(ctx, deliver) }()
	h.t.Cleanup(h.stop)
	return h
}

// stop cancels Run and waits for it to return.
func (h *harness) stop() {
	h.t.Helper()
	if h.cancel == nil {
		return
	}
	// Connections the client dialled but never used count as busy to Shutdown for a while.
	h.client.CloseIdleConnections()
	h.cancel()
	h.cancel = nil
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Run() = %v, want nil", err)
		}
	case <-time.After(testTimeout):
		h.t.Errorf("Run() did not return within %v of cancel", testTimeout)
	}
	h.client.CloseIdleConnections()
}

// mustStart builds and runs a Platform with the fake runtime rt.
func mustStart(t *testing.T, cfg Config, rt *fakeRuntime) *harness {
	t.Helper()
	h := mustNew(t, cfg)
	rt.p = h.p
	return h.start(rt.deliver)
}

type response struct {
	status int
	header http.Header
	body   []byte
	close  bool // the server closes the connection after it (Connection: close)
}

// errCode returns the error code of a JSON error body, or "" if there is none.
func (r response) errCode() string {
	var e ErrorResponse
	if err := json.Unmarshal(r.body, &e); err != nil {
		return ""
	}
	return e.Error.Code
}

func (h *harness) do(method, path string, header map[string]string, body string) response {
	h.t.Helper()
	return h.doCtx(context.Background(), method, path, header, body)
}

func (h *harness) doCtx(ctx context.Context, method, path string, header map[string]string, body string) response {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.base+path, rd)
	if err != nil {
		h.t.Fatalf("NewRequest(%s %s) error = %v", method, path, err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s error = %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b, close: resp.Close}
}

var jsonHeader = map[string]string{"Content-Type": "application/json"}

func (h *harness) post(path string, body any) response {
	h.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		h.t.Fatalf("marshal %T: %v", body, err)
	}
	return h.do(http.MethodPost, path, jsonHeader, string(b))
}

func mustDecode[T any](t *testing.T, r response) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decode %T from %s: %v", v, r.body, err)
	}
	return v
}

// fakeRuntime stands in for the session manager behind platforms.Deliver.
type fakeRuntime struct {
	p *Platform

	mu  sync.Mutex
	got []*platforms.Inbound
	// respond answers a delivery; nil answers a started ack with the message's session key.
	respond func(ctx context.Context, in *platforms.Inbound) (*platforms.Ack, error)
}

func (f *fakeRuntime) deliver(ctx context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
	f.mu.Lock()
	f.got = append(f.got, in)
	respond := f.respond
	f.mu.Unlock()
	if respond != nil {
		return respond(ctx, in)
	}
	return ackFor(in, platforms.Started), nil
}

func (f *fakeRuntime) setRespond(fn func(ctx context.Context, in *platforms.Inbound) (*platforms.Ack, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.respond = fn
}

func (f *fakeRuntime) delivered() []*platforms.Inbound {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.got)
}

func keyFor(src identity.Source) string { return identity.Key(src, identity.DefaultKeyOptions) }

func ackFor(in *platforms.Inbound, disposition string) *platforms.Ack {
	return &platforms.Ack{
		SessionKey:  keyFor(in.Source),
		SessionID:   "s1",
		MessageID:   in.MessageID,
		Disposition: disposition,
	}
}

// reply builds an outbound answering in.
func reply(in *platforms.Inbound, seq int64, text string, turnEnd bool) *platforms.Outbound {
	return &platforms.Outbound{
		SessionKey: keyFor(in.Source),
		SessionID:  "s1",
		Seq:        seq,
		Kind:       platforms.KindReply,
		Text:       text,
		TurnID:     "t1",
		InReplyTo:  []string{in.MessageID},
		Target:     in.Source,
		TurnEnd:    turnEnd,
	}
}

// fakeSessions is an in-memory Sessions.
type fakeSessions struct {
	mu       sync.Mutex
	outbox   map[string][]*platforms.Outbound
	replies  map[string][]*platforms.Outbound // by key + "\x00" + message id
	infos    map[string]*SessionInfo
	calls    []string
	lastList ListRequest
	panicGet bool
	// bigText, when set, is the text of every transcript message.
	bigText string
	// transcript, when set, is every key's transcript (instead of two messages).
	transcript []TranscriptMessage
	// transcriptReqs are the requests Transcript was called with.
	transcriptReqs []TranscriptRequest
	// failTranscriptAt, when above zero, makes the Transcript call of that number (from 1) and
	// every later one fail.
	failTranscriptAt int
	// outboxFailFrom, when above zero, makes OutboxAfter fail for an after of it or more: a
	// stream's replay fails past its first page.
	outboxFailFrom int64
	// resetErr, when set, is what Reset returns.
	resetErr error
	// repliesErr, when set, is what RepliesTo returns, for failReplies calls (every call when 0).
	repliesErr  error
	failReplies int
	// repliesHang, when set, makes RepliesTo wait for its ctx or for the channel to close, as a
	// database that does not answer until the caller's deadline (or the store's own bound).
	repliesHang chan struct{}
	// requeueErr, when set, is what Requeue returns.
	requeueErr error
	// requeueAfter is the key's outbox seq before a requeue, as Requeue reports it.
	requeueAfter int64
	// quarantined is what Quarantined lists (cut at its limit); quarantinedErr, when set, is
	// its error.
	quarantined    []QuarantinedMessage
	quarantinedErr error
}

func newFakeSessions() *fakeSessions {
	return &fakeSessions{
		outbox:  map[string][]*platforms.Outbound{},
		replies: map[string][]*platforms.Outbound{},
		infos:   map[string]*SessionInfo{},
	}
}

func (f *fakeSessions) record(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *fakeSessions) callLog() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeSessions) addOutbox(outs ...*platforms.Outbound) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, o := range outs {
		f.outbox[o.SessionKey] = append(f.outbox[o.SessionKey], o)
	}
}

func (f *fakeSessions) List(_ context.Context, r ListRequest) (*SessionList, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastList = r
	f.record("list")
	var out SessionList
	for _, k := range slices.Sorted(maps.Keys(f.infos)) {
		out.Sessions = append(out.Sessions, f.infos[k])
	}
	return &out, nil
}

func (f *fakeSessions) Get(_ context.Context, key string) (*SessionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("get %s", key)
	if f.panicGet {
		panic("fake sessions: get panicked")
	}
	info, ok := f.infos[key]
	if !ok {
		return nil, fmt.Errorf("get session %q: %w", key, persistence.ErrNotFound)
	}
	return info, nil
}

func (f *fakeSessions) Reset(_ context.Context, key string) (*SessionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("reset %s", key)
	if f.resetErr != nil {
		return nil, f.resetErr
	}
	info, ok := f.infos[key]
	if !ok {
		return nil, persistence.ErrNotFound
	}
	next := *info
	if info.Messages == 0 { // nothing said in it: kept, as the daemon keeps it
		next.Kept = true
		return &next, nil
	}
	next.PrevSessionID, next.SessionID, next.Messages = info.SessionID, info.SessionID+"-next", 0
	f.infos[key] = &next
	return &next, nil
}

func (f *fakeSessions) Requeue(_ context.Context, key, messageID string) (*MessageResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("requeue %s %s", key, messageID)
	if f.requeueErr != nil {
		return nil, f.requeueErr
	}
	return &MessageResponse{MessageID: messageID, SessionKey: key, SessionID: "s1", Disposition: "queued", QueueDepth: 1,
		OutboxAfter: f.requeueAfter}, nil
}

func (f *fakeSessions) Quarantined(_ context.Context, limit int) ([]QuarantinedMessage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("quarantined %d", limit)
	if f.quarantinedErr != nil {
		return nil, f.quarantinedErr
	}
	return f.quarantined[:min(limit, len(f.quarantined))], nil
}

func (f *fakeSessions) Transcript(_ context.Context, key string, r TranscriptRequest) (*Transcript, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("transcript %s %s", key, r.SessionID)
	f.transcriptReqs = append(f.transcriptReqs, r)
	if f.failTranscriptAt > 0 && len(f.transcriptReqs) >= f.failTranscriptAt {
		return nil, errors.New("fake sessions: transcript page failed")
	}
	if _, ok := f.infos[key]; !ok {
		return nil, persistence.ErrNotFound
	}
	all := f.transcript
	if all == nil {
		user, assistant := "hi", "hello"
		if f.bigText != "" {
			user, assistant = f.bigText, f.bigText
		}
		all = []TranscriptMessage{
			{Seq: 1, Role: persistence.RoleUser, Text: user, MessageID: "m1", Status: persistence.StatusDone},
			{Seq: 2, Role: persistence.RoleAssistant, Text: assistant, TurnID: "t1", Status: persistence.StatusDone},
		}
	}
	var page []TranscriptMessage
	for _, m := range all {
		if m.Seq > r.After && (r.Limit <= 0 || len(page) < r.Limit) {
			page = append(page, m)
		}
	}
	return &Transcript{SessionKey: key, SessionID: cmpOr(r.SessionID, "s1"), Messages: page}, nil
}

func (f *fakeSessions) transcriptRequests() []TranscriptRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.transcriptReqs)
}

func (f *fakeSessions) OutboxAfter(_ context.Context, key string, after int64, limit int) ([]*platforms.Outbound, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("outbox %s %d", key, after)
	if f.outboxFailFrom > 0 && after >= f.outboxFailFrom {
		return nil, errors.New("fake sessions: outbox read failed")
	}
	var res []*platforms.Outbound
	for _, o := range f.outbox[key] {
		if o.Seq > after && len(res) < limit {
			res = append(res, o)
		}
	}
	return res, nil
}

func (f *fakeSessions) LastOutboxSeq(_ context.Context, key string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var last int64
	for _, o := range f.outbox[key] {
		last = max(last, o.Seq)
	}
	return last, nil
}

func (f *fakeSessions) RepliesTo(ctx context.Context, key, messageID string, after int64) ([]*platforms.Outbound, error) {
	f.mu.Lock()
	if hang := f.repliesHang; hang != nil {
		f.record("replies %s %s", key, messageID)
		f.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("replies: %w", context.Cause(ctx))
		case <-hang:
			return nil, errors.New("replies: no answer from the database (test)")
		}
	}
	defer f.mu.Unlock()
	f.record("replies %s %s", key, messageID)
	if f.repliesErr != nil {
		err := f.repliesErr
		if f.failReplies--; f.failReplies == 0 {
			f.repliesErr = nil
		}
		return nil, err
	}
	return slices.DeleteFunc(slices.Clone(f.replies[key+"\x00"+messageID]), func(o *platforms.Outbound) bool { return o.Seq <= after }), nil
}

// sseEvent is one parsed Server-Sent Event or comment.
type sseEvent struct {
	id      int64
	event   string
	data    Event
	comment string
}

type sseStream struct {
	t      *testing.T
	status int
	body   io.ReadCloser
	rd     *bufio.Reader
	cancel context.CancelFunc
}

// openSSE opens the event stream of key; lastID, when not empty, is sent as Last-Event-ID.
func (h *harness) openSSE(key, lastID, query string) *sseStream {
	h.t.Helper()
	// The stream's whole life, all its events: a replay of megabytes under the race detector
	// on a loaded 2-core machine took more than testTimeout (CI).
	ctx, cancel := context.WithTimeout(context.Background(), streamTimeout)
	path := "/v1/sessions/" + url.PathEscape(key) + "/events" + query
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.base+path, nil)
	if err != nil {
		cancel()
		h.t.Fatalf("NewRequest(%s) error = %v", path, err)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	// A client without a timeout: the stream outlives any one request timeout.
	resp, err := (&http.Client{Transport: h.client.Transport}).Do(req)
	if err != nil {
		cancel()
		h.t.Fatalf("GET %s error = %v", path, err)
	}
	s := &sseStream{t: h.t, status: resp.StatusCode, body: resp.Body, rd: bufio.NewReader(resp.Body), cancel: cancel}
	h.t.Cleanup(s.close)
	return s
}

func (s *sseStream) close() {
	s.cancel()
	s.body.Close()
}

// next reads one event or comment; io.EOF means the server ended the stream.
func (s *sseStream) next() (sseEvent, error) {
	var ev sseEvent
	seen := false
	for {
		line, err := s.rd.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && !seen {
				return ev, io.EOF
			}
			return ev, fmt.Errorf("read event: %w", err)
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			if seen {
				return ev, nil
			}
			continue
		}
		seen = true
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "":
			ev.comment = value
		case "id":
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil {
				return ev, fmt.Errorf("event id %q: %w", value, err)
			}
			ev.id = n
		case "event":
			ev.event = value
		case "data":
			dec := json.NewDecoder(bytes.NewReader([]byte(value)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&ev.data); err != nil {
				return ev, fmt.Errorf("event data %q: %w", value, err)
			}
		default:
			return ev, fmt.Errorf("unexpected SSE field %q", line)
		}
	}
}

// mustNextEvent reads the next event, skipping keepalive comments.
func (s *sseStream) mustNextEvent() sseEvent {
	s.t.Helper()
	for {
		ev, err := s.next()
		if err != nil {
			s.t.Fatalf("next SSE event: %v", err)
		}
		if ev.comment == "" {
			return ev
		}
	}
}

// waitFor polls cond until it holds or the test deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", testTimeout, what)
		}
		time.Sleep(time.Millisecond) // a poll interval under a deadline, not a wait for an effect
	}
}

func (p *Platform) subscriberCount(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.subs[key])
}

func (p *Platform) waiterCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, set := range p.waiters {
		n += len(set)
	}
	return n
}

// grepLine returns the first line of text that holds substr, or "".
func grepLine(text, substr string) string {
	for l := range strings.SplitSeq(text, "\n") {
		if strings.Contains(l, substr) {
			return l
		}
	}
	return ""
}
