package actors

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/platforms"
)

// unseeingAgent takes the message steered into m1's turn and answers without passing it on,
// as an exec command that no longer reads its stdin: it reports that message Unseen.
type unseeingAgent struct{ took chan string }

func (unseeingAgent) CanSteer() bool { return true }

func (a unseeingAgent) Run(ctx context.Context, req *agents.Request) (*agents.Response, error) {
	if req.Identity.MessageID == "m1" {
		select {
		case m := <-req.Steer:
			a.took <- m.MessageID
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return &agents.Response{Text: "ok m1", Unseen: 1}, nil
	}
	return &agents.Response{Text: "ok " + req.Identity.MessageID}, nil
}

// TestUnseenSteeredMessageRunsNext: a message steered into a turn whose agent reports it
// unseen runs as the next turn and gets its own answer. (Before, the exec agent's forwarder
// took it and the turn counted it answered by a reply that never saw it.)
func TestUnseenSteeredMessageRunsNext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := unseeingAgent{took: make(chan string, 1)}
		w := newManagerWorld(t, agent, func(d *Deps) { d.Config.QueueMode = ModeSteer })
		w.startAndSteer(t, agent.took)
		time.Sleep(time.Minute)
		synctest.Wait()

		var answers [][]string
		var texts []string
		for len(w.sent) > 0 {
			out := (<-w.sent).Out
			answers, texts = append(answers, out.InReplyTo), append(texts, out.Text)
		}
		if want := [][]string{{"m1"}, {"m2"}}; !slices.EqualFunc(answers, want, slices.Equal) {
			t.Errorf("answers' in_reply_to: %v (%q), want %v", answers, texts, want)
		}
	})
}

// steerWatcher is an agent that can steer and notes, by message, whether its turn was given a
// steer channel; m-hold runs until released.
type steerWatcher struct {
	mu      sync.Mutex
	steered map[string]bool
	release chan struct{}
}

func (*steerWatcher) CanSteer() bool { return true }

func (a *steerWatcher) Run(ctx context.Context, req *agents.Request) (*agents.Response, error) {
	id := req.Identity.MessageID
	a.mu.Lock()
	a.steered[id] = req.Steer != nil
	a.mu.Unlock()
	if id == "hold" {
		<-a.release
	}
	return &agents.Response{Text: "ok " + id}, nil
}

// TestTurnsSteerOnlyInSteerMode: an agent that can steer (an exec agent with steer: true) is
// given a steer channel, which keeps a command's stdin open while it runs, only in queue mode
// steer, as README says. Before, every mode kept it open, and a command that reads stdin to
// its end waited until its timeout (found by an audit). A turn that began in another mode
// takes no message steered into it when the mode changes while it runs: the message queues
// and gets its own answer.
func TestTurnsSteerOnlyInSteerMode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent := &steerWatcher{steered: map[string]bool{}, release: make(chan struct{})}
		w := newManagerWorld(t, agent, nil) // followup
		w.deliver(t, "m1", "one")
		w.awaitTurnEnds(1)
		if r := w.deliver(t, "hold", "hold"); r.Disposition != platforms.Started {
			t.Fatalf("hold: %+v", r)
		}
		w.deliver(t, "q", "/queue steer")
		if r := w.deliver(t, "m2", "two"); r.Disposition != platforms.Queued {
			t.Errorf("m2 while a followup turn runs, after /queue steer: %+v, want queued", r)
		}
		close(agent.release)
		time.Sleep(time.Minute)
		synctest.Wait()
		w.deliver(t, "m3", "three")
		time.Sleep(time.Minute)
		synctest.Wait()
		agent.mu.Lock()
		defer agent.mu.Unlock()
		if want := map[string]bool{"m1": false, "hold": false, "m2": true, "m3": true}; !maps.Equal(agent.steered, want) {
			t.Errorf("turns given a steer channel: %v, want %v", agent.steered, want)
		}
	})
}

// TestQueueSteerSaysWhatTheAgentDoes: /queue steer tells the user what their next messages
// will do with this agent: join the running turn with one that can steer, queue as in
// followup with one that cannot. (Before, it said they queue with every agent: the openai
// agent's users were told so while their messages were steered, found by the openai soak.)
func TestQueueSteerSaysWhatTheAgentDoes(t *testing.T) {
	for _, tt := range []struct {
		name  string
		agent agents.Agent
		want  string
	}{
		{"can steer", &steerWatcher{steered: map[string]bool{}}, SteerModeNotice},
		{"cannot steer", echo.New(), SteerModeQueuedNotice},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newManagerWorld(t, tt.agent, nil)
				if r := w.deliver(t, "q", "/queue steer"); r.Disposition != platforms.Command {
					t.Fatalf("/queue steer: %+v", r)
				}
				if got := w.noticeFor(t, "q"); got != tt.want {
					t.Errorf("/queue steer answered %q, want %q", got, tt.want)
				}
			})
		})
	}
}
