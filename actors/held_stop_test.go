package actors

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
)

// TestStopWhileAResetIsHeldRunsItsMessageAgain: an idle reset falls due while m1's turn runs
// and is written as the turn ends, behind its result; the store refuses both (a full disk: from
// the result on, or from the turn's start, when the reset's due mark is refused too), and the
// daemon stops before it takes them (a drain's deadline). At the next start m1 is pending in a
// session whose reset is due: it runs again there and is answered (at least once, as any held
// result lost at a stop), and the session ends at its due time after it; the next message
// begins the next session. With sessions.recovery: notice m1 is answered with the notice that
// it may have been partly run. Never with "it was not run": before f84ed38 the start ended the
// session at once and set m1 aside, archived, with "could not be answered before the session
// was reset (idle), so it was not run", though its agent had run (the forty-second session's
// notes).
func TestStopWhileAResetIsHeldRunsItsMessageAgain(t *testing.T) {
	for _, tc := range []struct {
		fill   string // when the disk fills: at m1's "result", or as its "turn" runs
		notice bool   // sessions.recovery: notice
	}{{"result", false}, {"turn", false}, {"result", true}} {
		t.Run(fmt.Sprintf("fill=%s,notice=%v", tc.fill, tc.notice), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "agentgate.db")
				gate := make(chan struct{})
				echo, ran := countingEcho()
				out := &storetest.Outage{}
				agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
					if req.Identity.MessageID == "m1" && ran("m1") == 0 {
						if tc.fill == "turn" {
							out.Down.Store(true)
						}
						<-gate
					}
					return echo.Run(ctx, req)
				})
				idle := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Second, Notify: true}
				setup := func(d *Deps) {
					d.Config.ResetFor = func(string, string) ResetPolicy { return idle }
					d.Config.ResetPolicies = []ResetPolicy{idle}
					if tc.notice {
						d.Config.Recovery = RecoveryNotice
					}
				}
				disk := &fullDisk{left: 1 << 20, result: resultOf("m1")} // never takes it
				w := newManagerWorldWith(t, path, agent, setup, func(s persistence.Store) persistence.Store {
					if tc.fill == "turn" {
						out.Store = s
						return out
					}
					disk.Store = s
					return disk
				})
				m1 := w.deliver(t, "m1", "one")
				if m1.Disposition != platforms.Started {
					t.Fatalf("m1: %+v, want started", m1)
				}
				time.Sleep(time.Minute) // the turn runs past the idle time
				w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &ResetDue{}})
				synctest.Wait() // due, but the session works: the reset waits for the turn
				close(gate)
				time.Sleep(5 * time.Second) // m1's result and the reset behind it are refused, and held
				synctest.Wait()
				if r := w.deliver(t, "m2", "two"); r.ErrorCode != ErrCodeUnavailable {
					t.Fatalf("m2 while the reset is held: %+v, want it refused (the test does not test)", r)
				}
				if len(w.sent) > 0 {
					t.Fatalf("the platform was sent %q before the stop, want nothing (the test does not test)", (<-w.sent).Out.Text)
				}
				w.stop() // the drain's deadline

				w2 := newManagerWorldAt(t, path, agent, setup)
				synctest.Wait() // the start recovers the session: m1 runs again, or is answered with a notice
				var sent []string
				for len(w2.sent) > 0 {
					sent = append(sent, (<-w2.sent).Out.Text)
				}
				wantRuns, wantSent, wantStatus := 2, "echo: one", persistence.StatusDone
				if tc.notice {
					wantRuns, wantSent, wantStatus = 1, MayHaveRunNotice, persistence.StatusFailed
				}
				if n := ran("m1"); n != wantRuns {
					t.Errorf("the agent ran m1 %d times, want %d", n, wantRuns)
				}
				if !slices.Equal(sent, []string{wantSent}) {
					t.Errorf("after the restart the platform was sent %q, want [%q]", sent, wantSent)
				}
				for _, s := range sent {
					if strings.Contains(s, "not run") {
						t.Errorf("m1, whose agent ran, was answered %q", s)
					}
				}
				if st, _ := w2.statusOf(t, "m1"); st != wantStatus {
					t.Errorf("m1 is %s, want %s", st, wantStatus)
				}
				sess, err := w2.store.Session(w2.ctx, m1.SessionId)
				if err != nil {
					t.Fatal(err)
				}
				if sess.EndReason != persistence.EndIdle || !sess.EndedAt.Equal(sess.StartedAt.Add(idle.Idle)) {
					t.Errorf("m1's session ended at %v (%q), want by its idle reset at its due time, %v",
						sess.EndedAt, sess.EndReason, sess.StartedAt.Add(idle.Idle))
				}
				ms, err := w2.store.Transcript(w2.ctx, m1.SessionId)
				if err != nil {
					t.Fatal(err)
				}
				last := ms[len(ms)-1]
				if wantRole := map[bool]string{false: persistence.RoleAssistant, true: persistence.RoleNotice}[tc.notice]; len(ms) != 2 ||
					last.Role != wantRole || last.Content != wantSent {
					t.Errorf("m1's session holds %d rows, the last %s %q; want m1 and its answer (%s %q)", len(ms), last.Role, last.Content, wantRole, wantSent)
				}

				r := w2.deliver(t, "m2", "two") // sent again
				if r.ErrorCode != "" || r.SessionId == m1.SessionId {
					t.Fatalf("m2 sent again: %+v, want it taken in a new session (not %s)", r, m1.SessionId)
				}
				synctest.Wait()
				if n := ran("m2"); n != 1 {
					t.Errorf("the agent ran m2 %d times, want once", n)
				}
			})
		})
	}
}
