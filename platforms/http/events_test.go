package http

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/platforms"
)

func outbound(key string, seq int64, kind string) *platforms.Outbound {
	return &platforms.Outbound{
		SessionKey: key, SessionID: "s1", Seq: seq, Kind: kind,
		Text: fmt.Sprintf("event %d", seq), TurnID: "t1", InReplyTo: []string{fmt.Sprintf("m%d", seq)},
	}
}

func TestEventsReplayThenLive(t *testing.T) {
	sessions := newFakeSessions()
	h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})
	// A key with escaped components travels as one path segment and must reach Sessions
	// exactly as it was built, decoded once.
	key := "agent:main:http:dm:a%2Fb%3Ac d"
	for seq := int64(1); seq <= 5; seq++ {
		kind := platforms.KindReply
		if seq == 4 {
			kind = platforms.KindNotice
		}
		sessions.addOutbox(outbound(key, seq, kind))
	}
	sessions.addOutbox(outbound("agent:main:http:dm:other", 9, platforms.KindReply))

	s := h.openSSE(key, "2", "")
	if s.status != 200 {
		t.Fatalf("GET events = %d, want 200", s.status)
	}
	var ids []int64
	for range 3 {
		ev := s.mustNextEvent()
		ids = append(ids, ev.id)
		want := sseEvent{id: ev.id, event: "reply", data: Event{
			Text: fmt.Sprintf("event %d", ev.id), TurnID: "t1", SessionID: "s1", InReplyTo: []string{fmt.Sprintf("m%d", ev.id)},
		}}
		if ev.id == 4 {
			want.event = "notice"
		}
		if diff := cmp.Diff(want, ev, cmp.AllowUnexported(sseEvent{})); diff != "" {
			t.Errorf("replayed event mismatch (-want +got):\n%s", diff)
		}
	}

	// The seam: 5 was replayed; live copies of 5 and a re-sent 4 must not repeat.
	ctx := context.Background()
	for _, seq := range []int64{5, 6, 4, 7} {
		if err := h.p.Send(ctx, outbound(key, seq, platforms.KindReply)); err != nil {
			t.Fatalf("Send(%d) = %v", seq, err)
		}
	}
	h.p.Send(ctx, outbound("agent:main:http:dm:other", 10, platforms.KindReply))
	for range 2 {
		ids = append(ids, s.mustNextEvent().id)
	}
	if want := []int64{3, 4, 5, 6, 7}; !cmp.Equal(ids, want) {
		t.Errorf("event ids = %v, want %v", ids, want)
	}
	if calls := sessions.callLog(); len(calls) == 0 || calls[0] != "outbox "+key+" 2" {
		t.Errorf("Sessions calls = %q, want first OutboxAfter(%q, 2)", calls, key)
	}
}

// TestEventsLiveGapIsFilledFromTheOutbox: a live event that skips some (in a cluster, the
// relay of a reply sent on another member can miss this member) is preceded by the skipped
// entries, read from the durable outbox. Before, the stream sent the later event alone, the
// client's Last-Event-ID passed the missed one, and no resume brought it back (a black-box
// chaos run of three members lost seq 28 of a chat's stream this way, just after a restart).
func TestEventsLiveGapIsFilledFromTheOutbox(t *testing.T) {
	sessions := newFakeSessions()
	h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})
	for seq := int64(1); seq <= 2; seq++ {
		sessions.addOutbox(outbound(streamKey, seq, platforms.KindReply))
	}
	s := h.openSSE(streamKey, "1", "")
	if ev := s.mustNextEvent(); ev.id != 2 {
		t.Fatalf("replayed event id = %d, want 2", ev.id)
	}
	// 3 and 4 are recorded, but only 5 reaches this member live.
	for seq := int64(3); seq <= 5; seq++ {
		sessions.addOutbox(outbound(streamKey, seq, platforms.KindReply))
	}
	ctx := context.Background()
	if err := h.p.Send(ctx, outbound(streamKey, 5, platforms.KindReply)); err != nil {
		t.Fatalf("Send(5) = %v", err)
	}
	if err := h.p.Send(ctx, outbound(streamKey, 6, platforms.KindReply)); err != nil {
		t.Fatalf("Send(6) = %v", err)
	}
	var ids []int64
	for range 4 {
		ids = append(ids, s.mustNextEvent().id)
	}
	if want := []int64{3, 4, 5, 6}; !cmp.Equal(ids, want) {
		t.Errorf("event ids = %v, want %v", ids, want)
	}
}

// TestEventsMissedLastRelayIsSentAtTheKeepalive: on a member that gets relayed replies (a
// cluster), a stream whose latest reply the relay missed, and which no later reply follows,
// finds it in the outbox at its next keepalive. Before, it showed only after a reconnect.
func TestEventsMissedLastRelayIsSentAtTheKeepalive(t *testing.T) {
	sessions := newFakeSessions()
	h := mustStart(t, Config{Sessions: sessions, KeepAlive: 20 * time.Millisecond}, &fakeRuntime{})
	sessions.addOutbox(outbound(streamKey, 1, platforms.KindReply))
	s := h.openSSE(streamKey, "", "")
	if ev := s.mustNextEvent(); ev.id != 1 {
		t.Fatalf("replayed event id = %d, want 1", ev.id)
	}
	sessions.addOutbox(outbound(streamKey, 2, platforms.KindReply))
	h.p.Show(outbound(streamKey, 2, platforms.KindReply)) // relayed from another member
	if ev := s.mustNextEvent(); ev.id != 2 {
		t.Fatalf("relayed event id = %d, want 2", ev.id)
	}
	sessions.addOutbox(outbound(streamKey, 3, platforms.KindReply)) // its relay is lost
	if ev := s.mustNextEvent(); ev.id != 3 {
		t.Errorf("event id = %d, want 3", ev.id)
	}
}

// TestEventsMissedFirstRelayOfAClusterMemberIsSentAtTheKeepalive: on a cluster member that has
// not been shown any relayed reply yet (it has just started, which is when relays miss it), a
// stream whose reply the relay missed finds it in the outbox at its next keepalive. Before, the
// keepalive looked only on a member that had been shown a relayed reply, so a member whose
// first relay was the missed one showed it only after a reconnect.
func TestEventsMissedFirstRelayOfAClusterMemberIsSentAtTheKeepalive(t *testing.T) {
	sessions := newFakeSessions()
	h := mustStart(t, Config{Sessions: sessions, KeepAlive: 20 * time.Millisecond, Clustered: true}, &fakeRuntime{})
	sessions.addOutbox(outbound(streamKey, 1, platforms.KindReply))
	s := h.openSSE(streamKey, "", "")
	if ev := s.mustNextEvent(); ev.id != 1 {
		t.Fatalf("replayed event id = %d, want 1", ev.id)
	}
	sessions.addOutbox(outbound(streamKey, 2, platforms.KindReply)) // sent on another member; its relay is lost
	if ev := s.mustNextEvent(); ev.id != 2 {
		t.Errorf("event id = %d, want 2", ev.id)
	}
}

func TestEventsResumePoint(t *testing.T) {
	sessions := newFakeSessions()
	h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})
	for seq := int64(1); seq <= 3; seq++ {
		sessions.addOutbox(outbound(streamKey, seq, platforms.KindReply))
	}
	cases := []struct {
		name     string
		lastID   string
		query    string
		wantID   int64
		wantCode string
	}{
		{"from the start", "", "", 1, ""},
		{"after query", "", "?after=1", 2, ""},
		{"header wins over query", "2", "?after=1", 3, ""},
		{"invalid header", "abc", "", 0, CodeInvalidEventID},
		{"negative header", "-1", "", 0, CodeInvalidEventID},
		// A bad query parameter is an invalid_query, as docs/HTTP-API.md says of a bad after (and as a
		// bad after is on every other route); only the header's is an invalid_last_event_id.
		{"invalid after", "", "?after=x", 0, CodeInvalidQuery},
		{"negative after", "", "?after=-1", 0, CodeInvalidQuery},
		// A malformed pair is not dropped: the resume point it may have meant is not guessed.
		{"malformed query", "", "?after=2;x", 0, CodeInvalidQuery},
		{"bad escape", "", "?after=%zz", 0, CodeInvalidQuery},
		{"after given twice", "", "?after=1&after=2", 0, CodeInvalidQuery},
		// EventSource polyfills that cannot set the header on a reconnect send the last id as
		// lastEventId in the query, next to the stream's own parameters: before, the unknown
		// parameter was refused, and such a browser client could never reconnect.
		{"a polyfill's lastEventId", "", "?lastEventId=2", 3, ""},
		{"a polyfill's lastEventId wins over after", "", "?after=1&lastEventId=2", 3, ""},
		{"the header wins over lastEventId", "2", "?lastEventId=1", 3, ""},
		// As docs/HTTP-API.md says: what does not win is not read as an id.
		{"the header wins over a bad after", "2", "?after=x", 3, ""},
		{"invalid lastEventId", "", "?lastEventId=x", 0, CodeInvalidQuery},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := h.openSSE(streamKey, tc.lastID, tc.query)
			if tc.wantCode != "" {
				body, _ := io.ReadAll(s.body)
				got := response{status: s.status, body: body}
				if got.status != 400 || got.errCode() != tc.wantCode {
					t.Errorf("GET events = %d %q (%s), want 400 %q", got.status, got.errCode(), body, tc.wantCode)
				}
				return
			}
			if ev := s.mustNextEvent(); ev.id != tc.wantID {
				t.Errorf("first event id = %d, want %d", ev.id, tc.wantID)
			}
		})
	}

	if got := h.do("GET", "/v1/sessions/"+url.PathEscape("bad\x01key")+"/events", nil, ""); got.status != 400 || got.errCode() != CodeInvalidKey {
		t.Errorf("GET events of a key with a control character = %d %q, want 400 %q", got.status, got.errCode(), CodeInvalidKey)
	}
	// Not a session key: refused at once, not held open as a stream that can never carry
	// an event.
	for _, key := range []string{"nope", "agent:main:http:nochat:1", "agent:main:http:dm:a:b:c", "agent:main:http:dm:", "agent::http:dm:x"} {
		if got := h.do("GET", "/v1/sessions/"+url.PathEscape(key)+"/events", nil, ""); got.status != 400 || got.errCode() != CodeInvalidKey {
			t.Errorf("GET events of %q = %d %q, want 400 %q", key, got.status, got.errCode(), CodeInvalidKey)
		}
	}
	noSessions := mustStart(t, Config{}, &fakeRuntime{})
	if got := noSessions.do("GET", "/v1/sessions/k/events", nil, ""); got.status != 503 {
		t.Errorf("GET events without Sessions = %d, want 503", got.status)
	}
}

// TestEventsOfAKeyNotInCanonicalForm: a key that parses but that agentgate never writes so (a
// chat id escaped by the client, a lower-case escape, the profile "default" for main) can
// never carry an event: it is a 400 invalid_key naming the key meant. Before, it was streamed,
// and its client waited for ever on a session nothing ever went to. Every key agentgate
// writes is streamed as before.
func TestEventsOfAKeyNotInCanonicalForm(t *testing.T) {
	sessions := newFakeSessions()
	h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})
	for _, tc := range []struct{ key, meant string }{
		{"agent:main:http:dm:a%20b", "agent:main:http:dm:a b"},
		{"agent:main:http:dm:a%3ab", "agent:main:http:dm:a%3Ab"},
		{"agent:default:http:dm:c", "agent:main:http:dm:c"},
		{"agent:main:http:group:g:%75", "agent:main:http:group:g:u"},
	} {
		got := h.do("GET", "/v1/sessions/"+url.PathEscape(tc.key)+"/events", nil, "")
		var e ErrorResponse
		_ = json.Unmarshal(got.body, &e)
		if got.status != 400 || e.Error.Code != CodeInvalidKey || !strings.HasSuffix(e.Error.Message, "the key of that chat is "+tc.meant) {
			t.Errorf("GET events of %q = %d %s, want 400 %q naming %q", tc.key, got.status, got.body, CodeInvalidKey, tc.meant)
		}
	}

	opts := []identity.KeyOptions{{}, {GroupSessionsPerUser: true, ThreadSessionsPerUser: true}}
	for i, src := range []identity.Source{
		{Platform: "http", ChatType: identity.ChatDM, ChatID: "a b", UserID: "u"},
		{Platform: "http", ChatType: identity.ChatDM, ChatID: "a:b/c%d\x01", ThreadID: "t", Profile: "main"},
		{Platform: "http", ChatType: identity.ChatGroup, ChatID: "g", UserID: "u:1", Profile: "main~"},
		{Platform: "discord", ChatType: identity.ChatChannel, ChatID: "123", ThreadID: "456", UserID: "789", Profile: "ops"},
		{Platform: "http", ChatType: identity.ChatThread, ChatID: "c", ThreadID: "t%", UserID: "u", Profile: "a:b"},
	} {
		for _, o := range opts {
			key := identity.Key(src, o)
			s := h.openSSE(key, "", "")
			if s.status != http.StatusOK {
				t.Errorf("GET events of %q (source %d) = %d, want 200: a key agentgate writes", key, i, s.status)
			}
			s.close()
		}
	}
}

func TestEventsReplayPages(t *testing.T) {
	sessions := newFakeSessions()
	h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})
	const n = 2*replayPageSize + 37
	for seq := int64(1); seq <= n; seq++ {
		sessions.addOutbox(outbound(streamKey, seq, platforms.KindReply))
	}
	s := h.openSSE(streamKey, "", "")
	for want := int64(1); want <= n; want++ {
		if ev := s.mustNextEvent(); ev.id != want {
			t.Fatalf("event id = %d, want %d", ev.id, want)
		}
	}
}

func TestEventsKeepalive(t *testing.T) {
	h := mustStart(t, Config{Sessions: newFakeSessions(), KeepAlive: 10 * time.Millisecond}, &fakeRuntime{})
	s := h.openSSE(streamKey, "", "")
	ev, err := s.next()
	if err != nil || ev.comment != "keepalive" {
		t.Errorf("first SSE item = %+v, %v; want a keepalive comment", ev, err)
	}
}

// TestEventsSlowSubscriber checks that Send never waits for a client that does not read, and
// that such a client, dropped or not, still gets every event exactly once in order by resuming
// with Last-Event-ID.
func TestEventsSlowSubscriber(t *testing.T) {
	sessions := newFakeSessions()
	h := mustNew(t, Config{Sessions: sessions})
	h.p.subBuffer = 4
	h.start((&fakeRuntime{}).deliver)

	s := h.openSSE(streamKey, "", "")
	waitFor(t, "the subscriber", func() bool { return h.p.subscriberCount(streamKey) == 1 })

	const n = 1000
	text := strings.Repeat("x", 2<<10)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	sent := make(chan error, 1)
	go func() {
		for seq := int64(1); seq <= n; seq++ {
			out := outbound(streamKey, seq, platforms.KindReply)
			out.Text = text
			sessions.addOutbox(out) // recorded before it is sent, as the runtime does
			if err := h.p.Send(ctx, out); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	select {
	case err := <-sent:
		if err != nil {
			t.Fatalf("Send() = %v", err)
		}
	case <-ctx.Done():
		t.Fatalf("Send blocked on a client that does not read")
	}

	var last int64
	reconnects := 0
	for last < n {
		ev, err := s.next()
		if errors.Is(err, io.EOF) {
			reconnects++
			s.close()
			s = h.openSSE(streamKey, fmt.Sprint(last), "")
			continue
		}
		if err != nil {
			t.Fatalf("read event after %d: %v", last, err)
		}
		if ev.comment != "" {
			continue
		}
		if ev.id != last+1 {
			t.Fatalf("event id = %d after %d, want %d (strictly increasing, no gaps or repeats)", ev.id, last, last+1)
		}
		last = ev.id
	}
	t.Logf("read %d events with %d reconnects", n, reconnects)
}

// TestHeldRequestsAreBounded: event streams and ?wait requests are held open at most
// Config.MaxHeld at once; beyond it, one is answered 503 too_many_held at once, before anything
// is done for it (a ?wait message is not delivered), while requests that hold nothing are
// served; once one ends, another is taken. Before, nothing bounded them: 3,000 streams took a
// daemon from 27 to 150 MB and 3,000 open files.
func TestHeldRequestsAreBounded(t *testing.T) {
	rt := &fakeRuntime{}
	h := mustStart(t, Config{Sessions: newFakeSessions(), MaxHeld: 2}, rt)
	key := "agent:main:http:dm:c"
	first := h.openSSE(key, "", "")
	if first.status != http.StatusOK {
		t.Fatalf("first stream: %d", first.status)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waited := make(chan error, 1)
	go func() { // held until cancelled (doCtx would fail the test from this goroutine)
		req, err := http.NewRequestWithContext(ctx, "POST", h.base+"/v1/messages?wait=1m",
			strings.NewReader(`{"chat_id":"c","user_id":"u","text":"held","message_id":"m1"}`))
		if err == nil {
			var resp *http.Response
			if resp, err = h.client.Do(req); err == nil {
				resp.Body.Close()
			}
		}
		waited <- err
	}()
	waitFor(t, "two requests held", func() bool { return h.p.held.Load() == 2 })

	if s := h.openSSE(key, "", ""); s.status != http.StatusServiceUnavailable {
		t.Errorf("a third request held open (a stream): %d, want 503", s.status)
	}
	r := h.do("POST", "/v1/messages?wait=1m", nil, `{"chat_id":"c","user_id":"u","text":"refused","message_id":"m2"}`)
	if r.status != http.StatusServiceUnavailable || r.errCode() != CodeTooManyHeld || r.header.Get("Retry-After") == "" {
		t.Errorf("a third request held open (?wait): %d %s (Retry-After %q), want 503 %s with Retry-After", r.status, r.body, r.header.Get("Retry-After"), CodeTooManyHeld)
	}
	if r := h.do("POST", "/v1/messages", nil, `{"chat_id":"c","user_id":"u","text":"not held","message_id":"m3"}`); r.status != http.StatusAccepted {
		t.Errorf("a message without ?wait: %d %s, want 202", r.status, r.body)
	}
	rt.mu.Lock()
	var ids []string
	for _, in := range rt.got {
		ids = append(ids, in.MessageID)
	}
	rt.mu.Unlock()
	if fmt.Sprint(ids) != "[m1 m3]" {
		t.Errorf("delivered %v, want [m1 m3]: a refused ?wait delivers nothing", ids)
	}

	first.close()
	waitFor(t, "the stream's end to be counted", func() bool { return h.p.held.Load() == 1 })
	if s := h.openSSE(key, "", ""); s.status != http.StatusOK {
		t.Errorf("a stream once another ended: %d, want 200", s.status)
	}
	cancel()
	<-waited
}

// TestEventsResumePointPastTheLastEvent: a resume point past the key's last event (an id held
// from a restored backup, or from another daemon) is read as the last event: the stream goes
// on with the events to come, none repeated, none skipped. Before, it skipped every event up
// to the id it was given, and its client waited for ever without a word.
func TestEventsResumePointPastTheLastEvent(t *testing.T) {
	for _, tc := range []struct {
		name          string
		outbox        []int64 // seqs already recorded
		lastID, query string
	}{
		{"Last-Event-ID", []int64{1, 2, 3}, "100000", ""},
		{"after", []int64{1, 2, 3}, "", "?after=9999"},
		{"lastEventId", []int64{1, 2, 3}, "", "?lastEventId=4"},
		{"seqs with gaps", []int64{2, 5, 9}, "", "?after=9223372036854775807"},
		{"no event yet", nil, "7", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sessions := newFakeSessions()
			h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})
			var last int64
			for _, seq := range tc.outbox {
				sessions.addOutbox(outbound(streamKey, seq, platforms.KindReply))
				last = seq
			}
			s := h.openSSE(streamKey, tc.lastID, tc.query)
			if s.status != http.StatusOK {
				t.Fatalf("GET events = %d, want 200", s.status)
			}
			waitFor(t, "the subscriber", func() bool { return h.p.subscriberCount(streamKey) == 1 })
			var want []int64
			for seq := last + 1; seq <= last+2; seq++ {
				out := outbound(streamKey, seq, platforms.KindReply)
				sessions.addOutbox(out) // recorded before it is sent, as the runtime does
				if err := h.p.Send(context.Background(), out); err != nil {
					t.Fatalf("Send(%d) = %v", seq, err)
				}
				want = append(want, seq)
			}
			var ids []int64
			for range want {
				ids = append(ids, s.mustNextEvent().id)
			}
			if !cmp.Equal(ids, want) {
				t.Errorf("event ids = %v, want %v", ids, want)
			}
		})
	}
}

// TestEventsHeadIsNotHeld: a HEAD of the event stream is answered with the stream's headers and
// ends, as its Connection: close says: it has no body to stream. Before, it was held open as a
// stream (the server discards a HEAD's body, so the keepalives never failed) until its client
// closed the connection, and took one of Config.MaxHeld all that time: a client that kept the
// connection, as a HEAD's may, held it for ever, and with MaxHeld such requests every event
// stream was answered 503.
func TestEventsHeadIsNotHeld(t *testing.T) {
	sessions := newFakeSessions()
	sessions.addOutbox(outbound(streamKey, 1, platforms.KindReply))
	h := mustStart(t, Config{Sessions: sessions, MaxHeld: 1}, &fakeRuntime{})
	resp, err := rawRequest(t, h, "HEAD /v1/sessions/"+streamKey+"/events HTTP/1.1\r\nHost: 127.0.0.1\r\n", "")
	if err != nil {
		t.Fatalf("HEAD of the event stream: %v", err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("HEAD of the event stream: %s, Content-Type %q, want 200 text/event-stream", resp.Status, resp.Header.Get("Content-Type"))
	}
	// The client keeps its connection open: the answer must end on the server's side.
	waitFor(t, "the HEAD to be no longer held", func() bool { return h.p.held.Load() == 0 })
	if s := h.openSSE(streamKey, "", ""); s.status != http.StatusOK {
		t.Errorf("a stream after a HEAD of it: %d, want 200", s.status)
	}
}
