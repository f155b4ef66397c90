package config

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Validate checks every key and returns all problems at once, joined with errors.Join, each a
// *FieldError naming its key. It returns nil when the configuration is usable.
func (c *Config) Validate() error {
	return errors.Join(c.validate()...)
}

func (c *Config) validate() []error {
	var v validator
	v.required("data_dir", c.DataDir != "", "", "")
	if !slices.Contains(logLevels, strings.ToLower(c.Log.Level)) {
		// In any case, as slog's own level names are read: LOG_LEVEL=INFO, a common spelling,
		// was refused (found by an audit). SlogLevel reads it the same way.
		v.add("log.level", c.Log.Level, "must be one of "+strings.Join(logLevels, ", ")+" (in any case)")
	}
	v.oneOf("log.format", c.Log.Format, "text", "json")
	v.hostPort("http.addr", c.HTTP.Addr)
	v.envName("http.token_env", c.HTTP.TokenEnv)
	atLeast(&v, "http.max_held", c.HTTP.MaxHeld, 0)
	atMost(&v, "http.max_held", c.HTTP.MaxHeld, maxHeld, "each held request costs a connection, a file descriptor and some 40 KiB")
	atLeast(&v, "http.max_connections", c.HTTP.MaxConnections, 0)
	if held, conns := cmp.Or(c.HTTP.MaxHeld, 1024), c.HTTP.MaxConnections; conns > 0 && held > 0 && held <= maxHeld && conns < held+connectionRoom {
		// Held requests would take every connection: health checks, scrapes and new messages
		// would wait in the backlog behind them.
		v.addOf("http.max_connections", conns, fmt.Sprintf("must be at least http.max_held + %d (%d), so that held event streams and ?wait requests leave connections for health checks and new messages", connectionRoom, held+connectionRoom),
			"http.max_held")
	}
	if host, _, err := net.SplitHostPort(c.HTTP.Addr); err == nil && c.HTTP.TokenEnv == "" && !LoopbackHost(host) {
		v.add("http.addr", c.HTTP.Addr, "is not a loopback address, where the API needs a bearer token: set http.token_env")
	}

	v.oneOf("store.driver", c.Store.Driver, "sqlite", "postgres")
	if c.Store.Driver != "postgres" && postgresDSN(c.Store.DSN) {
		// SQLite took it for a file name: a database in a directory named after the URL,
		// the daemon on SQLite where its operator meant PostgreSQL (found by an audit).
		v.addOf("store.dsn", nil, "is a PostgreSQL connection string, but store.driver is "+c.Store.Driver+": set store.driver: postgres", "store.driver") // a DSN may hold a password
	}
	if c.Store.Driver == "postgres" {
		v.required("store.dsn", c.Store.DSN != "", "store.driver", "is postgres")
		// Before, only the store's Open found a DSN pgx cannot read, once the daemon had begun
		// to start, in words that did not say what was wrong (found by an audit).
		// A problem of a file it names, or of a PG* variable pgx reads, is this machine's
		// (CheckPostgres), not the configuration's.
		if p := pgDSNProblem(c.Store.DSN); p.reason != "" && !p.file && len(p.vars) == 0 {
			v.add("store.dsn", nil, "cannot be parsed: "+p.reason+"; "+dsnForms) // a DSN may hold a password
		}
	}
	v.oneOf("store.synchronous", c.Store.Synchronous, "full", "normal")
	if cl := &c.Cluster; cl.Enabled {
		if c.Store.Driver != "postgres" {
			v.addOf("cluster.enabled", true, "needs store.driver: postgres (every member must reach the sessions' store)", "store.driver")
		}
		v.required("cluster.name", cl.Name != "", "cluster.enabled", "")
		v.hostPort("cluster.bind", cl.Bind)
		if cl.Advertise != "" {
			v.hostPort("cluster.advertise", cl.Advertise)
			if EveryInterface(cl.Advertise) {
				v.add("cluster.advertise", cl.Advertise, "must be an address the other members can dial, not every interface")
			}
		} else if EveryInterface(cl.Bind) {
			// protoactor would register the listener's address, which every other member dials
			// as itself; two such members would also register one address, the mark of a
			// restarted member (the older one would be taken for gone).
			v.add("cluster.bind", cl.Bind, "listens on every interface: set cluster.advertise to the host:port the other members dial")
		}
		atLeast(&v, "cluster.member_ttl", cl.MemberTTL, time.Second)
		if t := cl.TLS; (t.CertFile != "" || t.KeyFile != "" || t.CAFile != "") && (t.CertFile == "" || t.KeyFile == "" || t.CAFile == "") {
			v.addOf("cluster.tls", fmt.Sprintf("cert_file %q, key_file %q, ca_file %q", t.CertFile, t.KeyFile, t.CAFile),
				"set all three files (mutual TLS) or none", "cluster.tls.cert_file", "cluster.tls.key_file", "cluster.tls.ca_file")
		}
	}

	s := &c.Sessions
	atLeast(&v, "sessions.passivate_after", s.PassivateAfter, 0)
	atLeast(&v, "sessions.max_in_memory", s.MaxInMemory, 0)
	v.oneOf("sessions.queue.mode", s.Queue.Mode, "followup", "collect", "interrupt", "steer")
	atLeast(&v, "sessions.queue.cap", s.Queue.Cap, 1)
	atMost(&v, "sessions.queue.cap", s.Queue.Cap, maxQueueCap,
		"a session holds that many messages in memory, some 4 KiB each; with overflow: spool, those past the cap wait in the store")
	v.oneOf("sessions.queue.overflow", s.Queue.Overflow, "spool", "reject")
	debounce := func(field string, d time.Duration) {
		atLeast(&v, field, d, 0)
		atMost(&v, field, d, maxDebounce, "every turn waits this long after its sender's last message")
	}
	debounce("sessions.queue.debounce", s.Queue.Debounce)
	for _, p := range slices.Sorted(maps.Keys(s.Queue.DebounceByPlatform)) {
		debounce(keyPath("sessions.queue.debounce_by_platform", p), s.Queue.DebounceByPlatform[p])
	}
	r := &s.Reset
	v.resetFields("sessions.reset", ResetOverride{Mode: &r.Mode, IdleMinutes: &r.IdleMinutes, AtHour: &r.AtHour, DailyMinIdle: &r.DailyMinIdle})
	if r.Timezone != "" {
		if _, err := loadLocation(r.Timezone); err != nil {
			v.add("sessions.reset.timezone", r.Timezone, "must be an IANA time zone such as Europe/Berlin or UTC, or empty for local time")
		}
	}
	for i, p := range r.QuietPlatforms {
		v.platformName(fmt.Sprintf("sessions.reset.quiet_platforms[%d]", i), p, p)
	}
	atLeast(&v, "sessions.reset.check_every", r.CheckEvery, time.Second)
	for _, p := range slices.Sorted(maps.Keys(s.ResetByPlatform)) {
		field := keyPath("sessions.reset_by_platform", p)
		v.platformName(field, p, nil)
		o := s.ResetByPlatform[p]
		v.resetFields(field, o)
		if o.Notify != nil && *o.Notify && slices.Contains(r.QuietPlatforms, p) {
			v.addOf(field+".notify", true, "contradicts sessions.reset.quiet_platforms, which lists "+p, "sessions.reset.quiet_platforms")
		}
	}
	for _, t := range slices.Sorted(maps.Keys(s.ResetByType)) {
		field := keyPath("sessions.reset_by_type", t)
		if !slices.Contains(chatTypes, t) {
			v.add(field, nil, "unknown chat type: must be one of "+strings.Join(chatTypes, ", "))
		}
		v.resetFields(field, s.ResetByType[t])
	}
	if s.Prune.Enabled {
		atLeast(&v, "sessions.prune.retention", s.Prune.Retention, 24*time.Hour)
		atLeast(&v, "sessions.prune.interval", s.Prune.Interval, time.Minute)
	}
	v.oneOf("sessions.recovery", s.Recovery, "rerun", "notice")
	atLeast(&v, "sessions.history_limit", s.HistoryLimit, 0)

	a := &c.Agent
	v.oneOf("agent.backend", a.Backend, "echo", "exec", "openai")
	if a.Backend == "exec" {
		v.required("agent.exec.command", len(a.Exec.Command) > 0, "agent.backend", "is exec")
		if len(a.Exec.Command) > 0 && a.Exec.Command[0] == "" {
			// Set, so not "required": its program is what is missing (found by a walkthrough).
			v.add("agent.exec.command", a.Exec.Command, "its first element, the program to run, is empty")
		}
	}
	atLeast(&v, "agent.max_concurrent", a.MaxConcurrent, 0)
	// At least a second: a shorter one (1ns) fails every turn, each with a timeout.
	atLeast(&v, "agent.exec.timeout", a.Exec.Timeout, minAgentTimeout)
	atLeast(&v, "agent.exec.history", a.Exec.History, 0)
	atLeast(&v, "agent.exec.history_bytes", a.Exec.HistoryBytes, 0)
	atLeast(&v, "agent.exec.kill_grace", a.Exec.KillGrace, 0)
	if a.Backend == "openai" {
		v.required("agent.openai.base_url", a.OpenAI.BaseURL != "", "agent.backend", "is openai")
		v.required("agent.openai.model", a.OpenAI.Model != "", "agent.backend", "is openai")
	}
	if a.OpenAI.BaseURL != "" {
		u, err := url.Parse(a.OpenAI.BaseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			// No value in the message: a URL may carry credentials.
			v.add("agent.openai.base_url", nil, "must be an absolute http or https URL")
		} else if strings.HasSuffix(strings.TrimSuffix(u.Path, "/"), "/chat/completions") {
			// The agent adds the endpoint's path: this one would be asked for
			// …/chat/completions/chat/completions, a 404 at every turn.
			v.add("agent.openai.base_url", nil, "is the API root (such as https://api.openai.com/v1), without /chat/completions")
		} else if u.User != nil {
			// net/http would send it as Basic credentials, or drop it next to the key's Bearer
			// header; either way a secret sits in the file and in every place the URL is shown.
			v.add("agent.openai.base_url", nil, "must not hold user info (user:password@): give the API key through agent.openai.api_key_env")
		} else if strings.Contains(a.OpenAI.BaseURL, "#") {
			// A URL's "#" can only start its fragment (a literal one is %23).
			v.add("agent.openai.base_url", nil, "must not hold a fragment (#…): an HTTP client never sends it, so it means nothing here")
		}
	}
	v.envName("agent.openai.api_key_env", a.OpenAI.APIKeyEnv)
	if t := a.OpenAI.Temperature; t != nil && !(*t >= 0 && *t <= 2) {
		v.add("agent.openai.temperature", *t, "must be from 0 to 2")
	}
	atLeast(&v, "agent.openai.max_tokens", a.OpenAI.MaxTokens, 0)
	atLeast(&v, "agent.openai.timeout", a.OpenAI.Timeout, minAgentTimeout)
	atLeast(&v, "agent.openai.max_history", a.OpenAI.MaxHistory, 0)
	atLeast(&v, "agent.openai.token_budget", a.OpenAI.TokenBudget, 0)
	atLeast(&v, "agent.openai.max_retries", a.OpenAI.MaxRetries, 0)
	atLeast(&v, "agent.openai.max_backoff", a.OpenAI.MaxBackoff, time.Second)

	d := &c.Platforms.Discord
	v.envName("platforms.discord.token_env", d.TokenEnv)
	if d.Enabled {
		v.required("platforms.discord.token_env", d.TokenEnv != "", "platforms.discord.enabled", "is true")
	}
	atLeast(&v, "platforms.discord.shard_count", d.ShardCount, 1)
	if d.ShardID < 0 || (d.ShardCount >= 1 && d.ShardID >= d.ShardCount) {
		v.add("platforms.discord.shard_id", d.ShardID, "must be from 0 to shard_count-1")
	}
	if d.Enabled && c.Cluster.Enabled && d.ShardCount > 1 {
		// A cluster holds one gateway connection for the bot (the lease gateway/discord, whose
		// holder also keeps the bot's unread places): one shard of several would be connected,
		// the other shards' guilds never heard.
		v.addOf("platforms.discord.shard_count", d.ShardCount, "must be 1 with cluster.enabled: a cluster connects one gateway for the bot; run a bot that needs shards as one daemon per shard_id",
			"cluster.enabled")
	}
	atLeast(&v, "platforms.discord.backfill_window", d.BackfillWindow, 0)
	if d.Enabled && c.Sessions.Prune.Enabled && d.BackfillWindow >= c.Sessions.Prune.Retention {
		// A message read back that old may be one whose session was pruned: nothing would say
		// it was taken, and it would be answered again.
		v.addOf("platforms.discord.backfill_window", d.BackfillWindow,
			fmt.Sprintf("must be shorter than sessions.prune.retention (%v): a message read back whose session was pruned would be answered again", c.Sessions.Prune.Retention),
			"sessions.prune.retention")
	}
	if !slices.Contains([]int{60, 1440, 4320, 10080}, d.ThreadArchiveMinutes) {
		v.add("platforms.discord.thread_archive_minutes", d.ThreadArchiveMinutes, "must be 60, 1440, 4320 or 10080")
	}
	if d.APIURL != "" {
		u, err := url.Parse(d.APIURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			v.add("platforms.discord.api_url", nil, "must be an absolute http or https URL")
		}
	}
	for _, list := range []struct {
		field string
		ids   []string
	}{
		{"free_response_channels", d.FreeResponseChannels}, {"allowed_guilds", d.AllowedGuilds},
		{"allowed_channels", d.AllowedChannels}, {"allowed_users", d.AllowedUsers},
	} {
		for i, id := range list.ids {
			v.snowflake(fmt.Sprintf("platforms.discord.%s[%d]", list.field, i), id)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(d.Guilds)) {
		v.snowflake(keyPath("platforms.discord.guilds", id), id)
	}
	for _, id := range slices.Sorted(maps.Keys(d.Channels)) {
		v.snowflake(keyPath("platforms.discord.channels", id), id)
	}

	atLeast(&v, "shutdown.drain_timeout", c.Shutdown.DrainTimeout, 0)
	atLeast(&v, "persistence.max_batch", c.Persist.MaxBatch, 1)
	if c.Persist.MaxBatch > MaxBatchLimit {
		v.add("persistence.max_batch", c.Persist.MaxBatch, fmt.Sprintf("must be at most %d", MaxBatchLimit))
	}
	return v.errs
}

// validator collects FieldErrors.
type validator struct {
	errs []error
}

func (v *validator) add(field string, value any, reason string) {
	v.errs = append(v.errs, &FieldError{Field: field, Value: value, Err: errors.New(reason)})
}

// addOf adds a problem of field that is one between keys: others are the keys besides field
// whose values make it one (FieldError.others), which the problem names the variables of.
func (v *validator) addOf(field string, value any, reason string, others ...string) {
	v.errs = append(v.errs, &FieldError{Field: field, Value: value, Err: errors.New(reason), others: others})
}

// required adds a problem when field is missing (not ok). A field required only by the value
// of another key, cause, is "required when <cause> <cond>", and carries cause (FieldError).
func (v *validator) required(field string, ok bool, cause, cond string) {
	if ok {
		return
	}
	if cause == "" {
		v.add(field, nil, "required")
		return
	}
	v.errs = append(v.errs, &FieldError{Field: field, Err: errors.New(strings.TrimSpace("required when " + cause + " " + cond)), cause: cause})
}

func (v *validator) oneOf(field, got string, allowed ...string) {
	for _, a := range allowed {
		if got == a {
			return
		}
	}
	v.add(field, got, "must be one of "+strings.Join(allowed, ", "))
}

// EveryInterface reports whether addr (host:port) has no host or an unspecified one (0.0.0.0,
// ::): a listener on every interface.
func EveryInterface(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.IsUnspecified()
}

// LoopbackHost reports whether host (of a host:port) is "localhost" or a loopback IP. An empty
// host or an unspecified IP (0.0.0.0, ::) is every interface, not loopback.
func LoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (v *validator) hostPort(field, addr string) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		v.add(field, addr, "must be host:port such as 127.0.0.1:8080")
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		v.add(field, addr, "port must be a number from 0 to 65535")
	}
}

// postgresDSN reports whether dsn is a PostgreSQL connection string: a postgres:// URL, or
// libpq's keywords (host=… dbname=…), which SQLite would take for a file name.
func postgresDSN(dsn string) bool {
	d := strings.ToLower(strings.TrimSpace(dsn))
	if strings.HasPrefix(d, "postgres://") || strings.HasPrefix(d, "postgresql://") {
		return true
	}
	if strings.HasPrefix(d, "file:") || strings.Contains(d, "?") {
		return false
	}
	for _, kw := range strings.Fields(d) {
		if k, _, ok := strings.Cut(kw, "="); ok && (k == "host" || k == "dbname" || k == "user") {
			return true
		}
	}
	return false
}

// maxIdleMinutes bounds idle_minutes: 100 years.
const maxIdleMinutes = 100 * 365 * 24 * 60

// The bounds of keys whose absurd values were taken without a word (found by an audit).
const (
	// maxQueueCap bounds sessions.queue.cap: a session holds up to that many messages in
	// memory (some 4 KiB each: actors/spill.go measured 176 MB for 47,500), and a cap near the
	// largest int overflowed where the session reads its queue back (cap+1).
	maxQueueCap = 10_000
	// maxDebounce bounds sessions.queue.debounce and its per-platform values: a turn waits the
	// window out after its sender's last message, so an hour's window is a bot that seems dead.
	maxDebounce = 5 * time.Minute
	// maxHeld bounds http.max_held: each held request costs a connection, a file descriptor and
	// some 40 KiB (RUNBOOK), 2.5 GiB at the bound.
	maxHeld = 65_536
	// connectionRoom is how many connections http.max_connections keeps beyond http.max_held,
	// for the requests that are not held (health checks, scrapes, messages without ?wait); the
	// HTTP platform's default keeps as many (httpplatform.HeldRoom).
	connectionRoom = 64
	// minAgentTimeout is the shortest agent.exec.timeout and agent.openai.timeout.
	minAgentTimeout = time.Second
)

// logLevels are the values of log.level, in lower case (any case is taken).
var logLevels = []string{"debug", "info", "warn", "error"}

// resetFields checks the fields of a reset policy or override under path; a nil field is left
// to the default and so not checked here.
func (v *validator) resetFields(path string, o ResetOverride) {
	if o.Mode != nil {
		v.oneOf(path+".mode", *o.Mode, resetModes...)
	}
	if o.IdleMinutes != nil {
		atLeast(v, path+".idle_minutes", *o.IdleMinutes, 1)
		if *o.IdleMinutes > maxIdleMinutes {
			// Past 292 years a time.Duration of it overflows to a time in the past: every
			// session was reset after every message (found by an audit).
			v.add(path+".idle_minutes", *o.IdleMinutes, fmt.Sprintf("must be at most %d (100 years); for no idle reset, set mode: none or daily", maxIdleMinutes))
		}
	}
	if o.AtHour != nil && (*o.AtHour < 0 || *o.AtHour > 23) {
		v.add(path+".at_hour", *o.AtHour, "must be from 0 to 23")
	}
	if o.DailyMinIdle != nil && (*o.DailyMinIdle < 0 || *o.DailyMinIdle >= 24*time.Hour) {
		v.add(path+".daily_min_idle", *o.DailyMinIdle, "must be from 0s to less than 24h")
	}
}

var platformNameRE = regexp.MustCompile(`^[a-z][a-z0-9_-]*$`)

// platformName checks a platform name as platforms report it: lower case, so that "Discord"
// is caught rather than never matching. value is what the message shows (nil when field
// already holds the name).
func (v *validator) platformName(field, name string, value any) {
	if !platformNameRE.MatchString(name) {
		v.add(field, value, "must be a platform name such as discord or http ([a-z][a-z0-9_-]*)")
	}
}

var snowflakeRE = regexp.MustCompile(`^[0-9]{1,20}$`)

// snowflake checks a Discord id: a decimal number, given as a string.
func (v *validator) snowflake(field, id string) {
	if !snowflakeRE.MatchString(id) {
		v.add(field, id, "must be a Discord id (a number such as 123456789012345678, quoted)")
	}
}

var (
	envNameRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	shellRefRE = regexp.MustCompile(`^\$([A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})$`)
)

// envName checks that a *_env key names a variable. Its value is left out of the message
// because the likely mistake is pasting the secret itself.
func (v *validator) envName(field, name string) {
	switch {
	case name == "" || envNameRE.MatchString(name):
	case shellRefRE.MatchString(name):
		// The name as a shell reads the variable: told so, not told it is the secret.
		v.add(field, nil, "must be the name of an environment variable, without the shell's $ (NAME, not $NAME or ${NAME})")
	default:
		v.add(field, nil, "must be the name of an environment variable ([A-Za-z_][A-Za-z0-9_]*), not the secret")
	}
}

// atMost checks got <= highest; why says what the bound spares, after it in the message.
func atMost[T int | time.Duration](v *validator, field string, got, highest T, why string) {
	if got <= highest {
		return
	}
	bound := fmt.Sprint(highest)
	if d, ok := any(highest).(time.Duration); ok {
		bound = ShortDuration(d)
	}
	v.add(field, got, "must be at most "+bound+" ("+why+")")
}

// atLeast checks got >= lowest. For a duration, lowest is compared in nanoseconds, so 1 means
// "positive".
func atLeast[T int | time.Duration](v *validator, field string, got, lowest T) {
	if got >= lowest {
		return
	}
	_, isDuration := any(got).(time.Duration)
	var reason string
	switch {
	case lowest == 0:
		reason = "must not be negative"
	case lowest == 1 && isDuration:
		reason = "must be positive"
	case isDuration:
		reason = "must be at least " + ShortDuration(time.Duration(lowest))
	default:
		reason = fmt.Sprintf("must be at least %d", lowest)
	}
	v.add(field, got, reason)
}
