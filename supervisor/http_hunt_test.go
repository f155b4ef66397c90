package supervisor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
)

// TestHuntHTTP drives a whole daemon through its HTTP API with a seeded random mix from several
// concurrent clients: messages in DMs and group chats (several users, one session each), with
// client-chosen or generated message ids, re-sent with the same id, with ?wait= short and long,
// bursts while turns run under every queue mode; commands (/new /stop /status /queue /help), API
// resets, transcript reads in pages; an SSE subscriber per session key that disconnects at random
// and resumes with Last-Event-ID; graceful restarts on the same data dir while all that goes on;
// and bad input (malformed JSON, bad keys, bad query strings, another user's message id in a
// group), which must get a 4xx JSON error and change nothing. The agent is a Go agent with
// random delays that names the session it ran in.
//
// It checks what a client sees against the guarantees: every acknowledged message is answered
// exactly once in the outbox; an agent's reply answers only messages of its own session (a reset
// or /new is a boundary); a ?wait answer's replies are exactly the message's answers; a re-sent
// message id is a duplicate (even after a /new or a restart), and no message is answered by the agent in two turns; answers come in arrival order per
// session; each subscriber's events, across its reconnections, are its key's outbox entries
// exactly once, in order, with strictly increasing ids; transcript pages follow each other with
// no gap; nothing of a refused request is stored.
//
// AGENTGATE_HTTP_SEEDS=N runs N new seeds; AGENTGATE_HTTP_SEED=S replays seed S;
// AGENTGATE_HTTP_STEPS sets the operations per client.
func TestHuntHTTP(t *testing.T) {
	seeds, steps := testutil.HuntSeeds(t, "AGENTGATE_HTTP", []uint64{1, 2}, 30)
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			h := newHTTPHunt(t, seed, steps)
			h.run()
			if t.Failed() {
				logs := h.logs.String()
				t.Logf("the daemons' logs (the last 20000 bytes):\n%s", logs[max(0, len(logs)-20000):])
				t.Logf("replay with AGENTGATE_HTTP_SEED=%d", seed)
			}
		})
	}
}

const (
	httpHuntClients = 4
	httpHuntChats   = 3 // DMs d0.., groups g0.. with users ua ub uc
)

var httpHuntModes = []string{"followup", "collect", "interrupt", "steer"}

// huntServer is one incarnation of the daemon: clients that fail to reach it wait for the next.
type huntServer struct {
	r        *runtime
	base     string
	stopping chan struct{} // closed when its stop begins
	next     chan struct{} // closed when its successor is up
}

// huntMsg is one message a client sent, and what it learnt about it.
type huntMsg struct {
	id, chatType, chatID, user, text string
	command                          bool
	acked                            bool   // some answer said it is stored
	unsure                           bool   // sent, answer lost: stored or not
	key, sid                         string // from the first non-duplicate ack
	waited                           []httpplatform.Reply
	hasWaited                        bool
}

type httpHunt struct {
	t     *testing.T
	seed  uint64
	steps int
	dir   string
	ctx   context.Context

	client     *http.Client
	logs       testutil.Buffer // the daemons' logs
	mu         sync.Mutex
	cur        *huntServer
	msgs       map[string]*huntMsg // by message id (ids are unique across chats here)
	order      []string
	bad        []string            // message ids of refused requests: never stored
	runs       map[string][]string // message id → the turns the agent finished for it
	seq        atomic.Int64
	reconnects atomic.Int64

	progress chan struct{}
}

func newHTTPHunt(t *testing.T, seed uint64, steps int) *httpHunt {
	return &httpHunt{
		t: t, seed: seed, steps: steps, dir: t.TempDir(), ctx: t.Context(),
		client:   &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}},
		msgs:     map[string]*huntMsg{},
		runs:     map[string][]string{},
		progress: make(chan struct{}, 1024),
	}
}

// agent answers each turn after a random delay with the session it ran in and the texts.
func (h *httpHunt) agent() agents.Agent {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(h.seed, 99))
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		mu.Lock()
		d := time.Duration(rng.IntN(25)) * time.Millisecond
		mu.Unlock()
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		var texts []string
		h.mu.Lock()
		for _, m := range req.Messages {
			texts = append(texts, m.Text)
			h.runs[m.MessageID] = append(h.runs[m.MessageID], req.Identity.TurnID)
		}
		h.mu.Unlock()
		return &agents.Response{Text: "sid=" + req.Identity.SessionID + " re " + strings.Join(texts, "|")}, nil
	})
}

func (h *httpHunt) start(drain time.Duration) *huntServer {
	h.t.Helper()
	// The daemons log to a buffer, not to the test: a stopped daemon's HTTP handler may still
	// log after the test has ended (Stop does not wait for every handler).
	r := MustStartDaemon(h.t, h.agent(), daemonOpts{dir: h.dir, drain: drain, logs: &h.logs, tweak: func(c *config.Config) {
		c.Sessions.Reset.Mode = "none" // an automatic reset's notice lists a message it does not answer
	}})
	return &huntServer{r: r, base: "http://" + r.d.Addr().String(), stopping: make(chan struct{}), next: make(chan struct{})}
}

func (h *httpHunt) server() *huntServer {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur
}

// unreachable is called after a transport error on s: if s is stopping, it waits for its
// successor. It reports false when the test is over.
func (h *httpHunt) unreachable(s *huntServer) bool {
	select {
	case <-s.stopping:
	default:
		return true // retry at once
	}
	select {
	case <-s.next:
		return true
	case <-h.ctx.Done():
		return false
	}
}

func (h *httpHunt) run() {
	t := h.t
	rng := rand.New(rand.NewPCG(h.seed, 1))
	h.cur = h.start(5 * time.Second)

	keys := h.keys()
	subsCtx, stopSubs := context.WithCancel(h.ctx)
	subs := make([]*huntSubscriber, len(keys))
	var subWG sync.WaitGroup
	for i, k := range keys {
		subs[i] = &huntSubscriber{h: h, key: k, rng: rand.New(rand.NewPCG(h.seed, uint64(100+i)))}
		subWG.Add(1)
		go func() { defer subWG.Done(); subs[i].follow(subsCtx) }()
	}

	// Restarts at random points of the clients' progress.
	restarts := 1 + rng.IntN(2)
	total := httpHuntClients * h.steps
	var points []int
	for range restarts {
		points = append(points, 1+rng.IntN(total-1))
	}
	slices.Sort(points)
	done := make(chan struct{})
	ctlDone := make(chan struct{})
	go func() {
		defer close(ctlDone)
		n := 0
		for _, p := range points {
			for n < p {
				select {
				case <-h.progress:
					n++
				case <-done:
					return
				}
			}
			drain := 5 * time.Second
			if rng.IntN(2) == 0 {
				drain = time.Duration(1+rng.IntN(20)) * time.Millisecond // cuts running turns short
			}
			h.restart(drain)
		}
	}()

	var wg sync.WaitGroup
	for c := range httpHuntClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := &huntClient{h: h, n: c, rng: rand.New(rand.NewPCG(h.seed, uint64(10+c)))}
			for range h.steps {
				if t.Failed() {
					return
				}
				cl.step()
				select {
				case h.progress <- struct{}{}:
				default:
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	<-ctlDone
	defer func() { h.server().r.stop(t) }()
	if t.Failed() {
		stopSubs()
		subWG.Wait()
		return
	}

	h.resolveUnsure()
	h.waitAnswered()
	outbox := h.outboxes(keys)
	// Each subscriber catches up with its key's last entry, then stops.
	for i, k := range keys {
		subs[i].until.Store(lastSeq(outbox[k]))
	}
	waitUntil(t, func() bool {
		for _, s := range subs {
			if s.last.Load() < s.until.Load() {
				return false
			}
		}
		return true
	})
	stopSubs()
	subWG.Wait()
	h.check(keys, outbox, subs)
}

func (h *httpHunt) restart(drain time.Duration) {
	h.t.Helper()
	old := h.server()
	close(old.stopping)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := old.r.d.Stop(ctx); err != nil {
		h.t.Errorf("Stop: %v", err)
	}
	next := h.start(drain)
	h.mu.Lock()
	h.cur = next
	h.mu.Unlock()
	close(old.next)
}

func (h *httpHunt) keys() []string {
	var keys []string
	for i := range httpHuntChats {
		keys = append(keys, "agent:main:http:dm:"+fmt.Sprint("d", i))
	}
	for i := range httpHuntChats - 1 {
		for _, u := range []string{"ua", "ub", "uc"} {
			keys = append(keys, fmt.Sprintf("agent:main:http:group:g%d:%s", i, u))
		}
	}
	return keys
}

// do sends a request to the current server, waiting for the next one when it is stopping. A
// POST of a message is not retried: its answer is lost (the caller re-sends it later).
func (h *httpHunt) do(method, path string, body []byte, header http.Header, once bool) (int, []byte, error) {
	for {
		s := h.server()
		ctx, cancel := context.WithTimeout(h.ctx, 20*time.Second)
		req, err := http.NewRequestWithContext(ctx, method, s.base+path, bytes.NewReader(body))
		if err != nil {
			cancel()
			return 0, nil, err
		}
		for k, v := range header {
			req.Header[k] = v
		}
		if body != nil && req.Header.Get("Content-Type") == "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := h.client.Do(req)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			cancel()
			if rerr == nil && !(resp.StatusCode == http.StatusServiceUnavailable && !once) {
				return resp.StatusCode, b, nil
			}
			err = rerr
			if err == nil {
				err = errors.New("503")
			}
		} else {
			cancel()
		}
		if once || !h.unreachable(s) {
			return 0, nil, err
		}
	}
}

type huntClient struct {
	h   *httpHunt
	n   int
	rng *rand.Rand
	own []*huntMsg
}

func (c *huntClient) step() {
	switch p := c.rng.IntN(100); {
	case p < 35:
		c.message(c.pickChat(), c.text(), c.waitParam())
	case p < 45 && len(c.own) > 0:
		c.resend(c.own[c.rng.IntN(len(c.own))])
	case p < 55:
		chat := c.pickChat()
		for range 2 + c.rng.IntN(4) {
			c.message(chat, c.text(), "")
		}
	case p < 68:
		cmds := []string{"/status", "/new", "/stop", "/help", "/queue " + httpHuntModes[c.rng.IntN(len(httpHuntModes))]}
		c.message(c.pickChat(), cmds[c.rng.IntN(len(cmds))], c.waitParam())
	case p < 73:
		c.reset(c.pickChat())
	case p < 83:
		c.transcript(c.pickChat())
	default:
		c.bad()
	}
}

type huntChat struct{ chatType, chatID, user string }

func (ch huntChat) key() string {
	if ch.chatType == "dm" {
		return "agent:main:http:dm:" + ch.chatID
	}
	return "agent:main:http:group:" + ch.chatID + ":" + ch.user
}

func (c *huntClient) pickChat() huntChat {
	if c.rng.IntN(2) == 0 {
		return huntChat{"dm", fmt.Sprint("d", c.rng.IntN(httpHuntChats)), "u"}
	}
	return huntChat{"group", fmt.Sprint("g", c.rng.IntN(httpHuntChats-1)), []string{"ua", "ub", "uc"}[c.rng.IntN(3)]}
}

func (c *huntClient) text() string { return fmt.Sprintf("t%d", c.h.seq.Add(1)) }

func (c *huntClient) waitParam() string {
	switch c.rng.IntN(5) {
	case 0:
		return "?wait=" + fmt.Sprint(1+c.rng.IntN(30)) + "ms"
	case 1:
		return "?wait=10s"
	}
	return ""
}

func (c *huntClient) message(ch huntChat, text, query string) {
	m := &huntMsg{chatType: ch.chatType, chatID: ch.chatID, user: ch.user, text: text, command: strings.HasPrefix(text, "/")}
	if c.rng.IntN(3) > 0 {
		m.id = fmt.Sprintf("m%d-%d-%d", c.h.seed, c.n, c.h.seq.Add(1))
	}
	c.post(m, query, true)
}

func (c *huntClient) resend(m *huntMsg) {
	query := ""
	if c.rng.IntN(2) == 0 {
		query = "?wait=10s"
	}
	c.post(m, query, false)
}

func (c *huntClient) post(m *huntMsg, query string, first bool) {
	h, t := c.h, c.h.t
	body, _ := json.Marshal(httpplatform.MessageRequest{ChatID: m.chatID, ChatType: m.chatType, UserID: m.user, MessageID: m.id, Text: m.text})
	status, b, err := h.do(http.MethodPost, "/v1/messages"+query, body, nil, true)
	what := fmt.Sprintf("POST %s%s %s", "/v1/messages", query, body)
	if err != nil || status == http.StatusServiceUnavailable {
		if m.id == "" { // a generated id is lost with its answer: nothing to check it by
			return
		}
		if first {
			h.record(m)
			c.own = append(c.own, m)
		}
		h.mu.Lock()
		if !m.acked {
			m.unsure = true
		}
		h.mu.Unlock()
		return
	}
	if status != http.StatusOK && status != http.StatusAccepted {
		t.Errorf("%s = %d %s, want 200 or 202", what, status, b)
		return
	}
	var ack httpplatform.MessageResponse
	if err := json.Unmarshal(b, &ack); err != nil {
		t.Errorf("%s = %s: %v", what, b, err)
		return
	}
	if m.id == "" {
		m.id = ack.MessageID
	}
	if ack.MessageID != m.id || ack.SessionKey != (huntChat{m.chatType, m.chatID, m.user}).key() {
		t.Errorf("%s = %s, want message %s in key %s", what, b, m.id, huntChat{m.chatType, m.chatID, m.user}.key())
	}
	if first {
		h.record(m)
		c.own = append(c.own, m)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case ack.Disposition == platforms.Duplicate:
		if !m.acked && !m.unsure {
			t.Errorf("%s: the first send is a duplicate (%s)", what, b)
		}
		m.key = ack.SessionKey // the session it was stored in is looked up at the end
	case m.acked:
		t.Errorf("%s: a re-sent message (first acked in %s) is %q, want duplicate", what, m.sid, ack.Disposition)
	default:
		m.key, m.sid = ack.SessionKey, ack.SessionID
	}
	m.acked, m.unsure = true, false
	if status == http.StatusOK {
		if len(ack.Replies) == 0 {
			t.Errorf("%s = 200 with no replies", what)
		}
		if m.hasWaited && fmt.Sprint(m.waited) != fmt.Sprint(ack.Replies) {
			t.Errorf("%s: replies %+v, an earlier wait had %+v", what, ack.Replies, m.waited)
		}
		m.waited, m.hasWaited = ack.Replies, true
	}
}

func (h *httpHunt) record(m *huntMsg) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m.id == "" {
		return
	}
	if _, ok := h.msgs[m.id]; !ok {
		h.msgs[m.id] = m
		h.order = append(h.order, m.id)
	}
}

func (c *huntClient) reset(ch huntChat) {
	status, b, err := c.h.do(http.MethodPost, "/v1/sessions/"+url.PathEscape(ch.key())+"/reset", nil, nil, false)
	if err != nil {
		return
	}
	if status != http.StatusOK && status != http.StatusNotFound {
		c.h.t.Errorf("POST reset %s = %d %s, want 200 or 404", ch.key(), status, b)
	}
}

// transcript reads the key's current transcript in pages of a random size: one incarnation,
// seqs 1, 2, 3… with no gap across pages.
func (c *huntClient) transcript(ch huntChat) {
	t := c.h.t
	limit := 1 + c.rng.IntN(4)
	sid := ""
	var after int64
	var read []int64
	for range 200 {
		q := url.Values{"limit": {fmt.Sprint(limit)}, "after": {fmt.Sprint(after)}}
		if sid != "" {
			q.Set("session_id", sid)
		}
		path := "/v1/sessions/" + url.PathEscape(ch.key()) + "/transcript?" + q.Encode()
		status, b, err := c.h.do(http.MethodGet, path, nil, nil, false)
		if err != nil {
			return
		}
		if status == http.StatusNotFound && sid == "" {
			return
		}
		if status != http.StatusOK {
			t.Errorf("GET %s = %d %s", path, status, b)
			return
		}
		var tr httpplatform.Transcript
		if err := json.Unmarshal(b, &tr); err != nil {
			t.Errorf("GET %s: %v", path, err)
			return
		}
		if sid != "" && tr.SessionID != sid {
			t.Errorf("GET %s: page of session %s, want %s", path, tr.SessionID, sid)
		}
		sid = tr.SessionID
		if len(tr.Messages) > limit {
			t.Errorf("GET %s: %d messages, over the limit", path, len(tr.Messages))
		}
		for _, m := range tr.Messages {
			if m.Seq <= after {
				t.Errorf("GET %s: seq %d after %d, want increasing", path, m.Seq, after)
				return
			}
			read = append(read, m.Seq)
			after = m.Seq
		}
		if tr.Next == 0 {
			break
		}
		if tr.Next != after {
			t.Errorf("GET %s: next %d, want %d", path, tr.Next, after)
			return
		}
	}
	// The pages skipped no row: a row the store holds now below the last one read was there
	// to be read (a seq may be missing for good: the seq of a message refused as another
	// conversation's is not given back).
	if sid == "" {
		return
	}
	rows, err := c.h.server().r.d.store.TranscriptAfter(c.h.ctx, sid, 0, 0)
	if err != nil {
		return // the daemon is stopping
	}
	var stored []int64
	for _, r := range rows {
		if r.Seq <= after {
			stored = append(stored, r.Seq)
		}
	}
	if fmt.Sprint(stored) != fmt.Sprint(read) {
		t.Errorf("transcript of %s (%s) read in pages of %d: seqs %v, the store has %v", ch.key(), sid, limit, read, stored)
	}
}

// bad sends a refused request: it must be a 4xx with a JSON error and store nothing.
func (c *huntClient) bad() {
	h, t := c.h, c.h.t
	id := fmt.Sprintf("bad%d-%d", c.n, h.seq.Add(1))
	valid, _ := json.Marshal(httpplatform.MessageRequest{ChatID: "d0", UserID: "u", MessageID: id, Text: "never"})
	var method, path string
	var body []byte
	header := http.Header{}
	switch c.rng.IntN(9) {
	case 0:
		method, path, body = http.MethodPost, "/v1/messages", valid[:len(valid)-1-c.rng.IntN(10)]
	case 1:
		method, path, body = http.MethodPost, "/v1/messages?wait=soon", valid
	case 2:
		method, path, body = http.MethodPost, "/v1/messages?wait=%zz", valid
	case 3:
		method, path, body = http.MethodPost, "/v1/messages?wait=-1s", valid
	case 4:
		method, path = http.MethodGet, "/v1/sessions/not-a-key/transcript"
	case 5:
		method, path = http.MethodGet, "/v1/sessions/agent:main:http:dm:d0/events"
		header.Set("Last-Event-ID", "x1")
	case 6:
		method, path = http.MethodGet, "/v1/sessions/agent:main:http:dm:d0/transcript?limit=%zz"
	case 7:
		method, path = http.MethodPost, "/v1/sessions/nokey/reset"
	case 8:
		// Another user's message id in the same group chat.
		h.mu.Lock()
		var taken *huntMsg
		for _, mid := range h.order {
			if m := h.msgs[mid]; m.chatType == "group" && m.acked && !strings.HasPrefix(m.id, "http-") {
				taken = m
				break
			}
		}
		h.mu.Unlock()
		if taken == nil {
			return
		}
		other := map[string]string{"ua": "ub", "ub": "uc", "uc": "ua"}[taken.user]
		body, _ = json.Marshal(httpplatform.MessageRequest{ChatID: taken.chatID, ChatType: "group", UserID: other, MessageID: taken.id, Text: "never"})
		method, path = http.MethodPost, "/v1/messages"
		id = "" // the id is the taken one's: it must stay answered once
	}
	if method == http.MethodPost && path == "/v1/messages" && body != nil {
		header.Set("Content-Type", "application/json")
	}
	status, b, err := h.do(method, path, body, header, true)
	if err != nil || status == http.StatusServiceUnavailable {
		return
	}
	var e httpplatform.ErrorResponse
	if status < 400 || status >= 500 || json.Unmarshal(b, &e) != nil || e.Error.Code == "" {
		t.Errorf("%s %s (%q) = %d %q, want a 4xx JSON error", method, path, body, status, b)
	}
	if id != "" {
		h.mu.Lock()
		h.bad = append(h.bad, id)
		h.mu.Unlock()
	}
}

// huntSubscriber follows one key's events, reconnecting at random with Last-Event-ID.
type huntSubscriber struct {
	h     *httpHunt
	key   string
	rng   *rand.Rand
	until atomic.Int64 // set at the end: the seq to reach before stopping
	last  atomic.Int64
	seen  []huntEvent
}

type huntEvent struct {
	seq  int64
	kind string
	ev   httpplatform.Event
}

func (s *huntSubscriber) follow(ctx context.Context) {
	for ctx.Err() == nil {
		srv := s.h.server()
		if !s.stream(ctx, srv) && ctx.Err() == nil && !s.h.unreachable(srv) {
			return
		}
	}
}

// stream reads one connection's events, up to a random number of them; false on a transport
// error.
func (s *huntSubscriber) stream(ctx context.Context, srv *huntServer) bool {
	t := s.h.t
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.base+"/v1/sessions/"+url.PathEscape(s.key)+"/events", nil)
	if last := s.last.Load(); last > 0 || s.rng.IntN(2) == 0 {
		req.Header.Set("Last-Event-ID", fmt.Sprint(last))
	}
	resp, err := s.h.client.Do(req)
	if err != nil {
		return false
	}
	s.h.reconnects.Add(1)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("GET events %s = %d", s.key, resp.StatusCode)
		}
		return false
	}
	budget := 1 + s.rng.IntN(6)
	fields := map[string]string{}
	rd := bufio.NewReader(resp.Body)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return false
		}
		line = strings.TrimSuffix(line, "\n")
		if line != "" {
			if name, value, ok := strings.Cut(line, ": "); ok && name != "" {
				fields[name] = value
			}
			continue
		}
		if fields["id"] == "" {
			fields = map[string]string{}
			continue
		}
		seq, err := strconv.ParseInt(fields["id"], 10, 64)
		var ev httpplatform.Event
		if err != nil || json.Unmarshal([]byte(fields["data"]), &ev) != nil {
			t.Errorf("events %s: bad event %q", s.key, fields)
			return true
		}
		if seq <= s.last.Load() {
			t.Errorf("events %s: id %d after %d, want strictly increasing", s.key, seq, s.last.Load())
		}
		s.seen = append(s.seen, huntEvent{seq: seq, kind: fields["event"], ev: ev})
		s.last.Store(seq)
		fields = map[string]string{}
		if budget--; budget == 0 {
			return true // disconnect; resume from the last id
		}
	}
}

func lastSeq(entries []persistence.OutboxEntry) int64 {
	if len(entries) == 0 {
		return 0
	}
	return entries[len(entries)-1].Seq
}

// resolveUnsure re-sends each message whose answer was lost: it is then stored, once.
func (h *httpHunt) resolveUnsure() {
	h.mu.Lock()
	var unsure []*huntMsg
	for _, id := range h.order {
		if m := h.msgs[id]; m.unsure {
			unsure = append(unsure, m)
		}
	}
	h.mu.Unlock()
	c := &huntClient{h: h, n: -1, rng: rand.New(rand.NewPCG(h.seed, 7))}
	for _, m := range unsure {
		c.post(m, "", false)
		if m.unsure {
			h.t.Errorf("message %s: still no answer from a running daemon", m.id)
		}
	}
}

func (h *httpHunt) waitAnswered() {
	t := h.t
	store := h.server().r.d.store
	for _, id := range h.order {
		m := h.msgs[id]
		if !m.acked {
			continue
		}
		if m.sid == "" {
			in, err := store.FindInbound(h.ctx, httpplatform.Name, m.chatID, m.id)
			if err != nil {
				t.Fatalf("message %s acknowledged as a duplicate: FindInbound = %v", m.id, err)
			}
			m.sid = in.SessionID
		}
		answered := func() bool {
			got, err := store.RepliesTo(h.ctx, m.key, m.id, 0)
			return err == nil && len(got) > 0
		}
		if !answered() {
			t.Logf("waiting for the answer to %s (%q in %s, session %s)", m.id, m.text, m.key, m.sid)
			waitUntil(t, answered)
		}
	}
}

func (h *httpHunt) outboxes(keys []string) map[string][]persistence.OutboxEntry {
	out := map[string][]persistence.OutboxEntry{}
	for _, k := range keys {
		entries, err := h.server().r.d.store.OutboxAfter(h.ctx, k, 0, 0)
		if err != nil {
			h.t.Fatalf("OutboxAfter(%s): %v", k, err)
		}
		out[k] = entries
	}
	return out
}

func (h *httpHunt) check(keys []string, outbox map[string][]persistence.OutboxEntry, subs []*huntSubscriber) {
	t := h.t
	store := h.server().r.d.store
	answers := map[string][]persistence.OutboxEntry{} // message id → entries answering it
	byText := map[string]string{}                     // message text → id
	replied := map[string]bool{}                      // turn ids of the agent's delivered replies
	for _, id := range h.order {
		if m := h.msgs[id]; !m.command {
			byText[m.text] = id
		}
	}
	for _, k := range keys {
		for _, e := range outbox[k] {
			for _, id := range e.InReplyTo {
				answers[id] = append(answers[id], e)
			}
			if e.Kind != platforms.KindReply {
				continue
			}
			replied[e.TurnID] = true
			if !strings.HasPrefix(e.Text, "sid="+e.SessionID+" re ") {
				t.Errorf("key %s: reply %d %q in session %s was written by a turn of another session", k, e.Seq, e.Text, e.SessionID)
				continue
			}
			// Every message the agent answered is one the reply answers.
			for _, text := range strings.Split(strings.TrimPrefix(e.Text, "sid="+e.SessionID+" re "), "|") {
				if id := byText[text]; id != "" && !slices.Contains(e.InReplyTo, id) {
					t.Errorf("key %s: reply %d %q answers %v, not %s, whose text the agent answered", k, e.Seq, e.Text, e.InReplyTo, id)
				}
			}
		}
	}
	userSeq := map[string]map[string]int64{} // session id → message id → transcript seq
	for _, id := range h.order {
		m := h.msgs[id]
		got := answers[id]
		if !m.acked {
			continue
		}
		if len(got) != 1 {
			t.Errorf("message %s (%q in %s, session %s) answered %d times: %+v", id, m.text, m.key, m.sid, len(got), got)
			continue
		}
		e := got[0]
		// A turn cut short (an interrupt, /stop, a stop's deadline) may have run the agent to
		// its end: only turns whose reply was delivered count.
		var delivered []string
		for _, turn := range h.runs[id] {
			if replied[turn] && !slices.Contains(delivered, turn) {
				delivered = append(delivered, turn)
			}
		}
		if len(delivered) > 1 {
			t.Errorf("message %s (%q) was answered by the agent in %d turns: %v", id, m.text, len(delivered), delivered)
		}
		if e.SessionKey != m.key {
			t.Errorf("message %s of %s answered in key %s", id, m.key, e.SessionKey)
		}
		if e.Kind == platforms.KindReply && e.SessionID != m.sid {
			t.Errorf("message %s acked in session %s answered by a reply of session %s: %q", id, m.sid, e.SessionID, e.Text)
		}
		if m.hasWaited && (len(m.waited) != 1 || m.waited[0].Seq != e.Seq || m.waited[0].Text != e.Text) {
			t.Errorf("message %s: ?wait answered %+v, want its answer %d %q", id, m.waited, e.Seq, e.Text)
		}
		if userSeq[m.sid] == nil {
			userSeq[m.sid] = map[string]int64{}
			rows, err := store.Transcript(h.ctx, m.sid)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				if r.Role == persistence.RoleUser {
					userSeq[m.sid][r.MessageID] = r.Seq
				}
			}
		}
	}
	// Arrival order per session: by transcript seq, the answers' outbox seqs never go back.
	for sid, seqs := range userSeq {
		var ids []string
		for id := range seqs {
			if m := h.msgs[id]; m != nil && m.acked && !m.command && len(answers[id]) == 1 {
				ids = append(ids, id)
			}
		}
		slices.SortFunc(ids, func(a, b string) int { return int(seqs[a] - seqs[b]) })
		for i := 1; i < len(ids); i++ {
			a, b := answers[ids[i-1]][0], answers[ids[i]][0]
			if b.Seq < a.Seq {
				t.Errorf("session %s: %s (row %d) answered by entry %d, before %s (row %d, entry %d)",
					sid, ids[i], seqs[ids[i]], b.Seq, ids[i-1], seqs[ids[i-1]], a.Seq)
			}
		}
	}
	for _, id := range h.bad {
		if _, err := store.FindInbound(h.ctx, httpplatform.Name, "d0", id); !errors.Is(err, persistence.ErrNotFound) {
			t.Errorf("refused request's message %s: FindInbound = %v, want not found", id, err)
		}
		if len(answers[id]) > 0 {
			t.Errorf("refused request's message %s answered: %+v", id, answers[id])
		}
	}
	var acked, waited, events, entries int
	for _, m := range h.msgs {
		if m.acked {
			acked++
		}
		if m.hasWaited {
			waited++
		}
	}
	for _, s := range subs {
		events += len(s.seen)
		entries += len(outbox[s.key])
	}
	t.Logf("%d messages acknowledged, %d answered to a wait, %d refused requests; %d outbox entries, %d events over %d reconnections",
		acked, waited, len(h.bad), entries, events, h.reconnects.Load())
	for _, s := range subs {
		entries := outbox[s.key]
		if len(s.seen) != len(entries) {
			t.Errorf("subscriber of %s saw %d events, the outbox has %d", s.key, len(s.seen), len(entries))
		}
		for i := range min(len(s.seen), len(entries)) {
			got, want := s.seen[i], entries[i]
			if got.seq != want.Seq || got.ev.Text != want.Text || got.ev.SessionID != want.SessionID || fmt.Sprint(got.ev.InReplyTo) != fmt.Sprint(want.InReplyTo) {
				t.Errorf("subscriber of %s: event %d is %d %+v, want entry %d %q %s %v", s.key, i, got.seq, got.ev, want.Seq, want.Text, want.SessionID, want.InReplyTo)
				break
			}
		}
	}
}
