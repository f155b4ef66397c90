package http

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/platforms"
)

// TestClientsThatGoAwayLeaveNothingBehind: clients that hang up in the middle of a ?wait or of
// an event stream, many times over, leave no goroutine, connection, waiter or subscriber
// behind. Over months a daemon sees many such clients; each one leaked would hold a goroutine
// and an entry of the waiters or subscribers maps for ever.
func TestClientsThatGoAwayLeaveNothingBehind(t *testing.T) {
	const rounds = 50
	sessions := newFakeSessions()
	rt := &fakeRuntime{}
	h := mustStart(t, Config{Sessions: sessions}, rt)
	rt.setRespond(func(_ context.Context, in *platforms.Inbound) (*platforms.Ack, error) {
		if strings.HasPrefix(in.MessageID, "answered") {
			go rt.p.Send(context.Background(), reply(in, 1, "answer", true))
		}
		return ackFor(in, platforms.Started), nil
	})
	// Each stream is opened on a key with one event, read up to it, then dropped.
	sessions.addOutbox(&platforms.Outbound{SessionKey: streamKey, Seq: 1, Text: "old"})

	round := func(i int) {
		var wg sync.WaitGroup
		// A ?wait that is answered.
		wg.Go(func() {
			got := h.post("/v1/messages?wait=5s", map[string]string{"chat_id": "c", "user_id": "u", "text": "t",
				"message_id": fmt.Sprint("answered-", i)})
			if got.status != http.StatusOK {
				t.Errorf("POST ?wait = %d %s, want 200", got.status, got.body)
			}
		})
		// A ?wait whose client hangs up before the answer.
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			id := fmt.Sprint("unanswered-", i)
			go func() {
				waitFor(t, "the waiter of "+id, func() bool { return h.p.hasWaiter(id) })
				cancel()
			}()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.base+"/v1/messages?wait=1m",
				strings.NewReader(fmt.Sprintf(`{"chat_id":"c","user_id":"u","text":"t","message_id":%q}`, id)))
			if resp, err := h.client.Do(req); err == nil {
				resp.Body.Close()
				t.Errorf("POST ?wait answered %d, want the client's own hang-up", resp.StatusCode)
			}
		})
		// A stream whose client hangs up after its first event, and one that hangs up while
		// the stream is idle.
		for _, read := range []bool{true, false} {
			wg.Go(func() {
				s := h.openSSE(streamKey, "", "")
				if read {
					if _, err := s.next(); err != nil {
						t.Errorf("first event: %v", err)
					}
				}
				s.close()
			})
		}
		wg.Wait()
	}

	round(0)
	h.client.CloseIdleConnections()
	base := testutil.TakeResources()
	for i := range rounds {
		round(i + 1)
	}
	h.client.CloseIdleConnections()
	// The client's idle connection and its server side may still be closing.
	testutil.MustSettle(t, "clients gone", base, testutil.Slack{Goroutines: 2, FDs: 2}, 10*time.Second)
	for deadline := time.Now().Add(testTimeout); ; {
		w, s := h.p.waiterCount(), h.p.subscriptions()
		if w == 0 && s == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d rounds of clients that went away: %d waiters and %d subscribers, want none", rounds+1, w, s)
		}
		time.Sleep(10 * time.Millisecond) // a poll interval under a deadline
	}
}

// subscriptions counts the SSE subscribers of every key.
func (p *Platform) subscriptions() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, set := range p.subs {
		n += len(set)
	}
	return n
}

func (p *Platform) hasWaiter(msgID string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.waiters[msgID]) > 0
}
