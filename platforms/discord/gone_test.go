package discord_test

import (
	"cmp"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms/discord"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// Replies whose place in Discord is gone or refused for good (found by an audit).

// heldEcho is echoAgent once release is closed.
func heldEcho(release <-chan struct{}) agents.Agent {
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return echoAgent(ctx, req)
	})
}

// streamed is an agent that shows a draft and answers once the draft's post to its chat (the
// thread, in one) was tried.
func streamed(w **world) agents.Agent {
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		req.Partial("thinking")
		posts := "/channels/" + cmp.Or(req.Identity.ThreadID, req.Identity.ChatID) + "/messages"
		if err := agentWait(ctx, func() bool { return (*w).srv.Requests("POST", posts) > 0 }); err != nil {
			return nil, err
		}
		return &agents.Response{Text: "the answer"}, nil
	})
}

// settled waits until key's first reply is no longer pending and returns its state.
func (w *world) settled(t *testing.T, key string) string {
	t.Helper()
	var state string
	eventually(t, "the reply delivered or failed", func() bool {
		out, err := w.d.Store().OutboxAfter(t.Context(), key, 0, 10)
		if err != nil || len(out) == 0 {
			return false
		}
		state = out[0].State
		return state == persistence.DeliveryDelivered || state == persistence.DeliveryFailed
	})
	return state
}

// TestReplyToADeletedThreadIsNotPostedInItsChannel: a private thread deleted while the agent
// answers a mention in it. With auto_thread on, the reply was taken for one to an auto-thread
// not opened yet: opening it from the message of the thread's id failed (there is none), and
// the answer was posted in the public parent channel, for everyone who could not see the
// thread. Whether or not the bot heard of the deletion, the reply is now undeliverable.
func TestReplyToADeletedThreadIsNotPostedInItsChannel(t *testing.T) {
	for _, heard := range []bool{true, false} {
		t.Run(map[bool]string{true: "deletion heard", false: "deletion missed"}[heard], func(t *testing.T) {
			release := make(chan struct{})
			w := startWorld(t, heldEcho(release), func(c *config.Config) { c.Platforms.Discord.AutoThread = true })
			const threadID = "210000000000000077"
			w.srv.AddChannel(discordtest.Channel{ID: threadID, GuildID: guildID, Type: discordgo.ChannelTypeGuildPrivateThread,
				ParentID: channelID, OwnerID: alice.ID, Name: "private"})
			m := w.srv.Post(discordtest.UserMessage{ChannelID: threadID, Author: alice, Content: "my secret question", MentionBot: true})
			key := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatThread, ChatID: channelID, ThreadID: threadID}, identity.DefaultKeyOptions)
			eventually(t, "the message taken", func() bool { _, ok := w.stored(t, channelID, m.ID); return ok })
			if heard {
				w.srv.DeleteChannel(threadID)
			} else {
				w.srv.ForgetChannel(threadID)
			}
			close(release)
			if got := w.settled(t, key); got != persistence.DeliveryFailed {
				t.Errorf("the reply is %s, want it failed (undeliverable)", got)
			}
			if sent := contents(w.srv.Sent(channelID)); len(sent) > 0 {
				t.Errorf("the private thread's answer was posted in the parent channel: %q", sent)
			}
			if n := len(w.srv.Threads()); n != 0 {
				t.Errorf("%d threads opened, want none", n)
			}
			w.wantDeletedLine(t)
		})
	}
}

// TestDeletedAutoThreadIsNotOpenedAgain: a moderator deletes the thread the bot opened for a
// mention while the agent answers it. The reply is not posted in a thread opened again from
// the mention, which would undo the moderator's deletion, whether or not the bot heard of it:
// a deletion sent while its gateway session was lost, and not replayed to the next one, was
// missed, and the thread was opened again for the reply.
func TestDeletedAutoThreadIsNotOpenedAgain(t *testing.T) {
	for _, heard := range []bool{true, false} {
		t.Run(map[bool]string{true: "deletion heard", false: "deletion missed"}[heard], func(t *testing.T) {
			release := make(chan struct{})
			w := startWorld(t, heldEcho(release), func(c *config.Config) { c.Platforms.Discord.AutoThread = true })
			m := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "question", MentionBot: true})
			w.srv.WaitFor(t, "the thread opened", func() bool { return len(w.srv.Threads()) == 1 })
			key := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatThread, ChatID: channelID, ThreadID: m.ID}, identity.DefaultKeyOptions)
			eventually(t, "the message taken", func() bool { _, ok := w.stored(t, channelID, m.ID); return ok })
			if heard {
				w.srv.DeleteChannel(m.ID)
			} else {
				w.srv.ForgetChannel(m.ID)
			}
			close(release)
			if got := w.settled(t, key); got != persistence.DeliveryFailed {
				t.Errorf("the reply is %s, want it failed (undeliverable)", got)
			}
			if n := w.srv.Requests("POST", "/threads"); n != 1 {
				t.Errorf("%d requests to open a thread, want 1 (the mention's)", n)
			}
			if sent := contents(w.srv.Sent(channelID)); len(sent) > 0 {
				t.Errorf("the channel got %q, want nothing", sent)
			}
			w.wantDeletedLine(t)
		})
	}
}

// TestDeletedAutoThreadIsNotOpenedAgainAfterARestart: the reply to a message in an auto-thread
// is still unconfirmed when the daemon stops (Discord rate limits its post for an hour), and a
// moderator deletes the thread before the daemon starts again. The reply sent again at the
// start is not posted in a thread opened again from the mention: it answers a message posted
// in the thread, so the thread was open, and Discord's 404 says it was deleted. Before, the
// thread was opened again for it.
func TestDeletedAutoThreadIsNotOpenedAgainAfterARestart(t *testing.T) {
	w := startWorld(t, echoAgent, func(c *config.Config) { c.Platforms.Discord.AutoThread = true })
	m := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "question", MentionBot: true})
	w.srv.WaitSent(t, m.ID, 1)
	w.srv.RateLimitNext("POST", "/channels/"+m.ID+"/messages", time.Hour, 1)
	follow := w.srv.Post(discordtest.UserMessage{ChannelID: m.ID, Author: alice, Content: "and then?"})
	w.srv.WaitFor(t, "the follow-up's reply rate limited", func() bool { return w.srv.PendingFaults("POST") == 0 })
	w.stop(t)
	w.srv.ForgetChannel(m.ID)
	w.start(t)
	key := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatThread, ChatID: channelID, ThreadID: m.ID}, identity.DefaultKeyOptions)
	var state string
	eventually(t, "the follow-up's reply delivered or failed", func() bool {
		out, err := w.d.Store().OutboxAfter(t.Context(), key, 0, 10)
		if err != nil || len(out) != 2 {
			return false
		}
		state = out[1].State
		return state == persistence.DeliveryDelivered || state == persistence.DeliveryFailed
	})
	if state != persistence.DeliveryFailed {
		t.Errorf("the reply to %s is %s, want it failed (undeliverable)", follow.ID, state)
	}
	if n := w.srv.Requests("POST", "/threads"); n != 1 {
		t.Errorf("%d requests to open a thread, want 1 (the mention's)", n)
	}
	if sent := contents(w.srv.Sent(channelID)); len(sent) > 0 {
		t.Errorf("the channel got %q, want nothing", sent)
	}
	w.wantDeletedLine(t)
}

// TestStreamedReplyIntoAnAutoThreadThatCouldNotOpen: the thread for a mention could not be
// opened at once (a passing 500), and the agent streams. The draft's post to the thread not
// opened yet was refused (404 Unknown Channel) and tried again until the process stopped,
// ahead of the final reply, the one path that opens the thread: the user never got an answer.
func TestStreamedReplyIntoAnAutoThreadThatCouldNotOpen(t *testing.T) {
	var w *world
	w = newWorld(t, streamed(&w), func(c *config.Config) { c.Platforms.Discord.AutoThread = true })
	w.draftInterval = 10 * time.Millisecond
	w.start(t)
	w.srv.WaitReady(t)
	w.srv.FailNext("POST", "/threads", 500, 1)
	m := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "question", MentionBot: true})
	got := w.srv.WaitSent(t, m.ID, 1)
	if got[0].Content != "the answer" {
		t.Errorf("the thread got %q, want the answer", got[0].Content)
	}
}

// TestStreamedReplyRefusedForGoodIsFinal: where Discord refuses the bot's posts for good (a
// user who takes no DMs from it), a streamed reply is recorded as failed, as a plain one is
// (TestUndeliverableReplyIsFinal), and the chat's next reply goes out. Before, the draft's post
// was tried again until the process stopped, and the chat's replies waited behind it.
func TestStreamedReplyRefusedForGoodIsFinal(t *testing.T) {
	var w *world
	w = startDraftWorld(t, streamed(&w))
	w.srv.FailNext("POST", "/channels/"+dmID+"/messages", 403, 2) // the draft, then the reply
	w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "question"})
	key := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatDM, ChatID: dmID}, identity.DefaultKeyOptions)
	if got := w.settled(t, key); got != persistence.DeliveryFailed {
		t.Errorf("the refused reply is %s, want it failed", got)
	}
	second := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "again"})
	w.replyTo(t, dmID, second.ID)
}

// TestReplyToAMentionDeletedBeforeItsThreadCouldOpen: the thread for a mention could not be
// opened at once (a passing 500), and its sender deletes the mention while the agent answers
// it. The reply cannot open the thread (404 Unknown Message): it is given up, recorded as failed
// and not tried again, with an INF line saying the message was deleted. Before, it was given up
// with the ERR line that asks the operator to fix the bot's permissions, though there is
// nothing to fix (found by the Discord soak).
func TestReplyToAMentionDeletedBeforeItsThreadCouldOpen(t *testing.T) {
	a := newHeldAgent()
	w := startWorld(t, a.agent(), func(c *config.Config) { c.Platforms.Discord.AutoThread = true })
	w.srv.FailNext("POST", "/threads", 500, 1)
	m := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "a question first", MentionBot: true})
	<-a.started
	w.srv.Delete(m.ID)
	// The gateway reader handles events in order: once a later message is stored, the deletion
	// has been handled (the running mention is answered all the same).
	later := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "unrelated", MentionBot: true})
	w.mustRow(t, channelID, later.ID, "the later mention stored", func(active, _ bool) bool { return active })
	close(a.release)
	key := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatThread, ChatID: channelID, ThreadID: m.ID}, identity.DefaultKeyOptions)
	if got := w.settled(t, key); got != persistence.DeliveryFailed {
		t.Errorf("the reply is %s, want it failed (its message is gone)", got)
	}
	w.wantDeletedLine(t)
	if n := w.srv.Requests("POST", "/channels/"+channelID+"/messages/"+m.ID+"/threads"); n != 2 {
		t.Errorf("%d requests to open the deleted mention's thread, want 2 (the mention's, the reply's)", n)
	}
	for _, s := range contents(w.srv.Sent(channelID)) {
		if !strings.Contains(s, "could not open a thread") {
			t.Errorf("the channel got %q, want only the notice that the thread could not open", s)
		}
	}
}

// TestReplyInADeletedChannel: the channel a mention was posted in is deleted while the agent
// answers it (404 Unknown Channel). The reply is given up, recorded as failed, with the INF line
// that says where it was to go was deleted, not the ERR line that asks for the bot's permissions.
func TestReplyInADeletedChannel(t *testing.T) {
	release := make(chan struct{})
	w := startWorld(t, heldEcho(release), nil)
	const gone = "200000000000000099"
	w.srv.AddChannel(discordtest.Channel{ID: gone, GuildID: guildID, Type: discordgo.ChannelTypeGuildText, Name: "doomed"})
	m := w.srv.Post(discordtest.UserMessage{ChannelID: gone, Author: alice, Content: "question", MentionBot: true})
	var in inbound
	eventually(t, "the message taken", func() (ok bool) { in, ok = w.stored(t, gone, m.ID); return ok })
	w.srv.DeleteChannel(gone)
	close(release)
	if got := w.settled(t, in.key); got != persistence.DeliveryFailed {
		t.Errorf("the reply is %s, want it failed (its channel is gone)", got)
	}
	w.wantDeletedLine(t)
}

// wantDeletedLine checks that w's log says, at Info, that a reply's place in Discord was deleted
// (platforms.ErrDeleted), and has no ERR line: there is nothing for the operator to do. Before,
// a thread or channel deleted meanwhile (10003), or a thread's starter deleted under a reply that
// did not answer it (10008), logged the ERR line that asks for the bot's permissions.
func (w *world) wantDeletedLine(t *testing.T) {
	t.Helper()
	log := w.log.String()
	if strings.Contains(log, "level=ERROR") {
		t.Errorf("the log has an ERR line:\n%s", log)
	}
	if !strings.Contains(log, `level=INFO msg="where a reply was to go was deleted; recorded as failed"`) {
		t.Errorf("the log does not say where the reply was to go was deleted:\n%s", log)
	}
}
