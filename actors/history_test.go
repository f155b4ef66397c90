package actors

import (
	"fmt"
	"testing"

	"github.com/agentgate/agentgate/agents"
)

// TestTrimHistory: the buffer keeps the last HistoryLimit entries in order, frees what it drops,
// and a full buffer takes a turn's message and reply without allocating.
func TestTrimHistory(t *testing.T) {
	const limit = 5
	s := &Session{d: &Deps{Config: SessionConfig{HistoryLimit: limit}}}
	add := func(seq int64) {
		s.history = append(s.history, histEntry{seq: seq, raw: fmt.Sprint(seq), msg: agents.Message{Text: fmt.Sprint(seq)}})
		s.trimHistory()
	}
	for seq := range int64(12) {
		add(seq)
	}
	if len(s.history) != limit {
		t.Fatalf("history holds %d entries, want %d", len(s.history), limit)
	}
	for i, h := range s.history {
		if want := int64(12 - limit + i); h.seq != want || h.raw != fmt.Sprint(want) || h.msg.Text != fmt.Sprint(want) {
			t.Errorf("history[%d] = %+v, want seq %d", i, h, want)
		}
	}
	if c := cap(s.history); c > limit+historyHeadroom {
		t.Errorf("buffer capacity %d, want at most %d", c, limit+historyHeadroom)
	}
	for i, h := range s.history[len(s.history):cap(s.history)] {
		if h != (histEntry{}) {
			t.Errorf("spare slot %d still holds %+v, want it cleared", i, h)
		}
	}
	seq := int64(100)
	allocs := testing.AllocsPerRun(100, func() {
		s.history = append(s.history, histEntry{seq: seq})
		s.trimHistory()
		s.history = append(s.history, histEntry{seq: seq + 1})
		s.trimHistory()
		seq += 2
	})
	if allocs != 0 {
		t.Errorf("a turn on a full buffer allocates %v times, want 0", allocs)
	}
	// A turn of many messages grows the buffer; the next trim gives the room back.
	for i := range int64(3 * limit) {
		s.history = append(s.history, histEntry{seq: 1000 + i})
	}
	s.trimHistory()
	if len(s.history) != limit || cap(s.history) != limit+historyHeadroom || s.history[0].seq != 1000+2*limit {
		t.Errorf("after a long turn: len %d cap %d first seq %d, want %d, %d, %d",
			len(s.history), cap(s.history), s.history[0].seq, limit, limit+historyHeadroom, 1000+2*limit)
	}
}
