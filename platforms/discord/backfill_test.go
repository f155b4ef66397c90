package discord

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/persistence"
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

// TestSeedReadsAThreadsParentFromTheThread: at the first READY, a thread the store took
// messages from is read after its newest one, and its parent channel (where a mention opens a
// new thread) after the thread's own id, or the parent's own newest message if later: not after
// the thread's newest message, which is in the thread. Before, a message in the parent that
// was not taken (it came while the daemon stopped) but is older than a later follow-up in the
// thread was never read back.
func TestSeedReadsAThreadsParentFromTheThread(t *testing.T) {
	for _, tc := range []struct {
		name  string
		marks []persistence.ChatMark
		want  map[string]string
	}{
		{"thread only", []persistence.ChatMark{{ChatID: "500", ThreadID: "1000", MessageID: "1500"}},
			map[string]string{"1000": "1500", "500": "1000"}},
		{"parent older", []persistence.ChatMark{{ChatID: "500", ThreadID: "1000", MessageID: "1500"}, {ChatID: "500", MessageID: "900"}},
			map[string]string{"1000": "1500", "500": "1000"}},
		{"parent newer", []persistence.ChatMark{{ChatID: "500", ThreadID: "1000", MessageID: "1500"}, {ChatID: "500", MessageID: "1200"}},
			map[string]string{"1000": "1500", "500": "1200"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Platform{seen: map[string]seenAt{}, unread: map[string]seenAt{},
				recent: func(context.Context, time.Time) ([]persistence.ChatMark, error) { return tc.marks, nil }}
			p.seed(t.Context(), time.Time{})
			got := map[string]string{}
			for ch, s := range p.seen {
				got[ch] = s.id
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("seen = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestBackfillReadsOnlyItsShardsChats: shards that share one store read back only the chats of
// their own guilds (guild_id >> 22 modulo shard_count), and DMs only on shard 0; the unread
// places of another shard's chats are neither read nor cleared. Before, every shard's READY
// read every chat the store had taken.
func TestBackfillReadsOnlyItsShardsChats(t *testing.T) {
	guildOn := func(shard uint64) string { return fmt.Sprint((1000+shard)<<22 | 12345) } // (1000+shard) % 2
	marks := []persistence.ChatMark{
		{ChatID: "100", MessageID: "1100", ScopeID: guildOn(0)},
		{ChatID: "101", MessageID: "1101", ScopeID: guildOn(1)},
		{ChatID: "102", ThreadID: "202", MessageID: "1102", ScopeID: guildOn(1)},
		{ChatID: "103", MessageID: "1103"}, // a DM
	}
	// A place recorded long ago (stale: cleared by the shard that owns it) in a chat of each shard.
	old := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	places := []persistence.Unread{
		{ChatID: "110", After: "1110", ScopeID: guildOn(0), At: old},
		{ChatID: "111", After: "1111", ScopeID: guildOn(1), At: old},
		{ChatID: "112", After: "1112", ScopeID: guildOn(1), At: old.Add(time.Hour)},
	}
	for _, tc := range []struct {
		shard       int
		wantSeen    string
		wantCleared string
	}{
		{0, "[100 103]", "[110]"},
		{1, "[101 102 112 202]", "[111]"},
	} {
		t.Run(fmt.Sprint("shard ", tc.shard), func(t *testing.T) {
			var cleared []string
			p := &Platform{cfg: config.Discord{ShardID: tc.shard, ShardCount: 2},
				seen: map[string]seenAt{}, unread: map[string]seenAt{}, kept: map[string]persistence.Unread{},
				recent: func(context.Context, time.Time) ([]persistence.ChatMark, error) { return marks, nil },
				stored: func(context.Context) ([]persistence.Unread, error) { return places, nil },
				record: func(ops ...persistence.Op) {
					for _, op := range ops {
						if c, ok := op.(*persistence.ClearUnread); ok {
							cleared = append(cleared, c.ChatID)
						}
					}
				}}
			p.seed(t.Context(), time.Time{})
			p.loadUnread(t.Context(), old.Add(time.Minute))
			var seen []string
			for ch := range p.seen {
				seen = append(seen, ch)
			}
			slices.Sort(seen)
			if got := fmt.Sprint(seen); got != tc.wantSeen {
				t.Errorf("channels to read back = %s, want %s", got, tc.wantSeen)
			}
			if got := fmt.Sprint(cleared); got != tc.wantCleared {
				t.Errorf("unread places cleared = %s, want %s", got, tc.wantCleared)
			}
		})
	}
}
