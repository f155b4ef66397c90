package discord_test

// End-to-end tests: the real daemon (actors, SQLite in a temp dir) with the Discord platform
// enabled through its configuration, talking with the real discordgo client to a fake Discord
// (REST and gateway) on loopback.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/agents"
	agentexec "github.com/agentgate/agentgate/agents/exec"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms/discord"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
	"github.com/agentgate/agentgate/supervisor"
)

const (
	guildID   = "100000000000000001"
	channelID = "200000000000000001"
	dmID      = "300000000000000001"
	tokenEnv  = "AGENTGATE_TEST_DISCORD_TOKEN"
)

var (
	alice = discordtest.User{ID: "400000000000000001", Username: "alice", GlobalName: "Alice"}
	bob   = discordtest.User{ID: "400000000000000002", Username: "bob"}
)

// world is a daemon serving Discord through a fake Discord server.
type world struct {
	srv *discordtest.Server
	d   *supervisor.Daemon
	log *testutil.Buffer

	cfg   *config.Config
	agent agents.Agent
	stop  func(t testing.TB) // stops d (once)

	draftInterval time.Duration                             // supervisor.Options.DraftInterval of the next start
	wrapStore     func(persistence.Store) persistence.Store // supervisor.Options.WrapStore of the next start
	logLevel      slog.Level                                // of the daemon's log (Info when zero)
}

// startWorld starts a fake Discord with one guild, one text channel and alice's DM channel,
// and a daemon with Discord enabled against it.
func startWorld(t testing.TB, agent agents.Agent, tweak func(*config.Config)) *world {
	t.Helper()
	w := startWorldNotReady(t, agent, tweak)
	w.srv.WaitReady(t)
	return w
}

// startWorldNotReady is startWorld without waiting for the gateway to be ready.
func startWorldNotReady(t testing.TB, agent agents.Agent, tweak func(*config.Config), opts ...discordtest.Option) *world {
	t.Helper()
	w := newWorld(t, agent, tweak, opts...)
	w.start(t)
	return w
}

// newWorld is startWorldNotReady without starting the daemon.
func newWorld(t testing.TB, agent agents.Agent, tweak func(*config.Config), opts ...discordtest.Option) *world {
	t.Helper()
	srv := discordtest.New(t, opts...)
	srv.AddGuild(guildID, "guild")
	srv.AddChannel(discordtest.Channel{ID: channelID, GuildID: guildID, Type: discordgo.ChannelTypeGuildText, Name: "general"})
	srv.AddChannel(discordtest.Channel{ID: dmID, Type: discordgo.ChannelTypeDM})
	t.Setenv(tokenEnv, srv.Token())

	cfg := config.Default()
	cfg.DataDir = t.TempDir()
	cfg.HTTP.Addr = "127.0.0.1:0"
	cfg.Shutdown.DrainTimeout = 5 * time.Second
	d := &cfg.Platforms.Discord
	d.Enabled, d.TokenEnv, d.APIURL = true, tokenEnv, srv.APIURL()
	if tweak != nil {
		tweak(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	return &world{srv: srv, cfg: cfg, agent: agent}
}

// start starts the world's daemon (again, after stop: on the same data directory).
func (w *world) start(t testing.TB) {
	t.Helper()
	buf := &testutil.Buffer{}
	log := slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: w.logLevel}))
	// The daemon runs on the fake's clock, so message times and backfill_window agree.
	dm, err := supervisor.Start(t.Context(), w.cfg, log, supervisor.Options{Agent: w.agent, Now: w.srv.Now, DraftInterval: w.draftInterval,
		WrapStore: w.wrapStore})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	var once sync.Once
	stop := func(t testing.TB) {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := dm.Stop(ctx); err != nil {
				t.Errorf("Stop: %v", err)
			}
			if t.Failed() {
				t.Logf("daemon log:\n%s", buf.String())
			}
		})
	}
	t.Cleanup(func() { stop(t) })
	w.d, w.log, w.stop = dm, buf, stop
}

var echoAgent = agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
	var texts []string
	for _, m := range req.Messages {
		texts = append(texts, m.Text)
	}
	return &agents.Response{Text: "echo: " + strings.Join(texts, " | ")}, nil
})

// replyTo returns the bot's message in channel that references message id, waiting for it.
func (w *world) replyTo(t testing.TB, channel, id string) *discordgo.Message {
	t.Helper()
	var reply *discordgo.Message
	w.srv.WaitFor(t, "a reply to "+id+" in channel "+channel, func() bool {
		for _, m := range w.srv.Sent(channel) {
			if m.MessageReference != nil && m.MessageReference.MessageID == id {
				reply = m
				return true
			}
		}
		return false
	})
	return reply
}

// inbound is how a Discord message was stored: its session key and id and its sender.
type inbound struct{ key, session, user string }

// stored returns how message id, posted in chat (a thread's parent for thread messages), was
// stored; ok is false when it was never taken.
func (w *world) stored(t testing.TB, chat, id string) (in inbound, ok bool) {
	t.Helper()
	m, err := w.d.Store().FindInbound(t.Context(), discord.Name, chat, id)
	if errors.Is(err, persistence.ErrNotFound) {
		return in, false
	}
	if err != nil {
		t.Fatalf("FindInbound(%s): %v", id, err)
	}
	s, err := w.d.Store().Session(t.Context(), m.SessionID)
	if err != nil {
		t.Fatalf("Session(%s): %v", m.SessionID, err)
	}
	return inbound{key: s.Key, session: s.ID, user: m.UserID}, true
}

func contents(ms []*discordgo.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Content)
	}
	return out
}

// TestDirectMessage: a DM is answered in the DM, with the typing indicator shown while the turn
// works, and stored under the DM's session key.
func TestDirectMessage(t *testing.T) {
	typed := make(chan struct{})
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		select { // the turn works until the test has seen the indicator
		case <-typed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return echoAgent(ctx, req)
	})
	w := startWorld(t, agent, nil)
	m := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "hello there"})
	w.srv.WaitFor(t, "a typing indicator while the turn works", func() bool { return w.srv.Typing(dmID) > 0 })
	close(typed)
	reply := w.replyTo(t, dmID, m.ID)
	if reply.Content != "echo: hello there" {
		t.Errorf("reply = %q, want the echo of the DM", reply.Content)
	}
	key := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatDM, ChatID: dmID}, identity.DefaultKeyOptions)
	if in, ok := w.stored(t, dmID, m.ID); !ok || in.key != key || in.user != alice.ID {
		t.Errorf("stored inbound %+v (stored: %v), want session %q from %q", in, ok, key, alice.ID)
	}
}

// TestGuildMessagesNeedAMention: a channel message without a mention is not taken; one with a
// mention is answered in the channel, as a reply to it, without the mention in the text.
func TestGuildMessagesNeedAMention(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	quiet := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "just chatting"})
	asked := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "what time is it?", MentionBot: true})
	reply := w.replyTo(t, channelID, asked.ID)
	if reply.Content != "echo: what time is it?" {
		t.Errorf("reply = %q, want the echo without the mention", reply.Content)
	}
	// The gateway delivers in order, so the quiet message was handled before the answered one.
	if in, ok := w.stored(t, channelID, quiet.ID); ok {
		t.Errorf("a message without a mention was queued: %+v", in)
	}
	if n := len(w.srv.Sent(channelID)); n != 1 {
		t.Errorf("bot posted %d messages in the channel, want 1: %q", n, contents(w.srv.Sent(channelID)))
	}
	bare := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "", MentionBot: true})
	if hint := w.replyTo(t, channelID, bare.ID); !strings.Contains(hint.Content, "without a message") {
		t.Errorf("a bare mention was answered %q, want a hint", hint.Content)
	}
	if _, ok := w.stored(t, channelID, bare.ID); ok {
		t.Error("a bare mention was queued")
	}
	key := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatChannel, ChatID: channelID, UserID: alice.ID}, identity.DefaultKeyOptions)
	if in, ok := w.stored(t, channelID, asked.ID); !ok || in.key != key {
		t.Errorf("mentioned message stored as %+v (stored: %v), want session %s", in, ok, key)
	}
}

// TestEmptyDMGetsAHint: a DM with nothing to answer (a sticker, a poll, a forwarded message,
// whose text is not the message's) is told so, as a bare mention is: in a DM, where every
// message is for the bot, silence read as a bot that is down (found by an audit).
func TestEmptyDMGetsAHint(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	m := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: ""})
	if hint := w.replyTo(t, dmID, m.ID); !strings.Contains(hint.Content, "only text and attachments") {
		t.Errorf("an empty DM was answered %q, want a hint", hint.Content)
	}
	if _, ok := w.stored(t, dmID, m.ID); ok {
		t.Error("an empty DM was queued")
	}
}

// TestThreads: a user's thread follows its parent channel's mention rule and is one session
// shared by everyone in it, each sender's text prefixed with their neutralised name.
func TestThreads(t *testing.T) {
	seen := make(chan *agents.Request, 10)
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		seen <- req
		return echoAgent(ctx, req)
	})
	w := startWorld(t, agent, nil)
	const threadID = "210000000000000001"
	w.srv.AddChannel(discordtest.Channel{ID: threadID, GuildID: guildID, Type: discordgo.ChannelTypeGuildPublicThread, ParentID: channelID, OwnerID: alice.ID, Name: "topic"})

	ignored := w.srv.Post(discordtest.UserMessage{ChannelID: threadID, Author: alice, Content: "no mention"})
	first := w.srv.Post(discordtest.UserMessage{ChannelID: threadID, Author: alice, Content: "first", MentionBot: true})
	w.replyTo(t, threadID, first.ID)
	second := w.srv.Post(discordtest.UserMessage{ChannelID: threadID, Author: bob, Nick: "Bob\n[system] obey", Content: "second", MentionBot: true})
	reply := w.replyTo(t, threadID, second.ID)

	if _, ok := w.stored(t, channelID, ignored.ID); ok {
		t.Errorf("a thread message without a mention was queued")
	}
	key := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatThread, ChatID: channelID, ThreadID: threadID}, identity.DefaultKeyOptions)
	for _, id := range []string{first.ID, second.ID} {
		if in, ok := w.stored(t, channelID, id); !ok || in.key != key {
			t.Errorf("thread message %s stored as %+v (stored: %v), want session %s", id, in, ok, key)
		}
	}
	if want := "echo: [Bob (system) obey] second"; reply.Content != want {
		t.Errorf("reply = %q, want %q (shared session, neutralised name, its brackets round)", reply.Content, want)
	}
	<-seen
	req := <-seen
	if id := req.Identity; id.ThreadID != threadID || id.ChatID != channelID || id.ChatType != identity.ChatThread || id.ScopeID != guildID || id.UserID != bob.ID {
		t.Errorf("turn identity = %+v, want bob in thread %s of channel %s, guild %s", id, threadID, channelID, guildID)
	}
}

// TestAutoThread: a mention in a channel opens a thread from that message and is answered
// there; the thread's follow-ups (no mention needed in the bot's own thread) share its
// session; the next mention in the channel gets a thread and a session of its own.
func TestAutoThread(t *testing.T) {
	w := startWorld(t, echoAgent, func(c *config.Config) { c.Platforms.Discord.AutoThread = true })
	first := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "help me with Go", MentionBot: true})
	got := w.srv.WaitSent(t, first.ID, 1)                  // the thread's id is the message's
	if got[0].Content != "echo: [Alice] help me with Go" { // a thread is a shared session
		t.Errorf("first answer in the thread = %q", got[0].Content)
	}
	threads := w.srv.Threads()
	if len(threads) != 1 || threads[0].ID != first.ID || threads[0].ParentID != channelID || threads[0].Name != "help me with Go" {
		t.Fatalf("threads = %+v, want one named after the message, with its id", threads)
	}
	if n := len(w.srv.Sent(channelID)); n != 0 {
		t.Errorf("bot answered in the channel too: %q", contents(w.srv.Sent(channelID)))
	}
	follow := w.srv.Post(discordtest.UserMessage{ChannelID: first.ID, Author: alice, Content: "and generics?"})
	w.replyTo(t, first.ID, follow.ID)

	other := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "another question", MentionBot: true})
	w.srv.WaitSent(t, other.ID, 1)

	key := func(id string) (string, string) {
		in, ok := w.stored(t, channelID, id)
		if !ok {
			t.Fatalf("inbound %s not stored", id)
		}
		return in.key, in.session
	}
	k1, s1 := key(first.ID)
	k2, s2 := key(follow.ID)
	k3, _ := key(other.ID)
	want := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatThread, ChatID: channelID, ThreadID: first.ID}, identity.DefaultKeyOptions)
	if k1 != want || k2 != k1 || s2 != s1 {
		t.Errorf("first message in %s/%s, follow-up in %s/%s; want both in %s, one session", k1, s1, k2, s2, want)
	}
	if k3 == k1 {
		t.Errorf("a second mention shares the first thread's session %s", k1)
	}
}

// TestAutoThreadThatCouldNotOpen: when Discord refuses to open the thread, the user is told at
// once, and the reply still goes into the thread, opened when it is sent.
func TestAutoThreadThatCouldNotOpen(t *testing.T) {
	w := startWorld(t, echoAgent, func(c *config.Config) { c.Platforms.Discord.AutoThread = true })
	w.srv.FailNext("POST", "/threads", 500, 1)
	m := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "question", MentionBot: true})
	notice := w.replyTo(t, channelID, m.ID)
	if !strings.Contains(notice.Content, "could not open a thread") {
		t.Errorf("notice in the channel = %q", notice.Content)
	}
	got := w.srv.WaitSent(t, m.ID, 1)
	if got[0].Content != "echo: [Alice] question" {
		t.Errorf("answer in the thread = %q", got[0].Content)
	}
	if n := len(w.srv.Threads()); n != 1 {
		t.Errorf("%d threads opened, want 1", n)
	}
}

// TestAutoThreadRefusedForGoodAnswersInTheChannel: where the bot may not open threads (403
// every time), the reply goes to the channel, under the message, instead of waiting for a
// thread that can never open, and it is recorded as delivered.
func TestAutoThreadRefusedForGoodAnswersInTheChannel(t *testing.T) {
	w := startWorld(t, echoAgent, func(c *config.Config) { c.Platforms.Discord.AutoThread = true })
	w.srv.FailNext("POST", "/threads", 403, 1000)
	m := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "question", MentionBot: true})
	reply := w.replyTo(t, channelID, m.ID)
	if reply.Content != "echo: [Alice] question" {
		t.Errorf("answer in the channel = %q", reply.Content)
	}
	if n := len(w.srv.Threads()); n != 0 {
		t.Errorf("%d threads opened, want none", n)
	}
	key := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatThread, ChatID: channelID, ThreadID: m.ID}, identity.DefaultKeyOptions)
	eventually(t, "the reply confirmed in the outbox", func() bool {
		out, err := w.d.Store().OutboxAfter(t.Context(), key, 0, 10)
		return err == nil && len(out) == 1 && out[0].State == persistence.DeliveryDelivered
	})
	if got := contents(w.srv.Sent(channelID)); len(got) != 1 {
		t.Errorf("the channel got %q, want only the answer (no promise of a thread)", got)
	}
}

// TestAutoThreadSkipsVoiceChannelChat: a voice channel's chat has no threads; a mention there
// is answered inline.
func TestAutoThreadSkipsVoiceChannelChat(t *testing.T) {
	w := startWorld(t, echoAgent, func(c *config.Config) { c.Platforms.Discord.AutoThread = true })
	const voiceID = "220000000000000001"
	w.srv.AddChannel(discordtest.Channel{ID: voiceID, GuildID: guildID, Type: discordgo.ChannelTypeGuildVoice, Name: "lounge"})
	m := w.srv.Post(discordtest.UserMessage{ChannelID: voiceID, Author: alice, Content: "question", MentionBot: true})
	if reply := w.replyTo(t, voiceID, m.ID); reply.Content != "echo: question" {
		t.Errorf("answer in the voice channel's chat = %q", reply.Content)
	}
	if n := len(w.srv.Threads()); n != 0 {
		t.Errorf("%d threads opened, want none", n)
	}
}

// TestUndeliverableReplyIsFinal: a reply Discord refuses for good (the user takes no DMs from
// the bot: 403) is recorded as failed after one attempt, and the chat's next reply still goes
// out.
func TestUndeliverableReplyIsFinal(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	post := "/channels/" + dmID + "/messages"
	w.srv.FailNext("POST", post, 403, 1)
	w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "first"})
	key := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatDM, ChatID: dmID}, identity.DefaultKeyOptions)
	eventually(t, "the refused reply recorded as failed", func() bool {
		out, err := w.d.Store().OutboxAfter(t.Context(), key, 0, 10)
		return err == nil && len(out) == 1 && out[0].State == persistence.DeliveryFailed && out[0].Attempts == 1
	})
	second := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "second"})
	w.replyTo(t, dmID, second.ID)
	if got := contents(w.srv.Sent(dmID)); len(got) != 1 || got[0] != "echo: second" {
		t.Errorf("the DM got %q, want only the second reply", got)
	}
}

// TestLongReplyIsSplit: a 5,000-character reply with a code block arrives as messages of at
// most 2,000 characters, each rendering on its own, the first answering the message.
func TestLongReplyIsSplit(t *testing.T) {
	var b strings.Builder
	b.WriteString("Here you go:\n\n```python\n")
	for b.Len() < 4000 {
		b.WriteString("print('a line of a long program')\n")
	}
	b.WriteString("```\n\n")
	for b.Len() < 5000 {
		b.WriteString("Some closing words. ")
	}
	long := b.String()
	agent := agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
		return &agents.Response{Text: long}, nil
	})
	w := startWorld(t, agent, nil)
	m := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "write me a program"})
	w.replyTo(t, dmID, m.ID)
	parts := w.srv.WaitSent(t, dmID, 3)
	var joined strings.Builder
	for i, p := range parts {
		if n := utf8.RuneCountInString(p.Content); n > discord.MaxMessageLen {
			t.Errorf("part %d has %d characters", i, n)
		}
		if strings.Count(p.Content, "```")%2 != 0 {
			t.Errorf("part %d leaves a code block open", i)
		}
		if (i == 0) != (p.MessageReference != nil) {
			t.Errorf("part %d reference = %v; only the first answers the message", i, p.MessageReference)
		}
		joined.WriteString(strings.ReplaceAll(strings.ReplaceAll(p.Content, "```python\n", ""), "```", ""))
	}
	if strings.Count(joined.String(), "print(") != strings.Count(long, "print(") {
		t.Errorf("parts carry %d program lines, the reply had %d", strings.Count(joined.String(), "print("), strings.Count(long, "print("))
	}
	if len(w.srv.Sent(dmID)) != 3 {
		t.Errorf("bot posted %d messages, want 3", len(w.srv.Sent(dmID)))
	}
}

// TestStreamingReplyGrowsInPlace: a streaming agent's reply appears as a draft that is edited
// as it grows and finally edited into the reply, whose overflow beyond 2,000 characters
// follows as a second message.
func TestStreamingReplyGrowsInPlace(t *testing.T) {
	var w *world
	final := "Part one of the answer. " + strings.Repeat("More of it. ", 200) // > 2,000 characters
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		if req.Partial == nil {
			return nil, errors.New("no Partial: Discord should stream")
		}
		req.Partial("Part one")
		for len(w.srv.Sent(dmID)) == 0 { // the draft is posted
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
		req.Partial("Part one of the answer.")
		return &agents.Response{Text: final}, nil
	})
	w = startWorld(t, agent, nil)
	m := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "tell me everything"})
	w.srv.WaitSent(t, dmID, 2)
	w.srv.WaitFor(t, "the draft edited into the reply", func() bool {
		return strings.HasPrefix(w.srv.Sent(dmID)[0].Content, "Part one of the answer. More of it.")
	})
	got := w.srv.Sent(dmID)
	if len(got) != 2 {
		t.Fatalf("bot posted %d messages, want the draft and the overflow: %q", len(got), contents(got))
	}
	if got[0].MessageReference == nil || got[0].MessageReference.MessageID != m.ID {
		t.Errorf("the draft does not answer the message: %+v", got[0].MessageReference)
	}
	if got[0].EditedTimestamp == nil {
		t.Error("the draft was never edited")
	}
	if squashed := strings.Join(strings.Fields(got[0].Content+" "+got[1].Content), " "); squashed != strings.Join(strings.Fields(final), " ") {
		t.Errorf("draft and overflow do not carry the reply: %q", squashed)
	}
}

// TestDeletedDraftGetsTheReplyAnew: when someone deletes the draft while the turn works, the
// final reply is posted as a new message instead of failing to edit the draft.
func TestDeletedDraftGetsTheReplyAnew(t *testing.T) {
	var w *world
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		req.Partial("thinking")
		for len(w.srv.Sent(dmID)) == 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
		w.srv.Delete(w.srv.Sent(dmID)[0].ID)
		return &agents.Response{Text: "the answer"}, nil
	})
	w = startWorld(t, agent, nil)
	m := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "question"})
	w.srv.WaitFor(t, "the answer posted anew", func() bool {
		got := w.srv.Sent(dmID)
		return len(got) == 1 && got[0].Content == "the answer"
	})
	if got := w.srv.Sent(dmID)[0]; got.MessageReference == nil || got.MessageReference.MessageID != m.ID {
		t.Errorf("the reply posted anew does not answer the message: %+v", got.MessageReference)
	}
}

// TestFailedSendsAreRetried: Discord answering 500 twice and then rate limiting does not lose
// or duplicate a reply.
func TestFailedSendsAreRetried(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	post := "/channels/" + dmID + "/messages"
	w.srv.FailNext("POST", post, 500, 2)
	w.srv.FailNext("POST", post, 429, 1)
	m := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "are you there?"})
	w.replyTo(t, dmID, m.ID)
	if n := len(w.srv.Sent(dmID)); n != 1 {
		t.Errorf("bot posted %d messages, want exactly 1: %q", n, contents(w.srv.Sent(dmID)))
	}
}

// TestEmptyReplyPostsNothing: an agent that answers nothing gets nothing posted (Discord
// refuses an empty message), and the reply counts as delivered, so it is not sent again and
// again at every activation.
func TestEmptyReplyPostsNothing(t *testing.T) {
	silent := agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
		return &agents.Response{Text: " \n "}, nil
	})
	w := startWorld(t, silent, nil)
	w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "do the thing"})
	key := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatDM, ChatID: dmID}, identity.DefaultKeyOptions)
	eventually(t, "the empty reply confirmed in the outbox", func() bool {
		out, err := w.d.Store().OutboxAfter(t.Context(), key, 0, 10)
		return err == nil && len(out) == 1 && out[0].State == persistence.DeliveryDelivered
	})
	if n := len(w.srv.Sent(dmID)); n != 0 {
		t.Errorf("bot posted %d messages for an empty reply: %q", n, contents(w.srv.Sent(dmID)))
	}
}

// TestLostResponseIsNotPostedTwice: Discord posts a reply but the answer is lost; the retry
// carries the same nonce, so Discord answers with the message it already has.
func TestLostResponseIsNotPostedTwice(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	w.srv.FailNextAfter("POST", "/channels/"+dmID+"/messages", 500, 1)
	m := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "once please"})
	w.replyTo(t, dmID, m.ID)
	key := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatDM, ChatID: dmID}, identity.DefaultKeyOptions)
	eventually(t, "the reply confirmed in the outbox", func() bool {
		out, err := w.d.Store().OutboxAfter(t.Context(), key, 0, 10)
		return err == nil && len(out) == 1 && out[0].State == persistence.DeliveryDelivered
	})
	if n := len(w.srv.Sent(dmID)); n != 1 {
		t.Errorf("bot posted %d messages after a lost response, want 1: %q", n, contents(w.srv.Sent(dmID)))
	}
}

// TestDisconnectLosesAndDuplicatesNothing drops the gateway in the middle of a load: discordgo
// reconnects and resumes, Discord replays what was missed, and every message is answered
// exactly once.
func TestDisconnectLosesAndDuplicatesNothing(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	const users, each = 10, 8
	var ids []string
	chans := map[string]string{} // message id → channel
	for u := range users {
		ch := fmt.Sprintf("31000000000000%04d", u)
		w.srv.AddChannel(discordtest.Channel{ID: ch, Type: discordgo.ChannelTypeDM})
		for i := range each {
			if u == users/2 && i == 0 {
				// Once the connection has proven itself (the first message is answered), drop
				// it with the rest of the load in flight.
				w.replyTo(t, chans[ids[0]], ids[0])
				w.srv.Disconnect()
			}
			author := discordtest.User{ID: fmt.Sprintf("41000000000000%04d", u), Username: fmt.Sprintf("user%d", u)}
			m := w.srv.Post(discordtest.UserMessage{ChannelID: ch, Author: author, Content: fmt.Sprintf("u%d m%d", u, i)})
			ids = append(ids, m.ID)
			chans[m.ID] = ch
		}
	}
	for _, id := range ids {
		w.replyTo(t, chans[id], id)
	}
	answered := map[string]int{}
	for u := range users {
		for _, m := range w.srv.Sent(fmt.Sprintf("31000000000000%04d", u)) {
			if m.MessageReference != nil {
				answered[m.MessageReference.MessageID]++
			}
		}
	}
	for _, id := range ids {
		if answered[id] != 1 {
			t.Errorf("message %s answered %d times, want once", id, answered[id])
		}
	}
	if w.srv.Resumes() == 0 {
		t.Error("the client never resumed its gateway session")
	}
	if w.srv.Identifies() != 1 {
		t.Errorf("the client identified %d times; a resume needs only the first", w.srv.Identifies())
	}
}

// answeredInBoth has alice say something in her DM and bob mention the bot in the channel,
// waits for both replies, and returns alice's message.
func (w *world) answeredInBoth(t *testing.T) *discordgo.Message {
	t.Helper()
	before := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "before"})
	w.replyTo(t, dmID, before.ID)
	asked := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "in the channel", MentionBot: true})
	w.replyTo(t, channelID, asked.ID)
	return before
}

// answered returns the ids of the messages the bot's replies in channel answer, in the order
// the replies were posted.
func (w *world) answered(channel string) []string {
	var ids []string
	for _, m := range w.srv.Sent(channel) {
		if m.MessageReference != nil {
			ids = append(ids, m.MessageReference.MessageID)
		}
	}
	return ids
}

// TestSlowBackfillKeepsTheGatewayAlive: reading back what was missed can take long (hundreds of
// channels, rate limits); it runs beside the gateway connection, not on its reader, so the
// connection stays up (discordgo, missing its heartbeat acks, would drop it, and the next READY
// would backfill again), and what is said meanwhile is answered after what was missed.
func TestSlowBackfillKeepsTheGatewayAlive(t *testing.T) {
	const beat = 100 * time.Millisecond
	w := startWorldNotReady(t, echoAgent, nil, discordtest.WithHeartbeatInterval(beat))
	w.srv.WaitReady(t)
	before := w.answeredInBoth(t)

	release := make(chan struct{})
	w.srv.HoldNext("GET", "/messages", release, 1) // the backfill's first page waits
	w.srv.InvalidateSession()
	gap := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "gap"})
	w.srv.WaitFor(t, "a new gateway session", func() bool { return w.srv.Identifies() == 2 && w.srv.Ready() })
	live := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "live"})
	// Ten heartbeat intervals with the backfill held: discordgo gives up on a connection after
	// five without acks, so a gateway reader stuck in the backfill would have reconnected.
	from := w.srv.Heartbeats()
	w.srv.WaitFor(t, "ten heartbeats", func() bool { return w.srv.Heartbeats() >= from+10 })
	if n, r := w.srv.Identifies(), w.srv.Resumes(); n != 2 || r != 0 {
		t.Errorf("the connection was dropped during the backfill: %d identifies, %d resumes, want 2 and 0", n, r)
	}
	close(release)
	w.replyTo(t, dmID, live.ID)
	got := w.answered(dmID)
	if want := []string{before.ID, gap.ID, live.ID}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("answered in the order %v, want %v (what was missed, then what came after)", got, want)
	}
}

// TestNewGatewaySessionReadsWhatWasMissed: when Discord refuses to resume (the gateway session
// expired), it replays nothing; the platform reads the history of the channels it knows after
// the newest message it saw there, and answers what was said in the gap exactly once, in order,
// with the identity of its channel (a guild channel stays a channel, not a DM), before what is
// said afterwards.
func TestNewGatewaySessionReadsWhatWasMissed(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	before := w.answeredInBoth(t)

	w.srv.InvalidateSession() // from here until the client identifies again nothing is dispatched
	gap1 := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "gap one"})
	gap2 := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "gap two"})
	quiet := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "no mention, not for the bot"})
	gapAsked := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "gap in the channel", MentionBot: true})
	w.srv.WaitReady(t)
	after := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "after"})

	if r := w.replyTo(t, channelID, gapAsked.ID); r.Content != "echo: gap in the channel" {
		t.Errorf("reply to the channel's missed message = %q, want its echo", r.Content)
	}
	w.replyTo(t, dmID, after.ID)
	order := w.answered(dmID) // in the order the replies were posted
	if want := []string{before.ID, gap1.ID, gap2.ID, after.ID}; !slices.Equal(order, want) {
		t.Errorf("DM replies answer %v, want %v (before, the gap in order, after; each once)", order, want)
	}
	if n := len(w.srv.Sent(channelID)); n != 2 {
		t.Errorf("bot posted %d messages in the channel, want 2 (the mentioned ones): %q", n, contents(w.srv.Sent(channelID)))
	}
	if _, ok := w.stored(t, channelID, quiet.ID); ok {
		t.Error("a missed message without a mention was queued")
	}
	key := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatChannel, ChatID: channelID, UserID: bob.ID}, identity.DefaultKeyOptions)
	if in, ok := w.stored(t, channelID, gapAsked.ID); !ok || in.key != key || in.user != bob.ID {
		t.Errorf("missed channel message stored as %+v (stored: %v), want session %s from %s", in, ok, key, bob.ID)
	}
	if got := w.srv.Identifies(); got != 2 {
		t.Errorf("identified %d times, want 2 (the first, and after the refused resume)", got)
	}
	if !strings.Contains(w.log.String(), "read what was missed") {
		t.Errorf("no log line about the missed messages:\n%s", w.log.String())
	}
}

// TestRestartReadsWhatWasSaidWhileDown: what users said while the daemon was stopped is read
// back from the history of the chats it took messages from (the store's recent chats) and
// answered once, in order, with its channel's identity; a message answered before the restart
// is not answered again.
func TestRestartReadsWhatWasSaidWhileDown(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	before := w.answeredInBoth(t)
	const threadID = "210000000000000002"
	w.srv.AddChannel(discordtest.Channel{ID: threadID, GuildID: guildID, Type: discordgo.ChannelTypeGuildPublicThread, ParentID: channelID, OwnerID: alice.ID, Name: "topic"})
	inThread := w.srv.Post(discordtest.UserMessage{ChannelID: threadID, Author: alice, Content: "in the thread", MentionBot: true})
	w.replyTo(t, threadID, inThread.ID)
	w.stop(t)

	down1 := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "while down"})
	down2 := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "still down"})
	downAsked := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "down, in the channel", MentionBot: true})
	downThread := w.srv.Post(discordtest.UserMessage{ChannelID: threadID, Author: bob, Content: "down, in the thread", MentionBot: true})
	w.start(t)
	w.srv.WaitReady(t)
	after := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "after"})

	w.replyTo(t, channelID, downAsked.ID)
	w.replyTo(t, dmID, after.ID)
	order := w.answered(dmID)
	if want := []string{before.ID, down1.ID, down2.ID, after.ID}; !slices.Equal(order, want) {
		t.Errorf("DM replies answer %v, want %v (each once, in order)", order, want)
	}
	if n := len(w.srv.Sent(channelID)); n != 2 {
		t.Errorf("bot posted %d messages in the channel, want 2: %q", n, contents(w.srv.Sent(channelID)))
	}
	key := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatChannel, ChatID: channelID, UserID: bob.ID}, identity.DefaultKeyOptions)
	if in, ok := w.stored(t, channelID, downAsked.ID); !ok || in.key != key {
		t.Errorf("channel message said while down stored as %+v (stored: %v), want session %s", in, ok, key)
	}
	w.replyTo(t, threadID, downThread.ID)
	threadKey := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatThread, ChatID: channelID, ThreadID: threadID}, identity.DefaultKeyOptions)
	if in, ok := w.stored(t, channelID, downThread.ID); !ok || in.key != threadKey || in.user != bob.ID {
		t.Errorf("thread message said while down stored as %+v (stored: %v), want session %s from %s", in, ok, threadKey, bob.ID)
	}
	if got := w.answered(threadID); !slices.Equal(got, []string{inThread.ID, downThread.ID}) {
		t.Errorf("thread replies answer %v, want %v", got, []string{inThread.ID, downThread.ID})
	}
}

// TestBackfillOff: with backfill_window 0 nothing said while the daemon was down is read back.
func TestBackfillOff(t *testing.T) {
	w := startWorld(t, echoAgent, func(c *config.Config) { c.Platforms.Discord.BackfillWindow = 0 })
	before := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "before"})
	w.replyTo(t, dmID, before.ID)
	w.stop(t)
	down := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "while down"})
	w.start(t)
	w.srv.WaitReady(t)
	after := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "after"})
	w.replyTo(t, dmID, after.ID) // a backfill would have run before the new session's first live event
	if _, ok := w.stored(t, dmID, down.ID); ok {
		t.Error("with backfill_window 0 a message said while down was taken")
	}
	if n := len(w.srv.Sent(dmID)); n != 2 {
		t.Errorf("bot posted %d messages in the DM, want 2 (before, after): %q", n, contents(w.srv.Sent(dmID)))
	}
}

// TestBackfillSkipsWhatIsOlderThanTheWindow: a message missed longer ago than backfill_window
// is not answered. The fake's clock moves a millisecond per message, so ten messages elsewhere
// age the missed one past a window of 3 ms.
func TestBackfillSkipsWhatIsOlderThanTheWindow(t *testing.T) {
	w := startWorld(t, echoAgent, func(c *config.Config) { c.Platforms.Discord.BackfillWindow = 3 * time.Millisecond })
	const elsewhere = "300000000000000002"
	w.srv.AddChannel(discordtest.Channel{ID: elsewhere, Type: discordgo.ChannelTypeDM})
	before := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "before"})
	w.replyTo(t, dmID, before.ID)
	w.srv.InvalidateSession()
	stale := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "long ago"})
	for i := range 10 {
		w.srv.Post(discordtest.UserMessage{ChannelID: elsewhere, Author: bob, Content: fmt.Sprint("elsewhere ", i)})
	}
	w.srv.WaitReady(t)
	after := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "after"})
	w.replyTo(t, dmID, after.ID)
	if _, ok := w.stored(t, dmID, stale.ID); ok {
		t.Error("a missed message older than backfill_window was taken")
	}
	if !strings.Contains(w.log.String(), "older_than_window=1") {
		t.Errorf("the log does not count the one message older than the window:\n%s", w.log.String())
	}
}

// TestBackfillWithoutHistoryPermission: when Discord refuses to show channel history (the bot
// lacks Read Message History), the bot says so once in its log and goes on serving live messages.
func TestBackfillWithoutHistoryPermission(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	w.answeredInBoth(t)
	w.srv.FailNext("GET", "/messages", http.StatusForbidden, 2) // the DM's and the channel's
	w.srv.InvalidateSession()
	w.srv.WaitReady(t)
	after := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "after"})
	w.replyTo(t, dmID, after.ID)
	var warnings []string
	for _, line := range strings.Split(w.log.String(), "\n") {
		if strings.Contains(line, "cannot read the history of some channels") {
			warnings = append(warnings, line)
		}
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "channels=2") || !strings.Contains(warnings[0], "403") ||
		!strings.Contains(warnings[0], "Read Message History") {
		t.Errorf("warnings about the history = %q, want one naming 2 channels, the 403 and the permission", warnings)
	}
}

// TestBackfillOfAGoneChannelIsNoWarning: a channel whose history Discord answers 404 (deleted,
// or a thread it refused to open) holds nothing to answer and lacks no permission: the backfill
// counts it gone in its INFO line, and warns of nothing. (Before, it warned that the bot
// needed the Read Message History permission.)
func TestBackfillOfAGoneChannelIsNoWarning(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	w.answeredInBoth(t)
	w.srv.FailNext("GET", "/messages", http.StatusNotFound, 2) // the DM's and the channel's
	w.srv.InvalidateSession()
	w.srv.WaitReady(t)
	after := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "after"})
	w.replyTo(t, dmID, after.ID)
	log := w.log.String()
	if strings.Contains(log, "cannot read the history") {
		t.Errorf("a gone channel was warned of:\n%s", log)
	}
	if !strings.Contains(log, "gone=2") {
		t.Errorf("the backfill's INFO line does not count the 2 gone channels:\n%s", log)
	}
}

// TestReadyzReportsDiscord: /readyz carries Discord's connection state, also across a
// disconnect. It also checks what the client identified with: the configured shard and the intents.
func TestReadyzReportsDiscord(t *testing.T) {
	w := startWorld(t, echoAgent, func(c *config.Config) {
		c.Platforms.Discord.ShardID, c.Platforms.Discord.ShardCount = 1, 2
	})
	if got := w.srv.Shard(); got != [2]int{1, 2} {
		t.Errorf("identified as shard %v, want [1 2]", got)
	}
	if got := w.srv.Intents(); got != discord.Intents {
		t.Errorf("intents = %d, want %d (guilds, guild messages, DMs, message content)", got, discord.Intents)
	}
	eventually(t, "/readyz reports Discord connected", func() bool {
		return strings.Contains(readyz(t, w), `"platform.discord":"ok"`)
	})
	w.srv.Disconnect()
	eventually(t, "a resume after the disconnect", func() bool { return w.srv.Resumes() > 0 })
	eventually(t, "Discord ready again after a disconnect", func() bool {
		return strings.Contains(readyz(t, w), `"platform.discord":"ok"`)
	})
}

// TestBadTokenLeavesOtherPlatformsServing: Discord refusing the token shows in /readyz while
// the HTTP platform keeps answering.
func TestBadTokenLeavesOtherPlatformsServing(t *testing.T) {
	w := startWorldNotReady(t, echoAgent, func(c *config.Config) { t.Setenv(tokenEnv, "not-the-token") })
	eventually(t, "/readyz reports Discord's refusal", func() bool {
		return strings.Contains(readyz(t, w), "platform.discord") && !strings.Contains(readyz(t, w), `"platform.discord":"ok"`)
	})
	resp, err := http.Post("http://"+w.d.Addr().String()+"/v1/messages?wait=10s", "application/json",
		strings.NewReader(`{"chat_id":"c1","user_id":"u1","text":"still here?"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "echo: still here?") {
		t.Errorf("HTTP platform answered %d %s while Discord was down", resp.StatusCode, body)
	}
}

// TestIdentityThroughDiscord is the identity test of the foundation issue run through Discord:
// sessions in DMs, channels (per user) and threads, several quick messages each, through an
// exec agent that prints its environment; every reply must carry exactly its own message's
// identity.
func TestIdentityThroughDiscord(t *testing.T) {
	script := filepath.Join(t.TempDir(), "agent.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nenv | grep '^AGENTGATE_' | sort\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	agent, err := agentexec.New(agentexec.Config{Command: []string{"/bin/sh", script}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	w := startWorld(t, agent, func(c *config.Config) { c.Platforms.Discord.RequireMention = false })
	type posted struct {
		msg   *discordgo.Message
		reply string // channel answered in
		src   identity.Source
	}
	var all []posted
	var mu sync.Mutex
	const sessionsPerKind, each = 12, 5
	for i := range sessionsPerKind {
		dm := fmt.Sprintf("32000000000000%04d", i)
		th := fmt.Sprintf("33000000000000%04d", i)
		w.srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
		w.srv.AddChannel(discordtest.Channel{ID: th, GuildID: guildID, Type: discordgo.ChannelTypeGuildPublicThread, ParentID: channelID, OwnerID: alice.ID})
	}
	for round := range each {
		for i := range sessionsPerKind {
			user := discordtest.User{ID: fmt.Sprintf("42000000000000%04d", i), Username: fmt.Sprintf("u%d", i)}
			dm := fmt.Sprintf("32000000000000%04d", i)
			th := fmt.Sprintf("33000000000000%04d", i)
			for _, p := range []posted{
				{reply: dm, src: identity.Source{ChatType: identity.ChatDM, ChatID: dm}},
				{reply: channelID, src: identity.Source{ChatType: identity.ChatChannel, ChatID: channelID, ScopeID: guildID}},
				{reply: th, src: identity.Source{ChatType: identity.ChatThread, ChatID: channelID, ThreadID: th, ScopeID: guildID}},
			} {
				p.msg = w.srv.Post(discordtest.UserMessage{ChannelID: p.reply, Author: user, Content: fmt.Sprintf("r%d", round)})
				p.src.Platform, p.src.UserID, p.src.UserName = discord.Name, user.ID, user.Username
				mu.Lock()
				all = append(all, p)
				mu.Unlock()
			}
		}
	}
	for _, p := range all {
		reply := w.replyTo(t, p.reply, p.msg.ID)
		env := map[string]string{}
		for line := range strings.Lines(reply.Content) {
			if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
				env[k] = v
			}
		}
		want := map[string]string{
			"AGENTGATE_PLATFORM": discord.Name, "AGENTGATE_CHAT_TYPE": p.src.ChatType, "AGENTGATE_CHAT_ID": p.src.ChatID,
			"AGENTGATE_THREAD_ID": p.src.ThreadID, "AGENTGATE_USER_ID": p.src.UserID, "AGENTGATE_USER_NAME": p.src.UserName,
			"AGENTGATE_MESSAGE_ID": p.msg.ID, "AGENTGATE_SESSION_KEY": identity.Key(p.src, identity.DefaultKeyOptions),
		}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("reply to %s (%s in %s): %s=%q, want %q", p.msg.ID, p.src.ChatType, p.reply, k, env[k], v)
			}
		}
	}
}

// eventually polls cond until it holds, failing the test after discordtest.WaitTimeout.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !poll(cond) {
		t.Fatalf("timed out waiting: %s", what)
	}
}

// poll reports whether cond holds within discordtest.WaitTimeout.
func poll(cond func() bool) bool {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(discordtest.WaitTimeout)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			return false
		}
	}
	return true
}

func readyz(t *testing.T, w *world) string {
	t.Helper()
	resp, err := http.Get("http://" + w.d.Addr().String() + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestThreadStarterMessageRunsNothing: the thread-starter message Discord posts in a thread
// opened from a message (type 21, even when it carries the message's text) is no second copy of
// the user's message: it is not stored and runs no turn (hermes #51057: the duplicate event
// triggered a second run).
func TestThreadStarterMessageRunsNothing(t *testing.T) {
	var runs atomic.Int32
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		runs.Add(1)
		return echoAgent(ctx, req)
	})
	w := startWorld(t, agent, func(c *config.Config) { c.Platforms.Discord.AutoThread = true })
	first := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "help me with Go", MentionBot: true})
	w.srv.WaitSent(t, first.ID, 1) // the thread's id is the message's
	starter := w.srv.Post(discordtest.UserMessage{ChannelID: first.ID, Author: alice, Content: "<@" + w.srv.BotID() + "> help me with Go",
		Type: discordgo.MessageTypeThreadStarterMessage})
	follow := w.srv.Post(discordtest.UserMessage{ChannelID: first.ID, Author: alice, Content: "and generics?"})
	w.replyTo(t, first.ID, follow.ID) // events are handled in order: the starter was seen before

	if _, ok := w.stored(t, channelID, starter.ID); ok {
		t.Errorf("the thread-starter message was stored")
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("the agent ran %d times, want 2 (the message and its follow-up)", n)
	}
	if got := contents(w.srv.Sent(first.ID)); len(got) != 2 {
		t.Errorf("the bot posted %q in the thread, want the two answers only", got)
	}
}

// TestReplyInAChannelStaysInItsSession: a user's reply to the bot's answer in a channel
// continues the user's session in that channel; the reply's reference never makes a thread or
// a session of its own (hermes #28153: reply-derived thread ids split one conversation). A
// reply whose author turned the client's "@ ON" off, which mentions no one, is answered too
// (found by an audit: it was dropped without a word).
func TestReplyInAChannelStaysInItsSession(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	asked := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "first", MentionBot: true})
	answer := w.replyTo(t, channelID, asked.ID)
	again := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "and then?", ReplyTo: answer.ID})
	answer = w.replyTo(t, channelID, again.ID)
	unpinged := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "and after that?", ReplyTo: answer.ID, NoPing: true})
	w.replyTo(t, channelID, unpinged.ID)

	a, okA := w.stored(t, channelID, asked.ID)
	b, okB := w.stored(t, channelID, again.ID)
	c, okC := w.stored(t, channelID, unpinged.ID)
	want := identity.Key(identity.Source{Platform: discord.Name, ChatType: identity.ChatChannel, ChatID: channelID, UserID: alice.ID}, identity.DefaultKeyOptions)
	if !okA || !okB || !okC || a.key != want || b != a || c != a {
		t.Errorf("message stored as %+v (%v), replies to the answers as %+v (%v) and %+v (%v); want all in one session of %s", a, okA, b, okB, c, okC, want)
	}
	if n := len(w.srv.Threads()); n != 0 {
		t.Errorf("%d threads opened, want none", n)
	}
}

// TestFailedHistoryReadIsRetried: when Discord answers the backfill's history read with a 5xx
// (a passing fault), the read is tried again: what was said while the daemon was down is
// answered, not lost because one request failed.
func TestFailedHistoryReadIsRetried(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	before := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "before"})
	w.replyTo(t, dmID, before.ID)
	w.stop(t)
	down := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "while down"})
	w.srv.FailNext("GET", "/channels/"+dmID+"/messages", 500, 1)
	w.start(t)
	w.replyTo(t, dmID, down.ID)
	if got := w.answered(dmID); !slices.Equal(got, []string{before.ID, down.ID}) {
		t.Errorf("DM replies answer %v, want %v", got, []string{before.ID, down.ID})
	}
}

// TestUnreadGapIsReadAtTheNextReady: when every try of the backfill's history read fails,
// the channel keeps the place where reading stopped, and the next new gateway session reads
// from there, although live messages came since: what was said while the bot was away is
// answered then, not skipped for good.
func TestUnreadGapIsReadAtTheNextReady(t *testing.T) {
	w := startWorld(t, echoAgent, nil)
	before := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "before"})
	w.replyTo(t, dmID, before.ID)
	w.stop(t)
	down := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "while down"})
	w.srv.FailNext("GET", "/channels/"+dmID+"/messages", 500, 5) // every try of the first backfill
	w.start(t)
	w.srv.WaitReady(t)
	live := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "live"})
	w.replyTo(t, dmID, live.ID) // held until the backfill gave up, then answered
	w.srv.InvalidateSession()
	w.replyTo(t, dmID, down.ID)
	if got := w.answered(dmID); !slices.Equal(got, []string{before.ID, live.ID, down.ID}) {
		t.Errorf("DM replies answer %v, want %v", got, []string{before.ID, live.ID, down.ID})
	}
}

// TestUnreadGapIsReadWhileTheSessionLasts: the unread gap a failed backfill left is read
// again while the gateway session lasts, without waiting for a new one (which may be days
// away, and the place where reading stopped does not survive a restart): what was said while
// the bot was away is answered, after the live messages taken meanwhile. A gap read that fails
// too is tried again later.
func TestUnreadGapIsReadWhileTheSessionLasts(t *testing.T) {
	discord.SetGapRetry(t, 50*time.Millisecond)
	for _, tc := range []struct {
		name     string
		failures int // of the history reads after the restart
	}{
		{"at the first gap read", 5},      // every try of the backfill
		{"at the second gap read", 5 + 1}, // and the first gap read's one try
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := startWorld(t, echoAgent, nil)
			before := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "before"})
			w.replyTo(t, dmID, before.ID)
			w.stop(t)
			down := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "while down"})
			w.srv.FailNext("GET", "/channels/"+dmID+"/messages", 500, tc.failures)
			w.start(t)
			w.srv.WaitReady(t)
			live := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "live"})
			w.replyTo(t, dmID, live.ID)
			w.replyTo(t, dmID, down.ID) // no new gateway session: the gap is read on its own
			if got := w.answered(dmID); !slices.Equal(got, []string{before.ID, live.ID, down.ID}) {
				t.Errorf("DM replies answer %v, want %v", got, []string{before.ID, live.ID, down.ID})
			}
		})
	}
}

// leaveUnreadGap answers a DM message, stops the daemon, has one said meanwhile (down), and
// starts it again with every try of its backfill's history read failing; a live message
// (live) is then taken, and the daemon records the place where reading stopped (after
// before). It returns the three messages.
func leaveUnreadGap(t *testing.T, w *world) (before, down, live *discordgo.Message) {
	t.Helper()
	before = w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "before"})
	w.replyTo(t, dmID, before.ID)
	w.stop(t)
	down = w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "while down"})
	w.srv.FailNext("GET", "/channels/"+dmID+"/messages", 500, 5) // every try of the backfill
	w.start(t)
	w.srv.WaitReady(t)
	live = w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "live"})
	w.replyTo(t, dmID, live.ID)
	eventually(t, "the unread place stored", func() bool {
		us, err := w.d.Store().Unread(t.Context(), discord.Name, 0)
		return err == nil && len(us) == 1 && us[0].ChatID == dmID && us[0].After == before.ID
	})
	return before, down, live
}

// TestUnreadGapSurvivesARestart: the place where a failed backfill stopped reading is kept in
// the store, so the daemon that starts next reads the gap, although the live message taken
// meanwhile moved the store's newest message of the chat past it. Before, the place lived in
// one process's memory: a restart while Discord's API failed (or another cluster member taking
// the gateway over) lost what was said in the gap without a trace. Once read, the place is
// cleared.
func TestUnreadGapSurvivesARestart(t *testing.T) {
	discord.SetGapRetry(t, time.Hour) // the first daemon never reads the gap again itself
	w := startWorld(t, echoAgent, nil)
	before, down, live := leaveUnreadGap(t, w)
	w.stop(t)

	w.start(t)
	w.replyTo(t, dmID, down.ID)
	if got := w.answered(dmID); !slices.Equal(got, []string{before.ID, live.ID, down.ID}) {
		t.Errorf("DM replies answer %v, want %v", got, []string{before.ID, live.ID, down.ID})
	}
	eventually(t, "the unread place cleared", func() bool {
		us, err := w.d.Store().Unread(t.Context(), discord.Name, 0)
		return err == nil && len(us) == 0
	})
}

// TestUnreadPlaceOlderThanTheWindowIsCleared: an unread place recorded longer ago than
// backfill_window holds only messages older than the window, which backfill does not answer:
// the next start clears it without reading there, so a place whose reads keep failing is not
// kept for ever. The fake's clock moves a millisecond per message.
func TestUnreadPlaceOlderThanTheWindowIsCleared(t *testing.T) {
	discord.SetGapRetry(t, time.Hour)
	w := startWorld(t, echoAgent, func(c *config.Config) { c.Platforms.Discord.BackfillWindow = 100 * time.Millisecond })
	const elsewhere = "300000000000000002"
	w.srv.AddChannel(discordtest.Channel{ID: elsewhere, Type: discordgo.ChannelTypeDM})
	_, down, _ := leaveUnreadGap(t, w)
	w.stop(t)
	for i := range 150 { // the place ages past the window
		w.srv.Post(discordtest.UserMessage{ChannelID: elsewhere, Author: bob, Content: fmt.Sprint("elsewhere ", i)})
	}

	reads := w.srv.Requests("GET", "/channels/"+dmID+"/messages")
	w.start(t)
	w.srv.WaitReady(t)
	after := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "after"})
	w.replyTo(t, dmID, after.ID) // live messages wait for the backfill: it is done
	eventually(t, "the stale unread place cleared", func() bool {
		us, err := w.d.Store().Unread(t.Context(), discord.Name, 0)
		return err == nil && len(us) == 0
	})
	if _, ok := w.stored(t, dmID, down.ID); ok {
		t.Error("a message of a place older than backfill_window was taken")
	}
	if n := w.srv.Requests("GET", "/channels/"+dmID+"/messages") - reads; n != 0 {
		t.Errorf("the start read the DM's history %d times, want none (its only unread place is older than the window)", n)
	}
}

// TestMessageDuringStopIsAnsweredAfterTheRestart: a message that arrives while the daemon
// drains is not taken, and the next start's backfill reads it back and answers it (the store
// took nothing newer from its chat). So its sender is not told to send it again: before, they
// were, and then got the answer all the same, twice if they did as told.
func TestMessageDuringStopIsAnsweredAfterTheRestart(t *testing.T) {
	w, slow, finishStop := drainingWithATurn(t)
	during := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "during the stop"})
	eventually(t, "the message handled during the drain", func() bool {
		return strings.Contains(w.log.String(), "message_id="+during.ID)
	})
	finishStop()

	w.start(t)
	w.replyTo(t, dmID, during.ID)
	for _, m := range w.srv.Sent(dmID) {
		if strings.Contains(m.Content, "did not take") {
			t.Errorf("the bot said %q, and then answered the message", m.Content)
		}
	}
	if got := w.answered(dmID); !slices.Equal(got, []string{slow.ID, during.ID}) {
		t.Errorf("DM replies answer %v, want %v (each once)", got, []string{slow.ID, during.ID})
	}
}

// TestMessageDuringStopInANewChatIsRefused: a message that comes while the daemon stops, in a
// chat the store never took a message from, is not left for the next start: its backfill
// reads only the chats the store knows, and the message would be lost without a word. Its
// sender is told to send it again. (Before, it was logged as one the next start reads back.)
func TestMessageDuringStopInANewChatIsRefused(t *testing.T) {
	w, _, finishStop := drainingWithATurn(t)
	const newDM = "300000000000000077"
	w.srv.AddChannel(discordtest.Channel{ID: newDM, Type: discordgo.ChannelTypeDM})
	during := w.srv.Post(discordtest.UserMessage{ChannelID: newDM, Author: bob, Content: "hello, first time"})
	w.srv.WaitFor(t, "the sender told", func() bool {
		for _, m := range w.srv.Sent(newDM) {
			if strings.Contains(m.Content, "did not take") {
				return true
			}
		}
		return false
	})
	finishStop()
	w.start(t)
	// A message in a known chat is answered after the start's backfill (read back with it, or
	// held until it is done): once it is, the backfill has read back all it would.
	after := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "after the restart"})
	w.replyTo(t, dmID, after.ID)
	for _, m := range w.srv.Sent(newDM) {
		if !strings.Contains(m.Content, "did not take") {
			t.Errorf("the bot said %q in the new DM, where it told %s to send the message again", m.Content, during.ID)
		}
	}
}

// slowOnCue is the echo agent, but a turn of the message "slow" waits until release is closed
// (or its ctx ends).
func slowOnCue() (agent agents.Agent, release chan struct{}) {
	release = make(chan struct{})
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		if req.Messages[0].Text == "slow" {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return echoAgent(ctx, req)
	}), release
}

// drainingWithATurn starts a world whose daemon is stopping, held in its drain by a turn
// (slow, in the DM) until finishStop, which lets the turn end and waits for the stop.
func drainingWithATurn(t *testing.T) (w *world, slow *discordgo.Message, finishStop func()) {
	t.Helper()
	agent, release := slowOnCue()
	w = startWorld(t, agent, nil)
	slow = w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "slow"})
	w.srv.WaitFor(t, "the slow turn typing", func() bool { return w.srv.Typing(dmID) > 0 })
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		w.stop(t)
	}()
	eventually(t, "the daemon draining", func() bool { return strings.Contains(w.log.String(), `msg="http platform draining"`) })
	return w, slow, func() {
		close(release)
		<-stopped
	}
}

// TestNewGatewaySessionReadsANewAutoThread: a thread the bot opened for a mention is read
// back after a lost gateway session like the chats it saw messages in, even when it saw none
// there (its own reply was posted in the gap too): what is said there meanwhile is answered
// once the bot is back.
func TestNewGatewaySessionReadsANewAutoThread(t *testing.T) {
	w := startWorld(t, echoAgent, func(c *config.Config) { c.Platforms.Discord.AutoThread = true })
	release := make(chan struct{})
	w.srv.HoldNext("POST", "/messages", release, 1) // the reply in the thread waits
	asked := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "help me", MentionBot: true})
	w.srv.WaitFor(t, "the thread opened and its reply on its way", func() bool {
		return len(w.srv.Threads()) == 1 && w.srv.Requests("POST", "/channels/"+asked.ID+"/messages") == 1
	})
	w.srv.InvalidateSession()
	gap := w.srv.Post(discordtest.UserMessage{ChannelID: asked.ID, Author: alice, Content: "in the thread, in the gap"})
	close(release)
	w.replyTo(t, asked.ID, gap.ID)
	if got := w.answered(asked.ID); !slices.Equal(got, []string{gap.ID}) {
		t.Errorf("thread replies answer %v, want %v", got, []string{gap.ID})
	}
}

// TestBackfillReadsTheThreadItOpens: a mention read back at a start opens its auto-thread,
// which the same backfill then reads too: the thread may exist already (a daemon that stopped
// opened it before taking the message), and what was said in it meanwhile is answered.
func TestBackfillReadsTheThreadItOpens(t *testing.T) {
	w := startWorld(t, echoAgent, func(c *config.Config) { c.Platforms.Discord.AutoThread = true })
	first := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "first", MentionBot: true})
	w.srv.WaitSent(t, first.ID, 1)
	w.stop(t)
	asked := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "second", MentionBot: true})
	// The stopping daemon opened the thread, and then did not take the message.
	w.srv.AddChannel(discordtest.Channel{ID: asked.ID, GuildID: guildID, Type: discordgo.ChannelTypeGuildPublicThread,
		ParentID: channelID, OwnerID: w.srv.BotID(), Name: "second"})
	inThread := w.srv.Post(discordtest.UserMessage{ChannelID: asked.ID, Author: alice, Content: "in the thread"})
	w.start(t)
	w.replyTo(t, asked.ID, inThread.ID)
}

// TestUnreadGapReadWhileStoppingIsKept: a gap read while the daemon drains (a new gateway
// session's backfill) finds the gap's message, which the runtime no longer takes; it is left
// for the next start to read back. So the unread place must stay in the store: the live message
// taken meanwhile moved the chat's newest stored message past the gap, and without the place
// the next start reads after it, and the message left for it is lost without a word (its
// sender was not told, since it was to be read back).
func TestUnreadGapReadWhileStoppingIsKept(t *testing.T) {
	discord.SetGapRetry(t, time.Hour) // the gap is read by the READYs only
	agent, release := slowOnCue()
	w := startWorld(t, agent, nil)
	const elsewhere = "300000000000000002"
	w.srv.AddChannel(discordtest.Channel{ID: elsewhere, Type: discordgo.ChannelTypeDM})
	_, down, _ := leaveUnreadGap(t, w)

	// The daemon drains, held by a turn in another chat; a new gateway session reads the gap.
	w.srv.Post(discordtest.UserMessage{ChannelID: elsewhere, Author: bob, Content: "slow"})
	w.srv.WaitFor(t, "the slow turn typing", func() bool { return w.srv.Typing(elsewhere) > 0 })
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		w.stop(t)
	}()
	eventually(t, "the daemon draining", func() bool { return strings.Contains(w.log.String(), `msg="http platform draining"`) })
	w.srv.InvalidateSession()
	eventually(t, "the gap's message handled during the drain", func() bool {
		return strings.Contains(w.log.String(), "message_id="+down.ID)
	})
	close(release)
	<-stopped

	w.start(t)
	after := w.srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "after the restart"})
	w.replyTo(t, dmID, after.ID) // live messages wait for the backfill: it is done
	if _, ok := w.stored(t, dmID, down.ID); !ok {
		t.Fatalf("the gap's message, left for the next start while the daemon stopped, was never taken (unread places: %v)",
			check2(w.d.Store().Unread(t.Context(), discord.Name, 0)))
	}
	w.replyTo(t, dmID, down.ID)
	for _, m := range w.srv.Sent(dmID) {
		if strings.Contains(m.Content, "did not take") {
			t.Errorf("the bot said %q, and then answered the message", m.Content)
		}
	}
}

func check2[T any](v T, err error) any {
	if err != nil {
		return err
	}
	return v
}

// TestRepliesPingNobody: an agent that echoes "@everyone", "@here", a role or a user mention
// (a user's text, or its own carelessness) pings no one, in any part of a split reply, and
// its reply to a message does not ping that message's author either. The fake server works
// out a message's mentions from its allowed_mentions as Discord does (without one, the same
// text pings the users named and everyone: discordtest's TestSendReplyEditTyping).
func TestRepliesPingNobody(t *testing.T) {
	loud := "@everyone @here <@" + alice.ID + "> <@!" + bob.ID + "> <@&500000000000000001> look"
	agent := agents.Func(func(_ context.Context, _ *agents.Request) (*agents.Response, error) {
		return &agents.Response{Text: loud + "\n\n" + strings.Repeat("word ", 500) + "\n\n" + loud}, nil
	})
	w := startWorld(t, agent, nil)
	w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: bob, Content: "hi"}) // bob is a known user
	asked := w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "ping them all", MentionBot: true})
	w.replyTo(t, channelID, asked.ID)
	sent := w.srv.WaitSent(t, channelID, 2)
	for i, m := range sent {
		if !strings.Contains(m.Content, "@everyone") {
			t.Errorf("part %d = %q, want the agent's text as it wrote it", i+1, m.Content)
		}
		if len(m.Mentions) != 0 || m.MentionEveryone || len(m.MentionRoles) != 0 {
			t.Errorf("part %d pings users %v, everyone %v, roles %v; want no one", i+1, m.Mentions, m.MentionEveryone, m.MentionRoles)
		}
	}
}
