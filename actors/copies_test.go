package actors

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
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
				dir, out, leaky, through := leakyParts(t)
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
				drainAfter(t, w, out, 2*time.Second) // the spool replayed
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

// scriptAgent answers every turn ("answered <message id>"), fails the turns of "fail" and
// declines, as a model endpoint's content policy does (agents.Refusal.Declined), those of
// "#policy"; it records each turn's history by its message id.
type scriptAgent struct {
	mu      sync.Mutex
	history map[string][]agents.Message
}

func (a *scriptAgent) Run(_ context.Context, req *agents.Request) (*agents.Response, error) {
	a.mu.Lock()
	if a.history == nil {
		a.history = map[string][]agents.Message{}
	}
	a.history[req.Identity.MessageID] = req.History
	a.mu.Unlock()
	switch req.Messages[len(req.Messages)-1].Text {
	case "fail":
		return nil, errors.New("agent: exit status 1 (test)")
	case "#policy":
		return nil, &agents.Refusal{Notice: "its model endpoint declined this message (its content policy)", Declined: true,
			Err: errors.New("model endpoint answered 400 Bad Request: safety system (test)")}
	}
	return &agents.Response{Text: "answered " + req.Identity.MessageID}, nil
}

// historyOf returns the texts of the user messages of the history the turn of message id saw.
func (a *scriptAgent) historyOf(id string) (texts []string, ran bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	h, ran := a.history[id]
	for _, m := range h {
		if m.Role == persistence.RoleUser {
			texts = append(texts, m.Text)
		}
	}
	return texts, ran
}

// spoolTwice delivers id (text) while the database fails, first through the leaky spool, which
// keeps the write and reports it failed, then again, as its sender sends it, under a later seq:
// its write is in the spool twice. It returns the second delivery's result.
func spoolTwice(t *testing.T, w *managerWorld, out *storetest.Outage, leaky *leakySpool, id, text string) *DeliverResult {
	t.Helper()
	out.Down.Store(true)
	leaky.leak.Store(true)
	if r := w.deliver(t, id, text); r.ErrorCode != "unavailable" {
		t.Fatalf("%s, whose spool append is reported failed: %+v, want unavailable", id, r)
	}
	leaky.leak.Store(false)
	r := w.deliver(t, id, text)
	if r.ErrorCode != "" {
		t.Fatalf("%s sent again: %+v, want it taken", id, r)
	}
	return r
}

// TestRewindOfAMessageSpooledTwiceTakesBackItsStoredCopy: a message whose write is in the spool
// twice (spoolTwice), which ran from memory under its later seq, is taken back from the
// conversation by /undo, by /retry (which runs its text again under the /retry's id) and, as a
// rider of a turn the agent declined after its own turn failed, by the declined turn's notice:
// the archive covers the earlier copy's seq, the one the replay stored. After a restart its row
// is archived and the next turn's history does not hold it (once, for /retry: the retried
// row). Before, the archive named the later seq only, which the database never held: the
// message the user took back came back in the conversation at the next load, and the declined
// rider was sent to the agent again.
func TestRewindOfAMessageSpooledTwiceTakesBackItsStoredCopy(t *testing.T) {
	for _, how := range []string{"/undo", "/retry", "declined"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir, out, leaky, through := leakyParts(t)
				a := &scriptAgent{}
				w, _ := spoolWorldThrough(t, dir, out, a, through)
				w.deliver(t, "m0", "m0")
				w.awaitTurnEnds(1)
				text := "x"
				if how == "declined" {
					text = "fail"
				}
				if r := spoolTwice(t, w, out, leaky, "x", text); r.Disposition != platforms.Started {
					t.Fatalf("x sent again: %+v, want started", r)
				}
				w.awaitTurnEnds(1)
				switch how {
				case "declined":
					w.deliver(t, "d", "#policy")
					if got := w.answerTo("d"); !strings.Contains(got, "with the earlier message sent along with it") {
						t.Fatalf("d answered %q, want the notice of a declined turn with x its rider", got)
					}
				case "/retry":
					mustCommand(t, w, "c1", how)
					if got := w.answerTo("c1"); got != "answered c1" {
						t.Fatalf("/retry answered %q, want its turn's answer", got)
					}
				default:
					mustCommand(t, w, "c1", how)
				}
				drainAfter(t, w, out, 2*time.Second) // the spool replayed
				w.stop()
				synctest.Wait()

				w, _ = spoolWorldThrough(t, dir, out, a, through)
				w.deliver(t, "w", "w")
				w.answerTo("w")
				got, ran := a.historyOf("w")
				if !ran {
					t.Fatal("w did not run after the restart")
				}
				want := []string{"m0"}
				if how == "/retry" {
					want = append(want, text) // the retried row, once
				}
				if !slices.Equal(got, want) {
					t.Errorf("the user messages w's turn saw after the restart = %q, want %q", got, want)
				}
				if m := w.rowOf(t, "x"); m.Active || !m.Archived {
					t.Errorf("x's row after %s = %+v, want archived, out of the conversation", how, m)
				}
			})
		})
	}
}

// TestMessageSpooledTwiceThatCrashesItsSessionIsQuarantinedOnce: a message whose write is in
// the spool twice (spoolTwice) and whose turn crashes its session every time is quarantined
// after QuarantineAfter crashes, as any other, and answered once, by the quarantine notice;
// the session goes on. Before, the crash of its later copy's turn was counted under the later
// seq, which the session, loaded again from the store once the spool drained, did not hold: the
// earlier copy's row counted from zero, the fourth crash was past the session's restart budget,
// the key's next activation counted from zero again, and the message ran 7 times.
func TestMessageSpooledTwiceThatCrashesItsSessionIsQuarantinedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir, out, leaky, through := leakyParts(t)
		a := newRequeueAgent()
		booms := &boomCounter{Agent: a}
		w, _ := spoolWorldThrough(t, dir, out, booms, through)
		w.deliver(t, "m0", "m0")
		w.awaitTurnEnds(1)
		a.poisoned.Store(true)
		if r := spoolTwice(t, w, out, leaky, "x", "boom"); r.Disposition != platforms.Started {
			t.Fatalf("x sent again: %+v, want started", r)
		}
		synctest.Wait()                    // its turn crashed the session, which waits for the spool to load
		drainAfter(t, w, out, time.Minute) // the spool replayed; the session loaded and ran x again
		if n := booms.n.Load(); n != QuarantineAfter {
			t.Errorf("x ran %d times, want %d (QuarantineAfter)", n, QuarantineAfter)
		}
		if m := w.rowOf(t, "x"); m.Status != persistence.StatusQuarantined {
			t.Errorf("x's row = %+v, want quarantined", m)
		}
		if got := w.answersStored(t, "x"); len(got) != 1 || !strings.Contains(got[0], "quarantined") {
			t.Errorf("x answered %q, want once, by the quarantine notice", got)
		}
		a.poisoned.Store(false)
		if r := w.deliver(t, "y", "y"); r.Disposition != platforms.Started {
			t.Fatalf("y after the quarantine: %+v, want started", r)
		}
		if got := w.answerTo("y"); got != "answered y" {
			t.Errorf("y answered %q, want its turn's answer", got)
		}
	})
}

// boomCounter counts the turns of "boom" its Agent is given.
type boomCounter struct {
	agents.Agent
	n atomic.Int32
}

func (b *boomCounter) Run(ctx context.Context, req *agents.Request) (*agents.Response, error) {
	if req.Messages[len(req.Messages)-1].Text == "boom" {
		b.n.Add(1)
	}
	return b.Agent.Run(ctx, req)
}

// TestMessageSpooledTwiceRunningAtAStopIsNoticedOnce: a message whose write is in the spool twice
// (spoolTwice), whose later copy's turn ran when the daemon stopped, is answered once at the
// next start under sessions.recovery: notice, by the notice that it may have run, and does not
// run; its row is failed and out of the conversation, and a start after that answers nothing
// more.
func TestMessageSpooledTwiceRunningAtAStopIsNoticedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir, out, leaky, through := leakyParts(t)
		a := newRequeueAgent()
		w, _ := spoolWorldThrough(t, dir, out, a, through)
		w.deliver(t, "m0", "m0")
		w.awaitTurnEnds(1)
		if r := spoolTwice(t, w, out, leaky, "x", "hold"); r.Disposition != platforms.Started {
			t.Fatalf("x sent again: %+v, want started", r)
		}
		w.stop() // x's turn is cut short; both its writes wait in the spool
		synctest.Wait()
		out.Down.Store(false)

		for _, recovery := range []string{RecoveryNotice, RecoveryRerun} {
			b := newRequeueAgent()
			close(b.hold)
			w, _ = spoolWorldThrough(t, dir, out, b, through, func(d *Deps) { d.Config.Recovery = recovery })
			w.system.Root.Send(w.manager, &Routed{Key: w.key, Msg: &Recover{}})
			time.Sleep(10 * time.Second)
			synctest.Wait()
			if w.d.Spooling.Load() {
				t.Fatal("the spool did not drain")
			}
			if got := b.order(); len(got) > 0 {
				t.Errorf("turns run at the start (recovery: %s) = %v, want none", recovery, got)
			}
			if got := w.answersStored(t, "x"); !slices.Equal(got, []string{MayHaveRunNotice}) {
				t.Errorf("x answered %q after the start (recovery: %s), want once, by the notice that it may have run", got, recovery)
			}
			if m := w.rowOf(t, "x"); m.Status != persistence.StatusFailed || m.Active || !m.Archived {
				t.Errorf("x's row = %+v after the start (recovery: %s), want failed and archived", m, recovery)
			}
			w.stop()
			synctest.Wait()
		}
	})
}

// TestFailedMessageSpooledTwiceKeepsItsPlaceAfterAReload: a message whose first write went to
// the spool though the spool reported it failed, and which its sender sent again only after
// another message (y) had run, is stored under its first write's seq, before y's rows (the
// replay refuses the later copy as its duplicate). Reloaded, the conversation is in the order
// the live session had it: y's exchange, then the message, whether its turn answered it (its
// row moves to its answer) or failed (to its turn's notice). Before, a failed one came back
// ahead of y's exchange, where it had not been: the agent saw it before y, and it no longer
// rode with the next message.
func TestFailedMessageSpooledTwiceKeepsItsPlaceAfterAReload(t *testing.T) {
	for _, tc := range []struct{ text, reload string }{{"x", "restart"}, {"fail", "restart"}, {"x", "/resume"}, {"fail", "/resume"}} {
		text := tc.text
		t.Run(text+" "+tc.reload, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir, out, leaky, through := leakyParts(t)
				a := &scriptAgent{}
				w, _ := spoolWorldThrough(t, dir, out, a, through)
				w.deliver(t, "m0", "m0")
				w.awaitTurnEnds(1)
				out.Down.Store(true)
				leaky.leak.Store(true)
				if r := w.deliver(t, "x", text); r.ErrorCode != "unavailable" {
					t.Fatalf("x, whose spool append is reported failed: %+v, want unavailable", r)
				}
				leaky.leak.Store(false)
				w.deliver(t, "y", "y")
				w.answerTo("y")
				if r := w.deliver(t, "x", text); r.Disposition != platforms.Started {
					t.Fatalf("x sent again: %+v, want started", r)
				}
				w.answerTo("x")
				r := w.deliver(t, "v", "v")
				w.answerTo("v")
				drainAfter(t, w, out, 2*time.Second) // the spool replayed
				if tc.reload == "/resume" {
					mustCommand(t, w, "n1", "/new")
					mustCommand(t, w, "r1", "/resume "+r.SessionId)
				} else {
					w.stop()
					synctest.Wait()
					w, _ = spoolWorldThrough(t, dir, out, a, through)
				}
				w.deliver(t, "w", "w")
				w.answerTo("w")
				a.mu.Lock()
				live, reloaded := a.history["v"], a.history["w"]
				a.mu.Unlock()
				texts := func(h []agents.Message) (out []string) {
					for _, m := range h {
						out = append(out, m.Role+": "+m.Text)
					}
					return out
				}
				want := append(texts(live), "user: v", "assistant: answered v")
				if got := texts(reloaded); !slices.Equal(got, want) {
					t.Errorf("the history w's turn saw after the reload = %q, want the live one's order %q", got, want)
				}
			})
		})
	}
}

// slowBoom panics on "boom" a while after its turn begins (as an agent that crashes after
// some work does), so that crashes are spread out within the session's restart budget; it
// counts each message's runs of "boom".
type slowBoom struct {
	mu   sync.Mutex
	runs map[string]int
}

func (b *slowBoom) Run(ctx context.Context, req *agents.Request) (*agents.Response, error) {
	if req.Messages[len(req.Messages)-1].Text != "boom" {
		return &agents.Response{Text: "answered " + req.Identity.MessageID}, nil
	}
	b.mu.Lock()
	if b.runs == nil {
		b.runs = map[string]int{}
	}
	b.runs[req.Identity.MessageID]++
	b.mu.Unlock()
	select {
	case <-time.After(40 * time.Second):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	panic("agent bug on " + req.Identity.MessageID)
}

func (b *slowBoom) runsOf(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runs[id]
}

// TestCrashOfACopyIsNotChargedToTheNextMessageOfItsSeq: a message whose write is in the spool
// twice (spoolTwice) and whose turn crashes its session is loaded again under the seq the
// replay stored, the earlier copy's; the later seq, which the replay refused as a duplicate,
// is the next one the session numbers. A message sent meanwhile (y) takes it, and when its
// own turn crashes the session it is quarantined after QuarantineAfter runs, as any other.
// Before, the first crash of x's later copy was counted under both seqs, the later one's count
// stayed, and y inherited it: quarantined after QuarantineAfter-1 runs.
func TestCrashOfACopyIsNotChargedToTheNextMessageOfItsSeq(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir, out, leaky, through := leakyParts(t)
		b := &slowBoom{}
		w, _ := spoolWorldThrough(t, dir, out, b, through)
		w.deliver(t, "m0", "m0")
		w.awaitTurnEnds(1)
		if r := spoolTwice(t, w, out, leaky, "x", "boom"); r.Disposition != platforms.Started {
			t.Fatalf("x sent again: %+v, want started", r)
		}
		time.Sleep(45 * time.Second) // its turn crashed the session, which waits for the spool to load
		synctest.Wait()
		drainAfter(t, w, out, 5*time.Second) // the spool replayed; the session loaded and runs x again
		if r := w.deliver(t, "y", "boom"); r.Disposition != platforms.Queued {
			t.Fatalf("y while x runs again: %+v, want queued", r)
		}
		time.Sleep(10 * time.Minute) // x quarantined; y runs until it is quarantined
		synctest.Wait()
		if n := b.runsOf("x"); n != QuarantineAfter {
			t.Errorf("x ran %d times, want %d (QuarantineAfter)", n, QuarantineAfter)
		}
		if n := b.runsOf("y"); n != QuarantineAfter {
			t.Errorf("y ran %d times before its quarantine, want %d (QuarantineAfter)", n, QuarantineAfter)
		}
		for _, id := range []string{"x", "y"} {
			if m := w.rowOf(t, id); m.Status != persistence.StatusQuarantined {
				t.Errorf("%s's row = %+v, want quarantined", id, m)
			}
		}
	})
}

// drainAfter lets the store of w answer again (out) and fails unless the spool drained within
// d of the bubble's time.
func drainAfter(t *testing.T, w *managerWorld, out *storetest.Outage, d time.Duration) {
	t.Helper()
	out.Down.Store(false)
	time.Sleep(d)
	synctest.Wait()
	if w.d.Spooling.Load() {
		t.Fatal("the spool did not drain")
	}
}

// leakyParts returns what a world whose spool may keep a batch it reports failed is built of
// (spoolWorldThrough): its data directory, the store's outage switch, the leaky spool, and the
// wrap that puts the leaky spool around the world's.
func leakyParts(t *testing.T) (dir string, out *storetest.Outage, leaky *leakySpool,
	through func(persistence.Spooler) persistence.Spooler) {
	leaky = &leakySpool{}
	return t.TempDir(), &storetest.Outage{}, leaky, func(s persistence.Spooler) persistence.Spooler { leaky.Spooler = s; return leaky }
}
