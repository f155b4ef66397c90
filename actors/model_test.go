package actors

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	agentexec "github.com/agentgate/agentgate/agents/exec"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/platformtest"
	"github.com/asynkron/protoactor-go/actor"
)

// The model test drives a few sessions through seeded random interleavings of messages,
// commands, slow, failing and crashing agent turns, passivations and daemon restarts on the
// same database, then checks what users see (acknowledgments, the exec agent's environment,
// replies and notices) and what the store holds against the guarantees of DESIGN §1: G1
// identity, G2 order, G4 no silent drop (and no duplicate answer), G6 boundaries, and the
// rows agreeing with what was delivered.
//
// Everything is real but the process edges: SQLite in a temp dir, the persistence, platform,
// manager, session and turn actors, and the exec agent running /bin/sh for every turn; the
// agent is wrapped to be slow, to crash, or to take steered messages on cue, and the platform
// is platformtest.Fake. Time is the synctest bubble's.
//
// AGENTGATE_MODEL_SEEDS=N runs N seeds instead of the fixed ones; AGENTGATE_MODEL_STEPS sets
// the steps per seed; AGENTGATE_MODEL_SEED=S runs the one seed S (to replay a failure).

// modelSeeds are the seeds the suite always runs (small: ~1 s each under -race).
var modelSeeds = []uint64{1, 2, 3, 4, 5, 6, 7, 8}

const modelSteps = 40

func TestModelSessions(t *testing.T) {
	seeds, steps := testutil.HuntSeeds(t, "AGENTGATE_MODEL", modelSeeds, modelSteps)
	script := modelScript(t)
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				m := newModel(t, seed, script)
				m.run(steps)
				m.check()
			})
		})
	}
}

// modelScript writes the exec agent's command: it answers with the AGENTGATE_* environment it
// was given (and how many such variables it saw), and fails (exit 3) when the text of its
// triggering message asks it to.
func modelScript(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.sh")
	script := `IFS= read -r line
printf 'ok|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s' "$AGENTGATE_PLATFORM" "$AGENTGATE_SESSION_KEY" \
  "$AGENTGATE_SESSION_ID" "$AGENTGATE_CHAT_ID" "$AGENTGATE_CHAT_TYPE" "$AGENTGATE_THREAD_ID" \
  "$AGENTGATE_USER_ID" "$AGENTGATE_USER_NAME" "$AGENTGATE_MESSAGE_ID" "$AGENTGATE_TURN_ID" \
  "$AGENTGATE_PROFILE" "$(env | grep -c '^AGENTGATE_')"
case "$line" in *"fail-$AGENTGATE_MESSAGE_ID."*) exit 3;; esac
`
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// modelEnv is the environment fields the script prints, in its order.
var modelEnv = []string{"PLATFORM", "SESSION_KEY", "SESSION_ID", "CHAT_ID", "CHAT_TYPE", "THREAD_ID",
	"USER_ID", "USER_NAME", "MESSAGE_ID", "TURN_ID", "PROFILE", "COUNT"}

// parseModelReply reads the script's answer; nil if it is not one.
func parseModelReply(text string) map[string]string {
	parts := strings.Split(text, "|")
	if len(parts) != len(modelEnv)+1 || parts[0] != "ok" {
		return nil
	}
	env := map[string]string{}
	for i, k := range modelEnv {
		env[k] = parts[i+1]
	}
	return env
}

// modelRun is one call of the agent, as the agent saw it.
type modelRun struct {
	ident      identity.Turn // what the session passed (the env is checked against the model)
	messages   []string      // the ids of the turn's messages, then of those steered into it
	nreq       int           // how many of messages the request carried (the rest were steered)
	texts      []string
	history    []agents.Message
	start, end time.Time
	cancelled  bool
	env        map[string]string // the subprocess's environment; nil if it did not answer
	err        error
	panicked   bool
}

// modelAgent runs the exec agent after the delay the triggering message's text asks for
// ("d=3" seconds), takes steered messages while it waits, and panics after the command when
// the text says "panic-<id>.<n>" and the message has crashed fewer than n times.
type modelAgent struct {
	exec  *agentexec.Agent
	steer bool

	mu      sync.Mutex
	runs    []*modelRun
	crashes map[string]int
}

func (a *modelAgent) CanSteer() bool { return a.steer }

// cancelCleanup is how long a turn cancelled while it waits takes to return, as a command does
// that cleans up on SIGTERM: the next turn of its session must not start before (checkOrder).
const cancelCleanup = 1500 * time.Millisecond

func (a *modelAgent) Run(ctx context.Context, req *agents.Request) (*agents.Response, error) {
	rec := &modelRun{ident: req.Identity, history: slices.Clone(req.History), start: time.Now()}
	for _, m := range req.Messages {
		rec.messages = append(rec.messages, m.MessageID)
		rec.texts = append(rec.texts, m.Text)
	}
	rec.nreq = len(rec.messages)
	a.mu.Lock()
	a.runs = append(a.runs, rec)
	a.mu.Unlock()
	text := req.Messages[len(req.Messages)-1].Text
	delay := time.Duration(testutil.PlanInt(text, "d=")) * time.Second
	sub := *req
	sub.Steer = nil
	sub.Messages = slices.Clone(req.Messages)
	steer := req.Steer
	timer := time.NewTimer(delay)
	defer timer.Stop()
wait:
	for {
		select {
		case <-timer.C:
			break wait
		case m, ok := <-steer:
			if !ok {
				steer = nil
				continue
			}
			a.mu.Lock()
			rec.messages = append(rec.messages, m.MessageID)
			rec.texts = append(rec.texts, m.Text)
			a.mu.Unlock()
			sub.Messages = append(sub.Messages, m)
		case <-ctx.Done():
			time.Sleep(cancelCleanup) // a command cleaning up on SIGTERM
			a.mu.Lock()
			rec.end, rec.cancelled = time.Now(), true
			a.mu.Unlock()
			return nil, ctx.Err()
		}
	}
	resp, err := a.exec.Run(ctx, &sub)
	id := req.Identity.MessageID
	a.mu.Lock()
	rec.end, rec.err, rec.cancelled = time.Now(), err, ctx.Err() != nil
	if resp != nil {
		rec.env = parseModelReply(resp.Text)
	}
	n := testutil.PlanInt(text, "panic-"+id+".")
	crash := n > 0 && a.crashes[id] < n && err == nil
	if crash {
		a.crashes[id]++
		rec.panicked = true
	}
	a.mu.Unlock()
	if crash {
		panic("model agent: planned crash of " + id)
	}
	return resp, err
}

// modelDaemon is one run of the daemon's actors over the model's database.
type modelDaemon struct {
	cancel   context.CancelFunc
	store    *sqlite.Store
	system   *actor.ActorSystem
	d        *Deps
	manager  *actor.PID
	platform *actor.PID
}

// modelAck is one message the model sent and the answer it got.
type modelAck struct {
	id     string
	src    identity.Source
	key    string
	text   string
	cmd    string // the command name, for a command
	arrive int    // arrival order over the whole run
	at     time.Time
	res    *DeliverResult
	err    error
	redo   bool // a re-delivery of an earlier id
	// stored is the message's row, read at the end for an unsure acknowledgment.
	stored *persistence.Message
	// runsBefore is how many agent calls had begun when the acknowledgment arrived.
	runsBefore int
	// ackedAt is when the model had the answer (a write that waits out a locked database's busy
	// timeout takes a while).
	ackedAt time.Time
	// spooled: when it was sent, the message (a re-delivery) was in the spool only, which no
	// session can look into: a session waiting for the spool tells it to send it again.
	spooled bool
}

type model struct {
	t      *testing.T
	rng    *rand.Rand
	seed   uint64
	path   string
	agent  *modelAgent
	fake   *platformtest.Fake
	cfg    SessionConfig
	daemon *modelDaemon
	srcs   []identity.Source
	keys   []string
	acks   []*modelAck
	byID   map[string]*modelAck // the first delivery of each id
	nextID int
	log    []string // what the model did, for a failure's report
	// sessions are the session ids the model saw per key, in order of first sight.
	sessions map[string][]string
	killed   bool                // the daemon was killed at least once (kill)
	titles   map[string][]string // the titles set per key
	// out, set by the outage hunt (TestOutageHunt), fails the database and the spool on cue.
	out *modelOutage
}

func newModel(t *testing.T, seed uint64, script string) *model {
	return newModelOut(t, seed, script, nil)
}

// newModelOut is newModel whose daemon runs with out (nil: the database never fails).
func newModelOut(t *testing.T, seed uint64, script string, out *modelOutage) *model {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ex, err := agentexec.New(agentexec.Config{Command: []string{"/bin/sh", script}, Timeout: time.Hour, KillGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m := &model{t: t, rng: rng, seed: seed, path: filepath.Join(t.TempDir(), "agentgate.db"),
		agent: &modelAgent{exec: ex, steer: rng.IntN(2) == 0, crashes: map[string]int{}},
		fake:  platformtest.NewFake("fake"), byID: map[string]*modelAck{}, sessions: map[string][]string{},
		titles: map[string][]string{}, out: out}
	m.cfg = SessionConfig{Keys: identity.DefaultKeyOptions, PassivateAfter: 20 * time.Second,
		QueueMode: []string{ModeFollowup, ModeCollect, ModeInterrupt, ModeSteer}[rng.IntN(4)],
		QueueCap:  []int{2, 50}[rng.IntN(2)], Overflow: []string{"spool", "reject"}[rng.IntN(2)], HistoryLimit: 50,
		Recovery: []string{RecoveryRerun, RecoveryNotice}[rng.IntN(2)], Debounce: []time.Duration{0, 0, 2 * time.Second}[rng.IntN(3)]}
	if rng.IntN(3) == 0 { // sessions idle for 30 s end, as an idle reset policy has them
		p := ResetPolicy{Mode: ResetIdle, Idle: 30 * time.Second, Notify: true}
		m.cfg.ResetFor = func(string, string) ResetPolicy { return p }
		m.cfg.ResetPolicies = []ResetPolicy{p}
	}
	// Two DMs and one thread shared by two users of a group (one session, two identities).
	m.srcs = []identity.Source{
		{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c1", UserID: "u1", UserName: "Ann"},
		{Platform: "fake", ChatType: identity.ChatDM, ChatID: "c2", UserID: "u2", UserName: "Bob"},
		{Platform: "fake", ChatType: identity.ChatThread, ChatID: "g1", ThreadID: "th1", UserID: "u3", UserName: "Cy", ScopeID: "guild"},
		{Platform: "fake", ChatType: identity.ChatThread, ChatID: "g1", ThreadID: "th1", UserID: "u4", UserName: "Di", ScopeID: "guild"},
	}
	for _, src := range m.srcs {
		m.keys = append(m.keys, identity.Key(src, m.cfg.Keys))
	}
	m.logf("config: mode=%s cap=%d overflow=%s recovery=%s debounce=%v idle reset=%v steer=%v", m.cfg.QueueMode, m.cfg.QueueCap,
		m.cfg.Overflow, m.cfg.Recovery, m.cfg.Debounce, m.cfg.ResetFor != nil, m.agent.steer)
	m.start()
	t.Cleanup(func() {
		replay := "AGENTGATE_MODEL_SEED"
		if m.out != nil {
			m.out.heal()
			replay = "AGENTGATE_OUTAGE_SEED"
		}
		if m.daemon != nil {
			m.stop(false)
		}
		if t.Failed() {
			t.Logf("seed %d (replay: %s=%d); what the model did:\n%s", seed, replay, seed, strings.Join(m.log, "\n"))
		}
	})
	return m
}

func (m *model) logf(format string, args ...any) {
	m.log = append(m.log, fmt.Sprintf("%6.1fs ", float64(time.Since(modelEpoch))/float64(time.Second))+fmt.Sprintf(format, args...))
}

// modelEpoch is the bubble's start time (synctest starts every bubble at the same instant).
var modelEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// start runs the daemon's actors over the model's database; the manager recovers what the
// last run left unfinished.
func (m *model) start() {
	t := m.t
	ctx, cancel := context.WithCancel(t.Context())
	var so sqlite.Options
	if m.out != nil {
		// No index pass on a timer: one that waits for the commit mutex while a commit waits
		// out the busy timeout of a locked database (a sync.Mutex, not durably blocked) would
		// stop the bubble's clock.
		so.IndexDelay = 24 * time.Hour
	}
	store, err := sqlite.Open(ctx, m.path, so)
	if err != nil {
		t.Fatal(err)
	}
	system, quiet := quietSystem(t)
	d := &Deps{Ctx: ctx, Store: store, Agent: m.agent, Log: quiet, Metrics: metrics.New("fake"), Node: "test", Config: m.cfg}
	opts := persistence.ActorOptions{MaxBatch: 64, Incarnation: &d.PersistIncarnation}
	if m.out != nil {
		m.out.attach(d, store, &opts) // the outage hunt: a store that fails on cue, and a spool
	}
	d.Persist = system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(ctx, d.Store, opts)))
	if m.out != nil {
		// As Start does: the actor replays the last run's spool when it starts, and sessions
		// must not read the store before that.
		if _, err := system.Root.RequestFuture(d.Persist, &persistence.Flush{}, time.Minute).Result(); err != nil {
			t.Fatalf("persistence start barrier: %v", err)
		}
	}
	platform := system.Root.Spawn(NewPlatform(d, m.fake, &PlatformHealth{}))
	d.Platforms = map[string]*actor.PID{"fake": platform}
	d.Probation = system.Root.Spawn(NewProbation(d))
	manager := system.Root.Spawn(NewSessionManager(d))
	m.daemon = &modelDaemon{cancel: cancel, store: store, system: system, d: d, manager: manager, platform: platform}
}

// stop stops the daemon as Daemon.Stop does: with a drain first when drain is set, then the
// tree in reverse order (running turns are cancelled and run again at the next start).
func (m *model) stop(drain bool) {
	w := m.daemon
	root := w.system.Root
	w.d.Stopping.Store(true)
	if m.out != nil && m.out.spoolOff && m.out.o.Down.Load() {
		// Neither the database nor the spool takes writes: the delivery marks of the replies
		// sent since they failed cannot be recorded anywhere, and those replies are sent again
		// at the next start (at least once), as after a kill.
		m.killed = true
	}
	if drain {
		_, _ = root.RequestFuture(w.manager, &Drain{}, 30*time.Second).Result()
	}
	_ = root.PoisonFuture(w.manager).Wait()
	_ = root.PoisonFuture(w.d.Probation).Wait()
	_, _ = root.RequestFuture(w.platform, &Quiesce{}, 10*time.Second).Result()
	_ = root.PoisonFuture(w.platform).Wait()
	_ = root.PoisonFuture(w.d.Persist).Wait()
	m.down()
}

// kill stops the daemon as near to a kill -9 as one process can: the persistence actor first,
// dropping the writes in its mailbox (their senders never hear back), then the platform without
// letting it finish its sends or record their delivery, then the rest. Replies not marked
// delivered are sent again at the next start (at least once), which the model then allows.
func (m *model) kill() {
	w := m.daemon
	root := w.system.Root
	m.killed = true
	_ = root.StopFuture(w.d.Persist).Wait()
	_ = root.StopFuture(w.platform).Wait()
	_ = root.StopFuture(w.manager).Wait()
	_ = root.StopFuture(w.d.Probation).Wait()
	m.down()
}

func (m *model) down() {
	w := m.daemon
	w.cancel()
	w.d.AgentCalls.Close()
	_ = w.d.AgentCalls.Wait(context.Background())
	synctest.Wait()
	w.system.Shutdown()
	if m.out != nil {
		// Close waits out the busy timeout holding a mutex the index timer waits for, which
		// synctest does not count as durably blocked: the bubble's clock would stand still.
		m.out.unlock()
	}
	if err := w.store.Close(); err != nil {
		m.t.Error(err)
	}
	m.daemon = nil
}

// advance lets up to upTo pass, now and then 40 s: past passivation and an idle reset.
func (m *model) advance(upTo time.Duration) {
	d := time.Duration(m.rng.IntN(int(upTo/time.Millisecond))) * time.Millisecond
	if m.rng.IntN(6) == 0 {
		d = 40 * time.Second
	}
	m.logf("advance %v", d)
	time.Sleep(d)
	synctest.Wait()
}

// restart stops the daemon drained, killed or plainly, drawing one of kinds (3, or 4 for
// plainly twice as often), and starts it again on the same database.
func (m *model) restart(kinds int) {
	switch m.rng.IntN(kinds) {
	case 0:
		m.logf("restart (drain)")
		m.stop(true)
	case 1:
		m.logf("restart (killed)")
		m.kill()
	default:
		m.logf("restart")
		m.stop(false)
	}
	m.start()
}

// run drives the sessions through steps random actions.
func (m *model) run(steps int) {
	for range steps {
		switch p := m.rng.IntN(100); {
		case p < 45:
			m.burst()
		case p < 72:
			m.command()
		case p < 75:
			m.redeliver()
		case p < 77:
			m.adminReset()
		case p < 79:
			// The platform refuses to send for a while (a 503): sends are retried, in order.
			d := time.Duration(m.rng.IntN(20)) * time.Second
			m.logf("platform outage of %v", d)
			m.fake.SetSendError(errors.New("503 service unavailable"))
			time.Sleep(d)
			synctest.Wait()
			m.fake.SetSendError(nil)
		case p < 91:
			m.advance(8000 * time.Millisecond)
		default:
			m.restart(4)
		}
	}
	// Quiesce: every turn ends (the longest is a few seconds), every reply is sent and marked.
	for range 20 {
		time.Sleep(30 * time.Second)
		synctest.Wait()
	}
}

// burst sends one to five messages (or commands) without waiting between them, then waits for their
// acknowledgments.
func (m *model) burst() {
	var pending []*modelAck
	var futures []*actor.Future
	for range 1 + m.rng.IntN(5) {
		src := m.srcs[m.rng.IntN(len(m.srcs))]
		if m.rng.IntN(5) == 0 { // a command among messages: it acts while their writes are in flight
			a, f := m.sendCommand(src)
			pending, futures = append(pending, a), append(futures, f)
			continue
		}
		m.nextID++
		id := fmt.Sprintf("m%d", m.nextID)
		text := fmt.Sprintf("%s d=%d", id, m.rng.IntN(5))
		switch p := m.rng.IntN(100); {
		case p < 12:
			text += " fail-" + id + "."
		case p < 20:
			text += " panic-" + id + ".1"
		case p < 22:
			text += " panic-" + id + ".9" // crashes until quarantined
		}
		a, f := m.send(src, id, text, "")
		pending, futures = append(pending, a), append(futures, f)
	}
	m.await(pending, futures)
}

// command sends one command and waits for its acknowledgment.
func (m *model) command() {
	a, f := m.sendCommand(m.srcs[m.rng.IntN(len(m.srcs))])
	m.await([]*modelAck{a}, []*actor.Future{f})
}

// sendCommand sends a random command of src without waiting for its acknowledgment.
func (m *model) sendCommand(src identity.Source) (*modelAck, *actor.Future) {
	m.nextID++
	id := fmt.Sprintf("k%d", m.nextID)
	var text string
	switch p := m.rng.IntN(100); {
	case p < 14:
		text = "/stop"
	case p < 26:
		text = "/new"
	case p < 34:
		text = "/reset"
	case p < 50:
		text = "/retry"
	case p < 62:
		text = "/undo"
	case p < 80:
		text = "/queue " + []string{ModeFollowup, ModeCollect, ModeInterrupt, ModeSteer}[m.rng.IntN(4)]
	case p < 86:
		text = "/title t" + id
	case p < 94:
		text = "/status"
	default:
		// An earlier session of the chat by id or title, now and then another chat's (which
		// /resume must refuse).
		key := identity.Key(src, m.cfg.Keys)
		if m.rng.IntN(4) == 0 {
			key = m.keys[m.rng.IntN(len(m.keys))]
		}
		if ids := m.sessions[key]; len(ids) > 0 {
			text = "/resume " + ids[m.rng.IntN(len(ids))]
		} else {
			text = "/help"
		}
		if titles := m.titles[key]; len(titles) > 0 && m.rng.IntN(2) == 0 {
			text = "/resume " + titles[m.rng.IntN(len(titles))]
		}
	}
	cmd, _ := parseCommand(text)
	return m.send(src, id, text, cmd.name)
}

// adminReset resets a session as the admin API does (POST /v1/sessions/{key}/reset).
func (m *model) adminReset() {
	key := m.keys[m.rng.IntN(len(m.keys))]
	m.nextID++
	a := &modelAck{id: fmt.Sprintf("admin%d", m.nextID), key: key, cmd: "admin", arrive: len(m.acks), at: time.Now()}
	res, err := m.daemon.system.Root.RequestFuture(m.daemon.manager, &Routed{Key: key, Msg: &ResetSession{}}, time.Hour).Result()
	r, _ := res.(*ResetResult)
	switch {
	case err != nil || r == nil:
		m.logf("admin reset %s: %v %v", key, res, err)
		return
	case r.Error != "":
		m.logf("admin reset %s: %s", key, r.Error)
		return
	}
	a.res = &DeliverResult{SessionId: r.SessionId, Disposition: "admin"}
	m.acks = append(m.acks, a)
	m.byID[a.id] = a
	m.logf("admin reset %s: %s → %s", key, r.PreviousSessionId, r.SessionId)
	synctest.Wait()
}

// redeliver sends an earlier message again, with its id and text (a platform's retry).
func (m *model) redeliver() {
	if len(m.acks) == 0 {
		return
	}
	orig := m.acks[m.rng.IntN(len(m.acks))]
	if orig.cmd == "admin" {
		return
	}
	spooled := m.out != nil && m.out.inSpool(orig.id)
	a, f := m.send(orig.src, orig.id, orig.text, orig.cmd)
	a.redo, a.spooled = true, spooled
	m.await([]*modelAck{a}, []*actor.Future{f})
}

func (m *model) send(src identity.Source, id, text, cmd string) (*modelAck, *actor.Future) {
	key := identity.Key(src, m.cfg.Keys)
	a := &modelAck{id: id, src: src, key: key, text: text, cmd: cmd, arrive: len(m.acks), at: time.Now()}
	m.acks = append(m.acks, a)
	if _, ok := m.byID[id]; !ok {
		m.byID[id] = a
	}
	msg := &Deliver{SessionKey: key, Source: sourceToProto(src), MessageId: id, Text: text, ReceivedAtUnixNano: time.Now().UnixNano()}
	f := m.daemon.system.Root.RequestFuture(m.daemon.manager, &Routed{Key: key, Msg: msg}, time.Hour)
	return a, f
}

func (m *model) await(acks []*modelAck, futures []*actor.Future) {
	for i, f := range futures {
		a := acks[i]
		res, err := f.Result()
		a.err, a.ackedAt = err, time.Now()
		m.agent.mu.Lock()
		a.runsBefore = len(m.agent.runs)
		m.agent.mu.Unlock()
		if r, ok := res.(*DeliverResult); ok {
			a.res = r
			if first := m.byID[a.id]; first != a && !first.accepted() && a.accepted() {
				m.byID[a.id] = a // an earlier delivery was refused: this one is the message
			}
			if r.SessionId != "" && r.ErrorCode == "" && !slices.Contains(m.sessions[a.key], r.SessionId) {
				m.sessions[a.key] = append(m.sessions[a.key], r.SessionId)
			}
			if a.cmd == "title" && a.accepted() {
				m.titles[a.key] = append(m.titles[a.key], strings.TrimPrefix(a.text, "/title "))
			}
		}
		m.logf("%s %s %q → %s", a.id, a.src.UserID, a.text, a.describe())
	}
	synctest.Wait()
}

func (a *modelAck) describe() string {
	if a.err != nil {
		return "error " + a.err.Error()
	}
	if a.res == nil {
		return "no answer"
	}
	s := a.res.Disposition + " " + a.res.SessionId
	if a.res.ErrorCode != "" {
		s += " error " + a.res.ErrorCode + ": " + a.res.Error
	}
	return s
}

// accepted reports whether the acknowledgment says the message was taken (to be answered).
func (a *modelAck) accepted() bool {
	if a.err != nil || a.res == nil || a.res.ErrorCode != "" {
		return false
	}
	switch a.res.Disposition {
	case platforms.Started, platforms.Queued, platforms.Collected, platforms.Steered, platforms.Interrupted, platforms.Command:
		return true
	}
	return false
}

// unsure reports whether the acknowledgment leaves the outcome open: an incarnation that
// failed while the message's write was in flight answers that it cannot tell (send it again
// with the same id). The store decides then: a stored message must be answered.
func (a *modelAck) unsure() bool {
	return a.err == nil && a.res != nil && a.res.ErrorCode != "" && a.res.Disposition != platforms.Rejected
}

// taken reports whether the message was taken: acknowledged so, or stored after an unsure
// acknowledgment (check fills stored).
func (a *modelAck) taken() bool { return a.accepted() || a.unsure() && a.stored != nil }

// sid is the session the message was taken in.
func (a *modelAck) sid() string {
	if a.accepted() {
		return a.res.SessionId
	}
	if a.stored != nil {
		return a.stored.SessionID
	}
	return ""
}
