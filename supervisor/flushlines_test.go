package supervisor

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	agentexec "github.com/agentgate/agentgate/agents/exec"
	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil"
)

// The agents whose lines the daemon's stop reports (Daemon.Stop).
var (
	_ interface{ FlushLines() } = (*openai.Agent)(nil)
	_ interface{ FlushLines() } = (*agentexec.Agent)(nil)
)

// flushingAgent is an agent whose limited lines hold events back (as the openai and exec
// agents' do): FlushLines logs the report it would.
type flushingAgent struct {
	agents.Agent
	log *slog.Logger
}

func (a flushingAgent) FlushLines() { a.log.Warn("the agent's line held back", "repeats", 3) }

// TestStopReportsTheAgentsLinesHeldBack: the daemon's stop has the agent report what its limited
// lines hold back (FlushLines: the retries of a model call in the last minute of an endpoint's
// outage), before the line that the daemon stopped. Before, only their limiter's timer reported
// them, up to a minute later, when the daemon had exited: they were counted nowhere.
func TestStopReportsTheAgentsLinesHeldBack(t *testing.T) {
	cfg := config.Default()
	cfg.DataDir, cfg.HTTP.Addr = t.TempDir(), "127.0.0.1:0"
	var logs testutil.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	d, err := Start(t.Context(), cfg, log, Options{Agent: flushingAgent{Agent: echo.New(), log: log}})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := d.Stop(context.Background()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	got := logs.String()
	report, stopped := strings.Index(got, "the agent's line held back"), strings.Index(got, "msg=stopped")
	if report < 0 || stopped < 0 || report > stopped {
		t.Errorf("the agent's report at %d, the stopped line at %d, want the report before it:\n%s", report, stopped, got)
	}
}
