package openai_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/agents/openai/openaitest"
)

// TestAskedWaitNotice: a wait the endpoint asks for that the turn will not wait out (longer
// than max_backoff, or than the turn has left) fails the turn at once, not retried, with a
// notice that says the endpoint rate-limited it (a 429) and how long to wait, rounded up to the
// second. Before, the notice rounded to the nearest second (a wait of 90.2 s said 1m30s: a
// message sent again then met the limit again); a wait longer than the turn had left failed the
// turn with the notice that asks to try again at once; and a Retry-After over 10^9 seconds (or a
// retry-after-ms over 10^12) was read as none, the 429 retried after 1s, 2s and 4s.
func TestAskedWaitNotice(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer http.HandlerFunc
		tweak  func(*openai.Config)
		notice string
	}{
		{"rounded up", openaitest.Status(429, `{"error":{"message":"quota"}}`, "Retry-After: 90.2"), nil,
			"its model endpoint rate-limited it (429) and asked for a wait of 1m31s before its next request: send it again after that"},
		{"longer than the turn has left", openaitest.Status(429, `{"error":{"message":"slow down"}}`, "Retry-After: 45"),
			func(c *openai.Config) { c.MaxBackoff, c.Timeout = time.Minute, 20*time.Second },
			"its model endpoint rate-limited it (429) and asked for a wait of 45s before its next request: send it again after that"},
		{"Retry-After of years", openaitest.Status(429, `{"error":{"message":"quota"}}`, "Retry-After: 99999999999"), nil,
			"its model endpoint rate-limited it (429) and asked for a wait of more than a day before its next request: send it again after that"},
		{"Retry-After past a float64", openaitest.Status(429, `{"error":{"message":"quota"}}`, "Retry-After: 1"+strings.Repeat("0", 400)), nil,
			"its model endpoint rate-limited it (429) and asked for a wait of more than a day before its next request: send it again after that"},
		{"retry-after-ms of years", openaitest.Status(429, `{"error":{"message":"quota"}}`, "Retry-After-Ms: 100000000000000000000"), nil,
			"its model endpoint rate-limited it (429) and asked for a wait of more than a day before its next request: send it again after that"},
		{"a 503's wait", openaitest.Status(503, `{"error":{"message":"maintenance"}}`, "Retry-After: 120"), nil,
			"its model endpoint asked for a wait of 2m0s before its next request: send it again after that"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(t, tc.answer, openaitest.Reply("ok", 1, 1))
			sl := &sleeps{}
			a := MustAgent(t, m, nil, sl, tc.tweak)
			_, err := a.Run(t.Context(), &agents.Request{Messages: []agents.Message{msg("user", "hi")}})
			if ref, ok := errors.AsType[*agents.Refusal](err); !ok || ref.Notice != tc.notice {
				t.Errorf("Run error = %v (refusal %v); want a Refusal whose notice is %q", err, ok, tc.notice)
			}
			if n, waits := m.Count(), sl.waits(); n != 1 || len(waits) != 0 {
				t.Errorf("%d requests after waits %v; want the one, failed at once", n, waits)
			}
		})
	}
}
