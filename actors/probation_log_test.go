package actors

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/asynkron/protoactor-go/actor"
)

// TestProbationWaitsLogOnceAMinute: sessions whose suspect begins to wait for probation log
// one Warn line at once, then one a minute for all of them, which says how many began to wait
// since the last one. Before, each session logged its own: after an unclean stop during a
// backlog, thousands at every start (a scale walkthrough: 3,560), and each session resumed
// logged one more at Info. The line that counts the sessions held back is logged when due, a
// minute after the last: before, only with the next session that began to wait, if any.
func TestProbationWaitsLogOnceAMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "agentgate.db")
		const suspects = 6
		heads := map[string]int{}
		for i := range suspects {
			heads[fmt.Sprint("p", i)] = ProbationAfter
		}
		MustSeedHeads(t, path, heads)
		// The first suspect to run holds the token a minute, then crashes its session, whose
		// next incarnation begins to wait again; every other turn is answered at once.
		var crashed atomic.Bool
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			if crashed.CompareAndSwap(false, true) {
				time.Sleep(time.Minute + time.Second)
				panic("the first suspect to run crashes its session")
			}
			return &agents.Response{Text: "answered " + req.Identity.MessageID}, nil
		})
		var logs testutil.Buffer
		w := newManagerWorldAt(t, path, agent, func(d *Deps) {
			d.Run = "run-1"
			d.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		})
		waits := regexp.MustCompile(`level=WARN msg="the next message was running during 2 unclean stops of agentgate: it waits to run alone[^"]*"` +
			`.* message_id=p\d strikes=2/3 sessions=(\d+)`)
		counts := func() []string {
			var got []string
			for _, m := range waits.FindAllStringSubmatch(logs.String(), -1) {
				got = append(got, m[1])
			}
			return got
		}
		synctest.Wait()
		// The start's one line counts the sessions it recovers; none logs its own at Info.
		if out := logs.String(); strings.Count(out, `msg="recovering sessions" actor=manager count=6`) != 1 || strings.Contains(out, "session resumed") {
			t.Errorf("start lines: want one \"recovering sessions\" count=6 and no \"session resumed\" at Info:\n%s", out)
		}
		if got := counts(); fmt.Sprint(got) != "[1]" {
			t.Errorf("waiting lines at start: sessions=%v, want one line, sessions=[1]:\n%s", got, logs.String())
		}
		// A minute on, the sessions held back are logged with no new one waiting.
		time.Sleep(time.Minute + time.Millisecond)
		synctest.Wait()
		if got := counts(); fmt.Sprint(got) != fmt.Sprint([]int{1, suspects - 1}) {
			t.Errorf("waiting lines a minute after the start: sessions=%v, want [1 %d]:\n%s",
				got, suspects-1, logs.String())
		}
		// The crashed suspect waits again a second later: held back, then logged when due.
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got := counts(); fmt.Sprint(got) != fmt.Sprint([]int{1, suspects - 1}) {
			t.Errorf("waiting lines once the crashed suspect waits again: sessions=%v, want [1 %d]:\n%s",
				got, suspects-1, logs.String())
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := counts(); fmt.Sprint(got) != fmt.Sprint([]int{1, suspects - 1, 1}) {
			t.Errorf("waiting lines a minute after the last: sessions=%v, want [1 %d 1]:\n%s",
				got, suspects-1, logs.String())
		}
		ids := make([]string, 0, suspects)
		for id := range heads {
			ids = append(ids, id)
		}
		for id, status := range headStatuses(t, w.store, ids...) {
			if status != persistence.StatusDone {
				t.Errorf("message %s is %s at the end, want %s", id, status, persistence.StatusDone)
			}
		}
	})
}

// TestProbationWaitsHeldBackAreLoggedAtAStopAndARestart: the sessions whose suspect began to
// wait since the waiting line last logged are counted by one line as Probation stops, and as
// it restarts, named after the first of them. Before, a stop logged none (they were counted
// again only by the next start's line), and the line due after a restart named no session: the
// new incarnation does not know the first held back.
func TestProbationWaitsHeldBackAreLoggedAtAStopAndARestart(t *testing.T) {
	waits := regexp.MustCompile(`level=WARN msg="` + regexp.QuoteMeta(waitingLine) + `" actor=probation(.*) sessions=(\d+)`)
	lines := func(logs *testutil.Buffer) []string {
		var got []string
		for _, m := range waits.FindAllStringSubmatch(logs.String(), -1) {
			got = append(got, strings.TrimSpace(m[1])+" sessions="+m[2])
		}
		return got
	}
	start := func(t *testing.T, props func(*Deps) *actor.Props) (*actor.ActorSystem, *actor.PID, *testutil.Buffer) {
		system, _ := quietSystem(t)
		logs := &testutil.Buffer{}
		d := &Deps{Ctx: t.Context(), Log: slog.New(slog.NewTextHandler(logs, nil)), Metrics: metrics.New("fake")}
		probation := system.Root.Spawn(props(d))
		for _, id := range []string{"a", "b", "c"} {
			session := system.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
			system.Root.Send(probation, &askProbation{id: id, session: session, key: "k-" + id, message: "m-" + id, strikes: "2/3"})
		}
		synctest.Wait()
		if got, want := lines(logs), []string{"session=k-a message_id=m-a strikes=2/3 sessions=1"}; !slices.Equal(got, want) {
			t.Fatalf("waiting lines once three sessions asked: %q, want %q", got, want)
		}
		return system, probation, logs
	}
	held := []string{"session=k-a message_id=m-a strikes=2/3 sessions=1", "session=k-b message_id=m-b strikes=2/3 sessions=2"}

	t.Run("stop", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			system, probation, logs := start(t, NewProbation)
			time.Sleep(time.Second) // well before the held line is due
			_ = system.Root.StopFuture(probation).Wait()
			synctest.Wait()
			if got := lines(logs); !slices.Equal(got, held) {
				t.Errorf("waiting lines after Probation stopped: %q, want %q", got, held)
			}
		})
	})
	t.Run("restart", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			type crash struct{}
			crashing := func(d *Deps) *actor.Props {
				return NewProbation(d).Configure(actor.WithReceiverMiddleware(func(next actor.ReceiverFunc) actor.ReceiverFunc {
					return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
						if _, ok := env.Message.(*crash); ok {
							panic("probation crashes")
						}
						next(c, env)
					}
				}))
			}
			system, probation, logs := start(t, crashing)
			time.Sleep(time.Second)
			system.Root.Send(probation, &crash{})
			synctest.Wait()
			time.Sleep(2 * time.Minute) // past the line that was due after the first
			synctest.Wait()
			if got := lines(logs); !slices.Equal(got, held) {
				t.Errorf("waiting lines after Probation restarted: %q, want %q", got, held)
			}
			_ = system.Root.StopFuture(probation).Wait()
		})
	})
}
