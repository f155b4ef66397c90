package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/platforms"
)

// TestQueueModes drives each queue mode with the exec agent: m1 starts a turn that waits for a
// gate, m2 and m3 arrive while it runs. The table asserts the turns the agent actually ran (from
// the stdin and environment each subprocess recorded), the replies delivered and the
// dispositions returned.
func TestQueueModes(t *testing.T) {
	tests := []struct {
		mode         string
		dispositions []string
		turns        [][]string // messages of each turn the agent ran, in order
		replies      [][]string // in_reply_to of each reply delivered, in order
	}{
		{"followup", []string{platforms.Started, platforms.Queued, platforms.Queued},
			[][]string{{"m1"}, {"m2"}, {"m3"}}, [][]string{{"m1"}, {"m2"}, {"m3"}}},
		{"collect", []string{platforms.Started, platforms.Queued, platforms.Collected},
			[][]string{{"m1"}, {"m2", "m3"}}, [][]string{{"m1"}, {"m2", "m3"}}},
		{"interrupt", []string{platforms.Started, platforms.Interrupted, platforms.Interrupted}, // the answer answers the interrupted too
			[][]string{{"m1"}, {"m2"}, {"m3"}}, [][]string{{"m1", "m2", "m3"}}},
		{"steer", []string{platforms.Started, platforms.Queued, platforms.Queued}, // no agent can steer yet
			[][]string{{"m1"}, {"m2"}, {"m3"}}, [][]string{{"m1"}, {"m2"}, {"m3"}}},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			logs := t.TempDir()
			gate := filepath.Join(t.TempDir(), "gate")
			agent := MustExecAgent(t, fmt.Sprintf(`f=%[1]s/$AGENTGATE_TURN_ID
cat > "$f.in"
env | grep '^AGENTGATE_' > "$f.env"
date +%%s%%N > "$f.at" && mv "$f.at" "$f.started" # whole when it appears: the next message may kill this turn
while [ ! -e %[2]q ]; do sleep 0.01; done
echo "reply to $AGENTGATE_MESSAGE_ID"`, logs, gate))
			r := MustStart(t, agent, func(c *config.Config) { c.Sessions.Queue.Mode = tt.mode })
			var got []string
			started := func(n int) {
				waitUntil(t, func() bool { ms, _ := filepath.Glob(filepath.Join(logs, "*.started")); return len(ms) >= n })
			}
			for i, id := range []string{"m1", "m2", "m3"} {
				ack := r.inject(t, dm, id, "text of "+id)
				got = append(got, ack.Disposition)
				if i == 0 || i == 1 && tt.mode == "interrupt" {
					started(i + 1) // the turn this message started runs before the next one arrives
				}
			}
			if !slices.Equal(got, tt.dispositions) {
				t.Errorf("dispositions = %v, want %v", got, tt.dispositions)
			}
			if err := os.WriteFile(gate, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			outs := r.waitSent(t, len(tt.replies))
			var replies [][]string
			for _, o := range outs {
				replies = append(replies, o.InReplyTo)
				if want := "reply to " + o.InReplyTo[len(o.InReplyTo)-1]; o.Text != want {
					t.Errorf("reply %q, want %q", o.Text, want)
				}
			}
			if fmt.Sprint(replies) != fmt.Sprint(tt.replies) {
				t.Errorf("replies answer %v, want %v", replies, tt.replies)
			}
			started(len(tt.turns))
			if turns := agentTurns(t, logs, r.fake.Sent()[0].SessionKey); fmt.Sprint(turns) != fmt.Sprint(tt.turns) {
				t.Errorf("the agent ran turns %v, want %v", turns, tt.turns)
			}
			if n := len(r.fake.Sent()); n != len(tt.replies) {
				t.Errorf("%d replies delivered, want %d (a cancelled turn's reply must never be delivered)", n, len(tt.replies))
			}
		})
	}
}

// agentTurns reads what each subprocess recorded, in start order, and checks that its
// environment carries the identity of the message(s) it was for.
func agentTurns(t *testing.T, dir, key string) [][]string {
	t.Helper()
	starts, _ := filepath.Glob(filepath.Join(dir, "*.started"))
	type turn struct {
		at  string
		ids []string
	}
	var turns []turn
	for _, s := range starts {
		base := strings.TrimSuffix(s, ".started")
		at, _ := os.ReadFile(s)
		raw, err := os.ReadFile(base + ".in")
		if err != nil {
			t.Fatal(err)
		}
		var in struct {
			Messages []struct {
				MessageID string `json:"message_id"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(raw, &in); err != nil {
			t.Fatalf("turn stdin %q: %v", raw, err)
		}
		var ids []string
		for _, m := range in.Messages {
			ids = append(ids, m.MessageID)
		}
		envRaw, _ := os.ReadFile(base + ".env")
		env := parseEnv(string(envRaw))
		if env["AGENTGATE_MESSAGE_ID"] != ids[len(ids)-1] || env["AGENTGATE_SESSION_KEY"] != key || env["AGENTGATE_TURN_ID"] != filepath.Base(base) {
			t.Errorf("turn for %v ran with message %q key %q turn %q", ids, env["AGENTGATE_MESSAGE_ID"], env["AGENTGATE_SESSION_KEY"], env["AGENTGATE_TURN_ID"])
		}
		turns = append(turns, turn{strings.TrimSpace(string(at)), ids})
	}
	slices.SortFunc(turns, func(a, b turn) int { return strings.Compare(a.at, b.at) })
	out := make([][]string, len(turns))
	for i, tr := range turns {
		out[i] = tr.ids
	}
	return out
}

// TestQueueCapOverflow floods one session with 10× its cap while a turn runs: with overflow
// spool nothing is lost and everything runs in order; with reject exactly the overflow is
// refused with an explicit answer.
func TestQueueCapOverflow(t *testing.T) {
	const capacity, sent = 5, 50
	for _, policy := range []string{"spool", "reject"} {
		t.Run(policy, func(t *testing.T) {
			release := make(chan struct{})
			agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
				if req.Identity.MessageID == "f00" {
					<-release
				}
				return &agents.Response{Text: req.Identity.MessageID}, nil
			})
			r := MustStart(t, agent, func(c *config.Config) {
				c.Sessions.Queue.Cap, c.Sessions.Queue.Overflow = capacity, policy
			})
			var accepted []string
			rejected := 0
			for i := range sent {
				id := fmt.Sprintf("f%02d", i)
				ack, err := r.fake.Inject(t.Context(), &platforms.Inbound{Source: dm, MessageID: id, Text: id})
				switch {
				case errors.Is(err, platforms.ErrRejected):
					rejected++
					if ack == nil || ack.Disposition != platforms.Rejected {
						t.Errorf("%s refused with ack %+v, want disposition rejected", id, ack)
					}
				case err != nil:
					t.Fatalf("Inject(%s): %v", id, err)
				default:
					accepted = append(accepted, id)
				}
			}
			close(release)
			want := sent
			if policy == "reject" {
				want = 1 + capacity // the running turn plus a full queue
			}
			if len(accepted) != want || rejected != sent-want {
				t.Errorf("accepted %d, rejected %d; want %d and %d", len(accepted), rejected, want, sent-want)
			}
			outs := r.waitSent(t, len(accepted))
			for i, o := range outs {
				if o.Text != accepted[i] {
					t.Fatalf("reply %d answers %s, want %s (in order, none lost)", i, o.Text, accepted[i])
				}
			}
		})
	}
}

// TestRestartRunsTheQueueInOrder: messages queued behind a turn when the daemon stops run in
// arrival order after the next start.
func TestRestartRunsTheQueueInOrder(t *testing.T) {
	dir := t.TempDir()
	ids := []string{"q0", "q1", "q2", "q3", "q4"}
	leaveUnanswered(t, dir, ids...)

	r2 := startOn(t, dir, time.Second, &recorder{})
	defer r2.stop(t)
	outs := r2.waitSent(t, len(ids))
	for i, o := range outs {
		if o.InReplyTo[0] != ids[i] {
			t.Errorf("after restart reply %d answers %v, want %s", i, o.InReplyTo, ids[i])
		}
	}
}

// steerer is an agent that takes steered messages. A first message "text:N" answers once N
// steered messages arrived; any other answers when gate closes. The reply joins every text it
// got and names the turn's sender.
type steerer struct{ gate chan struct{} }

func (s *steerer) CanSteer() bool { return true }

func (s *steerer) Run(ctx context.Context, req *agents.Request) (*agents.Response, error) {
	texts := []string{req.Messages[0].Text}
	var n int
	_, err := fmt.Sscanf(texts[0][strings.LastIndex(texts[0], ":")+1:], "%d", &n)
	for err != nil || len(texts)-1 < n {
		select {
		case m, ok := <-req.Steer:
			if !ok {
				break
			}
			texts = append(texts, m.Text)
			continue
		case <-s.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		break
	}
	return &agents.Response{Text: strings.Join(texts, "+") + " as " + req.Identity.UserID}, nil
}

// TestSteerIntoTheRunningTurn: with an agent that can steer, messages from the turn's own sender
// go into the running turn ("steered") and its one reply answers all of them. In a shared thread
// a message from another sender never joins someone else's turn: it waits ("queued"), and so
// does everything behind it.
func TestSteerIntoTheRunningTurn(t *testing.T) {
	gate := make(chan struct{})
	r := MustStart(t, &steerer{gate: gate}, func(c *config.Config) { c.Sessions.Queue.Mode = "steer" })
	thread := func(user string) identity.Source {
		return identity.Source{Platform: "fake", ChatType: identity.ChatThread, ChatID: "chan", ThreadID: "th", UserID: user, UserName: user}
	}
	send := func(msgs ...[3]string) []string {
		var got []string
		for _, m := range msgs {
			got = append(got, r.inject(t, thread(m[0]), m[1], m[2]).Disposition)
		}
		return got
	}
	got := send([3]string{"ann", "a0", "plan:2"}, [3]string{"ann", "a1", "more"}, [3]string{"ann", "a2", "done"})
	if want := []string{platforms.Started, platforms.Steered, platforms.Steered}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("dispositions %v, want %v", got, want)
	}
	outs := r.waitSent(t, 1)
	if o := outs[0]; o.Text != "[ann] plan:2+[ann] more+[ann] done as ann" || fmt.Sprint(o.InReplyTo) != "[a0 a1 a2]" {
		t.Errorf("steered turn answered %q to %v, want one reply to a0 a1 a2", o.Text, o.InReplyTo)
	}

	got = send([3]string{"ann", "x", "first"}, [3]string{"bob", "y", "mine"}, [3]string{"ann", "z", "again"})
	if want := []string{platforms.Started, platforms.Queued, platforms.Queued}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("dispositions %v, want %v", got, want)
	}
	close(gate)
	outs = r.waitSent(t, 4)
	var texts []string
	for _, o := range outs[1:] {
		texts = append(texts, o.Text)
	}
	if want := []string{"[ann] first as ann", "[bob] mine as bob", "[ann] again as ann"}; fmt.Sprint(texts) != fmt.Sprint(want) {
		t.Errorf("replies %q, want %q", texts, want)
	}
}

// TestDebounceMergesABurst: with a debounce window, rapid messages from one sender become one
// turn once the sender is quiet; another sender's message is not merged into it.
func TestDebounceMergesABurst(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tweak func(*config.Config)
	}{
		{"global window", func(c *config.Config) { c.Sessions.Queue.Debounce = time.Second }},
		{"window of this platform", func(c *config.Config) {
			c.Sessions.Queue.DebounceByPlatform = map[string]time.Duration{"fake": time.Second, "http": 0}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agent := &recorder{}
			r := MustStart(t, agent, tc.tweak)
			var got []string
			for _, id := range []string{"d1", "d2", "d3"} {
				got = append(got, r.inject(t, dm, id, id).Disposition)
			}
			if want := []string{platforms.Started, platforms.Collected, platforms.Collected}; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("dispositions %v, want %v", got, want)
			}
			outs := r.waitSent(t, 1)
			if fmt.Sprint(outs[0].InReplyTo) != "[d1 d2 d3]" {
				t.Errorf("the burst was answered by a turn for %v, want one turn for d1 d2 d3", outs[0].InReplyTo)
			}
			if req := agent.last(); len(req.Messages) != 3 || req.Identity.MessageID != "d3" {
				t.Errorf("the agent got %d messages for message id %s, want 3 for d3", len(req.Messages), req.Identity.MessageID)
			}
		})
	}
}

// TestQueueModeOverrideOutlivesPassivation: /queue sets the session's own mode, which it keeps
// after it passivates and comes back.
func TestQueueModeOverrideOutlivesPassivation(t *testing.T) {
	r := MustStart(t, &recorder{}, func(c *config.Config) { c.Sessions.PassivateAfter = 300 * time.Millisecond })
	r.inject(t, dm, "q1", "/queue collect")
	r.waitReplyTo(t, "q1")
	waitUntil(t, func() bool { return len(r.activeKeys(t)) == 0 })
	r.inject(t, dm, "q2", "/status")
	r.waitReplyTo(t, "q2")
	if out := r.fake.Sent(); !strings.Contains(out[len(out)-1].Text, "mode collect") {
		t.Errorf("/status after passivation says %q, want mode collect", out[len(out)-1].Text)
	}
}

// TestOldDuplicateInALongActivation: a session remembers only its most recent inbound ids in
// memory (actors' idSet); a re-delivery of a message it accepted long before in the same
// activation is still answered as a duplicate (by the store), never run again.
func TestOldDuplicateInALongActivation(t *testing.T) {
	const n = 1100 // more than the ids a session keeps in memory (idSetMax, 1,024)
	r := MustStart(t, echo.New(), nil)
	src := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "busy", UserID: "u"}
	for i := range n {
		if ack := r.inject(t, src, fmt.Sprint("m", i), fmt.Sprint("message ", i)); ack == nil || ack.Disposition == platforms.Duplicate {
			t.Fatalf("message %d: ack %+v, want it accepted", i, ack)
		}
	}
	r.waitSent(t, n)
	for _, id := range []string{"m0", "m1", fmt.Sprint("m", n-1)} { // forgotten, forgotten, remembered
		if ack := r.inject(t, src, id, "again"); ack == nil || ack.Disposition != platforms.Duplicate {
			t.Errorf("re-delivered %s: ack %+v, want disposition %s", id, ack, platforms.Duplicate)
		}
	}
	// A turn for a duplicate would run before this one's, in order.
	r.inject(t, src, "last", "last")
	sent := r.waitSent(t, n+1)
	if got := sent[n].InReplyTo; len(sent) != n+1 || len(got) != 1 || got[0] != "last" {
		t.Errorf("after the duplicates: %d replies, the last answering %v, want %d, [last]", len(sent), got, n+1)
	}
}

// TestInterruptedCommandEndsBeforeTheNextTurn: in queue mode interrupt, m2 cuts m1's turn
// short while m1's command runs; the command cleans up on SIGTERM for a moment before it
// exits. m2's command starts only after m1's has exited: a cancelled command never overlaps
// the next turn's (G2; before, m2's command started at once, beside m1's cleanup).
func TestInterruptedCommandEndsBeforeTheNextTurn(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log")
	script := fmt.Sprintf(`log=%q
echo "start $AGENTGATE_MESSAGE_ID" >> "$log"
if [ "$AGENTGATE_MESSAGE_ID" = m1 ]; then
	trap 'sleep 0.3; echo "end m1" >> "$log"; exit 0' TERM
	while :; do sleep 0.01; done
fi
echo "end $AGENTGATE_MESSAGE_ID" >> "$log"
echo done`, log)
	r := MustStart(t, MustExecAgent(t, script), func(c *config.Config) { c.Sessions.Queue.Mode = "interrupt" })
	r.inject(t, dm, "m1", "first")
	for ctx := t.Context(); ; {
		if b, _ := os.ReadFile(log); strings.Contains(string(b), "start m1") {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("m1's command never started")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if ack := r.inject(t, dm, "m2", "second"); ack.Disposition != platforms.Interrupted {
		t.Fatalf("m2: %s, want interrupted", ack.Disposition)
	}
	out := r.waitSent(t, 1)[0]
	if !slices.Equal(out.InReplyTo, []string{"m1", "m2"}) {
		t.Errorf("the reply answers %v, want [m1 m2]", out.InReplyTo)
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Split(strings.TrimSpace(string(b)), "\n"), []string{"start m1", "end m1", "start m2", "end m2"}; !slices.Equal(got, want) {
		t.Errorf("the commands ran %q, want %q", got, want)
	}
}
