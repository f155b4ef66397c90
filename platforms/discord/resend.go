package discord

import (
	"context"
	"crypto/sha256"
	"errors"
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
// instead of a second one. Discord enforces a nonce only "in the past few minutes", though, and
// a reply may be sent again much later: the platform actor tries a send again until it
// succeeds, through an outage of any length, and the next start, or the cluster member a
// session is handed over to, sends again every reply the outbox does not show confirmed (a stop
// or a crash that cut its send). A try that Discord posted but whose answer was lost was then
// posted a second time. So a send first reads its channel for the parts the bot posted already
// (postedBefore), and posts only the others, when an earlier post of it may be older than the
// nonce (mustRead): a post this process made and got no answer to, more than nonceWindow ago
// (posts before a read for it are the read's), or a post of an earlier send this process knows
// nothing of (Outbound.Again: the outbox showed the reply unconfirmed when its session loaded),
// before this process has read for it. A try that Discord refused, or that failed before its
// request went out (waiting out a rate limit), posted nothing (mayHavePosted). Nearly every
// send is of an outbound just made, or tried again within the window, and reads nothing.
// Before, the outbound's age (CreatedAt) decided: every reply of a backlog held back by a rate
// limit, never posted, read its channel once a minute old; and in a cluster the clock of the
// member that made a reply said how old it was, so a skew of more than a minute read for every
// reply, or for none that needed it.
//
// What the process knows of its sends is bounded (maxProgress). When it forgets it, a send it
// knows nothing of whose outbound was made before (on this process's clock: only one marked
// Again comes from another process, and that one reads anyway) reads its channel once.
//
// The nonce is of no help to the read: Discord keeps it for the answer to the post and its
// MESSAGE_CREATE only, and the history does not show it. A part is known by its author (the
// bot), its text, and for the first the message it answers: the bot's message with the very
// same text, answering the same message, after the read's start, is taken for it. The read
// starts after the newest message the outbound answers (an id Discord assigned), and for an
// outbound this process made, no earlier than clockSkew before it was made on this process's
// clock (or before this process first posted it without an answer, if that was earlier). One
// that another process made (Again) is looked for from the message it answers alone: its
// CreatedAt is of that process's clock. Before, a reply made on a cluster member whose clock
// ran ahead of Discord's by more than clockSkew, and sent again by another, was read for from
// after its earlier post, and posted twice. What the read does not cover: a part posted more
// than backfillPages pages of messages after the read's start, an Again outbound that answers
// no message (a notice) that its earlier process posted more than clockSkew before the time its
// outbound says it was made, and a reply that went to the channel because Discord refused to
// open its auto-thread (the read is of the thread). The first reply in an
// auto-thread, which references nothing, is only taken for posted when it is the bot's first
// message there: a reply to the starter that a notice preceded, and whose answer was lost, is
// posted twice.

// nonceWindow is how long after a post that got no answer (a reply's or a draft's) a post of
// the same message is left to Discord's enforced nonce alone. Discord says "a few minutes";
// one leaves room for that to mean less. It is measured from before the post was requested,
// on this process's clock, so the time Discord took to make it only adds to the margin.
const nonceWindow = time.Minute

// clockSkew is how much earlier than it was made, on Discord's clock, the parts of an
// outbound this process made are looked for.
const clockSkew = time.Minute

// discordEpoch is the Unix time in milliseconds at which Discord's snowflakes start (2015).
const discordEpoch = 1420070400000

// mustRead reports whether the next post of out, at now, may come later than Discord enforces
// the nonce of an earlier post of it, so that its channel must be read first (postedBefore).
// prog is how far this process's send of it got, known when the process has a record of it,
// and lost is when the process last forgot its records (zero for never).
func mustRead(out *platforms.Outbound, prog sendProgress, known bool, lost, now time.Time) bool {
	switch {
	case out.Again && prog.checked.IsZero():
		return true // an earlier send, not this process's, may have posted it at any time
	case !prog.posted.IsZero():
		return now.Sub(prog.posted) > nonceWindow
	case !known && !lost.IsZero():
		// Its record may have been forgotten: one made after that had none to forget.
		return !out.CreatedAt.After(lost)
	}
	return false
}

// mayHavePosted reports whether a post that failed with err may have made its message all the
// same, its answer lost: unless its request never went out (notSent), or Discord refused it
// (a 4xx, but for a timeout; a 429 is waited out, and ends as notSent). Nil, for a post that
// did not fail, is false.
func mayHavePosted(err error) bool {
	var ns *notSent
	if err == nil || errors.As(err, &ns) {
		return false
	}
	s := restStatus(err)
	return s < 400 || s >= 500 || s == http.StatusRequestTimeout
}

// postedBefore reads channel for the parts of out, from the part prog.parts on, that the bot
// posted already, and returns how far the send got: the parts posted, in order, and when the
// read began. A channel that is gone, or an auto-thread not open yet (404), holds none. One
// whose history the bot may not read (403: no Read Message History permission) is taken to
// hold none, with a warning: the reply would never go out otherwise.
func (p *Platform) postedBefore(ctx context.Context, out *platforms.Outbound, channel string, parts []string, prog sendProgress) (sendProgress, error) {
	from := prog.parts
	got := sendProgress{parts: from, checked: p.now()}
	bot, err := p.self(ctx)
	if err != nil {
		return sendProgress{}, fmt.Errorf("look up the bot's user: %w", err)
	}
	// The reply came after the messages it answers: the newest of them, whose id Discord
	// assigned, bounds the read on Discord's own clock.
	after := ""
	for _, id := range out.InReplyTo {
		if snowflakeLess(after, id) {
			after = id
		}
	}
	if !out.Again || after == "" {
		// A time of this process's clock narrows the read (clockSkew covers its offset from
		// Discord's), but not an outbound of another process (Again), whose CreatedAt is of
		// that process's clock: in a cluster, one running ahead by more than clockSkew put
		// the read's start after the earlier post, and the reply was posted twice.
		since := out.CreatedAt
		if !prog.posted.IsZero() && (since.IsZero() || prog.posted.Before(since)) {
			// This process posted it before the time its outbound says it was made: that
			// time is of a clock ahead of this one's (or this one was set back since).
			since = prog.posted
		}
		if at := snowflakeAt(since.Add(-clockSkew)); snowflakeLess(after, at) {
			after = at
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
	return answers(m) == ref
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

// Drafts past the nonce window. A streaming reply's draft is posted (SendDraft) with a nonce
// made from its key, and the platform actor tries a post that failed again, with the same key,
// until one succeeds or is refused for good: through an outage of any length, each try with the
// text the turn has streamed by then. A try later than Discord enforces the nonce of an earlier
// try that Discord made (its answer lost) made a second draft, and the first stayed in the chat
// for good, showing the start of an answer, never finished nor marked. The runtime does not
// tell SendDraft when the draft's first try was made, and need not: every try of a draft comes
// to this process (a draft is not tried again after a restart: its message runs again, under
// another key). So the platform remembers, by key, when the first try that may have made the
// draft without an answer was made and what each such try posted (draftTries; a try held back
// by a rate limit, or refused, made nothing: mayHavePosted), and a try more than nonceWindow
// after that first one, or after the last read for it, first reads the channel for the bot's
// message that answers the same message with the text of one of the tries, and takes it for the
// draft. Not covered, as for a reply: a try posted more than backfillPages pages of messages
// after the first, the tries past the first maxDraftTexts of one draft, and a draft tried again
// after its record made room for others' (maxProgress, forgetStalestDraft).

// maxDraftTexts is how many distinct texts of one draft's tries are remembered. A try posts the
// text streamed by then, so a draft tried again through a long outage while its turn streams
// has one for each try.
const maxDraftTexts = 256

// draftTries is what the platform knows of the tries of a draft's post that it has no answer
// to: when the first and the latest were made, when the channel was last read for them (zero
// for never), and the texts they posted (sha256 of each, without surrounding space).
type draftTries struct {
	first   time.Time
	last    time.Time
	checked time.Time
	texts   [][sha256.Size]byte
}

// draftSum is the sum a try of a draft's post that says text is remembered by.
func draftSum(text string) [sha256.Size]byte { return sha256.Sum256([]byte(strings.TrimSpace(text))) }

// triedDraft records a try of the post of the draft key that says text, made at at, that may
// have made the draft without an answer (mayHavePosted). One that surely made nothing (a rate
// limit waited out, Discord's refusal) is no try to look for: a draft held back by a rate limit
// for minutes does not read its channel.
func (p *Platform) triedDraft(key, text string, at time.Time) {
	if key == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.drafting[key]
	if t == nil {
		if len(p.drafting) >= maxProgress {
			p.forgetStalestDraft()
		}
		t = &draftTries{first: at}
		p.drafting[key] = t
	}
	t.last = later(t.last, at)
	if sum := draftSum(text); len(t.texts) < maxDraftTexts && !slices.Contains(t.texts, sum) {
		t.texts = append(t.texts, sum)
	}
}

// forgetStalestDraft forgets the tries of the draft that was tried, or read for, longest ago,
// to make room for another: one that may be posted twice past the nonce window if it is tried
// again. A draft in progress is tried again until a try is answered, through an outage of any
// length, so the stalest is one whose turn ended or whose run stopped without an answer.
// Before, every draft was forgotten at once, and those in progress with them. p.mu is held.
func (p *Platform) forgetStalestDraft() {
	stalest, at := "", time.Time{}
	for key, t := range p.drafting {
		if u := later(t.last, t.checked); stalest == "" || u.Before(at) {
			stalest, at = key, u
		}
	}
	delete(p.drafting, stalest)
}

// draftAnswered forgets the tries of the draft key: one was answered, with the draft or with
// Discord's refusal (nothing was made), or the draft was found.
func (p *Platform) draftAnswered(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.drafting, key)
}

// draftPostedBefore returns the draft key's message that an earlier try posted, if one may have
// been made more than nonceWindow ago, and a read of channel since its first try finds it: the
// bot's message answering ref ("" for none) with the text of one of the tries. A channel that
// is gone, or whose history the bot may not read, holds none (the try is posted, and a read
// refused for good says it may show twice).
func (p *Platform) draftPostedBefore(ctx context.Context, channel, key, ref string, inReplyTo []string) (*discordgo.Message, error) {
	p.mu.Lock()
	var tries draftTries
	t := p.drafting[key]
	if t != nil {
		tries = draftTries{first: t.first, checked: t.checked, texts: slices.Clone(t.texts)}
	}
	p.mu.Unlock()
	now := p.now()
	if t == nil || now.Sub(later(tries.first, tries.checked)) <= nonceWindow {
		return nil, nil
	}
	bot, err := p.self(ctx)
	if err != nil {
		return nil, fmt.Errorf("look up the bot's user: %w", err)
	}
	after := snowflakeAt(tries.first.Add(-clockSkew))
	for _, id := range inReplyTo {
		if snowflakeLess(after, id) {
			after = id // the draft came after the messages it answers
		}
	}
	found, err := p.findDraft(ctx, channel, key, after, bot, ref, tries.texts)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if t := p.drafting[key]; t != nil && now.After(t.checked) {
		t.checked = now
	}
	p.mu.Unlock()
	if found != nil {
		p.log.Info("discord draft tried again was posted before; the draft found is used", "channel", channel, "turn", key, "draft", found.ID)
	}
	return found, nil
}

// findDraft reads channel after the message after for the bot's message that answers ref with
// one of texts (of the tries of the draft key), and returns the first it finds.
func (p *Platform) findDraft(ctx context.Context, channel, key, after, bot, ref string, texts [][sha256.Size]byte) (*discordgo.Message, error) {
	for range backfillPages {
		page, err := p.messages(ctx, channel, "after", after)
		switch {
		case restStatus(err) == http.StatusNotFound:
			return nil, nil
		case err != nil && refusedForGood(err):
			p.log.Warn("discord cannot look for a draft tried again in its channel; posting it, which may show it twice",
				"channel", channel, "turn", key, logging.Err(err))
			return nil, nil
		case err != nil:
			return nil, fmt.Errorf("read channel %s for the draft posted before: %w", channel, err)
		}
		for _, m := range page {
			if m.Author != nil && m.Author.ID == bot && answers(m) == ref && slices.Contains(texts, draftSum(m.Content)) {
				return m, nil
			}
		}
		if len(page) < backfillPageSize {
			return nil, nil
		}
		after = page[len(page)-1].ID
	}
	return nil, nil
}

// answers is the message m references, or "".
func answers(m *discordgo.Message) string {
	if m.MessageReference == nil {
		return ""
	}
	return m.MessageReference.MessageID
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
