package supervisor

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
)

// holdReply is a store whose commit of the outbox entry with text waits until release closes.
type holdReply struct {
	persistence.Store
	text    string
	release chan struct{}
}

func (s *holdReply) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	for _, g := range groups {
		for _, op := range g {
			if o, ok := op.(*persistence.AddOutbox); ok && o.Entry.Text == s.text {
				<-s.release
			}
		}
	}
	return s.Store.Commit(ctx, groups)
}

// TestNextTurnLeavesTheFinishedDraftToItsReply: a session starts its next turn as soon as a
// turn ends, before the ended turn's reply is stored and handed to the platform; the next
// turn's draft then starts while the ended one's reply is on its way. The ended turn's draft
// is still finished by its reply. Before, the next turn's first text marked it interrupted, as
// if its turn had crashed, and its reply was posted as a message of its own: the user saw the
// answer twice, once marked interrupted (found by TestHuntDrafts).
func TestNextTurnLeavesTheFinishedDraftToItsReply(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	posted, streamed := make(chan struct{}), make(chan struct{})
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		req.Partial(fmt.Sprintf("answer %d, part", n))
		if n == 2 {
			close(streamed)
		}
		if n == 1 {
			select { // the second message is queued
			case <-posted:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return &agents.Response{Text: fmt.Sprintf("answer %d", n)}, nil
	})
	st := &holdReply{text: "answer 1", release: make(chan struct{})}
	r := MustStartDaemon(t, agent, daemonOpts{editor: true, draftInterval: time.Nanosecond,
		wrap: func(s persistence.Store) persistence.Store { st.Store = s; return st }})
	defer r.stop(t)
	r.inject(t, dm, "m1", "first")
	waitUntil(t, func() bool { return len(r.editor.Drafts()) == 1 })
	r.inject(t, dm, "m2", "second")
	close(posted)
	// The second turn streams while the first one's reply waits for its write.
	select {
	case <-streamed:
	case <-time.After(30 * time.Second):
		t.Fatal("the second turn never streamed")
	}
	close(st.release)
	r.waitSent(t, 2) // both replies
	// The fake records a reply as sent before it marks the draft it finishes final: wait for
	// that too (a draft left unfinished fails here, after the wait's deadline).
	waitUntil(t, func() bool { ds := r.editor.Drafts(); return len(ds) != 2 || ds[1].Final })
	// The second turn's draft waits until the first one is over; its reply may come first,
	// and then no draft is posted for it at all (nothing partial was ever shown).
	ds := r.editor.Drafts()
	if len(ds) == 0 || len(ds) > 2 || ds[0].Text() != "answer 1" || !ds[0].Final ||
		len(ds) == 2 && (ds[1].Text() != "answer 2" || !ds[1].Final) {
		t.Errorf("drafts = %+v, want the first finished with answer 1, and a second, if any, with answer 2", ds)
	}
	for _, out := range r.fake.Sent() {
		if out.DraftID == "" && (out.Text == "answer 1" || len(ds) == 2) {
			t.Errorf("reply %q posted as a message of its own, not finishing its draft", out.Text)
		}
	}
}
