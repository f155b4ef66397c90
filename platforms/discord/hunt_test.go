package discord_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms/discord"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// The hunt's guild channels: one that needs a mention, one that answers everything, and a
// user's thread under each (a thread follows its parent's rule).
const (
	huntFree         = "200000000000000002"
	huntMentionTopic = "210000000000000011"
	huntFreeTopic    = "210000000000000012"
)

var (
	huntDMs   = []string{dmID, "300000000000000002", "300000000000000003"}
	huntUsers = []discordtest.User{alice, bob, {ID: "400000000000000003", Username: "carol", GlobalName: "Carol"}}
	huntBot   = discordtest.User{ID: "400000000000000009", Username: "otherbot", Bot: true}
	huntToken = regexp.MustCompile(`q[0-9]{4}`)
)

// huntSeeds are the seeds the suite runs, with short hunts (a few seconds each);
// AGENTGATE_DISCORD_SEEDS=N runs seeds 1…N instead, with longer ones, and
// AGENTGATE_DISCORD_FIRST_SEED=F makes them F…F+N-1 (to sweep fresh seeds or replay one).
func huntSeeds(t *testing.T) (seeds []uint64, steps int) {
	v := os.Getenv("AGENTGATE_DISCORD_SEEDS")
	if v == "" {
		// Between them: auto-threads, the slow agent, a restart, invalidated gateway sessions,
		// a failed history read, disconnects and a lost response.
		return []uint64{5, 6}, 14
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("AGENTGATE_DISCORD_SEEDS=%q: want a positive number", v)
	}
	first := uint64(1)
	if f := os.Getenv("AGENTGATE_DISCORD_FIRST_SEED"); f != "" {
		if first, err = strconv.ParseUint(f, 10, 64); err != nil {
			t.Fatalf("AGENTGATE_DISCORD_FIRST_SEED=%q: %v", f, err)
		}
	}
	seeds = make([]uint64, n)
	for i := range seeds {
		seeds[i] = first + uint64(i)
	}
	return seeds, 25
}

// hunted is a message the hunt posted, and what should become of it.
type hunted struct {
	n      int // order of posting
	msg    *discordgo.Message
	token  string
	answer bool   // past the gate: the bot answers it
	reply  string // the channel its answer goes to
	chat   string // its chat in the store (a thread's parent)
	key    string // its session key
	order  string // the answers of one session in one channel come in posting order
	ref    bool   // its answer references it
}

// TestHuntDiscord drives a whole daemon against the fake Discord with a seeded random mix of
// user messages (DMs, a channel that needs a mention, a free-response channel, threads under
// both, auto-threads, other bots), gateway disconnects and invalidated sessions (backfill),
// REST failures (5xx, responses lost after the post, 429s) and daemon restarts on the same
// data directory, and then checks what Discord shows and what the store holds: every message
// the bot answers is answered once, in its own channel, as a reply to it, a session's answers
// in order, and nothing the gate refuses stored.
func TestHuntDiscord(t *testing.T) {
	seeds, steps := huntSeeds(t)
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { huntDiscord(t, seed, steps) })
	}
}

func huntDiscord(t *testing.T, seed uint64, minSteps int) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	autoThread, slow := rng.IntN(2) == 0, rng.IntN(2) == 0
	h := &hunt{t: t, rng: rng, autoThread: autoThread, byToken: map[string]*hunted{}}
	h.gate.Store(new(make(chan struct{})))
	agent := echoAgent
	if slow {
		// A slow agent: each turn runs until the hunt's next step, so turns are caught by
		// restarts (drain deadline, rerun at the next start), disconnects and queued messages.
		agent = agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			select {
			case <-*h.gate.Load():
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return echoAgent(ctx, req)
		})
	}
	w := startWorld(t, agent, func(c *config.Config) {
		c.Platforms.Discord.FreeResponseChannels = []string{huntFree}
		c.Platforms.Discord.AutoThread = autoThread
		c.Shutdown.DrainTimeout = 200 * time.Millisecond
	})
	h.w = w
	w.srv.AddChannel(discordtest.Channel{ID: huntFree, GuildID: guildID, Type: discordgo.ChannelTypeGuildText, Name: "free"})
	w.srv.AddChannel(discordtest.Channel{ID: huntMentionTopic, GuildID: guildID, Type: discordgo.ChannelTypeGuildPublicThread,
		ParentID: channelID, OwnerID: alice.ID, Name: "topic"})
	w.srv.AddChannel(discordtest.Channel{ID: huntFreeTopic, GuildID: guildID, Type: discordgo.ChannelTypeGuildPublicThread,
		ParentID: huntFree, OwnerID: bob.ID, Name: "free topic"})
	for _, dm := range huntDMs[1:] {
		w.srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
	}
	t.Logf("seed %d: auto_thread %v, slow agent %v", seed, autoThread, slow)
	// Every chat is known to the store before faults begin: backfill after a restart reads
	// only the chats the store took a message from.
	for i, dm := range huntDMs {
		h.post(dm, huntUsers[i], false)
	}
	for _, ch := range []string{channelID, huntFree, huntMentionTopic, huntFreeTopic} {
		h.post(ch, alice, true)
	}
	h.quiesce()

	// The platform reconnects with backoff doubling from 1 s, reset only by a run that lasted a
	// minute: a few gateway faults per daemon keep the waits short.
	running, gatewayFaults := true, 0
	steps := minSteps + rng.IntN(minSteps/2)
	for step := range steps {
		h.release()
		switch r := rng.IntN(100); {
		case r < 55:
			for range 1 + rng.IntN(3) {
				h.postRandom()
			}
		case r < 62 && running && gatewayFaults < 3:
			gatewayFaults++
			w.srv.WaitReady(t)
			t.Logf("step %d: disconnect", step)
			w.srv.Disconnect()
		case r < 68 && running && gatewayFaults < 3:
			gatewayFaults++
			w.srv.WaitReady(t)
			t.Logf("step %d: invalidate the gateway session", step)
			w.srv.InvalidateSession()
		case r < 74:
			n := 1 + rng.IntN(2)
			t.Logf("step %d: fail the next %d posts", step, n)
			w.srv.FailNext("POST", "/messages", 500, n)
			h.postFaults += n
		case r < 79:
			t.Logf("step %d: lose the next post's response", step)
			w.srv.FailNextAfter("POST", "/messages", 500, 1)
			h.postFaults++
		case r < 84:
			t.Logf("step %d: rate limit the next post", step)
			w.srv.RateLimitNext("POST", "/messages", time.Duration(50+rng.IntN(200))*time.Millisecond, 1)
		case r < 88:
			t.Logf("step %d: fail the next history read", step)
			w.srv.FailNext("GET", "/messages", 500, 1)
		case r < 95:
			if running {
				t.Logf("step %d: stop the daemon", step)
				w.stopKeepingLog(t, step)
			} else {
				t.Logf("step %d: start the daemon", step)
				w.start(t)
				gatewayFaults = 0
			}
			running = !running
		default:
			t.Logf("step %d: wait for quiescence", step)
			if running {
				h.quiesce()
			}
		}
	}
	if !running {
		w.start(t)
	}
	h.quiesce()
	h.check()
}

type hunt struct {
	t          *testing.T
	w          *world
	rng        *rand.Rand
	autoThread bool
	gate       atomic.Pointer[chan struct{}] // the slow agent's turns end when it closes
	// postFaults counts the failed posts injected since the last quiesce and those still to
	// come then: one key's sends may meet them all, one after another, and wait out the send
	// backoff after each.
	postFaults int
	posted     []*hunted
	byToken    map[string]*hunted
}

// release ends the slow agent's running turns.
func (h *hunt) release() {
	close(*h.gate.Swap(new(make(chan struct{}))))
}

// postRandom posts a random message: in a random chat, from a random user (sometimes another
// bot), with or without a mention.
func (h *hunt) postRandom() {
	chats := []string{channelID, huntFree, huntMentionTopic, huntFreeTopic}
	chats = append(chats, huntDMs...)
	for _, th := range h.w.srv.Threads() { // the bot's auto-threads
		chats = append(chats, th.ID)
	}
	ch := chats[h.rng.IntN(len(chats))]
	user := huntUsers[h.rng.IntN(len(huntUsers))]
	if i := slices.Index(huntDMs, ch); i >= 0 {
		user = huntUsers[i] // a DM is one user's
	} else if h.rng.IntN(10) == 0 {
		user = huntBot
	}
	h.post(ch, user, h.rng.IntN(2) == 0)
}

// post posts a message and records what should become of it.
func (h *hunt) post(ch string, user discordtest.User, mention bool) {
	n := len(h.posted)
	token := fmt.Sprintf("q%04d", n)
	dm := slices.Contains(huntDMs, ch)
	if dm {
		mention = false
	}
	m := h.w.srv.Post(discordtest.UserMessage{ChannelID: ch, Author: user, Content: "say " + token, MentionBot: mention})
	hm := &hunted{n: n, msg: m, token: token, reply: ch, chat: ch, ref: true}
	src := identity.Source{Platform: discord.Name, ChatID: ch, UserID: user.ID}
	switch {
	case user.Bot:
	case dm:
		hm.answer, src.ChatType, src.UserID = true, identity.ChatDM, ""
	case ch == channelID:
		hm.answer, src.ChatType = mention, identity.ChatChannel
		if mention && h.autoThread {
			hm.reply, hm.ref = m.ID, false
			src.ChatType, src.ThreadID, src.UserID = identity.ChatThread, m.ID, ""
		}
	case ch == huntFree:
		hm.answer, src.ChatType = true, identity.ChatChannel
	case ch == huntMentionTopic:
		hm.answer, hm.chat = mention, channelID
		src.ChatType, src.ChatID, src.ThreadID, src.UserID = identity.ChatThread, channelID, ch, ""
	default: // the free channel's thread, or one of the bot's auto-threads
		hm.answer, hm.chat = true, channelID
		if ch == huntFreeTopic {
			hm.chat = huntFree
		}
		src.ChatType, src.ChatID, src.ThreadID, src.UserID = identity.ChatThread, hm.chat, ch, ""
	}
	hm.key = identity.Key(src, identity.DefaultKeyOptions)
	hm.order = hm.reply + " " + hm.key
	h.posted = append(h.posted, hm)
	h.byToken[token] = hm
}

// sent is every message the bot posted, by channel, in order (auto-threads included).
func (h *hunt) sent() map[string][]*discordgo.Message {
	chans := []string{channelID, huntFree, huntMentionTopic, huntFreeTopic}
	chans = append(chans, huntDMs...)
	for _, th := range h.w.srv.Threads() {
		chans = append(chans, th.ID)
	}
	out := map[string][]*discordgo.Message{}
	for _, ch := range chans {
		out[ch] = h.w.srv.Sent(ch)
	}
	return out
}

// notice reports whether m is one of the platform's answers about a message it did not take.
func notice(m *discordgo.Message) bool {
	return !strings.HasPrefix(m.Content, "echo: ") && m.MessageReference != nil
}

// answers counts, per posted message, the bot's answers to it: echoes carrying its token,
// and notices referencing it.
func (h *hunt) answers() map[*hunted]int {
	got := map[*hunted]int{}
	byID := map[string]*hunted{}
	for _, hm := range h.posted {
		byID[hm.msg.ID] = hm
	}
	for _, ms := range h.sent() {
		for _, m := range ms {
			if notice(m) {
				if hm := byID[m.MessageReference.MessageID]; hm != nil {
					got[hm]++
				}
				continue
			}
			for _, tok := range huntToken.FindAllString(m.Content, -1) {
				if hm := h.byToken[tok]; hm != nil {
					got[hm]++
				}
			}
		}
	}
	return got
}

// quiesce waits until every message the bot answers has an answer and every reply in the
// store is delivered.
func (h *hunt) quiesce() {
	h.t.Helper()
	within := discordtest.WaitTimeout + sendBackoffs(h.postFaults)
	eventually := func(t *testing.T, what string, cond func() bool, why func() string) {
		t.Helper()
		if !pollWithin(within, cond) {
			t.Fatalf("timed out waiting: %s: %s", what, why())
		}
	}
	w := h.w
	w.srv.WaitReady(h.t)
	var missing string
	eventually(h.t, "every message answered and every reply delivered", func() bool {
		h.release()
		got := h.answers()
		for _, hm := range h.posted {
			if hm.answer && got[hm] == 0 {
				missing = fmt.Sprintf("no answer to %s (%s in %s)", hm.token, hm.msg.ID, hm.msg.ChannelID)
				return false
			}
		}
		keys := map[string]bool{}
		for _, hm := range h.posted {
			if hm.answer && !keys[hm.key] {
				keys[hm.key] = true
				out, err := w.d.Store().OutboxAfter(h.t.Context(), hm.key, 0, 1000)
				if err != nil {
					return false
				}
				for _, o := range out {
					if o.State != persistence.DeliveryDelivered {
						missing = fmt.Sprintf("outbox %s/%d %q is %s", o.SessionKey, o.Seq, o.Text, o.State)
						return false
					}
				}
			}
		}
		return true
	}, func() string { return missing })
	h.postFaults = w.srv.PendingFaults("POST")
}

// sendBackoffs is the longest that n failed sends in a row hold a key's next send: the platform
// actor's send backoff, 0.5 s doubling to 30 s (ARCHITECTURE "One message").
func sendBackoffs(n int) time.Duration {
	var d time.Duration
	for i := range n {
		d += min(500*time.Millisecond<<min(i, 16), 30*time.Second)
	}
	return d
}

// check checks what Discord shows and what the store holds against what was posted.
func (h *hunt) check() {
	t := h.t
	got := h.answers()
	lastInOrder := map[string]int{}
	for ch, ms := range h.sent() {
		for _, m := range ms {
			if notice(m) {
				t.Logf("notice in %s: %q (to %s)", ch, m.Content, m.MessageReference.MessageID)
				continue
			}
			toks := huntToken.FindAllString(m.Content, -1)
			if len(toks) == 0 {
				t.Errorf("bot posted %q in %s, an answer to nothing that was said", m.Content, ch)
			}
			for _, tok := range toks {
				hm := h.byToken[tok]
				if hm == nil {
					t.Errorf("bot posted %q in %s, answering a message never posted", m.Content, ch)
					continue
				}
				if ch != hm.reply {
					t.Errorf("message %s (%s in %s) answered in %s, want %s", hm.token, hm.msg.ID, hm.msg.ChannelID, ch, hm.reply)
				}
				if !hm.answer {
					t.Errorf("message %s (%s in %s), which the gate refuses, was answered: %q", hm.token, hm.msg.ID, hm.msg.ChannelID, m.Content)
				}
				if last, ok := lastInOrder[hm.order]; ok && last > hm.n {
					t.Errorf("in %s, message q%04d answered after q%04d, which was posted later", hm.order, hm.n, last)
				}
				lastInOrder[hm.order] = max(lastInOrder[hm.order], hm.n)
			}
			if len(toks) == 1 {
				hm := h.byToken[toks[0]]
				if hm == nil {
					continue
				}
				ref := ""
				if m.MessageReference != nil {
					ref = m.MessageReference.MessageID
				}
				if hm.ref && ref != hm.msg.ID {
					t.Errorf("the answer to %s (%s) references %q, want the message", hm.token, hm.msg.ID, ref)
				}
			}
		}
	}
	for _, hm := range h.posted {
		if hm.answer && got[hm] != 1 {
			t.Errorf("message %s (%s in %s) answered %d times, want once", hm.token, hm.msg.ID, hm.msg.ChannelID, got[hm])
		}
		stored, err := h.w.d.Store().FindInbound(t.Context(), discord.Name, hm.chat, hm.msg.ID)
		switch {
		case errors.Is(err, persistence.ErrNotFound):
			if hm.answer {
				// A message the platform told its sender it did not take is not stored.
				t.Logf("message %s (%s in %s) not stored", hm.token, hm.msg.ID, hm.msg.ChannelID)
			}
		case err != nil:
			t.Fatalf("FindInbound(%s): %v", hm.msg.ID, err)
		case !hm.answer:
			t.Errorf("message %s (%s in %s), which the gate refuses, was stored", hm.token, hm.msg.ID, hm.msg.ChannelID)
		default:
			s, err := h.w.d.Store().Session(t.Context(), stored.SessionID)
			if err != nil {
				t.Fatalf("Session(%s): %v", stored.SessionID, err)
			}
			if s.Key != hm.key || stored.UserID != hm.msg.Author.ID {
				t.Errorf("message %s stored in %s from %s, want %s from %s", hm.token, s.Key, stored.UserID, hm.key, hm.msg.Author.ID)
			}
		}
	}
}

// stopKeepingLog stops the world's daemon at a hunt's step; a failed test prints its log.
func (w *world) stopKeepingLog(t *testing.T, step int) {
	earlier := w.log
	w.stop(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log of a daemon stopped at step %d:\n%s", step, earlier.String())
		}
	})
}
