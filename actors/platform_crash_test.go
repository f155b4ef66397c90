package actors

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/platformtest"
	"github.com/asynkron/protoactor-go/actor"
)

// faultyPlatform is a platformtest.EditorFake with the bugs a real adapter could have: a Send that
// panics on some replies, or waits for the test to release it; a SendDraft or a Run that panics
// at first; a Show (it is a platforms.Watched) that panics. It counts its Run loops.
type faultyPlatform struct {
	*platformtest.EditorFake
	sendPanics  func(*platforms.Outbound) bool // Send panics on these
	hold        chan struct{}                  // if set, Send of seq 1 waits until it is closed
	runPanics   atomic.Int32                   // so many Runs panic before one runs
	showPanics  atomic.Int32                   // so many Shows panic
	draftPanics atomic.Int32                   // so many SendDrafts panic
	running     atomic.Int32                   // Run loops running now
	runs        atomic.Int32                   // Run loops that reached the Fake

	draftMu     sync.Mutex
	draftFaults []draftFault      // the faults of the next SendDrafts, in order; guarded by draftMu
	madeDrafts  map[string]string // the drafts SendDrafts failing so made, by key; guarded by draftMu
	editFaults  atomic.Int32      // so many EditDrafts fail
	deleteHold  chan struct{}     // if set, DeleteDraft waits until it is closed
}

func (f *faultyPlatform) DeleteDraft(ctx context.Context, target identity.Source, id string) error {
	if f.deleteHold != nil {
		<-f.deleteHold
	}
	return f.EditorFake.DeleteDraft(ctx, target, id)
}

func (f *faultyPlatform) EditDraft(ctx context.Context, target identity.Source, id, text string) error {
	if f.editFaults.Add(-1) >= 0 {
		return errors.New("500 internal server error")
	}
	return f.EditorFake.EditDraft(ctx, target, id, text)
}

func (f *faultyPlatform) Send(ctx context.Context, out *platforms.Outbound) error {
	if f.sendPanics != nil && f.sendPanics(out) {
		panic(fmt.Sprintf("adapter bug on seq %d", out.Seq))
	}
	if f.hold != nil && out.Seq == 1 {
		<-f.hold
	}
	return f.EditorFake.Send(ctx, out)
}

func (f *faultyPlatform) Run(ctx context.Context, deliver platforms.Deliver) error {
	if f.runPanics.Add(-1) >= 0 {
		panic("adapter bug in run")
	}
	f.runs.Add(1)
	f.running.Add(1)
	defer f.running.Add(-1)
	return f.Fake.Run(ctx, deliver)
}

func (f *faultyPlatform) SendDraft(ctx context.Context, target identity.Source, inReplyTo []string, key, text string) (string, error) {
	if f.draftPanics.Add(-1) >= 0 {
		panic("adapter bug in send draft")
	}
	f.draftMu.Lock()
	var fault *draftFault
	if len(f.draftFaults) > 0 {
		fault = &f.draftFaults[0]
		f.draftFaults = f.draftFaults[1:]
	}
	f.draftMu.Unlock()
	if fault == nil {
		return f.EditorFake.SendDraft(ctx, target, inReplyTo, key, text)
	}
	if fault.found {
		// The draft an earlier try made is found, and the edit to show text fails.
		f.draftMu.Lock()
		id, ok := f.madeDrafts[key]
		f.draftMu.Unlock()
		if ok {
			return id, errors.New("found, but the edit failed: 500 internal server error")
		}
	}
	if fault.made {
		id, err := f.EditorFake.SendDraft(ctx, target, inReplyTo, key, text)
		if err != nil {
			return "", err
		}
		f.draftMu.Lock()
		if f.madeDrafts == nil {
			f.madeDrafts = map[string]string{}
		}
		f.madeDrafts[key] = id
		f.draftMu.Unlock()
	}
	return "", errors.New("500 internal server error")
}

// draftFault is how one SendDraft fails: with the draft made and the answer lost, not made, or
// (found) with the draft an earlier try made found but not edited to show the new text.
type draftFault struct{ made, found bool }

func (f *faultyPlatform) Show(*platforms.Outbound) {
	if f.showPanics.Add(-1) >= 0 {
		panic("adapter bug in show")
	}
}

// platformWorld is a platform actor over a faultyPlatform, writing its marks to a SQLite store
// through the persistence actor.
type platformWorld struct {
	system *actor.ActorSystem
	store  *sqlite.Store
	p      *faultyPlatform
	d      *Deps
	pid    *actor.PID
}

const crashKey = "fake:dm:c1"

// newPlatformWorld starts a platformWorld; setup may change the Deps first. Call it inside
// synctest.Test: the world stops when the test ends.
func newPlatformWorld(t *testing.T, p *faultyPlatform, setup func(*Deps)) *platformWorld {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	system, quiet := quietSystem(t)
	w := &platformWorld{system: system, store: store, p: p}
	w.d = &Deps{Ctx: ctx, Store: store, Log: quiet, Metrics: metrics.New("fake")}
	w.d.Persist = system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(ctx, store, persistence.ActorOptions{MaxBatch: 64})))
	if setup != nil {
		setup(w.d)
	}
	w.pid = system.Root.Spawn(NewPlatform(w.d, p, &PlatformHealth{}))
	t.Cleanup(func() {
		_ = system.Root.StopFuture(w.pid).Wait()
		_ = system.Root.StopFuture(w.d.Persist).Wait()
		system.Shutdown()
		if err := store.Close(); err != nil {
			t.Error(err)
		}
		cancel()
	})
	return w
}

// reply records reply seq of crashKey in the outbox, as a session does, and has it sent.
func (w *platformWorld) reply(t *testing.T, seq int64) {
	t.Helper()
	e := persistence.OutboxEntry{SessionKey: crashKey, Seq: seq, Kind: "reply", Text: fmt.Sprint("reply ", seq), TurnID: fmt.Sprint("t", seq),
		Platform: "fake", ChatType: "dm", ChatID: "c1", State: persistence.DeliveryPending, CreatedAt: time.Now()}
	if errs := w.store.Commit(t.Context(), [][]persistence.Op{{&persistence.AddOutbox{Entry: e}}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	w.system.Root.Send(w.pid, &SendOutbound{Out: &platforms.Outbound{SessionKey: crashKey, Seq: seq, Text: e.Text, TurnID: e.TurnID, TurnEnd: true}})
}

// states returns the delivery state of crashKey's outbox entries, in seq order.
func (w *platformWorld) states(t *testing.T) string {
	t.Helper()
	return w.outbox(t, func(e persistence.OutboxEntry) any { return e.State })
}

// attempts returns the delivery attempts of crashKey's outbox entries, in seq order.
func (w *platformWorld) attempts(t *testing.T) string {
	t.Helper()
	return w.outbox(t, func(e persistence.OutboxEntry) any { return e.Attempts })
}

// outbox returns field of crashKey's outbox entries, each after its seq, in seq order.
func (w *platformWorld) outbox(t *testing.T, field func(persistence.OutboxEntry) any) string {
	t.Helper()
	es, err := w.store.OutboxAfter(t.Context(), crashKey, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, e := range es {
		s = append(s, fmt.Sprintf("%d:%v", e.Seq, field(e)))
	}
	return fmt.Sprint(s)
}

// sent returns the seqs the platform delivered, in order.
func (w *platformWorld) sent() string {
	var seqs []int64
	for _, o := range w.p.Sent() {
		seqs = append(seqs, o.Seq)
	}
	return fmt.Sprint(seqs)
}

// TestSendThatPanicsFailsTheReply: a Send that panics (an adapter bug on some odd reply) does
// not take the process down: the reply is recorded as failed, for good, and the key's next
// reply is delivered. (The panic used to kill the daemon, and since unconfirmed replies are
// re-sent at the next start, crash-loop it.)
func TestSendThatPanicsFailsTheReply(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &faultyPlatform{EditorFake: platformtest.NewEditorFake("fake"), sendPanics: func(o *platforms.Outbound) bool { return o.Seq == 1 }}
		w := newPlatformWorld(t, p, nil)
		w.reply(t, 1)
		w.reply(t, 2)
		synctest.Wait()
		if got, want := w.states(t), "[1:failed 2:delivered]"; got != want {
			t.Errorf("outbox %s, want %s", got, want)
		}
		if got := w.sent(); got != "[2]" {
			t.Errorf("sent %s, want [2]", got)
		}
	})
}

// TestRunThatPanicsIsRestarted: a Run that panics counts as Run failing: it is started again
// after its backoff, and the process lives on.
func TestRunThatPanicsIsRestarted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &faultyPlatform{EditorFake: platformtest.NewEditorFake("fake")}
		p.runPanics.Store(1)
		w := newPlatformWorld(t, p, nil)
		w.system.Root.Send(w.pid, &StartIntake{Deliver: func(context.Context, *platforms.Inbound) (*platforms.Ack, error) { return &platforms.Ack{}, nil }})
		if err := p.WaitRunning(t.Context()); err != nil {
			t.Fatal(err)
		}
		if n := p.runs.Load(); n != 1 {
			t.Errorf("Run reached the platform %d times, want 1 (after the panic)", n)
		}
	})
}

// crash makes the platform actor panic: the watched platform's Show panics on a reply relayed
// from another member.
func (w *platformWorld) crash() {
	w.p.showPanics.Add(1)
	w.system.Root.Send(w.pid, &RelayedOutbound{SessionKey: crashKey, Seq: 99, Text: "shown elsewhere"})
}

// TestRestartedPlatformKeepsItsQueues: a platform actor that crashes while a chat's replies wait
// behind a send in flight carries on after its restart: the send's result is taken, and every
// queued reply is delivered, in order, with its mark written, without waiting for the session
// to load again. (The restarted actor used to start empty: the queued replies stayed pending
// until the chat's next message, and the marks were lost.)
func TestRestartedPlatformKeepsItsQueues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &faultyPlatform{EditorFake: platformtest.NewEditorFake("fake"), hold: make(chan struct{})}
		w := newPlatformWorld(t, p, nil)
		for seq := int64(1); seq <= 3; seq++ {
			w.reply(t, seq)
		}
		synctest.Wait() // 1 is in flight, 2 and 3 wait behind it
		w.crash()
		synctest.Wait()
		close(p.hold)
		synctest.Wait()
		if got := w.sent(); got != "[1 2 3]" {
			t.Errorf("sent %s, want [1 2 3]", got)
		}
		if got, want := w.states(t), "[1:delivered 2:delivered 3:delivered]"; got != want {
			t.Errorf("outbox %s, want %s", got, want)
		}
	})
}

// TestRestartedPlatformKeepsOneRunLoop: after a restart the platform's Run loop is the one that
// ran before (a StartIntake does not start another), and stopping the actor stops it. (The
// restarted actor used to forget the loop: it served on, and the actor's stop left it running.)
func TestRestartedPlatformKeepsOneRunLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &faultyPlatform{EditorFake: platformtest.NewEditorFake("fake")}
		w := newPlatformWorld(t, p, nil)
		start := &StartIntake{Deliver: func(context.Context, *platforms.Inbound) (*platforms.Ack, error) { return &platforms.Ack{}, nil }}
		w.system.Root.Send(w.pid, start)
		if err := p.WaitRunning(t.Context()); err != nil {
			t.Fatal(err)
		}
		w.crash()
		w.system.Root.Send(w.pid, start)
		synctest.Wait()
		if err := w.system.Root.StopFuture(w.pid).Wait(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if n := p.runs.Load(); n != 1 {
			t.Errorf("Run started %d times, want 1", n)
		}
		if n := p.running.Load(); n != 0 {
			t.Errorf("%d Run loops still running after the actor stopped, want 0", n)
		}
	})
}

// TestJobThatCrashesThePlatformTwiceFails: a reply whose handling panics the platform actor
// every time (here: relaying it to the other members) is recorded as failed after it was being
// handled during 2 crashes, and the key's later replies are delivered. Its outbox entry counts
// the two sends tried (before, its mark counted one).
func TestJobThatCrashesThePlatformTwiceFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &faultyPlatform{EditorFake: platformtest.NewEditorFake("fake")}
		var mu sync.Mutex
		relayed := 0
		w := newPlatformWorld(t, p, func(d *Deps) {
			d.Relay = func(_ string, out *platforms.Outbound) {
				if out.Seq == 2 {
					panic("relay bug")
				}
				mu.Lock()
				relayed++
				mu.Unlock()
			}
		})
		for seq := int64(1); seq <= 3; seq++ {
			w.reply(t, seq)
		}
		synctest.Wait()
		if got, want := w.states(t), "[1:delivered 2:failed 3:delivered]"; got != want {
			t.Errorf("outbox %s, want %s", got, want)
		}
		if got := w.sent(); got != "[1 2 2 3]" {
			t.Errorf("sent %s, want [1 2 2 3] (2 sent again after the first crash)", got)
		}
		if got, want := w.attempts(t), "[1:1 2:2 3:1]"; got != want {
			t.Errorf("outbox attempts %s, want %s (2 tried twice)", got, want)
		}
		mu.Lock()
		defer mu.Unlock()
		if relayed != 2 {
			t.Errorf("relayed %d replies, want 2", relayed)
		}
	})
}

// TestRestartedPlatformKeepsARetry: a crash while a reply waits for its retry neither loses it
// nor sends it twice: the retry's timer releases it, and the replies go out once each, in order.
func TestRestartedPlatformKeepsARetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &faultyPlatform{EditorFake: platformtest.NewEditorFake("fake")}
		w := newPlatformWorld(t, p, nil)
		p.SetSendError(errors.New("503 service unavailable"))
		w.reply(t, 1)
		w.reply(t, 2)
		synctest.Wait() // 1 waits for its retry, 2 behind it
		w.crash()
		synctest.Wait()
		p.SetSendError(nil)
		time.Sleep(sendBackoffMax)
		synctest.Wait()
		if got := w.sent(); got != "[1 2]" {
			t.Errorf("sent %s, want [1 2]", got)
		}
		if got, want := w.states(t), "[1:delivered 2:delivered]"; got != want {
			t.Errorf("outbox %s, want %s", got, want)
		}
	})
}

// TestRestartedPlatformKeepsItsDrafts: a turn's draft posted before a crash is finished by the
// turn's reply after it, as without the crash. (The restarted actor used to forget it: the
// reply was posted anew, and the draft was left showing the partial text.)
func TestRestartedPlatformKeepsItsDrafts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &faultyPlatform{EditorFake: platformtest.NewEditorFake("fake")}
		w := newPlatformWorld(t, p, nil)
		w.system.Root.Send(w.pid, &DraftText{SessionKey: crashKey, TurnID: "t1",
			Target: identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1"}, Text: "partial"})
		synctest.Wait()
		w.crash()
		synctest.Wait()
		w.reply(t, 1)
		synctest.Wait()
		ds := p.Drafts()
		if len(ds) != 1 || !ds[0].Final || fmt.Sprint(ds[0].Texts) != "[partial reply 1]" {
			t.Errorf("drafts %+v, want one, finished with the reply", ds)
		}
		if got, want := w.states(t), "[1:delivered]"; got != want {
			t.Errorf("outbox %s, want %s", got, want)
		}
	})
}

// TestDraftThatPanicsIsLeft: a draft post that panics does not take the process down: the
// draft is left, and the turn's reply is posted as a message of its own.
func TestDraftThatPanicsIsLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &faultyPlatform{EditorFake: platformtest.NewEditorFake("fake")}
		p.draftPanics.Store(1)
		w := newPlatformWorld(t, p, nil)
		w.system.Root.Send(w.pid, &DraftText{SessionKey: crashKey, TurnID: "t1",
			Target: identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1"}, Text: "partial"})
		synctest.Wait()
		w.reply(t, 1)
		synctest.Wait()
		if ds := p.Drafts(); len(ds) != 0 {
			t.Errorf("drafts %+v, want none", ds)
		}
		if sent := p.Sent(); len(sent) != 1 || sent[0].Seq != 1 || sent[0].DraftID != "" {
			t.Errorf("sent %+v, want reply 1 as a message of its own", sent)
		}
		if got, want := w.states(t), "[1:delivered]"; got != want {
			t.Errorf("outbox %s, want %s", got, want)
		}
	})
}
