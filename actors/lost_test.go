package actors

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
)

// TestRetryAfterALostCommitAnswerRuns: the write of a message commits, but its answer is lost
// (a connection that broke after COMMIT; a member of a shared store keeps no spool that would
// replay it), so the sender is told the message was not stored. Its retry is refused by the
// store as a duplicate of that very write: the message is stored, and it runs now, in this
// activation, once. Before, the retry was answered "duplicate" and the stored message sat in
// no queue until the key's next activation. A re-delivery after that is a duplicate, and the
// seq the refused retry took is used by the next row, so the transcript has no gap.
func TestRetryAfterALostCommitAnswerRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		echo, ran := countingEcho()
		out := &storetest.Outage{}
		w := newManagerWorldWrites(t, echo, nil, func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		reply := func(want string) {
			t.Helper()
			select {
			case got := <-w.sent:
				if got.Out.Text != want {
					t.Fatalf("reply %q, want %q", got.Out.Text, want)
				}
			case <-time.After(time.Minute):
				t.Fatalf("no reply %q within a minute", want)
			}
		}

		if r := w.deliver(t, "m0", "zero"); r.Disposition != platforms.Started {
			t.Fatalf("m0: %+v", r)
		}
		reply("echo: zero")

		out.Lost.Store(1)
		if r := w.deliver(t, "m1", "one"); r.ErrorCode != "unavailable" {
			t.Fatalf("m1 whose commit answer is lost: %+v, want unavailable", r)
		}
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started || r.ErrorCode != "" {
			t.Errorf("the retry of m1 (stored, its answer lost): %+v, want started", r)
		}
		reply("echo: one")
		synctest.Wait()
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Duplicate {
			t.Errorf("m1 delivered again once it ran: %+v, want duplicate", r)
		}
		if r := w.deliver(t, "m2", "two"); r.Disposition != platforms.Started {
			t.Fatalf("m2: %+v", r)
		}
		reply("echo: two")
		synctest.Wait()

		if n := ran("m1"); n != 1 {
			t.Errorf("m1 ran %d times, want once", n)
		}
		snap, err := w.store.LoadSession(w.ctx, w.key, 100)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range snap.History {
			if m.Seq != int64(i+1) {
				t.Errorf("row %d has seq %d, want %d (no gap)", i, m.Seq, i+1)
			}
			if m.Role == persistence.RoleUser && m.Status != persistence.StatusDone {
				t.Errorf("message %s is %s, want done", m.MessageID, m.Status)
			}
		}
		if len(snap.History) != 6 {
			t.Errorf("the session holds %d rows, want 6 (three messages and their replies)", len(snap.History))
		}
	})
}

// TestLostCommitAnswerRunsAtTheKeysRecovery: as above, but the sender does not send the
// message again. The store lists the key as having pending work, and the recovery that
// follows (in a cluster, every member_ttl) finds the message in the live activation and runs
// it, once, rather than leave it to the key's next activation.
func TestLostCommitAnswerRunsAtTheKeysRecovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		echo, ran := countingEcho()
		out := &storetest.Outage{}
		w := newManagerWorldWrites(t, echo, func(d *Deps) { d.Fencing = true }, func(s persistence.Store) persistence.Store {
			out.Store = s
			return out
		})
		if r := w.deliver(t, "m0", "zero"); r.Disposition != platforms.Started {
			t.Fatalf("m0: %+v", r)
		}
		<-w.sent
		out.Lost.Store(1)
		if r := w.deliver(t, "m1", "one"); r.ErrorCode != "unavailable" {
			t.Fatalf("m1 whose commit answer is lost: %+v, want unavailable", r)
		}
		synctest.Wait()
		keys, err := w.store.Recoverable(w.ctx)
		if err != nil || len(keys) != 1 || keys[0] != w.key {
			t.Fatalf("Recoverable() = %v, %v; want the key, whose m1 is stored and pending", keys, err)
		}
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &Recover{}})
		select {
		case got := <-w.sent:
			if got.Out.Text != "echo: one" {
				t.Errorf("reply %q, want m1 answered", got.Out.Text)
			}
		case <-time.After(time.Minute):
			t.Fatalf("m1, stored and pending, did not run at the key's recovery")
		}
		synctest.Wait()
		w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &Recover{}})
		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Duplicate {
			t.Errorf("m1 sent again after it ran: %+v, want duplicate", r)
		}
		synctest.Wait()
		if n := ran("m1"); n != 1 {
			t.Errorf("m1 ran %d times, want once", n)
		}
	})
}

// countingEcho is an agent that echoes the last message of its turn, and ran, how many turns
// each message id ran in.
func countingEcho() (agent agents.Agent, ran func(id string) int) {
	var mu sync.Mutex
	runs := map[string]int{}
	agent = agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range req.Messages {
			runs[m.MessageID]++
		}
		return &agents.Response{Text: "echo: " + req.Messages[len(req.Messages)-1].Text}, nil
	})
	return agent, func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return runs[id]
	}
}
