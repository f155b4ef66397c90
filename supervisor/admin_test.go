package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/persistence"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
)

// transcriptReads is a store that counts the reads of whole transcripts and of their pages: the
// API layer's edge, where a read of a session of months would show.
type transcriptReads struct {
	persistence.Store
	whole, pages atomic.Int64
}

func (s *transcriptReads) Transcript(ctx context.Context, sessionID string) ([]persistence.Message, error) {
	s.whole.Add(1)
	return s.Store.Transcript(ctx, sessionID)
}

func (s *transcriptReads) TranscriptAfter(ctx context.Context, sessionID string, after int64, limit int) ([]persistence.Message, error) {
	s.pages.Add(1)
	return s.Store.TranscriptAfter(ctx, sessionID, after, limit)
}

// mustStartCounting starts a daemon whose store counts transcript reads, with three exchanges
// and an undone one (archived rows) in one session.
func mustStartCounting(t *testing.T) (*runtime, *transcriptReads, string) {
	t.Helper()
	reads := &transcriptReads{}
	r := MustStartDaemon(t, echo.New(), daemonOpts{wrap: func(s persistence.Store) persistence.Store { reads.Store = s; return reads }})
	t.Cleanup(func() { r.stop(t) })
	var key string
	for i := range 4 {
		id := fmt.Sprint("m", i)
		key = r.inject(t, dm, id, fmt.Sprint("message ", i)).SessionKey
		r.waitReplyTo(t, id)
	}
	r.inject(t, dm, "undo", "/undo")
	r.waitReplyTo(t, "undo")
	return r, reads, key
}

// TestGetSessionCountsWithoutTranscript: GET /v1/sessions/{key} counts the session's messages
// in the store, the same counts as the listing, and reads none of its transcript (a dashboard
// polling a session of months once read all of it at every poll).
func TestGetSessionCountsWithoutTranscript(t *testing.T) {
	r, reads, key := mustStartCounting(t)
	base := "http://" + r.d.Addr().String() + "/v1/sessions"
	whole, pages := reads.whole.Load(), reads.pages.Load()
	status, body := getJSON(t, base+"/"+url.PathEscape(key))
	var info httpplatform.SessionInfo
	if err := json.Unmarshal(body, &info); status != http.StatusOK || err != nil {
		t.Fatalf("GET session = %d %s, %v", status, body, err)
	}
	if w, p := reads.whole.Load()-whole, reads.pages.Load()-pages; w != 0 || p != 0 {
		t.Errorf("GET session read %d whole transcripts and %d pages, want none", w, p)
	}

	_, body = getJSON(t, base)
	var list httpplatform.SessionList
	if err := json.Unmarshal(body, &list); err != nil || len(list.Sessions) != 1 {
		t.Fatalf("GET sessions = %s, %v, want one session", body, err)
	}
	msgs, err := reads.Store.Transcript(t.Context(), info.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	listed := list.Sessions[0]
	if info.Messages != listed.Messages || info.Pending != listed.Pending || info.Messages != len(msgs) {
		t.Errorf("GET session counts %d messages, %d pending; the listing %d, %d; the transcript has %d rows",
			info.Messages, info.Pending, listed.Messages, listed.Pending, len(msgs))
	}
}

// TestTranscriptThroughTheDaemon: the daemon answers a transcript from pages of the store, never
// a whole read, with the body the whole transcript encoded at once had (archived rows
// included); ?limit pages walk it the same.
func TestTranscriptThroughTheDaemon(t *testing.T) {
	r, reads, key := mustStartCounting(t)
	path := "http://" + r.d.Addr().String() + "/v1/sessions/" + url.PathEscape(key) + "/transcript"
	whole := reads.whole.Load()
	status, body := getJSON(t, path)
	if n := reads.whole.Load() - whole; n != 0 {
		t.Errorf("GET transcript read %d whole transcripts, want pages only", n)
	}

	route, err := reads.Store.Route(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := reads.Store.Transcript(t.Context(), route.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	want := httpplatform.Transcript{SessionKey: key, SessionID: route.SessionID}
	archived := 0
	for _, m := range msgs {
		want.Messages = append(want.Messages, httpplatform.TranscriptMessage{Seq: m.Seq, Role: m.Role, Text: m.Content,
			MessageID: m.MessageID, TurnID: m.TurnID, Status: m.Status, CreatedAt: m.CreatedAt, Archived: m.Archived})
		if m.Archived {
			archived++
		}
	}
	if archived == 0 {
		t.Fatalf("the transcript has no archived rows after /undo: %+v", msgs)
	}
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(want); err != nil {
		t.Fatal(err)
	}
	if status != http.StatusOK || !bytes.Equal(body, buf.Bytes()) {
		t.Errorf("GET transcript = %d\n%s\nwant 200\n%s", status, body, buf.Bytes())
	}

	var paged []httpplatform.TranscriptMessage
	for after := int64(0); ; {
		status, body := getJSON(t, fmt.Sprintf("%s?after=%d&limit=3", path, after))
		var tr httpplatform.Transcript
		if err := json.Unmarshal(body, &tr); status != http.StatusOK || err != nil {
			t.Fatalf("GET page after %d = %d %s, %v", after, status, body, err)
		}
		paged = append(paged, tr.Messages...)
		if tr.Next == 0 {
			break
		}
		if tr.Next <= after || len(paged) > len(msgs) {
			t.Fatalf("page after %d: next %d, %d messages so far of %d: the pages do not advance", after, tr.Next, len(paged), len(msgs))
		}
		after = tr.Next
	}
	if d := cmp.Diff(want.Messages, paged); d != "" {
		t.Errorf("the pages mismatch the transcript (-want +got):\n%s", d)
	}
}

// TestListSessionsNextOnlyWhileMoreFollow: GET /v1/sessions says "next" while more sessions
// follow, and not on a page that ends at the last one (docs/HTTP-API.md: a client pages until there is
// no next, and a full last page once sent it to one more, empty, page). The state filter's
// pages end the same way.
func TestListSessionsNextOnlyWhileMoreFollow(t *testing.T) {
	r := MustStartDaemon(t, echo.New(), daemonOpts{})
	t.Cleanup(func() { r.stop(t) })
	var keys []string
	for i := range 3 {
		src := dm
		src.ChatID = fmt.Sprint("c", i)
		id := fmt.Sprint("m", i)
		keys = append(keys, r.inject(t, src, id, "hi").SessionKey)
		r.waitReplyTo(t, id)
	}
	base := "http://" + r.d.Addr().String() + "/v1/sessions"
	page := func(query string) ([]string, string) {
		t.Helper()
		status, body := getJSON(t, base+"?"+query)
		var list httpplatform.SessionList
		if err := json.Unmarshal(body, &list); status != http.StatusOK || err != nil {
			t.Fatalf("GET /v1/sessions?%s = %d %s, %v", query, status, body, err)
		}
		var got []string
		for _, s := range list.Sessions {
			got = append(got, s.SessionKey)
		}
		return got, list.Next
	}
	for _, filter := range []string{"", "&state=active"} {
		if got, next := page("limit=3" + filter); !cmp.Equal(got, keys) || next != "" {
			t.Errorf("limit=3%s: %v, next %q; want %v and no next (no more follow)", filter, got, next, keys)
		}
		got, next := page("limit=2" + filter)
		if !cmp.Equal(got, keys[:2]) || next != keys[1] {
			t.Errorf("limit=2%s: %v, next %q; want %v, next %q", filter, got, next, keys[:2], keys[1])
		}
		if got, next := page("limit=2&after=" + url.QueryEscape(next) + filter); !cmp.Equal(got, keys[2:]) || next != "" {
			t.Errorf("the second page of limit=2%s: %v, next %q; want %v and no next", filter, got, next, keys[2:])
		}
		if got, next := page("limit=1&after=" + url.QueryEscape(keys[1]) + filter); !cmp.Equal(got, keys[2:]) || next != "" {
			t.Errorf("limit=1 after the second%s: %v, next %q; want %v and no next", filter, got, next, keys[2:])
		}
	}
	if got, next := page("limit=2&state=passivated"); len(got) != 0 || next != "" {
		t.Errorf("state=passivated: %v, next %q; want none (every session is in memory)", got, next)
	}
}

// TestSingleDaemonLiveStateNamesNoMember: a daemon that is no cluster member names its host in
// live.node and no member address (its manager's PID has none: "nonhost").
func TestSingleDaemonLiveStateNamesNoMember(t *testing.T) {
	r, _, key := mustStartCounting(t)
	status, body := getJSON(t, "http://"+r.d.Addr().String()+"/v1/sessions/"+url.PathEscape(key))
	var info httpplatform.SessionInfo
	if err := json.Unmarshal(body, &info); err != nil || status != http.StatusOK || info.Live == nil {
		t.Fatalf("GET session = %d %s, want 200 with live state", status, body)
	}
	if info.Live.MemberAddress != "" || info.Live.Node != hostname() {
		t.Errorf("live member_address %q, node %q; want none, and the host name %q", info.Live.MemberAddress, info.Live.Node, hostname())
	}
}

// listReads is a store that counts the sessions ListSessions reads.
type listReads struct {
	persistence.Store
	rows atomic.Int64
}

func (s *listReads) ListSessions(ctx context.Context, f persistence.ListFilter) ([]persistence.SessionSummary, error) {
	sums, err := s.Store.ListSessions(ctx, f)
	s.rows.Add(int64(len(sums)))
	return sums, err
}

// TestListActiveReadsOnlyTheSessionsInMemory: GET /v1/sessions?state=active reads from the
// store the sessions in memory, not every stored one. Before, it listed every stored session
// and kept those in memory: 1.7 s for one in 100,000 on a scale walkthrough's database, which a
// dashboard polling it paid at each poll.
func TestListActiveReadsOnlyTheSessionsInMemory(t *testing.T) {
	dir := t.TempDir()
	r := MustStartDaemon(t, echo.New(), daemonOpts{dir: dir})
	const stored = 30
	for i := range stored {
		src := dm
		src.ChatID = fmt.Sprintf("old%02d", i)
		id := fmt.Sprint("m", i)
		r.inject(t, src, id, "hi")
		r.waitReplyTo(t, id)
	}
	r.stop(t)
	// Restarted, the daemon holds none of them in memory until they write again.
	reads := &listReads{}
	r = MustStartDaemon(t, echo.New(), daemonOpts{dir: dir, wrap: func(s persistence.Store) persistence.Store { reads.Store = s; return reads }})
	t.Cleanup(func() { r.stop(t) })
	var want []string
	for _, chat := range []string{"old07", "new", "old21"} {
		src := dm
		src.ChatID = chat
		id := "again-" + chat
		want = append(want, r.inject(t, src, id, "hi").SessionKey)
		r.waitReplyTo(t, id)
	}
	slices.Sort(want)
	base := "http://" + r.d.Addr().String() + "/v1/sessions"
	var got []string
	for after := ""; ; {
		query := "?state=active&limit=2"
		if after != "" {
			query += "&after=" + url.QueryEscape(after)
		}
		status, body := getJSON(t, base+query)
		var list httpplatform.SessionList
		if err := json.Unmarshal(body, &list); status != http.StatusOK || err != nil {
			t.Fatalf("GET /v1/sessions?state=active = %d %s, %v", status, body, err)
		}
		for _, s := range list.Sessions {
			if s.Live == nil || s.Messages < 2 {
				t.Errorf("session %s: live %v, %d messages; want live state and its messages counted", s.SessionKey, s.Live, s.Messages)
			}
			got = append(got, s.SessionKey)
		}
		if after = list.Next; after == "" {
			break
		}
	}
	if !cmp.Equal(got, want) {
		t.Errorf("?state=active paged = %v, want %v", got, want)
	}
	if status, body := getJSON(t, base+"?state=active&platform=http"); status != http.StatusOK || !bytes.Contains(body, []byte(`"sessions":[]`)) {
		t.Errorf("?state=active&platform=http = %d %s, want 200 and no session (each is the fake platform's)", status, body)
	}
	if n := reads.rows.Load(); n > 0 {
		t.Errorf("?state=active listed %d stored sessions, want none (it reads the %d in memory alone, of %d stored)", n, len(want), stored+1)
	}
}
