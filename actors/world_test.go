package actors

import (
	"context"
	"path/filepath"
	"sync"
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

// managerWorld is a session manager as the daemon runs one: a real SQLite store in a temp
// dir, the persistence actor over it, and a platform actor that records what it is asked to
// send. Tests run it inside a synctest bubble, so its timers run on the bubble's clock.
type managerWorld struct {
	ctx     context.Context
	store   *sqlite.Store
	system  *actor.ActorSystem
	d       *Deps
	manager *actor.PID
	sent    chan *SendOutbound // what the platform was asked to send, in order
	src     identity.Source    // the chat deliver writes from
	key     string             // its session key
	stop    func()             // stops the world (once; the test's end calls it too)
}

// resetsBy returns a world's setup: its clock reads clock (Unix nanoseconds, UTC), and every
// session resets by policy.
func resetsBy(clock *atomic.Int64, policy ResetPolicy) func(*Deps) {
	return func(d *Deps) {
		d.Now = func() time.Time { return time.Unix(0, clock.Load()).UTC() }
		d.Config.ResetFor = func(string, string) ResetPolicy { return policy }
		d.Config.ResetPolicies = []ResetPolicy{policy}
	}
}

// newManagerWorld starts a world whose sessions run agent. setup may change the Deps before
// the manager starts (wrap the Store its sessions read, set the clock or the Config); the
// persistence actor always writes to the SQLite store itself. Call it inside synctest.Test:
// the world stops when the test ends, inside the bubble.
func newManagerWorld(t *testing.T, agent agents.Agent, setup func(*Deps)) *managerWorld {
	t.Helper()
	return newManagerWorldAt(t, filepath.Join(t.TempDir(), "agentgate.db"), agent, setup)
}

// newManagerWorldAt is newManagerWorld on the database at path (which may hold data already).
func newManagerWorldAt(t *testing.T, path string, agent agents.Agent, setup func(*Deps)) *managerWorld {
	t.Helper()
	return newManagerWorldWith(t, path, agent, setup, nil)
}

// newManagerWorldWith is newManagerWorldAt whose persistence actor commits through
// commits(store) when commits is not nil (a store that fails or panics on cue).
func newManagerWorldWith(t *testing.T, path string, agent agents.Agent, setup func(*Deps), commits func(persistence.Store) persistence.Store,
	persist ...func(*persistence.ActorOptions)) *managerWorld {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	store, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	system, quiet := quietSystem(t)
	w := &managerWorld{ctx: ctx, store: store, system: system, sent: make(chan *SendOutbound, 256),
		src: identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1", UserID: "u1"}}
	platform := system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch m := c.Message().(type) {
		case *SendOutbound:
			select {
			case w.sent <- m:
			default: // a test that reads none of it
			}
		case *Quiesce:
			c.Respond(&Quiesced{}) // it sends nothing for real: nothing is ever in flight
		}
	}))
	w.d = &Deps{Ctx: ctx, Store: store, Agent: agent, Platforms: map[string]*actor.PID{"fake": platform},
		Log: quiet, Metrics: metrics.New("fake"), Node: "test",
		Config: SessionConfig{PassivateAfter: time.Hour, QueueMode: ModeFollowup, QueueCap: 10, HistoryLimit: 50}}
	if setup != nil {
		setup(w.d)
	}
	var writeTo persistence.Store = store
	if commits != nil {
		writeTo = commits(store)
	}
	opts := persistence.ActorOptions{MaxBatch: 64, Incarnation: &w.d.PersistIncarnation}
	for _, f := range persist {
		f(&opts)
	}
	w.d.Persist = system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(ctx, writeTo, opts)))
	// As a single daemon has it; sessions ask it only when setup gives the world a Run.
	w.d.Probation = system.Root.Spawn(NewProbation(w.d))
	w.manager = system.Root.Spawn(NewSessionManager(w.d))
	w.key = identity.Key(w.src, w.d.Config.Keys)
	w.stop = sync.OnceFunc(func() { // the manager and the writer before the store closes
		_ = system.Root.StopFuture(w.manager).Wait()
		_ = system.Root.StopFuture(w.d.Probation).Wait()
		_ = system.Root.StopFuture(w.d.Persist).Wait()
		system.Shutdown()
		if err := store.Close(); err != nil {
			t.Error(err)
		}
		cancel()
	})
	t.Cleanup(w.stop)
	return w
}

// awaitTurnEnds waits until the platform has been sent the last outbound of n turns.
func (w *managerWorld) awaitTurnEnds(n int) {
	for done := 0; done < n; {
		if (<-w.sent).Out.TurnEnd {
			done++
		}
	}
}

// message is a Deliver of the world's chat.
func (w *managerWorld) message(id, text string) *Deliver {
	return &Deliver{SessionKey: w.key, Source: sourceToProto(w.src), MessageId: id, Text: text,
		ReceivedAtUnixNano: time.Now().UnixNano()}
}

// deliver routes a message of the world's chat through the manager, as the router does, and
// returns the session's answer.
func (w *managerWorld) deliver(t *testing.T, id, text string) *DeliverResult {
	t.Helper()
	res, err := w.request(id, text).Result()
	if err != nil {
		t.Fatalf("deliver %s: %v", id, err)
	}
	return res.(*DeliverResult)
}

// request is deliver without waiting for the answer.
func (w *managerWorld) request(id, text string) *actor.Future {
	return w.system.Root.RequestFuture(w.manager, &Routed{Key: w.key, Msg: w.message(id, text)}, time.Hour)
}

// newManagerWorldWrites is newManagerWorld whose persistence actor commits through
// writes(store): a fault at the process edge (storetest.Outage).
func newManagerWorldWrites(t *testing.T, agent agents.Agent, setup func(*Deps), writes func(persistence.Store) persistence.Store) *managerWorld {
	t.Helper()
	return newManagerWorldWith(t, filepath.Join(t.TempDir(), "agentgate.db"), agent, setup, writes)
}

// suspendAndPassivate suspends the mailbox of the key's session, so that what is sent to it
// waits there (the manager's stop too), and tells the manager the session asks to passivate, as
// its idle check does: the manager holds the key's requests until the session is gone. resume
// lets the session handle its mailbox again.
func (w *managerWorld) suspendAndPassivate(t *testing.T) (resume func()) {
	t.Helper()
	session := actor.NewPID(w.system.Address(), w.manager.Id+"/"+w.key)
	proc, ok := w.system.ProcessRegistry.Get(session)
	if !ok {
		t.Fatalf("no session %s", session)
	}
	proc.SendSystemMessage(session, &actor.SuspendMailbox{})
	w.system.Root.Send(w.manager, &passivate{key: w.key, pid: session})
	return func() { proc.SendSystemMessage(session, &actor.ResumeMailbox{}) }
}

// restartManager makes the manager fail on a Recover of another key, through boom (which the
// panicking hook of its world clears as it panics), and waits, in t's synctest bubble, until it
// has restarted.
func (w *managerWorld) restartManager(t *testing.T, boom *atomic.Bool) {
	t.Helper()
	boom.Store(true)
	w.system.Root.Send(w.manager, &Routed{Key: "other-key", Msg: &Recover{}})
	synctest.Wait()
	if boom.Load() {
		t.Fatal("the manager did not restart")
	}
}
