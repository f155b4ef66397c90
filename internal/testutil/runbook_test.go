package testutil

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestRunbookQuotesRealLogLines: every log line docs/RUNBOOK.md explains or README.md quotes
// (`WRN …`, `ERR …`, `INF …`) is a message the code logs, word for word, so the docs cannot go
// on explaining a line that was reworded or removed.
func TestRunbookQuotesRealLogLines(t *testing.T) {
	root := filepath.Join("..", "..")
	runbook, err := os.ReadFile(filepath.Join(root, "docs", "RUNBOOK.md"))
	if err != nil {
		t.Fatal(err)
	}
	var code strings.Builder
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "data" || d.Name() == "bin") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		code.Write(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	checkErrorsExplained(t, string(runbook), code.String())
	// README.md quotes log lines too (a line may wrap inside its backquotes there).
	for _, doc := range []string{"docs/RUNBOOK.md", "README.md"} {
		quoted := regexp.MustCompile("`(?:WRN|ERR|INF) ([^`]+)`").FindAllStringSubmatch(MustReadDoc(t, doc), -1)
		if len(quoted) < 10 {
			t.Fatalf("found %d log lines in %s; the pattern no longer matches how it quotes them", len(quoted), doc)
		}
		for _, q := range quoted {
			msg := strings.TrimSuffix(strings.Join(strings.Fields(q[1]), " "), " …")
			msg = strings.TrimSuffix(msg, " (PostgreSQL)")
			if !strings.Contains(code.String(), `"`+msg) {
				t.Errorf("%s quotes the log line %q, which no code logs", doc, msg)
			}
		}
	}
}

// checkErrorsExplained: every message the code logs at ERR with a literal (log.Error("…")) is
// explained in the runbook, as `ERR <message>` or the start of it followed by " …": an ERR
// line means a human must act, and the runbook says how.
func checkErrorsExplained(t *testing.T, runbook, code string) {
	t.Helper()
	logged := regexp.MustCompile(`(?:log|Log|logger\(\))\.Error\(\s*"([^"]+)"`).FindAllStringSubmatch(code, -1)
	if len(logged) < 10 {
		t.Fatalf("found %d ERR lines in the code; the pattern no longer matches how it logs them", len(logged))
	}
	for _, l := range logged {
		msg := l[1]
		if strings.Contains(runbook, "`ERR "+msg+"`") {
			continue
		}
		explained := false
		for i := range len(msg) {
			if strings.Contains(runbook, "`ERR "+msg[:i]+" …`") && i > 0 {
				explained = true
				break
			}
		}
		if !explained {
			t.Errorf("the code logs %q at ERR, which the runbook does not explain", msg)
		}
	}
}
