package openai_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
)

// testKey is the API key of every test; no output may ever contain it.
const testKey = "sk-test-4f9c2d7e1b8a6035c9e7d2f1a4b6c8e0"

// newFakeModel starts a fake model that answers its requests with steps, in order, the last
// one repeating.
func newFakeModel(t testing.TB, steps ...http.HandlerFunc) *openaitest.Model {
	t.Helper()
	return openaitest.New(t, openaitest.Steps(steps...))
}

// sleeps records the waits of an agent's retries without waiting; each moves its clock, now,
// on by the wait (the clock starts at the zero time unless at is set).
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
	at time.Time
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.at = s.at.Add(d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeps) now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.at
}

func (s *sleeps) waits() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

// MustAgent builds an agent for m with the key in OPENAI_TEST_KEY, debug logs into logs (when
// not nil) and recorded sleeps; tweak changes the config first.
func MustAgent(t *testing.T, m *openaitest.Model, logs io.Writer, sl *sleeps, tweak func(*openai.Config)) *openai.Agent {
	t.Helper()
	t.Setenv("OPENAI_TEST_KEY", testKey)
	if logs == nil {
		logs = io.Discard
	}
	if sl == nil {
		sl = &sleeps{}
	}
	c := openai.Config{
		BaseURL: m.URL(), Model: "gpt-test", APIKeyEnv: "OPENAI_TEST_KEY",
		MaxHistory: 20, MaxRetries: 3, Sleep: sl.sleep, Jitter: noJitter,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if tweak != nil {
		tweak(&c)
	}
	a, err := openai.New(c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return a
}

// noJitter keeps the computed backoff as it is, so that tests can name the waits.
func noJitter(d time.Duration) time.Duration { return d }

// compact returns the compact form of a JSON literal.
func compact(t testing.TB, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatalf("compact %s: %v", s, err)
	}
	return b.String()
}
