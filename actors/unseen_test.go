package actors

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
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
