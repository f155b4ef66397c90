package discord

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/platforms"
)

// Send posts one outbound message, split at MaxMessageLen. The first part answers the message
// that triggered it. Each part carries a nonce Discord enforces, and the parts already posted
// are remembered, so a retry after a failed part neither repeats nor loses one; a send past
// the nonce's few minutes first reads the channel for the parts posted before (resend.go). A
// reply into an auto-thread that could not be opened when its message arrived opens the
// thread first.
func (p *Platform) Send(ctx context.Context, out *platforms.Outbound) error {
	p.forgetDelivered(out.InReplyTo) // answered: their deletion changes nothing now
	channel := replyChannel(out.Target)
	if blank(out.Text) {
		// An agent may answer nothing; Discord refuses an empty message (50006), so nothing is
		// posted and the reply counts as delivered. A draft keeps what it showed.
		p.log.Debug("discord: empty reply; nothing posted", "channel", channel, "turn", out.TurnID)
		if out.TurnEnd {
			p.typing.turnEnded(replyChannel(out.Target), out.InReplyTo)
		}
		return nil
	}
	parts := capParts(Split(out.Text, MaxMessageLen))
	id := out.SessionKey + "/" + strconv.FormatInt(out.Seq, 10)
	p.mu.Lock()
	prog, known := p.progress[id]
	lost := p.forgot
	p.mu.Unlock()
	if out.DraftID != "" && prog.parts == 0 {
		switch err := p.editContent(ctx, channel, out.DraftID, parts[0]); {
		case err == nil:
			prog.parts = 1
		case apiCode(err) == discordgo.ErrCodeUnknownMessage || refusedForGood(err):
			// The draft is gone (deleted by someone) or cannot be edited: post the reply whole.
			p.log.Info("discord draft gone; posting the reply anew", "channel", channel, "draft", out.DraftID, logging.Err(err))
		default:
			return fmt.Errorf("discord: finish draft: %w", err)
		}
	}
	if prog.parts < len(parts) && mustRead(out, prog, known, lost, p.now()) {
		var err error
		if prog, err = p.postedBefore(ctx, out, channel, parts, prog); err != nil {
			return fmt.Errorf("discord: send: %w", err)
		}
	}
	for i := prog.parts; i < len(parts); i++ {
		msg := &sendBody{Content: parts[i], AllowedMentions: noMentions(), Nonce: nonce(id, i), EnforceNonce: true}
		if ref := replyRef(out); i == 0 && ref != "" {
			msg.Reference = &discordgo.MessageReference{MessageID: ref, ChannelID: channel, FailIfNotExists: new(false)}
		}
		began := p.now()
		_, err := p.post(ctx, channel, msg)
		made := mayHavePosted(err) // a post of the part may have made its message, its answer lost
		if apiCode(err) == discordgo.ErrCodeUnknownChannel && p.unopenedThread(out) && channel == out.Target.ThreadID {
			// An unknown message (a private thread, which no message starts, or a thread
			// whose starter was deleted) leaves err refused for good: the reply is not posted
			// in the channel, where those who could not see the thread would read it.
			switch err = p.startThread(ctx, out.Target.ChatID, out.Target.ThreadID, "conversation"); {
			case err == nil:
				_, err = p.post(ctx, channel, msg)
				made = mayHavePosted(err)
			case threadsRefused(err):
				// The thread can never be opened (no permission to): answer in the channel,
				// under the message the thread was for.
				p.log.Warn("discord refuses the reply's thread; answering in the channel", "channel", out.Target.ChatID,
					"session", out.SessionKey, "seq", out.Seq, logging.Err(err))
				channel = out.Target.ChatID
				msg.Reference = nil
				if i == 0 {
					msg.Reference = &discordgo.MessageReference{MessageID: out.Target.ThreadID, ChannelID: channel, FailIfNotExists: new(false)}
				}
				_, err = p.post(ctx, channel, msg)
				made = mayHavePosted(err)
			}
		}
		if err != nil && refusedForGood(err) {
			p.forget(id) // never sent again
			if out.TurnEnd {
				p.typing.turnEnded(replyChannel(out.Target), out.InReplyTo)
			}
			if placeGone(err) {
				err = fmt.Errorf("%w: %w", platforms.ErrDeleted, err)
			}
			return fmt.Errorf("discord: send part %d of %d to channel %s: %w: %w", i+1, len(parts), channel, platforms.ErrUndeliverable, err)
		}
		if err != nil {
			prog.parts = i
			if made && prog.posted.IsZero() {
				prog.posted = began
			}
			p.remember(id, prog)
			return fmt.Errorf("discord: send part %d of %d to channel %s: %w", i+1, len(parts), channel, err)
		}
		prog.posted = time.Time{} // answered: so are the posts of this part before
		if i == prog.parts && channel == out.Target.ThreadID {
			p.markOpened(channel)
		}
	}
	p.forget(id)
	if out.TurnEnd {
		p.typing.turnEnded(replyChannel(out.Target), out.InReplyTo)
	}
	return nil
}

// blank reports whether Discord keeps nothing of text but white space, and so refuses it as an
// empty message (50006): it strips control characters and the bidirectional overrides and
// isolates before it reads a message's content (the warning on Create Message in its API docs;
// discord-api-docs#1189). The session takes the control characters out of a reply (its
// shownText) but for tab, line feed, carriage return and ESC; an outbox entry stored before it
// did, sent again after an upgrade, may hold nothing else, and a reply may be bidirectional
// marks alone. Before, either was posted, refused for good, logged at ERR and recorded failed
// (TestReplyOfWhatDiscordStripsPostsNothing).
func blank(text string) bool {
	return strings.TrimFunc(text, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r) || r >= '\u202a' && r <= '\u202e' || r >= '\u2066' && r <= '\u2069'
	}) == ""
}

// MaxReplyParts is how many messages one reply may become; what follows is cut, and a last
// message says so. An agent's reply may run to a megabyte (some 500 messages), which would
// flood the channel for minutes under Discord's rate limits.
const MaxReplyParts = 10

// capParts keeps the first MaxReplyParts parts and says how much was cut.
func capParts(parts []string) []string {
	if len(parts) <= MaxReplyParts {
		return parts
	}
	cut := 0
	for _, p := range parts[MaxReplyParts:] {
		cut += utf8.RuneCountInString(p)
	}
	return append(parts[:MaxReplyParts:MaxReplyParts],
		fmt.Sprintf("… (the reply goes on for about %d more characters, too long for Discord; the whole of it is in the session's transcript)", cut))
}

// unopenedThread reports whether the thread out goes to may be an auto-thread not opened yet:
// one whose id is the id of the message it starts from, so it can be opened from that message.
// A thread known to have been open is not: Discord's 404 for it means it was deleted (a
// moderator's act), and opening it again would undo that. It is known when this process
// opened it, posted in it or heard of its deletion, and when out answers a message posted in
// it (any but its starter, which is in the parent channel): after a restart, or a gateway
// session lost with its THREAD_DELETE, that is all there is to tell a deleted thread from one
// whose opening failed. Before, such a thread was opened again for the reply.
func (p *Platform) unopenedThread(out *platforms.Outbound) bool {
	target := out.Target
	if !p.cfg.AutoThread || target.ChatType != identity.ChatThread || target.ThreadID == "" {
		return false
	}
	if slices.ContainsFunc(out.InReplyTo, func(id string) bool { return id != target.ThreadID }) {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.opened[target.ThreadID]
}

// placeGone reports whether Discord's refusal of a reply's post says that where it was to go was
// deleted, not that the bot may not post there: its channel or thread (10003 Unknown Channel: a
// moderator deleted the thread, or the channel), or the message its auto-thread was to open from
// (10008 Unknown Message, from the thread's opening: its starter was deleted, whether or not the
// reply answers it; a private thread has none, and its post said Unknown Channel). The reply is
// undeliverable, and there is nothing for the operator to fix (platforms.ErrDeleted). A post's
// reply reference does not fail when its message is gone (FailIfNotExists false), so a 10008
// comes only from the opening. Before, only a 10008 of a reply to the starter itself was taken
// so; the others logged the ERR line that asks for the bot's permissions.
func placeGone(err error) bool {
	code := apiCode(err)
	return code == discordgo.ErrCodeUnknownChannel || code == discordgo.ErrCodeUnknownMessage
}

// threadsRefused reports whether Discord refuses for good to open a thread in a channel: the
// bot may not (403), or the channel takes none (50024). Not when the message to open it from is
// unknown (404): that is a thread that is gone, not one that could not be opened.
func threadsRefused(err error) bool {
	return restStatus(err) == http.StatusForbidden || apiCode(err) == discordgo.ErrCodeCannotExecuteActionOnThisChannelType
}

// sendProgress is how far the send of an outbound got in this process: its first parts are
// posted; as of checked (when not zero) a read of its channel found no later part posted
// (postedBefore); and posted (when not zero) is when the first of this process's posts of the
// next part since then that has no answer was made (resend.go).
type sendProgress struct {
	parts   int
	checked time.Time
	posted  time.Time
}

// remember records how far the send of the outbound id got. Nothing is kept of one that nothing
// is known of (a send held back by a rate limit before its first post): a backlog of replies
// takes no room. Past maxProgress outbounds, all are forgotten, and when (forgot), so that
// a send that finds none first reads its channel (mustRead).
func (p *Platform) remember(id string, s sendProgress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s == (sendProgress{}) {
		delete(p.progress, id)
		return
	}
	if _, ok := p.progress[id]; !ok && len(p.progress) >= maxProgress {
		clear(p.progress)
		p.forgot = p.now()
	}
	p.progress[id] = s
}

// forget drops what remember recorded of the outbound id: it is posted whole, or refused for
// good.
func (p *Platform) forget(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.progress, id)
}

// replyRef is the message a reply references: the last message it answers, unless that is
// the starter of the thread the reply goes to.
func replyRef(out *platforms.Outbound) string {
	if len(out.InReplyTo) == 0 {
		return ""
	}
	return refFor(out.Target, out.InReplyTo[len(out.InReplyTo)-1])
}

// SendDraft posts the first text of a streaming reply, with a nonce Discord enforces made from
// key: a retry after a lost answer returns the draft already posted (one later than Discord
// holds the nonce finds it in the channel: resend.go), which still shows the text of the try
// that posted it, and is edited to show text. Before, it kept that text: a cancelled turn's
// draft found so was left showing part of an answer without its interrupted mark
// (TestDraftFoundByItsKeyShowsTheNewText). When that edit fails, the draft's id comes with the
// error (TestDraftFoundButNotShownReturnsItsID).
func (p *Platform) SendDraft(ctx context.Context, target identity.Source, inReplyTo []string, key, text string) (string, error) {
	channel := replyChannel(target)
	content := draftText(text)
	msg := &sendBody{Content: content, AllowedMentions: noMentions()}
	if key != "" {
		msg.Nonce, msg.EnforceNonce = nonce("draft/"+key, 0), true
	}
	ref := replyRef(&platforms.Outbound{Target: target, InReplyTo: inReplyTo})
	if ref != "" {
		msg.Reference = &discordgo.MessageReference{MessageID: ref, ChannelID: channel, FailIfNotExists: new(false)}
	}
	// A try past the nonce window of an earlier one first looks for the draft it made (resend.go).
	m, err := p.draftPostedBefore(ctx, channel, key, ref, inReplyTo)
	if m == nil && err == nil {
		began := p.now()
		m, err = p.post(ctx, channel, msg)
		if mayHavePosted(err) {
			p.triedDraft(key, content, began)
		}
	}
	if err == nil || refusedForGood(err) {
		p.draftAnswered(key)
	}
	if err != nil && refusedForGood(err) {
		// Never made, and never will be: the final reply is posted as a message of its own
		// (Send), which opens an auto-thread that could not be opened yet, or is recorded as
		// failed. Before, the draft was tried again until the process stopped, and the
		// chat's replies waited behind it (found by an audit).
		return "", fmt.Errorf("discord: send draft: %w: %w", platforms.ErrUndeliverable, err)
	}
	if err != nil {
		return "", fmt.Errorf("discord: send draft: %w", err)
	}
	if channel == target.ThreadID {
		p.markOpened(channel)
	}
	if m.Content != content {
		if err := p.editContent(ctx, channel, m.ID, content); err != nil {
			// The draft is made: its id goes with the error, so that it is recorded.
			return m.ID, fmt.Errorf("discord: send draft: show the text of the draft found by its key: %w", err)
		}
	}
	return m.ID, nil
}

// EditDraft replaces the text of a streaming reply's draft.
func (p *Platform) EditDraft(ctx context.Context, target identity.Source, id, text string) error {
	if err := p.editContent(ctx, replyChannel(target), id, draftText(text)); err != nil {
		return fmt.Errorf("discord: edit draft: %w", err)
	}
	return nil
}

// DeleteDraft removes a streaming reply's draft that a crashed run left unfinished. A draft
// that is already gone (deleted by someone) is not an error.
func (p *Platform) DeleteDraft(ctx context.Context, target identity.Source, id string) error {
	channel := replyChannel(target)
	err := p.request(ctx, http.MethodDelete, discordgo.EndpointChannelMessage(channel, id), discordgo.EndpointChannelMessage(channel, ""), nil, nil)
	if err != nil && apiCode(err) != discordgo.ErrCodeUnknownMessage {
		return fmt.Errorf("discord: delete draft: %w", err)
	}
	return nil
}

// draftText is as much of a growing reply as fits one message, and its interrupted mark if it
// has one; the final reply is split.
func draftText(text string) string {
	r := []rune(text)
	if len(r) <= MaxMessageLen {
		return text
	}
	mark := ""
	if strings.HasSuffix(text, platforms.InterruptedMark) {
		mark = platforms.InterruptedMark
		r = []rune(strings.TrimSuffix(text, mark))
	}
	return string(r[:MaxMessageLen-1-utf8.RuneCountInString(mark)]) + "…" + mark
}

func (p *Platform) editContent(ctx context.Context, channel, id, text string) error {
	edit := &discordgo.MessageEdit{ID: id, Channel: channel, Content: &text, AllowedMentions: noMentions()}
	var m discordgo.Message
	return p.request(ctx, http.MethodPatch, discordgo.EndpointChannelMessage(channel, id), discordgo.EndpointChannelMessage(channel, ""), edit, &m)
}

// sendBody is a message create request. It is discordgo.MessageSend plus the nonce fields
// discordgo lacks: with enforce_nonce, Discord answers a repeated nonce with the message it
// already created instead of posting it twice.
type sendBody struct {
	Content         string                            `json:"content"`
	AllowedMentions *discordgo.MessageAllowedMentions `json:"allowed_mentions,omitempty"`
	Reference       *discordgo.MessageReference       `json:"message_reference,omitempty"`
	Nonce           string                            `json:"nonce,omitempty"`
	EnforceNonce    bool                              `json:"enforce_nonce,omitempty"`
}

// post creates a message. Its rate limits are handled by request.
func (p *Platform) post(ctx context.Context, channel string, body *sendBody) (*discordgo.Message, error) {
	ep := discordgo.EndpointChannelMessages(channel)
	var m discordgo.Message
	if err := p.request(ctx, http.MethodPost, ep, ep, body, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// noMentions keeps agent output from pinging anyone: no @everyone, roles or users.
func noMentions() *discordgo.MessageAllowedMentions {
	return &discordgo.MessageAllowedMentions{Parse: []discordgo.AllowedMentionType{}}
}

// nonce is the Discord nonce of one part of one outbound: 25 characters at most, the same on
// every attempt.
func nonce(id string, part int) string {
	sum := sha256.Sum256([]byte(id + "#" + strconv.Itoa(part)))
	return "ag" + hex.EncodeToString(sum[:11])
}

// refusedForGood reports whether Discord refused a request for good: a client error (4xx)
// other than a bad token (401: the operator's to fix, and every send waits for it), a timeout
// (408) or rate limiting (429, which request waits out while the call's deadline allows): a
// missing permission, an unknown channel, a user who takes no messages from the bot, an
// invalid body.
func refusedForGood(err error) bool {
	var re *discordgo.RESTError
	if !errors.As(err, &re) || re.Response == nil {
		return false
	}
	switch s := re.Response.StatusCode; s {
	case http.StatusUnauthorized, http.StatusRequestTimeout, http.StatusTooManyRequests:
		return false
	default:
		return s >= 400 && s < 500
	}
}

// restStatus is the HTTP status of a REST error, or 0.
func restStatus(err error) int {
	var re *discordgo.RESTError
	if errors.As(err, &re) && re.Response != nil {
		return re.Response.StatusCode
	}
	return 0
}

// apiCode is Discord's JSON error code of err, or 0.
func apiCode(err error) int {
	var re *discordgo.RESTError
	if errors.As(err, &re) && re.Message != nil {
		return re.Message.Code
	}
	return 0
}

// rewrite sends discordgo's REST requests to another base URL (a REST proxy, or a test server).
// discordgo names Discord's URL in what it returns (a failed request's *url.Error, a 429's
// RateLimit): the platform names the one requested instead (sentTo), so that a log line about a
// proxy that does not answer does not send the operator to look at discord.com.
type rewrite struct {
	base string // "" for none
	next http.RoundTripper
}

func newRewrite(base string, next http.RoundTripper) rewrite {
	if base != "" && !strings.HasSuffix(base, "/") {
		base += "/"
	}
	return rewrite{base: base, next: next}
}

// to returns the URL a request discordgo makes for u goes to.
func (r rewrite) to(u string) string {
	if r.base == "" || !strings.HasPrefix(u, discordgo.EndpointAPI) {
		return u
	}
	return r.base + strings.TrimPrefix(u, discordgo.EndpointAPI)
}

func (r rewrite) RoundTrip(req *http.Request) (*http.Response, error) {
	u := req.URL.String()
	to := r.to(u)
	if to == u {
		return r.next.RoundTrip(req)
	}
	nreq := req.Clone(req.Context())
	var err error
	if nreq.URL, err = nreq.URL.Parse(to); err != nil {
		return nil, fmt.Errorf("rewrite discord url: %w", err)
	}
	nreq.Host = nreq.URL.Host
	return r.next.RoundTrip(nreq)
}

// sentTo returns err with the URL of a failed request in it (a *url.Error) made the one
// requested (rewrite).
func (p *Platform) sentTo(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = p.api.to(ue.URL)
	}
	return err
}
