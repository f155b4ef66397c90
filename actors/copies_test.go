package actors

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/storetest"
	"github.com/agentgate/agentgate/platforms"
)

// answersStored returns the texts of the outbox's entries that answer the world's message id,
// in order.
func (w *managerWorld) answersStored(t *testing.T, id string) []string {
	t.Helper()
	out, err := w.store.OutboxAfter(w.ctx, w.key, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, e := range out {
		if slices.Contains(e.InReplyTo, id) {
			texts = append(texts, e.Text)
		}
	}
	return texts
}

// TestMessageSpooledTwiceIsAnsweredOnce: a message whose first write went to the spool though
// the spool reported it failed (its sender told it was not stored), sent again and spooled
// again under a later seq while the database fails, is answered once: when the later copy runs
// from memory, when /stop or /new drops it without running it, and when, in interrupt mode, a
// newer message cuts its turn short and the newer one's answer answers it, the write that marks
// it (done; failed and archived; failed) covers the earlier copy's seq too, which the spool's
// replay stores while it refuses the later copy as its duplicate. After a restart nothing
// answers it again, and its row is done (it ran), failed and archived (dropped), or failed with
// the turn cut short. Before, that write
// marked the later seq only, which the database never held: the earlier copy stayed pending,
// and the restart ran it and answered it a second time (a message /stop had dropped, its sender
// told so, answered after all), or, left in the session /new ended, set it aside with a second
// notice.
func TestMessageSpooledTwiceIsAnsweredOnce(t *testing.T) {
	for _, command := range []string{"", "/stop", "/new", "/queue interrupt"} {
		t.Run(fmt.Sprintf("command=%q", command), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir := t.TempDir()
				out := &storetest.Outage{}
				leaky := &leakySpool{}
				through := func(s persistence.Spooler) persistence.Spooler { leaky.Spooler = s; return leaky }
				a := newRequeueAgent()
				w, _ := spoolWorldThrough(t, dir, out, a, through)
				text := "x"
				switch command {
				case "/stop", "/new":
					if r := w.deliver(t, "m0", "hold"); r.Disposition != platforms.Started {
						t.Fatalf("m0: %+v, want started", r)
					}
				case "/queue interrupt":
					w.command(t, "c0", command)
					text = "hold"
					fallthrough
				default:
					w.deliver(t, "m0", "m0")
					w.awaitTurnEnds(1)
				}
				out.Down.Store(true)
				leaky.leak.Store(true)
				if r := w.deliver(t, "x", text); r.ErrorCode != "unavailable" {
					t.Fatalf("x, whose spool append is reported failed: %+v, want unavailable", r)
				}
				leaky.leak.Store(false)
				want := platforms.Started
				if command == "/stop" || command == "/new" {
					want = platforms.Queued
				}
				if r := w.deliver(t, "x", text); r.Disposition != want || r.ErrorCode != "" {
					t.Fatalf("x sent again: %+v, want %s", r, want)
				}
				switch command {
				case "/stop", "/new":
					w.command(t, "c1", command)
				case "/queue interrupt":
					if r := w.deliver(t, "y", "y"); r.Disposition != platforms.Interrupted {
						t.Fatalf("y: %+v, want interrupted", r)
					}
					w.awaitTurnEnds(1)
				default:
					w.awaitTurnEnds(1)
				}
				out.Down.Store(false)
				time.Sleep(2 * time.Second) // the spool replayed
				synctest.Wait()
				if w.d.Spooling.Load() {
					t.Fatal("the spool did not drain")
				}
				w.stop()
				synctest.Wait()

				a = newRequeueAgent()
				close(a.hold)
				w, _ = spoolWorldThrough(t, dir, out, a, through)
				w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &Recover{}})
				time.Sleep(10 * time.Second)
				synctest.Wait()
				if got := a.order(); slices.Contains(got, "x") {
					t.Errorf("turns run after the restart = %v, want none of x", got)
				}
				answers := w.answersStored(t, "x")
				m := w.rowOf(t, "x")
				switch command {
				case "/stop", "/new":
					if len(answers) != 1 || answers[0] == "answered x" {
						t.Errorf("x, dropped by %s, answered %q, want by the command's notice alone", command, answers)
					}
					if m.Status != persistence.StatusFailed || m.Active || !m.Archived {
						t.Errorf("x's row = %+v, want failed and archived", m)
					}
				case "/queue interrupt":
					if !slices.Equal(answers, []string{"answered y"}) {
						t.Errorf("x, cut short by y, answered %q, want once, by y's turn", answers)
					}
					if m.Status != persistence.StatusFailed || !m.Active || m.TurnID == "" {
						t.Errorf("x's row = %+v, want failed, with the turn cut short, in the conversation", m)
					}
				default:
					if !slices.Equal(answers, []string{"answered x"}) {
						t.Errorf("x answered %q, want once, by its turn", answers)
					}
					if m.Status != persistence.StatusDone {
						t.Errorf("x's row = %+v, want done", m)
					}
				}
			})
		})
	}
}

// TestCopyOfAWriteRefusedBeforeAResumeMarksNoOtherMessage: a message whose write the store
// refused (x, at seq 5 of session A) and which its sender sends again after /new and /resume A
// has its copy's seq remembered (noteCopy), but that seq is not its own any more: the resume
// numbered A's rows after the last one stored, which the refused write is not, and gave it to
// the next message (z). The writes that give x a final status, or withdraw it, cover the
// copy's seq (seqsOf, itemSeqs): they marked z's row with x's outcome, x's turn id on z's
// answered row, or z's row archived by x's withdrawal while z ran (gone from the conversation
// at the next load). Now the resume numbers A's rows after those of this activation's refused
// writes too, so no other message is given a seq a copy names.
func TestCopyOfAWriteRefusedBeforeAResumeMarksNoOtherMessage(t *testing.T) {
	for _, withdraw := range []bool{false, true} {
		t.Run(fmt.Sprint("withdraw=", withdraw), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				out := &storetest.Outage{}
				a := newRequeueAgent()
				w := newManagerWorldWith(t, filepath.Join(t.TempDir(), "agentgate.db"), a, nil, out.Wrap)
				r := w.deliver(t, "m0", "m0") // seqs 1 and 2 of A
				sid := r.SessionId
				w.awaitTurnEnds(1)
				out.Down.Store(true)
				for _, id := range []string{"f1", "f2", "x"} { // seqs 3, 4 and 5, refused
					if r := w.deliver(t, id, id); r.ErrorCode != "unavailable" {
						t.Fatalf("%s in the outage: %+v, want unavailable", id, r)
					}
				}
				out.Down.Store(false)
				mustCommand(t, w, "n1", "/new")
				mustCommand(t, w, "r1", "/resume "+sid) // its rows: 3 and 4
				if r := w.deliver(t, "z", "hold"); r.Disposition != platforms.Started || r.SessionId != sid {
					t.Fatalf("z: %+v, want started in %s", r, sid)
				}
				if r := w.deliver(t, "x", "x"); r.Disposition != platforms.Queued || r.ErrorCode != "" {
					t.Fatalf("x sent again: %+v, want queued", r)
				}
				if withdraw {
					if r := w.withdraw(t, "x"); !r.Withdrawn || r.Error != "" {
						t.Fatalf("withdrawal of x = %+v, want withdrawn", r)
					}
				}
				close(a.hold)
				if withdraw {
					w.awaitTurnEnds(1)
				} else {
					w.awaitTurnEnds(2)
				}
				synctest.Wait()
				z := w.rowOf(t, "z")
				if z.Status != persistence.StatusDone || !z.Active || z.Archived || z.TurnID == "" {
					t.Errorf("z's row = %+v, want done, in the conversation", z)
				}
				if x := w.rowOf(t, "x"); !withdraw && x.TurnID == z.TurnID {
					t.Errorf("z's row has x's turn id %s: x's result marked it", x.TurnID)
				}
				if got := w.answersStored(t, "z"); !slices.Equal(got, []string{"answered z"}) {
					t.Errorf("z answered %q, want once, by its turn", got)
				}
			})
		})
	}
}
