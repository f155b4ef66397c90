package supervisor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// startOn starts a daemon on dataDir with agent and a fresh fake platform; the test stops it.
func startOn(t *testing.T, dataDir string, drain time.Duration, agent agents.Agent, tweaks ...func(*config.Config)) *runtime {
	t.Helper()
	return MustStartDaemon(t, agent, daemonOpts{dir: dataDir, drain: drain, tweak: func(c *config.Config) {
		for _, f := range tweaks {
			f(c)
		}
	}})
}

func (r *runtime) stop(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.d.Stop(ctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
}

var dm = identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1", UserID: "u1"}

// TestDrainLetsRunningTurnsFinish: on stop, intake refuses new messages at once while a running
// turn finishes and its reply is delivered before the daemon exits.
func TestDrainLetsRunningTurnsFinish(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		if req.Identity.ChatID == "probe" {
			return &agents.Response{Text: "probe"}, nil
		}
		close(started)
		<-release
		return &agents.Response{Text: "finished"}, nil
	})
	r := startOn(t, t.TempDir(), 30*time.Second, agent)
	r.inject(t, dm, "m1", "work")
	<-started
	stopped := make(chan struct{})
	go func() { r.stop(t); close(stopped) }()
	probe := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "probe", UserID: "u"}
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		_, err := r.fake.Inject(t.Context(), &platforms.Inbound{Source: probe, MessageID: fmt.Sprint("p", i), Text: "late"})
		if errors.Is(err, platforms.ErrDraining) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("intake still accepts messages while draining (last error %v)", err)
		}
	}
	close(release)
	<-stopped
	var work []string
	for _, o := range r.fake.Sent() {
		if o.Target.ChatID == "c1" {
			work = append(work, o.Text)
		}
	}
	if len(work) != 1 || work[0] != "finished" {
		t.Errorf("replies to the running turn = %q, want [finished]", work)
	}
}

// TestDrainDeadlineCancelsTurnsAndRecoveryRerunsThem: a turn still running at the drain deadline
// is cancelled; its message stays pending in the store, and the next start answers it without
// waiting for traffic.
func TestDrainDeadlineCancelsTurnsAndRecoveryRerunsThem(t *testing.T) {
	dir := t.TempDir()
	ack := leaveUnanswered(t, dir, "m1")[0]

	echo := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		return &agents.Response{Text: "answered " + req.Identity.MessageID + " in " + req.Identity.SessionID}, nil
	})
	r2 := startOn(t, dir, time.Second, echo)
	defer r2.stop(t)
	outs := r2.waitSent(t, 1)
	if want := "answered m1 in " + ack.SessionID; outs[0].Text != want {
		t.Errorf("after restart sent %q, want %q", outs[0].Text, want)
	}
	msgs, err := r2.d.store.Transcript(t.Context(), ack.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) < 2 || msgs[0].Status != persistence.StatusDone || msgs[1].Role != persistence.RoleAssistant {
		t.Errorf("transcript after recovery = %+v, want m1 done and the reply", msgs)
	}
}

// TestRecoveryNoticeMode: with sessions.recovery: notice, a message left unanswered by the last
// run is not run again; its sender gets a notice and the row is marked failed.
func TestRecoveryNoticeMode(t *testing.T) {
	dir := t.TempDir()
	ack := leaveUnanswered(t, dir, "m1")[0]

	ran := make(chan string, 1)
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		ran <- req.Identity.MessageID
		return &agents.Response{Text: "ran"}, nil
	})
	r2 := startOn(t, dir, time.Second, agent, func(c *config.Config) { c.Sessions.Recovery = "notice" })
	defer r2.stop(t)
	outs := r2.waitSent(t, 1)
	if outs[0].Kind != platforms.KindNotice || outs[0].InReplyTo[0] != "m1" || !strings.Contains(outs[0].Text, "restarted") {
		t.Errorf("after restart sent %+v, want a restart notice for m1", outs[0])
	}
	select {
	case id := <-ran:
		t.Errorf("agent ran %s; notice mode must not run left-over messages", id)
	default:
	}
	msgs, err := r2.d.store.Transcript(t.Context(), ack.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) == 0 || msgs[0].Status != persistence.StatusFailed {
		t.Errorf("transcript = %+v, want m1 marked failed", msgs)
	}
}

// TestUnconfirmedRepliesAreResentAfterRestart: a reply the platform could not deliver stays in
// the outbox; the next start re-sends it without any new traffic.
func TestUnconfirmedRepliesAreResentAfterRestart(t *testing.T) {
	dir := t.TempDir()
	r := startOn(t, dir, time.Second, echo.New())
	r.fake.SetSendError(errors.New("platform down"))
	ack := r.inject(t, dm, "m1", "keep me")
	waitUntil(t, func() bool {
		return testutil.ToFloat64(r.d.metrics.OutboundTotal.WithLabelValues("fake", "error")) >= 1
	})
	r.stop(t)
	if n := len(r.fake.Sent()); n != 0 {
		t.Fatalf("failing platform recorded %d sends", n)
	}

	r2 := startOn(t, dir, time.Second, echo.New())
	defer r2.stop(t)
	outs := r2.waitSent(t, 1)
	if outs[0].Text != "keep me" || outs[0].InReplyTo[0] != "m1" || outs[0].SessionID != ack.SessionID {
		t.Errorf("re-sent %+v, want the echo of m1 in %s", outs[0], ack.SessionID)
	}
	waitUntil(t, func() bool {
		es, err := r2.d.store.OutboxAfter(t.Context(), ack.SessionKey, 0, 10)
		return err == nil && len(es) == 1 && es[0].State == persistence.DeliveryDelivered
	})
}

// leaveUnanswered runs a daemon on dir whose agent never answers, sends ids to one session and
// stops it at a short drain deadline: the messages stay durable and unanswered.
func leaveUnanswered(t *testing.T, dir string, ids ...string) []*platforms.Ack {
	t.Helper()
	stuck := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	r := startOn(t, dir, 100*time.Millisecond, stuck)
	var acks []*platforms.Ack
	for _, id := range ids {
		acks = append(acks, r.inject(t, dm, id, "please answer "+id))
	}
	r.stop(t)
	if sent := r.fake.Sent(); len(sent) != 0 {
		t.Fatalf("a cancelled turn delivered %+v", sent)
	}
	return acks
}

// TestDrainDeadlineSaysWhatItCancels: when the drain deadline passes, the log says how many
// sessions still had work in hand and which, since their turns are cancelled, and what becomes
// of their messages as sessions.recovery says: they run again at the next start, or are
// answered there with a notice. Before, the line said they run again also with recovery: notice.
func TestDrainDeadlineSaysWhatItCancels(t *testing.T) {
	stuck := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	for _, tc := range []struct{ recovery, says, never string }{
		{"rerun", "their messages stay pending and run again at the next start", "notice"},
		{"notice", "their messages stay pending and are answered at the next start with a notice instead of run (sessions.recovery: notice)", "run again"},
	} {
		t.Run(tc.recovery, func(t *testing.T) {
			logs := &logSignal{}
			r := MustStartDaemon(t, stuck, daemonOpts{drain: 100 * time.Millisecond, logs: logs,
				tweak: func(c *config.Config) { c.Sessions.Recovery = tc.recovery }})
			ack := r.inject(t, dm, "m1", "never answered")
			r.stop(t)
			var line string
			for l := range strings.SplitSeq(logs.String(), "\n") {
				if strings.Contains(l, "drain deadline passed") {
					line = l
				}
			}
			if !strings.Contains(line, "sessions=1") || !strings.Contains(line, ack.SessionKey) {
				t.Errorf("the drain deadline's log line %q, want the one session with work in hand (%s)", line, ack.SessionKey)
			}
			if !strings.Contains(line, tc.says) || strings.Contains(line, tc.never) {
				t.Errorf("the drain deadline's log line %q; want it to say %q, and not %q", line, tc.says, tc.never)
			}
		})
	}
}
