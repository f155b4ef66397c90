package discord

import (
	"fmt"
	"testing"

	"github.com/bwmarrin/discordgo"
)

// TestNoteSeen: a channel keeps its newest message and its guild; beyond backfillChannels the
// channel quiet longest is forgotten.
func TestNoteSeen(t *testing.T) {
	p := &Platform{seen: map[string]seenAt{}}
	p.noteSeen(&discordgo.Message{ChannelID: "c", ID: "1000", GuildID: "g"})
	p.noteSeen(&discordgo.Message{ChannelID: "c", ID: "999"}) // older: ignored
	p.noteSeen(&discordgo.Message{ChannelID: "c", ID: "10001"})
	if got := p.seen["c"]; got != (seenAt{id: "10001", guild: "g"}) {
		t.Errorf("seen[c] = %+v, want the newest id 10001 and the guild kept", got)
	}
	for i := range backfillChannels {
		p.noteSeen(&discordgo.Message{ChannelID: fmt.Sprint("ch", i), ID: fmt.Sprint(20000 + i)})
	}
	if len(p.seen) != backfillChannels {
		t.Errorf("%d channels remembered, want %d", len(p.seen), backfillChannels)
	}
	if _, ok := p.seen["c"]; ok {
		t.Error("the channel quiet longest (c) is still remembered")
	}
	if _, ok := p.seen["ch0"]; !ok {
		t.Error("ch0 was forgotten, but c was quieter")
	}
}

func TestCompareSnowflakes(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"9", "10", -1}, {"10", "9", 1}, {"123", "123", 0}, {"1323802873078743040", "1323802873078743041", -1},
	} {
		if got := compareSnowflakes(tc.a, tc.b); got != tc.want {
			t.Errorf("compareSnowflakes(%s, %s) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
