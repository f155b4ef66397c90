package storetest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/agentgate/agentgate/persistence"
)

// testSearch: full-text search finds messages by whole words, case-blind, archived ones
// included, in the query syntax both stores share (words, "a phrase", OR), and finds a message
// committed just before it asks.
func testSearch(t *testing.T, s persistence.Store) {
	idx, ok := s.(persistence.Searcher)
	if !ok {
		t.Fatalf("%T has no Search (persistence.Searcher): DESIGN §4 asks for full-text search over message content", s)
	}
	ctx := t.Context()
	MustCommit(t, s,
		&persistence.CreateSession{Session: newSession("s1", "k1")},
		&persistence.CreateSession{Session: newSession("s2", "k2")},
		&persistence.AppendMessage{Message: userMsg("s1", 1, "m1", "The quick brown fox")},
		&persistence.AppendMessage{Message: replyMsg("s1", 2, "a lazy dog sleeps")},
		&persistence.AppendMessage{Message: userMsg("s1", 3, "m3", "QUICK thinking")},
		&persistence.ArchiveMessages{SessionID: "s1", Seqs: []int64{3}},
		&persistence.AppendMessage{Message: userMsg("s2", 1, "m4", "brown bread and butter")},
	)
	hits := func(query string, limit int) []string {
		t.Helper()
		ms, err := idx.Search(ctx, query, limit)
		if err != nil {
			t.Fatalf("Search(%q): %v", query, err)
		}
		var got []string
		for _, m := range ms {
			got = append(got, fmt.Sprintf("%s/%d", m.SessionID, m.Seq))
		}
		slices.Sort(got)
		return got
	}
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"quick", []string{"s1/1", "s1/3"}}, // case-blind, the archived one too
		{"brown fox", []string{"s1/1"}},     // every word
		{`"brown bread"`, []string{"s2/1"}}, // a phrase
		{`"bread brown"`, nil},
		{"fox OR bread", []string{"s1/1", "s2/1"}},
		{"dog", []string{"s1/2"}}, // replies too
		{"do", nil},               // whole words
		{"zebra", nil},
	} {
		diff(t, fmt.Sprintf("Search(%q)", tc.query), hits(tc.query, 0), tc.want)
	}
	if got := hits("quick OR brown", 2); len(got) != 2 {
		t.Errorf("Search with limit 2 = %v, want 2 messages", got)
	}
	MustCommit(t, s, &persistence.AppendMessage{Message: userMsg("s2", 2, "m5", "a zebra crossing")})
	diff(t, "Search(zebra) after a commit", hits("zebra", 0), []string{"s2/2"})
}
