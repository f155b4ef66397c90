package config

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.yaml.in/yaml/v3"
)

// MustWriteConfig writes content to a config file in a temp dir and returns its path.
func MustWriteConfig(t testing.TB, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agentgate.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// problems flattens a joined error into its parts.
func problems(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, problems(e)...)
		}
		return out
	}
	return []error{err}
}

// fields returns the Field of every problem, or "!" + the message of one that is not a
// *FieldError.
func fields(err error) []string {
	var out []string
	for _, p := range problems(err) {
		var fe *FieldError
		if errors.As(p, &fe) {
			out = append(out, fe.Field)
		} else {
			out = append(out, "!"+p.Error())
		}
	}
	return out
}

func TestDefault(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Errorf("Default().Validate() = %v, want nil", err)
	}
	got, err := Load("", nil, nil)
	if err != nil {
		t.Fatalf("Load(\"\", nil, nil) error = %v, want nil", err)
	}
	if diff := cmp.Diff(Default(), got); diff != "" {
		t.Errorf("Load with no sources differs from Default() (-want +got):\n%s", diff)
	}
	a, b := Default(), Default()
	a.Agent.Exec.Command = append(a.Agent.Exec.Command, "x")
	if len(b.Agent.Exec.Command) != 0 {
		t.Errorf("Default() values share the exec command slice")
	}
}

func TestExample(t *testing.T) {
	t.Run("decodes to Default", func(t *testing.T) {
		dec := yaml.NewDecoder(strings.NewReader(Example()))
		dec.KnownFields(true)
		var got Config
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("decode Example() error = %v, want nil", err)
		}
		if diff := cmp.Diff(Default(), &got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("Example() differs from Default() (-want +got):\n%s", diff)
		}
	})
	t.Run("shows every key", func(t *testing.T) {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(Example()), &doc); err != nil {
			t.Fatal(err)
		}
		var got []string
		var walk func(n *yaml.Node, path string)
		walk = func(n *yaml.Node, path string) {
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := joinPath(path, n.Content[i].Value)
				// An empty mapping is the value of a map key ({}), not a section.
				if v := n.Content[i+1]; v.Kind == yaml.MappingNode && len(v.Content) > 0 {
					walk(v, p)
				} else {
					got = append(got, p)
				}
			}
		}
		walk(doc.Content[0], "")
		var want []string
		for _, l := range leaves() {
			want = append(want, l.path)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Example() keys differ from Config's, in order (-want +got):\n%s", diff)
		}
	})
}

func TestLoadFile(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want func(*Config)
	}{
		{"empty", "", func(*Config) {}},
		{"comments only", "# nothing here\n", func(*Config) {}},
		{"null section keeps defaults", "log:\nsessions:\n", func(*Config) {}},
		{
			name: "block style",
			yaml: "data_dir: /var/lib/agentgate\nlog:\n  level: debug\nsessions:\n  passivate_after: 90s\n  queue:\n    cap: 5\n",
			want: func(c *Config) {
				c.DataDir = "/var/lib/agentgate"
				c.Log.Level = "debug"
				c.Sessions.PassivateAfter = 90 * time.Second
				c.Sessions.Queue.Cap = 5
			},
		},
		{
			name: "flow style keeps unset siblings",
			yaml: "sessions:\n  reset: {mode: daily, at_hour: 6}\nagent:\n  backend: exec\n  exec: {command: [sh, -c, \"echo hi\"]}\n",
			want: func(c *Config) {
				c.Sessions.Reset.Mode = "daily"
				c.Sessions.Reset.AtHour = 6
				c.Agent.Backend = "exec"
				c.Agent.Exec.Command = []string{"sh", "-c", "echo hi"}
			},
		},
		{
			name: "exec steer",
			yaml: "agent:\n  backend: exec\n  exec:\n    command: [my-agent]\n    steer: true\n",
			want: func(c *Config) {
				c.Agent.Backend = "exec"
				c.Agent.Exec.Command = []string{"my-agent"}
				c.Agent.Exec.Steer = true
			},
		},
		{
			name: "reset overrides keep unset fields nil",
			yaml: "sessions:\n  reset_by_platform:\n    discord: {mode: idle, idle_minutes: 90}\n    http:\n  reset_by_type:\n    dm: {notify: false, at_hour: ~}\n",
			want: func(c *Config) {
				c.Sessions.ResetByPlatform = map[string]ResetOverride{
					"discord": {Mode: new("idle"), IdleMinutes: new(90)},
					"http":    {},
				}
				c.Sessions.ResetByType = map[string]ResetOverride{"dm": {Notify: new(false)}}
			},
		},
		{
			name: "reset timezone, quiet platforms, check_every and prune",
			yaml: "sessions:\n  reset: {mode: daily, timezone: Europe/Berlin, quiet_platforms: [discord], check_every: 10s}\n  prune: {enabled: true, retention: 720h}\n",
			want: func(c *Config) {
				c.Sessions.Reset.Mode = "daily"
				c.Sessions.Reset.Timezone = "Europe/Berlin"
				c.Sessions.Reset.QuietPlatforms = []string{"discord"}
				c.Sessions.Reset.CheckEvery = 10 * time.Second
				c.Sessions.Prune = Prune{Enabled: true, Retention: 720 * time.Hour, Interval: 24 * time.Hour}
			},
		},
		{
			name: "postgres",
			yaml: "store: {driver: postgres, dsn: \"postgres://db/agentgate\"}\n",
			want: func(c *Config) {
				c.Store.Driver = "postgres"
				c.Store.DSN = "postgres://db/agentgate"
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Load(MustWriteConfig(t, tt.yaml), nil, nil)
			if err != nil {
				t.Fatalf("Load(%q) error = %v, want nil", tt.yaml, err)
			}
			want := Default()
			tt.want(want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Load(%q) mismatch (-want +got):\n%s", tt.yaml, diff)
			}
		})
	}
}

func TestLoadFileErrors(t *testing.T) {
	tests := []struct {
		name       string
		yaml       string
		wantFields []string // "!" marks a problem that is not a *FieldError
		wantText   []string // substrings of the whole message
	}{
		{
			name:       "unknown top-level key",
			yaml:       "data_dir: x\nlisten: :80\n",
			wantFields: []string{"listen"},
			wantText:   []string{`agentgate.yaml:2: listen: unknown key`},
		},
		{
			name:       "unknown nested key",
			yaml:       "sessions:\n  queue:\n    mode: collect\n    size: 3\n",
			wantFields: []string{"sessions.queue.size"},
			wantText:   []string{`agentgate.yaml:4: sessions.queue.size: unknown key`},
		},
		{
			name:       "wrong types",
			yaml:       "sessions:\n  queue: {cap: lots, debounce: 5}\nplatforms:\n  discord: {enabled: maybe}\nlog: debug\n",
			wantFields: []string{"sessions.queue.cap", "sessions.queue.debounce", "platforms.discord.enabled", "log"},
			wantText: []string{
				`agentgate.yaml:2: sessions.queue.cap: "lots": must be an integer`,
				`agentgate.yaml:2: sessions.queue.debounce: "5": must be a duration`,
				`agentgate.yaml:4: platforms.discord.enabled: "maybe": must be true or false`,
				`agentgate.yaml:5: log: must be a mapping`,
			},
		},
		{
			name:       "a fraction where an integer goes", // yaml.v3 alone would read 1.5 as 1
			yaml:       "sessions:\n  queue:\n    cap: 1.5\n  reset_by_type:\n    dm: {at_hour: 4.5}\n",
			wantFields: []string{"sessions.queue.cap", "sessions.reset_by_type.dm.at_hour"},
			wantText: []string{
				`agentgate.yaml:3: sessions.queue.cap: "1.5": must be an integer`,
				`agentgate.yaml:5: sessions.reset_by_type.dm.at_hour: "4.5": must be an integer`,
			},
		},
		{
			// Found by an audit: each named Go's type, wrapped around, or went to the wrong store.
			name: "a map of durations, a never-ending idle reset, a PostgreSQL DSN on SQLite",
			yaml: "sessions:\n  queue:\n    debounce_by_platform: [discord]\n  reset:\n    idle_minutes: 9999999999\n" +
				"  reset_by_type:\n    dm: {idle_minutes: 153722868}\nstore:\n  dsn: postgres://u:pw@127.0.0.1/db\n",
			wantFields: []string{"sessions.queue.debounce_by_platform", "sessions.reset.idle_minutes",
				"sessions.reset_by_type.dm.idle_minutes", "store.dsn"},
			wantText: []string{
				`agentgate.yaml:3: sessions.queue.debounce_by_platform: must be a mapping of names to values, each a duration such as 90s or 10m`,
				`agentgate.yaml:5: sessions.reset.idle_minutes: 9999999999: must be at most 52560000 (100 years)`,
				`agentgate.yaml:7: sessions.reset_by_type.dm.idle_minutes: 153722868: must be at most 52560000`,
				`agentgate.yaml:9: store.dsn: is a PostgreSQL connection string, but store.driver is sqlite: set store.driver: postgres`,
			},
		},
		{
			name:       "list expected",
			yaml:       "agent:\n  exec:\n    command: echo hi\n",
			wantFields: []string{"agent.exec.command"},
			wantText:   []string{`agentgate.yaml:3: agent.exec.command: "echo hi": must be a list of strings`},
		},
		{
			name:       "decode and validation problems together",
			yaml:       "log: {level: loud, colour: true}\n",
			wantFields: []string{"log.colour", "log.level"},
			wantText:   []string{"log.colour: unknown key", `log.level: "loud": must be one of debug, info, warn, error`},
		},
		{
			name: "reset overrides, all at once with full paths",
			yaml: "sessions:\n" +
				"  reset_by_platform:\n" +
				"    discord: {mode: weekly, mod: idle, idle_minutes: 0}\n" +
				"    http: {at_hour: noon}\n" +
				"  reset_by_type:\n" +
				"    dms: {notify: false}\n" +
				"    group: {at_hour: 25, notify: maybe}\n" +
				"    thread: {daily_min_idle: 24h}\n" +
				"  reset: {timezone: Mars/Olympus_Mons}\n",
			// In the file's order, the decoder's problems and validation's alike.
			wantFields: []string{
				"sessions.reset_by_platform.discord.mod",
				"sessions.reset_by_platform.discord.mode",
				"sessions.reset_by_platform.discord.idle_minutes",
				"sessions.reset_by_platform.http.at_hour",
				"sessions.reset_by_type.dms",
				"sessions.reset_by_type.group.notify",
				"sessions.reset_by_type.group.at_hour",
				"sessions.reset_by_type.thread.daily_min_idle",
				"sessions.reset.timezone",
			},
			wantText: []string{
				`agentgate.yaml:3: sessions.reset_by_platform.discord.mod: unknown key`,
				`agentgate.yaml:3: sessions.reset_by_platform.discord.mode: "weekly": must be one of none, idle, daily, both`,
				`agentgate.yaml:3: sessions.reset_by_platform.discord.idle_minutes: 0: must be at least 1`,
				`agentgate.yaml:4: sessions.reset_by_platform.http.at_hour: "noon": must be an integer`,
				`agentgate.yaml:6: sessions.reset_by_type.dms: unknown chat type: must be one of dm, group, channel, thread`,
				`agentgate.yaml:7: sessions.reset_by_type.group.notify: "maybe": must be true or false`,
				`agentgate.yaml:7: sessions.reset_by_type.group.at_hour: 25: must be from 0 to 23`,
				`agentgate.yaml:8: sessions.reset_by_type.thread.daily_min_idle: 24h: must be from 0s to less than 24h`,
				`agentgate.yaml:9: sessions.reset.timezone: "Mars/Olympus_Mons": must be an IANA time zone`,
			},
		},
		{
			name:       "an override value that doesn't decode is reported once",
			yaml:       "sessions:\n  reset_by_type:\n    dm: {idle_minutes: soon}\n",
			wantFields: []string{"sessions.reset_by_type.dm.idle_minutes"},
			wantText:   []string{`agentgate.yaml:3: sessions.reset_by_type.dm.idle_minutes: "soon": must be an integer`},
		},
		{
			name:       "reset override map of the wrong shape",
			yaml:       "sessions:\n  reset_by_platform: [discord]\n  reset_by_type:\n    dm: idle\n",
			wantFields: []string{"sessions.reset_by_platform", "sessions.reset_by_type.dm"},
			wantText: []string{
				`agentgate.yaml:2: sessions.reset_by_platform: must be a mapping of names to mappings with the keys mode, idle_minutes, at_hour, notify, daily_min_idle`,
				`agentgate.yaml:4: sessions.reset_by_type.dm: must be a mapping of keys`,
			},
		},
		{
			// Merged content has no key path of its own, but its line, in the file's order.
			name:       "a merged mapping's unknown key",
			yaml:       "sessions:\n  queue: &q\n    cap: 5\nlog:\n  level: loud\n  <<: *q\n",
			wantFields: []string{"!agentgate.yaml:3: field cap not found in type config.Log", "log.level"},
			wantText:   []string{"agentgate.yaml:5: log.level"},
		},
		{
			// A section's usual key is named (before, "must be a mapping of keys" alone).
			name:       "a section written as its usual key's value",
			yaml:       "sessions: 5\nhttp: 127.0.0.1:8081\nlog: debug\n",
			wantFields: []string{"sessions", "http", "log"},
			wantText: []string{
				"agentgate.yaml:1: sessions: must be a mapping of keys\n", // no usual key
				`agentgate.yaml:2: http: must be a mapping of keys (did you mean http: {addr: 127.0.0.1:8081}?)`,
				`agentgate.yaml:3: log: must be a mapping of keys (did you mean log: {level: debug}?)`,
			},
		},
		{
			name:       "not a mapping",
			yaml:       "- a\n- b\n",
			wantFields: []string{"!agentgate.yaml:1: the document must be a mapping of keys"},
		},
		{
			// At its line, as every other problem of the file (before, "parse FILE: yaml: line 1:
			// …"), and yaml.v3's words, which name no line, at the file.
			name:       "syntax error",
			yaml:       "log:\n  level: [info\n",
			wantFields: []string{"!"},
			wantText:   []string{"agentgate.yaml:1: not valid YAML: did not find expected ',' or ']'"},
		},
		{
			name:       "syntax error without a line",
			yaml:       "log: level: info\n",
			wantFields: []string{"!"},
			wantText:   []string{"agentgate.yaml: not valid YAML: mapping values are not allowed in this context"},
		},
		{
			name:       "tab indentation",
			yaml:       "http:\n\taddr: 127.0.0.1:8081\n",
			wantFields: []string{"!"},
			wantText:   []string{"agentgate.yaml:2: indented with a tab: YAML indents with spaces only"},
		},
		{
			// yaml.v3 names the line above the tab's.
			name:       "a tab among spaces",
			yaml:       "data_dir: x\nhttp:\n  addr: 127.0.0.1:8081\n\tmax_held: 3\n",
			wantFields: []string{"!"},
			wantText:   []string{"agentgate.yaml:4: indented with a tab: YAML indents with spaces only"},
		},
		{
			// Before, yaml.v3's `mapping key "addr" already defined at line 2`, which named
			// neither the key's path nor the fix.
			name:       "a key set twice",
			yaml:       "http:\n  addr: 127.0.0.1:1\n  addr: 127.0.0.1:2\nlog: {level: info, format: json, level: debug}\n",
			wantFields: []string{"http.addr", "log.level"},
			wantText: []string{
				"agentgate.yaml:3: http.addr: set twice (first at line 2): keep one",
				"agentgate.yaml:4: log.level: set twice (first at line 4): keep one",
			},
		},
		{
			// yaml.v3 decodes nothing of a mapping with a key set twice, and so finds nothing
			// else in it: the document here.
			name:       "a section set twice",
			yaml:       "log: {level: info}\nhttp: {addr: 127.0.0.1:1, addr: 127.0.0.1:2}\nlog: {format: json}\n",
			wantFields: []string{"log"},
			wantText:   []string{"agentgate.yaml:3: log: set twice (first at line 1): keep one"},
		},
		{
			name:       "a map entry set twice",
			yaml:       "sessions:\n  reset_by_type:\n    dm: {mode: idle}\n    dm: {mode: none}\n",
			wantFields: []string{"sessions.reset_by_type.dm"},
			wantText:   []string{"agentgate.yaml:4: sessions.reset_by_type.dm: set twice (first at line 3): keep one"},
		},
		{
			// Before, "must be a duration such as 90s or 10m", which did not say what was
			// wrong with 30.
			name:       "a duration without its unit",
			yaml:       "cluster:\n  member_ttl: 30\nsessions:\n  queue: {debounce: 1.5, debounce_by_platform: {discord: 600}}\n",
			wantFields: []string{"cluster.member_ttl", "sessions.queue.debounce", "sessions.queue.debounce_by_platform.discord"},
			wantText: []string{
				`agentgate.yaml:2: cluster.member_ttl: "30": must be a duration with its unit, such as 30s or 30m`,
				`agentgate.yaml:4: sessions.queue.debounce: "1.5": must be a duration with its unit, such as 1.5s or 1.5m`,
				`agentgate.yaml:4: sessions.queue.debounce_by_platform.discord: "600": must be a duration with its unit, such as 600s or 600m`,
			},
		},
		{
			name:       "negative sizes and a port out of range",
			yaml:       "http:\n  addr: 127.0.0.1:70000\n  max_held: -1\nsessions:\n  queue:\n    cap: -5\n",
			wantFields: []string{"http.addr", "http.max_held", "sessions.queue.cap"},
			wantText: []string{
				`agentgate.yaml:2: http.addr: "127.0.0.1:70000": port must be a number from 0 to 65535`,
				`agentgate.yaml:3: http.max_held: -1: must not be negative`,
				`agentgate.yaml:6: sessions.queue.cap: -5: must be at least 1`,
			},
		},
		{
			name:       "two documents",
			yaml:       "data_dir: a\n---\ndata_dir: b\n",
			wantFields: []string{"!"},
			wantText:   []string{"want one YAML document, found more"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Load(MustWriteConfig(t, tt.yaml), nil, nil)
			if err == nil {
				t.Fatalf("Load(%q) = %+v, nil; want an error", tt.yaml, cfg)
			}
			if cfg != nil {
				t.Errorf("Load(%q) returned a config with error %v, want nil config", tt.yaml, err)
			}
			got := fields(err)
			// A "!" alone matches any non-field problem; a longer one must be its suffix.
			for i, w := range tt.wantFields {
				if i < len(got) && strings.HasPrefix(w, "!") && strings.HasPrefix(got[i], "!") && strings.HasSuffix(got[i], w[1:]) {
					got[i] = w
				}
			}
			if diff := cmp.Diff(tt.wantFields, got); diff != "" {
				t.Errorf("Load(%q) problems (-want +got):\n%s\nerror:\n%v", tt.yaml, diff, err)
			}
			for _, w := range tt.wantText {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Load(%q) error =\n%v\nwant it to contain %q", tt.yaml, err, w)
				}
			}
		})
	}
}

// TestLoadValidationProblemsNameTheirLine: a value the file holds that decodes but is refused
// (an unknown queue mode, a log level, an address) is named with its line, as a value that
// does not decode is; one an environment variable set instead is not pinned on the file's line.
// Before, only the decoder's problems had a line (found by an audit).
func TestLoadValidationProblemsNameTheirLine(t *testing.T) {
	path := MustWriteConfig(t, "data_dir: x\nsessions:\n  queue:\n    mode: fast\n    cap: 0\nlog:\n  level: loud\nhttp:\n  addr: nowhere\n")
	_, err := Load(path, nil, nil)
	for _, want := range []string{
		path + `:4: sessions.queue.mode: "fast": must be one of`,
		path + `:5: sessions.queue.cap: 0: must be`,
		path + `:7: log.level: "loud": must be one of`,
		path + `:9: http.addr: "nowhere": `,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Load error =\n%v\nwant it to contain %q", err, want)
		}
	}
	// A problem reported without its value (a required key left empty) cannot be told to be
	// the file's: the file's line holds a good one here.
	_, err = Load(MustWriteConfig(t, "data_dir: x\n"), nil, func(c *Config) { c.DataDir = "" })
	if err == nil || strings.Contains(err.Error(), ":1: data_dir") {
		t.Errorf("Load error with data_dir emptied by a flag =\n%v\nwant it without the file's line", err)
	}
	_, err = Load(path, []string{"AGENTGATE_SESSIONS_QUEUE_MODE=slow"}, nil)
	if err == nil || !strings.Contains(err.Error(), `sessions.queue.mode: "slow"`) || strings.Contains(err.Error(), `:4: sessions.queue.mode`) {
		t.Errorf("Load error with the mode from the environment =\n%v\nwant it without the file's line", err)
	}
}

// TestLoadProblemsInFileOrder: every problem of a value the file holds names its line, also one
// reported without its value (a required key emptied, a URL that may hold a password), one in a
// list entry and one of a map's key, and they come in the file's order, then those the file
// cannot be blamed for: the environment's, then the flags'. Before, these had no line, and problems came in validation's order
// (found by an audit).
func TestLoadProblemsInFileOrder(t *testing.T) {
	path := MustWriteConfig(t, `data_dir: ""
agent:
  backend: exec
  exec:
    command: []
  openai:
    base_url: "ftp://u:pw@example.com/v1"
sessions:
  reset:
    quiet_platforms: [discord, Http]
  reset_by_type:
    dmz: {mode: idle}
  queue:
    debounce_by_platform: {"my.chat": 6m}
platforms:
  discord:
    allowed_users:
      - "12"
      - abc
log: {level: loud}
`)
	// Each problem's field, after ":LINE: " when it names the file's line.
	lines := func(environ []string, override func(*Config)) []string {
		_, err := Load(path, environ, override)
		var out []string
		for _, p := range problems(err) {
			var fe *FieldError
			if !errors.As(p, &fe) {
				t.Fatalf("problem %q is not a *FieldError", p)
			}
			out = append(out, strings.TrimPrefix(strings.TrimSuffix(p.Error(), fe.Error()), path)+fe.Field)
		}
		return out
	}
	want := []string{
		":1: data_dir",
		":5: agent.exec.command",
		":7: agent.openai.base_url",
		":10: sessions.reset.quiet_platforms[1]",
		":12: sessions.reset_by_type.dmz",
		`:14: sessions.queue.debounce_by_platform."my.chat"`,
		":19: platforms.discord.allowed_users[1]",
		":20: log.level",
	}
	if diff := cmp.Diff(want, lines(nil, nil)); diff != "" {
		t.Errorf("Load problems (-want +got):\n%s", diff)
	}

	// What the environment or a flag set is not the file's line's fault: it follows the file's
	// problems, without a line, the variables' first, then the flags', each in the order of the
	// keys (--print-defaults'). Before, in validation's order, flags and variables mixed.
	want = []string{
		":1: data_dir",
		":5: agent.exec.command",
		":12: sessions.reset_by_type.dmz",
		`:14: sessions.queue.debounce_by_platform."my.chat"`,
		":19: platforms.discord.allowed_users[1]",
		"AGENTGATE_SESSIONS_QUEUE_CAP",
		"sessions.reset.quiet_platforms[0]",
		"agent.openai.base_url",
		"cluster.enabled",
		"log.level",
		"http.addr",
	}
	got := lines([]string{"AGENTGATE_CLUSTER_ENABLED=true", "AGENTGATE_AGENT_OPENAI_BASE_URL=gopher://x",
		"AGENTGATE_SESSIONS_RESET_QUIET_PLATFORMS=[Http]", "AGENTGATE_SESSIONS_QUEUE_CAP=many"},
		func(c *Config) { c.HTTP.Addr, c.Log.Level = "nowhere", "trace" })
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Load problems with values from the environment and a flag (-want +got):\n%s", diff)
	}
}

// TestLoadMissingFile: one line naming the file. Before, "load config: open …" (after a
// command's "config: ") said config twice and named the file only inside the os error.
func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.yaml")
	_, err := Load(path, nil, nil)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load(%q) error = %v, want one wrapping fs.ErrNotExist", path, err)
	}
	if want := "read " + path + ": no such file or directory"; err == nil || err.Error() != want {
		t.Errorf("Load(%q) error = %v, want %q", path, err, want)
	}
}

func TestLoadEnv(t *testing.T) {
	tests := []struct {
		name    string
		environ []string
		want    func(*Config)
	}{
		{
			name:    "strings",
			environ: []string{"AGENTGATE_DATA_DIR=/srv/ag", "AGENTGATE_HTTP_ADDR=0.0.0.0:9000", "AGENTGATE_LOG_LEVEL=debug", "AGENTGATE_HTTP_TOKEN_ENV=AG_TOKEN"},
			want: func(c *Config) {
				c.DataDir = "/srv/ag"
				c.HTTP.Addr = "0.0.0.0:9000"
				c.Log.Level = "debug"
				c.HTTP.TokenEnv = "AG_TOKEN"
			},
		},
		{
			name:    "string taken verbatim",
			environ: []string{"AGENTGATE_AGENT_OPENAI_SYSTEM_PROMPT=be brief: # no yaml here", "AGENTGATE_STORE_DSN=[not, a, list]"},
			want: func(c *Config) {
				c.Agent.OpenAI.SystemPrompt = "be brief: # no yaml here"
				c.Store.DSN = "[not, a, list]"
			},
		},
		{
			name:    "nested enum",
			environ: []string{"AGENTGATE_SESSIONS_QUEUE_MODE=collect"},
			want:    func(c *Config) { c.Sessions.Queue.Mode = "collect" },
		},
		{
			name:    "durations",
			environ: []string{"AGENTGATE_SESSIONS_PASSIVATE_AFTER=1h30m", "AGENTGATE_SESSIONS_QUEUE_DEBOUNCE=250ms"},
			want: func(c *Config) {
				c.Sessions.PassivateAfter = 90 * time.Minute
				c.Sessions.Queue.Debounce = 250 * time.Millisecond
			},
		},
		{
			name:    "bools and ints",
			environ: []string{"AGENTGATE_PLATFORMS_DISCORD_ENABLED=true", "AGENTGATE_SESSIONS_GROUP_SESSIONS_PER_USER=false", "AGENTGATE_PERSISTENCE_MAX_BATCH=64"},
			want: func(c *Config) {
				c.Platforms.Discord.Enabled = true
				c.Sessions.GroupSessionsPerUser = false
				c.Persist.MaxBatch = 64
			},
		},
		{
			name:    "list",
			environ: []string{"AGENTGATE_AGENT_BACKEND=exec", `AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c, "echo hi"]`},
			want: func(c *Config) {
				c.Agent.Backend = "exec"
				c.Agent.Exec.Command = []string{"sh", "-c", "echo hi"}
			},
		},
		{
			name:    "exec steer",
			environ: []string{"AGENTGATE_AGENT_EXEC_STEER=true"},
			want:    func(c *Config) { c.Agent.Exec.Steer = true },
		},
		{
			name:    "exec history_bytes",
			environ: []string{"AGENTGATE_AGENT_EXEC_HISTORY_BYTES=0"},
			want:    func(c *Config) { c.Agent.Exec.HistoryBytes = 0 },
		},
		{
			name: "openai options",
			environ: []string{"AGENTGATE_AGENT_OPENAI_TEMPERATURE=0.7", "AGENTGATE_AGENT_OPENAI_MAX_TOKENS=512",
				"AGENTGATE_AGENT_OPENAI_TOKEN_BUDGET=0", "AGENTGATE_AGENT_OPENAI_MAX_BACKOFF=5s"},
			want: func(c *Config) {
				c.Agent.OpenAI.Temperature = new(0.7)
				c.Agent.OpenAI.MaxTokens, c.Agent.OpenAI.TokenBudget, c.Agent.OpenAI.MaxBackoff = 512, 0, 5*time.Second
			},
		},
		{
			name:    "openai temperature null",
			environ: []string{"AGENTGATE_AGENT_OPENAI_TEMPERATURE=null"},
			want:    func(c *Config) {},
		},
		{
			name:    "reset check_every",
			environ: []string{"AGENTGATE_SESSIONS_RESET_CHECK_EVERY=15s"},
			want:    func(c *Config) { c.Sessions.Reset.CheckEvery = 15 * time.Second },
		},
		{
			name: "reset timezone, quiet platforms and prune",
			environ: []string{"AGENTGATE_SESSIONS_RESET_TIMEZONE=America/New_York", "AGENTGATE_SESSIONS_RESET_QUIET_PLATFORMS=[discord, http]",
				"AGENTGATE_SESSIONS_PRUNE_ENABLED=true", "AGENTGATE_SESSIONS_PRUNE_RETENTION=48h", "AGENTGATE_SESSIONS_PRUNE_INTERVAL=1h"},
			want: func(c *Config) {
				c.Sessions.Reset.Timezone = "America/New_York"
				c.Sessions.Reset.QuietPlatforms = []string{"discord", "http"}
				c.Sessions.Prune = Prune{Enabled: true, Retention: 48 * time.Hour, Interval: time.Hour}
			},
		},
		{
			name:    "reset override maps are set whole",
			environ: []string{"AGENTGATE_SESSIONS_RESET_BY_PLATFORM={discord: {mode: idle, idle_minutes: 30}}", "AGENTGATE_SESSIONS_RESET_BY_TYPE={thread: {notify: false}}"},
			want: func(c *Config) {
				c.Sessions.ResetByPlatform = map[string]ResetOverride{"discord": {Mode: new("idle"), IdleMinutes: new(30)}}
				c.Sessions.ResetByType = map[string]ResetOverride{"thread": {Notify: new(false)}}
			},
		},
		{
			name:    "null empties a map",
			environ: []string{"AGENTGATE_SESSIONS_RESET_BY_PLATFORM=~"},
			want:    func(*Config) {},
		},
		{
			name:    "unknown AGENTGATE variables are ignored",
			environ: []string{"AGENTGATE_SESSION_KEY=agent:main:http:dm:u1", "AGENTGATE_PLATFORM=http", "AGENTGATE_NONSENSE=1", "HOME=/root", "agentgate_data_dir=/lower"},
			want:    func(*Config) {},
		},
		{
			// As most Unix tools read one: an env file or a template that leaves a value out
			// does not empty the key (before, each of these was an error, or emptied it).
			name: "empty variables are unset",
			environ: []string{"AGENTGATE_LOG_LEVEL=", "AGENTGATE_SESSIONS_QUEUE_CAP=", "AGENTGATE_DATA_DIR=",
				"AGENTGATE_AGENT_EXEC_COMMAND=", "AGENTGATE_PLATFORMS_DISCORD_ENABLED="},
			want: func(*Config) {},
		},
		{
			// The exception: "" is the value that sends no API key (a local server), and an
			// environment could not say it (before, the default OPENAI_API_KEY stayed).
			name:    "an empty api_key_env sends no key",
			environ: []string{"AGENTGATE_AGENT_OPENAI_API_KEY_ENV="},
			want:    func(c *Config) { c.Agent.OpenAI.APIKeyEnv = "" },
		},
		{
			name:    "the last of repeats wins, also when empty",
			environ: []string{"AGENTGATE_DATA_DIR=/one", "AGENTGATE_DATA_DIR="},
			want:    func(*Config) {},
		},
		{
			name:    "log level in any case",
			environ: []string{"AGENTGATE_LOG_LEVEL=Debug"},
			want:    func(c *Config) { c.Log.Level = "Debug" },
		},
		{
			name:    "last repeat wins",
			environ: []string{"AGENTGATE_DATA_DIR=/one", "AGENTGATE_DATA_DIR=/two"},
			want:    func(c *Config) { c.DataDir = "/two" },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Load("", tt.environ, nil)
			if err != nil {
				t.Fatalf("Load(env %q) error = %v, want nil", tt.environ, err)
			}
			want := Default()
			tt.want(want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Load(env %q) mismatch (-want +got):\n%s", tt.environ, diff)
			}
		})
	}
}

func TestLoadEnvOverridesFile(t *testing.T) {
	path := MustWriteConfig(t, "log: {level: warn, format: json}\n")
	got, err := Load(path, []string{"AGENTGATE_LOG_LEVEL=error"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Log{Level: "error", Format: "json"}); got.Log != want {
		t.Errorf("Load log = %+v, want %+v", got.Log, want)
	}
	// An empty variable is unset: the file's value stays.
	got, err = Load(path, []string{"AGENTGATE_LOG_LEVEL=", "AGENTGATE_LOG_FORMAT="}, nil)
	if err != nil {
		t.Fatalf("Load with empty variables: %v", err)
	}
	if want := (Log{Level: "warn", Format: "json"}); got.Log != want {
		t.Errorf("Load log with empty variables = %+v, want the file's %+v", got.Log, want)
	}
}

// TestLoadEnvEmptiesAPIKeyEnv: AGENTGATE_AGENT_OPENAI_API_KEY_ENV= empties the file's
// api_key_env too, and the daemon then neither needs nor hides a key variable.
func TestLoadEnvEmptiesAPIKeyEnv(t *testing.T) {
	path := MustWriteConfig(t, "agent:\n  backend: openai\n  openai: {base_url: http://127.0.0.1:8000/v1, model: m, api_key_env: MY_KEY}\n")
	got, err := Load(path, []string{"AGENTGATE_AGENT_OPENAI_API_KEY_ENV="}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if k := got.Agent.OpenAI.APIKeyEnv; k != "" {
		t.Errorf("api_key_env = %q with AGENTGATE_AGENT_OPENAI_API_KEY_ENV set empty, want \"\" (no key)", k)
	}
	if s := got.SecretEnv(); len(s) != 0 {
		t.Errorf("SecretEnv = %q, want none", s)
	}
}

func TestLoadEnvErrors(t *testing.T) {
	tests := []struct {
		name    string
		environ []string
		want    []string // error substrings, in order
	}{
		{"duration", []string{"AGENTGATE_SESSIONS_PASSIVATE_AFTER=10"}, []string{`AGENTGATE_SESSIONS_PASSIVATE_AFTER: "10": must be a duration with its unit, such as 10s or 10m`}},
		{"duration word", []string{"AGENTGATE_SESSIONS_PASSIVATE_AFTER=soon"}, []string{`AGENTGATE_SESSIONS_PASSIVATE_AFTER: "soon": must be a duration such as 90s or 10m`}},
		// Go's durations have no d: before, "must be a duration such as 90s or 10m" of 90d,
		// which did not say what was wrong with it (found by a new operator's walkthrough).
		{"duration in days", []string{"AGENTGATE_SESSIONS_PRUNE_RETENTION=90d"}, []string{`AGENTGATE_SESSIONS_PRUNE_RETENTION: "90d": must be a duration in h, m or s, which has no d: 2160h for 90d`}},
		// A list's example is the value as a list: before, every list was shown the exec
		// agent's [sh, -c, "echo hi"], also allowed_users.
		{"one id for a list", []string{"AGENTGATE_PLATFORMS_DISCORD_ALLOWED_USERS=123456789012345678"}, []string{`AGENTGATE_PLATFORMS_DISCORD_ALLOWED_USERS: "123456789012345678": must be a list of strings such as [123456789012345678]`}},
		{"a command line for a list", []string{"AGENTGATE_AGENT_EXEC_COMMAND=/usr/local/bin/my-agent --fast"}, []string{`AGENTGATE_AGENT_EXEC_COMMAND: "/usr/local/bin/my-agent --fast": must be a list of strings such as [/usr/local/bin/my-agent, --fast]`}},
		{"a shell line for a list", []string{`AGENTGATE_AGENT_EXEC_COMMAND=my-agent | tee "log"`}, []string{`AGENTGATE_AGENT_EXEC_COMMAND: "my-agent | tee \"log\"": must be a list of strings such as [sh, -c, "echo hi"]`}},
		// A count written as a duration: before, only "must be an integer" (found by a new
		// operator's walkthrough, idle_minutes: 30m).
		{"duration for minutes", []string{"AGENTGATE_SESSIONS_RESET_IDLE_MINUTES=30m"}, []string{`AGENTGATE_SESSIONS_RESET_IDLE_MINUTES: "30m": must be an integer, not a duration: the key's name says its unit (idle_minutes: 30)`}},
		{"bool", []string{"AGENTGATE_PLATFORMS_DISCORD_ENABLED=sure"}, []string{`AGENTGATE_PLATFORMS_DISCORD_ENABLED: "sure": must be true or false`}},
		{"int", []string{"AGENTGATE_SESSIONS_QUEUE_CAP=5x"}, []string{`AGENTGATE_SESSIONS_QUEUE_CAP: "5x": must be an integer`}},
		{"fraction for an int", []string{"AGENTGATE_SESSIONS_QUEUE_CAP=2.7"}, []string{`AGENTGATE_SESSIONS_QUEUE_CAP: "2.7": must be an integer`}},
		{"fraction in a map", []string{"AGENTGATE_SESSIONS_RESET_BY_TYPE={dm: {at_hour: 4.5}}"}, []string{`AGENTGATE_SESSIONS_RESET_BY_TYPE: "{dm: {at_hour: 4.5}}": dm.at_hour: "4.5": must be an integer`}},
		{"null int", []string{"AGENTGATE_SESSIONS_QUEUE_CAP=~"}, []string{`AGENTGATE_SESSIONS_QUEUE_CAP: "~": must be an integer`}},
		// The syntax error, not "must be a list" of what is one (found by an audit).
		{"unclosed list", []string{"AGENTGATE_AGENT_EXEC_COMMAND=[sh, -c"}, []string{`AGENTGATE_AGENT_EXEC_COMMAND: "[sh, -c": is not valid YAML: did not find expected ',' or ']'`}},
		{"unclosed mapping", []string{"AGENTGATE_SESSIONS_RESET_BY_TYPE={dm: {mode: idle}"},
			[]string{`AGENTGATE_SESSIONS_RESET_BY_TYPE: "{dm: {mode: idle}": is not valid YAML: did not find expected ',' or '}'`}},
		{"unclosed mapping of durations", []string{"AGENTGATE_SESSIONS_QUEUE_DEBOUNCE_BY_PLATFORM={discord: 600ms"},
			[]string{`AGENTGATE_SESSIONS_QUEUE_DEBOUNCE_BY_PLATFORM: "{discord: 600ms": is not valid YAML: did not find expected ',' or '}'`}},
		{"a mapping for an integer is still not one", []string{"AGENTGATE_SESSIONS_QUEUE_CAP={"}, []string{`AGENTGATE_SESSIONS_QUEUE_CAP: "{": must be an integer`}},
		{"mapping for list", []string{"AGENTGATE_AGENT_EXEC_COMMAND={a: b}"}, []string{`AGENTGATE_AGENT_EXEC_COMMAND: "{a: b}": must be a list`}},
		// Reported once, under the variable: the key it did not set is not "required" too
		// (found by an audit).
		{"string for a required list", []string{"AGENTGATE_AGENT_BACKEND=exec", "AGENTGATE_AGENT_EXEC_COMMAND=/bin/cat"},
			[]string{`AGENTGATE_AGENT_EXEC_COMMAND: "/bin/cat": must be a list`}},
		{"check_every not a duration", []string{"AGENTGATE_SESSIONS_RESET_CHECK_EVERY=60"}, []string{`AGENTGATE_SESSIONS_RESET_CHECK_EVERY: "60": must be a duration`}},
		{"check_every too short", []string{"AGENTGATE_SESSIONS_RESET_CHECK_EVERY=500ms"}, []string{`sessions.reset.check_every: 500ms: must be at least 1s`}},
		{"list for map", []string{"AGENTGATE_SESSIONS_RESET_BY_TYPE=[dm]"}, []string{`AGENTGATE_SESSIONS_RESET_BY_TYPE: "[dm]": must be a mapping of names to mappings with the keys mode, idle_minutes, at_hour, notify, daily_min_idle`}},
		{"unknown key in a map", []string{"AGENTGATE_SESSIONS_RESET_BY_TYPE={dm: {idle: 5}}"}, []string{`AGENTGATE_SESSIONS_RESET_BY_TYPE: "{dm: {idle: 5}}": dm.idle: unknown key`}},
		{"bad values in a map", []string{"AGENTGATE_SESSIONS_RESET_BY_PLATFORM={discord: {at_hour: x, notify: 1}}"}, []string{
			`AGENTGATE_SESSIONS_RESET_BY_PLATFORM: "{discord: {at_hour: x, notify: 1}}": discord.at_hour: "x": must be an integer; discord.notify: "1": must be true or false`,
		}},
		{"map validated like the file", []string{"AGENTGATE_SESSIONS_RESET_BY_TYPE={dm: {mode: often}, chat: {}}"}, []string{
			`sessions.reset_by_type.chat: unknown chat type`, `sessions.reset_by_type.dm.mode: "often": must be one of`,
		}},
		{
			name:    "all at once with validation",
			environ: []string{"AGENTGATE_SESSIONS_QUEUE_CAP=no", "AGENTGATE_LOG_FORMAT=xml", "AGENTGATE_SHUTDOWN_DRAIN_TIMEOUT=soon"},
			// In the order of the keys (before, the variables' own first, then validation's).
			want: []string{"log.format", "AGENTGATE_SESSIONS_QUEUE_CAP", "AGENTGATE_SHUTDOWN_DRAIN_TIMEOUT"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Load("", tt.environ, nil)
			if err == nil {
				t.Fatalf("Load(env %q) = %+v, nil; want an error", tt.environ, cfg)
			}
			ps := problems(err)
			if len(ps) != len(tt.want) {
				t.Fatalf("Load(env %q) gave %d problems, want %d:\n%v", tt.environ, len(ps), len(tt.want), err)
			}
			for i, p := range ps {
				var fe *FieldError
				if !errors.As(p, &fe) {
					t.Errorf("problem %d = %v (%T), want a *FieldError", i, p, p)
				}
				if !strings.Contains(p.Error(), tt.want[i]) {
					t.Errorf("problem %d = %q, want it to contain %q", i, p, tt.want[i])
				}
			}
		})
	}
}

func TestLoadOverride(t *testing.T) {
	path := MustWriteConfig(t, "http: {addr: \"127.0.0.1:1\"}\ndata_dir: /file\n")
	environ := []string{"AGENTGATE_HTTP_ADDR=127.0.0.1:2", "AGENTGATE_DATA_DIR=/env"}
	got, err := Load(path, environ, func(c *Config) { c.HTTP.Addr = "127.0.0.1:0" })
	if err != nil {
		t.Fatal(err)
	}
	if got.HTTP.Addr != "127.0.0.1:0" {
		t.Errorf("http.addr = %q, want the override's %q", got.HTTP.Addr, "127.0.0.1:0")
	}
	if got.DataDir != "/env" {
		t.Errorf("data_dir = %q, want the environment's %q", got.DataDir, "/env")
	}

	// The override is validated like everything else.
	_, err = Load("", nil, func(c *Config) { c.HTTP.Addr = "nope" })
	if diff := cmp.Diff([]string{"http.addr"}, fields(err)); diff != "" {
		t.Errorf("Load with a bad override: problems (-want +got):\n%s", diff)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   []string // fields, in the order Validate reports them
	}{
		{"defaults", func(*Config) {}, nil},
		{"port zero", func(c *Config) { c.HTTP.Addr = "127.0.0.1:0" }, nil},
		{"all interfaces with a token", func(c *Config) { c.HTTP.Addr = ":8080"; c.HTTP.TokenEnv = "AGENTGATE_TOKEN" }, nil},
		{"all interfaces without a token", func(c *Config) { c.HTTP.Addr = ":8080" }, []string{"http.addr"}},
		{"a host's address without a token", func(c *Config) { c.HTTP.Addr = "10.0.0.5:8080" }, []string{"http.addr"}},
		{"localhost without a token", func(c *Config) { c.HTTP.Addr = "localhost:8080" }, nil},
		{"IPv6 loopback without a token", func(c *Config) { c.HTTP.Addr = "[::1]:8080" }, nil},
		{"exec with command", func(c *Config) { c.Agent.Backend = "exec"; c.Agent.Exec.Command = []string{"agent"} }, nil},
		{"openai complete", func(c *Config) {
			c.Agent.Backend = "openai"
			c.Agent.OpenAI.BaseURL = "http://localhost:11434/v1"
			c.Agent.OpenAI.Model = "llama3"
			c.Agent.OpenAI.APIKeyEnv = ""
		}, nil},
		{"discord enabled", func(c *Config) { c.Platforms.Discord.Enabled = true }, nil},
		{"empty data dir", func(c *Config) { c.DataDir = "" }, []string{"data_dir"}},
		{"log", func(c *Config) { c.Log = Log{Level: "trace", Format: "xml"} }, []string{"log.level", "log.format"}},
		{"log level in any case", func(c *Config) { c.Log.Level = "INFO" }, nil},
		{"log level mixed case", func(c *Config) { c.Log.Level = "Warn" }, nil},
		{"bounds met", func(c *Config) {
			c.HTTP.MaxHeld, c.Sessions.Queue.Cap, c.Sessions.Queue.Debounce = 65536, 10000, 5*time.Minute
			c.Sessions.Queue.DebounceByPlatform = map[string]time.Duration{"discord": 5 * time.Minute}
			c.Agent.Exec.Timeout, c.Agent.OpenAI.Timeout = time.Second, time.Second
		}, nil},
		{"bounds passed", func(c *Config) {
			c.HTTP.MaxHeld, c.Sessions.Queue.Cap, c.Sessions.Queue.Debounce = 65537, 10001, 5*time.Minute+time.Millisecond
			c.Sessions.Queue.DebounceByPlatform = map[string]time.Duration{"discord": time.Hour, "http": time.Second}
			c.Agent.Exec.Timeout, c.Agent.OpenAI.Timeout = time.Nanosecond, 999*time.Millisecond
		}, []string{
			"http.max_held", "sessions.queue.cap", "sessions.queue.debounce", "sessions.queue.debounce_by_platform.discord",
			"agent.exec.timeout", "agent.openai.timeout",
		}},
		{"max_connections leaves room beyond max_held", func(c *Config) { c.HTTP.MaxHeld, c.HTTP.MaxConnections = 100, 164 }, nil},
		{"max_connections leaves room beyond the default max_held", func(c *Config) { c.HTTP.MaxHeld, c.HTTP.MaxConnections = 0, 1088 }, nil},
		{"max_connections left to its default, max_held raised", func(c *Config) { c.HTTP.MaxHeld, c.HTTP.MaxConnections = 65536, 0 }, nil},
		{"max_connections held requests could fill", func(c *Config) { c.HTTP.MaxHeld, c.HTTP.MaxConnections = 100, 163 }, []string{"http.max_connections"}},
		{"max_connections negative", func(c *Config) { c.HTTP.MaxConnections = -1 }, []string{"http.max_connections"}},
		{"addr without port", func(c *Config) { c.HTTP.Addr = "localhost" }, []string{"http.addr"}},
		{"addr bad port", func(c *Config) { c.HTTP.Addr = "localhost:99999" }, []string{"http.addr"}},
		{"token_env holds a secret", func(c *Config) { c.HTTP.TokenEnv = "abc.def-ghi" }, []string{"http.token_env"}},
		{"postgres without dsn", func(c *Config) { c.Store.Driver = "postgres" }, []string{"store.dsn"}},
		{"store", func(c *Config) { c.Store.Driver = "mysql"; c.Store.Synchronous = "off" }, []string{"store.driver", "store.synchronous"}},
		{"cluster", func(c *Config) {
			c.Store.Driver, c.Store.DSN = "postgres", "postgres://db/agentgate"
			c.Cluster = Cluster{Enabled: true, Name: "agentgate", Bind: "10.0.0.5:6340", Advertise: "gw-1.internal:6340",
				MemberTTL: 6 * time.Second, TLS: ClusterTLS{CertFile: "m.pem", KeyFile: "m-key.pem", CAFile: "ca.pem"}}
		}, nil},
		{"cluster disabled is not checked", func(c *Config) { c.Cluster = Cluster{Bind: "nowhere"} }, nil},
		{"cluster on every interface, advertised", func(c *Config) {
			c.Store.Driver, c.Store.DSN = "postgres", "postgres://db/agentgate"
			c.Cluster = Cluster{Enabled: true, Name: "agentgate", Bind: "0.0.0.0:6340", Advertise: "10.0.0.5:6340", MemberTTL: 6 * time.Second}
		}, nil},
		{"cluster on every interface, not advertised", func(c *Config) {
			c.Store.Driver, c.Store.DSN = "postgres", "postgres://db/agentgate"
			c.Cluster = Cluster{Enabled: true, Name: "agentgate", Bind: "[::]:6340", MemberTTL: 6 * time.Second}
		}, []string{"cluster.bind"}},
		{"cluster without a host, advertising every interface", func(c *Config) {
			c.Store.Driver, c.Store.DSN = "postgres", "postgres://db/agentgate"
			c.Cluster = Cluster{Enabled: true, Name: "agentgate", Bind: ":6340", Advertise: "0.0.0.0:6340", MemberTTL: 6 * time.Second}
		}, []string{"cluster.advertise"}},
		{"cluster bad", func(c *Config) {
			c.Cluster = Cluster{Enabled: true, Bind: "10.0.0.5", Advertise: "gw:x", MemberTTL: 500 * time.Millisecond,
				TLS: ClusterTLS{CertFile: "m.pem"}}
		}, []string{"cluster.enabled", "cluster.name", "cluster.bind", "cluster.advertise", "cluster.member_ttl", "cluster.tls"}},
		{"sessions", func(c *Config) {
			c.Sessions = Sessions{
				PassivateAfter: -time.Second,
				Queue:          Queue{Mode: "fast", Cap: 0, Overflow: "drop", Debounce: -1},
				Reset:          Reset{Mode: "weekly", IdleMinutes: 0, AtHour: 24},
				Recovery:       "ignore",
				HistoryLimit:   -1,
			}
		}, []string{
			"sessions.passivate_after", "sessions.queue.mode", "sessions.queue.cap", "sessions.queue.overflow",
			"sessions.queue.debounce", "sessions.reset.mode", "sessions.reset.idle_minutes", "sessions.reset.at_hour",
			"sessions.reset.check_every", "sessions.recovery", "sessions.history_limit",
		}},
		{"at_hour negative", func(c *Config) { c.Sessions.Reset.AtHour = -1 }, []string{"sessions.reset.at_hour"}},
		{"timezone UTC", func(c *Config) { c.Sessions.Reset.Timezone = "UTC" }, nil},
		{"timezone name", func(c *Config) { c.Sessions.Reset.Timezone = "Asia/Tokyo" }, nil},
		{"timezone Local", func(c *Config) { c.Sessions.Reset.Timezone = "Local" }, nil},
		{"timezone unknown", func(c *Config) { c.Sessions.Reset.Timezone = "Europe/Atlantis" }, []string{"sessions.reset.timezone"}},
		{"timezone offset", func(c *Config) { c.Sessions.Reset.Timezone = "+02:00" }, []string{"sessions.reset.timezone"}},
		{"timezone path", func(c *Config) { c.Sessions.Reset.Timezone = "../../etc/passwd" }, []string{"sessions.reset.timezone"}},
		{"quiet platforms", func(c *Config) { c.Sessions.Reset.QuietPlatforms = []string{"discord", "http", "fake"} }, nil},
		{"quiet platforms bad", func(c *Config) { c.Sessions.Reset.QuietPlatforms = []string{"discord", "", "Discord"} }, []string{
			"sessions.reset.quiet_platforms[1]", "sessions.reset.quiet_platforms[2]",
		}},
		{"check_every", func(c *Config) { c.Sessions.Reset.CheckEvery = time.Second }, nil},
		{"check_every too short", func(c *Config) { c.Sessions.Reset.CheckEvery = 999 * time.Millisecond }, []string{"sessions.reset.check_every"}},
		{"prune enabled", func(c *Config) {
			c.Sessions.Prune = Prune{Enabled: true, Retention: 24 * time.Hour, Interval: time.Minute}
		}, nil},
		{"prune disabled is not checked", func(c *Config) { c.Sessions.Prune = Prune{Retention: time.Hour} }, nil},
		{"prune too eager", func(c *Config) {
			c.Sessions.Prune = Prune{Enabled: true, Retention: 23 * time.Hour, Interval: 59 * time.Second}
		}, []string{
			"sessions.prune.retention", "sessions.prune.interval",
		}},
		{"overrides", func(c *Config) {
			c.Sessions.ResetByPlatform = map[string]ResetOverride{"discord": {Mode: new("both"), AtHour: new(0)}, "http": {}}
			c.Sessions.ResetByType = map[string]ResetOverride{"dm": {IdleMinutes: new(1)}, "group": {}, "channel": {}, "thread": {Notify: new(false)}}
		}, nil},
		{"overrides bad, sorted by key", func(c *Config) {
			c.Sessions.ResetByPlatform = map[string]ResetOverride{
				"slack":   {IdleMinutes: new(-5)},
				"discord": {Mode: new(""), AtHour: new(-1)},
				"":        {},
				"Http":    {},
				"my.chat": {},
			}
			c.Sessions.ResetByType = map[string]ResetOverride{"private": {Mode: new("idle")}, "dm": {AtHour: new(24)}}
		}, []string{
			`sessions.reset_by_platform.""`,
			"sessions.reset_by_platform.Http",
			"sessions.reset_by_platform.discord.mode",
			"sessions.reset_by_platform.discord.at_hour",
			`sessions.reset_by_platform."my.chat"`,
			"sessions.reset_by_platform.slack.idle_minutes",
			"sessions.reset_by_type.dm.at_hour",
			"sessions.reset_by_type.private",
		}},
		{"quiet platform told to notify", func(c *Config) {
			c.Sessions.Reset.QuietPlatforms = []string{"discord"}
			c.Sessions.ResetByPlatform = map[string]ResetOverride{"discord": {Notify: new(true)}, "http": {Notify: new(true)}}
			c.Sessions.ResetByType = map[string]ResetOverride{"dm": {Notify: new(true)}}
		}, []string{"sessions.reset_by_platform.discord.notify"}},
		{"unknown backend", func(c *Config) { c.Agent.Backend = "claude" }, []string{"agent.backend"}},
		{"exec without command", func(c *Config) { c.Agent.Backend = "exec" }, []string{"agent.exec.command"}},
		{"negative max_concurrent", func(c *Config) { c.Agent.MaxConcurrent = -1 }, []string{"agent.max_concurrent"}},
		{"exec with empty argv0", func(c *Config) { c.Agent.Backend = "exec"; c.Agent.Exec.Command = []string{""} }, []string{"agent.exec.command"}},
		{"exec limits", func(c *Config) {
			c.Agent.Exec.Timeout, c.Agent.Exec.History, c.Agent.Exec.HistoryBytes, c.Agent.Exec.KillGrace = 0, -1, -1, -1
		}, []string{
			"agent.exec.timeout", "agent.exec.history", "agent.exec.history_bytes", "agent.exec.kill_grace",
		}},
		{"openai without url and model", func(c *Config) { c.Agent.Backend = "openai" }, []string{"agent.openai.base_url", "agent.openai.model"}},
		{"openai bad url", func(c *Config) { c.Agent.OpenAI.BaseURL = "api.openai.com/v1" }, []string{"agent.openai.base_url"}},
		{"openai url of the endpoint, not the root", func(c *Config) { c.Agent.OpenAI.BaseURL = "https://api.openai.com/v1/chat/completions/" }, []string{"agent.openai.base_url"}},
		{"openai key and timeout", func(c *Config) { c.Agent.OpenAI.APIKeyEnv = "sk-123"; c.Agent.OpenAI.Timeout = 0 }, []string{
			"agent.openai.api_key_env", "agent.openai.timeout",
		}},
		{"openai limits", func(c *Config) {
			o := &c.Agent.OpenAI
			o.Temperature, o.MaxTokens, o.MaxHistory, o.TokenBudget, o.MaxRetries, o.MaxBackoff = new(2.5), -1, -1, -1, -1, 0
		}, []string{
			"agent.openai.temperature", "agent.openai.max_tokens", "agent.openai.max_history",
			"agent.openai.token_budget", "agent.openai.max_retries", "agent.openai.max_backoff",
		}},
		{"discord without token_env", func(c *Config) { c.Platforms.Discord.Enabled, c.Platforms.Discord.TokenEnv = true, "" }, []string{"platforms.discord.token_env"}},
		{"discord shards, archive, ids and api_url", func(c *Config) {
			d := &c.Platforms.Discord
			d.ShardID, d.ShardCount, d.ThreadArchiveMinutes, d.APIURL = 2, 2, 30, "discord.com/api"
			d.AllowedUsers = []string{"123", "@alice"}
			d.Channels = map[string]DiscordScope{"general": {}}
		}, []string{
			"platforms.discord.shard_id", "platforms.discord.thread_archive_minutes", "platforms.discord.api_url",
			"platforms.discord.allowed_users[1]", "platforms.discord.channels.general",
		}},
		{"discord shards in a cluster", func(c *Config) {
			c.Store.Driver, c.Store.DSN = "postgres", "postgres://db/agentgate"
			c.Cluster = Cluster{Enabled: true, Name: "agentgate", Bind: "10.0.0.5:6340", MemberTTL: 6 * time.Second}
			c.Platforms.Discord.Enabled, c.Platforms.Discord.ShardID, c.Platforms.Discord.ShardCount = true, 1, 2
		}, []string{"platforms.discord.shard_count"}},
		{"discord shards without a cluster", func(c *Config) {
			c.Platforms.Discord.Enabled, c.Platforms.Discord.ShardID, c.Platforms.Discord.ShardCount = true, 1, 2
		}, nil},
		{"discord bad token_env", func(c *Config) { c.Platforms.Discord.TokenEnv = "1TOKEN" }, []string{"platforms.discord.token_env"}},
		{"discord backfill_window past the retention", func(c *Config) {
			c.Platforms.Discord.Enabled, c.Platforms.Discord.BackfillWindow = true, 48*time.Hour
			c.Sessions.Prune.Enabled, c.Sessions.Prune.Retention = true, 24*time.Hour
		}, []string{"platforms.discord.backfill_window"}},
		{"shutdown and persistence", func(c *Config) { c.Shutdown.DrainTimeout = -1; c.Persist.MaxBatch = 0 }, []string{
			"shutdown.drain_timeout", "persistence.max_batch",
		}},
		{"max_batch above its limit", func(c *Config) { c.Persist.MaxBatch = MaxBatchLimit + 1 }, []string{"persistence.max_batch"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.mutate(c)
			err := c.Validate()
			got := fields(err)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Validate() problems (-want +got):\n%s\nerror:\n%v", diff, err)
			}
			if len(problems(err)) != len(tt.want) {
				t.Errorf("Validate() gave %d problems, want %d", len(problems(err)), len(tt.want))
			}
		})
	}
}

// TestEnvNameWithItsDollar: a *_env key written as the shell reads the variable,
// $DISCORD_TOKEN, is told to drop the $; before, it was told not to hold the secret, which it
// did not (found by a new operator's walkthrough).
func TestEnvNameWithItsDollar(t *testing.T) {
	for _, name := range []string{"$DISCORD_TOKEN", "${DISCORD_TOKEN}"} {
		c := Default()
		c.Platforms.Discord.Enabled = true
		c.Platforms.Discord.TokenEnv = name
		want := "platforms.discord.token_env: must be the name of an environment variable, without the shell's $ (NAME, not $NAME or ${NAME})"
		if err := c.Validate(); err == nil || err.Error() != want {
			t.Errorf("Validate() of token_env %s = %v, want %q", name, err, want)
		}
	}
}

func TestFieldErrorMessages(t *testing.T) {
	c := Default()
	c.Sessions.Queue.Mode = "fast"
	c.Sessions.PassivateAfter = -time.Second
	c.HTTP.TokenEnv = "secret.token.value"
	c.Store.Driver = "postgres"
	c.Agent.Backend = "exec"
	c.Agent.Exec.Command = []string{""}
	err := c.Validate()

	var fe *FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("Validate() = %v, want it to hold a *FieldError", err)
	}
	want := []string{
		`http.token_env: must be the name of an environment variable ([A-Za-z_][A-Za-z0-9_]*), not the secret`,
		`store.dsn: required when store.driver is postgres`,
		`sessions.passivate_after: -1s: must not be negative`,
		`sessions.queue.mode: "fast": must be one of followup, collect, interrupt, steer`,
		// Set, but with no program: not "required" (found by a walkthrough).
		`agent.exec.command: [""]: its first element, the program to run, is empty`,
	}
	var got []string
	for _, p := range problems(err) {
		got = append(got, p.Error())
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Validate() messages (-want +got):\n%s", diff)
	}
	if strings.Contains(err.Error(), "secret.token.value") {
		t.Errorf("Validate() = %q, leaks the value of a *_env key", err)
	}
}

// TestBoundMessages: a value past a bound names its key, its value and the bound (found by an
// audit: 1ns for agent.exec.timeout, an hour's debounce and caps of billions were taken).
func TestBoundMessages(t *testing.T) {
	c := Default()
	c.HTTP.MaxHeld = 1_000_000
	c.Sessions.Queue.Cap = 9_223_372_036_854_775_807
	c.Sessions.Queue.Debounce = time.Hour
	c.Sessions.Queue.DebounceByPlatform = map[string]time.Duration{"discord": 90 * time.Minute}
	c.Agent.Exec.Timeout = time.Nanosecond
	c.Agent.OpenAI.Timeout = 500 * time.Millisecond
	want := []string{
		`http.max_held: 1000000: must be at most 65536 (each held request costs a connection, a file descriptor and some 40 KiB)`,
		`sessions.queue.cap: 9223372036854775807: must be at most 10000 (a session holds that many messages in memory, some 4 KiB each; with overflow: spool, those past the cap wait in the store)`,
		`sessions.queue.debounce: 1h: must be at most 5m (every turn waits this long after its sender's last message)`,
		`sessions.queue.debounce_by_platform.discord: 1h30m: must be at most 5m (every turn waits this long after its sender's last message)`,
		`agent.exec.timeout: 1ns: must be at least 1s`,
		`agent.openai.timeout: 500ms: must be at least 1s`,
	}
	var got []string
	for _, p := range problems(c.Validate()) {
		got = append(got, p.Error())
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Validate() messages (-want +got):\n%s", diff)
	}
	// From a file, the line is named too.
	path := MustWriteConfig(t, "sessions:\n  queue:\n    debounce: 10m\n")
	if _, err := Load(path, nil, nil); err == nil || !strings.Contains(err.Error(), path+":3: sessions.queue.debounce: 10m: must be at most 5m") {
		t.Errorf("Load(debounce: 10m) error = %v, want it to name the file's line and the bound", err)
	}
}

// TestLogLevelAnyCase: INFO, Debug and the like are levels, from a file, a variable or a flag
// (before, only lower case was; found by an audit).
func TestLogLevelAnyCase(t *testing.T) {
	for _, tt := range []struct {
		file, env, flag string
		want            slog.Level
	}{
		{file: "INFO", want: slog.LevelInfo},
		{env: "Debug", want: slog.LevelDebug},
		{flag: "WARN", want: slog.LevelWarn},
		{file: "debug", env: "ERROR", want: slog.LevelError},
	} {
		var environ []string
		if tt.env != "" {
			environ = []string{"AGENTGATE_LOG_LEVEL=" + tt.env}
		}
		path := ""
		if tt.file != "" {
			path = MustWriteConfig(t, "log: {level: "+tt.file+"}\n")
		}
		cfg, err := Load(path, environ, func(c *Config) {
			if tt.flag != "" {
				c.Log.Level = tt.flag
			}
		})
		if err != nil {
			t.Errorf("Load(level file %q, env %q, flag %q) error = %v, want nil", tt.file, tt.env, tt.flag, err)
			continue
		}
		if got := cfg.SlogLevel(); got != tt.want {
			t.Errorf("Load(level file %q, env %q, flag %q).SlogLevel() = %v, want %v", tt.file, tt.env, tt.flag, got, tt.want)
		}
	}
	_, err := Load("", []string{"AGENTGATE_LOG_LEVEL=Loud"}, nil)
	if want := `log.level: "Loud": must be one of debug, info, warn, error (in any case) (set by AGENTGATE_LOG_LEVEL)`; err == nil || err.Error() != want {
		t.Errorf("Load(level Loud) error = %v, want %q", err, want)
	}
}

func TestFieldErrorValues(t *testing.T) {
	reason := errors.New("bad")
	tests := []struct {
		value any
		want  string
	}{
		{nil, "f: bad"},
		{"x y", `f: "x y": bad`},
		{[]string{"sh", "-c"}, `f: ["sh", "-c"]: bad`},
		{90 * time.Second, "f: 1m30s: bad"},
		{3, "f: 3: bad"},
	}
	for _, tt := range tests {
		e := &FieldError{Field: "f", Value: tt.value, Err: reason}
		if got := e.Error(); got != tt.want {
			t.Errorf("FieldError{Value: %#v}.Error() = %q, want %q", tt.value, got, tt.want)
		}
		if !errors.Is(e, reason) {
			t.Errorf("errors.Is(FieldError, reason) = false, want true")
		}
	}
}

func TestEnvNames(t *testing.T) {
	seen := make(map[string]string)
	for _, l := range leaves() {
		if prev, ok := seen[l.env]; ok {
			t.Errorf("%s and %s share the variable %s", prev, l.path, l.env)
		}
		seen[l.env] = l.path
	}
	for _, name := range []string{"AGENTGATE_DATA_DIR", "AGENTGATE_HTTP_ADDR", "AGENTGATE_LOG_LEVEL",
		"AGENTGATE_SESSIONS_QUEUE_MODE", "AGENTGATE_PLATFORMS_DISCORD_ENABLED", "AGENTGATE_AGENT_EXEC_COMMAND"} {
		if _, ok := seen[name]; !ok {
			t.Errorf("no key is set by %s", name)
		}
	}
	// The exec agent passes these to its subprocess (DESIGN §5); none may set a config key.
	for _, name := range []string{"AGENTGATE_PLATFORM", "AGENTGATE_SESSION_KEY", "AGENTGATE_SESSION_ID",
		"AGENTGATE_CHAT_ID", "AGENTGATE_CHAT_TYPE", "AGENTGATE_THREAD_ID", "AGENTGATE_USER_ID",
		"AGENTGATE_USER_NAME", "AGENTGATE_MESSAGE_ID", "AGENTGATE_TURN_ID", "AGENTGATE_PROFILE"} {
		if path, ok := seen[name]; ok {
			t.Errorf("exec agent variable %s collides with key %s", name, path)
		}
	}
}

// TestUnknownEnv: a variable that reads like a key of a section but names none (a misspelt
// key) is reported; keys, the exec agent's identity variables and other AGENTGATE_ names are
// not.
func TestUnknownEnv(t *testing.T) {
	environ := []string{
		"AGENTGATE_HTTP_ADR=127.0.0.1:9", "AGENTGATE_HTTP_ADDR=127.0.0.1:8081",
		"AGENTGATE_SESSIONS_QUEUE_CAPS=5", "AGENTGATE_SESSIONS_QUEUE_CAPS=6",
		"AGENTGATE_AGENT_EXEC_COMAND=[x]", "AGENTGATE_DATA_DIR=/tmp/x",
		"AGENTGATE_SESSION_KEY=agent:main:http:dm:c", "AGENTGATE_PLATFORM=http", "AGENTGATE_USER_NAME=Ann",
		"AGENTGATE_PG_BIN=/usr/lib/postgresql/15/bin", "PATH=/bin", "HTTP_ADR=x",
		"AGENTGATE_HTTPADDR=127.0.0.1:9", "AGENTGATE_LOG={level: debug}", "AGENTGATE_SESSION_ID=s", "AGENTGATE_MESSAGE_ID=m",
		"AGENTGATE_SCOPE_ID=g", "AGENTGATE_PROFILE=p", "AGENTGATE_CHAT_TYPE=dm", "AGENTGATE_TOKEN=t",
	}
	cfg := Default()
	applyEnv(cfg, envVars(environ))
	got := cfg.UnknownEnv(environ)
	want := []string{"AGENTGATE_AGENT_EXEC_COMAND", "AGENTGATE_HTTPADDR", "AGENTGATE_HTTP_ADR", "AGENTGATE_LOG", "AGENTGATE_SESSIONS_QUEUE_CAPS"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("UnknownEnv() mismatch (-want +got):\n%s", diff)
	}
}

// TestClosestEnv: an unknown variable is told the known one it most likely misspells, as the
// file's unknown keys are told the key (before, "a misspelt one?" alone); one close to none is
// told nothing.
func TestClosestEnv(t *testing.T) {
	for _, tt := range []struct{ name, want string }{
		{"AGENTGATE_HTTP_ADR", "AGENTGATE_HTTP_ADDR"},
		{"AGENTGATE_HTTPADDR", "AGENTGATE_HTTP_ADDR"},
		{"AGENTGATE_SESSIONS_QUEUE_CAPS", "AGENTGATE_SESSIONS_QUEUE_CAP"},
		{"AGENTGATE_AGENT_EXEC_COMAND", "AGENTGATE_AGENT_EXEC_COMMAND"},
		{"AGENTGATE_LOG_LEVL", "AGENTGATE_LOG_LEVEL"},
		{"AGENTGATE_LOG", ""},
		{"AGENTGATE_HTTP_WHATEVER", ""},
	} {
		if got := ClosestEnv(tt.name); got != tt.want {
			t.Errorf("ClosestEnv(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestPostgresDSNSyntax: a PostgreSQL DSN pgx cannot parse is a problem of store.dsn, in pgx's
// words and never with the password; a file it names that is not here is left to CheckPostgres
// (check-config's refusals), since it may be where the configuration runs. Before, only the
// store's Open refused the DSN, once the daemon had begun to start (found by an audit).
func TestPostgresDSNSyntax(t *testing.T) {
	tests := []struct {
		dsn  string
		want string // the problem of store.dsn after "cannot be parsed: "; "" for none
	}{
		{"postgres://agentgate:s3cret@db.internal:5432/agentgate?sslmode=require", ""},
		{"host=db.internal user=agentgate password=s3cret dbname=agentgate", ""},
		{"postgres://agentgate:s3cret@db.internal:port/agentgate", "invalid port"},
		{"postgres://agentgate:s3c ret@db.internal/agentgate", "failed to parse as URL"},
		{"postgres://agentgate@db.internal:s3cret/agentgate", "invalid port"}, // (the strconv error quotes the port)
		{"host=db.internal password s3cret", "failed to parse as keyword/value"},
		{"host=db.internal password='s3cret", "failed to parse as keyword/value"},
		{"postgres://agentgate:s3cret@db.internal/agentgate?sslmode=sometimes", "failed to configure TLS: sslmode is invalid"},
		{"postgres://agentgate:s3cret@db.internal/agentgate?connect_timeout=soon", "invalid connect_timeout"},
		{"postgres://agentgate:s3cret@db.internal/agentgate?pool_max_conns=many", "cannot parse pool_max_conns"},
	}
	for _, tt := range tests {
		t.Run(tt.dsn, func(t *testing.T) {
			_, err := Load("", []string{"AGENTGATE_STORE_DRIVER=postgres", "AGENTGATE_STORE_DSN=" + tt.dsn}, nil)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Load(dsn %q) = %v, want no problem", tt.dsn, err)
				}
				return
			}
			want := "store.dsn: cannot be parsed: " + tt.want + "; write it as postgres://user:password@host:port/database?sslmode=... or as key=value pairs"
			if err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Errorf("Load(dsn %q) = %v, want %q", tt.dsn, err, want)
			}
			if err != nil && strings.Contains(err.Error(), "s3c") {
				t.Errorf("Load(dsn %q) = %v, which shows the password", tt.dsn, err)
			}
		})
	}

	missing := filepath.Join(t.TempDir(), "ca.pem")
	c := Default()
	c.Store.Driver, c.Store.DSN = "postgres", "postgres://agentgate:s3cret@db.internal/agentgate?sslmode=verify-full&sslrootcert="+missing
	if err := c.Validate(); err != nil {
		t.Errorf("Validate() with an sslrootcert that is not here = %v, want nil", err)
	}
	err := c.CheckPostgres()
	if want := "store.dsn: names a file that cannot be read here: failed to configure TLS: unable to read CA file: open " + missing; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("CheckPostgres() = %v, want %q", err, want)
	}
	c.Store.DSN = "postgres://agentgate:s3cret@db.internal/agentgate"
	if err := c.CheckPostgres(); err != nil {
		t.Errorf("CheckPostgres() of a DSN that names no file = %v, want nil", err)
	}
}

func TestDSN(t *testing.T) {
	c := Default()
	c.DataDir = "/var/lib/agentgate"
	if got, want := c.DSN(), filepath.Join("/var/lib/agentgate", "agentgate.db"); got != want {
		t.Errorf("DSN() = %q, want %q", got, want)
	}
	c.Store.DSN = "postgres://db/agentgate"
	if got, want := c.DSN(), "postgres://db/agentgate"; got != want {
		t.Errorf("DSN() with store.dsn = %q, want %q", got, want)
	}
}

func TestSlogLevel(t *testing.T) {
	for in, want := range map[string]slog.Level{
		"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn,
		"error": slog.LevelError, "": slog.LevelInfo, "loud": slog.LevelInfo,
		"DEBUG": slog.LevelDebug, "Warn": slog.LevelWarn, "ERROR": slog.LevelError,
	} {
		c := Default()
		c.Log.Level = in
		if got := c.SlogLevel(); got != want {
			t.Errorf("SlogLevel() with log.level %q = %v, want %v", in, got, want)
		}
	}
}

func FuzzLoad(f *testing.F) {
	f.Add("", "")
	f.Add(Example(), "")
	f.Add("log: {level: debug}\nsessions:\n  queue: {cap: 3, debounce: 1s}\n", "10m")
	f.Add("agent:\n  backend: exec\n  exec: {command: [sh, -c, \"echo hi\"]}\n", "[a, b]")
	f.Add("base: &b {level: warn}\nlog:\n  <<: *b\n", "true")
	f.Add("sessions: [1, 2]\nlog: debug\nnope: 1\n", "{x: y}")
	f.Add("sessions:\n  reset_by_platform: {discord: {mode: idle}, \"\": ~}\n  reset_by_type: {dm: {at_hour: 25}, x: [1]}\n  reset: {timezone: UTC}\n", "{dm: {notify: false}}")
	f.Add("sessions:\n  reset_by_type:\n    ? [a]\n    : {mode: none}\n  prune: {enabled: true}\n", "~")
	// One file for the whole run: a fuzz process calls the target sequentially.
	path := filepath.Join(f.TempDir(), "agentgate.yaml")
	f.Fuzz(func(t *testing.T, doc, env string) {
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		environ := []string{
			"AGENTGATE_SESSIONS_PASSIVATE_AFTER=" + env,
			"AGENTGATE_AGENT_EXEC_COMMAND=" + env,
			"AGENTGATE_PLATFORMS_DISCORD_ENABLED=" + env,
			"AGENTGATE_PERSISTENCE_MAX_BATCH=" + env,
			"AGENTGATE_SESSIONS_RESET_BY_TYPE=" + env,
			"AGENTGATE_SESSIONS_RESET_QUIET_PLATFORMS=" + env,
		}
		cfg, err := Load(path, environ, nil)
		if err != nil {
			if cfg != nil {
				t.Errorf("Load returned a config with error %v", err)
			}
			if err.Error() == "" {
				t.Errorf("Load error has an empty message")
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("Load succeeded but Validate() = %v", err)
		}
	})
}

func TestIsEnvKey(t *testing.T) {
	for name, want := range map[string]bool{
		"AGENTGATE_STORE_DSN": true, "AGENTGATE_SESSIONS_QUEUE_CAP": true, "AGENTGATE_DATA_DIR": true,
		"AGENTGATE_PG_BIN": false, "AGENTGATE_SESSION_KEY": false, "STORE_DSN": false, "agentgate_store_dsn": false,
	} {
		if got := IsEnvKey(name); got != want {
			t.Errorf("IsEnvKey(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestSecretEnv(t *testing.T) {
	c := Default()
	c.HTTP.TokenEnv = "BEARER"
	if got := fmt.Sprint(c.SecretEnv()); got != "[BEARER]" {
		t.Errorf("defaults with a bearer token: %s, want [BEARER] (Discord off, echo agent)", got)
	}
	c.Platforms.Discord.Enabled = true
	c.Agent.Backend = "openai"
	if got := fmt.Sprint(c.SecretEnv()); got != "[BEARER DISCORD_TOKEN OPENAI_API_KEY]" {
		t.Errorf("with Discord and openai: %s, want [BEARER DISCORD_TOKEN OPENAI_API_KEY]", got)
	}
	c.Store.Driver = "postgres"
	if got := fmt.Sprint(c.SecretEnv()); got != "[BEARER DISCORD_TOKEN OPENAI_API_KEY PGPASSWORD]" {
		t.Errorf("on PostgreSQL: %s, want [BEARER DISCORD_TOKEN OPENAI_API_KEY PGPASSWORD] (the database password the daemon reads)", got)
	}
}

// TestCountWrittenAsDurationNamesItsUnitOnlyWhereTheKeyDoes: a count written as a duration is
// told that the key's name says its unit only of a key whose name does (idle_minutes,
// thread_archive_minutes, at_hour), with the value in that unit; any other count
// (history_limit: 5m, max_connections: 1m as a million) is told it must be an integer. Before,
// every integer key was told "the key's name says its unit (idle_minutes: 30)", of
// history_limit or max_connections too, whose names name no unit (a review).
func TestCountWrittenAsDurationNamesItsUnitOnlyWhereTheKeyDoes(t *testing.T) {
	tests := []struct {
		name, file string
		environ    []string
		want       string
	}{
		{name: "minutes", environ: []string{"AGENTGATE_SESSIONS_RESET_IDLE_MINUTES=2h"},
			want: `AGENTGATE_SESSIONS_RESET_IDLE_MINUTES: "2h": must be an integer, not a duration: the key's name says its unit (idle_minutes: 120)`},
		{name: "minutes in a map", environ: []string{"AGENTGATE_SESSIONS_RESET_BY_TYPE={dm: {idle_minutes: 1h}}"},
			want: `dm.idle_minutes: "1h": must be an integer, not a duration: the key's name says its unit (idle_minutes: 60)`},
		{name: "minutes not whole", file: "platforms: {discord: {thread_archive_minutes: 90s}}\n",
			want: `platforms.discord.thread_archive_minutes: "90s": must be an integer, not a duration: the key's name says its unit (thread_archive_minutes: a whole number of minutes)`},
		{name: "hour", file: "sessions: {reset: {at_hour: 4h}}\n",
			want: `sessions.reset.at_hour: "4h": must be an integer, not a duration: the key's name says its unit (at_hour: 4)`},
		{name: "a count of messages", environ: []string{"AGENTGATE_SESSIONS_HISTORY_LIMIT=5m"},
			want: `AGENTGATE_SESSIONS_HISTORY_LIMIT: "5m": must be an integer`},
		{name: "a count of connections", file: "http: {max_connections: 1m}\n",
			want: `http.max_connections: "1m": must be an integer`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := ""
			if tt.file != "" {
				path = MustWriteConfig(t, tt.file)
			}
			_, err := Load(path, tt.environ, nil)
			ps := problems(err)
			if len(ps) != 1 {
				t.Fatalf("Load gave %d problems, want 1:\n%v", len(ps), err)
			}
			got := ps[0].Error()
			if !strings.Contains(got, tt.want) {
				t.Errorf("problem = %q, want it to contain %q", got, tt.want)
			}
			if !strings.Contains(tt.want, "unit") && strings.Contains(got, "unit") {
				t.Errorf("problem = %q: says the key's name gives a unit, which it does not", got)
			}
		})
	}
}
