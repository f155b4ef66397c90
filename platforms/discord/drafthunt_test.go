package discord_test

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/actors"
	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms/discord"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// The draft hunt's chats: alice's and bob's DMs, the guild channel (a session per user) and a
// thread under it (one shared session).
const (
	draftDM2    = "300000000000000002"
	draftThread = "210000000000000011"
)

var (
	draftChats = []string{dmID, draftDM2, channelID, draftThread}
	draftToken = regexp.MustCompile(`q[0-9]{4}`)
	// draftLine is a whole line of a model's answer: its message's token, the attempt (the
	// model's n-th answer to that message) and the line number, or END.
	draftLine = regexp.MustCompile(`^(q[0-9]{4})/a([0-9]+)/(L[0-9]{3}|END)`)
	// unsureDraft is the WARN of a daemon that stopped while a draft's post was unanswered:
	// a try whose answer was lost may have made the draft, and then it stays in the chat.
	unsureDraft = regexp.MustCompile(`msg="stopping while a draft's post is unanswered[^"]*".* session=(\S+) turn=`)
)

// draftSeeds are the seeds the suite runs; AGENTGATE_DRAFT_SEEDS=N runs seeds 1…N instead,
// with longer hunts.
func draftSeeds(t *testing.T) (seeds []uint64, steps int) {
	v := os.Getenv("AGENTGATE_DRAFT_SEEDS")
	if v == "" {
		return []uint64{1, 2}, 12
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("AGENTGATE_DRAFT_SEEDS=%q: want a positive number", v)
	}
	first := uint64(1)
	if f := os.Getenv("AGENTGATE_DRAFT_FIRST_SEED"); f != "" {
		if first, err = strconv.ParseUint(f, 10, 64); err != nil {
			t.Fatalf("AGENTGATE_DRAFT_FIRST_SEED=%q: %v", f, err)
		}
	}
	for i := range n {
		seeds = append(seeds, first+uint64(i))
	}
	return seeds, 20
}

// TestHuntDrafts drives a whole daemon, with the Discord platform against the fake Discord and
// the OpenAI agent streaming from the fake model, through a seeded random mix of messages in
// DMs, a channel and a thread; streamed answers of random lengths (some over several Discord
// messages) and chunkings, slow streams, streams that break off and calls refused with 429 or
// 5xx; queue modes interrupt and followup; /stop, /new and /queue during streams; Discord REST
// faults on posts and edits (5xx, 429, lost responses); gateway disconnects; and daemon
// restarts on the same data directory. It then checks what the channels show against the
// outbox: every message is answered exactly once; every delivered outbox entry shows exactly
// once, whole, in its own chat, as a reply, in the session's order (a streamed reply where its
// draft was posted); nothing else shows but drafts marked interrupted, and a draft a stopping
// daemon warned it may have left (noteUnsure); and, sampled while it runs, no session ever
// shows two drafts in progress at once.
func TestHuntDrafts(t *testing.T) {
	seeds, steps := draftSeeds(t)
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { huntDrafts(t, seed, steps) })
	}
}

// draftModel is the fake model's behaviour: it answers the last user message of a request by
// its token, with an answer whose every line names the token and the attempt.
type draftModel struct {
	seed uint64
	gate atomic.Pointer[chan struct{}] // slow streams wait for it to close

	mu       sync.Mutex
	attempts map[string]int    // by token
	texts    map[string]string // by "token/a<n>": the whole answer of that attempt
	keyOf    map[string]string // by token: the session key of its message (set by the hunt)
}

func (m *draftModel) release() { close(*m.gate.Swap(new(make(chan struct{})))) }

// serve answers one request. Its body was recorded by openaitest; the hunt gives it here.
func (m *draftModel) serve(w http.ResponseWriter, r *http.Request, reqBody string) {
	var body struct {
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal([]byte(reqBody), &body); err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	tok := ""
	for i := len(body.Messages) - 1; i >= 0; i-- {
		if body.Messages[i].Role == "user" {
			// The newest message's token is the last: the agent sends a run of user messages
			// (an interrupted one and the next) joined into one.
			if ts := draftToken.FindAllString(body.Messages[i].Content, -1); len(ts) > 0 {
				tok = ts[len(ts)-1]
			}
			break
		}
	}
	m.mu.Lock()
	m.attempts[tok]++
	a := m.attempts[tok]
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", tok, a)
	rng := rand.New(rand.NewPCG(m.seed, h.Sum64()))
	text := draftAnswer(rng, tok, a)
	m.texts[fmt.Sprintf("%s/a%d", tok, a)] = text
	m.mu.Unlock()

	switch k := rng.IntN(100); {
	case k < 7:
		openaitest.Status(http.StatusTooManyRequests, `{"error":{"message":"slow down"}}`, "Retry-After: 0")(w, r)
		return
	case k < 12:
		openaitest.Status(http.StatusInternalServerError+rng.IntN(4), `{"error":{"message":"oops"}}`)(w, r)
		return
	}
	chunks := draftChunks(rng, text)
	slowAt, breakAt := -1, -1
	if rng.IntN(4) == 0 {
		slowAt = rng.IntN(len(chunks))
	}
	if rng.IntN(8) == 0 {
		breakAt = rng.IntN(len(chunks))
	}
	gate := *m.gate.Load()
	w.Header().Set("Content-Type", "text/event-stream")
	f := w.(http.Flusher)
	io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n")
	f.Flush()
	for i, c := range chunks {
		if i == breakAt {
			panic(http.ErrAbortHandler) // the connection drops mid-stream
		}
		if i == slowAt {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		b, _ := json.Marshal(c)
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%s},\"finish_reason\":null}]}\n\n", b)
		f.Flush()
		if rng.IntN(3) == 0 { // a stream paced like a model's, so drafts are edited as they grow
			select {
			case <-time.After(time.Duration(rng.IntN(15)) * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
	}
	io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n")
	io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}}\n\n")
	io.WriteString(w, "data: [DONE]\n\n")
}

// draftAnswer is the answer of one attempt: lines that each name the token, the attempt and
// the line, then an END line. One in four is long enough to need several Discord messages.
func draftAnswer(rng *rand.Rand, tok string, attempt int) string {
	n := 1 + rng.IntN(8)
	if rng.IntN(4) == 0 {
		n = 35 + rng.IntN(50)
	}
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%s/a%d/L%03d", tok, attempt, i+1)
		for range 2 + rng.IntN(8) {
			b.WriteByte(' ')
			for range 1 + rng.IntN(7) {
				b.WriteByte(byte('a' + rng.IntN(26)))
			}
		}
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "%s/a%d/END", tok, attempt)
	return b.String()
}

// draftChunks cuts text into the deltas of a stream, of random sizes.
func draftChunks(rng *rand.Rand, text string) []string {
	var out []string
	for len(text) > 0 {
		n := min(len(text), 1+rng.IntN(40+rng.IntN(400)))
		out = append(out, text[:n])
		text = text[n:]
	}
	return out
}

// draftPosted is a message the hunt posted.
type draftPosted struct {
	n     int
	msg   *discordgo.Message
	token string // "" for a command
	key   string
	reply string // the channel its answers show in
}

type draftHunt struct {
	t       *testing.T
	w       *world
	rng     *rand.Rand
	model   *draftModel
	posted  []*draftPosted
	byID    map[string]*draftPosted
	running bool

	mu    sync.Mutex
	twoAt []string // samples that saw two drafts of one session in progress
	// Drafts a stopped daemon may have left (unsureDraft): by session key, how many it warned
	// of, and the bot messages of the key's answers that showed, unedited, as it stopped.
	unsure map[string]int
	left   map[string]string // message id → session key
	before map[string]bool   // the bot messages that showed as the running daemon started
}

func huntDrafts(t *testing.T, seed uint64, minSteps int) {
	rng := rand.New(rand.NewPCG(seed, 0xd4af7))
	mode := []string{"followup", "interrupt"}[rng.IntN(2)]
	m := &draftModel{seed: seed, attempts: map[string]int{}, texts: map[string]string{}, keyOf: map[string]string{}}
	m.gate.Store(new(make(chan struct{})))
	var model *openaitest.Model
	model = openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, model.Requests()[n-1].Body)
	})
	agent, err := openai.New(openai.Config{BaseURL: model.URL(), Model: "hunt", MaxHistory: 6, MaxRetries: 2,
		Timeout: 20 * time.Second, Sleep: func(ctx context.Context, _ time.Duration) error { return ctx.Err() }})
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, agent, func(c *config.Config) {
		c.Platforms.Discord.RequireMention = false
		c.Sessions.Queue.Mode = mode
		c.Shutdown.DrainTimeout = 200 * time.Millisecond
	})
	w.draftInterval = 20 * time.Millisecond
	if os.Getenv("AGENTGATE_DRAFT_DEBUG") != "" {
		w.logLevel = slog.LevelDebug
	}
	w.srv.AddChannel(discordtest.Channel{ID: draftDM2, Type: discordgo.ChannelTypeDM})
	w.srv.AddChannel(discordtest.Channel{ID: draftThread, GuildID: guildID, Type: discordgo.ChannelTypeGuildPublicThread,
		ParentID: channelID, OwnerID: alice.ID, Name: "topic"})
	w.start(t)
	h := &draftHunt{t: t, w: w, rng: rng, model: m, byID: map[string]*draftPosted{}, running: true}
	t.Logf("seed %d: queue mode %s", seed, mode)

	stop := make(chan struct{})
	sampled := make(chan struct{})
	go h.sample(stop, sampled)
	defer func() {
		close(stop)
		<-sampled
	}()

	// Every chat is known to the store before faults begin: the backfill after a restart
	// reads only the chats the store took a message from.
	for _, ch := range draftChats {
		h.post(ch, alice, "")
	}
	h.quiesce()

	gatewayFaults := 0
	steps := minSteps + rng.IntN(minSteps/2+1)
	for step := range steps {
		if rng.IntN(2) == 0 {
			m.release()
		}
		switch r := rng.IntN(100); {
		case r < 45:
			for range 1 + rng.IntN(3) {
				h.postRandom(false)
			}
		case r < 55:
			h.postRandom(true)
		case r < 60 && gatewayFaults < 3:
			gatewayFaults++
			w.srv.WaitReady(t)
			t.Logf("step %d: disconnect", step)
			w.srv.Disconnect()
		case r < 66:
			n := 1 + rng.IntN(2)
			t.Logf("step %d: fail the next %d posts", step, n)
			w.srv.FailNext("POST", "/messages", 500, n)
		case r < 71:
			t.Logf("step %d: lose the next post's response", step)
			w.srv.FailNextAfter("POST", "/messages", 500, 1)
		case r < 75:
			t.Logf("step %d: rate limit the next post", step)
			w.srv.RateLimitNext("POST", "/messages", time.Duration(20+rng.IntN(100))*time.Millisecond, 1)
		case r < 81:
			n := 1 + rng.IntN(3)
			t.Logf("step %d: fail the next %d edits", step, n)
			w.srv.FailNext("PATCH", "", 500+rng.IntN(3), n)
		case r < 85:
			t.Logf("step %d: lose the next edit's response", step)
			w.srv.FailNextAfter("PATCH", "", 500, 1)
		case r < 88:
			t.Logf("step %d: rate limit the next edit", step)
			w.srv.RateLimitNext("PATCH", "", time.Duration(20+rng.IntN(100))*time.Millisecond, 1)
		case r < 94:
			t.Logf("step %d: restart the daemon", step)
			log := w.log
			w.stopKeepingLog(t, step)
			h.noteUnsure(log.String())
			h.before = map[string]bool{}
			for _, ch := range draftChats {
				for _, m := range w.srv.Sent(ch) {
					h.before[m.ID] = true
				}
			}
			w.start(t)
			gatewayFaults = 0
		default:
			t.Logf("step %d: wait for quiescence", step)
			h.quiesce()
		}
	}
	h.quiesce()
	h.check()
}

// postRandom posts a message asking for an answer, or a command, in a random chat, from a
// random user.
func (h *draftHunt) postRandom(command bool) {
	ch := draftChats[h.rng.IntN(len(draftChats))]
	user := []discordtest.User{alice, bob}[h.rng.IntN(2)]
	cmd := ""
	if command {
		switch r := h.rng.IntN(100); {
		case r < 50:
			cmd = "/stop"
		case r < 75:
			cmd = "/new"
		case r < 88:
			cmd = "/queue interrupt"
		default:
			cmd = "/queue followup"
		}
	}
	h.post(ch, user, cmd)
}

// post posts a message in ch: cmd, or one asking for an answer.
func (h *draftHunt) post(ch string, user discordtest.User, cmd string) {
	switch ch {
	case dmID:
		user = alice
	case draftDM2:
		user = bob
	}
	n := len(h.posted)
	tok, text := fmt.Sprintf("q%04d", n), cmd
	if cmd != "" {
		tok = ""
	} else {
		text = "say " + tok
	}
	h.t.Logf("%s in %s by %s", text, ch, user.Username)
	src := identity.Source{Platform: discord.Name, ChatID: ch, UserID: user.ID}
	switch ch {
	case dmID, draftDM2:
		src.ChatType, src.UserID = identity.ChatDM, ""
	case channelID:
		src.ChatType = identity.ChatChannel
	default:
		src.ChatType, src.ChatID, src.ThreadID, src.UserID = identity.ChatThread, channelID, ch, ""
	}
	h.w.srv.WaitReady(h.t)
	msg := h.w.srv.Post(discordtest.UserMessage{ChannelID: ch, Author: user, Content: text})
	p := &draftPosted{n: n, msg: msg, token: tok, key: identity.Key(src, identity.DefaultKeyOptions), reply: ch}
	h.posted = append(h.posted, p)
	h.byID[msg.ID] = p
	if tok != "" {
		h.model.mu.Lock()
		h.model.keyOf[tok] = p.key
		h.model.mu.Unlock()
	}
}

// sample watches the channels while the hunt runs and records every moment a session shows
// two drafts in progress.
func (h *draftHunt) sample(stop, done chan struct{}) {
	defer close(done)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		live := map[string][]string{} // session key → contents of its drafts in progress
		for _, ch := range draftChats {
			for _, msg := range h.w.srv.Sent(ch) {
				tok, attempt, partial := h.model.partialOf(msg.Content)
				h.mu.Lock()
				_, left := h.left[msg.ID] // by a stopped daemon: checked at the end (leftUnsure)
				h.mu.Unlock()
				if partial && !left {
					h.model.mu.Lock()
					key := h.model.keyOf[tok]
					h.model.mu.Unlock()
					live[key] = append(live[key], fmt.Sprintf("%s/a%d %s in %s", tok, attempt, msg.ID, ch))
				}
			}
		}
		for key, ds := range live {
			if len(ds) > 1 {
				h.mu.Lock()
				if len(h.twoAt) < 10 {
					h.twoAt = append(h.twoAt, fmt.Sprintf("%s shows %d drafts in progress: %v", key, len(ds), ds))
				}
				h.mu.Unlock()
			}
		}
	}
}

// noteUnsure notes the drafts a daemon that just stopped warned, in its log, it may have left
// in the chat: a draft posted by a try whose answer was lost, and not found by the tries made
// as it stopped. The design leaves it ("What Discord still fails then is left: a draft made by
// a try whose answer was lost, and never found, stays in the chat, logged at WARN as the
// platform actor stops", docs/ARCHITECTURE.md): each such WARN excuses one unedited message of
// its session's answers, among those the daemon posted.
func (h *draftHunt) noteUnsure(log string) {
	keys := map[string]int{}
	for _, line := range strings.Split(log, "\n") {
		if sub := unsureDraft.FindStringSubmatch(line); sub != nil {
			keys[sub[1]]++
		}
	}
	if len(keys) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.unsure == nil {
		h.unsure, h.left = map[string]int{}, map[string]string{}
	}
	for key, n := range keys {
		h.unsure[key] += n
		h.t.Logf("the daemon stopped while %d draft post(s) of %s were unanswered", n, key)
	}
	for _, ch := range draftChats {
		for _, m := range h.w.srv.Sent(ch) {
			sub := draftLine.FindStringSubmatch(m.Content)
			if sub == nil || h.before[m.ID] || m.EditedTimestamp != nil || strings.HasSuffix(m.Content, actors.InterruptedMark) {
				continue
			}
			h.model.mu.Lock()
			key := h.model.keyOf[sub[1]]
			h.model.mu.Unlock()
			if keys[key] > 0 {
				h.left[m.ID] = key
			}
		}
	}
}

// isLeft reports whether id is of a message that showed as a daemon stopped and warned it may
// have left a draft of the message's session (noteUnsure).
func (h *draftHunt) isLeft(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.left[id]
	return ok
}

// leftUnsure reports whether m, which no delivered outbox entry shows, may be a draft a stopped
// daemon warned it left (noteUnsure), and counts it in excused, by session key.
func (h *draftHunt) leftUnsure(m *discordgo.Message, excused map[string]int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	key, ok := h.left[m.ID]
	if !ok || m.EditedTimestamp != nil || excused[key] >= h.unsure[key] {
		return false
	}
	excused[key]++
	return true
}

// partialOf reports whether content shows a part of one attempt's answer that is not a whole
// message of it: a draft in progress (or one left as if it were final). A draft marked
// interrupted is not in progress.
func (m *draftModel) partialOf(content string) (tok string, attempt int, partial bool) {
	if strings.HasSuffix(content, actors.InterruptedMark) {
		return "", 0, false
	}
	sub := draftLine.FindStringSubmatch(content)
	if sub == nil {
		return "", 0, false
	}
	tok = sub[1]
	attempt, _ = strconv.Atoi(sub[2])
	m.mu.Lock()
	text := m.texts[fmt.Sprintf("%s/a%d", tok, attempt)]
	m.mu.Unlock()
	if slices.Contains(discord.Split(text, discord.MaxMessageLen), content) {
		return tok, attempt, false
	}
	return tok, attempt, true
}

// entries returns every outbox entry of the hunt's session keys.
func (h *draftHunt) entries() ([]persistence.OutboxEntry, error) {
	var out []persistence.OutboxEntry
	seen := map[string]bool{}
	for _, p := range h.posted {
		if seen[p.key] {
			continue
		}
		seen[p.key] = true
		es, err := h.w.d.Store().OutboxAfter(h.t.Context(), p.key, 0, 0)
		if err != nil {
			return nil, err
		}
		out = append(out, es...)
	}
	return out, nil
}

// quiesce waits until every posted message is answered in the outbox, every entry is
// delivered and no draft is in progress.
func (h *draftHunt) quiesce() {
	h.t.Helper()
	h.w.srv.WaitReady(h.t)
	why := ""
	ok := pollWithin(60*time.Second, func() bool {
		h.model.release()
		es, err := h.entries()
		if err != nil {
			why = err.Error()
			return false
		}
		answered := map[string]bool{}
		for _, e := range es {
			if e.State != persistence.DeliveryDelivered {
				why = fmt.Sprintf("outbox %s/%d %.40q is %s", e.SessionKey, e.Seq, e.Text, e.State)
				return false
			}
			for _, id := range e.InReplyTo {
				answered[id] = true
			}
		}
		for _, p := range h.posted {
			if !answered[p.msg.ID] {
				why = fmt.Sprintf("message %d %q (%s in %s) has no answer in the outbox", p.n, p.msg.Content, p.msg.ID, p.reply)
				return false
			}
		}
		if ps := h.problems(es, true); len(ps) > 0 {
			why = ps[0]
			return false
		}
		return true
	})
	if !ok {
		es, _ := h.entries()
		for _, p := range h.problems(es, false) {
			h.t.Error(p)
		}
		h.dump(es)
		h.t.Fatalf("timed out waiting for quiescence: %s", why)
	}
}

// pollWithin reports whether cond holds within d, polling every 10 ms.
func pollWithin(d time.Duration, cond func() bool) bool {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(d)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			return false
		}
	}
	return true
}

// problems compares what the channels show with the delivered outbox entries es.
func (h *draftHunt) problems(es []persistence.OutboxEntry, quick bool) []string {
	var out []string
	bad := func(format string, args ...any) bool {
		out = append(out, fmt.Sprintf(format, args...))
		return quick
	}
	// What each channel should show: every delivered entry's parts.
	type part struct {
		e    *persistence.OutboxEntry
		i    int
		text string
	}
	want := map[string][]part{}
	excused := map[string]int{} // by session key: messages taken for drafts left (leftUnsure)
	for i := range es {
		e := &es[i]
		if strings.TrimSpace(e.Text) == "" || e.State != persistence.DeliveryDelivered {
			continue
		}
		ch := e.ChatID
		if e.ThreadID != "" {
			ch = e.ThreadID
		}
		for j, p := range discord.Split(e.Text, discord.MaxMessageLen) {
			want[ch] = append(want[ch], part{e: e, i: j, text: p})
		}
	}
	for _, ch := range draftChats {
		sent := h.w.srv.Sent(ch)
		used := make([]bool, len(sent))
		pos := map[*persistence.OutboxEntry][]int{}
		for _, p := range want[ch] {
			// A draft a stopped daemon may have left can show the whole of a part: the part
			// is the message posted for it, when there is one.
			at := -1
			for k, m := range sent {
				if used[k] || m.Content != p.text {
					continue
				}
				if at < 0 {
					at = k
				}
				if !h.isLeft(m.ID) {
					at = k
					break
				}
			}
			if at < 0 {
				if bad("in %s, part %d of outbox %s/%d (%.60q) does not show", ch, p.i+1, p.e.SessionKey, p.e.Seq, p.text) {
					return out
				}
				continue
			}
			used[at] = true
			pos[p.e] = append(pos[p.e], at)
		}
		for k, m := range sent {
			if used[k] {
				continue
			}
			if strings.HasSuffix(m.Content, actors.InterruptedMark) {
				shown := strings.TrimSuffix(strings.TrimSuffix(m.Content, actors.InterruptedMark), "…")
				if sub := draftLine.FindStringSubmatch(shown); sub != nil {
					h.model.mu.Lock()
					text := h.model.texts[sub[1]+"/a"+sub[2]]
					h.model.mu.Unlock()
					if !strings.HasPrefix(text, shown) {
						if bad("in %s, draft %s marked interrupted shows %.80q, no prefix of its answer", ch, m.ID, m.Content) {
							return out
						}
					}
				}
				continue
			}
			if h.leftUnsure(m, excused) {
				continue
			}
			kind := "a message no delivered outbox entry shows"
			if _, _, partial := h.model.partialOf(m.Content); partial {
				kind = "a draft in progress, or left showing part of an answer as if it were final"
			}
			if bad("in %s, bot message %s is %s: %.100q", ch, m.ID, kind, m.Content) {
				return out
			}
		}
		if quick {
			continue
		}
		// A whole entry shows in order, as a reply to the last message it answers; a session's
		// entries show in their order. A streamed reply (its first message a draft, edited into
		// it) shows where its draft was posted, as its turn began to stream: the answer to a
		// command sent meanwhile (a notice of no turn), stored before the reply, shows below it,
		// as anywhere an answer is written in place.
		type shownAt struct {
			pos int
			e   *persistence.OutboxEntry
		}
		earlier := map[string][]shownAt{} // by session: its entries shown so far, in seq order
		for i := range es {
			e := &es[i]
			ps := pos[e]
			if len(ps) == 0 {
				continue
			}
			if !slices.IsSorted(ps) {
				bad("in %s, the parts of outbox %s/%d show out of order (at %v)", ch, e.SessionKey, e.Seq, ps)
			}
			streamed := sent[ps[0]].EditedTimestamp != nil
			for _, f := range earlier[e.SessionKey] {
				command := f.e.Kind == "notice" && f.e.TurnID == ""
				if f.pos > ps[0] && !(streamed && command) {
					bad("in %s, outbox %s/%d shows before %s/%d", ch, e.SessionKey, e.Seq, e.SessionKey, f.e.Seq)
				}
			}
			earlier[e.SessionKey] = append(earlier[e.SessionKey], shownAt{pos: ps[0], e: e})
			ref := ""
			if r := sent[ps[0]].MessageReference; r != nil {
				ref = r.MessageID
			}
			if want := e.InReplyTo[len(e.InReplyTo)-1]; ref != want {
				bad("in %s, outbox %s/%d references %q, want %q", ch, e.SessionKey, e.Seq, ref, want)
			}
		}
	}
	return out
}

// check checks the end state: every posted message answered exactly once, in its session,
// and what the channels show (problems).
func (h *draftHunt) check() {
	t := h.t
	es, err := h.entries()
	if err != nil {
		t.Fatal(err)
	}
	answers := map[string][]string{}
	for _, e := range es {
		for _, id := range e.InReplyTo {
			answers[id] = append(answers[id], fmt.Sprintf("%s/%d", e.SessionKey, e.Seq))
		}
		for _, id := range e.InReplyTo {
			if p := h.byID[id]; p != nil && p.key != e.SessionKey {
				t.Errorf("outbox %s/%d answers message %d of session %s", e.SessionKey, e.Seq, p.n, p.key)
			}
		}
		if e.Kind == "reply" {
			sub := draftLine.FindStringSubmatch(e.Text)
			if sub == nil {
				t.Errorf("outbox %s/%d is a reply no model answer made: %.60q", e.SessionKey, e.Seq, e.Text)
				continue
			}
			h.model.mu.Lock()
			text := h.model.texts[sub[1]+"/a"+sub[2]]
			h.model.mu.Unlock()
			if e.Text != text {
				t.Errorf("outbox %s/%d is not the model's whole answer: %.60q…", e.SessionKey, e.Seq, e.Text)
			}
			if p := h.byID[e.InReplyTo[len(e.InReplyTo)-1]]; p == nil || p.token != sub[1] {
				t.Errorf("outbox %s/%d answers %v with the answer to %s", e.SessionKey, e.Seq, e.InReplyTo, sub[1])
			}
		}
	}
	for _, p := range h.posted {
		if n := len(answers[p.msg.ID]); n != 1 {
			t.Errorf("message %d %q (%s in %s) answered %d times (%v), want once", p.n, p.msg.Content, p.msg.ID, p.reply, n, answers[p.msg.ID])
		}
	}
	for _, p := range h.problems(es, false) {
		t.Error(p)
	}
	h.mu.Lock()
	for _, s := range h.twoAt {
		t.Error(s)
	}
	h.mu.Unlock()
	if t.Failed() {
		h.dump(es)
	}
	t.Logf("%d messages, %d outbox entries, %d model requests", len(h.posted), len(es), len(h.model.texts))
}

// dump logs the outbox and what the channels show, for a failed hunt.
func (h *draftHunt) dump(es []persistence.OutboxEntry) {
	for _, e := range es {
		h.t.Logf("outbox %s/%d %s %s turn %s in reply to %v: %.50q", e.SessionKey, e.Seq, e.Kind, e.State, e.TurnID, e.InReplyTo, e.Text)
	}
	for _, ch := range draftChats {
		for _, m := range h.w.srv.Sent(ch) {
			ref := ""
			if m.MessageReference != nil {
				ref = m.MessageReference.MessageID
			}
			h.t.Logf("in %s: %s (to %s, edited %v): %.50q", ch, m.ID, ref, m.EditedTimestamp != nil, m.Content)
		}
	}
}
