package http

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
)

// mustSmallPages makes the transcript handler read n messages at a time for the test.
func mustSmallPages(t *testing.T, n int) {
	t.Helper()
	old := transcriptPage
	transcriptPage = n
	t.Cleanup(func() { transcriptPage = old })
}

// longTranscript is n messages with every field set, archived ones, and text JSON escapes.
func longTranscript(n int) []TranscriptMessage {
	at := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	ms := make([]TranscriptMessage, n)
	for i := range ms {
		ms[i] = TranscriptMessage{Seq: int64(i + 1), Role: persistence.RoleUser, Text: fmt.Sprintf("<b>%d</b> & \"é\"\n\u2028", i),
			MessageID: fmt.Sprint("m", i), Status: persistence.StatusDone, CreatedAt: at.Add(time.Duration(i) * time.Second)}
		if i%2 == 1 {
			ms[i].Role, ms[i].MessageID, ms[i].TurnID = persistence.RoleAssistant, "", fmt.Sprint("t", i)
		}
		ms[i].Archived = i%5 == 3
	}
	return ms
}

// TestTranscriptStreamsInPages: a transcript longer than the handler's page comes back whole, in
// order, byte for byte as json.Encoder wrote the whole Transcript before it was streamed, and
// the handler never asked Sessions for more than a page at a time.
func TestTranscriptStreamsInPages(t *testing.T) {
	const page = 3
	mustSmallPages(t, page)
	for _, n := range []int{0, 1, page - 1, page, page + 1, 4 * page, 4*page + 2} {
		t.Run(fmt.Sprint(n, " messages"), func(t *testing.T) {
			sessions := newFakeSessions()
			sessions.infos[streamKey] = &SessionInfo{SessionKey: streamKey, SessionID: "s1"}
			sessions.transcript = longTranscript(n)
			h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})
			got := h.do("GET", "/v1/sessions/"+streamKey+"/transcript", nil, "")

			want := Transcript{SessionKey: streamKey, SessionID: "s1", Messages: sessions.transcript}
			if want.Messages == nil {
				want.Messages = []TranscriptMessage{}
			}
			var buf bytes.Buffer
			if err := json.NewEncoder(&buf).Encode(want); err != nil {
				t.Fatal(err)
			}
			if got.status != 200 || !bytes.Equal(got.body, buf.Bytes()) {
				t.Errorf("GET transcript = %d\n%s\nwant 200\n%s", got.status, got.body, buf.Bytes())
			}
			if ct := got.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q, want application/json", ct)
			}
			reqs := sessions.transcriptRequests()
			if wantCalls := n/page + 1; len(reqs) != wantCalls {
				t.Errorf("Sessions.Transcript called %d times (%+v), want %d", len(reqs), reqs, wantCalls)
			}
			for _, r := range reqs {
				if r.Limit < 1 || r.Limit > page {
					t.Errorf("Sessions.Transcript asked for %+v, want a limit of 1..%d", r, page)
				}
				if r.SessionID != "" && r.SessionID != "s1" {
					t.Errorf("Sessions.Transcript asked for %+v, want the session of the first page", r)
				}
			}
		})
	}
}

// TestTranscriptPaging: ?limit answers one page with "next" while more follow, and walking the
// pages with ?after=next gives the whole transcript in order; the last page has no next.
func TestTranscriptPaging(t *testing.T) {
	mustSmallPages(t, 4)
	sessions := newFakeSessions()
	sessions.infos[streamKey] = &SessionInfo{SessionKey: streamKey, SessionID: "s1"}
	sessions.transcript = longTranscript(1203)
	h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})
	path := "/v1/sessions/" + streamKey + "/transcript"

	for _, limit := range []int{1, 3, 4, 5, 401, MaxTranscriptLimit} {
		t.Run(fmt.Sprint("limit ", limit), func(t *testing.T) {
			var all []TranscriptMessage
			after, pages := int64(0), 0
			for {
				got := h.do("GET", fmt.Sprintf("%s?session_id=s1&after=%d&limit=%d", path, after, limit), nil, "")
				tr := mustDecode[Transcript](t, got)
				pages++
				if got.status != 200 || len(tr.Messages) > limit || tr.SessionID != "s1" {
					t.Fatalf("GET page after %d = %d %.200s, want 200 with at most %d messages", after, got.status, got.body, limit)
				}
				all = append(all, tr.Messages...)
				if tr.Next == 0 {
					if strings.Contains(string(got.body), `"next"`) {
						t.Errorf("the last page has a next: %.200s", got.body[len(got.body)-100:])
					}
					break
				}
				if last := tr.Messages[len(tr.Messages)-1].Seq; tr.Next != last || len(tr.Messages) != limit {
					t.Fatalf("page after %d: next = %d with %d messages, want the last seq %d of a full page", after, tr.Next, len(tr.Messages), last)
				}
				if tr.Next <= after || len(all) > len(sessions.transcript) {
					t.Fatalf("page after %d: next %d, %d messages so far: the pages do not advance", after, tr.Next, len(all))
				}
				after = tr.Next
			}
			if d := cmp.Diff(sessions.transcript, all); d != "" {
				t.Errorf("the pages mismatch the transcript (-want +got):\n%s", d)
			}
			if want := (1203 + limit - 1) / limit; pages != want {
				t.Errorf("walked %d pages, want %d (no empty page after an exact end)", pages, want)
			}
		})
	}
	t.Run("limit capped", func(t *testing.T) {
		tr := mustDecode[Transcript](t, h.do("GET", path+"?limit=5000", nil, ""))
		if len(tr.Messages) != MaxTranscriptLimit || tr.Next != MaxTranscriptLimit {
			t.Errorf("limit=5000 answered %d messages, next %d, want %d and next %d", len(tr.Messages), tr.Next, MaxTranscriptLimit, MaxTranscriptLimit)
		}
	})
	t.Run("after without limit", func(t *testing.T) {
		tr := mustDecode[Transcript](t, h.do("GET", path+"?after=1200", nil, ""))
		if d := cmp.Diff(sessions.transcript[1200:], tr.Messages); d != "" || tr.Next != 0 {
			t.Errorf("after=1200 answered next %d, messages (-want +got):\n%s", tr.Next, d)
		}
	})
}

// TestTranscriptBadPaging: a bad after or limit is answered 400 invalid_query, before Sessions is
// asked anything.
func TestTranscriptBadPaging(t *testing.T) {
	sessions := newFakeSessions()
	sessions.infos[streamKey] = &SessionInfo{SessionKey: streamKey, SessionID: "s1"}
	h := mustStart(t, Config{Sessions: sessions}, &fakeRuntime{})
	for _, q := range []string{"after=-1", "after=x", "after=1.5", "after=99999999999999999999", "after=",
		"limit=0", "limit=-3", "limit=x", "limit=", "limit=2&after=-2",
		"after=3;limit=2", "limit=2&after=%zz", // malformed pairs: not dropped unseen
		"limit=2&limit=50", "after=1&limit=2&after=9"} { // one of two values is not guessed
		got := h.do("GET", "/v1/sessions/"+streamKey+"/transcript?"+q, nil, "")
		if got.status != 400 || got.errCode() != CodeInvalidQuery {
			t.Errorf("GET transcript?%s = %d %s, want 400 %q", q, got.status, got.body, CodeInvalidQuery)
		}
	}
	if reqs := sessions.transcriptRequests(); len(reqs) != 0 {
		t.Errorf("Sessions.Transcript called %d times, want never", len(reqs))
	}
}

// TestTranscriptPageFails: an error reading the first page is answered with its status; one
// reading a later page ends the body early (invalid JSON: the client cannot take it for the
// whole transcript) and is logged at WARN with the key, once a minute for all readers.
func TestTranscriptPageFails(t *testing.T) {
	mustSmallPages(t, 2)
	for _, tc := range []struct {
		name   string
		failAt int
		status int
	}{
		{"first page", 1, 500},
		{"third page", 3, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sessions := newFakeSessions()
			sessions.infos[streamKey] = &SessionInfo{SessionKey: streamKey, SessionID: "s1"}
			sessions.transcript = longTranscript(9)
			sessions.failTranscriptAt = tc.failAt
			logs := &testutil.Buffer{}
			h := mustStart(t, Config{Sessions: sessions, Logger: slog.New(slog.NewTextHandler(logs, nil))}, &fakeRuntime{})
			got := h.do("GET", "/v1/sessions/"+streamKey+"/transcript", nil, "")
			if got.status != tc.status {
				t.Errorf("GET transcript = %d %s, want %d", got.status, got.body, tc.status)
			}
			if tc.status != 200 {
				if got.errCode() != CodeInternal {
					t.Errorf("GET transcript = %d %s, want the error JSON %q", got.status, got.body, CodeInternal)
				}
				return
			}
			if json.Valid(got.body) {
				t.Errorf("a transcript cut short is valid JSON: %s", got.body)
			}
			if !bytes.Contains(got.body, []byte(`"seq":4`)) || bytes.Contains(got.body, []byte(`"seq":5`)) {
				t.Errorf("the body ends elsewhere than after the pages read: %s", got.body)
			}
			if want := `level=WARN msg="transcript answer ended early: a page could not be read" platform=http session=` + streamKey; !strings.Contains(logs.String(), want) {
				t.Errorf("the log has no line %q:\n%s", want, logs)
			}
			// Readers cut short again (a database outage under many) log no line each.
			for range 2 {
				sessions.mu.Lock()
				sessions.transcriptReqs = nil
				sessions.mu.Unlock()
				if again := h.do("GET", "/v1/sessions/"+streamKey+"/transcript", nil, ""); json.Valid(again.body) {
					t.Errorf("a transcript cut short again is valid JSON: %s", again.body)
				}
			}
			if n := strings.Count(logs.String(), "level=WARN msg=\"transcript answer ended early"); n != 1 {
				t.Errorf("%d WARN lines for 3 transcripts cut short, want 1:\n%s", n, logs)
			}
		})
	}
}
