package discord

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
)

// Backfill. Discord replays missed events only to a gateway session that RESUMEs. A new
// session (the first one after a restart, or one identified afresh after Discord refused a
// RESUME because the session expired) gets nothing of what was said meanwhile: it would be
// lost without a trace. So the platform keeps, per channel, the newest message it saw there
// (and at every READY adds the store's recent chats, Config.Recent: seed), and on every READY
// reads each such channel's history after that message (Get Channel Messages, which needs the
// Read Message History permission) and handles what it finds exactly like live messages,
// oldest first, before any live event of the new session (handlers run in order on the
// gateway's reader). A message that was taken already is answered as a duplicate by the
// runtime and never runs twice. platforms.discord.backfill_window bounds it: only channels
// active within the window are read after a restart, and older messages are not answered.
// The history is read newest page first, back to that message (readBack): at most
// backfillSaid messages that are not the bot's own (and backfillPages pages) are read, and when
// more was said, the newest are the ones said while the bot was away (the mark after a restart
// is the newest message the store took, and the chatter after it that the bot saw live without
// taking, no mention, can run long). The bot's own messages do not count: after a restart the
// mark is the newest user message, and the replies the bot posted after it (to a backlog read
// back, hundreds) filled the pages, so every later restart warned of messages left unread when
// there were none.
//
// What it does not cover: channels the store took nothing from within the window, and the
// older messages of a channel where more than backfillSaid messages were said since the mark
// (logged at Warn).
const (
	backfillSaid     = 500 // messages not the bot's own read per channel
	backfillPages    = 20  // pages read per channel, the bot's own messages included
	backfillPageSize = 100 // Discord's maximum
)

// backfillChannels bounds the channels remembered; the one quiet longest is forgotten first
// (noteSeen; a var: tests lower it).
var backfillChannels = 1000

// seenAt is the newest message seen in a channel, and the channel's guild (history messages
// carry no guild_id, and a message without one reads as a DM); stored is when the store last
// took a message from the channel, as far as this process knows (the seed's, or one it took):
// the next start's seed reads the channel only if that is within the window.
type seenAt struct {
	id     string
	guild  string
	stored time.Time
}

// noteSeen records m as its channel's newest message if it is. A channel new past
// backfillChannels forgets the quietest one remembered that has no unread place: a place is
// what a failed read left to read back (a message said while the gateway was down), and a
// quiet channel's is the likeliest to be forgotten. Every READY merges the store's recent
// chats (seed), as many as backfillChannels, and forgot a quiet channel's place with it, in the
// store too: the message was never read back, without a word. The places are few (a read
// that failed for a reason that may pass, read again until one gets past it) and may hold the
// remembered channels past backfillChannels.
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
			if _, unread := p.unread[ch]; unread {
				continue
			}
			if oldest == "" || snowflakeLess(s.id, p.seen[oldest].id) {
				oldest = ch
			}
		}
		if oldest != "" {
			delete(p.seen, oldest)
		}
	}
	guild := m.GuildID
	if guild == "" {
		guild = cur.guild
	}
	p.seen[m.ChannelID] = seenAt{id: m.ID, guild: guild, stored: cur.stored}
}

// unsee forgets channel, noted by noteSeen: an auto-thread that will never be opened (its
// starter message was deleted), which a backfill would otherwise read at every new gateway
// session and find gone.
func (p *Platform) unsee(channel string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.seen, channel)
}

// noteStored records that the store took a message from channel at (a remembered one).
func (p *Platform) noteStored(channel string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.seen[channel]; ok && at.After(s.stored) {
		s.stored = at
		p.seen[channel] = s
	}
}

// storedSince reports whether the store took a message from channel after t.
func (p *Platform) storedSince(channel string, t time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[channel].stored.After(t)
}

// seed adds the store's recent chats to seen, at every READY of a new gateway session: a
// thread's parent channel is read too (a mention there opens a new thread). A mark only moves
// forward (noteSeen, noteStored): this process's own are newer where it saw more. In a cluster
// the gateway moves between members, and the store holds the chats another member took while
// this one did not hold it; seeded once per process, a member that took the gateway back read
// none of the chats new to it, and what was said in them while nobody held the gateway was
// never answered.
func (p *Platform) seed(ctx context.Context, since time.Time) {
	if p.recent == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, restTimeout)
	defer cancel()
	marks, err := p.recent(ctx, since)
	if err != nil {
		p.log.Warn("discord backfill: cannot read the recent chats from the store; only the chats this process saw are read back, what was said in others while the gateway session was away is not answered",
			logging.Err(err))
		return
	}
	for _, m := range marks {
		if !p.ownShard(m.ScopeID) {
			continue // another shard's gateway takes (and reads back) that guild's messages
		}
		if m.ThreadID != "" {
			p.noteSeen(&discordgo.Message{ChannelID: m.ThreadID, ID: m.MessageID, GuildID: m.ScopeID})
			// The parent is read after the thread's own id (an auto-thread's is its starter's,
			// a message in the parent), not after the thread's newest message: that one is in
			// the thread, and a message in the parent older than it that was not taken (it
			// came while the daemon stopped) would be skipped.
			p.noteSeen(&discordgo.Message{ChannelID: m.ChatID, ID: m.ThreadID, GuildID: m.ScopeID})
			p.noteStored(m.ThreadID, m.At)
			p.noteStored(m.ChatID, m.At)
			continue
		}
		p.noteSeen(&discordgo.Message{ChannelID: m.ChatID, ID: m.MessageID, GuildID: m.ScopeID})
		p.noteStored(m.ChatID, m.At)
	}
}

// ownShard reports whether this gateway connection's shard takes the messages of guild (a
// snowflake; "" for a DM): Discord sends a guild's events to shard (guild_id >> 22) %
// shard_count, and DMs to shard 0. Shards that share one store read back only their own
// chats: before, each shard's READY read every chat the store had taken, the other shards'
// too (up to backfillChannels of them), spending the bot's REST rate limits on messages
// another shard answers.
func (p *Platform) ownShard(guild string) bool {
	count := max(p.cfg.ShardCount, 1)
	if count == 1 {
		return true
	}
	if guild == "" {
		return p.cfg.ShardID == 0
	}
	id, err := strconv.ParseUint(guild, 10, 64)
	if err != nil {
		return true // not a snowflake: read it rather than lose it
	}
	return int((id>>22)%uint64(count)) == p.cfg.ShardID
}

// backfill handles the messages posted in the remembered channels after the newest one seen
// there (see Backfill above), at the READY of a new gateway session; with gaps, only in the
// channels where a failed backfill left messages unread, and in the threads what it reads
// there opens (scheduleGapRead).
func (p *Platform) backfill(gaps bool) {
	window := p.cfg.BackfillWindow
	if window <= 0 {
		return
	}
	type from struct {
		channel string
		seenAt
	}
	p.mu.Lock()
	ctx := p.runCtx
	p.mu.Unlock()
	since := p.now().Add(-window)
	if !gaps {
		p.seed(ctx, since)
		p.loadUnread(ctx, since)
	}
	// The channels to read, in rounds: a message read back may open an auto-thread (handle
	// remembers it), which is read in the next round; what was said in it meanwhile (it may
	// have been opened by a daemon that stopped before taking its message) is read back too.
	read := map[string]bool{}
	if gaps {
		p.mu.Lock()
		for ch := range p.seen {
			if _, ok := p.unread[ch]; !ok {
				read[ch] = true // nothing is missing there
			}
		}
		p.mu.Unlock()
	}
	unreadChans := func() []from {
		p.mu.Lock()
		defer p.mu.Unlock()
		var chans []from
		for ch, s := range p.seen {
			if read[ch] {
				continue
			}
			if u, ok := p.unread[ch]; ok {
				s = u // what a failed backfill left unread comes first
			}
			chans = append(chans, from{ch, s})
		}
		slices.SortFunc(chans, func(a, b from) int { return compareSnowflakes(a.id, b.id) })
		return chans
	}
	channels, fetched, old, failed, gone := 0, 0, 0, 0, 0
	var firstErr error // one warning per READY, not one per channel (a missing permission fails them all)
	var cut []string   // the channels where backfillPages stopped the read short
rounds:
	for chans := unreadChans(); len(chans) > 0; chans = unreadChans() {
		for _, c := range chans {
			if ctx.Err() != nil {
				break rounds // the run is over: the next READY reads the rest back
			}
			read[c.channel] = true
			channels++
			fetch := p.historyRetried
			if gaps {
				fetch = p.history // the gap read is tried again as a whole (scheduleGapRead)
			}
			// Each page goes to the backlog as it is read, where a deletion or an edit that
			// comes while the later pages are read reaches it (keepRead).
			p.clearBacklog()
			collect := func(ctx context.Context, channel, before string) ([]*discordgo.Message, error) {
				page, err := fetch(ctx, channel, before)
				p.addBacklog(page)
				return page, err
			}
			ms, short, readErr := p.readBack(ctx, collect, c.channel, c.id, since, p.bot())
			if readErr != nil && ctx.Err() != nil {
				// The end of the run cut it short (the daemon stops, and waits for the
				// backfill: settle; or a cluster member lets the gateway go), not Discord:
				// nothing failed, the places the store keeps stay as they are, and the next
				// READY (the next start's, or another member's) reads the rest back. Warned of,
				// with each channel after it read on the cancelled context, it read as
				// Discord's failure.
				channels--
				p.clearBacklog()
				break rounds
			}
			// left is where the daemon's stop left reading: the message before the first one
			// the runtime no longer took, which the next start is to read back (one the next
			// start would not read back is told so; one whose notice failed is left too:
			// leaveUntold).
			left := ""
			switch {
			case readErr != nil && restStatus(readErr) == http.StatusNotFound:
				// The channel or thread is gone (deleted, or a thread Discord refused to
				// open): nothing in it waits for an answer, and no permission is missing.
				gone++
				readErr = nil
			case readErr != nil:
				if failed++; firstErr == nil {
					firstErr = fmt.Errorf("channel %s: %w", c.channel, readErr)
				}
			default:
				if short {
					cut = append(cut, c.channel)
				}
				fetched += len(ms)
				told, asked := repliedTo(ms, p.bot())
				prev := c.id
				// Handed on one by one from the backlog, where a deletion or an edit that comes
				// meanwhile reaches them, as it reaches the intake's queue (dropDeleted).
				p.keepRead(ms)
				for m := p.nextBacklog(); m != nil; m = p.nextBacklog() {
					if m.Timestamp.Before(since) {
						if userSaid(m, p.bot()) {
							old++ // the bot's own replies are not messages it failed to answer
						}
						p.noteSeen(m)
						prev = m.ID
						continue
					}
					if asked[m.ID] {
						// Its sender was told it was not taken and asked to send it again (the
						// store refused it: a full disk): taken now, it was answered, and twice
						// for a sender who did as asked (found by a Discord soak).
						p.noteSeen(m)
						prev = m.ID
						continue
					}
					if m.GuildID == "" {
						m.GuildID = c.guild
					}
					if p.handle(m, told[m.ID]) {
						left = prev
						break
					}
					prev = m.ID
				}
			}
			p.clearBacklog()
			// Live messages move the channel's mark past what is left unread: keep the place, so
			// that the next new gateway session reads from there. A refusal for good (no Read
			// Message History permission) will not pass, and is not kept.
			// A message the daemon's stop left for the next start keeps the place before it too:
			// the chat's newest stored message may be past it (a live one taken after a failed
			// read), and the next start reads after that unless the store keeps the place.
			p.mu.Lock()
			switch {
			case left != "":
				p.unread[c.channel] = seenAt{id: left, guild: c.guild}
				p.keepUnread(c.channel, left, c.guild)
			case readErr != nil && !refusedForGood(readErr):
				// Nothing read is handled after a failed read: the place stays at the mark.
				p.unread[c.channel] = seenAt{id: c.id, guild: c.guild}
				p.keepUnread(c.channel, c.id, c.guild)
			default:
				delete(p.unread, c.channel)
				p.forgetUnread(c.channel)
			}
			if _, kept := p.unread[c.channel]; kept {
				if _, ok := p.seen[c.channel]; !ok {
					// Forgotten while this backfill read the channels before it (an auto-thread
					// one opened was new past backfillChannels, and it was the quietest without a
					// place yet): a place is read again only where a channel is remembered.
					// Before, the reads of the gaps never read it.
					p.seen[c.channel] = c.seenAt
				}
			}
			p.mu.Unlock()
			if left != "" {
				break rounds // the daemon stops: the runtime takes nothing more
			}
			if gaps && readErr != nil {
				// Live messages wait while gaps are read: after a failure (Discord's API is
				// likely down) the other gaps wait for the next try rather than hold them more.
				break rounds
			}
		}
	}
	if channels == 0 {
		return
	}
	what := "discord gateway session was new: read what was missed"
	if gaps {
		what = "discord backfill: read again what a failed read left unread"
	}
	p.log.Info(what, "channels", channels, "messages", fetched, "older_than_window", old, "failed", failed, "gone", gone)
	switch {
	case firstErr == nil:
	case restStatus(firstErr) == http.StatusForbidden:
		p.log.Warn("discord backfill: cannot read the history of some channels (the bot needs the Read Message History permission); what was said in them while disconnected is not answered",
			"channels", failed, "first_err", firstErr)
	default:
		p.log.Warn("discord backfill: cannot read the history of some channels; what was said in them while disconnected is read again later",
			"channels", failed, "first_err", firstErr)
	}
	if len(cut) > 0 {
		p.log.Warn("discord backfill: more was said in some channels than is read back; only their newest messages were read, older ones since the bot last saw them are not answered",
			"channels", len(cut), "channel_ids", cut, "read_back", backfillSaid)
	}
}

// clearBacklog empties the backlog the backfill hands on (nextBacklog), and ends the handling
// of the message in hand.
func (p *Platform) clearBacklog() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.putDownLocked()
	p.backlog = nil
}

// addBacklog adds a page being read back to the backlog (backfill): deletions and edits reach
// it while the later pages are read.
func (p *Platform) addBacklog(page []*discordgo.Message) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.backlog = append(p.backlog, page...)
}

// keepRead makes ms, what a channel's read back returned, the backlog the backfill hands on
// (nextBacklog), as the deletions and edits that came while its pages were read left them
// (addBacklog): a message deleted meanwhile is not handed on, an edited one is as edited.
// Before, the pages read first waited in the backfill's hands until the last one was read,
// out of their reach, and a message deleted meanwhile was answered.
func (p *Platform) keepRead(ms []*discordgo.Message) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.putDownLocked()
	left := make(map[string]*discordgo.Message, len(p.backlog))
	for _, m := range p.backlog {
		left[m.ChannelID+"/"+m.ID] = m
	}
	p.backlog = p.backlog[:0]
	for _, m := range ms {
		if l, ok := left[m.ChannelID+"/"+m.ID]; ok {
			p.backlog = append(p.backlog, l)
		}
	}
}

// nextBacklog ends the handling of the message in hand and takes the next one off the backlog;
// nil when none is left.
func (p *Platform) nextBacklog() *discordgo.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.putDownLocked()
	if len(p.backlog) == 0 {
		return nil
	}
	m := p.backlog[0]
	p.backlog[0] = nil
	p.backlog = p.backlog[1:]
	p.inHand = m
	return m
}

// putDownLocked ends the handling of the message in hand: the withdrawals its deletion waited
// for (queueDeletion) go to the intake, now that its delivery has returned. p.mu is held.
func (p *Platform) putDownLocked() {
	p.inHand = nil
	for _, run := range p.afterHand {
		p.intake = append(p.intake, intakeItem{run: run})
	}
	p.afterHand = nil
	p.startIntakeLocked()
}

// readBack reads channel's history after the message mark, newest page first (Discord's
// before), until a page reaches the mark or the start of the window (since), or backfillSaid
// messages not the bot's own or backfillPages pages were read, and returns what it read after the
// mark oldest first. short reports that a cap stopped it: messages older than those returned,
// posted after the mark, are not read.
// Reading newest first is what reaches what was said while the bot was away: the chatter it
// saw live but did not take (no mention) can exceed the cap after the store's newest message,
// and read oldest first the pages went on it and never got to the gap.
func (p *Platform) readBack(ctx context.Context, fetch func(ctx context.Context, channel, before string) ([]*discordgo.Message, error),
	channel, mark string, since time.Time, bot string) (ms []*discordgo.Message, short bool, err error) {
	before, said := "", 0
	for range backfillPages {
		page, err := fetch(ctx, channel, before)
		if err != nil {
			return nil, false, err
		}
		done := len(page) < backfillPageSize
		n := len(ms)
		for _, m := range page {
			switch {
			case before != "" && !snowflakeLess(m.ID, before):
				// Not older than the page before: an API that ignored before.
			case !snowflakeLess(mark, m.ID):
				done = true // the page reached the mark
			default:
				ms = append(ms, m)
				if m.Author == nil || m.Author.ID != bot {
					said++
				}
			}
		}
		// page is oldest first, and so is ms[n:]: its first is the oldest read yet.
		if len(ms) == n || ms[n].Timestamp.Before(since) {
			done = true // nothing older, or nothing older within the window
		}
		if done {
			return oldestFirst(ms), false, nil
		}
		if said >= backfillSaid {
			break
		}
		before = ms[n].ID
	}
	return oldestFirst(ms), true, nil
}

// repliedTo returns the ids of the messages that bot's messages among ms reply to (told), and
// of those among them that a notice of the bot's asked to send again (asked: notTakenNotices).
// A message read back that the bot has answered before, with a hint (a bare mention, a DM with
// nothing to read) or a notice, is not told again, and one whose sender was asked to send it
// again is not taken. Its answer is always read with it: it is newer, and readBack reads
// everything after the message. Before, the hints, which go with nothing stored, were posted
// again by every restart within backfill_window (found by an audit).
func repliedTo(ms []*discordgo.Message, bot string) (told, asked map[string]bool) {
	told, asked = map[string]bool{}, map[string]bool{}
	for _, m := range ms {
		if m.Author != nil && m.Author.ID == bot && m.MessageReference != nil && m.MessageReference.MessageID != "" {
			told[m.MessageReference.MessageID] = true
			if slices.Contains(notTakenNotices, m.Content) {
				asked[m.MessageReference.MessageID] = true
			}
		}
	}
	return told, asked
}

// oldestFirst sorts ms by id, ascending.
func oldestFirst(ms []*discordgo.Message) []*discordgo.Message {
	slices.SortFunc(ms, func(a, b *discordgo.Message) int { return compareSnowflakes(a.ID, b.ID) })
	return ms
}

// Unread gaps. A backfill whose reads of a channel all failed keeps the place where reading
// stopped (unread, and in the store: see "Unread places in the store" below); the READY of the
// next new gateway session reads from there. That READY may be days away (a RESUME does not
// backfill). So the gaps are read again while the gateway session lasts: the
// first time gapRetryFirst after the backfill that left them, the wait doubling up to
// gapRetryMax while reads keep failing. Their messages are older than the live ones taken
// meanwhile, and are answered after them, as at the next READY. Live messages wait while a
// gap read runs, as during a backfill, so each page is read once, and a failure ends the read.
var gapRetryFirst atomic.Int64 // a time.Duration; tests shorten it

const gapRetryMax = 30 * time.Minute

func init() { gapRetryFirst.Store(int64(time.Minute)) }

// scheduleGapRead arms the read of the unread gaps, if any and none is pending.
func (p *Platform) scheduleGapRead() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.unread) == 0 {
		p.gapWait = 0
		if p.gapRead != nil {
			p.gapRead.Stop()
			p.gapRead = nil
		}
		return
	}
	if p.gapRead != nil {
		return
	}
	wait := p.gapWait
	if wait == 0 {
		wait = time.Duration(gapRetryFirst.Load())
	}
	p.gapWait = min(2*wait, gapRetryMax)
	ctx := p.runCtx
	var t *time.Timer
	t = time.AfterFunc(wait, func() {
		p.mu.Lock()
		if p.gapRead != t {
			p.mu.Unlock()
			return // stopped, or replaced
		}
		p.gapRead = nil
		if ctx.Err() != nil || !p.connected.Load() {
			p.mu.Unlock()
			return // the next READY reads the gaps, or the next RESUMED arms this again
		}
		p.addBackfillLocked()
		p.mu.Unlock()
		p.backfillThenRelease(true)
	})
	p.gapRead = t
}

// stopGapRead cancels the pending read of the unread gaps (Run ends).
func (p *Platform) stopGapRead() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gapRead != nil {
		p.gapRead.Stop()
		p.gapRead = nil
	}
}

// Unread places in the store. A place a backfill leaves unread is also recorded in the store
// (persistence.MarkUnread, through the platform actor's queue of delivery marks), and cleared
// once a read gets past it; every READY's backfill reads the store's places first. So a
// restart, or another cluster member that takes the gateway over, reads the gap the last
// process could not: before, the place lived in this process's memory only, and live messages
// taken since had moved the store's newest message of the chat past it. A place recorded longer
// ago than backfill_window is cleared unread: everything left there is older than the window,
// which backfill does not answer.

// SetRecord implements platforms.Recorder.
func (p *Platform) SetRecord(record func(ops ...persistence.Op)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.record = record
}

// keepUnread records channel's unread place, after, in the store unless it holds it already. A
// place that moves (a read got part of the way) keeps the time of its gap's first recording.
// p.mu is held.
func (p *Platform) keepUnread(channel, after, guild string) {
	if p.record == nil {
		return
	}
	u, ok := p.kept[channel]
	if ok && u.After == after {
		return
	}
	if !ok {
		u = persistence.Unread{Platform: Name, ChatID: channel, At: p.now()}
	}
	u.After, u.ScopeID = after, guild
	p.kept[channel] = u
	p.record(&persistence.MarkUnread{Unread: u})
}

// forgetUnread clears channel's unread place in the store, if it holds one. p.mu is held.
func (p *Platform) forgetUnread(channel string) {
	u, ok := p.kept[channel]
	if !ok || p.record == nil {
		return
	}
	delete(p.kept, channel)
	p.record(&persistence.ClearUnread{Platform: Name, ChatID: channel, After: u.After})
}

// loadUnread adds the store's unread places to the ones this process knows (its own win: they
// are newer), and clears those recorded before since.
func (p *Platform) loadUnread(ctx context.Context, since time.Time) {
	if p.stored == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, restTimeout)
	defer cancel()
	us, err := p.stored(ctx)
	if err != nil {
		p.log.Warn("discord backfill: cannot read the unread places from the store; what a failed read left unread is read only if this process left it",
			logging.Err(err))
		return
	}
	for _, u := range us {
		if !p.ownShard(u.ScopeID) {
			continue // another shard's place: that shard reads it, or clears it
		}
		p.mu.Lock()
		if _, mine := p.kept[u.ChatID]; !mine {
			p.kept[u.ChatID] = u
		}
		stale := u.At.Before(since)
		if stale {
			delete(p.unread, u.ChatID)
			p.forgetUnread(u.ChatID)
		} else if _, mine := p.unread[u.ChatID]; !mine {
			p.unread[u.ChatID] = seenAt{id: u.After, guild: u.ScopeID}
		}
		p.mu.Unlock()
		if !stale {
			// Read there even when the store took nothing from the channel within the window.
			p.noteSeen(&discordgo.Message{ChannelID: u.ChatID, ID: u.After, GuildID: u.ScopeID})
		}
	}
}

// Backfill retries: a history read that fails for a reason that may pass (a 5xx, a lost
// connection, a rate limit longer than the call may wait) is tried again, backfillTries times
// in all, the wait doubling from backfillRetryBase. Without it one failed request lost, without
// a trace to the user, everything said in that channel while the gateway session was away:
// the live messages that follow move the channel's mark past the gap.
const (
	backfillTries     = 5
	backfillRetryBase = 250 * time.Millisecond
)

// historyRetried is history, tried again after a failure that may pass (see backfillTries).
func (p *Platform) historyRetried(ctx context.Context, channel, before string) ([]*discordgo.Message, error) {
	wait := backfillRetryBase
	for try := 1; ; try++ {
		ms, err := p.history(ctx, channel, before)
		if err == nil || try == backfillTries || refusedForGood(err) || ctx.Err() != nil {
			return ms, err // a read the daemon's stop cut short is no failure to try again
		}
		p.log.Warn("discord backfill: history read failed; retrying", "channel", channel, "attempt", try, "backoff", wait, logging.Err(err))
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// history returns a page of channel's messages before the message before (the newest ones
// if before is ""), oldest first.
func (p *Platform) history(ctx context.Context, channel, before string) ([]*discordgo.Message, error) {
	return p.messages(ctx, channel, "before", before)
}

// messages returns a page of channel's messages, oldest first: the newest ones before the
// message id with dir "before" (the newest ones of all if id is ""), the oldest ones after it
// with dir "after".
func (p *Platform) messages(ctx context.Context, channel, dir, id string) ([]*discordgo.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, restTimeout)
	defer cancel()
	q := url.Values{"limit": {strconv.Itoa(backfillPageSize)}}
	if id != "" {
		q.Set(dir, id)
	}
	ep := discordgo.EndpointChannelMessages(channel)
	var ms []*discordgo.Message
	if err := p.request(ctx, http.MethodGet, ep+"?"+q.Encode(), ep, nil, &ms); err != nil {
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
