package platformtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/agentgate/agentgate/platforms"
)

// FakeName is the platform name a Fake reports when NewFake is given none.
const FakeName = "fake"

// Fake is an in-memory platforms.Platform for tests. Inject hands an Inbound to the runtime
// through the Deliver func the Fake received in Run; Send records each Outbound, which Sent and
// WaitSent return in the order they were sent.
type Fake struct {
	name string

	mu      sync.Mutex
	deliver platforms.Deliver // set while Run runs
	sent    []*platforms.Outbound
	sendErr error
	// changed is closed and replaced on every state change, so waiters can block on it
	// without polling.
	changed chan struct{}
}

var _ platforms.Platform = (*Fake)(nil)

// NewFake returns a Fake that reports name from Name (FakeName when name is empty).
func NewFake(name string) *Fake {
	if name == "" {
		name = FakeName
	}
	return &Fake{name: name, changed: make(chan struct{})}
}

// Name returns the platform name given to NewFake.
func (f *Fake) Name() string { return f.name }

// Run makes deliver available to Inject and blocks until ctx ends, then returns nil. Running
// the same Fake twice at once is an error.
func (f *Fake) Run(ctx context.Context, deliver platforms.Deliver) error {
	if deliver == nil {
		return errors.New("run fake platform: nil deliver")
	}
	f.mu.Lock()
	if f.deliver != nil {
		f.mu.Unlock()
		return errors.New("run fake platform: already running")
	}
	f.deliver = deliver
	f.notifyLocked()
	f.mu.Unlock()

	<-ctx.Done()

	f.mu.Lock()
	f.deliver = nil
	f.notifyLocked()
	f.mu.Unlock()
	return nil
}

// Inject delivers in to the runtime as if a user had sent it, and returns the runtime's Ack.
// It waits until Run is running (or ctx ends). An empty Source.Platform is set to the Fake's
// name and a zero ReceivedAt to now; in itself is not modified.
func (f *Fake) Inject(ctx context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
	if in == nil {
		return nil, errors.New("inject: nil inbound")
	}
	deliver, err := f.waitDeliver(ctx)
	if err != nil {
		return nil, fmt.Errorf("inject: %w", err)
	}
	msg := *in
	if msg.Source.Platform == "" {
		msg.Source.Platform = f.name
	}
	if msg.ReceivedAt.IsZero() {
		msg.ReceivedAt = time.Now()
	}
	return deliver(ctx, &msg)
}

// WaitRunning blocks until Run is running or ctx ends.
func (f *Fake) WaitRunning(ctx context.Context) error {
	_, err := f.waitDeliver(ctx)
	return err
}

func (f *Fake) waitDeliver(ctx context.Context) (platforms.Deliver, error) {
	for {
		f.mu.Lock()
		d, ch := f.deliver, f.changed
		f.mu.Unlock()
		if d != nil {
			return d, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Send records a copy of out, or returns the error set with SetSendError without recording.
func (f *Fake) Send(ctx context.Context, out *platforms.Outbound) error {
	if out == nil {
		return errors.New("send: nil outbound")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sendErr != nil {
		return f.sendErr
	}
	f.sent = append(f.sent, clone(out))
	f.notifyLocked()
	return nil
}

// SetSendError makes every later Send fail with err (nil restores success), so tests can
// simulate a platform that cannot deliver.
func (f *Fake) SetSendError(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sendErr = err
}

// Sent returns copies of the outbound messages recorded so far, in send order.
func (f *Fake) Sent() []*platforms.Outbound {
	f.mu.Lock()
	defer f.mu.Unlock()
	return cloneAll(f.sent)
}

// WaitSent blocks until at least n outbound messages were recorded and returns copies of all of
// them, or returns what was recorded so far with ctx's error.
func (f *Fake) WaitSent(ctx context.Context, n int) ([]*platforms.Outbound, error) {
	for {
		f.mu.Lock()
		got, ch := cloneAll(f.sent), f.changed
		f.mu.Unlock()
		if len(got) >= n {
			return got, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return got, fmt.Errorf("wait for %d sent, have %d: %w", n, len(got), ctx.Err())
		}
	}
}

func (f *Fake) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func clone(out *platforms.Outbound) *platforms.Outbound {
	c := *out
	c.InReplyTo = slices.Clone(out.InReplyTo)
	return &c
}

func cloneAll(outs []*platforms.Outbound) []*platforms.Outbound {
	res := make([]*platforms.Outbound, len(outs))
	for i, o := range outs {
		res[i] = clone(o)
	}
	return res
}
