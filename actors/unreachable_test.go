package actors

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/asynkron/protoactor-go/actor"
)

// cutLink stands for member b's manager as member a reaches it: while cut, a Release sent
// through it is dead-lettered (protoactor's remote answers so a request to an address it cannot
// reach) or, when silent, lost; otherwise it passes everything on to b, sender and all.
func cutLink(system *actor.ActorSystem, b **actor.PID, cut *atomic.Bool, silent bool) *actor.PID {
	return system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch c.Message().(type) {
		case *actor.Started, *actor.Stopping, *actor.Stopped, *actor.Restarting:
			return
		case *Release:
			if cut.Load() {
				if !silent {
					c.Send(c.Sender(), &actor.DeadLetterResponse{Target: c.Self()})
				}
				return
			}
		}
		c.Forward(*b)
	}))
}

// loggedClusterWorld is a clusterWorld whose manager logs (from Info) into logs.
func loggedClusterWorld(t *testing.T, agent agents.Agent, logs *testutil.Buffer) *managerWorld {
	t.Helper()
	return newManagerWorld(t, agent, func(d *Deps) {
		d.Node, d.Fencing, d.Clustered = "a", true, true
		d.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
}

// twoMembers is a cluster of two managers on one store: a, the world's, which logs into logs,
// and b, which a reaches through link (cut cuts it: a dead letter, or silence when silent).
// ownerA and ownerB are where each one's view places the key, b to begin with; a's lookup of
// the key's holder in the store names none once gone names the holder (goneHolder).
func twoMembers(t *testing.T, agent agents.Agent, silent bool) (w *managerWorld, logs *testutil.Buffer, link *actor.PID,
	ownerA, ownerB, gone *atomic.Pointer[actor.PID], cut *atomic.Bool) {
	t.Helper()
	logs = &testutil.Buffer{}
	ownerA, ownerB, gone, cut = &atomic.Pointer[actor.PID]{}, &atomic.Pointer[actor.PID]{}, &atomic.Pointer[actor.PID]{}, &atomic.Bool{}
	w = loggedClusterWorld(t, agent, logs)
	db := &Deps{Ctx: w.ctx, Store: w.store, Agent: agent, Platforms: w.d.Platforms, Log: w.d.Log,
		Metrics: metrics.New("fake"), Node: "b", Config: w.d.Config, Persist: w.d.Persist, Fencing: true, Clustered: true}
	var b *actor.PID
	link = cutLink(w.system, &b, cut, silent) // b's manager, as a reaches it
	b = w.system.Root.Spawn(NewSessionManager(db))
	t.Cleanup(func() { _ = w.system.Root.StopFuture(b).Wait() })
	nodes := map[string]*actor.PID{"a": w.manager, "b": link}
	w.d.Placement = goneHolder{storedPlacement{peersPlacement{self: w.manager, peers: []*actor.PID{link}, owner: ownerA}, w.store, nodes}, gone}
	db.Placement = storedPlacement{peersPlacement{self: link, peers: []*actor.PID{w.manager}, owner: ownerB}, w.store, nodes}
	ownerA.Store(link)
	ownerB.Store(link)
	return w, logs, link, ownerA, ownerB, gone, cut
}

// linesWith returns the lines of logs that contain text.
func linesWith(logs *testutil.Buffer, text string) []string {
	var out []string
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, text) {
			out = append(out, l)
		}
	}
	return out
}

// goneHolder is a storedPlacement whose registry takes the members in gone for gone: it names
// none of them as a key's holder (their registrations expired or were removed).
type goneHolder struct {
	storedPlacement
	gone *atomic.Pointer[actor.PID]
}

func (p goneHolder) Holders(ctx context.Context, keys []string) (map[string]Holder, error) {
	return holdersOf(ctx, keys, p.holder)
}

func (p goneHolder) holder(ctx context.Context, key string) (*actor.PID, error) {
	h, err := p.storedPlacement.holder(ctx, key)
	if h != nil && h.Equal(p.gone.Load()) {
		return nil, err
	}
	return h, err
}

// TestActivationWaitsForAHolderItCannotReach: member b runs the key's slow turn when the key
// moves to member a, which cannot reach b: its Release comes back as a dead letter, or goes
// unanswered. b is alive (the store names it as the key's holder: its registration is live and
// it made the key's latest claim), so a does not take it to hold nothing: the chat's next
// message waits at a, which asks b again, for as long as b cannot be reached. Once it can, b
// says it holds the key, the message is stored behind its turn, b hands the key on when the
// turn is done, and a runs the next message. Each message runs once.
//
// Before, a took b for gone after the dead letter (or two silences), claimed the key, and ran
// the slow message again beside b's running turn: the agent ran twice (its tools acted twice),
// and b's result was fenced.
func TestActivationWaitsForAHolderItCannotReach(t *testing.T) {
	for _, silent := range []bool{false, true} {
		name := map[bool]string{false: "dead letter", true: "silent"}[silent]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release := make(chan struct{})
				agent, ran := slowUntil(release)
				w, logs, link, ownerA, ownerB, _, cut := twoMembers(t, agent, silent)

				slow := w.system.Root.RequestFuture(link, &Routed{Key: w.key, Msg: w.message("m1", "slow")}, time.Hour)
				synctest.Wait()
				if ran("slow") != 1 {
					t.Fatalf("the slow message ran %d times on b, want once", ran("slow"))
				}
				cut.Store(true)
				ownerA.Store(w.manager) // the key moves to a, which cannot reach b
				ownerB.Store(w.manager)
				next := w.request("m2", "next")
				time.Sleep(time.Minute)
				synctest.Wait()
				if ran("slow") != 1 || ran("next") != 0 {
					t.Fatalf("while b could not be reached the agent ran the slow message %d times and the next %d, want once and not at all",
						ran("slow"), ran("next"))
				}
				if own, err := w.store.Ownership(w.ctx, w.key); err != nil || own.Owner != "b" {
					t.Errorf("while b ran the turn the key's claim is %+v (%v), want b's", own, err)
				}
				waits := linesWith(logs, "cannot be reached; the session waits")
				if len(waits) == 0 || len(waits) > 2 {
					t.Errorf("lines of the wait:\n%s\nwant one, or two a minute apart", strings.Join(waits, "\n"))
				}
				for _, want := range []string{"level=WARN", "session=" + w.key, "member=" + link.Address, "waiting=", "err="} {
					if len(waits) > 0 && !strings.Contains(waits[0], want) {
						t.Errorf("line %q lacks %q", waits[0], want)
					}
				}
				if took := linesWith(logs, "takes the key over"); len(took) > 0 {
					t.Errorf("a took the key over while b held it: %q", took)
				}

				cut.Store(false) // b can be reached again
				if res, err := next.Result(); err != nil || res.(*DeliverResult).Disposition != "queued" {
					t.Errorf("the next message: %+v %v, want it queued behind b's running turn", res, err)
				}
				close(release)
				if res, err := slow.Result(); err != nil || res.(*DeliverResult).Disposition != "started" {
					t.Errorf("the slow message: %+v %v, want started", res, err)
				}
				ranOnceEach(t, w, ran)
				if own, err := w.store.Ownership(w.ctx, w.key); err != nil || own.Owner != "a" {
					t.Errorf("after b let go the key's claim is %+v (%v), want a's", own, err)
				}
			})
		})
	}
}

// TestActivationTakesOverFromAnUnreachableHolderThatIsGone: as above, but b stays out of
// reach, and its registration goes (it expired: b died; or b stopped cleanly). a then takes the
// key over within one more Release (releaseAnswerTimeout) and runs the messages.
func TestActivationTakesOverFromAnUnreachableHolderThatIsGone(t *testing.T) {
	for _, silent := range []bool{false, true} {
		name := map[bool]string{false: "dead letter", true: "silent"}[silent]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release := make(chan struct{})
				defer close(release)
				agent, ran := slowUntil(release)
				w, logs, link, ownerA, _, gone, cut := twoMembers(t, agent, silent)

				w.system.Root.Send(link, &Routed{Key: w.key, Msg: w.message("m1", "slow")})
				synctest.Wait()
				cut.Store(true)
				ownerA.Store(w.manager)
				next := w.request("m2", "next")
				time.Sleep(time.Minute)
				synctest.Wait()
				if ran("slow") != 1 {
					t.Fatalf("while b could not be reached the slow message ran %d times, want once", ran("slow"))
				}
				gone.Store(link) // b's registration is gone
				begin := time.Now()
				if res, err := next.Result(); err != nil || res.(*DeliverResult).ErrorCode != "" {
					t.Errorf("the next message: %+v %v, want it taken here", res, err)
				}
				if took, most := time.Since(begin), releaseAnswerTimeout; took > most {
					t.Errorf("a took the key over %v after b's registration went, want at most %v", took, most)
				}
				if own, err := w.store.Ownership(w.ctx, w.key); err != nil || own.Owner != "a" {
					t.Errorf("the key's claim is %+v (%v), want a's", own, err)
				}
				if took := linesWith(logs, "no longer holds the session; this member takes the key over"); len(took) != 1 ||
					!strings.Contains(took[0], "waited=") {
					t.Errorf("lines of the takeover: %q, want one that says how long a waited", took)
				}
			})
		})
	}
}
