package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/postgres"
	"github.com/agentgate/agentgate/persistence/sqlite"
)

// TestKill9Torture drives 50 sessions × 40 messages through POST /v1/messages while the daemon is
// killed with SIGKILL at random moments and restarted, on SQLite and on PostgreSQL. At the end
// every message that got a 202 is in the database exactly once with exactly one reply, and the
// SSE stream, resumed with Last-Event-ID, delivers each reply once.
func TestKill9Torture(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		dataDir := t.TempDir()
		torture(t, dataDir, nil, func() (persistence.Store, error) {
			return sqlite.OpenReadOnly(t.Context(), filepath.Join(dataDir, "agentgate.db"))
		})
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := pgtest.NewDatabase(t)
		torture(t, t.TempDir(), []string{"AGENTGATE_STORE_DRIVER=postgres", "AGENTGATE_STORE_DSN=" + dsn},
			func() (persistence.Store, error) { return postgres.Open(t.Context(), dsn, postgres.Options{}) })
	})
}

// torture is TestKill9Torture on the daemon started with env; open opens its database once the
// daemon has stopped.
func torture(t *testing.T, dataDir string, env []string, open func() (persistence.Store, error)) {
	const sessions, perSession, kills = 50, 40, 4
	var base atomic.Value
	d := MustServe(t, dataDir, env...)
	base.Store(d.base)

	var acked sync.Map // message id → session key
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	client := &http.Client{Timeout: 10 * time.Second}
	for s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perSession {
				id := fmt.Sprintf("s%02d-m%02d", s, i)
				body := fmt.Sprintf(`{"chat_id":"chat-%02d","user_id":"u","text":"%s","message_id":"%s"}`, s, id, id)
				for ctx.Err() == nil {
					key, ok := postOnce(ctx, client, base.Load().(string), body)
					if ok {
						acked.Store(id, key)
						break
					}
					time.Sleep(5 * time.Millisecond) // the daemon is down: retry the same message id
				}
			}
		}()
	}
	loadDone := make(chan struct{})
	go func() { wg.Wait(); close(loadDone) }()

	// Kill at random moments spread over the whole load: after a random number of acknowledged
	// messages in each of kills equal slices of it. A kill waits until every message acknowledged
	// before the previous kill is done, so no message is in flight at two kills running: one in
	// flight at three is quarantined by design (the daemon cannot tell a kill from the outside
	// from a message that takes it down; actors.Probation), and kills seconds apart are a crash
	// loop, which TestPoisonSparesTheChatsInFlight covers.
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	count := func() int {
		n := 0
		acked.Range(func(any, any) bool { n++; return true })
		return n
	}
	total := sessions * perSession
	var before map[string][]string // session key → message ids acknowledged before the last kill
	for k := 0; k < kills; k++ {
		target := k*total/(kills+1) + rng.IntN(total/(kills+1))
		for count() < target {
			select {
			case <-loadDone:
			case <-time.After(5 * time.Millisecond): // poll the acknowledged count
				continue
			}
			break
		}
		awaitDone(ctx, t, client, base.Load().(string), before)
		before = map[string][]string{}
		acked.Range(func(id, key any) bool {
			before[key.(string)] = append(before[key.(string)], id.(string))
			return true
		})
		t.Logf("kill -9 #%d after %d acknowledged messages", k+1, count())
		if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-d.done
		d = MustServe(t, dataDir, env...)
		base.Store(d.base)
	}
	<-loadDone
	if ctx.Err() != nil {
		t.Fatalf("load did not finish: %v", ctx.Err())
	}

	// Replies per session over SSE, read in two parts to exercise Last-Event-ID resume.
	keys := map[string][]string{}
	acked.Range(func(id, key any) bool {
		keys[key.(string)] = append(keys[key.(string)], id.(string))
		return true
	})
	if len(keys) != sessions {
		t.Fatalf("%d sessions got 202s, want %d", len(keys), sessions)
	}
	for key, ids := range keys {
		first := readSSE(t, d.base+"/v1/sessions/"+key+"/events", "", len(ids)/2)
		rest := readSSE(t, d.base+"/v1/sessions/"+key+"/events", first[len(first)-1].id, len(ids)-len(first))
		seen := map[string]int{}
		for _, e := range append(first, rest...) {
			for _, r := range e.data["in_reply_to"].([]any) {
				seen[r.(string)]++
			}
		}
		for _, id := range ids {
			if seen[id] != 1 {
				t.Errorf("SSE for %s delivered %d replies to %s, want 1", key, seen[id], id)
			}
		}
	}

	if err := d.stop(t, 30*time.Second); err != nil {
		t.Fatalf("final stop: %v", err)
	}
	store, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for key, ids := range keys {
		route, err := store.Route(t.Context(), key)
		if err != nil {
			t.Fatalf("route %s: %v", key, err)
		}
		sess, err := store.Session(t.Context(), route.SessionID)
		if err != nil {
			t.Fatalf("session %s: %v", route.SessionID, err)
		}
		if sess.Platform != "http" || sess.ChatType != "dm" || !strings.HasPrefix(sess.ChatID, "chat-") || sess.Key != key {
			t.Errorf("session row %+v lacks its identity columns", sess)
		}
		msgs, err := store.Transcript(t.Context(), route.SessionID)
		if err != nil {
			t.Fatal(err)
		}
		users, replies := map[string]int{}, map[string]int{}
		turnOf := map[string]string{}
		for _, m := range msgs {
			switch m.Role {
			case persistence.RoleUser:
				users[m.MessageID]++
				turnOf[m.MessageID] = m.TurnID
				if m.Status != persistence.StatusDone {
					t.Errorf("%s: message %s status %q, want done", key, m.MessageID, m.Status)
				}
			case persistence.RoleAssistant:
				replies[m.TurnID]++
			}
		}
		for _, id := range ids {
			if users[id] != 1 {
				t.Errorf("%s: message %s stored %d times, want once", key, id, users[id])
			}
			if replies[turnOf[id]] != 1 {
				t.Errorf("%s: message %s has %d replies, want 1", key, id, replies[turnOf[id]])
			}
		}
	}
}

// postOnce posts body and reports the session key when the daemon answered 202 (or 200 for a
// duplicate of a message it already has).
func postOnce(ctx context.Context, c *http.Client, base, body string) (string, bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/messages", strings.NewReader(body))
	if err != nil {
		return "", false
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", false
	}
	defer resp.Body.Close()
	var ack struct {
		SessionKey string `json:"session_key"`
	}
	if resp.StatusCode != http.StatusAccepted || json.NewDecoder(resp.Body).Decode(&ack) != nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return "", false
	}
	return ack.SessionKey, true
}

// awaitDone polls the transcripts of the daemon at base until each message in ids (session key →
// message ids) is done.
func awaitDone(ctx context.Context, t *testing.T, c *http.Client, base string, ids map[string][]string) {
	t.Helper()
	for key, want := range ids {
		for {
			status, err := transcriptStatus(ctx, c, base, key)
			if err == nil && !slices.ContainsFunc(want, func(id string) bool { return status[id] != persistence.StatusDone }) {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("messages of %s acknowledged before the last kill are not all done: %v", key, ctx.Err())
			case <-time.After(20 * time.Millisecond): // poll the transcript
			}
		}
	}
}

// transcriptStatus returns the status of each user message of the current session of key.
func transcriptStatus(ctx context.Context, c *http.Client, base, key string) (map[string]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/sessions/"+key+"/transcript", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("transcript of %s: %s", key, resp.Status)
	}
	var tr struct {
		Messages []struct {
			Role      string `json:"role"`
			MessageID string `json:"message_id"`
			Status    string `json:"status"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&tr); err != nil {
		return nil, err
	}
	status := map[string]string{}
	for _, m := range tr.Messages {
		if m.Role == persistence.RoleUser {
			status[m.MessageID] = m.Status
		}
	}
	return status, nil
}
