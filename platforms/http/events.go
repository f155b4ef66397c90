package http

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/platforms"
)

// subscriber is one live SSE stream's inbox. Send offers to it without blocking; when the
// buffer is full the subscriber is dropped: gone is closed and the stream ends, so the client
// reconnects with Last-Event-ID and catches up from the durable outbox.
type subscriber struct {
	ch   chan *platforms.Outbound
	gone chan struct{}
}

// offer is called with p.mu held and reports whether the subscriber keeps up.
func (s *subscriber) offer(out *platforms.Outbound) bool {
	select {
	case s.ch <- out:
		return true
	default:
		close(s.gone)
		return false
	}
}

func (p *Platform) subscribe(key string) *subscriber {
	s := &subscriber{ch: make(chan *platforms.Outbound, p.subBuffer), gone: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	set := p.subs[key]
	if set == nil {
		set = make(map[*subscriber]struct{})
		p.subs[key] = set
	}
	set[s] = struct{}{}
	return s
}

func (p *Platform) unsubscribe(key string, s *subscriber) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.removeSubLocked(key, s)
}

func (p *Platform) removeSubLocked(key string, s *subscriber) {
	set := p.subs[key]
	delete(set, s)
	if len(set) == 0 {
		delete(p.subs, key)
	}
}

// handleEvents is GET /v1/sessions/{key}/events: the durable outbox after the resume point,
// then live events, as Server-Sent Events whose ids are outbox seqs.
func (p *Platform) handleEvents(w http.ResponseWriter, r *http.Request) {
	// A key that is not a session key can never have events: it is refused rather than held
	// open as a stream for ever. A well-formed key with no session yet is streamed, so a client
	// may subscribe before its first message.
	sessions, key, ok := p.sessionsAndKey(w, r)
	if !ok {
		return
	}
	if canonical := canonicalKey(key); canonical != key {
		// Nor is a key that agentgate never writes so (%3a for %3A, a chat id escaped that
		// needs no escape, agent:default: for agent:main:): no event can ever come to it, and
		// its client, streamed, would wait for ever without a word. The answer names the key
		// meant. (GET and the other routes answer it 404: no session has it.)
		writeError(w, http.StatusBadRequest, CodeInvalidKey, fmt.Sprintf(
			"the session key is not in the form agentgate writes keys, so no event ever comes to it; the key of that chat is %s", clipped(canonical)))
		return
	}
	after, aerr := resumePoint(r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	release, held := p.hold(w, "event stream")
	if !held {
		return
	}
	defer release()
	ctx := r.Context()
	stop := p.stopped()

	// Subscribe before reading the outbox: an entry recorded after the read is then sent
	// live, and one both read and sent is skipped by seq.
	sub := p.subscribe(key)
	defer p.unsubscribe(key, sub)

	var err error
	if after > 0 {
		// An id past the key's last event (one held from a restored backup, or from another
		// daemon) is read as its last one: the stream goes on with the events to come. Kept,
		// it would skip them all, as ids it had had, and its client wait for ever without a
		// word; a 400 would make it start over and get again what it has. Read before the
		// replay: an entry recorded after this read has a higher seq, and is replayed or sent.
		var last int64
		if last, err = sessions.LastOutboxSeq(ctx, key); err == nil {
			after = min(after, last)
		}
	}
	var page []*platforms.Outbound
	if err == nil {
		page, err = sessions.OutboxAfter(ctx, key, after, replayPageSize)
	}
	if err != nil {
		p.writeSessionsError(w, r, "outbox", err)
		return
	}

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // reverse proxies must not buffer the stream
	// The stream's write deadlines must not outlive it on a reused connection, and a stream
	// ends only when it is stopped or too slow: close the connection with it.
	h.Set("Connection", "close")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		// The stream's headers are the whole answer: the server discards a HEAD's body, so its
		// keepalives never fail, and held it would last as long as its client kept the
		// connection, taking one of MaxHeld.
		return
	}
	sw := &sseWriter{w: w, rc: http.NewResponseController(w), timeout: p.cfg.WriteTimeout, last: after}
	if err := sw.flush(); err != nil {
		return
	}

	// A page holds at most replayPageSize entries and about a MiB of texts (the store's
	// persistence.OutboxPageBytes), so a stream whose client reads slowly, or not at all, holds
	// one such page: a shorter page is no sign of the end, an empty one is.
	for len(page) > 0 {
		for _, out := range page {
			if err := sw.event(out); err != nil {
				return
			}
		}
		if page, err = sessions.OutboxAfter(ctx, key, sw.last, replayPageSize); err != nil {
			// The client resumes from the last id it got.
			p.replayFailed(ctx, key, err)
			return
		}
	}

	keepalive := time.NewTicker(p.cfg.KeepAlive)
	defer keepalive.Stop()
	for {
		select {
		case out := <-sub.ch:
			if out.Seq > sw.last+1 {
				// A live event skipped some: in a cluster, a reply sent on another member
				// reaches this one by a relay that can miss it (this member joined after the
				// sender last renewed). The entries in between are durable, since a reply
				// is recorded before it is sent: send them first, or the client's
				// Last-Event-ID would pass them and no resume would bring them back.
				if err := p.fillGap(ctx, sessions, key, sw, out.Seq); err != nil {
					p.replayFailed(ctx, key, err)
					return
				}
			}
			if err := sw.event(out); err != nil {
				return
			}
		case <-sub.gone:
			p.log.Debug("sse stream closed for slow subscriber", "session", key)
			return
		case <-keepalive.C:
			if p.relayed.Load() {
				// A relay that missed this member's latest reply is followed by no live event
				// that would fill the gap: look in the outbox now and then.
				if err := p.fillGap(ctx, sessions, key, sw, math.MaxInt64); err != nil {
					p.replayFailed(ctx, key, err)
					return
				}
			}
			if err := sw.comment("keepalive"); err != nil {
				return
			}
		case <-ctx.Done():
			return
		case <-stop:
			return
		}
	}
}

// replayFailed logs a failed outbox read of an event stream, unless the stream ended (its
// client left, or the platform stops): the client resumes from the last id it got. Logged at
// once, then at most once a minute for all streams.
func (p *Platform) replayFailed(ctx context.Context, key string, err error) {
	if ctx.Err() != nil {
		return
	}
	p.replayFails.LogQuiet(p.log, slog.LevelWarn, "sse replay failed", "session", key, logging.Err(err))
}

// fillGap writes the outbox entries of key after the last event written and before seq
// (math.MaxInt64: all of them).
func (p *Platform) fillGap(ctx context.Context, sessions Sessions, key string, sw *sseWriter, seq int64) error {
	for sw.last+1 < seq {
		page, err := sessions.OutboxAfter(ctx, key, sw.last, replayPageSize)
		if err != nil {
			return err
		}
		from := sw.last
		for _, out := range page {
			if out.Seq >= seq {
				return nil
			}
			if err := sw.event(out); err != nil {
				return err
			}
		}
		if sw.last == from { // an empty page: a shorter one is no sign of the end
			return nil
		}
	}
	return nil
}

// resumePoint is the Last-Event-ID header, else the lastEventId query parameter (a
// polyfill's), else the after query parameter, else 0.
func resumePoint(r *http.Request) (int64, *apiError) {
	q, aerr := query(r, "after", "lastEventId")
	if aerr != nil {
		return 0, aerr
	}
	v, src := r.Header.Get("Last-Event-ID"), "Last-Event-ID"
	if v == "" {
		// An EventSource polyfill that cannot set the header on a reconnect sends the last id
		// in the query (event-source-polyfill's lastEventId), beside the URL's own after.
		v, src = q.Get("lastEventId"), "lastEventId"
	}
	if v == "" {
		v, src = q.Get("after"), "after"
	}
	if v == "" {
		return 0, nil
	}
	n, err := parseSeq(v)
	if err != nil {
		// The code names where the bad id is: in the query it is an invalid_query, as a bad
		// after is on every route; only the header's is an invalid_last_event_id.
		code := CodeInvalidQuery
		if src == "Last-Event-ID" {
			code = CodeInvalidEventID
		}
		return 0, badRequest(code, src+" must be a non-negative integer event id")
	}
	return n, nil
}

// sseWriter writes events with strictly increasing ids: an event whose seq is not above the
// last one written (a replay/live overlap or a re-send) is skipped.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration // Config.WriteTimeout, for each event
	last    int64
	buf     bytes.Buffer
}

func (s *sseWriter) event(out *platforms.Outbound) error {
	if out.Seq <= s.last {
		return nil
	}
	in := out.InReplyTo
	if in == nil {
		in = []string{}
	}
	data, err := json.Marshal(Event{Text: out.Text, TurnID: out.TurnID, SessionID: out.SessionID, InReplyTo: in})
	if err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	s.buf.Reset()
	s.buf.WriteString("id: ")
	s.buf.WriteString(strconv.FormatInt(out.Seq, 10))
	s.buf.WriteString("\nevent: ")
	s.buf.WriteString(eventKind(out.Kind))
	s.buf.WriteString("\ndata: ")
	s.buf.Write(data) // JSON escapes newlines, so the data is one line
	s.buf.WriteString("\n\n")
	if err := s.write(); err != nil {
		return err
	}
	s.last = out.Seq
	return nil
}

func (s *sseWriter) comment(text string) error {
	s.buf.Reset()
	s.buf.WriteString(": ")
	s.buf.WriteString(text)
	s.buf.WriteString("\n\n")
	return s.write()
}

// write sends the buffer under a write deadline, so a client that stops reading cannot hold
// the stream's goroutine forever.
func (s *sseWriter) write() error {
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.timeout)) // unsupported only off a real conn
	if _, err := s.w.Write(s.buf.Bytes()); err != nil {
		return fmt.Errorf("write event: %w", err)
	}
	return s.flush()
}

func (s *sseWriter) flush() error {
	if err := s.rc.Flush(); err != nil {
		return fmt.Errorf("flush event: %w", err)
	}
	return nil
}

// canonicalKey is the key identity.Key writes for the parts of key, a session key: the key
// itself for every key agentgate makes. The options keep the user slot the key has (ParseKey
// sets a user only where the key holds one).
func canonicalKey(key string) string {
	parts, err := identity.ParseKey(key)
	if err != nil {
		return ""
	}
	return identity.Key(identity.Source{Profile: parts.Profile, Platform: parts.Platform, ChatType: parts.ChatType,
		ChatID: parts.ChatID, ThreadID: parts.ThreadID, UserID: parts.UserID},
		identity.KeyOptions{GroupSessionsPerUser: true, ThreadSessionsPerUser: true})
}

// pathKey returns the {key} path value, or a 400 invalid_key when it is no session key. The
// mux has decoded it exactly once; it is used as is, never unescaped again, because its own
// components are percent-escaped (identity.Escape).
func pathKey(r *http.Request) (string, *apiError) {
	key := r.PathValue("key")
	switch {
	case key == "":
		return "", badRequest(CodeInvalidKey, "the session key is empty")
	case len(key) > maxKeyBytes:
		return "", badRequest(CodeInvalidKey, "the session key is too long")
	case !utf8.ValidString(key) || strings.ContainsFunc(key, unicode.IsControl):
		return "", badRequest(CodeInvalidKey, "the session key contains invalid characters")
	}
	if _, err := identity.ParseKey(key); err != nil {
		return "", badRequest(CodeInvalidKey, "not a session key (use the session_key a message's answer gives, such as agent:main:http:dm:CHAT)")
	}
	return key, nil
}
