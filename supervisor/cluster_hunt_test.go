//go:build !race

// A multi-member cluster test: without -race, as cluster_test.go says why.

package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/postgres"
	"github.com/agentgate/agentgate/platforms"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
	"github.com/jackc/pgx/v5"
)

// TestClusterHunt drives a cluster through seeded random interleavings of messages to any
// member, commands (/new, /reset, /stop, /queue), slow turns, platform re-deliveries through
// another member, and membership changes: members that leave gracefully (while traffic goes
// on), join, are stopped abruptly, or are restarted one at a time. It then checks what users
// see against the guarantees of DESIGN §1 in cluster mode: every acknowledged message is stored
// once and answered once, in its own session, in arrival order per session; each reply carries
// the identity its own turn's command ran with (the exec agent prints its AGENTGATE_*
// environment); no two turns of a session run at once on two members (owner epoch fencing);
// and a boundary (/new, /reset) is never undone by a member change.
//
// Everything is real: PostgreSQL (pgtest), the members' actors, protoactor's cluster over
// loopback gRPC, the exec agent running /bin/sh. A member stopped abruptly is cut off as a kill
// -9 would cut it: its database role stops logging in and its connections are terminated (its
// transactions roll back), its cluster port closes, its agent calls end (they are not recorded
// past that point, as Pdeathsig would end a command) and its platform delivers nothing more.
// Its registration stays until it expires (cluster.member_ttl), as a dead process's does.
//
// AGENTGATE_CLUSTER_SEEDS=N runs N new seeds instead of the fixed ones; AGENTGATE_CLUSTER_SEED=S
// runs seed S alone (to replay a failure); AGENTGATE_CLUSTER_STEPS sets the steps per seed.
func TestClusterHunt(t *testing.T) {
	seeds, steps := testutil.HuntSeeds(t, "AGENTGATE_CLUSTER", clusterHuntSeeds, clusterHuntSteps)
	script := MustExecAgent(t, clusterHuntScript)
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			h := newHunt(t, seed, script)
			h.run(steps)
			h.quiesce()
			h.check()
		})
	}
}

// clusterHuntSeeds are the seeds the suite always runs (~35 s together on 2 cores).
var clusterHuntSeeds = []uint64{1, 2}

const clusterHuntSteps = 24

// clusterHuntScript is the exec agent's command: it answers with the AGENTGATE_* environment
// it was given, and how many such variables it saw.
const clusterHuntScript = `IFS= read -r line
printf 'ok|%s|%s|%s|%s|%s|%s|%s|%s|%s' "$AGENTGATE_SESSION_KEY" "$AGENTGATE_SESSION_ID" \
  "$AGENTGATE_CHAT_ID" "$AGENTGATE_THREAD_ID" "$AGENTGATE_USER_ID" "$AGENTGATE_MESSAGE_ID" \
  "$AGENTGATE_TURN_ID" "$AGENTGATE_PLATFORM" "$(env | grep -c '^AGENTGATE_')"`

// huntEnv names the fields the script prints, in its order.
var huntEnv = []string{"SESSION_KEY", "SESSION_ID", "CHAT_ID", "THREAD_ID", "USER_ID", "MESSAGE_ID", "TURN_ID", "PLATFORM", "COUNT"}

func parseHuntReply(text string) map[string]string {
	parts := strings.Split(text, "|")
	if len(parts) != len(huntEnv)+1 || parts[0] != "ok" {
		return nil
	}
	env := map[string]string{}
	for i, k := range huntEnv {
		env[k] = parts[i+1]
	}
	return env
}

// huntRoles numbers the database roles of the hunt's members over the test binary's server.
var huntRoles atomic.Int64

// huntMember is one member the hunt started.
type huntMember struct {
	name  string
	role  string // its database role: a kill stops it logging in
	r     *runtime
	state string // live | leaving | stopped | killed
	done  chan struct{}
	logs  *testutil.Buffer // its log, at Debug (saved when the hunt fails: saveLogs)
}

// huntAck is one delivery the hunt made and what it got back.
type huntAck struct {
	id, text, cmd string
	src           identity.Source
	key           string
	to            *huntMember // the member it went to
	via           string
	wait          bool // an HTTP client waits for its turn (?wait)
	arrive        int
	ack           *platforms.Ack
	err           error
	redo          bool
	stored        *persistence.Message // read at the check
}

func (a *huntAck) accepted() bool {
	if a.err != nil || a.ack == nil {
		return false
	}
	switch a.ack.Disposition {
	case platforms.Started, platforms.Queued, platforms.Collected, platforms.Steered, platforms.Interrupted, platforms.Command:
		return true
	}
	return false
}

// taken: acknowledged as taken, or refused with an error yet stored (a commit whose answer was
// lost): the store decides then, and a stored message must be answered.
func (a *huntAck) taken() bool { return a.accepted() || a.err != nil && a.stored != nil }

func (a *huntAck) describe() string {
	if a.err != nil {
		return "error " + a.err.Error()
	}
	return a.ack.Disposition + " " + a.ack.SessionID
}

type hunt struct {
	t       *testing.T
	rng     *rand.Rand
	seed    uint64
	dsn     string
	admin   *pgx.Conn
	store   *postgres.Store // the checker's own connection, as user postgres
	exec    agents.Agent
	rec     *huntRecorder
	mode    string
	drain   time.Duration
	members []*huntMember
	srcs    []identity.Source
	keys    []string
	acks    []*huntAck
	byID    map[string]*huntAck
	nextID  int
	bg      sync.WaitGroup
	mu      sync.Mutex // guards log and members' state (background stops)
	log     []string
	begun   time.Time
}

func newHunt(t *testing.T, seed uint64, exec agents.Agent) *hunt {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	dsn := pgtest.NewDatabase(t)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.ConnectConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	store, err := postgres.Open(t.Context(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := &hunt{t: t, rng: rng, seed: seed, dsn: dsn, admin: admin, store: store, exec: exec, rec: newHuntRecorder(),
		mode:  []string{"followup", "followup", "collect", "interrupt", "steer"}[rng.IntN(5)],
		drain: time.Duration(300+rng.IntN(2500)) * time.Millisecond,
		byID:  map[string]*huntAck{}, begun: time.Now()}
	h.srcs = []identity.Source{
		{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1", UserID: "u1", UserName: "Ann"},
		{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c2", UserID: "u2", UserName: "Bob"},
		{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c3", UserID: "u3", UserName: "Cy"},
		// One thread shared by two users: one session, two identities.
		{Platform: "fake", ChatType: identity.ChatThread, ChatID: "g1", ThreadID: "th1", UserID: "u4", UserName: "Di", ScopeID: "guild"},
		{Platform: "fake", ChatType: identity.ChatThread, ChatID: "g1", ThreadID: "th1", UserID: "u5", UserName: "Ed", ScopeID: "guild"},
		// A chat of the HTTP API, whose clients may wait (?wait) on any member.
		{Platform: "http", ChatType: identity.ChatDM, ChatID: "h1", UserID: "u6", UserName: "Flo"},
	}
	n := 2 + rng.IntN(2)
	h.logf("config: members=%d mode=%s drain=%v", n, h.mode, h.drain)
	for range n {
		h.join()
	}
	for _, src := range h.srcs {
		h.keys = append(h.keys, h.members[0].r.d.intake.Key(src))
	}
	t.Cleanup(func() {
		h.bg.Wait()
		var wg sync.WaitGroup
		for _, m := range h.members {
			if m.state == "live" || m.state == "killed" {
				wg.Go(func() { h.stopMember(m) })
			}
		}
		wg.Wait()
		store.Close()
		admin.Close(context.Background())
		if t.Failed() {
			t.Logf("seed %d (replay: AGENTGATE_CLUSTER_SEED=%d); what the hunt did:\n%s", seed, seed, strings.Join(h.log, "\n"))
			h.saveLogs()
		}
	})
	return h
}

// saveLogs keeps each member's Debug log in a directory of its own, which outlives the test, and
// logs where it is, with the members' warnings and errors: what a failed hunt's members did is
// in their Debug lines (a member's view, its activations and releases), which the test's own
// log would drown in.
func (h *hunt) saveLogs() {
	t := h.t
	dir, err := os.MkdirTemp("", fmt.Sprintf("agentgate-hunt-seed%d-", h.seed))
	if err != nil {
		t.Logf("the members' logs are not kept: %v", err)
		return
	}
	for _, m := range h.members {
		text := m.logs.String()
		if err := os.WriteFile(filepath.Join(dir, m.name+".log"), []byte(text), 0o644); err != nil {
			t.Logf("%s's log is not kept: %v", m.name, err)
		}
		var serious []string
		for line := range strings.Lines(text) {
			if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
				serious = append(serious, strings.TrimSuffix(line, "\n"))
			}
		}
		t.Logf("%s's warnings and errors:\n%s", m.name, strings.Join(serious, "\n"))
	}
	t.Logf("each member's Debug log is in %s", dir)
}

func (h *hunt) logf(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.log = append(h.log, fmt.Sprintf("%7.3fs ", time.Since(h.begun).Seconds())+fmt.Sprintf(format, args...))
}

// live returns the members that take traffic.
func (h *hunt) live() []*huntMember {
	h.mu.Lock()
	defer h.mu.Unlock()
	var l []*huntMember
	for _, m := range h.members {
		if m.state == "live" {
			l = append(l, m)
		}
	}
	return l
}

// join starts a member on a database role of its own.
func (h *hunt) join() {
	t := h.t
	n := huntRoles.Add(1)
	role := fmt.Sprint("hunt_member_", n)
	if _, err := h.admin.Exec(t.Context(), `CREATE ROLE `+role+` LOGIN SUPERUSER`); err != nil {
		t.Fatal(err)
	}
	dsn := strings.Replace(h.dsn, "user=postgres", "user="+role, 1)
	if dsn == h.dsn {
		t.Fatalf("the dsn %q names no user postgres", h.dsn)
	}
	name := fmt.Sprint("m", len(h.members))
	logs := &testutil.Buffer{}
	r := MustStartDaemon(t, h.agentOf(name), daemonOpts{drain: h.drain, logs: logs, tweak: func(c *config.Config) {
		clusterOn(dsn)(c)
		c.Sessions.Queue.Mode = h.mode
	}})
	m := &huntMember{name: name, role: role, r: r, state: "live", done: make(chan struct{}), logs: logs}
	h.mu.Lock()
	h.members = append(h.members, m)
	h.mu.Unlock()
	h.logf("join %s (%s)", name, r.d.deps.Node)
}

// leave stops a member gracefully, in the background: traffic goes on through the others.
func (h *hunt) leave(m *huntMember) {
	h.mu.Lock()
	m.state = "leaving"
	h.mu.Unlock()
	h.logf("leave %s", m.name)
	h.bg.Go(func() {
		h.stopMember(m)
		h.mu.Lock()
		m.state = "stopped"
		h.mu.Unlock()
		h.logf("%s stopped", m.name)
	})
}

func (h *hunt) stopMember(m *huntMember) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := m.r.d.Stop(ctx)
	if err != nil && m.state != "killed" {
		h.t.Errorf("stop %s: %v", m.name, err)
	}
	close(m.done)
}

// kill cuts a member off as a kill -9 would.
func (h *hunt) kill(m *huntMember) {
	t := h.t
	h.mu.Lock()
	m.state = "killed"
	h.mu.Unlock()
	h.logf("kill %s", m.name)
	h.rec.kill(m.name)
	m.r.fake.SetSendError(errors.New("the member is dead"))
	if _, err := h.admin.Exec(t.Context(), `ALTER ROLE `+m.role+` NOLOGIN`); err != nil {
		t.Fatal(err)
	}
	// Until none is left: a termination is asynchronous, and a backend that passed its login
	// check just before the NOLOGIN committed shows in pg_stat_activity only a moment later
	// (as TestClusterRequestToAMemberRestartedOnItsPortIsSentAgain found): the store's retry of
	// a call whose connection died dials anew, and a backend left alive would let a killed
	// member write on.
	waitUntil(t, func() bool {
		var n int
		err := h.admin.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = $1`, m.role).Scan(&n)
		return err == nil && n == 0
	})
	m.r.d.cluster.Remote.Shutdown(false)
}

// agentOf is the agent of member name: it waits the delay its message asks for ("d=<ms>"), then
// runs the exec agent, and tells the recorder when the call begins and ends.
func (h *hunt) agentOf(member string) agents.Agent {
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		c := h.rec.begin(member, req, ctx.Err() != nil)
		if c == nil { // a dead member runs nothing
			<-ctx.Done()
			return nil, ctx.Err()
		}
		defer context.AfterFunc(ctx, func() { h.rec.cancel(c) })()
		delay := time.Duration(testutil.PlanInt(req.Messages[len(req.Messages)-1].Text, "d=")) * time.Millisecond
		timer := time.NewTimer(delay)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ctx.Done():
			h.rec.end(c, true)
			return nil, ctx.Err()
		}
		resp, err := h.exec.Run(ctx, req)
		h.rec.end(c, ctx.Err() != nil)
		return resp, err
	})
}

// run drives the cluster through steps random actions.
func (h *hunt) run(steps int) {
	for range steps {
		switch p := h.rng.IntN(100); {
		case p < 30:
			for range 1 + h.rng.IntN(4) {
				h.message()
			}
		case p < 45:
			h.burst()
		case p < 62:
			h.command()
		case p < 66:
			h.redeliver()
		case p < 69:
			h.adminReset()
		case p < 80:
			h.waitSome()
		default:
			h.memberChange()
		}
	}
}

func (h *hunt) message() { h.send(h.messageOf(h.srcs[h.rng.IntN(len(h.srcs))])) }

func (h *hunt) messageOf(src identity.Source) (identity.Source, string, string, string) {
	h.nextID++
	id := fmt.Sprint("m", h.nextID)
	d := h.rng.IntN(200)
	if h.rng.IntN(5) == 0 {
		d = 500 + h.rng.IntN(2000) // a slow turn: it may outlast a member's drain
	}
	return src, id, fmt.Sprintf("%s d=%d", id, d), ""
}

func (h *hunt) command() { h.send(h.commandOf(h.srcs[h.rng.IntN(len(h.srcs))])) }

func (h *hunt) commandOf(src identity.Source) (identity.Source, string, string, string) {
	h.nextID++
	id := fmt.Sprint("k", h.nextID)
	var text string
	switch p := h.rng.IntN(100); {
	case p < 25:
		text = "/new"
	case p < 45:
		text = "/reset"
	case p < 65:
		text = "/stop"
	case p < 90:
		text = "/queue " + []string{"followup", "collect", "interrupt", "steer"}[h.rng.IntN(4)]
	default:
		text = "/status"
	}
	cmd, _, _ := strings.Cut(strings.TrimPrefix(text, "/"), " ")
	return src, id, text, cmd
}

// redeliver sends an earlier message again, with its id, through a random member (a
// platform's retry that reaches another member).
func (h *hunt) redeliver() {
	if len(h.acks) == 0 {
		return
	}
	orig := h.acks[h.rng.IntN(len(h.acks))]
	if orig.cmd == "admin" {
		return
	}
	a := h.send(orig.src, orig.id, orig.text, orig.cmd)
	a.redo = true
}

func (h *hunt) send(src identity.Source, id, text, cmd string) *huntAck {
	a := h.plan(src, id, text, cmd)
	h.deliver(a)
	h.record(a)
	return a
}

// plan draws where a delivery goes (and whether an HTTP client waits) and gives it its place in
// the order of arrival; deliver sends it. Within a key, deliveries are sent in plan order.
func (h *hunt) plan(src identity.Source, id, text, cmd string) *huntAck {
	live := h.live()
	m := live[h.rng.IntN(len(live))]
	a := &huntAck{id: id, text: text, cmd: cmd, src: src, key: m.r.d.intake.Key(src), to: m, via: m.name, arrive: len(h.acks),
		wait: src.Platform == "http" && h.rng.IntN(3) == 0}
	h.acks = append(h.acks, a)
	return a
}

func (h *hunt) deliver(a *huntAck) {
	ctx, cancel := context.WithTimeout(h.t.Context(), 60*time.Second)
	defer cancel()
	if a.src.Platform == "http" {
		a.ack, a.err = h.post(ctx, a)
	} else {
		a.ack, a.err = a.to.r.fake.Inject(ctx, &platforms.Inbound{Source: a.src, MessageID: a.id, Text: a.text})
	}
	h.logf("%s %s via %s %q → %s", a.id, a.src.UserID, a.via, a.text, a.describe())
}

// record makes a the delivery of its id that counts: the first, or the first taken.
func (h *hunt) record(a *huntAck) {
	if first, ok := h.byID[a.id]; !ok || !first.accepted() && a.accepted() {
		h.byID[a.id] = a
	}
}

// burst sends messages and commands of several chats at once: each chat's in order, on a
// goroutine of its own.
func (h *hunt) burst() {
	var keys []string
	byKey := map[string][]*huntAck{}
	for range 2 + h.rng.IntN(3) {
		src := h.srcs[h.rng.IntN(len(h.srcs))]
		for range 1 + h.rng.IntN(3) {
			var a *huntAck
			if h.rng.IntN(5) == 0 {
				a = h.plan(h.commandOf(src))
			} else {
				a = h.plan(h.messageOf(src))
			}
			if byKey[a.key] == nil {
				keys = append(keys, a.key)
			}
			byKey[a.key] = append(byKey[a.key], a)
		}
	}
	var wg sync.WaitGroup
	for _, key := range keys {
		wg.Go(func() {
			for _, a := range byKey[key] {
				h.deliver(a)
			}
		})
	}
	wg.Wait()
	for _, key := range keys {
		for _, a := range byKey[key] {
			h.record(a)
		}
	}
}

// adminReset resets a session through the HTTP API of a random member (POST
// /v1/sessions/{key}/reset), which routes it to the member that runs the session: a boundary,
// as /reset is.
func (h *hunt) adminReset() {
	live := h.live()
	m := live[h.rng.IntN(len(live))]
	src := h.srcs[h.rng.IntN(len(h.srcs))]
	h.nextID++
	a := &huntAck{id: fmt.Sprint("admin", h.nextID), cmd: "admin", text: "POST reset", src: src, key: m.r.d.intake.Key(src),
		to: m, via: m.name, arrive: len(h.acks)}
	ctx, cancel := context.WithTimeout(h.t.Context(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+m.r.d.Addr().String()+"/v1/sessions/"+url.PathEscape(a.key)+"/reset", nil)
	if err != nil {
		h.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.logf("admin reset %s via %s: %v", a.key, m.name, err)
		return
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var info httpplatform.SessionInfo
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &info) != nil {
		h.logf("admin reset %s via %s: %d %s", a.key, m.name, resp.StatusCode, raw)
		return
	}
	a.ack = &platforms.Ack{SessionKey: info.SessionKey, SessionID: info.SessionID, Disposition: platforms.Command}
	h.acks = append(h.acks, a)
	h.record(a)
	h.logf("%s via %s: %s %s → %s", a.id, m.name, a.key, info.PrevSessionID, info.SessionID)
}

// post sends a's message to m's HTTP API, now and then waiting for its turn (?wait). A 200
// carries the replies of the turn that handled it: they must be of its own session key and
// carry the identity of their own turn.
func (h *hunt) post(ctx context.Context, a *huntAck) (*platforms.Ack, error) {
	m, wait := a.to, a.wait
	url := "http://" + m.r.d.Addr().String() + "/v1/messages"
	if wait {
		url += "?wait=3s"
	}
	body, _ := json.Marshal(map[string]string{"chat_id": a.src.ChatID, "user_id": a.src.UserID, "user_name": a.src.UserName,
		"message_id": a.id, "text": a.text})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var got httpplatform.MessageResponse
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
		return nil, fmt.Errorf("POST: %d %s", resp.StatusCode, raw)
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		return nil, fmt.Errorf("POST: %d %s: %w", resp.StatusCode, raw, err)
	}
	if got.SessionKey != a.key || got.MessageID != a.id {
		h.t.Errorf("POST %s to %s: answered for message %s of %s", a.id, m.name, got.MessageID, got.SessionKey)
	}
	for _, r := range got.Replies {
		if r.Kind != platforms.KindReply {
			continue
		}
		if env := parseHuntReply(r.Text); env == nil || env["SESSION_KEY"] != a.key || env["TURN_ID"] != r.TurnID {
			h.t.Errorf("POST %s?wait to %s: reply of turn %s is %.80q", a.id, m.name, r.TurnID, r.Text)
		}
	}
	if wait {
		h.logf("%s waited on %s: %d, %d replies", a.id, m.name, resp.StatusCode, len(got.Replies))
	}
	return &platforms.Ack{SessionKey: got.SessionKey, SessionID: got.SessionID, MessageID: got.MessageID,
		Disposition: got.Disposition, QueueDepth: got.QueueDepth}, nil
}

// waitSome waits until an earlier message is answered (a pause that lets turns run and end).
func (h *hunt) waitSome() {
	var open []*huntAck
	for _, a := range h.acks {
		if a.accepted() && a.cmd == "" && !a.redo {
			open = append(open, a)
		}
	}
	if len(open) == 0 {
		return
	}
	a := open[len(open)-1-h.rng.IntN(min(3, len(open)))]
	deadline := time.Now().Add(30 * time.Second)
	for len(h.answers(a.key)[a.id]) == 0 {
		if time.Now().After(deadline) {
			h.t.Errorf("%s (%s) not answered within 30s", a.id, a.describe())
			return
		}
		time.Sleep(20 * time.Millisecond) // a poll interval under a deadline
	}
	h.logf("%s answered", a.id)
}

// answers returns the outbox entries of key by the message ids they answer.
func (h *hunt) answers(key string) map[string][]persistence.OutboxEntry {
	entries, err := h.store.OutboxAfter(h.t.Context(), key, 0, 100000)
	if err != nil {
		h.t.Fatal(err)
	}
	by := map[string][]persistence.OutboxEntry{}
	for _, e := range entries {
		for _, id := range e.InReplyTo {
			by[id] = append(by[id], e)
		}
	}
	return by
}

func (h *hunt) memberChange() {
	live := h.live()
	h.mu.Lock()
	running := 0
	for _, m := range h.members {
		if m.state == "live" || m.state == "leaving" {
			running++
		}
	}
	h.mu.Unlock()
	switch p := h.rng.IntN(100); {
	case p < 30 && running < 3:
		h.join()
	case p < 55 && len(live) > 1:
		h.leave(live[h.rng.IntN(len(live))])
	case p < 75 && len(live) > 1:
		h.kill(live[h.rng.IntN(len(live))])
	case p < 100 && len(live) > 1:
		// A rolling restart's step: one member stops while a new one starts.
		h.leave(live[h.rng.IntN(len(live))])
		h.join()
	default:
		h.join()
	}
}

// quiesce waits for the stops to end, then for every taken message to be answered and for no
// key to have work left (pending messages, unconfirmed replies).
func (h *hunt) quiesce() {
	t := h.t
	h.bg.Wait()
	h.logf("quiesce")
	deadline := time.Now().Add(90 * time.Second)
	for {
		var stuck []string
		for _, key := range h.uniqueKeys() {
			snap, err := h.store.LoadSession(t.Context(), key, 0, 0)
			if errors.Is(err, persistence.ErrNotFound) {
				continue
			}
			if err != nil {
				stuck = append(stuck, fmt.Sprintf("%s: %v", key, err))
				continue
			}
			if len(snap.Pending) > 0 || len(snap.Unconfirmed) > 0 {
				var pend []string
				for _, m := range snap.Pending {
					pend = append(pend, fmt.Sprint(m.Seq, ":", m.MessageID))
				}
				stuck = append(stuck, fmt.Sprintf("%s: pending %v, %d unconfirmed", key, pend, len(snap.Unconfirmed)))
			}
		}
		if len(stuck) == 0 {
			h.logf("quiet")
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("work left 90s after the hunt:\n%s", strings.Join(stuck, "\n"))
			return
		}
		time.Sleep(50 * time.Millisecond) // a poll interval under a deadline
	}
}

func (h *hunt) uniqueKeys() []string { return slices.Compact(slices.Sorted(slices.Values(h.keys))) }

// huntCall is one agent call as the recorder saw it.
type huntCall struct {
	member, key, sid, turn string
	msgs                   []string
	start, end             int // event numbers; end 0 while it runs
	// cancelAt is the event at which the call's context was cancelled (0 if it never was);
	// bornCancelled: it was cancelled before the call began (a turn cut short before its agent
	// was called).
	cancelAt          int
	cancelled, killed bool
	bornCancelled     bool
}

// huntRecorder records the agent calls of every member in one order of events.
type huntRecorder struct {
	mu       sync.Mutex
	events   int
	calls    []*huntCall
	dead     map[string]bool
	overlaps [][2]*huntCall // a call that began while another of its key ran: {running, new}
}

func newHuntRecorder() *huntRecorder { return &huntRecorder{dead: map[string]bool{}} }

// cancel records that c's context was cancelled.
func (r *huntRecorder) cancel(c *huntCall) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.cancelAt == 0 && c.end == 0 {
		r.events++
		c.cancelAt = r.events
	}
}

func (r *huntRecorder) begin(member string, req *agents.Request, cancelled bool) *huntCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dead[member] {
		return nil
	}
	r.events++
	c := &huntCall{member: member, key: req.Identity.SessionKey, sid: req.Identity.SessionID, turn: req.Identity.TurnID, start: r.events,
		bornCancelled: cancelled}
	for _, m := range req.Messages {
		c.msgs = append(c.msgs, m.MessageID)
	}
	for _, o := range r.calls {
		if o.key == c.key && o.end == 0 {
			r.overlaps = append(r.overlaps, [2]*huntCall{o, c})
		}
	}
	r.calls = append(r.calls, c)
	return c
}

func (r *huntRecorder) end(c *huntCall, cancelled bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.end != 0 { // ended by its member's death
		return
	}
	r.events++
	c.end, c.cancelled = r.events, cancelled
	if cancelled && c.cancelAt == 0 { // it heard of its cancel before context.AfterFunc ran
		c.cancelAt = c.end
	}
}

// kill ends the calls of a member that dies (its commands die with it) and runs nothing of it
// after.
func (r *huntRecorder) kill(member string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dead[member] = true
	r.events++
	for _, c := range r.calls {
		if c.member == member && c.end == 0 {
			c.end, c.killed = r.events, true
		}
	}
}
