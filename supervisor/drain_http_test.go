package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/platforms"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
)

// stopsLate is a platform whose Run, once its context ends, returns only when let go: it holds
// the daemon's stop, after the drain and before the HTTP platform stops, for as long as a test
// needs to ask the draining HTTP API.
type stopsLate struct {
	stopping chan struct{} // closed when Run's context ends
	letGo    chan struct{}
}

func (p *stopsLate) Name() string { return "late" }

func (p *stopsLate) Run(ctx context.Context, _ platforms.Deliver) error {
	<-ctx.Done()
	close(p.stopping)
	<-p.letGo
	return nil
}

func (p *stopsLate) Send(context.Context, *platforms.Outbound) error { return nil }

// postMessage sends one message to the daemon's HTTP API and returns its status, Retry-After
// and error body.
func postMessage(t *testing.T, d *Daemon) (status int, retryAfter string, body httpplatform.ErrorResponse) {
	t.Helper()
	return postMessageTo(t, d, "c", "m1")
}

// postMessageTo is postMessage of a message with id in chat.
func postMessageTo(t *testing.T, d *Daemon, chat, id string) (status int, retryAfter string, body httpplatform.ErrorResponse) {
	t.Helper()
	req, err := json.Marshal(map[string]string{"chat_id": chat, "user_id": "u", "text": "hello", "message_id": id})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+d.Addr().String()+"/v1/messages", "application/json", bytes.NewReader(req))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), body
}

// TestDrainOfZeroTellsClientsToRetryInASecond: with shutdown.drain_timeout 0s the stop waits
// for no turn, so a message refused while the daemon stops is told to come back in a second
// (Retry-After: 1), not after the HTTP platform's default drain of 30 s, which a 0 handed to it
// would mean (Start gives it at least a second).
func TestDrainOfZeroTellsClientsToRetryInASecond(t *testing.T) {
	late := &stopsLate{stopping: make(chan struct{}), letGo: make(chan struct{})}
	cfg := config.Default()
	cfg.DataDir, cfg.HTTP.Addr, cfg.Shutdown.DrainTimeout = t.TempDir(), "127.0.0.1:0", 0
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	d, err := Start(t.Context(), cfg, log, Options{Platforms: []platforms.Platform{late}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopped <- d.Stop(ctx)
	}()
	select {
	case <-late.stopping:
	case <-time.After(30 * time.Second):
		close(late.letGo)
		t.Fatal("the stop did not reach the platforms within 30s")
	}
	status, retry, body := postMessage(t, d)
	close(late.letGo)
	if err := <-stopped; err != nil {
		t.Errorf("Stop: %v", err)
	}
	if status != http.StatusServiceUnavailable || body.Error.Code != httpplatform.CodeDraining || retry != "1" {
		t.Errorf("POST /v1/messages while stopping with drain_timeout 0s = %d %q Retry-After %q, want 503 %s with Retry-After 1",
			status, body.Error.Code, retry, httpplatform.CodeDraining)
	}
}
