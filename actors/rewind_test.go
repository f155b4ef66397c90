package actors

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
)

// noWholeTranscript is a store whose sessions may not read a whole transcript.
type noWholeTranscript struct {
	persistence.Store
	reads atomic.Int64
}

func (s *noWholeTranscript) Transcript(context.Context, string) ([]persistence.Message, error) {
	s.reads.Add(1)
	return nil, errors.New("a whole transcript read (test)")
}

// TestResumeLoadsOnlyTheLastHistory: /resume of a session longer than the history limit gives
// the agent exactly its last HistoryLimit active messages (the notices of its commands and
// the exchange /undo took back left out), continues its seqs, and reads none of the rest: a
// session of months is never loaded whole on the session's goroutine.
func TestResumeLoadsOnlyTheLastHistory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit = 4
		var mu sync.Mutex
		var last *agents.Request
		agent := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			mu.Lock()
			defer mu.Unlock()
			last = req
			return &agents.Response{Text: "echo: " + req.Messages[0].Text}, nil
		})
		store := &noWholeTranscript{}
		w := newManagerWorld(t, agent, func(d *Deps) {
			d.Config.HistoryLimit = limit
			store.Store = d.Store
			d.Store = store
		})
		send := func(id, text string) *DeliverResult {
			t.Helper()
			r := w.deliver(t, id, text)
			if r.ErrorCode != "" {
				t.Fatalf("%s %q: %+v", id, text, r)
			}
			synctest.Wait() // its turn or command has ended
			return r
		}
		old := send("q0", "question 0").SessionId
		for i := 1; i < 8; i++ {
			send(fmt.Sprint("q", i), fmt.Sprint("question ", i))
		}
		send("title", "/title old")
		send("undo", "/undo") // takes back question 7 and its answer
		send("new", "/new")
		send("b", "in the new session")
		if r := send("resume", "/resume old"); r.SessionId != old {
			t.Fatalf("/resume old switched to %s, want %s", r.SessionId, old)
		}
		send("back", "where were we")

		mu.Lock()
		var got []string
		for _, m := range last.History {
			got = append(got, m.Role+": "+m.Text)
		}
		mu.Unlock()
		want := []string{"user: question 5", "assistant: echo: question 5", "user: question 6", "assistant: echo: question 6"}
		if !slices.Equal(got, want) {
			t.Errorf("after /resume the agent's history = %q, want %q", got, want)
		}
		if n := store.reads.Load(); n != 0 {
			t.Errorf("the sessions read %d whole transcripts, want none", n)
		}

		msgs, err := w.store.Transcript(w.ctx, old)
		if err != nil {
			t.Fatal(err)
		}
		var seqs []int64
		for _, m := range msgs {
			seqs = append(seqs, m.Seq)
		}
		i := slices.IndexFunc(msgs, func(m persistence.Message) bool { return m.Content == "where were we" })
		if i < 1 || i != len(msgs)-2 || msgs[i].Seq != msgs[i-1].Seq+1 {
			t.Errorf("the message after /resume is row %d with seqs %v, want the next seq after the resumed session's, before its answer", i, seqs)
		}
	})
}
