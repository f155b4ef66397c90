package main

import (
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/openai/openaitest"
)

// TestDaemonWithAModel runs the real binary with agent.backend openai against a loopback model
// that first refuses the key (echoing it back, as some endpoints do) and then answers: the user
// gets a short error reply saying the credentials were refused, then the answer; the tokens and
// the requests by result show in /metrics, the tokens in `sessions show`; and the key is in no line of the daemon's debug log and no byte of its data directory.
func TestDaemonWithAModel(t *testing.T) {
	const key = "sk-e2e-3b7f1c9d2e8a4f6b0c5d7e9a1b3c5d7f"
	model := openaitest.New(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 || r.Header.Get("Authorization") != "Bearer "+key {
			openaitest.Status(http.StatusUnauthorized,
				fmt.Sprintf(`{"error":{"message":"Incorrect API key provided: %s"}}`, r.Header.Get("Authorization")))(w, r)
			return
		}
		openaitest.WriteReply(w, "Hi from the model.", 42, 5)
	})
	dataDir := t.TempDir()
	d := MustServe(t, dataDir, "AGENTGATE_AGENT_BACKEND=openai", "AGENTGATE_AGENT_OPENAI_BASE_URL="+model.URL(),
		"AGENTGATE_AGENT_OPENAI_MODEL=test-model", "AGENTGATE_AGENT_OPENAI_API_KEY_ENV=E2E_MODEL_KEY", "E2E_MODEL_KEY="+key,
		"AGENTGATE_LOG_LEVEL=debug")

	var texts []string
	for i, want := range []string{"could not answer this message (turn t_", "Hi from the model."} {
		status, res := post(t, d.base+"/v1/messages?wait=30s", "", fmt.Sprintf(`{"chat_id":"c1","user_id":"u1","text":"hello %d"}`, i))
		replies, _ := res["replies"].([]any)
		if status != http.StatusOK || len(replies) != 1 || !strings.Contains(replies[0].(map[string]any)["text"].(string), want) {
			t.Fatalf("message %d: %d %v, want one reply containing %q", i, status, res, want)
		}
		texts = append(texts, replies[0].(map[string]any)["text"].(string))
	}
	// Sending it again would meet the same refusal: the user is told why, not to try again.
	if !strings.HasSuffix(texts[0], "failed): its model endpoint refused its credentials, which the operator has to fix.") {
		t.Errorf("the refusal's reply = %q, want it to say the endpoint refused the credentials", texts[0])
	}
	_, metrics := get(t, d.base+"/metrics")
	for _, want := range []string{`agentgate_agent_tokens_total{direction="input"} 42`, `agentgate_agent_tokens_total{direction="output"} 5`,
		`agentgate_model_requests_total{result="refused"} 1`, `agentgate_model_requests_total{result="ok"} 1`,
		`agentgate_model_requests_total{result="rate_limited"} 0`, `go_build_info{checksum=`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grep(metrics, "agentgate_"))
		}
	}
	if err := d.stop(t, 30*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v, want 0", err)
	}
	show, _ := MustRunSessions(t, "show", "agent:main:http:dm:c1", "--data-dir", dataDir)
	if !strings.Contains(show, "input 42, output 5") {
		t.Errorf("sessions show lacks the tokens:\n%s", show)
	}

	logs := d.stderr.String()
	if !strings.Contains(logs, "401 Unauthorized: Incorrect API key provided: Bearer [redacted]") {
		t.Errorf("the log does not name the refusal:\n%s", logs)
	}
	leaks := map[string]string{"daemon log": logs, "replies": strings.Join(texts, "\n"), "metrics": metrics, "sessions show": show}
	err := filepath.WalkDir(dataDir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		leaks[path] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for where, s := range leaks {
		if strings.Contains(s, key) || strings.Contains(s, key[7:27]) {
			t.Errorf("the API key is in %s", where)
		}
	}
}
