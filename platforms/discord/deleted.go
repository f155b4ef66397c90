package discord

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/platforms"
)

// A message its sender deletes before its turn starts is not answered (MESSAGE_DELETE). The
// event carries the message's id, channel and guild, no author, and in a guild channel the
// session key holds the author (each user has their own session): the platform remembers, by
// id, the Source of each message it delivered, with the channel it was posted in, and hands the
// deletion of one of them to the runtime (platforms.Withdraw), which finds the same session as
// the message did. Only messages this process delivered since its Run began are known: the
// deletion of an unknown one posted before then (taken before a restart, or by the cluster
// member that held the gateway before this one) goes to the store (platforms.WithdrawStored),
// which finds the message by its chat and id, if it was taken, and its session by the key it
// was stored under (the session of the thread the deletion names, if any); the deletion of an unknown one posted since (chatter the bot never took,
// an answered message) costs nothing. One taken and then deleted while agentgate was down is
// answered: no event tells of its deletion. A deleted message is never read back: Discord's
// history no longer holds it. A moderator's purge (MESSAGE_DELETE_BULK, of the GUILD_MESSAGES
// intent the platform asks for) takes back each of its messages the same way.

// maxDelivered is how many of the latest delivered messages the platform remembers, at least,
// for their deletion (twice as many at most): far more than wait in its sessions' queues at once.
const maxDelivered = 10_000

// withdrawTimeout bounds the wait for a withdrawal's answer, or for all those of a purge
// together (withdrawDeleted). It runs on the intake (intake.go), which hands on nothing
// meanwhile, and it is worth less than the messages behind it: a session that cannot answer at
// once (its key paused, its activation slow) answers its message as usual (found by a review: a
// minute, deliverTimeout, before).
const withdrawTimeout = 5 * time.Second

// recordSkew is how much later than the platform's clock at a Run's start Discord's may date
// a message another process took before: such a message, deleted, goes to the store. A margin
// for clocks apart, which costs a store read for the deletions of what is said in the first
// minute of a Run.
const recordSkew = time.Minute

// deliveredMsg is a message the runtime took: where it was posted and the Source it went with.
type deliveredMsg struct {
	channel string
	src     identity.Source
}

// SetWithdraw implements platforms.Withdrawer.
func (p *Platform) SetWithdraw(withdraw platforms.Withdraw, stored platforms.WithdrawStored) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.withdraw, p.withdrawStored = withdraw, stored
}

// recordFromLocked makes delivered complete only for messages posted after now (recordSkew
// later): a Run starts, and what was taken before it may have been taken by another process.
// p.mu is held.
func (p *Platform) recordFromLocked(now time.Time) {
	p.recordAfterLocked(snowflakeAt(now.Add(recordSkew)))
}

// recordAfterLocked makes delivered complete only for messages after snowflake id, if it is
// later than the snowflake it was complete after. p.mu is held.
func (p *Platform) recordAfterLocked(id string) {
	if snowflakeLess(p.recordedAfter, id) {
		p.recordedAfter = id
	}
}

// unrecordedLocked reports whether message id, which delivered does not hold, may be held
// unanswered by the runtime all the same, and the store can tell (recordedAfter). p.mu is
// held.
func (p *Platform) unrecordedLocked(id string) bool {
	return p.withdrawStored != nil && p.recordedAfter != "" && !snowflakeLess(p.recordedAfter, id)
}

// noteDelivered remembers that message id, posted in channel, was delivered with src, and
// forgets the oldest, down to the last maxDelivered, once it remembers twice as many.
func (p *Platform) noteDelivered(channel, id string, src identity.Source) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.withdraw == nil {
		return
	}
	if _, ok := p.delivered[id]; !ok {
		p.deliveredOrder = append(p.deliveredOrder, id)
	}
	p.delivered[id] = deliveredMsg{channel: channel, src: src}
	if len(p.deliveredOrder) >= 2*maxDelivered {
		// Forgotten a batch at a time, so that a delivery on the intake does not
		// shift the whole order once it is full (found by a review).
		n := len(p.deliveredOrder) - maxDelivered
		for _, old := range p.deliveredOrder[:n] {
			delete(p.delivered, old)
			p.recordAfterLocked(old) // its deletion asks the store from now on
		}
		p.deliveredOrder = slices.Delete(p.deliveredOrder, 0, n)
	}
}

// forgetDelivered forgets the delivered messages a reply answers: their turn has run, and
// their deletion would only load a session to change nothing (a user cleaning up old messages
// loaded an idle session for each, on the gateway reader). noteDelivered drops their ids from
// the order as it passes them.
func (p *Platform) forgetDelivered(ids []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		delete(p.delivered, id)
	}
}

// onMessageDelete takes back a deleted message the runtime has not yet answered. A message
// still held (a backfill, a resume's replay), queued for the intake or read back by a backfill
// and not yet handed on is dropped before it is delivered, at once; the withdrawal of one the
// runtime may hold is queued for the intake, behind the handling of the message's
// MESSAGE_CREATE, or after a backfill's handling of it (whose delivery returns once the message
// is stored), so the runtime holds the message by then. Unknown ids (the bot's own messages,
// what it never took) and an id posted in another channel change nothing.
func (p *Platform) onMessageDelete(_ *discordgo.Session, d *discordgo.MessageDelete) {
	if d.Message == nil {
		return
	}
	channel, id := d.ChannelID, d.ID
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.dropDeleted(channel, []string{id}) {
		return
	}
	p.queueDeletion(channel, []string{id}, func() {
		for _, w := range p.withdrawDeleted("MESSAGE_DELETE", d.GuildID, channel, []string{id}) {
			switch {
			case w.err != nil && w.unsure:
				p.log.Warn(unsureLine, "channel", channel, "message_id", id, logging.Err(w.err))
			case w.err != nil:
				p.log.Warn("discord message deleted by its sender but not withdrawn; it is answered", "channel", channel, "message_id", id, logging.Err(w.err))
			case w.taken:
				p.log.Debug("discord message deleted by its sender before its turn; withdrawn", "channel", channel, "message_id", id)
			}
		}
	})
}

// onMessageDeleteBulk takes back the messages of a guild channel a moderator purged at once
// (MESSAGE_DELETE_BULK: up to 100 ids; a larger purge comes as several), as onMessageDelete
// takes back one. Their outcomes are logged once for the whole purge, not a
// line for each message.
func (p *Platform) onMessageDeleteBulk(_ *discordgo.Session, d *discordgo.MessageDeleteBulk) {
	channel, ids := d.ChannelID, slices.Clone(d.Messages)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.dropDeleted(channel, ids) {
		return
	}
	p.queueDeletion(channel, ids, func() {
		var taken, failed, unsure int
		var firstErr, unsureErr error
		for _, w := range p.withdrawDeleted("MESSAGE_DELETE_BULK", d.GuildID, channel, ids) {
			switch {
			case w.err != nil && w.unsure:
				unsure++
				if unsureErr == nil {
					unsureErr = w.err
				}
			case w.err != nil:
				failed++
				if firstErr == nil {
					firstErr = w.err
				}
			case w.taken:
				taken++
			}
		}
		if failed > 0 {
			p.log.Warn("discord messages deleted in bulk but not withdrawn; they are answered", "channel", channel, "messages", failed, "deleted", len(ids), logging.Err(firstErr))
		}
		if unsure > 0 {
			p.log.Warn(unsureBulkLine, "channel", channel, "messages", unsure, "deleted", len(ids), logging.Err(unsureErr))
		}
		if taken > 0 {
			p.log.Debug("discord messages deleted in bulk before their turns; withdrawn", "channel", channel, "messages", taken, "deleted", len(ids))
		}
	})
}

// The lines of a deletion the store could not be asked about (unsure): most deleted messages
// posted before the Run began are chatter the bot never took, and the line that says a message
// the bot took "is answered" told an operator, for each of them during a store outage, of an
// answer that was never coming (found by a review).
const (
	unsureLine     = "discord message deleted by its sender could not be looked up in the store; if agentgate took it before this run and it still waits, it is answered"
	unsureBulkLine = "discord messages deleted in bulk could not be looked up in the store; those agentgate took before this run that still wait are answered"
)

// withdrawal is the outcome of the withdrawal of one deleted message.
type withdrawal struct {
	taken bool
	err   error
	// unsure: err kept the store from telling whether the runtime holds the message at all
	// (its lookup, or its channel's, failed): it may be chatter the bot never took.
	unsure bool
}

// withdrawDeleted withdraws the delivered messages among ids, deleted in channel (of guild, ""
// for a DM), all at once, under one withdrawTimeout: the intake that waits for them hands on
// nothing meanwhile, and a purge of 100 queued messages, one after another, would have held it
// up to 100 times as long (their sessions are mostly different users' in a guild channel, and
// each answers as soon as it can). The ids delivered does not hold and that the runtime may
// hold all the same (unrecordedLocked) are withdrawn through the store, all in one call (one read
// of the store for all of them), by the chat they were posted in (a thread's is its parent
// channel) and their thread, if any: a message of a sibling
// thread, which shares the chat, is not the one deleted. It returns the outcome of each withdrawal;
// none for ids the runtime cannot hold.
func (p *Platform) withdrawDeleted(event, guild, channel string, ids []string) []withdrawal {
	type found struct {
		id     string
		src    identity.Source
		stored bool // not in delivered: asked of the store
	}
	var todo []found
	var unknown bool
	p.mu.Lock()
	for _, id := range ids {
		if m, ok := p.delivered[id]; ok {
			if m.channel == channel {
				todo = append(todo, found{id: id, src: m.src})
			}
		} else if p.unrecordedLocked(id) {
			todo, unknown = append(todo, found{id: id, stored: true}), true
		}
	}
	withdraw, stored, ctx := p.withdraw, p.withdrawStored, p.runCtx
	p.mu.Unlock()
	if withdraw == nil || len(todo) == 0 {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, withdrawTimeout)
	defer cancel()
	var chat, thread string
	var chatErr error
	if unknown {
		// Known for any channel the bot takes messages in (discordgo's state, or the cache of
		// threads looked up): a lookup over REST only for a thread seen by no message since the
		// start.
		chat, thread, chatErr = p.chatOf(wctx, guild, channel)
	}
	out := make([]withdrawal, len(todo))
	var wg sync.WaitGroup
	var fromStore []int // the indexes in todo of the ids asked of the store, all in one call
	for i, f := range todo {
		if f.stored {
			if chatErr != nil {
				out[i] = withdrawal{err: fmt.Errorf("withdraw %s: look up channel %s: %w", f.id, channel, chatErr), unsure: true}
			} else {
				fromStore = append(fromStore, i)
			}
			continue
		}
		wg.Go(func() {
			// Off the intake, where take's recover does not reach: a panic would end the
			// daemon. The message is answered as if nothing had withdrawn it: a failed
			// withdrawal, which the purge's line counts (it counted it neither way before).
			defer func() {
				if v := recover(); v != nil {
					p.panicked(event, v, "message_id", f.id)
					out[i] = withdrawal{err: fmt.Errorf("withdraw panicked: %v", v)}
				}
			}()
			taken, err := withdraw(wctx, f.src, f.id)
			out[i] = withdrawal{taken: taken, err: err}
			if taken && err == nil {
				// No reply will answer it: the typing indicator no longer waits for its turn.
				// Awaited still, it ran on after the last reply until typingMax.
				p.typing.turnEnded(replyChannel(f.src), []string{f.id})
			}
		})
	}
	if len(fromStore) > 0 {
		// One read of the store for all of them (a purge of messages taken before this Run
		// cost one a message before), then their withdrawals, at once.
		wg.Go(func() {
			defer func() {
				if v := recover(); v != nil {
					p.panicked(event, v, "messages", len(fromStore))
					for _, i := range fromStore {
						out[i] = withdrawal{err: fmt.Errorf("withdraw panicked: %v", v)}
					}
				}
			}()
			ids := make([]string, len(fromStore))
			for j, i := range fromStore {
				ids[j] = todo[i].id
			}
			res := stored(wctx, Name, chat, thread, ids)
			for j, i := range fromStore {
				if j >= len(res) {
					out[i] = withdrawal{err: fmt.Errorf("withdraw %s: no outcome", ids[j])}
					continue
				}
				r := res[j]
				// The Source is zero when the store did not find out whether it holds the
				// message.
				out[i] = withdrawal{taken: r.Taken, err: r.Err, unsure: r.Err != nil && r.Source.Platform == ""}
				if r.Taken && r.Err == nil {
					p.typing.turnEnded(replyChannel(r.Source), []string{ids[j]})
				}
			}
		})
	}
	wg.Wait()
	return out
}

// chatOf returns the chat id of the messages of channel, of guild ("" for a DM), and their
// thread id, as source gives them: the channel's own and none, or for a thread its parent's and
// its own.
func (p *Platform) chatOf(ctx context.Context, guild, channel string) (chat, thread string, err error) {
	ch, err := p.channelOf(ctx, &discordgo.Message{ChannelID: channel, GuildID: guild})
	if err != nil {
		return "", "", err
	}
	if ch.kind == kindThread {
		return ch.parent, channel, nil
	}
	return channel, "", nil
}
