package supervisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agentgate/agentgate/actors"
	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/agents/echo"
	agentexec "github.com/agentgate/agentgate/agents/exec"
	"github.com/agentgate/agentgate/agents/openai"
	"github.com/agentgate/agentgate/internal/buildinfo"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/internal/metrics"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/postgres"
	"github.com/agentgate/agentgate/persistence/spool"
	"github.com/agentgate/agentgate/persistence/sqlite"
	"github.com/agentgate/agentgate/platforms"
	"github.com/agentgate/agentgate/platforms/discord"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Options are the parts of a daemon that tests and `agentgate bench` replace.
type Options struct {
	// Agent replaces the configured agent backend.
	Agent agents.Agent
	// Platforms are added next to the HTTP platform.
	Platforms []platforms.Platform
	// Now replaces the clock of the session runtime (and of the platforms that read one).
	Now func() time.Time
	// DraftInterval replaces the least time between two edits of a streaming reply's draft.
	DraftInterval time.Duration
	// WrapStore, when set, wraps the opened store; the daemon uses what it returns (`agentgate
	// bench` records the daemon's transactions through it).
	WrapStore func(persistence.Store) persistence.Store
	// SharedStore runs the daemon as one of several that write one PostgreSQL database, as a
	// cluster member does (cluster.enabled sets it; DESIGN §6). The daemon holds the database's
	// daemon lock shared (postgres.Options.Shared), so such daemons do not exclude each other
	// but a single daemon and they do; every session activation claims its key and fences its
	// writes (actors.Deps.Fencing), so two activations of one key, on two daemons, never
	// interleave their writes. Writes are never spooled: a spooled write would live on
	// one member's disk and be fenced when replayed, so a daemon that cannot write refuses
	// messages (503) instead. Drafts left by earlier runs are not removed at start (they may be
	// another live member's).
	SharedStore bool
	// Stop, closed by the owner, asks a start still under way to stop (`agentgate serve`'s first
	// stop signal): the start's wait for the replay of the spool the last run left gives up, the
	// replay stops after the run of batches it commits, and Start stops what it started and
	// returns ErrStopped, with what the replay did not take still in the spool (the next start
	// replays it). Before, nothing heard a stop signal until Start returned, and a long replay
	// that kept taking batches out of the spool ignored SIGTERM until it ended. May be nil.
	Stop <-chan struct{}
	// Abortable, when set, is called once from Start as soon as an exit at once would leave
	// behind what Daemon.Abort sees to: once the start has recorded its run in the store (an
	// exit without the clean stop makes the next start count an unclean stop, a strike against
	// each session's running message), before the sessions and platforms start (a turn's exec
	// agent can run from then on). It is given Abort, which may be called from any goroutine
	// from then on, also while the start goes on (`agentgate serve`'s second stop signal during
	// the start). Before, serve's second signal during the start, or in the instant after Start
	// returned, exited without Abort: the clean stop unrecorded, the agents' commands running on.
	Abortable func(abort func())
	// managerMiddleware wraps the receive of the session manager: a test's stand-in for a
	// member of an older version, which reads a kind of Forward it does not know
	// (TestClusterRequestAnOlderMemberDoesNotKnowIsAnswered503MemberOutdated). Tests only.
	managerMiddleware []actor.ReceiverMiddleware
}

// stopContext is ctx, also ended once stop is closed (a nil stop never is); cancel releases it.
func stopContext(ctx context.Context, stop <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	if stop != nil {
		go func() { // ends with ctx, which cancel ends
			select {
			case <-stop:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	return ctx, cancel
}

// isClosed reports whether ch is closed (a nil ch never is).
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// ErrStopped is Start's error when its owner asked it to stop (Options.Stop) before it was done.
var ErrStopped = errors.New("start: stopped before the daemon served")

// Daemon is a running agentgate: its actor system, store, platforms and the PIDs of the
// supervision tree.
type Daemon struct {
	cfg     *config.Config
	log     *slog.Logger
	ctx     context.Context
	cancel  context.CancelFunc
	system  *actor.ActorSystem
	store   persistence.Store
	spool   *spool.Spool
	dirLock *os.File // the data directory's lock, held while the daemon keeps a spool there
	// spoolLeft is the batches waiting in the spool, as the persistence actor last said
	// (ActorOptions.SpoolFiles): the start's barrier watches its replay by it (awaitReplay).
	spoolLeft atomic.Int64
	// startPhase is what the start is doing, for /readyz while it runs (startStatus).
	startPhase atomic.Pointer[string]
	// persist is the persistence actor once it is spawned (nil before), for the store's hook
	// that runs on the store's own goroutine (storeRecovered).
	persist atomic.Pointer[actor.PID]
	metrics *metrics.Metrics
	meters  *sdkmetric.MeterProvider // protoactor's own metrics; nil when off
	// dispatcher runs every actor's mailbox on a pool of long-lived goroutines.
	dispatcher *actors.Dispatcher
	agent      agents.Agent
	deps       *actors.Deps
	// managerMiddleware wraps the session manager's receive (Options.managerMiddleware).
	managerMiddleware []actor.ReceiverMiddleware

	http      *httpplatform.Platform
	platforms []platforms.Platform
	health    map[string]*actors.PlatformHealth
	intake    *actors.Intake
	router    actors.SessionRouter
	addr      net.Addr

	children []Child
	pids     []*actor.PID
	manager  *actor.PID
	timers   *actor.PID
	events   *eventLog
	// cluster mode
	cluster    *cluster.Cluster
	topology   topologySubscription
	members    memberStore      // the store's membership registry (PostgreSQL)
	membership *storeMembership // this member's registration in it
	peers      *peers           // the other members' connections to this one
	unreadable logging.Limiter  // recoverStreams' line: a peer's message this member cannot read
	endpoints  *endpointGuard   // keeps the remote's stop from panicking (remote_guard.go)
	fatal      chan error       // receives why the daemon must stop on its own (see Fatal)
	stopping   atomic.Bool      // Stop has begun
	// treeStopping: Stop's drain is over and it stops the tree's actors (stopChildren), whose
	// stops are no failure of the daemon's (actorStopped).
	treeStopping atomic.Bool
	// began: this run is recorded in the store (beginRun, or its retry: retryRun); a clean stop
	// ends it (endRun), and so does Abort, from another goroutine than the stop's. ended: the
	// end was written or given up, and the run is recorded no more. endMu is held across the
	// begin's and the end's writes, so that an Abort that comes while the stop writes the end
	// waits for that write, and a retry's record is never written after the end.
	endMu    sync.Mutex
	began    bool
	ended    bool
	fatalOne sync.Once
	// cleanStops: endCleanStops has ended the runs whose clean stop the data directory kept
	// (guarded by endMu); the record's retries skip it.
	cleanStops bool
	// runRefused is why the store refused the record of this run, nil once it took it (or
	// before it was asked): /readyz reports it while the retry goes on.
	runRefused atomic.Pointer[error]
	// retrying is the retry of the record of the run (retryRun), which Stop waits for before the
	// store closes.
	retrying sync.WaitGroup
	// topLevel names the supervision tree's top-level actors (set once they are known); down is
	// why one of them is gone for good (actorStopped), nil while all run.
	topLevel atomic.Pointer[map[string]bool]
	down     atomic.Pointer[error]
	// refusals records the writes the persistence actor refused (the database and the spool
	// both failing), which /readyz reports: the store's ping passes on a full disk.
	refusals persistence.Refusals
}

// Fatal receives the error that makes a running daemon unable to go on (a cluster member the
// others dropped); its owner should Stop it and exit non-zero.
func (d *Daemon) Fatal() <-chan error { return d.fatal }

// fail reports a fatal error once.
func (d *Daemon) fail(err error) {
	d.fatalOne.Do(func() {
		d.log.Error("the daemon cannot go on", logging.Err(err))
		d.fatal <- err
	})
}

// membershipLost is the cluster membership's report that this member is out of the cluster
// (the others count it as gone, or it is the side of a split that leaves): the daemon fails
// (Fatal), and its HTTP API refuses new work from now on, saying why (lostMembership): the
// other members route its chats to themselves, so its clients send again at once, to them.
// Before, they were told only that it drained, as if it stopped for good.
func (d *Daemon) membershipLost(err error) {
	d.http.DrainBecause(lostMembership)
	d.fail(err)
}

// lostMembership is the message of a member's draining 503s once its membership is lost.
const lostMembership = "this cluster member lost its membership and is stopping; the other members take its chats: send the request again"

// actorStopped hears of every actor a supervisor stopped for failing. A session's stop is its
// manager's business (it starts the session again later). A top-level actor's is not: nothing
// restarts it, and the daemon would go on without its sessions, a platform's replies, its
// timers or its writes while /readyz said all was well. The daemon fails instead (Fatal), so
// that it stops in order and its process supervisor starts it afresh, as an Erlang release does
// when its top supervisor gives up. One stopped during the drain a signal began fails it too
// (`agentgate serve` exits 1 once the drain ends): before, a stop that had begun hid it, and
// the daemon exited 0 without the actor's turns, writes or replies (TestTopLevelActorStoppedDuringTheDrain).
func (d *Daemon) actorStopped(pid *actor.PID, reason any) {
	top := d.topLevel.Load()
	if pid == nil || top == nil || !(*top)[pid.Id] || d.treeStopping.Load() {
		return
	}
	err := fmt.Errorf("the %s actor failed more often than its supervisor restarts it, and is stopped (last failure: %v)", pid.Id, reason)
	d.down.CompareAndSwap(nil, &err)
	d.fail(err)
}

// Start builds the tree from cfg and starts it: store, persistence actor, platforms, session
// manager (which re-activates sessions with unfinished work), then intake. It binds the HTTP
// listener first, before the store opens (a taken port makes nothing on disk), and returns
// once the tree runs.
func Start(ctx context.Context, cfg *config.Config, log *slog.Logger, opts Options) (_ *Daemon, err error) {
	d := &Daemon{cfg: cfg, log: log, health: map[string]*actors.PlatformHealth{}, fatal: make(chan error, 1),
		managerMiddleware: opts.managerMiddleware}
	d.ctx, d.cancel = context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		if err != nil {
			d.cancel()
			d.retrying.Wait() // it ends with d.ctx; the store closes below
			// The daemon's actors stopped (stopChildren) before Start returned, and a cluster
			// join that failed or was stopped took down what it started (abandonJoin). A
			// member that joined leaves, as a stop's does.
			if d.system != nil {
				d.events.close()
				if d.cluster != nil {
					d.withdraw()
					d.leaveCluster(context.Background()) // it shuts the actor system down
				} else {
					d.system.Shutdown()
				}
			}
			if d.meters != nil {
				_ = d.meters.Shutdown(context.Background())
			}
			if d.dispatcher != nil {
				d.dispatcher.Stop()
			}
			if d.store != nil {
				d.endRun(context.Background()) // a failed start is no unclean stop
				_ = d.store.Close()
			}
			if d.dirLock != nil {
				_ = d.dirLock.Close()
			}
			if d.http != nil {
				d.http.Close() // the start's server and the listener, unless Run took them
			}
		}
	}()
	if d.agent = opts.Agent; d.agent == nil {
		// d.metrics is set before any turn runs.
		countRequest := func(result string) { d.metrics.ModelRequests.WithLabelValues(result).Inc() }
		if d.agent, err = newAgent(cfg, log, countRequest); err != nil {
			return nil, err
		}
	}
	// The secrets are read before anything is opened or made on disk: a start they refuse
	// leaves no data directory or database behind (a mistyped --data-dir did).
	token := ""
	if cfg.HTTP.TokenEnv != "" {
		// Named but empty is a mistake, never a wish to serve without a token. The token is
		// the variable's without surrounding white space, as a client's header is read (an
		// EnvironmentFile or $(cat file) keeps a line end).
		if token = strings.TrimSpace(os.Getenv(cfg.HTTP.TokenEnv)); token == "" {
			return nil, fmt.Errorf("start: http.token_env names %s, which is not set or empty: set it, or remove http.token_env to serve without a token (on a loopback address only)", cfg.HTTP.TokenEnv)
		}
	}
	for _, err := range cfg.TokenAdvice(os.Getenv) {
		log.Warn("the HTTP API's bearer token is short enough to guess; serving all the same", logging.Err(err))
	}
	if dc := cfg.Platforms.Discord; dc.Enabled {
		switch botTokenProblem(os.Getenv(dc.TokenEnv)) {
		case botTokenUnset:
			return nil, fmt.Errorf("start: discord is enabled but the environment variable %s (platforms.discord.token_env) is not set or empty: set it to the bot token (the Developer Portal's Bot page), or set platforms.discord.enabled: false", dc.TokenEnv)
		case botTokenPrefixOnly:
			return nil, fmt.Errorf("start: discord is enabled but the environment variable %s (platforms.discord.token_env) holds the prefix \"Bot\" alone, without the token: set it to the bot token (the Developer Portal's Bot page)", dc.TokenEnv)
		}
	}
	for _, err := range cfg.DiscordTokenAdvice(os.Getenv) {
		// A warning, not a refusal: Discord may change the format (check-config warns too).
		log.Warn("the Discord bot token does not look like one; serving all the same", logging.Err(err))
	}
	if cfg.Cluster.Enabled {
		opts.SharedStore = true // see Options.SharedStore
	}
	if opts.SharedStore && cfg.Store.Driver != "postgres" {
		return nil, errors.New("start: a shared store must be PostgreSQL (store.driver: postgres)")
	}
	// The HTTP listener is bound before the store opens, for the same reason: a start on a taken
	// port leaves no data directory behind either (it left the database, its lock files and the
	// spool). The platforms are built first for their names, which the metrics and the HTTP API
	// take; they read the store only once they run.
	extra, err := configuredPlatforms(cfg, log, func() persistence.Store { return d.store }, opts.Now)
	if err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	configured := len(extra) // run behind the cluster's gateway lease (below)
	extra = append(extra, opts.Platforms...)
	names := []string{"http"}
	for _, p := range extra {
		names = append(names, p.Name())
	}
	// Every platform agentgate has gets its series, also one not configured (as the HTTP API's
	// ?platform= knows it): DESIGN's "pre-initialised for every known label value".
	known := slices.Sorted(slices.Values(append([]string{discord.Name}, names...)))
	d.metrics = metrics.New(slices.Compact(known)...)
	if opts.Agent == nil && cfg.Agent.Backend == "openai" {
		d.metrics.InitModelRequests(openai.RequestResults)
	}
	run := newRunID()
	d.http, err = httpplatform.New(httpplatform.Config{
		Addr: cfg.HTTP.Addr, Token: token, Metrics: d.metrics.Handler(), Requests: d.metrics.HTTPRequests, Ready: d.ready,
		ConnectionsOpen: d.metrics.HTTPConnectionsOpen, ConnectionsLimit: d.metrics.HTTPConnectionsLimit, ConnectionsLimitReached: d.metrics.HTTPConnectionsLimitReached,
		Sessions: &sessionsAPI{d: d}, Logger: log.With("component", "http"), Run: run,
		Clustered: cfg.Cluster.Enabled, Pprof: cfg.HTTP.Pprof, MaxHeld: cfg.HTTP.MaxHeld, MaxConnections: cfg.HTTP.MaxConnections,
		// A drain of 0s waits for nothing: its clients are told a second (0 would mean the
		// platform's default).
		DrainTimeout: max(cfg.Shutdown.DrainTimeout, time.Second), Platforms: names[1:],
	})
	if err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	if d.addr, err = d.http.Listen(); err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("start: http.addr %s is taken (stop what listens there, or give agentgate a free port with --http-addr, AGENTGATE_HTTP_ADDR or http.addr): %w", cfg.HTTP.Addr, err)
		}
		return nil, fmt.Errorf("start: %w", err)
	}
	// From here the listener answers (ServeStarting): /healthz 200, /readyz 503 saying what the
	// start waits for, the rest 503 starting. The start may take minutes (a spool's replay),
	// and a liveness probe that got no answer killed a daemon making progress.
	d.phase(phaseDataDir)
	if err := d.http.ServeStarting(d.startStatus); err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	// The data directory's lock and the spool come before the store too: a start refused for a
	// data directory another daemon holds, or for a spool it cannot write, opens no database.
	// Before, with a store.dsn outside data_dir, it made a new, empty database there, and its
	// lock file, and logged it, only to be refused.
	if !opts.SharedStore {
		// A stop asked for while the start waits for an admin command to let the directory go
		// (up to adminLockWait) ends the wait: before, the signal was acted on only once the
		// wait was over (TestStopWhileTheStartWaitsForTheDataDir).
		waitCtx, endWait := stopContext(ctx, opts.Stop)
		d.dirLock, err = lockDataDirWaiting(waitCtx, cfg.DataDir, log)
		endWait()
		// Only a wait the stop ended: a refusal with nothing to wait for (another daemon's
		// lock) stays one, also when a stop was asked for meanwhile; it was taken for the stop
		// (exit 0, and a line of a wait that never was: TestStopDuringTheStartKeepsTheDataDirsRefusal).
		if ended := (*lockWaitEnded)(nil); errors.As(err, &ended) && isClosed(opts.Stop) {
			log.Info("asked to stop during the start while it waited for the admin command that holds the data directory; stopped without opening the store")
			return nil, ErrStopped
		}
		if err != nil {
			return nil, fmt.Errorf("start: %w", err)
		}
		if d.spool, err = spool.Open(filepath.Join(cfg.DataDir, "spool")); err != nil {
			return nil, fmt.Errorf("start: open spool: %w", err)
		}
		d.spoolLeft.Store(int64(d.spool.Len())) // (the persistence actor owns the spool once spawned)
	} else {
		warnSpoolLeft(log, cfg.DataDir)
	}
	d.phase(phaseStore)
	corrupt := func() { d.metrics.StoreCorrupt.Set(1) }
	// A stop asked for while the store opens ends its waits at once (PostgreSQL's connect and
	// its daemon lock, up to 5 s while another daemon holds it: the start then failed, exit 1,
	// "another agentgate daemon uses this database"; SQLite's wait for the write lock another
	// process holds, up to 5 s too, then exit 1, "the database is locked by another process"),
	// but not a migration that has begun, which ends first (openStore); the start stops then,
	// before the next step. Before, the stop was acted on only once the whole of the store's
	// opening was over (TestSIGTERMWhileTheStartWaitsForPostgresLock,
	// TestSIGTERMWhileTheStartMigratesPostgres, TestSIGTERMWhileTheStartWaitsForTheSQLiteLock).
	openCtx, endOpen := stopContext(ctx, opts.Stop)
	var applied int
	d.store, applied, err = openStore(openCtx, cfg, log.With("component", "persistence"), !opts.SharedStore, corrupt, d.storeRecovered)
	endOpen()
	// Only a stop that Options.Stop asked for is ErrStopped: an end of ctx is the start's
	// failure, ErrMigratedThenEnded's too (either store's), which returned no store. Before, that one
	// went on with none, and panicked at its first use (TestStartsContextEndedWhileItMigratesFails).
	// The stop's line says what the opening wrote: nothing, or the schema's migrations (a store
	// that applied some and then heard the stop returns ErrMigratedThenEnded; one that opened
	// says how many it applied). Nothing else is written before the run is recorded, below: the
	// search index's catch-up adds no conversation. Before, a stop that came just after a
	// migration's commit could say "stopped without writing anything", and one with nothing to
	// migrate "the opening, its migrations included, finished first"
	// (TestStopDuringTheStartsOpenSaysWhatItWrote). An opening that failed for real as the stop
	// came returns its failure, which wraps no context.Canceled (either store's endedByCtx),
	// and the start fails with it (exit 1), as without the stop.
	migrated := applied > 0 || errors.Is(err, postgres.ErrMigratedThenEnded) || errors.Is(err, sqlite.ErrMigratedThenEnded)
	stopped := isClosed(opts.Stop) && (err == nil || errors.Is(err, context.Canceled))
	if err != nil && !stopped {
		return nil, fmt.Errorf("start: open store: %w", err)
	}
	if stopped {
		switch {
		case migrated:
			log.Info("asked to stop during the start while it opened the store; the schema's migrations had been applied (one that has begun finishes first), no conversation or run written; stopped before the daemon served")
		case err != nil:
			log.Info("asked to stop during the start while it opened the store (connecting to the database, waiting for its lock, or checking it and its schema); stopped without writing anything")
		default:
			log.Info("asked to stop during the start while it opened the store; it had nothing to migrate, and no conversation or run was written; stopped before the daemon served")
		}
		return nil, ErrStopped // (the deferred cleanup closes a store that opened: no run was recorded in it)
	}
	if !opts.SharedStore {
		// A disk nearly full is said at once, not found when the writes fail (check-config says
		// it too; sqlite.LowSpace says why the bound).
		db := ""
		if cfg.Store.Driver == "sqlite" {
			db = cfg.DSN()
		}
		for _, err := range sqlite.CheckSpace(cfg.DataDir, db) {
			log.Warn("the disk holding the data directory or the database is nearly full; writes are refused once it is full", logging.Err(err))
		}
	}
	if ms, ok := d.store.(memberStore); ok {
		d.members = ms
	}
	leases, _ := d.store.(leaser)
	if opts.WrapStore != nil {
		d.store = opts.WrapStore(d.store)
	}
	for i, p := range extra[:configured] {
		if gp, ok := p.(gatewayPlatform); ok && cfg.Cluster.Enabled && leases != nil {
			extra[i] = newLeaderPlatform(gp, leases, log.With("component", p.Name()))
		}
	}
	// Where the running daemon listens, for the admin commands on this data directory (they
	// point an operator at its HTTP API when it holds the database).
	// With a PostgreSQL store nothing else may have created the data directory.
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		log.Warn("create the data directory; the admin commands cannot point at this daemon's HTTP API", "data_dir", cfg.DataDir, logging.Err(err))
	} else if err := recordAddr(cfg.DataDir, d.addr.String(), run); err != nil {
		log.Warn("record the HTTP address in the data directory; the admin commands cannot point at this daemon's HTTP API", "data_dir", cfg.DataDir, logging.Err(err))
	}
	d.platforms = append([]platforms.Platform{d.http}, extra...)

	sysOpts := []actor.ConfigOption{actor.WithLoggerFactory(func(s *actor.ActorSystem) *slog.Logger {
		return slog.New(floor{h: log.Handler(), min: slog.LevelWarn, hush: &d.stopping}).With("component", "actors")
	})}
	if cfg.Metrics.Actors {
		if d.meters, err = d.metrics.ActorMeterProvider(); err != nil {
			return nil, fmt.Errorf("start: %w", err)
		}
		sysOpts = append(sysOpts, actor.WithMetricProviders(d.meters))
	}
	d.system = actor.NewActorSystem(sysOpts...)
	if cfg.Cluster.Enabled {
		d.endpoints = guardEndpoints(d.system) // first, before any subscription that can end
	}
	d.events = watchEvents(d.system, log, d.metrics, d.actorStopped)
	d.dispatcher = actors.NewDispatcher(dispatcherThroughput, dispatcherWorkers)
	d.deps = &actors.Deps{
		Ctx: d.ctx, Store: d.store, Agent: d.agent, Platforms: map[string]*actor.PID{}, Dispatcher: d.dispatcher,
		Config: actors.SessionConfig{
			Keys: identity.KeyOptions{
				GroupSessionsPerUser:  cfg.Sessions.GroupSessionsPerUser,
				ThreadSessionsPerUser: cfg.Sessions.ThreadSessionsPerUser,
			},
			PassivateAfter: cfg.Sessions.PassivateAfter, MaxInMemory: cfg.Sessions.MaxInMemory, QueueMode: cfg.Sessions.Queue.Mode,
			QueueCap: cfg.Sessions.Queue.Cap, Overflow: cfg.Sessions.Queue.Overflow,
			Debounce: cfg.Sessions.Queue.Debounce, DebounceByPlatform: cfg.Sessions.Queue.DebounceByPlatform,
			HistoryLimit: cfg.Sessions.HistoryLimit, Recovery: cfg.Sessions.Recovery,
			ResetFor: func(platform, chatType string) actors.ResetPolicy {
				return resetPolicy(cfg.ResetFor(platform, chatType))
			},
			ResetPolicies: resetPolicies(cfg),
			Prune: actors.PrunePolicy{Enabled: cfg.Sessions.Prune.Enabled,
				After: cfg.Sessions.Prune.Retention, Every: cfg.Sessions.Prune.Interval},
			// An exec command's Run returns at most about two kill graces after its cancel
			// (SIGTERM, SIGKILL, then its output's pipes); an OpenAI request returns at once.
			CancelWait: 2*killGrace(cfg) + time.Second,
		},
		Log: log, Metrics: d.metrics, Now: opts.Now, Node: hostname(), Run: run,
		Editors: map[string]bool{}, DraftInterval: opts.DraftInterval, Fencing: opts.SharedStore,
		Clustered: cfg.Cluster.Enabled, Refusals: &d.refusals,
	}
	if opts.Agent == nil && cfg.Agent.Backend != "echo" {
		// The configured exec or openai agent: each call is a process or a model request. (An
		// agent a test or the benchmark passes in, and the echo agent, are not bounded.)
		d.deps.AgentSlots = actors.NewAgentSlots(cfg.Agent.MaxConcurrent, d.metrics.AgentCallsWaiting, d.metrics.AgentSlotWait,
			log.With("component", "agent"))
	}
	if cfg.Cluster.Enabled {
		d.deps.Relay = d.relay
		d.deps.Placement = placement{d}
	}
	if opts.SharedStore {
		d.deps.Node += "/" + d.deps.Run // several members may run on one host
		d.deps.Run = ""                 // another member's drafts are not this start's to remove
	}
	for _, p := range d.platforms {
		if _, ok := p.(platforms.Editor); ok {
			d.deps.Editors[p.Name()] = true
		}
	}
	d.children = tree(d)
	top := make(map[string]bool, len(d.children))
	for _, ch := range d.children {
		top[ch.Name] = true
	}
	d.topLevel.Store(&top)
	if d.spool != nil {
		d.phase(phaseReplay) // the persistence actor replays it as it starts, first
	} else {
		d.phase(phaseActors)
	}
	for _, ch := range d.children {
		props := ch.Props(d).Configure(actor.WithGuardian(ch.Policy))
		pid, err := d.system.Root.SpawnNamed(props, ch.Name)
		if err != nil {
			d.stopChildren(context.Background(), nil)
			return nil, fmt.Errorf("start: spawn %s: %w", ch.Name, err)
		}
		d.pids = append(d.pids, pid)
		switch {
		case ch.Name == "persistence":
			d.deps.Persist = pid
			d.persist.Store(pid)
			// The actor replays a spool left by the last run when it starts; nothing may read
			// the store before that.
			if !d.awaitReplay(pid, opts.Stop) {
				// The daemon's ctx ends the replay after its run of batches (or the commit of
				// it, which the database rolls back): the rest waits in the spool.
				d.cancel()
				d.stopChildren(context.Background(), nil)
				d.logStopped()
				return nil, ErrStopped
			}
			if !opts.SharedStore {
				if err := d.beginRun(opts.Now); err != nil {
					d.stopChildren(context.Background(), nil)
					return nil, fmt.Errorf("start: record the daemon's run: %w", err)
				}
			}
			d.phase(phaseActors)
			if opts.Abortable != nil {
				opts.Abortable(d.Abort)
			}
		case strings.HasPrefix(ch.Name, "platform-"):
			d.deps.Platforms[strings.TrimPrefix(ch.Name, "platform-")] = pid
		case ch.Name == "sessions":
			d.manager = pid
			d.router = actors.NewLocalRouter(d.system.Root, d.manager)
			if cfg.Cluster.Enabled {
				// A stop asked for by now stops the start before it joins; one during the
				// join ends its registration's waits (startCluster). A join that ended
				// before the stop is left to the stop once the daemon serves (it leaves then).
				if isClosed(opts.Stop) {
					d.stopChildren(context.Background(), nil)
					log.Info("asked to stop during the start before it joined the cluster; stopped")
					return nil, ErrStopped
				}
				d.phase(phaseCluster)
				if err := d.startCluster(opts.Stop); err != nil {
					d.stopChildren(context.Background(), nil)
					if isClosed(opts.Stop) && errors.Is(err, context.Canceled) {
						log.Info("asked to stop during the start while it joined the cluster; stopped without joining")
						return nil, ErrStopped
					}
					return nil, fmt.Errorf("start: %w", err)
				}
			}
		case ch.Name == "probation":
			d.deps.Probation = pid
		case ch.Name == "timers":
			d.timers = pid
		}
	}
	// The start is over: what comes now waits in the listen backlog for the HTTP platform's Run,
	// and is never answered "starting".
	d.http.EndStarting()
	d.intake = actors.NewIntake(d.router, d.store, d.deps.Config.Keys, d.metrics, log.With(logging.KeyComponent, "actors"))
	for _, pid := range d.deps.Platforms {
		d.system.Root.Send(pid, &actors.StartIntake{Deliver: d.intake.Deliver, Withdraw: d.intake.Withdraw, WithdrawStored: d.intake.WithdrawStored})
	}
	log.Info("agentgate started", append(append([]any{"addr", d.addr.String(),
		"platforms", strings.Join(slices.Sorted(maps.Keys(d.deps.Platforms)), ","), "agent", cfg.Agent.Backend}, agentAttrs(cfg.Agent)...),
		"data_dir", cfg.DataDir, "store", storeName(d.store), "version", buildinfo.Version())...)
	if token == "" {
		// Loopback is not private on a host other users log in to (README): say so where a
		// deploy that skipped the README looks, once it serves (not before a refused start).
		// httpplatform.New refuses it off loopback.
		log.Info("http API serves without a bearer token: every user and process on this host can use it; set http.token_env to require one", "addr", d.addr.String())
	}
	return d, nil
}

// What the start is doing, as /readyz says it while the daemon starts (startStatus).
const (
	phaseDataDir = "taking the data directory's lock (an admin command that holds it is waited for)"
	phaseStore   = "opening the store"
	phaseReplay  = "replaying the writes the last run left in the spool before anything reads the database"
	phaseActors  = "starting the sessions and the platforms"
	phaseCluster = "joining the cluster"
)

// phase records what the start is doing (startPhase).
func (d *Daemon) phase(what string) { d.startPhase.Store(&what) }

// startStatus says what the start is doing, for /readyz while it runs (ServeStarting): during
// the replay of the spool, with the batches left.
func (d *Daemon) startStatus() string {
	p := d.startPhase.Load()
	switch {
	case p == nil:
		return "starting"
	case *p == phaseReplay:
		return fmt.Sprintf("%s: %d batches left", *p, d.spoolLeft.Load())
	}
	return *p
}

// agentAttrs are the start line's words on the agent beyond its backend: an openai backend's
// model and endpoint (its host, without the path, query or user info that may hold
// credentials), which a walkthrough missed when replies failed.
func agentAttrs(a config.Agent) []any {
	if a.Backend != "openai" {
		return nil
	}
	host := ""
	if u, err := url.Parse(a.OpenAI.BaseURL); err == nil {
		host = u.Host
	}
	return []any{"model", a.OpenAI.Model, "endpoint", host}
}

// Addr is the bound address of the HTTP listener.
func (d *Daemon) Addr() net.Addr { return d.addr }

// Router returns the session router (for tests and the admin API).
func (d *Daemon) Router() actors.SessionRouter { return d.router }

// Store returns the daemon's store.
func (d *Daemon) Store() persistence.Store { return d.store }

// Stop drains and stops the daemon: intake stops (HTTP 503), running turns get until the drain
// deadline to finish, then the tree stops in reverse order (cancelling what still runs; its
// messages stay pending in the store and run again at the next start), the persistence actor
// flushes and the store closes. ctx bounds the whole stop.
func (d *Daemon) Stop(ctx context.Context) error {
	d.stopping.Store(true)
	d.deps.Stopping.Store(true)
	d.intake.Drain()
	d.http.Drain()
	d.leave()
	// At debug level: the owner says why it stops, and for what the drain waits (serve's line).
	d.log.Debug("draining", "deadline", d.cfg.Shutdown.DrainTimeout)
	if t := d.cfg.Shutdown.DrainTimeout; t > 0 {
		if _, err := d.system.Root.RequestFuture(d.manager, &actors.Drain{}, t).Result(); err != nil {
			d.drainMissed(t)
		}
	}
	d.treeStopping.Store(true)
	d.stopChildren(ctx, d.withdraw)
	d.cancel()
	d.waitAgents(ctx)
	// What the agent's limited lines hold back is reported now, before the line that the daemon
	// stopped: their limiter's timer reported it up to a minute later, when the daemon had
	// exited (TestStopReportsTheAgentsLinesHeldBack).
	if f, ok := d.agent.(interface{ FlushLines() }); ok {
		f.FlushLines()
	}
	d.events.close()
	if d.cluster != nil {
		d.leaveCluster(ctx) // it shuts the actor system down
		d.unreadable.Flush()
	} else {
		d.system.Shutdown()
	}
	d.dispatcher.Stop()
	if d.meters != nil {
		_ = d.meters.Shutdown(ctx)
	}
	d.retrying.Wait() // it ends with d.ctx, cancelled above: no ping or record of it meets a closed store
	d.endRun(ctx)
	err := d.store.Close()
	_ = os.Remove(filepath.Join(d.cfg.DataDir, AddrFile))
	_ = os.Remove(filepath.Join(d.cfg.DataDir, RunFile))
	if d.dirLock != nil {
		_ = d.dirLock.Close() // after the spool's last write and the address files
	}
	d.logStopped()
	return err
}

// logStopped says that the daemon stopped, and whether writes wait in its spool.
func (d *Daemon) logStopped() {
	switch n, cerr := d.spooled(); {
	case cerr != nil:
		// Not "stopped", as if nothing waited: writes may, and the operator who moves or
		// restores the database now must know to look.
		d.log.Warn("stopped, but the writes left in the spool could not be counted; any there are replayed at the next start before any session loads",
			"dir", d.spool.Dir(), logging.Err(cerr))
	case n > 0:
		// Acknowledged writes the database does not have: an operator who moves or restores
		// the database now must keep data_dir/spool with it.
		d.log.Warn("stopped with writes waiting in the spool; the next start replays them before any session loads",
			"batches", n, "dir", d.spool.Dir())
	default:
		d.log.Info("stopped")
	}
}

// warnSpoolLeft says, in one line, that the spool in a cluster member's data directory holds
// batches: a single daemon left them there (the database refused them, and it stopped before
// it could store them) before the deployment became a cluster. A member keeps no spool and
// never replays one (Options.SharedStore), so their writes are in no database, and before
// nothing said so. They are not replayed here: they may be a SQLite database's writes, not
// this PostgreSQL database's, and a member's writes are fenced by key, which spooled ones are
// not. RUNBOOK says what an operator can do (the single daemon replays them at its start).
func warnSpoolLeft(log *slog.Logger, dataDir string) {
	dir := filepath.Join(dataDir, "spool")
	n, err := spool.Waiting(dir)
	if err != nil {
		log.Warn("count the writes left in the spool", "dir", dir, logging.Err(err))
		return
	}
	if n > 0 {
		log.Warn("a single daemon's spool is left in the data directory, and a cluster member never replays it: its writes are in no database; "+
			"to replay them, start that single daemon once on this data_dir with its own store settings (RUNBOOK)", "dir", dir, "batches", n)
	}
}

// spooled counts the batches left in the spool (none for a member, which keeps no spool), or
// says why it cannot (its directory cannot be read).
func (d *Daemon) spooled() (int, error) {
	if d.spool == nil {
		return 0, nil
	}
	return spool.Waiting(d.spool.Dir())
}

// beginRun records this run in the store (Store.BeginRun) once the persistence actor has
// replayed the spool the last run left, and before any session loads. When the last run never
// stopped cleanly (killed, out of memory, a fatal runtime error), the store counts that against
// the message each session was running, and a session quarantines one counted
// actors.QuarantineAfter times when it loads: a message that takes the whole process down
// would otherwise crash-loop a daemon under a process supervisor. Only a single daemon does
// this: cluster members start and stop on their own, and one's death says nothing of the
// messages the others run.
//
// A refused record is logged and tried again each second (retryRun) while the daemon goes on,
// and /readyz fails until the store takes it (storeReady): a store that refuses writes (a
// read-only database) gets no traffic until a message finds out, and one that takes them
// again is ready at once, not after the minute a refused message is remembered for, which no
// traffic ends while the probe keeps it away.
//
// A database file found deleted or replaced since the store opened it (persistence.ErrFileGone:
// by the record itself, or by the spool's replay before it) is the exception, returned for the
// start to fail: the store refuses every write to it for as long as it is open, so no retry
// can pass, and a daemon started on it would take every message into the spool only. Before,
// the record went into the old file and the daemon started on it, acknowledging messages that
// the next start did not have.
func (d *Daemon) beginRun(now func() time.Time) error {
	if now == nil {
		now = time.Now
	}
	if d.deps.Spooling.Load() {
		// The start's replay left the last run's writes in the spool (the database refused
		// it, or a batch could not be removed): the record waits for them, as its retry does
		// (retryRun). Made now, by a database that takes it right after refusing the replay,
		// it counted the last run's unclean stop against heads the spool had answered. A
		// database file the replay found deleted or replaced still fails the start.
		pctx, cancel := context.WithTimeout(d.ctx, pingWithin)
		err := d.store.Ping(pctx)
		cancel()
		if errors.Is(err, persistence.ErrFileGone) {
			return err
		}
		d.log.Info("writes of the last run wait in the spool; the daemon's run is recorded once they are replayed")
		d.retrying.Go(func() { d.retryRun(now) })
		return nil
	}
	err := d.recordRun(d.ctx, now)
	switch {
	case errors.Is(err, persistence.ErrFileGone):
		return err
	case err != nil:
		d.log.Warn("record the daemon's run in the store; trying again each second", logging.Err(err))
		d.retrying.Go(func() { d.retryRun(now) })
	}
	return nil
}

// runRetry is how often a refused record of the run is tried again: as often as the spool's
// replay tries the database.
const runRetry = time.Second

// runRetryWithin bounds each retry's write of the record of the run, well within abortEndRun:
// the write holds endMu, which Abort waits for (at most abortEndRun) to record the clean stop.
// Under the daemon's ctx alone it waited out SQLite's busy timeout (5 s): Abort gave up, and a
// record the retry then took made the next start count an unclean stop.
const runRetryWithin = abortEndRun / 2

// retryRun tries the record of the run again every runRetry until the store takes it or the
// daemon stops (its ctx ends, or the end of the run is written first). Its owner is the
// Daemon: Stop waits for it (retrying) before it closes the store.
//
// A record taken late counts the last run's unclean stop against the heads of that moment,
// not of the start: sessions already loaded do not quarantine what it counts until they load
// again, and a head that has changed since (the counted one answered) gets the strike. That
// stays within what the count allows anyway: a head below persistence.ProbationAfter is
// counted at every unclean stop (it can become a suspect, never reach quarantine), and a
// suspect only by its mark of the run that died. Without the retry, a clean stop of this run
// left the last run recorded and the next start made the same count, later still, and a
// suspect this run marked (the run never recorded) was not counted when this run died running
// it.
func (d *Daemon) retryRun(now func() time.Time) {
	t := time.NewTicker(runRetry)
	defer t.Stop()
	since := time.Now()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
		}
		// Not while the store's ping fails (the database locked by another process, read-only,
		// unreachable): the record would hold its writer for the whole busy timeout, and the
		// messages' commits with it.
		pctx, cancel := context.WithTimeout(d.ctx, pingWithin)
		err := d.store.Ping(pctx)
		cancel()
		if err != nil {
			continue
		}
		// Nor while writes wait in the spool: the record counts the last run's unclean stop
		// against each session's head pending message in the database, which lacks them. A
		// database back from an outage took the record before the spool's replay, and struck
		// messages the spool had answered, not the one that was running (found by a crash
		// soak on PostgreSQL).
		if d.deps.Spooling.Load() {
			continue
		}
		rctx, cancel := context.WithTimeout(d.ctx, runRetryWithin)
		err = d.recordRun(rctx, now)
		cancel()
		switch {
		case err == nil:
			d.log.Info("recorded the daemon's run in the store", "after", time.Since(since).Round(time.Second))
			return
		case errors.Is(err, errRunEnded):
			return
		}
	}
}

// errRunEnded is recordRun's answer once the end of the run is written (or given up).
var errRunEnded = errors.New("the run has ended")

// recordRun writes the record of the run (Store.BeginRun) within ctx and logs the last run's
// unclean stop it counted, if any. A refusal is kept for /readyz (runRefused).
func (d *Daemon) recordRun(ctx context.Context, now func() time.Time) error {
	d.endMu.Lock()
	defer d.endMu.Unlock()
	if d.ended {
		return errRunEnded
	}
	if !d.cleanStops {
		if err := d.endCleanStops(ctx); err != nil {
			d.runRefused.Store(&err)
			return err
		}
		d.cleanStops = true
	}
	u, err := d.store.BeginRun(ctx, d.deps.Run, now())
	if err != nil {
		d.runRefused.Store(&err)
		return err
	}
	d.began = true
	d.runRefused.Store(nil)
	if u != nil && len(u.Counted) == 0 {
		d.log.Info("the last run did not stop cleanly; no message was running", "run", u.Run, "started", u.StartedAt)
	} else if u != nil {
		// Which messages got a strike, and how many they have: one at actors.QuarantineAfter is
		// set aside as its session loads.
		const shown = 20
		strikes := make([]string, 0, min(len(u.Counted), shown))
		for _, m := range u.Counted[:min(len(u.Counted), shown)] {
			strikes = append(strikes, fmt.Sprintf("%s %s=%d/%d", m.Key, m.MessageID, m.Attempts, actors.QuarantineAfter))
		}
		d.log.Warn("the last run did not stop cleanly; one unclean stop is counted against the message each session was running",
			"run", u.Run, "started", u.StartedAt, "messages", len(u.Counted), "strikes", strikes)
	}
	return nil
}

// endRunTimeout bounds the write that records a clean stop, also when the stop's own deadline
// has passed: without it the next start counts an unclean stop.
const endRunTimeout = 5 * time.Second

// endRun records in the store that this run stopped cleanly, after the persistence actor's
// final flush.
func (d *Daemon) endRun(ctx context.Context) {
	d.endRunWithin(ctx, endRunTimeout)
}

// endRunWithin is endRun bounded by timeout; it writes once, whoever calls it first, and a
// second caller returns once the first one's write is done.
func (d *Daemon) endRunWithin(ctx context.Context, timeout time.Duration) {
	d.endMu.Lock()
	defer d.endMu.Unlock()
	d.ended = true
	if !d.began {
		return
	}
	d.began = false
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if err := d.store.EndRun(ctx, d.deps.Run); err != nil {
		if path, ferr := keepCleanStop(d.cfg.DataDir, d.deps.Run); ferr != nil {
			d.log.Warn("record the clean stop in the store; the next start counts an unclean stop",
				logging.Err(fmt.Errorf("%w (and in the data directory: %v)", err, ferr)))
		} else {
			d.log.Warn("record the clean stop in the store; kept in the data directory for the next start", "file", path, logging.Err(err))
		}
	}
}

// cleanStopPrefix begins the name of the file in the data directory that keeps a clean stop
// the store refused (a full disk, the database locked by another process): "clean-stop.<run>".
// The next start ends that run in the store (endCleanStops) before it records its own, and so
// does not count the stop as unclean. Before, it did: a strike against the message each
// session was running, on every restart of a daemon whose disk was full.
const cleanStopPrefix = "clean-stop."

// keepCleanStop creates the file of run's clean stop in dir (cleanStopPrefix) and returns its
// path. It is empty, since a full disk still takes a new empty file (an inode and a directory
// entry), not a byte of data; the directory is fsynced, for the file to outlast a power loss.
func keepCleanStop(dir, run string) (string, error) {
	path := filepath.Join(dir, cleanStopPrefix+run)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	df, err := os.Open(dir)
	if err != nil {
		return "", err
	}
	err = df.Sync()
	if cerr := df.Close(); err == nil {
		err = cerr
	}
	return path, err
}

// endCleanStops ends in the store the runs whose clean stop it refused (keepCleanStop), and
// removes their files. Ending a run the store no longer records (this start's record came
// since, or an earlier start's) changes nothing, so a file left behind is harmless; but every
// start would end its run again, and it would be wrong to say so each time: a file that cannot
// be removed is logged instead, with what to do.
func (d *Daemon) endCleanStops(ctx context.Context) error {
	entries, err := os.ReadDir(d.cfg.DataDir)
	if err != nil {
		return nil // BeginRun counts the stops kept there as unclean, as it did before they were kept
	}
	for _, e := range entries {
		run, ok := strings.CutPrefix(e.Name(), cleanStopPrefix)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if err := d.store.EndRun(ctx, run); err != nil {
			return err
		}
		path := filepath.Join(d.cfg.DataDir, e.Name())
		if err := os.Remove(path); err != nil {
			d.log.Warn("cannot remove the file of an earlier run's clean stop, which the store has recorded; remove it", "file", path, logging.Err(err))
			continue
		}
		d.log.Info("recorded the clean stop of an earlier run, which its store had refused", "run", run)
	}
	return nil
}

// Abort kills what the agent runs now, with everything it started (an exec agent's process
// groups), for a process that exits at once instead of stopping (a second stop signal). The
// turns' messages stay pending, and the next start runs them again: without this, what the
// killed turns' commands started would run on beside that new run. It then records the stop
// in the store as clean, within abortEndRun: an operator's second Ctrl-C is no crash, and
// counted as one (a strike against each session's running message) three of them
// quarantined an innocent message (found by a new user's walkthrough). It stops nothing else.
// The sessions' reports of the agents it killed are logged at debug level (Deps.Aborted).
func (d *Daemon) Abort() {
	if d.deps != nil {
		d.deps.Aborted.Store(true)
	}
	if k, ok := d.agent.(interface{ KillAll() int }); ok {
		if n := k.KillAll(); n > 0 {
			d.log.Warn("killed the agent commands still running, with what they started", "commands", n)
		}
	}
	// Within abortEndRun, also when the stop's own write of it is under way (it holds endMu).
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.endRunWithin(d.ctx, abortEndRun)
	}()
	t := time.NewTimer(abortEndRun)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		d.log.Warn("the clean stop was not recorded in time; the next start counts an unclean stop")
	}
}

// abortEndRun bounds Abort's write of the clean stop: the operator asked to exit now, and a
// store that does not answer within it leaves the stop counted as unclean.
const abortEndRun = time.Second

// waitAgents waits, within ctx, for the agent calls still in flight once every turn is
// cancelled: an exec agent's command gets SIGTERM, and SIGKILL for its whole process group
// after agent.exec.kill_grace. A daemon that exited before that left the processes its commands
// started running (only the command itself dies with the daemon, by Pdeathsig). No call starts
// from here on: a turn whose request comes late (its session restarted by a crash as the
// daemon stopped) would run beside the next start's rerun of its message.
func (d *Daemon) waitAgents(ctx context.Context) {
	d.deps.AgentCalls.Close()
	n := d.deps.AgentCalls.Running()
	if n == 0 {
		return
	}
	d.log.Info("waiting for cancelled agent calls to end", "calls", n)
	if err := d.deps.AgentCalls.Wait(ctx); err != nil {
		d.log.Warn("agent calls still running at the stop's deadline", "calls", d.deps.AgentCalls.Running())
		d.Abort() // an exec agent's commands, with what they started, before the daemon is gone
	}
}

// drainMissed logs which sessions still have work in hand when the drain deadline passes: their
// running turns are cancelled now, and their messages, pending in the store, run again at the
// next start (in a cluster, on the member that takes the session over), or, with
// sessions.recovery: notice, are answered there with a notice instead (drainMissedOutcome).
func (d *Daemon) drainMissed(deadline time.Duration) {
	var busy, handingOn []string
	if res, err := d.system.Root.RequestFuture(d.manager, &actors.ListActive{}, time.Second).Result(); err == nil {
		l := res.(*actors.ActiveList)
		busy, handingOn = l.Busy, l.HandingOn
	}
	const shown = 10
	if len(busy) == 0 && len(handingOn) > 0 {
		// A leaving member whose drain waited for hand-overs, not turns: before, the line said
		// it cancelled the turns of "sessions 0".
		d.log.Warn("drain deadline passed; stopping the sessions that have not handed their keys on: the member that takes each over recovers its work once this one has withdrawn",
			"deadline", deadline, "sessions", len(handingOn), "keys", handingOn[:min(len(handingOn), shown)])
		return
	}
	d.log.Warn("drain deadline passed; cancelling the turns still running: their messages stay pending and "+drainMissedOutcome(d.deps.Clustered, d.deps.Config.Recovery),
		"deadline", deadline, "sessions", len(busy), "keys", busy[:min(len(busy), shown)])
}

// drainMissedOutcome says, in the drain deadline's line, what becomes of the pending messages
// of the turns it cancels. Before, it said they run again at the next start also with
// sessions.recovery: notice, where the next start answers them with a notice and runs none.
func drainMissedOutcome(clustered bool, recovery string) string {
	switch {
	case clustered: // (recovery: notice is a single daemon's; a cluster always runs them)
		return "run again on the member that takes their session over, or at the next start"
	case recovery == actors.RecoveryNotice:
		return "are answered at the next start with a notice instead of run (sessions.recovery: notice), which tells their senders they may have been partly run"
	default:
		return "run again at the next start"
	}
}

// AddrFile is the file in the data directory that holds the running daemon's HTTP address.
const AddrFile = "http.addr"

// RunFile is the file in the data directory that names the running daemon's run, which its HTTP
// answers carry (httpplatform.RunHeader): an admin command asks the address of AddrFile only
// when the process there answers as that run, not a process of another run (the record of a
// daemon killed with -9 names an address another process may have taken since).
const RunFile = "http.run"

// recordAddr records the daemon's HTTP address and run in dir (AddrFile, RunFile), the run
// first: an address recorded beside another run's name is not asked.
func recordAddr(dir, addr, run string) error {
	if err := os.WriteFile(filepath.Join(dir, RunFile), []byte(run+"\n"), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, AddrFile), []byte(addr+"\n"), 0o600)
}

// The actors' dispatcher: protoactor's default mailbox throughput (messages per run before it
// yields), and at most this many pool workers per GOMAXPROCS.
const (
	dispatcherThroughput = 300
	dispatcherWorkers    = 32
)

// quiesceTimeout bounds how long a platform may take to finish its sends at stop.
const quiesceTimeout = 10 * time.Second

// stopChildren poisons the top-level actors in reverse start order, waiting for each, and
// calls beforeStore (when not nil) once the sessions and the platforms have stopped, before the
// persistence actor does.
func (d *Daemon) stopChildren(ctx context.Context, beforeStore func()) {
	for i := len(d.pids) - 1; i >= 0; i-- {
		if d.pids[i] == d.deps.Persist && beforeStore != nil {
			beforeStore()
		}
		if strings.HasPrefix(d.pids[i].Id, "platform-") {
			// Let replies already handed to the platform go out (and be confirmed) first.
			if _, err := d.system.Root.RequestFuture(d.pids[i], &actors.Quiesce{}, quiesceTimeout).Result(); err != nil {
				d.log.Warn("platform still sending at stop; unconfirmed replies are re-sent at the next start", "actor", d.pids[i].Id)
			}
		}
		f := d.system.Root.PoisonFuture(d.pids[i])
		done := make(chan error, 1)
		go func() { done <- f.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				// protoactor's PoisonFuture gives an actor 10 s (err: future: timeout).
				d.log.Warn("an actor did not stop within 10 s; the stop goes on without waiting for it", "actor", d.pids[i].Id, logging.Err(err))
			}
		case <-ctx.Done():
			d.log.Warn("the stop's deadline passed while an actor stopped; the stop goes on without waiting for it", "actor", d.pids[i].Id)
		}
	}
}

// ready reports each component for /readyz.
func (d *Daemon) ready(ctx context.Context) map[string]error {
	r := map[string]error{"store": d.storeReady(ctx)}
	if err := d.down.Load(); err != nil {
		r["actors"] = *err
	}
	if d.intake != nil && d.intake.Draining() {
		r["intake"] = errors.New("draining")
	} else {
		r["intake"] = nil
	}
	for _, p := range d.platforms {
		if c, ok := p.(platforms.Checker); ok {
			r["platform."+p.Name()] = c.Ready(ctx)
		} else {
			r["platform."+p.Name()] = d.health[p.Name()].Err()
		}
	}
	if d.cfg.Cluster.Enabled {
		r["cluster"] = d.clusterReady()
	}
	if a, ok := d.agent.(interface{ Ready() error }); ok {
		// An exec agent whose program was removed, or lost its execute bit, while the daemon
		// runs: every turn fails.
		r["agent"] = a.Ready()
	}
	return r
}

// storeReady is /readyz's store: its ping (the database answers and its write lock can be
// taken, and the store has not found it corrupt, or its file deleted or replaced), then whether
// writes are taken. A full or read-only disk passes the ping but refuses every write, so the
// persistence actor's own view counts: writes refused within the last
// persistence.RefusalMemory, or waiting in the spool for the database; so does the record of
// this run while the store refuses it (beginRun tries it again each second). The ping gets 0.8 s:
// a probe must answer well within a load balancer's timeout (2 to 5 s), which a commit waiting
// out SQLite's busy timeout (5 s) would exceed.
func (d *Daemon) storeReady(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, pingWithin)
	err := d.store.Ping(pctx)
	cancel()
	if errors.Is(err, persistence.ErrCorrupt) || errors.Is(err, persistence.ErrFileGone) {
		return err // it says what to do; the spool's "until it takes them again" would not pass
	}
	// Writes refused outright come first, whatever the ping says. Looked at only when the ping
	// passed, they went unsaid while writes waited in the spool and the ping failed too (the
	// database locked by another process as the disk filled): /readyz said the writes waited in
	// the spool while each new one was refused (found by a disk-full soak of the binary).
	if rerr := d.refusals.Err(time.Now()); rerr != nil {
		if d.deps.Spooling.Load() {
			rerr = fmt.Errorf("%v; the writes taken before wait in the spool", rerr)
		}
		if err != nil {
			return fmt.Errorf("%v (%v)", rerr, err)
		}
		return rerr
	}
	if refused := d.runRefused.Load(); err == nil && refused != nil {
		err = fmt.Errorf("the database refuses writes: it refused the record of this run, tried again each second (%v)", *refused)
	}
	if d.deps.Spooling.Load() {
		const spooled = "the database refuses writes; they wait in the spool until it takes them again"
		if err != nil {
			return fmt.Errorf("%s (%v)", spooled, err)
		}
		return errors.New(spooled)
	}
	return err
}

// pingWithin bounds the store's ping: within the 1 s a Kubernetes probe waits by default.
const pingWithin = 800 * time.Millisecond

// configuredPlatforms builds the platforms the configuration enables besides HTTP; store is the
// daemon's store (opened after this is called), which tells Discord where to read back from
// after a restart; now is the clock (nil: time.Now).
func configuredPlatforms(cfg *config.Config, log *slog.Logger, store func() persistence.Store, now func() time.Time) ([]platforms.Platform, error) {
	var out []platforms.Platform
	if dc := cfg.Platforms.Discord; dc.Enabled {
		token := strings.TrimSpace(os.Getenv(dc.TokenEnv)) // set: Start checked it before opening anything
		recent := func(ctx context.Context, since time.Time) ([]persistence.ChatMark, error) {
			return store().RecentChats(ctx, discord.Name, since, 0)
		}
		unread := func(ctx context.Context) ([]persistence.Unread, error) { return store().Unread(ctx, discord.Name, 0) }
		// A cluster member's refused gateway connection ends Run, so that its gateway lease goes
		// to another member; leaderPlatform waits out the refusal instead.
		p, err := discord.New(discord.Config{Token: token, Settings: dc, Logger: log.With("component", "discord"),
			Recent: recent, Unread: unread, Now: now, ReturnRefusal: cfg.Cluster.Enabled})
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

func newAgent(cfg *config.Config, log *slog.Logger, countRequest func(result string)) (agents.Agent, error) {
	switch cfg.Agent.Backend {
	case "echo":
		return echo.New(), nil
	case "exec":
		a, err := agentexec.New(agentexec.Config{
			Command: cfg.Agent.Exec.Command, Timeout: cfg.Agent.Exec.Timeout,
			KillGrace: cfg.Agent.Exec.KillGrace, History: cfg.Agent.Exec.History, HistoryBytes: cfg.Agent.Exec.HistoryBytes,
			Steer:    cfg.Agent.Exec.Steer,
			Withhold: cfg.SecretEnv(), Logger: log.With("component", "agent"),
		})
		if err != nil {
			return nil, fmt.Errorf("start: agent: %w", err)
		}
		return a, nil
	case "openai":
		o := cfg.Agent.OpenAI
		a, err := openai.New(openai.Config{
			BaseURL: o.BaseURL, Model: o.Model, APIKeyEnv: o.APIKeyEnv, SystemPrompt: o.SystemPrompt,
			Temperature: o.Temperature, MaxTokens: o.MaxTokens, Timeout: o.Timeout,
			MaxHistory: o.MaxHistory, TokenBudget: o.TokenBudget, MaxRetries: o.MaxRetries,
			MaxBackoff: o.MaxBackoff, Logger: log.With("component", "agent"), Requests: countRequest,
		})
		if err != nil {
			return nil, fmt.Errorf("start: agent: %w", err)
		}
		return a, nil
	}
	return nil, fmt.Errorf("start: agent backend %q is not available yet", cfg.Agent.Backend)
}

// resetPolicy converts a configured reset policy for the session runtime.
func resetPolicy(r config.Reset) actors.ResetPolicy {
	return actors.ResetPolicy{Mode: r.Mode, Idle: r.Idle(), AtHour: r.AtHour, Notify: r.Notify, Location: r.Location(),
		DailyMinIdle: r.DailyMinIdle}
}

func resetPolicies(cfg *config.Config) []actors.ResetPolicy {
	var out []actors.ResetPolicy
	for _, r := range cfg.ResetPolicies() {
		out = append(out, resetPolicy(r))
	}
	return out
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

func persistenceProps(d *Daemon) *actor.Props {
	var sp persistence.Spooler // nil, not a nil *spool.Spool: without a spool, failed writes are refused
	if d.spool != nil {
		sp = d.spool
	}
	return actor.PropsFromProducer(persistence.NewActor(d.ctx, d.store, persistence.ActorOptions{
		MaxBatch: d.cfg.Persist.MaxBatch,
		Log:      d.log.With("actor", "persistence"),
		Observe: func(n int, took time.Duration) {
			d.metrics.PersistBatchSize.Observe(float64(n))
			d.metrics.PersistFlushSeconds.Observe(took.Seconds())
		},
		Spool:         sp,
		Spooling:      &d.deps.Spooling,
		Refusals:      &d.refusals,
		WritesRefused: func(n int) { d.metrics.WritesRefused.Add(float64(n)) },
		SpoolFiles: func(n int) {
			d.metrics.SpoolFiles.Set(float64(n))
			d.spoolLeft.Store(int64(n))
		},
		Incarnation: &d.deps.PersistIncarnation,
	}), d.deps.Mailbox("persistence")...)
}

func platformProps(p platforms.Platform) func(d *Daemon) *actor.Props {
	return func(d *Daemon) *actor.Props {
		h := &actors.PlatformHealth{}
		d.health[p.Name()] = h
		return actors.NewPlatform(d.deps, p, h)
	}
}

func managerProps(d *Daemon) *actor.Props {
	p := actors.NewSessionManager(d.deps)
	if len(d.managerMiddleware) > 0 {
		p.Configure(actor.WithReceiverMiddleware(d.managerMiddleware...))
	}
	return p
}

func probationProps(d *Daemon) *actor.Props { return actors.NewProbation(d.deps) }

func timersProps(d *Daemon) *actor.Props {
	return actors.NewTimers(d.deps, d.router, d.cfg.Sessions.Reset.CheckEvery)
}

// floor is a slog handler that drops records below min (protoactor logs lifecycle chatter at
// Info).
//
// Once the daemon stops (hush set), what protoactor still says is logged at debug level: a
// leaving cluster member's connections to the others close, which protoactor reports as
// errors ("EndpointWriter lost connection") on every clean stop. The members that stay report
// the same when they close their connection to a member that left (the gRPC stream ends
// Canceled: this side closed it); that is logged at debug level too, since the membership
// change is logged already. A connection lost any other way stays an error.
type floor struct {
	h    slog.Handler
	min  slog.Level
	hush *atomic.Bool
}

func (f floor) Enabled(ctx context.Context, l slog.Level) bool {
	if f.hush != nil && f.hush.Load() {
		return f.h.Enabled(ctx, slog.LevelDebug)
	}
	return l >= f.min && f.h.Enabled(ctx, l)
}

func (f floor) Handle(ctx context.Context, r slog.Record) error {
	if f.hush != nil && f.hush.Load() || closedHere(r) {
		r.Level = slog.LevelDebug
		if !f.h.Enabled(ctx, r.Level) {
			return nil
		}
	}
	return f.h.Handle(ctx, r)
}

// closedHere reports whether r is protoactor's report of a connection to another member that
// this member closed itself (after the member left).
func closedHere(r slog.Record) bool {
	if r.Level < slog.LevelError || r.Message != "EndpointWriter lost connection" {
		return false
	}
	canceled := false
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && a.Key == "error" {
			canceled = status.Code(err) == codes.Canceled
		}
		return !canceled
	})
	return canceled
}
func (f floor) WithAttrs(a []slog.Attr) slog.Handler { return floor{f.h.WithAttrs(a), f.min, f.hush} }
func (f floor) WithGroup(n string) slog.Handler      { return floor{f.h.WithGroup(n), f.min, f.hush} }

// openStore opens the configured store: SQLite (the default) or PostgreSQL, and returns how many
// migrations its Open applied to the schema too (the stop's line during the start says so). A failed Open
// returns a nil interface, never a nil *Store inside one (the caller's cleanup closes a
// non-nil store). corrupt is called once a SQLite store finds its database damaged, recovered
// each time a PostgreSQL store takes writes again after it lost its daemon lock.
// ctx ends either store's waits but not a migration that has begun (postgres.Open, sqlite.Open):
// SQLite's wait for the database's write lock, which another process may hold (a sqlite3 shell,
// an offline admin command, a backup), up to the busy timeout of 5 s.
func openStore(ctx context.Context, cfg *config.Config, log *slog.Logger, exclusive bool, corrupt, recovered func()) (persistence.Store, int, error) {
	switch cfg.Store.Driver {
	case "postgres":
		st, err := postgres.Open(ctx, cfg.Store.DSN, postgres.Options{Logger: log, Exclusive: exclusive, Shared: !exclusive,
			LockTaken: recovered})
		if err != nil {
			return nil, 0, err
		}
		return st, st.Migrated(), nil
	default:
		st, err := sqlite.Open(ctx, cfg.DSN(), sqlite.Options{Synchronous: cfg.Store.Synchronous, Logger: log, Corrupt: corrupt})
		if err != nil {
			return nil, 0, err
		}
		return st, st.Migrated(), nil
	}
}

// storeRecovered tells the persistence actor that the store takes writes again after refusing
// them without a write to show it (postgres.Options.LockTaken: its daemon lock taken again), so
// that it wakes the sessions holding a turn result it refused at once
// (persistence.StoreRecovered). Called on the store's goroutine; it does not block.
func (d *Daemon) storeRecovered() {
	if pid := d.persist.Load(); pid != nil {
		d.system.Root.Send(pid, &persistence.StoreRecovered{})
	}
}

// storeName names a store for the start log: its String (the SQLite file, or the PostgreSQL
// database without its password), or its type when it has none (a wrapped store).
func storeName(st persistence.Store) string {
	if s, ok := st.(fmt.Stringer); ok {
		return s.String()
	}
	return fmt.Sprintf("%T", st)
}

// newRunID identifies one run of the daemon (actors.Deps.Run).
func newRunID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "r_" + hex.EncodeToString(b[:])
}

// Preflight returns what serve would refuse in the environment getenv reads, which the
// configuration alone cannot tell: a secret variable that is not set, an exec agent's command
// that is not on this machine. Each is "key: reason; serve refuses to start …", with what to do.
// serve refuses them before Start, and check-config as serve does (warns of them with
// --config-only, for a file checked on another machine than the one it runs on), both at the
// file's line of the key; Start refuses them too, for a caller that did not ask.
func Preflight(cfg *config.Config, getenv func(string) string) []string {
	var out []string
	unset := func(name string) bool { return strings.TrimSpace(getenv(name)) == "" }
	if cfg.HTTP.TokenEnv != "" && unset(cfg.HTTP.TokenEnv) {
		out = append(out, fmt.Sprintf("http.token_env: %s is not set here; serve refuses to start without the bearer token "+
			"(set it, or remove http.token_env to serve without a token, on a loopback address only)", cfg.HTTP.TokenEnv))
	}
	if dc := cfg.Platforms.Discord; dc.Enabled {
		switch botTokenProblem(getenv(dc.TokenEnv)) {
		case botTokenUnset:
			out = append(out, fmt.Sprintf("platforms.discord.token_env: %s is not set here; serve refuses to start without the bot token "+
				"(set it to the bot token, from the Developer Portal's Bot page, or set platforms.discord.enabled: false)", dc.TokenEnv))
		case botTokenPrefixOnly:
			out = append(out, fmt.Sprintf("platforms.discord.token_env: %s holds the prefix \"Bot\" alone, without the token; serve refuses to start without the bot token "+
				"(set it to the bot token, from the Developer Portal's Bot page)", dc.TokenEnv))
		}
	}
	if o := cfg.Agent.OpenAI; cfg.Agent.Backend == "openai" && o.APIKeyEnv != "" && unset(o.APIKeyEnv) {
		out = append(out, fmt.Sprintf("agent.openai.api_key_env: %s is not set here; serve refuses to start without the API key (for a server that takes none, set agent.openai.api_key_env: \"\")", o.APIKeyEnv))
	}
	if c := cfg.Agent.Exec.Command; cfg.Agent.Backend == "exec" && len(c) > 0 && c[0] != "" {
		if err := agentexec.FindCommand(c[0], ""); err != nil {
			out = append(out, fmt.Sprintf("agent.exec.command: %v; serve refuses to start with it", err))
		}
	}
	return out
}

// What botTokenProblem finds in the Discord bot token's variable.
const (
	botTokenOK = iota
	botTokenUnset
	botTokenPrefixOnly
)

// botTokenProblem says whether value, the variable platforms.discord.token_env names, holds no
// bot token: nothing but white space (unset), or the Authorization header's "Bot " prefix with
// nothing after it ("Bot ", "Bot", in any case), which the platform cuts only in front of a
// token. Before, the prefix alone passed as a token, sent as "Bot Bot", and Discord refused it
// once the daemon ran (a new operator's review).
func botTokenProblem(value string) int {
	switch t := strings.TrimSpace(value); {
	case t == "":
		return botTokenUnset
	case strings.EqualFold(t, "bot"):
		return botTokenPrefixOnly
	}
	return botTokenOK
}

// killGrace is the exec agent's kill grace as its Run applies it (zero: its default).
func killGrace(cfg *config.Config) time.Duration {
	if cfg.Agent.Exec.KillGrace > 0 {
		return cfg.Agent.Exec.KillGrace
	}
	return agentexec.DefaultKillGrace
}
