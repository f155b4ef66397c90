package actors

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/platformtest"
	"github.com/asynkron/protoactor-go/actor"
)

// stopRecorder is a platformtest.EditorFake that keeps records of its own (platforms.Recorder),
// as the Discord platform keeps its unread places, and records one as its Run stops: the
// place of a message the stop met and left for the next start to read back.
type stopRecorder struct {
	*platformtest.EditorFake
	record  func(ops ...persistence.Op)
	running chan struct{}
}

func (r *stopRecorder) SetRecord(record func(ops ...persistence.Op)) { r.record = record }

func (r *stopRecorder) Run(ctx context.Context, _ platforms.Deliver) error {
	close(r.running)
	<-ctx.Done()
	r.record(&persistence.MarkUnread{Unread: persistence.Unread{Platform: "fake", ChatID: "c1", After: "41", At: time.Now()}})
	return nil
}

// TestRecordsMadeWhileThePlatformStopsAreWritten: a platform records an op while its actor
// waits for Run at the actor's stop (the Discord platform keeps the unread place of a message
// the stop left for the next start, whose notice could not be posted). The record reaches the
// store. Before, it went to the actor's mailbox, which the actor read only once it had
// stopped, and was dropped: the next start did not read the message back, and it was lost.
func TestRecordsMadeWhileThePlatformStopsAreWritten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "agentgate.db"), sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		system, quiet := quietSystem(t)
		defer system.Shutdown()
		d := &Deps{Ctx: ctx, Store: store, Log: quiet, Metrics: metrics.New("fake")}
		d.Persist = system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(ctx, store, persistence.ActorOptions{MaxBatch: 64})))
		p := &stopRecorder{EditorFake: platformtest.NewEditorFake("fake"), running: make(chan struct{})}
		pid := system.Root.Spawn(NewPlatform(d, p, &PlatformHealth{}))
		system.Root.Send(pid, &StartIntake{Deliver: func(context.Context, *platforms.Inbound) (*platforms.Ack, error) {
			return &platforms.Ack{Disposition: platforms.Started}, nil
		}})
		<-p.running
		if err := system.Root.PoisonFuture(pid).Wait(); err != nil {
			t.Fatal(err)
		}
		if err := system.Root.PoisonFuture(d.Persist).Wait(); err != nil { // its stop commits what it holds
			t.Fatal(err)
		}
		us, err := store.Unread(t.Context(), "fake", 0)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(us, func(u persistence.Unread) bool { return u.ChatID == "c1" && u.After == "41" }) {
			t.Errorf("the store's unread places are %v, want the one the platform recorded as it stopped", us)
		}
	})
}
