package discord

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// restBucketCount counts the buckets the platform's REST calls keep in discordgo's limiters:
// the Session's own and the platform's (restBuckets).
func (p *Platform) restBucketCount() int {
	n := bucketCount(p.s.Ratelimiter)
	p.buckets.mu.Lock()
	defer p.buckets.mu.Unlock()
	return n + bucketCount(p.buckets.lim)
}

// bucketCount is the size of a discordgo limiter's bucket map, which it never shrinks.
func bucketCount(lim *discordgo.RateLimiter) int {
	if lim == nil {
		return 0
	}
	lim.Lock()
	defer lim.Unlock()
	return reflect.ValueOf(lim).Elem().FieldByName("buckets").Len()
}

// TestRESTBucketsFollowTheActiveChannels: the rate-limit buckets of the REST calls are kept per
// channel (and per message for an auto-thread's opening), and discordgo keeps every bucket it
// was ever asked for. Replies to many channels, one each (DMs and threads the bot answered
// once, over months), leave at most maxBuckets of them. Before, one limiter for the Session's
// life held a bucket for every channel the bot ever posted, typed or looked up in.
func TestRESTBucketsFollowTheActiveChannels(t *testing.T) {
	const channels = 600
	defer func(n int) { maxBuckets = n }(maxBuckets)
	maxBuckets = 100
	srv := discordtest.New(t)
	p, err := New(Config{Token: srv.Token(), Settings: config.Discord{APIURL: srv.APIURL()}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range channels {
		dm := fmt.Sprint(300000000000000000 + i)
		srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
		out := &platforms.Outbound{SessionKey: "agent:main:discord:dm:" + dm, Seq: 1, Text: "the reply", TurnEnd: true,
			Target: identity.Source{Platform: Name, ChatType: identity.ChatDM, ChatID: dm}}
		if err := p.Send(t.Context(), out); err != nil {
			t.Fatalf("Send to channel %d: %v", i, err)
		}
	}
	if n := len(srv.Sent(fmt.Sprint(300000000000000000 + channels - 1))); n != 1 {
		t.Fatalf("the last channel got %d messages, want 1", n)
	}
	if got := p.restBucketCount(); got > maxBuckets {
		t.Errorf("after replies to %d channels the REST limiter keeps %d buckets, want at most %d", channels, got, maxBuckets)
	}
}
