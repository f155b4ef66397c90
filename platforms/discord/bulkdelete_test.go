package discord_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestBulkDeletedQueuedMessagesAreNotAnswered: a moderator's purge (MESSAGE_DELETE_BULK) of
// messages that wait behind running turns, in two users' sessions of one channel, takes each of
// them back: none runs or is answered, and their rows are archived; the messages before and
// after them are answered, and chatter the bot never took, purged with them, changes nothing.
// Before, nothing handled MESSAGE_DELETE_BULK, and the purged messages were answered.
func TestBulkDeletedQueuedMessagesAreNotAnswered(t *testing.T) {
	a := newHeldAgent()
	w := startWorld(t, a.agent(), nil)
	post := func(from discordtest.User, text string, mention bool) *discordgo.Message {
		return w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: from, Content: text, MentionBot: mention})
	}
	firstA, firstB := post(alice, "alice first", true), post(bob, "bob first", true)
	eventually(t, "both held turns running", func() bool { return len(a.ran()) == 2 })
	purgedA, purgedB := post(alice, "purged alice", true), post(bob, "purged bob", true)
	chatter := post(bob, "purged chatter", false)
	thirdA, thirdB := post(alice, "alice third", true), post(bob, "bob third", true)
	w.mustRow(t, channelID, thirdB.ID, "the last message stored", func(active, _ bool) bool { return active })
	w.srv.DeleteBulk(purgedA.ID, chatter.ID, purgedB.ID)
	for _, m := range []*discordgo.Message{purgedA, purgedB} {
		w.mustRow(t, channelID, m.ID, "the purged message's row archived", func(active, archived bool) bool { return !active && archived })
	}
	close(a.release)
	for _, m := range []*discordgo.Message{firstA, firstB, thirdA, thirdB} {
		w.replyTo(t, channelID, m.ID)
	}
	for _, m := range w.srv.Sent(channelID) {
		if strings.Contains(m.Content, "purged") {
			t.Errorf("bot posted %q for a purged message", m.Content)
		}
	}
	var ran []string
	for _, texts := range a.ran() {
		ran = append(ran, texts...)
	}
	slices.Sort(ran)
	if want := []string{"alice first", "alice third", "bob first", "bob third"}; !slices.Equal(ran, want) {
		t.Errorf("agent ran %q, want %q", ran, want)
	}
}

// TestBulkDeleteWaitsOnceForAllItsMessages: the withdrawals of a purge's messages are asked all
// at once and share one deadline, so that a purge of many messages whose sessions answer slowly
// holds the gateway reader the 5 s of one withdrawal, not 5 s for each; their failures are
// logged in one line. Before the fix this test went in with, they were asked one after another
// (here: the first waited its 5 s for the others, which were not asked yet).
func TestBulkDeleteWaitsOnceForAllItsMessages(t *testing.T) {
	const n = 20
	var (
		mu        sync.Mutex
		asked     []string
		deadlines = map[time.Time]bool{}
		all       = make(chan struct{}) // closed once every withdrawal has been asked
	)
	srv, log, take := mustRunWithWithdraw(t, func(ctx context.Context, src identity.Source, id string) (bool, error) {
		mu.Lock()
		asked = append(asked, id)
		dl, _ := ctx.Deadline()
		deadlines[dl] = true
		if len(asked) == n {
			close(all)
		}
		odd := len(asked)%2 == 1
		mu.Unlock()
		if src.ChatID != channelID || src.UserID != alice.ID {
			t.Errorf("withdrawal of %s with source %+v, want alice's in %s", id, src, channelID)
		}
		select { // a session that answers only once the others have been asked
		case <-all:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		if odd {
			return false, errors.New("injected: the session could not answer")
		}
		return true, nil
	})
	var ids []string
	for range n {
		m := srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "queued", MentionBot: true})
		take("queued")
		ids = append(ids, m.ID)
	}
	chatter := srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "not for the bot"})
	srv.DeleteBulk(append(slices.Clone(ids), chatter.ID)...)
	select {
	case <-all:
	case <-time.After(discordtest.WaitTimeout):
		mu.Lock()
		got := len(asked)
		mu.Unlock()
		t.Fatalf("%d of the %d withdrawals of the purge asked at once, want all", got, n)
	}
	srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "after", MentionBot: true})
	take("after") // the gateway reader went on
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(asked)
	if !slices.Equal(asked, ids) {
		t.Errorf("withdrawals asked for %v, want the purged messages the platform delivered %v", asked, ids)
	}
	if len(deadlines) != 1 {
		t.Errorf("the withdrawals had %d deadlines, want one for them all", len(deadlines))
	}
	logged := log.String()
	const failed = "discord messages deleted in bulk but not withdrawn; they are answered"
	if got := strings.Count(logged, failed); got != 1 || !strings.Contains(logged, "messages=10 deleted=21") {
		t.Errorf("%q logged %d times, want once with messages=10 deleted=21:\n%s", failed, got, logged)
	}
	if !strings.Contains(logged, "discord messages deleted in bulk before their turns; withdrawn") {
		t.Errorf("the withdrawn messages are not logged:\n%s", logged)
	}
}

// TestBulkDeleteCountsAPanickedWithdrawalAsFailed: a withdrawal of a purge's message that
// panics is logged with its stack and counted with the failures in the purge's line (the
// message is answered, as when its session could not take it back). Before, it was counted
// neither way: the line said the purge's other messages all went back, and none failed.
func TestBulkDeleteCountsAPanickedWithdrawalAsFailed(t *testing.T) {
	var boom atomic.Pointer[string] // the id whose withdrawal panics
	srv, log, take := mustRunWithWithdraw(t, func(_ context.Context, _ identity.Source, id string) (bool, error) {
		if b := boom.Load(); b != nil && *b == id {
			panic("injected: the withdrawal failed")
		}
		return true, nil
	})
	var ids []string
	for range 3 {
		ids = append(ids, srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "queued", MentionBot: true}).ID)
		take("queued")
	}
	boom.Store(&ids[1])
	srv.DeleteBulk(ids...)
	srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "after", MentionBot: true})
	take("after") // the gateway reader went on, past the purge
	logged := log.String()
	if !strings.Contains(logged, "discord event handling panicked; the event is dropped") || !strings.Contains(logged, "message_id="+ids[1]) {
		t.Errorf("the panic is not logged with the message it withdrew:\n%s", logged)
	}
	line := func(msg string) string {
		for l := range strings.Lines(logged) {
			if strings.Contains(l, msg) {
				return l
			}
		}
		return ""
	}
	failed := line("discord messages deleted in bulk but not withdrawn; they are answered")
	if !strings.Contains(failed, "messages=1 deleted=3") || !strings.Contains(failed, "withdraw panicked: injected") {
		t.Errorf("the purge's line does not count the panicked withdrawal as failed: got %q, want messages=1 deleted=3 and its panic\n%s", failed, logged)
	}
	if withdrawn := line("discord messages deleted in bulk before their turns; withdrawn"); !strings.Contains(withdrawn, "messages=2 deleted=3") {
		t.Errorf("the purge's other messages logged as %q, want messages=2 deleted=3 withdrawn", withdrawn)
	}
}

// mustRunWithWithdraw runs a Discord platform against a fake Discord with one guild channel,
// logging at Debug, with withdraw as the runtime's withdrawal and a runtime that queues every
// message it is delivered, until the test ends. take waits for the delivery of a message and
// fails the test unless its text is want.
func mustRunWithWithdraw(t *testing.T, withdraw platforms.Withdraw) (srv *discordtest.Server, log *testutil.Buffer, take func(want string)) {
	t.Helper()
	srv = discordtest.New(t)
	srv.AddGuild(guildID, "guild")
	srv.AddChannel(discordtest.Channel{ID: channelID, GuildID: guildID, Type: discordgo.ChannelTypeGuildText, Name: "general"})
	log = &testutil.Buffer{}
	settings := config.Default().Platforms.Discord
	settings.APIURL = srv.APIURL()
	p, err := discord.New(discord.Config{Token: srv.Token(), Settings: settings, Now: srv.Now,
		Logger: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	p.SetWithdraw(withdraw, nil)
	delivered := make(chan string, 64)
	deliver := func(_ context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
		delivered <- in.Text
		return &platforms.Ack{MessageID: in.MessageID, Disposition: "queued"}, nil
	}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_ = p.Run(ctx, deliver)
	}()
	t.Cleanup(func() {
		cancel()
		<-ran
	})
	srv.WaitReady(t)
	take = func(want string) {
		t.Helper()
		select {
		case got := <-delivered:
			if got != want {
				t.Fatalf("delivered %q, want %q", got, want)
			}
		case <-time.After(discordtest.WaitTimeout):
			t.Fatalf("%q was never delivered\n%s", want, log.String())
		}
	}
	return srv, log, take
}

// inboundReads is a store that counts its reads by the index of inbound ids: FindInbound's by
// message id, and FindInbounds's calls with their ids.
type inboundReads struct {
	persistence.Store
	mu    sync.Mutex
	one   map[string]int
	many  [][]string
	count bool
}

func (r *inboundReads) FindInbound(ctx context.Context, platform, chatID, messageID string) (*persistence.Message, error) {
	r.mu.Lock()
	if r.count {
		r.one[messageID]++
	}
	r.mu.Unlock()
	return r.Store.FindInbound(ctx, platform, chatID, messageID)
}

func (r *inboundReads) FindInbounds(ctx context.Context, platform, chatID string, ids []string) ([]persistence.Message, error) {
	r.mu.Lock()
	if r.count {
		r.many = append(r.many, slices.Clone(ids))
	}
	r.mu.Unlock()
	return r.Store.FindInbounds(ctx, platform, chatID, ids)
}

// TestBulkDeleteOfMessagesTakenBeforeARestartReadsTheStoreOnce: a moderator's purge of messages
// taken before a restart, which wait in two users' sessions behind turns that run again, and of
// chatter the bot never took, withdraws every one of those messages (none is answered, their
// rows are archived) with one read of the store's index of inbound ids for the whole purge.
// Before, each id cost its own read (FindInbound), and its session's one more.
func TestBulkDeleteOfMessagesTakenBeforeARestartReadsTheStoreOnce(t *testing.T) {
	a := &heldOnRestart{release: make(chan struct{}), started: make(chan struct{}, 4)}
	w := startWorld(t, a.agent(), func(c *config.Config) { c.Shutdown.DrainTimeout = 0 })
	post := func(from discordtest.User, text string, mention bool) *discordgo.Message {
		return w.srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: from, Content: text, MentionBot: mention})
	}
	firstA, firstB := post(alice, "alice first", true), post(bob, "bob first", true)
	<-a.started
	<-a.started
	var purged []string
	for i := range 3 {
		purged = append(purged, post(alice, fmt.Sprint("purged alice ", i), true).ID, post(bob, fmt.Sprint("purged bob ", i), true).ID)
	}
	chatter := post(bob, "purged chatter", false)
	w.mustRow(t, channelID, purged[len(purged)-1], "the last message to purge stored", func(active, _ bool) bool { return active })
	w.stop(t)
	reads := &inboundReads{one: map[string]int{}}
	w.wrapStore = func(s persistence.Store) persistence.Store { reads.Store = s; return reads }
	w.start(t)
	w.srv.WaitReady(t)
	<-a.started // the first turns run again, the others wait behind them
	<-a.started
	eventually(t, "the start's backfill done", func() bool { return strings.Contains(w.log.String(), "read what was missed") })
	reads.mu.Lock()
	reads.count = true
	reads.mu.Unlock()
	w.srv.DeleteBulk(append(slices.Clone(purged), chatter.ID)...)
	// The intake hands on in order: once a later message is stored, the purge's withdrawals
	// have returned.
	third := post(alice, "alice third", true)
	w.mustRow(t, channelID, third.ID, "third stored", func(active, _ bool) bool { return active })
	reads.mu.Lock()
	one, many := maps.Clone(reads.one), slices.Clone(reads.many)
	reads.count = false
	reads.mu.Unlock()
	for _, id := range purged {
		if m, err := w.d.Store().FindInbound(t.Context(), "discord", channelID, id); err != nil || m.Active || !m.Archived {
			t.Errorf("the purged message %s's row = %+v (err %v), want it archived", id, m, err)
		}
	}
	want := append(slices.Clone(purged), chatter.ID)
	slices.Sort(want)
	if len(many) != 1 || !slices.Equal(slices.Sorted(slices.Values(many[0])), want) {
		t.Errorf("the purge read the store's index of inbound ids with %v, want once with all its ids %v", many, want)
	}
	for _, id := range want {
		if one[id] != 0 {
			t.Errorf("the purge read the store for %s alone %d times, want none: %v", id, one[id], one)
		}
	}
	close(a.release)
	w.replyTo(t, channelID, firstA.ID)
	w.replyTo(t, channelID, firstB.ID)
	w.replyTo(t, channelID, third.ID)
	for _, m := range w.srv.Sent(channelID) {
		if strings.Contains(m.Content, "purged") {
			t.Errorf("bot posted %q for a purged message", m.Content)
		}
	}
}
