package discord

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/actors"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// runOnce is a platform whose Run runs the Discord platform's once: a later Run waits for its
// ctx, as a cluster member waits for the gateway lease, so that a stop finds the Discord
// platform's Run not running, as in the platform actor's backoff. returned is closed when the
// first Run returns.
type runOnce struct {
	*Platform
	once     sync.Once
	returned chan struct{}
}

func (r *runOnce) Run(ctx context.Context, deliver platforms.Deliver) error {
	first := false
	r.once.Do(func() { first = true })
	if !first {
		<-ctx.Done()
		return nil
	}
	defer close(r.returned)
	return r.Platform.Run(ctx, deliver)
}

// TestStopBetweenRunsWaitsForTheIntake: the daemon stops while the platform actor waits to run
// the platform again after a lost connection (its backoff; a cluster member's wait for the
// gateway lease), with a delivery the runtime does not answer and a new DM's message queued
// behind it. The actor stops only once the intake has handed that message on, as a stop of a
// running platform waits for it (TestStopWaitsForTheIntake). Before, it stopped at once, and
// the intake delivered the message after the runtime was gone, or never (the process
// exited): a new DM, which the next start does not read back, was lost without a word.
func TestStopBetweenRunsWaitsForTheIntake(t *testing.T) {
	h := newHeldDelivery()
	srv := discordtest.New(t, discordtest.WithHeartbeatInterval(200*time.Millisecond))
	srv.AddChannel(discordtest.Channel{ID: "300000000000000001", Type: discordgo.ChannelTypeDM})
	quiet := slog.New(slog.DiscardHandler)
	p, err := New(Config{Token: srv.Token(), Settings: config.Discord{APIURL: srv.APIURL()}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	r := &runOnce{Platform: p, returned: make(chan struct{})}
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
	d := &actors.Deps{Ctx: t.Context(), Log: quiet, Metrics: metrics.New(Name)}
	pid := system.Root.Spawn(actors.NewPlatform(d, r, &actors.PlatformHealth{}))
	t.Cleanup(func() {
		select {
		case <-h.release:
		default:
			close(h.release)
		}
		_ = system.Root.PoisonFuture(pid).Wait()
		system.Shutdown()
	})
	system.Root.Send(pid, &actors.StartIntake{Deliver: h.deliver, Withdraw: h.withdraw})
	srv.WaitReady(t)
	post := func(text string) {
		srv.Post(discordtest.UserMessage{ChannelID: "300000000000000001", Author: discordtest.User{ID: "400000000000000001", Username: "alice"}, Content: text})
	}
	post("first")
	<-h.started
	post("second")
	waitQueued(t, p, "the second message queued behind the held delivery", 1)
	srv.Disconnect() // Run returns; the actor runs it again after its backoff
	<-r.returned

	// Release the held delivery once the stop waits for the intake, or once the actor stopped
	// without waiting (as before: a failure).
	waiting := stopWaits(t)
	stopped := make(chan struct{})
	go func() {
		_ = system.Root.PoisonFuture(pid).Wait()
		close(h.returned) // what is delivered from now on is late
		close(stopped)
	}()
	select {
	case <-waiting:
	case <-stopped:
		t.Error("the platform actor stopped while a delivery was held and a message queued behind it")
	}
	close(h.release)
	<-stopped
	pollFor(t, "the queue handed on", func() bool { texts, _, _ := h.got(); return len(texts) == 2 })
	texts, _, late := h.got()
	if !slices.Equal(texts, []string{"first", "second"}) || len(late) > 0 {
		t.Errorf("delivered %q, %q of them after the platform actor stopped; want first and second, both before", texts, late)
	}
}

// TestStopDuringABackfillsReadsWarnsOfNothing: the daemon stops while a new gateway session's
// backfill reads the first of two channels (Discord has not answered yet). The stop waits for
// the backfill (settle), which reads nothing more: no history read failed, and nothing is
// warned of, as for a backfill the stop met before it read (TestStopSkipsABackfillThatWaitedForTheIntake);
// the next start reads it all back. Before, the read cut short by the stop was warned of as
// failed and "retrying", every channel after it was read on the cancelled context and failed
// the same way, and the backfill warned that it could not read them, as if Discord had failed.
func TestStopDuringABackfillsReadsWarnsOfNothing(t *testing.T) {
	const other = "200000000000000002"
	h := newHeldDelivery()
	answer := make(chan struct{})
	defer close(answer) // after the stop: the fake's held handlers end
	srv, _, log, stop := intakeWorldWith(t, h, func(srv *discordtest.Server) {
		srv.AddGuild(recentGuild, "guild")
		for _, ch := range []string{recentChannel, other} {
			srv.AddChannel(discordtest.Channel{ID: ch, GuildID: recentGuild, Type: discordgo.ChannelTypeGuildText, Name: "general-" + ch})
			srv.HoldNext("GET", "/channels/"+ch+"/messages", answer, 1)
		}
	}, func(c *Config) {
		c.Settings.BackfillWindow = time.Hour
		c.Recent = func(context.Context, time.Time) ([]persistence.ChatMark, error) {
			return []persistence.ChatMark{
				{ChatID: recentChannel, ScopeID: recentGuild, MessageID: "1", At: time.Now()},
				{ChatID: other, ScopeID: recentGuild, MessageID: "2", At: time.Now()},
			}, nil
		}
	})
	srv.WaitFor(t, "the backfill reading its first channel", func() bool {
		return srv.Requests("GET", "/channels/"+recentChannel+"/messages")+srv.Requests("GET", "/channels/"+other+"/messages") == 1
	})
	stop() // returns once the backfill is over (settle)
	if s := log.String(); strings.Contains(s, "discord backfill:") {
		t.Errorf("the backfill the stop cut short warned of failed reads:\n%s", s)
	}
}

// TestStopEndsTheBackfillOfAnEarlierRun: a gateway session's backfill reads a channel (Discord
// has not answered yet) when the connection is lost; the platform is run again in the same
// ctx, as the platform actor does, and resumes; then the daemon stops. The stop ends that
// backfill as it ends one of the running Run's (TestStopDuringABackfillsReadsWarnsOfNothing):
// Run returns while the read is still unanswered. Before, each Run made a run ctx of its own
// and a stop ended only the last one: the earlier Run's backfill read on, every channel and
// its pages, Run's stop waited for it without a bound, and what it read back was delivered
// after the runtime had stopped (the platform actor gives up its wait after runStopWait).
func TestStopEndsTheBackfillOfAnEarlierRun(t *testing.T) {
	h := newHeldDelivery()
	answer := make(chan struct{})
	var closeAnswer sync.Once
	release := func() { closeAnswer.Do(func() { close(answer) }) }
	defer release() // after the stop: the fake's held handler ends
	srv, _, log, stop := intakeWorldWith(t, h, func(srv *discordtest.Server) {
		srv.AddGuild(recentGuild, "guild")
		srv.AddChannel(discordtest.Channel{ID: recentChannel, GuildID: recentGuild, Type: discordgo.ChannelTypeGuildText, Name: "general"})
		srv.HoldNext("GET", "/channels/"+recentChannel+"/messages", answer, 1)
	}, func(c *Config) {
		c.Settings.BackfillWindow = time.Hour
		c.Recent = func(context.Context, time.Time) ([]persistence.ChatMark, error) {
			return []persistence.ChatMark{{ChatID: recentChannel, ScopeID: recentGuild, MessageID: "1", At: time.Now()}}, nil
		}
	})
	srv.WaitFor(t, "the backfill reading its channel", func() bool {
		return srv.Requests("GET", "/channels/"+recentChannel+"/messages") == 1
	})
	srv.Disconnect() // Run returns; it runs again and resumes
	srv.WaitFor(t, "the gateway session resumed", func() bool { return srv.Resumes() > 0 && srv.Ready() })

	stopped := make(chan struct{})
	go func() {
		stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second): // a deadline for the failure, not a wait for an effect
		t.Error("Run's stop waits for the backfill of the Run before it, which reads on")
		release()
		<-stopped
	}
	if s := log.String(); strings.Contains(s, "discord backfill:") {
		t.Errorf("the backfill the stop cut short warned of failed reads:\n%s", s)
	}
}

// TestStopTellsANewDMsSenderToSendAgain: the daemon stops while a delivery is held, with a
// message of a new DM (a chat the store took nothing from: the next start does not read it
// back) and one of a chat the store took a message from just now queued behind it; the
// stopping runtime turns both away. The new DM's sender is told to send it again, in a reply
// to the message; the other chat's is not (the next start reads it back and answers it).
// Before, the notice was posted on the run's context, which the stop had ended: the post
// failed with a WRN, and the new DM's message was lost without a word to its sender.
func TestStopTellsANewDMsSenderToSendAgain(t *testing.T) {
	const knownDM, newDM = "300000000000000001", "300000000000000002"
	h := newHeldDelivery()
	srv, p, log, stop := intakeWorldWith(t, h, func(srv *discordtest.Server) {
		srv.AddChannel(discordtest.Channel{ID: newDM, Type: discordgo.ChannelTypeDM})
	}, func(c *Config) { c.Settings.BackfillWindow = time.Hour })
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	bob := discordtest.User{ID: "400000000000000002", Username: "bob"}
	srv.Post(discordtest.UserMessage{ChannelID: knownDM, Author: alice, Content: "first"}) // taken once released
	<-h.started
	fresh := srv.Post(discordtest.UserMessage{ChannelID: newDM, Author: bob, Content: "hello, first time"})
	known := srv.Post(discordtest.UserMessage{ChannelID: knownDM, Author: alice, Content: "and then"})
	waitQueued(t, p, "both queued behind the held delivery", 2)
	onStopWait(t, func() {
		h.drain()
		close(h.release)
	})
	stop() // returns once the intake has handed the queue on (settle)
	wantStopNotice(t, srv, newDM, fresh)
	if s := log.String(); strings.Contains(s, "its author is not told") {
		t.Errorf("a notice failed:\n%s", s)
	}
	if sent := srv.Sent(knownDM); len(sent) > 0 {
		t.Errorf("told %s's sender %q, want nothing: the next start reads it back", known.ID, sent[0].Content)
	}
	if s := log.String(); !strings.Contains(s, "discord message not taken while stopping; the next start reads it back") || !strings.Contains(s, "message_id="+known.ID) {
		t.Errorf("the known chat's message is not left for the read-back:\n%s", s)
	}
}

// TestStopBoundsItsNoticesTogether: the daemon stops while a delivery is held, with three
// messages of a new DM queued behind it, and Discord does not answer a post. The stopping
// runtime turns the three away, and their notices share one stopNoticeTimeout: the first
// post takes it all, and the others, past it, are not tried. Before, each notice had a
// stopNoticeTimeout of its own: the stop waited one for each message queued, past the
// platform actor's wait (runStopWait, 10 s) from four of them, and the intake then went on
// delivering after the runtime had gone.
func TestStopBoundsItsNoticesTogether(t *testing.T) {
	const knownDM, newDM, queued = "300000000000000001", "300000000000000002", 3
	answer := make(chan struct{})
	defer close(answer) // after the stop: the fake's held handlers end
	h := newHeldDelivery()
	srv, p, log, stop := intakeWorldWith(t, h, func(srv *discordtest.Server) {
		srv.AddChannel(discordtest.Channel{ID: newDM, Type: discordgo.ChannelTypeDM})
		srv.HoldNext("POST", "/channels/"+newDM+"/messages", answer, queued)
	}, func(c *Config) { c.Settings.BackfillWindow = time.Hour })
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	bob := discordtest.User{ID: "400000000000000002", Username: "bob"}
	srv.Post(discordtest.UserMessage{ChannelID: knownDM, Author: alice, Content: "first"})
	<-h.started
	for i := range queued {
		srv.Post(discordtest.UserMessage{ChannelID: newDM, Author: bob, Content: fmt.Sprint("hello ", i)})
	}
	waitQueued(t, p, "the new DM's messages queued behind the held delivery", queued)
	onStopWait(t, func() {
		h.drain()
		close(h.release)
	})
	stop() // returns once the intake has handed the queue on (settle)
	if n := srv.Requests("POST", "/channels/"+newDM+"/messages"); n != 1 {
		t.Errorf("the stop tried %d notices in a Discord that does not answer, want 1: its notices share one %v:\n%s", n, stopNoticeTimeout, log.String())
	}
}

// TestStopTellsSendersInAThreadAndAnAutoThreadToSendAgain: the daemon stops while a delivery
// is held, with two mentions queued behind it in chats the store took nothing from (the next
// start does not read them back): one in a thread discordgo's state does not hold (archived:
// its handling looks it up over REST), one in a channel whose mentions open an auto-thread.
// The stopping runtime turns both away, and each sender gets the stop's own notice to send it
// again, replying to the message (the auto-thread's in its channel), and no thread is opened
// for a message not taken. Before, the lookups ran on the stop's cancelled context: the
// thread's lookup failed, logged ERR "discord message from an unknown channel", and told its
// sender the channel could not be looked up (it could: the daemon was stopping); the
// auto-thread's opening failed, and so did its "could not open a thread yet" notice.
func TestStopTellsSendersInAThreadAndAnAutoThreadToSendAgain(t *testing.T) {
	const channel, thread = "200000000000000002", "200000000000000003"
	h := newHeldDelivery()
	srv, p, log, stop := intakeWorldWith(t, h, func(srv *discordtest.Server) {
		addArchivedThread(srv, channel, thread, "400000000000000002")
	}, func(c *Config) {
		c.Settings.BackfillWindow = time.Hour
		c.Settings.AutoThread = true
		c.Settings.RequireMention = true
	}, discordtest.WithHeartbeatInterval(discordtest.DefaultHeartbeatInterval))
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	bob := discordtest.User{ID: "400000000000000002", Username: "bob"}
	srv.Post(discordtest.UserMessage{ChannelID: "300000000000000001", Author: alice, Content: "first"})
	<-h.started
	inThread := srv.Post(discordtest.UserMessage{ChannelID: thread, Author: bob, Content: "a question", MentionBot: true})
	inChannel := srv.Post(discordtest.UserMessage{ChannelID: channel, Author: bob, Content: "another one", MentionBot: true})
	waitQueued(t, p, "both queued behind the held delivery", 2)
	if _, err := p.s.State.Channel(thread); err == nil {
		t.Fatal("discordgo's state holds the thread: its handling would look nothing up")
	}
	onStopWait(t, func() {
		h.drain()
		close(h.release)
	})
	stop() // returns once the intake has handed the queue on (settle)
	for _, c := range []struct {
		where string
		m     *discordgo.Message
	}{{thread, inThread}, {channel, inChannel}} {
		wantStopNotice(t, srv, c.where, c.m)
	}
	if n := srv.Requests("POST", "/threads"); n > 0 {
		t.Errorf("tried to open %d threads for a message the stopping runtime did not take, want none", n)
	}
	if s := log.String(); strings.Contains(s, "unknown channel") || strings.Contains(s, "open discord thread") || strings.Contains(s, "its author is not told") {
		t.Errorf("a lookup or a notice failed on the stop's context:\n%s", s)
	}
}
