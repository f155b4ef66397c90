package testutil

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// unexplainedLines are the call sites whose WRN or ERR lines the runbook has no row for, on
// purpose, by "file:function" (a function may hold several). Each says why a row would be
// noise. Keep it short: a line an operator can meet deserves its row.
var unexplainedLines = map[string]string{
	// discordgo's own log lines, bridged to slog at Warn: their text is the library's, any of
	// dozens, formatted at run time. RUNBOOK's Discord table explains the two an operator
	// meets (a read error from the gateway, a heartbeat not acknowledged) by their start.
	"platforms/discord/discord.go:routeLibraryLogs": "discordgo's own lines",
	// A KeyedLimiter's reports of the lines it held back (report, Flush): each is a line its
	// caller logged through KeyedLimiter.Log, a helper whose callers the scan checks.
	"internal/logging/limit.go:logHeld": "a KeyedLimiter's caller's lines, held back",
}

// TestRunbookExplainsEveryWarnAndError: every line the daemon can log at WRN or ERR has a row
// in docs/RUNBOOK.md, quoted as `WRN <message>` or `ERR <message>` (at a level the code logs it
// at), or by its start followed by " …". A WRN line means a retry or a restart an operator may
// want to understand, an ERR line that a human must act, and the runbook says what each means,
// whether anything is lost, and what to do; a soak met `WRN delivery marks not acknowledged;
// sending them again` with no row.
//
// The calls are found in the syntax of every non-test Go file (go/ast, no type checking):
// slog's Warn, Error, WarnContext, ErrorContext, and Log or LogAttrs at a level that may be
// slog.LevelWarn or above; and the repository's own helpers, found by the same rules: a
// function that passes its parameter on as such a call's message (logging.Limiter.Log, the
// persistence actor's lineLimits.log, a session's logRefusedWrite) is one, and its callers'
// messages count. A message is resolved from a literal, a constant (also another package's),
// a local variable's assignments or a struct field's (r.log = "…" in each case of a switch),
// and a concatenation whose end is not constant (its start, then "…"). A message it cannot
// resolve fails the test, as an unexplained line does, unless its call site is one of
// unexplainedLines.
func TestRunbookExplainsEveryWarnAndError(t *testing.T) {
	root := filepath.Join("..", "..")
	calls, unresolved := warnAndErrorCalls(t, root)
	if len(calls) < 200 {
		t.Fatalf("found %d WRN and ERR log calls; the scan no longer sees how the code logs them", len(calls))
	}
	runbook := MustReadDoc(t, "docs/RUNBOOK.md")
	used := map[string]bool{}
	for _, u := range unresolved {
		if _, ok := unexplainedLines[u.site]; ok {
			used[u.site] = true
			continue
		}
		t.Errorf("%s: a line at %s whose message the scan cannot resolve (%s): log a constant, or list the call in unexplainedLines with why",
			u.pos, strings.Join(u.levels(), " or "), u.expr)
	}
	missing := map[string][]string{} // "WRN msg" → where
	for _, c := range calls {
		if _, ok := unexplainedLines[c.site]; ok {
			used[c.site] = true
			continue
		}
		for _, msg := range c.msgs {
			if !explained(runbook, c.levels(), msg) {
				k := c.levelName() + " " + msg
				missing[k] = append(missing[k], c.pos)
			}
		}
	}
	keys := make([]string, 0, len(missing))
	for k := range missing {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		t.Errorf("docs/RUNBOOK.md has no row for `%s` (logged at %s)", k, strings.Join(missing[k], ", "))
	}
	for site := range unexplainedLines {
		if !used[site] {
			t.Errorf("unexplainedLines lists %s, which logs no WRN or ERR line any more: remove it", site)
		}
	}
}

// explained reports whether runbook quotes msg at one of levels: whole, or its start (up to a
// space or a punctuation mark) followed by " …".
func explained(runbook string, levels []string, msg string) bool {
	whole, rest := msg, false
	if s, ok := strings.CutSuffix(msg, "…"); ok {
		whole, rest = s, true
	}
	for _, l := range levels {
		if !rest && strings.Contains(runbook, "`"+l+" "+whole+"`") {
			return true
		}
		for i := len(whole); i > 0; i-- {
			if (i == len(whole) || strings.ContainsRune(" ;:,", rune(whole[i]))) && strings.Contains(runbook, "`"+l+" "+whole[:i]+" …`") {
				return true
			}
		}
	}
	return false
}

// logCall is a call that logs at WRN or ERR (or at a level the scan cannot tell, which may be
// either): where, and the messages it may log.
type logCall struct {
	pos   string // file:line
	site  string // file:function, as unexplainedLines names it
	level string // "WRN", "ERR", or "" when it may be either
	msgs  []string
	expr  string // the message's expression, when it was not resolved
}

// levels are the levels the line may be logged at.
func (c logCall) levels() []string {
	if c.level == "" {
		return []string{"WRN", "ERR"}
	}
	return []string{c.level}
}

// levelName is the level to quote the line at: WRN when it may be either.
func (c logCall) levelName() string {
	if c.level == "" {
		return "WRN"
	}
	return c.level
}

// scanPackage is one directory's non-test files.
type scanPackage struct {
	files  []*ast.File
	consts map[string]ast.Expr   // package-level constants and variables by name
	fields map[string][]ast.Expr // values assigned to a field, by fieldKey (r.log = v)
}

// logHelper is a function that logs at WRN or ERR what its callers give it: the message (its
// parameter msg, by its index among the call's arguments), or the level (its parameter level),
// or both.
type logHelper struct {
	msg   int      // the parameter that is the message, or -1: msgs
	msgs  []string // the messages it logs, when msg is -1
	level int      // the parameter that is the level, or -1: fixed
	fixed string   // "WRN", "ERR", or "" for either, when level is -1
}

// warnAndErrorCalls parses every non-test Go file under root and returns the calls that log
// at WRN or ERR with their messages resolved, and those whose message it could not resolve.
func warnAndErrorCalls(t *testing.T, root string) (calls, unresolved []logCall) {
	t.Helper()
	fset := token.NewFileSet()
	pkgs := map[string]*scanPackage{}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "data" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		p := pkgs[rel]
		if p == nil {
			p = &scanPackage{consts: map[string]ast.Expr{}, fields: map[string][]ast.Expr{}}
			pkgs[rel] = p
		}
		p.files = append(p.files, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pkgs {
		p.index()
	}
	s := &scanner{fset: fset, root: root, pkgs: pkgs, helpers: map[string]logHelper{}}
	// Find the helpers until no new one appears: a helper of a helper is one too.
	for {
		before := fmt.Sprint(s.helpers)
		s.calls, s.unresolved = nil, nil
		dirs := mapKeys(pkgs)
		slices.Sort(dirs)
		for _, dir := range dirs {
			s.scan(pkgs[dir])
		}
		if fmt.Sprint(s.helpers) == before {
			break
		}
	}
	return s.calls, s.unresolved
}

func mapKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// index records p's package-level constants and variables, and the values its code assigns to
// fields.
func (p *scanPackage) index() {
	for _, f := range p.files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || (g.Tok != token.CONST && g.Tok != token.VAR) {
				continue
			}
			for _, sp := range g.Specs {
				vs := sp.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						p.consts[n.Name] = vs.Values[i]
					}
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			as, ok := n.(*ast.AssignStmt)
			if !ok || len(as.Lhs) != len(as.Rhs) {
				return true
			}
			for i, l := range as.Lhs {
				if k, ok := fieldKey(l); ok {
					p.fields[k] = append(p.fields[k], as.Rhs[i])
				}
			}
			return true
		})
	}
}

// fieldKey names a field x.f by the variable it is read through and its name ("r.log"): the
// scan has no types, and another type's field of the same name (a logger's log) is not it.
func fieldKey(e ast.Expr) (string, bool) {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return "", false
	}
	x, ok := sel.X.(*ast.Ident)
	if !ok {
		return "", false
	}
	return x.Name + "." + sel.Sel.Name, true
}

type scanner struct {
	fset       *token.FileSet
	root       string
	pkgs       map[string]*scanPackage
	helpers    map[string]logHelper // by function or method name
	calls      []logCall
	unresolved []logCall
}

// modulePath is the import path of the repository's root.
const modulePath = "github.com/agentgate/agentgate"

// funcScope is the function a call is in: its parameters by name, and its local
// assignments by name.
type funcScope struct {
	name   string // "" for a function literal
	params map[string]int
	locals map[string][]ast.Expr
	parent *funcScope
}

func newScope(name string, typ *ast.FuncType, body *ast.BlockStmt, parent *funcScope) *funcScope {
	sc := &funcScope{name: name, params: map[string]int{}, locals: map[string][]ast.Expr{}, parent: parent}
	i := 0
	for _, f := range typ.Params.List {
		if len(f.Names) == 0 {
			i++
			continue
		}
		for _, n := range f.Names {
			sc.params[n.Name] = i
			i++
		}
	}
	if body == nil {
		return sc
	}
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.AssignStmt:
			if len(n.Lhs) != len(n.Rhs) {
				for _, l := range n.Lhs {
					if id, ok := l.(*ast.Ident); ok {
						sc.locals[id.Name] = append(sc.locals[id.Name], nil) // not resolvable
					}
				}
				return true
			}
			for i, l := range n.Lhs {
				if id, ok := l.(*ast.Ident); ok {
					sc.locals[id.Name] = append(sc.locals[id.Name], n.Rhs[i])
				}
			}
		case *ast.ValueSpec:
			for i, id := range n.Names {
				if i < len(n.Values) {
					sc.locals[id.Name] = append(sc.locals[id.Name], n.Values[i])
				} else {
					sc.locals[id.Name] = append(sc.locals[id.Name], nil)
				}
			}
		}
		return true
	})
	return sc
}

func (s *scanner) scan(p *scanPackage) {
	for _, f := range p.files {
		imports := map[string]string{} // local name → directory under the root
		for _, im := range f.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			name := filepath.Base(path)
			if im.Name != nil {
				name = im.Name.Name
			}
			if dir, ok := strings.CutPrefix(path, modulePath+"/"); ok {
				imports[name] = dir
			} else {
				imports[name] = "\x00" + path
			}
		}
		file := filepath.ToSlash(mustRel(s.root, s.fset.Position(f.Pos()).Filename))
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			s.scanFunc(p, imports, file, fd.Name.Name, newScope(fd.Name.Name, fd.Type, fd.Body, nil), fd.Body)
		}
	}
}

func mustRel(root, path string) string {
	rel, err := filepath.Rel(root, path)
	if err != nil {
		return path
	}
	return rel
}

func (s *scanner) scanFunc(p *scanPackage, imports map[string]string, file, fn string, sc *funcScope, body *ast.BlockStmt) {
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			s.scanFunc(p, imports, file, fn, newScope("", n.Type, n.Body, sc), n.Body)
			return false
		case *ast.CallExpr:
			s.call(p, imports, file, fn, sc, n)
		}
		return true
	})
}

// call records n if it logs at WRN or ERR.
func (s *scanner) call(p *scanPackage, imports map[string]string, file, fn string, sc *funcScope, n *ast.CallExpr) {
	var name, recv string
	switch f := n.Fun.(type) {
	case *ast.SelectorExpr:
		name = f.Sel.Name
		if id, ok := f.X.(*ast.Ident); ok {
			recv = id.Name
		}
	case *ast.Ident:
		name = f.Name
	default:
		return
	}
	h := logHelper{msg: -1, level: -1}
	switch {
	case (name == "Warn" || name == "Error") && len(n.Args) >= 1:
		if recv == "http" || recv == "t" || recv == "tb" || recv == "b" {
			return // http.Error, testing.T's Error
		}
		h.msg, h.fixed = 0, map[string]string{"Warn": "WRN", "Error": "ERR"}[name]
	case (name == "WarnContext" || name == "ErrorContext") && len(n.Args) >= 2:
		h.msg, h.fixed = 1, map[string]string{"WarnContext": "WRN", "ErrorContext": "ERR"}[name]
	case (name == "Log" || name == "LogAttrs") && len(n.Args) >= 3:
		// slog.Logger.Log(ctx, level, msg, …), logging.Limiter.Log(logger, level, msg, …).
		h.msg, h.level = 2, 1
	default:
		var ok bool
		if h, ok = s.helpers[name]; !ok || len(n.Args) <= max(h.msg, h.level) {
			return
		}
	}
	level, levelParam := h.fixed, -1
	if h.level >= 0 {
		l, param, ok := s.level(sc, n.Args[h.level])
		if !ok {
			return // Info or Debug
		}
		level, levelParam = l, param
	}
	c := logCall{
		pos:   fmt.Sprintf("%s:%d", file, s.fset.Position(n.Pos()).Line),
		site:  file + ":" + fn,
		level: level,
		msgs:  h.msgs,
	}
	msgParam := -1
	if h.msg >= 0 {
		msgExpr := n.Args[h.msg]
		if id, ok := msgExpr.(*ast.Ident); ok && sc.parent == nil {
			if i, ok := sc.params[id.Name]; ok && len(sc.locals[id.Name]) == 0 {
				msgParam = i
			}
		}
		if msgParam < 0 {
			msgs, ok := s.strings(p, imports, sc, msgExpr, 0)
			if !ok {
				c.expr = exprString(s.fset, msgExpr)
				s.unresolved = append(s.unresolved, c)
				return
			}
			c.msgs = msgs
		}
	}
	if msgParam >= 0 || levelParam >= 0 {
		// A helper: its callers give it what it logs.
		s.helpers[sc.name] = logHelper{msg: msgParam, msgs: c.msgs, level: levelParam, fixed: level}
		return
	}
	s.calls = append(s.calls, c)
}

// level reports whether e, a slog.Level, may be Warn or above, and at which ("" when it may be
// either); param is the index of the enclosing function's parameter it is, or -1.
func (s *scanner) level(sc *funcScope, e ast.Expr) (level string, param int, ok bool) {
	if sel, ok := e.(*ast.SelectorExpr); ok {
		if x, ok := sel.X.(*ast.Ident); ok && x.Name == "slog" {
			switch sel.Sel.Name {
			case "LevelWarn":
				return "WRN", -1, true
			case "LevelError":
				return "ERR", -1, true
			case "LevelInfo", "LevelDebug":
				return "", -1, false
			}
		}
	}
	if id, ok := e.(*ast.Ident); ok && sc.parent == nil {
		if i, ok := sc.params[id.Name]; ok && len(sc.locals[id.Name]) == 0 {
			return "", i, true
		}
	}
	// A variable or a call: it may be Warn or Error.
	return "", -1, true
}

// strings resolves e to the strings it may hold: "…" ends one whose end is not constant.
func (s *scanner) strings(p *scanPackage, imports map[string]string, sc *funcScope, e ast.Expr, depth int) ([]string, bool) {
	if depth > 20 {
		return nil, false
	}
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return nil, false
		}
		v, err := strconv.Unquote(e.Value)
		return []string{v}, err == nil
	case *ast.ParenExpr:
		return s.strings(p, imports, sc, e.X, depth+1)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return nil, false
		}
		left, ok := s.strings(p, imports, sc, e.X, depth+1)
		if !ok {
			return nil, false
		}
		right, ok := s.strings(p, imports, sc, e.Y, depth+1)
		if !ok {
			right = []string{"…"}
		}
		var out []string
		for _, l := range left {
			for _, r := range right {
				if strings.HasSuffix(l, "…") {
					out = append(out, l)
				} else {
					out = append(out, l+r)
				}
			}
		}
		return out, true
	case *ast.Ident:
		for c := sc; c != nil; c = c.parent {
			if vals, ok := c.locals[e.Name]; ok {
				return s.all(p, imports, sc, vals, depth)
			}
			if _, ok := c.params[e.Name]; ok {
				return nil, false
			}
		}
		if v, ok := p.consts[e.Name]; ok {
			return s.strings(p, imports, nil, v, depth+1)
		}
		return nil, false
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok {
			if dir, ok := imports[x.Name]; ok {
				if q := s.pkgs[dir]; q != nil {
					if v, ok := q.consts[e.Sel.Name]; ok {
						return s.strings(q, nil, nil, v, depth+1)
					}
				}
				return nil, false
			}
		}
		if k, ok := fieldKey(e); ok && len(p.fields[k]) > 0 {
			return s.all(p, imports, nil, p.fields[k], depth)
		}
		return nil, false
	}
	return nil, false
}

// all resolves each of vals (nil: one that cannot be).
func (s *scanner) all(p *scanPackage, imports map[string]string, sc *funcScope, vals []ast.Expr, depth int) ([]string, bool) {
	var out []string
	for _, v := range vals {
		if v == nil {
			return nil, false
		}
		r, ok := s.strings(p, imports, sc, v, depth+1)
		if !ok {
			return nil, false
		}
		out = append(out, r...)
	}
	return out, true
}

func exprString(fset *token.FileSet, e ast.Expr) string {
	var b strings.Builder
	if err := printer.Fprint(&b, fset, e); err != nil {
		return fmt.Sprintf("%T", e)
	}
	return b.String()
}
