package discord

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/platforms"
)

// onMessage handles a MESSAGE_CREATE: it holds the message (during a backfill, or a resume's
// replay) or queues it for the intake (intake.go), and never waits for its handling.
func (p *Platform) onMessage(_ *discordgo.Session, m *discordgo.MessageCreate) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.backfills > 0:
		p.held = append(p.held, m.Message) // after what is being read back (backfillThenRelease)
		return
	case p.replaying && len(p.held) < maxReplayHeld:
		p.held = append(p.held, m.Message) // until RESUMED (replay.go)
		return
	}
	// A replay's hold that is full is handed on first, in order (replay.go).
	held := p.held
	p.held = nil
	p.enqueueLocked(append(held, m.Message)...)
}

// handle turns a message (from the gateway, or from channel history after a lost gateway
// session: backfill) into an Inbound: it ignores what the gate refuses before anything is
// queued, opens a thread when auto-thread applies, delivers the message (which returns once it
// is durable) and tells the user when it could not be taken, or has nothing to read. told
// reports that the bot has posted a reply to the message already (a backfill read it in the
// history after the message): whatever it said then (a hint, a notice), the user is not told
// again. left reports that the message was not taken because the daemon stops, and is left for
// the next start to read back (readBackAfterStop; or leaveUntold, its notice not posted): a
// backfill keeps its place unread (backfill.go).
func (p *Platform) handle(m *discordgo.Message, told bool) (left bool) {
	// One message's panic drops that message only (logged): not the backfill or the intake
	// (intake.go) it runs in. Its sender is told when the
	// message was one the bot answers and the runtime had not taken it.
	var ctx context.Context
	var admitted, taken bool
	tell := func(channelID, ref, text string) {
		if !told {
			p.tellUser(p.noticeCtx(ctx), channelID, ref, text)
		}
	}
	// tellStopped tells the sender of a message a stop met that it was not taken, and reports
	// whether the message is left for the next start instead, its notice not posted (Discord
	// refused it, or the stop's notice bound ran out): see leaveUntold.
	tellStopped := func(channelID, ref, text string) (left bool) {
		if told {
			return false
		}
		err := p.postNotice(p.noticeCtx(ctx), channelID, ref, text)
		if err == nil {
			return false
		}
		if p.leaveUntold(m) {
			p.log.Info("discord message not taken while stopping, and its notice not posted; the next start reads it back",
				"channel", m.ChannelID, "message_id", m.ID, logging.Err(err))
			return true
		}
		p.log.Warn("discord notice about a message not posted; its author is not told", "channel", channelID, "message_id", ref, logging.Err(err))
		return false
	}
	defer func() {
		if v := recover(); v != nil {
			p.panicked("message", v, "channel", m.ChannelID, "message_id", m.ID)
			if admitted && !taken {
				defer p.survive("message notice", "channel", m.ChannelID, "message_id", m.ID)
				tell(m.ChannelID, m.ID, panicNotice)
			}
		}
	}()
	bot := p.bot()
	if bot == "" {
		return // a message before READY told it who it is
	}
	p.noteSeen(m)
	if !userSaid(m, bot) {
		return
	}
	p.mu.Lock()
	deliver := p.deliver
	ctx = p.runCtx
	p.mu.Unlock()
	if deliver == nil {
		return
	}
	if !p.gate.admitSender(m) {
		return // what needs no lookup first: other bots are never told anything
	}
	if ctx.Err() != nil && p.readBackAfterStop(ctx, ctx.Err(), m.ChannelID) {
		// The run is over (the daemon stops): a message still queued for the intake meets the
		// stop here. The runtime takes nothing now, and the lookups below would fail on ctx: a
		// channel the state does not hold was logged at ERR as unknown, and its sender was to
		// be told to send it again, though the next start answers it.
		p.log.Info("discord message not taken while stopping; the next start reads it back", "channel", m.ChannelID, "message_id", m.ID)
		return true
	}
	// A message the stop meets that the next start does not read back (a new DM, a thread the
	// store took nothing from) is handed on, and the stopping runtime turns it away: its
	// sender gets the stop's notice to send it again. Its lookups run within the stop's notice
	// bound (noticeCtx), which bounds the stop's REST calls together. On the stop's cancelled
	// ctx they failed: a thread the state does not hold was logged at ERR as an unknown channel,
	// and its sender was told the channel could not be looked up, though the daemon was stopping.
	stopped := ctx.Err() != nil
	lookups := ctx
	if stopped {
		lookups = p.noticeCtx(ctx)
	}
	role, err := p.botRole(lookups, m)
	if err != nil {
		// The stop, or its notice bound, ended the lookup of the bot's role (botRole): whether
		// m mentions the bot is not known, and a mention of its role is one. Left for the next
		// start, whose lookup tells. Counted as no role, the message was dropped as one not
		// for the bot where the bot answers only when mentioned, and not read back.
		if p.readBackAfterStop(ctx, ctx.Err(), m.ChannelID) || p.leaveUntold(m) {
			p.log.Info("discord message not taken while stopping, the bot's role not looked up; the next start reads it back",
				"channel", m.ChannelID, "message_id", m.ID, logging.Err(err))
			return true
		}
		// Backfill off (or a store that keeps no unread places): nothing reads it back, and a
		// notice would answer what may be chatter. Said as the stop's: "cannot look up the
		// guild's roles", Discord's failure's line, sent the operator to look at Discord.
		p.log.Warn("discord message met the stop before the bot's role was looked up, and nothing reads it back (backfill is off); a mention of the bot's role in it is not seen as a mention: where one is needed, it is not answered and its sender not told",
			"channel", m.ChannelID, "guild", m.GuildID, "message_id", m.ID, logging.Err(fmt.Errorf("%w: %w", platforms.ErrDraining, err)))
		if !stopped {
			// The stop came during the lookup: the channel's lookup runs within the stop's
			// notice bound, and no thread is opened, as for a message the stop met before.
			stopped, lookups = true, p.noticeCtx(ctx)
		}
	}
	mentioned := mentions(m, bot, role)
	ch, err := p.channelOf(lookups, m)
	if err != nil && !stopped && ctx.Err() != nil && restStatus(err) == 0 {
		// The stop came while the lookup waited for Discord, and ended it: the message meets
		// the stop here, as one queued behind it does above. Before, the lookup the stop cut
		// short was logged at ERR as an unknown channel, and its sender told so.
		if p.readBackAfterStop(ctx, ctx.Err(), m.ChannelID) {
			p.log.Info("discord message not taken while stopping; the next start reads it back", "channel", m.ChannelID, "message_id", m.ID)
			return true
		}
		stopped = true
	}
	if err != nil {
		// Only a message the bot would likely answer is told: not chatter that needs a mention.
		likely := mentioned || !p.gate.mentionRequired(m.GuildID, m.ChannelID, m.ChannelID)
		if stopped && restStatus(err) == 0 {
			// Not the channel's failure: the stop's bound ran out, or the connection to Discord
			// failed as the daemon stopped. The stop's own notice says why the message was not
			// taken. An answer of Discord's (403: the bot lost access; 404) is the channel's,
			// told as outside a stop: taken for the stop's, it was logged as a lookup not made
			// in time, and its sender was told to send it again in a minute, to meet the same
			// refusal after the restart.
			if !likely && p.leaveUntold(m) {
				// Unmentioned, in a channel not known: a thread the bot opened (archived, so out of
				// discordgo's state) is its conversation and needs no mention (gate.admit). Left
				// for the next start, whose lookup tells; a notice would answer what may be
				// chatter. Before, it was dropped, and the bot's conversation lost its message.
				p.log.Info("discord message not taken while stopping, its channel not looked up; the next start reads it back",
					"channel", m.ChannelID, "message_id", m.ID, logging.Err(err))
				return true
			}
			p.log.Warn("discord message not taken", "channel", m.ChannelID, "message_id", m.ID,
				logging.Err(fmt.Errorf("%w: its channel was not looked up in time: %w", platforms.ErrDraining, err)))
			if likely {
				return tellStopped(m.ChannelID, m.ID, drainingNotice)
			}
			return
		}
		p.log.Error("discord message from an unknown channel; not taken", "channel", m.ChannelID, "message_id", m.ID, logging.Err(err))
		if likely {
			tell(m.ChannelID, m.ID, unknownChannelNotice)
		}
		return
	}
	if !p.gate.admit(m, ch, bot, mentioned) {
		return
	}
	admitted = true
	in := &platforms.Inbound{
		Source:     p.source(m, ch),
		MessageID:  m.ID,
		Text:       text(m, bot, role),
		ReceivedAt: time.Now(),
	}
	if in.Text == "" { // a bare mention, or a sticker: nothing to answer, but say so
		switch {
		case mentioned:
			tell(m.ChannelID, m.ID, "You mentioned me without a message: write it after the mention.")
		case ch.kind == kindDM:
			// A sticker, a poll, a forwarded message (its text is not the message's): in a
			// DM, where every message is for the bot, silence reads as a bot that is down.
			tell(m.ChannelID, m.ID, "I can read only text and attachments, and this message has neither: write it out, please.")
		}
		return
	}
	typingIn := "" // where the typing indicator shows, if not in the reply's channel
	// Auto-thread answers a mention in a channel that needs one; a free-response channel is a
	// conversation of its own and keeps its replies inline.
	// A voice or stage channel's chat has no threads.
	if ch.kind == kindText && ch.threads && mentioned && p.cfg.AutoThread && p.gate.mentionRequired(m.GuildID, m.ChannelID, m.ChannelID) {
		// The thread's id is the message's: key the session by it, so this message and the
		// thread's follow-ups share one session. If opening it fails now, Send opens it.
		in.Source.ChatType, in.Source.ThreadID, in.Source.ProspectiveThreadID = identity.ChatThread, m.ID, m.ID
		// When the daemon stops, no thread is opened for a message the stopping runtime turns
		// away (its notice replies to it in its channel, below); one it takes gets its thread
		// from its reply (Send). Opened on the stop's cancelled ctx, the opening failed, and so
		// did the notice that it would open later.
		open, gone := false, false
		if !stopped {
			// The thread is a chat of its own for backfill from now on, read after its
			// starter: the bot may see nothing said in it before a gateway session is lost (its
			// own reply in it may be posted in the gap too), and what users say there
			// meanwhile is missed.
			p.noteSeen(&discordgo.Message{ChannelID: m.ID, ID: m.ID, GuildID: m.GuildID})
			open, gone = p.openThread(ctx, m.ChannelID, m.ID, in.Text, told)
		}
		if gone {
			// Its sender deleted it already (a RESUME replays a message deleted while the bot
			// was disconnected before its deletion): it is not taken, as one deleted before its
			// turn is not run, and its answer would have no thread to go to. Taken, it was run
			// and its reply refused for good, with an ERR line (found by the Discord soak).
			p.unsee(m.ID)
			return
		}
		if !open {
			// The thread opens when the reply is posted (Send), or never (the reply goes to the
			// channel): until then the user waits in the channel, and the typing indicator shows
			// there. Sent to the thread, each one was answered 404 (found by an audit).
			typingIn = m.ChannelID
		}
	}
	// The answer is awaited through a stop too: the session may have stored the message, and
	// the sender must not be told to send it again when it will be answered.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deliverTimeout)
	defer cancel()
	reply := replyChannel(in.Source)
	p.typing.expectIn(reply, cmp.Or(typingIn, reply), m.ID)
	ack, err := deliver(dctx, in)
	taken = err == nil // the runtime answers it; otherwise the user is told below
	p.typing.delivered(reply, m.ID, ack, err)
	switch {
	case err == nil:
		if !strings.HasPrefix(strings.TrimSpace(in.Text), "/") {
			// Its sender may delete it before its turn. Not a command: a /retry's rerun goes by
			// the command's id, and taking it back would leave the exchange /retry archived
			// unanswered (found by a review); the others have acted when they were taken.
			p.noteDelivered(m.ChannelID, m.ID, in.Source)
		}
		// The chat is one the next start's backfill reads (the store took a message from
		// it), and so is an auto-thread's (the message is its first).
		p.noteStored(m.ChannelID, p.now())
		if th := in.Source.ThreadID; th != "" && th != m.ChannelID {
			p.noteStored(th, p.now())
		}
	case p.readBackAfterStop(ctx, err, m.ChannelID):
		p.log.Info("discord message not taken while stopping; the next start reads it back", "channel", m.ChannelID, "message_id", m.ID)
		return true
	default:
		p.logNotTaken(m, err)
		where, ref := reply, refFor(in.Source, m.ID)
		if ref == "" {
			// An auto-threaded message: its notice replies to it in its channel, not in its
			// thread, where nothing can reply to it (the starter lives in the channel), as the
			// next start's backfill knows a notice only by its reply to the message
			// (repliedTo). Posted in the thread, the backfill took the message and answered it
			// there, twice for a sender who did as asked; and a thread not open yet took no
			// notice at all (404), its sender left waiting for an answer promised in it.
			where, ref = m.ChannelID, m.ID
		}
		if ctx.Err() != nil || errors.Is(err, platforms.ErrDraining) {
			return tellStopped(where, ref, refusal(err))
		}
		tell(where, ref, refusal(err))
	}
	return false
}

// leaveUntold leaves m, a message a stop met that the runtime did not take and whose sender
// could not be told so (the notice's post failed: Discord refused it, or the stop's notice
// bound ran out, noticeCtx), for the next start to read back, and reports whether it could:
// backfill is on, and the store keeps the bot's unread places. Its channel's unread place is
// kept before it (an earlier one stays), in the store too, where the next start's backfill
// reads it (loadUnread) even in a chat the store took nothing from (a new DM); a backfill that
// read m keeps its own place before it (left). Before, the message was neither answered, nor
// told, nor read back: lost without a word but a WRN, and a backfill that read it cleared the
// channel's place past it. A notice Discord posted though its answer was lost is found in the
// read-back (repliedTo), and the message is not taken twice.
func (p *Platform) leaveUntold(m *discordgo.Message) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg.BackfillWindow <= 0 || p.record == nil {
		return false
	}
	if _, ok := p.unread[m.ChannelID]; !ok {
		p.unread[m.ChannelID] = seenAt{id: snowflakeBefore(m.ID), guild: m.GuildID}
	}
	u := p.unread[m.ChannelID]
	// The place holds a message said now: it is recorded afresh, with the time of now. An
	// earlier place kept the time of its gap's first recording, and one recorded longer ago than
	// backfill_window was cleared unread at the next start, m with it
	// (TestMessageLeftInAnOldGapIsReadBack). A read from there skips what is older than the window.
	delete(p.kept, m.ChannelID)
	p.keepUnread(m.ChannelID, u.id, u.guild)
	return true
}

// snowflakeBefore returns the snowflake just before id: a place that reads id back. An id that
// is not a snowflake reads the channel from its start (within backfill_window).
func snowflakeBefore(id string) string {
	n, err := strconv.ParseUint(id, 10, 64)
	if err != nil || n == 0 {
		return "0"
	}
	return strconv.FormatUint(n-1, 10)
}

// readBackAfterStop reports whether a message the runtime did not take, with err, in channel
// is left for the next start: the daemon is stopping (draining, or the run is over), backfill
// is on, and the store took a message from the channel within half the backfill window. The
// store took nothing newer from the chat meanwhile (it takes nothing while stopping), so the
// next start's backfill, which reads the chats the store took a message from within the
// window, reads the message back and answers it, as it does what is said while the daemon is
// down; telling its sender to send it again would have them answered twice. A chat the store
// took nothing from lately (a new DM) is not read back: its sender is told, or the message
// would be lost without a word. Half the window leaves the restart that long.
func (p *Platform) readBackAfterStop(ctx context.Context, err error, channel string) bool {
	w := p.cfg.BackfillWindow
	return w > 0 && (errors.Is(err, platforms.ErrDraining) || ctx.Err() != nil) &&
		p.storedSince(channel, p.now().Add(-w/2))
}

// userSaid reports whether m is something a user said: not one of the bot's own messages, and
// not a join, a pin, a thread starter or the like.
func userSaid(m *discordgo.Message, bot string) bool {
	return m.Author != nil && m.Author.ID != bot &&
		(m.Type == discordgo.MessageTypeDefault || m.Type == discordgo.MessageTypeReply)
}

// refusal is what a user is told when the runtime did not take their message: never silence.
// A message the cluster member holding its session did not know (OutdatedMemberError: it runs
// an older agentgate, during a rolling upgrade) is asked for again in a few minutes, once the
// upgrade is over; before, its sender was told that it could not be stored, to send it again
// at once, which met the same member (TestMessageAnOlderMemberCannotTakeIsAskedForAgainLater).
func refusal(err error) string {
	_, outdated := errors.AsType[*platforms.OutdatedMemberError](err)
	switch {
	case errors.Is(err, platforms.ErrRejected):
		return queueFullNotice
	case errors.Is(err, platforms.ErrDraining):
		return drainingNotice
	case outdated:
		return upgradingNotice
	default:
		return unstoredNotice
	}
}

// logNotTaken logs that the runtime did not take m (err; its sender is told), at once for the
// first message of each cause (notTakenCause), then at most once a logging.LimitEvery for the
// cause, with the count of the messages held back (repeats; each of them at Debug). Before,
// it was a line for each message: a rolling upgrade whose older member refuses the requests
// it does not know (platforms.OutdatedMemberError) logged one for every message of its chats
// until the upgrade was over (TestRefusalsOfAnOlderMemberAreLoggedOnceAMinute,
// TestRefusedMessagesAreCountedInOneLineAtTheStop).
func (p *Platform) logNotTaken(m *discordgo.Message, err error) {
	p.notTakenLines.Log(p.log, slog.LevelWarn, "discord message not taken", notTakenCause(err),
		"channel", m.ChannelID, "message_id", m.ID, logging.Err(err))
}

// notTakenCause is the key of a refusal's line (logNotTaken): the kind of refusal, and for an
// older member the member, so that each member to upgrade is named at once, and a refusal of
// another kind during the upgrade (the database unavailable) is not held back behind it. An
// error of no kind the runtime names (no member took the session, an answer it did not
// expect: a bug) is one of its own, "other", not held back behind the database's refusals
// during an outage, its err shown only if it came last; before, both were "not stored"
// (TestRefusalsOfAnOlderMemberAreLoggedOnceAMinute).
func notTakenCause(err error) string {
	if o, ok := errors.AsType[*platforms.OutdatedMemberError](err); ok {
		return "outdated member " + o.Address
	}
	switch {
	case errors.Is(err, platforms.ErrRejected):
		return "queue full"
	case errors.Is(err, platforms.ErrDraining):
		return "draining"
	case errors.Is(err, platforms.ErrUnavailable):
		return "not stored"
	default:
		return "other"
	}
}

// The notices that tell a sender their message was not taken and to send it again
// (notTakenNotices).
const (
	queueFullNotice      = "I'm still working on your earlier messages and my queue for this conversation is full, so I did not take this one. Please send it again in a little while."
	drainingNotice       = "I'm restarting and did not take this message. Please send it again in a minute."
	unstoredNotice       = "I could not store this message, so I did not take it. Please send it again."
	upgradingNotice      = "I'm in the middle of an upgrade and could not take this message yet. Please send it again in a few minutes."
	unknownChannelNotice = "I could not look up this channel, so I did not take your message. Please send it again."
	// panicNotice tells a sender that their message met a bug of the gateway's and was dropped.
	panicNotice = "Something went wrong on my side while I was taking this message, so I did not take it. Please send it again; if this happens again, tell whoever runs this bot."
)

// notTakenNotices are the notices that ask a sender to send their message again: a backfill
// that reads such a message back with the bot's notice replying to it does not take it
// (askedAgain), as its sender was asked to send it again.
var notTakenNotices = []string{queueFullNotice, drainingNotice, unstoredNotice, upgradingNotice, unknownChannelNotice, panicNotice}

// stopNoticeTimeout bounds the posts of the notices about the messages a stop met
// (noticeCtx), all of them together: a few seconds, well within the platform actor's wait
// for a stopping Run (10 s).
const stopNoticeTimeout = 3 * time.Second

// noticeCtx is the context a notice about a message not taken is posted on, given the run's
// ctx: that ctx while the run goes on; once a stop has ended it, one the stop does not end,
// which ends stopNoticeTimeout after the stop's first notice, for every notice of that stop.
// A message the stop meets that the next start does not read back (a new DM:
// readBackAfterStop) is turned away by the stopping runtime, and its notice is all its sender
// gets: posted on the ended run's ctx, it failed, and the message was lost without a word.
// Bounded each on its own, the notices of a queue of such messages held the stop one bound
// for each while Discord did not answer: past the platform actor's wait from four of them.
func (p *Platform) noticeCtx(ctx context.Context) context.Context {
	if ctx.Err() == nil {
		return ctx
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopNotices.of != ctx {
		if p.stopNotices.cancel != nil {
			p.stopNotices.cancel() // an earlier stop's (a cluster member's, run again)
		}
		p.stopNotices.ctx, p.stopNotices.cancel = context.WithTimeout(context.WithoutCancel(ctx), stopNoticeTimeout)
		p.stopNotices.of = ctx
	}
	return p.stopNotices.ctx
}

// tellUser posts a short, non-durable answer about a message that was not taken.
func (p *Platform) tellUser(ctx context.Context, channelID, ref, text string) {
	if err := p.postNotice(ctx, channelID, ref, text); err != nil {
		p.log.Warn("discord notice about a message not posted; its author is not told", "channel", channelID, "message_id", ref, logging.Err(err))
	}
}

// postNotice posts text in channelID, in reply to the message ref ("" for none).
func (p *Platform) postNotice(ctx context.Context, channelID, ref, text string) error {
	ctx, cancel := context.WithTimeout(ctx, restTimeout)
	defer cancel()
	msg := &sendBody{Content: text, AllowedMentions: noMentions()}
	if ref != "" {
		msg.Reference = &discordgo.MessageReference{MessageID: ref, ChannelID: channelID, FailIfNotExists: new(false)}
	}
	_, err := p.post(ctx, channelID, msg)
	return err
}

// openThread starts the thread of an auto-threaded message, and reports whether it is open.
// When it is not, the user is told so, unless told (they were, for this message), or the
// message is gone: Discord no longer has it (404 Unknown Message), its sender deleted it.
func (p *Platform) openThread(ctx context.Context, channelID, messageID, text string, told bool) (open, gone bool) {
	run := ctx
	ctx, cancel := context.WithTimeout(ctx, restTimeout)
	defer cancel()
	switch err := p.startThread(ctx, channelID, messageID, threadName(text)); {
	case err == nil:
		p.markOpened(messageID)
		return true, false
	case apiCode(err) == discordgo.ErrCodeUnknownMessage:
		p.log.Debug("discord message deleted before its thread was opened; not taken", "channel", channelID, "message_id", messageID)
		return false, true
	case run.Err() != nil && restStatus(err) == 0:
		// The daemon's stop ended the opening: the message meets the stop at its delivery (left
		// for the read-back, or the stop's notice), and one the runtime takes all the same gets
		// its thread from its reply (Send). Before, it warned of a thread to be opened on the
		// reply, and of a sender not told, as its notice failed on the ended ctx.
		p.log.Debug("discord thread not opened: the daemon stops", "channel", channelID, "message_id", messageID, logging.Err(err))
	case refusedForGood(err):
		// No permission to open threads here: the reply goes to the channel (Send).
		p.log.Warn("discord refuses a thread for this message; the reply goes to the channel", "channel", channelID, "message_id", messageID, logging.Err(err))
	default:
		p.log.Warn("open discord thread; will retry on reply", "channel", channelID, "message_id", messageID, logging.Err(err))
		if !told {
			p.tellUser(ctx, channelID, messageID, "I could not open a thread for this message yet; I'll answer in its thread as soon as Discord lets me.")
		}
	}
	return false, false
}

func (p *Platform) startThread(ctx context.Context, channelID, messageID, name string) error {
	ep := discordgo.EndpointChannelMessageThread(channelID, messageID)
	var th discordgo.Channel
	err := p.request(ctx, http.MethodPost, ep, ep, &discordgo.ThreadStart{
		Name: name, AutoArchiveDuration: p.cfg.ThreadArchiveMinutes, Type: discordgo.ChannelTypeGuildPublicThread,
	}, &th)
	if apiCode(err) == discordgo.ErrCodeThreadAlreadyCreatedForThisMessage {
		return nil
	}
	return err
}

// threadName is a thread's name taken from its first message: its first line, at most 80
// characters.
func threadName(text string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(text), "\n")
	line = strings.Join(strings.Fields(line), " ")
	if utf8.RuneCountInString(line) > 80 {
		line = string([]rune(line)[:79]) + "…"
	}
	if line == "" {
		line = "conversation"
	}
	return line
}

// source is the identity of a message: DMs by channel, guild channels with the guild as scope,
// threads under their parent channel.
func (p *Platform) source(m *discordgo.Message, ch chanInfo) identity.Source {
	src := identity.Source{Platform: Name, ChatID: m.ChannelID, UserName: displayName(m)}
	if m.Author != nil {
		src.UserID = m.Author.ID
	}
	switch ch.kind {
	case kindDM:
		src.ChatType = identity.ChatDM
	case kindGroupDM:
		src.ChatType = identity.ChatGroup
	case kindThread:
		src.ChatType, src.ChatID, src.ThreadID, src.ScopeID = identity.ChatThread, ch.parent, m.ChannelID, m.GuildID
	default:
		src.ChatType, src.ScopeID = identity.ChatChannel, m.GuildID
	}
	return src
}

// replyChannel is the Discord channel that answers to src go to.
func replyChannel(src identity.Source) string {
	if src.ThreadID != "" {
		return src.ThreadID
	}
	return src.ChatID
}

// refFor is the message an answer in src's reply channel may reference: not a thread's
// starter message, which lives in the parent channel (the thread shows it on top).
func refFor(src identity.Source, messageID string) string {
	if messageID == src.ThreadID {
		return ""
	}
	return messageID
}

// displayName is the name a user shows in the guild; untrusted (sessions neutralise it).
func displayName(m *discordgo.Message) string {
	switch {
	case m.Member != nil && m.Member.Nick != "":
		return m.Member.Nick
	case m.Author == nil:
		return ""
	case m.Author.GlobalName != "":
		return m.Author.GlobalName
	}
	return m.Author.Username
}

// mentions reports whether m mentions the bot or its role in m's guild (role, "" for none:
// roles.go), or replies to one of its messages.
func mentions(m *discordgo.Message, bot, role string) bool {
	if mentionsRole(m, role) {
		return true
	}
	for _, u := range m.Mentions {
		if u != nil && u.ID == bot {
			return true
		}
	}
	if r := m.ReferencedMessage; m.Type == discordgo.MessageTypeReply && r != nil && r.Author != nil && r.Author.ID == bot {
		// A reply to the bot whose author turned the client's "@ ON" off mentions no one;
		// README promises an answer to a reply as to a mention (found by an audit).
		return true
	}
	return strings.Contains(m.Content, "<@"+bot+">") || strings.Contains(m.Content, "<@!"+bot+">")
}

// text is what the user said: the bot's mention (and its role's, role) removed, attachments
// listed by name and URL.
func text(m *discordgo.Message, bot, role string) string {
	pairs := []string{"<@" + bot + ">", "", "<@!" + bot + ">", ""}
	if role != "" {
		pairs = append(pairs, "<@&"+role+">", "")
	}
	t := strings.NewReplacer(pairs...).Replace(m.Content)
	t = strings.TrimSpace(t)
	for _, a := range m.Attachments {
		if a != nil {
			t += fmt.Sprintf("\n[attachment: %s %s]", a.Filename, a.URL)
		}
	}
	return strings.TrimSpace(t)
}

// Channel kinds the adapter tells apart.
const (
	kindText = iota
	kindDM
	kindGroupDM
	kindThread
)

// chanInfo is what the adapter needs to know about a channel.
type chanInfo struct {
	kind    int
	parent  string // a thread's parent channel
	guild   string
	owner   string // a thread's creator
	threads bool   // a text or announcement channel, where a message can start a thread
}

// channelOf tells what kind of channel m was posted in.
func (p *Platform) channelOf(ctx context.Context, m *discordgo.Message) (chanInfo, error) {
	if m.GuildID == "" {
		// A DM; group DMs are not delivered to bots, but say so if one is.
		if c, err := p.s.State.Channel(m.ChannelID); err == nil && c.Type == discordgo.ChannelTypeGroupDM {
			return chanInfo{kind: kindGroupDM}, nil
		}
		return chanInfo{kind: kindDM}, nil
	}
	if c, err := p.s.State.Channel(m.ChannelID); err == nil {
		return infoOf(c), nil
	}
	return p.threads.get(ctx, m.ChannelID)
}

func infoOf(c *discordgo.Channel) chanInfo {
	info := chanInfo{kind: kindText, guild: c.GuildID}
	switch c.Type {
	case discordgo.ChannelTypeGuildText, discordgo.ChannelTypeGuildNews:
		info.threads = true
	case discordgo.ChannelTypeDM:
		info.kind = kindDM
	case discordgo.ChannelTypeGroupDM:
		info.kind = kindGroupDM
	case discordgo.ChannelTypeGuildPublicThread, discordgo.ChannelTypeGuildPrivateThread, discordgo.ChannelTypeGuildNewsThread:
		info.kind, info.parent, info.owner = kindThread, c.ParentID, c.OwnerID
	}
	return info
}

func (p *Platform) fetchChannel(ctx context.Context, id string) (chanInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, restTimeout)
	defer cancel()
	ep := discordgo.EndpointChannel(id)
	var c discordgo.Channel
	if err := p.request(ctx, http.MethodGet, ep, ep, nil, &c); err != nil {
		return chanInfo{}, err
	}
	return infoOf(&c), nil
}

// channelCache remembers channels looked up over REST (their kind and parent never change).
type channelCache struct {
	fetch func(context.Context, string) (chanInfo, error)
	mu    sync.Mutex
	m     map[string]chanInfo
}

const maxCachedChannels = 10_000

func newChannelCache(fetch func(context.Context, string) (chanInfo, error)) *channelCache {
	return &channelCache{fetch: fetch, m: map[string]chanInfo{}}
}

func (c *channelCache) get(ctx context.Context, id string) (chanInfo, error) {
	c.mu.Lock()
	info, ok := c.m[id]
	c.mu.Unlock()
	if ok {
		return info, nil
	}
	info, err := c.fetch(ctx, id)
	if err != nil {
		return info, err
	}
	c.mu.Lock()
	if len(c.m) >= maxCachedChannels {
		clear(c.m)
	}
	c.m[id] = info
	c.mu.Unlock()
	return info, nil
}

// gate decides which messages the bot answers, before anything is queued.
type gate struct {
	requireMention bool
	free           []string
	guilds         map[string]config.DiscordScope
	channels       map[string]config.DiscordScope
	allowGuilds    []string
	allowChannels  []string
	allowUsers     []string
	allowBots      bool
}

func newGate(c config.Discord) gate {
	return gate{
		requireMention: c.RequireMention, free: c.FreeResponseChannels, guilds: c.Guilds, channels: c.Channels,
		allowGuilds: c.AllowedGuilds, allowChannels: c.AllowedChannels, allowUsers: c.AllowedUsers, allowBots: c.AllowBots,
	}
}

// admitSender reports whether the bot may answer m as far as its author and guild tell,
// without knowing its channel.
func (g gate) admitSender(m *discordgo.Message) bool {
	if m.Author == nil || (m.Author.Bot && !g.allowBots) {
		return false
	}
	if len(g.allowUsers) > 0 && !slices.Contains(g.allowUsers, m.Author.ID) {
		return false
	}
	return m.GuildID == "" || len(g.allowGuilds) == 0 || slices.Contains(g.allowGuilds, m.GuildID)
}

// admit reports whether the bot answers m, posted in ch.
func (g gate) admit(m *discordgo.Message, ch chanInfo, bot string, mentioned bool) bool {
	if !g.admitSender(m) {
		return false
	}
	if ch.kind == kindDM || ch.kind == kindGroupDM {
		return true
	}
	channel := m.ChannelID
	if ch.kind == kindThread {
		channel = ch.parent
	}
	if len(g.allowChannels) > 0 && !slices.Contains(g.allowChannels, channel) && !slices.Contains(g.allowChannels, m.ChannelID) {
		return false
	}
	if mentioned || (ch.kind == kindThread && ch.owner == bot) {
		return true // a thread the bot opened is its conversation
	}
	return !g.mentionRequired(m.GuildID, m.ChannelID, channel)
}

// mentionRequired: the channel's setting, else its parent's, else the guild's, else the default.
func (g gate) mentionRequired(guild, channel, parent string) bool {
	if slices.Contains(g.free, channel) || slices.Contains(g.free, parent) {
		return false
	}
	for _, id := range []string{channel, parent} {
		if s, ok := g.channels[id]; ok && s.RequireMention != nil {
			return *s.RequireMention
		}
	}
	if s, ok := g.guilds[guild]; ok && s.RequireMention != nil {
		return *s.RequireMention
	}
	return g.requireMention
}
