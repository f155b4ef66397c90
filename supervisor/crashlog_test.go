package supervisor

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestSessionCrashLogsOneLinePerCrash: a session whose agent panics at every turn logs one line
// per crash, with its key and what it panicked with, and the crash past its restart budget the
// manager's line alone, with the pause; the agent's stack is at Debug. Before, each crash
// logged the supervisor's "actor failed" and the session's "session restarting", and the last
// one the manager's line too: nine lines a pause of a crash loop, two of them saying the same.
func TestSessionCrashLogsOneLinePerCrash(t *testing.T) {
	agent := agents.Func(func(context.Context, *agents.Request) (*agents.Response, error) {
		panic("agent bug")
	})
	stopped := make(chan struct{}) // (logSignal.ready is its own to clear)
	logs := &logSignal{want: "session stopped after crashing too often", ready: stopped}
	r := MustStartDaemon(t, agent, daemonOpts{logs: logs})
	defer r.stop(t)
	crashy := identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: "crashy", UserID: "u"}
	r.inject(t, crashy, "m1", "boom")
	r.waitReplyTo(t, "m1") // quarantined after 3 crashes
	r.inject(t, crashy, "m2", "boom")
	select { // its 4th crash in a minute: past its 3 restarts, the session is stopped
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatalf("no line of the session stopped for crashing too often; the log:\n%s", logs.String())
	}
	crashes := int(testutil.ToFloat64(r.d.metrics.ActorRestarts.WithLabelValues("session")))
	if crashes != 4 {
		t.Fatalf("%d crashes of the session, want 4", crashes)
	}
	var lines, stacks []string
	for line := range strings.Lines(logs.String()) {
		if !strings.Contains(line, "crashy") {
			continue
		}
		switch {
		case strings.Contains(line, "level=DEBUG"):
			if strings.Contains(line, "stack=") && strings.Contains(line, "agent bug") {
				stacks = append(stacks, line)
			}
		case strings.Contains(line, "message quarantined after repeated crashes"):
			// what became of m1: no line of a crash
		case strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR"):
			lines = append(lines, line)
		}
	}
	if len(lines) != crashes {
		t.Fatalf("%d lines at Warn or above for %d crashes, want one per crash:\n%s", len(lines), crashes, strings.Join(lines, ""))
	}
	for i, line := range lines {
		if !strings.Contains(line, "session=agent:main:fake:dm:crashy") || !strings.Contains(line, `panic="turn t_`) || !strings.Contains(line, "agent panicked: agent bug") {
			t.Errorf("crash line %d names no session or panic: %s", i+1, line)
		}
	}
	if last := lines[len(lines)-1]; !strings.Contains(last, "session stopped after crashing too often; it starts again from the store") || !strings.Contains(last, "in=10s") {
		t.Errorf("the last crash's line is %s, want the stop with its pause", last)
	}
	if len(stacks) != crashes {
		t.Errorf("%d stacks at Debug for %d crashes, want one each", len(stacks), crashes)
	}
}
