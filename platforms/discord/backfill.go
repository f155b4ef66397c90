package discord

import (
	"cmp"
	"context"
	"slices"

	"github.com/bwmarrin/discordgo"
)

// Backfill. When Discord refuses to RESUME a gateway session (it expired, or the connection
// was down too long), the client identifies afresh and Discord replays nothing: whatever was
// said in the gap would be lost without a trace. So the platform remembers, per channel, the
// newest message it saw there, and on every READY after the first it reads each such channel's
// history after that message (Get Channel Messages, which needs the Read Message History
// permission) and handles what it finds exactly like live messages, oldest first, before any
// live event of the new session (handlers run in order on the gateway's reader). A message
// that was taken already is answered as a duplicate by the runtime and never runs twice.
//
// What it does not cover: channels the bot saw nothing in since the process started (a
// restart remembers no channel), and more than backfillPages pages per channel.
const (
	backfillChannels = 1000 // channels remembered; the one quiet longest is forgotten first
	backfillPages    = 5    // pages of 100 messages read per channel
	backfillPageSize = 100  // Discord's maximum
)

// seenAt is the newest message seen in a channel, and the channel's guild (history messages
// carry no guild_id, and a message without one reads as a DM).
type seenAt struct {
	id    string
	guild string
}

// noteSeen records m as its channel's newest message if it is.
func (p *Platform) noteSeen(m *discordgo.Message) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cur, ok := p.seen[m.ChannelID]
	switch {
	case ok && !snowflakeLess(cur.id, m.ID):
		return
	case !ok && len(p.seen) >= backfillChannels:
		oldest := ""
		for ch, s := range p.seen {
			if oldest == "" || snowflakeLess(s.id, p.seen[oldest].id) {
				oldest = ch
			}
		}
		delete(p.seen, oldest)
	}
	guild := m.GuildID
	if guild == "" {
		guild = cur.guild
	}
	p.seen[m.ChannelID] = seenAt{id: m.ID, guild: guild}
}

// backfill handles the messages posted in the remembered channels after the newest one seen
// there (see Backfill above). It runs in the READY handler of a new gateway session.
func (p *Platform) backfill() {
	type from struct {
		channel string
		seenAt
	}
	p.mu.Lock()
	ctx := p.runCtx
	chans := make([]from, 0, len(p.seen))
	for ch, s := range p.seen {
		chans = append(chans, from{ch, s})
	}
	p.mu.Unlock()
	if len(chans) == 0 {
		return
	}
	slices.SortFunc(chans, func(a, b from) int { return compareSnowflakes(a.id, b.id) })
	fetched, failed := 0, 0
	for _, c := range chans {
		after := c.id
		for range backfillPages {
			ms, err := p.history(ctx, c.channel, after)
			if err != nil {
				failed++
				p.log.Warn("discord backfill: cannot read the channel's history; what was said in it while the gateway session was lost is not answered",
					"channel", c.channel, "after", after, "err", err)
				break
			}
			for _, m := range ms {
				if m.GuildID == "" {
					m.GuildID = c.guild
				}
				p.handle(m)
			}
			fetched += len(ms)
			if len(ms) < backfillPageSize {
				break
			}
			after = ms[len(ms)-1].ID
		}
	}
	p.log.Info("discord gateway session was new: read what was missed", "channels", len(chans), "messages", fetched, "failed", failed)
}

// history returns a page of channel's messages after the message after, oldest first.
func (p *Platform) history(ctx context.Context, channel, after string) ([]*discordgo.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, restTimeout)
	defer cancel()
	ms, err := p.s.ChannelMessages(channel, backfillPageSize, "", after, "", discordgo.WithContext(ctx))
	if err != nil {
		return nil, err
	}
	slices.SortFunc(ms, func(a, b *discordgo.Message) int { return compareSnowflakes(a.ID, b.ID) })
	return ms, nil
}

// compareSnowflakes orders two snowflakes (decimal strings without leading zeros).
func compareSnowflakes(a, b string) int {
	return cmp.Or(cmp.Compare(len(a), len(b)), cmp.Compare(a, b))
}

func snowflakeLess(a, b string) bool { return compareSnowflakes(a, b) < 0 }
