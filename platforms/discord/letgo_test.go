package discord

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// TestLateEndOfALetGoRunKeepsTheNextReplaysHold: a cluster member lets the gateway go (its
// Run's ctx ends with platforms.ErrLetGo), and the goroutine that hands on what that Run's
// replay held runs late: after the member took the gateway again and its next Run's RESUME
// began to replay a message its sender deleted while the bot was away. That message stays
// held until the deletion reaches it, and is never delivered. Before, the late end of the
// earlier Run's ctx ended the new replay's hold: the message was delivered before its deletion
// (an idle session ran it and answered a message taken back).
func TestLateEndOfALetGoRunKeepsTheNextReplaysHold(t *testing.T) {
	const dm = "300000000000000001"
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	h := newHeldDelivery()
	srv := discordtest.New(t) // Discord's heartbeat interval: nothing here waits for a heartbeat, and a short one drops a loaded run's connection (five missed ACKs)
	srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
	p, err := New(Config{Token: srv.Token(), Settings: config.Discord{APIURL: srv.APIURL()}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	p.SetWithdraw(h.withdraw, nil)

	// The first Run's ctx end waits in the hook until the next Run's replay holds the message.
	entered, goOn, finished := make(chan struct{}), make(chan struct{}), make(chan struct{})
	first := true
	late := func(end func()) {
		if !first {
			end()
			return
		}
		first = false
		close(entered)
		<-goOn
		end()
		close(finished)
	}
	runEnded.Store(&late)
	t.Cleanup(func() { runEnded.Store(nil) })

	ctx1, letGo := context.WithCancelCause(t.Context())
	done1 := make(chan error, 1)
	go func() { done1 <- p.Run(ctx1, h.deliver) }()
	srv.WaitReady(t)
	letGo(platforms.ErrLetGo) // the lease lost: Run closes the connection and returns
	<-entered
	if err := <-done1; err != nil {
		t.Fatalf("Run: %v", err)
	}

	gone := srv.Post(discordtest.UserMessage{ChannelID: dm, Author: alice, Content: "never mind"})
	resumed := srv.WithholdResumed()
	defer resumed()
	ctx2, stop := context.WithCancel(t.Context())
	done2 := make(chan error, 1)
	go func() { done2 <- p.Run(ctx2, h.deliver) }()
	t.Cleanup(func() {
		stop()
		if err := <-done2; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	pollFor(t, "the replay holding the message", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.held) == 1
	})
	close(goOn) // the first Run's ctx end runs now
	<-finished

	srv.Delete(gone.ID)
	resumed()
	after := srv.Post(discordtest.UserMessage{ChannelID: dm, Author: alice, Content: "after"})
	pollFor(t, "the delivery of the message after", func() bool { texts, _, _ := h.got(); return slices.Contains(texts, after.Content) })
	if texts, _, _ := h.got(); !slices.Equal(texts, []string{"after"}) {
		t.Errorf("delivered %q, want only %q: the message deleted during the replay was handed on before its deletion", texts, "after")
	}
}

// letGoWorld is a platform whose RESUME's replay holds a message said while the bot was away
// (gone), in a DM no read-back finds, when its connection is lost before RESUMED and the
// cluster member lets the gateway go: the Run's ctx ends with platforms.ErrLetGo, as the
// gateway wrapper ends it. The let-go's bound (letGoHold) passes when the test sends on bound;
// RESUMED waits until resumed is called.
type letGoWorld struct {
	srv     *discordtest.Server
	p       *Platform
	h       *heldDelivery
	dm      string
	alice   discordtest.User
	gone    *discordgo.Message
	clock   *letGoClock
	resumed func()
}

// letGoClock is the clock of the let-go's waits (letGoWait): a wait's channel fires once
// advance has moved the clock past its end.
type letGoClock struct {
	mu     sync.Mutex
	now    time.Duration // since the clock was made
	timers []letGoTimer
}

type letGoTimer struct {
	at time.Duration
	ch chan time.Time
}

func (c *letGoClock) after(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.timers = append(c.timers, letGoTimer{at: c.now + d, ch: ch})
	return ch
}

// advance moves the clock on by d and fires the waits that end by then; it returns how many
// it fired.
func (c *letGoClock) advance(d time.Duration) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now += d
	fired := 0
	c.timers = slices.DeleteFunc(c.timers, func(tm letGoTimer) bool {
		if tm.at > c.now {
			return false
		}
		tm.ch <- time.Time{}
		fired++
		return true
	})
	return fired
}

// armed returns the waits that have not fired, as how long each has still to run.
func (c *letGoClock) armed() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var left []time.Duration
	for _, tm := range c.timers {
		left = append(left, tm.at-c.now)
	}
	return left
}

func startLetGo(t *testing.T) *letGoWorld {
	t.Helper()
	w := &letGoWorld{dm: "300000000000000001", alice: discordtest.User{ID: "400000000000000001", Username: "alice"}, h: newHeldDelivery()}
	w.srv = discordtest.New(t)
	w.srv.AddChannel(discordtest.Channel{ID: w.dm, Type: discordgo.ChannelTypeDM})
	p, err := New(Config{Token: w.srv.Token(), Settings: config.Discord{APIURL: w.srv.APIURL()}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	w.p = p
	p.SetWithdraw(w.h.withdraw, nil)
	t.Cleanup(func() { p.WaitInbound(context.Background()) }) // the stop, last

	w.clock = &letGoClock{}
	wait := w.clock.after
	letGoWait.Store(&wait)
	t.Cleanup(func() { letGoWait.Store(nil) })
	ended := make(chan struct{}, 8)
	hook := func(end func()) { end(); ended <- struct{}{} }
	runEnded.Store(&hook)
	t.Cleanup(func() { runEnded.Store(nil) })

	// run runs p.Run until the connection is lost, then lets the gateway go as the gateway
	// wrapper does, and waits until the end of the Run's ctx is handled.
	run := func(lose func()) {
		t.Helper()
		ctx, letGo := context.WithCancelCause(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx, w.h.deliver) }()
		lose()
		if err := <-done; err == nil {
			t.Fatal("Run returned nil after a lost connection, want the loss")
		}
		letGo(platforms.ErrLetGo)
		<-ended
	}
	run(func() {
		w.srv.WaitReady(t)
		w.resumed = w.srv.WithholdResumed()
		t.Cleanup(w.resumed)
		w.srv.Disconnect()
	})
	w.gone = w.srv.Post(discordtest.UserMessage{ChannelID: w.dm, Author: w.alice, Content: "never mind"})
	run(func() {
		pollFor(t, "the replay holding the message", func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return len(p.held) == 1
		})
		w.srv.WaitReady(t)
		w.srv.Disconnect() // lost again before RESUMED
	})

	p.mu.Lock()
	held := len(p.held)
	p.mu.Unlock()
	if held != 1 {
		t.Errorf("the let-go left %d messages held, want the replay's 1 kept", held)
	}
	if got := w.clock.armed(); !slices.Equal(got, []time.Duration{letGoHoldMost}) {
		t.Errorf("the let-go armed waits of %v, want %v until the next Run is due", got, letGoHoldMost)
	}
	if texts, _, _ := w.h.got(); len(texts) > 0 {
		t.Errorf("delivered %q before the bound passed, want nothing", texts)
	}
	return w
}

// TestLetGoKeepsAReplaysHoldForAWhile: a cluster member's RESUME's replay holds a message its
// sender said while the bot was away, and the connection is lost before RESUMED; the member
// lets the gateway go (platforms.ErrLetGo). The hold is kept, as a lost connection keeps it
// outside a cluster, until this member's next Run, whose RESUME replays the message's
// deletion, which drops it: never delivered. With no next Run, the message (a new DM's, which
// another member's read-back does not find) is delivered once letGoHold has passed since the
// Run was due (RunDue: the member waits for the lease another holds), not before, or
// letGoHoldMost after the let-go when none says it is due; and a stop hands it on at once.
// Before, the let-go handed it on at once: in a cluster the hold never outlived a lost
// connection, and the deletion the next RESUME replayed came after the delivery.
func TestLetGoKeepsAReplaysHoldForAWhile(t *testing.T) {
	t.Run("this member resumes", func(t *testing.T) {
		w := startLetGo(t)
		w.resumeAndCheck(t)
	})
	t.Run("another member holds the lease", func(t *testing.T) {
		w := startLetGo(t)
		w.p.RunDue() // the wrapper waits for the lease
		if n := w.clock.advance(letGoHold - time.Second); n != 0 {
			t.Errorf("%d waits fired before letGoHold passed, want none", n)
		}
		w.clock.advance(time.Second)
		pollFor(t, "the delivery of the held message", func() bool { texts, _, _ := w.h.got(); return len(texts) > 0 })
		w.p.WaitInbound(t.Context())
		if texts, _, _ := w.h.got(); !slices.Equal(texts, []string{w.gone.Content}) {
			t.Errorf("delivered %q, want %q once", texts, w.gone.Content)
		}
	})
	t.Run("no Run said to be due", func(t *testing.T) {
		w := startLetGo(t)
		w.clock.advance(letGoHoldMost)
		pollFor(t, "the delivery of the held message", func() bool { texts, _, _ := w.h.got(); return len(texts) > 0 })
		w.p.WaitInbound(t.Context())
		if texts, _, _ := w.h.got(); !slices.Equal(texts, []string{w.gone.Content}) {
			t.Errorf("delivered %q, want %q once", texts, w.gone.Content)
		}
	})
	t.Run("a stop", func(t *testing.T) {
		w := startLetGo(t)
		w.h.drain() // the runtime stops: it turns the message away, and its sender is told
		w.p.WaitInbound(t.Context())
		if texts, _, _ := w.h.got(); !slices.Equal(texts, []string{w.gone.Content}) {
			t.Errorf("delivered %q at the stop, want %q", texts, w.gone.Content)
		}
	})
}

// TestLetGoHoldOutlivesALongBackoff: a cluster member lets the gateway go with a replay's
// message held, and the platform actor waits a backoff longer than letGoHold before it runs
// the platform again (32 s: a streak's sixth try); the wrapper then says the Run is due, gets
// the lease and runs it, whose RESUME replays the message's deletion: the message is never
// delivered. Before, letGoHold was counted from the let-go and passed within the backoff: the
// message was handed on before the Run, and the bot answered a message its sender had deleted.
func TestLetGoHoldOutlivesALongBackoff(t *testing.T) {
	w := startLetGo(t)
	if n := w.clock.advance(32 * time.Second); n != 0 {
		t.Errorf("%d waits of the hold ended within the backoff, want none: the hold was handed on before the next Run", n)
	}
	w.p.RunDue()
	w.resumeAndCheck(t)
}

// resumeAndCheck deletes the held message on Discord, runs the platform again, and checks that
// its RESUME drops the message: only a message said after it is delivered.
func (w *letGoWorld) resumeAndCheck(t *testing.T) {
	t.Helper()
	w.srv.Delete(w.gone.ID)
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.p.Run(ctx, w.h.deliver) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	w.srv.WaitFor(t, "the next RESUME", func() bool { return w.srv.Resumes() == 2 && w.srv.Ready() })
	w.resumed()
	after := w.srv.Post(discordtest.UserMessage{ChannelID: w.dm, Author: w.alice, Content: "after"})
	pollFor(t, "the delivery of the message after", func() bool { texts, _, _ := w.h.got(); return slices.Contains(texts, after.Content) })
	if texts, _, _ := w.h.got(); !slices.Equal(texts, []string{"after"}) {
		t.Errorf("delivered %q, want only %q: the message deleted before the next RESUME was handed on", texts, "after")
	}
}

// TestLetGoLeavesTheGatewaySessionResumable: a cluster member that lets a live gateway
// connection go (its lease lost: Run's ctx ends with platforms.ErrLetGo) closes it with a code
// that keeps the gateway session (closeResumable), so its next Run RESUMEs it and Discord
// replays what was said meanwhile: a new DM's message, which no read-back finds, is delivered.
// Before, the connection was closed with 1000, which ends the session on Discord: the RESUME
// got INVALID_SESSION, the new IDENTIFY's READY replayed nothing, and the message was lost. A
// stop still closes with 1000: the session ends with the daemon, and the bot shows offline.
func TestLetGoLeavesTheGatewaySessionResumable(t *testing.T) {
	const dm = "300000000000000001"
	alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
	for _, tt := range []struct {
		name       string
		cause      error // of the first Run's ctx
		resumable  bool
		identifies int
	}{
		{"a let-go", platforms.ErrLetGo, true, 1},
		{"a stop", context.Canceled, false, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHeldDelivery()
			srv := discordtest.New(t)
			srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
			p, err := New(Config{Token: srv.Token(), Settings: config.Discord{APIURL: srv.APIURL()}, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			p.SetWithdraw(h.withdraw, nil)

			ctx1, end := context.WithCancelCause(t.Context())
			done1 := make(chan error, 1)
			go func() { done1 <- p.Run(ctx1, h.deliver) }()
			srv.WaitReady(t)
			end(tt.cause)
			if err := <-done1; err != nil {
				t.Fatalf("Run: %v", err)
			}
			away := srv.Post(discordtest.UserMessage{ChannelID: dm, Author: alice, Content: "said while away"})

			ctx2, stop := context.WithCancel(t.Context())
			done2 := make(chan error, 1)
			go func() { done2 <- p.Run(ctx2, h.deliver) }()
			t.Cleanup(func() {
				stop()
				if err := <-done2; err != nil {
					t.Errorf("Run: %v", err)
				}
			})
			srv.WaitReady(t)
			if got := srv.Identifies(); got != tt.identifies {
				t.Errorf("Identifies() = %d after the second Run, want %d", got, tt.identifies)
			}
			if !tt.resumable {
				return // the new session's READY replays nothing: what it reads back is backfill's
			}
			if got := srv.Resumes(); got != 1 {
				t.Errorf("Resumes() = %d, want 1: the let-go's close ended the gateway session", got)
			}
			pollFor(t, "the replay of the message said while away", func() bool {
				texts, _, _ := h.got()
				return slices.Contains(texts, away.Content)
			})
		})
	}
}
