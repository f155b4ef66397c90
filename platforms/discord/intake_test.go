package discord

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// heldDelivery is a runtime whose delivery of a message whose text is "first" waits until
// release is closed; it records the texts it was handed, in order, and the withdrawals. A
// message handed on again is acknowledged as a duplicate, as the runtime does. Once drain is
// called, it turns away what it is handed (platforms.ErrDraining), as a stopping runtime does.
type heldDelivery struct {
	release  chan struct{}
	started  chan struct{} // closed when the delivery of "first" starts
	returned chan struct{} // closed by the test once Run returned
	mu       sync.Mutex
	texts    []string
	late     []string // texts handed on after Run returned
	withdrew []string
	ids      map[string]bool // the message ids handed on
	draining bool
	refusal  error // when set, every delivery fails with it (refuse)
}

func newHeldDelivery() *heldDelivery {
	return &heldDelivery{release: make(chan struct{}), started: make(chan struct{}), returned: make(chan struct{}), ids: map[string]bool{}}
}

func (h *heldDelivery) deliver(_ context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
	h.mu.Lock()
	h.texts = append(h.texts, in.Text)
	select {
	case <-h.returned:
		h.late = append(h.late, in.Text)
	default:
	}
	again := h.ids[in.MessageID]
	h.ids[in.MessageID] = true
	draining, refusal := h.draining, h.refusal
	h.mu.Unlock()
	if draining {
		return nil, platforms.ErrDraining
	}
	if refusal != nil {
		return nil, refusal
	}
	if again {
		return &platforms.Ack{Disposition: platforms.Duplicate}, nil
	}
	if in.Text == "first" {
		close(h.started)
		<-h.release
	}
	return &platforms.Ack{Disposition: platforms.Started}, nil
}

// refuse makes every delivery from now on fail with err.
func (h *heldDelivery) refuse(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refusal = err
}

// drain makes the runtime turn away what it is handed from now on.
func (h *heldDelivery) drain() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.draining = true
}

func (h *heldDelivery) withdraw(_ context.Context, _ identity.Source, id string) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.withdrew = append(h.withdrew, id)
	return true, nil
}

func (h *heldDelivery) got() (texts, withdrew, late []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.texts), slices.Clone(h.withdrew), slices.Clone(h.late)
}

// intakeWorld runs a platform against a fake Discord with alice's DM channel, heartbeating
// every 200 ms, with h as its runtime; Run is run again after a lost connection. stop cancels
// Run and waits for it to return.
func intakeWorld(t *testing.T, h *heldDelivery) (srv *discordtest.Server, p *Platform, log *testutil.Buffer, stop func()) {
	t.Helper()
	return intakeWorldWith(t, h, nil, nil)
}

// intakeWorldWith is intakeWorld with setup run on the fake before it starts, and tweak on the
// platform's Config before New; opts are the fake's, after the 200 ms heartbeat (a test that
// waits for no heartbeat passes Discord's own interval: a short one drops a loaded run's
// connection, five missed ACKs).
func intakeWorldWith(t *testing.T, h *heldDelivery, setup func(*discordtest.Server), tweak func(*Config), opts ...discordtest.Option) (srv *discordtest.Server, p *Platform, log *testutil.Buffer, stop func()) {
	t.Helper()
	srv = discordtest.New(t, append([]discordtest.Option{discordtest.WithHeartbeatInterval(200 * time.Millisecond)}, opts...)...)
	srv.AddChannel(discordtest.Channel{ID: "300000000000000001", Type: discordgo.ChannelTypeDM})
	if setup != nil {
		setup(srv)
	}
	log = &testutil.Buffer{}
	c := Config{Token: srv.Token(), Settings: config.Discord{APIURL: srv.APIURL()}, Logger: slog.New(slog.NewTextHandler(log, nil))}
	if tweak != nil {
		tweak(&c)
	}
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	p.SetWithdraw(h.withdraw, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		// Run again after a lost connection, as the platform actor does.
		err := p.Run(ctx, h.deliver)
		for err != nil && ctx.Err() == nil {
			err = p.Run(ctx, h.deliver)
		}
		done <- err
		close(h.returned)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		select {
		case <-h.release:
		default:
			close(h.release)
		}
		stop()
	})
	srv.WaitReady(t)
	return srv, p, log, stop
}

// TestReaderIsNotHeldByADelivery: while the delivery of one message waits for a runtime that
// does not answer, the gateway reader goes on: it reads heartbeat ACKs, and the deletion of a
// later message still queued drops it (never delivered) and an edit of one rewrites it; once
// the delivery returns, the queue is delivered in order, and the deletion of the message whose
// delivery was under way withdraws it. The queue's growth is warned of once. Before, the
// handlers ran the delivery on the reader: no ACK was read (discordgo dropped the connection
// after five intervals), and the deletion came after the deleted message was delivered.
func TestReaderIsNotHeldByADelivery(t *testing.T) {
	h := newHeldDelivery()
	srv, p, log, _ := intakeWorld(t, h)
	p.mu.Lock()
	p.intakeWarnAt = 2
	p.mu.Unlock()
	post := func(text string) *discordgo.Message {
		return srv.Post(discordtest.UserMessage{ChannelID: "300000000000000001", Author: discordtest.User{ID: "400000000000000001", Username: "alice"}, Content: text})
	}
	first := post("first")
	<-h.started
	p.s.RLock()
	acked := p.s.LastHeartbeatAck
	p.s.RUnlock()
	second := post("second")
	post("third")
	fourth := post("fourth")
	post("fifth")
	srv.Delete(second.ID)
	srv.Edit(fourth.ID, "fourth, edited")
	srv.Delete(first.ID) // its delivery is under way: withdrawn once it returns
	queued := func() []string {
		p.mu.Lock()
		defer p.mu.Unlock()
		var ids []string
		for _, it := range p.intake {
			if it.m != nil {
				ids = append(ids, it.m.Content)
			}
		}
		return ids
	}
	pollFor(t, "the deletion and the edit applied to the queue while the first delivery is held", func() bool {
		return slices.Equal(queued(), []string{"third", "fourth, edited", "fifth"})
	})
	pollFor(t, "a heartbeat ACK read while the first delivery is held", func() bool {
		p.s.RLock()
		defer p.s.RUnlock()
		return p.s.LastHeartbeatAck.After(acked)
	})
	if texts, _, _ := h.got(); !slices.Equal(texts, []string{"first"}) {
		t.Fatalf("delivered %q while the first delivery is held, want only first", texts)
	}
	close(h.release)
	want := []string{"first", "third", "fourth, edited", "fifth"}
	pollFor(t, "the queue delivered", func() bool {
		texts, withdrew, _ := h.got()
		return len(texts) == len(want) && len(withdrew) == 1
	})
	texts, withdrew, _ := h.got()
	if !slices.Equal(texts, want) {
		t.Errorf("delivered %q, want %q", texts, want)
	}
	if !slices.Equal(withdrew, []string{first.ID}) {
		t.Errorf("withdrew %q, want the first message %s", withdrew, first.ID)
	}
	if n := strings.Count(log.String(), "discord messages queue up behind a delivery"); n != 1 {
		t.Errorf("the queue's growth was warned of %d times, want once:\n%s", n, log.String())
	}
}

// TestStopWaitsForTheIntake: when the daemon stops while a delivery is held and messages
// queue behind it, Run returns only once the intake has handed each of them on (they meet
// the stop there), not before: nothing delivers once the runtime is gone.
func TestStopWaitsForTheIntake(t *testing.T) {
	h := newHeldDelivery()
	srv, p, _, stop := intakeWorld(t, h)
	post := func(text string) {
		srv.Post(discordtest.UserMessage{ChannelID: "300000000000000001", Author: discordtest.User{ID: "400000000000000001", Username: "alice"}, Content: text})
	}
	post("first")
	<-h.started
	post("second")
	post("third")
	waitQueued(t, p, "both queued behind the held delivery", 2)
	// Release the held delivery once the stop waits for the intake, or once Run returned
	// without waiting (as before: a failure).
	waiting := stopWaits(t)
	stopped := make(chan struct{})
	go func() {
		stop()
		close(stopped)
	}()
	select {
	case <-waiting:
	case <-h.returned:
		t.Error("Run returned while a delivery was held and messages queued behind it")
	}
	close(h.release)
	<-stopped
	pollFor(t, "the queue handed on", func() bool { texts, _, _ := h.got(); return len(texts) == 3 })
	texts, _, late := h.got()
	if !slices.Equal(texts, []string{"first", "second", "third"}) || len(late) > 0 {
		t.Errorf("delivered %q, %q of them after Run returned; want first, second and third, all before", texts, late)
	}
}

// TestStopLeavesAQueuedMessageForTheReadBack: a message still queued for the intake when the
// daemon stops meets the stop with the run's context over, and is left for the next start's
// read-back (its chat is one the store took a message from lately) before any REST lookup.
// Before, its handling looked its channel up (not in discordgo's state: a thread the gateway
// did not list) on the cancelled context, logged an ERR "discord message from an unknown
// channel" an operator would chase, and tried to tell its sender to send it again (which
// failed too), though the next start answers it.
func TestStopLeavesAQueuedMessageForTheReadBack(t *testing.T) {
	h := newHeldDelivery()
	srv, p, log, stop := intakeWorldWithARecentChannel(t, h)
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	pollFor(t, "the first READY's backfill", func() bool { return strings.Contains(log.String(), "read what was missed") })
	// The state no longer holds the channel: its handling would look it up over REST. The
	// guild's GUILD_CREATE may come after the READY's backfill is done: wait for it.
	var ch *discordgo.Channel
	pollFor(t, "the channel in the state", func() bool {
		var err error
		ch, err = p.s.State.Channel(recentChannel)
		return err == nil
	})
	if err := p.s.State.ChannelRemove(ch); err != nil {
		t.Fatal(err)
	}
	srv.Post(discordtest.UserMessage{ChannelID: "300000000000000001", Author: alice, Content: "first"})
	<-h.started
	second := srv.Post(discordtest.UserMessage{ChannelID: recentChannel, Author: alice, Content: "second"})
	waitQueued(t, p, "the second message queued behind the held delivery", 1)
	onStopWait(t, func() { close(h.release) })
	stop()
	if s := log.String(); strings.Contains(s, "unknown channel") || !strings.Contains(s, "discord message not taken while stopping; the next start reads it back") ||
		!strings.Contains(s, "message_id="+second.ID) {
		t.Errorf("the queued message met by the stop is not left for the read-back alone:\n%s", s)
	}
	if texts, _, _ := h.got(); !slices.Equal(texts, []string{"first"}) {
		t.Errorf("delivered %q, want first alone", texts)
	}
	if sent := srv.Sent(recentChannel); len(sent) > 0 {
		t.Errorf("told the sender %q, want nothing: the next start answers it", sent[0].Content)
	}
}

// TestStopSkipsABackfillThatWaitedForTheIntake: a new gateway session's backfill waits for the
// intake, here held by a delivery the runtime does not answer; when the daemon stops meanwhile,
// the backfill reads nothing once the intake is done: the next start reads it all back. Before,
// it read every channel on the stop's cancelled context, and warned of history reads failed
// ("retrying", "read again later") that were no failure of Discord's.
func TestStopSkipsABackfillThatWaitedForTheIntake(t *testing.T) {
	h := newHeldDelivery()
	srv, p, log, stop := intakeWorldWithARecentChannel(t, h)
	pollFor(t, "the first READY's backfill", func() bool { return strings.Contains(log.String(), "read what was missed") })
	srv.Post(discordtest.UserMessage{ChannelID: "300000000000000001", Author: discordtest.User{ID: "400000000000000001", Username: "alice"}, Content: "first"})
	<-h.started
	srv.InvalidateSession() // a new gateway session: its READY backfills, once the intake is done
	srv.WaitFor(t, "a second IDENTIFY", func() bool { return srv.Identifies() == 2 })
	pollFor(t, "the second READY's backfill waiting", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.backfills == 1
	})
	onStopWait(t, func() { close(h.release) })
	stop()
	pollFor(t, "the backfill over (after its lines)", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.backfills == 0
	})
	if s := log.String(); strings.Contains(s, "discord backfill:") || strings.Count(s, "read what was missed") != 1 {
		t.Errorf("the backfill that waited through the stop read back, want nothing read:\n%s", s)
	}
}

// The guild and its text channel of intakeWorldWithARecentChannel.
const recentGuild, recentChannel = "100000000000000001", "200000000000000001"

// intakeWorldWithARecentChannel is intakeWorldWith a guild's text channel the store took a
// message from lately (Recent), with backfill on: a stop leaves what it meets there for the
// next start's read-back.
func intakeWorldWithARecentChannel(t *testing.T, h *heldDelivery) (*discordtest.Server, *Platform, *testutil.Buffer, func()) {
	t.Helper()
	return intakeWorldWith(t, h, func(srv *discordtest.Server) {
		srv.AddGuild(recentGuild, "guild")
		srv.AddChannel(discordtest.Channel{ID: recentChannel, GuildID: recentGuild, Type: discordgo.ChannelTypeGuildText, Name: "general"})
	}, func(c *Config) {
		c.Settings.BackfillWindow = time.Hour
		c.Recent = func(context.Context, time.Time) ([]persistence.ChatMark, error) {
			return []persistence.ChatMark{{ChatID: recentChannel, ScopeID: recentGuild, MessageID: "1", At: time.Now()}}, nil
		}
	})
}

// TestTypingStopsForAWithdrawnMessage: two messages of a DM start or queue turns (the typing
// indicator runs for both); the second one's sender deletes it, and the runtime takes it back.
// The first turn's reply then stops the indicator: the withdrawn message has no turn to wait
// for. Before, nothing settled it (no reply answers a message taken back), and the indicator
// ran on after the last reply, renewed every typingEvery, until typingMax: fifteen minutes of
// "typing…" for nothing.
func TestTypingStopsForAWithdrawnMessage(t *testing.T) {
	h := newHeldDelivery()
	srv, p, _, _ := intakeWorld(t, h)
	const dm = "300000000000000001"
	post := func(text string) *discordgo.Message {
		return srv.Post(discordtest.UserMessage{ChannelID: dm, Author: discordtest.User{ID: "400000000000000001", Username: "alice"}, Content: text})
	}
	one := post("one")
	two := post("two")
	pollFor(t, "both delivered", func() bool { texts, _, _ := h.got(); return len(texts) == 2 })
	srv.Delete(two.ID)
	pollFor(t, "the second withdrawn", func() bool { _, withdrew, _ := h.got(); return slices.Contains(withdrew, two.ID) })
	pollFor(t, "the intake idle", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.intaking == nil
	})
	p.typing.turnEnded(dm, []string{one.ID}) // the first turn's reply (Send)
	p.typing.mu.Lock()
	var awaited map[string]int
	if tp := p.typing.chans[dm]; tp != nil {
		awaited = maps.Clone(tp.awaited)
	}
	p.typing.mu.Unlock()
	if awaited != nil {
		t.Errorf("the typing indicator runs on after the last reply, awaiting %v: want it stopped (the other message was withdrawn)", awaited)
	}
}

// stopWaits returns a channel closed once a stop starts to wait for a running intake or
// backfill (stopWait), for the rest of t.
func stopWaits(t *testing.T) <-chan struct{} {
	waiting := make(chan struct{})
	onStopWait(t, func() { close(waiting) })
	return waiting
}

// onStopWait calls f, once, as a stop starts to wait for a running intake or backfill
// (stopWait), for the rest of t.
func onStopWait(t *testing.T, f func()) {
	var once sync.Once
	wait := func() { once.Do(f) }
	stopWait.Store(&wait)
	t.Cleanup(func() { stopWait.Store(nil) })
}

// waitQueued waits until n messages wait in p's intake (queued behind a held delivery).
func waitQueued(t *testing.T, p *Platform, what string, n int) {
	t.Helper()
	pollFor(t, what, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.intake) == n
	})
}
