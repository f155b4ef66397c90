package main

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// cliDocSections are the sections of docs/CLI.md, by heading, and the Go type of the JSON
// each documents: a command's output, or an object the outputs share.
var cliDocSections = []struct {
	heading string
	v       any
}{
	{"`sessions list --json`", listJSON{}},
	{"`sessions show --json`", showJSON{}},
	{"`sessions export`", exportJSON{}},
	{"`sessions search --json`", searchJSON{}},
	{"`sessions quarantined --json`", quarantinedJSON{}},
	{"`sessions requeue --json`", requeueJSON{}},
	{"`bench --json`", benchReport{}},
	{"The session object", sessionJSON{}},
	{"The message object", messageJSON{}},
	{"The outbox entry object", outboxJSON{}},
}

// cliDocShapes are the objects docs/CLI.md documents once, in a section of their own, and the
// name a field of their type is given ("session object"), or "" for a type the test goes
// into, naming its fields with dots (route.session_id).
var cliDocShapes = map[reflect.Type]string{
	reflect.TypeFor[sessionJSON](): "session object",
	reflect.TypeFor[messageJSON](): "message object",
	reflect.TypeFor[outboxJSON]():  "outbox entry object",
	reflect.TypeFor[benchReport](): "bench object",
}

// docField is a field as docs/CLI.md or the code has it.
type docField struct {
	typ  string // "string", "integer", "time", "session object or null", "array of strings" …
	omit bool   // left out when empty (omitempty, omitzero): its meaning must say when
}

// TestCLIDocListsEveryJSONField: docs/CLI.md documents every field the JSON output of sessions
// list, show, export, search, quarantined and requeue and of bench --json holds, with its type and, for
// one left out when empty, when it is absent; and it documents no field they do not have. The
// fields are read from the Go types the commands encode; and what the sessions commands print
// of a seeded data directory decodes into those types with no field left over, so a command
// that printed another type's fields would fail too. Before, no document named the fields
// (found by a CLI review).
func TestCLIDocListsEveryJSONField(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "CLI.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	row := regexp.MustCompile("(?m)^\\| `([^`]+)` \\| ([^|]+?) \\| (.+) \\|$")
	for _, sec := range cliDocSections {
		_, body, ok := strings.Cut(doc, "\n## "+sec.heading+"\n")
		if !ok {
			t.Errorf("docs/CLI.md has no section %q", "## "+sec.heading)
			continue
		}
		body, _, _ = strings.Cut(body, "\n## ")
		documented := map[string]docField{}
		for _, m := range row.FindAllStringSubmatch(body, -1) {
			documented[m[1]] = docField{typ: m[2], omit: strings.Contains(m[3], "absent")}
		}
		emitted := map[string]docField{}
		embeds := jsonFields(reflect.TypeOf(sec.v), "", emitted)
		for _, shape := range embeds {
			// Its fields are the shape's, documented in its section: this one links to it.
			link := "(#the-" + strings.ReplaceAll(shape, " ", "-") + ")"
			if !strings.Contains(body, link) {
				t.Errorf("docs/CLI.md's %q: its objects hold a %s's fields, and it does not link to it, %s", sec.heading, shape, link)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(emitted)) {
			want := emitted[name]
			got, ok := documented[name]
			switch {
			case !ok:
				t.Errorf("docs/CLI.md's %q does not document the field %s (%s)", sec.heading, name, want.typ)
			case got.typ != want.typ:
				t.Errorf("docs/CLI.md's %q gives %s the type %q, want %q", sec.heading, name, got.typ, want.typ)
			case got.omit != want.omit && want.omit:
				t.Errorf("docs/CLI.md's %q does not say when %s is absent, which it is when empty", sec.heading, name)
			case got.omit != want.omit:
				t.Errorf("docs/CLI.md's %q says %s may be absent, which it never is", sec.heading, name)
			}
		}
		for name := range documented {
			if _, ok := emitted[name]; !ok {
				t.Errorf("docs/CLI.md's %q documents the field %s, which the output does not have", sec.heading, name)
			}
		}
	}

	// What the commands print has no field the types do not.
	dir := MustSeedSessions(t)
	for _, tc := range []struct {
		args []string
		into any
	}{
		{[]string{"list", "--json"}, &[]listJSON{}},
		{[]string{"show", "--json", keyA}, &showJSON{}},
		{[]string{"export", keyA}, &exportJSON{}},
		{[]string{"search", "--json", "hello"}, &[]searchJSON{}},
		{[]string{"quarantined", "--json"}, &[]quarantinedJSON{}},
	} {
		out, _ := MustRunSessions(t, append(tc.args, "--data-dir", dir)...)
		dec := json.NewDecoder(bytes.NewReader([]byte(out)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(tc.into); err != nil {
			t.Errorf("sessions %s printed what its type does not hold: %v\n%s", strings.Join(tc.args, " "), err, out)
		}
	}
}

// jsonFields adds the JSON fields of struct type t to fields, by their names under prefix, and
// returns the shapes (cliDocShapes) t embeds, whose fields it holds at its own level.
func jsonFields(t reflect.Type, prefix string, fields map[string]docField) (embeds []string) {
	for f := range t.Fields() {
		if f.Anonymous {
			if shape := cliDocShapes[f.Type]; shape != "" {
				embeds = append(embeds, shape)
				continue
			}
			embeds = append(embeds, jsonFields(f.Type, prefix, fields)...)
			continue
		}
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		path := prefix + name
		omit := strings.Contains(opts, "omitempty") || strings.Contains(opts, "omitzero")
		ft := f.Type
		if omit && ft.Kind() == reflect.Pointer {
			ft = ft.Elem() // left out when nil: never null
		}
		fields[path] = docField{typ: jsonType(ft), omit: omit}
		switch {
		case ft.Kind() == reflect.Struct && cliDocShapes[ft] == "" && ft != reflect.TypeFor[time.Time]():
			jsonFields(ft, path+".", fields)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct && cliDocShapes[ft.Elem()] == "":
			jsonFields(ft.Elem(), path+"[].", fields)
		}
	}
	return embeds
}

// jsonType names the JSON type of a field of Go type t as docs/CLI.md does.
func jsonType(t reflect.Type) string {
	if shape := cliDocShapes[t]; shape != "" {
		return shape
	}
	switch t.Kind() {
	case reflect.Pointer:
		return jsonType(t.Elem()) + " or null"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int32, reflect.Int64:
		return "integer"
	case reflect.Float64:
		return "number"
	case reflect.Slice:
		e := t.Elem()
		if e.Kind() == reflect.Pointer {
			e = e.Elem()
		}
		return "array of " + jsonType(e) + "s"
	case reflect.Struct:
		if t == reflect.TypeFor[time.Time]() {
			return "time"
		}
		return "object"
	}
	return t.String()
}
