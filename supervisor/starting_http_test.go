package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/persistence"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
)

// TestHTTPAnswersDuringTheStartsReplay: while the start replays the spool the last run left
// (held here at the database's gate), the bound listener answers: GET /healthz 200 (the process
// is up, its start going on), GET /readyz 503 saying that the start replays the spool and how
// many batches are left, GET /metrics, and every other route 503 starting with Retry-After.
// Once the start is over, the same listener serves the API. Before, the listener was bound but
// nothing answered on it until the start was over: a liveness probe during a replay of minutes
// timed out, and an orchestrator killed a daemon that was making progress.
func TestHTTPAnswersDuringTheStartsReplay(t *testing.T) {
	dir := t.TempDir()
	mustLeaveResetInSpool(t, dir)
	g := newGatedStore()
	opened := false
	defer func() {
		if !opened {
			g.open() // a start that did not return must not hang the test
		}
	}()
	cfg := config.Default()
	cfg.DataDir, cfg.HTTP.Addr = dir, "127.0.0.1:0"
	cfg.Persist.MaxBatch = 1 // a transaction a batch
	var logs logSignal
	type started struct {
		d   *Daemon
		err error
	}
	done := make(chan started, 1)
	go func() {
		d, err := Start(t.Context(), cfg, slog.New(slog.NewTextHandler(&logs, nil)), Options{Agent: echo.New(),
			WrapStore: func(s persistence.Store) persistence.Store {
				g.Store = s
				return g
			}})
		done <- started{d, err}
	}()
	if !waitAtGate(t, g, "the start's replay") {
		return
	}
	addr, err := os.ReadFile(filepath.Join(dir, AddrFile))
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + strings.TrimSpace(string(addr))
	client := &http.Client{Timeout: 5 * time.Second}
	get := func(method, path string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(`{"chat_id":"c1","user_id":"u1","text":"hi"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s during the start's replay: %v", method, path, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, body
	}

	if resp, body := get("GET", "/healthz"); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz during the start's replay = %d %s, want 200", resp.StatusCode, body)
	}
	resp, body := get("GET", "/readyz")
	var ready httpplatform.ReadyResponse
	if err := json.Unmarshal(body, &ready); err != nil {
		t.Fatalf("GET /readyz: %v: %s", err, body)
	}
	if start := ready.Components[httpplatform.ComponentStart]; resp.StatusCode != http.StatusServiceUnavailable || !ready.Starting ||
		!strings.Contains(start, "replaying the writes the last run left in the spool") || !strings.Contains(start, "batches left") {
		t.Errorf("GET /readyz during the start's replay = %d %s, want 503 starting, saying the replay and the batches left", resp.StatusCode, body)
	}
	if resp, body := get("GET", "/metrics"); resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "agentgate_") {
		t.Errorf("GET /metrics during the start's replay = %d, want 200 with the metrics", resp.StatusCode)
	}
	for _, path := range []string{"/v1/messages", "/v1/sessions"} {
		method := "GET"
		if path == "/v1/messages" {
			method = "POST"
		}
		resp, body := get(method, path)
		var e httpplatform.ErrorResponse
		if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != http.StatusServiceUnavailable ||
			e.Error.Code != httpplatform.CodeStarting || resp.Header.Get("Retry-After") != "5" {
			t.Errorf("%s %s during the start's replay = %d %s (Retry-After %q), want 503 %s with Retry-After 5",
				method, path, resp.StatusCode, body, resp.Header.Get("Retry-After"), httpplatform.CodeStarting)
		}
	}

	g.open()
	opened = true
	var r started
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("Start did not return within 30 s of the replay's release:\n%s", logs.String())
	}
	if r.err != nil {
		t.Fatalf("Start: %v", r.err)
	}
	defer func() {
		if err := r.d.Stop(context.Background()); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Stop: %v", err)
		}
	}()
	if got := r.d.Addr().String(); base != "http://"+got {
		t.Errorf("the daemon serves %s, the start served %s", got, base)
	}
	// The platform's Run took the listener over: the API answers on the same address.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, body := get("GET", "/v1/sessions")
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /v1/sessions once the start is over = %d %s, want 200", resp.StatusCode, body)
		}
		time.Sleep(10 * time.Millisecond) // a poll interval under a deadline (a real socket)
	}
}
