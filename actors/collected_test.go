package actors

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/platforms"
)

// TestCollectedIsToldOnlyOfAMessageThatJoins: with debounce, a message queued behind another of
// its sender's, while a turn runs, is answered "collected" only when it came within the window
// and so runs in the same turn; one that came later runs in a turn of its own and is answered
// "queued". Before, both were "collected".
func TestCollectedIsToldOnlyOfAMessageThatJoins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		ran := make(chan []string, 4)
		agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
			var ids []string
			for _, m := range req.Messages {
				ids = append(ids, m.MessageID)
			}
			ran <- ids
			if ids[0] == "m1" {
				<-release // the first turn runs while the others queue
			}
			return &agents.Response{Text: "ok"}, nil
		})
		w := newManagerWorld(t, agent, func(d *Deps) { d.Config.Debounce = 2 * time.Second })
		want := map[string]string{"m1": platforms.Started, "m2": platforms.Queued, "m3": platforms.Collected, "m4": platforms.Queued}
		got := map[string]string{}
		deliver := func(id string) { got[id] = w.deliver(t, id, id).Disposition }
		deliver("m1")
		time.Sleep(3 * time.Second) // past m1's window: its turn starts
		synctest.Wait()
		deliver("m2")
		time.Sleep(time.Second)
		deliver("m3") // within m2's window: it joins m2
		time.Sleep(5 * time.Second)
		deliver("m4") // past m3's window: a turn of its own
		for id, d := range want {
			if got[id] != d {
				t.Errorf("%s was answered %q, want %q", id, got[id], d)
			}
		}
		close(release)
		time.Sleep(time.Minute)
		synctest.Wait()
		var turns [][]string
		for len(ran) > 0 {
			turns = append(turns, <-ran)
		}
		if wantTurns := [][]string{{"m1"}, {"m2", "m3"}, {"m4"}}; !slices.EqualFunc(turns, wantTurns, slices.Equal) {
			t.Errorf("the turns ran %v, want %v", turns, wantTurns)
		}
	})
}
