package config

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// unknownKey is the problem of the key named key, of value v, unknown in the mapping m of the
// section at path of type t: errUnknownKey, with the section's key it most likely misspells
// when one is close (http.adr: "did you mean http.addr?"). A key the mapping writes already is
// no suggestion (mod beside mode is no misspelt mode), but for a section when no other key is
// close: sesions beside sessions is most likely its keys written apart, which go in it
// (writtenSection).
func unknownKey(t reflect.Type, m *yaml.Node, path, key string, v *yaml.Node) error {
	written := make(map[string]bool)
	for i := 0; i+1 < len(m.Content); i += 2 {
		written[m.Content[i].Value] = true
	}
	var names, sections []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, ok := yamlKey(f)
		switch {
		case !ok:
		case !written[name]:
			names = append(names, name)
		case isSection(f.Type):
			sections = append(sections, name)
		}
	}
	best := closest(strings.ToLower(key), names)
	if best == "" {
		if section := closest(strings.ToLower(key), sections); section != "" {
			// Before, a bare "unknown key": the close key is written already.
			return fmt.Errorf("%w (%s)", errUnknownKey, writtenSection(joinPath(path, section), v, valueOf(m, section)))
		}
		// log_level or log.level: a key of a section written beside it, as a variable's name
		// or a dotted path reads, which YAML takes for one key of its own.
		if section, inner, ok := nestedKey(t, strings.ToLower(key)); ok {
			parts := append([]string{section}, strings.Split(inner, ".")...)
			nested := strings.Join(parts, ": {") + ": …" + strings.Repeat("}", len(parts)-1)
			return fmt.Errorf("%w (%s is written inside its section: %s)", errUnknownKey, joinPath(path, strings.Join(parts, ".")), nested)
		}
		return errUnknownKey
	}
	return fmt.Errorf("%w (did you mean %s?)", errUnknownKey, joinPath(path, best))
}

// writtenSection is the hint for v, written under a key that misspells the section at path,
// which the mapping writes already (as sec): its keys go in that section; a value alone goes in
// as the section's key it most likely is (scalarKeys), or as one of its keys. When sec writes
// that key already, the value is to be removed or set there: written inside sec again, it is a
// key set twice, which Load refuses (before, agnet: exec beside agent: {backend: echo} was told
// to write backend: exec inside agent; a review). Before, a value was
// told to "move these keys into it" too: htp: :8080 beside http has no keys (a review). One
// that holds nothing (null, "", {} or []) is to be removed: before, htp: "" was told to write
// `addr: ` inside http, and htp: {} to move keys it has none of (a review of that fix).
// An alias (*q) is told as what its anchor names; one of a mapping, to write the keys it names
// in sec, or merge them there (<<: *q), and one of sec itself, to be removed. Before, each was
// told to set the key of sec its one value is for, which only a value has. So is sec, when the
// file writes the section as an alias (reset: *r): before, rest: *r beside it was told to write
// the keys of *r in it, and a value a key that *r sets there already.
func writtenSection(path string, v, sec *yaml.Node) string {
	alias := v
	v, sec = aliased(v), aliased(sec)
	switch {
	case alias != v && v == sec:
		return fmt.Sprintf("did you mean %s? *%s is %s itself, written already: remove this one", path, alias.Value, path)
	case holdsNothing(v):
		return fmt.Sprintf("did you mean %s? %s is written already, and this one holds nothing: remove it", path, path)
	case v.Kind == yaml.MappingNode && alias != v:
		return fmt.Sprintf("did you mean %s? %s is written already: write the keys *%s names inside it, or merge them there with <<: *%s, as a section is written once",
			path, path, alias.Value, alias.Value)
	case v.Kind == yaml.MappingNode:
		return fmt.Sprintf("did you mean %s? %s is written already: move these keys into it, as a section is written once", path, path)
	}
	if key, ok := scalarKeys[path]; ok && v.Kind == yaml.ScalarNode && !strings.ContainsAny(v.Value, "\n{}") {
		if valueOf(sec, key) != nil {
			return fmt.Sprintf("did you mean %s.%s? %s is written already, with its %s: remove this one, or set %s there to its value, %s",
				path, key, path, key, key, flowValue(key, v.Value))
		}
		return fmt.Sprintf("did you mean %s.%s? %s is written already, and holds keys, not one value: write this one inside it, as %s: %s",
			path, key, path, key, flowValue(key, v.Value))
	}
	return fmt.Sprintf("did you mean %s? %s is written already, and holds keys, not one value: set the key of it that this value is for", path, path)
}

// aliased is what the alias n names, or n when it is no alias.
func aliased(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// valueOf is the value of key in the mapping m, nil when m is none or does not write key.
func valueOf(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// holdsNothing reports whether v is null, an empty string, or an empty mapping or list.
func holdsNothing(v *yaml.Node) bool {
	switch v.Kind {
	case yaml.ScalarNode:
		return v.ShortTag() == "!!null" || v.ShortTag() == "!!str" && v.Value == ""
	case yaml.MappingNode, yaml.SequenceNode:
		return len(v.Content) == 0
	}
	return false
}

// isSection reports whether a key of type t holds keys of its own (a mapping).
func isSection(t reflect.Type) bool {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Kind() == reflect.Struct || t.Kind() == reflect.Map
}

// closest returns the one of names that word most likely misspells, or "" when none is close:
// one edit away from a short word, two from a longer one (more would suggest names of other
// meanings); the first of those equally close.
func closest(word string, names []string) string {
	limit := max(1, min(2, len(word)/3))
	best, bestDist := "", limit+1
	for _, name := range names {
		if d := editDistance(word, name); d < bestDist {
			best, bestDist = name, d
		}
	}
	return best
}

// ClosestEnv returns the AGENTGATE_* variable of a key that name, an AGENTGATE_ variable that
// names none (UnknownEnv), most likely misspells, as the file's unknown keys are told the key
// (AGENTGATE_HTTP_ADR: AGENTGATE_HTTP_ADDR), or "" when none is close.
func ClosestEnv(name string) string {
	var names []string
	for _, l := range leaves() {
		names = append(names, strings.TrimPrefix(l.env, EnvPrefix))
	}
	if best := closest(strings.ToUpper(strings.TrimPrefix(name, EnvPrefix)), names); best != "" {
		return EnvPrefix + best
	}
	return ""
}

// scalarKeys are the sections whose one value, written in the section's place, is most likely
// one key's: http: 127.0.0.1:8081 is http.addr, log: debug log.level, agent: exec
// agent.backend.
var scalarKeys = map[string]string{"http": "addr", "log": "level", "agent": "backend"}

// notMapping is the problem of n, written where the section at path, a mapping, goes: with the
// key that a value alone most likely meant (scalarKeys). Before, http: 127.0.0.1:8081 was told
// only that http must be a mapping of keys (a new operator's review).
func notMapping(path string, n *yaml.Node) error {
	if key, ok := scalarKeys[path]; ok && n.Kind == yaml.ScalarNode && n.Value != "" && !strings.ContainsAny(n.Value, "\n{}") {
		return fmt.Errorf("must be a mapping of keys (did you mean %s: {%s: %s}?)", path, key, flowValue(key, n.Value))
	}
	return errors.New("must be a mapping of keys")
}

// flowValue is v as the value of key in a flow mapping ({key: v}): as it is when YAML reads it
// back so, else double-quoted. Before, it was written as it came, and the hint of http: :8081
// was http: {addr: :8081}, which YAML refuses (a flow mapping's value cannot begin with ":"),
// and that of log: "debug, json" log: {level: debug, json}, which sets another key
// (TestSectionWrittenAsOneValueIsToldYAMLThatParses).
func flowValue(key, v string) string {
	var m map[string]string
	if yaml.Unmarshal([]byte("{"+key+": "+v+"}"), &m) == nil && len(m) == 1 && m[key] == v {
		return v
	}
	return strconv.Quote(v) // a Go string's escapes are YAML's double-quoted ones
}

// nestedKey finds the key of a section of t that key names with its section's name before it,
// joined by "_" or ".": log_level is log's level, sessions_queue_cap sessions' queue.cap.
func nestedKey(t reflect.Type, key string) (section, inner string, ok bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, named := yamlKey(f)
		if !named || f.Type.Kind() != reflect.Struct || len(key) <= len(name)+1 ||
			!strings.HasPrefix(key, name) || (key[len(name)] != '_' && key[len(name)] != '.') {
			continue
		}
		rest := key[len(name)+1:]
		if _, found := fieldByKey(f.Type, rest); found {
			return name, rest, true
		}
		if sub, subInner, found := nestedKey(f.Type, rest); found {
			return name, sub + "." + subInner, true
		}
	}
	return "", "", false
}

// editDistance is the optimal string alignment distance of a and b, in bytes: the insertions,
// deletions, substitutions and swaps of two neighbours that turn one into the other (idel is
// one swap from idle, where Levenshtein's distance counts two).
func editDistance(a, b string) int {
	// d[i][j] is the distance of a[:i] and b[:j]; keys are short, so the whole table is cheap.
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
