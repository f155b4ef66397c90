package actors

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
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
		echo := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "echo"}, nil
		})
		var slow *slowListing
		w := newManagerWorld(t, echo, func(d *Deps) {
			slow = &slowListing{Store: d.Store, gate: make(chan chan struct{}, 2)}
			d.Store = slow
		})
		system, manager, key, deliver := w.system, w.manager, w.key, func(id string) *Deliver { return w.message(id, id) }
		if r := w.deliver(t, "m0", "m0"); r.ErrorCode != "" {
			t.Fatalf("m0: %+v", r)
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
			m, err := w.store.FindInbound(w.ctx, "fake", "c1", id)
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
