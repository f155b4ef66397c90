package discord

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/platforms"
)

// Sends past the nonce window. Each part of a reply is posted with a nonce Discord enforces
// (Send), so a post tried again after its answer was lost gets the message the first try made
// instead of a second one. Discord enforces a nonce only "in the past few minutes", though,
// and a reply may be sent again much later: the platform actor tries a send again until it
// succeeds, through an outage of any length, and the next start sends again every reply the
// outbox does not show confirmed (a stop or a crash that cut its send). A try that Discord
// posted but whose answer was lost was then posted a second time. So a send of an outbound
// made more than nonceWindow ago first reads its channel for the parts the bot posted already
// (postedBefore), and posts only the others; nearly every send is of an outbound just made,
// which Discord's nonce covers, and reads nothing.
//
// The nonce is of no help to the read: Discord keeps it for the answer to the post and its
// MESSAGE_CREATE only, and the history does not show it. A part is known by its author (the
// bot), its text, and for the first the message it answers: the bot's message with the very
// same text, answering the same message, since the outbound was made, is taken for it. What
// the read does not cover: a part posted more than backfillPages pages of messages after the
// outbound was made, and a reply that went to the channel because Discord refused to open its
// auto-thread (the read is of the thread). The first reply in an auto-thread, which references
// nothing, is only taken for posted when it is the bot's first message there: a reply to the
// starter that a notice preceded, and whose answer was lost, is posted twice.

// nonceWindow is how long after an outbound was made, or its channel was last read for it,
// its posts are left to Discord's enforced nonce alone. Discord says "a few minutes"; one
// leaves room for the daemon's clock and Discord's to disagree.
const nonceWindow = time.Minute

// clockSkew is how much earlier than it was made, on Discord's clock, the parts of an
// outbound are looked for.
const clockSkew = time.Minute

// discordEpoch is the Unix time in milliseconds at which Discord's snowflakes start (2015).
const discordEpoch = 1420070400000

// pastNonceWindow reports whether a post of out may come later than Discord enforces the
// nonce of an earlier post of it: out was made more than nonceWindow ago, and its channel was
// not read for it since (prog.checked). An outbound that does not say when it was made
// (CreatedAt zero) is taken for a new one.
func (p *Platform) pastNonceWindow(out *platforms.Outbound, prog sendProgress) bool {
	if out.CreatedAt.IsZero() {
		return false
	}
	since := out.CreatedAt
	if prog.checked.After(since) {
		since = prog.checked
	}
	return p.now().Sub(since) > nonceWindow
}

// postedBefore reads channel for the parts of out, from the part from on, that the bot posted
// already, and returns how far the send got: the parts posted, in order, and when the read
// began. A channel that is gone, or an auto-thread not open yet (404), holds none. One whose
// history the bot may not read (403: no Read Message History permission) is taken to hold
// none, with a warning: the reply would never go out otherwise.
func (p *Platform) postedBefore(ctx context.Context, out *platforms.Outbound, channel string, parts []string, from int) (sendProgress, error) {
	got := sendProgress{parts: from, checked: p.now()}
	bot, err := p.self(ctx)
	if err != nil {
		return sendProgress{}, fmt.Errorf("look up the bot's user: %w", err)
	}
	after := snowflakeAt(out.CreatedAt.Add(-clockSkew))
	for _, id := range out.InReplyTo {
		if snowflakeLess(after, id) {
			after = id // the reply came after the messages it answers
		}
	}
	first := replyRef(out) // the message the first part answers
	// An outbound that answers only the starter of its auto-thread is the thread's first
	// reply: its first part references nothing (the starter is in the parent channel), so
	// any unreferenced message of the bot with its text, a notice or an earlier message,
	// would pass for it, and the reply would never be posted. It can only be the first
	// message the bot posted in the thread, so the thread is read from its start.
	threadFirst := from == 0 && channel == out.Target.ThreadID && len(out.InReplyTo) > 0 &&
		!slices.ContainsFunc(out.InReplyTo, func(id string) bool { return id != out.Target.ThreadID })
	if threadFirst {
		after = out.Target.ThreadID
	}
	for range backfillPages {
		page, err := p.messages(ctx, channel, "after", after)
		switch {
		case restStatus(err) == http.StatusNotFound:
			return got, nil
		case err != nil && refusedForGood(err):
			p.log.Warn("discord cannot look for a reply sent again in its channel; posting it, which may show it twice",
				"channel", channel, "session", out.SessionKey, "seq", out.Seq, logging.Err(err))
			return got, nil
		case err != nil:
			return sendProgress{}, fmt.Errorf("read channel %s for the parts posted before: %w", channel, err)
		}
		for _, m := range page {
			ref := ""
			if got.parts == 0 {
				ref = first
			}
			switch {
			case got.parts < len(parts) && isPart(m, bot, parts[got.parts], ref):
				got.parts++
			case threadFirst && got.parts == 0 && m.Author != nil && m.Author.ID == bot:
				return got, nil // the bot's first message in the thread is another
			}
		}
		if got.parts == len(parts) || len(page) < backfillPageSize {
			break
		}
		after = page[len(page)-1].ID
	}
	if got.parts > from {
		p.log.Info("discord reply sent again was posted before; the parts found are not posted again",
			"channel", channel, "session", out.SessionKey, "seq", out.Seq, "parts", got.parts-from)
	}
	return got, nil
}

// isPart reports whether m is the bot's post of a part that says text and answers the message
// ref ("" for none).
func isPart(m *discordgo.Message, bot, text, ref string) bool {
	if m.Author == nil || m.Author.ID != bot || strings.TrimSpace(m.Content) != strings.TrimSpace(text) {
		return false
	}
	answers := ""
	if m.MessageReference != nil {
		answers = m.MessageReference.MessageID
	}
	return answers == ref
}

// self returns the bot's user id: READY's, or, before the first READY (a reply sent again at
// the start while the gateway connects), Discord's answer to Get Current User.
func (p *Platform) self(ctx context.Context) (string, error) {
	if id := p.bot(); id != "" {
		return id, nil
	}
	ep := discordgo.EndpointUser("@me")
	var u discordgo.User
	if err := p.request(ctx, http.MethodGet, ep, ep, nil, &u); err != nil {
		return "", err
	}
	return u.ID, nil
}

// snowflakeAt is the least snowflake of a message made at t: a snowflake's upper bits count
// the milliseconds since Discord's epoch.
func snowflakeAt(t time.Time) string {
	return strconv.FormatInt(max(t.UnixMilli()-discordEpoch, 0)<<22, 10)
}
