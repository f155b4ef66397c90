package actors

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms/platformtest"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// sizeProbe asks a probed actor for the sizes of its per-key state, on its own goroutine.
type sizeProbe struct{}

// sizes are the sizes of an actor's per-key structures, by name.
type sizes map[string]int

// nonEmpty lists the structures of s that hold more than allowed[name] (0 when unlisted).
func (s sizes) nonEmpty(allowed map[string]int) []string {
	var out []string
	for k, n := range s {
		if n > allowed[k] {
			out = append(out, fmt.Sprintf("%s=%d", k, n))
		}
	}
	sort.Strings(out)
	return out
}

// probedManager is a SessionManager that answers sizeProbe.
type probedManager struct{ *SessionManager }

func (m probedManager) Receive(c actor.Context) {
	if _, ok := c.Message().(*sizeProbe); ok {
		c.Respond(sizes{"sessions": len(m.sessions), "stopping": len(m.stopping), "handed": len(m.handed),
			"crashStops": len(m.crashStops), "rerun": len(m.rerun), "refused": len(m.refused), "paused": len(m.paused),
			"crashed": len(m.crashed), "waitingOut": len(m.waitingOut), "startedEarly": len(m.startedEarly),
			"busy": len(m.busy), "drains": len(m.kept.drains), "grains": len(m.grains), "stoppedGrains": len(m.stoppedGrains),
			"quieted": len(m.quieted), "activating": len(m.activating), "waiters": len(m.waiters),
			"keptBackoffs": m.keptBackoffs.Len(), "keptAt": len(m.keptAt)})
		return
	}
	m.SessionManager.Receive(c)
}

// probedPlatform is a Platform actor that answers sizeProbe.
type probedPlatform struct{ *Platform }

func (a probedPlatform) Receive(c actor.Context) {
	if _, ok := c.Message().(*sizeProbe); ok {
		c.Respond(sizes{"queues": len(a.queues), "inflight": len(a.inflight), "held": len(a.held),
			"attempts": len(a.attempts), "strikes": len(a.strikes), "drafts": len(a.drafts), "liveDraft": len(a.liveDraft),
			"ended": len(a.ended.set), "endedOrder": len(a.ended.order), "marksWaiting": len(a.marks.waiting),
			"quiesce": len(a.quiesce), "sending": a.sending})
		return
	}
	a.Platform.Receive(c)
}

// longRunWorld is a session manager with a real platform actor over an EditorFake (its turns
// stream drafts), a real SQLite store and the persistence actor, for tests that drive many
// chats through it and check that what it holds comes back to nothing once they passivate.
type longRunWorld struct {
	system   *actor.ActorSystem
	d        *Deps
	manager  *actor.PID
	platform *actor.PID
	fake     *platformtest.EditorFake
}

func newLongRunWorld(t *testing.T, agent agents.Agent, setup func(*Deps)) *longRunWorld {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "agentgate.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	system, quiet := quietSystem(t)
	w := &longRunWorld{system: system, fake: platformtest.NewEditorFake("fake")}
	w.d = &Deps{Ctx: ctx, Store: store, Agent: agent, Platforms: map[string]*actor.PID{}, Editors: map[string]bool{"fake": true},
		Log: quiet, Metrics: metrics.New("fake"), Node: "test",
		Config: SessionConfig{PassivateAfter: time.Minute, QueueMode: ModeInterrupt, QueueCap: 10, HistoryLimit: 50}}
	if setup != nil {
		setup(w.d)
	}
	w.d.Persist = system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(ctx, w.d.Store, persistence.ActorOptions{MaxBatch: 256,
		Incarnation: &w.d.PersistIncarnation})))
	pa := &Platform{d: w.d, p: w.fake, health: &PlatformHealth{}}
	w.platform = system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return probedPlatform{pa} }, w.d.Mailbox("platform")...))
	w.d.Platforms["fake"] = w.platform
	w.manager = system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return probedManager{&SessionManager{d: w.d}} },
		append(w.d.Mailbox("manager"), actor.WithSupervisor(&sessionSupervisor{d: w.d, restarts: 3, window: time.Minute}))...))
	t.Cleanup(func() {
		_ = system.Root.StopFuture(w.manager).Wait()
		_ = system.Root.StopFuture(w.platform).Wait()
		_ = system.Root.StopFuture(w.d.Persist).Wait()
		system.Shutdown()
		if err := store.Close(); err != nil {
			t.Error(err)
		}
		cancel()
	})
	return w
}

// chat is the source of the i-th chat.
func (w *longRunWorld) chat(i int) identity.Source {
	return identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: fmt.Sprint("c", i), UserID: "u"}
}

// send routes a message of chat i through the manager and returns the future of its answer.
func (w *longRunWorld) send(i int, id, text string) *actor.Future {
	src := w.chat(i)
	key := identity.Key(src, w.d.Config.Keys)
	return w.system.Root.RequestFuture(w.manager, &Routed{Key: key, Msg: &Deliver{SessionKey: key, Source: sourceToProto(src),
		MessageId: id, Text: text, ReceivedAtUnixNano: time.Now().UnixNano()}}, time.Hour)
}

// mustAccept waits for every future and fails the test on an error answer.
func mustAccept(t *testing.T, what string, fs []*actor.Future) {
	t.Helper()
	for i, f := range fs {
		res, err := f.Result()
		if err != nil {
			t.Fatalf("%s %d: %v", what, i, err)
		}
		if r := res.(*DeliverResult); r.ErrorCode != "" {
			t.Fatalf("%s %d: %+v", what, i, r)
		}
	}
}

// mustRefuse waits for every future and fails the test unless each is answered unavailable.
func mustRefuse(t *testing.T, what string, fs []*actor.Future) {
	t.Helper()
	for i, f := range fs {
		res, err := f.Result()
		if err != nil {
			t.Fatalf("%s %d: %v", what, i, err)
		}
		if r := res.(*DeliverResult); r.ErrorCode != ErrCodeUnavailable {
			t.Fatalf("%s %d: %+v, want unavailable", what, i, r)
		}
	}
}

// probe asks pid for its sizes.
func (w *longRunWorld) probe(t *testing.T, pid *actor.PID) sizes {
	t.Helper()
	res, err := w.system.Root.RequestFuture(pid, &sizeProbe{}, time.Minute).Result()
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	return res.(sizes)
}

// registered counts the processes in the actor system's registry (actors and futures).
func (w *longRunWorld) registered() int {
	n := 0
	for _, m := range w.system.ProcessRegistry.LocalPIDs.LocalPIDs {
		n += m.Count()
	}
	return n
}

// streamingAgent streams a part of its answer, then: blocks until cancelled on "slow", fails
// on "fail", answers otherwise.
var streamingAgent = agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
	text := req.Messages[len(req.Messages)-1].Text
	if req.Partial != nil {
		req.Partial("thinking about " + text)
	}
	switch {
	case strings.HasPrefix(text, "slow"):
		<-ctx.Done()
		return nil, ctx.Err()
	case strings.HasPrefix(text, "fail"):
		return nil, errors.New("the agent failed")
	case strings.HasPrefix(text, "panic"):
		panic("the agent panicked")
	}
	return &agents.Response{Text: "answer to " + text}, nil
})

// TestManyChatsLeaveNothingBehind drives hundreds of distinct chats through the sessions and
// a platform that streams drafts, in the ways a chat ends a turn (answered, failed, cut short
// by an interrupt, by /stop, by /new, a panic that crashes its session until it is
// quarantined), and lets every session passivate. Then the manager and the platform actor hold
// nothing per key, no lifeline is left, and the actor system's registry is back to its first
// count: what the daemon holds follows the chats that are active, not those it has seen.
func TestManyChatsLeaveNothingBehind(t *testing.T) {
	chats := 600
	if testing.Short() {
		chats = 200
	}
	synctest.Test(t, func(t *testing.T) {
		w := newLongRunWorld(t, streamingAgent, nil)
		synctest.Wait()
		base := w.registered()
		// Phase one: every chat's first message; a fifth of them block their turn.
		var fs []*actor.Future
		for i := range chats {
			text := "hello"
			switch i % 6 {
			case 1, 2, 3:
				text = "slow"
			case 4:
				text = "fail"
			case 5:
				text = "panic"
			}
			fs = append(fs, w.send(i, "m1", text))
		}
		mustAccept(t, "m1", fs)
		synctest.Wait()
		// Phase two: the blocked turns are cut short, three ways.
		fs = fs[:0]
		for i := range chats {
			switch i % 6 {
			case 1:
				fs = append(fs, w.send(i, "m2", "interrupting"))
			case 2:
				fs = append(fs, w.send(i, "m2", "/stop"))
			case 3:
				fs = append(fs, w.send(i, "m2", "/new"))
			}
		}
		mustAccept(t, "m2", fs)
		synctest.Wait()
		// Every session passivates.
		time.Sleep(3 * w.d.Config.PassivateAfter)
		synctest.Wait()

		if got := testutil.ToFloat64(w.d.Metrics.SessionPassivations); got < float64(chats) {
			t.Fatalf("%v sessions passivated, want all %d", got, chats)
		}
		if got, want := testutil.ToFloat64(w.d.Metrics.MessagesQuarantined.WithLabelValues("session_crash")), float64(chats/6); got != want {
			t.Errorf("%v messages quarantined, want %v", got, want)
		}
		if got := len(w.fake.Drafts()); got < chats {
			t.Fatalf("%d drafts posted, want one for each of the %d chats at least", got, chats)
		}
		if got := w.probe(t, w.manager).nonEmpty(nil); len(got) > 0 {
			t.Errorf("after %d chats passivated, the manager holds %v; want nothing", chats, got)
		}
		if got := w.probe(t, w.platform).nonEmpty(map[string]int{"ended": endedTurnsKept, "endedOrder": endedTurnsKept}); len(got) > 0 {
			t.Errorf("after %d chats passivated, the platform actor holds %v; want nothing but the last %d ended turns",
				chats, got, endedTurnsKept)
		}
		lifelines := 0
		w.d.lifelines.Range(func(any, any) bool { lifelines++; return true })
		if lifelines > 0 {
			t.Errorf("%d lifelines left, want none", lifelines)
		}
		if got := w.registered(); got > base {
			t.Errorf("the actor registry holds %d processes, %d at the start: %d more after %d chats passivated",
				got, base, got-base, chats)
		}
		open := 0
		for _, d := range w.fake.Drafts() {
			if !d.Final && !strings.HasSuffix(d.Text(), InterruptedMark) {
				open++
			}
		}
		if open > 0 {
			t.Errorf("%d drafts neither finished nor marked interrupted", open)
		}
		if ds, err := w.d.Store.OpenDrafts(t.Context(), "fake", 0); err != nil || len(ds) > 0 {
			t.Errorf("the store holds %d open drafts (%v), want none: every draft shows its final text or its mark", len(ds), err)
		}
	})
}

// refusedOrPanics is the agent of the leave-nothing-behind tests: a turn of "refused…" waits for
// gate (the test takes the store down meanwhile), one of "panic…" panics, others answer.
func refusedOrPanics(gate chan struct{}) agents.Agent {
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		text := req.Messages[len(req.Messages)-1].Text
		switch {
		case strings.HasPrefix(text, "refused"):
			<-gate // the store goes down while every such turn runs
		case strings.HasPrefix(text, "panic"):
			panic("the agent panicked")
		}
		return &agents.Response{Text: "answer to " + text}, nil
	})
}

// TestChatsRefusedOrCrashedOutLeaveNothingBehind drives hundreds of distinct chats through
// the two ways a session stops other than by passivating, each once, and then lets them
// passivate: the store refusing a write as unavailable (a command's, while a turn runs: the
// session starts again from the store after a pause: refused, paused, waitingOut; a turn's
// result it would hold instead, TestRefusedTurnResultIsKeptNotRunAgain), and a session crashing past its
// restart budget (its supervisor has it stop, and it starts again later: crashStops, crashed).
// Once the chats passivate, the manager holds nothing per key: the state of those paths
// follows the chats that are active, not those that once went through them.
func TestChatsRefusedOrCrashedOutLeaveNothingBehind(t *testing.T) {
	chats := 300
	if testing.Short() {
		chats = 100
	}
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		gate := make(chan struct{})
		agent := refusedOrPanics(gate)
		w := newLongRunWorld(t, agent, func(d *Deps) {
			out.Store = d.Store
			d.Store = out
		})
		// Half the chats have their turn's result refused; the other half crash: their first
		// message until it is quarantined, their second past the restart budget.
		var fs []*actor.Future
		for i := range chats {
			text := "refused"
			if i%2 == 1 {
				text = "panic"
			}
			fs = append(fs, w.send(i, "m1", text))
		}
		mustAccept(t, "m1", fs)
		synctest.Wait()
		out.Down.Store(true)
		fs = fs[:0]
		for i := 0; i < chats; i += 2 {
			fs = append(fs, w.send(i, "c1", "/status"))
		}
		mustRefuse(t, "c1", fs)
		close(gate)
		synctest.Wait()
		time.Sleep(5 * time.Second) // a few restarts from the store, each after its pause
		synctest.Wait()
		if got := w.probe(t, w.manager); got["refused"] != chats/2 {
			t.Fatalf("during the outage the manager counts refusals of %d keys, want %d: the path is not taken", got["refused"], chats/2)
		}
		out.Down.Store(false)
		fs = fs[:0]
		for i := 1; i < chats; i += 2 {
			fs = append(fs, w.send(i, "m2", "panic again"))
		}
		mustAccept(t, "m2", fs)
		synctest.Wait()
		if got := w.probe(t, w.manager); got["crashStops"] != chats/2 {
			t.Fatalf("the manager counts crash stops of %d keys, want %d: the path is not taken", got["crashStops"], chats/2)
		}
		// Every session starts again, runs what it holds, and passivates.
		time.Sleep(maxCrashPause + 3*w.d.Config.PassivateAfter)
		synctest.Wait()

		if got, want := testutil.ToFloat64(w.d.Metrics.MessagesQuarantined.WithLabelValues("session_crash")), float64(chats); got != want {
			t.Errorf("%v messages quarantined, want %v (both messages of every chat that panics)", got, want)
		}
		answered := 0
		for _, m := range w.fake.Sent() {
			if strings.HasPrefix(m.Text, "answer to refused") {
				answered++
			}
		}
		if answered != chats/2 {
			t.Errorf("%d refused turns answered once the store was back, want %d", answered, chats/2)
		}
		if got := w.probe(t, w.manager).nonEmpty(nil); len(got) > 0 {
			t.Errorf("after %d chats passivated, the manager holds %v; want nothing", chats, got)
		}
		if got := testutil.ToFloat64(w.d.Metrics.SessionsActive); got != 0 {
			t.Errorf("%v sessions active, want none", got)
		}
	})
}

// TestEvictedChatsRefusedOrCrashedOutLeaveNothingBehind is
// TestChatsRefusedOrCrashedOutLeaveNothingBehind under sessions.max_in_memory with
// passivate_after 0s (no idle sweep): a flood of distinct chats, each refused or crashing out
// once, whose sessions are then passivated to make room. Their keys keep their backoffs while
// out of memory (a chat that came back would resume its pause where it left it), and once they
// have been out for backoffKeptFor the manager holds nothing of them: keys evicted and never
// seen again leave nothing behind. (A first try kept the backoffs of every key passivated to
// make room until it passivated for idleness, which with passivate_after 0s is never.)
func TestEvictedChatsRefusedOrCrashedOutLeaveNothingBehind(t *testing.T) {
	chats := 200
	if testing.Short() {
		chats = 60
	}
	const bound = 8
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		gate := make(chan struct{})
		agent := refusedOrPanics(gate)
		w := newLongRunWorld(t, agent, func(d *Deps) {
			out.Store = d.Store
			d.Store = out
			d.Config.PassivateAfter = 0
			d.Config.MaxInMemory = bound
		})
		// Half the chats have a command refused while their turn runs (their sessions are
		// busy: the bound lets them all in, and none is evicted).
		var fs []*actor.Future
		for i := 0; i < chats; i += 2 {
			fs = append(fs, w.send(i, "m1", "refused"))
		}
		mustAccept(t, "m1", fs)
		synctest.Wait()
		out.Down.Store(true)
		fs = fs[:0]
		for i := 0; i < chats; i += 2 {
			fs = append(fs, w.send(i, "c1", "/status"))
		}
		mustRefuse(t, "c1", fs)
		close(gate)
		synctest.Wait()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		out.Down.Store(false)
		time.Sleep(maxRefusedPause)
		synctest.Wait()
		// The other half crash, one chat after the other: their first message until it is
		// quarantined, their second past the restart budget; each new session makes room.
		for i := 1; i < chats; i += 2 {
			mustAccept(t, "m1", []*actor.Future{w.send(i, "m1", "panic")})
			synctest.Wait()
			mustAccept(t, "m2", []*actor.Future{w.send(i, "m2", "panic again")})
			synctest.Wait()
		}
		time.Sleep(crashPause) // they start again from the store, each making room
		synctest.Wait()
		// Chats that neither crash nor are refused take every place in memory.
		fs = fs[:0]
		for i := chats; i < chats+bound; i++ {
			fs = append(fs, w.send(i, "m1", "hello"))
		}
		mustAccept(t, "m1", fs)
		synctest.Wait()

		got := w.probe(t, w.manager)
		if got["sessions"] != bound {
			t.Fatalf("%d sessions in memory, want %d (sessions.max_in_memory)", got["sessions"], bound)
		}
		if got["crashStops"] != chats/2 || got["refused"] != chats/2 || got["keptBackoffs"] != chats {
			t.Errorf("with every chat's session passivated to make room, the manager holds %v; want the backoffs "+
				"of the %d chats that crashed out and the %d refused kept", got.nonEmpty(nil), chats/2, chats/2)
		}
		time.Sleep(backoffKeptFor + backoffCheckEvery)
		synctest.Wait()
		if got := w.probe(t, w.manager).nonEmpty(map[string]int{"sessions": bound}); len(got) > 0 {
			t.Errorf("%v after the chats stayed out of memory for %v, the manager holds %v; want nothing but the sessions in memory",
				chats, backoffKeptFor, got)
		}
		if got, want := testutil.ToFloat64(w.d.Metrics.MessagesQuarantined.WithLabelValues("session_crash")), float64(chats); got != want {
			t.Errorf("%v messages quarantined, want %v (both messages of every chat that panics)", got, want)
		}
	})
}

// TestRefusedSessionOfAKeyThatMovedLeavesNoPause: the store refuses a write as unavailable (a
// command's, while a turn runs) while the chat's key moves to another member. The stopped session's successor
// starts there, so this member waits out no pause for the key, and keeps no note of one: before,
// the note stayed (paused), for ever if the key never came back, and when it did, the key's next
// normal passivation here waited out a pause it had no reason for (answering the chat's
// messages "unavailable" meanwhile) and left a refusal counted for the key.
func TestRefusedSessionOfAKeyThatMovedLeavesNoPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &storetest.Outage{}
		gate, gateLater := make(chan struct{}), make(chan struct{})
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			switch req.Messages[len(req.Messages)-1].Text {
			case "refused":
				<-gate
			case "refused later":
				<-gateLater
			}
			return &agents.Response{Text: "answer"}, nil
		})
		var owner atomic.Pointer[actor.PID]
		w := newLongRunWorld(t, agent, func(d *Deps) {
			out.Store = d.Store
			d.Store = out
			d.Placement = peersPlacement{owner: &owner} // a member alone, until the key moves
		})
		mustAccept(t, "m1", []*actor.Future{w.send(0, "m1", "refused")})
		synctest.Wait()
		// The key moves to another member (one that takes what it is handed and does nothing),
		// and the store refuses a command.
		other := w.system.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
		owner.Store(other)
		out.Down.Store(true)
		mustRefuse(t, "c1", []*actor.Future{w.send(0, "c1", "/status")})
		close(gate)
		synctest.Wait()
		out.Down.Store(false)
		if got := w.probe(t, w.manager).nonEmpty(nil); len(got) > 0 {
			t.Errorf("after the key moved on, the manager holds %v; want nothing", got)
		}
		// The key comes back, and its session passivates as usual.
		owner.Store(nil)
		mustAccept(t, "m2", []*actor.Future{w.send(0, "m2", "again")})
		time.Sleep(3 * w.d.Config.PassivateAfter)
		synctest.Wait()
		if got := w.probe(t, w.manager).nonEmpty(nil); len(got) > 0 {
			t.Errorf("after the key came back and passivated, the manager holds %v; want nothing", got)
		}
		// Another chat's command is refused while its key is here, and the key moves while its
		// session waits out the pause: the refusal counted for it goes with it.
		mustAccept(t, "m1", []*actor.Future{w.send(1, "m1", "refused later")})
		synctest.Wait()
		out.Down.Store(true)
		mustRefuse(t, "c1", []*actor.Future{w.send(1, "c1", "/status")})
		close(gateLater)
		synctest.Wait()
		out.Down.Store(false)
		if got := w.probe(t, w.manager); got["refused"] != 1 || got["waitingOut"] != 1 {
			t.Fatalf("the manager holds %v, want the key waiting out its pause", got.nonEmpty(nil))
		}
		owner.Store(other)
		time.Sleep(maxRefusedPause)
		synctest.Wait()
		if got := w.probe(t, w.manager).nonEmpty(nil); len(got) > 0 {
			t.Errorf("after the key moved on during its pause, the manager holds %v; want nothing", got)
		}
	})
}

// TestClusterSessionCrashedOutLeavesNoCount: in a cluster, a session that crashes past its
// restart budget is stopped and left to the cluster's recovery sweep, which starts it wherever
// its key lives by then, with no pause of this member's. So this member keeps no count of the
// key's crash stops: before, it kept one for every key that ever crashed out here and never
// passivated here again.
func TestClusterSessionCrashedOutLeavesNoCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var owner atomic.Pointer[actor.PID]
		w := newLongRunWorld(t, streamingAgent, func(d *Deps) {
			d.Clustered = true
			d.Placement = peersPlacement{owner: &owner}
		})
		// The first message crashes its session until it is quarantined, the second past the
		// restart budget.
		mustAccept(t, "m1", []*actor.Future{w.send(0, "m1", "panic")})
		synctest.Wait()
		mustAccept(t, "m2", []*actor.Future{w.send(0, "m2", "panic again")})
		synctest.Wait()
		if got := testutil.ToFloat64(w.d.Metrics.SessionsActive); got != 0 {
			t.Fatalf("%v sessions active, want none: the session did not crash out", got)
		}
		if got := w.probe(t, w.manager).nonEmpty(nil); len(got) > 0 {
			t.Errorf("after the session crashed out, the manager holds %v; want nothing", got)
		}
	})
}

// TestPassivatedSessionsFreeTheirState: protoactor keeps the PID of a stopped child in a slot
// of its parent's set of children past its removal (PIDSet.Remove shortens the slice without
// clearing the slot), and the PID holds its process, so the session manager keeps every
// passivated session it had at its busiest moment reachable until as many new ones overwrite
// those slots. A session therefore lets go of its state once it has stopped: what the daemon
// holds after a busy hour then comes back to what the actors themselves cost, not to their
// transcripts. Before, hundreds of chats with a few kilobytes of history each left all of it
// in the heap after they passivated.
func TestPassivatedSessionsFreeTheirState(t *testing.T) {
	const chats, messages = 200, 4
	synctest.Test(t, func(t *testing.T) {
		w := newLongRunWorld(t, agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
			return &agents.Response{Text: "ok"}, nil // (the fake platform keeps what it is sent)
		}), nil)
		big := strings.Repeat("x", 16<<10)
		before := liveHeap()
		for m := range messages {
			var fs []*actor.Future
			for i := range chats {
				fs = append(fs, w.send(i, fmt.Sprint("m", m), fmt.Sprint(m, big)))
			}
			mustAccept(t, fmt.Sprint("m", m), fs)
			synctest.Wait()
		}
		time.Sleep(3 * w.d.Config.PassivateAfter)
		synctest.Wait()
		if got := testutil.ToFloat64(w.d.Metrics.SessionsActive); got != 0 {
			t.Fatalf("%v sessions active, want none", got)
		}
		// Each chat's history holds its messages: 64 KiB and more.
		if kept := (liveHeap() - before) / chats; kept > int64(len(big)) {
			t.Errorf("after %d chats passivated, the heap holds %d bytes more for each; want less than one of their messages", chats, kept)
		}
	})
}

// liveHeap is the size of the heap's live objects, after a collection.
func liveHeap() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
