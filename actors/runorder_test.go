package actors

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
)

// TestReloadedHistoryKeepsTheOrderTurnsRan: messages that queued behind a running turn have
// lower seqs than its reply. A session loaded again from the store (here after it passivated;
// a restart reads the same rows) gives its agent every question followed by its own answer, as
// the live session did, and /undo takes back the last exchange only. Before, the history was
// read in seq order: Q1 Q2 Q3 A1 A2 A3, and /undo archived Q3 with all three answers.
func TestReloadedHistoryKeepsTheOrderTurnsRan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newHistoryAgent("")
		w := newManagerWorld(t, a.agent, func(d *Deps) { d.Config.PassivateAfter = time.Minute })
		release, history := a.release, a.history
		send := func(id, text string) {
			t.Helper()
			if r := w.deliver(t, id, text); r.ErrorCode != "" {
				t.Fatalf("%s %q: %+v", id, text, r)
			}
			synctest.Wait()
		}
		send("q1", "Q1")
		send("q2", "Q2") // both queue behind Q1
		send("q3", "Q3")
		close(release)
		synctest.Wait()
		if got, want := history(), []string{"Q1", "A1", "Q2", "A2"}; !slices.Equal(got, want) {
			t.Fatalf("the live session gave Q3's turn the history %q, want %q", got, want)
		}

		time.Sleep(3 * time.Minute) // the session passivates
		synctest.Wait()
		send("q4", "Q4")
		if got, want := history(), []string{"Q1", "A1", "Q2", "A2", "Q3", "A3"}; !slices.Equal(got, want) {
			t.Errorf("the reloaded session gave Q4's turn the history %q, want %q", got, want)
		}

		time.Sleep(3 * time.Minute)
		synctest.Wait()
		send("undo", "/undo")  // takes back Q4 and A4
		send("undo2", "/undo") // and then Q3 and A3
		sid := w.deliver(t, "q5", "Q5").SessionId
		synctest.Wait()
		rows, err := w.store.Transcript(w.ctx, sid)
		if err != nil {
			t.Fatal(err)
		}
		var active []string
		for _, m := range rows {
			if m.Active && (m.Role == persistence.RoleUser || m.Role == persistence.RoleAssistant) {
				active = append(active, m.Content)
			}
		}
		// The transcript keeps the order messages arrived in.
		if want := []string{"Q1", "Q2", "A1", "A2", "Q5", "A5"}; !slices.Equal(active, want) {
			t.Errorf("after two /undo of a reloaded session the active rows are %q, want %q", active, want)
		}
	})
}

// TestRunOrder: the rows of turns that took several messages, of a failed turn (no reply) and
// of a pending message keep their places; only answered messages move, each to just before
// its turn's first reply.
func TestRunOrder(t *testing.T) {
	row := func(role, text, turn string) persistence.Message {
		return persistence.Message{Role: role, Content: text, TurnID: turn}
	}
	u := func(text, turn string) persistence.Message { return row(persistence.RoleUser, text, turn) }
	a := func(text, turn string) persistence.Message { return row(persistence.RoleAssistant, text, turn) }
	n := func(text, turn string) persistence.Message { return row(persistence.RoleNotice, text, turn) }
	for _, tc := range []struct {
		name string
		rows []persistence.Message
		want string
	}{
		{"in order", []persistence.Message{u("Q1", "t1"), a("A1", "t1"), u("Q2", "t2"), a("A2", "t2")}, "Q1 A1 Q2 A2"},
		{"queued", []persistence.Message{u("Q1", "t1"), u("Q2", "t2"), a("A1", "t1"), a("A2", "t2")}, "Q1 A1 Q2 A2"},
		{"collected in one turn", []persistence.Message{u("Q1", "t1"), u("Q2", "t2"), u("Q3", "t2"), a("A1", "t1"), a("A2", "t2")}, "Q1 A1 Q2 Q3 A2"},
		{"failed, then pending", []persistence.Message{u("Q1", "t1"), u("Q2", "t2"), u("Q3", ""), a("A2", "t2")}, "Q1 Q2 A2 Q3"},
		{"failed while queued", []persistence.Message{u("Q1", "t1"), u("Q2", "t2"), u("Q3", "t3"), a("A1", "t1"), a("A3", "t3")}, "Q1 A1 Q2 Q3 A3"},
		{"failed behind two", []persistence.Message{u("Q1", "t1"), u("Q2", "t2"), u("Q3", "t3"), a("A1", "t1"), a("A2", "t2")}, "Q1 A1 Q2 A2 Q3"},
		{"a turn's second reply", []persistence.Message{u("Q1", "t1"), a("A1", "t1"), u("Q2", "t2"), a("A1b", "t1"), a("A2", "t2")}, "Q1 A1 A1b Q2 A2"},
		{"the reply's window starts after its message", []persistence.Message{a("A0", "t0"), u("Q1", "t1"), a("A1", "t1")}, "A0 Q1 A1"},
		{"failed, with its notice", []persistence.Message{u("Q1", "t1"), u("Q2", "t2"), a("A1", "t1"), n("N2", "t2")}, "Q1 A1 Q2 N2"},
		{"failed, stored before a turn that ran first", []persistence.Message{u("X", "tx"), u("Y", "ty"), a("AY", "ty"), n("NX", "tx")}, "Y AY X NX"},
		{"a notice of no turn", []persistence.Message{u("Q1", "t1"), n("N", ""), a("A1", "t1")}, "Q1 A1 N"},
	} {
		var got []string
		for _, m := range runOrder(tc.rows) {
			got = append(got, m.Content)
		}
		if s := strings.Join(got, " "); s != tc.want {
			t.Errorf("%s: runOrder = %s, want %s", tc.name, s, tc.want)
		}
	}
}

// TestReloadedHistoryKeepsAFailedQueuedMessageAfterTheTurnItWaitedFor: a message that queued
// behind a running turn and whose own turn failed has no reply to move to; reloaded, it stays
// after the turn it waited for, where the live session had it (found by a review: it came
// before that turn's question, Q2 Q1 A1 Q3 A3).
func TestReloadedHistoryKeepsAFailedQueuedMessageAfterTheTurnItWaitedFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newHistoryAgent("Q2")
		w := newManagerWorld(t, a.agent, func(d *Deps) { d.Config.PassivateAfter = time.Minute })
		release, history := a.release, a.history
		for _, id := range []string{"q1", "q2"} {
			if r := w.deliver(t, id, strings.ToUpper(id)); r.ErrorCode != "" {
				t.Fatalf("%s: %+v", id, r)
			}
			synctest.Wait()
		}
		close(release)
		synctest.Wait()
		w.deliver(t, "q3", "Q3")
		synctest.Wait()
		live := history()
		time.Sleep(3 * time.Minute) // the session passivates
		synctest.Wait()
		w.deliver(t, "q4", "Q4")
		synctest.Wait()
		if got, want := history(), append(live, "Q3", "A3"); !slices.Equal(got, want) {
			t.Errorf("the reloaded session gave Q4's turn the history %q, want %q (Q3's turn had %q)", got, want, live)
		}
	})
}

// historyAgent answers Qn with An once release is closed (Q1 waits for it, so that the
// messages after it queue), fails the message named fail, and keeps the history of the last
// request it answered.
type historyAgent struct {
	agent   agents.Agent
	release chan struct{}
	mu      sync.Mutex
	last    *agents.Request
}

func newHistoryAgent(fail string) *historyAgent {
	a := &historyAgent{release: make(chan struct{})}
	a.agent = agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		switch req.Messages[0].Text {
		case "Q1":
			select {
			case <-a.release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		case fail:
			return nil, errors.New("the agent failed (test)")
		}
		a.mu.Lock()
		a.last = req
		a.mu.Unlock()
		return &agents.Response{Text: "A" + req.Messages[0].Text[1:]}, nil
	})
	return a
}

// history is the texts of the history the last answered request carried.
func (a *historyAgent) history() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var got []string
	for _, m := range a.last.History {
		got = append(got, m.Text)
	}
	return got
}

// TestRunOrderKeepsTheConversationOfOrdinaryFailedTurns: a failed turn's notice counts as its
// reply (f98f13e) for every failed turn, not only a message spooled twice; for the rows an
// ordinary failed turn leaves, the conversation an agent is given (user and assistant rows,
// in runOrder's order) is the one it was before, where only notices move. Failed turns with
// their notices: queued behind an answered turn, two in a row queued, one with a rider (a
// failed message before it), one then /retry (its row archived, the retried one answered),
// one whose message is archived (declined, /undo) and only its notice is left, and notices of
// no turn (a crash's, a quarantine's, a command's) among them.
func TestRunOrderKeepsTheConversationOfOrdinaryFailedTurns(t *testing.T) {
	row := func(role, text, turn string) persistence.Message {
		return persistence.Message{Role: role, Content: text, TurnID: turn}
	}
	u := func(text, turn string) persistence.Message { return row(persistence.RoleUser, text, turn) }
	a := func(text, turn string) persistence.Message { return row(persistence.RoleAssistant, text, turn) }
	n := func(text, turn string) persistence.Message { return row(persistence.RoleNotice, text, turn) }
	for _, tc := range []struct {
		name string
		rows []persistence.Message
		want string // the user and assistant rows, in order
	}{
		{"failed in turn", []persistence.Message{u("Q1", "t1"), n("N1", "t1"), u("Q2", "t2"), a("A2", "t2")}, "Q1 Q2 A2"},
		{"failed, queued behind an answered turn", []persistence.Message{u("Q0", "t0"), u("X", "tx"), a("A0", "t0"), n("NX", "tx")}, "Q0 A0 X"},
		{"failed, two queued behind", []persistence.Message{u("Q0", "t0"), u("X", "tx"), u("Y", "ty"), a("A0", "t0"), n("NX", "tx"), a("AY", "ty")}, "Q0 A0 X Y AY"},
		{"two failed in a row, queued", []persistence.Message{u("X1", "t1"), u("X2", "t2"), n("N1", "t1"), n("N2", "t2"), u("Q3", "t3"), a("A3", "t3")}, "X1 X2 Q3 A3"},
		{"failed with a rider", []persistence.Message{u("R", "tr"), n("NR", "tr"), u("X", "tx"), u("Y", "ty"), n("NX", "tx"), a("AY", "ty")}, "R X Y AY"},
		{"failed, then /retry", []persistence.Message{u("Q0", "t0"), a("A0", "t0"), n("NX", "tx"), u("X'", "tr"), a("AR", "tr")}, "Q0 A0 X' AR"},
		{"only the notice left, while a turn waits", []persistence.Message{u("Q1", "t1"), n("NX", "tx"), a("A1", "t1"), u("Q2", "t2"), a("A2", "t2")}, "Q1 A1 Q2 A2"},
		{"notices of no turn while one waits", []persistence.Message{u("X", "tx"), n("crash", ""), u("Y", "ty"), n("quarantined", ""), n("NX", "tx"), n("status", ""), a("AY", "ty")}, "X Y AY"},
		{"failed, a cut short one behind it", []persistence.Message{u("X", "tx"), u("C", "tc"), n("NX", "tx"), u("I", "ti"), a("AI", "ti")}, "X C I AI"},
	} {
		var got []string
		for _, m := range runOrder(tc.rows) {
			if m.Role != persistence.RoleNotice {
				got = append(got, m.Content)
			}
		}
		if s := strings.Join(got, " "); s != tc.want {
			t.Errorf("%s: the conversation in runOrder = %s, want %s", tc.name, s, tc.want)
		}
	}
}
