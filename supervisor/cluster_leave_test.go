//go:build !race

// A multi-member cluster test: without -race, as cluster_test.go says why.

package supervisor

import (
	"context"
	"fmt"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence/postgres"
	"github.com/agentgate/agentgate/platforms"
)

// TestClusterLeavingMemberKeepsItsKeysUntilDrained: a member stops while a turn of a key it
// owns runs, with a drain long enough for the turn to finish. Until its drain ends the other
// member neither recovers nor activates that key: it routes the chat's next message to the
// leaving member, which stores it behind the running turn (queued), and the key's successor runs
// it once the turn's result is stored. Another chat of the leaving member is answered at once,
// by the successor, while the drain still waits for the turn. The agent never runs twice at once
// for a session, and the running turn's message runs once.
//
// Before, the leaving member withdrew its membership row before it drained: the survivor's next
// renewal dropped it, its recovery activated the key and claimed it, and ran the message whose
// turn the leaving member was still finishing (whose result was then fenced).
func TestClusterLeavingMemberKeepsItsKeysUntilDrained(t *testing.T) {
	release := make(chan struct{})
	rec := newTurnRecorder(release, 4)
	agent := rec.agent()
	rs := startClusterMembers(t, 2, agent, 30*time.Second)
	a, leaving := rs[0], rs[1]
	defer a.stop(t)
	releaseOnce := sync.OnceFunc(func() { close(release) })
	defer releaseOnce() // a failed test must not hold the leaving member's drain

	// Two chats whose keys the leaving member owns.
	owner := ownerOf(a.d.cluster.MemberList.Members().Members())
	var busy, other identity.Source
	for i, found := 0, 0; found < 2; i++ {
		if owner(a.d.intake.Key(chat(i))) != leaving.d.system.Address() {
			continue
		}
		if found++; found == 1 {
			busy = chat(i)
		} else {
			other = chat(i)
		}
	}
	busyKey := a.d.intake.Key(busy)
	a.inject(t, other, "other-1", "first") // the other chat's session is in memory, idle, on the leaving member
	waitReply(t, rs, "other-1")
	a.inject(t, busy, "slow-1", "slow")
	if key := <-rec.started; key != busyKey {
		t.Fatalf("the slow turn ran for %s, want %s", key, busyKey)
	}

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		leaving.stop(t)
	}()
	// The survivor renews (as its own renewal would) once the leaving member's registration
	// shows that it leaves, and recovers what it then owns.
	waitUntil(t, func() bool {
		live, err := a.d.members.Heartbeat(t.Context(), a.d.cfg.Cluster.Name, a.d.membership.me, a.d.cfg.Cluster.MemberTTL)
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(live, func(m postgres.Member) bool { return m.ID == leaving.d.system.ID && !m.Leaving }) {
			return false
		}
		viewOf(a.d.cluster).publish(live)
		return true
	})
	a.d.recoverOwned(a.d.cluster.MemberList.Members().Members())

	// The busy chat's next message is stored by the leaving member, behind the running turn.
	if ack := a.inject(t, busy, "next-1", "next"); ack != nil && ack.Disposition != platforms.Queued {
		t.Errorf("the message after the slow one: disposition %q, want %q", ack.Disposition, platforms.Queued)
	}
	own, err := a.d.store.Ownership(t.Context(), busyKey)
	if err != nil {
		t.Fatal(err)
	}
	if own.Owner != leaving.d.deps.Node {
		t.Errorf("while the leaving member still ran the key's turn, %s claimed the key (the leaving member is %s)", own.Owner, leaving.d.deps.Node)
	}
	// The other chat does not wait for the drain: its successor answers it.
	a.inject(t, other, "other-2", "second")
	waitReply(t, rs, "other-2")
	select {
	case <-stopped:
		t.Error("the leaving member stopped before its running turn finished")
	default:
	}

	releaseOnce()
	for _, id := range []string{"slow-1", "next-1"} {
		waitReply(t, rs, id)
	}
	<-stopped
	for _, id := range []string{"slow-1", "next-1", "other-2"} {
		if n := repliesTo(rs, id); n != 1 {
			t.Errorf("message %s answered %d times, want once", id, n)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.overlaps > 0 || rec.calls["slow"] != 1 {
		t.Errorf("the agent ran twice at once for a session %d times, and %d times for the slow message; want never, and once",
			rec.overlaps, rec.calls["slow"])
	}
}

// turnRecorder is an agent that counts its calls by message text and the calls that began while
// another one of their session ran; a message whose text starts with "slow" announces its
// session key on started and waits for release.
type turnRecorder struct {
	release <-chan struct{}
	started chan string
	mu      sync.Mutex
	running map[string]int // session key → agent calls running now
	// overlaps counts the agent calls that began while another one of their session ran.
	overlaps int
	calls    map[string]int // message text → agent calls
}

func newTurnRecorder(release <-chan struct{}, slow int) *turnRecorder {
	return &turnRecorder{release: release, started: make(chan string, slow), running: map[string]int{}, calls: map[string]int{}}
}

func (r *turnRecorder) agent() agents.Agent {
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		key, text := req.Identity.SessionKey, req.Messages[0].Text
		r.mu.Lock()
		r.running[key]++
		if r.running[key] > 1 {
			r.overlaps++
		}
		r.calls[text]++
		r.mu.Unlock()
		defer func() {
			r.mu.Lock()
			r.running[key]--
			r.mu.Unlock()
		}()
		if strings.HasPrefix(text, "slow") {
			r.started <- key
			select {
			case <-r.release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return &agents.Response{Text: "ok " + text}, nil
	})
}

// whereRan is the agent of each member of a test cluster: it records which member ran each
// message, by text; a message for which wait gives a channel announces its text on started and
// waits for the channel to close.
type whereRan struct {
	wait    func(text string) <-chan struct{}
	started chan string
	mu      sync.Mutex
	ran     map[string][]string // message text → the members that ran it
}

func newWhereRan(waiting int, wait func(text string) <-chan struct{}) *whereRan {
	return &whereRan{wait: wait, started: make(chan string, waiting), ran: map[string][]string{}}
}

// agent is the agent of the member named member.
func (w *whereRan) agent(member string) agents.Agent {
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		text := req.Messages[0].Text
		w.mu.Lock()
		w.ran[text] = append(w.ran[text], member)
		w.mu.Unlock()
		if ch := w.wait(text); ch != nil {
			w.started <- text
			select {
			case <-ch:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return &agents.Response{Text: "ok " + text}, nil
	})
}

// result is what ran where so far.
func (w *whereRan) result() map[string][]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.ran)
}

// waitReply waits until one of the members sent the end of a reply to the message id.
func waitReply(t *testing.T, rs []*runtime, id string) {
	t.Helper()
	waitUntil(t, func() bool { return repliesTo(rs, id) > 0 })
}

// repliesTo counts the turns' ends sent in reply to id, over the members.
func repliesTo(rs []*runtime, id string) int {
	n := 0
	for _, r := range rs {
		for _, o := range r.fake.Sent() {
			if o.TurnEnd && slices.Contains(o.InReplyTo, id) {
				n++
			}
		}
	}
	return n
}

// TestClusterLeavingMemberHandsOnEveryBusyKey: a member stops while turns of several chats it
// owns run, each with messages queued behind it. As each turn ends the chat goes to the other
// member, which runs the queued messages and the chat's later ones (the cluster still routes
// them to the leaving member, which forwards them) while the leaving member still drains another
// chat's turn; the leaving member runs none of them, and no message runs twice.
//
// Before, the member that took a chat over sent it back to the leaving member (its view still
// placed the chat there, as the leaving member stays a member until it withdraws); the leaving
// member, unable to forward it again, started the chat's session itself and ran its turns until
// its drain deadline, then cancelled them, and the other member ran them again.
func TestClusterLeavingMemberHandsOnEveryBusyKey(t *testing.T) {
	release, holdout := make(chan struct{}), make(chan struct{})
	releaseOnce, holdoutOnce := sync.OnceFunc(func() { close(release) }), sync.OnceFunc(func() { close(holdout) })
	defer releaseOnce()
	defer holdoutOnce()
	w := newWhereRan(16, func(text string) <-chan struct{} {
		switch {
		case text == "holdout":
			return holdout
		case strings.HasPrefix(text, "slow"):
			return release
		}
		return nil
	})
	started, agentOf := w.started, w.agent
	dsn := pgtest.NewDatabase(t)
	stays := startClusterMember(t, dsn, agentOf("stays"), 30*time.Second)
	defer stays.stop(t)
	leaving := startClusterMember(t, dsn, agentOf("leaving"), 30*time.Second)
	rs := []*runtime{stays, leaving}
	waitUntil(t, func() bool {
		return len(stays.d.cluster.MemberList.Members().Members()) == 2 && len(leaving.d.cluster.MemberList.Members().Members()) == 2
	})
	owner := ownerOf(stays.d.cluster.MemberList.Members().Members())
	var busy []int
	for i := 0; len(busy) < 4; i++ {
		if owner(stays.d.intake.Key(chat(i))) == leaving.d.system.Address() {
			busy = append(busy, i)
		}
	}
	last := busy[3] // its turn holds the leaving member's drain open
	busy = busy[:3]
	stays.inject(t, chat(last), "holdout", "holdout")
	for _, i := range busy {
		stays.inject(t, chat(i), fmt.Sprint("slow-", i), fmt.Sprint("slow-", i))
	}
	for range len(busy) + 1 {
		<-started
	}
	for _, i := range busy {
		for j := range 2 {
			id := fmt.Sprintf("queued-%d-%d", i, j)
			if ack := stays.inject(t, chat(i), id, id); ack != nil && ack.Disposition != platforms.Queued {
				t.Errorf("%s: disposition %q, want %q", id, ack.Disposition, platforms.Queued)
			}
		}
	}

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		leaving.stop(t)
	}()
	// The member that stays renews (as its own renewal would) once the leaving member's
	// registration shows that it leaves.
	waitUntil(t, func() bool {
		live, err := stays.d.membership.heartbeat(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(live, func(m postgres.Member) bool { return m.ID == leaving.d.system.ID && !m.Leaving }) {
			return false
		}
		viewOf(stays.d.cluster).publish(live)
		return true
	})
	releaseOnce()
	for _, i := range busy {
		for j := range 2 {
			waitReply(t, rs, fmt.Sprintf("queued-%d-%d", i, j))
		}
	}
	// The leaving member still drains the holdout turn: the cluster routes the chats' next
	// messages to it, and it forwards them.
	for _, i := range busy {
		id := fmt.Sprint("late-", i)
		stays.inject(t, chat(i), id, id)
		waitReply(t, rs, id)
	}
	holdoutOnce()
	<-stopped
	ran := w.result()
	for _, i := range busy {
		if got := ran[fmt.Sprint("slow-", i)]; fmt.Sprint(got) != "[leaving]" {
			t.Errorf("slow-%d ran on %v, want once on the leaving member", i, got)
		}
		for _, text := range []string{fmt.Sprintf("queued-%d-0", i), fmt.Sprintf("queued-%d-1", i), fmt.Sprint("late-", i)} {
			if got := ran[text]; fmt.Sprint(got) != "[stays]" {
				t.Errorf("%s ran on %v, want once, on the member that stays", text, got)
			}
		}
	}
	if got := ran["holdout"]; fmt.Sprint(got) != "[leaving]" {
		t.Errorf("the holdout turn ran on %v, want once on the leaving member", got)
	}
}

// TestClusterLeavingMemberHandsOnBeforeTheOthersRenew: a member stops while a turn of a chat it
// owns runs with messages queued behind it, and the turn ends before the member that stays has
// renewed its registration since (it renews every member_ttl/3, here 40 s). What the leaving
// member hands on still stays with the member it went to: the queued messages run there, once.
//
// Before, the member that stays learnt that the other one leaves only at its next renewal; until
// then its placement still named the leaving member the chat's owner, and it sent the chat back,
// to be run by the leaving member (the hand-over of TestClusterLeavingMemberHandsOnEveryBusyKey
// worked only once every other member had renewed).
func TestClusterLeavingMemberHandsOnBeforeTheOthersRenew(t *testing.T) {
	release, holdout := make(chan struct{}), make(chan struct{})
	releaseOnce, holdoutOnce := sync.OnceFunc(func() { close(release) }), sync.OnceFunc(func() { close(holdout) })
	defer releaseOnce()
	defer holdoutOnce()
	w := newWhereRan(4, func(text string) <-chan struct{} {
		return map[string]chan struct{}{"slow": release, "holdout": holdout}[text]
	})
	started, agentOf := w.started, w.agent
	// Renewals every 40 s, and a drain that outlasts the test's waits (30 s each): what runs the
	// queued messages in time is the hand-over, not the other member's next renewal, nor its
	// recovery after the drain.
	slowRenewals := func(c *config.Config) { c.Cluster.MemberTTL = 2 * time.Minute }
	dsn := pgtest.NewDatabase(t)
	stays := startClusterMember(t, dsn, agentOf("stays"), 2*time.Minute, slowRenewals)
	defer stays.stop(t)
	told := &logSignal{want: "its sessions hand their keys on", ready: make(chan struct{})}
	leavesNow := told.ready
	defer func() {
		if t.Failed() {
			t.Log(told.String())
		}
	}()
	leaving := MustStartDaemon(t, agentOf("leaving"), daemonOpts{drain: 2 * time.Minute, logs: told, tweak: func(c *config.Config) {
		c.Store.Driver, c.Store.DSN = "postgres", dsn
		c.Cluster.Enabled, c.Cluster.Bind = true, "127.0.0.1:0"
		slowRenewals(c)
	}})
	rs := []*runtime{stays, leaving}
	// The member that started first sees the second at once, not at its next renewal.
	live, err := stays.d.membership.heartbeat(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	viewOf(stays.d.cluster).publish(live)
	waitUntil(t, func() bool {
		return len(stays.d.cluster.MemberList.Members().Members()) == 2 && len(leaving.d.cluster.MemberList.Members().Members()) == 2
	})
	owner := ownerOf(stays.d.cluster.MemberList.Members().Members())
	var owned []int
	for i := 0; len(owned) < 2; i++ {
		if owner(stays.d.intake.Key(chat(i))) == leaving.d.system.Address() {
			owned = append(owned, i)
		}
	}
	busy, last := owned[0], owned[1]
	stays.inject(t, chat(last), "holdout", "holdout") // its turn holds the leaving member's drain open
	stays.inject(t, chat(busy), "slow", "slow")
	<-started
	<-started
	for j := range 2 {
		id := fmt.Sprint("queued-", j)
		stays.inject(t, chat(busy), id, id)
	}

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		leaving.stop(t)
	}()
	select { // the leaving member's manager is told (actors.Leave)
	case <-leavesNow:
	case <-time.After(30 * time.Second):
		t.Fatal("the leaving member's manager was not told that it leaves")
	}
	releaseOnce()
	// While the leaving member still drains the holdout turn, before anything but the hand-over
	// could run them.
	for j := range 2 {
		waitReply(t, rs, fmt.Sprint("queued-", j))
	}
	holdoutOnce()
	<-stopped
	ran := w.result()
	for _, text := range []string{"queued-0", "queued-1"} {
		if got := ran[text]; fmt.Sprint(got) != "[stays]" {
			t.Errorf("%s ran on %v, want once, on the member that stays", text, got)
		}
	}
}
