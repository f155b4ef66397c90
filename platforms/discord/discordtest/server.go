package discordtest

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"
)

// DefaultHeartbeatInterval is the heartbeat interval HELLO announces unless
// WithHeartbeatInterval says otherwise. It is Discord's usual value.
const DefaultHeartbeatInterval = 41250 * time.Millisecond

// DefaultToken is the bot token a Server accepts unless WithToken says otherwise.
const DefaultToken = "MTIzNDU2Nzg5MDEyMzQ1Njc4.GfAkE1.ZmFrZS1ib3QtdG9rZW4tb2YtdGhlLXNoYXBl"

// WaitTimeout bounds WaitFor, WaitSent and WaitReady.
const WaitTimeout = 10 * time.Second

// NonceWindow is how long, on the fake clock, a bot message's nonce is enforced: a post with
// enforce_nonce and the nonce of a message the bot created less than NonceWindow ago gets that
// message back; a later one creates another. Discord enforces a nonce "in the past few
// minutes" and says no more; the fake takes three.
const NonceWindow = 3 * time.Minute

// Channel is a channel of the fake world. DM channels have no GuildID; threads have a
// ParentID and an OwnerID, and may be archived (ArchiveThread).
type Channel struct {
	ID       string
	GuildID  string
	Type     discordgo.ChannelType
	ParentID string
	OwnerID  string
	Name     string
	Archived bool
}

// User is a Discord user who posts messages through Server.Post.
type User struct {
	ID         string
	Username   string
	GlobalName string
	Bot        bool
}

// UserMessage is a message a user posts with Server.Post.
type UserMessage struct {
	ChannelID string
	Author    User
	// Nick is the author's server nickname; it is sent as member.nick in guild channels.
	Nick    string
	Content string
	// MentionBot prefixes Content with "<@BOTID> " and adds the bot to mentions, as a
	// Discord client does when the user types @bot.
	MentionBot bool
	// ReplyTo is the ID of an earlier message in the same channel that this one replies to.
	// The message gets type 19 (reply), a message_reference and referenced_message, and
	// mentions the replied-to author (Discord clients ping on reply by default).
	ReplyTo string
	// NoPing (with ReplyTo) is a reply whose author turned the client's "@ ON" toggle off:
	// the replied-to author is not added to mentions.
	NoPing bool
	// Type overrides the message type (default discordgo.MessageTypeDefault, or
	// discordgo.MessageTypeReply with ReplyTo).
	Type discordgo.MessageType
	// MentionRoles prefixes Content with "<@&ROLEID> " for each role, and lists them in
	// mention_roles, as a Discord client does when the user picks a role from autocomplete.
	// Each must be a role of the channel's guild (AddRole).
	MentionRoles []string
}

// Role is a role of a guild of the fake world (AddRole). A role with a BotID is the managed role
// Discord makes for that bot in each guild it joins (tags.bot_id), which the bot member holds.
type Role struct {
	ID    string
	Name  string
	BotID string
}

// Option configures a Server.
type Option func(*config)

type config struct {
	heartbeat time.Duration
	token     string
}

// WithHeartbeatInterval sets the heartbeat interval HELLO announces. discordgo reconnects
// when no ACK arrived within five intervals, so very short intervals (under ~200ms) make a
// loaded race-enabled test run reconnect spuriously.
func WithHeartbeatInterval(d time.Duration) Option {
	return func(c *config) { c.heartbeat = d }
}

// WithToken sets the bot token the Server accepts (without the "Bot " prefix).
func WithToken(token string) Option {
	return func(c *config) { c.token = strings.TrimPrefix(token, "Bot ") }
}

// Server is a fake Discord (REST + gateway) on 127.0.0.1. Safe for concurrent use.
//
// REST, under APIURL: GET gateway, GET gateway/bot, GET users/@me, GET guilds/{g}/roles, GET
// channels/{c}, GET channels/{c}/messages (after, before and limit), POST channels/{c}/messages,
// PATCH channels/{c}/messages/{m}, DELETE channels/{c}/messages/{m} (the bot's own), POST
// channels/{c}/typing and POST channels/{c}/messages/{m}/threads. Any other route or method is 404
// {"message":"404: Not Found","code":0}. Every route but GET gateway wants
// "Authorization: Bot <token>" (else 401). Errors carry Discord's codes (10003 Unknown
// Channel, 10004 Unknown Guild, 10008 Unknown Message, 50035 Invalid Form Body, 50006 empty
// message, 50005 not the author, 160004 thread exists). A POST with enforce_nonce repeating the
// nonce of a message the bot created within NonceWindow gets that message back. Every response
// but a global 429 and an edge's block (BlockNext) has X-RateLimit-* headers that never make
// discordgo wait.
//
// Gateway, at GatewayURL: HELLO, then IDENTIFY (READY, then GUILD_CREATE per guild with the
// GUILDS intent: its channels, active threads and roles, the bot its only member) or RESUME
// (replay, then RESUMED; op 9 INVALID_SESSION for an unknown session, or one the client
// ended with a close frame of 1000 or 1001, as Discord ends it). Heartbeats get ACKs, but for
// those MissHeartbeatACKs leaves unanswered.
// Close codes: 4001 unknown opcode, 4002 decode error, 4003 not authenticated, 4004
// authentication failed, 4005 already authenticated, 4010 invalid shard, and whichever
// RefuseNext sets. Dispatches honour intents: GUILD_MESSAGES and DIRECT_MESSAGES gate
// MESSAGE_CREATE and MESSAGE_UPDATE, GUILD_MESSAGES MESSAGE_DELETE_BULK, GUILDS gates GUILD_CREATE, GUILD_ROLE_CREATE, CHANNEL_CREATE and THREAD_CREATE, and without
// MESSAGE_CONTENT a guild message's content is blank unless the bot wrote it or is mentioned in
// it.
type Server struct {
	tb        testing.TB
	http      *httptest.Server
	apiURL    string // http://127.0.0.1:PORT/api/v9/
	wsURL     string // ws://127.0.0.1:PORT/gateway
	transport *http.Transport
	token     string
	heartbeat time.Duration
	bot       User

	wg sync.WaitGroup // gateway reader and writer goroutines

	mu      sync.Mutex
	closed  bool
	changed chan struct{} // closed and replaced on every state change
	ticks   int64         // fake clock: milliseconds after clockBase

	guilds    []*guild
	guildByID map[string]*guild
	channels  []*Channel // in creation order
	chanByID  map[string]*Channel
	users     map[string]User
	messages  map[string]*message   // by ID
	history   map[string][]*message // by channel ID, in creation order
	nonces    map[string]*message   // bot messages by nonce (enforce_nonce)
	typing    map[string]int
	deleted   []string       // ids of messages the bot deleted through the API
	requests  map[string]int // "METHOD /api/v9/path" → REST requests answered
	threads   []Channel
	faults    []*fault

	conns      map[*conn]struct{}
	sess       *session // the resumable gateway session, nil before the first IDENTIFY
	sessions   int
	identifies int
	resumes    int
	withhold   bool            // the next RESUME gets no RESUMED until released (WithholdResumed)
	withheld   *withheldResume // the RESUME whose RESUMED waits
	heartbeats int
	intents    discordgo.Intent
	shard      [2]int
	refuseCode int // RefuseNext's close code
	refuseLeft int // the connections RefuseNext has still to close
	missACKs   int // the heartbeats MissHeartbeatACKs leaves unanswered still
}

type guild struct {
	id, name string
	joined   time.Time
	roles    []Role // besides @everyone, whose id is the guild's
}

// New starts a Server on 127.0.0.1 and stops it in t.Cleanup. Close discordgo sessions
// before that cleanup runs (register their cleanup after calling New), or they will keep
// trying to reconnect.
func New(t testing.TB, opts ...Option) *Server {
	t.Helper()
	cfg := config{heartbeat: DefaultHeartbeatInterval, token: DefaultToken}
	for _, o := range opts {
		o(&cfg)
	}
	s := &Server{
		tb:        t,
		token:     cfg.token,
		heartbeat: cfg.heartbeat,
		changed:   make(chan struct{}),
		guildByID: map[string]*guild{},
		chanByID:  map[string]*Channel{},
		users:     map[string]User{},
		messages:  map[string]*message{},
		history:   map[string][]*message{},
		nonces:    map[string]*message{},
		typing:    map[string]int{},
		requests:  map[string]int{},
		conns:     map[*conn]struct{}{},
	}
	_, botID := s.tickLocked()
	s.bot = User{ID: botID, Username: "agentgate", Bot: true}
	s.users[botID] = s.bot

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("discordtest: listen: %v", err)
	}
	s.http = &httptest.Server{
		Listener: ln,
		Config:   &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second},
	}
	s.http.Start()
	s.apiURL = s.http.URL + "/api/v9/"
	s.wsURL = "ws://" + ln.Addr().String() + "/gateway"
	s.transport = &http.Transport{
		Proxy:               nil,
		DialContext:         dialLoopback,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
	}
	t.Cleanup(s.close)
	return s
}

// close drops every gateway connection, stops the HTTP server and waits for the gateway
// goroutines.
func (s *Server) close() {
	s.mu.Lock()
	s.closed = true
	conns := s.connsLocked()
	s.mu.Unlock()
	for _, c := range conns {
		c.abort()
	}
	s.http.Close()
	s.wg.Wait()
	s.transport.CloseIdleConnections()
}

// APIURL returns the REST base URL, "http://127.0.0.1:PORT/api/v9/", the value that
// replaces discordgo.EndpointAPI.
func (s *Server) APIURL() string { return s.apiURL }

// GatewayURL returns the websocket URL that GET gateway announces.
func (s *Server) GatewayURL() string { return s.wsURL }

// Token returns the bot token the Server accepts. REST requests must carry
// "Authorization: Bot <token>"; IDENTIFY and RESUME accept it with or without the prefix.
func (s *Server) Token() string { return s.token }

// BotID returns the bot user's snowflake.
func (s *Server) BotID() string { return s.bot.ID }

// AddGuild adds a guild the bot is a member of. If a client is identified, it gets a
// GUILD_CREATE, as when a bot joins a guild.
func (s *Server) AddGuild(id, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.guildByID[id]; ok {
		panic(fmt.Sprintf("discordtest: AddGuild(%q): guild exists", id))
	}
	joined, _ := s.tickLocked()
	g := &guild{id: id, name: name, joined: joined}
	s.guilds = append(s.guilds, g)
	s.guildByID[id] = g
	if s.sess != nil && s.sess.intents&discordgo.IntentsGuilds != 0 {
		s.dispatchLocked("GUILD_CREATE", s.guildWireLocked(g))
	}
	s.notifyLocked()
}

// AddRole adds role r to guild guildID (which must exist). If a client is identified, it gets a
// GUILD_ROLE_CREATE, as when the role is made (a bot's, when the bot joins).
func (s *Server) AddRole(guildID string, r Role) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.guildByID[guildID]
	if g == nil || r.ID == "" || r.ID == guildID || g.role(r.ID) != nil {
		panic(fmt.Sprintf("discordtest: AddRole(%q, %q): unknown guild, or empty or existing role ID", guildID, r.ID))
	}
	g.roles = append(g.roles, r)
	if s.sess != nil && s.sess.intents&discordgo.IntentsGuilds != 0 {
		s.dispatchLocked("GUILD_ROLE_CREATE", map[string]any{"guild_id": g.id, "role": roleWire(r, len(g.roles))})
	}
	s.notifyLocked()
}

func (g *guild) role(id string) *Role {
	for i := range g.roles {
		if g.roles[i].ID == id {
			return &g.roles[i]
		}
	}
	return nil
}

// AddChannel adds a channel. A guild channel's guild must exist. If a client is identified
// it gets CHANNEL_CREATE (or THREAD_CREATE) for guild channels; like Discord, nothing is
// dispatched for a new DM channel: its first MESSAGE_CREATE is the first the bot hears of it.
func (s *Server) AddChannel(c Channel) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.chanByID[c.ID]; ok || c.ID == "" {
		panic(fmt.Sprintf("discordtest: AddChannel(%q): empty or existing ID", c.ID))
	}
	isDM := c.Type == discordgo.ChannelTypeDM || c.Type == discordgo.ChannelTypeGroupDM
	if isDM != (c.GuildID == "") {
		panic(fmt.Sprintf("discordtest: AddChannel(%q): DM channels, and only they, have no GuildID", c.ID))
	}
	if !isDM && s.guildByID[c.GuildID] == nil {
		panic(fmt.Sprintf("discordtest: AddChannel(%q): unknown guild %q", c.ID, c.GuildID))
	}
	s.addChannelLocked(c)
	if !isDM && s.sess != nil && s.sess.intents&discordgo.IntentsGuilds != 0 {
		event := "CHANNEL_CREATE"
		if isThread(c.Type) {
			event = "THREAD_CREATE"
		}
		s.dispatchLocked(event, s.channelWireLocked(&c))
	}
	s.notifyLocked()
}

// ArchiveThread archives thread id, as Discord does after its auto-archive duration without
// activity: the identified session gets a THREAD_UPDATE with archived set, and a later
// GUILD_CREATE no longer lists the thread (it lists active threads only).
func (s *Server) ArchiveThread(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.chanByID[id]
	if c == nil || !isThread(c.Type) {
		panic(fmt.Sprintf("discordtest: ArchiveThread(%q): no such thread", id))
	}
	c.Archived = true
	if s.sess != nil && s.sess.intents&discordgo.IntentsGuilds != 0 {
		s.dispatchLocked("THREAD_UPDATE", s.channelWireLocked(c))
	}
	s.notifyLocked()
}

// DeleteChannel deletes channel or thread id, as a moderator would: the identified session gets
// THREAD_DELETE (CHANNEL_DELETE for a channel), and later requests to it get 404 Unknown
// Channel. Its messages stay (a thread's starter is in its parent).
func (s *Server) DeleteChannel(id string) { s.deleteChannel(id, true) }

// ForgetChannel is DeleteChannel for a deletion the bot missed (it was disconnected): nothing
// is dispatched.
func (s *Server) ForgetChannel(id string) { s.deleteChannel(id, false) }

func (s *Server) deleteChannel(id string, announce bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.chanByID[id]
	if c == nil {
		panic(fmt.Sprintf("discordtest: DeleteChannel(%q): no such channel", id))
	}
	delete(s.chanByID, id)
	s.channels = slices.DeleteFunc(s.channels, func(x *Channel) bool { return x == c })
	if announce && c.GuildID != "" && s.sess != nil && s.sess.intents&discordgo.IntentsGuilds != 0 {
		event := "CHANNEL_DELETE"
		if isThread(c.Type) {
			event = "THREAD_DELETE"
		}
		s.dispatchLocked(event, s.channelWireLocked(c))
	}
	s.notifyLocked()
}

func (s *Server) addChannelLocked(c Channel) {
	s.channels = append(s.channels, &c)
	s.chanByID[c.ID] = &c
}

// Post makes a user post a message and returns it as the gateway delivers it (snowflake
// and timestamp assigned, guild_id and member set in guilds, content unredacted). The
// identified session gets a MESSAGE_CREATE with the next sequence number; while the client
// is disconnected the event waits in the session's log for RESUME. Before the first
// IDENTIFY (or after InvalidateSession) there is no session and, as on Discord, nothing is
// dispatched. Post panics on an unknown channel, author or ReplyTo.
func (s *Server) Post(um UserMessage) *discordgo.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.chanByID[um.ChannelID]
	if ch == nil {
		panic(fmt.Sprintf("discordtest: Post: unknown channel %q", um.ChannelID))
	}
	if um.Author.ID == "" {
		panic("discordtest: Post: Author.ID is empty")
	}
	created, id := s.tickLocked()
	m := &message{
		id:        id,
		channelID: ch.ID,
		guildID:   ch.GuildID,
		author:    um.Author,
		nick:      um.Nick,
		content:   um.Content,
		typ:       discordgo.MessageTypeDefault,
		created:   created,
	}
	if um.MentionBot {
		m.content = "<@" + s.bot.ID + "> " + um.Content
		m.mentions = append(m.mentions, s.bot)
	}
	for _, r := range slices.Backward(um.MentionRoles) {
		if g := s.guildByID[ch.GuildID]; g == nil || g.role(r) == nil {
			panic(fmt.Sprintf("discordtest: Post: MentionRoles: %q is not a role of the channel's guild", r))
		}
		m.content = "<@&" + r + "> " + m.content
		m.mentionRoles = append([]string{r}, m.mentionRoles...)
	}
	if um.ReplyTo != "" {
		ref := s.messages[um.ReplyTo]
		if ref == nil || ref.channelID != ch.ID {
			panic(fmt.Sprintf("discordtest: Post: ReplyTo %q is not a message in channel %q", um.ReplyTo, ch.ID))
		}
		m.ref = ref
		m.typ = discordgo.MessageTypeReply
		if !um.NoPing {
			m.mentions = appendUser(m.mentions, ref.author)
		}
	}
	if um.Type != 0 {
		m.typ = um.Type
	}
	s.users[um.Author.ID] = um.Author
	s.storeLocked(m)
	s.dispatchMessageLocked("MESSAGE_CREATE", m)
	s.notifyLocked()
	return decodeMessage(s.messageWire(m, true, visibleAll))
}

// Sent returns the messages the bot posted in channelID, in order of creation, in their
// current state (edits applied), as the gateway would deliver them (with guild_id, and
// MessageReference and ReferencedMessage for replies).
func (s *Server) Sent(channelID string) []*discordgo.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*discordgo.Message
	for _, m := range s.history[channelID] {
		if m.author.ID == s.bot.ID {
			out = append(out, decodeMessage(s.messageWire(m, true, visibleAll)))
		}
	}
	return out
}

// Posted returns the content of each message the bot posted in channelID, in order of
// creation, as its last request (the post, or the last edit) carried it: before Discord
// stripped what it strips (discordStrip), which Sent shows done.
func (s *Server) Posted(channelID string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, m := range s.history[channelID] {
		if m.author.ID == s.bot.ID {
			out = append(out, m.posted)
		}
	}
	return out
}

// WaitSent waits until the bot has posted at least n messages in channelID and returns
// them (see Sent). It fails t after WaitTimeout.
func (s *Server) WaitSent(t testing.TB, channelID string, n int) []*discordgo.Message {
	t.Helper()
	var sent []*discordgo.Message
	s.waitFor(t, func() bool {
		sent = s.Sent(channelID)
		return len(sent) >= n
	}, func() string {
		return fmt.Sprintf("%d bot messages in channel %s; got %d: %s", n, channelID, len(sent), contents(sent))
	})
	return sent
}

// Typing returns how many typing indicators (POST channels/{id}/typing) the bot sent to
// channelID.
func (s *Server) Typing(channelID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.typing[channelID]
}

// Requests returns how many REST requests whose method is method (any method if empty) and
// whose URL path ends in pathSuffix the Server answered, faults and refusals included.
func (s *Server) Requests(method, pathSuffix string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, c := range s.requests {
		m, path, _ := strings.Cut(k, " ")
		if (method == "" || strings.EqualFold(method, m)) && strings.HasSuffix(path, pathSuffix) {
			n += c
		}
	}
	return n
}

// DeleteBulk removes messages ids, all of one guild channel, at once, as a moderator's purge
// (Discord's bulk delete) does: the identified session gets one MESSAGE_DELETE_BULK (ids,
// channel and guild) if it has the GUILD_MESSAGES intent. It panics if a message is unknown, in
// a DM, or in another channel than the first.
func (s *Server) DeleteBulk(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ms []*message
	for _, id := range ids {
		m := s.messages[id]
		if m == nil || m.guildID == "" || len(ms) > 0 && m.channelID != ms[0].channelID {
			panic("discordtest: DeleteBulk of an unknown, DM or other channel's message " + id)
		}
		ms = append(ms, m)
	}
	if len(ms) == 0 {
		return
	}
	for _, m := range ms {
		s.removeLocked(m)
	}
	if s.sess != nil && s.sess.intents&discordgo.IntentsGuildMessages != 0 {
		s.dispatchLocked("MESSAGE_DELETE_BULK", map[string]any{"ids": ids, "channel_id": ms[0].channelID, "guild_id": ms[0].guildID})
	}
	s.notifyLocked()
}

// Delete removes message id from its channel, as its author or a moderator deleting it would:
// the identified session gets MESSAGE_DELETE (id, channel and guild, no author), and later
// edits of it get 404 Unknown Message. It panics if the message is unknown.
func (s *Server) Delete(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.messages[id]
	if m == nil {
		panic("discordtest: Delete of unknown message " + id)
	}
	s.deleteLocked(m)
}

// DeleteIn dispatches a MESSAGE_DELETE of message id that names channelID (and its guild), not
// the channel the message was posted in, as a forged or mistaken event would, and deletes
// nothing. It panics if the channel is unknown.
func (s *Server) DeleteIn(id, channelID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.chanByID[channelID]
	if c == nil {
		panic("discordtest: DeleteIn of unknown channel " + channelID)
	}
	d := map[string]string{"id": id, "channel_id": channelID}
	if c.GuildID != "" {
		d["guild_id"] = c.GuildID
	}
	s.dispatchLocked("MESSAGE_DELETE", d)
	s.notifyLocked()
}

// Edit replaces the content of message id, as its author editing it would: the identified
// session gets MESSAGE_UPDATE (the whole message, with its edited_timestamp), or, while the
// client is disconnected, the event waits for RESUME as a Post's does. content is the whole
// new content (Post's MentionBot mention, if wanted, written out as <@ID>); the mentions stay
// as posted. It panics if the message is unknown.
func (s *Server) Edit(id, content string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.messages[id]
	if m == nil {
		panic("discordtest: Edit of unknown message " + id)
	}
	m.content = content
	edited, _ := s.tickLocked()
	m.edited = &edited
	s.dispatchMessageLocked("MESSAGE_UPDATE", m)
	s.notifyLocked()
}

// deleteLocked removes m from its channel and tells the gateway session, as Discord does for
// every deletion (the bot's own through REST too).
func (s *Server) deleteLocked(m *message) {
	s.removeLocked(m)
	d := map[string]string{"id": m.id, "channel_id": m.channelID}
	if m.guildID != "" {
		d["guild_id"] = m.guildID
	}
	s.dispatchLocked("MESSAGE_DELETE", d)
	s.notifyLocked()
}

// removeLocked removes m from the messages and from its channel's history.
func (s *Server) removeLocked(m *message) {
	delete(s.messages, m.id)
	h := s.history[m.channelID]
	for i, x := range h {
		if x == m {
			s.history[m.channelID] = append(h[:i:i], h[i+1:]...)
			break
		}
	}
}

// DeletedByBot returns the ids of the messages the bot deleted through the API, in order.
func (s *Server) DeletedByBot() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.deleted)
}

// Threads returns the threads the bot started through REST, in order.
func (s *Server) Threads() []Channel {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Channel(nil), s.threads...)
}

// Now returns the fake clock's time: the timestamp of the newest message, or its zero, plus
// what Advance added since. A daemon under test that runs on it sees messages exactly as recent
// as Discord says they are.
func (s *Server) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nowLocked()
}

func (s *Server) nowLocked() time.Time {
	return clockBase.Add(time.Duration(s.ticks) * time.Millisecond)
}

// Advance moves the fake clock d (whole milliseconds) forward, as time passing with nothing
// said: an outage, a daemon stopped for a while. What is posted next is that much newer, and a
// nonce older than NonceWindow is no longer enforced.
func (s *Server) Advance(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ticks += max(d.Milliseconds(), 0)
	s.notifyLocked()
}

// Identifies returns how many IDENTIFYs the gateway accepted.
func (s *Server) Identifies() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.identifies
}

// Resumes returns how many RESUMEs the gateway accepted.
func (s *Server) Resumes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resumes
}

// Heartbeats returns how many op 1 heartbeats the gateway received (and ACKed).
func (s *Server) Heartbeats() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.heartbeats
}

// Intents returns the intents of the last accepted IDENTIFY.
func (s *Server) Intents() discordgo.Intent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.intents
}

// Shard returns the shard of the last accepted IDENTIFY; [0 1] when it named none, as
// Discord assumes.
func (s *Server) Shard() [2]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shard
}

// Ready reports whether a client is connected, identified or resumed (it has been sent
// READY or RESUMED), and has sent a heartbeat on that connection. discordgo sends its first
// heartbeat right after READY; until then its heartbeat goroutine is starting, and a
// connection dropped in that window makes it close the reconnected connection too (a race
// in discordgo v0.29, which costs an extra RESUME or, after InvalidateSession, a lost
// session). So call WaitReady before Disconnect or InvalidateSession.
func (s *Server) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sess != nil && s.sess.conn != nil && s.sess.conn.heartbeats > 0
}

// WaitReady waits until Ready reports true. After Disconnect, that is when the client has
// resumed (or identified again). It fails t after WaitTimeout.
func (s *Server) WaitReady(t testing.TB) {
	t.Helper()
	s.waitFor(t, s.Ready, func() string { return "a gateway client to identify or resume, and heartbeat" })
}

// WaitRead waits until the gateway client has read every event dispatched so far: a heartbeat
// of its carries the last one's sequence number (discordgo keeps an event's as it reads it,
// and runs the event's handlers next, on the same goroutine). It fails t after WaitTimeout.
func (s *Server) WaitRead(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	sess := s.sess
	s.mu.Unlock()
	if sess == nil {
		return
	}
	s.waitFor(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return sess.read >= sess.seq
	}, func() string { return "a heartbeat of the client's to carry the last event's sequence number" })
}

// WaitFor waits until cond returns true. cond is evaluated now and after every change of
// the Server's state (a request, a gateway event, a connection coming or going), so it must
// depend only on that state. It fails t after WaitTimeout, naming what.
func (s *Server) WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	s.waitFor(t, cond, func() string { return what })
}

func (s *Server) waitFor(t testing.TB, cond func() bool, what func() string) {
	t.Helper()
	timer := time.NewTimer(WaitTimeout)
	defer timer.Stop()
	for {
		s.mu.Lock()
		changed := s.changed
		s.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-timer.C:
			t.Fatalf("discordtest: timed out after %v waiting for %s", WaitTimeout, what())
		}
	}
}

// Disconnect abruptly drops every gateway connection (TCP close, no close frame). The
// session stays resumable: discordgo notices, waits about a second in Session.Close, dials
// again and RESUMEs, and the Server replays what it missed. Events dispatched meanwhile are
// buffered. Call WaitReady first (see Ready).
func (s *Server) Disconnect() {
	s.mu.Lock()
	conns := s.connsLocked()
	if s.sess != nil {
		s.sess.conn = nil
	}
	s.notifyLocked()
	s.mu.Unlock()
	s.logf("disconnecting %d gateway connection(s)", len(conns))
	for _, c := range conns {
		c.abort()
	}
}

// InvalidateSession forgets the gateway session, as when it expires on Discord, and drops
// every connection. The client's RESUME gets op 9 INVALID_SESSION, so it identifies again;
// events dispatched in between are lost, as on Discord. Call WaitReady first (see Ready).
func (s *Server) InvalidateSession() {
	s.mu.Lock()
	conns := s.connsLocked()
	s.sess = nil
	s.notifyLocked()
	s.mu.Unlock()
	s.logf("invalidating the gateway session, dropping %d connection(s)", len(conns))
	for _, c := range conns {
		c.abort()
	}
}

func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Server) connsLocked() []*conn {
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	return conns
}

// logf logs through the test that owns the Server. All goroutines that call it end before
// the Server's cleanup returns, so it never logs after the test has completed.
func (s *Server) logf(format string, args ...any) {
	s.tb.Helper()
	s.tb.Logf("discordtest: "+format, args...)
}

func contents(ms []*discordgo.Message) string {
	qs := make([]string, len(ms))
	for i, m := range ms {
		qs[i] = fmt.Sprintf("%q", m.Content)
	}
	return "[" + strings.Join(qs, " ") + "]"
}
