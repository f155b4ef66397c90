package discord

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestNewSessionReadsAChatAnotherMemberTook: a cluster member that lets the gateway go and
// takes it back later identifies afresh, and its READY reads back the chats the store took a
// message from meanwhile, not only those it knew: another member took a message in a channel
// new to this one, and died; what users said there while nobody held the gateway is answered,
// once. Before, the store's chats were read at the first READY of the process only, and the
// gap's messages in the new channel were never answered, without a word.
func TestNewSessionReadsAChatAnotherMemberTook(t *testing.T) {
	const newChannel = "200000000000000002"
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	h := newHeldDelivery()
	srv := discordtest.New(t) // Discord's heartbeat interval: nothing here waits for a heartbeat, and a short one drops a loaded run's connection (five missed ACKs)
	srv.AddGuild(recentGuild, "guild")
	srv.AddChannel(discordtest.Channel{ID: recentChannel, GuildID: recentGuild, Type: discordgo.ChannelTypeGuildText, Name: "general"})
	srv.AddChannel(discordtest.Channel{ID: newChannel, GuildID: recentGuild, Type: discordgo.ChannelTypeGuildText, Name: "new"})
	var mu sync.Mutex // guards marks, the store's recent chats
	marks := []persistence.ChatMark{{ChatID: recentChannel, ScopeID: recentGuild, MessageID: "1", At: srv.Now()}}
	log := &testutil.Buffer{}
	p, err := New(Config{
		Token:    srv.Token(),
		Settings: config.Discord{APIURL: srv.APIURL(), BackfillWindow: time.Hour},
		Logger:   slog.New(slog.NewTextHandler(log, nil)),
		Now:      srv.Now,
		Recent: func(context.Context, time.Time) ([]persistence.ChatMark, error) {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(marks), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	p.SetWithdraw(h.withdraw, nil)
	// run runs the platform as the gateway's holder until the returned func ends Run's ctx
	// with cause: platforms.ErrLetGo when the member lets the gateway go.
	run := func() (end func(cause error)) {
		ctx, cancel := context.WithCancelCause(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx, h.deliver) }()
		var once sync.Once
		end = func(cause error) {
			once.Do(func() {
				cancel(cause)
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			})
		}
		t.Cleanup(func() { end(nil) })
		return end
	}
	backfills := func() int { return strings.Count(log.String(), "read what was missed") }

	letGo := run()
	srv.WaitReady(t)
	pollFor(t, "the first READY's backfill", func() bool { return backfills() == 1 })
	letGo(platforms.ErrLetGo)
	srv.InvalidateSession() // the next holder identifies afresh: nothing is replayed

	// Another member holds the gateway: the store takes a message of the new channel from it.
	taken := srv.Post(discordtest.UserMessage{ChannelID: newChannel, Author: alice, Content: "taken by another member"})
	mu.Lock()
	marks = append(marks, persistence.ChatMark{ChatID: newChannel, ScopeID: recentGuild, MessageID: taken.ID, At: srv.Now()})
	mu.Unlock()
	// It dies; nobody holds the gateway while alice goes on.
	srv.Post(discordtest.UserMessage{ChannelID: newChannel, Author: alice, Content: "said while nobody held the gateway"})

	stop := run() // this member takes the gateway back
	srv.WaitReady(t)
	pollFor(t, "the second READY's backfill", func() bool { return backfills() == 2 })
	srv.Post(discordtest.UserMessage{ChannelID: recentChannel, Author: alice, Content: "live"})
	pollFor(t, "the live message delivered", func() bool { texts, _, _ := h.got(); return slices.Contains(texts, "live") })
	stop(nil)

	texts, _, _ := h.got()
	if want := []string{"said while nobody held the gateway", "live"}; !slices.Equal(texts, want) {
		t.Errorf("delivered %q, want %q (the gap in the channel another member took, once, then the live one)", texts, want)
	}
	if n := srv.Identifies(); n != 2 {
		t.Errorf("identified %d times, want 2", n)
	}
}
