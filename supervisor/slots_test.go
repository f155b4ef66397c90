package supervisor

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/platforms"
)

// TestAgentCallsWaitForAFreeSlot: with agent.max_concurrent 2, five chats' messages arriving
// at once run two exec commands at a time, the others waiting (agentgate_agent_calls_waiting);
// a /stop cancels a waiting turn, whose command never starts; each of the others is answered
// once. Before, every chat's command started at once, however many chats wrote.
func TestAgentCallsWaitForAFreeSlot(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "agent.sh")
	// Each run logs its start and end and waits for the test's go-ahead (the file go).
	if err := os.WriteFile(script, []byte(`#!/bin/sh
echo "start $AGENTGATE_CHAT_ID" >> "$1/log"
touch "$1/running.$AGENTGATE_CHAT_ID"
while [ ! -e "$1/go" ]; do sleep 0.02; done
rm "$1/running.$AGENTGATE_CHAT_ID"
echo "end $AGENTGATE_CHAT_ID" >> "$1/log"
echo "ok $AGENTGATE_CHAT_ID"
`), 0o755); err != nil {
		t.Fatal(err)
	}
	r := MustStartDaemon(t, nil, daemonOpts{tweak: func(c *config.Config) {
		c.Agent.Backend, c.Agent.Exec.Command, c.Agent.MaxConcurrent = "exec", []string{"/bin/sh", script, dir}, 2
	}})
	defer r.stop(t)
	chat := func(i int) identity.Source {
		return identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: fmt.Sprint("c", i), UserID: fmt.Sprint("u", i)}
	}
	for i := range 5 {
		r.inject(t, chat(i), fmt.Sprint("m", i), "hi")
	}
	running := func() []string {
		ms, _ := filepath.Glob(filepath.Join(dir, "running.*"))
		return ms
	}
	waitUntil(t, func() bool {
		return len(running()) == 2 && value(r.scrape(t), "agentgate_agent_calls_waiting") == 3
	})

	// /stop in a chat whose turn waits: it never runs.
	var waiting int
	for i := range 5 {
		if _, err := os.Stat(filepath.Join(dir, fmt.Sprint("running.c", i))); err != nil {
			waiting = i
			break
		}
	}
	r.inject(t, chat(waiting), "stop", "/stop")
	r.waitReplyTo(t, "stop")
	waitUntil(t, func() bool { return value(r.scrape(t), "agentgate_agent_calls_waiting") == 2 })

	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if i != waiting {
			r.waitReplyTo(t, fmt.Sprint("m", i))
		}
	}
	replies := map[string]int{}
	for _, o := range r.fake.Sent() {
		if o.Kind == platforms.KindReply && strings.HasPrefix(o.Text, "ok ") {
			replies[o.Text]++
		}
	}
	for i := range 5 {
		want := 1
		if i == waiting {
			want = 0
		}
		if n := replies[fmt.Sprint("ok c", i)]; n != want {
			t.Errorf("chat c%d was answered %d times, want %d", i, n, want)
		}
	}
	log, err := os.ReadFile(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	most, now := 0, 0
	for l := range strings.SplitSeq(strings.TrimSpace(string(log)), "\n") {
		if strings.HasPrefix(l, "start ") {
			now++
			most = max(most, now)
		} else {
			now--
		}
		if l == fmt.Sprint("start c", waiting) {
			t.Errorf("the stopped chat c%d's command ran", waiting)
		}
	}
	if most != 2 {
		t.Errorf("at most %d commands ran at once, want 2:\n%s", most, log)
	}
	// The four calls that ran took a slot: two at once, two after a wait.
	if n := value(r.scrape(t), "agentgate_agent_slot_wait_seconds"); n != 4 {
		t.Errorf("agentgate_agent_slot_wait_seconds counts %v calls, want 4", n)
	}
}
