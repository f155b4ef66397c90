package openaitest_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/agents/openai/openaitest"
)

func TestModelRecordsAndAnswersInSteps(t *testing.T) {
	m := openaitest.New(t, openaitest.Steps(
		openaitest.Status(http.StatusTooManyRequests, `{"error":{"message":"slow down"}}`, "Retry-After: 7"),
		openaitest.Reply("hello", 3, 1),
	))
	post := func(body string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, m.URL()+"/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	for i, want := range []struct {
		code int
		body string
	}{
		{http.StatusTooManyRequests, "slow down"},
		{http.StatusOK, `"content":"hello"`},
		{http.StatusOK, `"content":"hello"`}, // the last step repeats
	} {
		resp, body := post(fmt.Sprintf(`{"n":%d}`, i+1))
		if resp.StatusCode != want.code || !strings.Contains(body, want.body) {
			t.Errorf("request %d: %d %s, want %d with %s", i+1, resp.StatusCode, body, want.code, want.body)
		}
		m.Wait(t)
	}
	if resp, _ := post(""); resp.StatusCode != http.StatusOK {
		t.Errorf("fourth request: %d", resp.StatusCode)
	}
	m.WaitRequests(t, 4)
	reqs := m.Requests()
	if len(reqs) != 4 || m.Count() != 4 || reqs[0].Body != `{"n":1}` || m.Body(t, 3) != `{"n":3}` ||
		reqs[1].Header.Get("Authorization") != "Bearer k" {
		t.Errorf("recorded %+v", reqs)
	}
	resp, err := http.Get(m.URL() + "/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || m.Count() != 4 {
		t.Errorf("GET /v1/models: %d, %d requests recorded; want 404 and none", resp.StatusCode, m.Count())
	}
}

func TestStreamWaitsForItsGate(t *testing.T) {
	gate := make(chan struct{})
	m := openaitest.New(t, openaitest.Steps(openaitest.Stream(gate, 5, 2, "Hel", "lo")))
	resp, err := http.Post(m.URL()+"/chat/completions", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, 4096)
	n, _ := resp.Body.Read(first)
	for n < 4096 && !strings.Contains(string(first[:n]), `"Hel"`) {
		k, err := resp.Body.Read(first[n:])
		if err != nil {
			t.Fatalf("stream ended before the first delta: %v; got %q", err, first[:n])
		}
		n += k
	}
	if strings.Contains(string(first[:n]), `"lo"`) {
		t.Fatalf("the second delta came before the gate opened: %q", first[:n])
	}
	close(gate)
	rest, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`"lo"`, `"finish_reason":"stop"`, `"prompt_tokens":5,"completion_tokens":2`, "data: [DONE]"} {
		if !strings.Contains(string(rest), want) {
			t.Errorf("the rest of the stream lacks %s: %q", want, rest)
		}
	}
}
