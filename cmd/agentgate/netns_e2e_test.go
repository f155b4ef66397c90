//go:build linux && !race

// Multi-host cluster tests: members in network namespaces of this machine, each with its own
// address on a private bridge, as on separate hosts (DESIGN §6). They need root (to make the
// namespaces); the test process reaches the members through the bridge, never the outside
// network, and PostgreSQL through its Unix socket, which every namespace shares.

package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/jackc/pgx/v5"
)

// hosts are network namespaces on one bridge: host i has address ip(i).
type hosts struct {
	t      *testing.T
	bridge string
	ns     []string
	subnet string // "10.77.N."
}

func (h *hosts) ip(i int) string { return fmt.Sprint(h.subnet, i+1) }

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// mustHosts makes n namespaces on a bridge the test process is on too. Without root, or on a
// kernel that refuses namespaces, the test cannot run here and is skipped, saying why.
func mustHosts(t *testing.T, n int) *hosts {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("multi-host tests make network namespaces: they need root")
	}
	var b [2]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	octet, _ := rand.Int(rand.Reader, big.NewInt(200))
	h := &hosts{t: t, bridge: "agbr" + id, subnet: fmt.Sprintf("10.77.%d.", octet.Int64()+20)}
	if err := ipCmd("netns", "add", "agns"+id+"x"); err != nil {
		t.Skipf("network namespaces are not available here: %v", err)
	}
	_ = ipCmd("netns", "del", "agns"+id+"x")
	must := func(args ...string) {
		t.Helper()
		if err := ipCmd(args...); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, ns := range h.ns {
			_ = ipCmd("netns", "del", ns)
		}
		_ = ipCmd("link", "del", h.bridge)
	})
	must("link", "add", h.bridge, "type", "bridge")
	must("addr", "add", h.subnet+"254/24", "dev", h.bridge)
	must("link", "set", h.bridge, "up")
	for i := range n {
		ns, veth := fmt.Sprintf("agns%s%d", id, i), fmt.Sprintf("agv%s%d", id, i)
		h.ns = append(h.ns, ns)
		must("netns", "add", ns)
		must("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
		must("link", "set", veth, "master", h.bridge, "up")
		must("-n", ns, "addr", "add", h.ip(i)+"/24", "dev", "eth0")
		must("-n", ns, "link", "set", "eth0", "up")
		must("-n", ns, "link", "set", "lo", "up")
	}
	return h
}

// partition cuts hosts i and j apart (each still reaches the bridge's own address, so the
// test, and the database's socket); heal joins them again.
func (h *hosts) partition(i, j int) {
	h.t.Helper()
	for _, a := range [][2]int{{i, j}, {j, i}} {
		if err := ipCmd("-n", h.ns[a[0]], "route", "add", "blackhole", h.ip(a[1])+"/32"); err != nil {
			h.t.Fatal(err)
		}
	}
}

func (h *hosts) heal(i, j int) {
	h.t.Helper()
	for _, a := range [][2]int{{i, j}, {j, i}} {
		if err := ipCmd("-n", h.ns[a[0]], "route", "del", "blackhole", h.ip(a[1])+"/32"); err != nil {
			h.t.Fatal(err)
		}
	}
}

// nsToken is the bearer token of the members: they listen on non-loopback addresses.
const nsToken = "netns-test-token"

// authed sends req with the members' bearer token.
func authed(c *http.Client, req *http.Request) (*http.Response, error) {
	req.Header.Set("Authorization", "Bearer "+nsToken)
	return c.Do(req)
}

// members reads agentgate_cluster_members from a member's /metrics (-1 when unreachable).
func members(base string) int { return metric(base, "agentgate_cluster_members") }

// metric reads a metric without labels from a member's /metrics (-1 when unreachable).
func metric(base, name string) int {
	c := &http.Client{Timeout: 2 * time.Second}
	req, _ := http.NewRequest(http.MethodGet, base+"/metrics", nil)
	resp, err := authed(c, req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			var n int
			fmt.Sscan(v, &n)
			return n
		}
	}
	return -1
}

// TestClusterAcrossHostsAndAPartition: two members on two "hosts" serve one cluster. Then the
// network between them is cut while both still reach the database, and both keep taking
// messages for the same chats: requests for the other side's sessions fail until gossip
// gives the other side up (20 s); each side then runs alone (a key's session may move to
// either side, whose claim fences the other out) until the younger member notices the split
// and exits. Once the
// network is back and it is started again, every message any member acknowledged is stored
// once and answered once, and each session's transcript has no gap and no seq used twice.
func TestClusterAcrossHostsAndAPartition(t *testing.T) {
	h := mustHosts(t, 2)
	dsn := pgtest.NewDatabase(t)
	bin := MustBuild(t)
	env := []string{"AGENTGATE_STORE_DRIVER=postgres", "AGENTGATE_STORE_DSN=" + dsn,
		"AGENTGATE_CLUSTER_ENABLED=true", "AGENTGATE_CLUSTER_MEMBER_TTL=2s",
		"AGENTGATE_HTTP_TOKEN_ENV=NETNS_TOKEN", "NETNS_TOKEN=" + nsToken}
	start := func(i int) *daemon {
		cmd := exec.Command("ip", "netns", "exec", h.ns[i], bin, "serve", "--data-dir", t.TempDir(),
			"--http-addr", h.ip(i)+":8080")
		return MustServeCmd(t, cmd, append(env, "AGENTGATE_CLUSTER_BIND="+h.ip(i)+":6340")...)
	}
	a := start(0)
	b := start(1)
	waitFor(t, 60*time.Second, func() bool { return members(a.base) == 2 && members(b.base) == 2 })

	var mu sync.Mutex
	acked := map[string]bool{} // message ids some member acknowledged (200 or 202)
	send := func(base, chat, id string, wait time.Duration) int {
		c := &http.Client{Timeout: wait + 40*time.Second}
		body := fmt.Sprintf(`{"chat_id":%q,"user_id":"u","text":%q,"message_id":%q}`, chat, id, id)
		req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/v1/messages?wait=%s", base, wait), strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := authed(c, req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusAccepted {
			mu.Lock()
			acked[id] = true
			mu.Unlock()
		}
		return resp.StatusCode
	}
	for i := range 6 { // across hosts: a takes every message, the sessions run on both
		if status := send(a.base, fmt.Sprint("c", i), fmt.Sprint("before-", i), 20*time.Second); status != http.StatusOK {
			t.Fatalf("before the partition, chat c%d through a: %d, want 200", i, status)
		}
	}

	h.partition(0, 1)
	// Both sides take messages for the same chats while cut apart, until b exits.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for m, d := range []*daemon{a, b} {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				send(d.base, fmt.Sprint("c", n%3), fmt.Sprintf("split-%d-%d", m, n), 2*time.Second)
			}
		})
	}
	select {
	case <-b.done:
	case <-time.After(90 * time.Second):
		t.Fatal("the younger member did not leave the split cluster within 90s")
	}
	close(stop)
	wg.Wait()
	fenced := metric(a.base, "agentgate_sessions_fenced_total")
	if !strings.Contains(b.stderr.String(), "cluster split") || b.err == nil {
		t.Errorf("the younger member exited with %v, want an error exit naming the split", b.err)
	}
	if members(a.base) != 1 {
		t.Errorf("the older member sees %d members, want itself alone", members(a.base))
	}

	h.heal(0, 1)
	b = start(1) // what the process supervisor does
	waitFor(t, 60*time.Second, func() bool { return members(a.base) == 2 && members(b.base) == 2 })
	for i := range 6 {
		if status := send(b.base, fmt.Sprint("c", i), fmt.Sprint("after-", i), 20*time.Second); status != http.StatusOK {
			t.Errorf("after the partition, chat c%d through b: %d, want 200", i, status)
		}
	}

	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	waitFor(t, 60*time.Second, func() bool {
		var pending int
		err := conn.QueryRow(context.Background(), `SELECT COUNT(*) FROM messages WHERE role = 'user' AND status = 'pending'`).Scan(&pending)
		return err == nil && pending == 0
	})
	rows, err := conn.Query(context.Background(), `SELECT m.message_id, COUNT(*),
			(SELECT COUNT(*) FROM outbox o WHERE m.message_id = ANY(o.in_reply_to))
		FROM messages m WHERE m.role = 'user' GROUP BY m.message_id`)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]bool{}
	for rows.Next() {
		var id string
		var copies, answers int
		if err := rows.Scan(&id, &copies, &answers); err != nil {
			t.Fatal(err)
		}
		stored[id] = true
		if copies != 1 || answers != 1 {
			t.Errorf("message %s: stored %d times, answered %d times; want once and once", id, copies, answers)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for id := range acked {
		if !stored[id] {
			t.Errorf("message %s was acknowledged and is not stored", id)
		}
	}
	var gaps int
	err = conn.QueryRow(context.Background(), `SELECT COUNT(*) FROM (
			SELECT session_id, MAX(seq) - COUNT(*) AS gap, COUNT(DISTINCT seq) - COUNT(*) AS reused
			FROM messages GROUP BY session_id) s WHERE gap <> 0 OR reused <> 0`).Scan(&gaps)
	if err != nil || gaps != 0 {
		t.Errorf("%d sessions whose seqs have a gap or a reuse (%v)", gaps, err)
	}
	// Both sides run alone only from the moment each blocks the other until b's next renewal,
	// under a second: whether a key's session moved across in that window (and the older
	// side was fenced out) varies; TestSharedStoreFencesTheOlderActivation covers that path.
	t.Logf("%d messages acknowledged, %d stored; %d sessions of a fenced out during the split",
		len(acked), len(stored), fenced)
	if err := a.stop(t, 30*time.Second); err != nil {
		t.Errorf("a: %v", err)
	}
	if err := b.stop(t, 30*time.Second); err != nil {
		t.Errorf("b: %v", err)
	}
}
