package http

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
)

// transcriptPage is how many messages the transcript handler asks Sessions for at a time. A
// page also ends once its texts reach persistence.TranscriptPageBytes (the store's bound), so
// that the handler holds about a MiB at once, whatever the length of the transcript or of its
// messages. A variable for tests.
var transcriptPage = 100

// handleTranscript is GET /v1/sessions/{key}/transcript?session_id=&after=&limit=. Without a
// limit it answers every message after after (0: the whole transcript); with one, at most limit
// of them and, when more follow, "next": the after of the next page.
func (p *Platform) handleTranscript(w http.ResponseWriter, r *http.Request) {
	s, key, ok := p.sessionsAndKey(w, r)
	if !ok {
		return
	}
	q, aerr := query(r, "session_id", "after", "limit")
	if aerr != nil {
		aerr.write(w)
		return
	}
	req := TranscriptRequest{SessionID: q.Get("session_id")}
	if aerr := checkQueryID("session_id", req.SessionID, MaxIDBytes); aerr != nil {
		aerr.write(w)
		return
	}
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, CodeInvalidQuery, "after must be a message seq (a non-negative integer)")
			return
		}
		req.After = n
	}
	want, aerr := queryLimit(q, -1, MaxTranscriptLimit) // -1: every message
	if aerr != nil {
		aerr.write(w)
		return
	}
	p.streamTranscript(w, r, s, key, req, want)
}

// streamTranscript answers want messages of a transcript from req.After on (-1: all of them),
// asking Sessions for a page at a time (transcriptPage messages, fewer once their texts reach
// persistence.TranscriptPageBytes) and writing each page before it asks for the next, so that
// neither a long transcript nor a page of large messages is held whole. The body is the JSON
// encoding of the Transcript, written in pieces. An error before the first page is answered as
// usual; a later one can only end the body early (the client sees invalid JSON), and is logged.
func (p *Platform) streamTranscript(w http.ResponseWriter, r *http.Request, s Sessions, key string, req TranscriptRequest, want int) {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	var tw *transcriptWriter
	for {
		req.Limit = transcriptPage
		if want >= 0 {
			req.Limit = min(req.Limit, want+1) // one past want tells whether more follow
		}
		tr, err := s.Transcript(ctx, key, req)
		if err == nil && tr == nil {
			err = persistence.ErrNotFound
		}
		if err != nil {
			switch {
			case tw == nil && req.SessionID != "" && errors.Is(err, persistence.ErrNotFound):
				// The session the request names is not one of the key's: not_found, as before,
				// not no_session, which says the key has none (it may have).
				writeError(w, http.StatusNotFound, CodeNotFound, "no such session")
			case tw == nil:
				p.writeSessionsError(w, r, "transcript", err)
			case ctx.Err() == nil:
				p.pageFails.Log(p.log, slog.LevelWarn, "transcript answer ended early: a page could not be read", "session", key,
					"after", req.After, logging.Err(err))
			}
			return
		}
		if tw == nil {
			req.SessionID = tr.SessionID // the same incarnation for every page
			tw = &transcriptWriter{w: w, last: req.After}
			jsonHeaders(w)
			w.WriteHeader(http.StatusOK)
			tw.head(tr)
		} else {
			// Each page has WriteTimeout to be read, as each event of an event stream.
			_ = rc.SetWriteDeadline(time.Now().Add(p.cfg.WriteTimeout)) // unsupported only off a real conn
		}
		msgs, last := tr.Messages, lastPage(tr.Messages, req.Limit)
		cut := want >= 0 && len(msgs) > want
		if cut {
			msgs = msgs[:want]
		}
		tw.messages(msgs)
		if want >= 0 {
			want -= len(msgs)
		}
		switch {
		case tw.err != nil:
			return // the client is gone or stopped reading (logged by recoverPanics)
		case cut:
			tw.end(tw.last)
			return
		case last || tw.last <= req.After: // (or a Sessions that did not advance)
			tw.end(0)
			return
		}
		req.After = tw.last
	}
}

// lastPage reports whether a page of a transcript read with limit is its last: an empty one, or
// one short of both its limit and persistence.TranscriptPageBytes. A page that reached the
// bound ended there, so more may follow it.
func lastPage(ms []TranscriptMessage, limit int) bool {
	if len(ms) >= limit {
		return false
	}
	size := 0
	for i := range ms {
		size += len(ms[i].Text)
	}
	return size < persistence.TranscriptPageBytes
}

// transcriptWriter writes a Transcript's JSON encoding in pieces, byte for byte what
// json.Encoder writes for the whole value. The first write error ends it.
type transcriptWriter struct {
	w    http.ResponseWriter
	n    int   // messages written
	last int64 // seq of the last message written
	err  error
}

func (t *transcriptWriter) write(b []byte) {
	if t.err == nil {
		_, t.err = t.w.Write(b)
	}
}

// raw writes the encoding of v (which cannot fail for the types written here).
func (t *transcriptWriter) raw(v any) {
	b, err := json.Marshal(v)
	if err != nil && t.err == nil {
		t.err = err
	}
	t.write(b)
}

func (t *transcriptWriter) head(tr *Transcript) {
	t.write([]byte(`{"session_key":`))
	t.raw(tr.SessionKey)
	t.write([]byte(`,"session_id":`))
	t.raw(tr.SessionID)
	t.write([]byte(`,"messages":[`))
}

func (t *transcriptWriter) messages(ms []TranscriptMessage) {
	for i := range ms {
		if t.n > 0 {
			t.write([]byte{','})
		}
		t.raw(&ms[i])
		t.n++
		t.last = ms[i].Seq
	}
}

// end closes the value; next is the Transcript's Next.
func (t *transcriptWriter) end(next int64) {
	b := []byte{']'}
	if next != 0 {
		b = strconv.AppendInt(append(b, `,"next":`...), next, 10)
	}
	t.write(append(b, "}\n"...))
}
