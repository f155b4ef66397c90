package discord

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bwmarrin/discordgo"
	"github.com/gorilla/websocket"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
)

// Name is the platform name of Discord in session keys and metrics.
const Name = "discord"

// Intents are the gateway intents the adapter asks for: guild messages, direct messages and
// message content (to read what users say), and guilds (to learn channels and threads).
const Intents = discordgo.IntentsGuildMessages | discordgo.IntentsDirectMessages |
	discordgo.IntentMessageContent | discordgo.IntentsGuilds

const (
	restTimeout    = 30 * time.Second
	deliverTimeout = time.Minute
)

// maxProgress bounds the sends, drafts and threads the platform remembers; past it, the sends
// and threads are forgotten, and the draft tried longest ago (a var: tests lower it).
var maxProgress = 10_000

// Config configures a Platform.
type Config struct {
	// Token is the bot token; a "Bot " in front of it (the Authorization header's form) is cut.
	Token string
	// Settings are the platforms.discord keys of the configuration.
	Settings config.Discord
	// Logger receives the platform's logs; nil discards them.
	Logger *slog.Logger
	// Recent returns the chats the store took a Discord message from since a time, with the
	// newest one of each: where every new gateway session reads back what was said while no
	// gateway session of this process was up (backfill.go), the chats another cluster member
	// took meanwhile too. Nil reads back only the chats this process saw.
	Recent func(ctx context.Context, since time.Time) ([]persistence.ChatMark, error)
	// Unread returns the unread places the store keeps for Discord (persistence.Unread): where
	// a backfill of this process or an earlier one (a restart, another cluster member) failed
	// to read, and every backfill reads from (backfill.go). Nil keeps them in memory only.
	Unread func(ctx context.Context) ([]persistence.Unread, error)
	// Now is the clock that backfill_window is measured on; nil is time.Now.
	Now func() time.Time
	// ReturnRefusal makes Run return a *RefusedError when Discord refuses the connection for
	// good, instead of keeping the platform down within Run until the next try. A cluster
	// member sets it: its Run holds the gateway lease, which another member, whose own token,
	// shard or build Discord may take, can get only once Run returns.
	ReturnRefusal bool
}

// Platform is the Discord adapter: one gateway connection (a shard) and the REST client that
// sends replies. Create it with New; the runtime drives it through Run and Send.
type Platform struct {
	cfg  config.Discord
	log  *slog.Logger
	s    *discordgo.Session
	api  rewrite // where REST requests go (Settings.APIURL)
	gate gate

	returnRefusal bool // Config.ReturnRefusal

	botID     atomic.Pointer[string]
	connected atomic.Bool
	lost      chan error // the gateway connection dropped; Run returns so it is reopened

	mu       sync.Mutex
	deliver  platforms.Deliver
	runCtx   context.Context // ends when the daemon stops, not when a lost connection ends Run (endRun); one for every Run until then
	lastErr  error
	progress map[string]sendProgress // "key/seq" → how far the send of that outbound got (outbound.go)
	forgot   time.Time               // when progress was last forgotten for being full; zero for never
	drafting map[string]*draftTries  // draft key → the tries of its post not yet answered (resend.go)
	limited  map[string]time.Time    // discordgo bucket → until when Discord rate limits it (ratelimit.go)
	global   time.Time               // until when Discord rate limits every route (ratelimit.go)
	buckets  restBuckets             // the limiter of the REST calls' buckets (ratelimit.go); own lock
	rateWarn logging.Counter         // the "discord rate limit" line (ratelimit.go); own lock
	threads  *channelCache
	typing   *typing
	seen     map[string]seenAt             // channel → the newest message seen there (backfill.go)
	unread   map[string]seenAt             // channel → where a backfill that failed stopped reading (backfill.go)
	kept     map[string]persistence.Unread // channel → the unread place the store holds, as far as this process knows
	stored   func(context.Context) ([]persistence.Unread, error)
	record   func(ops ...persistence.Op) // platforms.Recorder; nil until the runtime sets it
	withdraw platforms.Withdraw          // platforms.Withdrawer; nil until the runtime sets it
	// withdrawStored is the other half of platforms.Withdrawer: the withdrawal of a message
	// delivered holds no Source of (deleted.go). Nil until the runtime sets it.
	withdrawStored platforms.WithdrawStored
	// recordedAfter is the snowflake after which delivered holds every message the runtime
	// holds unanswered from this platform: one up to it may have been taken by another process
	// (before a restart, or by another cluster member before this one's Run) or forgotten
	// past maxDelivered, and its deletion asks the store (deleted.go). "" before the first Run.
	recordedAfter string
	// delivered are the messages the runtime took, by id, for their deletion (deleted.go);
	// deliveredOrder holds their ids oldest first, to forget the oldest past maxDelivered.
	delivered      map[string]deliveredMsg
	deliveredOrder []string
	live           map[string]string // thread → guild: the threads discordgo's state holds (threads.go)
	opened         map[string]bool   // threads known to have been open: never opened again (threads.go)
	roles          map[string]string // guild → the bot's managed role there, "" for none (roles.go)
	// roleMisses are the guilds whose roles could not be looked up, and when (roles.go).
	roleMisses map[string]time.Time
	recent     func(context.Context, time.Time) ([]persistence.ChatMark, error)
	now        func() time.Time

	// backfills counts the backfills running or waiting (one READY each); while it is above
	// zero, live messages wait in held, so that a channel's messages are taken in order: what
	// was missed first, then what arrives. backfilling is closed when it drops to zero, nil
	// while it is zero (a stop waits for it: settle). backfillMu runs the backfills and their
	// releases one at a time.
	backfills   int
	backfilling chan struct{}
	held        []*discordgo.Message
	backfillMu  sync.Mutex
	// backlog are the messages the running backfill read back (a channel's pages as they are
	// read, then what it returned) and has yet to hand on, inHand
	// the one it hands on now, and afterHand the withdrawals of inHand's deletion, queued for
	// the intake once its handling returns (backfill.go): deletions and edits reach them as
	// they reach the intake's queue (intake.go).
	backlog   []*discordgo.Message
	inHand    *discordgo.Message
	afterHand []func()

	// intake is the queue of messages (and deletions) the intake goroutine handles in order;
	// intaking is closed when that goroutine ends, nil while none runs; intakeWarned is set
	// once the queue grew past intakeWarnAt, until it is empty (intake.go).
	intake       []intakeItem
	intaking     chan struct{}
	intakeWarned bool
	intakeWarnAt int // a test's lower bound for the warning; 0: intakeWarnAt

	// unhold stops the last Run's ctx from ending a replay's hold when it ends (Run); runs
	// counts the Runs started, so that the end of an earlier one's ctx, run on its own
	// goroutine, ends no hold of a later one's (endReplayOf).
	unhold func() bool
	runs   int
	// letGoHeld is closed when the next Run starts: it ends the wait of a let-go Run for its
	// replay's hold (keepLetGoHoldLocked). Nil while no such wait runs.
	letGoHeld chan struct{}
	// letGoDue takes from RunDue the wait of letGoHold that bounds the wait of a let-go Run
	// for the next (keepLetGoHoldLocked): that Run is due. Nil while no such wait waits for
	// it. dueAfter is p.runs at a RunDue that came before that wait began.
	letGoDue chan (<-chan time.Time)
	dueAfter int
	// endRun ends runCtx: the daemon stops (Run's ctx ends without platforms.ErrLetGo, or
	// WaitInbound). Nil before the first Run.
	endRun context.CancelCauseFunc
	// stopNotices is the context the notices about the messages a stop met are posted on,
	// for the run's ctx of that stop (of): one bound for them all (noticeCtx).
	stopNotices struct {
		of, ctx context.Context
		cancel  context.CancelFunc
	}

	// resumable is set at the first READY: discordgo's every later Open sends RESUME. While
	// replaying, from the RESUME sent until RESUMED (or the READY of a new gateway session, or
	// a stop; a lost connection does not end it, a let-go after letGoHold), the messages
	// Discord replays wait in held (replay.go).
	resumable bool
	replaying bool

	// gapRead is the pending read of what a failed backfill left unread (unread), gapWait the
	// wait before the one after it (backfill.go, scheduleGapRead).
	gapRead *time.Timer
	gapWait time.Duration

	// blockWarn is rateWarn for the 429s of Discord's edge (ratelimit.go); own lock.
	blockWarn logging.Counter

	// notTakenLines is the "discord message not taken" line of a message the runtime refused
	// (logNotTaken, inbound.go): at once for each cause, then once a LimitEvery with the
	// count of those held back; own lock.
	notTakenLines logging.KeyedLimiter
}

var (
	_ platforms.Platform   = (*Platform)(nil)
	_ platforms.Checker    = (*Platform)(nil)
	_ platforms.Editor     = (*Platform)(nil)
	_ platforms.Recorder   = (*Platform)(nil)
	_ platforms.Withdrawer = (*Platform)(nil)
)

// New returns a Discord platform for c. It does not connect: Run does.
func New(c Config) (*Platform, error) {
	token := botToken(c.Token)
	if token == "" {
		return nil, errors.New("new discord platform: no bot token (set the environment variable named by platforms.discord.token_env)")
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("platform", Name)
	s, err := discordgo.New("Bot " + token)
	if err != nil {
		return nil, fmt.Errorf("new discord platform: %w", err)
	}
	api := newRewrite(c.Settings.APIURL, http.DefaultTransport)
	s.Client = &http.Client{Timeout: restTimeout, Transport: &blockedAs429{next: api}}
	s.UserAgent = "agentgate (https://github.com/agentgate/agentgate)"
	// Handlers run in order on the gateway's reader, so a channel's messages are delivered in
	// the order Discord sent them (the reader queues them, the intake hands them on: intake.go); a lost connection ends Run, and the platform supervisor
	// reopens it with capped backoff (discordgo's own reconnect loop could outlive Run).
	s.SyncEvents = true
	s.ShouldReconnectOnError = false
	// Nothing uses discordgo's own wait on a 429, which sleeps whatever retry_after Discord asks
	// (hours), deaf to the caller's ctx: every REST call of the platform goes through request
	// (ratelimit.go), and Run waits out a limit on Open's gateway lookup. Off, so that a call
	// that bypasses request fails with a RateLimitError instead of sleeping silently.
	s.ShouldRetryOnRateLimit = false
	s.MaxRestRetries = 3
	s.Identify.Intents = Intents
	s.ShardID, s.ShardCount = c.Settings.ShardID, max(c.Settings.ShardCount, 1)
	s.LogLevel = discordgo.LogWarning
	routeLibraryLogs(log, token)

	p := &Platform{
		cfg:        c.Settings,
		log:        log,
		s:          s,
		api:        api,
		gate:       newGate(c.Settings),
		lost:       make(chan error, 1),
		progress:   map[string]sendProgress{},
		drafting:   map[string]*draftTries{},
		limited:    map[string]time.Time{},
		seen:       map[string]seenAt{},
		unread:     map[string]seenAt{},
		kept:       map[string]persistence.Unread{},
		stored:     c.Unread,
		live:       map[string]string{},
		delivered:  map[string]deliveredMsg{},
		opened:     map[string]bool{},
		roles:      map[string]string{},
		roleMisses: map[string]time.Time{},
		recent:     c.Recent,
		now:        c.Now,
		runCtx:     context.Background(),
	}
	p.returnRefusal = c.ReturnRefusal
	if p.now == nil {
		p.now = time.Now
	}
	p.threads = newChannelCache(p.fetchChannel)
	p.typing = newTyping(p.sendTyping)
	p.lastErr = errors.New("not connected yet")
	s.AddHandler(survived(p, "READY", p.onReady))
	s.AddHandler(survived(p, "RESUMED", p.onResumed))
	s.AddHandler(survived(p, "disconnect", p.onDisconnect))
	s.AddHandler(survived(p, "MESSAGE_CREATE", p.onMessage))
	s.AddHandler(survived(p, "MESSAGE_UPDATE", p.onMessageUpdate))
	s.AddHandler(survived(p, "MESSAGE_DELETE", p.onMessageDelete))
	s.AddHandler(survived(p, "MESSAGE_DELETE_BULK", p.onMessageDeleteBulk))
	s.AddHandler(survived(p, "THREAD_CREATE", p.onThreadCreate))
	s.AddHandler(survived(p, "THREAD_UPDATE", p.onThreadUpdate))
	s.AddHandler(survived(p, "THREAD_DELETE", p.onThreadDelete))
	s.AddHandler(survived(p, "THREAD_LIST_SYNC", p.onThreadListSync))
	s.AddHandler(survived(p, "GUILD_CREATE", p.onGuildCreate))
	s.AddHandler(survived(p, "raw event", p.onEvent)) // after the typed handlers of each event
	return p, nil
}

// botToken is the token t without the spaces around it and without a "Bot " in front: the
// Authorization header's form, which the Developer Portal does not show but guides do, and
// which, sent as "Bot Bot …", Discord refuses. A token holds no space, so nothing else is cut.
func botToken(t string) string {
	t = strings.TrimSpace(t)
	if len(t) > 4 && strings.EqualFold(t[:4], "bot ") {
		t = strings.TrimSpace(t[4:])
	}
	return t
}

// survived is h with a panic in it logged and the event dropped. Handlers run on discordgo's
// gateway reader, where nothing recovers: a bug met on one odd event would take the daemon,
// and every chat with it, down, and a message that did so would be read back by the next
// start's backfill and do it again.
func survived[E any](p *Platform, event string, h func(*discordgo.Session, E)) func(*discordgo.Session, E) {
	return func(s *discordgo.Session, e E) {
		defer p.survive(event)
		h(s, e)
	}
}

// survive, deferred, logs a panic of the handling of one event and lets the platform go on.
func (p *Platform) survive(event string, attrs ...any) {
	if v := recover(); v != nil {
		p.panicked(event, v, attrs...)
	}
}

// panicked logs the recovered panic v of the handling of one event.
func (p *Platform) panicked(event string, v any, attrs ...any) {
	p.log.Error("discord event handling panicked; the event is dropped",
		append(attrs, "event", event, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))...)
}

// Name returns "discord".
func (p *Platform) Name() string { return Name }

// Run connects to the gateway (resuming the previous gateway session when there was one, so
// Discord replays what was missed) and feeds messages to deliver until ctx ends or the
// connection drops. A connection Discord refuses for good, at the connect or once live, keeps
// it down, not ended (stayDown); with Config.ReturnRefusal it ends Run with a *RefusedError.
func (p *Platform) Run(ctx context.Context, deliver platforms.Deliver) error {
	// The run's ctx (runCtx: the intake's, the backfills') ends when the daemon stops: when
	// ctx does, unless it ends with platforms.ErrLetGo (a cluster member lets the gateway
	// connection go, the daemon goes on), and at WaitInbound. Ended with ctx, the messages a
	// cluster member had queued met a stop, left for a read-back its next RESUME never made.
	// It is one for the Runs until a stop ends it: the backfill, the intake's delivery and the
	// gap read an earlier Run started go on with it after a lost connection, and a stop ends
	// them too. Made anew for each Run, a stop ended the last Run's only: a backfill of the one
	// before read on, and Run's stop waited for it, while it delivered after the runtime had
	// gone.
	p.mu.Lock()
	if p.endRun == nil || p.runCtx.Err() != nil {
		p.runCtx, p.endRun = context.WithCancelCause(context.WithoutCancel(ctx))
	}
	p.deliver = deliver
	p.recordFromLocked(p.now()) // what was said before, another process may have taken (deleted.go)
	if p.unhold != nil {
		p.unhold() // an earlier Run's ctx no longer ends the hold: this one's does
	}
	p.endLetGoWaitLocked()
	// A resume's replay cut short by a lost connection stays held (replay.go): the platform
	// actor runs Run again in the same ctx, and the next RESUME replays the rest. A ctx that
	// ends for a stop hands it on. One that ends with platforms.ErrLetGo (a cluster member lets
	// the gateway connection go, lost or its lease lost) keeps it until this member's next Run,
	// whose RESUME replays the rest, for letGoHold at most once that Run is due (RunDue):
	// another member may take the gateway, and no RESUME of this member's comes.
	// An earlier Run's ctx that ends late (a cluster member's, with platforms.ErrLetGo, once
	// that Run returned) no longer has the hold: this Run's replay is another, and handed on at
	// the end of the earlier ctx, it met its own deletions and edits too late.
	p.runs++
	run := p.runs
	p.unhold = context.AfterFunc(ctx, func() {
		p.stopping(ctx)
		end := func() { p.endReplayOf(run, context.Cause(ctx)) }
		if f := runEnded.Load(); f != nil {
			(*f)(end)
			return
		}
		end()
	})
	p.mu.Unlock()
	// The daemon stops: the messages still held or queued meet the stop (handle) before Run
	// returns, and nothing delivers once the runtime is gone. A lost connection returns at
	// once, and so does a connection let go: the intake goes on, and the next Run's messages
	// queue behind it (intake.go); a stop before that Run waits for it all the same
	// (WaitInbound).
	defer func() {
		if p.stopping(ctx) {
			p.settle(context.Background())
		}
	}()
	select { // a loss reported by the previous connection is old news
	case <-p.lost:
	default:
	}
	err := p.open(ctx)
	for {
		for err != nil {
			if ctx.Err() != nil {
				p.setErr(errors.New("stopped"))
				return nil
			}
			r, ok := p.refusedBy(err)
			if !ok {
				p.setErr(fmt.Errorf("connect to gateway: %w", err))
				return fmt.Errorf("discord: connect to gateway: %w", err)
			}
			p.refused(r, err)
			// No RESUME will follow soon, if ever: what a replay held is taken now.
			p.endReplay()
			if p.returnRefusal {
				return &RefusedError{RetryIn: refusalRetry, Err: err}
			}
			if !p.stayDown(ctx) {
				return nil
			}
			err = p.open(ctx)
		}
		if err = p.serve(ctx); err == nil {
			return nil
		}
		// A live connection Discord closed for good (4004: the token was reset in the
		// Developer Portal) stays down as a refused connect does, at once: ended, it cost a
		// warning and a restart, whose RESUME Discord refused the same way, before the ERR.
		if _, ok := p.refusedBy(err); !ok {
			return fmt.Errorf("discord: %w", err)
		}
	}
}

// stopping reports whether ctx, Run's, ended for a daemon stop, not with platforms.ErrLetGo,
// and then ends the run's ctx (runCtx) at once: what the intake takes from now on meets the
// stop.
func (p *Platform) stopping(ctx context.Context) bool {
	if ctx.Err() == nil || errors.Is(context.Cause(ctx), platforms.ErrLetGo) {
		return false
	}
	p.mu.Lock()
	end := p.endRun
	p.mu.Unlock()
	end(context.Cause(ctx))
	return true
}

// serve waits while the gateway connection is up, until ctx ends, which closes it (nil), or
// the connection is lost (why).
func (p *Platform) serve(ctx context.Context) error {
	defer p.typing.stopAll()
	select {
	case <-ctx.Done():
		p.setErr(errors.New("stopped"))
		p.stopGapRead()
		if err := p.s.CloseWithCode(closeCode(ctx)); err != nil {
			p.log.Debug("close gateway", logging.Err(err))
		}
		if p.stopping(ctx) {
			p.settle(context.Background()) // before the typing indicators stop: the intake may start one
		}
		return nil
	case err := <-p.lost:
		return err
	}
}

// closeResumable is the close code of a gateway connection let go with its session kept: any
// but 1000 and 1001 leaves the session resumable on Discord (docs: Gateway, Disconnecting), and
// 4000 is the one libraries use for it (discord.py, DSharpPlus).
const closeResumable = 4000

// closeCode is the close code of the gateway connection when Run's ctx ends. A stop (the daemon
// stops) closes it with 1000: the gateway session ends with the daemon, whose next start
// identifies anew (discordgo keeps no session across processes), and the bot shows offline at
// once. A let-go (platforms.ErrLetGo: a cluster member's lease lost) closes it with
// closeResumable, so that this member's next Run RESUMEs the session and Discord replays what
// was said meanwhile. Closed with 1000 (Session.Close), the session ended on Discord, and that
// RESUME got INVALID_SESSION: the new IDENTIFY's READY replayed nothing, a message said
// meanwhile in a chat no read-back finds (a new DM) was lost, and the deletions a replay brings
// after the messages a replay held never came (TestLetGoLeavesTheGatewaySessionResumable).
// Another member that takes the gateway identifies anyway (its discordgo has no session), and
// the session let go times out on Discord after a few minutes.
func closeCode(ctx context.Context) int {
	if errors.Is(context.Cause(ctx), platforms.ErrLetGo) {
		return closeResumable
	}
	return websocket.CloseNormalClosure
}

// open connects to the gateway, once a rate limit on its lookup has passed.
func (p *Platform) open(ctx context.Context) error {
	if err := p.waitGatewayLookup(ctx); err != nil {
		return err
	}
	p.beginReplay()
	// An Open that fails keeps what a replay holds (its first packet, or an earlier replay's
	// cut short): discordgo keeps its gateway session, and the next Open's RESUME replays the
	// rest.
	err := p.sentTo(p.s.Open())
	var rl *discordgo.RateLimitError
	if errors.As(err, &rl) {
		p.noteRateLimit(discordgo.EndpointGateway, rl.RateLimit, false) // Open does not say if it is global
	}
	return err
}

// refusalRetry is how long the platform stays down after the gateway refused it for good
// (stayDown) before it tries once more.
const refusalRetry = 30 * time.Minute

// refusalWait, when set, replaces time.After for the wait of stayDown (tests fire it).
var refusalWait atomic.Pointer[func(time.Duration) <-chan time.Time]

// A RefusedError ends Run (with Config.ReturnRefusal) when Discord refused the gateway
// connection for good: it logged its ERR line, and Ready says what to change, already.
type RefusedError struct {
	// RetryIn is how long to wait before connecting again. Trying sooner would meet the same
	// refusal and count towards Discord's edge blocking the host (blockedAs429).
	RetryIn time.Duration
	// Err is how Discord refused: the gateway's close, or the 401 of its lookup.
	Err error
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("discord: gateway connection refused, to be tried again in %v: %v", e.RetryIn, e.Err)
}

func (e *RefusedError) Unwrap() error { return e.Err }

// A gatewayRefusal is a gateway close code after which Discord says not to connect again: only
// what the operator changes can get past it (the token, the configuration, the bot's settings in
// the Developer Portal, agentgate itself).
type gatewayRefusal struct {
	log   string // the ERR line
	attrs []any  // of the ERR line: what the operator changes, and how Discord refused
	fix   string // what /readyz says
}

// refusalCode reports whether a gateway close code is one Discord says not to reconnect after:
// the codes refusedBy knows.
func refusalCode(code int) bool { return code == 4004 || code >= 4010 && code <= 4014 }

// refusedBy returns the refusal err is, if it is the gateway closing the connection with one of
// the close codes Discord says not to reconnect after, or the gateway lookup refusing the token.
func (p *Platform) refusedBy(err error) (gatewayRefusal, bool) {
	var (
		code int
		via  string // how Discord refused, for /readyz
		how  []any  // the same, for the log
		ce   *websocket.CloseError
	)
	switch {
	case errors.As(err, &ce):
		code, via, how = ce.Code, fmt.Sprintf("gateway close %d", ce.Code), []any{"close_code", ce.Code}
	case restStatus(err) == http.StatusUnauthorized:
		// The lookup of the gateway's address (or a REST proxy in front of it) refused the
		// token before the gateway could: the same refusal. Tried again at once, each 401
		// counted towards Discord's edge blocking the host (blockedAs429).
		code, via, how = 4004, "HTTP 401", []any{"status", http.StatusUnauthorized}
	default:
		return gatewayRefusal{}, false
	}
	shards := []any{"shard_id", p.s.ShardID, "shard_count", p.s.ShardCount}
	var r gatewayRefusal
	switch code {
	case 4004: // authentication failed
		r.log = "discord refused the bot token; the platform stays down until the daemon is restarted with the right one"
		r.attrs = []any{"token_env", p.cfg.TokenEnv}
		r.fix = fmt.Sprintf("the bot token was refused (%s): set the right one in $%s and restart the daemon", via, p.cfg.TokenEnv)
	case 4010: // invalid shard
		r.log = "discord refused the shard; set platforms.discord.shard_id and shard_count to one of the bot's shards and restart the daemon"
		r.attrs = shards
		r.fix = fmt.Sprintf("the shard was refused (%s): set platforms.discord.shard_id and shard_count and restart the daemon", via)
	case 4011: // sharding required
		r.log = "discord requires sharding: the bot is in too many guilds for one connection; set platforms.discord.shard_count and run a daemon for each shard_id"
		r.attrs = shards
		r.fix = fmt.Sprintf("sharding is required (%s): set platforms.discord.shard_count and run a daemon for each shard_id", via)
	case 4012: // invalid API version
		r.log = "discord refused the gateway api version of this agentgate; upgrade it"
		r.fix = fmt.Sprintf("the gateway api version was refused (%s): upgrade agentgate", via)
	case 4013: // invalid intents
		r.log = "discord refused the gateway intents as invalid; upgrade agentgate"
		r.attrs = []any{"intents", int(Intents)}
		r.fix = fmt.Sprintf("the gateway intents were refused as invalid (%s): upgrade agentgate", via)
	case 4014: // disallowed intents
		r.log = "discord refused the message content intent; turn it on for the bot in the developer portal"
		r.attrs = []any{"intents", int(Intents)}
		r.fix = fmt.Sprintf("the message content intent was refused (%s): turn it on in the Discord Developer Portal (the application, Bot, Privileged Gateway Intents); the platform tries again every 30 minutes, or restart the daemon", via)
	default:
		return gatewayRefusal{}, false
	}
	r.attrs = append(r.attrs, how...)
	return r, true
}

// refused logs the refusal r (met as err), and has Ready say it.
func (p *Platform) refused(r gatewayRefusal, err error) {
	p.setErr(errors.New(r.fix))
	p.log.Error(r.log, append(r.attrs, "retry_in", refusalRetry, logging.Err(err))...)
}

// stayDown keeps the platform down after a refusal for refusalRetry, then reports true for
// one more try; false when ctx ended first. Trying again at once cannot help:
// the token and the configuration are read once, at start, and every try would repeat the same
// refusal (a warning each, which read as a network problem) and count as one more invalid
// request towards Discord's edge blocking the host (blockedAs429). Never trying again kept the
// platform down for good after a refusal Discord made in error, or one the operator fixed
// without a restart (the intent turned on in the Developer Portal). /readyz says why it is down.
func (p *Platform) stayDown(ctx context.Context) bool {
	wait := time.After
	if f := refusalWait.Load(); f != nil {
		wait = *f
	}
	select {
	case <-ctx.Done():
		p.setErr(errors.New("stopped"))
		return false
	case <-wait(refusalRetry):
		return true
	}
}

// Ready reports whether the gateway connection is up.
func (p *Platform) Ready(context.Context) error {
	if p.connected.Load() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Errorf("discord gateway not connected: %w", p.lastErr)
}

func (p *Platform) setErr(err error) {
	p.connected.Store(false)
	p.mu.Lock()
	p.lastErr = err
	p.mu.Unlock()
}

func (p *Platform) onReady(_ *discordgo.Session, r *discordgo.Ready) {
	if r.User != nil {
		id := r.User.ID
		p.botID.Store(&id)
	}
	p.connected.Store(true)
	p.log.Info("discord gateway ready", "bot", userName(r.User), "guilds", len(r.Guilds), "shard", p.s.ShardID, "shards", p.s.ShardCount)
	// A READY starts a new gateway session, to which Discord replays nothing: read back what
	// was missed. Not here: handlers run on discordgo's gateway reader (SyncEvents), and the
	// first READY's inside Open, before heartbeats start; a backfill of many channels takes
	// longer than a heartbeat interval, and Discord (or discordgo, missing the acks) would drop
	// the connection, and the next READY would backfill again.
	// A RESUME answered with INVALID_SESSION ends with this READY: what its replay held (if
	// anything) is taken first, before what the backfill reads after it.
	p.endReplay()
	p.mu.Lock()
	p.resumable = true
	p.addBackfillLocked()
	p.mu.Unlock()
	go p.backfillThenRelease(false)
}

// backfillThenRelease runs a backfill (of the unread gaps only, with gaps), then hands the live
// messages held meanwhile to the intake, in order, once no other backfill waits and no resume's
// replay is in flight (whose end, endReplay, hands them on then). The backfill reads once the
// intake has handled what was queued before it (intake.go): those messages come first, and the
// backfill, which handles what it reads back on its own goroutine, never delivers beside it.
func (p *Platform) backfillThenRelease(gaps bool) {
	p.backfillMu.Lock()
	defer p.backfillMu.Unlock()
	p.waitIntake()
	p.mu.Lock()
	stopped := p.runCtx.Err() != nil
	p.mu.Unlock()
	// A stop met while it waited for the intake (held by a delivery the runtime did not answer)
	// ends it: read on the stop's cancelled context, every channel's read failed, warned of as
	// Discord's failure, and the next start reads it all back anyway.
	if !stopped {
		func() {
			defer p.survive("backfill") // the live messages it holds are taken all the same
			p.backfill(gaps)
		}()
		p.scheduleGapRead()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.doneBackfillLocked() // after what it held is queued: settle waits for it then
	p.putDownLocked()            // a backfill that panicked left its backlog
	p.backlog = nil
	switch {
	case p.backfills > 1:
		// A later READY's backfill waits: it hands them on after its own.
	case p.replaying:
		// A resume's replay is in flight: what is held waits for its end (endReplay), so that
		// the deletions and edits still to come in it apply to the replayed messages held
		// here. Handed on now, an idle session ran a message its sender had deleted
		// (TestReplayHeldThroughABackfillThatEndsFirst).
	default:
		held := p.held
		p.held = nil
		p.enqueueLocked(held...)
	}
}

func (p *Platform) onResumed(*discordgo.Session, *discordgo.Resumed) {
	p.connected.Store(true)
	p.log.Info("discord gateway resumed")
	// The replay is over: what it held, less what it deleted, is taken in order.
	p.endReplay()
	p.scheduleGapRead() // a gap whose read found the platform stopped is read now
}

func (p *Platform) onDisconnect(*discordgo.Session, *discordgo.Disconnect) {
	err := errors.New("gateway connection lost")
	if ce := liveClose.Swap(nil); ce != nil {
		err = fmt.Errorf("gateway connection lost: %w", ce)
	}
	p.setErr(err)
	// What a replay cut short holds stays held (replay.go): the next RESUME replays the
	// deletions and edits that follow it.
	select {
	case p.lost <- err:
	default:
	}
}

func (p *Platform) bot() string {
	if id := p.botID.Load(); id != nil {
		return *id
	}
	return ""
}

func userName(u *discordgo.User) string {
	if u == nil {
		return ""
	}
	return u.Username
}

// libraryLog is where discordgo's package-wide logger writes; the latest platform's logger.
var libraryLog atomic.Pointer[slog.Logger]

// liveClose is the close frame that ended a live gateway connection, from discordgo's line of
// it (gatewayClosed), until the Disconnect event that follows takes it (onDisconnect): nowhere
// else does discordgo tell why a live connection ended. Both run on the connection's reader,
// one after the other (the line, Session.Close, its Disconnect handlers: SyncEvents); the line
// names no platform, and the process runs one (its tests, one at a time).
var liveClose atomic.Pointer[websocket.CloseError]

// libraryTokens are the bot tokens of the platforms made so far, cut out of discordgo's lines.
var libraryTokens struct {
	mu     sync.Mutex
	tokens []string
}

var routeOnce sync.Once

// routeLibraryLogs sends discordgo's own log lines to log instead of the standard logger,
// without token in them. At the level the platform sets (LogWarning) discordgo logs no packet
// it sends, but at LogDebug it logs the identify packet, token and all: a line that reaches
// the log must not depend on that level staying where it is.
func routeLibraryLogs(log *slog.Logger, token string) {
	libraryLog.Store(log.With("component", "discordgo"))
	if token != "" {
		libraryTokens.mu.Lock()
		if !slices.Contains(libraryTokens.tokens, token) {
			libraryTokens.tokens = append(libraryTokens.tokens, token)
		}
		libraryTokens.mu.Unlock()
	}
	routeOnce.Do(func() {
		discordgo.Logger = func(level, _ int, format string, a ...any) {
			l := libraryLog.Load()
			if e, ok := replayedFirst(format, a); ok {
				// Discord answers a RESUME with the events the connection missed, then RESUMED,
				// so after a dropped connection the first packet is often a replayed event.
				// discordgo warns of it with a dump of the event's raw bytes (a user's message,
				// several KB on one WRN line), and handles it all the same: nothing to act on.
				l.Debug("discord gateway: resume replayed missed events before RESUMED", "first", e.Type, "seq", e.Sequence)
				return
			}
			msg := redactTokens(strings.TrimSpace(fmt.Sprintf(format, a...)))
			if ce, ok := gatewayClosed(format, a); ok {
				liveClose.Store(ce)
				if refusalCode(ce.Code) {
					// The platform stays down with an ERR line that says what to do, at once
					// (Run): this line would read as a network problem.
					l.Debug(msg)
					return
				}
			}
			// discordgo's errors are the gateway's (a heartbeat not acknowledged, a connection
			// or a read that failed, an event that did not decode). A lost connection ends Run,
			// which the platform actor restarts (WRN platform stopped; restarting): nothing in
			// them asks a human to act, as an ERR line would.
			switch level {
			case discordgo.LogError, discordgo.LogWarning:
				l.Warn(msg)
			default:
				l.Debug(msg)
			}
		}
	})
}

// replayedFirst recognises discordgo's warning that the first packet after IDENTIFY or RESUME
// was not READY or RESUMED, and returns that packet.
func replayedFirst(format string, a []any) (*discordgo.Event, bool) {
	if !strings.HasPrefix(format, "Expected READY/RESUMED") || len(a) != 1 {
		return nil, false
	}
	e, ok := a[0].(*discordgo.Event)
	return e, ok && e != nil
}

// gatewayClosed recognises discordgo's warning that the read of a live gateway connection
// failed (Session.listen), and returns the close frame that ended it, when one did.
func gatewayClosed(format string, a []any) (*websocket.CloseError, bool) {
	if !strings.HasPrefix(format, "error reading from gateway") || len(a) != 2 {
		return nil, false
	}
	var ce *websocket.CloseError
	if err, ok := a[1].(error); !ok || !errors.As(err, &ce) {
		return nil, false
	}
	return ce, true
}

// redactTokens replaces every bot token in s.
func redactTokens(s string) string {
	libraryTokens.mu.Lock()
	defer libraryTokens.mu.Unlock()
	for _, t := range libraryTokens.tokens {
		s = strings.ReplaceAll(s, t, "[token]")
	}
	return s
}
