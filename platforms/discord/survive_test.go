package discord_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
	"github.com/bwmarrin/discordgo"
)

// TestAPanicOnOneMessageSparesTheOthers: a panic while a message is handled (here, in the
// runtime it is delivered to) drops that message, logged with its ids, and nothing else: the
// gateway's next messages are taken, and so are those read back after a lost gateway session,
// where a message that panics comes before others in the same backfill. Before, the panic
// ended the process, and the backfill at its next start read the message back and ended it
// again.
func TestAPanicOnOneMessageSparesTheOthers(t *testing.T) {
	srv := discordtest.New(t)
	srv.AddChannel(discordtest.Channel{ID: dmID, Type: discordgo.ChannelTypeDM})
	log := &testutil.Buffer{}
	settings := config.Default().Platforms.Discord
	settings.APIURL = srv.APIURL()
	p, err := discord.New(discord.Config{Token: srv.Token(), Settings: settings, Now: srv.Now,
		Logger: slog.New(slog.NewTextHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	taken := make(chan string, 16)
	deliver := func(_ context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
		if strings.HasPrefix(in.Text, "boom") {
			panic("injected: the runtime failed on " + in.Text)
		}
		taken <- in.Text
		return &platforms.Ack{MessageID: in.MessageID, Disposition: "started"}, nil
	}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { // as the platform actor does: a lost gateway session ends Run
		for ctx.Err() == nil {
			_ = p.Run(ctx, deliver)
		}
		ran <- nil
	}()
	defer func() {
		cancel()
		<-ran
	}()
	srv.WaitReady(t)
	expect := func(want string) {
		t.Helper()
		select {
		case got := <-taken:
			if got != want {
				t.Fatalf("took %q, want %q", got, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%q was never taken\n%s", want, log.String())
		}
	}

	boom := srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "boom live"})
	srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "live after"})
	expect("live after")

	srv.InvalidateSession() // Discord replays nothing: the platform reads the gap back
	srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "boom in the gap"})
	srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "gap after"})
	srv.WaitReady(t)
	srv.Post(discordtest.UserMessage{ChannelID: dmID, Author: alice, Content: "after the gap"})
	expect("gap after")
	expect("after the gap")

	// Each boom's sender is told (the runtime never took it), in reply to it; no one else is.
	notices := map[string]int{}
	for _, sent := range srv.WaitSent(t, dmID, 2) {
		if strings.HasPrefix(sent.Content, "Something went wrong on my side") && sent.MessageReference != nil {
			notices[sent.MessageReference.MessageID]++
		}
	}
	if len(notices) != 2 || notices[boom.ID] != 1 {
		t.Errorf("notices of a dropped message, by the message they answer: %v; want one to each boom (%s first)", notices, boom.ID)
	}

	logged := log.String()
	if n := strings.Count(logged, "discord event handling panicked; the event is dropped"); n != 2 {
		t.Errorf("%d panics logged, want 2 (one per boom):\n%s", n, logged)
	}
	if !strings.Contains(logged, "message_id="+boom.ID) || !strings.Contains(logged, "injected: the runtime failed on boom live") {
		t.Errorf("the log does not name the dropped message and its panic:\n%s", logged)
	}
}
