package discord_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/actors"
	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
	"github.com/bwmarrin/discordgo"
)

// Streaming drafts against the fake Discord when its REST calls fail (TestHuntDrafts found
// each of these).

// startDraftWorld starts a world whose drafts are edited at most every 10 ms.
func startDraftWorld(t *testing.T, agent agents.Agent) *world {
	t.Helper()
	w := newWorld(t, agent, nil)
	w.draftInterval = 10 * time.Millisecond
	w.start(t)
	w.srv.WaitReady(t)
	return w
}

// agentWait polls cond from an agent's turn until it holds or ctx ends.
func agentWait(ctx context.Context, cond func() bool) error {
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

// TestDraftWhoseEditsFailIsStillFinished: when the edits of a draft fail until the platform
// stops editing it, the turn's reply still finishes the draft. Before, the reply was posted as
// a message of its own and the draft stayed, showing the start of the answer above it.
func TestDraftWhoseEditsFailIsStillFinished(t *testing.T) {
	var w *world
	const final = "one two three: the whole answer"
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		req.Partial("one")
		if err := agentWait(ctx, func() bool { return len(w.srv.Sent(dmID)) == 1 }); err != nil {
			return nil, err
		}
		w.srv.FailNext("PATCH", "", 500, 3)
		for i := range 3 { // each edit fails
			n := w.srv.Requests("PATCH", "")
			req.Partial(fmt.Sprintf("one two %d", i))
			if err := agentWait(ctx, func() bool { return w.srv.Requests("PATCH", "") > n }); err != nil {
				return nil, err
			}
		}
		return &agents.Response{Text: final}, nil
	})
	w = startDraftWorld(t, agent)
	m := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "question"})
	w.answerIsTheDraft(t, m, final)
}

// TestInterruptedDraftWhoseEditFailsIsMarked: when the edit that marks a cancelled turn's
// draft interrupted fails once, it is tried again. Before, the draft was left as it was: part
// of an answer, shown as if it were the whole of it.
func TestInterruptedDraftWhoseEditFailsIsMarked(t *testing.T) {
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		req.Partial("half an answer")
		<-ctx.Done() // until /stop
		return nil, ctx.Err()
	})
	w := startDraftWorld(t, agent)
	w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "question"})
	draft := w.srv.WaitSent(t, dmID, 1)[0]
	w.srv.FailNext("PATCH", "", 500, 1)
	w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "/stop"})
	w.srv.WaitFor(t, "the draft marked interrupted", func() bool {
		for _, m := range w.srv.Sent(dmID) {
			if m.ID == draft.ID {
				return m.Content == "half an answer"+actors.InterruptedMark
			}
		}
		return false
	})
}

// TestDraftWhosePostLostItsAnswerIsFinished: when Discord posts a draft but its answer is lost
// (a 500 after the post), the post is tried again with the same nonce, which finds the draft
// posted, and the reply finishes it. Before, the draft counted as never posted: the reply was
// posted as a message of its own, under a draft left showing the start of the answer.
func TestDraftWhosePostLostItsAnswerIsFinished(t *testing.T) {
	var w *world
	const final = "thinking done: the whole answer"
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		req.Partial("thinking")
		posts := func() int { return w.srv.Requests("POST", "/channels/"+dmID+"/messages") }
		if err := agentWait(ctx, func() bool { return posts() >= 2 }); err != nil { // the lost post, and its retry
			return nil, err
		}
		return &agents.Response{Text: final}, nil
	})
	w = startDraftWorld(t, agent)
	w.srv.FailNextAfter("POST", "/channels/"+dmID+"/messages", 500, 1)
	m := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "question"})
	w.answerIsTheDraft(t, m, final)
}

// TestLongInterruptedDraftShowsItsMark: a cancelled turn's draft longer than one Discord
// message shows its start and the interrupted mark. Before, the mark, at the end of the text,
// was cut off with the rest, and the draft went on showing part of an answer as if it were all.
func TestLongInterruptedDraftShowsItsMark(t *testing.T) {
	long := strings.Repeat("a long answer ", 200) // 2,800 characters
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		req.Partial(long)
		<-ctx.Done() // until /stop
		return nil, ctx.Err()
	})
	w := startDraftWorld(t, agent)
	w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "question"})
	draft := w.srv.WaitSent(t, dmID, 1)[0]
	w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "/stop"})
	w.srv.WaitSent(t, dmID, 2) // the answer to /stop
	w.srv.WaitFor(t, "the draft marked interrupted", func() bool {
		for _, m := range w.srv.Sent(dmID) {
			if m.ID == draft.ID {
				return strings.HasSuffix(m.Content, actors.InterruptedMark)
			}
		}
		return false
	})
	for _, m := range w.srv.Sent(dmID) {
		if m.ID == draft.ID && !strings.HasPrefix(m.Content, long[:1000]) {
			t.Errorf("the draft shows %.80q…, want the start of the answer", m.Content)
		}
	}
}

// TestInterruptedDraftAfterFailedEditsIsMarked: the edit that marks a cancelled turn's draft
// interrupted gets tries of its own, though edits of the draft failed just before. Before, it
// got what the streaming edits had left of theirs (here one), and the draft was left showing
// part of an answer.
func TestInterruptedDraftAfterFailedEditsIsMarked(t *testing.T) {
	var w *world
	failed := make(chan struct{})
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		req.Partial("one")
		if err := agentWait(ctx, func() bool { return len(w.srv.Sent(dmID)) == 1 }); err != nil {
			return nil, err
		}
		w.srv.FailNext("PATCH", "", 500, 3) // two streaming edits, and the mark's first try
		for _, text := range []string{"one two", "one two three"} {
			n := w.srv.Requests("PATCH", "")
			req.Partial(text)
			if err := agentWait(ctx, func() bool { return w.srv.Requests("PATCH", "") > n }); err != nil {
				return nil, err
			}
		}
		close(failed)
		<-ctx.Done() // until /stop
		return nil, ctx.Err()
	})
	w = startDraftWorld(t, agent)
	w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "question"})
	draft := w.srv.WaitSent(t, dmID, 1)[0]
	select {
	case <-failed:
	case <-time.After(discordtest.WaitTimeout):
		t.Fatal("the draft's edits were not tried")
	}
	w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "/stop"})
	w.srv.WaitFor(t, "the draft marked interrupted", func() bool {
		for _, m := range w.srv.Sent(dmID) {
			if m.ID == draft.ID {
				return m.Content == "one two three"+actors.InterruptedMark
			}
		}
		return false
	})
}

// answerIsTheDraft waits until the DM shows final, and checks that the bot posted one message
// there, the draft finished into the answer to m.
func (w *world) answerIsTheDraft(t *testing.T, m *discordgo.Message, final string) {
	t.Helper()
	w.srv.WaitFor(t, "the answer shown", func() bool {
		got := w.srv.Sent(dmID)
		return len(got) > 0 && got[len(got)-1].Content == final
	})
	got := w.srv.Sent(dmID)
	if len(got) != 1 {
		t.Fatalf("bot posted %q, want the draft finished into the answer alone", contents(got))
	}
	if ref := got[0].MessageReference; ref == nil || ref.MessageID != m.ID {
		t.Errorf("the answer references %+v, want the message", ref)
	}
}
