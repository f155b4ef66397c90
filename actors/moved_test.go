package actors

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/asynkron/protoactor-go/actor"
)

// TestWaitingSessionStopsWhenItsKeyMoves: a session waiting for the spool whose key goes to
// another member (moved) stops without loading; it must not claim, once the spool drains, the
// key the new owner holds.
func TestWaitingSessionStopsWhenItsKeyMoves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "agentgate.db"), sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		system, quiet := quietSystem()
		defer system.Shutdown()
		platform := system.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
		grain := system.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
		echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "echo"}, nil
		})
		d := &Deps{Ctx: ctx, Store: store, Agent: echo, Platforms: map[string]*actor.PID{"fake": platform},
			Log: quiet, Metrics: metrics.New("fake"), Node: "a", Fencing: true, Clustered: true,
			Config: SessionConfig{PassivateAfter: time.Hour, QueueMode: ModeFollowup, QueueCap: 10, HistoryLimit: 50}}
		d.Persist = system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(ctx, store, persistence.ActorOptions{MaxBatch: 64})))
		manager := system.Root.Spawn(NewSessionManager(d))
		defer func() {
			_ = system.Root.StopFuture(manager).Wait()
			_ = system.Root.StopFuture(d.Persist).Wait()
		}()
		src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1", UserID: "u1"}
		key := identity.Key(src, d.Config.Keys)
		d.Spooling.Store(true)
		res, err := system.Root.RequestFuture(manager, &Routed{Key: key, Grain: grain, Msg: &Deliver{SessionKey: key,
			Source: sourceToProto(src), MessageId: "m1", Text: "hi", ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour).Result()
		t.Logf("deliver while spooling: %+v %v", res, err)
		// Another member now owns the key and claims it.
		epoch, err := store.Claim(ctx, key, "b", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		system.Root.Send(manager, &grainStopped{key: key, grain: grain})
		synctest.Wait()
		time.Sleep(5 * time.Second)
		d.Spooling.Store(false) // the spool drains
		time.Sleep(5 * time.Second)
		synctest.Wait()
		act, _ := system.Root.RequestFuture(manager, &ListActive{}, time.Hour).Result()
		if slices.Contains(act.(*ActiveList).Keys, key) {
			t.Errorf("the session whose key moved away is still active here")
		}
		own, err := store.Ownership(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if own.Owner != "b" || own.Epoch != epoch {
			t.Errorf("ownership %+v after the move, want b's claim (epoch %d): this member took the key back", own, epoch)
		}
	})
}
