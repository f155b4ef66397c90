package platformtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/platforms"
)

func TestFakeInjectDeliversThroughRun(t *testing.T) {
	f := NewFake("")
	if got := f.Name(); got != FakeName {
		t.Fatalf("Name() = %q, want %q", got, FakeName)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	var mu sync.Mutex
	var got []*platforms.Inbound
	deliver := func(_ context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, in)
		return &platforms.Ack{MessageID: in.MessageID, Disposition: platforms.Started}, nil
	}

	// Inject before Run: it must wait for Run rather than fail.
	type result struct {
		ack *platforms.Ack
		err error
	}
	res := make(chan result, 1)
	go func() {
		ack, err := f.Inject(ctx, &platforms.Inbound{MessageID: "m1", Text: "hi"})
		res <- result{ack, err}
	}()

	runCtx, stop := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- f.Run(runCtx, deliver) }()

	r := <-res
	if r.err != nil {
		t.Fatalf("Inject() error = %v, want nil", r.err)
	}
	if r.ack.Disposition != platforms.Started || r.ack.MessageID != "m1" {
		t.Errorf("Inject() ack = %+v, want started m1", r.ack)
	}
	mu.Lock()
	if len(got) != 1 || got[0].Source.Platform != FakeName || got[0].ReceivedAt.IsZero() {
		t.Errorf("delivered = %+v, want one message with platform %q and ReceivedAt set", got, FakeName)
	}
	mu.Unlock()

	if err := f.Run(ctx, deliver); err == nil {
		t.Errorf("second concurrent Run() = nil, want error")
	}

	stop()
	if err := <-runDone; err != nil {
		t.Errorf("Run() = %v, want nil", err)
	}
	short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancelShort()
	if _, err := f.Inject(short, &platforms.Inbound{MessageID: "m2"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Inject() after Run ended = %v, want deadline exceeded", err)
	}
}

func TestFakeSendRecordsConcurrently(t *testing.T) {
	f := NewFake("http")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	const n = 50
	waited := make(chan []*platforms.Outbound, 1)
	go func() {
		outs, err := f.WaitSent(ctx, n)
		if err != nil {
			t.Errorf("WaitSent(%d) error = %v", n, err)
		}
		waited <- outs
	}()

	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			out := &platforms.Outbound{
				SessionKey: "k", Seq: int64(i + 1), Text: fmt.Sprint(i),
				InReplyTo: []string{"m"}, Target: identity.Source{Platform: "http"},
			}
			if err := f.Send(ctx, out); err != nil {
				t.Errorf("Send() = %v, want nil", err)
			}
			out.InReplyTo[0] = "mutated" // the Fake must have kept its own copy
		})
	}
	wg.Wait()

	outs := <-waited
	if len(outs) != n {
		t.Fatalf("WaitSent() returned %d, want %d", len(outs), n)
	}
	seen := map[int64]bool{}
	for _, o := range f.Sent() {
		seen[o.Seq] = true
		if o.InReplyTo[0] != "m" {
			t.Errorf("Sent() seq %d InReplyTo = %v, want [m]", o.Seq, o.InReplyTo)
		}
	}
	if len(seen) != n {
		t.Errorf("Sent() has %d distinct seqs, want %d", len(seen), n)
	}

	// Callers get copies: mutating them does not change the record.
	f.Sent()[0].Text = "changed"
	if got := f.Sent()[0].Text; got == "changed" {
		t.Errorf("Sent()[0].Text = %q after mutating a returned copy, want the original", got)
	}
}

func TestFakeSendError(t *testing.T) {
	f := NewFake("http")
	ctx := context.Background()
	boom := errors.New("boom")
	f.SetSendError(boom)
	if err := f.Send(ctx, &platforms.Outbound{Seq: 1}); !errors.Is(err, boom) {
		t.Errorf("Send() = %v, want %v", err, boom)
	}
	if got := len(f.Sent()); got != 0 {
		t.Errorf("len(Sent()) = %d after a failed Send, want 0", got)
	}
	f.SetSendError(nil)
	if err := f.Send(ctx, &platforms.Outbound{Seq: 2}); err != nil {
		t.Errorf("Send() = %v, want nil", err)
	}

	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	got, err := f.WaitSent(short, 5)
	if !errors.Is(err, context.DeadlineExceeded) || len(got) != 1 {
		t.Errorf("WaitSent(5) = %d, %v; want 1, deadline exceeded", len(got), err)
	}
}
