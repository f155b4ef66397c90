package actors

import (
	"context"
	"path/filepath"
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

// slowListing blocks Recoverable while armed: it stands for a manager busy with other work.
type slowListing struct {
	persistence.Store
	gate chan chan struct{}
}

func (s *slowListing) Recoverable(ctx context.Context) ([]string, error) {
	select {
	case release := <-s.gate:
		<-release
	default:
	}
	return nil, nil
}

// TestHandedBackBeatsTerminated: a session's Terminated, a system message, overtakes what it
// handed back before it stopped (a user message) in a busy manager's mailbox; the handed-back m1
// must still run before m2, which the manager held after the session asked to stop.
func TestHandedBackBeatsTerminated(t *testing.T) {
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
		echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "echo"}, nil
		})
		slow := &slowListing{Store: store, gate: make(chan chan struct{}, 2)}
		d := &Deps{Ctx: ctx, Store: slow, Agent: echo, Platforms: map[string]*actor.PID{"fake": platform},
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
		deliver := func(id string) *Deliver {
			return &Deliver{SessionKey: key, Source: sourceToProto(src), MessageId: id, Text: id, ReceivedAtUnixNano: time.Now().UnixNano()}
		}
		if _, err := system.Root.RequestFuture(manager, &Routed{Key: key, Msg: deliver("m0")}, time.Hour).Result(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		session := actor.NewPID(system.Address(), manager.Id+"/"+key)

		r1, r2 := make(chan struct{}), make(chan struct{})
		slow.gate <- r1
		system.Root.Send(manager, &recoverAll{}) // the manager is busy
		synctest.Wait()
		time.Sleep(61 * time.Minute)
		system.Root.Send(session, sweepCheck) // the session asks to passivate
		synctest.Wait()
		f2 := system.Root.RequestFuture(manager, &Routed{Key: key, Msg: deliver("m2")}, 3*time.Hour)
		slow.gate <- r2
		system.Root.Send(manager, &recoverAll{})                             // other work between the passivate and what follows
		f1 := system.Root.RequestFuture(session, deliver("m1"), 3*time.Hour) // routed before the manager knew
		synctest.Wait()
		close(r1) // passivate → Poison; m2 held; then busy again
		synctest.Wait()
		close(r2)
		for _, f := range []*actor.Future{f1, f2} {
			if res, err := f.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
				t.Fatalf("deliver: %v %+v", err, res)
			}
		}
		var seqs []int64
		for _, id := range []string{"m1", "m2"} {
			m, err := store.FindInbound(ctx, "fake", "c1", id)
			if err != nil {
				t.Fatal(err)
			}
			seqs = append(seqs, m.Seq)
		}
		if seqs[0] > seqs[1] {
			t.Errorf("m1 (reached the session first, handed back) stored at seq %d after m2 (held) at %d", seqs[0], seqs[1])
		}
		time.Sleep(time.Hour)
		synctest.Wait()
	})
}
