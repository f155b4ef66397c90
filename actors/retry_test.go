package actors

import (
	"context"
	"path/filepath"
	"sync"
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

// TestRetryInFlightIsDroppedByNew: /new right after /retry, while the retry's write is in
// flight: the retried message must not run after the boundary (in the ended session).
func TestRetryInFlightIsDroppedByNew(t *testing.T) {
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
		var mu sync.Mutex
		var calls []string
		echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			mu.Lock()
			calls = append(calls, req.Identity.SessionID+" "+req.Identity.MessageID)
			mu.Unlock()
			return &agents.Response{Text: "echo"}, nil
		})
		d := &Deps{Ctx: ctx, Store: store, Agent: echo, Platforms: map[string]*actor.PID{"fake": platform},
			Log: quiet, Metrics: metrics.New("fake"), Node: "test",
			Config: SessionConfig{PassivateAfter: time.Hour, QueueMode: ModeFollowup, QueueCap: 10, HistoryLimit: 50}}
		d.Persist = system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(ctx, store, persistence.ActorOptions{MaxBatch: 64})))
		manager := system.Root.Spawn(NewSessionManager(d))
		defer func() {
			_ = system.Root.StopFuture(manager).Wait()
			_ = system.Root.StopFuture(d.Persist).Wait()
		}()
		src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1", UserID: "u1"}
		key := identity.Key(src, d.Config.Keys)
		deliver := func(id, text string) *Deliver {
			return &Deliver{SessionKey: key, Source: sourceToProto(src), MessageId: id, Text: text, ReceivedAtUnixNano: time.Now().UnixNano()}
		}
		if _, err := system.Root.RequestFuture(manager, &Routed{Key: key, Msg: deliver("m0", "hello")}, time.Hour).Result(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		fr := system.Root.RequestFuture(manager, &Routed{Key: key, Msg: deliver("r1", "/retry")}, time.Hour)
		fn := system.Root.RequestFuture(manager, &Routed{Key: key, Msg: deliver("n1", "/new")}, time.Hour)
		rr, _ := fr.Result()
		rn, _ := fn.Result()
		synctest.Wait()
		time.Sleep(time.Minute)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		t.Logf("retry: %+v\nnew: %+v\nagent calls: %v", rr, rn, calls)
		newSID := rn.(*DeliverResult).SessionId
		oldSID := rr.(*DeliverResult).SessionId
		msgs, _ := store.Transcript(ctx, oldSID)
		for _, m := range msgs {
			t.Logf("old session row seq=%d role=%s id=%s status=%s text=%q", m.Seq, m.Role, m.MessageID, m.Status, m.Content)
			if m.MessageID == "r1" && m.Status != persistence.StatusFailed {
				t.Errorf("retried message r1 status %s after /new, want failed (dropped by the boundary)", m.Status)
			}
		}
		for _, c := range calls[1:] {
			if c != newSID+" " && len(c) > 0 {
				t.Errorf("a turn ran after /new: %q (new session %s)", c, newSID)
			}
		}
	})
}
