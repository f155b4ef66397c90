package testutil

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/metrics"
)

// MustReadDoc returns the text of a document under the repository root, such as "README.md".
func MustReadDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReadmeMetricsAreReal: the README's metrics table lists every agentgate_* metric the
// daemon exports, and every agentgate_* name the README, the runbook and the HTTP API reference
// mention (with its labels, as in agentgate_turns_total{outcome="error"}) is one the daemon
// exports, so an operator's alert cannot be written against a metric or a label that does not
// exist.
func TestReadmeMetricsAreReal(t *testing.T) {
	m := metrics.New("http")
	m.InitModelRequests([]string{"ok"}) // the daemon does this when its agent calls a model
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string][]string{} // exported agentgate_* family → its label names
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "agentgate_") {
			continue
		}
		var names []string
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if !slices.Contains(names, l.GetName()) {
					names = append(names, l.GetName())
				}
			}
		}
		labels[f.GetName()] = names
	}
	if len(labels) < 20 {
		t.Fatalf("the registry exports %d agentgate_* metrics; the gathering no longer sees them", len(labels))
	}

	readme := MustReadDoc(t, "README.md")
	mention := regexp.MustCompile(`\b(agentgate_[a-z_]+[a-z])(\{([^}]*)\})?`)
	var table []string
	for _, line := range strings.Split(readme, "\n") {
		if cells := strings.Split(line, "|"); len(cells) > 2 && strings.Contains(cells[1], "`agentgate_") {
			for _, mm := range mention.FindAllStringSubmatch(cells[1], -1) {
				table = append(table, mm[1])
			}
		}
	}
	for _, name := range sortedKeys(labels) {
		if !slices.Contains(table, name) {
			t.Errorf("the daemon exports %s, which the README's metrics table does not list", name)
		}
	}

	for _, doc := range []string{"README.md", "docs/RUNBOOK.md", "docs/HTTP-API.md"} {
		for _, mm := range mention.FindAllStringSubmatch(MustReadDoc(t, doc), -1) {
			name := mm[1]
			have, exported := labels[name]
			if !exported {
				t.Errorf("%s mentions %s, which the daemon does not export", doc, name)
				continue
			}
			if mm[2] == "" {
				continue
			}
			for _, pair := range strings.Split(mm[3], ",") {
				label, _, _ := strings.Cut(strings.TrimSpace(pair), "=")
				if !slices.Contains(have, label) {
					t.Errorf("%s mentions %s, whose labels are %v, not %q", doc, mm[0], have, label)
				}
			}
		}
	}
}

// TestReadmeConfigIsTheDefaults: the configuration the README shows under "Configuration" is
// accepted as a file and sets exactly the keys, with the values, of `check-config
// --print-defaults` (config.Example, which config's tests hold to config.Default): a key added
// to the Config struct is documented where an operator looks, with its real default.
func TestReadmeConfigIsTheDefaults(t *testing.T) {
	readme := MustReadDoc(t, "README.md")
	_, section, ok := strings.Cut(readme, "\n### Configuration\n")
	if !ok {
		t.Fatal(`README.md has no "### Configuration" section`)
	}
	_, block, ok := strings.Cut(section, "```yaml\n")
	if !ok {
		t.Fatal(`README.md's "Configuration" section has no yaml block`)
	}
	block, _, _ = strings.Cut(block, "```")

	path := filepath.Join(t.TempDir(), "readme.yaml")
	if err := os.WriteFile(path, []byte(block), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(path, nil, nil); err != nil {
		t.Errorf("config.Load(the README's configuration) = %v, want it accepted", err)
	}

	got, want := flatYAML(t, block), flatYAML(t, config.Example())
	for _, k := range sortedKeys(want) {
		if v, ok := got[k]; !ok {
			t.Errorf("the README's configuration lacks %s (default %s)", k, want[k])
		} else if v != want[k] {
			t.Errorf("the README's configuration sets %s: %s, want the default %s", k, v, want[k])
		}
	}
	for _, k := range sortedKeys(got) {
		if _, ok := want[k]; !ok {
			t.Errorf("the README's configuration sets %s, which --print-defaults does not", k)
		}
	}
}

// flatYAML decodes a YAML mapping into its leaf keys (a.b.c) and their values, printed.
func flatYAML(t *testing.T, doc string) map[string]string {
	t.Helper()
	var root map[string]any
	if err := yaml.Unmarshal([]byte(doc), &root); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
				walk(prefix+k+".", sub)
				continue
			}
			out[prefix+k] = fmt.Sprint(v)
		}
	}
	walk("", root)
	return out
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// TestArchitectureListsEveryPackage: the package map at the top of docs/ARCHITECTURE.md names
// every package of the module (by its last path element), so a package added since is placed
// where a reader of the design looks for it.
func TestArchitectureListsEveryPackage(t *testing.T) {
	arch := MustReadDoc(t, "docs/ARCHITECTURE.md")
	_, section, ok := strings.Cut(arch, "\n## Packages\n")
	if !ok {
		t.Fatal(`docs/ARCHITECTURE.md has no "## Packages" section`)
	}
	_, block, ok := strings.Cut(section, "```\n")
	if !ok {
		t.Fatal(`docs/ARCHITECTURE.md's "Packages" section has no code block`)
	}
	block, _, _ = strings.Cut(block, "```")
	root := filepath.Join("..", "..")
	dirs := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "data" || d.Name() == "bin") && path != root {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			dirs[filepath.Dir(path)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 20 {
		t.Fatalf("found %d package directories; the walk no longer sees the module", len(dirs))
	}
	for _, dir := range sortedKeys(dirs) {
		name := filepath.Base(dir)
		if !regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\b`).MatchString(block) {
			rel, _ := filepath.Rel(root, dir)
			t.Errorf("docs/ARCHITECTURE.md's package map does not name %s (%s)", name, rel)
		}
	}
}

// TestHTTPAPIListsEveryErrorCode: the "Errors" table of docs/HTTP-API.md names every error code
// the HTTP API answers with (the Code… constants of platforms/http), and no code it does not
// have, so a client written against the table meets no code it was not told of.
func TestHTTPAPIListsEveryErrorCode(t *testing.T) {
	path := filepath.Join("..", "..", "platforms", "http", "respond.go")
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			v := spec.(*ast.ValueSpec)
			for i, name := range v.Names {
				if !strings.HasPrefix(name.Name, "Code") || i >= len(v.Values) {
					continue
				}
				if lit, ok := v.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					code, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					codes = append(codes, code)
				}
			}
		}
	}
	if len(codes) < 20 {
		t.Fatalf("found %d Code… constants in %s; the parse no longer sees them", len(codes), path)
	}

	doc := MustReadDoc(t, "docs/HTTP-API.md")
	_, section, ok := strings.Cut(doc, "\n## Errors\n")
	if !ok {
		t.Fatal(`docs/HTTP-API.md has no "## Errors" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	row := regexp.MustCompile("(?m)^\\| `[0-9]{3}` \\| ([^|]+)\\|")
	var table []string
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		for _, c := range regexp.MustCompile("`([a-z_0-9]+)`").FindAllStringSubmatch(m[1], -1) {
			table = append(table, c[1])
		}
	}
	for _, code := range codes {
		if !slices.Contains(table, code) {
			t.Errorf("the HTTP API answers with the error code %q, which docs/HTTP-API.md's Errors table does not list", code)
		}
	}
	for _, code := range table {
		if !slices.Contains(codes, code) {
			t.Errorf("docs/HTTP-API.md's Errors table lists the error code %q, which the HTTP API does not have", code)
		}
	}
}
