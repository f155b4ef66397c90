// Package config is agentgate's configuration: one Config struct, loaded in the order defaults →
// YAML file → AGENTGATE_* environment → flags, decoded strictly (unknown keys are errors) and
// validated with every problem reported at once, each with its field name.
//
// Secrets never live in the config: it names the environment variables that hold them.
package config

import (
	"slices"
	"time"
)

// Config is the whole configuration of one agentgate process.
type Config struct {
	DataDir   string    `yaml:"data_dir"`
	Log       Log       `yaml:"log"`
	HTTP      HTTP      `yaml:"http"`
	Store     Store     `yaml:"store"`
	Sessions  Sessions  `yaml:"sessions"`
	Agent     Agent     `yaml:"agent"`
	Platforms Platforms `yaml:"platforms"`
	Shutdown  Shutdown  `yaml:"shutdown"`
	Metrics   Metrics   `yaml:"metrics"`
	Persist   Persist   `yaml:"persistence"`
	Cluster   Cluster   `yaml:"cluster"`
}

// Log configures logging.
type Log struct {
	Level  string `yaml:"level"`  // debug | info | warn | error
	Format string `yaml:"format"` // text (tint) | json
}

// HTTP configures the HTTP platform listener (which also serves /metrics and health).
type HTTP struct {
	Addr     string `yaml:"addr"`
	TokenEnv string `yaml:"token_env"` // env var holding the bearer token
	// Pprof serves Go's runtime profiles at /debug/pprof/ (goroutine dumps of a daemon that
	// seems stuck, heap and CPU profiles), behind the token like every other route.
	Pprof bool `yaml:"pprof"`
	// MaxHeld bounds the requests held open at once, event streams and ?wait requests; more
	// are answered 503. 0 means the HTTP platform's default (1024).
	MaxHeld int `yaml:"max_held"`
	// MaxConnections bounds the connections open at once, counted before a request is read
	// or its token checked; more wait in the kernel's listen backlog until one closes. 0 means
	// the HTTP platform's default: 4096, or max_held + 64 when that is more (a max_held raised
	// before this key existed needs no new key). There is no unbounded setting.
	MaxConnections int `yaml:"max_connections"`
}

// Store configures the database.
type Store struct {
	Driver      string `yaml:"driver"` // sqlite | postgres
	DSN         string `yaml:"dsn"`    // default <data_dir>/agentgate.db
	Synchronous string `yaml:"synchronous"`
}

// Sessions configures session keys, queues, resets and passivation.
type Sessions struct {
	GroupSessionsPerUser  bool          `yaml:"group_sessions_per_user"`
	ThreadSessionsPerUser bool          `yaml:"thread_sessions_per_user"`
	PassivateAfter        time.Duration `yaml:"passivate_after"`
	MaxInMemory           int           `yaml:"max_in_memory"` // 0: no bound (actors.SessionConfig.MaxInMemory)
	Queue                 Queue         `yaml:"queue"`
	Reset                 Reset         `yaml:"reset"`
	// ResetByPlatform overrides Reset per platform name (discord, http); it beats ResetByType.
	ResetByPlatform map[string]ResetOverride `yaml:"reset_by_platform"`
	// ResetByType overrides Reset per chat type (dm, group, channel, thread).
	ResetByType  map[string]ResetOverride `yaml:"reset_by_type"`
	Prune        Prune                    `yaml:"prune"`
	Recovery     string                   `yaml:"recovery"` // rerun | notice
	HistoryLimit int                      `yaml:"history_limit"`
}

// Queue configures what happens to messages that arrive while a turn runs.
type Queue struct {
	Mode     string        `yaml:"mode"` // followup | collect | interrupt | steer
	Cap      int           `yaml:"cap"`
	Overflow string        `yaml:"overflow"` // spool | reject
	Debounce time.Duration `yaml:"debounce"`
	// DebounceByPlatform overrides Debounce per platform name.
	DebounceByPlatform map[string]time.Duration `yaml:"debounce_by_platform"`
}

// Reset configures automatic session resets. Config.ResetFor gives the policy of one platform
// and chat type, with the overrides applied.
type Reset struct {
	Mode        string `yaml:"mode"` // none | idle | daily | both
	IdleMinutes int    `yaml:"idle_minutes"`
	AtHour      int    `yaml:"at_hour"` // 0-23, in Timezone
	// Timezone is the IANA name (Europe/Berlin) that AtHour is read in; "" is the machine's
	// local time. Location resolves it.
	Timezone string `yaml:"timezone"`
	Notify   bool   `yaml:"notify"` // tell the user once that the session was reset
	// DailyMinIdle defers a daily reset of a session active less than this long before the
	// hour until it has been idle this long; a message before then keeps the session (its
	// next daily reset is the next day's). 0: the reset is at the hour, whatever the activity.
	DailyMinIdle time.Duration `yaml:"daily_min_idle"`
	// QuietPlatforms are the platforms on which the reset notice is never sent.
	QuietPlatforms []string `yaml:"quiet_platforms"`
	// CheckEvery is how often the durable reset timer scans for sessions that are due.
	CheckEvery time.Duration `yaml:"check_every"`
}

// ResetOverride changes some fields of Reset for one platform or chat type. A nil field (a key
// left out of the file) inherits the value of sessions.reset.
type ResetOverride struct {
	Mode        *string `yaml:"mode,omitempty"`
	IdleMinutes *int    `yaml:"idle_minutes,omitempty"`
	AtHour      *int    `yaml:"at_hour,omitempty"`
	Notify      *bool   `yaml:"notify,omitempty"`
	// DailyMinIdle is Reset.DailyMinIdle.
	DailyMinIdle *time.Duration `yaml:"daily_min_idle,omitempty"`
}

// Prune configures the deletion of sessions that ended long ago.
type Prune struct {
	Enabled bool `yaml:"enabled"`
	// Retention is how long an ended session is kept after it ended.
	Retention time.Duration `yaml:"retention"`
	// Interval is the time between two pruning passes.
	Interval time.Duration `yaml:"interval"`
}

// Agent configures the agent backend.
type Agent struct {
	Backend string `yaml:"backend"` // echo | exec | openai
	// MaxConcurrent bounds the exec or openai agent calls that run at once, over every
	// session; more wait for a slot, first come first served. 0: no bound. The echo agent,
	// which answers at once, has none.
	MaxConcurrent int    `yaml:"max_concurrent"`
	Exec          Exec   `yaml:"exec"`
	OpenAI        OpenAI `yaml:"openai"`
}

// Exec configures the exec agent.
type Exec struct {
	Command []string      `yaml:"command"`
	Timeout time.Duration `yaml:"timeout"`
	History int           `yaml:"history"`
	// HistoryBytes bounds the history on the command's stdin, in bytes of its JSON: the oldest
	// entries are left out first, whole, and the newest is sent even when it alone takes more.
	// 0 means no bound.
	HistoryBytes int `yaml:"history_bytes"`
	// KillGrace is how long an interrupted command gets between SIGTERM and SIGKILL.
	KillGrace time.Duration `yaml:"kill_grace"`
	// Steer declares that the command reads steered messages as JSON lines on stdin while it
	// runs, so queue mode steer can deliver into its running turn; without it, steer falls
	// back to followup.
	Steer bool `yaml:"steer"`
}

// OpenAI configures the OpenAI-compatible agent.
type OpenAI struct {
	BaseURL string `yaml:"base_url"`
	Model   string `yaml:"model"`
	// APIKeyEnv names the environment variable holding the API key; "" sends no key (a local
	// endpoint).
	APIKeyEnv    string `yaml:"api_key_env"`
	SystemPrompt string `yaml:"system_prompt"`
	// Temperature is sent when set (0 to 2); unset leaves it to the endpoint.
	Temperature *float64 `yaml:"temperature,omitempty"`
	// MaxTokens bounds a reply (max_tokens); 0 leaves it to the endpoint.
	MaxTokens int `yaml:"max_tokens"`
	// Timeout bounds one turn, retries included.
	Timeout time.Duration `yaml:"timeout"`
	// MaxHistory is how many earlier messages a request carries at most.
	MaxHistory int `yaml:"max_history"`
	// TokenBudget bounds a request's estimated tokens (4 ASCII characters a token, any other
	// character a token) by dropping the oldest history; 0 means no budget.
	TokenBudget int `yaml:"token_budget"`
	// MaxRetries is how often a call refused with 429 or 5xx, or not answered, is tried again.
	MaxRetries int `yaml:"max_retries"`
	// MaxBackoff caps the wait before a retry (and the Retry-After honoured).
	MaxBackoff time.Duration `yaml:"max_backoff"`
}

// Platforms configures the chat platforms other than HTTP, which is always on.
type Platforms struct {
	Discord Discord `yaml:"discord"`
}

// Discord configures the Discord platform. Ids are Discord snowflakes, as strings.
type Discord struct {
	Enabled  bool   `yaml:"enabled"`
	TokenEnv string `yaml:"token_env"` // env var holding the bot token
	// RequireMention: in guild channels, answer only messages that mention the bot. DMs never
	// need a mention, nor do threads the bot started.
	RequireMention bool `yaml:"require_mention"`
	// AutoThread: a mention in a guild text channel opens a thread from that message, and the
	// conversation continues there, one thread and session per mention.
	AutoThread bool `yaml:"auto_thread"`
	// FreeResponseChannels are channels where every message is answered, mention or not.
	FreeResponseChannels []string `yaml:"free_response_channels"`
	// Guilds and Channels override require_mention per guild and per channel (a channel
	// beats its guild; a thread follows its parent channel).
	Guilds   map[string]DiscordScope `yaml:"guilds"`
	Channels map[string]DiscordScope `yaml:"channels"`
	// AllowedGuilds, AllowedChannels and AllowedUsers, when not empty, are the only guilds,
	// channels (a thread counts as its parent) and users answered; everything else is ignored
	// before it is queued. DMs are checked against AllowedUsers only.
	AllowedGuilds   []string `yaml:"allowed_guilds"`
	AllowedChannels []string `yaml:"allowed_channels"`
	AllowedUsers    []string `yaml:"allowed_users"`
	// AllowBots answers messages from other bots (the bot's own messages are always ignored).
	AllowBots bool `yaml:"allow_bots"`
	// ShardID and ShardCount place this gateway connection among the bot's shards.
	ShardID    int `yaml:"shard_id"`
	ShardCount int `yaml:"shard_count"`
	// APIURL replaces Discord's REST base URL (https://discord.com/api/v9/), for a REST proxy.
	APIURL string `yaml:"api_url"`
	// ThreadArchiveMinutes is the auto-archive duration of threads the bot opens:
	// 60, 1440, 4320 or 10080.
	ThreadArchiveMinutes int `yaml:"thread_archive_minutes"`
	// BackfillWindow bounds what the bot reads back from channel history when Discord replayed
	// nothing (a new gateway session: after a restart, or a refused resume): the channels it
	// took a message from within this window, and messages at most this old. 0s turns it off.
	BackfillWindow time.Duration `yaml:"backfill_window"`
}

// DiscordScope overrides Discord gating for one guild or channel; a nil field inherits.
type DiscordScope struct {
	RequireMention *bool `yaml:"require_mention,omitempty"`
}

// Shutdown configures the drain on SIGTERM/SIGINT.
type Shutdown struct {
	// DrainTimeout bounds how long running turns may take to finish before they are cancelled.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
}

// Persist configures the persistence actor.
type Persist struct {
	// MaxBatch bounds the write groups of one transaction: 1 to MaxBatchLimit.
	MaxBatch int `yaml:"max_batch"`
}

// MaxBatchLimit is the largest persistence.max_batch. A larger transaction holds the store's
// write lock longer for no gain (the batching gain is spent well below it, docs/BENCHMARKS.md),
// and a platform writes the delivery marks of at most this many replies at a time: a batch
// above it could carry more replies per commit than one mark write can keep up with.
const MaxBatchLimit = 4096

// Cluster configures cluster mode (DESIGN §6): several members share one PostgreSQL store, and
// each session runs on the member the cluster places its key on.
type Cluster struct {
	Enabled bool   `yaml:"enabled"`
	Name    string `yaml:"name"` // members with the same name form one cluster
	// Bind is the host:port of this member's gRPC listener, which the other members dial.
	Bind string `yaml:"bind"`
	// Advertise is the host:port the other members dial when it differs from Bind (behind NAT,
	// or when Bind is 0.0.0.0).
	Advertise string `yaml:"advertise"`
	// MemberTTL is how long a member stays in the cluster without renewing its registration in
	// the store (it renews every third of it): how soon the others take over its sessions when
	// it dies.
	MemberTTL time.Duration `yaml:"member_ttl"`
	// TLS makes the members talk mutual TLS: each presents its certificate, and accepts only
	// peers whose certificate the CA signed.
	TLS ClusterTLS `yaml:"tls"`
}

// ClusterTLS names PEM files; all three are set, or none (plain gRPC, for a private network).
type ClusterTLS struct {
	CertFile string `yaml:"cert_file"` // this member's certificate (chain)
	KeyFile  string `yaml:"key_file"`  // its private key
	CAFile   string `yaml:"ca_file"`   // the CA that signs every member's certificate
}

// Metrics configures what /metrics exports beyond agentgate's own metrics.
type Metrics struct {
	// Actors adds protoactor's own actor metrics (protoactor_*; off by default: at the write
	// ceiling they cost about a third of the daemon's CPU). agentgate's own actor metrics
	// (agentgate_actor_*, agentgate_mailbox_depth) are always exported.
	Actors bool `yaml:"actors"`
}

// SecretEnv names the environment variables that hold the secrets this daemon uses (its HTTP
// bearer token, its bot token when Discord is enabled, its API key when the openai backend
// runs, PGPASSWORD when its store is PostgreSQL): an agent's subprocess must not inherit them. A variable the daemon does not use is the
// operator's to pass on (an exec agent calling a model may want OPENAI_API_KEY).
func (c *Config) SecretEnv() []string {
	var out []string
	add := func(v string) {
		if v != "" && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	add(c.HTTP.TokenEnv)
	if c.Platforms.Discord.Enabled {
		add(c.Platforms.Discord.TokenEnv)
	}
	if c.Agent.Backend == "openai" {
		add(c.Agent.OpenAI.APIKeyEnv)
	}
	if c.Store.Driver == "postgres" {
		// The database password, as README tells the operator to give it (pgx reads it as
		// libpq does): a chat-driven command that prints its environment would post it.
		add("PGPASSWORD")
	}
	return out
}
