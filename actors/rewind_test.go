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
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
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

// TestResumeWhileItsWritesAreInFlight: /new ends a session while the write of a message to it
// is in flight, and /resume goes straight back to it. The resume must number its rows after
// that message's, which the store does not show yet. (Before, it took the store's last seq:
// its write collided with the message's row and was refused, and m2, which the session took
// meanwhile in the resumed session, was stored in an ended one and never answered.)
func TestResumeWhileItsWritesAreInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "ok " + req.Identity.MessageID}, nil
		})
		hc := &heldCommits{hold: make(chan struct{}), release: make(chan struct{}), held: make(chan struct{}, 64)}
		w := newManagerWorldWrites(t, agent, nil, func(s persistence.Store) persistence.Store { hc.Store = s; return hc })
		w.deliver(t, "m0", "zero")
		first := w.deliver(t, "k0", "/title t1").SessionId
		synctest.Wait()
		close(hc.hold) // the writes below wait in the persistence actor
		var fs []*actor.Future
		for _, m := range [][2]string{{"m1", "one"}, {"k1", "/new"}, {"k2", "/resume t1"}, {"m2", "two"}} {
			fs = append(fs, w.request(m[0], m[1]))
		}
		synctest.Wait()
		close(hc.release)
		for i, f := range fs {
			res, err := f.Result()
			if r, ok := res.(*DeliverResult); err != nil || !ok || r.ErrorCode != "" {
				t.Errorf("request %d: %v %v", i, res, err)
			}
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		m2, err := w.store.FindInbound(w.ctx, "fake", "c1", "m2")
		if err != nil {
			t.Fatal(err)
		}
		if m2.SessionID != first || m2.Status != persistence.StatusDone {
			t.Errorf("m2 is %s in session %s, want done in the resumed session %s", m2.Status, m2.SessionID, first)
		}
		if route, err := w.store.Route(w.ctx, w.key); err != nil || route.SessionID != first {
			t.Errorf("the key routes to %v (%v), want the resumed session %s", route, err, first)
		}
	})
}
