package discord_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/platforms/discord"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// heldAgent echoes each turn's messages, records them, and holds each turn whose first message
// ends in "first" until release is closed, so that messages queue behind it.
type heldAgent struct {
	release chan struct{}
	started chan struct{} // closed when the first held turn starts
	once    sync.Once
	mu      sync.Mutex
	runs    [][]string
}

func newHeldAgent() *heldAgent {
	return &heldAgent{release: make(chan struct{}), started: make(chan struct{})}
}

func (a *heldAgent) agent() agents.Agent {
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		var texts []string
		for _, m := range req.Messages {
			texts = append(texts, m.Text)
		}
		a.mu.Lock()
		a.runs = append(a.runs, texts)
		a.mu.Unlock()
		if strings.HasSuffix(texts[0], "first") {
			a.once.Do(func() { close(a.started) })
			select {
			case <-a.release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return echoAgent(ctx, req)
	})
}

func (a *heldAgent) ran() [][]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.runs)
}

// mustRow waits until message id of channelID is stored and cond holds for its row: active,
// archived.
func (w *world) mustRow(t *testing.T, chat, id, what string, cond func(active, archived bool) bool) {
	t.Helper()
	eventually(t, what, func() bool {
		m, err := w.d.Store().FindInbound(t.Context(), discord.Name, chat, id)
		return err == nil && cond(m.Active, m.Archived)
	})
}

// TestDeletedQueuedMessageIsNotAnswered: a guild message deleted by its sender while it waits
// behind a running turn never runs, is not answered, and its row is archived; the turns before
// and after it run and are answered in order. In collect mode, where it would have been merged
// with the message after it, only it leaves the merged turn. Before, nothing handled
// MESSAGE_DELETE, and the deleted message was answered.
func TestDeletedQueuedMessageIsNotAnswered(t *testing.T) {
	for _, mode := range []string{"followup", "collect"} {
		t.Run(mode, func(t *testing.T) {
			a := newHeldAgent()
			w := startWorld(t, a.agent(), func(c *config.Config) { c.Sessions.Queue.Mode = mode })
			post := func(text string) *discordgo.Message {
				return w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: text, MentionBot: true})
			}
			first := post("first")
			<-a.started
			second, third := post("to be deleted"), post("third")
			w.mustRow(t, channelID, third.ID, "third stored", func(active, _ bool) bool { return active })
			w.srv.Delete(second.ID)
			w.mustRow(t, channelID, second.ID, "the deleted message's row archived", func(active, archived bool) bool { return !active && archived })
			close(a.release)
			r1, r3 := w.replyTo(t, channelID, first.ID), w.replyTo(t, channelID, third.ID)
			if r1.Content != "echo: first" || r3.Content != "echo: third" {
				t.Errorf("replies = %q, %q, want the echoes of first and third", r1.Content, r3.Content)
			}
			sent := w.srv.Sent(channelID)
			i1 := slices.IndexFunc(sent, func(m *discordgo.Message) bool { return m.ID == r1.ID })
			i3 := slices.IndexFunc(sent, func(m *discordgo.Message) bool { return m.ID == r3.ID })
			if i1 > i3 {
				t.Errorf("third answered before first (%d, %d)", i3, i1)
			}
			for _, m := range sent {
				if strings.Contains(m.Content, "deleted") || m.MessageReference != nil && m.MessageReference.MessageID == second.ID {
					t.Errorf("bot posted %q (answering %v) for the deleted message", m.Content, m.MessageReference)
				}
			}
			if got := a.ran(); len(got) != 2 || slices.ContainsFunc(got, func(texts []string) bool {
				return slices.ContainsFunc(texts, func(s string) bool { return strings.Contains(s, "deleted") })
			}) {
				t.Errorf("agent runs = %q, want first and third only", got)
			}
		})
	}
}

// TestDeletedRunningMessageIsAnswered: a message deleted while its turn runs is answered as it
// would have been, and its row stays active.
func TestDeletedRunningMessageIsAnswered(t *testing.T) {
	a := newHeldAgent()
	w := startWorld(t, a.agent(), nil)
	first := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "first"})
	<-a.started
	w.srv.Delete(first.ID)
	// The gateway reader handles events in order: once a later message is stored, the deletion
	// has been handled.
	later := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "later"})
	w.mustRow(t, dmID, later.ID, "later stored", func(active, _ bool) bool { return active })
	close(a.release)
	// Its reply references nothing (the message is gone), as Discord posts it.
	w.srv.WaitFor(t, "the reply to the deleted message, then the next one's", func() bool {
		return slices.Equal(contents(w.srv.Sent(dmID)), []string{"echo: first", "echo: later"})
	})
	w.mustRow(t, dmID, first.ID, "the running message's row left active", func(active, archived bool) bool { return active && !archived })
	if got := a.ran(); len(got) != 2 {
		t.Errorf("agent runs = %q, want first and later", got)
	}
}

// TestMessageDeletedWhileDownIsNotReadBack: a message said and deleted while the daemon was down
// is not answered by the next start's backfill (Discord's history no longer holds it), and the
// message after it is.
func TestMessageDeletedWhileDownIsNotReadBack(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	before := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "before"})
	w.replyTo(t, dmID, before.ID)
	w.stop(t)
	gone := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "to be deleted"})
	kept := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "kept"})
	w.srv.Delete(gone.ID)
	w.start(t)
	w.srv.WaitReady(t)
	w.replyTo(t, dmID, kept.ID)
	if got, want := w.answered(dmID), []string{before.ID, kept.ID}; !slices.Equal(got, want) {
		t.Errorf("DM replies answer %v, want %v", got, want)
	}
	if _, ok := w.stored(t, dmID, gone.ID); ok {
		t.Errorf("the message deleted while down was stored")
	}
}

// TestMentionDeletedBeforeItsThreadOpensIsNotTaken: with auto_thread on, a mention its sender
// deleted while the bot was disconnected comes back in the RESUME's replay, before its
// deletion, and Discord refuses to open a thread from it (404 Unknown Message). It is not taken:
// its sender took it back, and its answer has nowhere to go. Before, it was taken and run, the
// log said its reply went to the channel, and the reply was then refused for good with an ERR
// line asking the operator to fix the bot's permissions (found by the Discord soak).
func TestMentionDeletedBeforeItsThreadOpensIsNotTaken(t *testing.T) {
	a := newHeldAgent()
	w := startWorld(t, a.agent(), func(c *config.Config) { c.Platforms.Discord.AutoThread = true })
	w.srv.Disconnect()
	gone := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "never mind", MentionBot: true})
	w.srv.Delete(gone.ID)
	w.srv.WaitReady(t) // resumed: the replay holds the mention, then its deletion
	later := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "a question", MentionBot: true})
	w.srv.WaitSent(t, later.ID, 1) // the gateway's order: the deleted mention was handled before
	if _, ok := w.stored(t, channelID, gone.ID); ok {
		t.Errorf("the deleted mention was stored")
	}
	if got := a.ran(); len(got) != 1 || !strings.HasSuffix(got[0][0], "a question") {
		t.Errorf("agent runs = %q, want only the later question's", got)
	}
	if n := w.srv.Requests("POST", "/channels/"+gone.ID+"/messages"); n != 0 {
		t.Errorf("%d posts to the deleted mention's thread, want none", n)
	}
	for _, line := range []string{"the reply goes to the channel", "refused the message for good"} {
		if strings.Contains(w.log.String(), line) {
			t.Errorf("the log says %q:\n%s", line, w.log.String())
		}
	}
}
