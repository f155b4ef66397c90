package config

import (
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// mustProblemTexts returns the text of each problem Load finds in a file holding yaml (its
// path replaced by FILE) with environ.
func mustProblemTexts(t *testing.T, yaml string, environ []string) []string {
	t.Helper()
	path := MustWriteConfig(t, yaml)
	_, err := Load(path, environ, nil)
	if err == nil {
		t.Fatalf("Load(%q) error = nil, want problems", yaml)
	}
	var out []string
	for _, p := range problems(err) {
		out = append(out, strings.ReplaceAll(p.Error(), path, "FILE"))
	}
	return out
}

// TestLoadUnknownKeySuggestsTheClosest: a key the file misspells is told the key it most
// likely meant, as a misspelt variable is warned of. Before, the file's http.adr was just an
// "unknown key", with no word of http.addr.
func TestLoadUnknownKeySuggestsTheClosest(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		environ []string
		want    string
	}{
		{"one letter left out", "http:\n  adr: 127.0.0.1:8081\n", nil,
			"FILE:2: http.adr: unknown key (did you mean http.addr?)"},
		{"another case", "log:\n  Level: debug\n", nil,
			"FILE:2: log.Level: unknown key (did you mean log.level?)"},
		{"two letters swapped, in a map's entry", "sessions:\n  reset_by_type:\n    dm: {mode: idle, idel_minutes: 5}\n", nil,
			"FILE:3: sessions.reset_by_type.dm.idel_minutes: unknown key (did you mean sessions.reset_by_type.dm.idle_minutes?)"},
		{"two edits in a longer key", "agent:\n  exec: {kil_grase: 5s}\n", nil,
			"FILE:2: agent.exec.kil_grase: unknown key (did you mean agent.exec.kill_grace?)"},
		// Before, a bare "unknown key" of both (found by a new operator's walkthrough).
		{"a section's key beside it, as a variable names it", "log_level: debug\n", nil,
			"FILE:1: log_level: unknown key (log.level is written inside its section: log: {level: …})"},
		{"a section's key beside it, as a dotted path", "sessions.queue.cap: 5\n", nil,
			"FILE:1: sessions.queue.cap: unknown key (sessions.queue.cap is written inside its section: sessions: {queue: {cap: …}})"},
		{"a section's key beside it, within a section", "agent:\n  exec_kill_grace: 5s\n", nil,
			"FILE:2: agent.exec_kill_grace: unknown key (agent.exec.kill_grace is written inside its section: exec: {kill_grace: …})"},
		{"nothing close", "listen: :80\n", nil, "FILE:1: listen: unknown key"},
		{"too far for a short key", "http:\n  adrs: x\n", nil, "FILE:2: http.adrs: unknown key"},
		// mod beside mode is no misspelt mode: mode is written already.
		{"the close key is written already", "sessions:\n  reset:\n    mode: idle\n    mod: idle\n", nil,
			"FILE:4: sessions.reset.mod: unknown key"},
		// A section misspelt beside itself: its keys go in the one written. Before, a bare
		// "unknown key", for the close key is written already.
		{"a section written already", "sessions:\n  history_limit: 5\nsesions:\n  queue: {cap: 5}\n", nil,
			"FILE:3: sesions: unknown key (did you mean sessions? sessions is written already: move these keys into it, as a section is written once)"},
		{"a section written already, within a section", "agent:\n  exec: {timeout: 5m}\n  exce: {kill_grace: 5s}\n", nil,
			"FILE:3: agent.exce: unknown key (did you mean agent.exec? agent.exec is written already: move these keys into it, as a section is written once)"},
		// A value, not keys, beside the section it misspells: there are no keys to move. Before,
		// htp: :8080 was told to "move these keys into it" (a review).
		{"one value beside a section written already", "http:\n  pprof: true\nhtp: :8080\n", nil,
			`FILE:3: htp: unknown key (did you mean http.addr? http is written already, and holds keys, not one value: write this one inside it, as addr: ":8080")`},
		{"one value beside a section with no such key", "sessions:\n  history_limit: 5\nsesions: 5\n", nil,
			"FILE:3: sesions: unknown key (did you mean sessions? sessions is written already, and holds keys, not one value: set the key of it that this value is for)"},
		{"nothing beside a section written already", "sessions:\n  history_limit: 5\nsesions:\n", nil,
			"FILE:3: sesions: unknown key (did you mean sessions? sessions is written already, and this one holds nothing: remove it)"},
		// An empty string, mapping or list holds nothing either. Before, htp: "" was told to
		// write `addr: ` inside http, and htp: {} to move its keys, which it has none of (a
		// review).
		{"an empty string beside a section written already", "http:\n  pprof: true\nhtp: \"\"\n", nil,
			"FILE:3: htp: unknown key (did you mean http? http is written already, and this one holds nothing: remove it)"},
		{"an empty mapping beside a section written already", "http:\n  pprof: true\nhtp: {}\n", nil,
			"FILE:3: htp: unknown key (did you mean http? http is written already, and this one holds nothing: remove it)"},
		{"an empty list beside a section written already", "sessions:\n  history_limit: 5\nsesions: []\n", nil,
			"FILE:3: sesions: unknown key (did you mean sessions? sessions is written already, and this one holds nothing: remove it)"},
		// The section writes that key already: written inside it again, it is a key set twice,
		// which Load refuses. Before, agnet: exec beside agent: {backend: echo} was told to
		// write backend: exec inside agent (a review).
		{"one value beside a section that writes its key already", "agent:\n  backend: echo\nagnet: exec\n", nil,
			"FILE:3: agnet: unknown key (did you mean agent.backend? agent is written already, with its backend: remove this one, or set backend there to its value, exec)"},
		// An alias stands for what its anchor names. Before, each was told to set the key that
		// one value is for: a mapping has keys, and nothing to set there.
		{"an alias of a mapping beside a section written already", "sessions:\n  queue: &q {cap: 5}\n  history_limit: 5\nsesions: *q\n", nil,
			"FILE:4: sesions: unknown key (did you mean sessions? sessions is written already: write the keys *q names inside it, or merge them there with <<: *q, as a section is written once)"},
		{"an alias of the section itself", "http: &h\n  pprof: true\nhtp: *h\n", nil,
			"FILE:3: htp: unknown key (did you mean http? *h is http itself, written already: remove this one)"},
		{"an alias of one value beside a section written already", "sessions:\n  reset_by_type:\n    dm: {mode: &m idle}\nhttp:\n  pprof: true\nhtp: *m\n", nil,
			`FILE:6: htp: unknown key (did you mean http.addr? http is written already, and holds keys, not one value: write this one inside it, as addr: idle)`},
		{"an alias of an empty mapping beside a section written already", "sessions:\n  queue: &q {}\n  history_limit: 5\nsesions: *q\n", nil,
			"FILE:4: sesions: unknown key (did you mean sessions? sessions is written already, and this one holds nothing: remove it)"},
		// The section itself an alias: what it names is what the file writes there. Before,
		// sessions.reset was told to take the keys of *r it holds already, and log a level it
		// has (each written again there, a key set twice).
		{"an alias of the section beside the section written as that alias", "sessions:\n  reset_by_type: {dm: &r {mode: idle}}\n  reset: *r\n  rest: *r\n", nil,
			"FILE:4: sessions.rest: unknown key (did you mean sessions.reset? *r is sessions.reset itself, written already: remove this one)"},
		{"one value beside a section written as an alias that has its key", "sessions:\n  reset_by_type: {dm: &l {level: debug}}\nlog: *l\nlgo: info\n", nil,
			"FILE:4: lgo: unknown key (did you mean log.level? log is written already, with its level: remove this one, or set level there to its value, info)"},
		{"in a variable's mapping", "", []string{"AGENTGATE_SESSIONS_RESET_BY_TYPE={dm: {idel_minutes: 5}}"},
			`AGENTGATE_SESSIONS_RESET_BY_TYPE: "{dm: {idel_minutes: 5}}": dm.idel_minutes: unknown key (did you mean dm.idle_minutes?)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := mustProblemTexts(t, tt.yaml, tt.environ); !slices.Contains(got, tt.want) {
				t.Errorf("Load(%q) problems = %q, want one %q", tt.yaml, got, tt.want)
			}
		})
	}
}

// TestLoadRequiredKeyNamesALine: a key that another key's value requires and that the file
// does not write is pinned on the line of its section when the file writes one (where it
// goes), else on the key that requires it. Before, agent: {backend: exec} was told of
// agent.exec.command with no FILE:LINE at all.
func TestLoadRequiredKeyNamesALine(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		environ []string
		want    string
	}{
		{"flow mapping", "agent: {backend: exec}\n", nil,
			"FILE:1: agent.exec.command: required when agent.backend is exec"},
		{"the key that requires it", "data_dir: x\nagent:\n  backend: exec\n", nil,
			"FILE:3: agent.exec.command: required when agent.backend is exec"},
		{"its section", "agent:\n  backend: exec\n  exec:\n    timeout: 5m\n", nil,
			"FILE:3: agent.exec.command: required when agent.backend is exec"},
		// store is a top-level section: store.driver says more.
		{"not the top-level section", "store:\n  synchronous: full\n  driver: postgres\n", nil,
			"FILE:3: store.dsn: required when store.driver is postgres"},
		{"its section, after the key that requires it", "agent:\n  backend: openai\n  openai:\n    model: m\n", nil,
			"FILE:3: agent.openai.base_url: required when agent.backend is openai"},
		// The file's line says echo: the exec the environment set is not its fault, and the
		// variable that set it is named (TestCrossKeyProblemNamesTheVariables).
		{"required by the environment", "agent:\n  backend: echo\n", []string{"AGENTGATE_AGENT_BACKEND=exec"},
			"agent.exec.command: required when agent.backend is exec (agent.backend set by AGENTGATE_AGENT_BACKEND)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := mustProblemTexts(t, tt.yaml, tt.environ); !slices.Contains(got, tt.want) {
				t.Errorf("Load(%q) problems = %q, want one %q", tt.yaml, got, tt.want)
			}
		})
	}
}

func TestEditDistance(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"addr", "addr", 0},
		{"adr", "addr", 1},
		{"idel", "idle", 1}, // a swap is one edit
		{"timout", "timeout", 1},
		{"kil_grase", "kill_grace", 2},
		{"max_concurent", "max_concurrent", 1},
		{"adrs", "addr", 2},
		{"", "abc", 3},
		{"listen", "log", 5},
	}
	for _, tt := range tests {
		if got := editDistance(tt.a, tt.b); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}

// TestSectionWrittenAsOneValueIsToldYAMLThatParses: the hint given to a section written as one
// value (http: :8081) is YAML that, copied into the file, sets the key it names to that value.
// Before, the value was written in the flow mapping as it came: http: {addr: :8081}, which
// YAML refuses ("did not find expected node content"), and log: {level: debug, json}, which
// sets another key.
func TestSectionWrittenAsOneValueIsToldYAMLThatParses(t *testing.T) {
	tests := []struct {
		name, section, key, value string
	}{
		{"a host and port", "http", "addr", "127.0.0.1:8081"},
		{"a port alone, as Go's listeners take it", "http", "addr", ":8081"},
		{"a comma", "log", "level", "debug, json"},
		{"a comment sign", "log", "level", "debug # loud"},
		{"an alias sign", "http", "addr", "*:8081"},
		{"a tag sign", "agent", "backend", "!exec"},
		{"quotes", "agent", "backend", `it's "exec"`},
		{"a word", "agent", "backend", "exec"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			line, err := yaml.Marshal(map[string]string{tt.section: tt.value}) // the value as a file can hold it
			if err != nil {
				t.Fatal(err)
			}
			got := mustProblemTexts(t, string(line), nil)
			_, hint, ok := strings.Cut(strings.Join(got, "\n"), "(did you mean ")
			hint, _, _ = strings.Cut(hint, "?)")
			if !ok {
				t.Fatalf("%s problems = %q, want a hint", strings.TrimSpace(string(line)), got)
			}
			var parsed map[string]map[string]string
			if err := yaml.Unmarshal([]byte(hint), &parsed); err != nil {
				t.Fatalf("%s hint %q: not valid YAML: %v", strings.TrimSpace(string(line)), hint, err)
			}
			if v, ok := parsed[tt.section][tt.key]; !ok || len(parsed[tt.section]) != 1 || v != tt.value {
				t.Errorf("%s hint %q = %v, want %s.%s %q alone", strings.TrimSpace(string(line)), hint, parsed, tt.section, tt.key, tt.value)
			}
		})
	}
}
