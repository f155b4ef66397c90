package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/buildinfo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The actor system's log (floor): protoactor's lifecycle chatter is dropped, a connection this
// member closed to a member that left is debug, and a connection lost otherwise stays an error.
func TestActorLogFloor(t *testing.T) {
	lost := func(err error) func(*slog.Logger) {
		return func(l *slog.Logger) {
			l.Error("EndpointWriter lost connection", slog.String("address", "127.0.0.1:6341"), slog.Any("error", err))
		}
	}
	closing := status.Error(codes.Canceled, "grpc: the client connection is closing")
	tests := []struct {
		name     string
		level    slog.Level // the daemon's log level
		stopping bool
		log      func(*slog.Logger)
		want     string // the level logged; "" for nothing
	}{
		{"info chatter dropped", slog.LevelInfo, false, func(l *slog.Logger) { l.Info("actor system started") }, ""},
		{"warning kept", slog.LevelInfo, false, func(l *slog.Logger) { l.Warn("dead letter") }, "WARN"},
		{"connection closed here: not an error", slog.LevelInfo, false, lost(closing), ""},
		{"connection closed here, at debug level", slog.LevelDebug, false, lost(closing), "DEBUG"},
		{"connection lost otherwise", slog.LevelInfo, false, lost(status.Error(codes.Unavailable, "connection reset by peer")), "ERROR"},
		{"not a gRPC error", slog.LevelInfo, false, lost(errors.New("boom")), "ERROR"},
		{"another error with Canceled", slog.LevelInfo, false, func(l *slog.Logger) {
			l.Error("EndpointWriter failed to receive connect response", slog.Any("error", closing))
		}, "ERROR"},
		{"while stopping: any error is debug", slog.LevelInfo, true, lost(errors.New("boom")), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			var hush atomic.Bool
			hush.Store(tt.stopping)
			h := slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tt.level})
			tt.log(slog.New(floor{h: h, min: slog.LevelWarn, hush: &hush}).With("component", "actors"))
			got := buf.String()
			switch {
			case tt.want == "" && got != "":
				t.Errorf("logged %q, want nothing", got)
			case tt.want != "" && !strings.Contains(got, "level="+tt.want+" "):
				t.Errorf("logged %q, want it at %s", got, tt.want)
			}
		})
	}
}

// TestStartLineNamesTheBuild: the daemon's start line names the build that runs (what
// `agentgate version` prints), so a log read later says which build wrote it.
func TestStartLineNamesTheBuild(t *testing.T) {
	line := startLine(t)
	if want := fmt.Sprintf("version=%q", buildinfo.Version()); !strings.Contains(line, want) {
		t.Errorf("start line %q, want it to carry %s", line, want)
	}
}

// TestStartLineNamesThePlatforms: the start line names the platforms the daemon serves, so
// that an operator who enabled Discord (AGENTGATE_PLATFORMS_DISCORD_ENABLED=true) reads there
// that it took: before, only a "discord gateway ready" line, once connected, said so, and a
// Discord left off by a misspelt variable said nothing at all.
func TestStartLineNamesThePlatforms(t *testing.T) {
	if line, want := startLine(t), " platforms=fake,http "; !strings.Contains(line, want) {
		t.Errorf("start line %q, want it to carry %q", line, want)
	}
}

// startLine starts a daemon (an echo agent, the fake platform and HTTP), stops it, and returns
// its start line ("agentgate started").
func startLine(t *testing.T) string {
	t.Helper()
	var logs testutil.Buffer
	r := MustStartDaemon(t, echo.New(), daemonOpts{logs: &logs})
	r.stop(t)
	for line := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(line, `msg="agentgate started"`) {
			return line
		}
	}
	t.Fatalf("no start line in the log:\n%s", logs.String())
	return ""
}

// TestStartLineNamesTheModelEndpoint: with the openai backend, the start line names the model
// and the endpoint's host, never the base_url's user info, path or query, which may hold
// credentials.
func TestStartLineNamesTheModelEndpoint(t *testing.T) {
	var logs testutil.Buffer
	r := MustStartDaemon(t, echo.New(), daemonOpts{logs: &logs, tweak: func(c *config.Config) {
		c.Agent.Backend = "openai"
		c.Agent.OpenAI.Model, c.Agent.OpenAI.BaseURL = "m-1", "https://u:s3cret@models.example:8443/v1?key=s3cret"
	}})
	r.stop(t)
	for line := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(line, `msg="agentgate started"`) {
			if want := "agent=openai model=m-1 endpoint=models.example:8443 "; !strings.Contains(line, want) || strings.Contains(line, "s3cret") {
				t.Errorf("start line %q, want it to carry %q and no credentials", line, want)
			}
			return
		}
	}
	t.Fatalf("no start line in the log:\n%s", logs.String())
}
