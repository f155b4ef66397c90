package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/postgres"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord"
)

// leaser hands out leases that at most one process of the cluster holds at a time (the
// PostgreSQL store's Lease).
type leaser interface {
	Lease(ctx context.Context, name string) (lost <-chan struct{}, release func(), err error)
}

// gatewayPlatform is a platform with a connection that must be one per bot (Discord's gateway):
// it sends over REST from anywhere, but only one process should receive.
type gatewayPlatform interface {
	platforms.Platform
	platforms.Editor
	platforms.Checker
}

// leaderPlatform runs a gateway platform's Run (its inbound connection) only while this
// cluster member holds the platform's lease, so a cluster keeps one gateway connection per bot
// however many members have the platform enabled; when its holder stops or dies the lease
// frees and another member connects (and, as after any reconnect, reads back what it missed).
// Sends, drafts and edits work on every member. A member waiting for the lease is ready: it
// serves everything but the gateway.
//
// A member whose connection Discord refuses for good (discord.RefusedError) lets the lease go
// and stays out of the race for it until the refusal's retry time, while its Ready says why:
// the refusal may be of its own settings (its token variable, an older build during an
// upgrade), which another member's connection passes. Keeping the lease while it waited
// kept the whole bot deaf. A refusal every member shares (the intents in the Developer Portal)
// costs each member one refused connection per retry time, within Discord's identify limits.
type leaderPlatform struct {
	gatewayPlatform
	leases  leaser
	log     *slog.Logger
	standby atomic.Bool // waiting for the lease, and not after a refusal: ready
}

var (
	_ platforms.Recorder      = (*leaderPlatform)(nil)
	_ platforms.InboundWaiter = (*leaderPlatform)(nil)
	_ runDuer                 = (*discord.Platform)(nil)
)

func newLeaderPlatform(p gatewayPlatform, leases leaser, log *slog.Logger) *leaderPlatform {
	l := &leaderPlatform{gatewayPlatform: p, leases: leases, log: log}
	l.standby.Store(true)
	return l
}

// runDuer is a gateway platform that keeps what it received for its next Run a while after a
// let-go (discord.Platform.RunDue: a resume's replay's hold), counted from when that Run is due:
// once the platform actor's backoff has passed and this member waits for the lease. Counted
// from the let-go, a backoff past the bound handed the hold on before the Run whose RESUME
// replays the deletions after it.
type runDuer interface {
	RunDue()
}

// errLeaseLost ends a Run whose lease went with its database connection; the platform actor
// runs it again, which waits for the lease anew.
var errLeaseLost = errors.New("the gateway lease was lost with its database connection")

// refusalAfter, when set, replaces time.After for the wait of a member after a refusal (tests
// fire it).
var refusalAfter atomic.Pointer[func(time.Duration) <-chan time.Time]

// Run waits for the lease, then runs the platform's own Run until ctx ends or the lease is lost;
// after a refusal it lets the lease go, waits the refusal's retry time, and starts over.
func (l *leaderPlatform) Run(ctx context.Context, deliver platforms.Deliver) error {
	for {
		l.standby.Store(true)
		err := l.lead(ctx, deliver)
		var refused *discord.RefusedError
		if !errors.As(err, &refused) {
			return err
		}
		// standby stays false: Ready says what the platform's Ready says, the refusal.
		l.log.Info("this member lets the gateway connection go while discord refuses it", "platform", l.Name(), "retry_in", refused.RetryIn)
		after := time.After
		if f := refusalAfter.Load(); f != nil {
			after = *f
		}
		select {
		case <-ctx.Done():
			return nil
		case <-after(refused.RetryIn):
		}
	}
}

// lead waits for the lease, then runs the platform's own Run until ctx ends or the lease is
// lost; it gives the lease back when it returns. Run's ctx ends then with platforms.ErrLetGo,
// not as a daemon stop: what the platform received and has not handed on yet (Discord's
// intake queue, behind a delivery the runtime has not answered) is still delivered. Ended as
// a stop, it was left for a read-back that never came when this member took the lease again
// and resumed the gateway session (a resume replays nothing received already): lost without a
// word. Delivered here while another member holds the lease, a message that member's read-back
// reads too is a duplicate of it. What a Discord replay held when the connection went waits up
// to 30 s for this member's next Run first (platforms.ErrLetGo), from when lead is called
// again (runDuer), whose RESUME replays the deletions that follow it: handed on at once, a
// message deleted before that RESUME was answered.
func (l *leaderPlatform) lead(ctx context.Context, deliver platforms.Deliver) error {
	if d, ok := l.gatewayPlatform.(runDuer); ok {
		d.RunDue()
	}
	lost, release, err := l.leases.Lease(ctx, postgres.GatewayLease(l.Name())) // the name its store fences unread clears by
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("%s: wait for the gateway lease: %w", l.Name(), err)
	}
	defer release()
	l.log.Info("this member holds the gateway connection", "platform", l.Name())
	l.standby.Store(false)
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(platforms.ErrLetGo)
	go func() {
		select {
		case <-lost:
			cancel(platforms.ErrLetGo)
		case <-runCtx.Done():
		}
	}()
	err = l.gatewayPlatform.Run(runCtx, deliver)
	select {
	case <-lost:
		return fmt.Errorf("%s: %w", l.Name(), errLeaseLost)
	default:
		return err
	}
}

// Ready reports the gateway's state on the member that holds the lease, and on one that let
// it go after a refusal, for the refusal's retry time (the refusal); a member waiting for it is
// ready.
func (l *leaderPlatform) Ready(ctx context.Context) error {
	if l.standby.Load() {
		return nil
	}
	return l.gatewayPlatform.Ready(ctx)
}

// SetWithdraw hands withdraw and stored to the gateway platform when it learns of deleted
// messages (platforms.Withdrawer: Discord), which the wrapper would otherwise hide from the
// platform actor.
func (l *leaderPlatform) SetWithdraw(withdraw platforms.Withdraw, stored platforms.WithdrawStored) {
	if w, ok := l.gatewayPlatform.(platforms.Withdrawer); ok {
		w.SetWithdraw(withdraw, stored)
	}
}

// WaitInbound hands a stop's wait for the inbound messages the gateway platform still hands on
// to it (platforms.InboundWaiter: Discord's intake, after a lost connection), which the wrapper
// would otherwise hide from the platform actor: a member waiting for the lease runs no Run of
// the gateway platform's that would wait for them.
func (l *leaderPlatform) WaitInbound(ctx context.Context) {
	if w, ok := l.gatewayPlatform.(platforms.InboundWaiter); ok {
		w.WaitInbound(ctx)
	}
}

// SetRecord hands record to the gateway platform when it keeps records of its own
// (platforms.Recorder: Discord's unread places). Without it the wrapper hid the platform's
// Recorder from the platform actor, and in cluster mode nothing was recorded: the member that
// takes the gateway over did not read the gap a failed backfill left.
func (l *leaderPlatform) SetRecord(record func(ops ...persistence.Op)) {
	if r, ok := l.gatewayPlatform.(platforms.Recorder); ok {
		r.SetRecord(record)
	}
}
