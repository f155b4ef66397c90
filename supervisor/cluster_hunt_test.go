//go:build !race

// A multi-member cluster test: without -race, as cluster_test.go says why.

package supervisor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/postgres"
	"github.com/agentgate/agentgate/platforms"
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
	seeds, steps := clusterHuntSeeds, clusterHuntSteps
	if v := os.Getenv("AGENTGATE_CLUSTER_SEEDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("AGENTGATE_CLUSTER_SEEDS=%q: %v", v, err)
		}
		seeds = nil
		base := uint64(time.Now().UnixNano())
		for i := range n {
			seeds = append(seeds, base+uint64(i))
		}
	}
	if v := os.Getenv("AGENTGATE_CLUSTER_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("AGENTGATE_CLUSTER_SEED=%q: %v", v, err)
		}
		seeds = []uint64{s}
	}
	if v := os.Getenv("AGENTGATE_CLUSTER_STEPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("AGENTGATE_CLUSTER_STEPS=%q: %v", v, err)
		}
		steps = n
	}
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

// clusterHuntSeeds are the seeds the suite always runs (~15 s each on 2 cores).
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
}

// huntAck is one delivery the hunt made and what it got back.
type huntAck struct {
	id, text, cmd string
	src           identity.Source
	key           string
	via           string // the member it went to
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
		}
	})
	return h
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
	r := startClusterMember(t, dsn, h.agentOf(name), h.drain, func(c *config.Config) {
		c.Sessions.Queue.Mode = h.mode
	})
	m := &huntMember{name: name, role: role, r: r, state: "live", done: make(chan struct{})}
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
	if _, err := h.admin.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, m.role); err != nil {
		t.Fatal(err)
	}
	m.r.d.cluster.Remote.Shutdown(false)
}

// agentOf is the agent of member name: it waits the delay its message asks for ("d=<ms>"), then
// runs the exec agent, and tells the recorder when the call begins and ends.
func (h *hunt) agentOf(member string) agents.Agent {
	return agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		c := h.rec.begin(member, req)
		if c == nil { // a dead member runs nothing
			<-ctx.Done()
			return nil, ctx.Err()
		}
		delay := time.Duration(huntInt(req.Messages[len(req.Messages)-1].Text, "d=")) * time.Millisecond
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

// huntInt reads the number after tag in text; 0 if there is none.
func huntInt(text, tag string) int {
	_, after, ok := strings.Cut(text, tag)
	if !ok {
		return 0
	}
	end := strings.IndexFunc(after, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(after)
	}
	n, _ := strconv.Atoi(after[:end])
	return n
}

// run drives the cluster through steps random actions.
func (h *hunt) run(steps int) {
	for range steps {
		switch p := h.rng.IntN(100); {
		case p < 45:
			for range 1 + h.rng.IntN(4) {
				h.message()
			}
		case p < 62:
			h.command()
		case p < 66:
			h.redeliver()
		case p < 80:
			h.waitSome()
		default:
			h.memberChange()
		}
	}
}

func (h *hunt) message() {
	h.nextID++
	id := fmt.Sprint("m", h.nextID)
	d := h.rng.IntN(200)
	if h.rng.IntN(5) == 0 {
		d = 500 + h.rng.IntN(2000) // a slow turn: it may outlast a member's drain
	}
	h.send(h.srcs[h.rng.IntN(len(h.srcs))], id, fmt.Sprintf("%s d=%d", id, d), "")
}

func (h *hunt) command() {
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
	h.send(h.srcs[h.rng.IntN(len(h.srcs))], id, text, cmd)
}

// redeliver sends an earlier message again, with its id, through a random member (a
// platform's retry that reaches another member).
func (h *hunt) redeliver() {
	if len(h.acks) == 0 {
		return
	}
	orig := h.acks[h.rng.IntN(len(h.acks))]
	a := h.send(orig.src, orig.id, orig.text, orig.cmd)
	a.redo = true
}

func (h *hunt) send(src identity.Source, id, text, cmd string) *huntAck {
	live := h.live()
	m := live[h.rng.IntN(len(live))]
	a := &huntAck{id: id, text: text, cmd: cmd, src: src, key: m.r.d.intake.Key(src), via: m.name, arrive: len(h.acks)}
	ctx, cancel := context.WithTimeout(h.t.Context(), 60*time.Second)
	defer cancel()
	a.ack, a.err = m.r.fake.Inject(ctx, &platforms.Inbound{Source: src, MessageID: id, Text: text})
	h.acks = append(h.acks, a)
	if first, ok := h.byID[id]; !ok || !first.accepted() && a.accepted() {
		h.byID[id] = a
	}
	h.logf("%s %s via %s %q → %s", id, src.UserID, m.name, text, a.describe())
	return a
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
			snap, err := h.store.LoadSession(t.Context(), key, 0)
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
	cancelled, killed      bool
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

func (r *huntRecorder) begin(member string, req *agents.Request) *huntCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dead[member] {
		return nil
	}
	r.events++
	c := &huntCall{member: member, key: req.Identity.SessionKey, sid: req.Identity.SessionID, turn: req.Identity.TurnID, start: r.events}
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

// check compares what the hunt saw and what the store holds with the guarantees.
func (h *hunt) check() {
	t := h.t
	ctx := t.Context()
	h.rec.mu.Lock()
	calls := slices.Clone(h.rec.calls)
	overlaps := slices.Clone(h.rec.overlaps)
	h.rec.mu.Unlock()
	for _, c := range calls {
		h.logf("call %s on %s %s msgs=%v events %d–%d cancelled=%v killed=%v", c.turn, c.member, c.sid, c.msgs, c.start, c.end, c.cancelled, c.killed)
	}
	for _, a := range h.acks {
		if h.byID[a.id] == a && !a.accepted() {
			if row, err := h.store.FindInbound(ctx, a.src.Platform, a.src.ChatID, a.id); err == nil {
				a.stored = row
			}
		}
	}

	// Stored exactly once, in the session it was acknowledged in, and done.
	for _, a := range h.acks {
		if h.byID[a.id] != a || !a.taken() || a.cmd != "" {
			continue
		}
		var n int
		if err := h.admin.QueryRow(ctx, `SELECT COUNT(*) FROM messages WHERE message_id = $1 AND role = 'user'`, a.id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("%s (%s) is stored %d times, want once", a.id, a.describe(), n)
		}
		row, err := h.store.FindInbound(ctx, a.src.Platform, a.src.ChatID, a.id)
		if err != nil {
			t.Errorf("%s (%s): no stored row: %v", a.id, a.describe(), err)
			continue
		}
		if a.accepted() && row.SessionID != a.ack.SessionID {
			t.Errorf("%s acknowledged in session %s, stored in %s", a.id, a.ack.SessionID, row.SessionID)
		}
		if row.Status == persistence.StatusPending {
			t.Errorf("%s is still pending after everything ended", a.id)
		}
		a.stored = row
	}

	// Answered exactly once, in its own session, with its own identity, in arrival order.
	for _, key := range h.uniqueKeys() {
		entries, err := h.store.OutboxAfter(ctx, key, 0, 100000)
		if err != nil {
			t.Fatal(err)
		}
		answered := map[string]int{}
		lastArrive, lastID := -1, ""
		for _, e := range entries {
			h.logf("outbox %s #%d %s %s turn=%s in_reply_to=%v %s %.70q", key, e.Seq, e.SessionID, e.Kind, e.TurnID, e.InReplyTo, e.State, e.Text)
			for _, id := range e.InReplyTo {
				answered[id]++
				a := h.byID[id]
				if a == nil {
					t.Errorf("outbox %s #%d answers %s, which was never sent", key, e.Seq, id)
					continue
				}
				if a.key != key {
					t.Errorf("outbox %s #%d answers %s of key %s", key, e.Seq, id, a.key)
				}
				// (A boundary's notice, in the new session, answers what it cut short in the old.)
				if e.Kind == platforms.KindReply && a.stored != nil && a.cmd == "" && a.stored.SessionID != e.SessionID {
					t.Errorf("outbox %s #%d in session %s answers %s, stored in session %s", key, e.Seq, e.SessionID, id, a.stored.SessionID)
				}
				if a.cmd != "" || answered[id] > 1 {
					continue
				}
				if a.arrive < lastArrive {
					t.Errorf("key %s: %s (arrived #%d) answered after %s (arrived #%d), at outbox #%d", key, id, a.arrive, lastID, lastArrive, e.Seq)
				}
				lastArrive, lastID = a.arrive, id
			}
			if e.State != "delivered" {
				t.Errorf("outbox %s #%d is %s after everything ended", key, e.Seq, e.State)
			}
			if e.Kind != platforms.KindReply {
				continue
			}
			env := parseHuntReply(e.Text)
			if env == nil {
				t.Errorf("reply %s #%d is not the agent's: %.80q", key, e.Seq, e.Text)
				continue
			}
			a := h.byID[env["MESSAGE_ID"]]
			switch {
			case env["SESSION_KEY"] != key || env["SESSION_ID"] != e.SessionID || env["TURN_ID"] != e.TurnID || env["COUNT"] != "11":
				t.Errorf("reply %s #%d of session %s turn %s carries the identity %v", key, e.Seq, e.SessionID, e.TurnID, env)
			case a == nil || !slices.Contains(e.InReplyTo, a.id):
				t.Errorf("reply %s #%d answers %v but ran for message %s", key, e.Seq, e.InReplyTo, env["MESSAGE_ID"])
			case a.src.ChatID != env["CHAT_ID"] || a.src.ThreadID != env["THREAD_ID"] || a.src.UserID != env["USER_ID"] || env["PLATFORM"] != a.src.Platform:
				t.Errorf("reply %s #%d for %s (of %s) ran as chat %s thread %s user %s", key, e.Seq, a.id, a.src.UserID, env["CHAT_ID"], env["THREAD_ID"], env["USER_ID"])
			}
		}
		for _, a := range h.acks {
			if h.byID[a.id] != a || a.key != key || a.cmd != "" && !a.accepted() {
				continue // a command refused with an error may have acted or not
			}
			switch n := answered[a.id]; {
			case a.taken() && n != 1:
				t.Errorf("%s (%s via %s) answered %d times, want once", a.id, a.describe(), a.via, n)
			case !a.taken() && n > 0:
				t.Errorf("%s (%s) was not taken but answered %d times", a.id, a.describe(), n)
			}
		}
	}
	for _, a := range h.acks {
		if a.redo && h.byID[a.id] != a && h.byID[a.id].accepted() && a.err == nil && a.ack.Disposition != platforms.Duplicate {
			t.Errorf("%s re-delivered via %s after it was accepted: %s, want duplicate", a.id, a.via, a.describe())
		}
	}

	// No two turns of a session at once on two members. A call cut short (an interrupt,
	// /stop, a drain's deadline) may still be ending as the next begins (docs/ARCHITECTURE.md,
	// "A cancelled turn ... is not awaited").
	for _, o := range overlaps {
		run, next := o[0], o[1]
		if run.cancelled || run.killed && run.end < next.start {
			continue
		}
		t.Errorf("key %s: turn %s (msgs %v) began on %s at event %d while turn %s (msgs %v) ran on %s (events %d–%d)",
			next.key, next.turn, next.msgs, next.member, next.start, run.turn, run.msgs, run.member, run.start, run.end)
	}

	// Per key, messages first run in arrival order (calls cut short excepted: see above).
	for _, key := range h.uniqueKeys() {
		seen := map[string]bool{}
		prev, prevID := -1, ""
		for _, c := range calls {
			if c.key != key || c.cancelled || c.killed {
				continue
			}
			for _, id := range c.msgs {
				a := h.byID[id]
				if seen[id] || a == nil {
					continue
				}
				seen[id] = true
				if a.arrive < prev {
					t.Errorf("key %s: %s (arrived #%d) first ran after %s (arrived #%d), in turn %s on %s", key, id, a.arrive, prevID, prev, c.turn, c.member)
				}
				prev, prevID = a.arrive, id
			}
		}
	}

	// A boundary is never undone: once /new or /reset moved a key to a new session, nothing
	// is acknowledged in the old one, which stays ended.
	ended := map[string]string{} // session id → the boundary that ended it
	cur := map[string]string{}
	for _, a := range h.acks {
		if !a.accepted() || a.ack.SessionID == "" {
			continue
		}
		sid := a.ack.SessionID
		if by, ok := ended[sid]; ok {
			t.Errorf("%s (%q) acknowledged in session %s, which %s ended", a.id, a.text, sid, by)
		}
		if (a.cmd == "new" || a.cmd == "reset") && cur[a.key] != "" && cur[a.key] != sid {
			ended[cur[a.key]] = a.id
		}
		cur[a.key] = sid
	}
	for sid, by := range ended {
		s, err := h.store.Session(ctx, sid)
		if err != nil {
			t.Errorf("session %s: %v", sid, err)
			continue
		}
		if s.EndedAt.IsZero() || s.EndReason != "new_command" && s.EndReason != "reset_command" {
			t.Errorf("session %s, ended by %s, is ended at %v for %q", sid, by, s.EndedAt, s.EndReason)
		}
	}
	for key, sid := range cur {
		r, err := h.store.Route(ctx, key)
		if err != nil || r.SessionID != sid {
			t.Errorf("key %s routes to %+v (%v), want session %s, the last acknowledged", key, r, err, sid)
		}
	}
	for _, c := range calls {
		if by, ok := ended[c.sid]; ok && !c.cancelled && !c.killed {
			if b := h.byID[by]; b != nil && slices.ContainsFunc(c.msgs, func(id string) bool { a := h.byID[id]; return a != nil && a.arrive > b.arrive }) {
				t.Errorf("turn %s ran messages %v in session %s, which %s ended before they arrived", c.turn, c.msgs, c.sid, by)
			}
		}
	}
	events := map[string]int{}
	for _, m := range h.members {
		events[m.state]++
	}
	t.Logf("%d deliveries, %d agent calls, %d overlaps of a cut-short call, members: %v", len(h.acks), len(calls), len(overlaps), events)
}
