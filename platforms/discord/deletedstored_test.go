package discord_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// heldOnRestart echoes each turn's messages and records them; each turn whose first message
// ends in "first" reports its start on started and waits until release is closed, so that
// messages queue behind it, before a restart and after it (the turn runs again).
type heldOnRestart struct {
	release chan struct{}
	started chan struct{}
	mu      sync.Mutex
	runs    [][]string
}

func (a *heldOnRestart) agent() agents.Agent {
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		var texts []string
		for _, m := range req.Messages {
			texts = append(texts, m.Text)
		}
		a.mu.Lock()
		a.runs = append(a.runs, texts)
		a.mu.Unlock()
		if strings.HasSuffix(texts[0], "first") {
			a.started <- struct{}{}
			select {
			case <-a.release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return echoAgent(ctx, req)
	})
}

// TestDeletedMessageTakenBeforeARestartIsNotAnswered: a message taken before a restart that
// waits in its session's queue after it (behind a turn that runs again) is withdrawn when its
// sender deletes it, though the new process never delivered it: the platform asks the store
// for it, by its chat (a thread's parent channel) and id, and its session, by the key it was
// stored under (a guild channel's holds its sender, whom MESSAGE_DELETE does not carry). It is
// not answered, its row is archived, and the turns before and after it are answered. Before,
// the new process had no record of it, ignored the deletion without a word, and answered it.
func TestDeletedMessageTakenBeforeARestartIsNotAnswered(t *testing.T) {
	const threadID = "210000000000000001"
	for _, tc := range []struct {
		name, channel, chat string
		mention             bool
	}{
		{"dm", dmID, dmID, false},
		{"guild channel", channelID, channelID, true},
		{"thread", threadID, channelID, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &heldOnRestart{release: make(chan struct{}), started: make(chan struct{}, 2)}
			// No drain: the stop cancels the running turn, whose message runs again at the start.
			w := startWorld(t, a.agent(), func(c *config.Config) { c.Shutdown.DrainTimeout = 0 })
			w.srv.AddChannel(discordtest.Channel{ID: threadID, GuildID: guildID, Type: discordgo.ChannelTypeGuildPublicThread,
				ParentID: channelID, OwnerID: alice.ID, Name: "topic"})
			post := func(text string) *discordgo.Message {
				return w.srv.Post(discordtest.UserMessage{ChannelID: tc.channel, Author: alice, Content: text, MentionBot: tc.mention})
			}
			first := post("first")
			<-a.started
			gone := post("to be deleted")
			w.mustRow(t, tc.chat, gone.ID, "the message to delete stored", func(active, _ bool) bool { return active })
			w.stop(t)

			w.start(t)
			w.srv.WaitReady(t)
			<-a.started // first runs again, the message to delete waits behind it
			// The start's backfill has read back what it would (nothing): the message posted
			// next is taken live, on the intake, behind the deletion.
			eventually(t, "the start's backfill done", func() bool { return strings.Contains(w.log.String(), "read what was missed") })
			w.srv.Delete(gone.ID)
			// The intake hands on in order: once a later message is stored, the deletion's
			// withdrawal has returned.
			third := post("third")
			w.mustRow(t, tc.chat, third.ID, "third stored", func(active, _ bool) bool { return active })
			if m, err := w.d.Store().FindInbound(t.Context(), "discord", tc.chat, gone.ID); err != nil || m.Active || !m.Archived {
				t.Errorf("the deleted message's row = %+v (err %v), want it archived", m, err)
			}
			close(a.release)
			w.replyTo(t, tc.channel, first.ID)
			w.replyTo(t, tc.channel, third.ID)
			if got, want := w.answered(tc.channel), []string{first.ID, third.ID}; !slices.Equal(got, want) {
				t.Errorf("replies answer %v, want %v (not the deleted %s)", got, want, gone.ID)
			}
			a.mu.Lock()
			defer a.mu.Unlock()
			for _, texts := range a.runs {
				if slices.ContainsFunc(texts, func(s string) bool { return strings.Contains(s, "deleted") }) {
					t.Errorf("agent runs = %q, want none with the deleted message", a.runs)
				}
			}
		})
	}
}

// findCounter is a store that counts its reads by the index of inbound ids (FindInbound,
// FindInbounds) by message id.
type findCounter struct {
	persistence.Store
	mu    sync.Mutex
	finds map[string]int
}

func (f *findCounter) FindInbound(ctx context.Context, platform, chatID, messageID string) (*persistence.Message, error) {
	f.mu.Lock()
	f.finds[messageID]++
	f.mu.Unlock()
	return f.Store.FindInbound(ctx, platform, chatID, messageID)
}

func (f *findCounter) FindInbounds(ctx context.Context, platform, chatID string, ids []string) ([]persistence.Message, error) {
	f.mu.Lock()
	for _, id := range ids {
		f.finds[id]++
	}
	f.mu.Unlock()
	return f.Store.FindInbounds(ctx, platform, chatID, ids)
}

func (f *findCounter) count(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.finds[id]
}

// TestDeletedChatterCostsAtMostOneRead: the deletion of a message the bot never took costs one
// read of the store's index of inbound ids if it was posted before the platform's Run began
// (another process may have taken it), and none if it was posted since (the platform would
// know it): a user cleaning up a busy channel does not read the store for each message.
func TestDeletedChatterCostsAtMostOneRead(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	before := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "chatter before"})
	w.stop(t)
	counter := &findCounter{finds: map[string]int{}}
	w.wrapStore = func(s persistence.Store) persistence.Store { counter.Store = s; return counter }
	w.start(t)
	w.srv.WaitReady(t)
	w.srv.Advance(2 * time.Minute) // past the margin for clocks apart
	after := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "chatter after"})
	w.srv.Delete(before.ID)
	w.srv.Delete(after.ID)
	// The intake hands on in order: once this is answered, the deletions have been handled.
	last := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "then"})
	w.replyTo(t, dmID, last.ID)
	if n := counter.count(before.ID); n != 1 {
		t.Errorf("%d reads for the deletion of chatter posted before the start, want 1", n)
	}
	if n := counter.count(after.ID); n != 0 {
		t.Errorf("%d reads for the deletion of chatter posted since the start, want none", n)
	}
}

// findRefuser is a store whose reads by the index of inbound ids (FindInbound, FindInbounds)
// fail (persistence.ErrUnavailable) while refuse is set, as a store in an outage does.
type findRefuser struct {
	persistence.Store
	refuse atomic.Bool
}

func (f *findRefuser) FindInbound(ctx context.Context, platform, chatID, messageID string) (*persistence.Message, error) {
	if f.refuse.Load() {
		return nil, fmt.Errorf("find inbound %s/%s/%s: %w", platform, chatID, messageID, persistence.ErrUnavailable)
	}
	return f.Store.FindInbound(ctx, platform, chatID, messageID)
}

func (f *findRefuser) FindInbounds(ctx context.Context, platform, chatID string, ids []string) ([]persistence.Message, error) {
	if f.refuse.Load() {
		return nil, fmt.Errorf("find inbound %s/%s (%d ids): %w", platform, chatID, len(ids), persistence.ErrUnavailable)
	}
	return f.Store.FindInbounds(ctx, platform, chatID, ids)
}

// TestDeletedChatterTheStoreCannotFindIsNotSaidAnswered: the deletion of a message posted
// before the platform's Run began, which the store cannot be read for, is logged as one the
// platform cannot place (it may be chatter the bot never took), with the store's error, once
// for a message and once for a purge; not as a message the bot took that "is answered". Before,
// each deletion of old chatter during a store outage said an answer was coming that never
// would.
func TestDeletedChatterTheStoreCannotFindIsNotSaidAnswered(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	one := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "chatter"})
	purged := []*discordgo.Message{
		w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "chatter 2"}),
		w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "chatter 3"}),
	}
	w.stop(t)
	refuser := &findRefuser{}
	refuser.refuse.Store(true)
	w.wrapStore = func(s persistence.Store) persistence.Store { refuser.Store = s; return refuser }
	w.start(t)
	w.srv.WaitReady(t)
	w.srv.Delete(one.ID)
	w.srv.DeleteBulk(purged[0].ID, purged[1].ID)
	// The intake hands on in order: once this is answered, the deletions have been handled.
	last := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "then"})
	w.replyTo(t, dmID, last.ID)
	log := w.log.String()
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "but not withdrawn") { // the line of a message the bot took
			t.Errorf("a deletion the store could not be asked about is said answered: %s", l)
		}
	}
	for _, want := range []string{
		"discord message deleted by its sender could not be looked up in the store",
		"discord messages deleted in bulk could not be looked up in the store",
	} {
		if !strings.Contains(log, want) || !strings.Contains(log, persistence.ErrUnavailable.Error()) {
			t.Errorf("no line %q with the store's error in the log:\n%s", want, log)
		}
	}
}

// TestDeletionNamingAnotherThreadWithdrawsNothing: the deletion of a message taken before a
// restart is looked up in the store by its chat, which for a thread is its parent channel,
// shared with its sibling threads; a deletion naming a sibling thread of the one the message
// was posted in withdraws nothing (the message runs and is answered), and one naming its own
// thread withdraws it. Before, the lookup checked the chat only, and a forged or mistaken
// event naming any thread of the channel withdrew the message.
func TestDeletionNamingAnotherThreadWithdrawsNothing(t *testing.T) {
	const thread, sibling = "210000000000000001", "210000000000000002"
	a := &heldOnRestart{release: make(chan struct{}), started: make(chan struct{}, 2)}
	w := startWorld(t, a.agent(), func(c *config.Config) { c.Shutdown.DrainTimeout = 0 })
	for _, id := range []string{thread, sibling} {
		w.srv.AddChannel(discordtest.Channel{ID: id, GuildID: guildID, Type: discordgo.ChannelTypeGuildPublicThread,
			ParentID: channelID, OwnerID: alice.ID, Name: "topic " + id})
	}
	post := func(text string) *discordgo.Message {
		return w.srv.Post(discordtest.UserMessage{ChannelID: thread, Author: alice, Content: text, MentionBot: true})
	}
	first := post("first")
	<-a.started
	kept, gone := post("kept"), post("to be deleted")
	w.mustRow(t, channelID, gone.ID, "the messages to delete stored", func(active, _ bool) bool { return active })
	w.stop(t)

	w.start(t)
	w.srv.WaitReady(t)
	<-a.started // first runs again, the others wait behind it
	eventually(t, "the start's backfill done", func() bool { return strings.Contains(w.log.String(), "read what was missed") })
	w.srv.DeleteIn(kept.ID, sibling)
	// The intake hands on in order: once a later message is stored, the deletion's withdrawal
	// has returned.
	second := post("second")
	w.mustRow(t, channelID, second.ID, "second stored", func(active, _ bool) bool { return active })
	if m, err := w.d.Store().FindInbound(t.Context(), "discord", channelID, kept.ID); err != nil || !m.Active || m.Archived {
		t.Errorf("the row of the message a deletion in a sibling thread named = %+v (err %v), want it pending", m, err)
	}
	w.srv.Delete(gone.ID)
	third := post("third")
	w.mustRow(t, channelID, third.ID, "third stored", func(active, _ bool) bool { return active })
	if m, err := w.d.Store().FindInbound(t.Context(), "discord", channelID, gone.ID); err != nil || m.Active || !m.Archived {
		t.Errorf("the deleted message's row = %+v (err %v), want it archived", m, err)
	}
	close(a.release)
	w.replyTo(t, thread, first.ID)
	w.replyTo(t, thread, third.ID)
	a.mu.Lock()
	defer a.mu.Unlock()
	var ran []string
	for _, texts := range a.runs {
		ran = append(ran, texts...)
	}
	if !slices.ContainsFunc(ran, func(s string) bool { return strings.Contains(s, "kept") }) ||
		slices.ContainsFunc(ran, func(s string) bool { return strings.Contains(s, "deleted") }) {
		t.Errorf("agent runs = %q, want one with the kept message and none with the deleted one", a.runs)
	}
}
