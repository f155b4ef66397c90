package supervisor

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
)

// The tests in this file are the replaced gateway's regression scenarios and failure classes
// (shared/reference/hermes-gateway-behaviour.md §8 and §9) that no other test covered on the
// surface a user sees.

// TestNonePolicyResumesAnOldSessionAfterARestart: with the default reset mode none, a session
// idle for 30 days is neither reset by the reset timer nor by the next start: the chat's next
// message runs in the same session, with its history, and nobody is told of a reset (hermes
// scenario 27; #61052, #43392: a resume reset a session despite mode none, with a notice).
func TestNonePolicyResumesAnOldSessionAfterARestart(t *testing.T) {
	dir := t.TempDir()
	clk := testutil.NewClock(t0)
	r := startClocked(t, dir, clk, &recorder{}, nil)
	first := r.inject(t, dm, "m1", "remember me")
	r.waitReplyTo(t, "m1")
	clk.Advance(30 * 24 * time.Hour)
	r.checkResets()
	r.stop(t)

	clk.Advance(time.Hour)
	agent := &recorder{}
	r2 := startClocked(t, dir, clk, agent, nil)
	defer r2.stop(t)
	r2.checkResets()
	again := r2.inject(t, dm, "m2", "still there?")
	r2.waitReplyTo(t, "m2")
	if again.SessionID != first.SessionID {
		t.Errorf("after 30 days and a restart m2 runs in %s, want the same session %s (reset mode none)", again.SessionID, first.SessionID)
	}
	if s := r2.session(t, first.SessionID); !s.EndedAt.IsZero() || s.EndReason != "" {
		t.Errorf("session ended %v (%q), want it open", s.EndedAt, s.EndReason)
	}
	if h := agent.last().History; len(h) == 0 || h[len(h)-1].Text != "echo: remember me" {
		t.Errorf("the agent's history ends %+v, want the first exchange", h)
	}
	for _, o := range r2.fake.Sent() {
		if !strings.HasPrefix(o.Text, "echo: ") {
			t.Errorf("the user was sent %q, want only the echo of m2 (no reset notice)", o.Text)
		}
	}
	if all, err := r2.d.store.SessionsOfKey(t.Context(), first.SessionKey, 0); err != nil || len(all) != 1 {
		t.Errorf("SessionsOfKey = %d sessions (%v), want 1", len(all), err)
	}
}

// TestConcurrentFirstMessagesStartOneSession: many messages arriving at once for a key that has
// no session yet start exactly one session, one row in the store, and each message is answered
// once (hermes scenario 57, single-flight; #45456: two agents for one session doubled replies).
func TestConcurrentFirstMessagesStartOneSession(t *testing.T) {
	const n = 20
	var running, overlapped atomic.Int32
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		if running.Add(1) > 1 {
			overlapped.Store(1)
		}
		defer running.Add(-1)
		return &agents.Response{Text: "echo: " + req.Messages[0].Text}, nil
	})
	r := MustStart(t, agent, nil)
	acks := make([]*platforms.Ack, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { acks[i] = r.inject(t, dm, fmt.Sprintf("m%d", i), fmt.Sprintf("hello %d", i)) })
	}
	wg.Wait()
	for i, a := range acks {
		if a == nil || a.SessionID != acks[0].SessionID {
			t.Fatalf("ack %d = %+v, want session %s like the first", i, a, acks[0].SessionID)
		}
	}
	if all, err := r.d.store.SessionsOfKey(t.Context(), acks[0].SessionKey, 0); err != nil || len(all) != 1 {
		t.Errorf("SessionsOfKey = %d sessions (%v), want 1", len(all), err)
	}
	outs := r.waitSent(t, n)
	answered := map[string]int{}
	for _, o := range outs {
		for _, id := range o.InReplyTo {
			answered[id]++
		}
	}
	for i := range n {
		if id := fmt.Sprintf("m%d", i); answered[id] != 1 {
			t.Errorf("%s answered %d times, want once", id, answered[id])
		}
	}
	if overlapped.Load() != 0 {
		t.Errorf("two turns of one session ran at the same time")
	}
}

// TestRestartResendsOnlyUnconfirmedReplies: after a restart only the reply whose delivery was
// never confirmed is sent again. A delivered reply is not sent twice (hermes #92589), and one the
// platform refused for good is not retried at every start (#100660).
func TestRestartResendsOnlyUnconfirmedReplies(t *testing.T) {
	dir := t.TempDir()
	r := startOn(t, dir, time.Second, echo.New())
	a1 := r.inject(t, dm, "m1", "delivered")
	outboxState := func(r *runtime, seq int) string {
		es, err := r.d.store.OutboxAfter(t.Context(), a1.SessionKey, 0, 10)
		if err != nil || len(es) < seq {
			return ""
		}
		return es[seq-1].State
	}
	waitUntil(t, func() bool { return outboxState(r, 1) == persistence.DeliveryDelivered })
	r.fake.SetSendError(fmt.Errorf("blocked by the user: %w", platforms.ErrUndeliverable))
	r.inject(t, dm, "m2", "refused for good")
	waitUntil(t, func() bool { return outboxState(r, 2) == persistence.DeliveryFailed })
	r.fake.SetSendError(errors.New("platform down"))
	r.inject(t, dm, "m3", "unconfirmed")
	waitUntil(t, func() bool {
		return promtest.ToFloat64(r.d.metrics.OutboundTotal.WithLabelValues("fake", "error")) >= 2
	})
	r.stop(t)

	r2 := startOn(t, dir, time.Second, echo.New())
	defer r2.stop(t)
	r2.waitSent(t, 1)
	r2.inject(t, dm, "m4", "after the restart")
	r2.waitReplyTo(t, "m4")
	var got []string
	for _, o := range r2.fake.Sent() {
		got = append(got, o.InReplyTo[0]+":"+o.Text)
	}
	if want := []string{"m3:unconfirmed", "m4:after the restart"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after the restart the platform was sent %q, want %q", got, want)
	}
	if s := outboxState(r2, 2); s != persistence.DeliveryFailed {
		t.Errorf("the refused reply's delivery state is %q after the restart, want %q", s, persistence.DeliveryFailed)
	}
}

// TestTranscriptReadFailureIsAnError: when the store cannot read a transcript, GET
// /v1/sessions/{key}/transcript answers an error with a JSON error body, never 200 with an empty
// or partial list a client would take for the conversation (hermes scenario 48: a read failure
// must raise, not return []).
func TestTranscriptReadFailureIsAnError(t *testing.T) {
	r := MustStart(t, echo.New(), nil)
	ack := r.inject(t, dm, "m1", "hello")
	r.waitReplyTo(t, "m1")
	url := "http://" + r.d.Addr().String() + "/v1/sessions/" + ack.SessionKey + "/transcript"
	if status, _ := getJSON(t, url); status != http.StatusOK {
		t.Fatalf("GET transcript = %d before the failure, want 200", status)
	}

	db, err := sql.Open("sqlite", "file:"+r.d.cfg.DSN()+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(t.Context(), "ALTER TABLE messages RENAME TO messages_away"); err != nil {
		t.Fatal(err)
	}
	status, body := getJSON(t, url)
	var e struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal(body, &e); status < 500 || err != nil || e.Error.Code == "" {
		t.Errorf("GET transcript with an unreadable store = %d %s, want a 5xx with a JSON error body", status, body)
	}
	if _, err := db.ExecContext(t.Context(), "ALTER TABLE messages_away RENAME TO messages"); err != nil {
		t.Fatal(err)
	}
}

func getJSON(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}
