package config

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"
)

// EnvPrefix starts the name of every environment variable that sets a config key:
// AGENTGATE_ followed by the key's YAML path joined with "_" in upper case, such as
// AGENTGATE_SESSIONS_QUEUE_MODE for sessions.queue.mode. The value is YAML. A map key such as
// sessions.reset_by_platform is set whole, as a flow mapping that replaces the file's
// (AGENTGATE_SESSIONS_RESET_BY_PLATFORM='{discord: {mode: idle}}'); its entries have no
// variables of their own.
const EnvPrefix = "AGENTGATE_"

// Default returns the built-in configuration: SQLite in ./data, the HTTP platform on
// 127.0.0.1:8080 and the echo agent. Every call returns a new value that shares nothing.
func Default() *Config {
	return &Config{
		DataDir: "./data",
		Log:     Log{Level: "info", Format: "text"},
		HTTP:    HTTP{Addr: "127.0.0.1:8080", MaxHeld: 1024},
		Store:   Store{Driver: "sqlite", Synchronous: "full"},
		Cluster: Cluster{Name: "agentgate", Bind: "127.0.0.1:6340", MemberTTL: 6 * time.Second},
		Sessions: Sessions{
			GroupSessionsPerUser: true,
			PassivateAfter:       10 * time.Minute,
			MaxInMemory:          100_000, // some 0.5 GiB of sessions (README: sessions.max_in_memory)
			Queue:                Queue{Mode: "followup", Cap: 50, Overflow: "spool"},
			Reset:                Reset{Mode: "none", IdleMinutes: 1440, AtHour: 4, Notify: true, CheckEvery: time.Minute},
			Prune:                Prune{Retention: 90 * 24 * time.Hour, Interval: 24 * time.Hour},
			Recovery:             "rerun",
			HistoryLimit:         20,
		},
		Agent: Agent{
			Backend:       "echo",
			MaxConcurrent: 32,
			// 1 MiB of history: the size of the longest reply (MaxReply), against the 20 of
			// them that history: 20 alone let through.
			Exec: Exec{Timeout: 10 * time.Minute, History: 20, HistoryBytes: 1 << 20, KillGrace: 5 * time.Second},
			OpenAI: OpenAI{APIKeyEnv: "OPENAI_API_KEY", Timeout: 2 * time.Minute, MaxHistory: 20,
				TokenBudget: 8000, MaxRetries: 3, MaxBackoff: 30 * time.Second},
		},
		Platforms: Platforms{Discord: Discord{
			TokenEnv: "DISCORD_TOKEN", RequireMention: true, ShardCount: 1, ThreadArchiveMinutes: 1440,
			BackfillWindow: time.Hour,
		}},
		Shutdown: Shutdown{DrainTimeout: 30 * time.Second},
		Persist:  Persist{MaxBatch: 512},
	}
}

// Load builds the configuration in the order defaults → the YAML file at path (skipped when
// path is empty) → the AGENTGATE_* variables in environ (os.Environ's "KEY=value" form) →
// override (the command-line flags; may be nil), then validates it.
//
// The file is decoded strictly: an unknown key is an error naming the key and its line. An
// AGENTGATE_ variable that names no key is ignored, because the exec agent hands its
// subprocesses variables such as AGENTGATE_SESSION_KEY; one whose value doesn't parse is an
// error naming the variable. An empty variable counts as unset (AGENTGATE_LOG_LEVEL= keeps the
// file's level), as most Unix tools read one: an env file or a template that leaves a value
// out must not empty the key. The exception is AGENTGATE_AGENT_OPENAI_API_KEY_ENV=, which
// sets agent.openai.api_key_env to "" (send no API key), as the file's api_key_env: "" does. Every problem is reported at once, joined with errors.Join; the
// ones tied to a key are *FieldError. A file that can't be read is returned on its own,
// naming the file and wrapping the os error's cause (errors.Is(err, fs.ErrNotExist) holds).
func Load(path string, environ []string, override func(*Config)) (*Config, error) {
	cfg, problems, _ := Check(path, environ, override, nil, nil)
	if problems != nil {
		return nil, problems
	}
	return cfg, nil
}

// Check is Load for check-config and serve: it returns the configuration also when it has
// problems (nil only when the file cannot be read), so that what serve would refuse on this
// machine is reported with them, not after they are fixed. A key with a problem holds its
// default or the value as decoded.
//
// here (may be nil) checks the configuration against this machine (a data directory it cannot
// write, a secret variable that is not set); its problems are returned apart, as refused, but
// for those of a key whose value did not decode (the key holds another value than the file's).
// The problems of both kinds that are a *FieldError of a key the file sets are pinned on that
// key's line (FILE:LINE: key: …), as the file's own are. Each kind comes in the same order:
// the problems pinned on the file's lines in the file's order; then the file's others (a
// syntax error without a line, a rule between keys the file leaves at their defaults); then
// those of AGENTGATE_* variables; then those of override's values; each group in the order of
// the keys in Config (that of --print-defaults).
//
// flags (may be nil) names the command-line flag that override sets each key with, by the
// key's path (log.level: --log-level): a problem of a value a flag set says "(set by
// --log-level)", as one of a variable's says "(set by AGENTGATE_LOG_LEVEL)".
func Check(path string, environ []string, override func(*Config), flags map[string]string, here func(*Config) []error) (cfg *Config, problems, refused error) {
	cfg = Default()
	var errs []error
	var lines map[string]int
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			// One line naming the file: "config: read agentgate.yaml: no such file or
			// directory". Before, the os error's "open …" followed "load config: ", and a
			// command's "config: " before that (found by an audit).
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return nil, fmt.Errorf("read %s: %w", path, err), nil
		}
		errs = append(errs, decodeFile(cfg, path, data)...)
		lines = keyLines(data)
	}
	vars := envVars(environ)
	errs = append(errs, applyEnv(cfg, vars)...)
	// The keys whose value is not the file's: a problem with one is not pinned on the file's
	// line, which may hold a good value.
	src := sources{fromEnv: make(map[string]bool), fromFlag: make(map[string]bool)}
	for _, l := range leaves() {
		if _, ok := envValue(l, vars); ok {
			src.fromEnv[l.path] = true
		}
	}
	if override != nil {
		// The flags set whole values (a shallow copy tells what they changed).
		before := *cfg
		override(cfg)
		b, a := reflect.ValueOf(&before).Elem(), reflect.ValueOf(cfg).Elem()
		for _, l := range leaves() {
			if !reflect.DeepEqual(b.FieldByIndex(l.index).Interface(), a.FieldByIndex(l.index).Interface()) {
				src.fromFlag[l.path] = true
			}
		}
	}
	notFile := make(map[string]bool)
	maps.Copy(notFile, src.fromEnv)
	maps.Copy(notFile, src.fromFlag)
	// A value that didn't decode is reported once: the decoder may have left a zero in its
	// place (it allocates an override's pointer field before it fails), which isn't news.
	undecoded := make(map[string]bool)
	for _, err := range errs {
		var fe *FieldError
		if errors.As(err, &fe) {
			undecoded[fe.Field] = true
			for _, l := range leaves() {
				if l.env == fe.Field { // a variable's: its key too (found by an audit: reported twice)
					undecoded[l.path] = true
				}
			}
		}
	}
	// pin names the file's line of a problem of a key the file sets, and drops (nil) one of a
	// key whose value did not decode.
	pin := func(err error) error {
		var fe *FieldError
		switch {
		case !errors.As(err, &fe):
			return err
		case undecoded[fe.Field]:
			return nil
		}
		line, onLine := fileLine(fe, lines, notFile)
		fe.env = nil
		// setBy names the variable or the flag that gave the key l its value, "" for the file.
		setBy := func(l leaf) string {
			switch {
			case src.fromFlag[l.path]:
				return flags[l.path]
			case src.fromEnv[l.path]:
				return l.env
			}
			return ""
		}
		own, hasOwn := leafOf(fe.Field)
		if by := setBy(own); hasOwn && !onLine && by != "" {
			fe.env = append(fe.env, "set by "+by)
		}
		// The other keys of a problem between keys are named too, also at the file's line of
		// Field (the file writes agent.exec; AGENTGATE_AGENT_BACKEND=exec asks for its command).
		for _, key := range fe.involved() {
			if l, ok := leafOf(key); ok && (!hasOwn || l.path != own.path) && setBy(l) != "" {
				fe.env = append(fe.env, key+" set by "+setBy(l))
			}
		}
		if onLine {
			return &lineError{file: path, line: line, err: err}
		}
		return err
	}
	for _, err := range cfg.validate() {
		if err := pin(err); err != nil {
			errs = append(errs, err)
		}
	}
	var refusals []error
	if here != nil {
		// A key with a problem already is not refused again: an empty or misspelt secret
		// variable's name (token_env: $DISCORD_TOKEN) read "required" or "must be the name of
		// an environment variable", then "… is not set here; serve refuses to start", as two.
		invalid := make(map[string]bool)
		for _, err := range errs {
			var fe *FieldError
			if errors.As(err, &fe) {
				invalid[fe.Field] = true
			}
		}
		for _, err := range here(cfg) {
			var fe *FieldError
			if errors.As(err, &fe) && invalid[fe.Field] {
				continue
			}
			if err := pin(err); err != nil {
				refusals = append(refusals, err)
			}
		}
	}
	src.sort(errs)
	src.sort(refusals)
	return cfg, errors.Join(errs...), errors.Join(refusals...)
}

// sources are the keys whose value came from an AGENTGATE_* variable, and from the override
// (the flags), by path.
type sources struct {
	fromEnv, fromFlag map[string]bool
}

// sort puts problems in Check's order.
func (s sources) sort(problems []error) {
	slices.SortStableFunc(problems, func(a, b error) int {
		ka, kb := s.rank(a), s.rank(b)
		return cmp.Or(cmp.Compare(ka.group, kb.group), cmp.Compare(ka.line, kb.line), cmp.Compare(ka.key, kb.key))
	})
}

// problemRank is where a problem goes in Check's order.
type problemRank struct {
	group int // 0: at a line of the file; 1: the file's others; 2: a variable's; 3: a flag's
	line  int // the file's line (group 0)
	key   int // the problem's key in Config's order (the others)
}

func (s sources) rank(err error) problemRank {
	var le *lineError
	if errors.As(err, &le) {
		return problemRank{group: 0, line: le.line}
	}
	var fe *FieldError
	if !errors.As(err, &fe) {
		return problemRank{group: 1, key: math.MaxInt}
	}
	r := problemRank{group: 1, key: keyIndex(fe.Field)}
	switch {
	case fe.Field != "" && strings.ToUpper(fe.Field) == fe.Field: // a variable (AGENTGATE_…, PGSSLMODE), never a key
		r.group = 2
	case setElsewhere(fe.Field, s.fromFlag) || anySetElsewhere(fe.involved(), s.fromFlag):
		r.group = 3
	case setElsewhere(fe.Field, s.fromEnv) || anySetElsewhere(fe.involved(), s.fromEnv):
		r.group = 2
	}
	return r
}

// anySetElsewhere reports whether one of keys got its value elsewhere than the file
// (setElsewhere).
func anySetElsewhere(keys []string, notFile map[string]bool) bool {
	return slices.ContainsFunc(keys, func(key string) bool { return setElsewhere(key, notFile) })
}

// leafOf returns the key that holds field: the key itself, or the one whose map or list entry
// it is.
func leafOf(field string) (leaf, bool) {
	for _, l := range leaves() {
		if field == l.path || strings.HasPrefix(field, l.path+".") || strings.HasPrefix(field, l.path+"[") {
			return l, true
		}
	}
	return leaf{}, false
}

// keyIndex is the place in Config's order of the key field (a key's path, a map entry's or a
// list entry's within it, or its AGENTGATE_ variable), or the largest int for no key.
func keyIndex(field string) int {
	for i, l := range leaves() {
		if field == l.path || field == l.env || strings.HasPrefix(field, l.path+".") || strings.HasPrefix(field, l.path+"[") {
			return i
		}
	}
	return math.MaxInt
}

// fileLine returns the line of the file that the validation problem fe is pinned on: its key's,
// when the key's value is the file's. A required key the file does not write has no line of
// its own: it is pinned on the nearest section below the top level that the file writes
// (agent.exec, where it goes), else on the key whose value requires it (agent.backend), when
// the file wrote that value. check-config's FILE:LINE then leads to the place to fix.
func fileLine(fe *FieldError, lines map[string]int, notFile map[string]bool) (int, bool) {
	if setElsewhere(fe.Field, notFile) {
		return 0, false
	}
	if line, ok := lines[fe.Field]; ok {
		return line, true
	}
	if fe.cause == "" {
		return 0, false
	}
	for p := fe.Field; strings.Count(p, ".") > 1; {
		p = p[:strings.LastIndex(p, ".")]
		if line, ok := lines[p]; ok {
			return line, true
		}
	}
	if line, ok := lines[fe.cause]; ok && !setElsewhere(fe.cause, notFile) {
		return line, true
	}
	return 0, false
}

// lineError is a problem at a line of the configuration file.
type lineError struct {
	file string
	line int
	err  error
}

func (e *lineError) Error() string { return fmt.Sprintf("%s:%d: %v", e.file, e.line, e.err) }

func (e *lineError) Unwrap() error { return e.err }

// setElsewhere reports whether field, or a key it holds or is part of, got its value from an
// environment variable or a flag rather than the file.
func setElsewhere(field string, notFile map[string]bool) bool {
	for key := range notFile {
		if key == field || strings.HasPrefix(key, field+".") ||
			strings.HasPrefix(field, key+".") || strings.HasPrefix(field, key+"[") {
			return true
		}
	}
	return false
}

// keyLines returns the line of every key the file writes, by its path as a FieldError names it
// (sessions.reset_by_type.dm.mode), and of every list entry (agent.exec.command[1]).
func keyLines(data []byte) map[string]int {
	lines := make(map[string]int)
	var root yaml.Node
	if yaml.Unmarshal(data, &root) == nil { // it parsed once already
		diagnose(&root, reflect.TypeFor[Config](), "", new([]diag), lines)
	}
	return lines
}

// DSN returns the store's data source name: store.dsn, or agentgate.db in the data directory.
func (c *Config) DSN() string {
	if c.Store.DSN != "" {
		return c.Store.DSN
	}
	return filepath.Join(c.DataDir, "agentgate.db")
}

// SlogLevel returns log.level (in any case) as a slog.Level, or slog.LevelInfo if it isn't a
// valid level.
func (c *Config) SlogLevel() slog.Level {
	switch strings.ToLower(c.Log.Level) {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

var errUnknownKey = errors.New("unknown key")

// decodeFile decodes one YAML document over cfg and returns its problems, each prefixed
// with name and, where known, the line.
func decodeFile(cfg *Config, name string, data []byte) []error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(cfg)
	if errors.Is(err, io.EOF) {
		return nil // an empty file (or only comments) keeps the defaults
	}
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return describeTypeErrors(name, data, te)
	}
	if err != nil {
		return []error{syntaxError(name, data, err)}
	}
	// A second document would otherwise be ignored without a word.
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return []error{fmt.Errorf("parse %s: want one YAML document, found more", name)}
	}
	// yaml.v3 truncates a float into an integer field (cap: 1.5 reads as 1); the walk that
	// names type errors refuses it.
	var root yaml.Node
	_ = yaml.Unmarshal(data, &root) // the document parsed once already
	var diags []diag
	diagnose(&root, reflect.TypeFor[Config](), "", &diags, nil)
	var errs []error
	for _, d := range diags {
		errs = append(errs, &lineError{file: name, line: d.line, err: d.err})
	}
	return errs
}

// syntaxError is the problem of the file name, whose text data yaml.v3 cannot parse (err): at
// the line yaml.v3 names, as the file's other problems are, when it names one.
func syntaxError(name string, data []byte, err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := lineOf(msg)
	if line == 0 {
		return fmt.Errorf("%s: not valid YAML: %s", name, msg)
	}
	msg = lineRE.ReplaceAllString(msg, "")
	// yaml.v3 says "found character that cannot start any token" of a line indented with a
	// tab, or "found a tab character that violates indentation" at the line above it: name the
	// tab's line, and the fix.
	text := strings.Split(string(data), "\n")
	last := line
	if strings.Contains(msg, "tab character") {
		last++
	}
	for l := line; l <= last && l <= len(text); l++ {
		indent := text[l-1][:len(text[l-1])-len(strings.TrimLeft(text[l-1], " \t"))]
		if strings.Contains(indent, "\t") {
			return &lineError{file: name, line: l, err: errors.New("indented with a tab: YAML indents with spaces only")}
		}
	}
	return &lineError{file: name, line: line, err: errors.New("not valid YAML: " + msg)}
}

// isInteger reports whether t is an integer kind (a time.Duration included), or a pointer to
// one (an optional setting).
func isInteger(t reflect.Type) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

// describeTypeErrors turns yaml.v3's messages ("line 3: field foo not found in type
// config.Log") into errors that name the key path. It re-walks the document to find each
// problem's key; the decoder stays the authority on what is wrong, so a message this walk
// can't attribute is kept as yaml.v3 wrote it.
func describeTypeErrors(name string, data []byte, te *yaml.TypeError) []error {
	var root yaml.Node
	_ = yaml.Unmarshal(data, &root) // the document parsed once already
	var diags []diag
	diagnose(&root, reflect.TypeFor[Config](), "", &diags, nil)
	byLine := make(map[int][]error)
	for _, d := range diags {
		byLine[d.line] = append(byLine[d.line], d.err)
	}
	errs := make([]error, 0, len(te.Errors))
	for _, msg := range te.Errors {
		line := lineOf(msg)
		if ds := byLine[line]; line > 0 && len(ds) > 0 {
			errs = append(errs, &lineError{file: name, line: line, err: ds[0]})
			byLine[line] = ds[1:]
			continue
		}
		if line > 0 {
			errs = append(errs, &lineError{file: name, line: line, err: errors.New(lineRE.ReplaceAllString(msg, ""))})
			continue
		}
		errs = append(errs, fmt.Errorf("%s: %s", name, msg))
	}
	return errs
}

var lineRE = regexp.MustCompile(`^line (\d+): `)

// yamlReason is yaml.v3's message for a value that does not parse, without its "yaml: " and,
// for a value on one line, the line.
func yamlReason(err error, value string) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if !strings.Contains(value, "\n") {
		msg = lineRE.ReplaceAllString(msg, "")
	}
	return msg
}

func lineOf(msg string) int {
	m := lineRE.FindStringSubmatch(msg)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

type diag struct {
	line int
	err  error
}

// diagnose walks n against the type t in document order, as yaml.v3's decoder does, and
// records every unknown key and every value that doesn't decode into its field. When lines is
// not nil, it also records the line of every key by its path, and of every list entry.
func diagnose(n *yaml.Node, t reflect.Type, path string, out *[]diag, lines map[string]int) {
	for n != nil && (n.Kind == yaml.DocumentNode || n.Kind == yaml.AliasNode) {
		if n.Kind == yaml.AliasNode {
			n = n.Alias
		} else if len(n.Content) > 0 {
			n = n.Content[0]
		} else {
			return
		}
	}
	if n == nil {
		return
	}
	if (t.Kind() == reflect.Map || t.Kind() == reflect.Struct) && n.Kind == yaml.MappingNode && duplicateKeys(n, t, path, out) {
		return // yaml.v3 decodes nothing of the mapping
	}
	if t.Kind() == reflect.Map && n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.ShortTag() == "!!merge" {
				continue
			}
			if err := k.Decode(reflect.New(t.Key()).Interface()); err != nil {
				*out = append(*out, diag{k.Line, &FieldError{Field: path, Err: fmt.Errorf("each key %v", typeMismatch(t.Key()))}})
				continue
			}
			p := keyPath(path, k.Value)
			if lines != nil {
				lines[p] = k.Line
			}
			diagnose(v, t.Elem(), p, out, lines)
		}
		return
	}
	if t.Kind() == reflect.Struct {
		if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
			return // decodes to nothing: the defaults stay
		}
		if n.Kind != yaml.MappingNode {
			if path == "" {
				*out = append(*out, diag{n.Line, errors.New("the document must be a mapping of keys")})
			} else {
				*out = append(*out, diag{n.Line, &FieldError{Field: path, Err: notMapping(path, n)}})
			}
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.ShortTag() == "!!merge" {
				continue // merged content is attributed by line only
			}
			p := joinPath(path, k.Value)
			f, ok := fieldByKey(t, k.Value)
			if !ok {
				*out = append(*out, diag{k.Line, &FieldError{Field: p, Err: unknownKey(t, n, path, k.Value, v)}})
				continue
			}
			if lines != nil {
				lines[p] = k.Line
			}
			diagnose(v, f.Type, p, out, lines)
		}
		return
	}
	if isInteger(t) && n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" {
		*out = append(*out, diag{n.Line, &FieldError{Field: path, Value: n.Value, Err: mismatch(path, t, n.Value)}})
		return
	}
	if lines != nil && n.Kind == yaml.SequenceNode {
		for i, e := range n.Content {
			lines[fmt.Sprintf("%s[%d]", path, i)] = e.Line
		}
	}
	err := n.Decode(reflect.New(t).Interface())
	if err == nil {
		return
	}
	fe := &FieldError{Field: path, Err: typeMismatch(t)}
	if n.Kind == yaml.ScalarNode {
		fe.Value, fe.Err = n.Value, mismatch(path, t, n.Value)
	}
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		*out = append(*out, diag{n.Line, fe})
		return
	}
	// One entry per message keeps the pairing with the decoder's messages exact.
	for _, msg := range te.Errors {
		*out = append(*out, diag{lineOf(msg), fe})
	}
}

// duplicateKeys records every key the mapping n (of the type t, at path) writes again, as
// yaml.v3 finds them (each later one, against each earlier one), and reports whether there was
// one. yaml.v3 says only `mapping key "addr" already defined at line 3`.
func duplicateKeys(n *yaml.Node, t reflect.Type, path string, out *[]diag) bool {
	found := false
	for i := 0; i < len(n.Content); i += 2 {
		ki := n.Content[i]
		for j := i + 2; j < len(n.Content); j += 2 {
			if kj := n.Content[j]; kj.Kind == ki.Kind && kj.Value == ki.Value {
				p := joinPath(path, kj.Value)
				if t.Kind() == reflect.Map {
					p = keyPath(path, kj.Value)
				}
				*out = append(*out, diag{kj.Line, &FieldError{Field: p, Err: fmt.Errorf("set twice (first at line %d): keep one", ki.Line)}})
				found = true
			}
		}
	}
	return found
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

var plainKeyRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// keyPath names the entry key of the map at path; a key that would make the path ambiguous
// (empty, or holding a dot or a space) is quoted: sessions.reset_by_platform."my.chat".
func keyPath(path, key string) string {
	if !plainKeyRE.MatchString(key) {
		key = strconv.Quote(key)
	}
	return joinPath(path, key)
}

func yamlKey(f reflect.StructField) (string, bool) {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	switch {
	case !f.IsExported() || name == "-":
		return "", false
	case name == "":
		return strings.ToLower(f.Name), true // yaml.v3's default
	}
	return name, true
}

func fieldByKey(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if name, ok := yamlKey(f); ok && name == key {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

var durationType = reflect.TypeFor[time.Duration]()

// typeMismatch says what a value of type t looks like.
func typeMismatch(t reflect.Type) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == durationType:
		return errors.New("must be a duration such as 90s or 10m")
	case t.Kind() == reflect.Bool:
		return errors.New("must be true or false")
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return errors.New("must be an integer")
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return errors.New("must be a number")
	case t.Kind() == reflect.String:
		return errors.New("must be a string")
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		return errors.New(`must be a list of strings such as [sh, -c, "echo hi"]`)
	case t.Kind() == reflect.Map && t.Elem().Kind() == reflect.Struct:
		var keys []string
		for i := range t.Elem().NumField() {
			if name, ok := yamlKey(t.Elem().Field(i)); ok {
				keys = append(keys, name)
			}
		}
		return fmt.Errorf("must be a mapping of names to mappings with the keys %s", strings.Join(keys, ", "))
	case t.Kind() == reflect.Map && t.Key().Kind() == reflect.String:
		// Its value's own words, not Go's: "map[string]time.Duration" named no YAML (found by
		// an audit).
		what := strings.TrimPrefix(typeMismatch(t.Elem()).Error(), "must be ")
		return fmt.Errorf("must be a mapping of names to values, each %s", what)
	default:
		return fmt.Errorf("must be a %s", t)
	}
}

var (
	numberRE = regexp.MustCompile(`^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)$`)
	daysRE   = regexp.MustCompile(`^[0-9]{1,9}d$`)
)

// mismatch is typeMismatch for the value written for the key at path, of type t: a duration
// written as a bare number (member_ttl: 30, as a count of seconds) is told its unit.
func mismatch(path string, t reflect.Type, value string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == durationType && numberRE.MatchString(value):
		return fmt.Errorf("must be a duration with its unit, such as %ss or %sm", value, value)
	case t == durationType && daysRE.MatchString(value):
		// retention: 90d, as other tools write it: Go's durations stop at hours.
		days, _ := strconv.Atoi(strings.TrimSuffix(value, "d"))
		return fmt.Errorf("must be a duration in h, m or s, which has no d: %dh for %s", days*24, value)
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64 && isDuration(value) && unitOfKey(path) != 0:
		// idle_minutes: 30m, thread_archive_minutes: 1h: the unit is in the key's name. Only
		// there: history_limit: 5m or max_connections: 1m (a million) names no unit.
		key := path[strings.LastIndexByte(path, '.')+1:]
		d, _ := time.ParseDuration(value)
		unit := unitOfKey(path)
		example := fmt.Sprintf("%s: %d", key, d/unit)
		if d%unit != 0 {
			example = fmt.Sprintf("%s: a whole number of %s", key, unitNames[unit])
		}
		return fmt.Errorf("must be an integer, not a duration: the key's name says its unit (%s)", example)
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		// A list's example is the value as a list, when YAML reads that back as the value's
		// words: allowed_users: 123 was shown the exec agent's [sh, -c, "echo hi"].
		words := strings.Fields(value)
		example := "[" + strings.Join(words, ", ") + "]"
		var back []string
		if len(words) > 0 && yaml.Unmarshal([]byte(example), &back) == nil && slices.Equal(back, words) {
			return fmt.Errorf("must be a list of strings such as %s", example)
		}
	}
	return typeMismatch(t)
}

// unitNames are the units of time a count's key may name, by the suffix of its name.
var unitNames = map[time.Duration]string{time.Minute: "minutes", time.Hour: "hours"}

// unitOfKey is the unit of time the name of the key at path says its count is in
// (idle_minutes, thread_archive_minutes, at_hour), or 0 when it names none.
func unitOfKey(path string) time.Duration {
	key := path[strings.LastIndexByte(path, '.')+1:]
	switch {
	case strings.HasSuffix(key, "_minutes"):
		return time.Minute
	case strings.HasSuffix(key, "_hour"), strings.HasSuffix(key, "_hours"):
		return time.Hour
	}
	return 0
}

// isDuration reports whether value is a Go duration with its unit (0 alone is not).
func isDuration(value string) bool {
	_, err := time.ParseDuration(value)
	return err == nil && !numberRE.MatchString(value)
}

// leaf is one settable key: a field that is not itself a section.
type leaf struct {
	path  string // sessions.queue.mode
	env   string // AGENTGATE_SESSIONS_QUEUE_MODE
	index []int  // for reflect.Value.FieldByIndex
	typ   reflect.Type
}

// leaves lists every key of Config in declaration order.
var leaves = sync.OnceValue(func() []leaf {
	var out []leaf
	var walk func(t reflect.Type, path string, index []int)
	walk = func(t reflect.Type, path string, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, ok := yamlKey(f)
			if !ok {
				continue
			}
			p := joinPath(path, name)
			idx := append(index[:len(index):len(index)], i)
			if f.Type.Kind() == reflect.Struct {
				walk(f.Type, p, idx)
				continue
			}
			env := EnvPrefix + strings.ToUpper(strings.ReplaceAll(p, ".", "_"))
			out = append(out, leaf{path: p, env: env, index: idx, typ: f.Type})
		}
	}
	walk(reflect.TypeFor[Config](), "", nil)
	return out
})

// IsEnvKey reports whether the environment variable name sets a configuration key (as
// AGENTGATE_STORE_DSN does). Tests clear these, so that a developer's environment never points
// a test's daemon at a real database.
func IsEnvKey(name string) bool {
	for _, l := range leaves() {
		if l.env == name {
			return true
		}
	}
	return false
}

// UnknownEnv returns the AGENTGATE_ variables in environ that begin as a section's keys do
// (AGENTGATE_HTTP, AGENTGATE_SESSIONS…) but name no key, sorted: most likely a misspelt key,
// which Load ignores like any variable that names none (the exec agent's identity variables,
// such as AGENTGATE_SESSION_KEY, are no key either). check-config and serve warn of them. A
// variable that one of c's *_env keys names is no misspelt key but the secret itself, however
// it begins: http.token_env: AGENTGATE_HTTP_TOKEN had its bearer token called ignored (found
// by a walkthrough).
func (c *Config) UnknownEnv(environ []string) []string {
	sections := map[string]bool{}
	secrets := map[string]bool{}
	root := reflect.ValueOf(c).Elem()
	for _, l := range leaves() {
		if head, _, ok := strings.Cut(l.path, "."); ok {
			// Without its "_": AGENTGATE_HTTPADDR and AGENTGATE_LOG='{level: debug}' are
			// misspelt keys too (found by an audit), and no identity variable begins so.
			sections[EnvPrefix+strings.ToUpper(head)] = true
		}
		if strings.HasSuffix(l.path, "_env") && l.typ.Kind() == reflect.String {
			secrets[root.FieldByIndex(l.index).String()] = true
		}
	}
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix) || IsEnvKey(name) || secrets[name] || slices.Contains(out, name) {
			continue
		}
		for prefix := range sections {
			if strings.HasPrefix(name, prefix) {
				out = append(out, name)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// envVars returns the AGENTGATE_ variables in environ by name; the last of repeated variables
// wins, as with os.Getenv.
func envVars(environ []string) map[string]string {
	vars := make(map[string]string)
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if ok && strings.HasPrefix(k, EnvPrefix) {
			vars[k] = v
		}
	}
	return vars
}

// emptySets are the keys whose empty AGENTGATE_ variable sets them to "", where every other
// empty variable sets nothing (see Load): "" is the value that says "none" there, and without
// it a keyless local model endpoint could not be configured from the environment alone (the
// default OPENAI_API_KEY stayed required; found by a walkthrough).
var emptySets = map[string]bool{"agent.openai.api_key_env": true}

// envValue returns the value vars (envVars) give the key l, and whether they set it.
func envValue(l leaf, vars map[string]string) (string, bool) {
	raw, ok := vars[l.env]
	return raw, ok && (raw != "" || emptySets[l.path])
}

// applyEnv sets every key named by one of vars (envVars). An empty variable sets nothing but
// the keys of emptySets (see Load).
func applyEnv(cfg *Config, vars map[string]string) []error {
	if len(vars) == 0 {
		return nil
	}
	root := reflect.ValueOf(cfg).Elem()
	var errs []error
	for _, l := range leaves() {
		raw, ok := envValue(l, vars)
		if !ok {
			continue
		}
		v, err := parseEnvValue(l.path, raw, l.typ)
		if err != nil {
			errs = append(errs, &FieldError{Field: l.env, Value: raw, Err: err})
			continue
		}
		root.FieldByIndex(l.index).Set(v)
	}
	return errs
}

// parseEnvValue reads raw, the value of the key at path, as a YAML scalar or flow value of type
// t, as strictly as the file (an
// unknown key in a mapping is an error). A string is taken verbatim, so that a prompt or DSN
// holding "#" or ": " survives. Null empties a list or a map, or unsets an optional value.
func parseEnvValue(path, raw string, t reflect.Type) (reflect.Value, error) {
	if t.Kind() == reflect.String {
		return reflect.ValueOf(raw).Convert(t), nil
	}
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(raw), &doc); err != nil || len(doc.Content) == 0 {
		if k := t.Kind(); err != nil && (k == reflect.Slice || k == reflect.Map) {
			// A list or a mapping is written in YAML's flow syntax, where an unclosed bracket
			// is the likely slip: say so, not "must be a mapping" of what is one (found by an
			// audit).
			return reflect.Value{}, fmt.Errorf("is not valid YAML: %s", yamlReason(err, raw))
		}
		return reflect.Value{}, typeMismatch(t)
	}
	if doc.Content[0].ShortTag() == "!!null" && t.Kind() != reflect.Slice && t.Kind() != reflect.Map && t.Kind() != reflect.Pointer {
		return reflect.Value{}, typeMismatch(t)
	}
	ptr := reflect.New(t)
	dec := yaml.NewDecoder(strings.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(ptr.Interface()); err != nil {
		// Inside a mapping, name the entry that is wrong: dm.idel: unknown key.
		var diags []diag
		diagnose(&doc, t, "", &diags, nil)
		var inner []string
		for _, d := range diags {
			var fe *FieldError
			if errors.As(d.err, &fe) && fe.Field != "" {
				inner = append(inner, fe.Error())
			}
		}
		if len(inner) > 0 {
			return reflect.Value{}, errors.New(strings.Join(inner, "; "))
		}
		return reflect.Value{}, mismatch(path, t, raw)
	}
	var diags []diag // a float into an integer, anywhere in the value (yaml.v3 truncated it)
	diagnose(&doc, t, "", &diags, nil)
	if len(diags) > 0 {
		if fe := (*FieldError)(nil); errors.As(diags[0].err, &fe) && fe.Field == "" {
			return reflect.Value{}, fe.Err // the variable itself: its name is said already
		}
		return reflect.Value{}, diags[0].err
	}
	return ptr.Elem(), nil
}
