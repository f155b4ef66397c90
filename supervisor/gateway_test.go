package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/actors"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// memLeaser is one lease in memory, as PostgreSQL's advisory lock holds it for the cluster: a
// Lease waits until no one holds it. lose takes it from its holder as a database connection
// that drops does: its lost channel closes and the lease is free at once.
type memLeaser struct {
	sem chan struct{}

	mu   sync.Mutex
	lose func() // the holder's, nil while no one holds it
}

func newMemLeaser() *memLeaser { return &memLeaser{sem: make(chan struct{}, 1)} }

func (m *memLeaser) Lease(ctx context.Context, _ string) (<-chan struct{}, func(), error) {
	select {
	case m.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	lost := make(chan struct{})
	var once sync.Once
	free := func(lose bool) {
		once.Do(func() {
			m.mu.Lock()
			m.lose = nil
			m.mu.Unlock()
			if lose {
				close(lost)
			}
			<-m.sem
		})
	}
	m.mu.Lock()
	m.lose = func() { free(true) }
	m.mu.Unlock()
	return lost, func() { free(false) }, nil
}

// loseHolders takes the lease from its holder (its database connection dropped).
func (m *memLeaser) loseHolders() {
	m.mu.Lock()
	lose := m.lose
	m.mu.Unlock()
	if lose != nil {
		lose()
	}
}

// heldRuntime is a runtime whose delivery of "first" waits until release is closed; it records
// what it was handed, and what after the platform actor stopped (late).
type heldRuntime struct {
	release chan struct{}
	started chan struct{} // closed when the delivery of "first" starts
	stopped chan struct{} // closed by the test once the platform actor stopped

	mu    sync.Mutex
	texts []string
	late  []string
}

func newHeldRuntime() *heldRuntime {
	return &heldRuntime{release: make(chan struct{}), started: make(chan struct{}), stopped: make(chan struct{})}
}

func (h *heldRuntime) deliver(_ context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
	h.mu.Lock()
	h.texts = append(h.texts, in.Text)
	select {
	case <-h.stopped:
		h.late = append(h.late, in.Text)
	default:
	}
	h.mu.Unlock()
	if in.Text == "first" {
		close(h.started)
		<-h.release
	}
	return &platforms.Ack{Disposition: platforms.Started}, nil
}

func (h *heldRuntime) got() (texts, late []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.texts), slices.Clone(h.late)
}

// waitDelivered waits until the runtime was handed text.
func (h *heldRuntime) waitDelivered(t *testing.T, srv *discordtest.Server, text string) {
	t.Helper()
	srv.WaitFor(t, "the delivery of "+text, func() bool {
		texts, _ := h.got()
		return slices.Contains(texts, text)
	})
}

// TestLeaderKeepsTheQueueThroughALostGateway: a cluster member's gateway connection is lost
// (Discord drops it, or the gateway lease goes with the member's database connection) while a
// delivery the runtime does not answer holds the intake and a message of a chat the store took
// a message from lately is queued behind it. Another member takes the lease meanwhile, gives it
// back, and this member takes it again: its connection RESUMEs, and Discord replays nothing it
// received already. The queued message is handed to the runtime all the same. Before, the
// member's letting the gateway go ended the Discord platform's run as a daemon stop does, and
// the message was "left for the next start's read-back", which a RESUME never makes: lost
// without a word.
func TestLeaderKeepsTheQueueThroughALostGateway(t *testing.T) {
	cases := []struct {
		name string
		lose func(srv *discordtest.Server, leases *memLeaser)
	}{
		{"lost connection", func(srv *discordtest.Server, _ *memLeaser) { srv.Disconnect() }},
		{"lost lease", func(_ *discordtest.Server, leases *memLeaser) { leases.loseHolders() }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const first, recent = "300000000000000001", "300000000000000002" // two DMs
			alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
			srv := discordtest.New(t, discordtest.WithHeartbeatInterval(200*time.Millisecond))
			srv.AddChannel(discordtest.Channel{ID: first, Type: discordgo.ChannelTypeDM})
			srv.AddChannel(discordtest.Channel{ID: recent, Type: discordgo.ChannelTypeDM})
			quiet := slog.New(slog.DiscardHandler)
			p, err := discord.New(discord.Config{Token: srv.Token(), Logger: quiet, ReturnRefusal: true,
				Settings: config.Discord{APIURL: srv.APIURL(), BackfillWindow: time.Hour}})
			if err != nil {
				t.Fatal(err)
			}
			leases := newMemLeaser()
			h := newHeldRuntime()
			system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet }))
			d := &actors.Deps{Ctx: t.Context(), Log: quiet, Metrics: metrics.New(discord.Name)}
			pid := system.Root.Spawn(actors.NewPlatform(d, newLeaderPlatform(p, leases, quiet), &actors.PlatformHealth{}))
			var once sync.Once
			stop := func() {
				once.Do(func() {
					select {
					case <-h.release:
					default:
						close(h.release)
					}
					_ = system.Root.PoisonFuture(pid).Wait()
					close(h.stopped)
					system.Shutdown()
				})
			}
			t.Cleanup(stop)
			system.Root.Send(pid, &actors.StartIntake{Deliver: h.deliver, Withdraw: func(context.Context, identity.Source, string) (bool, error) { return false, nil }})
			srv.WaitReady(t)
			post := func(channel, text string) {
				srv.Post(discordtest.UserMessage{ChannelID: channel, Author: alice, Content: text})
			}
			post(recent, "zero") // the store takes a message from this chat: the next start reads it back
			h.waitDelivered(t, srv, "zero")
			post(first, "first")
			<-h.started
			post(recent, "second") // queued behind the held delivery
			srv.WaitRead(t)        // the gateway's reader queued it: a RESUME does not replay it

			// Another member waits for the lease; it takes it as this member lets it go.
			other := make(chan func(), 1)
			go func() {
				_, release, err := leases.Lease(t.Context(), "discord")
				if err == nil {
					other <- release
				}
			}()
			tc.lose(srv, leases)
			var release func()
			select {
			case release = <-other:
			case <-time.After(discordtest.WaitTimeout):
				t.Fatal("the other member did not get the lease")
			}
			close(h.release) // the intake goes on while this member waits for the lease
			h.waitDelivered(t, srv, "first")
			release() // this member takes the gateway again, and RESUMEs
			srv.WaitFor(t, "a RESUME", func() bool { return srv.Resumes() == 1 && srv.Ready() })
			post(recent, "third")
			h.waitDelivered(t, srv, "third") // the intake took what was queued before it
			stop()
			texts, late := h.got()
			if want := []string{"zero", "first", "second", "third"}; !slices.Equal(texts, want) || len(late) > 0 {
				t.Errorf("delivered %q, %q of them after the platform actor stopped; want %q, all before", texts, late, want)
			}
			if n := srv.Identifies(); n != 1 {
				t.Errorf("%d IDENTIFYs, want 1 (a RESUME after it)", n)
			}
		})
	}
}

// dueRecorder is a gateway platform that records, with its leaser, the order of RunDue, the
// lease and Run; its Run returns as after a lost connection.
type dueRecorder struct {
	gatewayPlatform
	mu     sync.Mutex
	events []string
}

func (d *dueRecorder) note(e string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.events = append(d.events, e)
}

func (d *dueRecorder) Name() string { return discord.Name }
func (d *dueRecorder) RunDue()      { d.note("due") }
func (d *dueRecorder) Run(context.Context, platforms.Deliver) error {
	d.note("run")
	return errors.New("gateway connection lost")
}
func (d *dueRecorder) Lease(context.Context, string) (<-chan struct{}, func(), error) {
	d.note("lease")
	return make(chan struct{}), func() {}, nil
}

// TestLeaderSaysTheRunIsDueBeforeItWaitsForTheLease: the gateway wrapper tells the platform
// that its Run is due (discord.Platform.RunDue) as it begins to wait for the lease, after the
// platform actor's backoff, so that what a let-go's replay held waits letGoHold from then.
// Counted from the let-go, a backoff past 30 s handed the hold on before the Run whose RESUME
// replays the deletions after it (the Discord platform's TestLetGoHoldOutlivesALongBackoff).
func TestLeaderSaysTheRunIsDueBeforeItWaitsForTheLease(t *testing.T) {
	p := &dueRecorder{}
	l := newLeaderPlatform(p, p, slog.New(slog.DiscardHandler))
	if err := l.Run(t.Context(), nil); err == nil {
		t.Fatal("Run returned nil, want the lost connection")
	}
	if want := []string{"due", "lease", "run"}; !slices.Equal(p.events, want) {
		t.Errorf("events %q, want %q", p.events, want)
	}
}
