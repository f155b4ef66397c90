package sqlite

import (
	"fmt"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
)

// TestRecentChatsPlan: RecentChats reads the messages backwards along the rowid and stops at the
// first one older than it wants; a plan that sorted would read every message first (the
// query's WHERE matches the condition of messages_inbound, which NOT INDEXED keeps out of it).
func TestRecentChatsPlan(t *testing.T) {
	s := MustOpen(t, Options{})
	var ops []persistence.Op
	for i := range 50 {
		sid := fmt.Sprint("s", i%5)
		if i < 5 {
			ops = append(ops, &persistence.CreateSession{Session: newSession(sid, "k-"+sid)})
		}
		m := userMsg(sid, int64(i/5+1), fmt.Sprint("text ", i))
		m.MessageID = fmt.Sprint("m", i)
		ops = append(ops, &persistence.AppendMessage{Message: m})
	}
	storetest.MustCommit(t, s, ops...)
	raw := MustRawDB(t, s.Path())
	mustExec(t, raw, `ANALYZE`)
	plan := queryPlan(t, raw, recentChatsSQL)
	if len(plan) == 0 || plan[0] != "SCAN m" || strings.Contains(strings.Join(plan, "\n"), "TEMP B-TREE") {
		t.Errorf("recent chats query plan = %q, want a plain backwards SCAN m first and no sort", plan)
	}
}

// TestSessionReadsUseTheIndex: the reads of one session's messages (a transcript page, its
// counts, its last messages) search the (session_id, seq) index: a long session costs what is read, never a scan
// of every session's messages.
func TestSessionReadsUseTheIndex(t *testing.T) {
	s := MustOpen(t, Options{})
	for name, q := range map[string]struct {
		sql  string
		args []any
	}{"transcript page": {transcriptSQL, []any{"s1", 10, 100}}, "counts": {countMessagesSQL, []any{"s1"}},
		"history": {historyOfSQL, []any{"s1", 20}}} {
		plan := queryPlan(t, s.writer, q.sql, q.args...)
		joined := strings.Join(plan, "\n")
		if strings.Contains(joined, "SCAN messages") || strings.Contains(joined, "TEMP B-TREE") {
			t.Errorf("%s: query plan %q, want index searches only, no scan or sort", name, plan)
		}
		t.Logf("%s: %q", name, plan)
	}
}
