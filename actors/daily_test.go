package actors

import (
	"context"
	"path/filepath"
	"sync/atomic"
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

// TestDailyResetHeldOverAWorkingTurnStillHappens: a turn running across the daily boundary
// holds the reset over until the session is idle; it must still happen then (the turn's own
// activity, and the queued message's, would move the due time to the next day).
func TestDailyResetHeldOverAWorkingTurnStillHappens(t *testing.T) {
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
		gate := make(chan struct{})
		agent := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			if req.Identity.MessageID == "a" {
				<-gate
			}
			return &agents.Response{Text: "ok"}, nil
		})
		var clock atomic.Int64
		day := time.Date(2030, 1, 1, 3, 59, 0, 0, time.UTC)
		clock.Store(day.UnixNano())
		policy := ResetPolicy{Mode: ResetDaily, AtHour: 4, Notify: true, Location: time.UTC}
		d := &Deps{Ctx: ctx, Store: store, Agent: agent, Platforms: map[string]*actor.PID{"fake": platform},
			Log: quiet, Metrics: metrics.New("fake"), Node: "test", Now: func() time.Time { return time.Unix(0, clock.Load()).UTC() },
			Config: SessionConfig{PassivateAfter: time.Hour, QueueMode: ModeFollowup, QueueCap: 10, HistoryLimit: 50,
				ResetFor: func(string, string) ResetPolicy { return policy }, ResetPolicies: []ResetPolicy{policy}}}
		d.Persist = system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(ctx, store, persistence.ActorOptions{MaxBatch: 64})))
		manager := system.Root.Spawn(NewSessionManager(d))
		defer func() {
			_ = system.Root.StopFuture(manager).Wait()
			_ = system.Root.StopFuture(d.Persist).Wait()
		}()
		src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1", UserID: "u1"}
		key := identity.Key(src, d.Config.Keys)
		send := func(id string) *DeliverResult {
			res, err := system.Root.RequestFuture(manager, &Routed{Key: key, Msg: &Deliver{SessionKey: key, Source: sourceToProto(src),
				MessageId: id, Text: id, ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour).Result()
			if err != nil {
				t.Fatal(err)
			}
			return res.(*DeliverResult)
		}
		a := send("a") // 03:59, its turn runs past 04:00
		synctest.Wait()
		clock.Store(day.Add(2 * time.Minute).UnixNano()) // 04:01
		b := send("b")
		close(gate)
		synctest.Wait()
		clock.Store(day.Add(31 * time.Minute).UnixNano()) // 04:30, idle
		c := send("c")
		synctest.Wait()
		t.Logf("a %s, b %s (%s), c %s (%s)", a.SessionId, b.SessionId, b.Disposition, c.SessionId, c.Disposition)
		if c.SessionId == a.SessionId {
			t.Errorf("c at 04:30 ran in the session of 03:59: the 04:00 daily reset never happened")
		}
	})
}
