//go:build !race

// Cluster tests run several members in one process, and protoactor's cluster code is not
// race-clean (docs/ARCHITECTURE.md): they are the documented exception to -race, and `make
// test` runs them in a second pass without it.

package supervisor

import (
	"context"
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

	"github.com/agentgate/agentgate/actors"
	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// startCluster starts n members of one cluster on a fresh PostgreSQL database. The caller
// stops them (runtime.stop).
func startClusterMembers(t *testing.T, n int, agent agents.Agent, drain time.Duration, tweaks ...func(*config.Config)) []*runtime {
	t.Helper()
	return startClusterOn(t, pgtest.NewDatabase(t), n, agent, drain, tweaks...)
}

func startClusterOn(t *testing.T, dsn string, n int, agent agents.Agent, drain time.Duration, tweaks ...func(*config.Config)) []*runtime {
	t.Helper()
	var rs []*runtime
	for range n {
		rs = append(rs, startClusterMember(t, dsn, agent, drain, tweaks...))
	}
	waitForMembers(t, rs)
	return rs
}

// waitForMembers waits until every member of rs sees all of them: a member that has not yet
// seen the others would place every key on itself, so a test routes only after.
func waitForMembers(t testing.TB, rs []*runtime) {
	t.Helper()
	waitUntil(t, func() bool {
		for _, r := range rs {
			if len(r.d.cluster.MemberList.Members().Members()) != len(rs) {
				return false
			}
		}
		return true
	})
}

// okAgent answers "ok <text>".
var okAgent = agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
	return &agents.Response{Text: "ok " + req.Messages[0].Text}, nil
})

func stopAll(t *testing.T, rs []*runtime) {
	for _, r := range rs {
		r.stop(t)
	}
}

// startClusterMember starts one member of the cluster on dsn; the caller stops it.
func startClusterMember(t testing.TB, dsn string, agent agents.Agent, drain time.Duration, tweaks ...func(*config.Config)) *runtime {
	t.Helper()
	return MustStartDaemon(t, agent, daemonOpts{drain: drain, tweak: func(c *config.Config) {
		clusterOn(dsn)(c)
		for _, f := range tweaks {
			f(c)
		}
	}})
}

// clusterOn configures a member of the test cluster on dsn (startClusterMember), for a test
// that starts one with daemonOpts of its own.
func clusterOn(dsn string) func(*config.Config) {
	return func(c *config.Config) {
		c.Store.Driver, c.Store.DSN = "postgres", dsn
		c.Cluster.Enabled, c.Cluster.Bind, c.Cluster.MemberTTL = true, "127.0.0.1:0", 2*time.Second
	}
}

func chat(i int) identity.Source {
	return identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: fmt.Sprint("c", i), UserID: "u"}
}

// TestClusterRoutesEveryKeyToItsOwner: messages for many chats arrive on both members; each
// session runs on the one member that owns its key, whichever member took the message, and
// every message is stored once and answered once, by the owner.
func TestClusterRoutesEveryKeyToItsOwner(t *testing.T) {
	rs := startClusterMembers(t, 2, okAgent, 0)
	defer stopAll(t, rs)
	for i, r := range rs {
		resp, err := http.Get("http://" + r.d.Addr().String() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"cluster"`) {
			t.Errorf("member %d: /readyz %d %s, want 200 with the cluster ready", i, resp.StatusCode, body)
		}
		if n := testutil.ToFloat64(r.d.metrics.ClusterMembers); n != 2 {
			t.Errorf("member %d: agentgate_cluster_members = %v, want 2", i, n)
		}
	}
	const chats, rounds = 20, 3
	acks := map[string]*platforms.Ack{}
	for round := range rounds {
		for i := range chats {
			id := fmt.Sprintf("m%d-%d", i, round)
			if ack := rs[(i+round)%2].inject(t, chat(i), id, id); ack != nil {
				acks[id] = ack
			}
		}
	}
	if len(acks) != chats*rounds {
		t.Fatalf("%d of %d messages acknowledged", len(acks), chats*rounds)
	}
	answered := map[string]int{}       // message id → replies, over both members
	ranOn := map[string]map[int]bool{} // session key → members that answered it
	waitUntil(t, func() bool { return len(rs[0].fake.Sent())+len(rs[1].fake.Sent()) >= chats*rounds })
	for m, r := range rs {
		for _, o := range r.fake.Sent() {
			answered[o.InReplyTo[0]]++
			if ranOn[o.SessionKey] == nil {
				ranOn[o.SessionKey] = map[int]bool{}
			}
			ranOn[o.SessionKey][m] = true
		}
	}
	for id := range acks {
		if answered[id] != 1 {
			t.Errorf("message %s answered %d times, want once", id, answered[id])
		}
	}
	owners := map[int]int{}
	for key, on := range ranOn {
		if len(on) != 1 {
			t.Errorf("session %s ran on %d members, want one", key, len(on))
		}
		for m := range on {
			owners[m]++
		}
	}
	if owners[0] == 0 || owners[1] == 0 {
		t.Errorf("sessions per member: %v; both members should own some of %d keys", owners, chats)
	}
	for i := range chats {
		key := acks[fmt.Sprintf("m%d-0", i)].SessionKey
		msgs, err := rs[0].d.store.Transcript(t.Context(), acks[fmt.Sprintf("m%d-0", i)].SessionID)
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) != 2*rounds {
			t.Errorf("session %s holds %d rows, want %d (a message and its reply per round)", key, len(msgs), 2*rounds)
		}
	}
}

// TestClusterMemberLeavingHandsItsSessionsOver: a member leaves while a turn of a session it
// owns runs; the turn is cancelled and its message stays pending in the store. The remaining
// member takes the key over and answers the message, and the next message of the chat goes
// to it as well. With sessions.recovery: notice too: that is for a restart of agentgate, and
// a key that moves between members runs its work (before, the message was answered "agentgate
// restarted" and never run).
func TestClusterMemberLeavingHandsItsSessionsOver(t *testing.T) {
	for _, recovery := range []string{"rerun", "notice"} {
		t.Run(recovery, func(t *testing.T) { memberLeavingHandsItsSessionsOver(t, recovery) })
	}
}

func memberLeavingHandsItsSessionsOver(t *testing.T, recovery string) {
	started := make(chan string, 1)
	var blockOnce atomic.Bool
	agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		if req.Messages[0].Text == "slow" && blockOnce.CompareAndSwap(false, true) {
			started <- req.Identity.SessionKey
			<-ctx.Done() // until its member leaves
			return nil, ctx.Err()
		}
		return &agents.Response{Text: "ok " + req.Messages[0].Text}, nil
	})
	rs := startClusterMembers(t, 2, agent, 50*time.Millisecond, func(c *config.Config) { c.Sessions.Recovery = recovery })
	a := rs[0]
	defer a.stop(t)

	// Find a chat whose key the second member owns, by sending through the first.
	var leaving *runtime
	var src identity.Source
	for i := 0; leaving == nil; i++ {
		ack := a.inject(t, chat(i), fmt.Sprint("probe", i), "probe")
		waitUntil(t, func() bool { return len(a.fake.Sent())+len(rs[1].fake.Sent()) > i })
		if len(rs[1].fake.Sent()) > 0 {
			leaving, src = rs[1], chat(i)
			_ = ack
		}
	}
	a.inject(t, src, "slow-1", "slow")
	<-started
	leaving.stop(t) // drains for 50ms, cancels the turn, leaves the cluster

	waitUntil(t, func() bool { return testutil.ToFloat64(a.d.metrics.ClusterMembers) == 1 })
	var got []string
	waitUntil(t, func() bool {
		got = nil
		for _, o := range a.fake.Sent() {
			if o.InReplyTo[0] == "slow-1" {
				got = append(got, o.Text)
			}
		}
		return len(got) > 0
	})
	if fmt.Sprint(got) != "[ok slow]" {
		t.Errorf("replies to the message whose turn was cancelled: %q, want one, from the remaining member", got)
	}
	a.inject(t, src, "after", "after")
	waitUntil(t, func() bool {
		for _, o := range a.fake.Sent() {
			if o.InReplyTo[0] == "after" {
				return true
			}
		}
		return false
	})
}

// TestClusterWaitOnAnyMember: a client waits (?wait) on the member it is connected to, for
// chats whose sessions run on either member: a reply sent by the owner reaches the waiting
// client on the other.
func TestClusterWaitOnAnyMember(t *testing.T) {
	rs := startClusterMembers(t, 2, okAgent, 0)
	defer stopAll(t, rs)
	a := rs[0]
	remote := 0
	// Until three sessions ran on the other member: placement follows the cluster's view, which
	// may still be a's alone for a moment after both members listed each other.
	for i := 0; remote < 3; i++ {
		if i == 60 {
			t.Fatalf("%d of 60 sessions ran on the other member", remote)
		}
		body := fmt.Sprintf(`{"chat_id":"w%d","user_id":"u","text":"hello %d","message_id":"w%d"}`, i, i, i)
		resp, err := http.Post("http://"+a.d.Addr().String()+"/v1/messages?wait=20s", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			SessionKey string `json:"session_key"`
			Replies    []struct {
				Text string `json:"text"`
			} `json:"replies"`
		}
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || len(got.Replies) != 1 || got.Replies[0].Text != fmt.Sprint("ok hello ", i) {
			t.Fatalf("chat w%d: status %d, body %+v, err %v; want 200 with its reply", i, resp.StatusCode, got, err)
		}
		own, err := a.d.store.Ownership(t.Context(), got.SessionKey)
		if err != nil {
			t.Fatal(err)
		}
		if own.Owner == a.d.deps.Node {
			continue
		}
		remote++
		// The admin API of the member the client talks to shows the owner's live session.
		resp, err = http.Get("http://" + a.d.Addr().String() + "/v1/sessions/" + got.SessionKey)
		if err != nil {
			t.Fatal(err)
		}
		var info struct {
			Live *struct {
				Active bool   `json:"active"`
				Node   string `json:"node"`
			} `json:"live"`
		}
		err = json.NewDecoder(resp.Body).Decode(&info)
		resp.Body.Close()
		if err != nil || info.Live == nil || !info.Live.Active || info.Live.Node != own.Owner {
			t.Errorf("GET /v1/sessions/%s on a non-owner: live %+v (%v), want it active on %s", got.SessionKey, info.Live, err, own.Owner)
		}
	}
}

// TestClusterMemberCutOffFromTheStoreStops: a member that cannot renew its registration for
// cluster.member_ttl has been dropped by the others, and protoactor never readmits a member it
// dropped: the daemon reports it cannot go on (Fatal; serve then stops and exits non-zero).
func TestClusterMemberCutOffFromTheStoreStops(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	r := startClusterOn(t, dsn, 1, okAgent, 0)[0]
	restore := pgtest.Cut(t, dsn)
	select {
	case err := <-r.d.Fatal():
		if !strings.Contains(err.Error(), "cluster membership lost") {
			t.Errorf("Fatal: %v, want the lost membership", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a member cut off from the store for 30s still runs")
	}
	restore()
	r.stop(t)
}

// TestClusterSplitTheYoungerLeaves: when protoactor has dropped a member that the store still
// lists alive (gossip lost it, as across a network partition, while both reach the
// database), the two would route by different views for ever. The younger one reports itself
// lost, so that it starts again with a new id and rejoins; the older one goes on.
func TestClusterSplitTheYoungerLeaves(t *testing.T) {
	rs := startClusterMembers(t, 2, okAgent, 0)
	older, younger := rs[0], rs[1]
	defer stopAll(t, rs)
	younger.d.cluster.Remote.BlockList().Block(older.d.system.ID) // what 20 s without gossip does
	select {
	case err := <-younger.d.Fatal():
		if !strings.Contains(err.Error(), "cluster split") || !strings.Contains(err.Error(), older.d.system.ID) {
			t.Errorf("Fatal: %v, want the split from %s", err, older.d.system.ID)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the younger member of a split cluster still runs")
	}
	select {
	case err := <-older.d.Fatal():
		t.Errorf("the older member reported %v; it must go on", err)
	default:
	}
}

// TestClusterRollingRestart: members are restarted one at a time while a client keeps
// talking to the cluster through another member, as in a deploy. A stopping member first
// leaves the membership, so the others take its keys while it drains. Every message the
// cluster acknowledged is stored once and answered once, and nothing is left pending.
func TestClusterRollingRestart(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	rs := startClusterOn(t, dsn, 3, okAgent, 5*time.Second)
	front := rs[0]
	var mu sync.Mutex
	acked, failed := map[string]bool{}, 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		c := &http.Client{Timeout: 60 * time.Second}
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprint("r", n)
			body := fmt.Sprintf(`{"chat_id":"c%d","user_id":"u","text":%q,"message_id":%q}`, n%12, id, id)
			resp, err := c.Post("http://"+front.d.Addr().String()+"/v1/messages?wait=5s", "application/json", strings.NewReader(body))
			mu.Lock()
			if err == nil && (resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusAccepted) {
				acked[id] = true
			} else {
				failed++
			}
			mu.Unlock()
			if err == nil {
				resp.Body.Close()
			}
		}
	})
	for i := 1; i < len(rs); i++ { // restart every member but the front one, one at a time
		rs[i].stop(t)
		rs[i] = startClusterMember(t, dsn, okAgent, 5*time.Second)
		waitUntil(t, func() bool {
			return testutil.ToFloat64(front.d.metrics.ClusterMembers) == 3 && testutil.ToFloat64(rs[i].d.metrics.ClusterMembers) == 3
		})
	}
	close(stop)
	wg.Wait()
	defer stopAll(t, rs)

	ctx := t.Context()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var stuck []string
		for _, key := range keysOf(t, front, 12) {
			snap, err := front.d.store.LoadSession(ctx, key, 0, 0)
			if err != nil || len(snap.Pending) > 0 || len(snap.Unconfirmed) > 0 {
				own, _ := front.d.store.Ownership(ctx, key)
				var pend []string
				for _, m := range snap.Pending {
					pend = append(pend, fmt.Sprint(m.Seq, ":", m.MessageID))
				}
				var unc []int64
				for _, e := range snap.Unconfirmed {
					unc = append(unc, e.Seq)
				}
				var live []string
				for i, r := range rs {
					st, _ := r.d.system.Root.RequestFuture(r.d.manager, &actors.Peek{Key: key}, time.Second).Result()
					if s, ok := st.(*actors.SessionState); ok && s.Active {
						live = append(live, fmt.Sprintf("m%d(%s running=%s q=%d)", i, r.d.deps.Node, s.RunningTurnId, s.QueueDepth))
					}
				}
				stuck = append(stuck, fmt.Sprintf("%s pending=%v unconfirmed=%v owner=%+v live=%v err=%v", key, pend, unc, own, live, err))
			}
		}
		if len(stuck) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stuck sessions:\n%s", strings.Join(stuck, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	stored := map[string]int{}
	answered := map[string]int{}
	for _, key := range keysOf(t, front, 12) {
		r, err := front.d.store.Route(ctx, key)
		if errors.Is(err, persistence.ErrNotFound) {
			continue // no message of this chat was stored
		}
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := front.d.store.Transcript(ctx, r.SessionID)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range msgs {
			if m.Seq != int64(i+1) {
				t.Errorf("session %s: row %d has seq %d", key, i, m.Seq)
			}
			if m.Role == persistence.RoleUser {
				stored[m.MessageID]++
			}
		}
		out, err := front.d.store.OutboxAfter(ctx, key, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range out {
			for _, id := range e.InReplyTo {
				answered[id]++
			}
		}
	}
	for id := range acked {
		if stored[id] != 1 || answered[id] != 1 {
			t.Errorf("acknowledged message %s: stored %d times, answered %d times; want once and once", id, stored[id], answered[id])
		}
	}
	t.Logf("%d messages acknowledged, %d refused or failed during the restarts", len(acked), failed)
	if len(acked) == 0 {
		t.Fatal("no message was acknowledged")
	}
	// A message that reaches a leaving member as it stops is sent again, by the front member's
	// router, to the key's next owner (actors.ErrCodeStopped): the client sees no refusal.
	if failed > 0 {
		t.Errorf("%d messages refused or failed during the restarts, want none", failed)
	}
}

// keysOf returns the session keys of the chats c0..c<n-1> of the HTTP platform.
func keysOf(t *testing.T, r *runtime, n int) []string {
	var keys []string
	for i := range n {
		keys = append(keys, r.d.intake.Key(identity.Source{Platform: "http", ChatType: identity.ChatDM, ChatID: fmt.Sprint("c", i), UserID: "u"}))
	}
	return keys
}
