package discord

import (
	"context"
	"fmt"
	"testing"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestManyChannelsLeaveNothingBehind: DMs in many channels, each answered, leave the platform
// holding nothing per channel but what it keeps on purpose (the newest message of at most
// backfillChannels channels): no typing indicator, no partial send, no rate limit, no held
// message.
func TestManyChannelsLeaveNothingBehind(t *testing.T) {
	const channels = 300
	srv := discordtest.New(t)
	p, err := New(Config{Token: srv.Token(), Settings: config.Discord{APIURL: srv.APIURL()}})
	if err != nil {
		t.Fatal(err)
	}
	in := make(chan *platforms.Inbound, channels)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- p.Run(ctx, func(_ context.Context, m *platforms.Inbound) (*platforms.Ack, error) {
			in <- m
			return &platforms.Ack{Disposition: platforms.Started}, nil
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	srv.WaitReady(t)
	user := discordtest.User{ID: "400000000000000001", Username: "alice"}
	for i := range channels {
		dm := fmt.Sprint(300000000000000000 + i)
		srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
		srv.Post(discordtest.UserMessage{ChannelID: dm, Author: user, Content: "hello"})
		m := <-in
		out := &platforms.Outbound{SessionKey: "agent:main:discord:dm:" + dm, Seq: 1, Text: "the reply", TurnEnd: true,
			InReplyTo: []string{m.MessageID}, Target: m.Source}
		if err := p.Send(t.Context(), out); err != nil {
			t.Fatalf("Send to channel %d: %v", i, err)
		}
	}
	p.typing.mu.Lock()
	typing := len(p.typing.chans)
	p.typing.mu.Unlock()
	p.mu.Lock()
	progress, limited, held, seen := len(p.progress), len(p.limited), len(p.held), len(p.seen)
	p.mu.Unlock()
	if typing != 0 || progress != 0 || limited != 0 || held != 0 || seen > backfillChannels {
		t.Errorf("after %d channels answered the platform holds %d typing indicators, %d partial sends, %d rate limits, "+
			"%d held messages and %d seen channels; want none, and at most %d seen", channels, typing, progress, limited, held, seen, backfillChannels)
	}
}
